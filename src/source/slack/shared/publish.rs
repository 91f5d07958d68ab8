//! Publishing to the shared stream: the holder's [`publisher`] task takes the buffer's
//! unwritten rows at each insert and [`publish_pending`] sends them in seq order, sealed with
//! their seq, each expecting the last stream sequence (the `writer` lock held across the
//! awaits); a duplicate or a wrong last sequence that is not this process's own earlier
//! publish means another process wrote, and this one is no longer the writer.

use crate::sync::Recover;
use std::sync::Arc;
use std::time::Instant;

use async_nats::jetstream;

use super::{Feed, PUBLISH_TIMEOUT, RETRY, Sealed};
use crate::source::slack::core::Core;

/// Publishes what this process ingests, at once, while it may write.
pub(super) async fn publisher(core: Arc<Core>, feed: Arc<Feed>) {
    let shutdown = core.ctx.shutdown().clone();
    let mut backoff = RETRY;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = core.unwritten.notified() => {}
        }
        loop {
            match publish_pending(&core, &feed).await {
                Ok(()) => {
                    backoff = RETRY;
                    break;
                }
                Err(Refused::Superseded) => {
                    feed.superseded.send_modify(|n| *n += 1);
                    break;
                }
                Err(Refused::Failed) => {
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(backoff.next_delay()) => {}
                    }
                }
            }
        }
    }
}

/// Records whether publishing fails now (the lease's shell hears of it when that changes).
pub(super) fn failing(feed: &Feed, now_failing: bool) {
    feed.failing_since
        .send_if_modified(|f| match (now_failing, f.is_some()) {
            (true, false) => {
                *f = Some(Instant::now());
                true
            }
            (false, true) => {
                *f = None;
                true
            }
            _ => false,
        });
}

/// The stream's last sequence, when its last message is one this process sent without an
/// acknowledgement.
async fn own_last(feed: &Feed) -> Option<u64> {
    if feed.unacked.locked().is_empty() {
        return None;
    }
    let stream = feed.js.get_stream(&feed.stream).await.ok()?;
    let last = tokio::time::timeout(
        PUBLISH_TIMEOUT,
        stream.get_last_raw_message_by_subject(&feed.subject),
    )
    .await
    .ok()?
    .ok()?;
    let id = last
        .headers
        .get(async_nats::header::NATS_MESSAGE_ID)?
        .as_str()
        .to_owned();
    feed.unacked.locked().remove(&id).then_some(last.sequence)
}

/// Why a publish did not go through.
pub(super) enum Refused {
    /// Another process wrote to the stream: this one is no longer the only writer.
    Superseded,
    /// NATS did not answer (in time): the rows stay unwritten, for the next try.
    Failed,
}

/// Publishes every unwritten row, in seq order, each expecting the last one before it.
pub(super) async fn publish_pending(core: &Core, feed: &Feed) -> Result<(), Refused> {
    let mut writer = feed.writer.lock().await;
    let Some(mut expected) = *writer else {
        // Not the holder (any more): nothing is written; the rows wait for a lease or are
        // forgotten when it is lost.
        return Ok(());
    };
    let counts = &feed.counts;
    let rows = core.buffer.take_unwritten();
    for (i, h) in rows.iter().enumerate() {
        let id = h.posted.event_id();
        let plain = serde_json::to_vec(&Sealed {
            seq: h.seq,
            prev: feed.through.load(std::sync::atomic::Ordering::Relaxed),
            data: (*h.posted).clone(),
        })
        .expect("a payload serializes");
        let sealed = core.buffer.sealer().seal(&id, &plain);
        let msg = jetstream::message::PublishMessage::build()
            .payload(sealed.into())
            .message_id(&id)
            .expected_last_sequence(expected);
        let clock = Instant::now();
        let r = tokio::time::timeout(PUBLISH_TIMEOUT, async {
            feed.js.send_publish(feed.subject.clone(), msg).await?.await
        })
        .await;
        match r {
            Ok(Ok(ack))
                if ack.duplicate
                    && ack.sequence > expected
                    && feed.unacked.locked().remove(&id) =>
            {
                // This process's own earlier publish of it, landed after all.
                expected = ack.sequence;
                *writer = Some(expected);
            }
            Ok(Ok(ack)) if ack.duplicate && ack.sequence > expected => {
                // The stream took this event from another writer after this one's last
                // publish: this process is not the only writer any more.
                tracing::warn!(stream = %feed.stream, "another process wrote to the slack stream: this one is no longer its writer");
                core.buffer.restore_unwritten(&rows[i + 1..]);
                *writer = None;
                return Err(Refused::Superseded);
            }
            Ok(Ok(ack)) => {
                counts.publish_seconds.observe(clock.elapsed());
                failing(feed, false);
                feed.unacked.locked().remove(&id);
                feed.through
                    .fetch_max(h.seq, std::sync::atomic::Ordering::Relaxed);
                if !ack.duplicate {
                    expected = ack.sequence;
                    *writer = Some(expected);
                }
            }
            Ok(Err(e)) if e.kind() == jetstream::context::PublishErrorKind::WrongLastSequence => {
                counts.publish_failures.inc();
                // The last message may be this process's own, sent earlier without an
                // acknowledgement (and applied meanwhile): then take its place and go on.
                if let Some(own) = own_last(feed).await {
                    expected = own;
                    *writer = Some(expected);
                    core.buffer.restore_unwritten(&rows[i..]);
                    return Err(Refused::Failed);
                }
                tracing::warn!(stream = %feed.stream, "another process wrote to the slack stream: this one is no longer its writer");
                core.buffer.restore_unwritten(&rows[i..]);
                *writer = None;
                return Err(Refused::Superseded);
            }
            Ok(Err(e)) => {
                counts.publish_failures.inc();
                failing(feed, true);
                feed.unacked.locked().insert(id.clone());
                tracing::warn!(error = %e, "cannot publish to the slack stream; retrying");
                // NATS lost the stream: made again, the next try meets its new last sequence
                // and this holder steps down to fence it anew.
                feed.remake_stream().await;
                core.buffer.restore_unwritten(&rows[i..]);
                return Err(Refused::Failed);
            }
            Err(_) => {
                counts.publish_failures.inc();
                failing(feed, true);
                feed.unacked.locked().insert(id.clone());
                tracing::warn!(servers = %feed.servers, "no acknowledgement from NATS in time; retrying");
                core.buffer.restore_unwritten(&rows[i..]);
                return Err(Refused::Failed);
            }
        }
    }
    Ok(())
}
