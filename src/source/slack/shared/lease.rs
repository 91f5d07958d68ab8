//! The socket lease: [`lease`] waits for it ([`acquire`]: compare-and-set on the key of the
//! bucket, taken after the stale time by this host's clock, at once from a dead holder of
//! this host) and [`hold`]s it: catch up with the stream, publish a fence, run the socket and
//! the backfill, renew every heartbeat, step down when a renewal is two thirds of the stale
//! time old, publishing has failed that long or a write was refused, and at shutdown close
//! the socket, publish what is left and release the key. The holder writes the shared state
//! row ([`write_state`]) a short window after the buffer says it changed.
//!
//! The timers here are deadlines, not polling: a lease held is renewed before it goes stale,
//! so the holder sleeps until its next renewal is due (a heartbeat after the last attempt) or
//! until its last successful renewal is two thirds of the stale time old (it steps down); a
//! standby sleeps until the lease it watches would be stale (any change to it wakes it
//! earlier). Nothing wakes to look for work: the state row waits for the buffer's changes.

use crate::sync::Recover;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, kv};
use futures::StreamExt;
use tokio_util::sync::CancellationToken;

use super::LeaseMetrics;
use super::publish::{failing, publish_pending};
use super::{
    CATCH_UP_TIMEOUT, Feed, LeaseValue, MARKER_HEADER, PUBLISH_TIMEOUT, RELEASE_STEP, RETRY,
    SharedConfig, lease_status,
};
use crate::mcp::ring::now_ms;
use crate::nats::holder::dead_here;
use crate::source::slack::buffer::{SharedState, now_us};
use crate::source::slack::core::{Core, SocketState, at};
use crate::source::slack::flush::FLUSH_WINDOW;
use crate::source::slack::{backfill, socket};

/// How a holding spell ended.
enum Ended {
    Shutdown,
    Lost(String),
}

/// Waits for the lease, holds it (socket and backfill running) until lost, and again, until
/// shutdown.
pub(super) async fn lease(core: Arc<Core>, feed: Arc<Feed>, cfg: SharedConfig) {
    let shutdown = core.ctx.shutdown().clone();
    let mut backoff = RETRY;
    loop {
        core.status().state = SocketState::Standby;
        let Some(taken) = acquire(&core, &feed, &cfg, &shutdown).await else {
            return;
        };
        if let Some(seen) = taken.previous_seen_ms
            && core.buffer.live_through().is_none()
        {
            // The previous holder's state never reached the bucket: it was live (and
            // publishing) until it was last seen renewing, so the backfill reads from there.
            // (No start is known: the retention is the only floor.)
            core.buffer.merge_shared(SharedState {
                first_seq: 0,
                born_ms: Some(0),
                live_through_ms: Some(seen),
            });
        }
        let began = Instant::now();
        let ended = hold(&core, &feed, &cfg, taken.revision, &shutdown).await;
        if let Ended::Shutdown = ended {
            return;
        }
        core.status().state = SocketState::Standby;
        // A spell that ended at once (the stream gone, no permission) is not tried again in
        // a tight loop.
        if began.elapsed() > cfg.stale {
            backoff = RETRY;
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(backoff.next_delay()) => {}
        }
    }
}

/// What taking the lease found.
struct Taken {
    revision: u64,
    /// When (this host's clock) another holder was last seen renewing it.
    previous_seen_ms: Option<u64>,
}

