//! Streamable HTTP: rmcp's service behind herald's own accept loop.
//!
//! The accept loop exists for reasons rmcp's examples do not cover: `TCP_NODELAY` on every
//! connection (notifications are small writes that Nagle would hold back), a per-client
//! listen-stream count ([`ConnStreams`] in the request extensions, checked by [`listen_gate`]
//! when it opens a listen), a cap on open connections (`--max-connections`,
//! [`ConnCap`]), a connection's deadlines (idle, header, body: [`Timeouts`], see [`conn`]),
//! and a graceful drain on shutdown. Origin validation and the Host check are on; SSE
//! keep-alive comments go out on listen streams.

/// How long the gate waits for rmcp's handler to claim a listen rmcp took.
const CLAIM_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, debug, info_span};

use self::conn::Activity;
use crate::runtime::metrics::Metrics;
use crate::transport::cap::{ConnCap, ConnMetrics};

use crate::mcp::admission::{Budget, ConnStreams, ListenClaim, ListenFilter};
use crate::mcp::caller::{Caller, PeerAddr};
use crate::mcp::server::SourceServer;
use crate::transport::origin::Allowlist;

pub mod budget;
mod conn;
mod events;
mod first;
pub mod oauth;
mod params;
mod plain;
pub mod sessions;
mod sse;
#[cfg(test)]
use plain::checked_arguments;
use plain::{modern_meta, param_headers_refused, plain_headers, plain_request};
use sse::sse_listen;

pub use conn::{
    DEFAULT_BODY_TIMEOUT_MS, DEFAULT_HEADER_TIMEOUT_MS, DEFAULT_IDLE_TIMEOUT_MS, Timeouts,
};

/// The path the MCP endpoint is served on.
pub const MCP_PATH: &str = "/mcp";

/// HTTP server options.
#[derive(Debug, Clone, Default)]
pub struct HttpOptions {
    /// Extra `Host` values accepted besides loopback names and the bound address.
    pub allowed_hosts: Vec<String>,
    /// Extra browser origins accepted besides loopback origins.
    pub allowed_origins: Vec<String>,
    /// A connection's idle, header and body deadlines.
    pub timeouts: Timeouts,
    /// The proxies whose `X-Forwarded-For` names the client's address (see [`budget`]);
    /// `None`: [`budget::DEFAULT_TRUSTED_PROXIES`].
    pub trusted_proxies: Option<Vec<budget::Cidr>>,
    /// A legacy session is closed this long after its client's last request or stream
    /// ([`sessions`]); `None`: [`sessions::DEFAULT_SESSION_IDLE_MS`].
    pub session_idle: Option<Duration>,
}

/// Connections the kernel queues for `accept` (capped by `net.core.somaxconn`): a burst of
/// clients (a gateway's callers, a thousand listens opening at once) is queued, not dropped
/// into a one-second SYN retry as with the standard library's 128.
const LISTEN_BACKLOG: u32 = 1024;

/// Binds `addr` (e.g. `127.0.0.1:0`): the first of its addresses that binds.
pub async fn bind(addr: &str) -> std::io::Result<TcpListener> {
    let mut last = None;
    for a in tokio::net::lookup_host(addr).await? {
        let socket = if a.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        socket.set_reuseaddr(true)?;
        match socket.bind(a).and_then(|()| socket.listen(LISTEN_BACKLOG)) {
            Ok(l) => return Ok(l),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{addr} names no address to bind"),
        )
    }))
}

/// A listener bound elsewhere (a socket systemd passed), in non-blocking mode.
pub fn from_std(listener: std::net::TcpListener) -> std::io::Result<TcpListener> {
    listener.set_nonblocking(true)?;
    TcpListener::from_std(listener)
}

/// What [`serve`] serves: a router, and for an MCP endpoint the gate whose plain listens
/// are answered ahead of hyper when they come first on a connection ([`first`]).
pub struct Endpoint {
    router: Router,
    gate: Option<Gate>,
    timeouts: Timeouts,
    max_connections: usize,
    /// The connection counters, in the process's metrics.
    conns: ConnMetrics,
}

