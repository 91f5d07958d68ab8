//! The Kubernetes / kcp source: event-log resources over the real `kubectl get -w`.
//!
//! - `kcp-events://watch/{workspace}/{resource}{?namespace,labelSelector,fieldSelector,kcp}`
//!   and `k8s-events://watch/{resource}{?namespace,labelSelector,fieldSelector,context}`: one
//!   [`watcher::Watcher`] per URI, shared by every listen stream watching it (refcounted by
//!   the [`WatchGuard`]s) and stopped, with its kubectl, when the last one leaves.
//! - `kcp-api://{workspace}/resources{?kcp}` and `k8s-api://resources{?context}`: the API
//!   resources list, readable, not watchable; `get_api_resources` returns the same JSON.
//! - MCP Events: `k8s.changed` and `kcp.changed` take the watch URIs' parts as arguments and
//!   poll the same rings; a poll holds its watcher for [`events::POLL_LEASE`] after the poll.
//! - Tools: `kubectl_get` and `get_api_resources` (read-only); with `--read-write` also
//!   `kubectl_apply` and `kubectl_delete` (destructive).

pub mod known;
pub mod kubectl;
pub mod stream;
pub mod uri;
pub mod watcher;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use rmcp::model::{
    CallToolResult, ContentBlock as Content, JsonObject, Resource, ResourceTemplate, Tool,
    ToolAnnotations,
};
use serde_json::{Value, json};

use crate::mcp::events::{self, EventType, Leases, PollRequest};
use crate::mcp::hub::ChangeFeed;
use crate::mcp::ring::EVENT_LOG_MIME;
use crate::mcp::source::{
    Admission, Caller, Contents, ListenFilter, Progress, Source, SourceError, SourceInfo,
    WatchGuard, check_args, schema,
};
use kubectl::{Kubectl, KubectlConfig};
use uri::{Cluster, K8sUri, Selection};
use watcher::Watcher;

pub struct K8s {
    kubectl: Arc<Kubectl>,
    feed: ChangeFeed,
    watchers: Mutex<HashMap<String, Weak<Watcher>>>,
    opts: K8sOptions,
    /// The watchers `events/poll` keeps between polls, by URI.
    polls: Leases<Lease>,
}

/// The event type over `k8s-events://watch/...` rings.
pub const K8S_CHANGED: &str = "k8s.changed";
/// The event type over `kcp-events://watch/...` rings.
pub const KCP_CHANGED: &str = "kcp.changed";

/// Settings of the k8s source beyond kubectl's.
#[derive(Debug, Clone)]
pub struct K8sOptions {
    /// Offer kubectl_apply and kubectl_delete.
    pub read_write: bool,
    /// Events kept per watched URI.
    pub ring_capacity: usize,
    /// How long a watcher outlives its last subscriber (and its last read), so a client that
    /// resubscribes finds its ring and seq where it left them.
    pub linger: Duration,
    /// Most URIs watched at once (each is one `kubectl get -w`).
    pub max_watchers: usize,
}

impl Default for K8sOptions {
    fn default() -> Self {
        K8sOptions {
            read_write: false,
            ring_capacity: crate::mcp::ring::DEFAULT_RING_CAPACITY,
            linger: Duration::from_secs(10),
            max_watchers: 256,
        }
    }
}

