//! The file source's state machine: inotify records in, file events and changed URIs out.
//!
//! It knows nothing of file descriptors or threads. It is fed `(wd, mask, cookie, name)`
//! records with the time they were read, asks a [`Disk`] to stat, list, and add or remove
//! kernel watches, and writes what it decides into the subscriptions' event rings and the
//! change feed. A fake `Disk` drives it in the unit tests (`tests/`), overflow included; the real
//! one (in `watcher.rs`) is a thin layer over `inotify` and `std::fs`.
//!
//! How raw inotify becomes events:
//! - Only directories are watched, never files: a file watch stays on the old inode after a
//!   rename-over, so a file is watched through its directory. Every directory from the root
//!   down to a subscription's base is watched for its one next name ([`Spec::chain`]), which is
//!   how a deleted base, or a deleted directory above it, is seen coming back; each level that
//!   reappears is watched and scanned, which re-arms the next.
//! - Each path's events within the debounce window are collected, and when the window closes the
//!   path is stat'ed and the *net* change since the last settled state is emitted: created and
//!   removed within the window is nothing; removed and recreated is `MODIFIED`; a thousand
//!   writes are one `MODIFIED`. Appends with no close (`MODIFY` only) wait at least 50 ms.
//! - `MOVED_FROM` and `MOVED_TO` are paired by cookie. A file that did not exist when its
//!   window began (a temp file) renamed over a target is a write to the target (`MODIFIED`, or
//!   `CREATED` if the target is new); otherwise the pair is one `MOVED` with `from` and `to`.
//!   An unpaired `MOVED_FROM` settles as `DELETED`, an unpaired `MOVED_TO` as `CREATED`.
//! - A new directory under a recursive watch is watched and scanned at once; what the scan finds
//!   is reported as `CREATED` (files can land before the watch exists). A removed one is dropped.
//! - `IN_Q_OVERFLOW` means the kernel dropped events: every event-log gets an in-band
//!   `OVERFLOW`, pending paths settle, every watch is added again (a new wd replaces a dead
//!   one), every watched directory is rescanned against the last settled listing, the
//!   differences are emitted as synthetic events, and every subscription is published.
//!
//! This file holds the machine's vocabulary and state; its behaviour is split by concern:
//! `spec.rs` (what a subscription watches and which paths concern it), `watches.rs`
//! (subscribing, and the kernel watches and listings that follow), `feed.rs` (records into
//! pending paths, rename pairing), `settle.rs` (a closed window into events), `overflow.rs`
//! (the rescan after `IN_Q_OVERFLOW`) and `meta.rs` (what a stat tells).

mod feed;
mod meta;
mod overflow;
mod settle;
mod spec;
mod watches;

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use inotify::EventMask;

use self::spec::Sub;
use crate::mcp::hub::ChangeFeed;

pub use self::meta::{Kind, Meta, mtime_ns, rfc3339};
pub use self::settle::Change;
pub use self::spec::{Mode, Spec};
pub use self::watches::SubError;

/// A kernel watch descriptor's number.
pub type Wd = i32;

/// The descriptor of a watch the kernel has already dropped.
const DEAD: Wd = -1;

/// The least time a path with only `MODIFY` events (a writer that has not closed the file)
/// waits before it settles, whatever the debounce: otherwise every `write(2)` of an open file
/// would be its own event when the debounce is 0.
pub const DIRTY_MIN: Duration = Duration::from_millis(50);

/// One inotify event, as read.
#[derive(Debug, Clone)]
pub struct Record {
    pub wd: Wd,
    pub mask: EventMask,
    pub cookie: u32,
    pub name: Option<OsString>,
}

/// The machine's view of the file system and the kernel.
pub trait Disk {
    /// `lstat`; `None` if it does not exist (or cannot be stat'ed).
    fn stat(&self, path: &Path) -> Option<Meta>;
    /// The entries of `dir` with UTF-8 names (others are skipped), not following symlinks.
    fn list(&self, dir: &Path) -> std::io::Result<Vec<(String, Meta)>>;
    /// Adds (or finds) the kernel watch on directory `dir`.
    fn add_watch(&mut self, dir: &Path) -> std::io::Result<Wd>;
    fn rm_watch(&mut self, wd: Wd);
}

#[derive(Debug, Clone)]
pub struct Config {
    pub debounce: Duration,
    pub max_watches: usize,
    pub ring_capacity: usize,
    /// Where event-log rings send their events when the role publishes them.
    pub tap: Option<crate::runtime::tap::Tap>,
}

/// The state machine. See the module docs.
pub struct Machine {
    cfg: Config,
    feed: ChangeFeed,
    subs: HashMap<String, Sub>,
    dirs: HashMap<PathBuf, Dir>,
    by_wd: HashMap<Wd, PathBuf>,
    pending: HashMap<PathBuf, Pending>,
    /// Cookie of a `MOVED_FROM` → its path and what it was (`None`: not settled yet).
    moves: HashMap<u32, (PathBuf, Option<Meta>)>,
}

struct Dir {
    wd: Wd,
    /// Every entry is known (some subscription wants the contents), not only wanted names.
    full: bool,
    entries: HashMap<String, Meta>,
}

#[derive(Debug)]
struct Pending {
    first: Instant,
    deadline: Instant,
    created: bool,
    wrote: bool,
    /// Paired `MOVED_TO`: the source path and what it was.
    moved_from: Option<(PathBuf, Meta)>,
    /// Paired `MOVED_FROM`: the target reports the move.
    moved_to: Option<PathBuf>,
    cookie: Option<u32>,
}

impl Machine {
    pub fn new(cfg: Config, feed: ChangeFeed) -> Machine {
        Machine {
            cfg,
            feed,
            subs: HashMap::new(),
            dirs: HashMap::new(),
            by_wd: HashMap::new(),
            pending: HashMap::new(),
            moves: HashMap::new(),
        }
    }

    /// Kernel watches held.
    pub fn watched_dirs(&self) -> usize {
        self.dirs.len()
    }

    pub fn is_subscribed(&self, uri: &str) -> bool {
        self.subs.contains_key(uri)
    }
}

#[cfg(test)]
mod tests;
