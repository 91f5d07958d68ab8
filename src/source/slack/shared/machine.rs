//! The socket lease as a machine: [`Lease::handle`] takes the time and one [`Input`] (the
//! lease key as read or seen changing, the answer to a write, the stream caught up or fenced,
//! a publish refused, the socket closed, shutdown, a deadline passed) and returns the
//! [`Action`]s to take, in order. It does no I/O and reads no clock: `shared/lease.rs` is the
//! shell that runs the actions against NATS and the socket and feeds their answers back, and
//! `machine_tests.rs` runs several machines under simulated time against a fake bucket and
//! stream.
//!
//! The rules it keeps:
//! - The key is taken by create (absent) or compare-and-set on the revision seen (deleted; a
//!   gone holder of this host; this process's own; or unchanged for the stale time by this
//!   process's clock, counted from when this process first saw that revision).
//! - A taken key is held only once the stream is caught up, a fence is in and a renewal after
//!   it went through: the socket opens then, and the writer is set to the fence's sequence.
//! - A renewal counts from when it was *sent*: the holder steps down (socket closed, writer
//!   cleared) when its last renewal sent with success is two thirds of the stale time old,
//!   when publishing has failed that long, when a renewal finds another revision or when a
//!   publish finds another writer. So a standby, which waits the whole stale time from the
//!   last change it saw, never overlaps it while messages take less than a sixth of it.
//! - At shutdown the socket closes, what is left is published, the writer is cleared and the
//!   key deleted at its revision (only once the socket is known closed).

use std::time::{Duration, Instant};

use crate::runtime::backoff::Backoff;

/// The lease's two durations (the stale time is at least three heartbeats), and the pacing
/// of retries after a failed read or take, or a lost spell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    pub heartbeat: Duration,
    pub stale: Duration,
    pub retry: Backoff,
}

impl Timing {
    /// How long a holder keeps the socket past its last renewal sent with success.
    pub fn keep_for(&self) -> Duration {
        self.stale * 2 / 3
    }
}

/// The lease key as read or seen changing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Key {
    pub revision: u64,
    /// Who holds it; `None` when it was deleted (or holds no lease).
    pub holder: Option<String>,
    /// The holder was a process of this host that is gone (the shell asks `nats::holder`).
    pub holder_gone: bool,
}

/// Why a write of the key did not go through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteError {
    /// The key was at another revision (or existed, for a create).
    Conflict,
    /// NATS did not answer (in time) or refused for another reason.
    Failed(String),
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// The key as read, or as the watch saw it change: `None` when it never existed.
    Key(Option<Key>),
    /// A read of the key, or its watch, failed.
    KeyFailed(String),
    /// The answer to [`Action::Create`] or [`Action::Update`]: the new revision.
    Written(Result<u64, WriteError>),
    /// The answer to [`Action::CatchUp`]: the stream's last sequence, applied.
    CaughtUp(Result<u64, String>),
    /// The answer to [`Action::Fence`]: the fence's sequence.
    Fenced(Result<u64, String>),
    /// A publish found another process's message in the stream.
    Superseded,
    /// Publishing has failed since then (`None`: it works again).
    Publishing(Option<Instant>),
    /// The spell cannot go on (its shared state unreadable, say).
    Broken(String),
    /// The answer to [`Action::CloseSocket`]: `clean` when everything stopped in time.
    SocketClosed {
        clean: bool,
    },
    Shutdown,
    /// Time passed: the shell wakes at [`Lease::deadline`].
    Tick,
}

