//! The flusher: writes the buffer to the store when it has something to write, expires what
//! passed the retention when the oldest event's time comes, and writes once more, closed, at
//! shutdown.
//!
//! Nothing here runs on a tick. The flusher sleeps on the buffer's
//! [`changes`](Buffer::changes) (marked by an insert, an eviction, a new `live_through`), on
//! the deadline at which the oldest event passes the retention
//! ([`Buffer::next_expiry_ms`]), and on shutdown. A change opens a [`FLUSH_WINDOW`]: what
//! comes within it goes in the same store batch (a burst of messages, or a backfill, is one
//! commit). A failed write is tried again after another window. An idle role never wakes.
//!
//! On NATS ([`Buffer::memory`]) nothing is stored: the flusher only expires (at the deadline)
//! and the lease holder publishes and writes the shared state (`shared/`), waking on the same
//! changes.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::buffer::{Buffer, Written};
use super::core::{Core, at};
use crate::mcp::ring::now_ms;
use crate::store::StoreError;

/// How long changes are gathered before they are written: one store batch for a burst.
pub const FLUSH_WINDOW: Duration = Duration::from_secs(2);

/// The role's flusher, until shutdown (its last write included); each write's outcome goes to
/// the status.
pub(super) async fn run(core: Arc<Core>) {
    let shutdown = core.ctx.shutdown().clone();
    flusher(&core.buffer, &shutdown, |r| {
        let mut s = core.status();
        match r {
            Ok(w) if w.rows + w.deleted > 0 => {
                s.last_write_at = Some(at(now_ms()));
                s.last_write_rows = w.rows;
                s.last_write_error = None;
            }
            Ok(_) => {}
            Err(e) => {
                tracing::error!(error = %e, "cannot write the slack buffer; it is retried");
                s.last_write_error = Some(e.to_string());
            }
        }
    })
    .await
}

/// Flushes `buffer` when it changed (after [`FLUSH_WINDOW`]) or an event passed the retention,
/// and once more at `shutdown` (closing a stored buffer first); `wrote` hears each flush's
/// outcome.
pub(super) async fn flusher(
    buffer: &Buffer,
    shutdown: &CancellationToken,
    mut wrote: impl FnMut(Result<Written, StoreError>),
) {
    let mut changes = buffer.changes();
    // What opening left to write (a new buffer's state row) is written like any change.
    let mut due = buffer.dirty();
    loop {
        let last = if due {
            // Something to write: gather what comes within the window, then write it all.
            tokio::select! {
                _ = shutdown.cancelled() => true,
                _ = tokio::time::sleep(FLUSH_WINDOW) => false,
            }
        } else {
            let expiry = buffer.next_expiry_ms().map(|ms| {
                tokio::time::Instant::now() + Duration::from_millis(ms.saturating_sub(now_ms()))
            });
            tokio::select! {
                _ = shutdown.cancelled() => true,
                // (The buffer holds the sender: this never ends while `buffer` lives.) On NATS
                // nothing is stored: the holder publishes and shares, and this only expires.
                Ok(()) = changes.changed(), if !buffer.is_shared() => {
                    due = true;
                    continue;
                }
                _ = sleep_until_some(expiry) => false,
            }
        };
        buffer.expire(now_ms());
        // Everything changed until now is in this flush; a change after it opens a new window.
        changes.borrow_and_update();
        // On NATS the buffer is not closed: the socket is still draining (the lease's holding
        // spell publishes what it brings before it lets the lease go).
        let r = if last && !buffer.is_shared() {
            buffer.close().await
        } else {
            buffer.flush().await
        };
        // A failed write keeps its rows marked: tried again after another window.
        due = r.is_err();
        wrote(r);
        if last {
            return;
        }
    }
}

/// Sleeps until `at`, or forever when there is no deadline.
async fn sleep_until_some(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::slack::message::Posted;
    use crate::source::slack::settings::Key;
    use crate::store::Store;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A message posted `ago_ms` ago.
    fn posted(text: &str, ago_ms: u64) -> Posted {
        super::super::buffer::tests::posted("C1", now_ms() - ago_ms, text)
    }

    /// A stored buffer with nothing left to write, and a flusher over it counting its flushes
    /// (each also sent on the channel).
    async fn flushing() -> (
        Arc<Buffer>,
        Arc<AtomicUsize>,
        tokio::sync::mpsc::Receiver<Written>,
        CancellationToken,
    ) {
        let (b, _) = Buffer::open(
            Store::memory(),
            &Key([7; 32]),
            Duration::from_secs(7 * 86_400),
            100,
        )
        .await
        .unwrap();
        // The new buffer's state row, written before the clock stops.
        b.flush().await.unwrap();
        assert!(!b.dirty());
        let b = Arc::new(b);
        let flushes = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let stop = CancellationToken::new();
        let (b2, n, s) = (b.clone(), flushes.clone(), stop.clone());
        tokio::spawn(async move {
            flusher(&b2, &s, |r| {
                n.fetch_add(1, Ordering::SeqCst);
                let _ = tx.try_send(r.unwrap());
            })
            .await
        });
        (b, flushes, rx, stop)
    }

    /// Lets the flusher run up to where it waits again.
    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn an_idle_buffer_is_never_flushed() {
        let (b, flushes, _rx, _stop) = flushing().await;
        tokio::time::pause();
        for _ in 0..24 {
            tokio::time::advance(Duration::from_secs(3600)).await;
            settle().await;
        }
        assert_eq!(
            flushes.load(Ordering::SeqCst),
            0,
            "no flush in a day of nothing"
        );
        assert!(!b.dirty());
    }

    #[tokio::test]
    async fn what_is_pushed_is_flushed_once_after_the_window() {
        let (b, flushes, mut rx, stop) = flushing().await;
        tokio::time::pause();
        settle().await;
        b.insert(posted("one", 2)).unwrap();
        settle().await;
        tokio::time::advance(FLUSH_WINDOW / 2).await;
        b.insert(posted("two", 1)).unwrap();
        tokio::time::advance(FLUSH_WINDOW / 2 - Duration::from_millis(10)).await;
        settle().await;
        assert_eq!(flushes.load(Ordering::SeqCst), 0, "not before the window");
        assert!(b.dirty());
        tokio::time::advance(Duration::from_millis(20)).await;
        // The store's writer is a thread: wait for it on the real clock.
        tokio::time::resume();
        let w = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("flushed after the window")
            .unwrap();
        assert_eq!(w.rows, 3, "both rows and the state row, in one batch");
        assert!(!b.dirty());
        // Nothing new: no other flush, however long it stays quiet.
        tokio::time::pause();
        for _ in 0..10 {
            tokio::time::advance(Duration::from_secs(60)).await;
            settle().await;
        }
        assert_eq!(flushes.load(Ordering::SeqCst), 1);
        stop.cancel();
    }
}
