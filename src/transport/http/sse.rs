//! A listen herald answers itself on HTTP: its notifications as SSE events on a bounded
//! channel to the response body ([`sse_listen`], [`SseOut`]), and the `taskIds` herald adds to
//! an acknowledgment rmcp wrote ([`echo_task_ids`]).

use std::time::Duration;

use axum::body::Body;
use axum::http::{StatusCode, header};
use axum::response::Response;
use serde_json::{Value, json};

use super::events::{Ack, StreamEvents, ack_event, final_event};
use crate::mcp::server::SourceServer;

/// Notifications queued for one SSE listen stream before its task waits (the transport's
/// write is what bounds a stream: a reader that takes nothing stalls it).
const SSE_QUEUE: usize = 4;

/// A listen's notifications as SSE events on a channel to the response body.
struct SseOut {
    tx: tokio::sync::mpsc::Sender<axum::body::Bytes>,
    events: StreamEvents,
}

impl crate::mcp::listen::ListenOut for SseOut {
    async fn updated(&mut self, uri: &str) -> Result<(), crate::mcp::listen::Undelivered> {
        let event = self.events.updated(uri, |e| e);
        self.tx
            .send(event)
            .await
            .map_err(|_| crate::mcp::listen::Undelivered::Closed)
    }

    async fn list_changed(
        &mut self,
        list: crate::mcp::lists::List,
    ) -> Result<(), crate::mcp::listen::Undelivered> {
        self.tx
            .send(self.events.list_changed(list))
            .await
            .map_err(|_| crate::mcp::listen::Undelivered::Closed)
    }

    async fn task(
        &mut self,
        task: rmcp::model::DetailedTask,
    ) -> Result<(), crate::mcp::listen::Undelivered> {
        self.tx
            .send(self.events.task(task))
            .await
            .map_err(|_| crate::mcp::listen::Undelivered::Closed)
    }

    fn closed(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let tx = self.tx.clone();
        async move { tx.closed().await }
    }

    fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }
}

/// How often an idle SSE listen stream gets a keep-alive comment (as rmcp's streams do).
pub(super) const SSE_KEEP_ALIVE: Duration = Duration::from_secs(15);

/// herald's own SSE response to an admitted listen: the acknowledgment (`ack`), then
/// what [`SourceServer::deliver`] writes, then the listen's final result or error, with a
/// keep-alive comment on a quiet stream. One small task and a short channel per stream, where
/// rmcp's service would hold a whole per-request service with its channels. The body going
/// away (the client closed the connection) ends the task.
pub(super) fn sse_listen(
    server: SourceServer,
    listen: crate::mcp::admission::AdmittedListen,
    id: rmcp::model::RequestId,
    ack: Ack,
) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel(SSE_QUEUE);
    let id_json = serde_json::to_value(&id).expect("an id serializes");
    tx.try_send(ack_event(&id_json, ack))
        .expect("a new channel has room for the acknowledgment");
    let stall = server.limits().stall_timeout;
    tokio::spawn(async move {
        let mut out = SseOut {
            tx,
            events: StreamEvents::new(id_json),
        };
        let ended = server.deliver(listen, &mut out).await;
        if out.tx.is_closed() {
            return;
        }
        let last = final_event(&server, id, ended);
        let _ = tokio::time::timeout(stall, out.tx.send(last)).await;
    });
    let body = futures::stream::unfold(rx, |mut rx| async move {
        let next = match tokio::time::timeout(SSE_KEEP_ALIVE, rx.recv()).await {
            Ok(Some(event)) => event,
            Ok(None) => return None,
            Err(_) => axum::body::Bytes::from_static(b":\n\n"),
        };
        Some((Ok::<_, std::convert::Infallible>(next), rx))
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .header("x-accel-buffering", "no")
        .body(Body::from_stream(body))
        .expect("a valid response")
}

/// The listen's SSE body with `taskIds` added to its acknowledgment (the first event that is
/// one); every other byte passes through as it came.
pub(super) fn echo_task_ids(body: Body, ids: Vec<String>) -> Body {
    use futures::StreamExt as _;
    struct State {
        inner: axum::body::BodyDataStream,
        ids: Option<Vec<String>>,
        buf: Vec<u8>,
        ended: bool,
    }
    let state = State {
        inner: body.into_data_stream(),
        ids: Some(ids),
        buf: Vec::new(),
        ended: false,
    };
    let stream = futures::stream::unfold(state, |mut st| async move {
        loop {
            if st.ids.is_none() && !st.buf.is_empty() {
                let out = std::mem::take(&mut st.buf);
                return Some((Ok(axum::body::Bytes::from(out)), st));
            }
            if st.ended {
                return None;
            }
            match st.inner.next().await {
                None => {
                    st.ended = true;
                    st.ids = None;
                }
                Some(Err(e)) => return Some((Err(e), st)),
                Some(Ok(chunk)) if st.ids.is_none() => return Some((Ok(chunk), st)),
                Some(Ok(chunk)) => {
                    st.buf.extend_from_slice(&chunk);
                    // Whole events only: patch the first acknowledgment among them.
                    let Some(end) = last_event_end(&st.buf) else {
                        continue;
                    };
                    let rest = st.buf.split_off(end);
                    let events = std::mem::replace(&mut st.buf, rest);
                    let (patched, done) = patch_ack(&events, st.ids.as_ref().unwrap());
                    if done {
                        st.ids = None;
                    }
                    return Some((Ok(axum::body::Bytes::from(patched)), st));
                }
            }
        }
    });
    Body::from_stream(stream)
}

/// Where the last complete SSE event in `buf` ends (after its blank line).
fn last_event_end(buf: &[u8]) -> Option<usize> {
    // On bytes: a chunk may end inside a UTF-8 character.
    let rfind = |needle: &[u8]| {
        buf.windows(needle.len())
            .rposition(|w| w == needle)
            .map(|i| i + needle.len())
    };
    [rfind(b"\n\n"), rfind(b"\r\n\r\n")]
        .into_iter()
        .flatten()
        .max()
}

/// Adds `taskIds` to the acknowledgment among `events` (whole SSE events); whether it found it.
fn patch_ack(events: &[u8], ids: &[String]) -> (Vec<u8>, bool) {
    let Ok(text) = std::str::from_utf8(events) else {
        return (events.to_vec(), false);
    };
    let mut out = String::with_capacity(text.len() + 64);
    let mut done = false;
    for line in text.split_inclusive('\n') {
        if !done
            && let Some(data) = line.strip_prefix("data:")
            && let Ok(mut v) = serde_json::from_str::<Value>(data.trim())
            && v.get("method").and_then(Value::as_str)
                == Some("notifications/subscriptions/acknowledged")
            && let Some(n) = v
                .pointer_mut("/params/notifications")
                .and_then(Value::as_object_mut)
        {
            n.insert("taskIds".into(), json!(ids));
            out.push_str("data: ");
            out.push_str(&v.to_string());
            out.push_str(if line.ends_with("\r\n") { "\r\n" } else { "\n" });
            done = true;
            continue;
        }
        out.push_str(line);
    }
    (out.into_bytes(), done)
}
