//! `herald check`: a config checked as its command's start checks it, without starting
//! anything: `herald up`'s (its tables, tokens and slugs, kubeconfigs, every watch's filter
//! dry-run), `herald gateway`'s (slugs and tokens) and `herald watch --config`'s (servers and
//! every filter). Which command a file is for is recognised from its tables, or named with
//! `--kind`. For `ExecStartPre=`: exit 0 when the command would start, 64 (with every reason)
//! when it would not.

use std::path::{Path, PathBuf};

use anyhow::anyhow;
use clap::{Args, ValueEnum};

use crate::app::console;
use crate::cli::{Exit, usage};
use crate::gateway::config::GatewayConfig;
use crate::watch::WatchSpec;

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// A config to check: `herald up`'s, `herald gateway`'s or `herald watch --config`'s.
    pub config: PathBuf,
    /// Which command the config is for [default: recognised from its tables: [[server]] or
    /// [limits] is herald watch's; [listen], [memo], [file], [k8s], [slack], [[watch]],
    /// [notify] or [publish] herald up's; anything else herald gateway's].
    #[arg(long, value_enum, value_name = "KIND")]
    pub kind: Option<Kind>,
}

/// The command a config is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Kind {
    Up,
    Gateway,
    Watch,
}

/// Tables only `herald up`'s config has (`[[watch]]` is in `herald watch`'s too).
const UP_TABLES: [&str; 8] = [
    "listen", "memo", "file", "k8s", "slack", "watch", "notify", "publish",
];

/// Tables only `herald watch --config`'s has.
const WATCH_TABLES: [&str; 2] = ["server", "limits"];

/// Which command `text` is a config for, from its tables.
fn recognise(text: &str) -> Kind {
    let Ok(t) = toml::from_str::<toml::Table>(text) else {
        // Not TOML: the gateway's parser says where (any kind's would).
        return Kind::Gateway;
    };
    let has = |names: &[&str]| t.keys().any(|k| names.contains(&k.as_str()));
    if has(&WATCH_TABLES) {
        Kind::Watch
    } else if has(&UP_TABLES) {
        Kind::Up
    } else {
        Kind::Gateway
    }
}

pub async fn run(args: CheckArgs) -> Result<(), Exit> {
    let path = &args.config;
    let text = std::fs::read_to_string(path)
        .map_err(|e| usage(anyhow!("cannot read {}: {e}", path.display())))?;
    let summary = match args.kind.unwrap_or_else(|| recognise(&text)) {
        Kind::Up => up(path).await?,
        Kind::Gateway => gateway(path)?,
        Kind::Watch => watch(path).await?,
    };
    console::println(&format!("{}: ok ({summary})", path.display()))?;
    Ok(())
}

async fn up(path: &Path) -> Result<String, Exit> {
    let cfg = crate::cli::up::config::UpToml::load(path)
        .and_then(|t| t.check())
        .map_err(usage)?;
    up_parts(path, &cfg, true).await?;
    Ok(format!(
        "herald up: roles {}; {}, {}, {}",
        match cfg.file.roles() {
            r if r.is_empty() => "none".to_owned(),
            r => r.join(", "),
        },
        count(cfg.slugs.len(), "server"),
        count(cfg.tokens.len(), "token"),
        count(cfg.watches.len(), "watch")
    ))
}

/// What a start checks of an up config beyond its tables (which `UpToml::check` did): every
/// watch's filter dry-run, and with `k8s`, that `[k8s]` builds (kubeconfigs and all). A
/// reload runs it too, `k8s` only when that table changed.
pub async fn up_parts(
    path: &Path,
    cfg: &crate::cli::up::config::UpConfig,
    k8s: bool,
) -> Result<(), Exit> {
    if let Some(k) = cfg.file.k8s.as_ref().filter(|_| k8s) {
        let ctx = crate::runtime::context::RoleContext::new("check");
        let built = k.build(&ctx).await;
        ctx.shutdown().cancel();
        built?;
    }
    crate::cli::watch::check_filters(path, &cfg.watch_specs()).await
}

fn gateway(path: &Path) -> Result<String, Exit> {
    let cfg = GatewayConfig::load(path).map_err(|e| usage(e.into()))?;
    Ok(format!(
        "herald gateway: {}, {}{}{}",
        count(cfg.slugs.len(), "server"),
        count(cfg.tokens.len(), "token"),
        if cfg.issuers.is_empty() {
            String::new()
        } else {
            format!(", {}", count(cfg.issuers.len(), "issuer"))
        },
        if cfg.tokenless() {
            "; callers on this host need none"
        } else {
            ""
        }
    ))
}

async fn watch(path: &Path) -> Result<String, Exit> {
    let file = crate::cli::watch::WatchFile::load(path).map_err(usage)?;
    let mut names = std::collections::BTreeSet::new();
    for w in &file.watch {
        if !names.insert(w.name.as_str()) {
            return Err(usage(anyhow!(
                "{}: [[watch]] {} is defined twice",
                path.display(),
                w.name
            )));
        }
    }
    let specs: Vec<WatchSpec> = file
        .watch
        .iter()
        .map(|w| WatchSpec {
            name: w.name.clone(),
            uri: w.uri.clone(),
            on_event: w.on_event.clone(),
        })
        .collect();
    crate::cli::watch::check_filters(path, &specs).await?;
    Ok(format!(
        "herald watch: {}, {}",
        count(file.server.len(), "server"),
        count(specs.len(), "watch")
    ))
}

/// `1 token`, `2 tokens`, `1 watch`, `0 watches`.
fn count(n: usize, noun: &str) -> String {
    match (n, noun.ends_with("ch")) {
        (1, _) => format!("1 {noun}"),
        (_, true) => format!("{n} {noun}es"),
        (_, false) => format!("{n} {noun}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_config_is_recognised_by_its_tables() {
        assert_eq!(
            recognise(
                "[[server]]\nhttp = \"http://x/mcp\"\n[[watch]]\nname = \"n\"\nuri = \"memo://notes\"\n"
            ),
            Kind::Watch
        );
        assert_eq!(recognise("[limits]\ndebounce_ms = 1\n"), Kind::Watch);
        assert_eq!(
            recognise("[memo]\n[[watch]]\nname = \"n\"\nuri = \"memo://notes\"\n"),
            Kind::Up
        );
        assert_eq!(
            recognise("[[slug]]\nname = \"a\"\nstdio = \"x\"\n"),
            Kind::Gateway
        );
        assert_eq!(recognise("not toml ["), Kind::Gateway);
    }
}
