//! `herald watch`: the headless watch client. Watches from flags or a TOML config; notices to
//! stdout (the `<watch-event>` block on a terminal, else or with `--json` NDJSON), a command,
//! or a webhook. It exits once no watch runs: 0 when each ended, 1 when those left failed.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::app;
use crate::cli::client::ConnectTimeout;
use crate::cli::{Exit, Globals, usage};
use crate::filter::pool::PoolConfig;
use crate::transport::target::Target;
use crate::transport::tls::ClientTrust;
use crate::upstream::{Upstream, UpstreamConfig};
use crate::watch::log::WatchLog;
use crate::watch::sink::Sink;
use crate::watch::{Restart, WatchConfig, WatchOptions, WatchSpec, upstream_config};
use anyhow::{Context, anyhow};
use clap::Args;
use serde::Deserialize;

#[derive(Debug, Args)]
pub struct WatchArgs {
    #[command(flatten)]
    pub servers: ServerFlags,
    /// TOML config with [[server]], [[watch]] and [limits]; flags add to it and override limits
    /// [default: none].
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// A watch to start (repeatable). A watch that cannot start makes herald exit non-zero.
    /// `NAME=task:ID` (or `task://ID`) watches a task: a notice per status change, and the
    /// watch ends with the task (herald exits once every watch has ended).
    /// `NAME=events:TYPE?ARG=VALUE` follows an event type: its events pushed by events/stream.
    #[arg(long = "watch", value_name = "NAME=URI")]
    pub watches: Vec<String>,
    /// Python source file run once per event (`FILE.py` when there is one watch, else
    /// `NAME=FILE.py`; repeatable). It sees `event`; what it leaves (or prints) becomes the
    /// notice line, and `None` with nothing printed drops the event.
    #[arg(long = "on-event", value_name = "[NAME=]FILE.py")]
    pub on_event: Vec<String>,
    /// Processes that run the filters.
    #[arg(long, default_value_t = 2, value_name = "N")]
    pub filter_workers: usize,
    /// Memory cap of each filter process, in bytes (at least 16 MiB) [default: 268435456
    /// (256 MiB)].
    #[arg(long, default_value_t = 256 * 1024 * 1024, hide_default_value = true, value_name = "BYTES")]
    pub filter_memory_bytes: u64,
    /// Time limit of one filter run (per event), in ms.
    #[arg(long, default_value_t = 2000, value_name = "MS")]
    pub filter_time_ms: u64,
    /// Run CMD (with `sh -c`) per notice, the notice text on its stdin and HERALD_WATCH /
    /// HERALD_URI in its environment; one run at a time per watch.
    #[arg(long, value_name = "CMD", conflicts_with = "webhook")]
    pub exec: Option<String>,
    /// POST each notice as JSON to URL.
    #[arg(long, value_name = "URL")]
    pub webhook: Option<String>,
    /// Print notices as NDJSON even on a terminal (they are NDJSON whenever stdout is not a
    /// terminal; on one, each is its `<watch-event>` block).
    #[arg(long)]
    pub json: bool,
    /// Save watch specs in the store on every start and stop, and restart them at start.
    #[arg(long)]
    pub watch_state: bool,
    // The limits below override the config's [limits], so a flag left out must stay unset:
    // each states its default (WatchConfig's, checked by a test) instead of clap's.
    /// Quiet time before a notice goes out (trailing debounce) [default: 3000].
    #[arg(long, value_name = "MS")]
    pub debounce_ms: Option<u64>,
    /// Longest a burst is held after its first line [default: 15000].
    #[arg(long, value_name = "MS")]
    pub max_wait_ms: Option<u64>,
    /// Most lines per notice; the rest become `+N more` [default: 20].
    #[arg(long, value_name = "N")]
    pub max_lines: Option<usize>,
    /// Most events processed per update [default: 100].
    #[arg(long, value_name = "N")]
    pub max_events: Option<usize>,
    /// Most watches at once [default: 5].
    #[arg(long, value_name = "N")]
    pub max_watches: Option<usize>,
    /// First resubscribe delay; doubles per attempt [default: 1000].
    #[arg(long, value_name = "MS")]
    pub resubscribe_base_ms: Option<u64>,
    /// Resubscribe attempts before a watch fails [default: 5].
    #[arg(long, value_name = "N")]
    pub resubscribe_attempts: Option<u32>,
}

