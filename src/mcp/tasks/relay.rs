//! Tasks another server runs, served as this server's own: the gateway's side of the tasks
//! extension. A [`TaskRelay`](super::relaying::TaskRelay) answers a task-augmented `tools/call` and `tasks/*` by asking the
//! server that runs the task; the pushes of one relayed task land in one [`Relayed`] (its
//! latest state, shared by every listen stream watching it) and reach each stream through a
//! [`RelayedListen`].
//!
//! A [`Relayed`] keeps one state, never a queue: a stream that falls behind skips to the
//! latest state (polling `tasks/get` stays authoritative), and a state is offered only when
//! it is newer than the one kept (an ended task never goes back, and `lastUpdatedAt` never
//! goes back), since an upstream's notifications may be handled out of order.

use crate::sync::Recover;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use rmcp::model::{DetailedTask, Task};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// One relayed task's latest state, shared by the streams watching it.
#[derive(Default)]
pub struct Relayed {
    state: Mutex<RelayedState>,
    /// Cancelled once the task has ended: nothing newer can come.
    ended: CancellationToken,
    /// Called once, when an end is taken.
    on_end: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

#[derive(Default)]
struct RelayedState {
    latest: Option<(u64, DetailedTask)>,
    seq: u64,
    /// The streams to wake on a new state.
    waiters: Vec<Weak<Notify>>,
}

fn terminal(t: &DetailedTask) -> bool {
    t.status().is_terminal()
}

/// The end of a task its server no longer knows (expired there, or the server lost it in a
/// restart without its store): it will never push it again.
pub fn unknown_upstream(id: &str) -> DetailedTask {
    let now = super::stamp(super::now_ms());
    let mut error = rmcp::model::JsonObject::new();
    error.insert("code".into(), (-32602).into());
    error.insert(
        "message".into(),
        "the server that ran this task no longer knows it (it expired there, or the server restarted without its store)".into(),
    );
    DetailedTask::new(
        Task::new(id, rmcp::model::TaskStatus::Failed, now.clone(), now),
        rmcp::model::TaskPayload::Failed { error },
    )
}

/// An RFC 3339 time (`2026-12-01T02:03:04.567Z`, any fraction, `Z` or an offset) in
/// nanoseconds since the epoch; `None` when it is not one.
pub fn stamp_nanos(s: &str) -> Option<i128> {
    // Bytes from here on: anything else is not a stamp (and never a slice off a char).
    if !s.is_ascii() {
        return None;
    }
    let b = s.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let t = s.get(r)?;
        t.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| t.parse().ok())
            .flatten()
    };
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't' | b' ')
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    // A leap second (`:60`) reads as the last moment of its minute.
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    let sec = sec.min(59);
    let mut i = 19;
    let mut frac: i128 = 0;
    if b.get(i) == Some(&b'.') {
        i += 1;
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        let digits = s.get(start..i)?;
        if digits.is_empty() {
            return None;
        }
        let nine: String = digits
            .chars()
            .chain(std::iter::repeat('0'))
            .take(9)
            .collect();
        frac = nine.parse().ok()?;
    }
    let offset_s: i64 = match s.get(i..)? {
        "Z" | "z" => 0,
        o if o.len() == 6 && matches!(&o[..1], "+" | "-") && &o[3..4] == ":" => {
            let v = num(i + 1..i + 3)? * 3600 + num(i + 4..i + 6)? * 60;
            if &o[..1] == "-" { -v } else { v }
        }
        _ => return None,
    };
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if mo <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + h * 3600 + mi * 60 + sec - offset_s;
    Some(secs as i128 * 1_000_000_000 + frac)
}

