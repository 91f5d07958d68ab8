//! The tasks extension (`io.modelcontextprotocol/tasks`): a `tools/call` that runs as a task,
//! `tasks/get`, `tasks/update`, `tasks/cancel`, and task status pushed on listen streams that
//! name the task in `taskIds`.
//!
//! [`Tasks`] is one server's tasks. A task is made by [`Tasks::start`] (durable in the store
//! before its id is handed out), runs as a tracked helper task of the role, and moves through
//! `working`, `input_required` (its [`TaskHandle::ask`] waits for `tasks/update`),
//! `completed`, `failed` or `cancelled`. Each task belongs to the principal that made it
//! ([`Caller::principal`](crate::mcp::caller::Caller::principal)); another principal cannot
//! tell it from an unknown id.
//!
//! Pushes: every change of a task's state is stamped with a number from one counter and put,
//! without waiting, on one bounded queue ([`TRANSITION_QUEUE`]); one dispatcher task takes it
//! from there to the listen streams watching that task (each a bounded channel of its own,
//! [`STREAM_QUEUE`]). A full queue or channel sheds the push (counted): polling `tasks/get`
//! stays authoritative. A stream delivers a task's state only when its stamp is newer than the
//! last it delivered for that task, so it never goes back to an older state (its first push is
//! the state at registration, taken after the acknowledgment).
//!
//! Locks: `state` (the tasks) and `streams` (who watches what) are `std` mutexes, never held
//! together and never across an `.await`; transitions only `try_send` under `state`.
//!
//! Restart: the store keeps each task (made, and its end). At open, a task that had not ended
//! reads as `failed` with an error saying the server restarted.
//!
//! Bounds: a server keeps at most [`MAX_TASKS`] tasks and a principal [`MAX_TASKS_PER_OWNER`];
//! past either, the oldest ended task is forgotten early, and when all of them still run the
//! call is refused.
//!
//! The pushes' side (the streams, the dispatcher, [`TaskListen`], [`TaskFeed`]) is `listen.rs`;
//! the ttl's expiry loop is `expiry.rs`; tasks another server runs are `relay.rs`.

use crate::sync::Recover;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    CallToolResult, DetailedTask, ErrorData as McpError, InputRequests, InputResponses, JsonObject,
    Task, TaskPayload, TaskStatus,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::mcp::error::SourceError;
use crate::runtime::context::RoleContext;
use crate::store::{Store, Table};

mod expiry;
mod listen;
pub mod relay;
pub mod relaying;
#[cfg(test)]
mod tests;

use expiry::expire_loop;
use listen::{Streams, dispatch};
pub use listen::{TaskFeed, TaskListen};

/// The extension's id, in capabilities and in a tool's `_meta`.
pub const TASKS_EXTENSION: &str = "io.modelcontextprotocol/tasks";
/// Task ids one listen may name.
pub const MAX_LISTEN_TASK_IDS: usize = 256;
/// How long a task is kept after it is made (its `ttlMs`).
pub const DEFAULT_TTL: Duration = Duration::from_secs(3600);
/// What `pollIntervalMs` suggests.
pub const POLL_INTERVAL_MS: u64 = 1000;
/// Transitions waiting for the dispatcher.
pub const TRANSITION_QUEUE: usize = 1024;
/// Pushes waiting on one listen stream.
pub const STREAM_QUEUE: usize = 256;
/// Tasks one server keeps at once, running or ended within their ttl; past it the oldest ended
/// one is forgotten early.
pub const MAX_TASKS: usize = 10_000;
/// Tasks one principal keeps on one server, the same way.
pub const MAX_TASKS_PER_OWNER: usize = 1_000;

/// The error of a task that was running when the server stopped.
pub const RESTARTED: &str =
    "the server restarted while this task ran, so it did not finish; start it again";

/// Whether a tool may run as a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskSupport {
    /// Never: a call is answered in place, with or without the extension.
    Forbidden,
    /// As a task when the request declares the extension, else answered in place.
    Optional,
    /// Only as a task: a request without the extension gets `-32021`.
    Required,
}