/// One holder of a watcher: a listen stream or a read in progress. When dropped, the
/// watcher is kept for the linger time before this hold really ends.
struct Lease {
    watcher: Option<Arc<Watcher>>,
    linger: Duration,
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
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                tokio::time::sleep(linger).await;
                drop(w);
            });
        }
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

    pub fn new(cfg: KubectlConfig, opts: K8sOptions) -> std::io::Result<K8s> {
        Ok(K8s {
            kubectl: Arc::new(Kubectl::new(cfg)?),
            feed: ChangeFeed::new(),
            watchers: Mutex::new(HashMap::new()),
            opts,
            polls: Leases::new(events::POLL_LEASE, events::MAX_POLL_LEASES),
        })
    }

    /// A hold on the watcher of `uri`, starting it if none runs.
    fn lease(&self, uri: &str, sel: Selection) -> Result<Lease, SourceError> {
        let mut watchers = self.watchers.lock().unwrap_or_else(|e| e.into_inner());
        watchers.retain(|_, w| w.strong_count() > 0);
        let w = match watchers.get(uri).and_then(Weak::upgrade) {
            Some(w) => w,
            None => {
                if watchers.len() >= self.opts.max_watchers {
                    return Err(SourceError::Unavailable(format!(
                        "this server already watches {} URIs, its limit (--max-watchers); stop a watch first",
                        self.opts.max_watchers
                    )));
                }
                let w = Arc::new(Watcher::start(
                    uri.to_owned(),
                    sel,
                    self.kubectl.clone(),
                    self.feed.clone(),
                    self.opts.ring_capacity,
                ));
                watchers.insert(uri.to_owned(), Arc::downgrade(&w));
                w
            }
        };
        Ok(Lease {
            watcher: Some(w),
            linger: self.opts.linger,
        })
    }

    /// The watcher behind a poll of `uri`: held by the poll lease (renewed), or started (or
    /// shared) now and held from here on. Its seed is awaited; a watcher whose first list
    /// fails is not kept.
    async fn poll_watcher(&self, uri: &str, sel: Selection) -> Result<Arc<Watcher>, SourceError> {
        let held = |l: &Lease| l.watcher.clone().expect("held");
        let w = match self.polls.renew(uri, held) {
            Some(w) => w,
            None => {
                self.polls.check_room()?;
                let lease = self.lease(uri, sel)?;
                self.polls.hold(uri, lease, held)?
            }
        };
        if let Err(e) = w.ready().await {
            self.polls.release(uri);
            return Err(e);
        }
        Ok(w)
    }

    /// How many watchers are running (tests and metrics).
    pub fn running(&self) -> usize {
        self.watchers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .filter(|w| w.strong_count() > 0)
            .count()
    }
}

fn template(uri: &str, name: &str, mime: &str, description: &str) -> ResourceTemplate {
    ResourceTemplate::new(uri, name)
        .with_mime_type(mime)
        .with_description(description)
}

const READ_ARGS: [&str; 8] = [
    "resource",
    "name",
    "namespace",
    "labelSelector",
    "fieldSelector",
    "workspace",
    "kcp",
    "context",
];

fn str_arg(args: &JsonObject, key: &str) -> Result<Option<String>, SourceError> {
    match args.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(SourceError::InvalidParams(format!(
            "{key} must be a string, got {other}"
        ))),
    }
}

fn required(args: &JsonObject, key: &str, example: &str) -> Result<String, SourceError> {
    str_arg(args, key)?.ok_or_else(|| {
        SourceError::InvalidParams(format!("missing argument {key}; call with {key}={example}"))
    })
}

/// The cluster a tool call names: `workspace` (kcp) and `kcp`, or `context`.
fn cluster_arg(args: &JsonObject) -> Result<Cluster, SourceError> {
    let workspace = match str_arg(args, "workspace")? {
        Some(ws) => Some(uri::workspace(&ws, "the workspace argument")?),
        None => None,
    };
    Ok(Cluster {
        kubeconfig: str_arg(args, "kcp")?,
        workspace,
        context: str_arg(args, "context")?,
    })
}

fn cluster_props() -> Value {
    json!({
        "workspace": {"type": "string", "description": "kcp workspace, e.g. root:app (omit for a plain cluster)"},
        "kcp": {"type": "string", "description": "which kubeconfig (--kubeconfig NAME=PATH); default the first"},
        "context": {"type": "string", "description": "kubeconfig context"}
    })
}

fn with_cluster_props(mut props: Value) -> Value {
    if let (Some(p), Value::Object(c)) = (props.as_object_mut(), cluster_props()) {
        p.extend(c);
    }
    props
}

/// Appends `key=value` (encoded) to a URI's query.
fn push_query(uri: &mut String, key: &str, value: Option<String>) {
    if let Some(v) = value {
        uri.push(if uri.contains('?') { '&' } else { '?' });
        uri.push_str(key);
        uri.push('=');
        uri.push_str(&events::encode_query_value(&v));
    }
}

