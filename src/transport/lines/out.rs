//! The writing half of a line transport ([`Out`]): a frame is written in the sender's own
//! task when the stream takes it at once and nothing is queued ahead of it, and otherwise
//! queued for the writer task.
//!
//! Why: rmcp runs each `Transport::send` future as a task of its own, and a writer task fed by
//! a channel wrote the bytes, so every message a connection sent (an answer, a listen's
//! update, a request) crossed two tasks after the service loop before its write, each a wake
//! that may land on another worker. Now the service loop's call to `send` writes it (a pipe
//! or a socket takes a line at once nearly always) and the future rmcp spawns is already done.
//!
//! What stays true:
//! - **One writer at a time, whole frames, in order.** The stream sits under one lock. A
//!   sender writes only when it holds the lock, nothing is queued (`queued`) and nothing is
//!   left over from an earlier frame (`carry`); everything else goes to the queue in the
//!   sender's call, which the writer task empties in order after the carry, under the same
//!   lock. So frames go out in the order of the calls, but for one case: when the queue is
//!   full, a frame waits for room in the future rmcp spawns for it, and frames waiting so
//!   take the room in the order those futures are polled (as every frame did before the
//!   queue was entered in the call; a queue that is never full would be unbounded).
//! - **Bounded.** A frame the stream does not take whole is kept as the carry (one frame at
//!   most: no frame is written past it until the writer task has written it), and the queue
//!   is the bounded channel as before: a peer that stops reading makes senders wait.
//! - **No lost wake.** A write that is not taken at once was tried with a no-op waker; the
//!   writer task is then told (`queued` counts it) and polls the stream with its own, which
//!   replaces the no-op one wherever the stream keeps it.
//! - **A broken stream stays broken.** After a failed write (perhaps of half a line) nothing
//!   more is written: the writer task stops, dropping what was queued, and every send after
//!   that fails.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Waker};

use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use super::Writer;

/// Frames queued for the writer task.
pub(super) const WRITE_QUEUE: usize = 256;

/// Bytes the writer task gathers from queued frames before it writes them in one go.
const BATCH: usize = 64 * 1024;

/// A line transport's way out: see the module documentation. Cheap to clone.
#[derive(Clone)]
pub(super) struct Out {
    tx: mpsc::Sender<Vec<u8>>,
    shared: Arc<Shared>,
}

struct Shared {
    stream: tokio::sync::Mutex<Stream>,
    /// Frames handed to the queue (or about to be) that the writer task has not written and
    /// flushed yet, and a carry's call for it; while it is not zero no sender writes.
    queued: AtomicUsize,
    /// Bytes the writer task has written (the stream's own count): how closing tells a slow
    /// peer, still reading, from one that stopped.
    written: Arc<AtomicUsize>,
    /// Answers to the peer's own requests waiting for room ([`Owed`]).
    owed: AtomicUsize,
}

struct Stream {
    w: Writer,
    /// Bytes the writer task has written ([`Shared::written`]).
    written: Arc<AtomicUsize>,
    /// Bytes taken but not written yet: the rest of a frame the stream did not take at once,
    /// then the writer task's batch.
    carry: Vec<u8>,
    /// A write failed, perhaps in the middle of a line.
    broken: bool,
}

/// What [`Out::send`] did with a frame.
pub(super) enum Sent {
    /// Written, kept to be written next by the writer task, or queued: not yet delivered
    /// (a write failing later loses it, as the peer's end would).
    Done,
    /// Queued behind others once the queue has room: the caller awaits this.
    Waiting(Waiting),
    /// The stream failed or is closed.
    Failed(io::Error),
}

/// A place in the queue ([`Out::reserve`]).
pub(super) struct Permit<'a> {
    permit: mpsc::Permit<'a, Vec<u8>>,
    queued: &'a AtomicUsize,
}

impl Permit<'_> {
    pub(super) fn send(self, frame: Vec<u8>) {
        self.queued.fetch_add(1, Ordering::AcqRel);
        self.permit.send(frame);
    }
}

