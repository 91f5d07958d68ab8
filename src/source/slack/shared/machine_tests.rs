//! The lease machine under simulated time: several processes, each a [`Lease`], against a
//! fake bucket (revisions, create, compare-and-set, delete, watches) and a fake stream (a
//! publish names the last sequence it expects), with random message delays, lost answers,
//! partitions, kills, clean stops and newcomers, while Slack emits events to whichever
//! socket is open. Checked on every schedule:
//! - never two sockets open at once;
//! - every event in the stream was written by the holder that fenced last before it;
//! - every event Slack emitted is in the stream exactly once, once the run settles;
//! - a killed holder is taken over within the stale time plus the time to take, catch up
//!   and fence; a stopped one at once.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::*;

const HEARTBEAT: u64 = 300;
const STALE: u64 = 900;
/// Each way; a sixth of the stale time is the protocol's margin.
const MAX_DELAY: u64 = 40;
/// How long the shell waits for an answer.
const TIMEOUT: u64 = HEARTBEAT / 3;
/// How long closing a socket may take (the shell's bound, scaled).
const MAX_CLOSE: u64 = 30;

fn timing() -> Timing {
    Timing {
        heartbeat: Duration::from_millis(HEARTBEAT),
        stale: Duration::from_millis(STALE),
        retry: Backoff::new(Duration::from_millis(5), Duration::from_millis(300)),
    }
}

