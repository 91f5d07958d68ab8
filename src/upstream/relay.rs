//! [`Relay`]: the rmcp client handler of every upstream connection, and its [`Tap`]. As the
//! tap it sees each message in wire order, in the connection's receive loop, and hands an
//! upstream's progress notifications and log messages to the channel of the call they are for
//! ([`Upward`], bounded; one that does not fit is dropped and counted) before the response
//! behind them is delivered: a call that drains its channel after its answer has forwarded
//! everything the upstream sent before that answer, in order. As the handler it forwards an
//! upstream's task pushes to the [`Relayed`] state of that task (the gateway's
//! relayed tasks, the watch client's task watches), and counts an older server's list changes
//! on the upstream's [`ListSignal`](super::ListSignal); a connection nobody registers on only
//! ever buffers a few strays.
//!
//! Log messages (`notifications/message`) carry nothing that names their request, and one
//! byte-stream connection (stdio, QUIC) carries every call the gateway relays to it. A server
//! sends them only for a request that asked (`_meta` `logLevel`), so while exactly one such
//! call is in flight on the connection they are that call's; with two or more in flight at
//! once they could be either's, and go to neither (one caller never sees another's log).

use crate::sync::Recover;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;

use rmcp::ClientHandler;
use rmcp::model::GetMeta as _;
#[allow(deprecated)]
use rmcp::model::LoggingMessageNotificationParam;
use rmcp::model::{
    ClientConfig, JsonRpcMessage, NumberOrString, ProgressNotificationParam, ProgressToken,
    ServerNotification, TaskStatusNotificationParams,
};
use rmcp::service::{NotificationContext, RoleClient, RxJsonRpcMessage};

use crate::mcp::tasks::relay::Relayed;
use crate::transport::client::{Tap, client_config};

/// What an upstream sends for one call before its answer, in wire order.
#[allow(deprecated)] // logging is deprecated by SEP-2577, still in 2026-07-28
pub enum Upward {
    Progress(ProgressNotificationParam),
    Log(LoggingMessageNotificationParam),
}

/// How many of a call's [`Upward`] messages may wait for it to forward them.
pub const UPWARD_CAPACITY: usize = 64;

/// Relays an upstream's progress notifications to the downstream caller waiting on that call.
#[derive(Clone, Default)]
pub struct Relay {
    waiting: Arc<Mutex<HashMap<String, mpsc::Sender<Upward>>>>,
    /// Progress that arrived before its call was registered (the request is on the wire before
    /// rmcp hands back its token); at most [`MAX_EARLY`], oldest dropped.
    early: Arc<Mutex<VecDeque<ProgressNotificationParam>>>,
    /// Progress and log messages dropped because their call's channel was full.
    dropped: Arc<AtomicU64>,
    /// Task pushes, by the upstream's task id: the id to show them under, and where they go.
    tasks: TaskRoutes,
    /// An older server's list changes, and each connect (see [`super::lists`]).
    pub(super) lists: super::ListSignal,
    /// The calls in flight that asked for log messages, by key.
    logs: Arc<Mutex<LogRoutes>>,
    /// Open `events/stream` requests' messages, by subscription id (see [`super::events`]).
    streams: Arc<Mutex<StreamRoutes>>,
    /// Every listen asks that its updates carry reads ([`UpstreamConfig::contents`]).
    ///
    /// [`UpstreamConfig::contents`]: super::UpstreamConfig::contents
    pub(super) contents: bool,
}

/// One message of an `events/stream`: its kind (`active`, `event`, `heartbeat`, `error`,
/// `terminated`) and its params.
#[derive(Debug, Clone)]
pub struct StreamMessage {
    pub kind: String,
    pub params: serde_json::Value,
}

/// How many messages an open stream's channel holds; one that does not fit ends that route
/// (its follower resumes from the last cursor it took, so nothing is lost).
pub const STREAM_CAPACITY: usize = 256;
/// Stream messages kept for a subscription id no route has claimed yet (a stream's first
/// messages can arrive before its request's id is known), oldest dropped.
const MAX_EARLY_STREAM: usize = 256;

