//! `herald up`: the whole demo pipeline from its embedded default, no config needed.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;

use crate::app::{self, ServeOptions};
use crate::cli::serve::announce;
use crate::cli::{Exit, Globals};
use crate::mcp::context::RoleContext;
use crate::mcp::ring::DEFAULT_RING_CAPACITY;
use crate::source::file::{FileConfig, FileSource};
use crate::source::memo::Memo;
use crate::source::slack::filter::EVENTS_URI as SLACK_EVENTS;
use crate::source::slack::settings::Settings;
use crate::source::slack::{Slack, SlackConfig};
use crate::transport::client::Target;
use crate::watch::log::WatchLog;
use crate::watch::sink::Sink;
use crate::watch::{WatchConfig, WatchOptions, WatchSpec, upstream};

/// Where the embedded default serves HTTP.
pub const DEFAULT_HTTP: &str = "127.0.0.1:8750";
/// Where the embedded default serves QUIC.
pub const DEFAULT_QUIC: &str = "127.0.0.1:8751";
/// Where the embedded default serves the file source over HTTP.
pub const DEFAULT_FILE_HTTP: &str = "127.0.0.1:8752";
/// The directory the demo's file source serves (created if missing).
pub const DEFAULT_DEMO_DIR: &str = "herald-demo";
/// Where the embedded default serves the Slack source over HTTP.
pub const DEFAULT_SLACK_HTTP: &str = "127.0.0.1:8754";

#[derive(Debug, Args)]
pub struct UpArgs {
    /// HTTP address of the demo's endpoint.
    #[arg(long, default_value = DEFAULT_HTTP, value_name = "ADDR")]
    pub http: String,
    /// QUIC address of the demo's endpoint.
    #[arg(long, default_value = DEFAULT_QUIC, value_name = "ADDR")]
    pub quic: String,
    /// HTTP address of the demo's file source.
    #[arg(long, default_value = DEFAULT_FILE_HTTP, value_name = "ADDR")]
    pub file_http: String,
    /// The directory the demo's file source serves and watches (created if missing).
    #[arg(long, default_value = DEFAULT_DEMO_DIR, value_name = "DIR")]
    pub demo_dir: PathBuf,
    /// HTTP address of the demo's Slack source (inert until the SLACK_* variables are set).
    #[arg(long, default_value = DEFAULT_SLACK_HTTP, value_name = "ADDR")]
    pub slack_http: String,
}

