//! `herald gateway`: many servers behind one endpoint.

use std::path::PathBuf;

use crate::runtime::context::RoleContext;
use clap::Args;

use crate::cli::client::UpstreamConnectTimeout;
use crate::cli::serve::{ServeArgs, begin, role_store, serve_until_stopped};
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
    if cfg.open_to_loopback {
        // The config's own addresses were checked when it was read; the flags' are here.
        crate::gateway::config::open_on_loopback_only(
            [&opts.http, &opts.quic]
                .into_iter()
                .flatten()
                .map(String::as_str),
            cfg.tokens.is_empty(),
        )
        .map_err(|e| crate::cli::usage(e.into()))?;
    }
    if cfg.tokens.is_empty() && (opts.http.is_some() || opts.quic.is_some()) {
        tracing::info!(
            "no [[token]] configured: callers on this host (loopback) may use every server without a token"
        );
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
