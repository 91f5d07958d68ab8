//! The one inotify instance of the file source and the thread that drives it.
//!
//! A dedicated thread (`herald-inotify`) owns the instance and the [`Machine`]. It sleeps in
//! `poll(2)` on two descriptors, the inotify fd and an eventfd that wakes it for commands, with
//! the machine's next debounce deadline as the timeout; so it runs only when the kernel has
//! events, a subscriber came or went, or a debounce window closed. Blocking work (adding
//! watches, scanning a 100,000-file tree, stat'ing a settled path) happens on this thread,
//! never on a runtime worker. Subscribers talk to it through [`Watcher::subscribe`]; the
//! returned [`Subscription`] is the refcount, and dropping it lets go.
//!
//! The commands travel on a `std` channel with no capacity of its own, bounded by construction:
//! every subscribe awaits its reply (one command per request in flight), and every unsubscribe
//! is a dropped [`Subscription`] (one per live subscription). A subscription that would pass
//! `--max-watches` (watched directories) fails whole and leaves no watch behind.

use crate::sync::Recover;
use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use inotify::{Inotify, WatchDescriptor, WatchMask, Watches};

use super::machine::{Config, Disk, Machine, Meta, Record, Spec, SubError, Wd};
use super::paths;
use crate::mcp::hub::ChangeFeed;
use crate::mcp::ring::EventRing;

/// What every directory watch asks the kernel for. Never `ATTRIB` (chmod and `touch` are not
/// content changes) nor `ACCESS`/`OPEN` (reads are not changes).
fn mask() -> WatchMask {
    WatchMask::CREATE
        | WatchMask::MODIFY
        | WatchMask::CLOSE_WRITE
        | WatchMask::DELETE
        | WatchMask::MOVED_FROM
        | WatchMask::MOVED_TO
        | WatchMask::DELETE_SELF
        | WatchMask::ONLYDIR
        | WatchMask::EXCL_UNLINK
}

/// Bytes read from the inotify fd at a time (several hundred events).
const READ_BUFFER: usize = 64 * 1024;
/// Reads per wake-up before commands and settling get a turn.
const READS_PER_TURN: usize = 64;

/// The thread answers with the [`Subscription`] itself: if the caller gave up before the
/// answer came (its future dropped), the undelivered guard is dropped on the thread and
/// unsubscribes at once, so nothing leaks.
type Reply = tokio::sync::oneshot::Sender<Result<Subscription, SubError>>;

enum Command {
    Subscribe {
        uri: String,
        spec: Spec,
        reply: Reply,
    },
    Unsubscribe {
        uri: String,
    },
    Stop,
}

/// Rings of the subscriptions that exist now, by URI (`None` for a state subscription): lets a
/// read of an already-watched URI skip the round trip to the thread.
type Active = Arc<Mutex<HashMap<String, Option<Arc<EventRing>>>>>;

/// An eventfd: the way into the thread's `poll`.
struct Wake(OwnedFd);

impl Wake {
    fn new() -> io::Result<Wake> {
        // SAFETY: eventfd returns a new descriptor or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor we own.
        Ok(Wake(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    fn ring(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our eventfd. A full counter (never in
        // practice) only means the thread is already due to wake.
        unsafe { libc::write(self.0.as_raw_fd(), &one as *const u64 as *const _, 8) };
    }

    fn drain(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64; non-blocking.
        unsafe { libc::read(self.0.as_raw_fd(), &mut v as *mut u64 as *mut _, 8) };
    }
}

/// The handle to the watcher thread. Dropping it stops the thread.
pub struct Watcher {
    // Unbounded, but bounded in practice: every Subscribe is a request awaiting its reply, and
    // every Unsubscribe is a Subscription dropped, so the queue never holds more than the open
    // requests plus the live subscriptions (capped by the listen limits).
    tx: mpsc::Sender<Command>,
    wake: Arc<Wake>,
    active: Active,
}

/// One holder of a watched URI. Dropping it tells the watcher.
pub struct Subscription {
    uri: String,
    ring: Option<Arc<EventRing>>,
    tx: mpsc::Sender<Command>,
    wake: Arc<Wake>,
}

impl Subscription {
    pub fn ring(&self) -> Option<&Arc<EventRing>> {
        self.ring.as_ref()
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let _ = self.tx.send(Command::Unsubscribe {
            uri: std::mem::take(&mut self.uri),
        });
        self.wake.ring();
    }
}

impl Watcher {
    /// Creates the inotify instance and starts its thread.
    /// `roots` are the canonical roots: nothing outside them is stat'ed, listed or watched
    /// (but a root's parent, for the root's name).
    pub fn start(cfg: Config, feed: ChangeFeed, roots: Vec<PathBuf>) -> io::Result<Watcher> {
        let ino = Inotify::init().map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "cannot create an inotify instance ({e}); if the per-user limit is reached, raise fs.inotify.max_user_instances"
                ),
            )
        })?;
        let wake = Arc::new(Wake::new()?);
        let (tx, rx) = mpsc::channel();
        let active: Active = Arc::default();
        let machine = Machine::new(cfg, feed);
        {
            let wake = wake.clone();
            let active = active.clone();
            let tx = tx.clone();
            std::thread::Builder::new()
                .name("herald-inotify".into())
                .spawn(move || run(ino, (tx, rx), wake, machine, active, roots))?;
        }
        Ok(Watcher { tx, wake, active })
    }

