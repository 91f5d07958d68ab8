//! `herald memo`: the memo source, and `[memo]` of `herald up`: one settings type
//! ([`MemoToml`], its defaults the source's constants), `herald memo`'s flags laid over it, and
//! one [`MemoToml::open`] both run.

use clap::Args;
use serde::{Deserialize, Serialize};

use crate::cli::nats::NatsToml;
use crate::cli::serve::{ServeArgs, begin, role_store, serve_until_stopped};
use crate::cli::{Exit, Globals};
use crate::mcp::ring::DEFAULT_RING_CAPACITY;
use crate::runtime::context::RoleContext;
use crate::source::memo::{DEFAULT_MAX_NOTES_BYTES, Memo, default_max_notes_bytes};
use crate::store::Store;

#[derive(Debug, Args)]
pub struct MemoArgs {
    #[command(flatten)]
    pub serve: ServeArgs,
    #[command(flatten)]
    pub access: crate::cli::serve::AccessArgs,
    /// Events kept in memo://log [default: 256].
    #[arg(long, value_name = "N")]
    pub ring_capacity: Option<usize>,
    /// Most bytes the notes may take in all (keys and values as stored); a memo_set past it is
    /// refused. Half of --max-message-bytes, so memo://notes, read whole as one message, still
    /// fits [default: 2097152 (2 MiB), half the default message limit].
    #[arg(long, value_name = "BYTES")]
    pub max_notes_bytes: Option<usize>,
    #[command(flatten)]
    pub nats: crate::cli::nats::NatsArgs,
    #[command(flatten)]
    pub publish: crate::cli::serve::PublishArgs,
}

/// The memo role's settings: `[memo]` of `herald up`, or `herald memo`'s flags. Every field
/// is optional; [`MemoToml::with_defaults`] fills in the source's defaults.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MemoToml {
    pub ring_capacity: Option<usize>,
    /// Most bytes the notes may take in all (keys and values as stored); a memo_set past it is
    /// refused. Default: [`DEFAULT_MAX_NOTES_BYTES`] (2 MiB, half the message limit).
    pub max_notes_bytes: Option<usize>,
    /// The notes in a NATS JetStream key-value bucket (`backend`, `nats_*`), as
    /// `herald memo --backend` (none: the store).
    #[serde(flatten)]
    pub nats: NatsToml,
}

/// Why memo did not open.
pub enum MemoOpenError {
    /// For good (the store).
    Failed(Exit),
    /// Its NATS backend did not answer, or its bucket could not be opened: it may later.
    NotYet(String),
}

impl MemoToml {
    /// Every unset field at its default (what `herald up --print-config` shows).
    pub fn with_defaults(mut self) -> MemoToml {
        self.ring_capacity.get_or_insert(DEFAULT_RING_CAPACITY);
        self.max_notes_bytes.get_or_insert(DEFAULT_MAX_NOTES_BYTES);
        self
    }

    /// The NATS settings, when `backend` names NATS.
    pub fn nats(&self) -> Option<crate::source::memo::nats::NatsConfig> {
        self.nats.config(crate::source::memo::nats::DEFAULT_BUCKET)
    }

    /// Opens memo as these settings say, on `ctx`: its notes in `store`, or on NATS. Its
    /// notes' bound defaults to half of `max_message_bytes`. `herald memo` and `herald up`
    /// both open it here.
    pub async fn open(
        &self,
        store: &Store,
        ctx: &RoleContext,
        max_message_bytes: usize,
    ) -> Result<Memo, MemoOpenError> {
        let ring = self.ring_capacity.unwrap_or(DEFAULT_RING_CAPACITY);
        let max_notes = self
            .max_notes_bytes
            .unwrap_or_else(|| default_max_notes_bytes(max_message_bytes));
        let memo = match self.nats() {
            None => Memo::open(store.clone(), ring, ctx.tap())
                .await
                .map_err(|e| MemoOpenError::Failed(e.into()))?,
            Some(n) => Memo::open_nats(&n, ring, ctx)
                .await
                .map_err(MemoOpenError::NotYet)?,
        };
        Ok(memo.with_max_notes_bytes(max_notes))
    }
}

pub async fn run(args: MemoArgs, globals: &Globals) -> Result<(), Exit> {
    let ctx = crate::cli::serve::role_context("memo");
    let mut settings = MemoToml {
        ring_capacity: args.ring_capacity,
        max_notes_bytes: args.max_notes_bytes,
        ..MemoToml::default()
    };
    args.nats.lay_over(&mut settings.nats);
    let nats = settings.nats();
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
    let access = args.access.load("memo", &args.serve.options())?;
    let admin = begin(&args.serve, &ctx, globals, &store).await?;
    let published = args.publish.start("memo", &ctx).await?;
    let memo = match settings
        .open(&store, &ctx, args.serve.max_message_bytes)
        .await
    {
        Ok(m) => m,
        Err(MemoOpenError::Failed(e)) => return Err(e),
        Err(MemoOpenError::NotYet(e)) => return Err(anyhow::anyhow!("{e}").into()),
    };
    if let Some(p) = &published {
        p.catalog(&memo).await;
    }
    let (source, opts) = (std::sync::Arc::new(memo), args.serve.options());
    let source = crate::cli::serve::guarded(access, source, &ctx);
    serve_until_stopped(source, &opts, admin, &store, ctx, globals, None).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// The flags and `[memo]` are one type with one set of defaults, the NATS keys included.
    #[test]
    fn flags_lay_over_the_settings_and_share_their_defaults() {
        let table: MemoToml =
            toml::from_str("backend = \"nats://a:1\"\nnats_bucket = \"t\"\n").unwrap();
        let table = table.with_defaults();
        assert_eq!(table.ring_capacity, Some(DEFAULT_RING_CAPACITY));
        assert_eq!(table.max_notes_bytes, Some(DEFAULT_MAX_NOTES_BYTES));
        let cli = crate::cli::Cli::try_parse_from([
            "herald",
            "memo",
            "--backend",
            "nats://b:2",
            "--ring-capacity",
            "9",
        ])
        .unwrap();
        let crate::cli::Command::Memo(a) = cli.command else {
            panic!("herald memo")
        };
        let mut t = table.clone();
        a.nats.lay_over(&mut t.nats);
        let n = t.nats().unwrap();
        assert_eq!((n.urls.as_str(), n.bucket.as_str()), ("nats://b:2", "t"));
        assert_eq!(a.ring_capacity, Some(9));
        assert!(MemoToml::default().nats().is_none());
    }

    /// `--quic ""` (and `--http ""`) turn the endpoint off, as `""` does in `herald up`'s
    /// `[listen]`, instead of failing to listen on an empty address.
    #[test]
    fn an_empty_address_flag_turns_the_endpoint_off() {
        let cli = crate::cli::Cli::try_parse_from([
            "herald", "memo", "--quic", "", "--http", " ", "--admin", "",
        ])
        .unwrap();
        let crate::cli::Command::Memo(a) = cli.command else {
            panic!("herald memo")
        };
        let o = a.serve.options();
        assert_eq!((o.http, o.quic), (None, None));
        assert_eq!(crate::transport::listen_addr(&a.serve.admin), None);
        let cli =
            crate::cli::Cli::try_parse_from(["herald", "memo", "--quic", "127.0.0.1:0"]).unwrap();
        let crate::cli::Command::Memo(a) = cli.command else {
            panic!("herald memo")
        };
        assert_eq!(a.serve.options().quic.as_deref(), Some("127.0.0.1:0"));
    }
}