/// A frame waiting for room in the queue. Counted in `queued` from [`Out::send`] on; dropped
/// before it is queued, it is counted out again.
pub(super) struct Waiting {
    out: Out,
    frame: Option<Vec<u8>>,
}

impl Waiting {
    pub(super) async fn sent(mut self) -> io::Result<()> {
        let permit = self.out.tx.reserve().await.map_err(|_| closed())?;
        if let Some(frame) = self.frame.take() {
            permit.send(frame);
        }
        Ok(())
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if self.frame.is_some() {
            self.out.shared.queued.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// One answer owed to the peer ([`Out::owe`]).
pub(super) struct Owed(Arc<Shared>);

impl Drop for Owed {
    fn drop(&mut self) {
        self.0.owed.fetch_sub(1, Ordering::Relaxed);
    }
}

fn closed() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, "the peer closed the stream")
}

impl Out {
    /// The way out through `w`, and the writer task, which ends when every `Out` is dropped
    /// (after writing what is queued and shutting the stream down).
    pub(super) fn new(w: Writer) -> (Out, tokio::task::JoinHandle<()>) {
        let (tx, rx) = mpsc::channel(WRITE_QUEUE);
        let written = Arc::new(AtomicUsize::new(0));
        let shared = Arc::new(Shared {
            stream: tokio::sync::Mutex::new(Stream {
                w,
                written: written.clone(),
                carry: Vec::new(),
                broken: false,
            }),
            queued: AtomicUsize::new(0),
            written,
            owed: AtomicUsize::new(0),
        });
        let task = tokio::spawn(write_loop(shared.clone(), rx));
        (Out { tx, shared }, task)
    }

    /// Sends one frame (a whole line): written now when it can be, else queued. Never waits.
    pub(super) fn send(&self, frame: Vec<u8>) -> Sent {
        let frame = match self.write_now(frame) {
            Ok(None) => return Sent::Done,
            Ok(Some(frame)) => frame,
            Err(e) => {
                // The writer task, idle, is told, so it stops (and the reading side sees it).
                let _ = self.tx.try_send(Vec::new());
                return Sent::Failed(e);
            }
        };
        self.shared.queued.fetch_add(1, Ordering::AcqRel);
        match self.tx.try_send(frame) {
            Ok(()) => Sent::Done,
            Err(mpsc::error::TrySendError::Full(frame)) => Sent::Waiting(Waiting {
                out: self.clone(),
                frame: Some(frame),
            }),
            Err(mpsc::error::TrySendError::Closed(_)) => {
                self.shared.queued.fetch_sub(1, Ordering::AcqRel);
                Sent::Failed(closed())
            }
        }
    }

    /// A place in the queue once there is one, for a frame the reading side owes the peer (an
    /// error answer). Cancel-safe. `None` once the queue is closed.
    pub(super) async fn reserve(&self) -> Option<Permit<'_>> {
        let permit = self.tx.reserve().await.ok()?;
        Some(Permit {
            permit,
            queued: &self.shared.queued,
        })
    }

    /// Waits until the queue has room (the reading side's back-pressure: while the peer does
    /// not take what this side writes, this side stops reading). `None` once it is closed
    /// (the writer task stopped: nothing this side reads could be answered).
    pub(super) async fn room(&self) -> Option<()> {
        if self.tx.is_closed() {
            return None;
        }
        if self.tx.capacity() == 0 {
            drop(self.reserve().await?);
        }
        Some(())
    }

    /// Counts one answer owed to the peer until the guard is dropped (its send ended).
    pub(super) fn owe(&self) -> Owed {
        self.shared.owed.fetch_add(1, Ordering::Relaxed);
        Owed(self.shared.clone())
    }

    /// Answers owed to the peer now ([`Out::owe`]).
    pub(super) fn owed(&self) -> usize {
        self.shared.owed.load(Ordering::Relaxed)
    }

    /// Resolves once the writer task has stopped (the stream failed, or every `Out` is gone).
    pub(super) async fn closed(&self) {
        self.tx.closed().await
    }