/// xorshift64*: enough randomness for schedules, reproducible from a seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
    fn delay(&mut self) -> u64 {
        1 + self.below(MAX_DELAY)
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Entry {
    Fence(usize),
    Event(usize, u64),
}

#[derive(Debug)]
enum Ev {
    /// An answer to process `pid`'s outstanding action `token`.
    Answer {
        pid: usize,
        token: u64,
        input: Input,
    },
    /// A change of the key, to a watcher.
    Watched {
        pid: usize,
        key: Option<Key>,
    },
    /// Any other input (ticks, publishing news, socket closed).
    Input {
        pid: usize,
        input: Input,
    },
    /// A write reaching the bucket or stream, then answered.
    Exec {
        pid: usize,
        token: u64,
        op: Op,
    },
    /// A publish of an event reaching the stream.
    Publish {
        pid: usize,
        id: u64,
        expected: u64,
    },
    /// The answer to that publish: its sequence, or refused (another writer's message is
    /// last), or no answer at all (cut off).
    Published {
        pid: usize,
        id: u64,
        seq: Result<u64, Refusal>,
    },
    /// The publisher tries again after a failure.
    Retry(usize),
    Slack(u64),
    Kill(usize),
    Stop(usize),
    Join,
}

#[derive(Debug, Clone, Copy)]
enum Refusal {
    WrongLast,
    CutOff,
}

#[derive(Debug, Clone)]
enum Op {
    Read,
    Create,
    Update(u64),
    CatchUp,
    Fence(u64),
}

struct Proc {
    m: Lease,
    alive: bool,
    socket: bool,
    writer: Option<u64>,
    unpublished: Vec<u64>,
    publishing: bool,
    /// Since when publishing fails.
    failing: Option<Instant>,
    watching: bool,
    /// The outstanding answered action.
    token: u64,
    partitioned_until: u64,
}

struct World {
    rng: Rng,
    t0: Instant,
    now: u64,
    queue: BinaryHeap<Reverse<(u64, u64, usize)>>,
    evs: Vec<Option<Ev>>,
    /// The key: (revision, holder) or deleted at a revision, or never made.
    key: Option<(u64, Option<usize>)>,
    revision: u64,
    stream: Vec<Entry>,
    slack: Vec<u64>,
    procs: Vec<Proc>,
    next_token: u64,
    /// Percent of answers lost; percent of actions that meet a partition.
    lose: u64,
    /// Each takeover: (holder gone at, socket opened elsewhere at).
    gone_at: Option<u64>,
    takeovers: Vec<u64>,
}

impl World {
    fn new(seed: u64, procs: usize, lose: u64) -> World {
        let mut w = World {
            rng: Rng(seed | 1),
            t0: Instant::now(),
            now: 0,
            queue: BinaryHeap::new(),
            evs: Vec::new(),
            key: None,
            revision: 0,
            stream: Vec::new(),
            slack: Vec::new(),
            procs: Vec::new(),
            next_token: 0,
            lose,
            gone_at: None,
            takeovers: Vec::new(),
        };
        for _ in 0..procs {
            w.join();
        }
        w
    }

    fn at(&mut self, ms: u64, ev: Ev) {
        let i = self.evs.len();
        self.evs.push(Some(ev));
        self.queue.push(Reverse((ms, i as u64, i)));
    }

    fn instant(&self) -> Instant {
        self.t0 + Duration::from_millis(self.now)
    }

    fn key_for(&self, pid: usize) -> Option<Key> {
        self.key
            .map(|(revision, holder)| Key {
                revision,
                holder: holder.map(|h| format!("p{h}")),
                holder_gone: false,
            })
            .map(|mut k| {
                // A holder of "this host" that was killed is known gone at once.
                if let Some((_, Some(h))) = self.key {
                    k.holder_gone = h != pid && !self.procs[h].alive && h % 2 == pid % 2;
                }
                k
            })
    }

    fn join(&mut self) {
        let pid = self.procs.len();
        self.procs.push(Proc {
            m: Lease::new(format!("p{pid}"), timing()),
            alive: true,
            socket: false,
            writer: None,
            unpublished: Vec::new(),
            publishing: false,
            failing: None,
            watching: false,
            token: 0,
            partitioned_until: 0,
        });
        let a = self.procs[pid].m.start();
        self.run(pid, a);
    }

    fn cut_off(&mut self, pid: usize) -> bool {
        self.now < self.procs[pid].partitioned_until || self.rng.chance(self.lose)
    }

    /// Sends an answered action: it reaches NATS after a delay (or never, cut off), and its
    /// answer comes back after another (or a timeout of a heartbeat stands for it).
    fn send(&mut self, pid: usize, op: Op) {
        self.next_token += 1;
        let token = self.next_token;
        self.procs[pid].token = token;
        if self.cut_off(pid) {
            let input = match op {
                Op::Read => Input::KeyFailed("cut off".into()),
                Op::Create | Op::Update(_) => {
                    Input::Written(Err(WriteError::Failed("cut off".into())))
                }
                Op::CatchUp => Input::CaughtUp(Err("cut off".into())),
                Op::Fence(_) => Input::Fenced(Err("cut off".into())),
            };
            self.at(self.now + TIMEOUT, Ev::Answer { pid, token, input });
            return;
        }
        let t = self.now + self.rng.delay();
        self.at(t, Ev::Exec { pid, token, op });
    }

    fn exec(&mut self, pid: usize, token: u64, op: Op) {
        let input = match op {
            Op::Read => Input::Key(self.key_for(pid)),
            Op::Create => match self.key {
                None => Input::Written(Ok(self.write(Some(pid)))),
                Some(_) => Input::Written(Err(WriteError::Conflict)),
            },
            Op::Update(rev) => match self.key {
                Some((r, _)) if r == rev => Input::Written(Ok(self.write(Some(pid)))),
                _ => Input::Written(Err(WriteError::Conflict)),
            },
            Op::CatchUp => Input::CaughtUp(Ok(self.stream.len() as u64)),
            Op::Fence(last) => {
                if self.stream.len() as u64 == last {
                    self.stream.push(Entry::Fence(pid));
                    Input::Fenced(Ok(self.stream.len() as u64))
                } else {
                    Input::Fenced(Err("wrong last sequence".into()))
                }
            }
        };
        // Done at the server; the answer may still be lost on its way back.
        if self.rng.chance(self.lose) || self.now < self.procs[pid].partitioned_until {
            let input = match input {
                Input::Key(_) => Input::KeyFailed("no answer".into()),
                Input::Written(_) => Input::Written(Err(WriteError::Failed("no answer".into()))),
                Input::CaughtUp(_) => Input::CaughtUp(Err("no answer".into())),
                _ => Input::Fenced(Err("no answer".into())),
            };
            self.at(self.now + TIMEOUT, Ev::Answer { pid, token, input });
            return;
        }
        let t = self.now + self.rng.delay();
        self.at(t, Ev::Answer { pid, token, input });
    }

    /// A new revision of the key, seen by every watcher.
    fn write(&mut self, holder: Option<usize>) -> u64 {
        self.revision += 1;
        self.key = Some((self.revision, holder));
        for pid in 0..self.procs.len() {
            if self.procs[pid].alive && self.procs[pid].watching {
                let key = self.key_for(pid);
                let t = self.now + self.rng.delay();
                self.at(t, Ev::Watched { pid, key });
            }
        }
        self.revision
    }

    fn run(&mut self, pid: usize, actions: Vec<Action>) {
        for a in actions {
            match a {
                Action::Read => self.send(pid, Op::Read),
                Action::Watch => {
                    self.procs[pid].watching = true;
                    let key = self.key_for(pid);
                    let t = self.now + self.rng.delay();
                    self.at(t, Ev::Watched { pid, key });
                }
                Action::Unwatch => self.procs[pid].watching = false,
                Action::Create { .. } => self.send(pid, Op::Create),
                Action::Update { revision, .. } => self.send(pid, Op::Update(revision)),
                Action::CatchUp => self.send(pid, Op::CatchUp),
                Action::Fence { last } => self.send(pid, Op::Fence(last)),
                Action::Writer(w) => {
                    self.procs[pid].writer = w;
                    self.publish(pid);
                }
                Action::OpenSocket { .. } => {
                    let others =
                        (0..self.procs.len()).filter(|&p| p != pid && self.procs[p].socket);
                    assert_eq!(others.count(), 0, "two sockets open at {} ms", self.now);
                    self.procs[pid].socket = true;
                    if let Some(g) = self.gone_at.take() {
                        self.takeovers.push(self.now - g);
                    }
                    // The backfill: what Slack holds and the stream does not.
                    let have = self.in_stream();
                    for id in self.slack.clone() {
                        if !have.contains(&id) && !self.procs[pid].unpublished.contains(&id) {
                            self.procs[pid].unpublished.push(id);
                        }
                    }
                    self.publish(pid);
                }
                Action::CloseSocket => {
                    let t = self.now + self.rng.below(MAX_CLOSE);
                    // With faults, now and then a socket task is aborted, not stopped: then
                    // the key is not given back.
                    let clean = !(self.lose > 0 && self.rng.chance(10));
                    self.at(
                        t,
                        Ev::Input {
                            pid,
                            input: Input::SocketClosed { clean },
                        },
                    );
                }
                Action::PublishPending => {}
                Action::ForgetUnpublished => self.procs[pid].unpublished.clear(),
                Action::Release { revision } => {
                    // Modelled as landing at once: a delete expecting this revision.
                    if matches!(self.key, Some((r, _)) if r == revision) {
                        self.write(None);
                        self.gone_at.get_or_insert(self.now);
                    }
                }
                Action::TakeOver { .. } | Action::Holder(_) | Action::Lost(_) => {}
                Action::Done => {}
            }
        }
        // The machine wakes at its next deadline.
        if let Some(d) = self.procs[pid].m.deadline() {
            let ms = d.saturating_duration_since(self.t0).as_millis() as u64;
            self.at(
                ms.max(self.now),
                Ev::Input {
                    pid,
                    input: Input::Tick,
                },
            );
        }
    }

    fn in_stream(&self) -> Vec<u64> {
        self.stream
            .iter()
            .filter_map(|e| match e {
                Entry::Event(_, id) => Some(*id),
                Entry::Fence(_) => None,
            })
            .collect()
    }

    /// The publisher: one publish at a time, of the oldest unpublished event.
    fn publish(&mut self, pid: usize) {
        let p = &self.procs[pid];
        let (Some(expected), false, Some(&id)) = (p.writer, p.publishing, p.unpublished.first())
        else {
            return;
        };
        self.procs[pid].publishing = true;
        if self.cut_off(pid) {
            let seq = Err(Refusal::CutOff);
            self.at(self.now + TIMEOUT, Ev::Published { pid, id, seq });
            return;
        }
        let t = self.now + self.rng.delay();
        self.at(t, Ev::Publish { pid, id, expected });
    }

    fn input_later(&mut self, pid: usize, input: Input) {
        let t = self.now + 1;
        self.at(t, Ev::Input { pid, input });
    }

    fn feed(&mut self, pid: usize, input: Input) {
        if !self.procs[pid].alive {
            return;
        }
        let now = self.instant();
        let a = self.procs[pid].m.handle(now, input);
        if a.contains(&Action::Done) {
            self.procs[pid].alive = false;
        }
        self.run(pid, a);
    }

    fn step(&mut self, ev: Ev) {
        if std::env::var("SIM_TRACE").is_ok()
            && !matches!(
                ev,
                Ev::Slack(_)
                    | Ev::Input {
                        input: Input::Tick,
                        ..
                    }
            )
        {
            eprintln!("{} {:?} stream={}", self.now, ev, self.stream.len());
        }
        match ev {
            Ev::Answer { pid, token, input } => {
                if self.procs[pid].token == token {
                    self.procs[pid].token = 0;
                    self.feed(pid, input);
                }
            }
            Ev::Watched { pid, key } => {
                if self.procs[pid].watching && self.now >= self.procs[pid].partitioned_until {
                    self.feed(pid, Input::Key(key));
                }
            }
            Ev::Input { pid, input } => {
                if matches!(input, Input::SocketClosed { .. }) {
                    self.procs[pid].socket = false;
                }
                self.feed(pid, input);
            }
            Ev::Exec { pid, token, op } => self.exec(pid, token, op),
            Ev::Publish { pid, id, expected } => {
                let seq = if self.stream.len() as u64 == expected {
                    self.stream.push(Entry::Event(pid, id));
                    Ok(self.stream.len() as u64)
                } else {
                    Err(Refusal::WrongLast)
                };
                let t = self.now + self.rng.delay();
                self.at(t, Ev::Published { pid, id, seq });
            }
            Ev::Published { pid, id, seq } => {
                let p = &mut self.procs[pid];
                p.publishing = false;
                if !p.alive {
                    return;
                }
                match seq {
                    Ok(seq) => {
                        p.unpublished.retain(|&u| u != id);
                        if p.writer.is_some() {
                            p.writer = Some(seq);
                        }
                        if p.failing.take().is_some() {
                            self.input_later(pid, Input::Publishing(None));
                        }
                        self.publish(pid);
                    }
                    Err(Refusal::CutOff) => {
                        if p.failing.is_none() {
                            let since = self.t0 + Duration::from_millis(self.now - TIMEOUT);
                            p.failing = Some(since);
                            self.input_later(pid, Input::Publishing(Some(since)));
                        }
                        let t = self.now + 50;
                        self.at(t, Ev::Retry(pid));
                    }
                    Err(Refusal::WrongLast) if p.writer.is_some() => {
                        // Another process wrote: this one is not the writer any more.
                        p.writer = None;
                        self.input_later(pid, Input::Superseded);
                    }
                    Err(Refusal::WrongLast) => {}
                }
            }
            Ev::Retry(pid) => self.publish(pid),
            Ev::Slack(id) => {
                self.slack.push(id);
                for pid in 0..self.procs.len() {
                    if self.procs[pid].alive && self.procs[pid].socket {
                        self.procs[pid].unpublished.push(id);
                        self.publish(pid);
                    }
                }
            }
            Ev::Kill(pid) => {
                let p = &mut self.procs[pid];
                if p.alive {
                    if p.socket {
                        self.gone_at.get_or_insert(self.now);
                    }
                    p.alive = false;
                    p.socket = false;
                    p.watching = false;
                }
            }
            Ev::Stop(pid) => {
                if self.procs[pid].alive && self.procs[pid].socket {
                    self.gone_at.get_or_insert(self.now);
                }
                self.feed(pid, Input::Shutdown);
            }
            Ev::Join => self.join(),
        }
    }

    fn run_until(&mut self, end: u64) {
        while let Some(Reverse((t, _, i))) = self.queue.peek().copied() {
            if t > end {
                break;
            }
            self.queue.pop();
            self.now = t;
            let ev = self.evs[i].take().expect("each event runs once");
            self.step(ev);
            let open = self.procs.iter().filter(|p| p.alive && p.socket).count();
            assert!(open <= 1, "two sockets open at {} ms", self.now);
        }
        self.now = end;
    }

    /// Every event in the stream was written by the holder whose fence came last before it.
    fn check_fences(&self) {
        let mut fenced = None;
        for (i, e) in self.stream.iter().enumerate() {
            match e {
                Entry::Fence(p) => fenced = Some(*p),
                Entry::Event(p, id) => assert_eq!(
                    fenced,
                    Some(*p),
                    "event {id} at seq {} written by p{p}, fenced by {fenced:?}",
                    i + 1
                ),
            }
        }
    }
}

/// A run of `ms` with Slack emitting events, processes killed, stopped, partitioned and
/// joining at random; then calm (no faults, no loss) until everything settles.
fn chaos(seed: u64, procs: usize, lose: u64, ms: u64) -> World {
    let mut w = World::new(seed, procs, lose);
    let mut id = 0;
    let mut t = 0;
    while t < ms {
        // Slower than a publish's round trip on average, as Slack is next to NATS.
        t += 1 + w.rng.below(300);
        id += 1;
        w.at(t, Ev::Slack(id));
        if w.rng.chance(3) {
            let pid = w.rng.below(w.procs.len() as u64) as usize;
            let ev = match w.rng.below(4) {
                0 => Ev::Kill(pid),
                1 => Ev::Stop(pid),
                2 => Ev::Join,
                _ => {
                    let until = t + w.rng.below(2 * STALE);
                    w.run_until(t);
                    w.procs[pid].partitioned_until = until;
                    continue;
                }
            };
            w.at(t, ev);
        }
    }
    w.run_until(ms);
    // Calm: no loss, a newcomer in case everyone is gone, and time to settle.
    w.lose = 0;
    w.join();
    // Time to take over and publish a backfill of everything, one round trip per event.
    w.run_until(ms + 6 * STALE + w.slack.len() as u64 * 2 * MAX_DELAY);
    w
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn never_two_sockets_and_every_event_once(
        seed in any::<u64>(),
        procs in 1usize..5,
        lose in 0u64..10,
    ) {
        let w = chaos(seed, procs, lose, 20_000);
        w.check_fences();
        let got = w.in_stream();
        let unique: BTreeSet<u64> = got.iter().copied().collect();
        prop_assert_eq!(unique.len(), got.len(), "an event is in the stream twice");
        let all: BTreeSet<u64> = w.slack.iter().copied().collect();
        let missing: Vec<&u64> = all.difference(&unique).collect();
        prop_assert!(missing.is_empty(), "events never published: {:?}", missing);
        prop_assert!(w.procs.iter().any(|p| p.alive && p.m.holding()), "nobody holds the lease at the end");
    }

    #[test]
    fn a_killed_holder_is_taken_over_within_the_stale_time(
        seed in any::<u64>(),
        procs in 2usize..5,
    ) {
        let mut w = World::new(seed, procs, 0);
        w.run_until(3 * STALE);
        let holder = w.procs.iter().position(|p| p.socket).expect("someone holds");
        // Another host's process: not known gone at once.
        let kill_at = w.now + w.rng.below(HEARTBEAT);
        w.at(kill_at, Ev::Kill(holder));
        w.run_until(kill_at + 3 * STALE);
        let took = *w.takeovers.last().expect("taken over");
        // The stale time from the last renewal seen, then a take, a catch-up, a fence
        // and a renewal, each a round trip.
        prop_assert!(took <= STALE + 8 * 2 * MAX_DELAY, "taken over after {took} ms");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 100, ..ProptestConfig::default() })]

    /// The holder cut off from NATS (but not from Slack) steps down before a standby, which
    /// still reaches NATS, takes over.
    #[test]
    fn a_holder_cut_off_steps_down_before_it_is_taken_over(
        seed in any::<u64>(),
        procs in 2usize..5,
    ) {
        let mut w = World::new(seed, procs, 0);
        w.run_until(3 * STALE);
        let holder = w.procs.iter().position(|p| p.socket).expect("someone holds");
        let at = w.now + w.rng.below(HEARTBEAT);
        w.run_until(at);
        w.procs[holder].partitioned_until = at + 3 * STALE;
        w.gone_at = Some(at);
        w.run_until(at + 4 * STALE);
        prop_assert!(!w.procs[holder].m.holding());
        let took = *w.takeovers.last().expect("taken over");
        prop_assert!(took <= STALE + HEARTBEAT + 8 * 2 * MAX_DELAY, "taken over after {took} ms");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 100, ..ProptestConfig::default() })]

    /// Stopped at any moment of its heartbeat (a renewal in flight or not), the holder gives
    /// the key back: the next takes over in round trips, not the stale time.
    #[test]
    fn a_stopped_holder_hands_over_at_once(seed in any::<u64>(), procs in 2usize..4) {
        let mut w = World::new(seed, procs, 0);
        w.run_until(3 * STALE);
        let holder = w.procs.iter().position(|p| p.socket).expect("someone holds");
        let at = w.now + w.rng.below(HEARTBEAT);
        w.at(at, Ev::Stop(holder));
        w.run_until(at + 3 * STALE);
        let took = *w.takeovers.last().expect("taken over");
        prop_assert!(took <= STALE / 2, "taken over after {took} ms");
        prop_assert!(!w.procs[holder].alive);
    }
}

