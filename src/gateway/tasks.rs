//! The gateway's tasks: a task-augmented call of `slug__tool` goes to the slug as one, and the
//! task it makes is shown as `slug__<its id>`, so one slug's id never reaches another's and
//! `tasks/*` route by the id alone. The gateway keeps who started each task it handed out
//! (its caller's principal, until the task's ttl): another caller cannot tell that task from
//! an unknown id, and a caller not entitled to the slug is refused with `-32024` whether the
//! task exists or not. A listen's `taskIds` are relayed like its URIs: one upstream listen per
//! watched task, shared by every stream watching it, that ends once the task has.

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

use crate::gateway::config::valid_slug;
use crate::gateway::source::Access;
use crate::mcp::context::RoleContext;
use crate::mcp::server::to_mcp_error;
use crate::mcp::source::{Caller, Progress, SourceError};
use crate::mcp::tasks::relay::{Relayed, RelayedListen, Started, TaskRelay, Watched};
use crate::mcp::tasks::{DEFAULT_TTL, MAX_TASKS, MAX_TASKS_PER_OWNER, unknown_task};
use crate::mcp::upstream::{REQUEST_TIMEOUT, Upstream};

/// The gateway's relayed tasks.
pub(crate) struct GatewayTasks {
    access: Arc<Access>,
    ctx: RoleContext,
    /// Who started each task handed out, by its gateway id, until its ttl.
    owners: Owners,
    /// The running upstream listen of each watched task, by gateway id.
    relays: Mutex<HashMap<String, Weak<Relaying>>>,
}

type Owners = Arc<Mutex<HashMap<String, Owner>>>;

/// Whether `principal` started task `id` (and its ttl has not passed).
fn owns(owners: &Owners, principal: &str, id: &str) -> bool {
    let now = Instant::now();
    owners
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(id)
        .is_some_and(|o| o.principal == principal && o.expires > now)
}

struct Owner {
    principal: String,
    expires: Instant,
}

/// One watched task's upstream listen, shared by the streams watching it; the last one
/// dropped stops it.
struct Relaying {
    relayed: Arc<Relayed>,
    stop: CancellationToken,
    slug: String,
}

impl Drop for Relaying {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// `slug__id` → (`slug`, `id`).
fn split(id: &str) -> Option<(&str, &str)> {
    id.split_once("__")
        .filter(|(slug, rest)| valid_slug(slug) && !rest.is_empty())
}

impl GatewayTasks {
    pub(crate) fn new(access: Arc<Access>, ctx: &RoleContext) -> GatewayTasks {
        GatewayTasks {
            access,
            ctx: ctx.clone(),
            owners: Arc::new(Mutex::new(HashMap::new())),
            relays: Mutex::new(HashMap::new()),
        }
    }

    fn owners(&self) -> std::sync::MutexGuard<'_, HashMap<String, Owner>> {
        self.owners.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps `id` as `principal`'s until its ttl. Past the caps, expired entries go first,
    /// then the soonest to expire (the caller's own, then anyone's).
    fn own(&self, principal: &str, id: &str, ttl: Duration) {
        let now = Instant::now();
        let mut o = self.owners();
        o.retain(|_, v| v.expires > now);
        let mine = o.values().filter(|v| v.principal == principal).count();
        if mine >= MAX_TASKS_PER_OWNER || o.len() >= MAX_TASKS {
            let only_mine = mine >= MAX_TASKS_PER_OWNER;
            let soonest = o
                .iter()
                .filter(|(_, v)| !only_mine || v.principal == principal)
                .min_by_key(|(_, v)| v.expires)
                .map(|(k, _)| k.clone());
            if let Some(k) = soonest {
                o.remove(&k);
            }
        }
        o.insert(
            id.to_owned(),
            Owner {
                principal: principal.to_owned(),
                expires: now + ttl,
            },
        );
    }

    /// The slug and the slug's own id of task `id`, for `caller`: `-32024` when the caller
    /// may not use the slug (the same whether it exists or not), `-32602` when the task is not
    /// one this caller started here.
    fn resolve<'a>(
        &self,
        caller: &Caller,
        id: &'a str,
    ) -> Result<(Arc<Upstream>, &'a str), McpError> {
        let Some((slug, upstream_id)) = split(id) else {
            return Err(unknown_task(id));
        };
        let up = self.access.slug(caller, slug).map_err(to_mcp_error)?;
        if !owns(&self.owners, &caller.principal(), id) {
            return Err(unknown_task(id));
        }
        Ok((up, upstream_id))
    }

    /// Asks the slug, mapping its "unknown task" to the gateway's id.
    async fn ask(
        &self,
        up: &Arc<Upstream>,
        id: &str,
        req: ClientRequest,
    ) -> Result<ServerResult, McpError> {
        match up.request_declaring_tasks(req, REQUEST_TIMEOUT).await {
            Ok(r) => Ok(r),
            Err(SourceError::Upstream { code, .. })
                if code == rmcp::model::ErrorCode::INVALID_PARAMS.0 =>
            {
                // The slug forgot it (its ttl passed there): so does the gateway.
                self.owners().remove(id);
                Err(unknown_task(id))
            }
            Err(e) => Err(to_mcp_error(e)),
        }
    }