/// `herald watch --config FILE`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WatchFile {
    #[serde(default)]
    pub server: Vec<ServerEntry>,
    #[serde(default)]
    pub watch: Vec<WatchEntry>,
    #[serde(default)]
    pub limits: LimitsEntry,
}

/// One server: exactly one of `stdio`, `http`, `quic`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerEntry {
    pub stdio: Option<String>,
    pub http: Option<String>,
    pub quic: Option<String>,
    pub tls_ca: Option<PathBuf>,
    pub tls_pin: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WatchEntry {
    pub name: String,
    pub uri: String,
    /// Python source run once per event.
    pub on_event: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsEntry {
    pub debounce_ms: Option<u64>,
    pub max_wait_ms: Option<u64>,
    pub max_lines: Option<usize>,
    pub max_events: Option<usize>,
    pub max_watches: Option<usize>,
    pub resubscribe_base_ms: Option<u64>,
    pub resubscribe_attempts: Option<u32>,
}

impl WatchFile {
    pub fn load(path: &std::path::Path) -> anyhow::Result<WatchFile> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        // Not toml's own Display, which quotes the offending line (it may hold a token).
        let file: WatchFile = toml::from_str(&text).map_err(|e| {
            anyhow!(
                "{} is not a valid watch config: {}",
                path.display(),
                crate::gateway::config::toml_message(&text, &e)
            )
        })?;
        for (i, s) in file.server.iter().enumerate() {
            let n = [&s.stdio, &s.http, &s.quic]
                .iter()
                .filter(|x| x.is_some())
                .count();
            if n != 1 {
                return Err(anyhow!(
                    "{}: [[server]] #{} needs exactly one of stdio, http, quic",
                    path.display(),
                    i + 1
                ));
            }
        }
        Ok(file)
    }
}

/// Servers given on the command line, shared by `herald watch` and `herald code`: each of
/// `--mcp-stdio`, `--mcp-http`, `--mcp-quic` repeatable, with one trust setting for QUIC.
#[derive(Debug, Args)]
pub struct ServerFlags {
    /// A server to run and speak to over stdio (repeatable).
    #[arg(long, value_name = "CMD")]
    pub mcp_stdio: Vec<String>,
    /// A Streamable HTTP server (repeatable).
    #[arg(long, value_name = "URL")]
    pub mcp_http: Vec<String>,
    /// A QUIC server HOST:PORT (repeatable).
    #[arg(long, value_name = "HOST:PORT")]
    pub mcp_quic: Vec<String>,
    /// CA file (PEM) trusted for QUIC servers given on the command line.
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// Certificate fingerprint pinned for QUIC servers given on the command line.
    #[arg(long, value_name = "SHA256")]
    pub tls_pin: Option<String>,
    #[command(flatten)]
    pub timeout: ConnectTimeout,
    /// The global `--store`: where an HTTP server's OAuth tokens are kept (`herald login`).
    #[arg(skip)]
    pub store: Option<String>,
}

impl ServerFlags {
    /// The servers, in flag order: stdio, then HTTP, then QUIC. An HTTP URL without its
    /// scheme is bad usage.
    pub fn servers(&self, max_message_bytes: usize) -> Result<Vec<Arc<Upstream>>, Exit> {
        let trust = ClientTrust {
            ca: self.tls_ca.clone(),
            pin: self.tls_pin.clone(),
            token: crate::transport::tls::Secret::from_env(),
            oauth: None,
        };
        let targets = self
            .mcp_stdio
            .iter()
            .map(|c| Target::Stdio(c.clone()))
            .chain(self.mcp_http.iter().map(|u| Target::Http(u.clone())))
            .chain(self.mcp_quic.iter().map(|q| Target::Quic(q.clone())));
        let kept = crate::cli::client::kept_tokens(self.store.as_deref());
        targets
            .map(|t| {
                let trust = ClientTrust {
                    oauth: crate::cli::client::oauth_for(&t, &kept),
                    ..trust.clone()
                };
                self.upstream(t, trust, max_message_bytes)
            })
            .collect()
    }

    /// The watch client's upstream for `target`, with this command's connect timeout.
    fn upstream(
        &self,
        target: Target,
        trust: ClientTrust,
        max_message_bytes: usize,
    ) -> Result<Arc<Upstream>, Exit> {
        crate::cli::client::check_target(&target, trust.pin.as_deref())?;
        Ok(Arc::new(Upstream::new(UpstreamConfig {
            handshake_timeout: self.timeout.duration(),
            ..upstream_config(target, trust, max_message_bytes)
        })))
    }
}