pub async fn run(args: UpArgs, globals: &Globals) -> Result<(), Exit> {
    let store = globals.open_store().await?;
    let memo = Memo::open(store.clone(), DEFAULT_RING_CAPACITY).await?;
    let ctx = RoleContext::new("memo");
    let shutdown = ctx.shutdown().clone();
    app::cancel_on_signals(shutdown.clone());
    let opts = ServeOptions {
        http: Some(args.http.clone()),
        quic: Some(args.quic.clone()),
        ..ServeOptions::default()
    };
    let bound = app::serve_source(Arc::new(memo), &opts, &store, &ctx)
        .await
        .map_err(|e| crate::cli::usage(e.into()))?;
    announce(&bound, globals.log_format);
    // The file source on ./herald-demo, on its own HTTP endpoint.
    std::fs::create_dir_all(&args.demo_dir).map_err(|e| {
        crate::cli::usage(anyhow::anyhow!(
            "cannot create the demo directory {}: {e}; pass --demo-dir DIR",
            args.demo_dir.display()
        ))
    })?;
    let file_ctx = ctx.for_role("file");
    let files = FileSource::new(
        FileConfig {
            roots: vec![args.demo_dir.clone()],
            ..FileConfig::default()
        },
        &file_ctx,
    )
    .map_err(|e| crate::cli::usage(e.into()))?;
    let demo = files.roots()[0].clone();
    let file_opts = ServeOptions {
        http: Some(args.file_http.clone()),
        ..ServeOptions::default()
    };
    let file_bound = app::serve_source(Arc::new(files), &file_opts, &store, &file_ctx)
        .await
        .map_err(|e| crate::cli::usage(e.into()))?;
    announce(&file_bound, globals.log_format);
    let demo_events = crate::source::file::events_uri(&demo, true);
    let file_url = file_bound.http_url().unwrap_or_default();
    // The Slack source: live when the SLACK_* variables (or $CREDENTIALS_DIRECTORY's files)
    // are there, inert otherwise.
    let slack_settings = Settings::from_env(
        std::env::var_os("CREDENTIALS_DIRECTORY")
            .map(PathBuf::from)
            .as_deref(),
    )
    .map_err(|e| crate::cli::usage(e.into()))?;
    let slack_ctx = ctx.for_role("slack");
    let slack = Slack::open(SlackConfig::new(slack_settings), store.clone(), &slack_ctx).await?;
    let slack_live = slack.configured();
    let slack_opts = ServeOptions {
        http: Some(args.slack_http.clone()),
        ..ServeOptions::default()
    };
    let slack_bound = app::serve_source(Arc::new(slack), &slack_opts, &store, &slack_ctx)
        .await
        .map_err(|e| crate::cli::usage(e.into()))?;
    announce(&slack_bound, globals.log_format);
    let slack_url = slack_bound.http_url().unwrap_or_default();
    if let (Some(url), crate::cli::LogFormat::Text) = (bound.http_url(), globals.log_format) {
        let store = globals
            .store_path()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| ":memory:".into());
        let pin = bound.quic_fingerprint.clone().unwrap_or_default();
        let quic = bound.quic.map(|a| a.to_string()).unwrap_or_default();
        let demo_dir = demo.display();
        let slack_line = if slack_live {
            format!("Slack is live at {slack_url}: messages addressed to the bot are watched too.")
        } else {
            format!(
                "Slack is inert at {slack_url} (set SLACK_APP_TOKEN, SLACK_BOT_TOKEN and\
                 \nSLACK_EVENTS_ENCRYPTION_KEY to turn it on; see the README)."
            )
        };
        eprintln!(
            "\nherald up: the memo source is serving (store {store}), and the file source\
             \nserves {demo_dir}. Try it:\n\
             \n  herald call memo_set key=todo value='\"buy milk\"' --mcp-http {url}\
             \n  herald read memo://notes --mcp-http {url}\
             \n  herald read memo://log --mcp-quic {quic} --tls-pin {pin}\
             \n  herald ls --mcp-http {url}\
             \n  echo hello > {demo_dir}/hello.txt\
             \n  herald read file://{demo_dir}/hello.txt --mcp-http {file_url}\n\
             \nA watch client here prints notices for memo://notes, memo://log and\
             \n{demo_events} on stdout.\n\
             \n{slack_line}\
             \nStop with Ctrl-C.\n"
        );
    }
    // The demo's watch client: notices for both memo resources and the demo directory on
    // stdout, through the same HTTP endpoints any other client uses.
    let url = bound.http_url().unwrap_or_default();
    let mut servers = vec![
        upstream(Target::Http(url), Default::default(), 4 << 20),
        upstream(Target::Http(file_url.clone()), Default::default(), 4 << 20),
    ];
    let mut watches = vec![
        ("notes", crate::source::memo::NOTES_URI),
        ("memo-log", crate::source::memo::LOG_URI),
        ("demo-files", demo_events.as_str()),
    ];
    let slack_watch = format!("{SLACK_EVENTS}?addressed_to_bot=true");
    if slack_live {
        servers.push(upstream(
            Target::Http(slack_url),
            Default::default(),
            4 << 20,
        ));
        watches.push(("slack", slack_watch.as_str()));
    }
    let watches = watches
        .into_iter()
        .map(|(name, uri)| WatchSpec {
            name: name.into(),
            uri: uri.into(),
            on_event: None,
        })
        .collect();
    let opts = WatchOptions {
        config: WatchConfig::default(),
        servers,
        sink: Sink::Stdout,
        log: WatchLog::stderr(false),
        store: None,
        filters: None,
        watches,
        require_watches: false,
    };
    // Not required, so this never fails: a demo watch that cannot start is logged.
    let _ = crate::watch::run(opts, shutdown.clone(), async |_| true).await;
    app::drain(&ctx).await;
    Ok(())
}
