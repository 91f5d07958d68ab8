//! `herald memo`: the memo source.

use crate::mcp::context::RoleContext;
use clap::Args;

use crate::cli::serve::{ServeArgs, begin, serve_until_stopped};
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
    let ctx = RoleContext::new("memo");
    let store = globals.open_store().await?;
    let admin = begin(&args.serve, &ctx, globals, &store).await?;
    let memo = Memo::open(store.clone(), args.ring_capacity).await?;
    serve_until_stopped(memo, &args.serve.options(), admin, &store, ctx, globals).await
}
