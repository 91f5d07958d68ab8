//! The socket lease's shell: [`lease`] runs the [`Lease`] machine (`shared/machine.rs`, where
//! the rules are) against NATS and the socket. It turns each [`Action`] into a key read,
//! watch, create, compare-and-set or delete, a catch-up with the stream, a fence, the socket
//! and backfill tasks, and feeds their answers back as [`Input`]s, with the time. While the
//! lease is held it also writes the shared state row ([`write_state`]) a short window after
//! the buffer says it changed.
//!
//! Nothing here polls: the shell sleeps until an answer, a change of the key, a refused or
//! failing publish, shutdown, the state row's window or the machine's next deadline.

use crate::sync::Recover;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use async_nats::jetstream::{self, kv};
use futures::StreamExt;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::machine::{Action, Input, Key, Lease, Timing, WriteError};
use super::publish::{failing, publish_pending};
use super::{
    CATCH_UP_TIMEOUT, Feed, LeaseMetrics, LeaseValue, MARKER_HEADER, PUBLISH_TIMEOUT, RELEASE_STEP,
    RETRY, SharedConfig, lease_status,
};
use crate::mcp::ring::now_ms;
use crate::nats::holder::dead_here;
use crate::source::slack::buffer::{SharedState, now_us};
use crate::source::slack::core::{Core, SocketState, at};
use crate::source::slack::flush::FLUSH_WINDOW;
use crate::source::slack::{backfill, socket};

/// Waits for the lease, holds it (socket and backfill running) until lost, and again, until
/// shutdown.
pub(super) async fn lease(core: Arc<Core>, feed: Arc<Feed>, cfg: SharedConfig) {
    let timing = Timing {
        heartbeat: cfg.heartbeat,
        stale: cfg.stale,
        retry: RETRY,
    };
    let mut machine = Lease::new(feed.me.clone(), timing);
    let mut shell = Shell::new(core, feed, timing);
    let mut actions = machine.start();
    loop {
        for a in actions {
            if a == Action::Done {
                shell.done().await;
                return;
            }
            shell.act(a).await;
        }
        let input = shell.next(machine.deadline()).await;
        actions = machine.handle(Instant::now(), input);
    }
}

type Answer = Pin<Box<dyn Future<Output = Input> + Send>>;

struct Shell {
    core: Arc<Core>,
    feed: Arc<Feed>,
    timing: Timing,
    counts: LeaseMetrics,
    shutdown: CancellationToken,
    shutdown_fed: bool,
    /// Inputs the actions themselves produced (a watch that could not start).
    queued: VecDeque<Input>,
    /// The one outstanding answered action.
    answer: Option<Answer>,
    /// The socket closing (its own slot: a write of the key outstanding still answers).
    closing: Option<Answer>,
    watch: Option<kv::Watch>,
    superseded: tokio::sync::watch::Receiver<u64>,
    failing: tokio::sync::watch::Receiver<Option<Instant>>,
    /// The spell's socket and backfill, and what stops them.
    stop: CancellationToken,
    running: Vec<JoinHandle<()>>,
    /// While the socket is open: the buffer's changes, and when the state row is due.
    state: Option<(
        tokio::sync::watch::Receiver<()>,
        Option<tokio::time::Instant>,
    )>,
    /// A spell was held and the key given back (for the last word at shutdown).
    held: bool,
    released: bool,
}

impl Shell {
    fn new(core: Arc<Core>, feed: Arc<Feed>, timing: Timing) -> Shell {
        Shell {
            counts: LeaseMetrics::register(core.ctx.metrics()),
            shutdown: core.ctx.shutdown().clone(),
            shutdown_fed: false,
            queued: VecDeque::new(),
            answer: None,
            closing: None,
            watch: None,
            superseded: feed.superseded.subscribe(),
            failing: feed.failing_since.subscribe(),
            stop: CancellationToken::new(),
            running: Vec::new(),
            state: None,
            held: false,
            released: false,
            core,
            feed,
            timing,
        }
    }

