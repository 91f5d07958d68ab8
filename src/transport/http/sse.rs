//! A listen herald answers on HTTP through hyper: its acknowledgment and notifications as SSE
//! events on a bounded channel to the response body ([`sse_listen`], [`SseOut`]).

use std::time::Duration;

use super::events::{StreamEvents, ack_event, final_event};
use crate::mcp::listen::Ack;
use crate::mcp::server::SourceServer;
use axum::body::Body;
use axum::http::{StatusCode, header};
use axum::response::Response;

/// Notifications queued for one SSE listen stream before its task waits (the transport's
/// write is what bounds a stream: a reader that takes nothing stalls it).
const SSE_QUEUE: usize = 4;

/// A listen's notifications as SSE events on a channel to the response body.
struct SseOut {
    tx: tokio::sync::mpsc::Sender<axum::body::Bytes>,
    events: StreamEvents,
}

impl crate::mcp::listen::ListenOut for SseOut {
    async fn updated(
        &mut self,
        uri: &str,
        carried: Option<serde_json::Value>,
    ) -> Result<(), crate::mcp::listen::Undelivered> {
        let event = self.events.updated(uri, carried, |e| e);
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
    tx.try_send(ack_event(&id, &ack))
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
