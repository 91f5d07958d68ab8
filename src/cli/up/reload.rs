//! `herald up`'s reload ([`crate::app::reload`]): the config file read again and checked as
//! `herald check` (and the start) checks it, then the difference applied, in this order:
//!
//! 1. A role whose table changed (or that goes) stops, and its tasks are waited for (it
//!    shares the store, and Slack one socket, with its new self); the changed and new ones are
//!    built. One that cannot start brings every stopped role back as it was and refuses the
//!    reload, nothing else applied.
//! 2. The watch client stops the watches that go or change (quietly, before their slug goes).
//! 3. The gateway takes the new roles, slugs and tokens at once (`Gateway::apply`: unchanged
//!    slugs keep their connections and their clients' streams; streams that lost access end).
//! 4. The watch client keeps the new and changed watches; every unchanged one, and its
//!    baseline, is left alone.
//!
//! What cannot change live (`[listen]`, `[publish]`, `[notify]`) refuses the reload with a
//! message saying a restart is needed.

use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use super::config::{UpConfig, UpToml};
use super::roles::{Role, Roles, same_table};
use crate::cli::gateway::{apply_slugs, describe, restart_needed};
use crate::filter::pool::{FilterPool, PoolConfig};
use crate::gateway::Gateway;
use crate::gateway::config::GatewayConfig;
use crate::mcp::limits::Limits;
use crate::runtime::context::RoleContext;
use crate::watch::WatchSpec;
use crate::watch::manager::WatchManager;

/// The flags laid over the config's `[listen]` (they win on reload too).
#[derive(Debug, Clone, Default)]
pub(super) struct ListenFlags {
    pub http: Option<String>,
    pub quic: Option<String>,
    pub admin: Option<String>,
}

impl ListenFlags {
    pub fn lay_over(&self, toml: &mut UpToml) {
        if let Some(h) = &self.http {
            toml.listen.http = Some(h.clone());
        }
        if let Some(q) = &self.quic {
            toml.listen.quic = Some(q.clone());
        }
        if let Some(a) = &self.admin {
            toml.listen.admin = Some(a.clone());
        }
    }
}

/// What a reload asks of the watch client, in two steps around the gateway's change: first
/// stop the watches that go or change (before their slug may go: they end quietly, never as
/// streams a reload cut), then start the ones that come or changed. `specs` is every watch the
/// config runs (and any the start added); the answer is one line per change.
pub(super) struct WatchReload {
    start: bool,
    specs: Vec<WatchSpec>,
    reply: oneshot::Sender<Vec<String>>,
}

pub(super) struct UpReload {
    /// The config file (`None`: the demo, which has none to read again).
    pub path: Option<PathBuf>,
    pub flags: ListenFlags,
    pub running: UpConfig,
    pub roles: Vec<Role>,
    pub builder: Roles,
    pub gateway: Arc<Gateway>,
    /// The `[[slug]]` servers' limits, context and connect timeout (as at the start).
    pub slug_limits: Limits,
    pub gctx: RoleContext,
    pub handshake_timeout: std::time::Duration,
    /// Watches the start added beside the config's (the demo's Slack watch).
    pub extra_watches: Vec<WatchSpec>,
    /// `[publish]`: its catalog is written again when roles change.
    pub published: Option<Arc<crate::nats::events::PublisherHandle>>,
    pub watches: mpsc::Sender<WatchReload>,
}

/// The gateway's part of an up config.
fn gateway_config(cfg: &UpConfig) -> GatewayConfig {
    GatewayConfig {
        http: None,
        quic: None,
        open_to_loopback: cfg.tokenless(),
        slugs: cfg.slugs.clone(),
        tokens: cfg.tokens.clone(),
        issuers: cfg.issuers.clone(),
        // (herald up compares its [events] itself: a change needs a restart.)
        events: Default::default(),
    }
}

/// The error's whole chain on one line.
fn said(e: crate::cli::Exit) -> String {
    format!("{:#}", e.error)
}