    /// How far the writer task has got, readable after every `Out` is dropped (see
    /// [`Shared::written`]).
    pub(super) fn progress(&self) -> impl Fn() -> usize + Send + use<> {
        let shared = self.shared.clone();
        move || shared.written.load(Ordering::Relaxed)
    }

    /// Writes `frame` in this task if the stream is free and nothing is queued ahead of it:
    /// `Ok(None)` when it is written (or its rest kept as the carry, the writer task told);
    /// `Ok(Some(frame))` to queue it.
    fn write_now(&self, mut frame: Vec<u8>) -> io::Result<Option<Vec<u8>>> {
        let shared = &*self.shared;
        if shared.queued.load(Ordering::Acquire) != 0 {
            return Ok(Some(frame));
        }
        let Ok(mut stream) = shared.stream.try_lock() else {
            return Ok(Some(frame));
        };
        if stream.broken {
            return Err(closed());
        }
        // Checked again under the lock: the writer task lowers `queued` only under it, after
        // writing, so a frame queued before this one is either written or still counted.
        if shared.queued.load(Ordering::Acquire) != 0 || !stream.carry.is_empty() {
            return Ok(Some(frame));
        }
        let mut cx = Context::from_waker(Waker::noop());
        let mut done = 0;
        while done < frame.len() {
            match Pin::new(&mut stream.w).poll_write(&mut cx, &frame[done..]) {
                Poll::Ready(Ok(n)) if n > 0 => done += n,
                Poll::Ready(Ok(_)) => return Err(stream.fail(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Err(e)) => return Err(stream.fail(e)),
                Poll::Pending => break,
            }
        }
        if done == frame.len() {
            match Pin::new(&mut stream.w).poll_flush(&mut cx) {
                Poll::Ready(Ok(())) => return Ok(None),
                Poll::Ready(Err(e)) => return Err(stream.fail(e)),
                Poll::Pending => {}
            }
        } else {
            frame.drain(..done);
            stream.carry = frame;
        }
        // The rest (or the flush) is the writer task's: an empty frame calls it, counted so
        // that no sender writes past the carry meanwhile. A full queue already calls it.
        shared.queued.fetch_add(1, Ordering::AcqRel);
        match self.tx.try_send(Vec::new()) {
            Ok(()) => Ok(None),
            Err(mpsc::error::TrySendError::Full(_)) => {
                shared.queued.fetch_sub(1, Ordering::AcqRel);
                Ok(None)
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                shared.queued.fetch_sub(1, Ordering::AcqRel);
                Err(closed())
            }
        }
    }
}

/// The writer task: each time frames are queued, takes the stream, writes the carry and the
/// frames in order (gathered into batches), flushes, and only then lowers `queued`.
async fn write_loop(shared: Arc<Shared>, mut rx: mpsc::Receiver<Vec<u8>>) {
    while let Some(first) = rx.recv().await {
        let mut stream = shared.stream.lock().await;
        if stream.broken {
            return;
        }
        let mut frames = 1;
        let mut next = Some(first);
        while let Some(frame) = next.take() {
            if let Err(e) = stream.put(frame).await {
                stream.fail(e);
                return;
            }
            if let Ok(more) = rx.try_recv() {
                frames += 1;
                next = Some(more);
            }
        }
        if let Err(e) = stream.flush().await {
            stream.fail(e);
            return;
        }
        shared.queued.fetch_sub(frames, Ordering::AcqRel);
    }
    let mut stream = shared.stream.lock().await;
    if !stream.broken && stream.flush().await.is_ok() {
        let _ = stream.w.shutdown().await;
    }
}

impl Stream {
    /// Marks the stream broken by `e` (nothing more is written to it) and returns `e`.
    fn fail(&mut self, e: io::Error) -> io::Error {
        self.broken = true;
        e
    }