/// A tool's `_meta` saying it may run as a task (`taskSupport: optional`: a client without the
/// extension gets a plain answer).
pub fn optional(mut tool: rmcp::model::Tool) -> rmcp::model::Tool {
    let meta = tool.meta.get_or_insert_with(Default::default);
    meta.0
        .insert(TASKS_EXTENSION.into(), json!({"taskSupport": "optional"}));
    tool
}

/// A tool's `_meta` saying it runs only as a task (`taskSupport: required`: a client without
/// the extension gets `-32021`).
pub fn required(mut tool: rmcp::model::Tool) -> rmcp::model::Tool {
    let meta = tool.meta.get_or_insert_with(Default::default);
    meta.0
        .insert(TASKS_EXTENSION.into(), json!({"taskSupport": "required"}));
    tool
}

/// What a tool's `_meta` says of running it as a task ([`optional`], [`required`]).
pub fn task_support(tool: &rmcp::model::Tool) -> TaskSupport {
    let said = tool
        .meta
        .as_ref()
        .and_then(|m| m.0.get(TASKS_EXTENSION))
        .and_then(|v| v.get("taskSupport"))
        .and_then(Value::as_str);
    match said {
        Some("optional") => TaskSupport::Optional,
        Some("required") => TaskSupport::Required,
        _ => TaskSupport::Forbidden,
    }
}

/// Whether a tool's `_meta` says it may run as a task.
pub fn supports_tasks(tool: &rmcp::model::Tool) -> bool {
    task_support(tool) != TaskSupport::Forbidden
}

/// Takes the tasks marker off a tool (a server that relays or runs it without tasks); what
/// it said.
pub fn unmark(tool: &mut rmcp::model::Tool) -> TaskSupport {
    let support = task_support(tool);
    if let Some(m) = tool.meta.as_mut() {
        m.0.remove(TASKS_EXTENSION);
    }
    support
}

/// The `-32602` of an id this caller cannot see: unknown, expired or another's.
pub fn unknown_task(id: &str) -> McpError {
    McpError::invalid_params(
        format!(
            "no task {id:?}: unknown, expired or not yours; tasks/get ids come from a tools/call that returned a task"
        ),
        Some(json!({"taskId": id})),
    )
}

/// One server's tasks. Cheap to clone.
#[derive(Clone)]
pub struct Tasks {
    inner: Arc<Inner>,
}

struct Inner {
    state: Mutex<State>,
    streams: Mutex<Streams>,
    seq: AtomicU64,
    queue: mpsc::Sender<Transition>,
    shed: AtomicU64,
    store: Option<Store>,
    /// The store key prefix: the role's name, so roles sharing a store keep apart.
    prefix: String,
    ttl: Duration,
    ctx: RoleContext,
    /// Wakes the expiry loop when a task expires sooner than it was sleeping for (its own
    /// `Arc`, so the loop can wait on it without keeping the tasks alive).
    expiry: Arc<Notify>,
    /// Bumped, and every stream woken, when a transition was shed before the dispatcher saw
    /// it: each stream then reads its tasks' states again (newer ones only).
    shed_epoch: AtomicU64,
    resync: Notify,
}

#[derive(Default)]
struct State {
    tasks: HashMap<String, Record>,
    /// When the expiry loop means to wake next.
    next_wake: Option<Instant>,
}

struct Record {
    owner: String,
    task: DetailedTask,
    /// The stamp of the last change.
    seq: u64,
    created_ms: u64,
    expires: Instant,
    cancel: CancellationToken,
    waiting: Option<Waiting>,
}

/// A task parked on `input_required`: the keys still unanswered, the answers so far, and
/// where they go once complete.
struct Waiting {
    outstanding: BTreeSet<String>,
    got: InputResponses,
    tx: oneshot::Sender<InputResponses>,
}

struct Transition {
    id: String,
    seq: u64,
    owner: String,
    task: DetailedTask,
}

