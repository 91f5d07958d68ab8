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
//!   HTTP/1.1: against a real API server (TLS, h2) every list and watch of a cluster shares
//!   one connection; a plain-HTTP server gets HTTP/1.1, one connection per open watch.
//! - **Discovery** lists the preferred version of every API group once per cluster (again,
//!   at most every [`REDISCOVER`], when a resource is not found, so a CRD installed later is
//!   seen). A resource is named as kubectl names it: plural, singular, short name or kind,
//!   optionally with `.group` or `.version.group`.
//! - **Watch bodies** are read as bytes and parsed by the watcher with the same streaming
//!   JSON parser kubectl's output went through: one decode per event, no typed round trip.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper_util::client::legacy::connect::HttpConnector;
use kube::client::ConfigExt;
use serde_json::{Value, json};
use tower::ServiceBuilder;

use crate::mcp::source::SourceError;
use crate::source::k8s::known::strip;
use crate::source::k8s::kubectl::{did_you_mean, mint};
use crate::source::k8s::uri::{Cluster, Selection};

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

fn unavailable(msg: String) -> SourceError {
    SourceError::Unavailable(msg)
}

/// One resource type as discovery describes it.
#[derive(Debug, Clone)]
pub struct ApiType {
    pub group: String,
    pub version: String,
    pub plural: String,
    pub singular: String,
    pub kind: String,
    pub short_names: Vec<String>,
    pub namespaced: bool,
    pub verbs: Vec<String>,
    pub categories: Vec<String>,
}

impl ApiType {
    fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The collection's path for `namespace` (`None`: all namespaces, or cluster-scoped).
    fn path(&self, namespace: Option<&str>) -> String {
        let base = if self.group.is_empty() {
            format!("/api/{}", self.version)
        } else {
            format!("/apis/{}/{}", self.group, self.version)
        };
        match namespace {
            Some(ns) if self.namespaced => format!("{base}/namespaces/{ns}/{}", self.plural),
            _ => format!("{base}/{}", self.plural),
        }
    }

    /// Whether kubectl would take `name` (plural, singular, short name or kind) with the
    /// optional `.group` / `.version.group` qualifier `qual` for this type.
    fn answers_to(&self, name: &str, qual: Option<&str>) -> bool {
        let named = self.plural == name
            || self.singular == name
            || self.short_names.iter().any(|s| s == name)
            || self.kind.eq_ignore_ascii_case(name);
        named
            && match qual {
                None => true,
                Some(q) => {
                    q == self.group
                        || q.split_once('.')
                            .is_some_and(|(v, g)| v == self.version && g == self.group)
                        || (self.group.is_empty() && q == self.version)
                }
            }
    }

    fn to_json(&self) -> Value {
        json!({"name": self.plural, "shortNames": self.short_names, "apiVersion": self.api_version(),
               "namespaced": self.namespaced, "kind": self.kind, "verbs": self.verbs,
               "categories": self.categories})
    }
}

/// Finds the type kubectl would pick for `resource` among `types` (discovery order: the
/// core group first).
pub fn resolve<'a>(types: &'a [ApiType], resource: &str) -> Option<&'a ApiType> {
    let lower = resource.to_ascii_lowercase();
    let (name, qual) = match lower.split_once('.') {
        Some((n, q)) => (n, Some(q)),
        None => (lower.as_str(), None),
    };
    // Exact plural names win over singular, short and kind matches (as kubectl's RESTMapper).
    types
        .iter()
        .find(|t| t.plural == name && t.answers_to(name, qual))
        .or_else(|| types.iter().find(|t| t.answers_to(name, qual)))
}

/// One connection's worth of a cluster's client: its own pool, and a bound on the watch
/// streams it carries.
struct Lane {
    client: kube::Client,
    watches: Arc<tokio::sync::Semaphore>,
}

