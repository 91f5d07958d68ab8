//! The Kubernetes API spoken directly, with `kube`'s configuration and authentication: one
//! client per cluster (kubeconfig, context, kcp workspace), its discovery, and the list and
//! watch requests the watchers make.
//!
//! - **Configuration and credentials** come from kube 5 exactly as kubectl reads them: the
//!   kubeconfig (`--kubeconfig`, else `$KUBECONFIG` or `~/.kube/config`, else in-cluster), a
//!   context, client certificates, bearer tokens, token files (re-read), exec credential
//!   plugins (cached until they expire) and OIDC refresh. `--token-command` replaces the
//!   kubeconfig's user: its token is minted before every list and watch and sent as Bearer.
//!   What kube cannot serve (a proxy URL, an unknown auth provider) is refused when the
//!   cluster's client is first built, naming the field and `--watch-via kubectl`.
//! - **Connections.** The client is hyper's pooled client with HTTP/2 offered by ALPN beside
//!   HTTP/1.1: against a real API server (TLS, h2) a cluster's lists and watches share one
//!   connection, another one (a lane) opened for each [`STREAMS_PER_CONNECTION`] watches, so
//!   no watch queues behind the server's stream limit; a plain-HTTP server gets HTTP/1.1, one
//!   connection per open watch.
//! - **Discovery** lists the preferred version of every API group once per cluster (again,
//!   at most every [`REDISCOVER`], when a resource is not found, so a CRD installed later is
//!   seen). A resource is named as kubectl names it: plural, singular, short name or kind,
//!   optionally with `.group` or `.version.group`.
//! - **Watch bodies** are read as bytes and parsed by the watcher with the same streaming
//!   JSON parser kubectl's output went through: one decode per event, no typed round trip.
//!
//! This file holds the limits, [`Api`] (every cluster's client, built on first use) and
//! [`ClusterClient`]'s requests (lanes, sending, lists, watches); `api/build.rs` builds a
//! client from a kubeconfig, `api/discovery.rs` discovers and resolves resource types,
//! `api/body.rs` reads response bodies.

use crate::sync::Recover;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::Value;

use crate::mcp::source::SourceError;
use crate::source::k8s::known::strip;
use crate::source::k8s::kubectl::mint;
use crate::source::k8s::uri::{Cluster, Selection};

mod body;
mod build;
mod discovery;

pub use body::WatchBody;
use body::{Overflow, body_error, read_bounded};
use build::{build_client, kube_words};
use discovery::Discovered;
pub use discovery::{ApiType, resolve};

/// Longest one request (a page of a list, a discovery document, the start of a watch) may
/// take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// A watch stream silent this long is taken as dead (a half-open connection): the server
/// ends every watch after [`WATCH_TIMEOUT_SECS`] anyway, and sends BOOKMARKs before that.
pub const WATCH_SILENCE: Duration = Duration::from_secs(WATCH_TIMEOUT_SECS as u64 + 30);
/// Most watch streams one connection carries: under every API server's and proxy's h2
/// stream limit (Go's default is 250, nginx's 128), with room left for lists. More watches of
/// a cluster open another connection.
pub const STREAMS_PER_CONNECTION: usize = 100;
/// Lists of one cluster running at once (after an API server restart every watcher re-lists).
const LISTS_AT_ONCE: usize = 8;
/// The most bytes one list page (or discovery document) may have.
const MAX_PAGE_BYTES: usize = 64 << 20;
/// Most clusters (kubeconfig, context, kcp workspace) with a client at once: URIs choose
/// them, so they are bounded.
pub const MAX_CLUSTERS: usize = 64;
/// A failed discovery is answered from memory this long, not run again by every waiter.
const DISCOVERY_FAILURE_MEMORY: Duration = Duration::from_secs(5);
/// A client whose credentials were refused (401) is built again (its exec plugin run
/// again) at most this often.
const REBUILD_AFTER_401: Duration = Duration::from_secs(10);
/// How long building a client (exec credential plugins included) may take.
const BUILD_TIMEOUT: Duration = Duration::from_secs(30);
/// What a watch asks the server for: it ends the stream after this, and the watcher
/// re-watches from the last resourceVersion it saw (what kubectl and client-go ask).
pub const WATCH_TIMEOUT_SECS: u32 = 290;
/// The page size of a list.
const PAGE: u32 = 500;
/// Discovery is run again for an unknown resource at most this often.
const REDISCOVER: Duration = Duration::from_secs(30);
/// The most of an error body quoted.
const MAX_ERROR_BYTES: usize = 64 * 1024;

