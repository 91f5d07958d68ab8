//! A fake Kubernetes API server that the real `kubectl` talks to: legacy discovery (`/version`,
//! `/api`, `/apis`, `/api/v1`), configmaps list / get / watch / delete with resourceVersion and
//! a replayable history, chunked watch streams, label selectors, `410 Gone` on demand, and kcp's
//! `/clusters/{workspace}` prefix (each workspace its own object space). Tests change objects
//! directly through [`FakeApi`] and await its state with [`FakeApi::wait`], never a sleep.
//! `tests/bench/k8s.rs` includes this file too.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::response::Response;
use serde_json::{Value, json};
use tokio::sync::{Notify, mpsc};

/// How long [`FakeApi::wait`] waits (the fake is shared with the k8s bench, so it has its own).
const WAIT: std::time::Duration = std::time::Duration::from_secs(30);

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
}

struct Watch {
    ws: String,
    ns: Option<String>,
    labels: Option<(String, String)>,
    tx: mpsc::UnboundedSender<Result<Vec<u8>, Infallible>>,
}

#[derive(Clone)]
pub struct FakeApi {
    inner: Arc<Mutex<Inner>>,
    changed: Arc<Notify>,
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
    fn emit(&mut self, ws: &str, kind: &str, obj: &Value) {
        let ev = json!({"type": kind, "object": obj});
        self.history.push((ws.to_owned(), self.rv, ev.clone()));
        let line = format!("{ev}\n").into_bytes();
        self.watches
            .retain(|w| !matches(w, ws, obj) || w.tx.send(Ok(line.clone())).is_ok());
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

/// Silent changes made while every watch stream is down (see [`FakeApi::drop_watches_and`]).
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
    {
        let mut inner = api.inner.lock().unwrap();
        inner.requests.push(format!("{method} {path}?{query}"));
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
        (m, ["api", "v1", "configmaps"]) => collection(&api, m, &ws, None, &query),
        (m, ["api", "v1", "namespaces", ns, "configmaps"]) => {
            collection(&api, m, &ws, Some(ns.to_string()), &query)
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

fn collection(api: &FakeApi, m: Method, ws: &str, ns: Option<String>, query: &str) -> Response {
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
            tx,
        };
        // Replay what happened after the client's resourceVersion.
        let from: u64 = query_param(query, "resourceVersion")
            .and_then(|v| v.parse().ok())
            .unwrap_or(inner.rv);
        for (hws, rv, ev) in &inner.history {
            if *rv > from && matches(&w, hws, &ev["object"]) {
                let _ = w.tx.send(Ok(format!("{ev}\n").into_bytes()));
            }
        }
        inner.watches.push(w);
        drop(inner);
        api.changed.notify_waiters();
        // Waiters hear when the stream ends or its client goes away (the body is dropped).
        let guard = Closed(api.changed.clone());
        let stream = futures::stream::unfold((rx, guard), |(mut rx, guard)| async move {
            rx.recv().await.map(|item| (item, (rx, guard)))
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
        .map(|(_, o)| o.clone())
        .collect();
    json_response(
        StatusCode::OK,
        json!({"kind": "ConfigMapList", "apiVersion": "v1",
               "metadata": {"resourceVersion": inner.rv.to_string()}, "items": items}),
    )
}

struct Closed(Arc<Notify>);

impl Drop for Closed {
    fn drop(&mut self) {
        self.0.notify_waiters();
    }
}

impl FakeApi {
    pub async fn start() -> FakeApi {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let api = FakeApi {
            inner: Arc::new(Mutex::new(Inner {
                rv: 100,
                ..Inner::default()
            })),
            changed: Arc::new(Notify::new()),
            url,
        };
        let app = axum::Router::new().fallback(handle).with_state(api.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        api
    }

    /// A kubeconfig (JSON, which kubectl reads as YAML) for this server, written to `dir`.
    pub fn kubeconfig(&self, dir: &std::path::Path) -> std::path::PathBuf {
        let path = dir.join("kubeconfig");
        let v = json!({"apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake", "namespace": "default"}}],
            "current-context": "fake"});
        std::fs::write(&path, v.to_string()).unwrap();
        path
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

    /// Open watch streams (a closed client is noticed when the next event is sent, so this
    /// prunes with a no-op probe first).
    pub fn watches(&self) -> usize {
        let mut inner = self.inner.lock().unwrap();
        inner.watches.retain(|w| !w.tx.is_closed());
        inner.watches.len()
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
