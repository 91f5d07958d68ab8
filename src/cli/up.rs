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
    if let (Some(url), crate::cli::LogFormat::Text) = (bound.http_url(), globals.log_format) {
        let store = globals
            .store_path()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| ":memory:".into());
        let pin = bound.quic_fingerprint.clone().unwrap_or_default();
        let quic = bound.quic.map(|a| a.to_string()).unwrap_or_default();
        let demo_dir = demo.display();
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
             \n{demo_events} on stdout.\
             \nStop with Ctrl-C.\n"
        );
    }
    // The demo's watch client: notices for both memo resources and the demo directory on
    // stdout, through the same HTTP endpoints any other client uses.
    let url = bound.http_url().unwrap_or_default();
    let servers = vec![
        upstream(Target::Http(url), Default::default(), 4 << 20),
        upstream(Target::Http(file_url.clone()), Default::default(), 4 << 20),
    ];
    let watches = [
        ("notes", crate::source::memo::NOTES_URI),
        ("memo-log", crate::source::memo::LOG_URI),
        ("demo-files", demo_events.as_str()),
    ]
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
