//! `herald up`: the appliance. One process, one store, the roles a config names (memo, file,
//! k8s, slack), external servers beside them, all behind one gateway endpoint, and a watch
//! client reaching them through it. With no config: the demo (memo, the files of
//! `./herald-demo`, Slack inert until configured).
//!
//! Each in-process role is a gateway slug named after it, reached over an in-memory pipe
//! (`upstream::local`), never a socket; the watch client reaches the gateway the same way.
//! A pipe carries one listen stream per URI for every caller and watch sharing it, so the
//! pipes take up to 65,536 streams each (the 64 meant for one outside client would cap the
//! appliance); the gateway's own callers keep the usual limits.
//!
//! The order is a runner's (`app`): the admin address first, each role on its own
//! `RoleContext::for_role`, the gateway's `serve_source` (never falling back to stdio, whose
//! stdout carries notices), `READY=1`, the `listening` line, then the watch client. `/ready`
//! means the endpoint answers, every role started and every configured watch runs: a watch
//! that cannot start yet (its slug or source not up) is kept, listed as `starting` with its
//! last error, and tried again until it runs (`watch::manager`'s `kept.rs`).
//!
//! The roles are built in `roles.rs`, each on a context it can be stopped on alone; a reload
//! (SIGHUP, `herald reload`) is `reload.rs`: the config checked again, then only what changed
//! applied (roles, slugs, tokens, watches), what cannot change live refused.

pub mod config;
mod reload;
mod roles;

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;

use self::config::UpToml;
use self::reload::{ListenFlags, UpReload};
use self::roles::Roles;
use crate::app::{self, Bound, ServeOptions, console};
use crate::cli::serve::announce;
use crate::cli::{Exit, Globals, LogFormat, usage};
use crate::filter::pool::PoolConfig;
use crate::gateway::Gateway;
use crate::gateway::config::Slug;
use crate::mcp::limits::Limits;
use crate::mcp::server::SourceServer;
use crate::mcp::source::DynSource;
use crate::transport::http::HttpOptions;
use crate::transport::target::Target;
use crate::upstream::{Upstream, UpstreamConfig, local};
use crate::watch::log::WatchLog;
use crate::watch::manager::Settled;
use crate::watch::sink::Sink;
use crate::watch::{Restart, WatchConfig, WatchOptions, WatchSpec, upstream_config};

/// Listen streams on one in-process pipe (see `run`).
const LOCAL_MAX_STREAMS: usize = 1 << 16;

/// Watches `herald up` runs at most without the agent (the config's; a reload may add more).
const CONFIGURED_WATCHES: usize = 4096;

/// The directory the demo's file source serves (created if missing).
pub const DEFAULT_DEMO_DIR: &str = "herald-demo";

#[derive(Debug, Args)]
pub struct UpArgs {
    /// The appliance's config (TOML): [listen], [memo], [file], [k8s], [slack], [[slug]],
    /// [[token]], [[watch]], [notify] [default: none: the embedded demo].
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The gateway's HTTP address, over [listen] http ("" turns HTTP off) [default:
    /// 127.0.0.1:8750].
    #[arg(long, value_name = "ADDR")]
    pub http: Option<String>,
    /// The gateway's QUIC address, over [listen] quic ("" turns QUIC off) [default:
    /// 127.0.0.1:8751].
    #[arg(long, value_name = "ADDR")]
    pub quic: Option<String>,
    /// The admin address (/live, /ready, /metrics, /status), over [listen] admin ("" turns it
    /// off) [default: 127.0.0.1:8759; when that default is taken, herald up warns and runs
    /// without it].
    #[arg(long, value_name = "ADDR")]
    pub admin: Option<String>,
    /// Without --config: the directory the demo's file source serves and watches (created if
    /// missing).
    #[arg(long, default_value = DEFAULT_DEMO_DIR, value_name = "DIR")]
    pub demo_dir: PathBuf,
    /// Print the effective config (every default filled in) and exit.
    #[arg(long)]
    pub print_config: bool,
    /// Print the watch client's notices as NDJSON even on a terminal (they are NDJSON
    /// whenever stdout is not a terminal; on one, each is its `<watch-event>` block).
    #[arg(long)]
    pub json: bool,
    /// Run the agent too (see herald agent), on this model's OpenAI-compatible API: the watch
    /// client's notices become its turns instead of stdout lines, what is typed at the
    /// terminal is its input, and with [slack] live so are messages addressed to the bot. The
    /// key comes from HERALD_MODEL_KEY or $CREDENTIALS_DIRECTORY/HERALD_MODEL_KEY.
    #[arg(long, env = "HERALD_MODEL_URL", value_name = "URL")]
    pub model_url: Option<String>,
    /// With --model-url: the model name sent with each request.
    #[arg(long, default_value = "default", value_name = "NAME")]
    pub model: String,
    /// With --model-url: a file of the operator's instructions for the agent.
    #[arg(long, value_name = "FILE")]
    pub prompt: Option<PathBuf>,
    /// With --model-url and [slack] live: where the agent's notices go before anyone has
    /// addressed the bot (a conversation id; repeatable, the first is used) [default: stdout].
    #[arg(long, value_name = "ID")]
    pub channel: Vec<String>,
    /// Let webhook callbacks whose URL starts with PREFIX reach a private address or plain
    /// http (repeatable), added to [events] callback_allow. Webhook subscriptions are on when
    /// HERALD_EVENTS_KEY is set.
    #[arg(long = "callback-allow", value_name = "PREFIX")]
    pub callback_allow: Vec<String>,
    /// The Events error codes, over [events] profile: the draft's (-32023…-32027) or the ones
    /// ChatGPT uses (-32011…-32015) [default: draft].
    #[arg(long, value_enum, value_name = "CODES")]
    pub events_profile: Option<crate::hooks::Profile>,
    // --connect-timeout-ms: the config's [[slug]] servers'.
    #[command(flatten)]
    pub timeout: crate::cli::client::UpstreamConnectTimeout,
}

