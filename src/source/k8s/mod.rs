//! The Kubernetes / kcp source: event-log resources over watches of the Kubernetes API
//! (`api`: kube's configuration and credentials, HTTP/2 when the server offers it), or over
//! `kubectl get -w` with `--watch-via kubectl`.
//!
//! - `kcp-events://watch/{workspace}/{resource}{?namespace,labelSelector,fieldSelector,kcp,metadata}`
//!   and `k8s-events://watch/{resource}{?namespace,labelSelector,fieldSelector,context,metadata}`
//!   (`metadata=true`: each object's metadata alone, asked of the API as PartialObjectMetadata): one
//!   [`watcher::Watcher`] per URI, shared by every holder (each listen stream's
//!   [`WatchGuard`], each read, each poll lease) and stopped, with its watch stream, when the
//!   last one leaves and the linger time (`--linger-ms`, 10 s) has passed, so a client that
//!   listens again finds its ring and seqs where it left them. A read starts or joins the
//!   watcher and awaits its seed (at most 20 s), so the first read returns the log or the API's
//!   error. At most `--max-watchers` (256) URIs are watched; one more is refused naming the flag.
//! - `kcp-api://{workspace}/resources{?kcp}` and `k8s-api://resources{?context}`: the API
//!   resources list, readable, not watchable; `get_api_resources` returns the same JSON.
//! - MCP Events: `k8s.changed` and `kcp.changed` take the watch URIs' parts as arguments and
//!   poll the same rings; a poll holds its watcher for [`POLL_LEASE`] after the poll.
//! - Tools: `kubectl_get` and `get_api_resources` (read-only), `kubectl_wait` and
//!   `rollout_status` (read-only, may run as tasks); with `--read-write` also `kubectl_apply` and
//!   `kubectl_delete` (destructive).
//!
//! This file holds the source itself: [`K8s`], its configuration, the shared, lingering
//! watchers every holder leases, and the [`Source`] implementation, which hands each request
//! to the file that owns it: `read` (templates and reads), `tools` (the tool list and its
//! dispatch), `events` (MCP Events and polls). `uri` parses URIs, `api` speaks to API servers
//! (watches, lists, discovery), `kubectl` runs kubectl (the one-shot tools, and watches with
//! `--watch-via kubectl`), `watcher` is one watcher task, `stream` and `known` are its pure
//! parts.

pub mod api;
mod events;
pub(crate) use events::poll_uri;
pub mod known;
pub mod kubectl;
mod read;
pub mod stream;
mod tools;
pub mod uri;
pub mod watcher;

use crate::sync::Recover;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use rmcp::model::{JsonObject, Resource, ResourceTemplate, Tool};
use serde_json::Value;

use crate::mcp::events::{EventType, Leases, MAX_POLL_LEASES, POLL_LEASE};
use crate::mcp::hub::ChangeFeed;
use crate::mcp::source::{
    Admission, Call, Caller, Contents, ListenFilter, Read, Source, SourceError, SourceInfo,
    WatchGuard,
};
use crate::runtime::context::RoleContext;
use kubectl::{Kubectl, KubectlConfig};
use uri::{K8sUri, Selection};
use watcher::{Via, Watcher};

pub use events::{K8S_CHANGED, KCP_CHANGED};

/// The k8s source. See the module docs.
pub struct K8s {
    kubectl: Arc<Kubectl>,
    /// How watchers (and the API resources list) reach clusters.
    via: Via,
    feed: ChangeFeed,
    watchers: Mutex<HashMap<String, Weak<Watcher>>>,
    config: K8sConfig,
    /// The watchers `events/poll` keeps between polls, by URI.
    polls: Leases<Lease>,
}

/// Settings of the k8s source beyond kubectl's.
#[derive(Debug, Clone)]
pub struct K8sConfig {
    /// Offer kubectl_apply and kubectl_delete.
    pub read_write: bool,
    /// Events kept per watched URI.
    pub ring_capacity: usize,
    /// How long a watcher outlives its last subscriber (and its last read), so a client that
    /// resubscribes finds its ring and seq where it left them.
    pub linger: Duration,
    /// Most URIs watched at once.
    pub max_watchers: usize,
    /// Watch through the API (the default) or through `kubectl get -w`.
    pub watch_via: WatchVia,
}