impl Endpoint {
    /// A plain router (the admin address's), with the default deadlines and cap; its
    /// connections are counted in `metrics`.
    pub fn plain(router: Router, metrics: &Metrics) -> Endpoint {
        Endpoint {
            router,
            gate: None,
            timeouts: Timeouts::default(),
            max_connections: crate::mcp::limits::DEFAULT_MAX_CONNECTIONS,
            conns: ConnMetrics::register(metrics),
        }
    }
}

/// The MCP endpoint serving `server` at [`MCP_PATH`], plus `/live` and `/metrics` (what
/// `metrics` holds, where its connections are counted too).
pub fn router(
    server: SourceServer,
    bound: SocketAddr,
    opts: &HttpOptions,
    sessions: CancellationToken,
    metrics: &Metrics,
) -> Endpoint {
    let limits = server.limits().clone();
    let receiver = server.webhook_receiver();
    if let Some(r) = &receiver {
        r.serving_http(bound);
    }
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
    let trusted = opts.trusted_proxies.clone().unwrap_or_else(|| {
        budget::DEFAULT_TRUSTED_PROXIES
            .iter()
            .map(|c| c.parse().expect("a valid block"))
            .collect()
    });
    let gate = Gate {
        server: server.clone(),
        allow: Arc::new(Allowlist::new(&hosts, &origins)),
        budgets: Arc::new(budget::Budgets::new(trusted.clone())),
    };
    // A call's answer as one JSON body (falling back to SSE only when the handler sends
    // progress first): cheaper to write and to parse than a one-event SSE stream.
    let config = StreamableHttpServerConfig::default()
        .with_json_response(true)
        .with_allowed_hosts(hosts)
        .with_allowed_origins(origins)
        .enforce_origin_validation()
        .with_sse_keep_alive(Some(Duration::from_secs(15)))
        .with_max_request_body_bytes(limits.max_message_bytes)
        .with_cancellation_token(sessions.child_token());
    let legacy = sessions::Sessions::start(
        opts.session_idle
            .unwrap_or(Duration::from_millis(sessions::DEFAULT_SESSION_IDLE_MS)),
        trusted.clone(),
        sessions.child_token(),
        metrics,
    );
    let service = Rmcp(Arc::new(StreamableHttpService::new(
        move || Ok(server.for_session()),
        legacy.manager(),
        config,
    )));
    // The session layer runs inside the listen gate: it sees the caller the gate let in.
    let router = Router::new()
        .nest_service(MCP_PATH, service)
        .layer(axum::middleware::from_fn_with_state(
            legacy,
            sessions::session_gate,
        ))
        .layer(axum::middleware::from_fn_with_state(
            gate.clone(),
            listen_gate,
        ));
    // (After the gate's layer: the metadata is for callers with no token yet.)
    let router = oauth::routes(router, gate.server.clone())
        .route("/live", axum::routing::get(|| async { "ok\n" }))
        .route(
            "/events/hooks/{id}",
            axum::routing::post(receive_webhook)
                .layer(axum::extract::DefaultBodyLimit::max(WEBHOOK_BODY_LIMIT))
                .with_state(receiver),
        )
        .route("/metrics", {
            let metrics = metrics.clone();
            axum::routing::get(move || async move {
                (
                    [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                    metrics.render(),
                )
            })
        });
    Endpoint {
        router,
        gate: Some(gate),
        timeouts: opts.timeouts,
        max_connections: limits.max_connections,
        conns: ConnMetrics::register(metrics),
    }
}

/// The 2026-07-28 headers, named once for the gates that read them on every request and the
/// upstream client that writes them: a name given as a string is parsed again at each use.
pub(crate) const MCP_METHOD: header::HeaderName = header::HeaderName::from_static("mcp-method");
pub(crate) const MCP_NAME: header::HeaderName = header::HeaderName::from_static("mcp-name");
pub(crate) const MCP_PROTOCOL_VERSION: header::HeaderName =
    header::HeaderName::from_static("mcp-protocol-version");
pub(crate) const MCP_SESSION_ID: header::HeaderName =
    header::HeaderName::from_static("mcp-session-id");

/// rmcp's service behind the gates, shared: the layers clone the service they wrap for every
/// request, and rmcp's own clone copies its whole config (hosts, origins) each time, even for
/// the requests the gates answer themselves.
#[derive(Clone)]
struct Rmcp(
    Arc<
        StreamableHttpService<
            SourceServer,
            rmcp::transport::streamable_http_server::session::local::LocalSessionManager,
        >,
    >,
);

impl tower::Service<Request> for Rmcp {
    type Response = Response;
    type Error = std::convert::Infallible;
    type Future =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<Response, Self::Error>> + Send>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request) -> Self::Future {
        let rmcp = self.0.clone();
        Box::pin(async move { Ok(rmcp.handle(req).await.map(Body::new)) })
    }
}