    /// The next input: an answer, a change of the key, a refused or failing publish,
    /// shutdown, or the machine's `deadline` passed. Writes the state row on the way.
    async fn next(&mut self, deadline: Option<Instant>) -> Input {
        if let Some(i) = self.queued.pop_front() {
            return i;
        }
        let deadline = deadline.map(tokio::time::Instant::from_std);
        let Shell {
            core,
            feed,
            timing,
            shutdown,
            shutdown_fed,
            answer,
            closing,
            watch,
            superseded,
            failing,
            state,
            ..
        } = self;
        loop {
            let state_due = state.as_ref().and_then(|(_, at)| *at);
            let changes_open = state.as_ref().is_some_and(|(_, at)| at.is_none());
            tokio::select! {
                // Shutdown and the machine's deadlines before anything else.
                biased;
                _ = shutdown.cancelled(), if !*shutdown_fed => {
                    *shutdown_fed = true;
                    return Input::Shutdown;
                }
                _ = tokio::time::sleep_until(deadline.unwrap_or_else(tokio::time::Instant::now)), if deadline.is_some() => {
                    return Input::Tick;
                }
                i = async { closing.as_mut().expect("guarded").await }, if closing.is_some() => {
                    *closing = None;
                    return i;
                }
                i = async { answer.as_mut().expect("guarded").await }, if answer.is_some() => {
                    *answer = None;
                    return i;
                }
                e = async { watch.as_mut().expect("guarded").next().await }, if watch.is_some() => {
                    return match e {
                        Some(Ok(entry)) => Input::Key(Some(key_of(&entry))),
                        Some(Err(e)) => {
                            *watch = None;
                            Input::KeyFailed(e.to_string())
                        }
                        None => {
                            *watch = None;
                            Input::KeyFailed("the watch of the lease ended".into())
                        }
                    };
                }
                Ok(()) = superseded.changed() => return Input::Superseded,
                Ok(()) = failing.changed() => {
                    return Input::Publishing(*failing.borrow_and_update());
                }
                Ok(()) = async { state.as_mut().expect("guarded").0.changed().await }, if changes_open => {
                    // The window gathers a backfill's inserts and its new `live_through`
                    // into one write.
                    let window = FLUSH_WINDOW.min(timing.heartbeat);
                    if let Some((_, at)) = state.as_mut() {
                        *at = Some(tokio::time::Instant::now() + window);
                    }
                }
                _ = tokio::time::sleep_until(state_due.unwrap_or_else(tokio::time::Instant::now)), if state_due.is_some() => {
                    if let Some((changes, at)) = state.as_mut() {
                        *at = None;
                        changes.borrow_and_update();
                    }
                    // Where the backfill may start from, for whoever holds next.
                    let (shared, changed) = core.buffer.take_shared();
                    if changed {
                        let _ = tokio::time::timeout(RELEASE_STEP, write_state(feed, shared)).await;
                    }
                }
            }
        }
    }

    fn answer(&mut self, f: impl Future<Output = Input> + Send + 'static) {
        self.answer = Some(Box::pin(f));
    }