    /// Starts (or joins) the watch behind `uri`.
    pub async fn subscribe(&self, uri: &str, spec: Spec) -> Result<Subscription, SubError> {
        let (reply, rx) = tokio::sync::oneshot::channel();
        self.tx
            .send(Command::Subscribe {
                uri: uri.to_owned(),
                spec,
                reply,
            })
            .map_err(|_| SubError::Io("the inotify thread has stopped".into()))?;
        self.wake.ring();
        rx.await
            .map_err(|_| SubError::Io("the inotify thread has stopped".into()))?
    }

    /// `Some(ring)` if `uri` is being watched now (the ring is `None` for a state URI).
    pub fn active(&self, uri: &str) -> Option<Option<Arc<EventRing>>> {
        self.active.locked().get(uri).cloned()
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let _ = self.tx.send(Command::Stop);
        self.wake.ring();
    }
}

/// The real [`Disk`]: the inotify watch table, and the file system reached only beneath the
/// roots with no symlink followed in any component ([`paths::open_nofollow`]). A directory
/// on a watched path swapped for a symlink (to `/etc`, say) is refused, never stat'ed,
/// listed or watched through.
struct RealDisk {
    watches: Watches,
    wds: HashMap<Wd, WatchDescriptor>,
    /// Canonical roots.
    roots: Vec<PathBuf>,
    /// `/proc/self/fd` is there, so a watch can be added on an opened descriptor.
    proc_fd: bool,
}

impl RealDisk {
    /// Opens `path` beneath the deepest root that holds it; an ancestor of a root (a root's
    /// parent, watched for the root's name only) by its path with `O_NOFOLLOW`. Anything
    /// else is refused.
    fn open(&self, path: &Path, flags: i32) -> io::Result<OwnedFd> {
        if let Some(root) = self
            .roots
            .iter()
            .filter(|r| path.starts_with(r))
            .max_by_key(|r| r.as_os_str().len())
        {
            return paths::open_nofollow(root, path, flags).map_err(|e| {
                if paths::is_escape(&e) {
                    io::Error::new(
                        io::ErrorKind::PermissionDenied,
                        "a symlink is on the path; herald follows none below a root",
                    )
                } else {
                    e
                }
            });
        }
        if self.roots.iter().any(|r| r.starts_with(path)) {
            let c = CString::new(path.as_os_str().as_bytes())?;
            // SAFETY: open on a NUL-terminated string; the fd is owned at once.
            let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_NOFOLLOW | libc::O_CLOEXEC) };
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: a fresh descriptor we own.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "outside the served roots",
        ))
    }
}