/// The largest webhook body taken: one event is at most 256 KiB (the Events draft), with room
/// for its envelope.
const WEBHOOK_BODY_LIMIT: usize = 320 * 1024;

/// A webhook POSTed to `/events/hooks/{id}`: to the server's receiver, or 404 when it has
/// none. A body over [`WEBHOOK_BODY_LIMIT`] is refused with 413.
async fn receive_webhook(
    axum::extract::State(receiver): axum::extract::State<
        Option<Arc<dyn crate::mcp::server::webhooks::Receiver>>,
    >,
    axum::extract::Path(id): axum::extract::Path<String>,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    let Some(receiver) = receiver else {
        return (
            axum::http::StatusCode::NOT_FOUND,
            "no webhooks are received here\n",
        )
            .into_response();
    };
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let (status, answer) = receiver.receive(&id, &header, &body);
    (
        axum::http::StatusCode::from_u16(status).unwrap_or(axum::http::StatusCode::OK),
        [(header::CONTENT_TYPE, "application/json")],
        answer.to_string(),
    )
        .into_response()
}

/// Serves `endpoint` on `listener` until `shutdown`, then drains open connections for up to
/// `grace`. At most the endpoint's `max_connections` are open at once (fewer when the
/// open-file limit has no room for them): at the cap the loop stops accepting, so new
/// connections wait in the kernel's backlog until one closes.
pub async fn serve(
    listener: TcpListener,
    endpoint: Endpoint,
    shutdown: CancellationToken,
    grace: Duration,
) {
    let Endpoint {
        router,
        gate,
        timeouts,
        max_connections,
        conns,
    } = endpoint;
    let tracker = TaskTracker::new();
    let cap = ConnCap::new(
        within_open_files(max_connections),
        "HTTP",
        conns.http.limit_reached.clone(),
        conns.http.open.clone(),
    );
    loop {
        let Some(place) = cap.admit(&shutdown).await else {
            break;
        };
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
        conns.http.accepted.inc();
        // The connection's budget for events/stream and legacy subscriptions, by its peer's
        // address (a listen's is chosen per request).
        let conn = match &gate {
            Some(g) => g
                .budgets
                .get(Budget::Address(budget::budget_address(peer.ip()))),
            None => ConnStreams::default(),
        };
        let router = router.clone();
        let gate = gate.clone();
        let shutdown = shutdown.clone();
        // In place (`runtime::in_place`): on HTTP/1.1, the timers' `Notify`, hyper's
        // dispatch and an upstream call's own connection all wake this task from within it.
        // (hyper runs each HTTP/2 stream in a task of its own, outside this.)
        tracker.spawn(
            crate::runtime::in_place::in_place(async move {
                // The connection's place under the cap, given back when it closes.
                let _place = place.opened();
                let prefix = match &gate {
                    None => Vec::new(),
                    Some(gate) => {
                        let first = first::serve_first(&stream, gate, peer, timeouts, &shutdown);
                        match first.await {
                            first::First::Gone | first::First::Done => return,
                            first::First::Hyper(bytes) | first::First::Answered(bytes) => bytes,
                        }
                    }
                };
                let activity = Activity::new(!prefix.is_empty());
                let svc = service(router, activity.clone(), conn, peer, timeouts);
                let mut builder =
                    hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                // The idle and header deadlines are herald's own ([`conn`]): hyper's one
                // header-read timer would be both, with one length.
                builder
                    .http1()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(None);
                let io = TokioIo::new(first::Prefixed::new(prefix, stream, activity.clone()));
                let connection = builder
                    .serve_connection_with_upgrades(io, TowerToHyperService::new(svc))
                    .into_owned();
                tokio::pin!(connection);
                // The connection is polled before the shutdown is looked at, so a request
                // whose bytes were read ahead is taken in and answered; then hyper closes
                // the connection once its request is done.
                let ended = tokio::select! {
                    biased;
                    r = connection.as_mut() => r,
                    () = shutdown.cancelled() => {
                        connection.as_mut().graceful_shutdown();
                        connection.await
                    }
                    // Dropping the connection closes it: nothing is in flight on it.
                    why = activity.expired(timeouts) => {
                        debug!(%why, "closing the connection");
                        return;
                    }
                };
                if let Err(e) = ended {
                    debug!(error = %e, "http connection ended with an error");
                }
            })
            .instrument(info_span!("http_conn", %peer)),
        );
    }
    drop(listener);
    tracker.close();
    // hyper's connections close once their requests are answered; a listen answered ahead
    // of hyper ends with the server's shutdown and writes its result.
    if tokio::time::timeout(grace, tracker.wait()).await.is_err() {
        debug!("http drain deadline passed; closing remaining connections");
    }
}

