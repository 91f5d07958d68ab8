//! The file source's state machine: inotify records in, file events and changed URIs out.
//!
//! It knows nothing of file descriptors or threads. It is fed `(wd, mask, cookie, name)`
//! records with the time they were read, asks a [`Disk`] to stat, list, and add or remove
//! kernel watches, and writes what it decides into the subscriptions' event rings and the
//! change feed. A fake `Disk` drives it in the unit tests below, overflow included; the real
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

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use inotify::EventMask;
use serde_json::{Map, Value};

use super::glob::Glob;
use crate::mcp::hub::ChangeFeed;
use crate::mcp::ring::EventRing;

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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    Other,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::File => "file",
            Kind::Dir => "dir",
            Kind::Symlink => "symlink",
            Kind::Other => "other",
        }
    }
}

/// What a stat tells (without following symlinks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meta {
    pub kind: Kind,
    pub size: u64,
    /// Nanoseconds since the epoch.
    pub mtime_ns: i64,
}

impl Meta {
    pub fn from_std(m: &std::fs::Metadata) -> Meta {
        use std::os::unix::fs::MetadataExt;
        let ft = m.file_type();
        let kind = if ft.is_symlink() {
            Kind::Symlink
        } else if ft.is_dir() {
            Kind::Dir
        } else if ft.is_file() {
            Kind::File
        } else {
            Kind::Other
        };
        Meta {
            kind,
            size: if kind == Kind::Dir { 0 } else { m.len() },
            mtime_ns: mtime_ns(m.mtime(), m.mtime_nsec()),
        }
    }

    /// From a raw `stat` (an `fstatat` with `AT_SYMLINK_NOFOLLOW`).
    pub fn from_stat(st: &libc::stat) -> Meta {
        let kind = match st.st_mode & libc::S_IFMT {
            libc::S_IFLNK => Kind::Symlink,
            libc::S_IFDIR => Kind::Dir,
            libc::S_IFREG => Kind::File,
            _ => Kind::Other,
        };
        Meta {
            kind,
            size: if kind == Kind::Dir {
                0
            } else {
                st.st_size.max(0) as u64
            },
            mtime_ns: mtime_ns(st.st_mtime, st.st_mtime_nsec),
        }
    }

    /// `{"kind", "size", "mtime"}`.
    pub fn json(&self) -> Value {
        let mut o = Map::new();
        o.insert("kind".into(), self.kind.as_str().into());
        o.insert("size".into(), self.size.into());
        o.insert("mtime".into(), rfc3339(self.mtime_ns).into());
        Value::Object(o)
    }
}

/// Seconds and nanoseconds as nanoseconds since the epoch, saturating at the ends of `i64`
/// (a file system can hold mtimes far past 2262).
pub fn mtime_ns(sec: i64, nsec: i64) -> i64 {
    (i128::from(sec) * 1_000_000_000 + i128::from(nsec)).clamp(i64::MIN.into(), i64::MAX.into())
        as i64
}

/// RFC 3339 UTC with milliseconds, e.g. `2026-11-30T10:13:30.123Z` (shared with the event
/// timestamps of `events/poll`).
pub use crate::mcp::events::rfc3339;

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

/// What a subscription watches.
#[derive(Debug, Clone, PartialEq)]
pub struct Spec {
    /// Canonical path of the file or directory.
    pub base: PathBuf,
    /// The root it lies under (canonical).
    pub root: PathBuf,
    pub mode: Mode,
}

impl Spec {
    /// The directories watched for one name each, so the base is seen going and coming back
    /// however much of its path goes: every directory from the root down to the base's
    /// parent (top first); for a base that is the root, the root's parent.
    pub fn chain(&self) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = self
            .base
            .ancestors()
            .skip(1)
            .filter(|a| a.starts_with(&self.root))
            .map(Path::to_owned)
            .collect();
        if v.is_empty()
            && let Some(p) = self.base.parent()
        {
            v.push(p.to_owned());
        }
        v.reverse();
        v
    }

    /// The one name this subscription needs in directory `d` of its chain: the next
    /// component of the base below `d`.
    fn name_in(&self, d: &Path) -> Option<&str> {
        if !(d.starts_with(&self.root) || self.base.parent() == Some(d)) {
            return None;
        }
        match self.base.strip_prefix(d).ok()?.components().next()? {
            std::path::Component::Normal(n) => n.to_str(),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Mode {
    /// `file:///...`: the base itself and, for a directory, its entries.
    State,
    /// `file-events://watch/...`: an event log.
    Events { recursive: bool, glob: Option<Glob> },
}

#[derive(Debug, Clone)]
pub struct Config {
    pub debounce: Duration,
    pub max_watches: usize,
    pub ring_capacity: usize,
}

/// Why a subscription could not start.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SubError {
    #[error(
        "watching this needs more than {max} watched directories, the limit (--max-watches); watch a smaller tree or raise the limit"
    )]
    Limit { max: usize },
    #[error(
        "the kernel's inotify watch limit is reached; raise fs.inotify.max_user_watches (sysctl) or watch a smaller tree"
    )]
    KernelLimit,
    #[error("its directory does not exist; create it first")]
    Missing,
    #[error("cannot watch it: {0}")]
    Io(String),
}

struct Sub {
    uri: String,
    spec: Spec,
    refs: usize,
    ring: Option<Arc<EventRing>>,
}

impl Sub {
    fn recursive(&self) -> bool {
        matches!(
            self.spec.mode,
            Mode::Events {
                recursive: true,
                ..
            }
        )
    }

    /// Whether an event about `p` belongs to this subscription.
    fn covers(&self, p: &Path) -> bool {
        let base = &self.spec.base;
        let inside = p == base
            || p.parent() == Some(base.as_path())
            || (self.recursive() && p.starts_with(base));
        if !inside {
            return false;
        }
        match &self.spec.mode {
            Mode::Events { glob: Some(g), .. } if p != base => p
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| g.matches(n)),
            _ => true,
        }
    }

    /// Whether this subscription wants the entries of directory `d`.
    fn wants_contents(&self, d: &Path) -> bool {
        d == self.spec.base || (self.recursive() && d.starts_with(&self.spec.base))
    }
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

/// One settled change.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub kind: &'static str,
    pub path: PathBuf,
    pub from: Option<PathBuf>,
    pub meta: Option<Meta>,
    pub old: Option<Meta>,
    pub replaced: bool,
}

impl Change {
    fn new(kind: &'static str, path: PathBuf, meta: Option<Meta>, old: Option<Meta>) -> Change {
        Change {
            kind,
            path,
            from: None,
            meta,
            old,
            replaced: false,
        }
    }

    /// The event's fields: `path` (and `key`, for the watch client's default line and
    /// per-object dedupe), `kind`, `size`, `mtime`, `object`; `old` on MODIFIED; `from`/`to`
    /// on MOVED.
    pub fn fields(&self) -> Map<String, Value> {
        let mut f = Map::new();
        let path = self.path.to_string_lossy().into_owned();
        f.insert("path".into(), path.clone().into());
        match &self.from {
            Some(from) => {
                let from = from.to_string_lossy().into_owned();
                f.insert("key".into(), format!("{from} → {path}").into());
                f.insert("from".into(), from.into());
                f.insert("to".into(), path.into());
                if self.replaced {
                    f.insert("replaced".into(), true.into());
                }
            }
            None => {
                f.insert("key".into(), path.into());
            }
        }
        if let Some(m) = self.meta.or(self.old) {
            f.insert("kind".into(), m.kind.as_str().into());
            f.insert("size".into(), m.size.into());
            f.insert("mtime".into(), rfc3339(m.mtime_ns).into());
            f.insert("object".into(), m.json());
        }
        if self.kind == "MODIFIED"
            && let Some(o) = self.old
        {
            f.insert("old".into(), o.json());
        }
        f
    }
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