pub async fn run(args: UpArgs, globals: &Globals) -> Result<(), Exit> {
    let (mut toml, demo_dir) = match &args.config {
        Some(p) => (UpToml::load(p).map_err(usage)?, None),
        None => {
            std::fs::create_dir_all(&args.demo_dir).map_err(|e| {
                usage(anyhow::anyhow!(
                    "cannot create the demo directory {}: {e}; pass --demo-dir DIR",
                    args.demo_dir.display()
                ))
            })?;
            let dir = std::fs::canonicalize(&args.demo_dir).map_err(|e| usage(e.into()))?;
            (UpToml::demo(&dir), Some(dir))
        }
    };
    let flags = ListenFlags {
        http: args.http.clone(),
        quic: args.quic.clone(),
        admin: args.admin.clone(),
    };
    flags.lay_over(&mut toml);
    let cfg = toml.check().map_err(usage)?;
    if args.print_config {
        console::print(&cfg.to_toml())?;
        return Ok(());
    }
    // What `herald check` refuses, `herald up` refuses before it starts anything.
    let config_path = args.config.clone().unwrap_or_else(|| "herald up".into());
    crate::cli::watch::check_filters(&config_path, &cfg.watch_specs()).await?;
    // The appliance serves its endpoint: a closed stdout only ends its notices there (said
    // once in the log), never the roles every client depends on.
    console::keep_running_when_stdout_closes();
    let store = globals.open_store().await?;
    let ctx = crate::cli::serve::role_context("up");
    app::cancel_on_signals(ctx.shutdown().clone());
    // The admin address first: /live answers and /ready says what it waits for during the
    // start.
    let served = app::admin::serve_admin(cfg.admin(), &globals.systemd, &ctx, Some(&store)).await;
    let admin = match served {
        Ok(a) => a,
        // Only the default address is let go: an address someone chose must be served.
        Err(e) if cfg.admin_defaulted => {
            tracing::warn!(
                "{e}: running without the admin endpoints (/live, /ready, /metrics, /status); \
                 set [listen] admin or --admin to another address, or \"\" to turn them off"
            );
            None
        }
        Err(e) => return Err(usage(e.into())),
    };
    let limits = Limits::default();
    let max = limits.max_message_bytes;
    let file = &cfg.file;
    // The in-process pipes (gateway to each role, watch client to the gateway) each carry
    // one listen stream per URI, however many callers and watches share it: the per-connection
    // stream cap, meant for one outside client, would cap the whole appliance (64 URIs). The
    // gateway's own callers keep the usual limits.
    let local = Limits {
        max_streams_per_connection: LOCAL_MAX_STREAMS,
        max_listen_streams_total: LOCAL_MAX_STREAMS,
        ..limits.clone()
    };

    // [publish]: the tap goes in before the roles make their rings.
    let published = match &file.publish {
        Some(p) => p.args().start("up", &ctx).await?.map(Arc::new),
        None => None,
    };
    let builder = Roles {
        local: local.clone(),
        store: store.clone(),
        ctx: ctx.clone(),
        demo: demo_dir.is_some(),
    };
    let roles = builder.all(file).await?;
    let slack_live = roles.iter().find_map(|r| r.slack_live);
    let mut upstreams: Vec<Arc<Upstream>> = roles.iter().map(|r| r.up.clone()).collect();
    if let Some(p) = &published {
        let all: Vec<&dyn crate::mcp::source::Source> =
            roles.iter().filter_map(|r| r.source.as_deref()).collect();
        p.catalog_of(&all).await;
    }
    let gctx = ctx.for_role("gateway");
    let slugs: Vec<Slug> = cfg
        .slugs
        .iter()
        .map(|slug| Slug {
            handshake_timeout: args.timeout.duration(),
            ..slug.clone()
        })
        .collect();
    let slug_limits = Limits {
        max_message_bytes: max,
        ..limits.clone()
    };
    upstreams.extend(crate::cli::gateway::upstreams(
        &slugs,
        &slug_limits,
        &gctx,
        &store,
    ));
    let open = cfg.tokenless();
    // (`check` refused a non-loopback address without tokens.)
    let gateway = Arc::new(
        Gateway::with_upstreams(upstreams, cfg.tokens.clone(), &gctx)
            .bare(crate::gateway::config::bare_slug(&cfg.slugs))
            .loopback(open)
            .issuers(&cfg.issuers)
            .receive_webhooks_at(file.events.as_ref().and_then(|e| e.receiver_url.clone())),
    );
    gateway.warm_up(crate::cli::gateway::WARM_UP).await;
    let gateway_source: DynSource = gateway.clone();

    let opts = ServeOptions {
        http: cfg.http().map(str::to_owned),
        quic: cfg.quic().map(str::to_owned),
        stdio: false,
        // Both listeners off is allowed (the roles, the watch client and [notify] still run);
        // it never turns the terminal into an endpoint.
        no_stdio_fallback: true,
        // The connection deadlines and cap (`Limits::max_connections`) are the defaults of
        // `herald memo`'s flags.
        http_options: HttpOptions {
            allowed_hosts: file.listen.allowed_hosts.clone(),
            allowed_origins: file.listen.allowed_origins.clone(),
            trusted_proxies: cfg.trusted_proxies(),
            ..HttpOptions::default()
        },
        limits: limits.clone(),
        http_socket: globals.systemd.socket("http"),
        events: {
            let mut e = file.events.clone().unwrap_or_default();
            e.callback_allow.extend(args.callback_allow.iter().cloned());
            if let Some(p) = args.events_profile {
                e.profile = p;
            }
            e
        },
        ..ServeOptions::default()
    };
    let mut bound = match app::serve_source(gateway_source.clone(), &opts, &store, &ctx).await {
        Ok(b) => b,
        Err(e) => {
            app::drain(&ctx).await;
            return Err(usage(e.into()));
        }
    };
    bound.admin = admin;
    // (With the agent, addressed messages are its input, not notices.)
    let mut extra_watches = Vec::new();
    if slack_live == Some(true) && demo_dir.is_some() && args.model_url.is_none() {
        extra_watches.push(WatchSpec {
            name: "slack".into(),
            uri: format!(
                "{}?addressed_to_bot=true",
                crate::source::slack::filter::EVENTS_URI
            ),
            on_event: None,
        });
    }
    // Reloads (SIGHUP, POST /reload) are taken before systemd hears READY=1.
    let (watch_reloads, watch_reloads_rx) = tokio::sync::mpsc::channel(1);
    let reloader = UpReload {
        path: args.config.clone(),
        flags,
        // (With the connect timeout the slugs were built with, which a reload sets again.)
        running: config::UpConfig {
            slugs: slugs.clone(),
            ..cfg.clone()
        },
        roles,
        builder,
        gateway: gateway.clone(),
        slug_limits,
        gctx,
        handshake_timeout: args.timeout.duration(),
        extra_watches: extra_watches.clone(),
        published,
        watches: watch_reloads,
    };
    app::reload::serve(
        &ctx,
        &globals.systemd,
        app::serving_status(std::slice::from_ref(&bound)),
        Box::new(reloader),
    );
    // `/ready` waits for the watch client's start too: its configured watches are listed
    // (running, or starting while they keep trying) before it says ready.
    ctx.status().role_starting("watch");
    app::ready(&ctx, &globals.systemd, std::slice::from_ref(&bound)).await;
    announce(&bound, globals.log_format);
    if open {
        tracing::info!(
            "no [[token]] configured: callers on this host (loopback) may use every role without a token"
        );
    }
    if globals.log_format == LogFormat::Text {
        banner(&bound, &cfg, demo_dir.as_deref(), slack_live, globals);
    }

    // The watch client, through the gateway, over a pipe.
    let gw_server = SourceServer::new(gateway_source, local.clone(), ctx.shutdown().clone());
    // The watch client's listens are streams on this pipe's server: its row counts them.
    let watch_listens = gw_server.listen_count();
    let servers = vec![Arc::new(local::upstream(
        UpstreamConfig {
            name: "gateway".into(),
            context: Some(ctx.for_role("watch")),
            ..upstream_config(
                Target::Stdio("in-process gateway".into()),
                Default::default(),
                max,
            )
        },
        gw_server,
        &ctx.for_role("watch"),
    ))];
    let mut watches = cfg.watch_specs();
    watches.extend(extra_watches);
    let configured = watches.clone();
    let filters = if watches.iter().any(|w| w.on_event.is_some()) {
        let exe = std::env::current_exe().map_err(|e| {
            usage(anyhow::anyhow!(
                "cannot find the herald binary for filter workers: {e}"
            ))
        })?;
        Some(PoolConfig::new(exe))
    } else {
        None
    };
    // With a model, the notices go to the agent.
    let agent = match &args.model_url {
        Some(url) => {
            let model = super::agent::chat_client(url, &args.model, 8192, 600)?;
            let operator = match &args.prompt {
                Some(p) => Some(std::fs::read_to_string(p).map_err(|e| {
                    usage(anyhow::anyhow!("reading --prompt {}: {e}", p.display()))
                })?),
                None => None,
            };
            let log = match globals
                .store_path()
                .map(|p| p.with_file_name("agent-session.jsonl"))
            {
                Some(p) => crate::agent::session::SessionLog::open(&p).map_err(|e| {
                    usage(anyhow::anyhow!(
                        "opening the agent's session log {}: {e}",
                        p.display()
                    ))
                })?,
                None => crate::agent::session::SessionLog::none(),
            };
            let exe = std::env::current_exe()
                .map_err(|e| usage(anyhow::anyhow!("cannot find the herald binary: {e}")))?;
            let mut code = PoolConfig::new(exe);
            code.workers = 1;
            let (ntx, nrx) = tokio::sync::mpsc::channel(64);
            tracing::info!(model = %args.model, url = %model.endpoint(), "the agent runs on the watch client's notices");
            Some((
                ntx,
                nrx,
                super::agent::Settings {
                    model: Arc::new(model),
                    operator,
                    log,
                    resumed: Vec::new(),
                    slack: slack_live == Some(true),
                    channel: args.channel.clone(),
                    code_pool: crate::filter::pool::FilterPool::new(code),
                    end_when_idle: false,
                    unanswered: Default::default(),
                },
            ))
        }
        None => None,
    };
    let filters = match (&filters, &agent) {
        // The agent's watches may bring filters.
        (None, Some(_)) => std::env::current_exe().ok().map(PoolConfig::new),
        _ => filters,
    };
    let (sink, agent) = match agent {
        Some((ntx, nrx, settings)) => (Sink::Channel(ntx), Some((nrx, settings))),
        None => (
            match &file.notify {
                Some(n) if n.exec.is_some() => Sink::Exec(n.exec.clone().unwrap_or_default()),
                Some(n) if n.webhook.is_some() => {
                    Sink::Webhook(n.webhook.clone().unwrap_or_default())
                }
                _ => Sink::stdout(args.json),
            },
            None,
        ),
    };
    // The config's watches all run (kept: tried until they do): the watch client's cap (meant
    // for watches an agent starts) is raised to their number.
    let mut config = WatchConfig {
        restart: if agent.is_some() {
            Restart::WatchStart
        } else {
            Restart::HeraldUp
        },
        ..WatchConfig::default()
    };
    // (With the agent, it may start its own on top of them.)
    config.max_watches = if agent.is_some() {
        config.max_watches + watches.len()
    } else {
        // (A reload may add more.)
        watches.len().max(CONFIGURED_WATCHES)
    };
    let opts = WatchOptions {
        config,
        servers,
        sink,
        // Its event log (`watch.*` on stderr) with -v, as herald watch's.
        log: WatchLog::stderr(tracing::enabled!(tracing::Level::DEBUG)),
        store: None,
        filters,
        watches,
        // A watch that cannot start (a server not up yet) is logged; the rest run.
        configured: crate::watch::Configured::Kept,
        end_when_all_ended: false,
        state_prefix: "",
    };
    let board = ctx.status().clone();
    let agent_stop = ctx.shutdown().clone();
    let watch = crate::watch::run(opts, ctx.shutdown().clone(), async |m| {
        m.report_to(&board);
        board.role_serving("watch", Vec::new(), Some(watch_listens.clone()));
        // Reloads change the configured watches for as long as the watch client runs.
        // Fused: it ends when the reloads end (no config file, or the shutdown), and the
        // selects below may meet it again after that.
        let reloads =
            futures::FutureExt::fuse(reload::serve_watches(m, configured, watch_reloads_rx));
        tokio::pin!(reloads);
        if let Some((nrx, settings)) = agent {
            tokio::select! {
                _ = super::agent::serve(m, settings, nrx, agent_stop.clone()) => {}
                _ = &mut reloads => {}
            }
        } else {
            // Nothing here starts a failed watch again; the servers are worth keeping, so the
            // appliance says so once, loudly, and goes on serving (/status lists them failed).
            tokio::select! {
                _ = agent_stop.cancelled() => {}
                _ = &mut reloads => {}
                settled = m.none_running() => if let Settled::Failed(failed) = settled {
                    tracing::error!(
                        "{}; herald up goes on serving its endpoint without notices: fix the cause and reload or restart it",
                        crate::watch::RunError::AllFailed(failed)
                    );
                },
            }
        }
        // (Until the shutdown, a reload may still start watches again.)
        tokio::select! {
            _ = agent_stop.cancelled() => {}
            _ = &mut reloads => {}
        }
        true
    });
    tokio::pin!(watch);
    let ended = tokio::select! {
        _ = &mut watch => true,
        _ = ctx.shutdown().cancelled() => false,
    };
    // systemd hears STOPPING (and the timeout extensions) as soon as the shutdown begins, while
    // the watch client delivers what it still holds, for at most the drain's time.
    ctx.shutdown().cancel();
    let deliver = async {
        if !ended && tokio::time::timeout(app::DRAIN, &mut watch).await.is_err() {
            tracing::warn!(
                "the watch client could not deliver its last notices within {} s; they are dropped",
                app::DRAIN.as_secs()
            );
        }
    };
    tokio::join!(app::stop(&ctx, &globals.systemd), deliver);
    Ok(())
}