/// What a metadata watch asks a list for: PartialObjectMetadataList, plain JSON from a server
/// that does not do it.
static METADATA_LIST: http::HeaderValue = http::HeaderValue::from_static(
    "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json",
);
/// What it asks a watch for: each object as PartialObjectMetadata.
static METADATA_OBJECT: http::HeaderValue = http::HeaderValue::from_static(
    "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json",
);

fn unavailable(msg: String) -> SourceError {
    SourceError::Unavailable(msg)
}

/// One connection's worth of a cluster's client: its own pool, and a bound on the watch
/// streams it carries.
struct Lane {
    client: kube::Client,
    watches: Arc<tokio::sync::Semaphore>,
}

/// The client of one cluster.
pub struct ClusterClient {
    /// Lane 0 carries lists and discovery too; another lane (connection) is opened for
    /// watches past [`STREAMS_PER_CONNECTION`] each.
    lanes: std::sync::Mutex<Vec<Arc<Lane>>>,
    /// What another lane is built from.
    config: kube::Config,
    /// The context's namespace (`default` when it names none).
    namespace: String,
    /// Where the cluster is, for messages (no userinfo, no query).
    server: String,
    /// `--token-command`, run before each request (once for a whole discovery).
    token_command: Option<String>,
    discovery: tokio::sync::Mutex<Option<Discovered>>,
    lists: tokio::sync::Semaphore,
    built: Instant,
    /// The server refused the credentials: build the client again (fresh credentials).
    refused: std::sync::atomic::AtomicBool,
}

/// A watch that could not start, or a list that failed.
#[derive(Debug, Clone)]
pub enum ApiError {
    /// `410 Gone`: the resourceVersion is too old; list again.
    Gone(String),
    /// `404`: the type is not (or no longer) served where discovery said.
    Missing(SourceError),
    Other(SourceError),
}

impl ApiError {
    pub fn into_source(self) -> SourceError {
        match self {
            ApiError::Gone(m) => SourceError::Unavailable(m),
            ApiError::Missing(e) | ApiError::Other(e) => e,
        }
    }
}

impl From<SourceError> for ApiError {
    fn from(e: SourceError) -> ApiError {
        ApiError::Other(e)
    }
}

impl ClusterClient {
    /// Lane `i` (lane 0 always exists).
    fn lane(&self, i: usize) -> Arc<Lane> {
        self.lanes.locked()[i].clone()
    }

    /// A lane with room for one more watch stream, opening another (another connection)
    /// when every lane is full. The new lane's client is built off the runtime's workers and
    /// outside the lock (building may run an exec credential plugin).
    async fn watch_lane(
        &self,
    ) -> Result<(Arc<Lane>, tokio::sync::OwnedSemaphorePermit), SourceError> {
        let free = |lanes: &[Arc<Lane>]| {
            lanes.iter().find_map(|lane| {
                let p = lane.watches.clone().try_acquire_owned().ok()?;
                Some((lane.clone(), p))
            })
        };
        if let Some(got) = free(&self.lanes.locked()) {
            return Ok(got);
        }
        let config = self.config.clone();
        let client = tokio::task::spawn_blocking(move || build_client(config))
            .await
            .map_err(|e| unavailable(format!("building another connection failed: {e}")))?
            .map_err(|e| unavailable(format!("another connection to {}: {e}", self.server)))?;
        let lane = Arc::new(Lane {
            client,
            watches: Arc::new(tokio::sync::Semaphore::new(STREAMS_PER_CONNECTION)),
        });
        let p = lane
            .watches
            .clone()
            .try_acquire_owned()
            .map_err(|_| unavailable("a new connection had no room".into()))?;
        self.lanes.locked().push(lane.clone());
        Ok((lane, p))
    }

    /// A token from `--token-command`, minted now.
    async fn token(&self) -> Result<Option<String>, SourceError> {
        match &self.token_command {
            None => Ok(None),
            Some(cmd) => Ok(Some(mint(cmd).await?)),
        }
    }

