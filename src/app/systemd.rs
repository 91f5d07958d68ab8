//! systemd's side of a service: the notify socket (`READY=1`, `STATUS=`, `WATCHDOG=1`,
//! `EXTEND_TIMEOUT_USEC=`, `STOPPING=1`, for `Type=notify` units) and socket activation
//! (`LISTEN_FDS`, `LISTEN_PID`, `LISTEN_FDNAMES`). The one module that knows systemd.
//!
//! What systemd passes is taken out of the environment once, first thing in `main`
//! ([`Systemd::take_from_env`]), and travels from there as a [`Systemd`] value: no child herald
//! starts (a stdio upstream, kubectl, a filter worker, an `--exec` command) sees a notify socket
//! or descriptors meant for this process, and nothing reads the environment later.
//!
//! Hand-written rather than the sd-notify crate: the protocol is one datagram of `KEY=VALUE`
//! lines, and sd-notify 0.5 cannot reach an abstract socket (`NOTIFY_SOCKET=@name`), which
//! container managers pass. Each message goes out on a fresh non-blocking socket, awaited on
//! the runtime, bounded by a second, so a stuck service manager never blocks a worker.
//! Outside systemd (no `NOTIFY_SOCKET`) every call is a no-op.

use crate::sync::Recover;
use std::ffi::{OsStr, OsString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixDatagram};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The first descriptor systemd passes (`SD_LISTEN_FDS_START`).
const LISTEN_FDS_START: RawFd = 3;

/// The variables systemd sets for a service, all taken out of the environment at start.
const VARS: [&str; 6] = [
    "NOTIFY_SOCKET",
    "WATCHDOG_USEC",
    "WATCHDOG_PID",
    "LISTEN_PID",
    "LISTEN_FDS",
    "LISTEN_FDNAMES",
];

/// Longest a notify message may take to go out.
const SEND_BOUND: Duration = Duration::from_secs(1);

/// One line of a notify message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Notify<'a> {
    /// `READY=1`: every listener is bound and every role has started.
    Ready,
    /// `STATUS=…`: one line for `systemctl status` (newlines become spaces).
    Status(&'a str),
    /// `WATCHDOG=1`: the process is alive (`WatchdogSec=`).
    Watchdog,
    /// `STOPPING=1`: shutdown has begun.
    Stopping,
    /// `RELOADING=1` with `MONOTONIC_USEC=` (now, on `CLOCK_MONOTONIC`): a reload has begun
    /// (`Type=notify-reload`); `READY=1` says it ended.
    Reloading,
    /// `EXTEND_TIMEOUT_USEC=…`: the current phase (here: the drain) needs this much longer
    /// before the next message; systemd only ever extends its own timeout with it.
    ExtendTimeout(Duration),
}

impl Notify<'_> {
    fn line(&self) -> String {
        match self {
            Notify::Ready => "READY=1\n".into(),
            Notify::Status(s) => format!("STATUS={}\n", s.replace(['\n', '\r'], " ")),
            Notify::Watchdog => "WATCHDOG=1\n".into(),
            Notify::Stopping => "STOPPING=1\n".into(),
            Notify::Reloading => format!("RELOADING=1\nMONOTONIC_USEC={}\n", monotonic_usec()),
            Notify::ExtendTimeout(d) => format!("EXTEND_TIMEOUT_USEC={}\n", d.as_micros()),
        }
    }
}

/// Microseconds on `CLOCK_MONOTONIC`, as systemd's `MONOTONIC_USEC=` wants them.
fn monotonic_usec() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write into; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64) * 1_000_000 + (ts.tv_nsec as u64) / 1_000
}

/// The message `states` make, as systemd reads it.
pub fn message(states: &[Notify<'_>]) -> String {
    states.iter().map(Notify::line).collect()
}

/// What systemd passed this process. Cheap to clone. The default is "not under systemd":
/// no notify socket, no watchdog, no sockets.
#[derive(Clone, Default)]
pub struct Systemd {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    notify: Option<(OsString, UnixAddr)>,
    watchdog: Option<Duration>,
    sockets: Vec<Inherited>,
}

impl std::fmt::Debug for Systemd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Systemd")
            .field("notify", &self.inner.notify.as_ref().map(|(s, _)| s))
            .field("watchdog", &self.inner.watchdog)
            .field("sockets", &self.inner.sockets)
            .finish()
    }
}