#[test]
fn a_renewal_whose_answer_was_lost_keeps_the_lease() {
    let t0 = Instant::now();
    let ms = |n| t0 + Duration::from_millis(n);
    let mut m = Lease::new("me", timing());
    assert_eq!(m.start(), [Action::Read]);
    let a = m.handle(ms(0), Input::Key(None));
    assert_eq!(a.last(), Some(&Action::Create { beat: 0 }));
    assert_eq!(m.handle(ms(1), Input::Written(Ok(1))), [Action::CatchUp]);
    assert_eq!(
        m.handle(ms(2), Input::CaughtUp(Ok(0))),
        [Action::Fence { last: 0 }]
    );
    assert_eq!(
        m.handle(ms(3), Input::Fenced(Ok(1))),
        [Action::Update {
            revision: 1,
            beat: 0
        }]
    );
    let a = m.handle(ms(4), Input::Written(Ok(2)));
    assert!(a.contains(&Action::Writer(Some(1))), "{a:?}");
    assert!(m.holding());
    // The heartbeat's renewal lands, its answer does not; the next try meets the revision
    // it made, which is this process's own.
    let hb = |n: u64| 3 + n * HEARTBEAT;
    assert_eq!(
        m.handle(ms(hb(1)), Input::Tick),
        [Action::Update {
            revision: 2,
            beat: 1
        }]
    );
    let failed = Input::Written(Err(WriteError::Failed("timeout".into())));
    assert_eq!(m.handle(ms(hb(1) + TIMEOUT), failed), []);
    let retry_at = hb(1) + TIMEOUT + HEARTBEAT / 6;
    assert_eq!(
        m.deadline(),
        Some(ms(retry_at)),
        "tried again soon, not a heartbeat later"
    );
    assert_eq!(
        m.handle(ms(retry_at), Input::Tick),
        [Action::Update {
            revision: 2,
            beat: 2
        }]
    );
    assert_eq!(
        m.handle(ms(retry_at + 2), Input::Written(Err(WriteError::Conflict))),
        [Action::Read]
    );
    let mine = Key {
        revision: 3,
        holder: Some("me".into()),
        holder_gone: false,
    };
    // Held still, and renewed at once on the revision it found.
    assert_eq!(
        m.handle(ms(retry_at + 4), Input::Key(Some(mine))),
        [Action::Update {
            revision: 3,
            beat: 3
        }]
    );
    assert!(m.holding(), "its own renewal is not another holder");
    assert_eq!(m.handle(ms(retry_at + 6), Input::Written(Ok(4))), []);
    // Counted from that renewal's sending: well past two thirds of the stale time since the
    // first, it holds on.
    assert_eq!(m.handle(ms(3 + STALE * 2 / 3), Input::Tick), []);
    assert!(m.holding());
    // Another process's name at the revision: lost.
    let mut n = Lease::new("me", timing());
    n.start();
    n.handle(ms(0), Input::Key(None));
    n.handle(ms(1), Input::Written(Ok(1)));
    n.handle(ms(2), Input::CaughtUp(Ok(0)));
    n.handle(ms(3), Input::Fenced(Ok(1)));
    n.handle(ms(4), Input::Written(Ok(2)));
    n.handle(ms(hb(1)), Input::Tick);
    n.handle(ms(hb(1) + 1), Input::Written(Err(WriteError::Conflict)));
    let theirs = Key {
        revision: 3,
        holder: Some("other".into()),
        holder_gone: false,
    };
    let a = n.handle(ms(hb(1) + 2), Input::Key(Some(theirs)));
    assert_eq!(a, [Action::CloseSocket, Action::Writer(None)]);
}