/// The service hyper runs for each request on one connection: the router, with the request's
/// connection facts in its extensions, its body due whole within `timeouts.body` (else the
/// answer is `408` and the connection closes), and the request counted as in flight on
/// `activity` until its response body is done.
fn service(
    router: Router,
    activity: std::sync::Arc<Activity>,
    conn: ConnStreams,
    peer: SocketAddr,
    timeouts: Timeouts,
) -> impl tower::Service<
    Request<hyper::body::Incoming>,
    Response = Response<conn::Guarded>,
    Error = std::convert::Infallible,
    Future = impl Send,
> + Clone {
    tower::service_fn(move |req: Request<hyper::body::Incoming>| {
        let busy = activity.busy();
        let (mut parts, body) = req.into_parts();
        parts.extensions.insert(conn.clone());
        parts.extensions.insert(PeerAddr(peer));
        let (body, late) = conn::TimedBody::new(body, timeouts.body);
        let req = Request::from_parts(parts, body);
        let router = router.clone();
        async move {
            let Ok(response) = tower::ServiceExt::oneshot(router, req).await;
            // Whatever the handler made of the failed read (rmcp's 400, the gate's 413), the
            // client is owed the reason, and the connection must close: the rest of the body
            // may still come.
            let response = if late.load(std::sync::atomic::Ordering::Relaxed) {
                debug!(
                    timeout_ms = timeouts.body.as_millis(),
                    "a request body came too late"
                );
                conn::body_timeout_response(timeouts.body)
            } else {
                response
            };
            Ok(response.map(|body| conn::Guarded::new(body, busy)))
        }
    })
}

/// `max`, or fewer when the open-file limit (`RLIMIT_NOFILE`) has no room for that many
/// sockets beside what the rest of the process opens (a quarter of the limit, at most 256,
/// kept for the store, upstreams, watches): past it `accept` fails with `EMFILE` and leaves
/// the connection queued anyway, so the cap does the same with a log line that says why.
fn within_open_files(max: usize) -> usize {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the valid, initialised struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0
        || limit.rlim_cur == libc::RLIM_INFINITY
    {
        return max;
    }
    let soft = usize::try_from(limit.rlim_cur).unwrap_or(usize::MAX);
    let room = soft.saturating_sub((soft / 4).min(256)).max(1);
    if max <= room {
        return max;
    }
    tracing::info!(
        max_connections = max,
        open_files = soft,
        "HTTP connections capped at {room}: the open-file limit ({soft}) has no room for \
         --max-connections {max}; raise it (LimitNOFILE=, ulimit -n) to allow more"
    );
    room
}