impl Systemd {
    /// Takes systemd's variables out of the environment and adopts the listening sockets it
    /// passed (made close-on-exec, so no child inherits them).
    ///
    /// # Safety
    ///
    /// No other thread may exist yet: this changes the environment (which other threads may be
    /// reading) and takes ownership of descriptors 3 and up when `LISTEN_PID` names this
    /// process (which nothing else may own). Call it first thing in `main`.
    pub unsafe fn take_from_env() -> Systemd {
        let get = |k: &str| std::env::var_os(k);
        let notify = get("NOTIFY_SOCKET");
        let watchdog_usec = get("WATCHDOG_USEC");
        let watchdog_pid = get("WATCHDOG_PID");
        let listen_pid = get("LISTEN_PID");
        let listen_fds = get("LISTEN_FDS");
        let listen_names = get("LISTEN_FDNAMES");
        for k in VARS {
            // SAFETY: the caller guarantees no other thread exists, so nothing reads the
            // environment while it changes.
            unsafe { std::env::remove_var(k) };
        }
        let pid = std::process::id();
        let mut systemd = Systemd::notifying(notify.as_deref());
        let inner = Arc::get_mut(&mut systemd.inner).expect("not shared yet");
        inner.watchdog = watchdog_interval(watchdog_usec.as_deref(), watchdog_pid.as_deref(), pid);
        match listen_fds_of(
            pid,
            listen_pid.as_deref(),
            listen_fds.as_deref(),
            listen_names.as_deref(),
        ) {
            Ok(fds) => {
                for (fd, name) in fds {
                    // SAFETY: LISTEN_PID names this process, so systemd passed `fd` to it and
                    // nothing in the process has touched it yet (the caller guarantees this
                    // runs first); `adopt` checks that it is open.
                    match unsafe { adopt(fd) } {
                        Ok(owned) => inner.sockets.push(Inherited::new(fd, name, owned)),
                        Err(e) => {
                            tracing::warn!(fd, %name, error = %e, "ignoring a socket systemd passed")
                        }
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "ignoring the sockets systemd passed"),
        }
        systemd
    }

    /// Notifies the socket named like `NOTIFY_SOCKET` (a path, or `@name` for an abstract
    /// socket); `None`, or a form herald does not speak, notifies nothing. No watchdog, no
    /// sockets.
    pub fn notifying(socket: Option<&OsStr>) -> Systemd {
        let notify = socket.and_then(|s| match notify_addr(s) {
            Ok(addr) => Some((s.to_owned(), addr)),
            Err(e) => {
                tracing::warn!(socket = ?s, error = %e, "not notifying systemd");
                None
            }
        });
        Systemd {
            inner: Arc::new(Inner {
                notify,
                ..Inner::default()
            }),
        }
    }

    /// The same, asking for a `WATCHDOG=1` ping every half of `interval`.
    pub fn with_watchdog(self, interval: Duration) -> Systemd {
        Systemd {
            inner: Arc::new(Inner {
                notify: self.inner.notify.clone(),
                watchdog: Some(interval),
                sockets: self.inner.sockets.clone(),
            }),
        }
    }

    /// Whether a notify socket was given.
    pub fn is_notifying(&self) -> bool {
        self.inner.notify.is_some()
    }

    /// `WATCHDOG_USEC`, when it is meant for this process: systemd restarts the service when
    /// no `WATCHDOG=1` arrives for this long.
    pub fn watchdog(&self) -> Option<Duration> {
        self.inner.watchdog.filter(|_| self.is_notifying())
    }

    /// Sends `states` as one message. Failures are logged, never returned: systemd's view of
    /// the service must not stop the service.
    pub async fn notify(&self, states: &[Notify<'_>]) {
        let Some((name, addr)) = &self.inner.notify else {
            return;
        };
        let msg = message(states);
        let sent = tokio::time::timeout(SEND_BOUND, send(addr, msg.as_bytes())).await;
        let error = match sent {
            Ok(Ok(())) => return,
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no room within {} s", SEND_BOUND.as_secs()),
        };
        if states == [Notify::Watchdog] {
            tracing::debug!(socket = ?name, %error, "could not send the watchdog ping");
        } else {
            tracing::warn!(socket = ?name, %error, message = %msg.trim_end(), "could not notify systemd");
        }
    }

    /// The listening socket systemd passed for `name`: the one whose `FileDescriptorName=` is
    /// `name`; for `http`, also the only socket passed when it is not named `admin` (a socket
    /// unit's default name is the unit's own).
    pub fn socket(&self, name: &str) -> Option<Inherited> {
        let sockets = &self.inner.sockets;
        if let Some(s) = sockets.iter().find(|s| s.name == name) {
            return Some(s.clone());
        }
        match sockets.as_slice() {
            [only] if name == "http" && only.name != "admin" => Some(only.clone()),
            _ => None,
        }
    }
}

/// `NOTIFY_SOCKET` as an address: an absolute path, or `@name` for the abstract namespace.
fn notify_addr(s: &OsStr) -> std::io::Result<UnixAddr> {
    let bytes = s.as_bytes();
    match bytes.first() {
        Some(b'@') => UnixAddr::from_abstract_name(&bytes[1..]),
        Some(b'/') => UnixAddr::from_pathname(s),
        _ => Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "NOTIFY_SOCKET is neither a path nor @abstract",
        )),
    }
}

async fn send(addr: &UnixAddr, msg: &[u8]) -> std::io::Result<()> {
    let sock = UnixDatagram::unbound()?;
    sock.connect_addr(addr)?;
    sock.set_nonblocking(true)?;
    let sock = tokio::net::UnixDatagram::from_std(sock)?;
    let n = sock.send(msg).await?;
    if n != msg.len() {
        return Err(std::io::Error::other("the message was cut short"));
    }
    Ok(())
}

/// The watchdog interval from `WATCHDOG_USEC` (a positive number of microseconds), unless
/// `WATCHDOG_PID` names another process.
pub fn watchdog_interval(
    usec: Option<&OsStr>,
    for_pid: Option<&OsStr>,
    pid: u32,
) -> Option<Duration> {
    if let Some(p) = for_pid
        && p.to_str().and_then(|p| p.parse::<u32>().ok()) != Some(pid)
    {
        return None;
    }
    let usec: u64 = usec?.to_str()?.parse().ok()?;
    (usec > 0).then(|| Duration::from_micros(usec))
}

/// The descriptors (and their names) that `LISTEN_*` pass to process `pid`: none when
/// `LISTEN_PID` is absent or names another process (a parent's variables leaking through).
pub fn listen_fds_of(
    pid: u32,
    listen_pid: Option<&OsStr>,
    listen_fds: Option<&OsStr>,
    names: Option<&OsStr>,
) -> Result<Vec<(RawFd, String)>, String> {
    let Some(for_pid) = listen_pid else {
        return Ok(Vec::new());
    };
    let for_pid: u32 = for_pid
        .to_str()
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| format!("LISTEN_PID={for_pid:?} is not a process id"))?;
    if for_pid != pid {
        return Ok(Vec::new());
    }
    let n: RawFd = listen_fds
        .and_then(OsStr::to_str)
        .and_then(|n| n.parse().ok())
        .filter(|n| (0..=4096).contains(n))
        .ok_or_else(|| format!("LISTEN_FDS={listen_fds:?} is not a count of descriptors"))?;
    let names: Vec<String> = names
        .map(|n| n.to_string_lossy().split(':').map(str::to_owned).collect())
        .unwrap_or_default();
    Ok((0..n)
        .map(|i| {
            let name = names
                .get(i as usize)
                .cloned()
                .filter(|n| !n.is_empty())
                .unwrap_or_else(|| "unknown".into());
            (LISTEN_FDS_START + i, name)
        })
        .collect())
}