impl Disk for RealDisk {
    fn stat(&self, path: &Path) -> Option<Meta> {
        let f = std::fs::File::from(self.open(path, libc::O_PATH).ok()?);
        f.metadata().ok().map(|m| Meta::from_std(&m))
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<(String, Meta)>> {
        let fd = self.open(dir, libc::O_RDONLY | libc::O_DIRECTORY)?;
        let raw = fd.into_raw_fd();
        // SAFETY: fdopendir takes the descriptor (closed here if it fails); readdir's entries
        // are read before the next call; fstatat on the stream's own descriptor with a name
        // from it, never following a symlink; closedir closes the descriptor.
        unsafe {
            let d = libc::fdopendir(raw);
            if d.is_null() {
                let e = io::Error::last_os_error();
                libc::close(raw);
                return Err(e);
            }
            let dfd = libc::dirfd(d);
            let mut out = Vec::new();
            loop {
                let ent = libc::readdir(d);
                if ent.is_null() {
                    break;
                }
                let name = CStr::from_ptr((*ent).d_name.as_ptr());
                let b = name.to_bytes();
                if b == b"." || b == b".." {
                    continue;
                }
                let Ok(n) = std::str::from_utf8(b) else {
                    continue;
                };
                let mut st: libc::stat = std::mem::zeroed();
                // Gone between readdir and stat: its DELETE event follows.
                if libc::fstatat(dfd, name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) == 0 {
                    out.push((n.to_owned(), Meta::from_stat(&st)));
                }
            }
            libc::closedir(d);
            Ok(out)
        }
    }

    fn add_watch(&mut self, dir: &Path) -> io::Result<Wd> {
        let fd = self.open(dir, libc::O_PATH | libc::O_DIRECTORY)?;
        // The watch goes on the directory that was opened beneath the root, through its
        // descriptor (the magic link is the only thing followed). Without /proc, by path
        // with IN_DONT_FOLLOW, which guards the last component only.
        let wd = if self.proc_fd {
            let p = format!("/proc/self/fd/{}", fd.as_raw_fd());
            self.watches.add(p, mask())?
        } else {
            self.watches.add(dir, mask() | WatchMask::DONT_FOLLOW)?
        };
        drop(fd);
        let id = wd.get_watch_descriptor_id();
        self.wds.insert(id, wd);
        Ok(id)
    }

    fn rm_watch(&mut self, wd: Wd) {
        if let Some(w) = self.wds.remove(&wd) {
            // EINVAL when the kernel already dropped it (directory deleted): nothing to do.
            let _ = self.watches.remove(w);
        }
    }
}

fn run(
    mut ino: Inotify,
    (tx, rx): (mpsc::Sender<Command>, mpsc::Receiver<Command>),
    wake: Arc<Wake>,
    mut machine: Machine,
    active: Active,
    roots: Vec<PathBuf>,
) {
    let mut disk = RealDisk {
        watches: ino.watches(),
        wds: HashMap::new(),
        roots,
        proc_fd: Path::new("/proc/self/fd").is_dir(),
    };
    let mut buf = vec![0u8; READ_BUFFER];
    loop {
        let timeout = match machine.next_deadline() {
            // Rounded up, so a deadline is never polled for early and spun on.
            Some(d) => d
                .saturating_duration_since(Instant::now())
                .as_micros()
                .div_ceil(1000)
                .min(i32::MAX as u128) as i32,
            None => -1,
        };
        let mut fds = [
            libc::pollfd {
                fd: ino.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: wake.0.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: two valid pollfd structs.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                tracing::error!(error = %e, "poll on the inotify descriptor failed; the file source stops watching");
                return;
            }
        }
        if fds[1].revents != 0 {
            wake.drain();
        }
        loop {
            match rx.try_recv() {
                Ok(Command::Subscribe { uri, spec, reply }) => {
                    let r = machine.subscribe(&mut disk, &uri, spec);
                    tracing::debug!(
                        %uri,
                        ok = r.is_ok(),
                        watched_dirs = machine.watched_dirs(),
                        "file subscription"
                    );
                    if let Ok(ring) = &r {
                        active.locked().insert(uri.clone(), ring.clone());
                    }
                    let r = r.map(|ring| Subscription {
                        uri,
                        ring,
                        tx: tx.clone(),
                        wake: wake.clone(),
                    });
                    // Undelivered (the caller's future was dropped): the guard comes back and
                    // is dropped here, which queues its Unsubscribe for this very loop.
                    drop(reply.send(r));
                }
                Ok(Command::Unsubscribe { uri }) => {
                    machine.unsubscribe(&mut disk, &uri);
                    if !machine.is_subscribed(&uri) {
                        tracing::debug!(
                            %uri,
                            watched_dirs = machine.watched_dirs(),
                            "file subscription ended"
                        );
                        active.locked().remove(&uri);
                    }
                }
                Ok(Command::Stop) | Err(mpsc::TryRecvError::Disconnected) => return,
                Err(mpsc::TryRecvError::Empty) => break,
            }
        }
        for _ in 0..READS_PER_TURN {
            match ino.read_events(&mut buf) {
                Ok(events) => {
                    let now = Instant::now();
                    for e in events {
                        let rec = Record {
                            wd: e.wd.get_watch_descriptor_id(),
                            mask: e.mask,
                            cookie: e.cookie,
                            name: e.name.map(|n| n.to_owned()),
                        };
                        machine.feed(&mut disk, rec, now);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    tracing::error!(error = %e, "reading inotify events failed");
                    break;
                }
            }
        }
        machine.flush(&mut disk, Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::file::machine::Kind;

    struct Tmp(PathBuf);
    impl Tmp {
        fn new(tag: &str) -> Tmp {
            let p =
                std::env::temp_dir().join(format!("herald-watcher-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).unwrap();
            Tmp(std::fs::canonicalize(p).unwrap())
        }
    }
    impl Drop for Tmp {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn a_subscribe_given_up_before_its_reply_leaves_no_subscription_behind() {
        use crate::source::file::machine::{Config, Mode};
        let t = Tmp::new("cancel");
        let w = Watcher::start(
            Config {
                debounce: std::time::Duration::from_millis(50),
                max_watches: 100,
                ring_capacity: 16,
                tap: None,
            },
            ChangeFeed::new(),
            vec![t.0.clone()],
        )
        .unwrap();
        let spec = |base: &Path| Spec {
            base: base.to_owned(),
            root: t.0.clone(),
            mode: Mode::State,
        };
        std::fs::create_dir_all(t.0.join("a")).unwrap();
        futures::executor::block_on(async {
            // Polled once (the command is on its way), then dropped, as a cancelled request's
            // future is.
            let _ = futures::FutureExt::now_or_never(w.subscribe("gave-up", spec(&t.0)));
            // Two round trips: the first is queued behind the abandoned subscribe, the second
            // behind whatever the thread queued while handling it.
            let b1 = w.subscribe("b1", spec(&t.0.join("a"))).await.unwrap();
            let b2 = w.subscribe("b2", spec(&t.0.join("a"))).await.unwrap();
            assert!(
                w.active("gave-up").is_none(),
                "the abandoned subscription leaked"
            );
            assert!(w.active("b1").is_some() && w.active("b2").is_some());
            drop((b1, b2));
        });
    }

    #[test]
    fn the_real_disk_follows_no_symlink_anywhere_below_a_root() {
        let t = Tmp::new("disk");
        let root = t.0.join("root");
        let outside = t.0.join("etc");
        std::fs::create_dir_all(root.join("d")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("passwd"), "secret").unwrap();
        std::fs::write(root.join("d/f"), "ok").unwrap();
        // A dangling link that passed confinement, then retargeted outside; and a directory
        // on the path replaced by a link.
        std::os::unix::fs::symlink(&outside, root.join("a")).unwrap();
        let ino = Inotify::init().unwrap();
        let mut disk = RealDisk {
            watches: ino.watches(),
            wds: HashMap::new(),
            roots: vec![root.clone()],
            proc_fd: Path::new("/proc/self/fd").is_dir(),
        };
        assert_eq!(disk.stat(&root.join("d/f")).unwrap().size, 2);
        assert_eq!(disk.stat(&root.join("a")).unwrap().kind, Kind::Symlink);
        assert_eq!(disk.stat(&root.join("a/passwd")), None);
        assert!(disk.list(&root.join("a")).is_err());
        assert!(disk.add_watch(&root.join("a")).is_err());
        assert!(
            disk.stat(&outside.join("passwd")).is_none(),
            "outside the roots"
        );
        assert!(disk.add_watch(&outside).is_err());
        let names: Vec<String> = disk
            .list(&root)
            .unwrap()
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert!(names.contains(&"d".to_owned()) && names.contains(&"a".to_owned()));
        // The watches that are allowed: beneath the root, and the root's parent.
        let w = disk.add_watch(&root.join("d")).unwrap();
        assert_eq!(
            disk.add_watch(&root.join("d")).unwrap(),
            w,
            "one inode, one watch"
        );
        disk.add_watch(&t.0).unwrap();
    }
}
