//! A fake Kubernetes API server that the real `kubectl` and herald's own client (kube, hyper)
//! both talk to: legacy discovery (`/version`, `/api`, `/apis`, `/api/v1`), configmaps list /
//! get / watch / delete with resourceVersion and a replayable history, chunked watch streams
//! (`watch=true`, `resourceVersion`, `allowWatchBookmarks`, `timeoutSeconds` accepted),
//! BOOKMARK events on demand, label selectors, `410 Gone` on demand, and kcp's
//! `/clusters/{workspace}` prefix (each workspace its own object space).
//!
//! [`FakeApi::start`] serves plain HTTP (HTTP/1.1, and h2c with prior knowledge);
//! [`FakeApi::start_tls`] serves HTTPS with a CA it makes, offers h2 and HTTP/1.1 by ALPN and
//! requires a client certificate signed by that CA ([`FakeApi::kubeconfig`] then carries the
//! CA and a client certificate). [`FakeApi::require_token`] makes it answer 401 to any other
//! bearer token. It counts the TCP connections it accepted.
//!
//! Tests change objects directly through [`FakeApi`] and await its state with
//! [`FakeApi::wait`], never a sleep. `tests/bench/k8s.rs` includes this file too.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::response::Response;
use serde_json::{Value, json};
use tokio::sync::{Notify, mpsc};

/// How long [`FakeApi::wait`] waits (the fake is shared with the k8s bench, so it has its own).
const WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Changes to make right after a list is answered.
type AfterList = Box<dyn FnOnce(&mut Gap) + Send>;

#[derive(Default)]
struct Inner {
    rv: u64,
    next_uid: u64,
    /// (workspace, namespace, name) → object.
    objects: BTreeMap<(String, String, String), Value>,
    /// (workspace, rv, event) for watch replay.
    history: Vec<(String, u64, Value)>,
    watches: Vec<Watch>,
    /// Answer the next watch request with 410 Gone.
    gone_next: bool,
    /// Every request's method and path (with query), in order.
    requests: Vec<String>,
    /// Each request's Accept header, in the order of `requests`.
    accepts: Vec<String>,
    /// Changes made right after the next list is answered (before any watch can start).
    after_list: Option<AfterList>,
    /// The bearer token every request must carry (None: any or none).
    token: Option<String>,
    /// Answer whole objects whatever `as=` asks, as a server without the metadata forms.
    whole_only: bool,
    /// Bearer tokens seen, in order (for tests of minted credentials).
    tokens: Vec<String>,
    /// TCP connections accepted.
    connections: u64,
}

struct Watch {
    ws: String,
    ns: Option<String>,
    labels: Option<(String, String)>,
    /// Asked for PartialObjectMetadata: each object's metadata alone.
    metadata: bool,
    tx: mpsc::UnboundedSender<Result<Vec<u8>, std::io::Error>>,
}

/// An object as PartialObjectMetadata (what a client asking `as=PartialObjectMetadata` gets).
fn partial(obj: &Value) -> Value {
    json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": obj["metadata"]})
}

/// A watch event's line for `w`.
fn line_for(w: &Watch, ev: &Value) -> Vec<u8> {
    if w.metadata {
        let ev = json!({"type": ev["type"], "object": partial(&ev["object"])});
        format!("{ev}\n").into_bytes()
    } else {
        format!("{ev}\n").into_bytes()
    }
}

#[derive(Clone)]
pub struct FakeApi {
    inner: Arc<Mutex<Inner>>,
    changed: Arc<Notify>,
    /// While true, watch streams send nothing yet (what they would send waits, in order).
    held: Arc<tokio::sync::watch::Sender<bool>>,
    pub url: String,
}

fn matches(w: &Watch, ws: &str, obj: &Value) -> bool {
    w.ws == ws
        && w.ns
            .as_deref()
            .is_none_or(|ns| obj["metadata"]["namespace"] == ns)
        && w.labels
            .as_ref()
            .is_none_or(|(k, v)| obj["metadata"]["labels"][k] == v.as_str())
}