#[derive(Default)]
struct StreamRoutes {
    next: u64,
    /// The route's key and its channel's only sender (so a route closed for falling behind
    /// is seen closed by its reader).
    by_id: HashMap<String, (u64, mpsc::Sender<StreamMessage>)>,
    early: VecDeque<(String, StreamMessage)>,
    /// Ids whose route ended (dropped, or closed for falling behind): what still comes for
    /// them until the server hears the cancel is dropped, not kept as early; at most
    /// [`MAX_EARLY_STREAM`], oldest forgotten.
    closed: VecDeque<String>,
}

impl StreamRoutes {
    fn close(&mut self, key: &str) {
        self.by_id.remove(key);
        if self.closed.len() == MAX_EARLY_STREAM {
            self.closed.pop_front();
        }
        self.closed.push_back(key.to_owned());
    }
}

/// A registered stream route; dropping it ends the route.
pub struct StreamRoute {
    id: String,
    key: u64,
    streams: Arc<Mutex<StreamRoutes>>,
}

impl Drop for StreamRoute {
    fn drop(&mut self) {
        let mut m = self.streams.locked();
        if m.by_id.get(&self.id).is_some_and(|(k, _)| *k == self.key) {
            m.close(&self.id);
        }
    }
}

/// A request id (a subscription id) in JSON as a route key, as [`id_key`] makes them.
fn json_key(id: &serde_json::Value) -> Option<String> {
    serde_json::from_value::<NumberOrString>(id.clone())
        .ok()
        .map(|n| id_key(&n))
}

#[derive(Default)]
struct LogRoutes {
    next: u64,
    live: Vec<(u64, mpsc::Sender<Upward>)>,
}

/// A registered log route; dropping it ends the route.
pub struct LogRoute {
    key: u64,
    logs: Arc<Mutex<LogRoutes>>,
}

impl Drop for LogRoute {
    fn drop(&mut self) {
        let mut m = self.logs.locked();
        m.live.retain(|(k, _)| *k != self.key);
    }
}

/// Where each followed task's pushes go, by the upstream's task id: every route following it
/// (a gateway relay, a watch; an old one still winding down beside its successor), each with
/// its key, the id to show the pushes under, and the state they update.
type TaskRoutes = Arc<Mutex<TaskRouteMap>>;

#[derive(Default)]
struct TaskRouteMap {
    next: u64,
    by_id: HashMap<String, Vec<(u64, String, std::sync::Weak<Relayed>)>>,
}

/// A registered task route; dropping it ends the route.
pub struct TaskRoute {
    id: String,
    key: u64,
    tasks: TaskRoutes,
}

impl Drop for TaskRoute {
    fn drop(&mut self) {
        let mut m = self.tasks.locked();
        if let Some(routes) = m.by_id.get_mut(&self.id) {
            // Only this route: another may follow the same task.
            routes.retain(|(k, _, _)| *k != self.key);
            if routes.is_empty() {
                m.by_id.remove(&self.id);
            }
        }
    }
}

const MAX_EARLY: usize = 64;

/// A registered progress relay; dropping it ends the relay.
pub struct Relaying {
    key: String,
    /// Its own sender: a later call under the same token (on a newer connection) is not
    /// this relay's to end.
    to: mpsc::Sender<Upward>,
    waiting: Arc<Mutex<HashMap<String, mpsc::Sender<Upward>>>>,
}

impl Drop for Relaying {
    fn drop(&mut self) {
        let mut waiting = self.waiting.locked();
        if waiting
            .get(&self.key)
            .is_some_and(|s| s.same_channel(&self.to))
        {
            waiting.remove(&self.key);
        }
    }
}

fn token_key(t: &ProgressToken) -> String {
    id_key(&t.0)
}

/// A progress token's or a request id's key (`n:1`, `s:abc`): a number and the string of its
/// digits are different ids.
fn id_key(id: &NumberOrString) -> String {
    match id {
        NumberOrString::Number(n) => format!("n:{n}"),
        NumberOrString::String(s) => format!("s:{s}"),
    }
}