    async fn act(&mut self, a: Action) {
        let feed = self.feed.clone();
        let core = self.core.clone();
        // A write of the key answers in milliseconds; one that has not in a third of a
        // heartbeat is tried again (the machine decides when).
        let step = self.timing.heartbeat / 3;
        match a {
            Action::Read => self.answer(async move {
                match tokio::time::timeout(step, feed.kv.entry(&feed.lease_key)).await {
                    Ok(Ok(e)) => Input::Key(e.as_ref().map(key_of)),
                    Ok(Err(e)) => {
                        tracing::debug!(error = %e, "cannot read the slack lease; retrying");
                        // NATS lost the bucket: made again, and read again at the next try.
                        let _ = tokio::time::timeout(step, feed.remake_bucket()).await;
                        Input::KeyFailed(e.to_string())
                    }
                    Err(_) => Input::KeyFailed("no answer in time".into()),
                }
            }),
            // With its history: the key as it is now comes first, so no change between the
            // read and the watch is missed.
            Action::Watch => match feed.kv.watch_with_history(&feed.lease_key).await {
                Ok(w) => self.watch = Some(w),
                Err(e) => {
                    tracing::debug!(error = %e, "cannot watch the slack lease; retrying");
                    self.queued.push_back(Input::KeyFailed(e.to_string()));
                }
            },
            Action::Unwatch => self.watch = None,
            Action::Create { beat } => self.answer(async move {
                let r = tokio::time::timeout(
                    step,
                    feed.kv
                        .create(&feed.lease_key, feed.lease_value(beat).into()),
                )
                .await;
                Input::Written(match r {
                    Ok(Ok(rev)) => Ok(rev),
                    Ok(Err(e)) if e.kind() == kv::CreateErrorKind::AlreadyExists => {
                        Err(WriteError::Conflict)
                    }
                    Ok(Err(e)) => Err(WriteError::Failed(e.to_string())),
                    Err(_) => Err(WriteError::Failed("no answer in time".into())),
                })
            }),
            Action::Update { revision, beat } => self.answer(async move {
                let r = tokio::time::timeout(
                    step,
                    feed.kv
                        .update(&feed.lease_key, feed.lease_value(beat).into(), revision),
                )
                .await;
                Input::Written(match r {
                    Ok(Ok(rev)) => Ok(rev),
                    Ok(Err(e)) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => {
                        Err(WriteError::Conflict)
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, "cannot write the slack lease");
                        let _ = tokio::time::timeout(step, feed.remake_bucket()).await;
                        Err(WriteError::Failed(e.to_string()))
                    }
                    Err(_) => {
                        tracing::warn!("cannot write the slack lease: no answer in time");
                        Err(WriteError::Failed("no answer in time".into()))
                    }
                })
            }),
            Action::CatchUp => {
                // The key is this process's: a new spell starts clean. Ids left
                // unacknowledged, a refusal or failures of an earlier spell mean nothing in
                // this one, and anything ingested outside a spell (a reader that outlived
                // its socket's close) is not published under stale seqs: the backfill reads
                // it again.
                feed.unacked.locked().clear();
                self.superseded.borrow_and_update();
                let stranded = core.buffer.take_unwritten();
                core.buffer.forget(&stranded);
                self.answer(async move {
                    Input::CaughtUp(
                        tokio::time::timeout(CATCH_UP_TIMEOUT, caught_up(&feed))
                            .await
                            .unwrap_or_else(|_| Err("not in time".into())),
                    )
                });
            }
            Action::Fence { last } => self.answer(async move {
                // A message that says the stream's last sequence is `last`: it fails if
                // another process wrote since; once it is in, a publish of a previous holder
                // (which expects an older sequence) is refused.
                let marker = jetstream::message::PublishMessage::build()
                    .header(MARKER_HEADER, feed.me.as_str())
                    .expected_last_sequence(last);
                let r = tokio::time::timeout(PUBLISH_TIMEOUT, async {
                    feed.js
                        .send_publish(feed.subject.clone(), marker)
                        .await?
                        .await
                })
                .await;
                Input::Fenced(match r {
                    Ok(Ok(ack)) => Ok(ack.sequence),
                    Ok(Err(e)) => Err(e.to_string()),
                    Err(_) => Err("not in time".into()),
                })
            }),
            Action::Writer(w) => {
                if self.shutdown_fed {
                    // Within the process's drain time: a publish stuck on NATS does not hold
                    // the release up.
                    if let Ok(mut g) =
                        tokio::time::timeout(RELEASE_STEP / 2, feed.writer.lock()).await
                    {
                        *g = w;
                    }
                } else {
                    // A spell lost waits for the publish in flight: nothing is written after.
                    *feed.writer.lock().await = w;
                }
                if w.is_some() {
                    failing(&feed, false);
                }
            }
            Action::OpenSocket { previous_seen } => self.open(previous_seen).await,
            Action::CloseSocket => {
                // The socket closes (and its reader ends) before anything else happens.
                self.stop.cancel();
                self.state = None;
                self.counts.held.set(0);
                let running = std::mem::take(&mut self.running);
                self.closing = Some(Box::pin(async move {
                    let mut running = running;
                    let clean = tokio::time::timeout(RELEASE_STEP * 3, async {
                        for r in &mut running {
                            let _ = r.await;
                        }
                    })
                    .await
                    .is_ok();
                    if !clean {
                        for r in &running {
                            r.abort();
                        }
                    }
                    Input::SocketClosed { clean }
                }));
            }
            Action::PublishPending => {
                // A row cut off mid-publish stays counted as in flight, so the state written
                // at the end does not pass it.
                let _ = tokio::time::timeout(RELEASE_STEP, publish_pending(&core, &feed)).await;
            }
            Action::ForgetUnpublished => {
                let unpublished = core.buffer.take_unwritten();
                core.buffer.forget(&unpublished);
            }
            Action::Release { revision } => {
                self.released = matches!(
                    tokio::time::timeout(
                        RELEASE_STEP,
                        feed.kv
                            .delete_expect_revision(&feed.lease_key, Some(revision)),
                    )
                    .await,
                    Ok(Ok(()))
                );
            }
            Action::TakeOver { from, stale } => {
                if stale {
                    tracing::warn!(holder = %from, stale_s = self.timing.stale.as_secs_f64(), "the slack lease's holder is silent: taking the socket over");
                } else {
                    tracing::info!(holder = %from, "the slack lease's holder was a process of this host that is gone: taking it");
                }
            }
            Action::Holder(h) => {
                if let Some(h) = &h
                    && *h != feed.me
                {
                    tracing::info!(holder = %h, "another process holds the slack socket lease: standing by");
                }
                lease_status(&core, |l| l.holder = h);
            }
            Action::Lost(why) => {
                self.held = false;
                self.counts.lost.inc();
                tracing::warn!(reason = %why, "lost the slack socket lease: socket closed; what was not published is left to the next holder's backfill");
                lease_status(&core, |l| {
                    l.held = false;
                    l.lost += 1;
                });
                let mut s = core.status();
                s.last_socket_error = Some(format!("lease lost: {why}"));
                s.state = SocketState::Standby;
            }
            Action::Done => {}
        }
    }

    /// The spell begins: the shared state row is read (or made), the socket and the backfill
    /// start.
    async fn open(&mut self, previous_seen: Option<Instant>) {
        // Counted as held from here: what closes the spell closes its socket too.
        let (core, feed) = (self.core.clone(), self.feed.clone());
        tracing::info!(holder = %feed.me, "this process holds the slack socket lease");
        self.counts.held.set(1);
        self.counts.acquired.inc();
        self.held = true;
        self.released = false;
        lease_status(&core, |l| {
            l.held = true;
            l.holder = Some(feed.me.clone());
            l.acquired_at = Some(at(now_ms()));
            l.takeovers += 1;
        });
        if let Some(seen) = previous_seen
            && core.buffer.live_through().is_none()
        {
            // The previous holder's state never reached the bucket: it was live (and
            // publishing) until it was last seen renewing, so the backfill reads from there.
            // (No start is known: the retention is the only floor.)
            let ago = u64::try_from(seen.elapsed().as_millis()).unwrap_or(u64::MAX);
            core.buffer.merge_shared(SharedState {
                first_seq: 0,
                born_ms: Some(0),
                live_through_ms: Some(now_ms().saturating_sub(ago)),
            });
        }
        let (mut shared, _) = core.buffer.take_shared();
        let row = match tokio::time::timeout(RELEASE_STEP * 5, feed.kv.get(&feed.state_key)).await {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(_) => Err("no answer in time".to_owned()),
        };
        match row {
            Ok(Some(v)) => {
                if let Ok(s) = serde_json::from_slice::<SharedState>(&v) {
                    core.buffer.merge_shared(s);
                }
                shared = core.buffer.take_shared().0;
                let _ = tokio::time::timeout(RELEASE_STEP, write_state(&feed, shared)).await;
            }
            Ok(None) => {
                // No state yet: the feed begins where this process's buffer began (now, for a
                // new one), so a cursor from before it learns `truncated`. A bucket NATS lost
                // and made again keeps its feed's start: only the readers who missed events
                // lost with the stream are told (`follow`). Made only if absent (and taken in
                // only once made), so a feed's start never moves.
                if shared.first_seq == 0 {
                    shared.first_seq = core.buffer.head().max(now_us());
                }
                let bytes = serde_json::to_vec(&shared).expect("the state serializes");
                let step = RELEASE_STEP * 5;
                match tokio::time::timeout(step, feed.kv.create(&feed.state_key, bytes.into()))
                    .await
                {
                    Ok(Ok(_)) => core.buffer.merge_shared(shared),
                    _ => {
                        if let Ok(Ok(Some(v))) =
                            tokio::time::timeout(step, feed.kv.get(&feed.state_key)).await
                            && let Ok(s) = serde_json::from_slice::<SharedState>(&v)
                        {
                            core.buffer.merge_shared(s);
                        }
                    }
                }
            }
            Err(e) => {
                self.queued.push_back(Input::Broken(format!(
                    "cannot read the feed's shared state: {e}"
                )));
                return;
            }
        }
        self.stop = self.shutdown.child_token();
        self.running = vec![
            core.ctx.spawn(
                "slack socket mode",
                socket::run(core.clone(), self.stop.clone()),
            ),
            core.ctx.spawn(
                "slack backfill",
                backfill::run(core.clone(), self.stop.clone()),
            ),
        ];
        // Due at once: what changed before this spell's first write is not left out.
        self.state = Some((core.buffer.changes(), Some(tokio::time::Instant::now())));
    }

    /// The machine stopped (shutdown): the last word on the key, and the state row.
    async fn done(&mut self) {
        self.watch = None;
        if !self.held {
            return;
        }
        if self.released {
            tracing::info!("slack socket lease released");
        } else {
            tracing::warn!(
                "could not release the slack socket lease; another process takes it once it is stale"
            );
        }
        let shared = self.core.buffer.take_shared().0;
        let _ = tokio::time::timeout(RELEASE_STEP / 2, write_state(&self.feed, shared)).await;
        lease_status(&self.core, |l| l.held = false);
    }
}

