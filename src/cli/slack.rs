//! `herald slack`: the Slack source. Secrets come from the environment or a credentials
//! directory, never from flags or the config file.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use serde::{Deserialize, Serialize};

use crate::cli::nats::{NatsArgs, NatsToml};
use crate::cli::serve::{ServeArgs, begin, role_store, serve_until_stopped};
use crate::cli::{Exit, Globals, usage};
use std::time::Duration;

use crate::source::slack::api::DEFAULT_API_URL;
use crate::source::slack::buffer::MAX_EVENTS;
use crate::source::slack::settings::Settings;
use crate::source::slack::shared::{self, SharedConfig};
use crate::source::slack::socket::DEFAULT_IDLE;
use crate::source::slack::{Slack, SlackConfig};

#[derive(Debug, Args)]
pub struct SlackArgs {
    #[command(flatten)]
    pub serve: ServeArgs,
    #[command(flatten)]
    pub access: crate::cli::serve::AccessArgs,
    /// A directory holding one file per variable (SLACK_APP_TOKEN, SLACK_BOT_TOKEN,
    /// SLACK_EVENTS_ENCRYPTION_KEY, SLACK_EVENTS_RETENTION_DAYS), read for each one the
    /// environment does not set [default: $CREDENTIALS_DIRECTORY, set by systemd's
    /// LoadCredential=].
    #[arg(long, value_name = "DIR")]
    pub credentials: Option<PathBuf>,
    /// Slack's Web API base URL; apps.connections.open is asked here too (a stand-in for
    /// tests, or an egress proxy) [default: https://slack.com/api/].
    #[arg(long, value_name = "URL")]
    pub slack_api_url: Option<String>,
    /// Most messages the buffer keeps (oldest evicted first) [default: 20000].
    #[arg(long, value_name = "N")]
    pub max_events: Option<usize>,
    /// A Socket Mode connection silent this long is pinged, and taken for dead (and replaced)
    /// 10 s later (or this long later, if shorter).
    #[arg(long, value_name = "MS", default_value_t = 30_000)]
    pub socket_idle_ms: u64,
    /// A TOML file with a [slack] table: api_url, credentials, max_events, socket_idle_ms,
    /// backend, nats_bucket, nats_creds, nats_nkey, nats_tls_ca, lease_heartbeat_ms,
    /// lease_stale_ms. Flags override it.
    #[arg(long, value_name = "FILE.toml")]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub nats: NatsArgs,
    /// With --backend: how often the socket lease's holder renews it.
    #[arg(
        long,
        value_name = "MS",
        default_value_t = 30_000,
        help_heading = "Backend"
    )]
    pub lease_heartbeat_ms: u64,
    /// With --backend: a lease not renewed for this long is taken over by another process
    /// (which then opens the socket and backfills the gap).
    #[arg(
        long,
        value_name = "MS",
        default_value_t = 90_000,
        help_heading = "Backend"
    )]
    pub lease_stale_ms: u64,
}

/// The `[slack]` table.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SlackToml {
    pub api_url: Option<String>,
    /// Relative to the config file.
    pub credentials: Option<PathBuf>,
    pub max_events: Option<usize>,
    pub socket_idle_ms: Option<u64>,
    /// The feed shared on NATS JetStream (`backend`, `nats_*`), as `--backend`.
    #[serde(flatten)]
    pub nats: NatsToml,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_heartbeat_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_stale_ms: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
struct ConfigFile {
    #[serde(default)]
    slack: SlackToml,
}

fn load(path: &Path) -> anyhow::Result<SlackToml> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read config {}", path.display()))?;
    // toml's own Display quotes the offending line: a secret put there by mistake must not
    // reach the log, so only the message and the line number are kept.
    let mut t: ConfigFile = toml::from_str(&text).map_err(|e| {
        anyhow::anyhow!(
            "bad config {}: {}",
            path.display(),
            crate::gateway::config::toml_message(&text, &e)
        )
    })?;
    t.slack.resolve(path.parent().unwrap_or(Path::new(".")));
    Ok(t.slack)
}

impl SlackArgs {
    /// Merges the config file, the flags (flags win) and the environment.
    pub fn config(&self) -> anyhow::Result<SlackConfig> {
        let mut t = match &self.config {
            Some(p) => load(p)?,
            None => SlackToml::default(),
        };
        t.credentials = self.credentials.clone().or(t.credentials);
        t.api_url = self.slack_api_url.clone().or(t.api_url);
        t.max_events = self.max_events.or(t.max_events);
        t.socket_idle_ms = Some(self.socket_idle_ms);
        self.nats.lay_over(&mut t.nats);
        t.lease_heartbeat_ms = Some(self.lease_heartbeat_ms);
        t.lease_stale_ms = Some(self.lease_stale_ms);
        t.to_config()
    }
}