    /// Adds `frame` to the batch, writing the batch first when it would grow past [`BATCH`]
    /// (a frame that large on its own is written as it is).
    async fn put(&mut self, frame: Vec<u8>) -> io::Result<()> {
        if self.carry.len() + frame.len() > BATCH {
            self.write_carry().await?;
        }
        if frame.len() >= BATCH {
            return self.write_counted(&frame).await;
        }
        self.carry.extend_from_slice(&frame);
        Ok(())
    }

    /// Writes all of `buf`, counting the bytes as the stream takes them.
    async fn write_counted(&mut self, mut buf: &[u8]) -> io::Result<()> {
        while !buf.is_empty() {
            let n = self.w.write(buf).await?;
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            self.written.fetch_add(n, Ordering::Relaxed);
            buf = &buf[n..];
        }
        Ok(())
    }

    async fn write_carry(&mut self) -> io::Result<()> {
        if self.carry.is_empty() {
            return Ok(());
        }
        let mut carry = std::mem::take(&mut self.carry);
        self.write_counted(&carry).await?;
        // A small allocation is kept for the next batch; a batch's is given back (a quiet
        // connection holds none).
        if carry.capacity() <= 4096 {
            carry.clear();
            self.carry = carry;
        }
        Ok(())
    }

    async fn flush(&mut self) -> io::Result<()> {
        self.write_carry().await?;
        self.w.flush().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;
    use std::time::Duration;
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};

    const WAIT: Duration = Duration::from_secs(10);

    fn line(i: usize, len: usize) -> Vec<u8> {
        let mut l = format!("{i:08}:").into_bytes();
        l.resize(len - 1, b'x');
        l.push(b'\n');
        l
    }

    /// Where line `i` is among the lines of `all`.
    fn pos(all: &[u8], i: usize) -> usize {
        all.split(|b| *b == b'\n')
            .position(|l| l.starts_with(format!("{i:08}:").as_bytes()))
            .unwrap_or_else(|| panic!("line {i} missing"))
    }

    fn outstanding(out: &Out) -> usize {
        out.shared.queued.load(Ordering::Acquire)
    }