/// What the store keeps of a task.
#[derive(Serialize, Deserialize)]
struct Stored {
    owner: String,
    created_ms: u64,
    task: DetailedTask,
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn stamp(ms: u64) -> String {
    crate::mcp::events::rfc3339(ms as i64 * 1_000_000)
}

/// Now, but later than `prev` (by a millisecond when the clock has not moved on): each change
/// of a task reads as later than the one before, so a follower that sees states out of order
/// (the gateway's relay) can tell which is newer.
fn later_stamp(prev: &str) -> String {
    let now = now_ms();
    let after = relay::stamp_nanos(prev).map_or(0, |n| (n / 1_000_000) as u64 + 1);
    stamp(now.max(after))
}

fn new_id() -> String {
    use ring::rand::{SecureRandom, SystemRandom};
    let mut b = [0u8; 16];
    if SystemRandom::new().fill(&mut b).is_err() {
        // The kernel's generator failing is not something to paper over with a weak id.
        panic!("no randomness for a task id");
    }
    hex::encode(b)
}

fn error_object(e: &McpError) -> JsonObject {
    let mut o = JsonObject::new();
    o.insert("code".into(), e.code.0.into());
    o.insert("message".into(), e.message.to_string().into());
    if let Some(d) = &e.data {
        o.insert("data".into(), d.clone());
    }
    o
}

impl Tasks {
    /// A server's tasks, kept in `store` under `prefix` (the role's name) when there is one.
    /// Tasks the store holds from an earlier run come back, an unfinished one as `failed`.
    pub async fn open(ctx: &RoleContext, store: Option<Store>, prefix: &str) -> Tasks {
        Tasks::with_ttl(ctx, store, prefix, DEFAULT_TTL).await
    }

    /// [`Tasks::open`] with another ttl.
    pub async fn with_ttl(
        ctx: &RoleContext,
        store: Option<Store>,
        prefix: &str,
        ttl: Duration,
    ) -> Tasks {
        let (tx, rx) = mpsc::channel(TRANSITION_QUEUE);
        let tasks = Tasks {
            inner: Arc::new(Inner {
                state: Mutex::new(State::default()),
                streams: Mutex::new(Streams::default()),
                seq: AtomicU64::new(0),
                queue: tx,
                shed: AtomicU64::new(0),
                store,
                prefix: format!("{prefix}/"),
                ttl,
                ctx: ctx.clone(),
                expiry: Arc::new(Notify::new()),
                shed_epoch: AtomicU64::new(0),
                resync: Notify::new(),
            }),
        };
        tasks.restore().await;
        let weak = Arc::downgrade(&tasks.inner);
        ctx.spawn_until_shutdown("task-dispatch", dispatch(weak.clone(), rx));
        ctx.spawn_until_shutdown("task-expiry", expire_loop(weak));
        tasks
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner.state.locked()
    }

    /// Pushes dropped because a queue was full.
    pub fn shed(&self) -> u64 {
        self.inner.shed.load(Ordering::Relaxed)
    }

    /// Tasks kept now.
    pub fn len(&self) -> usize {
        self.lock().tasks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    async fn restore(&self) {
        let Some(store) = &self.inner.store else {
            return;
        };
        let rows = match store.scan(Table::Tasks).await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the tasks kept in the store");
                return;
            }
        };
        let now = now_ms();
        let ttl_ms = self.inner.ttl.as_millis() as u64;
        for (key, bytes) in rows {
            let Some(id) = key.strip_prefix(&self.inner.prefix) else {
                continue;
            };
            let Ok(mut stored) = serde_json::from_slice::<Stored>(&bytes) else {
                tracing::warn!(task = %id, "a task in the store cannot be read; dropping it");
                let _ = store.delete(Table::Tasks, &key).await;
                continue;
            };
            let age = now.saturating_sub(stored.created_ms);
            let ttl = stored.task.task.ttl_ms.unwrap_or(ttl_ms);
            if age >= ttl {
                let _ = store.delete(Table::Tasks, &key).await;
                continue;
            }
            if !stored.task.status().is_terminal() {
                let mut t = stored.task.task.clone();
                t.last_updated_at = later_stamp(&t.last_updated_at);
                t.status_message = None;
                stored.task = DetailedTask::new(
                    t,
                    TaskPayload::Failed {
                        error: error_object(&McpError::internal_error(RESTARTED, None)),
                    },
                );
                if let Ok(b) = serde_json::to_vec(&stored) {
                    let _ = store.put(Table::Tasks, &key, b).await;
                }
            }
            let expires = Instant::now() + Duration::from_millis(ttl - age);
            let seq = self.inner.seq.fetch_add(1, Ordering::AcqRel) + 1;
            self.lock().tasks.insert(
                id.to_owned(),
                Record {
                    owner: stored.owner,
                    task: stored.task,
                    seq,
                    created_ms: stored.created_ms,
                    expires,
                    cancel: CancellationToken::new(),
                    waiting: None,
                },
            );
        }
    }