    /// Sends `req` on `lane` (with `token` as its Bearer, from `--token-command`) within the
    /// request timeout; a non-2xx answer is its Status as an error.
    async fn send(
        &self,
        lane: &Lane,
        req: http::Request<Vec<u8>>,
        token: Option<&str>,
    ) -> Result<http::Response<kube::client::Body>, ApiError> {
        let (mut parts, body) = req.into_parts();
        if let Some(token) = token {
            let mut value =
                http::HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
                    unavailable(
                        "the token command printed a token that is not a valid header value".into(),
                    )
                })?;
            value.set_sensitive(true);
            parts.headers.insert(http::header::AUTHORIZATION, value);
        }
        parts
            .headers
            .entry(http::header::ACCEPT)
            .or_insert(http::HeaderValue::from_static("application/json"));
        let path = parts.uri.path().to_owned();
        let req = http::Request::from_parts(parts, kube::client::Body::from(body));
        let res = tokio::time::timeout(REQUEST_TIMEOUT, lane.client.send(req))
            .await
            .map_err(|_| {
                unavailable(format!(
                    "the API server at {} did not answer within {} s",
                    self.server,
                    REQUEST_TIMEOUT.as_secs()
                ))
            })?
            .map_err(|e| unavailable(self.explain(&e)))?;
        let status = res.status();
        if status.is_success() {
            return Ok(res);
        }
        let body = match tokio::time::timeout(
            REQUEST_TIMEOUT,
            read_bounded(res.into_body(), MAX_ERROR_BYTES),
        )
        .await
        {
            Ok(Ok(Ok(b))) => b,
            _ => Bytes::new(),
        };
        let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let message = v["message"].as_str().map(str::to_owned).unwrap_or_else(|| {
            String::from_utf8_lossy(&body)
                .trim()
                .chars()
                .take(300)
                .collect()
        });
        let code = status.as_u16();
        Err(match code {
            410 => ApiError::Gone(message),
            404 => ApiError::Missing(unavailable(format!(
                "the API server at {} has nothing at {path} (404: {message})",
                self.server
            ))),
            401 => {
                self.refused.store(true, Ordering::Relaxed);
                ApiError::Other(unavailable(format!(
                    "the API server at {} refused the credentials (401 Unauthorized: {message}); check the kubeconfig's user or --token-command",
                    self.server
                )))
            }
            403 => ApiError::Other(unavailable(format!(
                "the API server at {} forbids this (403: {message}); the kubeconfig's user needs list and watch on it",
                self.server
            ))),
            _ => ApiError::Other(unavailable(format!(
                "the API server at {} answered {code} to {path}: {message}",
                self.server
            ))),
        })
    }

    /// A transport failure in words.
    fn explain(&self, e: &kube::Error) -> String {
        let text = kube_words(e);
        if text.contains("Connection refused") {
            format!(
                "connection refused at {}: is the API server running there?",
                self.server
            )
        } else {
            format!("cannot reach the API server at {}: {text}", self.server)
        }
    }

    /// A whole response body of at most [`MAX_PAGE_BYTES`].
    async fn body(
        &self,
        res: http::Response<kube::client::Body>,
        what: &str,
    ) -> Result<Bytes, SourceError> {
        match tokio::time::timeout(
            REQUEST_TIMEOUT,
            read_bounded(res.into_body(), MAX_PAGE_BYTES),
        )
        .await
        {
            Err(_) => Err(unavailable(format!(
                "{what} from {} did not finish within {} s",
                self.server,
                REQUEST_TIMEOUT.as_secs()
            ))),
            Ok(Err(Overflow)) => Err(unavailable(format!(
                "{what} from {} is over {} MiB; narrow the watch with a namespace or selector",
                self.server,
                MAX_PAGE_BYTES >> 20
            ))),
            Ok(Ok(Err(e))) => Err(unavailable(format!(
                "{what} from {} broke: {}",
                self.server,
                body_error(&*e).1
            ))),
            Ok(Ok(Ok(b))) => Ok(b),
        }
    }

    /// Every page of a list: its items (managedFields stripped) and the list's
    /// resourceVersion, the point to watch from.
    async fn list(&self, t: &ApiType, sel: &Selection) -> Result<(Vec<Value>, String), ApiError> {
        let _turn = self
            .lists
            .acquire()
            .await
            .map_err(|_| unavailable("the k8s source is shutting down".into()))?;
        let lane = self.lane(0);
        let request = kube::core::Request::new(t.path(self.namespace_of(sel)));
        let mut items = Vec::new();
        let mut cont: Option<String> = None;
        loop {
            let params = kube::core::params::ListParams {
                label_selector: sel.label_selector.clone(),
                field_selector: sel.field_selector.clone(),
                limit: Some(PAGE),
                continue_token: cont.take(),
                ..Default::default()
            };
            let mut req = request
                .list(&params)
                .map_err(|e| SourceError::InvalidParams(format!("bad selection: {e}")))?;
            if sel.metadata {
                req.headers_mut()
                    .insert(http::header::ACCEPT, METADATA_LIST.clone());
            }
            let token = self.token().await?;
            let res = self.send(&lane, req, token.as_deref()).await?;
            let body = self.body(res, "the list").await?;
            let mut page: Value = serde_json::from_slice(&body).map_err(|e| {
                unavailable(format!(
                    "the API server at {} sent a list that is not JSON: {e}",
                    self.server
                ))
            })?;
            if let Some(Value::Array(list)) = page.get_mut("items").map(Value::take) {
                for mut o in list {
                    strip(&mut o);
                    // A list's items carry no kind (the list has it): add it as a watch's have.
                    // Metadata alone comes as PartialObjectMetadata: named as its type.
                    if sel.metadata {
                        // Cut here too: a server that ignores `as=` sends whole objects, and
                        // the pages are held until the last.
                        t.name(&mut o);
                        crate::source::k8s::known::metadata_only(&mut o);
                    } else if let Some(m) = o.as_object_mut() {
                        m.entry("apiVersion")
                            .or_insert_with(|| t.api_version().into());
                        m.entry("kind").or_insert_with(|| t.kind.clone().into());
                    }
                    items.push(o);
                }
            }
            let meta = &page["metadata"];
            match meta["continue"].as_str() {
                Some(c) if !c.is_empty() => cont = Some(c.to_owned()),
                _ => {
                    let rv = meta["resourceVersion"].as_str().unwrap_or("").to_owned();
                    return Ok((items, rv));
                }
            }
        }
    }

    /// Opens a watch of the selection from `rv`.
    async fn watch(&self, t: &ApiType, sel: &Selection, rv: &str) -> Result<WatchBody, ApiError> {
        let params = kube::core::params::WatchParams {
            label_selector: sel.label_selector.clone(),
            field_selector: sel.field_selector.clone(),
            timeout: Some(WATCH_TIMEOUT_SECS),
            bookmarks: true,
            send_initial_events: false,
        };
        let mut req = kube::core::Request::new(t.path(self.namespace_of(sel)))
            .watch(&params, rv)
            .map_err(|e| SourceError::InvalidParams(format!("bad selection: {e}")))?;
        req.headers_mut().insert(
            http::header::ACCEPT_ENCODING,
            http::HeaderValue::from_static("identity"),
        );
        if sel.metadata {
            req.headers_mut()
                .insert(http::header::ACCEPT, METADATA_OBJECT.clone());
        }
        let (lane, permit) = self.watch_lane().await?;
        let token = self.token().await?;
        let res = self.send(&lane, req, token.as_deref()).await?;
        Ok(WatchBody {
            body: res.into_body(),
            _stream: permit,
        })
    }

    fn namespace_of<'a>(&'a self, sel: &'a Selection) -> Option<&'a str> {
        match sel.namespace.as_deref() {
            Some("*") => None,
            Some(ns) => Some(ns),
            None => Some(&self.namespace),
        }
    }
}

