//! A herald-written listen stream's SSE events (the acknowledgment, each notification, the
//! final result or error), shared by both of herald's own SSE writers: the one through hyper
//! (`SseOut`) and the one straight to the socket (`first::RawOut`).

use axum::body::Bytes;
use serde_json::{Value, json};

use crate::mcp::admission::{AdmittedListen, ListenFilter};
use crate::mcp::server::SourceServer;

/// A listen stream's events as it writes them: its subscription id, and each URI's
/// `notifications/resources/updated` made once per stream and reused for every change.
pub(super) struct StreamEvents {
    /// The stream's subscription id, as JSON.
    id: Value,
    updated: Vec<(String, Bytes)>,
}

impl StreamEvents {
    pub(super) fn new(id: Value) -> StreamEvents {
        StreamEvents {
            id,
            updated: Vec::new(),
        }
    }

    /// `uri`'s notification, framed by `frame` (for the transport) the first time.
    pub(super) fn updated(&mut self, uri: &str, frame: impl FnOnce(Bytes) -> Bytes) -> Bytes {
        if let Some((_, e)) = self.updated.iter().find(|(u, _)| u == uri) {
            return e.clone();
        }
        let e = frame(updated_event(&self.id, uri));
        self.updated.push((uri.to_owned(), e.clone()));
        e
    }

    /// `list`'s change as an event.
    pub(super) fn list_changed(&self, list: crate::mcp::lists::List) -> Bytes {
        sse_event(&list.notification(&self.id))
    }

    /// `task`'s state as an event.
    pub(super) fn task(&self, task: rmcp::model::DetailedTask) -> Bytes {
        task_event(&self.id, task)
    }
}

/// One SSE event carrying `message`.
fn sse_event(message: &impl serde::Serialize) -> Bytes {
    let mut out = b"data: ".to_vec();
    serde_json::to_writer(&mut out, message).expect("JSON values serialize");
    out.extend_from_slice(b"\n\n");
    out.into()
}

/// The subscription-id key of a notification's `_meta`.
const SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";

/// A listen's acknowledgment for subscription `id`: what `ack` names.
pub(super) fn ack_event(id: &Value, ack: Ack) -> Bytes {
    let mut notifications = serde_json::Map::new();
    ack.lists.echo(&mut notifications);
    if let Some(uris) = ack.uris {
        notifications.insert("resourceSubscriptions".into(), json!(uris));
    }
    if let Some(ids) = ack.task_ids {
        notifications.insert("taskIds".into(), json!(ids));
    }
    sse_event(
        &json!({"jsonrpc": "2.0", "method": "notifications/subscriptions/acknowledged",
        "params": {"_meta": {SUBSCRIPTION_ID: id}, "notifications": notifications}}),
    )
}

/// `notifications/resources/updated` for `uri` on subscription `id`.
fn updated_event(id: &Value, uri: &str) -> Bytes {
    sse_event(&json!({"jsonrpc": "2.0",
        "method": "notifications/resources/updated",
        "params": {"_meta": {SUBSCRIPTION_ID: id}, "uri": uri}}))
}

/// `notifications/tasks` with `task`'s state on subscription `id`.
fn task_event(id: &Value, task: rmcp::model::DetailedTask) -> Bytes {
    let mut n = serde_json::to_value(rmcp::model::ServerJsonRpcMessage::notification(
        rmcp::model::ServerNotification::TaskStatusNotification(
            rmcp::model::TaskStatusNotification::new(task.into()),
        ),
    ))
    .expect("a notification serializes");
    if let Some(params) = n.get_mut("params").and_then(Value::as_object_mut) {
        let meta = params.entry("_meta").or_insert_with(|| json!({}));
        if let Some(meta) = meta.as_object_mut() {
            meta.insert(SUBSCRIPTION_ID.into(), id.clone());
        }
    }
    sse_event(&n)
}

/// A listen's last event: its graceful result, or the error that ended it.
pub(super) fn final_event(
    server: &SourceServer,
    id: rmcp::model::RequestId,
    ended: Result<(), rmcp::model::ErrorData>,
) -> Bytes {
    match ended {
        Ok(()) => {
            use rmcp::ServerHandler as _;
            let mut result = rmcp::model::SubscriptionsListenResult::complete(id.clone());
            result.meta.set_server_info(server.get_info().server_info);
            sse_event(&rmcp::model::ServerJsonRpcMessage::response(
                rmcp::model::ServerResult::SubscriptionsListenResult(result),
                id,
            ))
        }
        Err(e) => sse_event(&rmcp::model::ServerJsonRpcMessage::error(e, Some(id))),
    }
}

/// What a plain listen's acknowledgment names.
pub(super) struct Ack {
    /// `resourceSubscriptions`.
    uris: Option<Vec<String>>,
    /// `taskIds`.
    task_ids: Option<Vec<String>>,
    /// `toolsListChanged`, `promptsListChanged`.
    lists: crate::mcp::lists::Lists,
}

/// What a plain listen's acknowledgment names, as rmcp would: the accepted URIs when the
/// request named some and some were accepted, the accepted lists, and the admitted task ids.
pub(super) fn ack_lists(filter: &ListenFilter, listen: &AdmittedListen) -> Ack {
    let accepted = listen.uris();
    let uris = (filter.resources.is_some() && !accepted.is_empty()).then_some(accepted);
    Ack {
        uris,
        task_ids: listen.task_ids(),
        lists: listen.lists(),
    }
}