/// `--watch-via`: how watches reach the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum WatchVia {
    /// The Kubernetes API directly (kube's kubeconfig handling and credentials).
    #[default]
    Api,
    /// One `kubectl get -w` per watched URI (for kubeconfigs only kubectl handles).
    Kubectl,
}

/// How long a watcher outlives its last subscriber by default, in milliseconds.
pub const DEFAULT_LINGER_MS: u64 = 10_000;
/// Most URIs watched at once by default.
pub const DEFAULT_MAX_WATCHERS: usize = 256;

impl Default for K8sConfig {
    fn default() -> Self {
        K8sConfig {
            read_write: false,
            ring_capacity: crate::mcp::ring::DEFAULT_RING_CAPACITY,
            linger: Duration::from_millis(DEFAULT_LINGER_MS),
            max_watchers: DEFAULT_MAX_WATCHERS,
            watch_via: WatchVia::Api,
        }
    }
}

/// One holder of a watcher: a listen stream or a read in progress. When dropped, the
/// watcher is kept for the linger time before this hold really ends.
struct Lease {
    watcher: Option<Arc<Watcher>>,
    linger: Duration,
    ctx: RoleContext,
}

impl Drop for Lease {
    fn drop(&mut self) {
        let Some(w) = self.watcher.take() else {
            return;
        };
        if self.linger.is_zero() {
            return;
        }
        let linger = self.linger;
        // Outside a runtime, or at shutdown, the watcher stops now.
        self.ctx.spawn_in_drop("k8s linger", async move {
            tokio::time::sleep(linger).await;
            drop(w);
        });
    }
}

impl K8s {
    /// Holds the watcher of a watch URI (starting or joining it); the guard keeps it up.
    pub fn watch(&self, uri: &str) -> Result<WatchGuard, SourceError> {
        let K8sUri::Watch(sel) = uri::parse(uri)? else {
            return Err(SourceError::InvalidParams(format!(
                "{uri} is readable, not watchable; watch a kcp-events:// or k8s-events:// URI"
            )));
        };
        Ok(WatchGuard::new(self.lease(uri, sel)?))
    }

    /// The source; its watchers, lingers and kubectl helpers run on `ctx`.
    pub fn new(
        kubectl: KubectlConfig,
        config: K8sConfig,
        ctx: &RoleContext,
    ) -> std::io::Result<K8s> {
        let via = match config.watch_via {
            WatchVia::Api => Via::Api(Arc::new(api::Api::new(
                kubectl.kubeconfigs.clone(),
                kubectl.token_command.clone(),
            ))),
            WatchVia::Kubectl => Via::Kubectl,
        };
        Ok(K8s {
            kubectl: Arc::new(Kubectl::new(kubectl, ctx)?),
            via,
            feed: ChangeFeed::new(),
            watchers: Mutex::new(HashMap::new()),
            config,
            polls: Leases::new(POLL_LEASE, MAX_POLL_LEASES, ctx.clone()),
        })
    }

    /// A hold on the watcher of `uri`, starting it if none runs.
    fn lease(&self, uri: &str, sel: Selection) -> Result<Lease, SourceError> {
        let mut watchers = self.watchers.locked();
        watchers.retain(|_, w| w.strong_count() > 0);
        let w = match watchers.get(uri).and_then(Weak::upgrade) {
            Some(w) => w,
            None => {
                if watchers.len() >= self.config.max_watchers {
                    return Err(SourceError::Unavailable(format!(
                        "this server already watches {} URIs, its limit (--max-watchers); stop a watch first",
                        self.config.max_watchers
                    )));
                }
                let w = Arc::new(Watcher::start(
                    uri.to_owned(),
                    sel,
                    self.kubectl.clone(),
                    self.via.clone(),
                    self.feed.clone(),
                    self.config.ring_capacity,
                ));
                watchers.insert(uri.to_owned(), Arc::downgrade(&w));
                w
            }
        };
        Ok(Lease {
            watcher: Some(w),
            linger: self.config.linger,
            ctx: self.kubectl.ctx().clone(),
        })
    }

