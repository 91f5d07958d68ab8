//! `herald k8s`: the Kubernetes / kcp source.

use std::path::PathBuf;

use clap::Args;

use crate::cli::serve::{ServeArgs, begin, role_store, serve_until_stopped};
use crate::cli::{Exit, Globals};
use crate::mcp::ring::DEFAULT_RING_CAPACITY;
use crate::source::k8s::kubectl::KubectlConfig;
use crate::source::k8s::{K8s, K8sConfig, WatchVia};

#[derive(Debug, Args)]
pub struct K8sArgs {
    #[command(flatten)]
    pub serve: ServeArgs,
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
    /// and for watches with --watch-via kubectl).
    #[arg(long, default_value = "kubectl", value_name = "PATH")]
    pub kubectl: PathBuf,
    /// How watches and the API resources list reach the cluster: `api` speaks to the API
    /// server directly (HTTP/2 where offered; kubeconfig, contexts, certificates, tokens,
    /// token files, exec plugins and OIDC as kubectl reads them), `kubectl` runs one
    /// `kubectl get -w` per watched URI (for a kubeconfig only kubectl handles).
    #[arg(long, value_enum, default_value_t = WatchVia::Api, value_name = "HOW")]
    pub watch_via: WatchVia,
    /// A shell command printing a bearer token; run before every list and watch (and every
    /// kubectl command), so credentials are re-minted on each reconnect.
    #[arg(long, value_name = "CMD")]
    pub token_command: Option<String>,
    /// Events kept per watched URI.
    #[arg(long, default_value_t = DEFAULT_RING_CAPACITY, value_name = "N")]
    pub ring_capacity: usize,
    /// How long a watcher (its watch stream, ring and seq) outlives its last subscriber, so a
    /// client that resubscribes loses nothing.
    #[arg(long, default_value_t = 10_000, value_name = "MS")]
    pub linger_ms: u64,
    /// Most URIs watched at once (each is one watch stream; with --watch-via kubectl, one
    /// kubectl process).
    #[arg(long, default_value_t = 256, value_name = "N")]
    pub max_watchers: usize,
}

fn kubeconfigs(specs: &[String]) -> Result<Vec<(String, PathBuf)>, Exit> {
    let mut out: Vec<(String, PathBuf)> = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
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
        if !path.is_file() {
            return Err(crate::cli::usage(anyhow::anyhow!(
                "--kubeconfig {}: no such file",
                path.display()
            )));
        }
        if out.iter().any(|(n, _)| *n == name) {
            return Err(crate::cli::usage(anyhow::anyhow!(
                "--kubeconfig name {name} is given twice"
            )));
        }
        out.push((name, path));
    }
    Ok(out)
}

pub async fn run(args: K8sArgs, globals: &Globals) -> Result<(), Exit> {
    let cfg = KubectlConfig {
        program: args.kubectl.clone(),
        kubeconfigs: kubeconfigs(&args.kubeconfig)?,
        token_command: args.token_command.clone(),
    };
    let config = K8sConfig {
        read_write: args.read_write,
        ring_capacity: args.ring_capacity,
        linger: std::time::Duration::from_millis(args.linger_ms),
        max_watchers: args.max_watchers.max(1),
        watch_via: args.watch_via,
    };
    let ctx = crate::cli::serve::role_context("k8s");
    let store = role_store(&args.serve.options(), globals).await?;
    let admin = begin(&args.serve, &ctx, globals, &store).await?;
    let names: Vec<String> = cfg.kubeconfigs.iter().map(|(n, _)| n.clone()).collect();
    let published = args.publish.start("k8s", &ctx).await?;
    let source = K8s::new(cfg, config, &ctx).map_err(|e| crate::cli::usage(e.into()))?;
    if let Some(p) = &published {
        p.catalog(&source).await;
    }
    // A kubeconfig the API client cannot use is refused now, not at the first watch.
    source
        .check_kubeconfigs(&names)
        .await
        .map_err(|e| crate::cli::usage(anyhow::anyhow!("{e}")))?;
    serve_until_stopped(source, &args.serve.options(), admin, &store, ctx, globals).await
}