    /// One more holder of `uri`. The first one starts watching (and may fail; then nothing
    /// is left behind). Returns the event ring of an event-log subscription.
    pub fn subscribe(
        &mut self,
        disk: &mut dyn Disk,
        uri: &str,
        spec: Spec,
    ) -> Result<Option<Arc<EventRing>>, SubError> {
        if let Some(s) = self.subs.get_mut(uri) {
            s.refs += 1;
            return Ok(s.ring.clone());
        }
        let ring = match spec.mode {
            Mode::Events { .. } => Some(Arc::new(EventRing::new(self.cfg.ring_capacity))),
            Mode::State => None,
        };
        let spec2 = spec.clone();
        self.subs.insert(
            uri.to_owned(),
            Sub {
                uri: uri.to_owned(),
                spec,
                refs: 1,
                ring: ring.clone(),
            },
        );
        match self.start(disk, &spec2) {
            Ok(()) => Ok(ring),
            Err(e) => {
                self.subs.remove(uri);
                self.prune(disk);
                Err(e)
            }
        }
    }

    fn start(&mut self, disk: &mut dyn Disk, spec: &Spec) -> Result<(), SubError> {
        let base = &spec.base;
        for d in spec.chain() {
            match self.watch_dir(disk, &d) {
                Ok(_) => {}
                // The root's parent (watched to see the root itself go and come back) lies
                // outside the roots and may be unreadable: best effort.
                Err(e) if !d.starts_with(&spec.root) => {
                    tracing::debug!(dir = %d.display(), error = %e, "the root's parent is not watched");
                }
                Err(e) => return Err(e),
            }
        }
        if disk.stat(base).is_some_and(|m| m.kind == Kind::Dir) {
            self.add_tree(disk, base, None)?;
        } else if base.parent().is_none() {
            return Err(SubError::Missing);
        }
        Ok(())
    }

    /// One holder of `uri` left; the last one stops watching what nobody else needs.
    pub fn unsubscribe(&mut self, disk: &mut dyn Disk, uri: &str) {
        let Some(s) = self.subs.get_mut(uri) else {
            return;
        };
        s.refs -= 1;
        if s.refs == 0 {
            self.subs.remove(uri);
            self.prune(disk);
        }
    }

    fn needs_contents(&self, d: &Path) -> bool {
        self.subs.values().any(|s| s.wants_contents(d))
    }

    fn wants_name(&self, d: &Path, name: &str) -> bool {
        self.subs.values().any(|s| s.spec.name_in(d) == Some(name))
    }

    /// The names some subscription needs in `d` (the next component of its base).
    fn names_in(&self, d: &Path) -> HashSet<String> {
        self.subs
            .values()
            .filter_map(|s| s.spec.name_in(d).map(str::to_owned))
            .collect()
    }

    fn needed(&self, d: &Path) -> bool {
        self.subs
            .values()
            .any(|s| s.wants_contents(d) || s.spec.name_in(d).is_some())
    }

    /// Drops the watches nobody needs, and the entries of directories only watched for a name.
    fn prune(&mut self, disk: &mut dyn Disk) {
        let paths: Vec<PathBuf> = self.dirs.keys().cloned().collect();
        for p in paths {
            if !self.needed(&p) {
                self.drop_dir(disk, &p);
            } else if !self.needs_contents(&p) {
                let keep = self.names_in(&p);
                if let Some(d) = self.dirs.get_mut(&p) {
                    d.full = false;
                    d.entries.retain(|k, _| keep.contains(k));
                }
            }
        }
        self.pending.retain(|p, _| {
            p.parent()
                .is_some_and(|d| self.dirs.contains_key(d) || self.dirs.contains_key(p))
        });
        self.moves.retain(|_, (p, _)| self.pending.contains_key(p));
    }

    fn drop_dir(&mut self, disk: &mut dyn Disk, p: &Path) {
        if let Some(d) = self.dirs.remove(p) {
            if d.wd != DEAD {
                disk.rm_watch(d.wd);
            }
            if self.by_wd.get(&d.wd).map(PathBuf::as_path) == Some(p) {
                self.by_wd.remove(&d.wd);
            }
        }
    }

    /// Drops `p` and every watched directory under it.
    fn drop_tree(&mut self, disk: &mut dyn Disk, p: &Path) {
        let under: Vec<PathBuf> = self
            .dirs
            .keys()
            .filter(|d| d.starts_with(p))
            .cloned()
            .collect();
        for d in under {
            self.drop_dir(disk, &d);
        }
    }

    /// Watches directory `p` (if not yet), and makes sure its snapshot is full if someone
    /// wants its contents. Returns the entries found when the watch was new.
    fn watch_dir(
        &mut self,
        disk: &mut dyn Disk,
        p: &Path,
    ) -> Result<Option<Vec<(String, Meta)>>, SubError> {
        let full = self.needs_contents(p);
        if let Some(d) = self.dirs.get_mut(p) {
            if full && !d.full {
                d.full = true;
                d.entries = disk.list(p).unwrap_or_default().into_iter().collect();
            } else if !full {
                for n in self.subs.values().filter_map(|s| s.spec.name_in(p)) {
                    if !d.entries.contains_key(n)
                        && let Some(m) = disk.stat(&p.join(n))
                    {
                        d.entries.insert(n.to_owned(), m);
                    }
                }
            }
            return Ok(None);
        }
        if self.dirs.len() >= self.cfg.max_watches {
            return Err(SubError::Limit {
                max: self.cfg.max_watches,
            });
        }
        let wd = disk.add_watch(p).map_err(|e| match e.raw_os_error() {
            Some(libc::ENOSPC) => SubError::KernelLimit,
            Some(libc::ENOENT) | Some(libc::ENOTDIR) => SubError::Missing,
            _ => SubError::Io(e.to_string()),
        })?;
        // After the watch exists, so nothing that happens from here on is missed.
        let listed: Vec<(String, Meta)> = if full {
            disk.list(p).unwrap_or_default()
        } else {
            self.names_in(p)
                .into_iter()
                .filter_map(|n| {
                    let m = disk.stat(&p.join(&n))?;
                    Some((n, m))
                })
                .collect()
        };
        self.by_wd.insert(wd, p.to_owned());
        self.dirs.insert(
            p.to_owned(),
            Dir {
                wd,
                full,
                entries: listed.iter().cloned().collect(),
            },
        );
        Ok(Some(listed))
    }

