//! `herald up`: the whole demo pipeline from its embedded default, no config needed.

use std::sync::Arc;

use clap::Args;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::app::{self, ServeOptions};
use crate::cli::serve::announce;
use crate::cli::{Exit, Globals};
use crate::mcp::ring::DEFAULT_RING_CAPACITY;
use crate::source::memo::Memo;
use crate::transport::client::Target;
use crate::watch::log::WatchLog;
use crate::watch::manager::{Server, WatchConfig, WatchManager};
use crate::watch::sink::{self, Sink};

/// Where the embedded default serves HTTP.
pub const DEFAULT_HTTP: &str = "127.0.0.1:8750";
/// Where the embedded default serves QUIC.
pub const DEFAULT_QUIC: &str = "127.0.0.1:8751";

#[derive(Debug, Args)]
pub struct UpArgs {
    /// HTTP address of the demo's endpoint.
    #[arg(long, default_value = DEFAULT_HTTP, value_name = "ADDR")]
    pub http: String,
    /// QUIC address of the demo's endpoint.
    #[arg(long, default_value = DEFAULT_QUIC, value_name = "ADDR")]
    pub quic: String,
}

pub async fn run(args: UpArgs, globals: &Globals) -> Result<(), Exit> {
    let store = globals.open_store().await?;
    let memo = Memo::open(store.clone(), DEFAULT_RING_CAPACITY).await?;
    let shutdown = CancellationToken::new();
    app::cancel_on_signals(shutdown.clone());
    let tracker = TaskTracker::new();
    let opts = ServeOptions {
        http: Some(args.http.clone()),
        quic: Some(args.quic.clone()),
        ..ServeOptions::default()
    };
    let bound = app::serve_source(Arc::new(memo), &opts, &store, &shutdown, &tracker)
        .await
        .map_err(|e| crate::cli::usage(e.into()))?;
    announce(&bound, globals.log_format);
    if let (Some(url), crate::cli::LogFormat::Text) = (bound.http_url(), globals.log_format) {
        let store = globals
            .store_path()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| ":memory:".into());
        let pin = bound.quic_fingerprint.clone().unwrap_or_default();
        let quic = bound.quic.map(|a| a.to_string()).unwrap_or_default();
        eprintln!(
            "\nherald up: the memo source is serving (store {store}). Try it:\n\
             \n  herald call memo_set key=todo value='\"buy milk\"' --mcp-http {url}\
             \n  herald read memo://notes --mcp-http {url}\
             \n  herald read memo://log --mcp-quic {quic} --tls-pin {pin}\
             \n  herald ls --mcp-http {url}\n\
             \nA watch client here prints notices for memo://notes and memo://log on stdout.\
             \nStop with Ctrl-C.\n"
        );
    }
    // The demo's watch client: notices for both memo resources on stdout, through the same
    // HTTP endpoint any other client uses.
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let sink_task = tokio::spawn(sink::run(Sink::Stdout, rx));
    let url = bound.http_url().unwrap_or_default();
    let servers = vec![Server::new(Target::Http(url), Default::default(), 4 << 20)];
    let watcher = WatchManager::new(
        WatchConfig::default(),
        servers,
        tx,
        WatchLog::stderr(false),
        None,
    );
    for (name, uri) in [
        ("notes", crate::source::memo::NOTES_URI),
        ("memo-log", crate::source::memo::LOG_URI),
    ] {
        if let Err(e) = watcher.watch_start(name, uri, None).await {
            tracing::warn!(watch = name, error = %e, "demo watch did not start");
        }
    }
    shutdown.cancelled().await;
    watcher.shutdown().await;
    drop(watcher);
    let _ = sink_task.await;
    app::drain(tracker).await;
    Ok(())
}