/// Takes ownership of `fd` (checked open) and makes it close-on-exec.
///
/// # Safety
///
/// Nothing else in the process may own `fd`.
unsafe fn adopt(fd: RawFd) -> std::io::Result<OwnedFd> {
    // SAFETY: F_GETFD only reads the descriptor's flags; an unused number fails with EBADF.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
    if flags < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: as above, F_SETFD only changes the descriptor's own flags.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is open (checked) and the caller guarantees nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A listening socket systemd passed. Clones share it; it is taken at most once.
#[derive(Clone)]
pub struct Inherited {
    fd: RawFd,
    name: String,
    slot: Arc<Mutex<Option<OwnedFd>>>,
}

impl std::fmt::Debug for Inherited {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "fd {} ({})", self.fd, self.name)
    }
}

impl std::fmt::Display for Inherited {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the socket systemd passed (fd {}, named {})",
            self.fd, self.name
        )
    }
}

impl Inherited {
    fn new(fd: RawFd, name: String, owned: OwnedFd) -> Inherited {
        Inherited {
            fd,
            name,
            slot: Arc::new(Mutex::new(Some(owned))),
        }
    }

    /// Its `FileDescriptorName=`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The socket as a TCP listener, checked to be one (a stream socket of an IP family that
    /// listens). The first call takes it; later ones fail.
    pub fn take_tcp(&self) -> Result<std::net::TcpListener, String> {
        let owned = self
            .slot
            .locked()
            .take()
            .ok_or_else(|| "it is already in use".to_owned())?;
        let fd = owned.as_raw_fd();
        let is = |level, opt, want: &[libc::c_int]| {
            sockopt(fd, level, opt).is_ok_and(|v| want.contains(&v))
        };
        if !is(
            libc::SOL_SOCKET,
            libc::SO_DOMAIN,
            &[libc::AF_INET, libc::AF_INET6],
        ) || !is(libc::SOL_SOCKET, libc::SO_TYPE, &[libc::SOCK_STREAM])
            || !is(libc::SOL_SOCKET, libc::SO_ACCEPTCONN, &[1])
        {
            return Err(
                "it is not a listening TCP socket; give the socket unit ListenStream=ADDR:PORT"
                    .into(),
            );
        }
        Ok(std::net::TcpListener::from(owned))
    }
}

