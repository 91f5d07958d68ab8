//! `herald gateway`: many servers behind one endpoint.

use std::path::PathBuf;
use std::sync::Arc;

use crate::runtime::context::RoleContext;
use clap::Args;

use crate::cli::client::UpstreamConnectTimeout;
use crate::cli::serve::{ServeArgs, begin, role_store, serve_until_stopped};
use crate::cli::{Exit, Globals};
use crate::gateway::Gateway;
use crate::gateway::config::{GatewayConfig, Slug};
use crate::gateway::source::Reconfigured;
use crate::mcp::limits::Limits;
use crate::upstream::Upstream;

/// How long the start (and a reload) waits for the slugs to connect before serving on: one
/// that does not answer by then connects on first use.
pub const WARM_UP: std::time::Duration = std::time::Duration::from_secs(5);

#[derive(Debug, Args)]
pub struct GatewayArgs {
    /// The gateway's TOML config: [[slug]] upstreams and [[token]] entitlements (required).
    #[arg(long, value_name = "FILE")]
    pub config: PathBuf,
    #[command(flatten)]
    pub serve: ServeArgs,
    // --connect-timeout-ms: each [[slug]]'s.
    #[command(flatten)]
    pub timeout: UpstreamConnectTimeout,
    /// --backend: who started each task kept on NATS, shared by the gateway's replicas.
    #[command(flatten)]
    pub nats: crate::cli::nats::NatsArgs,
}

pub async fn run(args: GatewayArgs, globals: &Globals) -> Result<(), Exit> {
    let cfg =
        load(&args.config, args.timeout.duration()).map_err(|e| crate::cli::usage(e.into()))?;
    let mut opts = args.serve.options();
    // A flag, even "" (off), wins over the config's address.
    if args.serve.http.is_none() {
        opts.http = cfg.http.clone();
    }
    if args.serve.quic.is_none() {
        opts.quic = cfg.quic.clone();
    }
    // [events], with the flags' callback prefixes added and their profile over it.
    let allow = std::mem::take(&mut opts.events.callback_allow);
    opts.events = cfg.events.clone();
    opts.events.callback_allow.extend(allow);
    if let Some(p) = args.serve.events_profile {
        opts.events.profile = p;
    }
    loopback_only(&cfg, &[opts.http.clone(), opts.quic.clone()])
        .map_err(|e| crate::cli::usage(e.into()))?;
    if cfg.tokenless() && (opts.http.is_some() || opts.quic.is_some()) {
        tracing::info!(
            "no [[token]] configured: callers on this host (loopback) may use every server without a token"
        );
    }
    // An OAuth slug keeps its tokens in the store on disk (where `herald login` put them).
    let store = if cfg.slugs.iter().any(|s| s.trust.oauth.is_some()) {
        globals.open_store().await?
    } else {
        role_store(&opts, globals).await?
    };
    let ctx = crate::cli::serve::role_context("gateway");
    // The slugs are on the status board before the admin address answers: /ready names
    // every one it waits for from its first answer. Nothing connects before the warm-up.
    let gateway = Arc::new(Gateway::configured(
        upstreams(&cfg.slugs, &opts.limits, &ctx, &store),
        &cfg,
        &ctx,
    ));
    let (keep, hooks_bucket) = keeps(&args.nats, &store, &ctx).await?;
    gateway.keep_tasks_in(keep);
    opts.hooks_bucket = hooks_bucket;
    let admin = begin(&args.serve, &ctx, globals, &store).await?;
    gateway.warm_up(WARM_UP).await;
    let reload = GatewayReload {
        path: args.config.clone(),
        handshake_timeout: args.timeout.duration(),
        addrs: [opts.http.clone(), opts.quic.clone()],
        flags_set: [args.serve.http.is_some(), args.serve.quic.is_some()],
        limits: opts.limits.clone(),
        running: cfg,
        gateway: gateway.clone(),
        ctx: ctx.clone(),
        store: store.clone(),
    };
    serve_until_stopped(
        gateway,
        &opts,
        admin,
        &store,
        ctx,
        globals,
        Some(Box::new(reload)),
    )
    .await
}