    /// Watches directory `p` and, where a recursive subscription covers them, its
    /// subdirectories. With `found`, what the scans of newly watched directories hold is
    /// reported as created (a directory that appeared at run time).
    fn add_tree(
        &mut self,
        disk: &mut dyn Disk,
        p: &Path,
        mut found: Option<&mut Vec<Change>>,
    ) -> Result<(), SubError> {
        let mut stack = vec![p.to_owned()];
        while let Some(d) = stack.pop() {
            let listed = self.watch_dir(disk, &d)?;
            let entries: Vec<(String, Meta)> = match listed {
                Some(l) => {
                    if let Some(found) = found.as_deref_mut() {
                        for (n, m) in &l {
                            found.push(Change::new("CREATED", d.join(n), Some(*m), None));
                        }
                    }
                    l
                }
                None => self.dirs[&d]
                    .entries
                    .iter()
                    .map(|(n, m)| (n.clone(), *m))
                    .collect(),
            };
            for (n, m) in entries {
                let child = d.join(&n);
                // Wanted whole and not yet listed whole, or on a subscription's chain (the
                // next directory down to its base, come back) and not watched yet.
                if m.kind == Kind::Dir
                    && ((self.needs_contents(&child)
                        && !self.dirs.get(&child).is_some_and(|c| c.full))
                        || (self.needed(&child) && !self.dirs.contains_key(&child)))
                {
                    stack.push(child);
                }
            }
        }
        Ok(())
    }

