//! Task pushes on listen streams: who watches which task ([`Streams`], registered by
//! [`Tasks::listen`] and unregistered when the stream's [`TaskListen`] drops), the dispatcher
//! that takes each transition off the queue and offers it, without waiting, to the owner's
//! streams watching that task, and the stream's side ([`TaskListen::next`]: each newer state
//! once, reading its tasks' states again after a shed push). [`TaskFeed`] is a stream's tasks,
//! this server's own or relayed.

use crate::sync::Recover;
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use rmcp::model::DetailedTask;
use tokio::sync::mpsc;

use super::{Inner, STREAM_QUEUE, Tasks, Transition, relay};

#[derive(Default)]
pub(super) struct Streams {
    next: u64,
    by_task: HashMap<String, BTreeSet<u64>>,
    streams: HashMap<u64, StreamEntry>,
}

struct StreamEntry {
    principal: String,
    ids: Vec<String>,
    tx: mpsc::Sender<(u64, DetailedTask)>,
    /// Set when a push to this stream was shed: it reads its tasks' states again once it has
    /// taken what is queued.
    behind: Arc<std::sync::atomic::AtomicBool>,
}

impl Tasks {
    fn streams(&self) -> std::sync::MutexGuard<'_, Streams> {
        self.inner.streams.locked()
    }

    /// Registers a listen stream of `principal` for `ids`: returns the ids it may see now
    /// (the acknowledgment's `taskIds`, each once, unknown and foreign ones left out) and the
    /// stream's end of the pushes.
    pub fn listen(&self, principal: &str, ids: &[String]) -> TaskListen {
        let visible: Vec<String> = {
            let s = self.lock();
            let mut seen = BTreeSet::new();
            ids.iter()
                .filter(|id| seen.insert(id.as_str()))
                .filter(|id| {
                    s.tasks
                        .get(id.as_str())
                        .is_some_and(|r| r.owner == principal)
                })
                .cloned()
                .collect()
        };
        let (tx, rx) = mpsc::channel(STREAM_QUEUE);
        let behind = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let key = {
            let mut st = self.streams();
            st.next += 1;
            let key = st.next;
            for id in &visible {
                st.by_task.entry(id.clone()).or_default().insert(key);
            }
            st.streams.insert(
                key,
                StreamEntry {
                    principal: principal.to_owned(),
                    ids: visible.clone(),
                    tx,
                    behind: behind.clone(),
                },
            );
            key
        };
        TaskListen {
            ids: visible,
            rx,
            behind,
            epoch: self.inner.shed_epoch.load(Ordering::Acquire),
            again: std::collections::VecDeque::new(),
            last: HashMap::new(),
            _registration: StreamRegistration {
                tasks: Arc::downgrade(&self.inner),
                key,
            },
            principal: principal.to_owned(),
            tasks: self.clone(),
        }
    }

    fn unregister(inner: &Inner, key: u64) {
        let mut st = inner.streams.locked();
        if let Some(e) = st.streams.remove(&key) {
            for id in e.ids {
                if let Some(set) = st.by_task.get_mut(&id) {
                    set.remove(&key);
                    if set.is_empty() {
                        st.by_task.remove(&id);
                    }
                }
            }
        }
    }

    /// Listen streams registered now (for tests and the status board).
    pub fn streams_open(&self) -> usize {
        self.streams().streams.len()
    }
}

/// A listen stream's tasks: this server's own, or relayed from the servers that run them.
pub enum TaskFeed {
    Local(TaskListen),
    Relayed(relay::RelayedListen),
}

impl TaskFeed {
    /// The ids the stream watches (the acknowledgment's `taskIds`).
    pub fn ids(&self) -> &[String] {
        match self {
            TaskFeed::Local(l) => &l.ids,
            TaskFeed::Relayed(r) => &r.ids,
        }
    }

    /// The states to push right after the acknowledgment.
    pub fn initial(&mut self) -> Vec<DetailedTask> {
        match self {
            TaskFeed::Local(l) => l.initial(),
            TaskFeed::Relayed(r) => r.initial(),
        }
    }

    /// The next state to push.
    pub async fn next(&mut self) -> Option<DetailedTask> {
        match self {
            TaskFeed::Local(l) => l.next().await,
            TaskFeed::Relayed(r) => r.next().await,
        }
    }
}