impl Relayed {
    pub fn new() -> Arc<Relayed> {
        Arc::new(Relayed::default())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, RelayedState> {
        self.state.locked()
    }

    /// Takes `task` as the latest state when it is newer than the one kept; wakes the streams
    /// then. Returns whether it was taken.
    pub fn offer(&self, task: DetailedTask) -> bool {
        let waiters = {
            let mut s = self.lock();
            if let Some((_, cur)) = &s.latest {
                // Herald stamps each change of a task later than the one before, so an older
                // stamp is a state overtaken (the upstream's notifications are handled
                // concurrently). An equal stamp (a coarser clock elsewhere) is taken; an end
                // always is, whatever its stamp says: nothing follows an end.
                let newer = terminal(&task)
                    || match (
                        stamp_nanos(&task.task.last_updated_at),
                        stamp_nanos(&cur.task.last_updated_at),
                    ) {
                        (Some(new), Some(old)) => new >= old,
                        _ => true,
                    };
                if terminal(cur) || !newer || *cur == task {
                    return false;
                }
            }
            s.seq += 1;
            let ended = terminal(&task);
            s.latest = Some((s.seq, task));
            if ended {
                self.ended.cancel();
            }
            s.waiters.retain(|w| w.strong_count() > 0);
            (s.waiters.clone(), ended)
        };
        let (waiters, ended) = waiters;
        if ended && let Some(f) = self.on_end.locked().take() {
            f();
        }
        for w in waiters.iter().filter_map(Weak::upgrade) {
            w.notify_one();
        }
        true
    }

    /// Calls `f` once, when an end is taken (at once if it has been).
    pub fn on_end(&self, f: Box<dyn FnOnce() + Send>) {
        if self.ended.is_cancelled() {
            f();
            return;
        }
        *self.on_end.locked() = Some(f);
        // An end taken between the look and the store calls it here.
        if self.ended.is_cancelled()
            && let Some(f) = self.on_end.locked().take()
        {
            f();
        }
    }

    /// The latest state when its stamp is past `seen` (cloned only then).
    fn newer_than(&self, seen: Option<u64>) -> Option<(u64, DetailedTask)> {
        let s = self.lock();
        match &s.latest {
            Some((seq, t)) if seen.is_none_or(|l| *seq > l) => Some((*seq, t.clone())),
            _ => None,
        }
    }

    /// Cancelled once an ended state was taken.
    pub fn ended(&self) -> &CancellationToken {
        &self.ended
    }

    fn wake(&self, n: &Arc<Notify>) {
        let mut s = self.lock();
        s.waiters.retain(|w| w.strong_count() > 0);
        s.waiters.push(Arc::downgrade(n));
    }
}

/// One watched task of a [`RelayedListen`]: its id as the caller knows it, its shared state,
/// and whatever keeps its relay running (dropped with the stream).
pub struct Watched {
    pub id: String,
    pub relayed: Arc<Relayed>,
    pub keep: Arc<dyn std::any::Any + Send + Sync>,
}

/// A listen stream's relayed tasks.
pub struct RelayedListen {
    /// The ids this stream watches (the acknowledgment's `taskIds`).
    pub ids: Vec<String>,
    watched: Vec<Watched>,
    last: HashMap<String, u64>,
    /// Where the next look starts.
    cursor: usize,
    wake: Arc<Notify>,
    /// Checked again at every delivery: may this stream's caller still see task `id`?
    allowed: Arc<dyn Fn(&str) -> bool + Send + Sync>,
}

impl RelayedListen {
    pub fn new(watched: Vec<Watched>, allowed: Arc<dyn Fn(&str) -> bool + Send + Sync>) -> Self {
        let wake = Arc::new(Notify::new());
        for w in &watched {
            w.relayed.wake(&wake);
        }
        RelayedListen {
            ids: watched.iter().map(|w| w.id.clone()).collect(),
            watched,
            last: HashMap::new(),
            cursor: 0,
            wake,
            allowed,
        }
    }

    /// States newer than what this stream delivered, marked delivered.
    pub fn initial(&mut self) -> Vec<DetailedTask> {
        std::iter::from_fn(|| self.take_one()).collect()
    }

    /// The first watched task whose state is newer than what this stream delivered (and that
    /// its caller may still see), marked delivered.
    fn take_one(&mut self) -> Option<DetailedTask> {
        // Round robin from after the last one served: a task that changes often cannot keep
        // the others' states (their ends among them) waiting.
        let n = self.watched.len();
        for k in 0..n {
            let i = (self.cursor + k) % n;
            let w = &self.watched[i];
            let Some((seq, task)) = w.relayed.newer_than(self.last.get(&w.id).copied()) else {
                continue;
            };
            if !(self.allowed)(&w.id) {
                continue;
            }
            self.last.insert(w.id.clone(), seq);
            self.cursor = i + 1;
            return Some(task);
        }
        None
    }