/// What the listen gate needs: the server to admit with, and the endpoint's allowlists.
#[derive(Clone)]
struct Gate {
    server: SourceServer,
    allow: Arc<Allowlist>,
    /// Whose listen streams count where ([`budget`]).
    budgets: Arc<budget::Budgets>,
}

use super::jsonrpc::MethodProbe;

/// Opens a `subscriptions/listen` before rmcp sees it: the HTTP end of the one way a listen
/// starts ([`SourceServer::open`], see `crate::mcp::admission`), and every admitted listen's
/// answer is herald's own SSE stream ([`sse_listen`]), its acknowledgment the one admission
/// built.
///
/// Why a middleware: rmcp's HTTP service takes only a `ServerHandler`, and acknowledges a
/// listen before its handler runs, from a hook with no request context and no room for
/// `taskIds`; so the caller's admission happens here, before rmcp parses the body. This is the
/// one place that reads a body ahead of rmcp. Since admission starts real work (watches,
/// upstream subscriptions), nothing is admitted for a request rmcp will refuse anyway: a Host
/// or Origin outside the endpoint's lists (a cross-site page, DNS rebinding) or a body that is
/// not `application/json` goes on untouched and rmcp refuses it. The method is read with serde
/// (so an escaped name is still seen), the caller comes from the headers, the stream slot from
/// the client's address ([`PeerStreams`]). A listen in the plain shape ([`plain_listen`]) is
/// answered at once; one in another shape goes to rmcp untouched, to be checked as rmcp checks
/// any request, and is answered here once rmcp's handler claims it ([`ListenClaim`]).
///
/// A listen refused before its acknowledgment (its filter, its admission) is answered here
/// with the status rmcp gives the error ([`listen_refused`]); a listen whose `_meta` rmcp
/// refuses goes on to rmcp unadmitted ([`refused_by_rmcp`]), so its answer is rmcp's.
///
/// The same gate answers the two requests that carry a server's load itself, when they come
/// in the plain shape every 2026-07-28 client sends: a listen ([`plain_listen`], herald's own
/// SSE stream) and a `tools/call` ([`plain_request`], the handler then one JSON body). rmcp's
/// stateless service builds a whole service per request; these answers are rmcp's, byte for
/// byte in meaning (`tests/it/wire.rs` compares them), and anything else goes on to rmcp.
async fn listen_gate(State(gate): State<Gate>, req: Request, next: Next) -> Response {
    let server = &gate.server;
    let max = server.limits().max_message_bytes;
    let (mut parts, body) = req.into_parts();
    // Every request to the endpoint, whatever its method or type (a page from another origin
    // is refused by rmcp whoever it claims to be).
    // The caller is worked out once (its token's digest with it) and kept for the checks
    // below; rmcp's handler reads it again from the parts, with the principal found here.
    let caller = if gate.allow.admits(&parts.uri, &parts.headers) {
        let mut caller = Caller::from_parts(&parts);
        if let Some(refused) = unauthenticated(server, &mut caller).await {
            return refused;
        }
        if let Some(p) = &caller.known_as {
            parts
                .extensions
                .insert(crate::mcp::caller::KnownAs(p.clone()));
        }
        Some(caller)
    } else {
        None
    };
    let Some(caller) =
        caller.filter(|_| parts.method == Method::POST && json_content(&parts.headers))
    else {
        return next.run(Request::from_parts(parts, body)).await;
    };
    let bytes = match axum::body::to_bytes(body, max).await {
        Ok(b) => b,
        Err(_) => {
            let error = json!({"code": -32600, "message": format!(
                "request body exceeds the {max}-byte limit; send smaller messages")});
            return rpc_error(StatusCode::PAYLOAD_TOO_LARGE, Value::Null, error);
        }
    };
    // A byte scan first, so the many bodies that cannot name the method (a tool call, a
    // read) are not parsed twice: a listen's method name contains `listen` unless its letters
    // are written as `\u` escapes, and then the body contains `\u`.
    let contains = |needle: &[u8]| bytes.windows(needle.len()).any(|w| w == needle);
    // The `Mcp-Param-*` check of every tools/call, whatever path answers it (rmcp does not
    // check the headers of herald's tools), then the plain shapes herald answers itself.
    let call = (parts.headers.get(MCP_METHOD)).is_some_and(|m| m == "tools/call");
    let plain = contains(b"tools/call") || contains(b"resources/read");
    if call || plain {
        if call
            && let Some(refused) = param_headers_refused(&parts.headers, &bytes, server, &caller)
        {
            return refused;
        }
        if plain && let Some(plain) = plain_request(&parts.headers, &bytes) {
            return plain.answer(server, &caller).await;
        }
    }
    let is_listen = (contains(b"listen") || contains(b"\\u"))
        && serde_json::from_slice::<MethodProbe>(&bytes)
            .is_ok_and(|p| p.method.as_deref() == Some("subscriptions/listen"));
    if is_listen
        && let Ok(v) = serde_json::from_slice::<Value>(&bytes)
        && !refused_by_rmcp(server, &v)
    {
        let id = v.get("id").cloned().unwrap_or(Value::Null);
        let filter = match ListenFilter::from_params(v.get("params")) {
            Ok(f) => f,
            Err(e) => return listen_refused(id, e),
        };
        let conn = match parts.extensions.get::<PeerAddr>() {
            Some(peer) => gate
                .budgets
                .for_listen(server, &caller, &parts.headers, peer.0.ip()),
            None => parts
                .extensions
                .get::<ConnStreams>()
                .cloned()
                .unwrap_or_default(),
        };
        let (ack, listen) = match server.open(&caller, &filter, &conn).await {
            Ok(opened) => opened,
            Err(e) => return listen_refused(id, e),
        };
        if let Some(id) = plain_listen(&parts.headers, &bytes, server) {
            return sse_listen(server.clone(), listen, id, ack);
        }
        // Another shape: rmcp checks the request as it checks any, untouched, and its
        // handler claims the listen once rmcp has taken it ([`ListenClaim`]). The answer is
        // then this gate's own stream, with the acknowledgment admission built; rmcp's
        // response (whose acknowledgment has no room for `taskIds`) is dropped unread. A
        // listen rmcp refuses keeps rmcp's answer, and its admission is dropped with it.
        let (claim, claimed) = ListenClaim::new();
        parts.extensions.insert(claim);
        let body = Body::from(bytes.clone());
        let response = next.run(Request::from_parts(parts, body)).await;
        // rmcp's handler claims a listen it takes at once; one it never claims must not hold
        // the admitted stream's slot.
        if is_event_stream(&response)
            && matches!(tokio::time::timeout(CLAIM_WAIT, claimed).await, Ok(Ok(_)))
            && let Ok(id) = serde_json::from_value::<rmcp::model::RequestId>(id)
        {
            return sse_listen(server.clone(), listen, id, ack);
        }
        return unparsed(response, &bytes);
    }
    let body = Body::from(bytes.clone());
    unparsed(next.run(Request::from_parts(parts, body)).await, &bytes)
}