    /// Makes a task for `owner`, durable before this returns, and runs `work` as it: the
    /// work's answer completes it (an `Err` fails it), `tasks/cancel` drops the work and
    /// cancels it, and the ttl fails it if it is still running then. `work` gets the task's
    /// handle. Returns the task as `CreateTaskResult` shows it.
    pub async fn start<F, Fut>(&self, owner: &str, work: F) -> Result<Task, McpError>
    where
        F: FnOnce(TaskHandle) -> Fut,
        Fut: Future<Output = Result<CallToolResult, McpError>> + Send + 'static,
    {
        let id = new_id();
        let now = now_ms();
        let ttl_ms = self.inner.ttl.as_millis() as u64;
        let task = Task::new(&id, TaskStatus::Working, stamp(now), stamp(now))
            .with_ttl_ms(ttl_ms)
            .with_poll_interval_ms(POLL_INTERVAL_MS);
        let detailed = DetailedTask::new(task.clone(), TaskPayload::Working);
        let cancel = CancellationToken::new();
        let expires = Instant::now() + self.inner.ttl;
        let mut evicted = Vec::new();
        {
            let mut s = self.lock();
            // Room for this one: past a cap, the oldest ended task (of this caller, then of
            // anyone) makes way; when every kept task still runs, the call is refused.
            let oldest_ended = |s: &State, owner: Option<&str>| {
                s.tasks
                    .iter()
                    .filter(|(_, r)| r.task.status().is_terminal())
                    .filter(|(_, r)| owner.is_none_or(|o| r.owner == o))
                    .min_by_key(|(_, r)| r.created_ms)
                    .map(|(id, _)| id.clone())
            };
            if s.tasks.values().filter(|r| r.owner == owner).count() >= MAX_TASKS_PER_OWNER {
                let Some(old) = oldest_ended(&s, Some(owner)) else {
                    return Err(McpError::internal_error(
                        format!(
                            "you have {MAX_TASKS_PER_OWNER} tasks running on this server; cancel some or wait for them to end"
                        ),
                        None,
                    ));
                };
                s.tasks.remove(&old);
                evicted.push(old);
            }
            if s.tasks.len() >= MAX_TASKS {
                let Some(old) = oldest_ended(&s, None) else {
                    return Err(McpError::internal_error(
                        format!(
                            "this server runs {MAX_TASKS} tasks already; try again when some have ended, or call without the tasks extension"
                        ),
                        None,
                    ));
                };
                s.tasks.remove(&old);
                evicted.push(old);
            }
            let seq = self.inner.seq.fetch_add(1, Ordering::AcqRel) + 1;
            s.tasks.insert(
                id.clone(),
                Record {
                    owner: owner.to_owned(),
                    task: detailed.clone(),
                    seq,
                    created_ms: now,
                    expires,
                    cancel: cancel.clone(),
                    waiting: None,
                },
            );
            if s.next_wake.is_none_or(|w| expires < w) {
                s.next_wake = Some(expires);
                self.inner.expiry.notify_one();
            }
        }
        if let Some(store) = &self.inner.store {
            for old in &evicted {
                let _ = store
                    .delete(Table::Tasks, &format!("{}{old}", self.inner.prefix))
                    .await;
            }
        }
        if let Err(e) = self.persist(&id, owner, now, &detailed).await {
            self.lock().tasks.remove(&id);
            return Err(McpError::internal_error(
                format!(
                    "cannot keep the task in the store ({e}); call again without the tasks extension"
                ),
                None,
            ));
        }
        let handle = TaskHandle {
            tasks: self.clone(),
            id: id.clone(),
            cancel: cancel.clone(),
        };
        let fut = work(handle);
        let tasks = self.clone();
        let task_id = id.clone();
        self.inner.ctx.spawn_until_shutdown("task", async move {
            let outcome = tokio::select! {
                r = fut => Some(r),
                _ = cancel.cancelled() => None,
            };
            tasks.finish(&task_id, outcome).await;
        });
        Ok(task)
    }

