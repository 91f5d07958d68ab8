//! Streamable HTTP: rmcp's service behind herald's own accept loop.
//!
//! The accept loop exists for three reasons rmcp's examples do not cover: `TCP_NODELAY` on every
//! connection (notifications are small writes that Nagle would hold back), a per-client
//! listen-stream count ([`ConnStreams`] in the request extensions, checked by [`listen_gate`]
//! before rmcp acknowledges a listen), and a graceful drain on shutdown. Origin validation and the
//! Host check are on; SSE keep-alive comments go out on listen streams.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, debug, info_span};

use crate::mcp::server::{ConnStreams, SourceServer, http_caller};

/// The path the MCP endpoint is served on.
pub const MCP_PATH: &str = "/mcp";

/// HTTP server options.
#[derive(Debug, Clone, Default)]
pub struct HttpOptions {
    /// Extra `Host` values accepted besides loopback names and the bound address.
    pub allowed_hosts: Vec<String>,
    /// Extra browser origins accepted besides loopback origins.
    pub allowed_origins: Vec<String>,
}

/// Binds `addr` (e.g. `127.0.0.1:0`).
pub async fn bind(addr: &str) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// The router serving `server` at [`MCP_PATH`], plus `/live`.
pub fn router(
    server: SourceServer,
    bound: SocketAddr,
    opts: &HttpOptions,
    sessions: CancellationToken,
) -> Router {
    let limits = server.limits().clone();
    let gate = server.clone();
    let mut hosts: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
    if !bound.ip().is_unspecified() {
        hosts.push(bound.ip().to_string());
    }
    hosts.extend(opts.allowed_hosts.iter().cloned());
    let mut origins: Vec<String> = vec![
        "http://localhost:*".into(),
        "http://127.0.0.1:*".into(),
        "http://[::1]:*".into(),
    ];
    origins.extend(opts.allowed_origins.iter().cloned());
    let config = StreamableHttpServerConfig::default()
        .with_allowed_hosts(hosts)
        .with_allowed_origins(origins)
        .enforce_origin_validation()
        .with_sse_keep_alive(Some(Duration::from_secs(15)))
        .with_max_request_body_bytes(limits.max_message_bytes)
        .with_cancellation_token(sessions.child_token());
    let service = StreamableHttpService::new(
        move || Ok(server.for_http()),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    Router::new()
        .nest_service(MCP_PATH, service)
        .layer(axum::middleware::from_fn_with_state(gate, listen_gate))
        .route("/live", axum::routing::get(|| async { "ok\n" }))
        .route(
            "/metrics",
            axum::routing::get(|| async {
                (
                    [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                    crate::mcp::metrics::render(),
                )
            }),
        )
}

/// Serves `router` on `listener` until `shutdown`, then drains open connections for up to
/// `grace`.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: CancellationToken,
    grace: Duration,
) {
    let tracker = TaskTracker::new();
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let peers = PeerStreams::default();
    loop {
        let (stream, peer) = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // EMFILE and friends: back off briefly instead of spinning.
                    debug!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let conn = peers.for_peer(peer.ip());
        let svc = tower::ServiceExt::map_request(
            router.clone(),
            move |mut req: Request<hyper::body::Incoming>| {
                req.extensions_mut().insert(conn.clone());
                req
            },
        );
        let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
        // Without a timer hyper silently drops its header-read timeout; a client that never
        // finishes its headers would hold the connection forever.
        builder
            .http1()
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(Duration::from_secs(30));
        let connection = builder
            .serve_connection_with_upgrades(TokioIo::new(stream), TowerToHyperService::new(svc))
            .into_owned();
        let watched = graceful.watch(connection);
        tracker.spawn(
            async move {
                if let Err(e) = watched.await {
                    debug!(error = %e, "http connection ended with an error");
                }
            }
            .instrument(info_span!("http_conn", %peer)),
        );
    }
    drop(listener);
    tracker.close();
    if tokio::time::timeout(grace, graceful.shutdown())
        .await
        .is_err()
    {
        debug!("http drain deadline passed; closing remaining connections");
    }
}

/// Listen-stream counts per client address. HTTP/1.1 gives every open SSE response its own
/// TCP connection, so on HTTP the "connection" the stream limit counts is the client's IP
/// address. Entries are weak: an address with no open connection and no open stream is pruned.
#[derive(Default)]
struct PeerStreams {
    map: std::sync::Mutex<HashMap<IpAddr, std::sync::Weak<AtomicUsize>>>,
}

impl PeerStreams {
    fn for_peer(&self, ip: IpAddr) -> ConnStreams {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(live) = map.get(&ip).and_then(std::sync::Weak::upgrade) {
            return ConnStreams::from_shared(live);
        }
        if map.len() >= 1024 {
            map.retain(|_, w| w.strong_count() > 0);
        }
        let fresh = ConnStreams::default();
        map.insert(ip, fresh.downgrade());
        fresh
    }
}

/// Runs the listen limits before rmcp sees a `subscriptions/listen`, and reserves the stream's
/// slot on the client's address (see [`PeerStreams`]; the slot rides in the request extensions, which rmcp keeps for
/// as long as the listen runs).
async fn listen_gate(State(server): State<SourceServer>, req: Request, next: Next) -> Response {
    let limits = server.limits().clone();
    if req.method() != Method::POST {
        return next.run(req).await;
    }
    // The body decides, never a header: a listen whose Mcp-Method says otherwise is still
    // admitted here (the handler refuses any listen that was not).
    let (mut parts, body) = req.into_parts();
    let mut bytes = match axum::body::to_bytes(body, limits.max_message_bytes).await {
        Ok(b) => b,
        Err(_) => {
            return (
                StatusCode::PAYLOAD_TOO_LARGE,
                [(header::CONTENT_TYPE, "application/json")],
                json!({"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":format!(
                    "request body exceeds the {}-byte limit; send smaller messages",
                    limits.max_message_bytes)}})
                .to_string(),
            )
                .into_response();
        }
    };
    // Only a body naming the method is parsed here (a cheap scan first: rmcp parses every body
    // again anyway). A listen that hides its method name in JSON escapes skips admission and
    // is then refused by the handler, which serves no unadmitted listen.
    let names_listen = bytes
        .windows(b"subscriptions/listen".len())
        .any(|w| w == b"subscriptions/listen");
    if names_listen
        && let Ok(v) = serde_json::from_slice::<Value>(&bytes)
        && v.get("method").and_then(Value::as_str) == Some("subscriptions/listen")
    {
        let requested: Vec<String> = v
            .pointer("/params/notifications/resourceSubscriptions")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .map(|u| u.as_str().unwrap_or_default().to_owned())
                    .collect()
            })
            .unwrap_or_default();
        let conn = parts
            .extensions
            .get::<ConnStreams>()
            .cloned()
            .unwrap_or_default();
        // What this caller may watch decides what is registered before the ack.
        let caller = http_caller(&parts.headers, &parts.uri);
        let admitted = caller.scope(server.admit_listen(&requested, &conn)).await;
        match admitted {
            Ok(admission) => {
                // rmcp acknowledges what the request names; narrow it to what was admitted.
                if let Some(subs) = v.pointer("/params/notifications/resourceSubscriptions")
                    && subs.as_array().map(Vec::len) != Some(admission.accepted().len())
                {
                    let mut v = v.clone();
                    v["params"]["notifications"]["resourceSubscriptions"] =
                        json!(admission.accepted());
                    bytes = v.to_string().into_bytes().into();
                }
                parts.extensions.insert(admission);
            }
            Err(e) => {
                let id = v.get("id").cloned().unwrap_or(Value::Null);
                return (
                    StatusCode::OK,
                    [(header::CONTENT_TYPE, "application/json")],
                    json!({"jsonrpc":"2.0","id":id,"error":e}).to_string(),
                )
                    .into_response();
            }
        }
    }
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}