impl Inner {
    fn bookmark(&mut self) {
        let ev = json!({"type": "BOOKMARK", "object": {"kind": "ConfigMap", "apiVersion": "v1",
            "metadata": {"resourceVersion": self.rv.to_string()}}});
        let line = format!("{ev}\n").into_bytes();
        self.watches.retain(|w| w.tx.send(Ok(line.clone())).is_ok());
    }

    fn emit(&mut self, ws: &str, kind: &str, obj: &Value) {
        let ev = json!({"type": kind, "object": obj});
        self.history.push((ws.to_owned(), self.rv, ev.clone()));
        self.watches
            .retain(|w| !matches(w, ws, obj) || w.tx.send(Ok(line_for(w, &ev))).is_ok());
    }

    fn put(&mut self, ws: &str, ns: &str, name: &str, data: Value, labels: Value) -> Value {
        self.rv += 1;
        let key = (ws.to_owned(), ns.to_owned(), name.to_owned());
        let (uid, kind) = match self.objects.get(&key) {
            Some(o) => (o["metadata"]["uid"].clone(), "MODIFIED"),
            None => {
                self.next_uid += 1;
                (json!(format!("uid-{}", self.next_uid)), "ADDED")
            }
        };
        let obj = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": ns, "uid": uid, "labels": labels,
                         "resourceVersion": self.rv.to_string(),
                         "creationTimestamp": "2026-11-30T00:00:00Z",
                         "managedFields": [{"manager": "kubectl-create", "operation": "Update"}]},
            "data": data});
        self.objects.insert(key, obj.clone());
        self.emit(ws, kind, &obj);
        obj
    }

    fn remove(&mut self, ws: &str, ns: &str, name: &str) -> Option<Value> {
        let mut obj = self
            .objects
            .remove(&(ws.to_owned(), ns.to_owned(), name.to_owned()))?;
        self.rv += 1;
        obj["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        self.emit(ws, "DELETED", &obj);
        Some(obj)
    }
}

/// Changes made where no open watch stream sees them (see [`FakeApi::drop_watches_and`] and
/// [`FakeApi::after_next_list`]).
pub struct Gap<'a>(&'a mut Inner);

impl Gap<'_> {
    pub fn put(&mut self, ws: &str, ns: &str, name: &str, data: Value) {
        self.0.put(ws, ns, name, data, json!({}));
    }
    pub fn delete(&mut self, ws: &str, ns: &str, name: &str) {
        self.0.remove(ws, ns, name);
    }
}

fn json_response(status: StatusCode, v: Value) -> Response {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Body::from(v.to_string()))
        .unwrap()
}

fn status(code: u16, reason: &str, message: &str) -> Response {
    json_response(
        StatusCode::from_u16(code).unwrap(),
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": message, "reason": reason, "code": code}),
    )
}

fn query_param(q: &str, key: &str) -> Option<String> {
    q.split('&').find_map(|p| {
        let (k, v) = p.split_once('=')?;
        (k == key).then(|| {
            // Enough decoding for label selectors.
            v.replace("%3D", "=")
                .replace("%3d", "=")
                .replace("%2C", ",")
        })
    })
}

