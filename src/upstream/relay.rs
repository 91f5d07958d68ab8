//! [`Relay`]: the rmcp client handler of every upstream connection. It forwards an upstream's
//! progress notifications to the downstream caller waiting on that call (the gateway's tool
//! calls), and an upstream's task pushes to the [`Relayed`] state of that task (the gateway's
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
use std::sync::{Arc, Mutex};

use rmcp::ClientHandler;
#[allow(deprecated)]
use rmcp::model::LoggingMessageNotificationParam;
use rmcp::model::{
    ClientConfig, NumberOrString, ProgressNotificationParam, ProgressToken,
    TaskStatusNotificationParams,
};
use rmcp::service::{NotificationContext, RoleClient};

use crate::mcp::context::RoleContext;
use crate::mcp::source::{Log, Progress};
use crate::mcp::tasks::relay::Relayed;
use crate::transport::client::client_config;

/// Relays an upstream's progress notifications to the downstream caller waiting on that call.
#[derive(Clone, Default)]
pub struct Relay {
    waiting: Arc<Mutex<HashMap<String, Progress>>>,
    /// Progress that arrived before its call was registered (the request is on the wire before
    /// rmcp hands back its token); at most [`MAX_EARLY`], oldest dropped.
    early: Arc<Mutex<VecDeque<ProgressNotificationParam>>>,
    /// Where the flush of early progress runs; `None`: a plain task (a client role).
    ctx: Option<RoleContext>,
    /// Task pushes, by the upstream's task id: the id to show them under, and where they go.
    tasks: TaskRoutes,
    /// An older server's list changes, and each connect (see [`super::lists`]).
    pub(super) lists: super::ListSignal,
    /// The calls in flight that asked for log messages, by key.
    logs: Arc<Mutex<LogRoutes>>,
}

#[derive(Default)]
struct LogRoutes {
    next: u64,
    live: Vec<(u64, Log)>,
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

impl Relay {
    pub fn new(ctx: Option<RoleContext>) -> Relay {
        Relay {
            ctx,
            ..Relay::default()
        }
    }
}

const MAX_EARLY: usize = 64;

/// A registered progress relay; dropping it ends the relay.
pub struct Relaying {
    key: String,
    waiting: Arc<Mutex<HashMap<String, Progress>>>,
}

impl Drop for Relaying {
    fn drop(&mut self) {
        self.waiting.locked().remove(&self.key);
    }
}

fn token_key(t: &ProgressToken) -> String {
    match &t.0 {
        NumberOrString::Number(n) => format!("n:{n}"),
        NumberOrString::String(s) => format!("s:{s}"),
    }
}

impl Relay {
    /// Sends the upstream's progress for `token` to `to` until the returned guard drops.
    pub fn register(&self, token: ProgressToken, to: Progress) -> Relaying {
        let key = token_key(&token);
        self.waiting.locked().insert(key.clone(), to.clone());
        let early: Vec<ProgressNotificationParam> = {
            let mut q = self.early.locked();
            let (mine, rest): (Vec<_>, Vec<_>) = q
                .drain(..)
                .partition(|p| token_key(&p.progress_token) == key);
            q.extend(rest);
            mine
        };
        if !early.is_empty() {
            let flush = async move {
                for mut p in early {
                    p.progress_token = to.token.clone();
                    let _ = to.peer.notify_progress(p).await;
                }
            };
            match &self.ctx {
                Some(ctx) => drop(ctx.spawn_until_shutdown("early progress", flush)),
                None => drop(tokio::spawn(flush)),
            }
        }
        Relaying {
            key,
            waiting: self.waiting.clone(),
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
    pub fn route_log(&self, to: Log) -> LogRoute {
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

    #[allow(deprecated)] // logging is deprecated by SEP-2577, still in 2026-07-28
    async fn on_logging_message(
        &self,
        params: LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let to = {
            let m = self.logs.locked();
            match m.live.as_slice() {
                [(_, only)] => Some(only.clone()),
                _ => None,
            }
        };
        match to {
            Some(to) => {
                let logger = params.logger.as_deref().unwrap_or("");
                to.send(params.level, logger, params.data).await;
            }
            None => tracing::debug!("an upstream log message with no one call to go to"),
        }
    }

    async fn on_progress(
        &self,
        mut params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let to = self
            .waiting
            .locked()
            .get(&token_key(&params.progress_token))
            .cloned();
        match to {
            Some(to) => {
                params.progress_token = to.token.clone();
                let _ = to.peer.notify_progress(params).await;
            }
            None => {
                let mut q = self.early.locked();
                if q.len() == MAX_EARLY {
                    q.pop_front();
                }
                q.push_back(params);
            }
        }
    }
}
