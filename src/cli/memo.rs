//! `herald memo`: the memo source.

use std::sync::Arc;

use clap::Args;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::app;
use crate::cli::serve::{ServeArgs, announce};
use crate::cli::{Exit, Globals};
use crate::mcp::ring::DEFAULT_RING_CAPACITY;
use crate::source::memo::Memo;

#[derive(Debug, Args)]
pub struct MemoArgs {
    #[command(flatten)]
    pub serve: ServeArgs,
    /// Events kept in memo://log.
    #[arg(long, default_value_t = DEFAULT_RING_CAPACITY)]
    pub ring_capacity: usize,
}

pub async fn run(args: MemoArgs, globals: &Globals) -> Result<(), Exit> {
    let store = globals.open_store().await?;
    let memo = Memo::open(store.clone(), args.ring_capacity).await?;
    let shutdown = CancellationToken::new();
    app::cancel_on_signals(shutdown.clone());
    let tracker = TaskTracker::new();
    let bound = app::serve_source(
        Arc::new(memo),
        &args.serve.options(),
        &store,
        &shutdown,
        &tracker,
    )
    .await
    .map_err(|e| crate::cli::usage(e.into()))?;
    announce(&bound, globals.log_format);
    shutdown.cancelled().await;
    app::drain(tracker).await;
    Ok(())
}