/// What a person sees at start: where the endpoint is, what runs behind it, how to try it.
fn banner(
    bound: &Bound,
    cfg: &config::UpConfig,
    demo_dir: Option<&std::path::Path>,
    slack_live: Option<bool>,
    globals: &Globals,
) {
    let url = bound.http_url().unwrap_or_default();
    let store = globals
        .store_path()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| ":memory:".into());
    let mut roles: Vec<String> = cfg.file.roles().iter().map(|r| (*r).to_owned()).collect();
    roles.extend(cfg.slugs.iter().map(|s| s.name.clone()));
    let mut out = format!(
        "\nherald up: {} behind one endpoint (store {store}).",
        roles.join(", ")
    );
    if !url.is_empty() {
        out.push_str(&format!(" Try it:\n\n  herald ls --mcp-http {url}\n"));
        if cfg.file.memo.is_some() {
            out.push_str(&format!(
                "  herald call memo__memo_set key=todo value='\"buy milk\"' --mcp-http {url}\
                 \n  herald read memo://notes --mcp-http {url}\n"
            ));
            if let (Some(q), Some(pin)) = (bound.quic, &bound.quic_fingerprint) {
                out.push_str(&format!(
                    "  herald read memo://log --mcp-quic {q} --tls-pin {pin}\n"
                ));
            }
        }
        if let Some(dir) = demo_dir {
            let d = dir.display();
            out.push_str(&format!(
                "  echo hello > {d}/hello.txt\n  herald read file://{d}/hello.txt --mcp-http {url}\n"
            ));
        }
    }
    if !cfg.watches.is_empty() {
        let names: Vec<&str> = cfg.watches.iter().map(|w| w.1.as_str()).collect();
        out.push_str(&format!(
            "\nThe watch client here prints notices for {} on stdout.",
            names.join(", ")
        ));
    }
    match slack_live {
        Some(true) => out.push_str("\nSlack is live: messages addressed to the bot are watched too."),
        Some(false) => out.push_str(
            "\nSlack is inert (set SLACK_APP_TOKEN, SLACK_BOT_TOKEN and SLACK_EVENTS_ENCRYPTION_KEY to turn it on).",
        ),
        None => {}
    }
    if cfg.tokenless() {
        out.push_str("\nNo [[token]]: callers on this host may use every role without one.");
    }
    out.push_str("\nStop with Ctrl-C.\n");
    eprintln!("{out}");
}
