//! `herald memo`: the memo source.

use clap::Args;

use crate::cli::serve::{ServeArgs, begin, role_store, serve_until_stopped};
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
    #[command(flatten)]
    pub nats: NatsArgs,
    #[command(flatten)]
    pub publish: crate::cli::serve::PublishArgs,
}

/// Where a role keeps its state: the embedded store (the default) or NATS JetStream.
#[derive(Debug, Args)]
#[command(next_help_heading = "Backend")]
pub struct NatsArgs {
    /// Keep this role's state on NATS JetStream, shared with other hosts, instead of the
    /// store: nats://HOST:PORT (comma-separated for a cluster; tls://… for TLS)
    /// [default: the embedded store].
    #[arg(long, value_name = "URL")]
    pub backend: Option<String>,
    /// The key-value bucket (with --backend) [default: herald_memo for memo, herald_slack for
    /// slack].
    #[arg(long, value_name = "NAME")]
    pub nats_bucket: Option<String>,
    /// A NATS credentials file (.creds: JWT and nkey seed) [default: none].
    #[arg(long, value_name = "FILE")]
    pub nats_creds: Option<std::path::PathBuf>,
    /// A file holding an nkey seed [default: none].
    #[arg(long, value_name = "FILE")]
    pub nats_nkey: Option<std::path::PathBuf>,
    /// A CA certificate (PEM) to verify the NATS servers with; TLS is then required
    /// [default: none].
    #[arg(long, value_name = "FILE")]
    pub nats_tls_ca: Option<std::path::PathBuf>,
}

impl NatsArgs {
    /// The NATS settings, when --backend names NATS.
    pub fn config(&self) -> Option<crate::source::memo::nats::NatsConfig> {
        let urls = self.backend.clone()?;
        Some(crate::source::memo::nats::NatsConfig {
            urls,
            creds: self.nats_creds.clone(),
            nkey: self.nats_nkey.clone(),
            tls_ca: self.nats_tls_ca.clone(),
            bucket: self
                .nats_bucket
                .clone()
                .unwrap_or_else(|| crate::source::memo::nats::DEFAULT_BUCKET.to_owned()),
        })
    }
}

pub async fn run(args: MemoArgs, globals: &Globals) -> Result<(), Exit> {
    let ctx = crate::cli::serve::role_context("memo");
    let nats = args.nats.config();
    if let Some(n) = &nats {
        n.check()
            .map_err(|e| crate::cli::usage(anyhow::anyhow!("{e}")))?;
    }
    // With NATS the notes are not kept here: a store only for what else needs one (a QUIC
    // identity, tasks), as the roles without state do.
    let store = match &nats {
        None => globals.open_store().await?,
        Some(_) => role_store(&args.serve.options(), globals).await?,
    };
    let admin = begin(&args.serve, &ctx, globals, &store).await?;
    let published = args.publish.start("memo", &ctx).await?;
    let max_notes = args
        .max_notes_bytes
        .unwrap_or(default_max_notes_bytes(args.serve.max_message_bytes));
    let memo = match &nats {
        None => Memo::open(store.clone(), args.ring_capacity, ctx.tap()).await?,
        Some(n) => Memo::open_nats(n, args.ring_capacity, &ctx)
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?,
    }
    .with_max_notes_bytes(max_notes);
    if let Some(p) = &published {
        p.catalog(&memo).await;
    }
    serve_until_stopped(memo, &args.serve.options(), admin, &store, ctx, globals).await
}
