//! `herald k8s`: the Kubernetes / kcp source, and `[k8s]` of `herald up`: one settings type
//! ([`K8sToml`], its defaults the source's constants), `herald k8s`'s flags laid over it, and
//! one [`K8sToml::build`] that both run (kubeconfigs checked the same way for both).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use serde::{Deserialize, Serialize};

use crate::cli::serve::{ServeArgs, begin, role_store, serve_until_stopped};
use crate::cli::{Exit, Globals, usage};
use crate::mcp::ring::DEFAULT_RING_CAPACITY;
use crate::runtime::context::RoleContext;
use crate::source::k8s::kubectl::KubectlConfig;
use crate::source::k8s::{DEFAULT_LINGER_MS, DEFAULT_MAX_WATCHERS, K8s, K8sConfig, WatchVia};

#[derive(Debug, Args)]
pub struct K8sArgs {
    #[command(flatten)]
    pub serve: ServeArgs,
    #[command(flatten)]
    pub access: crate::cli::serve::AccessArgs,
    #[command(flatten)]
    pub publish: crate::cli::serve::PublishArgs,
    /// A kubeconfig, as PATH or NAME=PATH (repeatable; `?kcp=NAME` in a URI picks one, the
    /// first is the default) [default: kubectl's own].
    #[arg(long, value_name = "[NAME=]PATH")]
    pub kubeconfig: Vec<String>,
    /// Offer only read-only tools (the default).
    #[arg(long, conflicts_with = "read_write")]
    pub read_only: bool,
    /// Also offer kubectl_apply and kubectl_delete.
    #[arg(long)]
    pub read_write: bool,
    /// The kubectl to run (for kubectl_get, kubectl_apply, kubectl_delete and the task tools,
    /// and for watches with --watch-via kubectl) [default: kubectl].
    #[arg(long, value_name = "PATH")]
    pub kubectl: Option<PathBuf>,
    /// How watches and the API resources list reach the cluster: `api` speaks to the API
    /// server directly (HTTP/2 where offered; kubeconfig, contexts, certificates, tokens,
    /// token files, exec plugins and OIDC as kubectl reads them), `kubectl` runs one
    /// `kubectl get -w` per watched URI (for a kubeconfig only kubectl handles) [default: api].
    #[arg(long, value_enum, value_name = "HOW")]
    pub watch_via: Option<WatchVia>,
    /// A shell command printing a bearer token; run before every list and watch (and every
    /// kubectl command), so credentials are re-minted on each reconnect.
    #[arg(long, value_name = "CMD")]
    pub token_command: Option<String>,
    /// Events kept per watched URI [default: 256].
    #[arg(long, value_name = "N")]
    pub ring_capacity: Option<usize>,
    /// How long a watcher (its watch stream, ring and seq) outlives its last subscriber, so a
    /// client that resubscribes loses nothing [default: 10000].
    #[arg(long, value_name = "MS")]
    pub linger_ms: Option<u64>,
    /// Most URIs watched at once (each is one watch stream; with --watch-via kubectl, one
    /// kubectl process) [default: 256].
    #[arg(long, value_name = "N")]
    pub max_watchers: Option<usize>,
}

/// The k8s role's settings: `[k8s]` of `herald up`, or `herald k8s`'s flags. Every field is
/// optional; [`K8sToml::with_defaults`] fills in the source's defaults, the one place they are.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct K8sToml {
    /// Named kubeconfigs (`?kcp=NAME` picks one; the first is the default: in the TOML, the
    /// first in name order). None: kubectl's own default.
    #[serde(default, with = "named_paths")]
    pub kubeconfigs: Vec<(String, PathBuf)>,
    pub kubectl: Option<PathBuf>,
    pub token_command: Option<String>,
    pub read_write: Option<bool>,
    pub ring_capacity: Option<usize>,
    pub linger_ms: Option<u64>,
    pub max_watchers: Option<usize>,
    /// `api` (the default) or `kubectl`, as `herald k8s --watch-via`.
    pub watch_via: Option<String>,
}

/// `kubeconfigs` as a TOML table of name = path (read in name order).
mod named_paths {
    use std::collections::BTreeMap;
    use std::path::PathBuf;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(v: &[(String, PathBuf)], s: S) -> Result<S::Ok, S::Error> {
        v.iter().cloned().collect::<BTreeMap<_, _>>().serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Vec<(String, PathBuf)>, D::Error> {
        Ok(BTreeMap::<String, PathBuf>::deserialize(d)?
            .into_iter()
            .collect())
    }
}

impl K8sArgs {
    /// The flags as settings.
    fn settings(&self) -> Result<K8sToml, Exit> {
        let mut kubeconfigs: Vec<(String, PathBuf)> = Vec::new();
        for (i, spec) in self.kubeconfig.iter().enumerate() {
            let (name, path) = match spec.split_once('=') {
                Some((n, p)) if !n.contains('/') => (n.to_owned(), PathBuf::from(p)),
                _ => (
                    if i == 0 {
                        "default".into()
                    } else {
                        format!("kubeconfig{}", i + 1)
                    },
                    PathBuf::from(spec),
                ),
            };
            if kubeconfigs.iter().any(|(n, _)| *n == name) {
                return Err(usage(anyhow::anyhow!(
                    "--kubeconfig name {name} is given twice"
                )));
            }
            kubeconfigs.push((name, path));
        }
        Ok(K8sToml {
            kubeconfigs,
            kubectl: self.kubectl.clone(),
            token_command: self.token_command.clone(),
            read_write: Some(self.read_write),
            ring_capacity: self.ring_capacity,
            linger_ms: self.linger_ms,
            max_watchers: self.max_watchers,
            watch_via: self.watch_via.map(|v| {
                match v {
                    WatchVia::Api => "api",
                    WatchVia::Kubectl => "kubectl",
                }
                .to_owned()
            }),
        })
    }
}

impl K8sToml {
    /// `watch_via` as the source takes it; anything else is a config error naming the key.
    pub fn via(&self) -> anyhow::Result<WatchVia> {
        match self.watch_via.as_deref() {
            None | Some("api") => Ok(WatchVia::Api),
            Some("kubectl") => Ok(WatchVia::Kubectl),
            Some(other) => anyhow::bail!(
                "[k8s] watch_via = {other:?} is not a way to watch; use \"api\" (the default) or \"kubectl\""
            ),
        }
    }

