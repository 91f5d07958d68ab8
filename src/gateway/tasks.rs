//! The gateway's tasks: a task-augmented call of `slug__tool` goes to the slug as one, and the
//! task it makes is shown as `slug__<its id>`, so one slug's id never reaches another's and
//! `tasks/*` route by the id alone. The gateway keeps who started each task it handed out
//! (its caller's principal, until the task's ttl): another caller cannot tell that task from
//! an unknown id, and a caller not entitled to the slug is refused with `-32024` whether the
//! task exists or not. A listen's `taskIds` are relayed: one upstream listen per stream and
//! slug (however many of its tasks the stream names), ended with the stream or once its tasks
//! have; each task's latest state is shared by every stream watching it.

use crate::sync::Recover;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use rmcp::model::{
    CallToolRequestParams, CancelTaskParams, ClientRequest, DetailedTask, ErrorData as McpError,
    GetTaskParams, InputResponses, JsonObject, ServerResult, UpdateTaskParams,
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::gateway::access::Access;
use crate::gateway::config::valid_slug;
use crate::gateway::names::Names;
use crate::gateway::owners::{Keep, MAX_OWNED_FOR, OWNER_GRACE, Row};
use crate::mcp::ring::now_ms;
use crate::mcp::server::to_mcp_error;
use crate::mcp::source::{Call, Caller, SourceError};
use crate::mcp::tasks::relay::{Relayed, RelayedListen, Watched};
use crate::mcp::tasks::relaying::{Started, TaskRelay};
use crate::mcp::tasks::{MAX_TASKS, MAX_TASKS_PER_OWNER, unknown_task};
use crate::runtime::context::RoleContext;
use crate::upstream::{REQUEST_TIMEOUT, Upstream, UpstreamError};

/// The gateway's relayed tasks.
pub(crate) struct GatewayTasks {
    access: Arc<Access>,
    ctx: RoleContext,
    /// Who started each task handed out, by its gateway id, until its ttl.
    owners: Owners,
    /// The latest known state of each watched task, by gateway id, shared by every stream
    /// watching it (a new stream starts from it).
    states: Mutex<HashMap<String, Weak<Relayed>>>,
    /// Upstream task listens running now, per slug.
    following: Arc<Mutex<HashMap<String, usize>>>,
    /// The gateway's watched URIs on a slug: they share its listen budget with the tasks.
    uris: Arc<dyn Fn(&str) -> usize + Send + Sync>,
    /// Where the owners are kept beyond memory (the store, or NATS for replicas).
    keep: std::sync::OnceLock<Keep>,
}

type Owners = Arc<Mutex<HashMap<String, Owner>>>;

/// Whether `principal` started task `id` (and its ttl has not passed).
fn owns(owners: &Owners, principal: &str, id: &str) -> bool {
    let now = Instant::now();
    owners
        .locked()
        .get(id)
        .is_some_and(|o| o.principal == principal && o.expires > now)
}

struct Owner {
    principal: String,
    expires: Instant,
    /// When it started (the oldest ended task makes way at a cap).
    started: Instant,
    /// Seen ended (a push, or a tasks/get answer).
    ended: bool,
}

/// Marks task `id` ended in `owners`.
fn mark_ended(owners: &Owners, id: &str) {
    if let Some(o) = owners.locked().get_mut(id) {
        o.ended = true;
    }
}

/// One upstream listen following a stream's tasks on one slug; dropped with the stream,
/// which stops it.
struct Following {
    stop: CancellationToken,
}

impl Drop for Following {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// A slug's listen counted for as long as its follow runs (not the stream's life: a follow
/// whose tasks have ended gives its slot back).
struct Slot {
    slug: String,
    counts: Arc<Mutex<HashMap<String, usize>>>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut c = self.counts.locked();
        if let Some(n) = c.get_mut(&self.slug) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                c.remove(&self.slug);
            }
        }
    }
}

/// A task's gateway id and its slug's id for it.
type IdPair = (String, String);

/// `slug__id` → (`slug`, `id`).
pub(super) fn split(id: &str) -> Option<(&str, &str)> {
    id.split_once("__")
        .filter(|(slug, rest)| valid_slug(slug) && !rest.is_empty())
}

impl GatewayTasks {
    pub(crate) fn new(
        access: Arc<Access>,
        ctx: &RoleContext,
        uris: Arc<dyn Fn(&str) -> usize + Send + Sync>,
    ) -> GatewayTasks {
        GatewayTasks {
            access,
            ctx: ctx.clone(),
            owners: Arc::new(Mutex::new(HashMap::new())),
            states: Mutex::new(HashMap::new()),
            following: Arc::default(),
            uris,
            keep: std::sync::OnceLock::new(),
        }
    }