/// Waits until this process holds the lease, or `None` at shutdown.
async fn acquire(
    core: &Core,
    feed: &Feed,
    cfg: &SharedConfig,
    shutdown: &CancellationToken,
) -> Option<Taken> {
    let value = |beat| feed.lease_value(beat);
    let mut backoff = RETRY;
    let mut previous_seen_ms = None;
    'fresh: loop {
        // What the key holds now, and from when (by this process's clock) it is unchanged.
        let current = tokio::select! {
            _ = shutdown.cancelled() => return None,
            e = feed.kv.entry(&feed.lease_key) => e,
        };
        let current = match current {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(error = %e, "cannot read the slack lease; retrying");
                tokio::select! {
                    _ = shutdown.cancelled() => return None,
                    _ = tokio::time::sleep(backoff.next_delay()) => continue 'fresh,
                }
            }
        };
        let free = current
            .as_ref()
            .is_none_or(|e| e.operation != kv::Operation::Put);
        let holder = current
            .as_ref()
            .filter(|_| !free)
            .and_then(|e| serde_json::from_slice::<LeaseValue>(&e.value).ok())
            .map(|v| v.holder);
        let changed_hands = core
            .status()
            .lease
            .as_ref()
            .is_none_or(|l| l.holder != holder);
        lease_status(core, |l| l.holder = holder.clone());
        if let Some(h) = &holder {
            previous_seen_ms = Some(now_ms());
            if changed_hands && h != &feed.me {
                tracing::info!(holder = %h, "another process holds the slack socket lease: standing by");
            }
        }
        let revision = current.as_ref().map_or(0, |e| e.revision);
        let mine = holder.as_deref() == Some(feed.me.as_str());
        let taken = if free {
            match current {
                None => feed.kv.create(&feed.lease_key, value(0).into()).await,
                Some(_) => feed
                    .kv
                    .update(&feed.lease_key, value(0).into(), revision)
                    .await
                    .map_err(Into::into),
            }
        } else if mine || holder.as_deref().is_some_and(dead_here) {
            tracing::info!(holder = ?holder, "the slack lease's holder was a process of this host that is gone: taking it");
            feed.kv
                .update(&feed.lease_key, value(0).into(), revision)
                .await
                .map_err(Into::into)
        } else {
            // Held: wait for a change, or for the stale time with none.
            let mut watch = match feed.kv.watch(&feed.lease_key).await {
                Ok(w) => w,
                Err(e) => {
                    tracing::debug!(error = %e, "cannot watch the slack lease; retrying");
                    tokio::select! {
                        _ = shutdown.cancelled() => return None,
                        _ = tokio::time::sleep(backoff.next_delay()) => continue 'fresh,
                    }
                }
            };
            let stale_at = tokio::time::Instant::now() + cfg.stale;
            tokio::select! {
                _ = shutdown.cancelled() => return None,
                // Changed (a heartbeat, a release): read it again.
                _ = watch.next() => continue 'fresh,
                _ = tokio::time::sleep_until(stale_at) => {}
            }
            tracing::warn!(holder = ?holder, stale_s = cfg.stale.as_secs_f64(), "the slack lease's holder is silent: taking the socket over");
            feed.kv
                .update(&feed.lease_key, value(0).into(), revision)
                .await
                .map_err(Into::into)
        };
        match taken {
            Ok(revision) => {
                return Some(Taken {
                    revision,
                    previous_seen_ms,
                });
            }
            Err::<u64, kv::CreateError>(e) => {
                // Someone else was quicker (or NATS is away, or refuses): look again, paced.
                tracing::debug!(error = %e, "the slack lease was not taken");
                tokio::select! {
                    _ = shutdown.cancelled() => return None,
                    _ = tokio::time::sleep(backoff.next_delay()) => {}
                }
            }
        }
    }
}

