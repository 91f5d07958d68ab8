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
#[path = "machine_tests.rs"]
mod tests;
