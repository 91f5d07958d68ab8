//! `herald up`'s in-process roles (memo, file, k8s, slack): each built from its table on a
//! context of its own ([`RoleContext::for_stoppable_role`]) so a reload can stop it alone, and
//! served as a gateway slug of its name over an in-memory pipe (`upstream::local`). A role
//! whose NATS backend is not up yet is a deferred slug that starts it once it answers.

use std::sync::Arc;

use super::config::UpToml;
use crate::cli::memo::MemoOpenError;
use crate::cli::{Exit, usage};
use crate::mcp::limits::Limits;
use crate::mcp::server::SourceServer;
use crate::mcp::source::DynSource;
use crate::runtime::context::RoleContext;
use crate::source::slack::Slack;
use crate::store::Store;
use crate::transport::target::Target;
use crate::upstream::{Upstream, UpstreamConfig, local};

/// One running role.
pub(super) struct Role {
    pub name: &'static str,
    /// Its slug.
    pub up: Arc<Upstream>,
    /// The source, for `[publish]`'s catalog (`None` while it waits for its backend).
    pub source: Option<DynSource>,
    /// Slack only: whether it is live (configured) rather than inert.
    pub slack_live: Option<bool>,
    ctx: RoleContext,
}

impl Role {
    /// Stops it: its server ends its listens, its tasks end, its slug closes once the gateway
    /// lets go of it.
    pub fn stop(&self) {
        self.ctx.stop_alone();
    }

    /// Waits (at most `bound`) until its tasks have ended (its last writes to the store, its
    /// sockets closed); `false`, logged, when some still ran.
    pub async fn stopped(&self, bound: std::time::Duration) -> bool {
        let done = self.ctx.wait_stopped(bound).await;
        if !done {
            tracing::warn!(
                role = self.name,
                "the stopped role's tasks did not all end within {} s; its new self starts anyway",
                bound.as_secs()
            );
        }
        done
    }
}

/// How roles are built: the pipes' limits, the one store, the process's context.
pub(super) struct Roles {
    /// The limits of the in-process pipes (see `LOCAL_MAX_STREAMS`).
    pub local: Limits,
    pub store: Store,
    pub ctx: RoleContext,
    /// The demo runs Slack inert until configured, and its banner says so.
    pub demo: bool,
}

/// Whether role `name`'s table is the same in `a` and `b` (both absent counts).
pub(super) fn same_table(name: &str, a: &UpToml, b: &UpToml) -> bool {
    match name {
        "memo" => a.memo == b.memo,
        "file" => a.file == b.file,
        "k8s" => a.k8s == b.k8s,
        "slack" => a.slack == b.slack,
        _ => true,
    }
}

impl Roles {
    /// Every role `file` configures, in the order of [`super::config::ROLES`].
    pub async fn all(&self, file: &UpToml) -> Result<Vec<Role>, Exit> {
        let mut out = Vec::new();
        for name in file.roles() {
            out.extend(self.build(name, file).await?);
        }
        Ok(out)
    }

