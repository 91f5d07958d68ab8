//! `herald memo`: the memo source.

use crate::mcp::context::RoleContext;
use clap::Args;

use crate::cli::serve::{ServeArgs, begin, serve_until_stopped};
use crate::cli::{Exit, Globals};
use crate::mcp::ring::DEFAULT_RING_CAPACITY;
use crate::source::memo::{Memo, default_max_notes_bytes};

#[derive(Debug, Args)]
pub struct MemoArgs {
    #[command(flatten)]
    pub serve: ServeArgs,
    /// Events kept in memo://log.
    #[arg(long, default_value_t = DEFAULT_RING_CAPACITY, value_name = "N")]
    pub ring_capacity: usize,
    /// Most bytes the notes may take in all (keys and values as stored); a memo_set past it is
    /// refused. Half of --max-message-bytes, so memo://notes, read whole as one message, still
    /// fits [default: 2097152 (2 MiB), half the default message limit].
    #[arg(long, value_name = "BYTES")]
    pub max_notes_bytes: Option<usize>,
}

pub async fn run(args: MemoArgs, globals: &Globals) -> Result<(), Exit> {
    let ctx = RoleContext::new("memo");
    let store = globals.open_store().await?;
    let admin = begin(&args.serve, &ctx, globals, &store).await?;
    let max_notes = args
        .max_notes_bytes
        .unwrap_or(default_max_notes_bytes(args.serve.max_message_bytes));
    let memo = Memo::open(store.clone(), args.ring_capacity)
        .await?
        .with_max_notes_bytes(max_notes);
    serve_until_stopped(memo, &args.serve.options(), admin, &store, ctx, globals).await
}