    /// The API resource types of `cluster`, as `get_api_resources` returns them.
    pub(crate) async fn api_resources(&self, cluster: &uri::Cluster) -> Result<Value, SourceError> {
        match &self.via {
            Via::Api(api) => api.api_resources(cluster).await,
            Via::Kubectl => self.kubectl.api_resources(cluster).await,
        }
    }

    /// Builds the client of each configured kubeconfig's current context now, so a
    /// kubeconfig herald's client cannot handle is refused at start (credentials that fail
    /// only warn: they may work later); the default kubeconfig only warns (it may appear
    /// later). Nothing with `--watch-via kubectl`.
    pub async fn check_kubeconfigs(&self, names: &[String]) -> Result<(), SourceError> {
        let Via::Api(api) = &self.via else {
            return Ok(());
        };
        if names.is_empty() {
            if let Err(e) = api.client(&uri::Cluster::default()).await {
                tracing::warn!(error = %e, "no usable default kubeconfig yet; watches fail until there is one");
            }
            return Ok(());
        }
        for n in names {
            let cluster = uri::Cluster {
                kubeconfig: Some(n.clone()),
                ..Default::default()
            };
            match api.client_or_why(&cluster).await {
                Ok(_) => {}
                Err(api::BuildError::Config(e)) => return Err(e),
                // Credentials may come later (a plugin logged in, a token file written).
                Err(api::BuildError::Credentials(e)) => {
                    tracing::warn!(kubeconfig = %n, error = %e, "no credentials yet; watches fail until there are")
                }
            }
        }
        Ok(())
    }

    /// How many watchers are running (tests and metrics).
    pub fn running(&self) -> usize {
        self.watchers
            .locked()
            .values()
            .filter(|w| w.strong_count() > 0)
            .count()
    }
}

#[async_trait]
impl Source for K8s {
    fn info(&self) -> SourceInfo {
        SourceInfo {
            name: "k8s".into(),
            instructions: Some(
                "Kubernetes and kcp objects as event logs. Watch kcp-events://watch/{workspace}/{resource} or \
                 k8s-events://watch/{resource} (namespace=* for all namespaces); read kcp-api://{workspace}/resources \
                 or call get_api_resources to see which resource types exist."
                    .into(),
            ),
            ..SourceInfo::default()
        }
    }

    fn resources(&self, _caller: &Caller) -> Vec<Resource> {
        Vec::new()
    }

    fn templates(&self, _caller: &Caller) -> Vec<ResourceTemplate> {
        read::templates()
    }

    async fn read(&self, _caller: &Caller, read: Read<'_>) -> Result<Contents, SourceError> {
        self.read_uri(read.uri, read.after).await
    }

    /// A watch URI is accepted with a hold on its (shared, lingering) watcher; the API
    /// resources list is readable, not watchable, and left out.
    async fn admit(&self, _caller: &Caller, filter: &ListenFilter) -> Admission {
        let mut admission = Admission::default();
        for uri in filter.uris() {
            match self.watch(&uri) {
                Ok(guard) => admission.accept(&uri, uri.as_str(), guard),
                Err(e) => admission.refuse(&uri, e),
            }
        }
        admission
    }

    fn changes(&self) -> ChangeFeed {
        self.feed.clone()
    }

    async fn events_advertised(&self, _caller: &Caller) -> bool {
        true
    }

    async fn events_list(&self, _caller: &Caller) -> Result<Vec<Value>, SourceError> {
        Ok(events::event_types()
            .iter()
            .map(EventType::to_json)
            .collect())
    }

    async fn events_poll(
        &self,
        _caller: &Caller,
        params: JsonObject,
    ) -> Result<Value, SourceError> {
        self.poll(params).await
    }