    /// The next newer state of a watched task; waits for one.
    pub async fn next(&mut self) -> Option<DetailedTask> {
        if self.watched.is_empty() {
            return None;
        }
        loop {
            // Interest first, then the look: a state offered in between still wakes this.
            let woken = self.wake.clone();
            let notified = woken.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(t) = self.take_one() {
                return Some(t);
            }
            notified.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::{TaskPayload, TaskStatus};

    fn state(id: &str, status: TaskStatus, at: &str) -> DetailedTask {
        let payload = match status {
            TaskStatus::Working => TaskPayload::Working,
            TaskStatus::Cancelled => TaskPayload::Cancelled,
            _ => TaskPayload::Completed {
                result: Default::default(),
            },
        };
        DetailedTask::new(Task::new(id, status, at.to_owned(), at.to_owned()), payload)
    }

    #[test]
    fn stamps_compare_as_times_whatever_their_spelling() {
        let z = stamp_nanos("2026-12-01T00:00:00Z").unwrap();
        assert_eq!(
            stamp_nanos("2026-12-01T00:00:00.123456789123Z").unwrap() - z,
            123_456_789
        );
        assert!(stamp_nanos("2026-12-01T00:00:00-01:00").unwrap() > z);
        assert_eq!(stamp_nanos("2026-12-01T00:00:00.000Z"), Some(z));
        assert_eq!(stamp_nanos("2026-12-01T01:00:00+01:00"), Some(z));
        assert_eq!(
            stamp_nanos("2026-12-01T00:00:00.5Z").unwrap() - z,
            500_000_000
        );
        assert_eq!(stamp_nanos("1970-01-01T00:00:01Z"), Some(1_000_000_000));
        assert!(stamp_nanos("2026-12-01T00:00:00.1Z") > stamp_nanos("2026-11-30T23:59:59.999Z"));
        for bad in [
            "",
            "yesterday",
            "2026-12-01",
            "2026-12-01T00:00:00",
            "2026-12-01T00:00:00.Z",
            "2026-12-01T00:00:00é1234",
            "2026-12-01T00:00:00+1é12",
            "2026-12-01T00x00y00Z",
            "2026-13-45T99:99:99Z",
        ] {
            assert_eq!(stamp_nanos(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_relayed_task_never_goes_back() {
        let r = Relayed::new();
        assert!(r.offer(state("a", TaskStatus::Working, "2026-12-01T00:00:00.002Z")));
        assert!(
            !r.offer(state("a", TaskStatus::Working, "2026-12-01T00:00:00.002Z")),
            "the same state twice"
        );
        let mut older = state("a", TaskStatus::Working, "2026-12-01T00:00:00.001Z");
        older.task.status_message = Some("older".into());
        assert!(!r.offer(older), "an older stamp");
        assert!(!r.ended().is_cancelled());
        assert!(r.offer(state(
            "a",
            TaskStatus::Completed,
            "2026-12-01T00:00:00.003Z"
        )));
        assert!(r.ended().is_cancelled());
        assert!(
            !r.offer(state("a", TaskStatus::Working, "2026-12-01T00:00:00.009Z")),
            "nothing after the end"
        );
        assert_eq!(r.newer_than(None).unwrap().0, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_skips_to_the_latest_and_is_rechecked_at_each_delivery() {
        let r = Relayed::new();
        let allowed = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let a = allowed.clone();
        let mut l = RelayedListen::new(
            vec![Watched {
                id: "s__a".into(),
                relayed: r.clone(),
                keep: Arc::new(()),
            }],
            Arc::new(move |_| a.load(std::sync::atomic::Ordering::SeqCst)),
        );
        assert!(l.initial().is_empty(), "nothing known yet");
        r.offer(state(
            "s__a",
            TaskStatus::Working,
            "2026-12-01T00:00:00.001Z",
        ));
        let mut w2 = state("s__a", TaskStatus::Working, "2026-12-01T00:00:00.002Z");
        w2.task.status_message = Some("half".into());
        r.offer(w2.clone());
        let got = tokio::time::timeout(std::time::Duration::from_secs(5), l.next())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(got, w2, "the latest, not a backlog");
        allowed.store(false, std::sync::atomic::Ordering::SeqCst);
        r.offer(state(
            "s__a",
            TaskStatus::Completed,
            "2026-12-01T00:00:00.003Z",
        ));
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(50), l.next())
                .await
                .is_err(),
            "a caller that may no longer see the task gets nothing"
        );
    }
}