/// Where the gateway keeps who started each task, and its webhook subscriptions: on NATS
/// with `--backend` (shared by every replica behind a load balancer: the bucket, and the
/// bucket `<bucket>_hooks`), else in its store (kept across restarts).
async fn keeps(
    nats: &crate::cli::nats::NatsArgs,
    store: &crate::store::Store,
    ctx: &RoleContext,
) -> Result<
    (
        crate::gateway::owners::Keep,
        Option<async_nats::jetstream::kv::Store>,
    ),
    Exit,
> {
    use crate::gateway::owners::Keep;
    let mut t = crate::cli::nats::NatsToml::default();
    nats.lay_over(&mut t);
    let Some(cfg) = t.config("herald_gateway") else {
        if t.nats_bucket.is_some() || t.nats_creds.is_some() || t.nats_nkey.is_some() {
            return Err(crate::cli::usage(anyhow::anyhow!(
                "--nats-bucket, --nats-creds and --nats-nkey go with --backend nats://HOST:PORT"
            )));
        }
        let keep = Keep::Store(store.clone());
        keep.sweep().await;
        return Ok((keep, None));
    };
    let servers = cfg.redacted();
    let client = tokio::time::timeout(
        std::time::Duration::from_secs(20),
        cfg.connect(ctx.metrics()),
    )
    .await
    .map_err(|_| format!("no NATS server answered at {servers} within 20 s"))
    .and_then(|r| r)
    .map_err(|e| crate::cli::usage(anyhow::anyhow!("--backend: {e}")))?
    .client;
    let js = async_nats::jetstream::new(client);
    // Rows expire with the longest a task is kept (a day) and its grace.
    let kv = crate::nats::open_bucket(
        &js,
        async_nats::jetstream::kv::Config {
            bucket: cfg.bucket.clone(),
            description: "herald gateway: who started each task (digests only)".into(),
            history: 1,
            max_age: crate::gateway::owners::MAX_AGE,
            ..Default::default()
        },
        &servers,
    )
    .await
    .map_err(|e| crate::cli::usage(anyhow::anyhow!("--backend: {e}")))?;
    // A subscription's row lives as long as its longest TTL past its last write.
    let hooks = crate::nats::open_bucket(
        &js,
        async_nats::jetstream::kv::Config {
            bucket: format!("{}_hooks", cfg.bucket),
            description: "herald gateway: webhook subscriptions (sealed) and their deliverer"
                .into(),
            history: 1,
            max_age: crate::hooks::MAX_TTL + crate::hooks::ROTATION,
            ..Default::default()
        },
        &servers,
    )
    .await
    .map_err(|e| crate::cli::usage(anyhow::anyhow!("--backend: {e}")))?;
    tracing::info!(bucket = %cfg.bucket, %servers, "task owners and webhook subscriptions kept on NATS, shared by this gateway's replicas");
    Ok((Keep::Nats(Box::new(kv)), Some(hooks)))
}

/// `herald gateway --config`'s reload: the file read and checked again, then its slugs and
/// tokens applied ([`apply_slugs`]); the listen addresses cannot change live.
struct GatewayReload {
    path: PathBuf,
    handshake_timeout: std::time::Duration,
    /// The addresses served (flags over the config).
    addrs: [Option<String>; 2],
    /// Whether --http and --quic chose them (then the config's own are not used), each on
    /// its own.
    flags_set: [bool; 2],
    limits: Limits,
    running: GatewayConfig,
    gateway: Arc<Gateway>,
    ctx: RoleContext,
    /// Where OAuth slugs keep their tokens.
    store: crate::store::Store,
}