/// A listen stream's registration for task pushes. Dropping it unregisters the stream.
pub struct TaskListen {
    /// The ids this stream watches (the acknowledgment's `taskIds`).
    pub ids: Vec<String>,
    rx: mpsc::Receiver<(u64, DetailedTask)>,
    /// A push to this stream was shed (set by the dispatcher).
    behind: Arc<std::sync::atomic::AtomicBool>,
    /// The shed epoch this stream last looked again at.
    epoch: u64,
    /// States read again after a shed, still to deliver.
    again: std::collections::VecDeque<DetailedTask>,
    /// The stamp of the last state delivered, per task.
    last: HashMap<String, u64>,
    /// Held for its drop, which unregisters the stream.
    _registration: StreamRegistration,
    principal: String,
    tasks: Tasks,
}

struct StreamRegistration {
    tasks: Weak<Inner>,
    key: u64,
}

impl Drop for StreamRegistration {
    fn drop(&mut self) {
        if let Some(inner) = self.tasks.upgrade() {
            Tasks::unregister(&inner, self.key);
        }
    }
}

impl TaskListen {
    /// The current state of every watched task, as a stream's first pushes (after its
    /// acknowledgment). Marks them delivered.
    pub fn initial(&mut self) -> Vec<DetailedTask> {
        let snapshot: Vec<(String, u64, DetailedTask)> = {
            let s = self.tasks.lock();
            self.ids
                .iter()
                .filter_map(|id| {
                    let r = s.tasks.get(id)?;
                    (r.owner == self.principal).then(|| (id.clone(), r.seq, r.task.clone()))
                })
                .collect()
        };
        snapshot
            .into_iter()
            .filter_map(|(id, seq, task)| self.newer(&id, seq).then_some(task))
            .collect()
    }

    fn newer(&mut self, id: &str, seq: u64) -> bool {
        match self.last.get(id) {
            Some(&last) if last >= seq => false,
            _ => {
                self.last.insert(id.to_owned(), seq);
                true
            }
        }
    }

    /// The next state to push: newer than what this stream has for that task. `None` once
    /// the server's tasks are gone. After a shed push (this stream's, or a transition lost
    /// before dispatch) the stream reads its tasks' current states again, so a final state is
    /// never lost for good, and never delivered twice or out of order.
    pub async fn next(&mut self) -> Option<DetailedTask> {
        loop {
            if let Some(t) = self.again.pop_front() {
                return Some(t);
            }
            // Interest first, then the epoch: a shed between the two still wakes this.
            let inner = self.tasks.inner.clone();
            let resync = inner.resync.notified();
            tokio::pin!(resync);
            resync.as_mut().enable();
            let epoch = inner.shed_epoch.load(Ordering::Acquire);
            let lagged = self.rx.is_empty() && self.behind.swap(false, Ordering::AcqRel);
            if lagged || epoch != self.epoch {
                self.epoch = epoch;
                self.again = self.initial().into();
                continue;
            }
            tokio::select! {
                got = self.rx.recv() => {
                    let (seq, task) = got?;
                    if self.newer(&task.task.task_id, seq) {
                        return Some(task);
                    }
                }
                _ = resync => {}
            }
        }
    }

    /// Whether this stream watches any task.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
}

/// The dispatcher: takes transitions off the queue in order and offers each to the streams
/// watching its task whose principal owns it, never waiting on one.
pub(super) async fn dispatch(inner: Weak<Inner>, mut rx: mpsc::Receiver<Transition>) {
    while let Some(t) = rx.recv().await {
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let st = inner.streams.locked();
        let Some(keys) = st.by_task.get(&t.id) else {
            continue;
        };
        for key in keys {
            let Some(e) = st.streams.get(key) else {
                continue;
            };
            // Checked again at every delivery: only the owner's streams get a task's state.
            if e.principal != t.owner {
                continue;
            }
            if e.tx.try_send((t.seq, t.task.clone())).is_err() && !e.tx.is_closed() {
                inner.shed.fetch_add(1, Ordering::Relaxed);
                e.behind.store(true, Ordering::Release);
            }
        }
    }
}