async fn handle(State(api): State<FakeApi>, req: Request) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let query = req.uri().query().unwrap_or("").to_owned();
    let bearer = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_owned);
    let accept = req
        .headers()
        .get("accept")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    {
        let mut inner = api.inner.lock().unwrap();
        inner.requests.push(format!("{method} {path}?{query}"));
        inner.accepts.push(accept.clone());
        if let Some(t) = &bearer {
            inner.tokens.push(t.clone());
        }
        if let Some(want) = &inner.token
            && bearer.as_ref() != Some(want)
        {
            drop(inner);
            api.changed.notify_waiters();
            return status(401, "Unauthorized", "Unauthorized");
        }
    }
    api.changed.notify_waiters();
    let (ws, rest) = match path.strip_prefix("/clusters/") {
        Some(r) => match r.split_once('/') {
            Some((ws, rest)) => (ws.to_owned(), format!("/{rest}")),
            None => (r.to_owned(), "/".into()),
        },
        None => (String::new(), path.clone()),
    };
    let parts: Vec<&str> = rest.trim_matches('/').split('/').collect();
    match (method.clone(), parts.as_slice()) {
        (Method::GET, ["version"]) => json_response(
            StatusCode::OK,
            json!({"major": "1", "minor": "32", "gitVersion": "v1.32.0-fake", "platform": "linux/amd64"}),
        ),
        (Method::GET, ["api"]) => json_response(
            StatusCode::OK,
            json!({"kind": "APIVersions", "versions": ["v1"],
                   "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]}),
        ),
        (Method::GET, ["apis"]) => json_response(
            StatusCode::OK,
            json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": []}),
        ),
        (Method::GET, ["api", "v1"]) => {
            let verbs = json!([
                "create", "delete", "get", "list", "patch", "update", "watch"
            ]);
            json_response(
                StatusCode::OK,
                json!({"kind": "APIResourceList", "groupVersion": "v1", "resources": [
                    {"name": "configmaps", "singularName": "configmap", "namespaced": true, "kind": "ConfigMap", "verbs": verbs, "shortNames": ["cm"]},
                    {"name": "namespaces", "singularName": "namespace", "namespaced": false, "kind": "Namespace", "verbs": verbs, "shortNames": ["ns"]},
                    {"name": "pods", "singularName": "pod", "namespaced": true, "kind": "Pod", "verbs": verbs, "shortNames": ["po"]},
                    {"name": "secrets", "singularName": "secret", "namespaced": true, "kind": "Secret", "verbs": verbs}
                ]}),
            )
        }
        (m, ["api", "v1", "configmaps"]) => collection(&api, m, &ws, None, &query, &accept),
        (m, ["api", "v1", "namespaces", ns, "configmaps"]) => {
            collection(&api, m, &ws, Some(ns.to_string()), &query, &accept)
        }
        (Method::GET, ["api", "v1", "namespaces", ns, "configmaps", name]) => {
            let inner = api.inner.lock().unwrap();
            match inner
                .objects
                .get(&(ws.clone(), ns.to_string(), name.to_string()))
            {
                Some(o) => json_response(StatusCode::OK, o.clone()),
                None => status(404, "NotFound", &format!("configmaps \"{name}\" not found")),
            }
        }
        (Method::DELETE, ["api", "v1", "namespaces", ns, "configmaps", name]) => {
            let removed = api.inner.lock().unwrap().remove(&ws, ns, name);
            api.changed.notify_waiters();
            match removed {
                Some(o) => json_response(StatusCode::OK, o),
                None => status(404, "NotFound", &format!("configmaps \"{name}\" not found")),
            }
        }
        (Method::GET, ["api", "v1", _] | ["api", "v1", "namespaces", _, _]) => json_response(
            StatusCode::OK,
            json!({"kind": "List", "apiVersion": "v1", "metadata": {"resourceVersion": "1"}, "items": []}),
        ),
        _ => status(
            404,
            "NotFound",
            "the server could not find the requested resource",
        ),
    }
}

fn collection(
    api: &FakeApi,
    m: Method,
    ws: &str,
    ns: Option<String>,
    query: &str,
    accept: &str,
) -> Response {
    // `as=PartialObjectMetadataList` for a list, `as=PartialObjectMetadata` for a watch; the
    // one asked of the other is refused as a real API server refuses it.
    let as_list = accept.contains("as=PartialObjectMetadataList");
    let as_object = accept.contains("as=PartialObjectMetadata;")
        || accept.ends_with("as=PartialObjectMetadata");
    let watching = query_param(query, "watch").is_some_and(|v| v == "true" || v == "1");
    if (watching && as_list) || (!watching && as_object && !as_list) {
        return status(
            406,
            "NotAcceptable",
            "the requested as= does not fit this request",
        );
    }
    let metadata = (as_list || as_object) && !api.inner.lock().unwrap().whole_only;
    if m != Method::GET {
        return status(405, "MethodNotAllowed", "not supported by the fake");
    }
    let labels = query_param(query, "labelSelector")
        .and_then(|l| l.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())));
    let mut inner = api.inner.lock().unwrap();
    let watch = query_param(query, "watch").is_some_and(|v| v == "true" || v == "1");
    if watch {
        if std::mem::take(&mut inner.gone_next) {
            return status(410, "Expired", "too old resource version");
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let w = Watch {
            ws: ws.to_owned(),
            ns,
            labels,
            metadata,
            tx,
        };
        // Replay what happened after the client's resourceVersion.
        let from: u64 = query_param(query, "resourceVersion")
            .and_then(|v| v.parse().ok())
            .unwrap_or(inner.rv);
        for (hws, rv, ev) in &inner.history {
            if *rv > from && matches(&w, hws, &ev["object"]) {
                let _ = w.tx.send(Ok(line_for(&w, ev)));
            }
        }
        inner.watches.push(w);
        drop(inner);
        api.changed.notify_waiters();
        // Waiters hear when the stream ends or its client goes away (the body is dropped).
        let guard = Closed(api.changed.clone());
        let held = Some(api.held.subscribe());
        let stream =
            futures::stream::unfold((rx, guard, held), |(mut rx, guard, held)| async move {
                if let Some(mut h) = held {
                    let _ = h.wait_for(|held| !*held).await;
                }
                rx.recv().await.map(|item| (item, (rx, guard, None)))
            });
        return Response::builder()
            .status(200)
            .header("content-type", "application/json")
            .body(Body::from_stream(stream))
            .unwrap();
    }
    let items: Vec<Value> = inner
        .objects
        .iter()
        .filter(|((w, n, _), o)| {
            w == ws
                && ns.as_deref().is_none_or(|ns| ns == n)
                && labels
                    .as_ref()
                    .is_none_or(|(k, v)| o["metadata"]["labels"][k] == v.as_str())
        })
        .map(|(_, o)| {
            if metadata {
                return partial(o);
            }
            // A list's items carry no kind or apiVersion, as a real API server's.
            let mut o = o.clone();
            if let Some(m) = o.as_object_mut() {
                m.remove("kind");
                m.remove("apiVersion");
            }
            o
        })
        .collect();
    let rv = inner.rv.to_string();
    if let Some(after) = inner.after_list.take() {
        after(&mut Gap(&mut inner));
        drop(inner);
        api.changed.notify_waiters();
    }
    let (kind, api_version) = if metadata {
        ("PartialObjectMetadataList", "meta.k8s.io/v1")
    } else {
        ("ConfigMapList", "v1")
    };
    json_response(
        StatusCode::OK,
        json!({"kind": kind, "apiVersion": api_version,
               "metadata": {"resourceVersion": rv}, "items": items}),
    )
}

