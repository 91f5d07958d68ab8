//! `herald file`: the file source, from flags and/or a small TOML file.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use serde::{Deserialize, Serialize};

use crate::cli::serve::{ServeArgs, begin, role_store, serve_until_stopped};
use crate::cli::{Exit, Globals, usage};
use crate::mcp::ring::DEFAULT_RING_CAPACITY;
use crate::source::file::{
    DEFAULT_DEBOUNCE_MS, DEFAULT_MAX_FILE_BYTES, DEFAULT_MAX_WATCHES, FileConfig, FileSource,
};

#[derive(Debug, Args)]
pub struct FileArgs {
    #[command(flatten)]
    pub serve: ServeArgs,
    #[command(flatten)]
    pub access: crate::cli::serve::AccessArgs,
    #[command(flatten)]
    pub publish: crate::cli::serve::PublishArgs,
    /// A directory to serve (repeatable). Only paths under a root are served; added to the
    /// config file's roots.
    #[arg(long = "root", value_name = "DIR")]
    pub roots: Vec<PathBuf>,
    /// A TOML file: roots = ["/srv/data"], max_file_bytes, debounce_ms, max_watches,
    /// ring_capacity. Flags override it.
    #[arg(long, value_name = "FILE.toml")]
    pub config: Option<PathBuf>,
    /// Largest file served, in bytes [default: 4194304 (4 MiB)].
    #[arg(long, value_name = "BYTES")]
    pub max_file_bytes: Option<u64>,
    /// Changes to one path within this window become one event [default: 50].
    #[arg(long, value_name = "MS")]
    pub debounce_ms: Option<u64>,
    /// Most directories watched at once [default: 8192].
    #[arg(long, value_name = "N")]
    pub max_watches: Option<usize>,
    /// Events kept per file-events URI [default: 256].
    #[arg(long, value_name = "N")]
    pub ring_capacity: Option<usize>,
}

/// The config file. Every field is optional; flags win.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileToml {
    /// Directories to serve; relative paths are relative to the config file.
    #[serde(default)]
    pub roots: Vec<PathBuf>,
    pub max_file_bytes: Option<u64>,
    pub debounce_ms: Option<u64>,
    pub max_watches: Option<usize>,
    pub ring_capacity: Option<usize>,
}

impl FileArgs {
    /// Merges the config file and the flags (flags win).
    pub fn settings(&self) -> anyhow::Result<FileToml> {
        let mut t = match &self.config {
            Some(p) => load(p)?,
            None => FileToml::default(),
        };
        t.roots.extend(self.roots.iter().cloned());
        t.max_file_bytes = self.max_file_bytes.or(t.max_file_bytes);
        t.debounce_ms = self.debounce_ms.or(t.debounce_ms);
        t.max_watches = self.max_watches.or(t.max_watches);
        t.ring_capacity = self.ring_capacity.or(t.ring_capacity);
        Ok(t)
    }
}

impl FileToml {
    /// Every unset field at its default (what `herald up --print-config` shows).
    pub fn with_defaults(mut self) -> FileToml {
        self.max_file_bytes.get_or_insert(DEFAULT_MAX_FILE_BYTES);
        self.debounce_ms.get_or_insert(DEFAULT_DEBOUNCE_MS);
        self.max_watches.get_or_insert(DEFAULT_MAX_WATCHES);
        self.ring_capacity.get_or_insert(DEFAULT_RING_CAPACITY);
        self
    }

    /// The file source these settings describe, on `ctx`: `herald file` and `herald up` both
    /// build it here.
    pub fn build(&self, ctx: &crate::runtime::context::RoleContext) -> Result<FileSource, Exit> {
        let cfg = self.to_config().map_err(usage)?;
        FileSource::new(cfg, ctx).map_err(|e| usage(anyhow::anyhow!("file: {e}")))
    }