    async fn persist(
        &self,
        id: &str,
        owner: &str,
        created_ms: u64,
        task: &DetailedTask,
    ) -> Result<(), String> {
        let Some(store) = &self.inner.store else {
            return Ok(());
        };
        let stored = Stored {
            owner: owner.to_owned(),
            created_ms,
            task: task.clone(),
        };
        let bytes = serde_json::to_vec(&stored).map_err(|e| e.to_string())?;
        store
            .put(Table::Tasks, &format!("{}{id}", self.inner.prefix), bytes)
            .await
            .map_err(|e| e.to_string())
    }

    /// Changes task `id` with `change` (unless it has ended), stamps it and queues the push.
    /// Returns the new state, its owner and creation time when it changed.
    fn transition(
        &self,
        id: &str,
        change: impl FnOnce(&mut Record) -> bool,
    ) -> Option<(DetailedTask, String, u64)> {
        let mut s = self.lock();
        let r = s.tasks.get_mut(id)?;
        if r.task.status().is_terminal() || !change(r) {
            return None;
        }
        r.task.task.last_updated_at = later_stamp(&r.task.task.last_updated_at);
        let seq = self.inner.seq.fetch_add(1, Ordering::AcqRel) + 1;
        r.seq = seq;
        let t = Transition {
            id: id.to_owned(),
            seq,
            owner: r.owner.clone(),
            task: r.task.clone(),
        };
        let out = (r.task.clone(), r.owner.clone(), r.created_ms);
        if self.inner.queue.try_send(t).is_err() {
            // Lost before any stream saw it: every stream looks again (a notify wakes its
            // loop at once; it reads the state then, taking no lock here).
            self.inner.shed.fetch_add(1, Ordering::Relaxed);
            self.inner.shed_epoch.fetch_add(1, Ordering::AcqRel);
            self.inner.resync.notify_waiters();
        }
        Some(out)
    }

    /// Ends task `id` with the work's answer (`None`: cancelled), and keeps the end.
    async fn finish(&self, id: &str, outcome: Option<Result<CallToolResult, McpError>>) {
        let payload = match outcome {
            None => TaskPayload::Cancelled,
            Some(Ok(result)) => match serde_json::to_value(&result) {
                Ok(Value::Object(result)) => TaskPayload::Completed { result },
                _ => TaskPayload::Failed {
                    error: error_object(&McpError::internal_error(
                        "the tool's result could not be encoded",
                        None,
                    )),
                },
            },
            Some(Err(e)) => TaskPayload::Failed {
                error: error_object(&e),
            },
        };
        // The end is kept before anyone is told of it: a push of `completed` followed by a
        // crash must not read `failed` (restarted) afterwards.
        let end = {
            let s = self.lock();
            let Some(r) = s.tasks.get(id).filter(|r| !r.task.status().is_terminal()) else {
                return;
            };
            let mut end = DetailedTask::new(r.task.task.clone(), payload);
            if end.status() != TaskStatus::Cancelled {
                end.task.status_message = None;
            }
            end.task.last_updated_at = later_stamp(&end.task.last_updated_at);
            (end, r.owner.clone(), r.created_ms)
        };
        let (task, owner, created) = end;
        if let Err(e) = self.persist(id, &owner, created, &task).await {
            tracing::warn!(task = %id, error = %e, "cannot keep the task's end in the store");
        }
        self.transition(id, |r| {
            r.waiting = None;
            r.task = task;
            true
        });
    }

    /// `tasks/get`: the task as `owner` may see it.
    pub fn get(&self, owner: &str, id: &str) -> Result<DetailedTask, McpError> {
        let s = self.lock();
        match s.tasks.get(id) {
            Some(r) if r.owner == owner => Ok(r.task.clone()),
            _ => Err(unknown_task(id)),
        }
    }