    /// Role `name` as `file` configures it (`None` when it does not).
    pub async fn build(&self, name: &'static str, file: &UpToml) -> Result<Option<Role>, Exit> {
        if !file.roles().contains(&name) {
            return Ok(None);
        }
        let ctx = self.ctx.for_stoppable_role(name);
        let max = self.local.max_message_bytes;
        let role = |up, source: Option<DynSource>, slack_live| Role {
            name,
            up,
            source,
            slack_live,
            ctx: ctx.clone(),
        };
        Ok(Some(match name {
            "memo" => {
                let m = file.memo.clone().unwrap_or_default();
                match m.open(&self.store, &ctx, max).await {
                    Ok(memo) => {
                        let memo: DynSource = Arc::new(memo);
                        role(
                            self.in_process(name, memo.clone(), &ctx).await,
                            Some(memo),
                            None,
                        )
                    }
                    Err(MemoOpenError::Failed(e)) => return Err(e),
                    // Its NATS backend is not up yet: memo starts once it is.
                    Err(MemoOpenError::NotYet(e)) => {
                        tracing::warn!(role = "memo", error = %e, "memo cannot start yet; trying again until its NATS backend answers");
                        let (c, st) = (ctx.clone(), self.store.clone());
                        let open = move || -> futures::future::BoxFuture<'static, Result<DynSource, String>> {
                            let (m, c, st) = (m.clone(), c.clone(), st.clone());
                            Box::pin(async move {
                                match m.open(&st, &c, max).await {
                                    Ok(memo) => Ok(Arc::new(memo) as DynSource),
                                    Err(MemoOpenError::NotYet(e)) => Err(e),
                                    Err(MemoOpenError::Failed(e)) => Err(format!("{:#}", e.error)),
                                }
                            })
                        };
                        role(self.deferred(name, open, &ctx), None, None)
                    }
                }
            }
            "file" => {
                let f = file.file.clone().unwrap_or_default();
                let src: DynSource = Arc::new(f.build(&ctx)?);
                role(
                    self.in_process(name, src.clone(), &ctx).await,
                    Some(src),
                    None,
                )
            }
            "k8s" => {
                let k = file.k8s.clone().unwrap_or_default();
                let src: DynSource = Arc::new(k.build(&ctx).await?);
                role(
                    self.in_process(name, src.clone(), &ctx).await,
                    Some(src),
                    None,
                )
            }
            _ => {
                let s = file.slack.clone().unwrap_or_default();
                let mut scfg = s.to_config().map_err(usage)?;
                scfg.inert_expected = self.demo;
                match Slack::open(scfg.clone(), self.store.clone(), &ctx).await {
                    Ok(src) => {
                        let live = src.configured();
                        let src: DynSource = Arc::new(src);
                        role(self.in_process(name, src, &ctx).await, None, Some(live))
                    }
                    // On NATS, a backend not up yet: Slack starts once it is.
                    Err(crate::source::slack::OpenError::Nats(e)) => {
                        tracing::warn!(role = "slack", error = %e, "slack cannot start yet; trying again until its NATS backend answers");
                        let (c, st) = (ctx.clone(), self.store.clone());
                        let open = move || -> futures::future::BoxFuture<'static, Result<DynSource, String>> {
                            let (scfg, c, st) = (scfg.clone(), c.clone(), st.clone());
                            Box::pin(async move {
                                let src = Slack::open(scfg, st, &c).await.map_err(|e| e.to_string())?;
                                Ok(Arc::new(src) as DynSource)
                            })
                        };
                        role(self.deferred(name, open, &ctx), None, None)
                    }
                    Err(e) => return Err(anyhow::anyhow!("{e}").into()),
                }
            }
        }))
    }

    /// A role's own server (its tasks kept in the store under its name, as a role on its own
    /// keeps them).
    async fn server_for(&self, name: &str, source: DynSource, ctx: &RoleContext) -> SourceServer {
        server_for(name, source, &self.local, ctx, &self.store).await
    }

    /// A role in this process as a gateway slug: its own server, dialled over a pipe.
    async fn in_process(&self, name: &str, source: DynSource, ctx: &RoleContext) -> Arc<Upstream> {
        let server = self.server_for(name, source, ctx).await;
        let cfg = local_config(name, ctx, self.local.max_message_bytes);
        Arc::new(local::upstream(cfg, server, ctx))
    }

    /// A role that could not start (its NATS backend did not answer): a slug that tries
    /// `open` again until it gives the source (`upstream::local::deferred`), never connected
    /// until then, so `/ready` waits for it and `/status` says why.
    fn deferred<F>(&self, name: &'static str, open: F, ctx: &RoleContext) -> Arc<Upstream>
    where
        F: Fn() -> futures::future::BoxFuture<'static, Result<DynSource, String>>
            + Send
            + Sync
            + 'static,
    {
        let (limits, ctx2, store) = (self.local.clone(), ctx.clone(), self.store.clone());
        let open = Arc::new(open);
        let build: local::Build = Arc::new(move || {
            let (open, limits, ctx, store) =
                (open.clone(), limits.clone(), ctx2.clone(), store.clone());
            Box::pin(async move {
                let source = open().await?;
                Ok(server_for(name, source, &limits, &ctx, &store).await)
            })
        });
        local::deferred(
            local_config(name, ctx, self.local.max_message_bytes),
            build,
            ctx,
        )
    }
}

/// A role's own server (its tasks kept in `store` under its name).
async fn server_for(
    name: &str,
    source: DynSource,
    limits: &Limits,
    ctx: &RoleContext,
    store: &Store,
) -> SourceServer {
    let tasks = crate::mcp::tasks::Tasks::open(ctx, Some(store.clone()), name).await;
    SourceServer::with_tasks(source, limits.clone(), ctx.shutdown().clone(), Some(tasks))
}

/// How the gateway reaches role `name` in this process.
fn local_config(name: &str, ctx: &RoleContext, max_message_bytes: usize) -> UpstreamConfig {
    UpstreamConfig {
        name: name.to_owned(),
        context: Some(ctx.clone()),
        // The server is in this process, with the pipe's own limit.
        max_listens: super::LOCAL_MAX_STREAMS,
        ..UpstreamConfig::new(
            Target::Stdio(format!("{}{name}", crate::transport::target::IN_PROCESS)),
            Default::default(),
            max_message_bytes,
        )
    }
}
