//! The k8s source in MCP Events: the `k8s.changed` and `kcp.changed` event types, the watch
//! URI their poll arguments select, and the watcher a poll keeps between polls.

use std::sync::Arc;

use rmcp::model::JsonObject;
use serde_json::{Value, json};

use super::uri::{self, K8sUri, Selection};
use super::watcher::Watcher;
use super::{K8s, Lease};
use crate::mcp::events::{self, EventType, PollRequest};
use crate::mcp::source::SourceError;

/// The event type over `k8s-events://watch/...` rings.
pub const K8S_CHANGED: &str = "k8s.changed";
/// The event type over `kcp-events://watch/...` rings.
pub const KCP_CHANGED: &str = "kcp.changed";

impl K8s {
    /// Answers an `events/poll`: its arguments turned into the watch URI, the URI's watcher
    /// started (or shared) and held by the poll lease.
    pub(super) async fn poll(&self, params: JsonObject) -> Result<Value, SourceError> {
        let req = PollRequest::parse(&params)?;
        if req.name != K8S_CHANGED && req.name != KCP_CHANGED {
            return Err(events::unknown_event(&req.name));
        }
        let (uri, sel) = poll_uri(&req.name, &req.arguments)?;
        let w = self.poll_watcher(&uri, sel).await?;
        Ok(events::poll(w.ring(), &self.feed, &uri, &req).await)
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
pub(crate) fn poll_uri(event: &str, args: &JsonObject) -> Result<(String, Selection), SourceError> {
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
                "metadata",
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
                "metadata",
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
    if events::bool_argument(args, "metadata")? {
        push_query(&mut uri, "metadata", Some("true".into()));
    }
    match uri::parse(&uri)? {
        K8sUri::Watch(sel) => Ok((uri, sel)),
        K8sUri::ApiResources(_) => unreachable!("a watch URI was built"),
    }
}

pub(super) fn event_types() -> Vec<EventType> {
    let payload = events::log_payload_schema(&["ADDED", "MODIFIED", "DELETED", "ERROR"]);
    let selection = json!({
        "resource": {"type": "string", "description": "resource type, e.g. configmaps or deployments.apps"},
        "namespace": {"type": "string", "description": "a namespace, or * for all (default: the kubeconfig's)"},
        "labelSelector": {"type": "string"},
        "fieldSelector": {"type": "string"},
        "metadata": {"type": "boolean", "description": "each object's metadata alone (apiVersion, kind, metadata), no spec or status: lighter for watches that need names, labels and versions"}
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::mcp::source::{Caller, Source, schema};
    use crate::source::k8s::tests::source;

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
}