#[async_trait::async_trait]
impl crate::app::reload::Reload for GatewayReload {
    async fn reload(&mut self) -> Result<Vec<String>, String> {
        let next = load(&self.path, self.handshake_timeout).map_err(|e| e.to_string())?;
        let [http_flag, quic_flag] = self.flags_set;
        if !http_flag {
            restart_needed("http", &self.running.http, &next.http)?;
        }
        if !quic_flag {
            restart_needed("quic", &self.running.quic, &next.quic)?;
        }
        // (The flags add to [events]; the config's own part is compared.)
        if self.running.events != next.events {
            return Err(
                "[events] changed: it cannot change live, restart herald to apply it".into(),
            );
        }
        loopback_only(&next, &self.addrs).map_err(|e| e.to_string())?;
        if matches!(self.store.location(), crate::store::Location::Memory)
            && next.slugs.iter().any(|s| s.trust.oauth.is_some())
        {
            return Err(
                "a [slug.oauth] keeps its tokens in the store on disk, which this gateway did not \
                 open: restart herald gateway to apply it"
                    .into(),
            );
        }
        let ups = apply_slugs(
            &self.gateway,
            &self.running.slugs,
            &next.slugs,
            &self.limits,
            &self.ctx,
            &self.store,
        );
        let done = self.gateway.apply(ups, &next, WARM_UP).await;
        let changes = describe(&self.running, &next, &done);
        self.running = next;
        Ok(changes)
    }
}

/// The config at `path`, each slug given `handshake_timeout` (`--connect-timeout-ms`): what
/// the start and a reload read alike.
fn load(
    path: &std::path::Path,
    handshake_timeout: std::time::Duration,
) -> Result<GatewayConfig, crate::gateway::config::ConfigError> {
    let mut cfg = GatewayConfig::load(path)?;
    for slug in &mut cfg.slugs {
        slug.handshake_timeout = handshake_timeout;
    }
    Ok(cfg)
}

/// A gateway open to loopback serves on loopback only: the config's own addresses were
/// checked when it was read, `served` (the flags over them) here.
fn loopback_only(
    cfg: &GatewayConfig,
    served: &[Option<String>; 2],
) -> Result<(), crate::gateway::config::ConfigError> {
    if !cfg.open_to_loopback {
        return Ok(());
    }
    let addrs = served.iter().flatten().map(String::as_str);
    crate::gateway::config::open_on_loopback_only(addrs, cfg.tokenless())
}

/// Refuses a reload that moves what cannot move live, naming it.
pub fn restart_needed(
    what: &str,
    running: &Option<String>,
    next: &Option<String>,
) -> Result<(), String> {
    if running == next {
        return Ok(());
    }
    let show = |a: &Option<String>| a.clone().unwrap_or_else(|| "off".into());
    Err(format!(
        "{what} changed ({} to {}): the listen addresses cannot change live, restart herald to move them",
        show(running),
        show(next)
    ))
}

/// The upstream of each slug of `next`: the running one for a slug whose config did not
/// change (its connection, subscriptions and clients' streams untouched), a new one for a
/// slug added or changed.
pub fn apply_slugs(
    gateway: &Gateway,
    running: &[Slug],
    next: &[Slug],
    limits: &Limits,
    ctx: &RoleContext,
    store: &crate::store::Store,
) -> Vec<Arc<Upstream>> {
    let live = gateway.upstreams();
    next.iter()
        .map(|s| {
            let same = running.iter().any(|r| r == s);
            match live.iter().find(|u| u.name == s.name).filter(|_| same) {
                Some(up) => up.clone(),
                None => upstreams(std::slice::from_ref(s), limits, ctx, store).remove(0),
            }
        })
        .collect()
}