    fn tools(&self, _caller: &Caller) -> std::borrow::Cow<'_, [Tool]> {
        std::borrow::Cow::Borrowed(tools::list(self.config.read_write))
    }

    async fn call_tool(
        &self,
        _caller: &Caller,
        name: &str,
        args: JsonObject,
        _call: Call,
    ) -> Result<rmcp::model::CallToolResponse, SourceError> {
        self.run_tool(name, args).await.map(Into::into)
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(super) fn source(linger: Duration) -> K8s {
        let cfg = KubectlConfig {
            program: "/nonexistent/kubectl".into(),
            kubeconfigs: Vec::new(),
            token_command: None,
        };
        K8s::new(
            cfg,
            K8sConfig {
                linger,
                max_watchers: 2,
                watch_via: WatchVia::Kubectl,
                ..K8sConfig::default()
            },
            &RoleContext::new("k8s"),
        )
        .unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn watchers_are_shared_and_linger_after_the_last_hold() {
        let k = source(Duration::from_secs(10));
        let uri = "k8s-events://watch/configmaps";
        let a = k.watch(uri).unwrap();
        let b = k.watch(uri).unwrap();
        assert_eq!(k.running(), 1, "one watcher for two holders");
        drop((a, b));
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(k.running(), 1, "still there for a resubscribing client");
        let c = k.watch(uri).unwrap();
        drop(c);
        tokio::time::sleep(Duration::from_secs(11)).await;
        assert_eq!(k.running(), 0, "stopped once nobody came back");
    }

    /// A credential plugin that kubectl starts may keep kubectl's stderr open after kubectl
    /// itself is gone: the drain still ends the watcher's stderr reader.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_plugin_holding_stderr_does_not_hold_the_drain() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("herald-k8s-stderr-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let script = dir.join("kubectl");
        std::fs::write(
            &script,
            "#!/bin/sh\ncase \" $* \" in\n  *\" -w \"*) sleep 30 >/dev/null </dev/null & exec sleep 30 ;;\n  *) echo '{\"items\":[]}' ;;\nesac\n",
        )
        .unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let ctx = RoleContext::new("k8s");
        let k = K8s::new(
            KubectlConfig {
                program: script.clone(),
                kubeconfigs: Vec::new(),
                token_command: None,
            },
            K8sConfig {
                watch_via: WatchVia::Kubectl,
                ..K8sConfig::default()
            },
            &ctx,
        )
        .unwrap();
        let held = k.watch("k8s-events://watch/configmaps").unwrap();
        // The seed is in: the watch (and its stderr reader) runs.
        k.read_uri("k8s-events://watch/configmaps", None)
            .await
            .unwrap();
        let r = ctx.drain(Duration::from_secs(5)).await;
        drop(held);
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(r, Ok(()));
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_drains_watchers_and_lingers_at_once() {
        let ctx = RoleContext::new("k8s");
        let k = K8s::new(
            KubectlConfig {
                program: "/nonexistent/kubectl".into(),
                kubeconfigs: Vec::new(),
                token_command: None,
            },
            K8sConfig {
                linger: Duration::from_secs(600),
                ..K8sConfig::default()
            },
            &ctx,
        )
        .unwrap();
        let held = k.watch("k8s-events://watch/a").unwrap();
        drop(k.watch("k8s-events://watch/b").unwrap());
        tokio::task::yield_now().await;
        let running: Vec<String> = ctx.running().into_iter().map(|(n, _)| n).collect();
        assert!(running.contains(&"k8s/k8s watch".to_owned()), "{running:?}");
        assert!(
            running.contains(&"k8s/k8s linger".to_owned()),
            "{running:?}"
        );
        // A held watcher and a ten-minute linger: the drain ends both, well before either.
        let started = tokio::time::Instant::now();
        assert_eq!(ctx.drain(Duration::from_secs(5)).await, Ok(()));
        assert!(started.elapsed() < Duration::from_secs(5));
        drop(held);
    }

    #[tokio::test(start_paused = true)]
    async fn the_watcher_limit_is_a_clear_error() {
        let k = source(Duration::ZERO);
        let _a = k.watch("k8s-events://watch/a").unwrap();
        let _b = k.watch("k8s-events://watch/b").unwrap();
        let err = k.watch("k8s-events://watch/c").err().unwrap();
        assert!(err.to_string().contains("--max-watchers"), "{err}");
        // A read of a new URI is refused the same way; a read of a watched one is not.
        let err = k
            .read(&Caller::local(), Read::new("k8s-events://watch/c"))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("its limit"), "{err}");
        let err = k
            .read(&Caller::local(), Read::new("k8s-events://watch/a"))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("cannot run"), "{err}");
    }
}