    /// Keeps the owners in `keep` too (set once, before serving).
    pub(crate) fn keep_in(&self, keep: Keep) {
        let _ = self.keep.set(keep);
    }

    fn keep(&self) -> &Keep {
        self.keep.get().unwrap_or(&Keep::Memory)
    }

    /// Upstream task listens on `slug` now.
    pub(crate) fn following(&self, slug: &str) -> usize {
        self.following.locked().get(slug).copied().unwrap_or(0)
    }

    /// The shared state of task `id`, made when nobody watches it yet.
    fn state(&self, id: &str) -> Arc<Relayed> {
        let mut states = self.states.locked();
        if let Some(r) = states.get(id).and_then(Weak::upgrade) {
            return r;
        }
        if states.len() >= 1024 {
            states.retain(|_, w| w.strong_count() > 0);
        }
        let r = Relayed::new();
        // Its end marks the task ended for the caps.
        let owners = Arc::downgrade(&self.owners);
        let key = id.to_owned();
        r.on_end(Box::new(move || {
            if let Some(o) = owners.upgrade() {
                mark_ended(&o, &key);
            }
        }));
        states.insert(id.to_owned(), Arc::downgrade(&r));
        r
    }

    fn owners(&self) -> std::sync::MutexGuard<'_, HashMap<String, Owner>> {
        self.owners.locked()
    }

    /// Whether `principal` may start one more task here: past the caps (counting only tasks
    /// whose time has not passed) the call is refused before it reaches the slug.
    fn room(&self, principal: &str) -> Result<(), McpError> {
        let now = Instant::now();
        let mut o = self.owners();
        o.retain(|_, v| v.expires > now);
        // Past a cap the oldest ended task (of this caller, then of anyone) makes way; when
        // every one kept still runs, the call is refused.
        let oldest_ended = |o: &HashMap<String, Owner>, only: Option<&str>| {
            o.iter()
                .filter(|(_, v)| v.ended && only.is_none_or(|p| v.principal == p))
                .min_by_key(|(_, v)| v.started)
                .map(|(k, _)| k.clone())
        };
        // (Calls in flight may have taken the count past a cap: make way down to it.)
        while o.values().filter(|v| v.principal == principal).count() >= MAX_TASKS_PER_OWNER
            && let Some(k) = oldest_ended(&o, Some(principal))
        {
            o.remove(&k);
        }
        while o.len() >= MAX_TASKS
            && let Some(k) = oldest_ended(&o, None)
        {
            o.remove(&k);
        }
        if o.values().filter(|v| v.principal == principal).count() >= MAX_TASKS_PER_OWNER {
            return Err(McpError::internal_error(
                format!(
                    "you have {MAX_TASKS_PER_OWNER} tasks through this gateway; wait for some to expire, or call without the tasks extension"
                ),
                None,
            ));
        }
        if o.len() >= MAX_TASKS {
            return Err(McpError::internal_error(
                format!(
                    "this gateway holds {MAX_TASKS} tasks already; try again later, or call without the tasks extension"
                ),
                None,
            ));
        }
        Ok(())
    }

    /// Keeps `id` as `principal`'s until its ttl, and a grace after it (the slug's last push,
    /// the failure at its ttl, still reaches the caller): in memory, and where the owners are
    /// kept, before the caller learns the id (so another replica knows it at once).
    async fn own(&self, principal: &str, id: &str, ttl: Duration) {
        let now = Instant::now();
        self.owners().insert(
            id.to_owned(),
            Owner {
                principal: principal.to_owned(),
                expires: now + ttl + OWNER_GRACE,
                started: now,
                ended: false,
            },
        );
        self.keep()
            .put(id, &Row::new(principal, ttl + OWNER_GRACE))
            .await;
    }

    /// Whether `principal` started task `id`: known here, or kept by another replica (or by
    /// this one before a restart), and then known here from now on.
    async fn owned(&self, principal: &str, id: &str) -> bool {
        // Known here (whoever's): what this replica knows stands.
        if self.owners().contains_key(id) {
            return owns(&self.owners, principal, id);
        }
        if !self.keep().shared() {
            return false;
        }
        let Some(row) = self.keep().get(id).await else {
            return false;
        };
        if !row.owned_by(principal) {
            return false;
        }
        let left = row.expires_ms.saturating_sub(now_ms());
        let now = Instant::now();
        self.owners().insert(
            id.to_owned(),
            Owner {
                principal: principal.to_owned(),
                expires: now + Duration::from_millis(left),
                started: now,
                ended: row.ended,
            },
        );
        true
    }

    /// The slug and the slug's own id of task `id`, for `caller`: `-32024` when the caller
    /// may not use the slug (the same whether it exists or not), `-32602` when the task is not
    /// one this caller started here.
    async fn resolve<'a>(
        &self,
        caller: &Caller,
        id: &'a str,
    ) -> Result<(Arc<Upstream>, &'a str), McpError> {
        let Some((slug, upstream_id)) = split(id) else {
            return Err(unknown_task(id));
        };
        let up = self.access.slug(caller, slug).map_err(to_mcp_error)?;
        if !self.owned(&caller.principal(), id).await {
            return Err(unknown_task(id));
        }
        Ok((up, upstream_id))
    }

    /// Asks the slug, mapping its "unknown task" (a `-32602` naming that task in
    /// `data.taskId`) to the gateway's id.
    async fn ask(
        &self,
        up: &Arc<Upstream>,
        id: &str,
        upstream_id: &str,
        req: ClientRequest,
    ) -> Result<ServerResult, McpError> {
        match up.tasks_request(req, REQUEST_TIMEOUT, None).await {
            Ok(r) => Ok(r),
            Err(UpstreamError::Rejected { data, .. })
                if data
                    .as_ref()
                    .and_then(|d| d.get("taskId"))
                    .is_some_and(|t| t == upstream_id) =>
            {
                // The slug forgot it (its ttl passed there): so does the gateway.
                self.owners().remove(id);
                self.keep().delete(id).await;
                Err(unknown_task(id))
            }
            Err(e) => Err(to_mcp_error(e.into())),
        }
    }

    /// Starts one upstream listen following `tasks` (gateway id, the slug's id) on `up`, for
    /// one stream; `None` when the slug has no listen to spare.
    fn follow(
        &self,
        up: Arc<Upstream>,
        tasks: &[(String, String)],
    ) -> Option<(Arc<Following>, Vec<Arc<Relayed>>)> {
        let states: Vec<Arc<Relayed>> = tasks.iter().map(|(id, _)| self.state(id)).collect();
        let following = Arc::new(Following {
            stop: self.ctx.shutdown().child_token(),
        });
        // Tasks that have all ended need no listen: their states are here already.
        if states.iter().all(|r| r.ended().is_cancelled()) {
            return Some((following, states));
        }
        // Each is a listen stream on the slug's one connection, as a watched URI is. The URI
        // count is read first: no lock is ever held while taking another.
        let uris = (self.uris)(&up.name);
        {
            let mut counts = self.following.locked();
            let n = counts.get(&up.name).copied().unwrap_or(0);
            if n + uris >= up.max_listens {
                tracing::info!(slug = %up.name, tasks = tasks.len(), "no listen to spare on this server; leaving its tasks out of a listen");
                return None;
            }
            counts.insert(up.name.clone(), n + 1);
        }
        let slot = Slot {
            slug: up.name.clone(),
            counts: self.following.clone(),
        };
        let followed = tasks
            .iter()
            .zip(&states)
            .map(|((id, upstream_id), r)| (upstream_id.clone(), id.clone(), r.clone()))
            .collect();
        let stop = following.stop.clone();
        self.ctx.spawn("gateway task follow", async move {
            let _slot = slot;
            crate::upstream::follow_tasks(up, followed, stop).await;
        });
        Some((following, states))
    }
}