fn parse_watch(s: &str) -> anyhow::Result<(String, String)> {
    let (name, uri) = s
        .split_once('=')
        .ok_or_else(|| anyhow!("--watch {s:?} is not NAME=URI"))?;
    if name.is_empty() || uri.is_empty() {
        return Err(anyhow!("--watch {s:?} is not NAME=URI"));
    }
    // `task:ID` is short for `task://ID`.
    if let Some(id) = uri.strip_prefix("task:")
        && !id.starts_with("//")
    {
        return Ok((name.to_owned(), format!("task://{id}")));
    }
    Ok((name.to_owned(), uri.to_owned()))
}

fn config(args: &WatchArgs, file: &LimitsEntry) -> WatchConfig {
    let mut cfg = WatchConfig {
        // Nothing here starts a watch again: herald watch exits once none runs.
        restart: Restart::HeraldWatch,
        ..WatchConfig::default()
    };
    let ms = Duration::from_millis;
    if let Some(v) = args.debounce_ms.or(file.debounce_ms) {
        cfg.debounce.quiet = ms(v);
    }
    if let Some(v) = args.max_wait_ms.or(file.max_wait_ms) {
        cfg.debounce.max_wait = ms(v);
    }
    if let Some(v) = args.max_lines.or(file.max_lines) {
        cfg.debounce.max_lines = v;
    }
    if let Some(v) = args.max_events.or(file.max_events) {
        cfg.max_events_per_update = v;
    }
    if let Some(v) = args.max_watches.or(file.max_watches) {
        cfg.max_watches = v;
    }
    if let Some(v) = args.resubscribe_base_ms.or(file.resubscribe_base_ms) {
        cfg.resubscribe_base = ms(v);
    }
    if let Some(v) = args.resubscribe_attempts.or(file.resubscribe_attempts) {
        cfg.resubscribe_attempts = v;
    }
    cfg
}

pub async fn run(args: WatchArgs, globals: &Globals, verbose: bool) -> Result<(), Exit> {
    let file = match &args.config {
        Some(p) => WatchFile::load(p).map_err(usage)?,
        None => WatchFile::default(),
    };
    let cfg = config(&args, &file.limits);
    let kept = crate::cli::client::kept_tokens(args.servers.store.as_deref());
    let mut servers = Vec::new();
    for s in &file.server {
        let target = match (&s.stdio, &s.http, &s.quic) {
            (Some(c), _, _) => Target::Stdio(c.clone()),
            (_, Some(u), _) => Target::Http(u.clone()),
            (_, _, Some(q)) => Target::Quic(q.clone()),
            _ => unreachable!("checked by WatchFile::load"),
        };
        let trust = ClientTrust {
            ca: s.tls_ca.clone(),
            pin: s.tls_pin.clone(),
            token: crate::transport::tls::Secret::from_env(),
            oauth: crate::cli::client::oauth_for(&target, &kept),
        };
        servers.push(
            args.servers
                .upstream(target, trust, cfg.max_message_bytes)?,
        );
    }
    servers.extend(args.servers.servers(cfg.max_message_bytes)?);
    if servers.is_empty() {
        return Err(usage(anyhow!(
            "no server to watch: pass --mcp-stdio, --mcp-http or --mcp-quic, or a --config with [[server]]"
        )));
    }
    let mut watches: Vec<(String, String, Option<String>)> = file
        .watch
        .iter()
        .map(|w| (w.name.clone(), w.uri.clone(), w.on_event.clone()))
        .collect();
    for w in &args.watches {
        let (n, u) = parse_watch(w).map_err(usage)?;
        watches.push((n, u, None));
    }
    for spec in &args.on_event {
        let (name, path) = match spec.split_once('=') {
            Some((n, p)) if !n.is_empty() && !n.contains('/') => (Some(n.to_owned()), p.to_owned()),
            _ => (None, spec.clone()),
        };
        let code = std::fs::read_to_string(&path)
            .with_context(|| format!("reading the --on-event file {path}"))
            .map_err(usage)?;
        let count = watches.len();
        let target = match name {
            Some(n) => watches.iter_mut().find(|w| w.0 == n).ok_or_else(|| {
                usage(anyhow!(
                    "--on-event {spec}: no watch named {n} (give it with --watch {n}=URI)"
                ))
            })?,
            None if count == 1 => &mut watches[0],
            None => {
                return Err(usage(anyhow!(
                    "--on-event {spec}: there are {count} watches; say which with --on-event NAME=FILE.py"
                )));
            }
        };
        target.2 = Some(code);
    }
    if watches.is_empty() && !args.watch_state {
        return Err(usage(anyhow!(
            "nothing to watch: pass --watch NAME=URI, a --config with [[watch]], or --watch-state to restore saved watches"
        )));
    }
    let store = if args.watch_state {
        Some(globals.open_store().await?)
    } else {
        None
    };
    let sink = match (&args.exec, &args.webhook) {
        (Some(c), _) => Sink::Exec(c.clone()),
        (_, Some(u)) => Sink::Webhook(u.clone()),
        _ => Sink::stdout(args.json),
    };
    let exe = std::env::current_exe().context("finding the herald binary for filter workers")?;
    let mut pool = PoolConfig::new(exe);
    pool.workers = args.filter_workers.max(1);
    pool.memory_bytes = args.filter_memory_bytes.max(16 * 1024 * 1024);
    pool.time = std::time::Duration::from_millis(args.filter_time_ms.clamp(10, 600_000));
    let opts = WatchOptions {
        config: cfg,
        servers,
        sink,
        log: WatchLog::stderr(verbose),
        store,
        filters: Some(pool),
        watches: watches
            .into_iter()
            .map(|(name, uri, on_event)| WatchSpec {
                name,
                uri,
                on_event,
            })
            .collect(),
        configured: crate::watch::Configured::Required,
        end_when_all_ended: true,
        state_prefix: "",
    };
    let shutdown = tokio_util::sync::CancellationToken::new();
    // From the first line on, SIGTERM and Ctrl-C end herald through its drain (a start still
    // connecting is cut short).
    app::cancel_on_signals(shutdown.clone());
    crate::watch::run(opts, shutdown.clone(), async |_| true)
        .await
        .map_err(|e| anyhow!(e).into())
}