    /// `tasks/update`: answers to the task's outstanding input requests. Keys not
    /// outstanding are ignored; once every outstanding key has an answer the task goes on.
    pub fn update(&self, owner: &str, id: &str, responses: InputResponses) -> Result<(), McpError> {
        let (done, narrowed) = {
            let mut s = self.lock();
            let Some(r) = s.tasks.get_mut(id).filter(|r| r.owner == owner) else {
                return Err(unknown_task(id));
            };
            let Some(w) = r.waiting.as_mut() else {
                return Ok(());
            };
            let mut took = false;
            for (k, v) in responses {
                if w.outstanding.remove(&k) {
                    w.got.insert(k, v);
                    took = true;
                }
            }
            (w.outstanding.is_empty(), took)
        };
        if !done && narrowed {
            // Some answered: the task still waits, and shows only what it still asks.
            self.transition(id, |r| {
                let Some(w) = r.waiting.as_ref() else {
                    return false;
                };
                let TaskPayload::InputRequired { input_requests } = &r.task.payload else {
                    return false;
                };
                let left: InputRequests = input_requests
                    .iter()
                    .filter(|(k, _)| w.outstanding.contains(k.as_str()))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                r.task = DetailedTask::new(
                    r.task.task.clone(),
                    TaskPayload::InputRequired {
                        input_requests: left,
                    },
                );
                true
            });
        }
        if done {
            let mut answers = None;
            self.transition(id, |r| {
                let Some(w) = r.waiting.take() else {
                    return false;
                };
                answers = Some((w.tx, w.got));
                r.task = DetailedTask::new(r.task.task.clone(), TaskPayload::Working);
                true
            });
            if let Some((tx, got)) = answers {
                let _ = tx.send(got);
            }
        }
        Ok(())
    }

    /// `tasks/cancel`: asks the work to stop; the task then reads `cancelled` (unless it
    /// ended first).
    pub fn cancel(&self, owner: &str, id: &str) -> Result<(), McpError> {
        let s = self.lock();
        match s.tasks.get(id) {
            Some(r) if r.owner == owner => {
                r.cancel.cancel();
                Ok(())
            }
            _ => Err(unknown_task(id)),
        }
    }
}

/// The running work's side of a task.
#[derive(Clone)]
pub struct TaskHandle {
    tasks: Tasks,
    id: String,
    cancel: CancellationToken,
}

impl std::fmt::Debug for TaskHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskHandle").field("id", &self.id).finish()
    }
}

impl TaskHandle {
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Cancelled by `tasks/cancel` or the ttl.
    pub fn cancelled(&self) -> &CancellationToken {
        &self.cancel
    }

    /// Sets the task's `statusMessage` (pushed like any change). Say something a person can
    /// read, at most a few times a second.
    pub fn message(&self, text: impl Into<String>) {
        let text = text.into();
        self.tasks.transition(&self.id, |r| {
            if r.task.task.status_message.as_deref() == Some(text.as_str()) {
                return false;
            }
            r.task.task.status_message = Some(text);
            true
        });
    }

    /// Parks the task on `input_required` with `requests` and waits until `tasks/update` has
    /// answered every one of them; the task is `working` again then. Keys must be unique for
    /// the task's life. Fails when the task is cancelled or ends meanwhile.
    pub async fn ask(&self, requests: InputRequests) -> Result<InputResponses, SourceError> {
        let (tx, rx) = oneshot::channel();
        let outstanding: BTreeSet<String> = requests.keys().cloned().collect();
        let mut tx = Some(tx);
        let parked = self.tasks.transition(&self.id, |r| {
            r.waiting = Some(Waiting {
                outstanding,
                got: BTreeMap::new(),
                tx: tx.take().expect("called once"),
            });
            r.task = DetailedTask::new(
                r.task.task.clone(),
                TaskPayload::InputRequired {
                    input_requests: requests,
                },
            );
            true
        });
        if parked.is_none() {
            return Err(SourceError::Unavailable("the task has ended".into()));
        }
        tokio::select! {
            r = rx => r.map_err(|_| SourceError::Unavailable("the task ended before its input came".into())),
            _ = self.cancel.cancelled() => Err(SourceError::Unavailable("the task was cancelled".into())),
        }
    }
}