/// One line per change a reload made to the slugs and tokens, and the streams it ended.
pub fn describe(running: &GatewayConfig, next: &GatewayConfig, done: &Reconfigured) -> Vec<String> {
    let mut out = Vec::new();
    for name in &done.added {
        if done.removed.contains(name) {
            out.push(format!("slug {name} changed"));
        } else {
            out.push(format!("slug {name} added"));
        }
    }
    for name in done.removed.iter().filter(|n| !done.added.contains(n)) {
        out.push(format!("slug {name} removed"));
    }
    for t in &next.tokens {
        match running.tokens.iter().find(|r| r.label == t.label) {
            None => out.push(format!("token {} added", t.label)),
            Some(r) if r != t => out.push(format!("token {} changed", t.label)),
            Some(_) => {}
        }
    }
    for t in running
        .tokens
        .iter()
        .filter(|r| !next.tokens.iter().any(|t| t.label == r.label))
    {
        out.push(format!("token {} revoked", t.label));
    }
    if running.open_to_loopback != next.open_to_loopback {
        out.push(if next.open_to_loopback {
            "loopback callers need no token now".into()
        } else {
            "loopback callers need a token now".into()
        });
    }
    if crate::gateway::config::bare_slug(&running.slugs)
        != crate::gateway::config::bare_slug(&next.slugs)
    {
        out.push("the bare slug (prefix = false) changed".into());
    }
    if done.ended_streams > 0 {
        out.push(format!(
            "{} listen stream{} ended (their callers lost access)",
            done.ended_streams,
            if done.ended_streams == 1 { "" } else { "s" }
        ));
    }
    out
}

/// The upstream of each `[[slug]]`: its server, or for a `nats` slug the event logs its source
/// publishes, served in this process (the role's poll mapping handed in: the gateway imports
/// no role).
pub fn upstreams(
    slugs: &[crate::gateway::config::Slug],
    limits: &crate::mcp::limits::Limits,
    ctx: &RoleContext,
    store: &crate::store::Store,
) -> Vec<std::sync::Arc<crate::upstream::Upstream>> {
    // An OAuth slug's tokens are kept, sealed, in this process's store.
    for oauth in slugs.iter().filter_map(|s| s.trust.oauth.as_ref()) {
        match crate::transport::oauth::keep::StoreKeep::new(store.clone()) {
            Ok(k) => oauth.keep_in(std::sync::Arc::new(k)),
            Err(e) => {
                tracing::warn!(server = %oauth.server(), error = %e, "OAuth tokens cannot be kept")
            }
        }
    }
    // The deployment's key opens the event logs published sealed. One that cannot be read
    // (refused at start by the webhooks' check of the same variable; on a reload, said here)
    // lets nothing in, rather than taking events in the clear.
    let seal = match crate::hooks::events_key() {
        Ok(k) => k.map(|k| crate::nats::events::Seal::new(&k)),
        Err(e) => {
            if slugs.iter().any(|s| s.nats.is_some()) {
                tracing::error!("{e}; nats slugs take no events until it is mended");
            }
            Some(crate::nats::events::Seal::nothing())
        }
    };
    slugs
        .iter()
        .map(|s| (s, ctx.for_stoppable_role(ctx.role())))
        // Each on a context of its own: a reload that removes it stops its tasks.
        .map(|(s, ctx)| match &s.nats {
            None => Gateway::upstream_for(s, limits.max_message_bytes, &ctx),
            Some(n) => {
                let mirror = crate::nats::events::Mirror::start(
                    n.config.clone(),
                    &n.source,
                    seal.clone(),
                    crate::source::poll_uri,
                    &ctx,
                );
                let server = crate::mcp::server::SourceServer::new(
                    mirror,
                    limits.clone(),
                    ctx.shutdown().clone(),
                );
                std::sync::Arc::new(crate::upstream::local::upstream(
                    crate::upstream::UpstreamConfig {
                        name: s.name.clone(),
                        context: Some(ctx.clone()),
                        ..crate::upstream::UpstreamConfig::new(
                            s.target.clone(),
                            Default::default(),
                            limits.max_message_bytes,
                        )
                    },
                    server,
                    &ctx,
                ))
            }
        })
        .collect()
}
