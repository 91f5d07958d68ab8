//! This process's stdin and stdout as async streams for `--stdio`, read and written by the
//! runtime's reactor when they are pipes.
//!
//! tokio's own `stdin()` and `stdout()` hand every read and write to the blocking pool and wait
//! for it: two thread hops per message, about a tenth of a notice's whole latency on a busy
//! 2-core host. A pipe can be polled instead: [`stdin`] and [`stdout`] put a duplicate of the
//! descriptor on the reactor (`tokio::net::unix::pipe`), which sets `O_NONBLOCK` on the pipe.
//! That flag belongs to the pipe end, shared with whoever else holds it, so this is only for
//! `--stdio`, whose pipes the MCP client made for herald alone, and the flags are put back
//! when the stream is dropped. A terminal (shared with the shell that started herald), a file,
//! a socket, a pipe that is stderr too (`2>&1`) or one end serving as both stdin and stdout is
//! left alone and goes through tokio's blocking streams as before.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::unix::pipe;

use super::lines::{Reader, Writer};

/// Stdin: on the reactor when it is a pipe, else tokio's blocking stdin. Must be called within
/// the runtime.
pub fn stdin() -> Reader {
    match on_reactor(io::stdin().as_fd(), pipe::Receiver::from_owned_fd) {
        Some(r) => Box::new(r),
        None => Box::new(tokio::io::stdin()),
    }
}

/// Stdout: on the reactor when it is a pipe, else tokio's blocking stdout. Must be called
/// within the runtime.
pub fn stdout() -> Writer {
    match on_reactor(io::stdout().as_fd(), pipe::Sender::from_owned_fd) {
        Some(w) => Box::new(w),
        None => Box::new(tokio::io::stdout()),
    }
}

/// A pipe end of this process's on the reactor; the flags its descriptor had are put back
/// when it is dropped.
struct OnReactor<T: AsRawFd> {
    inner: T,
    flags: libc::c_int,
}

fn on_reactor<T: AsRawFd>(
    fd: BorrowedFd<'_>,
    make: fn(std::os::fd::OwnedFd) -> io::Result<T>,
) -> Option<OnReactor<T>> {
    let raw = fd.as_raw_fd();
    // SAFETY: fcntl(F_GETFL) on a descriptor borrowed for this call; it reads flags only.
    let flags = unsafe { libc::fcntl(raw, libc::F_GETFL) };
    if flags < 0 {
        return None;
    }
    // The same pipe as stderr (`2>&1 | …`): non-blocking, it would be stderr's too, and the
    // log lines and a panic's message are written the ordinary way. One end serving as both
    // stdin and stdout: the second stream would take the first's flag as the original.
    let (stdin, stdout) = (io::stdin(), io::stdout());
    let other = if raw == stdin.as_fd().as_raw_fd() {
        stdout.as_fd()
    } else {
        stdin.as_fd()
    };
    if same_file(fd, io::stderr().as_fd()) || same_file(fd, other) {
        return None;
    }
    // Not a pipe (a terminal, a file, a socket): the maker refuses it before setting any flag.
    // One it took and then could not register (epoll full) has its flags put back here.
    match make(fd.try_clone_to_owned().ok()?) {
        Ok(inner) => Some(OnReactor { inner, flags }),
        Err(_) => {
            restore(raw, flags);
            None
        }
    }
}

/// Puts `flags` back on `fd`.
fn restore(fd: RawFd, flags: libc::c_int) {
    // SAFETY: F_SETFL on a descriptor the caller holds open; it only puts back flags read
    // from it before.
    unsafe { libc::fcntl(fd, libc::F_SETFL, flags) };
}

/// Whether two descriptors are the same file (for a pipe: the same pipe).
fn same_file(a: BorrowedFd<'_>, b: BorrowedFd<'_>) -> bool {
    let stat = |fd: BorrowedFd<'_>| {
        // SAFETY: stat is plain data, for which all zeroes is a valid value.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fstat fills the stat it is given; a bad descriptor is an error return.
        (unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } == 0).then_some((st.st_dev, st.st_ino))
    };
    matches!((stat(a), stat(b)), (Some(x), Some(y)) if x == y)
}

impl<T: AsRawFd> Drop for OnReactor<T> {
    fn drop(&mut self) {
        restore(self.inner.as_raw_fd(), self.flags);
    }
}

impl<T: AsyncRead + AsRawFd + Unpin> AsyncRead for OnReactor<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + AsRawFd + Unpin> AsyncWrite for OnReactor<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A pipe end made non-blocking for the reactor gets its flags back when the stream goes.
    #[tokio::test]
    async fn a_pipe_is_polled_and_its_flags_are_put_back() {
        let (r, w) = std::io::pipe().unwrap();
        // SAFETY: F_GETFL reads the flags of a descriptor this test holds open.
        let flags = |fd: RawFd| unsafe { libc::fcntl(fd, libc::F_GETFL) };
        let (rfd, wfd) = (r.as_raw_fd(), w.as_raw_fd());
        assert_eq!(flags(wfd) & libc::O_NONBLOCK, 0);
        let mut tx = on_reactor(w.as_fd(), pipe::Sender::from_owned_fd).expect("a pipe");
        let mut rx = on_reactor(r.as_fd(), pipe::Receiver::from_owned_fd).expect("a pipe");
        assert_ne!(flags(wfd) & libc::O_NONBLOCK, 0);
        tx.write_all(b"line\n").await.unwrap();
        let mut got = [0u8; 5];
        rx.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"line\n");
        drop((tx, rx));
        assert_eq!(flags(wfd) & libc::O_NONBLOCK, 0);
        assert_eq!(flags(rfd) & libc::O_NONBLOCK, 0);
    }

    /// More than a pipe holds, to a reader that takes its time: the writer waits on the
    /// reactor for room, and every byte arrives in order.
    #[tokio::test]
    async fn a_full_pipe_is_waited_on_and_loses_nothing() {
        let (mut r, w) = std::io::pipe().unwrap();
        let mut tx = on_reactor(w.as_fd(), pipe::Sender::from_owned_fd).expect("a pipe");
        let sent: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
        let expect = sent.clone();
        let reader = std::thread::spawn(move || {
            let mut got = Vec::new();
            std::io::Read::read_to_end(&mut r, &mut got).unwrap();
            got
        });
        tx.write_all(&sent).await.unwrap();
        // The stream first (it puts the flags back on `w`), then the last writer: end of file.
        drop(tx);
        drop(w);
        assert_eq!(reader.join().unwrap(), expect);
    }

    /// A file is not a pipe: it is left alone (tokio's blocking stream serves it).
    #[tokio::test]
    async fn a_file_is_left_to_the_blocking_pool() {
        let file = std::fs::File::open("/proc/self/status").unwrap();
        assert!(on_reactor(file.as_fd(), pipe::Receiver::from_owned_fd).is_none());
        // SAFETY: F_GETFL reads the flags of the file this test holds open.
        let flags = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
        assert_eq!(flags & libc::O_NONBLOCK, 0);
    }
}