    /// The file source's configuration.
    pub fn to_config(&self) -> anyhow::Result<FileConfig> {
        if self.roots.is_empty() {
            anyhow::bail!(
                "no roots to serve; pass --root DIR (repeatable) or roots = [...] in the config"
            );
        }
        let t = self.clone().with_defaults();
        Ok(FileConfig {
            roots: t.roots,
            max_file_bytes: t.max_file_bytes.unwrap_or(DEFAULT_MAX_FILE_BYTES),
            debounce: Duration::from_millis(t.debounce_ms.unwrap_or(DEFAULT_DEBOUNCE_MS)),
            max_watches: t.max_watches.unwrap_or(DEFAULT_MAX_WATCHES),
            ring_capacity: t.ring_capacity.unwrap_or(DEFAULT_RING_CAPACITY),
        })
    }
}

fn load(path: &Path) -> anyhow::Result<FileToml> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read config {}", path.display()))?;
    let mut t: FileToml =
        toml::from_str(&text).with_context(|| format!("bad config {}", path.display()))?;
    let base = path.parent().unwrap_or(Path::new("."));
    for r in &mut t.roots {
        if r.is_relative() {
            *r = base.join(&*r);
        }
    }
    Ok(t)
}

pub async fn run(args: FileArgs, globals: &Globals) -> Result<(), Exit> {
    let settings = args.settings().map_err(usage)?;
    // Refused before anything binds.
    settings.to_config().map_err(usage)?;
    let ctx = crate::cli::serve::role_context("file");
    let store = role_store(&args.serve.options(), globals).await?;
    let access = args.access.load("file", &args.serve.options())?;
    let admin = begin(&args.serve, &ctx, globals, &store).await?;
    let published = args.publish.start("file", &ctx).await?;
    let source = settings.build(&ctx)?;
    if let Some(p) = &published {
        p.catalog(&source).await;
    }
    let (source, opts) = (std::sync::Arc::new(source), args.serve.options());
    let source = crate::cli::serve::guarded(access, source, &ctx);
    serve_until_stopped(source, &opts, admin, &store, ctx, globals, None).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_file_is_strict_and_flags_win() {
        let dir = std::env::temp_dir().join(format!("herald-file-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("file.toml");
        std::fs::write(
            &p,
            "roots = [\"data\"]\ndebounce_ms = 10\nmax_watches = 5\n",
        )
        .unwrap();
        let args = FileArgs {
            access: Default::default(),
            serve: ServeArgs {
                http: None,
                quic: None,
                stdio: false,
                admin: None,
                tls_cert: None,
                tls_key: None,
                allowed_hosts: vec![],
                allowed_origins: vec![],
                max_listen_streams: 1,
                max_caller_listen_streams: 1,
                max_total_listen_streams: 1,
                trusted_proxies: vec![],
                max_event_streams: 1,
                callback_allow: vec![],
                events_profile: Default::default(),
                max_listen_uris: 1,
                max_message_bytes: 1,
                listen_stall_ms: 1,
                max_connections: 1,
                http_idle_timeout_ms: 1,
                http_header_timeout_ms: 1,
                http_body_timeout_ms: 1,
                session_idle_timeout_ms: 1,
            },
            roots: vec!["/extra".into()],
            config: Some(p.clone()),
            max_file_bytes: None,
            debounce_ms: None,
            max_watches: Some(7),
            ring_capacity: None,
            publish: Default::default(),
        };
        let c = args.settings().and_then(|t| t.to_config()).unwrap();
        assert_eq!(c.roots, [dir.join("data"), PathBuf::from("/extra")]);
        assert_eq!(c.debounce, Duration::from_millis(10));
        assert_eq!(c.max_watches, 7, "the flag wins");
        assert_eq!(c.max_file_bytes, DEFAULT_MAX_FILE_BYTES);
        std::fs::write(&p, "roots = []\nwatches = 5\n").unwrap();
        let e = format!(
            "{:#}",
            args.settings().and_then(|t| t.to_config()).unwrap_err()
        );
        assert!(e.contains("unknown field `watches`"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