/// An integer socket option of `fd`.
fn sockopt(fd: RawFd, level: libc::c_int, opt: libc::c_int) -> std::io::Result<libc::c_int> {
    let mut value: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `value` and `len` are live locals of the sizes getsockopt is told; a bad `fd`
    // fails with an error instead of touching memory.
    let r = unsafe {
        libc::getsockopt(
            fd,
            level,
            opt,
            (&mut value as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(value)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn os(s: &str) -> Option<&OsStr> {
        Some(OsStr::new(s))
    }

    #[test]
    fn messages_are_systemd_lines() {
        let m = message(&[
            Notify::Ready,
            Notify::Status("serving memo\non x"),
            Notify::ExtendTimeout(Duration::from_millis(7500)),
        ]);
        assert_eq!(
            m,
            "READY=1\nSTATUS=serving memo on x\nEXTEND_TIMEOUT_USEC=7500000\n"
        );
        assert_eq!(
            message(&[Notify::Watchdog, Notify::Stopping]),
            "WATCHDOG=1\nSTOPPING=1\n"
        );
    }

    #[test]
    fn the_watchdog_is_for_this_process_only() {
        let two = Some(Duration::from_secs(2));
        assert_eq!(watchdog_interval(os("2000000"), None, 7), two);
        assert_eq!(watchdog_interval(os("2000000"), os("7"), 7), two);
        assert_eq!(watchdog_interval(os("2000000"), os("8"), 7), None);
        assert_eq!(watchdog_interval(os("0"), None, 7), None);
        assert_eq!(watchdog_interval(os("soon"), None, 7), None);
        assert_eq!(watchdog_interval(None, None, 7), None);
    }

    #[test]
    fn listen_fds_are_for_this_process_only_and_named() {
        assert_eq!(listen_fds_of(7, None, os("1"), None), Ok(vec![]));
        assert_eq!(listen_fds_of(7, os("8"), os("1"), None), Ok(vec![]));
        assert_eq!(
            listen_fds_of(7, os("7"), os("2"), os("http:admin")),
            Ok(vec![(3, "http".into()), (4, "admin".into())])
        );
        assert_eq!(
            listen_fds_of(7, os("7"), os("2"), os("http")),
            Ok(vec![(3, "http".into()), (4, "unknown".into())])
        );
        assert!(listen_fds_of(7, os("x"), os("1"), None).is_err());
        assert!(listen_fds_of(7, os("7"), os("-1"), None).is_err());
        assert!(listen_fds_of(7, os("7"), None, None).is_err());
    }

    #[test]
    fn notify_socket_forms() {
        assert!(notify_addr(OsStr::new("/run/systemd/notify")).is_ok());
        let a = notify_addr(OsStr::new("@herald/notify")).unwrap();
        assert_eq!(a.as_abstract_name(), Some(&b"herald/notify"[..]));
        assert!(notify_addr(OsStr::new("vsock:2:1234")).is_err());
        assert!(!Systemd::notifying(Some(OsStr::new("relative"))).is_notifying());
    }

    /// The next datagram on `sock`, as text (the app tests use it too).
    pub(crate) async fn recv(sock: &tokio::net::UnixDatagram) -> String {
        let mut buf = vec![0u8; 4096];
        let n = tokio::time::timeout(Duration::from_secs(10), sock.recv(&mut buf))
            .await
            .expect("a datagram in time")
            .unwrap();
        String::from_utf8(buf[..n].to_vec()).unwrap()
    }

    #[tokio::test]
    async fn notifies_a_path_socket_and_an_abstract_one() {
        let dir = std::env::temp_dir().join(format!("herald-notify-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("notify");
        let sock = tokio::net::UnixDatagram::bind(&path).unwrap();
        let sd = Systemd::notifying(Some(path.as_os_str()));
        sd.notify(&[Notify::Ready, Notify::Status("serving")]).await;
        assert_eq!(recv(&sock).await, "READY=1\nSTATUS=serving\n");
        let _ = std::fs::remove_dir_all(&dir);

        let name = format!("herald-test-notify-{}", std::process::id());
        let std_sock =
            UnixDatagram::bind_addr(&UnixAddr::from_abstract_name(name.as_bytes()).unwrap())
                .unwrap();
        std_sock.set_nonblocking(true).unwrap();
        let sock = tokio::net::UnixDatagram::from_std(std_sock).unwrap();
        let sd = Systemd::notifying(Some(OsStr::new(&format!("@{name}"))));
        sd.notify(&[Notify::Watchdog]).await;
        assert_eq!(recv(&sock).await, "WATCHDOG=1\n");
    }

    #[tokio::test]
    async fn outside_systemd_nothing_is_sent_and_nothing_fails() {
        let sd = Systemd::default();
        assert!(!sd.is_notifying());
        assert_eq!(sd.with_watchdog(Duration::from_secs(1)).watchdog(), None);
        Systemd::default().notify(&[Notify::Ready]).await;
        // A socket nobody reads: logged, not an error.
        Systemd::notifying(Some(OsStr::new("/nonexistent/herald/notify")))
            .notify(&[Notify::Stopping])
            .await;
    }

    #[test]
    fn an_inherited_socket_is_checked_and_taken_once() {
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = tcp.local_addr().unwrap();
        let s = Inherited::new(3, "http".into(), OwnedFd::from(tcp));
        let again = s.clone();
        let l = s.take_tcp().unwrap();
        assert_eq!(l.local_addr().unwrap(), addr);
        assert!(again.take_tcp().unwrap_err().contains("already in use"));

        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let s = Inherited::new(4, "http".into(), OwnedFd::from(udp));
        assert!(
            s.take_tcp()
                .unwrap_err()
                .contains("not a listening TCP socket")
        );
        // Bound but not listening.
        let sock = socket_unlistened();
        let s = Inherited::new(5, "http".into(), sock);
        assert!(
            s.take_tcp()
                .unwrap_err()
                .contains("not a listening TCP socket")
        );
    }

    fn socket_unlistened() -> OwnedFd {
        // A connected TCP stream is a stream socket that does not listen.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        OwnedFd::from(c)
    }

    #[test]
    fn the_http_socket_is_the_named_one_or_the_only_one() {
        let tcp = || OwnedFd::from(std::net::TcpListener::bind("127.0.0.1:0").unwrap());
        let with = |names: &[&str]| Systemd {
            inner: Arc::new(Inner {
                sockets: names
                    .iter()
                    .enumerate()
                    .map(|(i, n)| Inherited::new(3 + i as RawFd, (*n).into(), tcp()))
                    .collect(),
                ..Inner::default()
            }),
        };
        let one = with(&["herald-memo.socket"]);
        assert_eq!(one.socket("http").unwrap().name(), "herald-memo.socket");
        assert!(one.socket("admin").is_none());
        let admin_only = with(&["admin"]);
        assert!(admin_only.socket("http").is_none());
        assert!(admin_only.socket("admin").is_some());
        let two = with(&["admin", "http"]);
        assert_eq!(two.socket("http").unwrap().name(), "http");
        let unnamed = with(&["a.socket", "b.socket"]);
        assert!(unnamed.socket("http").is_none());
    }
}