/// Why a client could not be built.
#[derive(Debug, Clone)]
pub enum BuildError {
    /// The configuration itself (a missing or bad kubeconfig, an unknown context, a
    /// proxy-url): fix it and start again.
    Config(SourceError),
    /// Obtaining credentials failed (an exec plugin, a token file): may pass later.
    Credentials(SourceError),
}

impl BuildError {
    pub fn into_source(self) -> SourceError {
        match self {
            BuildError::Config(e) | BuildError::Credentials(e) => e,
        }
    }
}

type Cell = Arc<tokio::sync::OnceCell<Arc<ClusterClient>>>;

/// Every cluster's client, built on first use and kept (built again after its credentials
/// were refused).
pub struct Api {
    kubeconfigs: Vec<(String, PathBuf)>,
    token_command: Option<String>,
    clients: std::sync::Mutex<HashMap<Cluster, Cell>>,
}

impl Api {
    pub fn new(kubeconfigs: Vec<(String, PathBuf)>, token_command: Option<String>) -> Api {
        Api {
            kubeconfigs,
            token_command,
            clients: std::sync::Mutex::new(HashMap::new()),
        }
    }

    /// The client of `cluster`, built on first use: concurrent first uses share one build,
    /// a failed build is forgotten (tried again by the next use), a client whose credentials
    /// a server refused is built again (at most every [`REBUILD_AFTER_401`]).
    pub async fn client(&self, cluster: &Cluster) -> Result<Arc<ClusterClient>, SourceError> {
        self.client_or_why(cluster)
            .await
            .map_err(BuildError::into_source)
    }