/// The key as the machine sees it.
fn key_of(e: &kv::Entry) -> Key {
    // A value that is not a lease (another version's, one put by hand) is held by someone
    // all the same: taken only once it stands still for the stale time.
    let holder = (e.operation == kv::Operation::Put).then(|| {
        serde_json::from_slice::<LeaseValue>(&e.value)
            .map(|v| v.holder)
            .unwrap_or_else(|_| "(a lease value this version cannot read)".into())
    });
    Key {
        revision: e.revision,
        holder_gone: holder.as_deref().is_some_and(dead_here),
        holder,
    }
}

/// Applies everything published before now: new seqs stay above it. Returns the stream's
/// last sequence.
async fn caught_up(feed: &Feed) -> Result<u64, String> {
    let mut s = match feed.js.get_stream(&feed.stream).await {
        Ok(s) => s,
        // NATS lost it: made again (empty), and fenced from its start.
        Err(_) if feed.remake_stream().await => feed
            .js
            .get_stream(&feed.stream)
            .await
            .map_err(|e| e.to_string())?,
        Err(e) => return Err(e.to_string()),
    };
    let st = s.info().await.map_err(|e| e.to_string())?.state.clone();
    if st.messages > 0 {
        let mut rx = feed.applied.clone();
        let last = st.last_sequence;
        rx.wait_for(|&a| a >= last)
            .await
            .map_err(|e| e.to_string())?;
    }
    Ok(st.last_sequence)
}

/// Writes the shared state (the holder's), best effort: a lost write only widens the next
/// holder's backfill.
async fn write_state(feed: &Feed, s: SharedState) {
    let bytes = serde_json::to_vec(&s).expect("the state serializes");
    if let Err(e) = feed.kv.put(&feed.state_key, bytes.into()).await {
        tracing::debug!(error = %e, "cannot write the slack shared state");
    }
}