/// Holds the lease from `revision`: catches up with the stream, fences it, runs the socket
/// and the backfill, renews; ends at shutdown (releasing it) or when it is lost.
///
/// The socket runs only while the last renewal is younger than two thirds of the stale time
/// (each renewal's wait is cut at that deadline), so a standby that takes over after the
/// stale time never overlaps it.
async fn hold(
    core: &Arc<Core>,
    feed: &Feed,
    cfg: &SharedConfig,
    mut revision: u64,
    shutdown: &CancellationToken,
) -> Ended {
    tracing::info!(holder = %feed.me, "this process holds the slack socket lease");
    let counts = LeaseMetrics::register(core.ctx.metrics());
    counts.held.set(1);
    counts.acquired.inc();
    lease_status(core, |l| {
        l.held = true;
        l.holder = Some(feed.me.clone());
        l.acquired_at = Some(at(now_ms()));
        l.takeovers += 1;
    });
    let stop = shutdown.child_token();
    let mut running: Vec<tokio::task::JoinHandle<()>> = Vec::new();
    let mut beat = 0u64;
    let lease_value = |beat| feed.lease_value(beat);
    // Ids left unacknowledged by an earlier spell mean nothing in this one.
    feed.unacked.locked().clear();
    let keep_for = cfg.stale * 2 / 3;
    // Anything ingested outside a spell (a reader that outlived its socket's close) is not
    // published under stale seqs: the backfill reads it again.
    let stranded = core.buffer.take_unwritten();
    core.buffer.forget(&stranded);
    let mut superseded = feed.superseded.subscribe();
    let ended = 'held: {
        // Everything published before this moment is applied first: new seqs stay above it.
        let caught_up = tokio::time::timeout(CATCH_UP_TIMEOUT, async {
            let mut s = feed
                .js
                .get_stream(&feed.stream)
                .await
                .map_err(|e| e.to_string())?;
            let st = s.info().await.map_err(|e| e.to_string())?.state.clone();
            if st.messages > 0 {
                let mut rx = feed.applied.clone();
                let last = st.last_sequence;
                rx.wait_for(|&a| a >= last)
                    .await
                    .map_err(|e| e.to_string())?;
            }
            Ok::<u64, String>(st.last_sequence)
        })
        .await;
        let last = match caught_up {
            Ok(Ok(last)) => last,
            Ok(Err(e)) => break 'held Ended::Lost(format!("cannot catch up with the stream: {e}")),
            Err(_) => break 'held Ended::Lost("cannot catch up with the stream in time".into()),
        };
        // The fence: a message that says the stream's last sequence is `last`. It fails if
        // another process wrote since; once it is in, a publish of a previous holder (which
        // expects an older sequence) is refused.
        let marker = jetstream::message::PublishMessage::build()
            .header(MARKER_HEADER, feed.me.as_str())
            .expected_last_sequence(last);
        let fenced = tokio::time::timeout(PUBLISH_TIMEOUT, async {
            feed.js
                .send_publish(feed.subject.clone(), marker)
                .await?
                .await
        })
        .await;
        let expected = match fenced {
            Ok(Ok(ack)) => ack.sequence,
            Ok(Err(e)) => break 'held Ended::Lost(format!("cannot fence the stream: {e}")),
            Err(_) => break 'held Ended::Lost("cannot fence the stream in time".into()),
        };
        // Renewed now: the catch-up may have taken a while of the stale time.
        match tokio::time::timeout(
            keep_for,
            feed.kv
                .update(&feed.lease_key, lease_value(0).into(), revision),
        )
        .await
        {
            Ok(Ok(r)) => revision = r,
            _ => {
                break 'held Ended::Lost("the lease could not be renewed after catching up".into());
            }
        }
        let mut last_ok = Instant::now();
        *feed.writer.lock().await = Some(expected);
        failing(feed, false);
        let (mut shared, _) = core.buffer.take_shared();
        match feed.kv.get(&feed.state_key).await {
            Ok(Some(v)) => {
                if let Ok(s) = serde_json::from_slice::<SharedState>(&v) {
                    core.buffer.merge_shared(s);
                }
                shared = core.buffer.take_shared().0;
                write_state(feed, shared).await;
            }
            Ok(None) => {
                // A new feed begins now: a cursor from before it learns `truncated`. Made
                // only if absent (and taken in only once made), so a feed's start never moves.
                shared.first_seq = core.buffer.head().max(now_us());
                let bytes = serde_json::to_vec(&shared).expect("the state serializes");
                match feed.kv.create(&feed.state_key, bytes.into()).await {
                    Ok(_) => core.buffer.merge_shared(shared),
                    Err(_) => {
                        if let Ok(Some(v)) = feed.kv.get(&feed.state_key).await
                            && let Ok(s) = serde_json::from_slice::<SharedState>(&v)
                        {
                            core.buffer.merge_shared(s);
                        }
                    }
                }
            }
            Err(e) => {
                break 'held Ended::Lost(format!("cannot read the feed's shared state: {e}"));
            }
        }
        running.push(
            core.ctx
                .spawn("slack socket mode", socket::run(core.clone(), stop.clone())),
        );
        running.push(
            core.ctx
                .spawn("slack backfill", backfill::run(core.clone(), stop.clone())),
        );
        // The next renewal is due a heartbeat after the last attempt.
        let mut renew_at = tokio::time::Instant::now() + cfg.heartbeat;
        // The shared state is written a window after the buffer says it changed (the
        // window gathers a backfill's inserts and its new `live_through` into one write).
        let mut changes = core.buffer.changes();
        let state_window = FLUSH_WINDOW.min(cfg.heartbeat);
        // Due at once: what changed before this spell's first write is not left out.
        let mut state_at = Some(tokio::time::Instant::now());
        loop {
            let deadline = tokio::time::Instant::from_std(last_ok + keep_for);
            tokio::select! {
                _ = shutdown.cancelled() => break 'held Ended::Shutdown,
                _ = superseded.changed() => break 'held Ended::Lost("another process wrote to the stream".into()),
                _ = tokio::time::sleep_until(deadline) => {
                    break 'held Ended::Lost("the lease could not be renewed for 2/3 of the stale time".into());
                }
                Ok(()) = changes.changed(), if state_at.is_none() => {
                    state_at = Some(tokio::time::Instant::now() + state_window);
                    continue;
                }
                _ = tokio::time::sleep_until(state_at.unwrap_or(deadline)), if state_at.is_some() => {
                    state_at = None;
                    changes.borrow_and_update();
                    // Where the backfill may start from, for whoever holds next.
                    let (shared, changed) = core.buffer.take_shared();
                    if changed {
                        write_state(feed, shared).await;
                    }
                    continue;
                }
                _ = tokio::time::sleep_until(renew_at) => {}
            }
            let stuck = feed
                .failing_since
                .locked()
                .is_some_and(|t| t.elapsed() >= keep_for);
            if stuck {
                break 'held Ended::Lost(
                    "publishing to the stream failed for 2/3 of the stale time".into(),
                );
            }
            beat += 1;
            renew_at = tokio::time::Instant::now() + cfg.heartbeat;
            let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
            match tokio::time::timeout(
                remaining.min(cfg.heartbeat),
                feed.kv
                    .update(&feed.lease_key, lease_value(beat).into(), revision),
            )
            .await
            {
                Ok(Ok(r)) => {
                    revision = r;
                    last_ok = Instant::now();
                }
                Ok(Err(e)) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => {
                    break 'held Ended::Lost("another process took the lease".into());
                }
                Ok(Err(e)) => tracing::warn!(error = %e, "cannot renew the slack lease"),
                Err(_) => tracing::warn!("cannot renew the slack lease: no answer in time"),
            }
        }
    };
    // The socket closes (and its reader ends) before anything else happens.
    stop.cancel();
    let stopped = tokio::time::timeout(RELEASE_STEP * 3, async {
        for r in &mut running {
            let _ = r.await;
        }
    })
    .await
    .is_ok();
    if !stopped {
        for r in &running {
            r.abort();
        }
    }
    counts.held.set(0);
    match ended {
        Ended::Shutdown => {
            // What the socket brought in last is published, then the lease is given back
            // (only once the socket is known closed), then the state written: all within the
            // process's drain time. A row cut off mid-publish stays counted as in flight, so
            // the state written does not pass it.
            let _ = tokio::time::timeout(RELEASE_STEP, publish_pending(core, feed)).await;
            if let Ok(mut w) = tokio::time::timeout(RELEASE_STEP / 2, feed.writer.lock()).await {
                *w = None;
            }
            let released = stopped
                && matches!(
                    tokio::time::timeout(
                        RELEASE_STEP,
                        feed.kv
                            .delete_expect_revision(&feed.lease_key, Some(revision)),
                    )
                    .await,
                    Ok(Ok(()))
                );
            if released {
                tracing::info!("slack socket lease released");
            } else {
                tracing::warn!(
                    "could not release the slack socket lease; another process takes it once it is stale"
                );
            }
            let shared = core.buffer.take_shared().0;
            let _ = tokio::time::timeout(RELEASE_STEP / 2, write_state(feed, shared)).await;
            lease_status(core, |l| l.held = false);
            Ended::Shutdown
        }
        Ended::Lost(why) => {
            counts.lost.inc();
            // Writing stops before the lease is given up.
            *feed.writer.lock().await = None;
            let unpublished = core.buffer.take_unwritten();
            core.buffer.forget(&unpublished);
            // Given back if it is still this process's (a catch-up that failed, NATS back)
            // and its socket is known closed: anyone may take it at once. Refused when
            // another process has it already.
            if stopped {
                let _ = tokio::time::timeout(
                    Duration::from_secs(5),
                    feed.kv
                        .delete_expect_revision(&feed.lease_key, Some(revision)),
                )
                .await;
            }
            tracing::warn!(reason = %why, "lost the slack socket lease: socket closed; what was not published is left to the next holder's backfill");
            lease_status(core, |l| {
                l.held = false;
                l.lost += 1;
            });
            core.status().last_socket_error = Some(format!("lease lost: {why}"));
            Ended::Lost(why)
        }
    }
}

/// Writes the shared state (the holder's), best effort: a lost write only widens the next
/// holder's backfill.
async fn write_state(feed: &Feed, s: SharedState) {
    let bytes = serde_json::to_vec(&s).expect("the state serializes");
    if let Err(e) = feed.kv.put(&feed.state_key, bytes.into()).await {
        tracing::debug!(error = %e, "cannot write the slack shared state");
    }
}