    /// Starts (or joins) the upstream listen of task `id` on `up`.
    fn relay(&self, up: Arc<Upstream>, id: &str, upstream_id: &str) -> Option<Arc<Relaying>> {
        let mut relays = self.relays.lock().unwrap_or_else(|e| e.into_inner());
        relays.retain(|_, w| w.strong_count() > 0);
        if let Some(r) = relays.get(id).and_then(Weak::upgrade) {
            return Some(r);
        }
        // Each is a listen stream on the slug's one connection, as a watched URI is.
        let per_slug = relays
            .values()
            .filter_map(Weak::upgrade)
            .filter(|r| r.slug == up.name)
            .count();
        if per_slug >= up.max_listens {
            tracing::info!(slug = %up.name, task = %id, "too many watched tasks on this server; leaving one out of a listen");
            return None;
        }
        let r = Arc::new(Relaying {
            relayed: Relayed::new(),
            stop: self.ctx.shutdown().child_token(),
            slug: up.name.clone(),
        });
        self.ctx.spawn(
            "gateway task relay",
            crate::mcp::upstream::follow_task(
                up,
                upstream_id.to_owned(),
                id.to_owned(),
                r.relayed.clone(),
                r.stop.clone(),
            ),
        );
        relays.insert(id.to_owned(), Arc::downgrade(&r));
        Some(r)
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
        _progress: Option<Progress>,
    ) -> Result<Started, McpError> {
        let Some((slug, tool)) = name.split_once("__") else {
            return Err(to_mcp_error(SourceError::UnknownTool(format!(
                "{name} (gateway tools are named server__tool)"
            ))));
        };
        let up = self.access.slug(caller, slug).map_err(to_mcp_error)?;
        let params = CallToolRequestParams::new(tool.to_owned()).with_arguments(args);
        let answer = up
            .request_declaring_tasks(
                ClientRequest::CallToolRequest(rmcp::model::Request::new(params)),
                REQUEST_TIMEOUT,
            )
            .await
            .map_err(to_mcp_error)?;
        match answer {
            ServerResult::CreateTaskResult(t) => {
                let mut task = t.task;
                let id = format!("{slug}__{}", task.task_id);
                let ttl = task
                    .ttl_ms
                    .map_or(DEFAULT_TTL, Duration::from_millis)
                    .min(DEFAULT_TTL * 24);
                self.own(&caller.principal(), &id, ttl);
                task.task_id = id;
                Ok(Started::Task(task))
            }
            ServerResult::CallToolResult(r) => Ok(Started::Done(r)),
            _ => Err(McpError::internal_error(
                format!(
                    "server {slug} answered the call with something other than a result or a task"
                ),
                None,
            )),
        }
    }

    async fn get(&self, caller: &Caller, id: &str) -> Result<DetailedTask, McpError> {
        let (up, upstream_id) = self.resolve(caller, id)?;
        let req = ClientRequest::GetTaskRequest(rmcp::model::GetTaskRequest::new(
            GetTaskParams::new(upstream_id.to_owned()),
        ));
        match self.ask(&up, id, req).await? {
            ServerResult::GetTaskResult(r) => Ok(shown(r.task, id)),
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
        let (up, upstream_id) = self.resolve(caller, id)?;
        let req = ClientRequest::UpdateTaskRequest(rmcp::model::UpdateTaskRequest::new(
            UpdateTaskParams::new(upstream_id.to_owned(), responses),
        ));
        self.ask(&up, id, req).await.map(|_| ())
    }

    async fn cancel(&self, caller: &Caller, id: &str) -> Result<(), McpError> {
        let (up, upstream_id) = self.resolve(caller, id)?;
        let req = ClientRequest::CancelTaskRequest(rmcp::model::CancelTaskRequest::new(
            CancelTaskParams::new(upstream_id.to_owned()),
        ));
        self.ask(&up, id, req).await.map(|_| ())
    }

    fn listen(&self, caller: &Caller, ids: &[String]) -> RelayedListen {
        let principal = caller.principal();
        let mut seen = std::collections::BTreeSet::new();
        let mut watched = Vec::new();
        for id in ids {
            if !seen.insert(id.as_str()) {
                continue;
            }
            // Only what this caller could tasks/get now; the rest left out without a word.
            let Ok((up, upstream_id)) = self.resolve(caller, id) else {
                continue;
            };
            let Some(r) = self.relay(up, id, upstream_id) else {
                continue;
            };
            watched.push(Watched {
                id: id.clone(),
                relayed: r.relayed.clone(),
                keep: r,
            });
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