/// What discovery last gave.
enum Discovered {
    Types(Instant, Arc<Vec<ApiType>>),
    Failed(Instant, SourceError),
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

/// An open watch: the response body, read chunk by chunk, holding its place on its
/// connection.
pub struct WatchBody {
    body: kube::client::Body,
    _stream: tokio::sync::OwnedSemaphorePermit,
}

impl WatchBody {
    /// The next chunk of the stream; `None` when it ended: the server ended it, the
    /// connection was cut (mid-chunk, an h2 GOAWAY or reset: how watches often end behind
    /// proxies), or it was silent past [`WATCH_SILENCE`] (a half-open connection). Either way
    /// the watcher watches again from where it was.
    pub async fn chunk(&mut self) -> Option<Result<Bytes, String>> {
        loop {
            let frame = match tokio::time::timeout(WATCH_SILENCE, self.body.frame()).await {
                Err(_) => {
                    tracing::debug!("a watch stream was silent past its timeout; watching again");
                    return None;
                }
                Ok(f) => f?,
            };
            match frame {
                Ok(frame) => {
                    if let Ok(data) = frame.into_data()
                        && !data.is_empty()
                    {
                        return Some(Ok(data));
                    }
                }
                Err(e) => {
                    let (cut, why) = body_error(&e);
                    if cut {
                        tracing::debug!(%why, "a watch stream was cut; watching again");
                        return None;
                    }
                    return Some(Err(format!("the watch stream broke: {why}")));
                }
            }
        }
    }
}

/// Whether a body error is a cut connection (an end to watch again after), and its
/// innermost cause in words.
fn body_error(e: &(dyn std::error::Error + 'static)) -> (bool, String) {
    let mut cut = false;
    let mut why = e.to_string();
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(h) = err.downcast_ref::<hyper::Error>()
            && (h.is_incomplete_message() || h.is_closed() || h.is_canceled())
        {
            cut = true;
        }
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && matches!(
                io.kind(),
                std::io::ErrorKind::UnexpectedEof
                    | std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::ConnectionAborted
                    | std::io::ErrorKind::BrokenPipe
            )
        {
            cut = true;
        }
        let text = err.to_string();
        // h2's GOAWAY or RST_STREAM with NO_ERROR: the server closing politely.
        if text.contains("NO_ERROR") || text.contains("go away") {
            cut = true;
        }
        why = text;
        cur = err.source();
    }
    (cut, why)
}

/// What went wrong with credentials, in words that never carry a secret: kube's own text
/// for an exec plugin's failure quotes its command, environment and everything it printed.
fn auth_words(e: &kube::client::AuthError) -> String {
    use kube::client::AuthError as A;
    match e {
        A::AuthExecStart(io) => format!(
            "the exec credential plugin could not be started ({})",
            io.kind()
        ),
        A::AuthExecRun { out, .. } => format!(
            "the exec credential plugin failed ({}); run it by hand to see why",
            out.status
        ),
        A::ExecPluginFailed | A::AuthExecParse(_) | A::AuthExec(_) => {
            "the exec credential plugin printed no usable ExecCredential; run it by hand to see why"
                .to_owned()
        }
        A::MalformedTokenExpirationDate(_) => {
            "the exec credential plugin printed a bad expirationTimestamp".to_owned()
        }
        A::ReadTokenFile(io, _) => {
            format!("cannot read the kubeconfig's tokenFile ({})", io.kind())
        }
        A::MissingCommand => "the kubeconfig's exec section names no command".to_owned(),
        A::Oidc(_) => "the OIDC token could not be refreshed; log in again".to_owned(),
        A::InvalidBasicAuth(_) | A::InvalidBearerToken(_) => {
            "the kubeconfig's credentials are not valid header values".to_owned()
        }
        _ => "the kubeconfig's credentials could not be used".to_owned(),
    }
}

/// An error from kube in words: credentials never quoted, library type names never shown
/// (the innermost cause).
fn kube_words(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    let mut innermost = e.to_string();
    while let Some(err) = cur {
        if let Some(a) = err.downcast_ref::<kube::client::AuthError>() {
            return auth_words(a);
        }
        if let Some(kube::Error::Auth(a)) = err.downcast_ref::<kube::Error>() {
            return auth_words(a);
        }
        innermost = err.to_string();
        cur = err.source();
    }
    innermost
}

impl ClusterClient {
    /// Lane `i` (lane 0 always exists).
    fn lane(&self, i: usize) -> Arc<Lane> {
        self.lanes.lock().unwrap_or_else(|e| e.into_inner())[i].clone()
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
        if let Some(got) = free(&self.lanes.lock().unwrap_or_else(|e| e.into_inner())) {
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
        self.lanes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(lane.clone());
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
        parts.headers.insert(
            http::header::ACCEPT,
            http::HeaderValue::from_static("application/json"),
        );
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
            let req = request
                .list(&params)
                .map_err(|e| SourceError::InvalidParams(format!("bad selection: {e}")))?;
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
                    if let Some(m) = o.as_object_mut() {
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

    /// The cluster's resource types: discovered once, again when `fresh` and the last
    /// discovery is older than [`REDISCOVER`]. A failure is remembered for
    /// [`DISCOVERY_FAILURE_MEMORY`]; a failed rediscovery keeps the last good one.
    async fn types(&self, fresh: bool) -> Result<Arc<Vec<ApiType>>, SourceError> {
        let mut d = self.discovery.lock().await;
        match &*d {
            Some(Discovered::Types(at, types)) if !fresh || at.elapsed() < REDISCOVER => {
                return Ok(types.clone());
            }
            Some(Discovered::Failed(at, e)) if at.elapsed() < DISCOVERY_FAILURE_MEMORY => {
                return Err(e.clone());
            }
            _ => {}
        }
        match self.discover().await {
            Ok(types) => {
                let types = Arc::new(types);
                *d = Some(Discovered::Types(Instant::now(), types.clone()));
                Ok(types)
            }
            Err(e) => {
                if let Some(Discovered::Types(_, types)) = &*d {
                    tracing::debug!(error = %e, "discovery failed; keeping the last one");
                    return Ok(types.clone());
                }
                *d = Some(Discovered::Failed(Instant::now(), e.clone()));
                Err(e)
            }
        }
    }

    async fn get_json(&self, path: &str, token: Option<&str>) -> Result<Value, SourceError> {
        let req = http::Request::get(path)
            .body(Vec::new())
            .map_err(|e| unavailable(format!("bad discovery path {path}: {e}")))?;
        let lane = self.lane(0);
        let res = self
            .send(&lane, req, token)
            .await
            .map_err(ApiError::into_source)?;
        let body = self.body(res, "discovery").await?;
        serde_json::from_slice(&body).map_err(|e| {
            unavailable(format!(
                "the API server at {} answered {path} with no JSON: {e}",
                self.server
            ))
        })
    }

    /// Legacy discovery: `/api` and its versions, `/apis` and each group's preferred
    /// version (these fetched concurrently).
    async fn discover(&self) -> Result<Vec<ApiType>, SourceError> {
        // One token for the whole discovery (--token-command runs once, not once a group).
        let token = self.token().await?;
        let token = token.as_deref();
        // One request first, alone: until a connection exists the pool cannot know that it
        // will be h2, and concurrent first requests would each open one.
        let core = self.get_json("/api", token).await?;
        let groups = self.get_json("/apis", token).await?;
        let mut versions: Vec<(String, String)> = Vec::new();
        if let Some(v) = core["versions"]
            .as_array()
            .and_then(|v| v.first())
            .and_then(Value::as_str)
        {
            versions.push((String::new(), v.to_owned()));
        }
        for g in groups["groups"].as_array().into_iter().flatten() {
            let name = g["name"].as_str().unwrap_or_default();
            let pref = g["preferredVersion"]["version"]
                .as_str()
                .or_else(|| g["versions"][0]["version"].as_str());
            if let Some(v) = pref
                && !name.is_empty()
            {
                versions.push((name.to_owned(), v.to_owned()));
            }
        }
        use futures::StreamExt;
        let lists: Vec<(String, String, Result<Value, SourceError>)> =
            futures::stream::iter(versions)
                .map(|(group, version)| async move {
                    let path = if group.is_empty() {
                        format!("/api/{version}")
                    } else {
                        format!("/apis/{group}/{version}")
                    };
                    let r = self.get_json(&path, token).await;
                    (group, version, r)
                })
                .buffered(8)
                .collect()
                .await;
        let mut out = Vec::new();
        for (group, version, list) in lists {
            // A group whose discovery fails (an aggregated API that is down) is left out, as
            // kubectl does, unless it is the core group.
            let list = match list {
                Ok(l) => l,
                Err(e) if group.is_empty() => return Err(e),
                Err(e) => {
                    tracing::debug!(%group, error = %e, "discovery of an API group failed");
                    continue;
                }
            };
            for r in list["resources"].as_array().into_iter().flatten() {
                let plural = r["name"].as_str().unwrap_or_default();
                if plural.is_empty() || plural.contains('/') {
                    continue;
                }
                let strings = |k: &str| -> Vec<String> {
                    r[k].as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|s| s.as_str().map(str::to_owned))
                        .collect()
                };
                let kind = r["kind"].as_str().unwrap_or_default().to_owned();
                out.push(ApiType {
                    group: group.clone(),
                    version: version.clone(),
                    plural: plural.to_owned(),
                    singular: r["singularName"]
                        .as_str()
                        .filter(|s| !s.is_empty())
                        .map(str::to_owned)
                        .unwrap_or_else(|| kind.to_ascii_lowercase()),
                    kind,
                    short_names: strings("shortNames"),
                    namespaced: r["namespaced"].as_bool().unwrap_or(false),
                    verbs: strings("verbs"),
                    categories: strings("categories"),
                });
            }
        }
        Ok(out)
    }

    /// The type `resource` names (with `fresh`, after discovering again if the last one is
    /// old enough: a 404 said it moved), or an error with `did you mean` that reads as
    /// kubectl's.
    async fn resolve(&self, resource: &str, fresh: bool) -> Result<ApiType, SourceError> {
        if !fresh {
            let types = self.types(false).await?;
            if let Some(t) = resolve(&types, resource) {
                return Ok(t.clone());
            }
        }
        // Perhaps installed (or moved) since: look again, at most every REDISCOVER.
        let types = self.types(true).await?;
        if let Some(t) = resolve(&types, resource) {
            return Ok(t.clone());
        }
        let list = Value::Array(types.iter().map(ApiType::to_json).collect());
        let names = did_you_mean(resource, &list);
        let hint = if names.is_empty() {
            "; get_api_resources lists the resource types this cluster serves".to_owned()
        } else {
            format!("; did you mean: {}?", names.join(", "))
        };
        Err(SourceError::InvalidParams(format!(
            "the server doesn't have a resource type \"{resource}\"{hint}"
        )))
    }
}

/// A body over its bound.
struct Overflow;

type BodyError = Box<dyn std::error::Error + Send + Sync>;

/// Reads a body of at most `max` bytes: `Err(Overflow)` past it, `Ok(Err)` if it broke.
async fn read_bounded(
    mut body: kube::client::Body,
    max: usize,
) -> Result<Result<Bytes, BodyError>, Overflow> {
    let mut out = bytes::BytesMut::new();
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => {
                if let Ok(d) = frame.into_data() {
                    if out.len() + d.len() > max {
                        return Err(Overflow);
                    }
                    out.extend_from_slice(&d);
                }
            }
            Err(e) => return Ok(Err(Box::new(e))),
        }
    }
    Ok(Ok(out.freeze()))
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
            let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
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
            let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
            if clients
                .get(&key)
                .is_some_and(|c| Arc::ptr_eq(c, &cell) && !c.initialized())
            {
                clients.remove(&key);
            }
        }
        built
    }

    /// How a cluster is named in messages: the kubeconfig's name (never its path: messages
    /// reach clients), the context and the workspace.
    fn label(&self, c: &Cluster) -> String {
        let mut s = format!(
            "kubeconfig {}",
            c.kubeconfig.as_deref().unwrap_or("(default)")
        );
        if let Some(ctx) = &c.context {
            s.push_str(&format!(", context {ctx}"));
        }
        if let Some(ws) = &c.workspace {
            s.push_str(&format!(", workspace {ws}"));
        }
        s
    }

    async fn build(&self, cluster: &Cluster) -> Result<Arc<ClusterClient>, BuildError> {
        let config_err = |m: String| BuildError::Config(unavailable(m));
        let path = match cluster.kubeconfig.as_deref() {
            None => None,
            Some(n) => match self.kubeconfigs.iter().find(|(k, _)| k == n) {
                Some((_, p)) => Some(p.clone()),
                None => {
                    return Err(BuildError::Config(SourceError::InvalidParams(format!(
                        "no kubeconfig named {n}; this server has {}",
                        if self.kubeconfigs.is_empty() {
                            "only the default kubeconfig".to_owned()
                        } else {
                            self.kubeconfigs
                                .iter()
                                .map(|(k, _)| k.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        }
                    ))));
                }
            },
        };
        if cluster.workspace.is_some() && path.is_none() {
            return Err(BuildError::Config(SourceError::InvalidParams(
                "kcp workspaces need a kubeconfig; start the server with --kubeconfig PATH".into(),
            )));
        }
        let what = self.label(cluster);
        let options = kube::config::KubeConfigOptions {
            context: cluster.context.clone(),
            ..Default::default()
        };
        let mut config = match &path {
            Some(p) => {
                let kc = kube::config::Kubeconfig::read_from(p)
                    .map_err(|e| config_err(format!("cannot read {what}: {}", kube_words(&e))))?;
                if let Some(ctx) = &cluster.context
                    && !kc.contexts.iter().any(|c| &c.name == ctx)
                {
                    return Err(BuildError::Config(SourceError::InvalidParams(format!(
                        "{what} has no context {ctx}"
                    ))));
                }
                kube::Config::from_custom_kubeconfig(kc, &options)
                    .await
                    .map_err(|e| config_err(format!("{what}: {}", kube_words(&e))))?
            }
            None if cluster.context.is_some() => kube::Config::from_kubeconfig(&options)
                .await
                .map_err(|e| config_err(format!("{what}: {}", kube_words(&e))))?,
            None => kube::Config::infer().await.map_err(|e| {
                config_err(format!(
                    "no kubeconfig found and not running in a cluster ({}); pass --kubeconfig PATH",
                    kube_words(&e)
                ))
            })?,
        };
        if config.proxy_url.is_some() {
            return Err(config_err(format!(
                "{what} sets proxy-url, which herald's client does not support; start herald k8s with --watch-via kubectl"
            )));
        }
        if config
            .auth_info
            .auth_provider
            .as_ref()
            .is_some_and(|p| p.name != "oidc")
        {
            return Err(config_err(format!(
                "{what}: its user's auth-provider is not oidc, the only one herald's client supports; use an exec credential plugin, or start herald k8s with --watch-via kubectl"
            )));
        }
        if let Some(ws) = &cluster.workspace {
            let url = config.cluster_url.to_string();
            let base = match url.find("/clusters/") {
                Some(i) => &url[..i],
                None => url.trim_end_matches('/'),
            };
            config.cluster_url = format!("{base}/clusters/{ws}").parse().map_err(|e| {
                config_err(format!("{what}: no server URL for workspace {ws}: {e}"))
            })?;
        }
        if self.token_command.is_some() {
            // The minted token is the user's credential; a client certificate stays (as
            // kubectl --token keeps it).
            let a = &mut config.auth_info;
            a.token = None;
            a.token_file = None;
            a.exec = None;
            a.auth_provider = None;
            a.username = None;
            a.password = None;
        }
        if let Some(exec) = &mut config.auth_info.exec {
            // Never handed herald's stdin (an MCP stream under --stdio), never prompting.
            exec.interactive_mode = Some(kube::config::ExecInteractiveMode::Never);
        }
        let server = redacted(&config.cluster_url);
        let namespace = config.default_namespace.clone();
        // Building runs exec credential plugins (blocking std::process calls): off the
        // runtime's workers.
        let c = config.clone();
        let client = tokio::task::spawn_blocking(move || build_client(c))
            .await
            .map_err(|e| BuildError::Credentials(unavailable(format!("building the client failed: {e}"))))?
            .map_err(|e| {
                BuildError::Credentials(unavailable(format!(
                    "{what}: {e}; if kubectl itself handles this kubeconfig, start herald k8s with --watch-via kubectl"
                )))
            })?;
        Ok(Arc::new(ClusterClient {
            lanes: std::sync::Mutex::new(vec![Arc::new(Lane {
                client,
                watches: Arc::new(tokio::sync::Semaphore::new(STREAMS_PER_CONNECTION)),
            })]),
            config,
            namespace,
            server,
            token_command: self.token_command.clone(),
            discovery: tokio::sync::Mutex::new(None),
            lists: tokio::sync::Semaphore::new(LISTS_AT_ONCE),
            built: Instant::now(),
            refused: std::sync::atomic::AtomicBool::new(false),
        }))
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

/// A server URL without userinfo or query, for messages (a kcp workspace's path kept).
fn redacted(uri: &http::Uri) -> String {
    let scheme = uri.scheme_str().unwrap_or("https");
    let host = uri.host().unwrap_or("?");
    let path = uri.path().trim_end_matches('/');
    let path = if path.starts_with("/clusters/") {
        path
    } else {
        ""
    };
    match uri.port_u16() {
        Some(p) => format!("{scheme}://{host}:{p}{path}"),
        None => format!("{scheme}://{host}{path}"),
    }
}

/// kube's client, with HTTP/2 offered: hyper's pooled client over rustls (ALPN h2 then
/// http/1.1), kube's base-URI, auth and header layers on top.
fn build_client(config: kube::Config) -> Result<kube::Client, String> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(config.connect_timeout.or(Some(Duration::from_secs(30))));
    // A dead peer is noticed within about two minutes even on an idle HTTP/1.1 watch.
    http.set_keepalive(Some(Duration::from_secs(60)));
    http.set_keepalive_interval(Some(Duration::from_secs(15)));
    http.set_keepalive_retries(Some(4));
    let tls = config.rustls_client_config().map_err(|e| kube_words(&e))?;
    let mut builder = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    if let Some(name) = &config.tls_server_name {
        let name = rustls::pki_types::ServerName::try_from(name.clone())
            .map_err(|e| format!("bad tls-server-name {name}: {e}"))?;
        builder =
            builder.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name));
    }
    let https = builder.enable_all_versions().wrap_connector(http);
    let hyper = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .timer(hyper_util::rt::TokioTimer::new())
        .pool_timer(hyper_util::rt::TokioTimer::new())
        .pool_idle_timeout(Duration::from_secs(90))
        // A dead h2 connection is noticed within a minute even while only watches are open.
        .http2_keep_alive_interval(Duration::from_secs(30))
        .http2_keep_alive_timeout(Duration::from_secs(20))
        .http2_keep_alive_while_idle(true)
        .build(https);
    let auth = config.auth_layer().map_err(|e| kube_words(&e))?;
    let headers = config.extra_headers_layer().map_err(|e| kube_words(&e))?;
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(auth)
        .layer(headers)
        .map_err(tower::BoxError::from)
        .service(hyper);
    Ok(kube::Client::new(service, config.default_namespace))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(group: &str, version: &str, plural: &str, kind: &str, short: &[&str]) -> ApiType {
        ApiType {
            group: group.into(),
            version: version.into(),
            plural: plural.into(),
            singular: kind.to_ascii_lowercase(),
            kind: kind.into(),
            short_names: short.iter().map(|s| s.to_string()).collect(),
            namespaced: true,
            verbs: vec!["list".into(), "watch".into()],
            categories: Vec::new(),
        }
    }

    #[test]
    fn resources_resolve_as_kubectl_names_them() {
        let types = vec![
            t("", "v1", "pods", "Pod", &["po"]),
            t("", "v1", "events", "Event", &["ev"]),
            t("apps", "v1", "deployments", "Deployment", &["deploy"]),
            t("events.k8s.io", "v1", "events", "Event", &["ev"]),
        ];
        let g = |r: &str| resolve(&types, r).map(|t| format!("{}/{}", t.group, t.plural));
        assert_eq!(g("pods").as_deref(), Some("/pods"));
        assert_eq!(g("pod").as_deref(), Some("/pods"));
        assert_eq!(g("po").as_deref(), Some("/pods"));
        assert_eq!(g("Pod").as_deref(), Some("/pods"));
        assert_eq!(g("deploy").as_deref(), Some("apps/deployments"));
        assert_eq!(g("deployments.apps").as_deref(), Some("apps/deployments"));
        assert_eq!(
            g("deployments.v1.apps").as_deref(),
            Some("apps/deployments")
        );
        assert_eq!(g("deployments.extensions"), None);
        // The core group first, as kubectl picks it; the group qualifier picks the other.
        assert_eq!(g("events").as_deref(), Some("/events"));
        assert_eq!(
            g("events.events.k8s.io").as_deref(),
            Some("events.k8s.io/events")
        );
        assert_eq!(g("nothing"), None);
    }

    #[test]
    fn paths_follow_group_and_scope() {
        let pods = t("", "v1", "pods", "Pod", &[]);
        assert_eq!(pods.path(Some("ns1")), "/api/v1/namespaces/ns1/pods");
        assert_eq!(pods.path(None), "/api/v1/pods");
        let mut nodes = t("", "v1", "nodes", "Node", &[]);
        nodes.namespaced = false;
        assert_eq!(
            nodes.path(Some("ns1")),
            "/api/v1/nodes",
            "cluster-scoped ignores -n"
        );
        let d = t("apps", "v1", "deployments", "Deployment", &[]);
        assert_eq!(d.path(Some("a")), "/apis/apps/v1/namespaces/a/deployments");
        assert_eq!(d.to_json()["apiVersion"], "apps/v1");
    }

    #[test]
    fn server_urls_are_quoted_without_secrets() {
        let u: http::Uri = "https://user:pw@10.0.0.1:6443/clusters/x?token=y"
            .parse()
            .unwrap();
        assert_eq!(redacted(&u), "https://10.0.0.1:6443/clusters/x");
        let u: http::Uri = "https://10.0.0.1/k8s/".parse().unwrap();
        assert_eq!(redacted(&u), "https://10.0.0.1");
    }

    #[test]
    fn exec_failures_never_quote_the_plugin() {
        use std::os::unix::process::ExitStatusExt;
        let e = kube::client::AuthError::AuthExecRun {
            cmd: "kubelogin --client-secret=s3cret".into(),
            out: Box::new(std::process::Output {
                status: std::process::ExitStatus::from_raw(256),
                stdout: b"token: s3cret".to_vec(),
                stderr: b"VAULT_TOKEN=s3cret".to_vec(),
            }),
        };
        let words = kube_words(&kube::Error::Auth(e));
        assert!(!words.contains("s3cret"), "{words}");
        assert!(words.contains("exec credential plugin failed"), "{words}");
    }
}