/// What to do, in order. Of the actions that are answered, at most one is outstanding: a
/// newer one replaces it (its answer, if it comes, is not fed in).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Read the key (answer: [`Input::Key`] or [`Input::KeyFailed`]).
    Read,
    /// Feed every change of the key as [`Input::Key`] until [`Action::Unwatch`].
    Watch,
    Unwatch,
    /// Create the key with this process's value (answer: [`Input::Written`]).
    Create {
        beat: u64,
    },
    /// Compare-and-set the key at `revision` (answer: [`Input::Written`]).
    Update {
        revision: u64,
        beat: u64,
    },
    /// Apply the stream through its last sequence (answer: [`Input::CaughtUp`]).
    CatchUp,
    /// Publish the fence expecting `last` as the stream's last sequence (answer:
    /// [`Input::Fenced`]).
    Fence {
        last: u64,
    },
    /// Publish expecting this last sequence from now on; `None`: publish nothing more.
    Writer(Option<u64>),
    /// The spell begins: open the socket and the backfill.
    OpenSocket {
        previous_seen: Option<Instant>,
    },
    /// Close the socket and the backfill (answer: [`Input::SocketClosed`]).
    CloseSocket,
    /// Publish what is left (a clean stop, before the writer is cleared).
    PublishPending,
    /// Forget what was not published: the next holder's backfill reads it from Slack.
    ForgetUnpublished,
    /// Delete the key if it is still at `revision` (no answer awaited).
    Release {
        revision: u64,
    },
    /// For the log: the key is taken from `from`, which is silent (`stale`) or was a
    /// process of this host that is gone.
    TakeOver {
        from: String,
        stale: bool,
    },
    /// For the status and the log: who holds the key, as far as this process knows.
    Holder(Option<String>),
    /// For the status and the log: the lease is lost, and why.
    Lost(String),
    /// Nothing more: the machine has stopped.
    Done,
}

/// The lease held, the socket open.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Held {
    revision: u64,
    beat: u64,
    /// When the last renewal that went through was sent.
    last_ok: Instant,
    renew_at: Instant,
    /// When the outstanding renewal was sent.
    in_flight: Option<Instant>,
    /// A renewal met another revision: the key is read to see whether it is this process's
    /// own renewal whose answer was lost.
    checking: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    /// A read of the key is outstanding.
    Reading,
    /// Another process holds the key at `revision`, unchanged since `since` (this clock).
    Watching {
        revision: u64,
        since: Instant,
    },
    /// A create or compare-and-set to take the key is outstanding.
    Taking,
    /// Waiting before reading the key again.
    Resting {
        until: Instant,
    },
    /// The key is this process's at `revision`; the stream is being applied.
    CatchingUp {
        revision: u64,
    },
    Fencing {
        revision: u64,
    },
    /// The renewal after the fence, sent at `sent`.
    Confirming {
        revision: u64,
        expected: u64,
        sent: Instant,
    },
    Holding(Held),
    /// The spell is ending; `why` is `None` at shutdown. It ends once the socket is closed
    /// (`closed`: whether cleanly) and the write of the key that was outstanding (`writing`)
    /// has answered: the key is then released at the revision that write made, if it
    /// landed, so a stop never leaves the key naming a process that is gone.
    Closing {
        revision: Option<u64>,
        why: Option<String>,
        writing: bool,
        closed: Option<bool>,
    },
    Done,
}

/// One process's side of the lease.
#[derive(Debug, Clone)]
pub struct Lease {
    me: String,
    timing: Timing,
    phase: Phase,
    backoff: Backoff,
    /// When another holder was last seen (for the backfill's start, when the previous
    /// holder's state never reached the bucket).
    other_seen: Option<Instant>,
    /// The holder last reported.
    reported: Option<Option<String>>,
    /// Since when publishing fails, while holding.
    failing_since: Option<Instant>,
    /// When the current spell took the key.
    began: Option<Instant>,
}

impl Lease {
    /// A machine for the process named `me`; [`Lease::start`] gives its first actions.
    pub fn new(me: impl Into<String>, timing: Timing) -> Lease {
        Lease {
            me: me.into(),
            timing,
            phase: Phase::Reading,
            backoff: timing.retry,
            other_seen: None,
            reported: None,
            failing_since: None,
            began: None,
        }
    }

    pub fn start(&mut self) -> Vec<Action> {
        self.phase = Phase::Reading;
        vec![Action::Read]
    }

    /// This process holds the lease (its socket may be open).
    #[cfg(test)]
    pub fn holding(&self) -> bool {
        matches!(self.phase, Phase::Holding(_))
    }

    /// When [`Input::Tick`] is due next, if ever.
    pub fn deadline(&self) -> Option<Instant> {
        let keep = self.timing.keep_for();
        match &self.phase {
            Phase::Watching { since, .. } => Some(*since + self.timing.stale),
            Phase::Resting { until } => Some(*until),
            Phase::Confirming { sent, .. } => Some(*sent + keep),
            Phase::Holding(h) => {
                let mut d = h.last_ok + keep;
                if h.in_flight.is_none() && !h.checking {
                    d = d.min(h.renew_at);
                }
                if let Some(f) = self.failing_since {
                    d = d.min(f + keep);
                }
                Some(d)
            }
            _ => None,
        }
    }