impl SlackToml {
    /// Paths relative to the config file's directory `base`.
    pub fn resolve(&mut self, base: &Path) {
        if let Some(p) = &mut self.credentials
            && p.is_relative()
        {
            *p = base.join(&*p);
        }
        self.nats.resolve(base);
    }

    /// The NATS settings, when `backend` names NATS (checked: what can be without connecting).
    pub fn shared(&self) -> anyhow::Result<Option<SharedConfig>> {
        let Some(nats) = self.nats.config(shared::DEFAULT_BUCKET) else {
            return Ok(None);
        };
        nats.check().map_err(|e| anyhow::anyhow!("{e}"))?;
        let heartbeat = Duration::from_millis(self.lease_heartbeat_ms.unwrap_or(30_000).max(10));
        let stale = Duration::from_millis(self.lease_stale_ms.unwrap_or(90_000));
        if stale < heartbeat * 3 {
            anyhow::bail!(
                "--lease-stale-ms (lease_stale_ms: {} ms) must be at least three times --lease-heartbeat-ms (lease_heartbeat_ms: {} ms): a holder renews every heartbeat and gives the socket up after two thirds of the stale time without a renewal",
                stale.as_millis(),
                heartbeat.as_millis()
            );
        }
        Ok(Some(SharedConfig {
            nats,
            heartbeat,
            stale,
        }))
    }

    /// Every unset field at its default (what `herald up --print-config` shows).
    pub fn with_defaults(mut self) -> SlackToml {
        self.api_url
            .get_or_insert_with(|| DEFAULT_API_URL.to_owned());
        self.max_events.get_or_insert(MAX_EVENTS);
        self.socket_idle_ms
            .get_or_insert(DEFAULT_IDLE.as_millis() as u64);
        self
    }

    /// The Slack role's configuration, its secrets from the environment or the credentials
    /// directory (this table's, else `$CREDENTIALS_DIRECTORY`).
    pub fn to_config(&self) -> anyhow::Result<SlackConfig> {
        let t = self.clone().with_defaults();
        let credentials = t
            .credentials
            .clone()
            .or_else(|| std::env::var_os("CREDENTIALS_DIRECTORY").map(PathBuf::from));
        let settings = Settings::from_env(credentials.as_deref())?;
        let api_url = t.api_url.unwrap_or_else(|| DEFAULT_API_URL.to_owned());
        if !(api_url.starts_with("https://") || api_url.starts_with("http://")) {
            anyhow::bail!("slack api_url {api_url}: give an http:// or https:// URL");
        }
        let max_events = t.max_events.unwrap_or(MAX_EVENTS);
        if max_events == 0 {
            anyhow::bail!("slack max_events must be at least 1");
        }
        Ok(SlackConfig {
            settings,
            api_url,
            max_events,
            socket_idle: std::time::Duration::from_millis(
                t.socket_idle_ms.unwrap_or(30_000).max(100),
            ),
            inert_expected: false,
            shared: self.shared()?,
        })
    }
}

pub async fn run(args: SlackArgs, globals: &Globals) -> Result<(), Exit> {
    let cfg = args.config().map_err(usage)?;
    // On NATS the feed is not kept here: a store only for what else needs one (a QUIC
    // identity, tasks), as the roles without state do.
    let store = match &cfg.shared {
        None => globals.open_store().await?,
        Some(_) => role_store(&args.serve.options(), globals).await?,
    };
    let ctx = crate::cli::serve::role_context("slack");
    let access = args.access.load("slack", &args.serve.options())?;
    let admin = begin(&args.serve, &ctx, globals, &store).await?;
    let source = Slack::open(cfg, store.clone(), &ctx).await?;
    let (source, opts) = (std::sync::Arc::new(source), args.serve.options());
    let source = crate::cli::serve::guarded(access, source, &ctx);
    serve_until_stopped(source, &opts, admin, &store, ctx, globals, None).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slack_table_is_strict_and_flags_win() {
        let dir = std::env::temp_dir().join(format!("herald-slack-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("herald.toml");
        std::fs::write(&p, "[slack]\napi_url = \"http://127.0.0.1:1/api/\"\ncredentials = \"creds\"\nmax_events = 50\n").unwrap();
        let t = load(&p).unwrap();
        assert_eq!(t.credentials, Some(dir.join("creds")));
        assert_eq!(t.max_events, Some(50));
        std::fs::write(&p, "[slack]\ntoken = \"xoxb-no\"\n").unwrap();
        let e = format!("{:#}", load(&p).unwrap_err());
        assert!(e.contains("unknown field `token`"), "{e}");
        assert!(
            !e.contains("xoxb-no"),
            "a secret put in the wrong place is not echoed: {e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
