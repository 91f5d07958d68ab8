//! A herald-written listen stream's SSE events (the acknowledgment, each notification, the
//! final result or error), shared by both of herald's own SSE writers: the one through hyper
//! (`SseOut`) and the one straight to the socket (`first::RawOut`).

use axum::body::Bytes;
use serde_json::{Value, json};

use crate::mcp::admission::CONTENTS;
use crate::mcp::listen::{Ack, SUBSCRIPTION_ID};
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

    /// `uri`'s notification, framed by `frame` (for the transport) the first time; one that
    /// carries a read (`carried`) is made each time.
    pub(super) fn updated(
        &mut self,
        uri: &str,
        carried: Option<Value>,
        frame: impl FnOnce(Bytes) -> Bytes,
    ) -> Bytes {
        if let Some(c) = carried {
            return frame(sse_event(&json!({"jsonrpc": "2.0",
                "method": "notifications/resources/updated",
                "params": {"_meta": {SUBSCRIPTION_ID: self.id, CONTENTS: c}, "uri": uri}})));
        }
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

/// A listen's acknowledgment ([`Ack`], built at admission) for the listen request `id`, as
/// an SSE event.
pub(super) fn ack_event(id: &rmcp::model::RequestId, ack: &Ack) -> Bytes {
    sse_event(&ack.message(id))
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
        Ok(()) => sse_event(&rmcp::model::ServerJsonRpcMessage::response(
            server.listen_result(id.clone()),
            id,
        )),
        Err(e) => sse_event(&rmcp::model::ServerJsonRpcMessage::error(e, Some(id))),
    }
}