impl UpReload {
    /// The new config, checked; or why it cannot be applied.
    async fn next(&self) -> Result<UpConfig, String> {
        let Some(path) = &self.path else {
            return Err(
                "herald up runs the demo, which has no config file to read again; run herald up --config FILE to reload one".into(),
            );
        };
        let mut toml = UpToml::load(path).map_err(|e| format!("{e:#}"))?;
        self.flags.lay_over(&mut toml);
        let mut next = toml.check().map_err(|e| format!("{e:#}"))?;
        for slug in &mut next.slugs {
            slug.handshake_timeout = self.handshake_timeout;
        }
        let k8s_changed = self.running.file.k8s != next.file.k8s;
        crate::cli::check::up_parts(path, &next, k8s_changed)
            .await
            .map_err(said)?;
        let (now, new) = (&self.running, &next);
        let opt = |s: Option<&str>| s.map(str::to_owned);
        restart_needed("[listen] http", &opt(now.http()), &opt(new.http()))?;
        restart_needed("[listen] quic", &opt(now.quic()), &opt(new.quic()))?;
        restart_needed("[listen] admin", &opt(now.admin()), &opt(new.admin()))?;
        let (a, b) = (&now.file, &new.file);
        for (what, same) in [
            (
                "[listen] allowed_hosts",
                a.listen.allowed_hosts == b.listen.allowed_hosts,
            ),
            (
                "[listen] allowed_origins",
                a.listen.allowed_origins == b.listen.allowed_origins,
            ),
            ("[publish]", a.publish == b.publish),
            ("[events]", a.events == b.events),
            ("[notify]", a.notify == b.notify),
        ] {
            if !same {
                return Err(format!(
                    "{what} changed: it cannot change live, restart herald up to apply it"
                ));
            }
        }
        Ok(next)
    }
}

/// What a reload does to one role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Change {
    Added,
    Changed,
    Removed,
}