/// Whether rmcp refuses the listen `request` (a JSON-RPC message) before it would acknowledge
/// it, whatever herald says of its filter: its `_meta` names no protocol version (rmcp answers
/// `-32602` with `400` when the `MCP-Protocol-Version` header is 2026-07-28 or later; a
/// request of the `initialize` era outside a session gets its `400` asking for a session, and
/// inside one `-32601`), names one the server does not support
/// (`-32022`), or names 2026-07-28 without the keys it requires (`-32602`, `400`). Such a
/// listen goes on to rmcp unadmitted, so its error and status are rmcp's, and nothing is
/// admitted for it. A `_meta` that is not an object is rmcp's too (its parser refuses it).
fn refused_by_rmcp(server: &SourceServer, request: &Value) -> bool {
    use rmcp::ServerHandler as _;
    use rmcp::model::{ProtocolVersion, RequestMetaObject};
    let meta = match request.pointer("/params/_meta") {
        None | Some(Value::Null) => RequestMetaObject::default(),
        Some(meta) => match serde_json::from_value::<RequestMetaObject>(meta.clone()) {
            Ok(meta) => meta,
            Err(_) => return true,
        },
    };
    let Some(version) = meta.protocol_version() else {
        return true;
    };
    !server.supported_protocol_versions().contains(&version)
        || (version.as_str() >= ProtocolVersion::V_2026_07_28.as_str()
            && !meta
                .missing_required_keys(&ProtocolVersion::V_2026_07_28)
                .is_empty())
}