    pub async fn client_or_why(&self, cluster: &Cluster) -> Result<Arc<ClusterClient>, BuildError> {
        // The default kubeconfig is the first named one: one client under either key.
        let mut key = cluster.clone();
        if key.kubeconfig.is_none() {
            key.kubeconfig = self.kubeconfigs.first().map(|(n, _)| n.clone());
        }
        let cell = {
            let mut clients = self.clients.locked();
            // A client refused its credentials long enough ago: replace it.
            let stale = clients.get(&key).and_then(|c| c.get()).is_some_and(|c| {
                c.refused.load(Ordering::Relaxed) && c.built.elapsed() >= REBUILD_AFTER_401
            });
            if stale {
                clients.remove(&key);
            }
            if !clients.contains_key(&key) && clients.len() >= MAX_CLUSTERS {
                // Forget the clusters whose builds failed or are idle first.
                clients.retain(|_, c| c.get().is_some_and(|c| Arc::strong_count(c) > 1));
                if clients.len() >= MAX_CLUSTERS {
                    return Err(BuildError::Config(unavailable(format!(
                        "this server already has clients for {MAX_CLUSTERS} clusters (kubeconfig, context and workspace); stop watches of others first"
                    ))));
                }
            }
            clients.entry(key.clone()).or_default().clone()
        };
        let built = cell
            .get_or_try_init(|| async {
                tokio::time::timeout(BUILD_TIMEOUT, self.build(&key))
                    .await
                    .unwrap_or_else(|_| {
                        Err(BuildError::Credentials(unavailable(format!(
                            "building the client for {} took over {} s (an exec credential plugin that hangs?)",
                            self.label(&key),
                            BUILD_TIMEOUT.as_secs()
                        ))))
                    })
            })
            .await
            .cloned();
        if built.is_err() {
            // Not kept: the next use tries again, and a bad name leaves nothing behind.
            let mut clients = self.clients.locked();
            if clients
                .get(&key)
                .is_some_and(|c| Arc::ptr_eq(c, &cell) && !c.initialized())
            {
                clients.remove(&key);
            }
        }
        built
    }

    /// The type a selection names (resolve once, then keep it: a watcher lists and watches
    /// with it).
    pub async fn resolve(&self, sel: &Selection, fresh: bool) -> Result<ApiType, SourceError> {
        self.client(&sel.cluster)
            .await?
            .resolve(&sel.resource, fresh)
            .await
    }

    /// The list of a selection as type `t`: (items, resourceVersion).
    pub async fn list(
        &self,
        t: &ApiType,
        sel: &Selection,
    ) -> Result<(Vec<Value>, String), ApiError> {
        let c = self.client(&sel.cluster).await?;
        c.list(t, sel).await
    }

    /// A watch of a selection as type `t` from `rv`.
    pub async fn watch(
        &self,
        t: &ApiType,
        sel: &Selection,
        rv: &str,
    ) -> Result<WatchBody, ApiError> {
        let c = self.client(&sel.cluster).await?;
        c.watch(t, sel, rv).await
    }

    /// The cluster's resource types as `get_api_resources` returns them: `[{name,
    /// shortNames, apiVersion, namespaced, kind, verbs, categories}]`, sorted by group, then
    /// name.
    pub async fn api_resources(&self, cluster: &Cluster) -> Result<Value, SourceError> {
        let c = self.client(cluster).await?;
        let types = c.types(false).await?;
        let mut list: Vec<&ApiType> = types.iter().collect();
        list.sort_by(|a, b| (&a.group, &a.plural).cmp(&(&b.group, &b.plural)));
        Ok(Value::Array(
            list.into_iter().map(ApiType::to_json).collect(),
        ))
    }
}

#[cfg(test)]
#[path = "api_tests.rs"]
mod tests;