/// Shows an upstream task under the gateway's id.
fn shown(mut task: DetailedTask, id: &str) -> DetailedTask {
    task.task.task_id = id.to_owned();
    task
}

#[async_trait]
impl TaskRelay for GatewayTasks {
    async fn call(
        &self,
        caller: &Caller,
        name: &str,
        args: JsonObject,
        mut call: Call,
    ) -> Result<Started, McpError> {
        let Some(route) = self.access.route_name(caller, name, Names::Tools) else {
            return Err(to_mcp_error(SourceError::UnknownTool(format!(
                "{name} (gateway tools are named server__tool)"
            ))));
        };
        let (up, tool) = route.map_err(to_mcp_error)?;
        self.access
            .may_call(caller, &up, &tool)
            .map_err(to_mcp_error)?;
        let slug = up.name.as_str();
        self.access
            .open_state(caller, slug, &mut call.input)
            .map_err(to_mcp_error)?;
        self.room(&caller.principal())?;
        let mut params = CallToolRequestParams::new(tool.to_owned()).with_arguments(args);
        // The caller's SEP-2322 answers, when the slug asked for input before its task.
        params.input_responses = call.input.responses;
        params.request_state = call.input.request_state;
        // The caller's own capabilities (an upstream's input rounds before its task ask only
        // for what the caller can give), with the extension.
        let answer = up
            .tasks_request(
                ClientRequest::CallToolRequest(rmcp::model::Request::new(params)),
                REQUEST_TIMEOUT,
                call.capabilities.as_ref(),
            )
            .await
            .map_err(|e| to_mcp_error(e.into()))?;
        match answer {
            ServerResult::CreateTaskResult(t) => {
                let mut task = t.task;
                let id = format!("{slug}__{}", task.task_id);
                // No ttl (kept as long as the slug likes): a day here, as the longest.
                let ttl = task
                    .ttl_ms
                    .map_or(MAX_OWNED_FOR, Duration::from_millis)
                    .min(MAX_OWNED_FOR);
                self.own(&caller.principal(), &id, ttl).await;
                task.task_id = id;
                Ok(Started::Task(task))
            }
            ServerResult::CallToolResult(r) => Ok(Started::Done(r)),
            ServerResult::InputRequiredResult(r) => Ok(Started::InputRequired(
                self.access.seal_state(caller, slug, r),
            )),
            _ => Err(McpError::internal_error(
                format!(
                    "server {slug} answered the call with something other than a result or a task"
                ),
                None,
            )),
        }
    }

