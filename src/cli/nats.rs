//! The NATS settings a role keeps its state with, one type each way in: [`NatsToml`], the keys
//! of a role's table (`[memo]`, `[slack]`: `backend`, `nats_bucket`, `nats_creds`, `nats_nkey`,
//! `nats_tls_ca`, flattened into it), and [`NatsArgs`], the same as flags (`herald memo`,
//! `herald slack`), laid over the table's. Both roles make their `NatsConfig` here.

use std::path::{Path, PathBuf};

use clap::Args;
use serde::{Deserialize, Serialize};

use crate::nats::NatsConfig;

/// Where a role keeps its state: the embedded store (the default) or NATS JetStream.
#[derive(Debug, Args)]
#[command(next_help_heading = "Backend")]
pub struct NatsArgs {
    /// Keep this role's state on NATS JetStream, shared with other hosts, instead of the
    /// store: nats://HOST:PORT (comma-separated for a cluster; tls://… for TLS;
    /// nats://USER:PASSWORD@HOST:PORT with a user and password) [default: the embedded
    /// store].
    #[arg(long, value_name = "URL")]
    pub backend: Option<String>,
    /// The key-value bucket (with --backend) [default: herald_memo for memo, herald_slack for
    /// slack, herald_gateway for gateway].
    #[arg(long, value_name = "NAME")]
    pub nats_bucket: Option<String>,
    /// A NATS credentials file (.creds: JWT and nkey seed) [default: none].
    #[arg(long, value_name = "FILE")]
    pub nats_creds: Option<PathBuf>,
    /// A file holding an nkey seed [default: none].
    #[arg(long, value_name = "FILE")]
    pub nats_nkey: Option<PathBuf>,
    /// A CA certificate (PEM) to verify the NATS servers with; TLS is then required
    /// [default: none].
    #[arg(long, value_name = "FILE")]
    pub nats_tls_ca: Option<PathBuf>,
}

/// A role table's NATS keys (flattened into it: `[memo] backend = "nats://…"`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct NatsToml {
    /// `nats://HOST:PORT[,…]`: the role's state on NATS JetStream, as `--backend` (none: the
    /// store).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nats_bucket: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nats_creds: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nats_nkey: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nats_tls_ca: Option<PathBuf>,
}

impl NatsArgs {
    /// The flags laid over `t` (each given flag wins).
    pub fn lay_over(&self, t: &mut NatsToml) {
        t.backend = self.backend.clone().or(t.backend.take());
        t.nats_bucket = self.nats_bucket.clone().or(t.nats_bucket.take());
        t.nats_creds = self.nats_creds.clone().or(t.nats_creds.take());
        t.nats_nkey = self.nats_nkey.clone().or(t.nats_nkey.take());
        t.nats_tls_ca = self.nats_tls_ca.clone().or(t.nats_tls_ca.take());
    }
}

impl NatsToml {
    /// The connection settings, when `backend` names NATS; the bucket `default_bucket` unless
    /// set.
    pub fn config(&self, default_bucket: &str) -> Option<NatsConfig> {
        Some(NatsConfig {
            urls: self.backend.clone()?,
            creds: self.nats_creds.clone(),
            nkey: self.nats_nkey.clone(),
            tls_ca: self.nats_tls_ca.clone(),
            bucket: self
                .nats_bucket
                .clone()
                .unwrap_or_else(|| default_bucket.to_owned()),
        })
    }

    /// Its files relative to the config file's directory `base`.
    pub fn resolve(&mut self, base: &Path) {
        for p in [
            &mut self.nats_creds,
            &mut self.nats_nkey,
            &mut self.nats_tls_ca,
        ]
        .into_iter()
        .flatten()
        {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        }
    }
}