impl Relay {
    /// A connection's handler; `contents`: its listens ask for carried reads.
    pub(super) fn new(contents: bool) -> Relay {
        Relay {
            contents,
            ..Relay::default()
        }
    }
    /// Sends the upstream's progress for `token` to `to` until the returned guard drops (what
    /// came before this, early, first).
    pub fn register(&self, token: ProgressToken, to: mpsc::Sender<Upward>) -> Relaying {
        let key = token_key(&token);
        let mut waiting = self.waiting.locked();
        let early: Vec<ProgressNotificationParam> = {
            let mut q = self.early.locked();
            let (mine, rest): (Vec<_>, Vec<_>) = q
                .drain(..)
                .partition(|p| token_key(&p.progress_token) == key);
            q.extend(rest);
            mine
        };
        for p in early {
            self.hand(&to, Upward::Progress(p));
        }
        waiting.insert(key.clone(), to.clone());
        Relaying {
            key,
            to,
            waiting: self.waiting.clone(),
        }
    }

    /// Forgets progress no call has claimed: a new connection numbers its progress tokens
    /// from the start again, so what an older one left must never reach a call of the new one.
    pub(super) fn connected(&self) {
        self.early.locked().clear();
        // A new connection numbers its requests from the start again: nothing an older one
        // left may reach a stream of the new one.
        let mut s = self.streams.locked();
        s.early.clear();
        s.closed.clear();
        // The older connection's streams are gone with it: their followers see their channel
        // end and open again (ids start over, so a route kept could take a new stream's).
        s.by_id.clear();
    }

    /// Progress and log messages dropped so far because their call's channel was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Hands `up` to a call's channel, never waiting: a call that does not drain it in time
    /// loses what does not fit (counted).
    fn hand(&self, to: &mpsc::Sender<Upward>, up: Upward) {
        if let Err(mpsc::error::TrySendError::Full(_)) = to.try_send(up) {
            let n = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            tracing::debug!(
                dropped = n,
                "an upstream's progress or log message found its call's channel full"
            );
        }
    }

    fn progress(&self, params: ProgressNotificationParam) {
        let waiting = self.waiting.locked();
        match waiting.get(&token_key(&params.progress_token)) {
            Some(to) => self.hand(to, Upward::Progress(params)),
            None => {
                let mut q = self.early.locked();
                if q.len() == MAX_EARLY {
                    q.pop_front();
                }
                q.push_back(params);
            }
        }
    }

    #[allow(deprecated)]
    fn log(&self, params: LoggingMessageNotificationParam) {
        let m = self.logs.locked();
        match m.live.as_slice() {
            [(_, only)] => self.hand(only, Upward::Log(params)),
            _ => tracing::debug!("an upstream log message with no one call to go to"),
        }
    }
}

impl Tap for Relay {
    fn outgoing(&self, message: &mut rmcp::service::TxJsonRpcMessage<RoleClient>) {
        if let JsonRpcMessage::Request(r) = message
            && self.contents
            && let rmcp::model::ClientRequest::SubscriptionsListenRequest(l) = &mut r.request
        {
            l.params
                .meta
                .get_or_insert_with(Default::default)
                .insert(crate::mcp::admission::CONTENTS.into(), true.into());
        }
    }

    fn seen(&self, message: &RxJsonRpcMessage<RoleClient>) {
        let JsonRpcMessage::Notification(n) = message else {
            return;
        };
        match &n.notification {
            ServerNotification::ProgressNotification(p) => self.progress(p.params.clone()),
            #[allow(deprecated)]
            ServerNotification::LoggingMessageNotification(l) => self.log(l.params.clone()),
            ServerNotification::CustomNotification(c) => self.stream_message(c),
            _ => {}
        }
    }
}

impl Relay {
    /// Sends the upstream's pushes of task `upstream_id` to `to`, shown under `shown_as`,
    /// until the returned route drops.
    pub fn route_task(&self, upstream_id: &str, shown_as: &str, to: &Arc<Relayed>) -> TaskRoute {
        let mut m = self.tasks.locked();
        m.next += 1;
        let key = m.next;
        m.by_id.entry(upstream_id.to_owned()).or_default().push((
            key,
            shown_as.to_owned(),
            Arc::downgrade(to),
        ));
        TaskRoute {
            id: upstream_id.to_owned(),
            key,
            tasks: self.tasks.clone(),
        }
    }