    /// Takes one input at `now`; returns what to do, in order.
    pub fn handle(&mut self, now: Instant, input: Input) -> Vec<Action> {
        if input == Input::Shutdown {
            return self.shutdown();
        }
        match (self.phase.clone(), input) {
            (Phase::Reading, Input::Key(k)) => self.decide(now, k),
            (Phase::Watching { revision, since }, Input::Key(k)) => {
                match &k {
                    // Held still, by the same revision: the stale time runs on.
                    Some(k) if k.holder.is_some() && !k.holder_gone && k.revision == revision => {
                        self.phase = Phase::Watching { revision, since };
                        Vec::new()
                    }
                    _ => {
                        let mut a = self.decide(now, k);
                        if !matches!(self.phase, Phase::Watching { .. }) {
                            a.insert(0, Action::Unwatch);
                        }
                        a
                    }
                }
            }
            (Phase::Reading, Input::KeyFailed(_)) => self.rest(now, Vec::new()),
            (Phase::Watching { .. }, Input::KeyFailed(_)) => self.rest(now, vec![Action::Unwatch]),
            (Phase::Watching { revision, since }, Input::Tick)
                if now >= since + self.timing.stale =>
            {
                // Silent for the stale time by this clock: taken over.
                self.phase = Phase::Taking;
                let from = self.reported.clone().flatten().unwrap_or_default();
                vec![
                    Action::Unwatch,
                    Action::TakeOver { from, stale: true },
                    Action::Update { revision, beat: 0 },
                ]
            }
            (Phase::Resting { until }, Input::Tick) if now >= until => {
                self.phase = Phase::Reading;
                vec![Action::Read]
            }
            (Phase::Taking, Input::Written(Ok(revision))) => {
                self.began = Some(now);
                self.failing_since = None;
                self.phase = Phase::CatchingUp { revision };
                vec![Action::CatchUp]
            }
            (Phase::Taking, Input::Written(Err(_))) => self.rest(now, Vec::new()),
            (Phase::CatchingUp { revision }, Input::CaughtUp(r)) => match r {
                Ok(last) => {
                    self.phase = Phase::Fencing { revision };
                    vec![Action::Fence { last }]
                }
                Err(e) => self.lose(
                    revision,
                    format!("cannot catch up with the stream: {e}"),
                    false,
                ),
            },
            (Phase::Fencing { revision }, Input::Fenced(r)) => match r {
                Ok(expected) => {
                    self.phase = Phase::Confirming {
                        revision,
                        expected,
                        sent: now,
                    };
                    vec![Action::Update { revision, beat: 0 }]
                }
                Err(e) => self.lose(revision, format!("cannot fence the stream: {e}"), false),
            },
            (
                Phase::Confirming {
                    revision,
                    expected,
                    sent,
                },
                i,
            ) => match i {
                // Renewed, but too late to open the socket safely.
                Input::Written(Ok(r)) if now >= sent + self.timing.keep_for() => self.lose(
                    r,
                    "the lease could not be renewed after catching up".into(),
                    false,
                ),
                Input::Written(Ok(r)) => {
                    self.backoff.reset();
                    self.phase = Phase::Holding(Held {
                        revision: r,
                        beat: 0,
                        last_ok: sent,
                        renew_at: sent + self.timing.heartbeat,
                        in_flight: None,
                        checking: false,
                    });
                    let mut a = self.report(Some(self.me.clone()));
                    a.push(Action::Writer(Some(expected)));
                    a.push(Action::OpenSocket {
                        previous_seen: self.other_seen,
                    });
                    a
                }
                Input::Written(Err(_)) => self.lose(
                    revision,
                    "the lease could not be renewed after catching up".into(),
                    false,
                ),
                Input::Tick if now >= sent + self.timing.keep_for() => self.lose(
                    revision,
                    "the lease could not be renewed after catching up".into(),
                    true,
                ),
                Input::Superseded => self.superseded(),
                _ => Vec::new(),
            },
            (Phase::Holding(h), i) => self.hold(now, h, i),
            (
                Phase::Closing {
                    revision,
                    why,
                    writing,
                    closed,
                },
                i,
            ) => {
                let (revision, writing, closed) = match i {
                    Input::SocketClosed { clean } => (revision, writing, Some(clean)),
                    Input::Written(Ok(r)) if writing => (Some(r), false, closed),
                    // Someone else's now: nothing to give back.
                    Input::Written(Err(WriteError::Conflict)) if writing => (None, false, closed),
                    Input::Written(Err(WriteError::Failed(_))) if writing => {
                        (revision, false, closed)
                    }
                    _ => return Vec::new(),
                };
                match closed {
                    Some(clean) if !writing => self.closed(now, revision, why, clean),
                    _ => {
                        self.phase = Phase::Closing {
                            revision,
                            why,
                            writing,
                            closed,
                        };
                        Vec::new()
                    }
                }
            }
            // Answers no longer awaited, and ticks before their time.
            _ => Vec::new(),
        }
    }