impl UpReload {
    /// Builds `names` as `file` configures them; on the first that cannot start, stops the
    /// ones built and says which and why.
    async fn build(&self, names: &[&'static str], file: &UpToml) -> Result<Vec<Role>, String> {
        let mut built = Vec::new();
        for &name in names {
            match self.builder.build(name, file).await {
                Ok(Some(role)) => built.push(role),
                Ok(None) => {}
                Err(e) => {
                    built.iter().for_each(Role::stop);
                    return Err(format!("[{name}] cannot start: {}", said(e)));
                }
            }
        }
        Ok(built)
    }

    /// Asks the watch client for one step of the watches' change ([`WatchReload`]).
    async fn watches(&self, start: bool, specs: &[WatchSpec]) -> Vec<String> {
        let (reply, heard) = oneshot::channel();
        let ask = WatchReload {
            start,
            specs: specs.to_vec(),
            reply,
        };
        match self.watches.send(ask).await {
            Ok(()) => heard.await.unwrap_or_default(),
            Err(_) => Vec::new(),
        }
    }

    /// `[publish]`'s catalog, written again for `roles`.
    async fn catalog(&self, roles: &[Role]) {
        if let Some(p) = &self.published {
            let all: Vec<&dyn crate::mcp::source::Source> =
                roles.iter().filter_map(|r| r.source.as_deref()).collect();
            p.catalog_of(&all).await;
        }
    }

    /// The gateway takes `roles` and `slugs` with `cfg`'s tokens.
    async fn apply(&self, roles: &[Role], cfg: &UpConfig) -> crate::gateway::source::Reconfigured {
        let mut ups: Vec<_> = roles.iter().map(|r| r.up.clone()).collect();
        ups.extend(apply_slugs(
            &self.gateway,
            &self.running.slugs,
            &cfg.slugs,
            &self.slug_limits,
            &self.gctx,
            &self.builder.store,
        ));
        self.gateway
            .apply(ups, &gateway_config(cfg), crate::cli::gateway::WARM_UP)
            .await
    }
}

#[async_trait::async_trait]
impl crate::app::reload::Reload for UpReload {
    async fn reload(&mut self) -> Result<Vec<String>, String> {
        let next = self.next().await?;
        let mut changes = Vec::new();
        let mut changed: Vec<(&'static str, Change)> = Vec::new();
        let (was, will) = (&self.running.file, &next.file);
        for name in super::config::ROLES {
            if same_table(name, was, will) {
                continue;
            }
            let on = |f: &UpToml| f.roles().contains(&name);
            changed.push(match (on(was), on(will)) {
                (true, true) => (name, Change::Changed),
                (true, false) => (name, Change::Removed),
                _ => (name, Change::Added),
            });
        }
        // A role that changes stops before its new self starts (they share the store, and
        // Slack one socket); should the new one fail to start, the old one is started again
        // and the reload refused with nothing else applied.
        let (stopped, mut roles): (Vec<Role>, Vec<Role>) = std::mem::take(&mut self.roles)
            .into_iter()
            .partition(|r| changed.iter().any(|(n, _)| *n == r.name));
        stopped.iter().for_each(Role::stop);
        for r in &stopped {
            r.stopped(crate::app::GRACE).await;
        }
        let starting: Vec<&'static str> = changed
            .iter()
            .filter(|(_, c)| *c != Change::Removed)
            .map(|(n, _)| *n)
            .collect();
        match self.build(&starting, &next.file).await {
            Ok(built) => roles.extend(built),
            Err(why) => {
                // Each stopped role again as it was, one by one (one that fails leaves the
                // others running).
                for r in &stopped {
                    match self.build(&[r.name], &self.running.file).await {
                        Ok(old) => roles.extend(old),
                        Err(e) => tracing::error!(
                            "after a refused reload, a role could not start again as it was: {e}; reload a config that starts or restart herald up"
                        ),
                    }
                }
                roles.sort_by_key(|r| super::config::ROLES.iter().position(|n| *n == r.name));
                let running = self.running.clone();
                self.apply(&roles, &running).await;
                self.catalog(&roles).await;
                self.roles = roles;
                return Err(why);
            }
        }
        roles.sort_by_key(|r| super::config::ROLES.iter().position(|n| *n == r.name));
        for (name, change) in &changed {
            changes.push(format!(
                "role {name} {}",
                match change {
                    Change::Added => "added",
                    Change::Changed => "changed",
                    Change::Removed => "removed",
                }
            ));
        }
        let mut specs = next.watch_specs();
        specs.extend(self.extra_watches.iter().cloned());
        changes.extend(self.watches(false, &specs).await);
        let done = self.apply(&roles, &next).await;
        let (was, will) = (gateway_config(&self.running), gateway_config(&next));
        // (Roles are slugs too: their lines above say more than "slug memo changed".)
        changes.extend(describe(&was, &will, &done).into_iter().filter(|l| {
            !super::config::ROLES
                .iter()
                .any(|r| l.starts_with(&format!("slug {r} ")))
        }));
        if !changed.is_empty() {
            self.catalog(&roles).await;
        }
        self.roles = roles;
        changes.extend(self.watches(true, &specs).await);
        self.running = next;
        Ok(changes)
    }
}

/// Serves the watch client's side of reloads on `m` until the reloads end ([`WatchReload`]):
/// unchanged watches are left alone; removed ones stopped; changed ones stopped, then kept
/// anew (one whose new self can never start goes on as it was); new ones kept (tried until
/// they run). Never returns before `rx` closes.
pub(super) async fn serve_watches(
    m: &WatchManager,
    mut current: Vec<WatchSpec>,
    mut rx: mpsc::Receiver<WatchReload>,
) {
    // The changed watches between the two steps: their old specs.
    let mut changing: Vec<WatchSpec> = Vec::new();
    while let Some(WatchReload {
        start,
        specs,
        reply,
    }) = rx.recv().await
    {
        let mut lines = Vec::new();
        if !start {
            let mut kept = Vec::new();
            for old in current.drain(..) {
                match specs.iter().find(|s| s.name == old.name) {
                    Some(new) if *new == old => kept.push(old),
                    Some(_) => {
                        m.watch_stop(&old.name).await;
                        changing.push(old);
                    }
                    None => {
                        m.watch_stop(&old.name).await;
                        lines.push(format!("watch {} removed", old.name));
                    }
                }
            }
            current = kept;
            let _ = reply.send(lines);
            continue;
        }
        if specs.iter().any(|s| s.on_event.is_some())
            && !m.has_filters()
            && let Ok(exe) = std::env::current_exe()
        {
            m.set_filters(FilterPool::new(PoolConfig::new(exe)));
        }
        let was = std::mem::take(&mut changing);
        for new in specs {
            if current.iter().any(|c| c.name == new.name) {
                continue;
            }
            let old = was.iter().find(|s| s.name == new.name);
            let what = if old.is_some() { "changed" } else { "added" };
            match m.watch_keep(new.clone()).await {
                Ok(()) => {
                    lines.push(format!("watch {} {what}", new.name));
                    current.push(new);
                }
                Err(e) => {
                    lines.push(format!("watch {} not started: {e}", new.name));
                    // A changed one that can never start goes on as it was.
                    if let Some(old) = old.cloned()
                        && m.watch_keep(old.clone()).await.is_ok()
                    {
                        lines.push(format!("watch {} kept as it was", old.name));
                        current.push(old);
                    }
                }
            }
        }
        let _ = reply.send(lines);
    }
}