/// The watch URI (and its selection) a `k8s.changed` or `kcp.changed` poll's arguments select.
/// The path parts are checked before they go into the URI, so an argument cannot smuggle in
/// a query of its own.
fn poll_uri(event: &str, args: &JsonObject) -> Result<(String, Selection), SourceError> {
    let selectors = ["namespace", "labelSelector", "fieldSelector"];
    let mut uri = if event == KCP_CHANGED {
        events::check_arguments(
            args,
            event,
            &[
                "workspace",
                "resource",
                "namespace",
                "labelSelector",
                "fieldSelector",
                "kcp",
            ],
        )?;
        let ws = uri::workspace(
            &events::required_argument(args, "workspace", event)?,
            "the workspace argument",
        )?;
        let resource = uri::resource_name(
            &events::required_argument(args, "resource", event)?,
            "the resource argument",
        )?;
        format!("kcp-events://watch/{ws}/{resource}")
    } else {
        events::check_arguments(
            args,
            event,
            &[
                "resource",
                "namespace",
                "labelSelector",
                "fieldSelector",
                "context",
            ],
        )?;
        let resource = uri::resource_name(
            &events::required_argument(args, "resource", event)?,
            "the resource argument",
        )?;
        format!("k8s-events://watch/{resource}")
    };
    let cluster_key = if event == KCP_CHANGED {
        "kcp"
    } else {
        "context"
    };
    for key in selectors.into_iter().chain([cluster_key]) {
        push_query(&mut uri, key, events::str_argument(args, key)?);
    }
    match uri::parse(&uri)? {
        K8sUri::Watch(sel) => Ok((uri, sel)),
        K8sUri::ApiResources(_) => unreachable!("a watch URI was built"),
    }
}

fn event_types() -> Vec<EventType> {
    let payload = events::log_payload_schema(&["ADDED", "MODIFIED", "DELETED", "ERROR"]);
    let selection = json!({
        "resource": {"type": "string", "description": "resource type, e.g. configmaps or deployments.apps"},
        "namespace": {"type": "string", "description": "a namespace, or * for all (default: the kubeconfig's)"},
        "labelSelector": {"type": "string"},
        "fieldSelector": {"type": "string"}
    });
    let mut k8s = selection.clone();
    k8s["context"] = json!({"type": "string", "description": "kubeconfig context"});
    let mut kcp = selection;
    kcp["workspace"] = json!({"type": "string", "description": "kcp workspace, e.g. root:app"});
    kcp["kcp"] = json!({"type": "string", "description": "which kubeconfig (--kubeconfig NAME=PATH); default the first"});
    vec![
        EventType {
            name: K8S_CHANGED,
            description: "An object of one resource type in a Kubernetes cluster was added, modified \
                          or deleted: the event of k8s-events://watch/{resource} (ADDED, MODIFIED with \
                          old, DELETED, each with the object; ERROR in-band). The first poll starts the \
                          watch; it is kept for 5 minutes after each poll."
                .into(),
            input_schema: json!({
                "type": "object",
                "properties": k8s,
                "required": ["resource"],
                "additionalProperties": false
            }),
            payload_schema: payload.clone(),
        },
        EventType {
            name: KCP_CHANGED,
            description: "An object of one resource type in a kcp workspace was added, modified or \
                          deleted: the event of kcp-events://watch/{workspace}/{resource} (ADDED, \
                          MODIFIED with old, DELETED, each with the object; ERROR in-band). The first \
                          poll starts the watch; it is kept for 5 minutes after each poll."
                .into(),
            input_schema: json!({
                "type": "object",
                "properties": kcp,
                "required": ["workspace", "resource"],
                "additionalProperties": false
            }),
            payload_schema: payload,
        },
    ]
}