    async fn get(&self, caller: &Caller, id: &str) -> Result<DetailedTask, McpError> {
        let (up, upstream_id) = self.resolve(caller, id).await?;
        let req = ClientRequest::GetTaskRequest(rmcp::model::GetTaskRequest::new(
            GetTaskParams::new(upstream_id.to_owned()),
        ));
        match self.ask(&up, id, upstream_id, req).await? {
            ServerResult::GetTaskResult(r) => {
                if r.task.status().is_terminal() {
                    mark_ended(&self.owners, id);
                }
                Ok(shown(r.task, id))
            }
            _ => Err(McpError::internal_error(
                format!("server {} answered tasks/get with something else", up.name),
                None,
            )),
        }
    }

    async fn update(
        &self,
        caller: &Caller,
        id: &str,
        responses: InputResponses,
    ) -> Result<(), McpError> {
        let (up, upstream_id) = self.resolve(caller, id).await?;
        let req = ClientRequest::UpdateTaskRequest(rmcp::model::UpdateTaskRequest::new(
            UpdateTaskParams::new(upstream_id.to_owned(), responses),
        ));
        self.ask(&up, id, upstream_id, req).await.map(|_| ())
    }

    async fn cancel(&self, caller: &Caller, id: &str) -> Result<(), McpError> {
        let (up, upstream_id) = self.resolve(caller, id).await?;
        let req = ClientRequest::CancelTaskRequest(rmcp::model::CancelTaskRequest::new(
            CancelTaskParams::new(upstream_id.to_owned()),
        ));
        self.ask(&up, id, upstream_id, req).await.map(|_| ())
    }

    async fn listen(&self, caller: &Caller, ids: &[String]) -> RelayedListen {
        let principal = caller.principal();
        let mut seen = std::collections::BTreeSet::new();
        let unique: Vec<&String> = ids.iter().filter(|id| seen.insert(id.as_str())).collect();
        // Resolved together (a keep read each, at most, for ids this replica has not seen).
        let resolved =
            futures::future::join_all(unique.iter().map(|id| self.resolve(caller, id))).await;
        // Only what this caller could tasks/get now, by slug; the rest left out without a word.
        let mut by_slug: Vec<(Arc<Upstream>, Vec<IdPair>)> = Vec::new();
        for (id, r) in unique.into_iter().zip(resolved) {
            let Ok((up, upstream_id)) = r else {
                continue;
            };
            let pair = (id.clone(), upstream_id.to_owned());
            match by_slug.iter_mut().find(|(u, _)| Arc::ptr_eq(u, &up)) {
                Some((_, v)) => v.push(pair),
                None => by_slug.push((up, vec![pair])),
            }
        }
        // One upstream listen per slug for this stream, however many of its tasks it names.
        let mut watched = Vec::new();
        for (up, tasks) in by_slug {
            let Some((following, states)) = self.follow(up, &tasks) else {
                continue;
            };
            for ((id, _), relayed) in tasks.into_iter().zip(states) {
                watched.push(Watched {
                    id,
                    relayed,
                    keep: following.clone(),
                });
            }
        }
        // Checked again at every delivery: the caller still owns the task, and may still use
        // its slug.
        let (access, owners, caller) = (self.access.clone(), self.owners.clone(), caller.clone());
        let check = Arc::new(move |id: &str| {
            split(id).is_some_and(|(slug, _)| access.slug(&caller, slug).is_ok())
                && owns(&owners, &principal, id)
        });
        RelayedListen::new(watched, check)
    }
}