    /// What can be checked without building anything: each kubeconfig is a file, and
    /// `watch_via` names a way to watch.
    pub fn check_files(&self) -> Result<(), Exit> {
        for (name, path) in &self.kubeconfigs {
            if !path.is_file() {
                return Err(usage(anyhow::anyhow!(
                    "kubeconfig {name} = {}: no such file (--kubeconfig, or [k8s] kubeconfigs)",
                    path.display()
                )));
            }
        }
        self.via().map(drop).map_err(usage)
    }

    /// Every unset field at its default (what `herald up --print-config` shows).
    pub fn with_defaults(mut self) -> K8sToml {
        self.kubectl.get_or_insert_with(|| "kubectl".into());
        self.read_write.get_or_insert(false);
        self.ring_capacity.get_or_insert(DEFAULT_RING_CAPACITY);
        self.linger_ms.get_or_insert(DEFAULT_LINGER_MS);
        self.max_watchers.get_or_insert(DEFAULT_MAX_WATCHERS);
        self.watch_via.get_or_insert_with(|| "api".into());
        self
    }

    /// The k8s source these settings describe, on `ctx`, with its kubeconfigs checked as a
    /// start checks them: each is a file, and the API client can use it (credentials may
    /// come later). `herald k8s`, `herald up` and `herald check` all build it here.
    pub async fn build(&self, ctx: &RoleContext) -> Result<K8s, Exit> {
        let t = self.clone().with_defaults();
        t.check_files()?;
        let names: Vec<String> = t.kubeconfigs.iter().map(|(n, _)| n.clone()).collect();
        let source = K8s::new(
            KubectlConfig {
                program: t.kubectl.clone().unwrap_or_default(),
                kubeconfigs: t.kubeconfigs.clone(),
                token_command: t.token_command.clone(),
            },
            K8sConfig {
                read_write: t.read_write.unwrap_or_default(),
                ring_capacity: t.ring_capacity.unwrap_or_default().max(1),
                linger: Duration::from_millis(t.linger_ms.unwrap_or_default()),
                max_watchers: t.max_watchers.unwrap_or_default().max(1),
                watch_via: t.via().map_err(usage)?,
            },
            ctx,
        )
        .map_err(|e| usage(anyhow::anyhow!("k8s: {e}")))?;
        // A kubeconfig the API client cannot use is refused now, not at the first watch.
        source
            .check_kubeconfigs(&names)
            .await
            .map_err(|e| usage(anyhow::anyhow!("k8s: {e}")))?;
        Ok(source)
    }
}

pub async fn run(args: K8sArgs, globals: &Globals) -> Result<(), Exit> {
    let settings = args.settings()?;
    // Refused before anything binds, as before.
    settings.check_files()?;
    let ctx = crate::cli::serve::role_context("k8s");
    let store = role_store(&args.serve.options(), globals).await?;
    let access = args.access.load("k8s", &args.serve.options())?;
    let admin = begin(&args.serve, &ctx, globals, &store).await?;
    let published = args.publish.start("k8s", &ctx).await?;
    let source = settings.build(&ctx).await?;
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
    use clap::Parser;

    fn flags(args: &[&str]) -> K8sToml {
        let cli = crate::cli::Cli::try_parse_from(["herald", "k8s"].iter().chain(args)).unwrap();
        let crate::cli::Command::K8s(a) = cli.command else {
            panic!("herald k8s")
        };
        a.settings().unwrap()
    }

    /// The flags and `[k8s]` are one type with one set of defaults: the source's.
    #[test]
    fn flags_and_the_table_share_the_settings_and_their_defaults() {
        let none = flags(&[]).with_defaults();
        let table: K8sToml = toml::from_str("").unwrap();
        let table = table.with_defaults();
        assert_eq!(none.linger_ms, Some(DEFAULT_LINGER_MS));
        assert_eq!(none.max_watchers, Some(DEFAULT_MAX_WATCHERS));
        assert_eq!(
            toml::to_string(&none).unwrap(),
            toml::to_string(&table).unwrap()
        );
        // Flags keep their order (the first kubeconfig is the default); the table reads in
        // name order.
        let f = flags(&[
            "--kubeconfig",
            "prod=/p",
            "--kubeconfig",
            "dev=/d",
            "--linger-ms",
            "5",
        ]);
        let names: Vec<&str> = f.kubeconfigs.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["prod", "dev"]);
        assert_eq!(f.linger_ms, Some(5));
        let t: K8sToml = toml::from_str("[kubeconfigs]\nprod = \"/p\"\ndev = \"/d\"\n").unwrap();
        let names: Vec<&str> = t.kubeconfigs.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["dev", "prod"]);
    }
}