struct Closed(Arc<Notify>);

impl Drop for Closed {
    fn drop(&mut self) {
        self.0.notify_waiters();
    }
}

/// What [`FakeApi::start_tls`] made: its CA, and a client certificate the CA signed.
#[derive(Clone)]
pub struct Pki {
    pub ca_pem: String,
    pub client_cert_pem: String,
    pub client_key_pem: String,
}

fn make_pki() -> (Pki, rustls::ServerConfig) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "fake-kube-ca");
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let server_key = KeyPair::generate().unwrap();
    let server = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
        .unwrap()
        .signed_by(&server_key, &issuer)
        .unwrap();
    let client_key = KeyPair::generate().unwrap();
    let mut cp = CertificateParams::new(Vec::<String>::new()).unwrap();
    cp.distinguished_name
        .push(rcgen::DnType::CommonName, "herald-test");
    let client = cp.signed_by(&client_key, &issuer).unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca_cert.der().clone()).unwrap();
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::new(rustls::crypto::ring::default_provider()),
    )
    .build()
    .unwrap();
    let mut cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_client_cert_verifier(verifier)
    .with_single_cert(
        vec![server.der().clone()],
        rustls::pki_types::PrivateKeyDer::Pkcs8(server_key.serialize_der().into()),
    )
    .unwrap();
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    (
        Pki {
            ca_pem: ca_cert.pem(),
            client_cert_pem: client.pem(),
            client_key_pem: client_key.serialize_pem(),
        },
        cfg,
    )
}

impl FakeApi {
    /// The fake on plain HTTP.
    pub async fn start() -> FakeApi {
        Self::serve(None).await
    }

    /// The fake on HTTPS (h2 and HTTP/1.1 by ALPN), requiring a client certificate.
    pub async fn start_tls() -> (FakeApi, Pki) {
        let (pki, cfg) = make_pki();
        let api = Self::serve(Some(Arc::new(cfg))).await;
        (api, pki)
    }