    /// The next time [`Machine::flush`] has work.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.pending.values().map(|p| p.deadline).min()
    }

    fn pend(&mut self, path: PathBuf, now: Instant, min_wait: Duration) -> &mut Pending {
        let w = self.cfg.debounce.max(min_wait);
        self.pending.entry(path).or_insert_with(|| Pending {
            first: now,
            deadline: now + w,
            created: false,
            wrote: false,
            moved_from: None,
            moved_to: None,
            cookie: None,
        })
    }

    fn snapshot(&self, p: &Path) -> Option<Meta> {
        let dir = self.dirs.get(p.parent()?)?;
        dir.entries.get(p.file_name()?.to_str()?).copied()
    }

    /// Feeds one record read at `now`.
    pub fn feed(&mut self, disk: &mut dyn Disk, rec: Record, now: Instant) {
        if rec.mask.contains(EventMask::Q_OVERFLOW) {
            self.overflow(disk, now);
            return;
        }
        let Some(dir) = self.by_wd.get(&rec.wd).cloned() else {
            return;
        };
        if rec.mask.intersects(EventMask::IGNORED | EventMask::UNMOUNT) {
            // The kernel dropped the watch (directory gone). Keep the directory's listing
            // until its path settles, so its entries' deletions (read in the same batch,
            // just before this) still know what they were.
            if let Some(d) = self.dirs.get_mut(&dir)
                && d.wd == rec.wd
            {
                d.wd = DEAD;
            }
            self.by_wd.remove(&rec.wd);
            self.pend(dir, now, Duration::ZERO);
            return;
        }
        if rec.mask.contains(EventMask::DELETE_SELF) {
            // The parent's watch normally reports this too (same pending entry); a directory
            // whose parent is not watched learns it only here.
            self.pend(dir, now, Duration::ZERO);
            return;
        }
        let Some(name) = rec.name else {
            return;
        };
        let Some(name) = name.to_str() else {
            tracing::debug!(dir = %dir.display(), "skipping an entry whose name is not UTF-8");
            return;
        };
        let full = self.dirs.get(&dir).is_some_and(|d| d.full);
        if !full && !self.wants_name(&dir, name) {
            return;
        }
        let path = dir.join(name);
        let m = rec.mask;
        if m.contains(EventMask::CREATE) {
            self.pend(path, now, Duration::ZERO).created = true;
        } else if m.contains(EventMask::MODIFY) {
            self.pend(path, now, DIRTY_MIN).wrote = true;
        } else if m.contains(EventMask::CLOSE_WRITE) {
            let w = self.cfg.debounce;
            let p = self.pend(path, now, Duration::ZERO);
            p.wrote = true;
            p.deadline = p.deadline.min(p.first + w);
        } else if m.contains(EventMask::DELETE) {
            self.pend(path, now, Duration::ZERO);
        } else if m.contains(EventMask::MOVED_FROM) {
            let before = self.snapshot(&path);
            self.moves.insert(rec.cookie, (path.clone(), before));
            self.pend(path, now, Duration::ZERO).cookie = Some(rec.cookie);
        } else if m.contains(EventMask::MOVED_TO) {
            match self.moves.remove(&rec.cookie) {
                // A file that was not there when its window began: a temp file renamed over
                // the target is a write to the target.
                Some((_, None)) => {
                    self.pend(path, now, Duration::ZERO).wrote = true;
                }
                Some((from, Some(was))) => {
                    if let Some(src) = self.pending.get_mut(&from) {
                        src.moved_to = Some(path.clone());
                    }
                    if m.contains(EventMask::ISDIR) {
                        self.repath(&from, &path);
                    }
                    self.pend(path, now, Duration::ZERO).moved_from = Some((from, was));
                }
                None => {
                    self.pend(path, now, Duration::ZERO).created = true;
                }
            }
        }
    }

    /// A watched directory moved from `from` to `to`: its watches follow the inode, so only
    /// the paths change.
    fn repath(&mut self, from: &Path, to: &Path) {
        let moved: Vec<PathBuf> = self
            .dirs
            .keys()
            .filter(|d| d.starts_with(from))
            .cloned()
            .collect();
        for old in moved {
            let Ok(rel) = old.strip_prefix(from) else {
                continue;
            };
            let new = if rel.as_os_str().is_empty() {
                to.to_owned()
            } else {
                to.join(rel)
            };
            if let Some(d) = self.dirs.remove(&old) {
                self.by_wd.insert(d.wd, new.clone());
                self.dirs.insert(new, d);
            }
        }
        // What is pending inside moved with it: it settles under its new name (a file written
        // just before its directory was renamed is created at the new path).
        let under = |p: &Path| p.starts_with(from) && p != from;
        let re = |p: &Path| to.join(p.strip_prefix(from).expect("under from"));
        let keys: Vec<PathBuf> = self.pending.keys().filter(|p| under(p)).cloned().collect();
        for k in keys {
            let Some(mut p) = self.pending.remove(&k) else {
                continue;
            };
            if let Some(t) = p.moved_to.as_mut()
                && under(t)
            {
                *t = re(t);
            }
            let new = re(&k);
            match self.pending.get_mut(&new) {
                Some(q) => {
                    q.first = q.first.min(p.first);
                    q.deadline = q.deadline.min(p.deadline);
                    q.created |= p.created;
                    q.wrote |= p.wrote;
                }
                None => {
                    self.pending.insert(new, p);
                }
            }
        }
        for (path, _) in self.moves.values_mut() {
            if under(path) {
                *path = re(path);
            }
        }
    }

    /// Settles every path whose window has closed by `now`, and emits what changed.
    pub fn flush(&mut self, disk: &mut dyn Disk, now: Instant) {
        let mut due: Vec<(PathBuf, Pending)> = Vec::new();
        let keys: Vec<PathBuf> = self
            .pending
            .iter()
            .filter(|(_, p)| p.deadline <= now)
            .map(|(k, _)| k.clone())
            .collect();
        for k in keys {
            if let Some(p) = self.pending.remove(&k) {
                due.push((k, p));
            }
        }
        if due.is_empty() {
            return;
        }
        // Oldest first; at the same instant, deeper paths first, so the entries of a removed
        // directory settle before the directory does.
        due.sort_by_key(|(k, p)| (p.first, std::cmp::Reverse(k.components().count())));
        let mut changes = Vec::new();
        for (path, p) in due {
            self.settle(disk, path, p, &mut changes);
        }
        self.emit(changes, false);
    }

    fn set_snapshot(&mut self, p: &Path, m: Option<Meta>) {
        let (Some(parent), Some(name)) = (p.parent(), p.file_name().and_then(|n| n.to_str()))
        else {
            return;
        };
        let wanted = self.dirs.get(parent).is_some_and(|d| d.full) || self.wants_name(parent, name);
        if let Some(d) = self.dirs.get_mut(parent) {
            match m {
                Some(m) if wanted => {
                    d.entries.insert(name.to_owned(), m);
                }
                _ => {
                    d.entries.remove(name);
                }
            }
        }
    }

    /// Decides the net change of one path from what it was, what it is, and what happened.
    fn settle(&mut self, disk: &mut dyn Disk, path: PathBuf, p: Pending, out: &mut Vec<Change>) {
        if let Some(c) = p.cookie {
            self.moves.remove(&c);
        }
        let mut before = self.snapshot(&path);
        if before.is_none() && self.dirs.contains_key(&path) && p.moved_from.is_none() {
            // A watched directory whose parent is not watched.
            before = Some(Meta {
                kind: Kind::Dir,
                size: 0,
                mtime_ns: 0,
            });
        }
        let now = disk.stat(&path);
        self.set_snapshot(&path, now);
        if let Some((from, was)) = p.moved_from {
            match now {
                Some(m) => out.push(Change {
                    kind: "MOVED",
                    path: path.clone(),
                    from: Some(from),
                    meta: Some(m),
                    old: Some(was),
                    replaced: before.is_some(),
                }),
                None => {
                    // Moved, then gone again within the window.
                    out.push(Change::new("DELETED", from, None, Some(was)));
                    if let Some(b) = before {
                        out.push(Change::new("DELETED", path.clone(), None, Some(b)));
                    }
                }
            }
        } else if p.moved_to.is_some() {
            // Renamed away: the target's settle reports the move. Something new at the old
            // name is a creation.
            if let Some(m) = now {
                out.push(Change::new("CREATED", path.clone(), Some(m), None));
            }
        } else {
            match (before, now) {
                (None, None) => {}
                (None, Some(m)) => out.push(Change::new("CREATED", path.clone(), Some(m), None)),
                (Some(b), None) => out.push(Change::new("DELETED", path.clone(), None, Some(b))),
                (Some(b), Some(m)) => {
                    if b != m || (p.wrote && !p.created) {
                        out.push(Change::new("MODIFIED", path.clone(), Some(m), Some(b)));
                    }
                }
            }
        }
        match now {
            Some(m) if m.kind == Kind::Dir => {
                if self.dirs.get(&path).is_some_and(|d| d.wd == DEAD) {
                    // The kernel dropped its watch (unmounted over, or removed and made again
                    // within the window): start afresh.
                    self.dirs.remove(&path);
                }
                if self.needed(&path) && !self.dirs.get(&path).is_some_and(|d| d.full) {
                    let mut found = Vec::new();
                    if let Err(e) = self.add_tree(disk, &path, Some(&mut found)) {
                        self.error_for(&path, &format!("{} is not watched: {e}", path.display()));
                    }
                    out.extend(found);
                }
            }
            // A file that is still there: there is nothing under it to drop.
            Some(_) if before.is_none_or(|b| b.kind != Kind::Dir) => {}
            _ => {
                // Whatever is still pending under it settles first, against the listings
                // that are about to go.
                let mut under: Vec<PathBuf> = self
                    .pending
                    .keys()
                    .filter(|k| k.starts_with(&path) && **k != path)
                    .cloned()
                    .collect();
                under.sort_by_key(|k| std::cmp::Reverse(k.components().count()));
                for k in under {
                    if let Some(p) = self.pending.remove(&k) {
                        self.settle(disk, k, p, out);
                    }
                }
                self.drop_tree(disk, &path)
            }
        }
    }

    /// An in-band ERROR for every event log that covers `p`.
    fn error_for(&self, p: &Path, message: &str) {
        for s in self.subs.values() {
            if let Some(r) = &s.ring
                && s.covers(p)
            {
                r.push_error(message);
                self.feed.publish(&s.uri);
            }
        }
    }

    /// Writes `changes` into the rings that cover them and publishes the URIs they touch.
    /// With `all`, every subscription is published as well (after an overflow: every event
    /// log got its `OVERFLOW`, every state may have changed).
    fn emit(&self, changes: Vec<Change>, all: bool) {
        let mut publish: Vec<&str> = Vec::new();
        for c in &changes {
            let fields = c.fields();
            for s in self.subs.values() {
                let hit = s.covers(&c.path) || c.from.as_deref().is_some_and(|f| s.covers(f));
                if !hit {
                    continue;
                }
                if let Some(r) = &s.ring {
                    r.push(c.kind, fields.clone());
                    let base_gone = (c.kind == "DELETED" && c.path == s.spec.base)
                        || (c.kind == "MOVED" && c.from.as_deref() == Some(s.spec.base.as_path()));
                    if base_gone {
                        r.push_error(&format!(
                            "{} is gone (deleted or moved away); reads of it fail until it exists again, and events resume then",
                            s.spec.base.display()
                        ));
                    }
                }
                if !publish.contains(&s.uri.as_str()) {
                    publish.push(&s.uri);
                }
            }
        }
        if all {
            for s in self.subs.values() {
                if !publish.contains(&s.uri.as_str()) {
                    publish.push(&s.uri);
                }
            }
        }
        for uri in publish {
            self.feed.publish(uri);
        }
    }

    /// `IN_Q_OVERFLOW`: events were lost. Tell every event log, settle what is pending,
    /// rescan every watched directory against its last listing, and emit the differences.
    pub fn overflow(&mut self, disk: &mut dyn Disk, _now: Instant) {
        for s in self.subs.values() {
            if let Some(r) = &s.ring {
                let mut f = Map::new();
                f.insert(
                    "message".into(),
                    "the kernel's inotify queue overflowed and events were lost; herald rescanned the watched directories and the events that follow are what changed".into(),
                );
                r.push("OVERFLOW", f);
            }
        }
        let mut changes = Vec::new();
        let mut due: Vec<(PathBuf, Pending)> = self.pending.drain().collect();
        due.sort_by_key(|(k, p)| (p.first, std::cmp::Reverse(k.components().count())));
        for (path, p) in due {
            self.settle(disk, path, p, &mut changes);
        }
        self.moves.clear();
        let mut dirs: Vec<PathBuf> = self.dirs.keys().cloned().collect();
        dirs.sort();
        // The kernel's own notices (IGNORED) may be among what was lost, or a path may now be
        // another directory: add every watch again. The same wd is the same directory; another
        // one means the old watch is dead or on a directory elsewhere, so the new one replaces
        // it (and the rescan below compares the directory against its last listing).
        let mut live: HashSet<Wd> = HashSet::new();
        let mut stale: Vec<Wd> = Vec::new();
        let mut gone: HashSet<PathBuf> = HashSet::new();
        for d in &dirs {
            let Some(old) = self.dirs.get(d).map(|x| x.wd) else {
                continue;
            };
            match disk.add_watch(d) {
                Ok(wd) => {
                    live.insert(wd);
                    if wd != old {
                        stale.push(old);
                        if let Some(x) = self.dirs.get_mut(d) {
                            x.wd = wd;
                        }
                    }
                }
                Err(_) => {
                    gone.insert(d.clone());
                }
            }
        }
        for w in stale {
            if w != DEAD && !live.contains(&w) {
                disk.rm_watch(w);
            }
        }
        self.by_wd = self
            .dirs
            .iter()
            .filter(|(p, d)| d.wd != DEAD && !gone.contains(*p))
            .map(|(p, d)| (d.wd, p.clone()))
            .collect();
        for d in dirs {
            if gone.contains(&d) {
                // Gone (or no longer a directory beneath the root): its parent's rescan
                // reports it.
                self.drop_tree(disk, &d);
                continue;
            }
            let Some(dir) = self.dirs.get(&d) else {
                continue;
            };
            let full = dir.full;
            let fresh: HashMap<String, Meta> = if full {
                match disk.list(&d) {
                    Ok(l) => l.into_iter().collect(),
                    Err(_) => {
                        // Gone: its parent's rescan reports it.
                        self.drop_tree(disk, &d);
                        continue;
                    }
                }
            } else {
                self.names_in(&d)
                    .into_iter()
                    .filter_map(|n| {
                        let m = disk.stat(&d.join(&n))?;
                        Some((n, m))
                    })
                    .collect()
            };
            let old = std::mem::take(&mut self.dirs.get_mut(&d).expect("present").entries);
            let mut names: Vec<&String> = old.keys().chain(fresh.keys()).collect();
            names.sort();
            names.dedup();
            let mut appeared_dirs = Vec::new();
            for n in names {
                let p = d.join(n);
                match (old.get(n), fresh.get(n)) {
                    (None, Some(m)) => {
                        changes.push(Change::new("CREATED", p.clone(), Some(*m), None));
                        if m.kind == Kind::Dir {
                            appeared_dirs.push(p);
                        }
                    }
                    (Some(o), None) => {
                        changes.push(Change::new("DELETED", p.clone(), None, Some(*o)));
                        self.drop_tree(disk, &p);
                    }
                    (Some(o), Some(m)) if o != m => {
                        changes.push(Change::new("MODIFIED", p.clone(), Some(*m), Some(*o)));
                        if o.kind == Kind::Dir && m.kind != Kind::Dir {
                            self.drop_tree(disk, &p);
                        } else if m.kind == Kind::Dir {
                            appeared_dirs.push(p);
                        }
                    }
                    _ => {}
                }
            }
            if let Some(dir) = self.dirs.get_mut(&d) {
                dir.entries = fresh;
            }
            for p in appeared_dirs {
                if self.needed(&p) && !self.dirs.get(&p).is_some_and(|x| x.full) {
                    let mut found = Vec::new();
                    if let Err(e) = self.add_tree(disk, &p, Some(&mut found)) {
                        self.error_for(&p, &format!("{} is not watched: {e}", p.display()));
                    }
                    changes.extend(found);
                }
            }
        }
        self.emit(changes, true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// An in-memory file system with fake watches.
    #[derive(Default)]
    struct FakeDisk {
        files: BTreeMap<PathBuf, Meta>,
        watches: BTreeMap<PathBuf, Wd>,
        next_wd: Wd,
        limit: Option<usize>,
    }

    fn file(size: u64, t: i64) -> Meta {
        Meta {
            kind: Kind::File,
            size,
            mtime_ns: t,
        }
    }

    fn dir() -> Meta {
        Meta {
            kind: Kind::Dir,
            size: 0,
            mtime_ns: 0,
        }
    }

    impl FakeDisk {
        fn put(&mut self, p: &str, m: Meta) {
            self.files.insert(PathBuf::from(p), m);
        }
        fn rm(&mut self, p: &str) {
            let p = PathBuf::from(p);
            self.files.retain(|k, _| !k.starts_with(&p));
        }
        fn wd(&self, p: &str) -> Wd {
            self.watches[Path::new(p)]
        }
    }

    impl Disk for FakeDisk {
        fn stat(&self, path: &Path) -> Option<Meta> {
            if path == Path::new("/") {
                return Some(dir());
            }
            self.files.get(path).copied()
        }
        fn list(&self, d: &Path) -> std::io::Result<Vec<(String, Meta)>> {
            if self.stat(d).map(|m| m.kind) != Some(Kind::Dir) {
                return Err(std::io::Error::from_raw_os_error(libc::ENOENT));
            }
            Ok(self
                .files
                .iter()
                .filter(|(k, _)| k.parent() == Some(d))
                .map(|(k, m)| (k.file_name().unwrap().to_str().unwrap().to_owned(), *m))
                .collect())
        }
        fn add_watch(&mut self, d: &Path) -> std::io::Result<Wd> {
            if self.stat(d).map(|m| m.kind) != Some(Kind::Dir) {
                return Err(std::io::Error::from_raw_os_error(libc::ENOENT));
            }
            if let Some(w) = self.watches.get(d) {
                return Ok(*w);
            }
            if self.limit.is_some_and(|l| self.watches.len() >= l) {
                return Err(std::io::Error::from_raw_os_error(libc::ENOSPC));
            }
            self.next_wd += 1;
            self.watches.insert(d.to_owned(), self.next_wd);
            Ok(self.next_wd)
        }
        fn rm_watch(&mut self, wd: Wd) {
            self.watches.retain(|_, w| *w != wd);
        }
    }

    fn rec(disk: &FakeDisk, dir: &str, mask: EventMask, name: &str, cookie: u32) -> Record {
        Record {
            wd: disk.wd(dir),
            mask,
            cookie,
            name: Some(name.into()),
        }
    }

    struct T {
        m: Machine,
        disk: FakeDisk,
        t0: Instant,
        feed: ChangeFeed,
    }

    impl T {
        fn new() -> T {
            let feed = ChangeFeed::new();
            let mut disk = FakeDisk::default();
            disk.put("/r", dir());
            disk.put("/r/d", dir());
            disk.put("/r/d/a.txt", file(1, 10));
            disk.put("/r/e", dir());
            T {
                m: Machine::new(
                    Config {
                        debounce: Duration::from_millis(50),
                        max_watches: 100,
                        ring_capacity: 64,
                    },
                    feed.clone(),
                ),
                disk,
                t0: Instant::now(),
                feed,
            }
        }
        fn events(&mut self, uri: &str, base: &str, recursive: bool) -> Arc<EventRing> {
            self.m
                .subscribe(
                    &mut self.disk,
                    uri,
                    Spec {
                        base: base.into(),
                        root: "/r".into(),
                        mode: Mode::Events {
                            recursive,
                            glob: None,
                        },
                    },
                )
                .unwrap()
                .unwrap()
        }
        fn at(&self, ms: u64) -> Instant {
            self.t0 + Duration::from_millis(ms)
        }
        fn feed(&mut self, dir: &str, mask: EventMask, name: &str, cookie: u32, ms: u64) {
            let r = rec(&self.disk, dir, mask, name, cookie);
            let now = self.at(ms);
            self.m.feed(&mut self.disk, r, now);
        }
        fn flush(&mut self, ms: u64) {
            let now = self.at(ms);
            self.m.flush(&mut self.disk, now);
        }
    }

    fn events(r: &EventRing) -> Vec<Value> {
        let v: Value = serde_json::from_str(&r.read_json()).unwrap();
        v["events"].as_array().unwrap().clone()
    }

    fn summary(r: &EventRing) -> Vec<String> {
        events(r)
            .iter()
            .map(|e| {
                let t = e["type"].as_str().unwrap();
                match e.get("from") {
                    Some(f) => format!(
                        "{t} {} -> {}",
                        f.as_str().unwrap(),
                        e["to"].as_str().unwrap()
                    ),
                    None => format!("{t} {}", e["path"].as_str().unwrap_or("")),
                }
            })
            .collect()
    }

    #[test]
    fn create_write_close_is_one_created_after_the_window() {
        let mut t = T::new();
        let ring = t.events("e", "/r/d", false);
        t.disk.put("/r/d/b.txt", file(3, 20));
        t.feed("/r/d", EventMask::CREATE, "b.txt", 0, 0);
        t.feed("/r/d", EventMask::MODIFY, "b.txt", 0, 1);
        t.feed("/r/d", EventMask::CLOSE_WRITE, "b.txt", 0, 2);
        assert_eq!(t.m.next_deadline(), Some(t.at(50)));
        t.flush(49);
        assert!(summary(&ring).is_empty(), "the window is still open");
        t.flush(50);
        assert_eq!(summary(&ring), ["CREATED /r/d/b.txt"]);
        let e = &events(&ring)[0];
        assert_eq!(e["size"], 3);
        assert_eq!(e["kind"], "file");
        assert_eq!(e["key"], "/r/d/b.txt");
        assert_eq!(t.m.next_deadline(), None);
    }

    #[test]
    fn a_burst_of_writes_is_one_modified_with_old() {
        let mut t = T::new();
        let ring = t.events("e", "/r/d", false);
        for i in 0..1000u64 {
            t.disk.put("/r/d/a.txt", file(i + 2, 100 + i as i64));
            t.feed("/r/d", EventMask::MODIFY, "a.txt", 0, i / 100);
            t.feed("/r/d", EventMask::CLOSE_WRITE, "a.txt", 0, i / 100);
        }
        t.flush(60);
        let ev = events(&ring);
        assert_eq!(ev.len(), 1, "{ev:?}");
        assert_eq!(ev[0]["type"], "MODIFIED");
        assert_eq!(ev[0]["old"]["size"], 1);
        assert_eq!(ev[0]["object"]["size"], 1001);
    }

    #[test]
    fn write_to_temp_then_rename_is_one_modified_of_the_target() {
        let mut t = T::new();
        let ring = t.events("e", "/r/d", false);
        let state =
            t.m.subscribe(
                &mut t.disk,
                "s",
                Spec {
                    base: "/r/d/a.txt".into(),
                    root: "/r".into(),
                    mode: Mode::State,
                },
            )
            .unwrap();
        assert!(state.is_none());
        let reg = t.feed.register(&["s".into(), "e".into()]);
        t.disk.put("/r/d/.a.txt.swp", file(5, 30));
        t.feed("/r/d", EventMask::CREATE, ".a.txt.swp", 0, 0);
        t.feed("/r/d", EventMask::MODIFY, ".a.txt.swp", 0, 0);
        t.feed("/r/d", EventMask::CLOSE_WRITE, ".a.txt.swp", 0, 0);
        t.disk.rm("/r/d/.a.txt.swp");
        t.disk.put("/r/d/a.txt", file(5, 30));
        t.feed("/r/d", EventMask::MOVED_FROM, ".a.txt.swp", 7, 1);
        t.feed("/r/d", EventMask::MOVED_TO, "a.txt", 7, 1);
        t.flush(100);
        assert_eq!(summary(&ring), ["MODIFIED /r/d/a.txt"]);
        let mut got = futures::executor::block_on(reg.queue().next_batch());
        got.sort();
        assert_eq!(got, ["e", "s"]);
    }

    #[test]
    fn renames_within_and_across_directories_are_moved() {
        let mut t = T::new();
        let d = t.events("d", "/r/d", false);
        let e = t.events("e", "/r/e", false);
        t.disk.rm("/r/d/a.txt");
        t.disk.put("/r/d/b.txt", file(1, 10));
        t.feed("/r/d", EventMask::MOVED_FROM, "a.txt", 1, 0);
        t.feed("/r/d", EventMask::MOVED_TO, "b.txt", 1, 0);
        t.flush(100);
        assert_eq!(summary(&d), ["MOVED /r/d/a.txt -> /r/d/b.txt"]);
        t.disk.rm("/r/d/b.txt");
        t.disk.put("/r/e/c.txt", file(1, 10));
        t.feed("/r/d", EventMask::MOVED_FROM, "b.txt", 2, 200);
        t.feed("/r/e", EventMask::MOVED_TO, "c.txt", 2, 200);
        t.flush(300);
        assert_eq!(
            summary(&d),
            [
                "MOVED /r/d/a.txt -> /r/d/b.txt",
                "MOVED /r/d/b.txt -> /r/e/c.txt"
            ]
        );
        assert_eq!(summary(&e), ["MOVED /r/d/b.txt -> /r/e/c.txt"]);
        // Out of every watched directory: a deletion.
        t.disk.rm("/r/e/c.txt");
        t.feed("/r/e", EventMask::MOVED_FROM, "c.txt", 3, 400);
        t.flush(500);
        assert_eq!(summary(&e).last().unwrap(), "DELETED /r/e/c.txt");
    }

    #[test]
    fn delete_then_recreate_in_the_window_is_modified_and_later_ones_still_seen() {
        let mut t = T::new();
        let ring = t.events("e", "/r/d", false);
        t.disk.put("/r/d/a.txt", file(2, 20));
        t.feed("/r/d", EventMask::DELETE, "a.txt", 0, 0);
        t.feed("/r/d", EventMask::CREATE, "a.txt", 0, 1);
        t.feed("/r/d", EventMask::CLOSE_WRITE, "a.txt", 0, 1);
        t.flush(100);
        t.disk.rm("/r/d/a.txt");
        t.feed("/r/d", EventMask::DELETE, "a.txt", 0, 200);
        t.flush(300);
        t.disk.put("/r/d/a.txt", file(4, 40));
        t.feed("/r/d", EventMask::CREATE, "a.txt", 0, 400);
        t.flush(500);
        assert_eq!(
            summary(&ring),
            [
                "MODIFIED /r/d/a.txt",
                "DELETED /r/d/a.txt",
                "CREATED /r/d/a.txt"
            ]
        );
    }

    #[test]
    fn recursive_watch_adds_new_subdirectories_and_reports_what_they_hold() {
        let mut t = T::new();
        let ring = t.events("e", "/r", true);
        assert!(t.disk.watches.contains_key(Path::new("/r/d")));
        t.disk.put("/r/n", dir());
        t.disk.put("/r/n/early.txt", file(1, 1));
        t.feed("/r", EventMask::CREATE | EventMask::ISDIR, "n", 0, 0);
        t.flush(100);
        assert_eq!(summary(&ring), ["CREATED /r/n", "CREATED /r/n/early.txt"]);
        // Now watched: a file in it is seen.
        t.disk.put("/r/n/late.txt", file(1, 2));
        t.feed("/r/n", EventMask::CREATE, "late.txt", 0, 200);
        t.flush(300);
        assert_eq!(summary(&ring).last().unwrap(), "CREATED /r/n/late.txt");
        // Removed: dropped.
        t.disk.rm("/r/n");
        t.feed("/r/n", EventMask::DELETE, "early.txt", 0, 400);
        t.feed("/r/n", EventMask::DELETE, "late.txt", 0, 400);
        t.feed("/r", EventMask::DELETE | EventMask::ISDIR, "n", 0, 400);
        t.flush(500);
        assert!(!t.disk.watches.contains_key(Path::new("/r/n")));
        assert!(!t.m.dirs.contains_key(Path::new("/r/n")));
        // A renamed subdirectory keeps its watch under its new name.
        t.disk.rm("/r/d");
        t.disk.put("/r/d2", dir());
        t.disk.put("/r/d2/a.txt", file(1, 10));
        t.feed("/r", EventMask::MOVED_FROM | EventMask::ISDIR, "d", 9, 600);
        t.feed("/r", EventMask::MOVED_TO | EventMask::ISDIR, "d2", 9, 600);
        t.flush(700);
        assert_eq!(summary(&ring).last().unwrap(), "MOVED /r/d -> /r/d2");
        let wd = t.m.dirs[Path::new("/r/d2")].wd;
        t.disk.put("/r/d2/z", file(1, 1));
        t.m.feed(
            &mut t.disk,
            Record {
                wd,
                mask: EventMask::CREATE,
                cookie: 0,
                name: Some("z".into()),
            },
            t.t0 + Duration::from_millis(800),
        );
        t.flush(900);
        assert_eq!(summary(&ring).last().unwrap(), "CREATED /r/d2/z");
    }

    #[test]
    fn a_directory_renamed_within_the_window_takes_its_pending_entries_along() {
        let mut t = T::new();
        let ring = t.events("e", "/r", true);
        // write d/x; mv d d2, all inside one window.
        t.disk.put("/r/d/x", file(4, 4));
        t.feed("/r/d", EventMask::CREATE, "x", 0, 0);
        t.feed("/r/d", EventMask::CLOSE_WRITE, "x", 0, 1);
        let d = t.disk.files.clone();
        t.disk.rm("/r/d");
        for (k, m) in d.range(PathBuf::from("/r/d")..) {
            if let Ok(rel) = k.strip_prefix("/r/d") {
                t.disk.files.insert(Path::new("/r/d2").join(rel), *m);
            }
        }
        t.feed("/r", EventMask::MOVED_FROM | EventMask::ISDIR, "d", 5, 2);
        t.feed("/r", EventMask::MOVED_TO | EventMask::ISDIR, "d2", 5, 2);
        t.flush(100);
        let got = summary(&ring);
        assert!(got.contains(&"CREATED /r/d2/x".to_string()), "{got:?}");
        assert!(got.contains(&"MOVED /r/d -> /r/d2".to_string()), "{got:?}");
        assert!(t.m.pending.is_empty());
        assert_eq!(
            events(&ring)
                .iter()
                .find(|e| e["path"] == "/r/d2/x")
                .unwrap()["size"],
            4
        );
    }

    #[test]
    fn the_base_deleted_is_an_in_band_error_and_its_return_is_seen() {
        let mut t = T::new();
        let ring = t.events("e", "/r/d", false);
        t.disk.rm("/r/d");
        // What `rm -rf /r/d` makes the kernel say, in one read.
        let wd = t.disk.wd("/r/d");
        t.feed("/r/d", EventMask::DELETE, "a.txt", 0, 0);
        for mask in [EventMask::DELETE_SELF, EventMask::IGNORED] {
            let r = Record {
                wd,
                mask,
                cookie: 0,
                name: None,
            };
            t.m.feed(&mut t.disk, r, t.t0);
        }
        t.disk.watches.remove(Path::new("/r/d"));
        t.feed("/r", EventMask::DELETE | EventMask::ISDIR, "d", 0, 0);
        t.flush(100);
        let ev = events(&ring);
        let types: Vec<&str> = ev.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(types, ["DELETED", "DELETED", "ERROR"]);
        assert!(ev[2]["message"].as_str().unwrap().contains("/r/d is gone"));
        t.disk.put("/r/d", dir());
        t.disk.put("/r/d/new.txt", file(1, 1));
        t.feed("/r", EventMask::CREATE | EventMask::ISDIR, "d", 0, 200);
        t.flush(300);
        assert_eq!(
            summary(&ring)[3..],
            [
                "CREATED /r/d".to_string(),
                "CREATED /r/d/new.txt".to_string()
            ]
        );
        assert!(t.disk.watches.contains_key(Path::new("/r/d")));
    }

    #[test]
    fn a_deleted_parent_is_watched_for_again_and_each_level_re_arms_the_next() {
        let mut t = T::new();
        t.disk.put("/r/d/e", dir());
        t.disk.put("/r/d/e/f.json", file(1, 1));
        t.m.subscribe(
            &mut t.disk,
            "s",
            Spec {
                base: "/r/d/e/f.json".into(),
                root: "/r".into(),
                mode: Mode::State,
            },
        )
        .unwrap();
        // The whole chain from the root down, each for one name.
        for d in ["/r", "/r/d", "/r/d/e"] {
            assert!(t.disk.watches.contains_key(Path::new(d)), "{d}");
        }
        let reg = t.feed.register(&["s".into()]);
        // rm -rf /r/d
        let (wd_d, wd_e) = (t.disk.wd("/r/d"), t.disk.wd("/r/d/e"));
        t.disk.rm("/r/d");
        t.feed("/r/d/e", EventMask::DELETE, "f.json", 0, 0);
        for wd in [wd_e, wd_d] {
            for mask in [EventMask::DELETE_SELF, EventMask::IGNORED] {
                let r = Record {
                    wd,
                    mask,
                    cookie: 0,
                    name: None,
                };
                t.m.feed(&mut t.disk, r, t.t0);
            }
        }
        t.disk.watches.remove(Path::new("/r/d"));
        t.disk.watches.remove(Path::new("/r/d/e"));
        t.feed("/r", EventMask::DELETE | EventMask::ISDIR, "d", 0, 0);
        t.flush(100);
        assert_eq!(futures::executor::block_on(reg.queue().next_batch()), ["s"]);
        assert!(
            t.disk.watches.contains_key(Path::new("/r")),
            "still watched for d"
        );
        assert!(!t.m.dirs.contains_key(Path::new("/r/d")));
        // mkdir -p /r/d/e && cp f.json /r/d/e/: all of it before herald looks.
        t.disk.put("/r/d", dir());
        t.disk.put("/r/d/e", dir());
        t.disk.put("/r/d/e/f.json", file(2, 2));
        t.feed("/r", EventMask::CREATE | EventMask::ISDIR, "d", 0, 200);
        t.flush(300);
        assert_eq!(futures::executor::block_on(reg.queue().next_batch()), ["s"]);
        assert!(t.disk.watches.contains_key(Path::new("/r/d/e")), "re-armed");
        // Later writes are seen through the new watch.
        t.disk.put("/r/d/e/f.json", file(3, 3));
        t.feed("/r/d/e", EventMask::CLOSE_WRITE, "f.json", 0, 400);
        t.flush(500);
        assert_eq!(futures::executor::block_on(reg.queue().next_batch()), ["s"]);
        // The last holder gone: nothing left.
        t.m.unsubscribe(&mut t.disk, "s");
        assert!(t.disk.watches.is_empty());
    }

    #[test]
    fn overflow_is_reported_in_band_and_a_rescan_converges() {
        let mut t = T::new();
        let ring = t.events("e", "/r", true);
        let _ = t.m.subscribe(
            &mut t.disk,
            "s",
            Spec {
                base: "/r/e".into(),
                root: "/r".into(),
                mode: Mode::State,
            },
        );
        let reg = t.feed.register(&["s".into()]);
        // Changes the kernel never reported.
        t.disk.put("/r/d/a.txt", file(9, 99));
        t.disk.put("/r/e/new.txt", file(1, 1));
        t.disk.put("/r/e/sub", dir());
        t.disk.put("/r/e/sub/deep.txt", file(1, 1));
        t.disk.rm("/r/d");
        t.disk.put("/r/d", dir());
        t.m.feed(
            &mut t.disk,
            Record {
                wd: -1,
                mask: EventMask::Q_OVERFLOW,
                cookie: 0,
                name: None,
            },
            t.t0,
        );
        assert_eq!(
            summary(&ring),
            [
                "OVERFLOW ",
                "DELETED /r/d/a.txt",
                "CREATED /r/e/new.txt",
                "CREATED /r/e/sub",
                "CREATED /r/e/sub/deep.txt",
            ]
        );
        assert!(t.disk.watches.contains_key(Path::new("/r/e/sub")));
        assert_eq!(
            futures::executor::block_on(reg.queue().next_batch()),
            ["s"],
            "state watchers re-read after an overflow"
        );
        // Converged: a second overflow with nothing changed adds only its notice.
        t.m.overflow(&mut t.disk, t.t0);
        assert_eq!(summary(&ring).len(), 6);
    }

    #[test]
    fn overflow_re_adds_every_watch_and_replaces_a_dead_one() {
        let mut t = T::new();
        let ring = t.events("e", "/r", true);
        let quiet = t.events("q", "/r/e", false);
        let reg = t.feed.register(&["e".into(), "q".into()]);
        let old = t.disk.wd("/r/d");
        // Lost with the overflow: /r/d removed (its IGNORED too) and made again.
        t.disk.watches.remove(Path::new("/r/d"));
        t.disk.rm("/r/d");
        t.disk.put("/r/d", dir());
        t.disk.put("/r/d/n.txt", file(1, 1));
        t.m.overflow(&mut t.disk, t.t0);
        let new = t.disk.wd("/r/d");
        assert_ne!(new, old);
        assert_eq!(t.m.dirs[Path::new("/r/d")].wd, new);
        assert_eq!(t.m.by_wd[&new], Path::new("/r/d"));
        assert!(!t.m.by_wd.contains_key(&old), "the dead wd is forgotten");
        assert_eq!(
            summary(&ring),
            ["OVERFLOW ", "DELETED /r/d/a.txt", "CREATED /r/d/n.txt"]
        );
        // Every event log is told, even one with nothing changed.
        assert_eq!(summary(&quiet), ["OVERFLOW "]);
        let mut got = futures::executor::block_on(reg.queue().next_batch());
        got.sort();
        assert_eq!(got, ["e", "q"]);
        // Events on the new watch are seen.
        t.disk.put("/r/d/z", file(1, 2));
        t.feed("/r/d", EventMask::CREATE, "z", 0, 10);
        t.flush(100);
        assert_eq!(summary(&ring).last().unwrap(), "CREATED /r/d/z");
    }

    #[test]
    fn limits_refuse_cleanly_and_last_unsubscribe_drops_watches() {
        let mut t = T::new();
        t.m.cfg.max_watches = 2;
        let spec = Spec {
            base: "/r".into(),
            root: "/r".into(),
            mode: Mode::Events {
                recursive: true,
                glob: None,
            },
        };
        let e = t.m.subscribe(&mut t.disk, "e", spec).unwrap_err();
        assert_eq!(e, SubError::Limit { max: 2 });
        assert!(t.disk.watches.is_empty(), "nothing left behind");
        assert!(!t.m.is_subscribed("e"));
        t.m.cfg.max_watches = 100;
        t.disk.limit = Some(1);
        let spec = Spec {
            base: "/r/d".into(),
            root: "/r".into(),
            mode: Mode::Events {
                recursive: false,
                glob: None,
            },
        };
        let e = t.m.subscribe(&mut t.disk, "e", spec.clone()).unwrap_err();
        assert_eq!(e, SubError::KernelLimit);
        t.disk.limit = None;
        t.m.subscribe(&mut t.disk, "e", spec.clone()).unwrap();
        t.m.subscribe(&mut t.disk, "e", spec).unwrap();
        assert_eq!(t.disk.watches.len(), 2, "/r/d and its parent /r");
        t.m.unsubscribe(&mut t.disk, "e");
        assert_eq!(t.disk.watches.len(), 2, "one holder left");
        t.m.unsubscribe(&mut t.disk, "e");
        assert!(t.disk.watches.is_empty());
    }

    #[test]
    fn glob_narrows_by_name_and_state_watches_see_only_their_file() {
        let mut t = T::new();
        let ring =
            t.m.subscribe(
                &mut t.disk,
                "g",
                Spec {
                    base: "/r/d".into(),
                    root: "/r".into(),
                    mode: Mode::Events {
                        recursive: false,
                        glob: Some(Glob::new("*.json").unwrap()),
                    },
                },
            )
            .unwrap()
            .unwrap();
        t.m.subscribe(
            &mut t.disk,
            "s",
            Spec {
                base: "/r/e/x.json".into(),
                root: "/r".into(),
                mode: Mode::State,
            },
        )
        .unwrap();
        let reg = t.feed.register(&["s".into()]);
        t.disk.put("/r/d/a.json", file(1, 1));
        t.disk.put("/r/d/b.txt", file(1, 1));
        t.disk.put("/r/e/other", file(1, 1));
        t.feed("/r/d", EventMask::CREATE, "a.json", 0, 0);
        t.feed("/r/d", EventMask::CREATE, "b.txt", 0, 0);
        t.feed("/r/e", EventMask::CREATE, "other", 0, 0);
        t.flush(100);
        assert_eq!(summary(&ring), ["CREATED /r/d/a.json"]);
        assert!(t.m.pending.is_empty());
        assert!(
            futures::FutureExt::now_or_never(reg.queue().next_batch()).is_none(),
            "nothing for the state watch"
        );
        t.disk.put("/r/e/x.json", file(2, 2));
        t.feed("/r/e", EventMask::CREATE, "x.json", 0, 200);
        t.flush(300);
        assert_eq!(futures::executor::block_on(reg.queue().next_batch()), ["s"]);
    }

    #[test]
    fn modify_without_close_waits_at_least_the_dirty_minimum() {
        let mut t = T::new();
        t.m.cfg.debounce = Duration::ZERO;
        let ring = t.events("e", "/r/d", false);
        t.disk.put("/r/d/a.txt", file(2, 20));
        t.feed("/r/d", EventMask::MODIFY, "a.txt", 0, 0);
        t.flush(0);
        assert!(summary(&ring).is_empty());
        t.feed("/r/d", EventMask::CLOSE_WRITE, "a.txt", 0, 1);
        t.flush(1);
        assert_eq!(summary(&ring), ["MODIFIED /r/d/a.txt"]);
        t.disk.put("/r/d/a.txt", file(3, 30));
        t.feed("/r/d", EventMask::MODIFY, "a.txt", 0, 10);
        t.flush(59);
        assert_eq!(summary(&ring).len(), 1);
        t.flush(60);
        assert_eq!(summary(&ring).len(), 2);
    }

    #[test]
    fn mtimes_far_from_now_saturate_instead_of_overflowing() {
        assert_eq!(mtime_ns(1, 5), 1_000_000_005);
        assert_eq!(mtime_ns(-1, 0), -1_000_000_000);
        assert_eq!(mtime_ns(i64::MAX, 999_999_999), i64::MAX);
        assert_eq!(mtime_ns(i64::MIN, 0), i64::MIN);
        assert_eq!(mtime_ns(9_223_372_036, 999_999_999), i64::MAX);
    }

    #[test]
    fn rfc3339_formats_utc_milliseconds() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            rfc3339(1_764_497_610_123_456_789),
            "2025-11-30T10:13:30.123Z"
        );
        assert_eq!(rfc3339(951_782_400_000_000_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(rfc3339(-1_000_000), "1969-12-31T23:59:59.999Z");
    }
}