    /// Waits (with a deadline) until the writer task has written everything queued.
    async fn drained(out: &Out) {
        tokio::time::timeout(WAIT, async {
            while outstanding(out) != 0 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the writer task wrote what was queued");
    }

    /// Sends `frame` as `LineTransport::send` and the future rmcp spawns for it do.
    async fn send(out: &Out, frame: Vec<u8>) -> io::Result<()> {
        match out.send(frame) {
            Sent::Done => Ok(()),
            Sent::Waiting(w) => w.sent().await,
            Sent::Failed(e) => Err(e),
        }
    }

    /// Blocks the writer task on a full stream (`duplex(64)`, unread) and queues frames
    /// until the queue is full; returns the next line's number.
    async fn fill(out: &Out) -> usize {
        send(out, line(0, 100)).await.unwrap();
        tokio::task::yield_now().await;
        let mut i = 1;
        while out.tx.capacity() > 0 {
            assert!(matches!(out.send(line(i, 100)), Sent::Done));
            i += 1;
        }
        i
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_frame_the_stream_takes_is_written_in_the_senders_task() {
        let (w, mut r) = tokio::io::duplex(1 << 16);
        let (out, _task) = Out::new(Box::new(w));
        assert!(matches!(out.send(b"one\n".to_vec()), Sent::Done));
        // No await since: the writer task has not run, so the bytes are the send's own.
        let mut buf = [0u8; 16];
        let n = r
            .read(&mut buf)
            .now_or_never()
            .expect("written before any other task ran")
            .unwrap();
        assert_eq!(&buf[..n], b"one\n");
        assert_eq!(outstanding(&out), 0);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_carry_goes_out_on_its_own() {
        let (w, mut r) = tokio::io::duplex(64);
        let (out, _task) = Out::new(Box::new(w));
        let a = line(1, 200);
        send(&out, a.clone()).await.unwrap();
        assert!(!out.shared.stream.try_lock().unwrap().carry.is_empty());
        // Nothing else is sent: the writer task, called for the carry, writes it.
        let mut got = vec![0u8; 200];
        tokio::time::timeout(WAIT, r.read_exact(&mut got))
            .await
            .expect("the carry is written")
            .unwrap();
        assert_eq!(got, a);
        drained(&out).await;
    }

    /// A duplex end that misbehaves as told: its first flush answers `Pending`
    /// (`slow_flush`), or its first write takes three bytes and its second fails
    /// (`fails_once`).
    struct Scripted {
        inner: tokio::io::DuplexStream,
        slow_flush: bool,
        fails_once: bool,
        writes: usize,
        flushes: usize,
    }

    impl Scripted {
        fn writer(inner: tokio::io::DuplexStream, slow_flush: bool, fails_once: bool) -> Writer {
            Box::new(Scripted {
                inner,
                slow_flush,
                fails_once,
                writes: 0,
                flushes: 0,
            })
        }
    }

    impl AsyncWrite for Scripted {
        fn poll_write(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.writes += 1;
            match (self.fails_once, self.writes) {
                (true, 1) => Pin::new(&mut self.inner).poll_write(cx, &buf[..3.min(buf.len())]),
                (true, 2) => Poll::Ready(Err(io::ErrorKind::ConnectionReset.into())),
                _ => Pin::new(&mut self.inner).poll_write(cx, buf),
            }
        }
        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            self.flushes += 1;
            if self.slow_flush && self.flushes == 1 {
                return Poll::Pending;
            }
            Pin::new(&mut self.inner).poll_flush(cx)
        }
        fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.inner).poll_shutdown(cx)
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_flush_left_pending_is_finished_by_the_writer_task() {
        let (w, mut r) = tokio::io::duplex(1 << 16);
        let (out, task) = Out::new(Scripted::writer(w, true, false));
        assert!(matches!(out.send(b"one\n".to_vec()), Sent::Done));
        assert_eq!(
            outstanding(&out),
            1,
            "the writer task was called for the flush"
        );
        drained(&out).await;
        drop(out);
        task.await.unwrap();
        let mut all = Vec::new();
        r.read_to_end(&mut all).await.unwrap();
        assert_eq!(all, b"one\n");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_frame_taken_in_part_goes_whole_and_before_the_next() {
        let (w, mut r) = tokio::io::duplex(64);
        let (out, _task) = Out::new(Box::new(w));
        let (a, b) = (line(1, 200), line(2, 50));
        send(&out, a.clone()).await.unwrap();
        assert!(!out.shared.stream.try_lock().unwrap().carry.is_empty());
        // Room again before the writer task runs: `b` must still not go past `a`'s rest.
        let mut head = [0u8; 64];
        r.read_exact(&mut head).now_or_never().unwrap().unwrap();
        send(&out, b.clone()).await.unwrap();
        let mut lines = BufReader::new(head.chain(r)).lines();
        let first = lines.next_line().await.unwrap().unwrap();
        let second = lines.next_line().await.unwrap().unwrap();
        assert_eq!(first.as_bytes(), &a[..a.len() - 1]);
        assert_eq!(second.as_bytes(), &b[..b.len() - 1]);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_queued_frame_is_not_overtaken() {
        let (w, mut r) = tokio::io::duplex(1 << 16);
        let (out, task) = Out::new(Box::new(w));
        let guard = out.shared.stream.try_lock().unwrap();
        assert!(matches!(out.send(line(1, 50)), Sent::Done), "queued");
        drop(guard);
        // The writer task has not run: line 2 must not go ahead of the queued line 1.
        assert!(matches!(out.send(line(2, 50)), Sent::Done));
        drop(out);
        task.await.unwrap();
        let mut all = Vec::new();
        r.read_to_end(&mut all).await.unwrap();
        assert!(pos(&all, 1) < pos(&all, 2));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_peer_that_does_not_read_makes_senders_wait() {
        let (w, mut r) = tokio::io::duplex(64);
        let (out, task) = Out::new(Box::new(w));
        let next = fill(&out).await;
        let Sent::Waiting(waiting) = out.send(line(next, 100)) else {
            panic!("the queue is full: the sender waits");
        };
        let mut sent = Box::pin(waiting.sent());
        assert!((&mut sent).now_or_never().is_none());
        assert!(
            out.room().now_or_never().is_none(),
            "the reading side waits too"
        );
        // Reading frees the stream, then the queue, and the frame counts as sent.
        let reader = tokio::spawn(async move {
            let mut all = Vec::new();
            r.read_to_end(&mut all).await.unwrap();
            all
        });
        tokio::time::timeout(WAIT, sent).await.unwrap().unwrap();
        drop(out);
        task.await.unwrap();
        let all = reader.await.unwrap();
        let lines: Vec<_> = all
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .collect();
        assert_eq!(lines.len(), next + 1, "every frame written once");
        for (i, l) in lines.iter().enumerate() {
            assert_eq!(&l[..9], format!("{i:08}:").as_bytes(), "line {i} in order");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn many_senders_never_interleave_and_each_keeps_its_order() {
        const SENDERS: usize = 8;
        const EACH: usize = 500;
        let (w, r) = tokio::io::duplex(512);
        let (out, task) = Out::new(Box::new(w));
        let reader = tokio::spawn(async move {
            let mut lines = BufReader::new(r).lines();
            let mut next = [0usize; SENDERS];
            let mut n = 0;
            while let Some(l) = lines.next_line().await.unwrap() {
                let (who, rest) = l.split_once(':').unwrap();
                let (who, seq): (usize, usize) = (who.parse().unwrap(), rest[..6].parse().unwrap());
                assert_eq!(seq, next[who], "sender {who}'s frames in order");
                assert!(rest[6..].bytes().all(|b| b == b'y'), "a frame whole");
                next[who] += 1;
                n += 1;
            }
            n
        });
        let senders: Vec<_> = (0..SENDERS)
            .map(|who| {
                let out = out.clone();
                tokio::spawn(async move {
                    for seq in 0..EACH {
                        let mut l = format!("{who}:{seq:06}").into_bytes();
                        l.resize(20 + (seq * 37) % 300, b'y');
                        l.push(b'\n');
                        send(&out, l).await.unwrap();
                        if seq % 16 == 0 {
                            tokio::task::yield_now().await;
                        }
                    }
                })
            })
            .collect();
        for s in senders {
            s.await.unwrap();
        }
        drop(out);
        task.await.unwrap();
        assert_eq!(reader.await.unwrap(), SENDERS * EACH);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn after_half_a_line_nothing_more_is_written() {
        let (w, mut r) = tokio::io::duplex(1 << 16);
        let (out, task) = Out::new(Scripted::writer(w, false, true));
        assert!(send(&out, b"first\n".to_vec()).await.is_err());
        // The stream would take these: they must not follow half a line.
        assert!(send(&out, b"second\n".to_vec()).await.is_err());
        let guard = out.shared.stream.try_lock().unwrap();
        let queued = out.send(b"third\n".to_vec());
        drop(guard);
        assert!(matches!(queued, Sent::Done), "queued behind the lock");
        drop(out);
        task.await.unwrap();
        let mut all = Vec::new();
        r.read_to_end(&mut all).await.unwrap();
        assert_eq!(all, b"fir");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn after_the_writer_task_fails_sends_fail() {
        let (w, r) = tokio::io::duplex(64);
        let (out, task) = Out::new(Box::new(w));
        let next = fill(&out).await;
        drop(r);
        // The writer task meets the closed peer and stops; the waiting sender is told.
        let Sent::Waiting(waiting) = out.send(line(next, 100)) else {
            panic!("full");
        };
        assert!(
            tokio::time::timeout(WAIT, waiting.sent())
                .await
                .unwrap()
                .is_err()
        );
        assert!(send(&out, line(next + 1, 100)).await.is_err());
        assert!(out.room().await.is_none());
        drop(out);
        task.await.unwrap();
    }
}