/// Every watch's filter, dry-run as its start would: refused ones fail the check, a call to
/// a name only a server's tool could have is a warning.
pub(crate) async fn check_filters(path: &std::path::Path, specs: &[WatchSpec]) -> Result<(), Exit> {
    if specs.iter().all(|s| s.on_event.is_none()) {
        return Ok(());
    }
    let exe = std::env::current_exe().map_err(|e| {
        usage(anyhow!(
            "cannot find the herald binary for filter workers: {e}"
        ))
    })?;
    let mut refused = Vec::new();
    for (name, verdict) in crate::watch::check::check_filters(exe, specs).await {
        match verdict {
            crate::watch::check::Verdict::Refused(why) => {
                refused.push(format!("[[watch]] {name}: {why}"))
            }
            crate::watch::check::Verdict::MaybeATool(why) => eprintln!(
                "{}: [[watch]] {name}: {why} (fine if a server offers a tool by that name: herald check connects to none)",
                path.display()
            ),
        }
    }
    if refused.is_empty() {
        return Ok(());
    }
    Err(usage(anyhow!("{}: {}", path.display(), refused.join("; "))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_file_is_validated() {
        let dir = std::env::temp_dir().join(format!("herald-watchcfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ok = dir.join("ok.toml");
        std::fs::write(&ok, "[[server]]\nhttp = \"http://127.0.0.1:1/mcp\"\n[[watch]]\nname = \"n\"\nuri = \"memo://notes\"\n[limits]\ndebounce_ms = 10\n").unwrap();
        let f = WatchFile::load(&ok).unwrap();
        assert_eq!(f.watch[0].uri, "memo://notes");
        assert_eq!(f.limits.debounce_ms, Some(10));
        let two = dir.join("two.toml");
        std::fs::write(&two, "[[server]]\nhttp = \"x\"\nstdio = \"y\"\n").unwrap();
        assert!(
            WatchFile::load(&two)
                .unwrap_err()
                .to_string()
                .contains("exactly one")
        );
        let typo = dir.join("typo.toml");
        std::fs::write(&typo, "[[watch]]\nname = \"n\"\nurl = \"memo://notes\"\n").unwrap();
        assert!(WatchFile::load(&typo).is_err());
        let _ = std::fs::remove_dir_all(dir);
        assert!(parse_watch("a=memo://x").is_ok());
        assert!(parse_watch("memo://x").is_err());
    }
}