    /// Offers a task state (a push, or a `tasks/get`'s answer) to every route following it.
    pub fn offer_task(&self, task: rmcp::model::DetailedTask) {
        let to: Vec<(String, Arc<Relayed>)> = {
            let m = self.tasks.locked();
            m.by_id
                .get(&task.task.task_id)
                .into_iter()
                .flatten()
                .filter_map(|(_, shown_as, w)| Some((shown_as.clone(), w.upgrade()?)))
                .collect()
        };
        for (shown_as, relayed) in to {
            let mut t = task.clone();
            t.task.task_id = shown_as;
            relayed.offer(t);
        }
    }
}

impl Relay {
    /// Sends the upstream's log messages to `to` while the returned route is the only one
    /// (see the module's doc), until it drops.
    pub fn route_log(&self, to: mpsc::Sender<Upward>) -> LogRoute {
        let mut m = self.logs.locked();
        m.next += 1;
        let key = m.next;
        m.live.push((key, to));
        LogRoute {
            key,
            logs: self.logs.clone(),
        }
    }
}

impl Relay {
    /// Sends the messages of the `events/stream` whose request id is `id` to a new channel
    /// (those that came before this, early, first) until the returned route drops.
    pub fn route_stream(
        &self,
        id: &rmcp::model::RequestId,
    ) -> (StreamRoute, mpsc::Receiver<StreamMessage>) {
        let key = id_key(id);
        let (tx, rx) = mpsc::channel(STREAM_CAPACITY);
        let mut m = self.streams.locked();
        let (mine, rest): (VecDeque<_>, VecDeque<_>) =
            m.early.drain(..).partition(|(k, _)| *k == key);
        m.early = rest;
        m.closed.retain(|k| *k != key);
        for (_, msg) in mine {
            // A fresh channel as large as the early queue: it fits.
            let _ = tx.try_send(msg);
        }
        m.next += 1;
        let route = m.next;
        m.by_id.insert(key.clone(), (route, tx));
        (
            StreamRoute {
                id: key,
                key: route,
                streams: self.streams.clone(),
            },
            rx,
        )
    }

    /// Hands a `notifications/events/*` message to its stream's route, never waiting: a
    /// route whose reader fell [`STREAM_CAPACITY`] behind is closed (its follower sees the
    /// channel end and resumes from its cursor).
    fn stream_message(&self, c: &rmcp::model::CustomNotification) {
        let Some(kind) = c.method.strip_prefix("notifications/events/") else {
            return;
        };
        let Some(params) = c.params.clone() else {
            return;
        };
        let id = c
            .get_meta()
            .0
            .0
            .get(crate::mcp::listen::SUBSCRIPTION_ID)
            .cloned()
            .or_else(|| {
                params
                    .pointer("/_meta")
                    .and_then(|m| m.get(crate::mcp::listen::SUBSCRIPTION_ID))
                    .cloned()
            });
        let Some(key) = id.as_ref().and_then(json_key) else {
            return;
        };
        let msg = StreamMessage {
            kind: kind.to_owned(),
            params,
        };
        let mut m = self.streams.locked();
        match m.by_id.get(&key) {
            Some((_, to)) => {
                if to.try_send(msg).is_err() {
                    m.close(&key);
                }
            }
            None if m.closed.contains(&key) => {}
            None => {
                if m.early.len() == MAX_EARLY_STREAM {
                    m.early.pop_front();
                }
                m.early.push_back((key, msg));
            }
        }
    }
}

impl ClientHandler for Relay {
    fn get_info(&self) -> ClientConfig {
        client_config()
    }

    async fn on_task_status(
        &self,
        params: TaskStatusNotificationParams,
        _context: NotificationContext<RoleClient>,
    ) {
        self.offer_task(params.task);
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.lists.count(|e| e.tools += 1);
    }

    async fn on_prompt_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.lists.count(|e| e.prompts += 1);
    }
}