    /// What the key says, read or changed, in a standby phase.
    fn decide(&mut self, now: Instant, k: Option<Key>) -> Vec<Action> {
        let holder = k.as_ref().and_then(|k| k.holder.clone());
        let mut a = self.report(holder.clone());
        let Some(k) = k else {
            self.phase = Phase::Taking;
            a.push(Action::Create { beat: 0 });
            return a;
        };
        match &holder {
            None => {
                self.phase = Phase::Taking;
                a.push(Action::Update {
                    revision: k.revision,
                    beat: 0,
                });
            }
            Some(h) if *h == self.me || k.holder_gone => {
                self.phase = Phase::Taking;
                if *h != self.me {
                    a.push(Action::TakeOver {
                        from: h.clone(),
                        stale: false,
                    });
                }
                a.push(Action::Update {
                    revision: k.revision,
                    beat: 0,
                });
            }
            Some(_) => {
                self.other_seen = Some(now);
                let since = match self.phase {
                    Phase::Watching { revision, since } if revision == k.revision => since,
                    _ => now,
                };
                if !matches!(self.phase, Phase::Watching { .. }) {
                    a.push(Action::Watch);
                }
                self.phase = Phase::Watching {
                    revision: k.revision,
                    since,
                };
            }
        }
        a
    }

    fn hold(&mut self, now: Instant, mut h: Held, i: Input) -> Vec<Action> {
        match (i, h.in_flight) {
            (Input::Written(Ok(r)), Some(sent)) => {
                h.revision = r;
                h.last_ok = sent;
                h.in_flight = None;
            }
            (Input::Written(Err(WriteError::Conflict)), Some(_)) => {
                h.in_flight = None;
                h.checking = true;
                self.phase = Phase::Holding(h);
                return vec![Action::Read];
            }
            (Input::Written(Err(WriteError::Failed(_))), Some(_)) => {
                // Tried again soon (a sixth of a heartbeat), so a lost answer or a NATS
                // hiccup costs several tries, not the lease.
                h.in_flight = None;
                h.renew_at = h.renew_at.min(now + self.timing.heartbeat / 6);
            }
            (Input::Key(k), None) if h.checking => match k {
                // This process's own renewal, whose answer was lost: held still, counted
                // from the last renewal known to have gone through, and renewed at once on
                // the revision found.
                Some(k) if k.holder.as_deref() == Some(self.me.as_str()) => {
                    h.revision = k.revision;
                    h.renew_at = now;
                    h.checking = false;
                }
                _ => return self.lose(h.revision, "another process took the lease".into(), false),
            },
            (Input::KeyFailed(_), None) if h.checking => h.checking = false,
            (Input::Superseded, _) => return self.superseded(),
            (Input::Broken(why), _) => return self.lose(h.revision, why, h.in_flight.is_some()),
            (Input::Publishing(since), _) => self.failing_since = since,
            (Input::Tick, _) => {}
            // An answer no longer awaited.
            _ => return Vec::new(),
        }
        self.phase = Phase::Holding(h);
        self.check(now)
    }

    fn superseded(&mut self) -> Vec<Action> {
        let why = "another process wrote to the stream".to_owned();
        match &self.phase {
            Phase::Holding(h) => self.lose(h.revision, why, h.in_flight.is_some()),
            Phase::Confirming { revision, .. } => self.lose(*revision, why, true),
            _ => Vec::new(),
        }
    }

