//! `herald gateway`: many servers behind one endpoint; `herald check`: validate a config.

use std::path::PathBuf;

use crate::runtime::context::RoleContext;
use clap::Args;

use crate::app::console;
use crate::cli::client::UpstreamConnectTimeout;
use crate::cli::serve::{ServeArgs, begin, role_store, serve_until_stopped};
use crate::cli::up::config::is_loopback;
use crate::cli::{Exit, Globals};
use crate::gateway::Gateway;
use crate::gateway::config::GatewayConfig;

#[derive(Debug, Args)]
pub struct GatewayArgs {
    /// The gateway's TOML config: [[slug]] upstreams and [[token]] entitlements.
    #[arg(long, value_name = "FILE")]
    pub config: PathBuf,
    #[command(flatten)]
    pub serve: ServeArgs,
    // --connect-timeout-ms: each [[slug]]'s.
    #[command(flatten)]
    pub timeout: UpstreamConnectTimeout,
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// A config to validate: `herald up`'s (any of [listen], [memo], [file], [k8s], [slack],
    /// [[watch]], [notify]) or `herald gateway`'s.
    pub config: PathBuf,
}

/// Tables only `herald up`'s config has.
const UP_TABLES: [&str; 8] = [
    "listen", "memo", "file", "k8s", "slack", "watch", "notify", "publish",
];

pub async fn run(args: GatewayArgs, globals: &Globals) -> Result<(), Exit> {
    let mut cfg = GatewayConfig::load(&args.config).map_err(|e| crate::cli::usage(e.into()))?;
    for slug in &mut cfg.slugs {
        slug.handshake_timeout = args.timeout.duration();
    }
    let mut opts = args.serve.options();
    if opts.http.is_none() {
        opts.http = cfg.http.clone();
    }
    if opts.quic.is_none() {
        opts.quic = cfg.quic.clone();
    }
    if cfg.tokens.is_empty()
        && !cfg.open_to_loopback
        && (opts.http.is_some() || opts.quic.is_some())
    {
        tracing::warn!(
            "no [[token]] in the config: HTTP and QUIC callers are refused every server; only stdio callers get them"
        );
    }
    if cfg.open_to_loopback {
        // The config's own addresses were checked when it was read; the flags' are here.
        crate::gateway::config::open_on_loopback_only(
            [&opts.http, &opts.quic]
                .into_iter()
                .flatten()
                .map(String::as_str),
        )
        .map_err(|e| crate::cli::usage(e.into()))?;
    }
    let store = role_store(&opts, globals).await?;
    let ctx = crate::cli::serve::role_context("gateway");
    // The slugs are on the status board before the admin address answers: /ready names
    // every one it waits for from its first answer. Nothing connects before the warm-up.
    let gateway = Gateway::configured(upstreams(&cfg.slugs, &opts.limits, &ctx), &cfg, &ctx);
    let admin = begin(&args.serve, &ctx, globals, &store).await?;
    gateway.warm_up(std::time::Duration::from_secs(5)).await;
    serve_until_stopped(gateway, &opts, admin, &store, ctx, globals).await
}

/// The upstream of each `[[slug]]`: its server, or for a `nats` slug the event logs its source
/// publishes, served in this process (the role's poll mapping handed in: the gateway imports
/// no role).
pub fn upstreams(
    slugs: &[crate::gateway::config::Slug],
    limits: &crate::mcp::limits::Limits,
    ctx: &RoleContext,
) -> Vec<std::sync::Arc<crate::upstream::Upstream>> {
    slugs
        .iter()
        .map(|s| match &s.nats {
            None => Gateway::upstream_for(s, limits.max_message_bytes, ctx),
            Some(n) => {
                let mirror = crate::nats::events::Mirror::start(
                    n.config.clone(),
                    &n.source,
                    crate::source::poll_uri,
                    ctx,
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
                    ctx,
                ))
            }
        })
        .collect()
}

pub fn check(args: CheckArgs) -> Result<(), Exit> {
    let text = std::fs::read_to_string(&args.config).map_err(|e| {
        crate::cli::usage(anyhow::anyhow!(
            "cannot read {}: {e}",
            args.config.display()
        ))
    })?;
    let is_up = toml::from_str::<toml::Table>(&text)
        .is_ok_and(|t| t.keys().any(|k| UP_TABLES.contains(&k.as_str())));
    if is_up {
        let cfg = crate::cli::up::config::UpToml::load(&args.config)
            .and_then(|t| t.check())
            .map_err(crate::cli::usage)?;
        console::println(&format!(
            "{}: ok (herald up: roles {}; {}, {}, {})",
            args.config.display(),
            match cfg.file.roles() {
                r if r.is_empty() => "none".to_owned(),
                r => r.join(", "),
            },
            count(cfg.slugs.len(), "server"),
            count(cfg.tokens.len(), "token"),
            count(cfg.watches.len(), "watch")
        ))?;
        return Ok(());
    }
    let cfg = GatewayConfig::load(&args.config).map_err(|e| crate::cli::usage(e.into()))?;
    if let Some(warning) = no_token_warning(&cfg) {
        eprintln!("{}: {warning}", args.config.display());
    }
    console::println(&format!(
        "{}: ok ({}, {})",
        args.config.display(),
        count(cfg.slugs.len(), "server"),
        count(cfg.tokens.len(), "token")
    ))?;
    Ok(())
}

/// What `herald check` says about a gateway config with no `[[token]]` that listens on HTTP or
/// QUIC: loudly, when an address is not loopback (the config is meant to be reached from other
/// hosts, and every caller reaching it there would be refused every server). `herald up`'s
/// config refuses that outright instead; a gateway's is valid, since its stdio callers need no
/// token.
fn no_token_warning(cfg: &GatewayConfig) -> Option<String> {
    if !cfg.tokens.is_empty() {
        return None;
    }
    let listens: Vec<(&str, &str)> = [("http", &cfg.http), ("quic", &cfg.quic)]
        .into_iter()
        .filter_map(|(k, a)| Some((k, a.as_deref().filter(|a| !a.trim().is_empty())?)))
        .collect();
    let remote: Vec<String> = listens
        .iter()
        .filter(|(_, a)| !is_loopback(a))
        .map(|(k, a)| format!("{k} = {a:?}"))
        .collect();
    if !remote.is_empty() {
        return Some(format!(
            "WARNING: {} is not a loopback address, so this gateway is meant to be reached from \
             other hosts, but it has no [[token]]: every HTTP and QUIC caller is refused every \
             server. Add a [[token]] (sha256 = the output of `printf %s TOKEN | sha256sum`, \
             slugs = [\"*\"]) for each caller, or listen on 127.0.0.1",
            remote.join(" and ")
        ));
    }
    (!listens.is_empty()).then(|| {
        "note: no [[token]]: HTTP and QUIC callers are refused every server; only stdio callers get them"
            .to_owned()
    })
}

/// `1 token`, `2 tokens`, `1 watch`, `0 watches`.
fn count(n: usize, noun: &str) -> String {
    match (n, noun.ends_with("ch")) {
        (1, _) => format!("1 {noun}"),
        (_, true) => format!("{n} {noun}es"),
        (_, false) => format!("{n} {noun}s"),
    }
}