fn json_result(v: Value) -> CallToolResult {
    let mut r = CallToolResult::success(vec![Content::text(v.to_string())]);
    r.structured_content = Some(v);
    r
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
        }
    }

    fn resources(&self, _caller: &Caller) -> Vec<Resource> {
        Vec::new()
    }

    fn templates(&self, _caller: &Caller) -> Vec<ResourceTemplate> {
        vec![
            template(
                uri::KCP_WATCH_TEMPLATE,
                "kcp objects",
                EVENT_LOG_MIME,
                "Event log of one resource type in a kcp workspace: ADDED / MODIFIED (with old) / DELETED, each \
                 with the object (managedFields stripped), numbered by seq; ERROR events report source failures. \
                 namespace=* means all namespaces; labelSelector and fieldSelector narrow it.\n\
                 Example: await watch_start(name=\"cm\", uri=\"kcp-events://watch/root:app/configmaps?namespace=*\")",
            ),
            template(
                uri::K8S_WATCH_TEMPLATE,
                "Kubernetes objects",
                EVENT_LOG_MIME,
                "Event log of one resource type in a Kubernetes cluster: ADDED / MODIFIED (with old) / DELETED, \
                 each with the object, numbered by seq; ERROR events report source failures. namespace=* means \
                 all namespaces; context picks a kubeconfig context.\n\
                 Example: await watch_start(name=\"pods\", uri=\"k8s-events://watch/pods?namespace=*\")",
            ),
            template(
                uri::KCP_API_TEMPLATE,
                "kcp API resources",
                "application/json",
                "The resource types a kcp workspace serves (name, shortNames, apiVersion, namespaced, kind, \
                 verbs); readable, not watchable.\n\
                 Example: await read_resource(uri=\"kcp-api://root:app/resources\")",
            ),
            template(
                uri::K8S_API_TEMPLATE,
                "Kubernetes API resources",
                "application/json",
                "The resource types the cluster serves (name, shortNames, apiVersion, namespaced, kind, verbs); \
                 readable, not watchable.\n\
                 Example: await read_resource(uri=\"k8s-api://resources\")",
            ),
        ]
    }

    async fn read(&self, _caller: &Caller, uri: &str) -> Result<Contents, SourceError> {
        match uri::parse(uri)? {
            // The read shares (or starts) the URI's watcher and awaits its seed: a listen's
            // baseline read may even arrive before the listen's own hold.
            K8sUri::Watch(sel) => {
                let lease = self.lease(uri, sel)?;
                let w = lease.watcher.as_ref().expect("held");
                w.read().await
            }
            K8sUri::ApiResources(c) => Ok(Contents::json(&self.kubectl.api_resources(&c).await?)),
        }
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
        Ok(event_types().iter().map(EventType::to_json).collect())
    }

    async fn events_poll(
        &self,
        _caller: &Caller,
        params: JsonObject,
    ) -> Result<Value, SourceError> {
        let req = PollRequest::parse(&params)?;
        if req.name != K8S_CHANGED && req.name != KCP_CHANGED {
            return Err(events::unknown_event(&req.name));
        }
        let (uri, sel) = poll_uri(&req.name, &req.arguments)?;
        let w = self.poll_watcher(&uri, sel).await?;
        Ok(events::poll(w.ring(), &self.feed, &uri, &req).await)
    }

    fn tools(&self, _caller: &Caller) -> Vec<Tool> {
        let read_only = |title: &str| {
            ToolAnnotations::with_title(title)
                .read_only(true)
                .destructive(false)
                .idempotent(true)
                .open_world(true)
        };
        let mut tools = vec![
            Tool::new(
                "kubectl_get",
                "kubectl get: one object (name) or a list of a resource type, as JSON with managedFields stripped.",
                schema(json!({
                    "type": "object",
                    "properties": with_cluster_props(json!({
                        "resource": {"type": "string", "description": "resource type, e.g. configmaps"},
                        "name": {"type": "string"},
                        "namespace": {"type": "string", "description": "a namespace, or * for all"},
                        "labelSelector": {"type": "string"},
                        "fieldSelector": {"type": "string"}
                    })),
                    "required": ["resource"],
                    "additionalProperties": false
                })),
            )
            .with_annotations(read_only("Get Kubernetes objects")),
            Tool::new(
                "get_api_resources",
                "The resource types the cluster or workspace serves (name, shortNames, apiVersion, namespaced, kind, verbs).",
                schema(json!({
                    "type": "object",
                    "properties": cluster_props(),
                    "additionalProperties": false
                })),
            )
            .with_annotations(read_only("List API resource types")),
        ];
        if self.opts.read_write {
            let destructive = |title: &str| {
                ToolAnnotations::with_title(title)
                    .read_only(false)
                    .destructive(true)
                    .idempotent(true)
                    .open_world(true)
            };
            tools.push(
                Tool::new(
                    "kubectl_apply",
                    "kubectl apply -f -: create or update objects from a manifest (YAML or JSON text, or a JSON object).",
                    schema(json!({
                        "type": "object",
                        "properties": with_cluster_props(json!({
                            "manifest": {"description": "the manifest: YAML/JSON text or a JSON object"},
                            "namespace": {"type": "string"}
                        })),
                        "required": ["manifest"],
                        "additionalProperties": false
                    })),
                )
                .with_annotations(destructive("Apply a manifest")),
            );
            tools.push(
                Tool::new(
                    "kubectl_delete",
                    "kubectl delete: delete one object by resource type and name.",
                    schema(json!({
                        "type": "object",
                        "properties": with_cluster_props(json!({
                            "resource": {"type": "string"},
                            "name": {"type": "string"},
                            "namespace": {"type": "string"}
                        })),
                        "required": ["resource", "name"],
                        "additionalProperties": false
                    })),
                )
                .with_annotations(destructive("Delete an object")),
            );
        }
        tools
    }

    async fn call_tool(
        &self,
        _caller: &Caller,
        name: &str,
        args: JsonObject,
        _progress: Option<Progress>,
    ) -> Result<CallToolResult, SourceError> {
        match name {
            "kubectl_get" => {
                check_args(&args, &READ_ARGS)?;
                let resource = uri::resource_name(
                    &required(&args, "resource", "\"configmaps\"")?,
                    "the resource argument",
                )?;
                let sel = Selection {
                    cluster: cluster_arg(&args)?,
                    resource,
                    namespace: str_arg(&args, "namespace")?,
                    label_selector: str_arg(&args, "labelSelector")?,
                    field_selector: str_arg(&args, "fieldSelector")?,
                };
                let items = match str_arg(&args, "name")? {
                    None => self.kubectl.list(&sel).await?,
                    Some(n) => {
                        let mut one = sel.clone();
                        one.resource = format!("{}/{}", sel.resource, kubectl::object_name(&n)?);
                        self.kubectl.list(&one).await?
                    }
                };
                let v = if args.contains_key("name") {
                    items.into_iter().next().unwrap_or(Value::Null)
                } else {
                    json!({"items": items})
                };
                Ok(json_result(v))
            }
            "get_api_resources" => {
                check_args(&args, &["workspace", "kcp", "context"])?;
                let c = cluster_arg(&args)?;
                Ok(json_result(self.kubectl.api_resources(&c).await?))
            }
            "kubectl_apply" if self.opts.read_write => {
                check_args(
                    &args,
                    &["manifest", "namespace", "workspace", "kcp", "context"],
                )?;
                let manifest = match args.get("manifest") {
                    Some(Value::String(s)) => s.clone(),
                    Some(v @ Value::Object(_)) | Some(v @ Value::Array(_)) => v.to_string(),
                    _ => {
                        return Err(SourceError::InvalidParams(
                            "missing argument manifest; pass the manifest as YAML/JSON text or an object"
                                .into(),
                        ));
                    }
                };
                let mut a = vec!["apply".to_owned(), "-f".into(), "-".into()];
                if let Some(ns) = str_arg(&args, "namespace")? {
                    a.push(format!("--namespace={ns}"));
                }
                a.extend(["-o".into(), "name".into()]);
                let out = self
                    .kubectl
                    .run(&cluster_arg(&args)?, &a, Some(manifest.as_bytes()))
                    .await
                    .map_err(|e| SourceError::InvalidParams(e.to_string()))?;
                let applied: Vec<&str> = out.lines().filter(|l| !l.is_empty()).collect();
                Ok(json_result(json!({"applied": applied})))
            }
            "kubectl_delete" if self.opts.read_write => {
                check_args(
                    &args,
                    &[
                        "resource",
                        "name",
                        "namespace",
                        "workspace",
                        "kcp",
                        "context",
                    ],
                )?;
                let resource = uri::resource_name(
                    &required(&args, "resource", "\"configmaps\"")?,
                    "the resource argument",
                )?;
                let name = required(&args, "name", "\"my-object\"")?;
                let target = format!("{resource}/{}", kubectl::object_name(&name)?);
                let mut a = vec!["delete".to_owned(), target, "--wait=false".into()];
                if let Some(ns) = str_arg(&args, "namespace")? {
                    a.push(format!("--namespace={ns}"));
                }
                a.extend(["-o".into(), "name".into()]);
                let out = self
                    .kubectl
                    .run(&cluster_arg(&args)?, &a, None)
                    .await
                    .map_err(|e| SourceError::InvalidParams(e.to_string()))?;
                Ok(json_result(json!({"deleted": out.trim()})))
            }
            other => Err(SourceError::UnknownTool(other.to_owned())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(linger: Duration) -> K8s {
        let cfg = KubectlConfig {
            program: "/nonexistent/kubectl".into(),
            kubeconfigs: Vec::new(),
            token_command: None,
        };
        K8s::new(
            cfg,
            K8sOptions {
                linger,
                max_watchers: 2,
                ..K8sOptions::default()
            },
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

    #[test]
    fn poll_arguments_select_the_watch_uri() {
        let a = |v: Value| v.as_object().unwrap().clone();
        let (uri, sel) = poll_uri(
            K8S_CHANGED,
            &a(
                json!({"resource": "ConfigMaps", "context": "kind-a", "namespace": "*",
                      "labelSelector": "app=web"}),
            ),
        )
        .unwrap();
        assert_eq!(
            uri,
            "k8s-events://watch/configmaps?namespace=*&labelSelector=app%3Dweb&context=kind-a"
        );
        assert_eq!(sel.label_selector.as_deref(), Some("app=web"));
        let (uri, _) = poll_uri(
            KCP_CHANGED,
            &a(json!({"workspace": "root:app", "resource": "configmaps", "kcp": "prod"})),
        )
        .unwrap();
        assert_eq!(uri, "kcp-events://watch/root:app/configmaps?kcp=prod");
        for (event, v, needle) in [
            (K8S_CHANGED, json!({}), "missing argument resource"),
            (
                K8S_CHANGED,
                json!({"resource": "cm", "kcp": "x"}),
                "unknown argument kcp",
            ),
            (
                KCP_CHANGED,
                json!({"resource": "cm"}),
                "missing argument workspace",
            ),
            (
                KCP_CHANGED,
                json!({"workspace": "root", "resource": "cm", "context": "c"}),
                "unknown argument context",
            ),
            (
                K8S_CHANGED,
                json!({"resource": "cm?context=x"}),
                "bad resource",
            ),
            (
                KCP_CHANGED,
                json!({"workspace": "root/x", "resource": "cm"}),
                "bad workspace",
            ),
            (
                K8S_CHANGED,
                json!({"resource": "cm", "namespace": "A B"}),
                "bad namespace",
            ),
            (
                K8S_CHANGED,
                json!({"resource": "cm", "namespace": 3}),
                "must be a string",
            ),
        ] {
            let e = poll_uri(event, &a(v.clone())).unwrap_err().to_string();
            assert!(e.contains(needle), "{event} {v}: {e}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_poll_whose_first_list_fails_keeps_no_watcher() {
        let k = source(Duration::ZERO);
        let err = k
            .events_poll(
                &Caller::local(),
                schema(json!({"name": K8S_CHANGED, "arguments": {"resource": "cm"}})),
            )
            .await
            .unwrap_err();
        assert!(err.to_string().contains("cannot run"), "{err}");
        assert_eq!(k.running(), 0, "the failed watcher is let go");
        let err = k
            .events_poll(&Caller::local(), schema(json!({"name": "pods.changed"})))
            .await
            .unwrap_err();
        assert!(matches!(err, SourceError::EventNotFound(_)), "{err}");
        assert_eq!(k.events_list(&Caller::local()).await.unwrap().len(), 2);
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
            .read(&Caller::local(), "k8s-events://watch/c")
            .await
            .unwrap_err();
        assert!(err.to_string().contains("its limit"), "{err}");
        let err = k
            .read(&Caller::local(), "k8s-events://watch/a")
            .await
            .unwrap_err();
        assert!(err.to_string().contains("cannot run"), "{err}");
    }
}