    /// The holder's deadlines at `now`: step down, or renew.
    fn check(&mut self, now: Instant) -> Vec<Action> {
        let Phase::Holding(mut h) = self.phase.clone() else {
            return Vec::new();
        };
        let keep = self.timing.keep_for();
        let writing = h.in_flight.is_some();
        if now >= h.last_ok + keep {
            return self.lose(
                h.revision,
                "the lease could not be renewed for 2/3 of the stale time".into(),
                writing,
            );
        }
        if self.failing_since.is_some_and(|f| now >= f + keep) {
            return self.lose(
                h.revision,
                "publishing to the stream failed for 2/3 of the stale time".into(),
                writing,
            );
        }
        if !writing && !h.checking && now >= h.renew_at {
            h.beat += 1;
            h.renew_at = now + self.timing.heartbeat;
            h.in_flight = Some(now);
            let a = vec![Action::Update {
                revision: h.revision,
                beat: h.beat,
            }];
            self.phase = Phase::Holding(h);
            return a;
        }
        Vec::new()
    }

    /// The spell ends: writing stops, the socket closes; `writing` when a write of the key
    /// is outstanding (its answer is awaited before the key is given back).
    fn lose(&mut self, revision: u64, why: String, writing: bool) -> Vec<Action> {
        self.phase = Phase::Closing {
            revision: Some(revision),
            why: Some(why),
            writing,
            closed: None,
        };
        vec![Action::CloseSocket, Action::Writer(None)]
    }

    fn shutdown(&mut self) -> Vec<Action> {
        let closing = |revision, writing| Phase::Closing {
            revision,
            why: None,
            writing,
            closed: None,
        };
        match self.phase.clone() {
            Phase::CatchingUp { revision } | Phase::Fencing { revision } => {
                self.phase = closing(Some(revision), false);
                vec![Action::CloseSocket]
            }
            Phase::Confirming { revision, .. } => {
                self.phase = closing(Some(revision), true);
                vec![Action::CloseSocket]
            }
            Phase::Holding(h) => {
                self.phase = closing(Some(h.revision), h.in_flight.is_some());
                vec![Action::CloseSocket]
            }
            // A take in flight: if it lands, the key is given back at once.
            Phase::Taking => {
                self.phase = Phase::Closing {
                    revision: None,
                    why: None,
                    writing: true,
                    closed: Some(true),
                };
                Vec::new()
            }
            // Already closing: it ends as a shutdown.
            Phase::Closing {
                revision,
                writing,
                closed,
                ..
            } => {
                self.phase = Phase::Closing {
                    revision,
                    why: None,
                    writing,
                    closed,
                };
                Vec::new()
            }
            Phase::Watching { .. } => {
                self.phase = Phase::Done;
                vec![Action::Unwatch, Action::Done]
            }
            Phase::Done => Vec::new(),
            _ => {
                self.phase = Phase::Done;
                vec![Action::Done]
            }
        }
    }

    fn closed(
        &mut self,
        now: Instant,
        revision: Option<u64>,
        why: Option<String>,
        clean: bool,
    ) -> Vec<Action> {
        let release = revision
            .filter(|_| clean)
            .map(|revision| Action::Release { revision });
        match why {
            None => {
                self.phase = Phase::Done;
                let mut a = vec![Action::PublishPending, Action::Writer(None)];
                a.extend(release);
                a.push(Action::Done);
                a
            }
            Some(why) => {
                let mut a = vec![Action::ForgetUnpublished];
                a.extend(release);
                a.push(Action::Lost(why));
                // A spell that ended at once is not tried again in a tight loop.
                if self
                    .began
                    .is_some_and(|b| now.saturating_duration_since(b) > self.timing.stale)
                {
                    self.backoff.reset();
                }
                self.began = None;
                self.failing_since = None;
                self.reported = None;
                self.rest(now, a)
            }
        }
    }

    fn rest(&mut self, now: Instant, a: Vec<Action>) -> Vec<Action> {
        self.phase = Phase::Resting {
            until: now + self.backoff.next_delay(),
        };
        a
    }

    /// [`Action::Holder`] when the holder differs from the one last reported.
    fn report(&mut self, holder: Option<String>) -> Vec<Action> {
        if self.reported.as_ref() == Some(&holder) {
            return Vec::new();
        }
        self.reported = Some(holder.clone());
        vec![Action::Holder(holder)]
    }
}

#[cfg(test)]
#[path = "machine_tests.rs"]
mod tests;