/// The gate's answer to a listen it refused before its acknowledgment (its filter, its
/// admission), with the status rmcp gives that error ([`error_status`]). Only a listen whose
/// `_meta` is whole gets here ([`refused_by_rmcp`]), so a `-32602` is about the filter, not
/// the request's shape: `200`.
fn listen_refused(id: Value, error: rmcp::model::ErrorData) -> Response {
    let (status, body) = listen_refusal(id, error);
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// [`listen_refused`]'s status and JSON body (also written by [`first`], ahead of hyper).
fn listen_refusal(id: Value, error: rmcp::model::ErrorData) -> (StatusCode, String) {
    (
        error_status(error.code, false),
        rpc_error_body(id, json!(error)),
    )
}

/// The HTTP status of a JSON-RPC error answering a 2026-07-28 request, as rmcp's service maps
/// it (`jsonrpc_http_status` in its `streamable_http_server/tower.rs`), so that every answer
/// herald writes itself ([`plain::PlainRequest::answer`], the listen gate, the first listen read ahead of
/// hyper, which hands a refused listen to the gate) has the status rmcp would give: `400` for
/// the protocol's request errors (`-32020` header mismatch, `-32021` missing client
/// capability, `-32022` unsupported version, and `-32602` when `meta_malformed`: the
/// request's `_meta` lacks a key 2026-07-28 requires), `404` for `-32601`, else `200` with
/// the error in the body.
fn error_status(code: rmcp::model::ErrorCode, meta_malformed: bool) -> StatusCode {
    use rmcp::model::ErrorCode;
    match code {
        ErrorCode::UNSUPPORTED_PROTOCOL_VERSION
        | ErrorCode::MISSING_REQUIRED_CLIENT_CAPABILITY
        | ErrorCode::HEADER_MISMATCH => StatusCode::BAD_REQUEST,
        ErrorCode::INVALID_PARAMS if meta_malformed => StatusCode::BAD_REQUEST,
        ErrorCode::METHOD_NOT_FOUND => StatusCode::NOT_FOUND,
        _ => StatusCode::OK,
    }
}

/// Whether the request's `Content-Type` is JSON as rmcp tests it: the media type before any
/// parameter, trimmed, `application/json` in any case.
fn json_content(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
}

/// `401` with `WWW-Authenticate: Bearer` for a caller whose credentials the source does not
/// know (a gateway's missing or unknown token), before anything of the request is read: an
/// unknown token is refused outright, never taken as a token with no entitlements.
async fn unauthenticated(server: &SourceServer, caller: &mut Caller) -> Option<Response> {
    use crate::mcp::source::Authentication;
    let auth = server.authenticates(caller).await;
    let message = auth.refusal()?;
    let challenge = match auth {
        // Known, but `?servers=` kept nothing: 403, no credentials to ask for.
        Authentication::NothingSelected => {
            return Some(rpc_error(
                StatusCode::FORBIDDEN,
                Value::Null,
                json!({"code": -32024, "message": message}),
            ));
        }
        Authentication::UnknownToken => oauth::challenge(server, Some("invalid_token")),
        _ => oauth::challenge(server, None),
    };
    let mut response = rpc_error(
        StatusCode::UNAUTHORIZED,
        Value::Null,
        json!({"code": -32024, "message": message}),
    );
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, challenge);
    Some(response)
}