    async fn serve(tls: Option<Arc<rustls::ServerConfig>>) -> FakeApi {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let scheme = if tls.is_some() { "https" } else { "http" };
        let url = format!("{scheme}://{}", listener.local_addr().unwrap());
        let api = FakeApi {
            inner: Arc::new(Mutex::new(Inner {
                rv: 100,
                ..Inner::default()
            })),
            changed: Arc::new(Notify::new()),
            held: Arc::new(tokio::sync::watch::channel(false).0),
            url,
        };
        let app = axum::Router::new().fallback(handle).with_state(api.clone());
        let counter = api.clone();
        tokio::spawn(async move {
            let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let _ = tcp.set_nodelay(true);
                counter.inner.lock().unwrap().connections += 1;
                counter.changed.notify_waiters();
                let app = app.clone();
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let svc = hyper_util::service::TowerToHyperService::new(app);
                    let builder = hyper_util::server::conn::auto::Builder::new(
                        hyper_util::rt::TokioExecutor::new(),
                    );
                    match acceptor {
                        None => {
                            let _ = builder
                                .serve_connection(hyper_util::rt::TokioIo::new(tcp), svc)
                                .await;
                        }
                        Some(a) => {
                            let Ok(stream) = a.accept(tcp).await else {
                                return;
                            };
                            let _ = builder
                                .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                                .await;
                        }
                    }
                });
            }
        });
        api
    }

    /// A kubeconfig (JSON, which kubectl reads as YAML) for this server, written to `dir`.
    /// On HTTPS it carries the CA and the client certificate ([`FakeApi::kubeconfig_tls`]).
    pub fn kubeconfig(&self, dir: &std::path::Path) -> std::path::PathBuf {
        self.kubeconfig_with(dir, json!({}))
    }

    /// A kubeconfig whose user is `user` (a kubeconfig `user` object: token, exec, ...).
    pub fn kubeconfig_with(&self, dir: &std::path::Path, user: Value) -> std::path::PathBuf {
        let path = dir.join("kubeconfig");
        let v = json!({"apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": user}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake", "namespace": "default"}}],
            "current-context": "fake"});
        std::fs::write(&path, v.to_string()).unwrap();
        path
    }

    /// A kubeconfig for [`FakeApi::start_tls`]: the CA, and the client certificate as the user.
    pub fn kubeconfig_tls(&self, dir: &std::path::Path, pki: &Pki) -> std::path::PathBuf {
        use base64::Engine;
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let path = dir.join("kubeconfig");
        let v = json!({"apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url,
                "certificate-authority-data": b64(&pki.ca_pem)}}],
            "users": [{"name": "fake", "user": {
                "client-certificate-data": b64(&pki.client_cert_pem),
                "client-key-data": b64(&pki.client_key_pem)}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake", "namespace": "default"}}],
            "current-context": "fake"});
        std::fs::write(&path, v.to_string()).unwrap();
        path
    }

    /// Answers 401 to every request that does not carry `Bearer <token>`.
    /// From now on, answers whole objects to a request for PartialObjectMetadata, as a server
    /// (or an aggregated API) that does not do it.
    pub fn whole_objects_only(&self) {
        self.inner.lock().unwrap().whole_only = true;
    }

    pub fn require_token(&self, token: &str) {
        self.inner.lock().unwrap().token = Some(token.to_owned());
    }

    /// The bearer tokens requests carried, in order.
    pub fn tokens(&self) -> Vec<String> {
        self.inner.lock().unwrap().tokens.clone()
    }

    /// TCP connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.inner.lock().unwrap().connections
    }

    /// Makes `gap`'s changes right after the next list is answered: after the list's
    /// resourceVersion was taken and before any watch from it can start.
    pub fn after_next_list(&self, gap: impl FnOnce(&mut Gap) + Send + 'static) {
        self.inner.lock().unwrap().after_list = Some(Box::new(gap));
    }

    /// Holds every watch stream's first bytes (a list still answers) until
    /// [`release_watches`](Self::release_watches): a test orders what a client reads against
    /// what a watch delivers.
    pub fn hold_watches(&self) {
        self.held.send_replace(true);
    }

    pub fn release_watches(&self) {
        self.held.send_replace(false);
    }

    /// Sends a BOOKMARK at the current resourceVersion on every open watch stream.
    pub fn bookmark(&self) -> u64 {
        let mut inner = self.inner.lock().unwrap();
        inner.bookmark();
        inner.rv
    }

    pub fn put(&self, ws: &str, ns: &str, name: &str, data: Value) -> Value {
        self.put_labeled(ws, ns, name, data, json!({}))
    }

    pub fn put_labeled(&self, ws: &str, ns: &str, name: &str, data: Value, labels: Value) -> Value {
        let o = self.inner.lock().unwrap().put(ws, ns, name, data, labels);
        self.changed.notify_waiters();
        o
    }

    pub fn delete(&self, ws: &str, ns: &str, name: &str) {
        self.inner.lock().unwrap().remove(ws, ns, name);
        self.changed.notify_waiters();
    }

    /// Ends every watch stream, then makes `gap`'s changes, which no stream sees: a client
    /// learns of them only by listing again.
    pub fn drop_watches_and(&self, gap: impl FnOnce(&mut Gap)) {
        let mut inner = self.inner.lock().unwrap();
        inner.watches.clear();
        gap(&mut Gap(&mut inner));
        drop(inner);
        self.changed.notify_waiters();
    }

    /// Ends every watch stream with a `410 Gone` ERROR event, and answers the next watch
    /// request with 410 too.
    pub fn expire_watches(&self) {
        let mut inner = self.inner.lock().unwrap();
        let gone = json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1",
            "status": "Failure", "message": "too old resource version", "reason": "Expired", "code": 410}});
        for w in inner.watches.drain(..) {
            let _ = w.tx.send(Ok(format!("{gone}\n").into_bytes()));
        }
        inner.gone_next = true;
        drop(inner);
        self.changed.notify_waiters();
    }

    /// Makes `gap`'s changes where no watch stream sees them, then ends every stream with a
    /// `410 Gone` ERROR event (and answers the next watch request with 410): only a new list
    /// can tell of them.
    pub fn expire_watches_and(&self, gap: impl FnOnce(&mut Gap)) {
        let mut inner = self.inner.lock().unwrap();
        let open = std::mem::take(&mut inner.watches);
        gap(&mut Gap(&mut inner));
        inner.watches = open;
        drop(inner);
        self.expire_watches();
    }

    /// Cuts every watch stream's connection in the middle of a chunk (no terminating chunk:
    /// what a proxy or a dying server does), then makes `gap`'s changes.
    pub fn cut_watches_and(&self, gap: impl FnOnce(&mut Gap)) {
        let mut inner = self.inner.lock().unwrap();
        for w in inner.watches.drain(..) {
            let _ = w.tx.send(Ok(b"{\"type\":\"MODIF".to_vec()));
            let _ = w.tx.send(Err(std::io::Error::other("cut")));
        }
        gap(&mut Gap(&mut inner));
        drop(inner);
        self.changed.notify_waiters();
    }

    /// Open watch streams (a closed client is noticed when the next event is sent, so this
    /// prunes with a no-op probe first).
    pub fn watches(&self) -> usize {
        let mut inner = self.inner.lock().unwrap();
        inner.watches.retain(|w| !w.tx.is_closed());
        inner.watches.len()
    }

    /// Each request's Accept header, in order.
    pub fn accepts(&self) -> Vec<String> {
        self.inner.lock().unwrap().accepts.clone()
    }

    pub fn requests(&self) -> Vec<String> {
        self.inner.lock().unwrap().requests.clone()
    }

    /// Awaits `cond` on this server (re-checked on every request and change).
    pub async fn wait(&self, what: &str, cond: impl Fn(&FakeApi) -> bool) {
        let fut = async {
            loop {
                let notified = self.changed.notified();
                if cond(self) {
                    return;
                }
                notified.await;
            }
        };
        tokio::time::timeout(WAIT, fut)
            .await
            .unwrap_or_else(|_| panic!("the fake API server never saw: {what}"));
    }
}