/// rmcp's answer to a JSON body it could not take as a JSON-RPC message is `415` and a line of
/// plain text; a client is owed a JSON-RPC error saying what is wrong (as stdio answers):
/// `-32700` for a body that is not JSON, `-32600` for JSON that is not one JSON-RPC message,
/// `-32602` for a `_meta` or `params` of the wrong type, all with `400`. Only that `415` is
/// looked at again, so a body rmcp takes costs nothing here; a body that is well-formed
/// JSON-RPC keeps rmcp's answer.
fn unparsed(response: Response, body: &[u8]) -> Response {
    if response.status() != StatusCode::UNSUPPORTED_MEDIA_TYPE {
        return response;
    }
    match body_error(body) {
        Some((id, error)) => rpc_error(StatusCode::BAD_REQUEST, id, error),
        None => response,
    }
}

/// What is wrong with a body that is not one JSON-RPC message, and the id to answer with
/// (when it has a usable one); `None` when nothing is (the `415` was about something else).
fn body_error(body: &[u8]) -> Option<(Value, Value)> {
    let v: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => {
            let message = if body.iter().all(u8::is_ascii_whitespace) {
                "the request body is empty; send one JSON-RPC message".to_owned()
            } else {
                format!("the request body is not JSON ({e}); send one JSON-RPC message")
            };
            return Some((Value::Null, json!({"code": -32700, "message": message})));
        }
    };
    let wrong = super::jsonrpc::misshapen(&v)?;
    Some((
        wrong.id,
        json!({"code": wrong.code, "message": wrong.message}),
    ))
}

/// The request id of a listen herald answers with its own SSE stream: one in the shape every
/// 2026-07-28 client sends, which rmcp would take as it is (`MCP-Protocol-Version` and
/// `Mcp-Method` headers, each once and matching; both media types accepted; no session, name
/// or parameter headers; a well-formed request whose `_meta` names the version and the
/// client's capabilities; a server advertising resource subscriptions). Anything else goes on
/// to rmcp, which answers it as it always has.
fn plain_listen(
    headers: &axum::http::HeaderMap,
    body: &[u8],
    server: &SourceServer,
) -> Option<rmcp::model::RequestId> {
    use rmcp::ServerHandler as _;
    use rmcp::model::{ClientJsonRpcMessage, ClientRequest, GetMeta as _};
    if plain_headers(headers, "subscriptions/listen")?.is_some() {
        return None;
    }
    let subscribes = server
        .get_info()
        .capabilities
        .resources
        .is_some_and(|r| r.subscribe == Some(true));
    if !subscribes {
        return None;
    }
    let ClientJsonRpcMessage::Request(request) =
        serde_json::from_slice::<ClientJsonRpcMessage>(body).ok()?
    else {
        return None;
    };
    (matches!(
        &request.request,
        ClientRequest::SubscriptionsListenRequest(_)
    ) && modern_meta(request.request.get_meta()))
    .then_some(request.id)
}

/// Whether rmcp answered with a stream (it took the request) rather than one JSON body.
fn is_event_stream(response: &Response) -> bool {
    response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"))
}

/// A JSON-RPC error response with `status`.
fn rpc_error(status: StatusCode, id: Value, error: Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        rpc_error_body(id, error),
    )
        .into_response()
}

/// A JSON-RPC error message's text.
fn rpc_error_body(id: Value, error: Value) -> String {
    json!({"jsonrpc": "2.0", "id": id, "error": error}).to_string()
}

#[cfg(test)]
#[path = "http_tests.rs"]
mod tests;
