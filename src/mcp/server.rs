//! MCP server plumbing shared by every source: discover, resources, tools, `subscriptions/listen`
//! with its limits, and error mapping, on rmcp.
//!
//! [`SourceServer`] is the rmcp handler. On byte-stream transports each connection gets a
//! [`ConnServer`] ([`SourceServer::for_connection`]) that counts its listen streams; on HTTP, where
//! rmcp builds a handler per request, the HTTP layer counts per TCP connection ([`ConnStreams`])
//! and runs the same [`check_listen`]. Either way the limits are enforced
//! *before* rmcp acknowledges a listen, so a refused listen is a
//! plain JSON-RPC error, never an acknowledgment followed by silence.

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use base64::Engine as _;
use rmcp::handler::server::ServerHandler;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ClientRequest, CustomRequest, CustomResult,
    DiscoverResult, ErrorCode, ErrorData as McpError, Implementation, InitializeRequestParams,
    InitializeResult, ListPromptsResult, ListResourceTemplatesResult, ListResourcesResult,
    ListToolsResult, PaginatedRequestParams, ProtocolVersion, ReadResourceRequestParams,
    ReadResourceResponse, ReadResourceResult, ResourceContents, ServerCapabilities, ServerConfig,
    ServerResult, SubscriptionFilter, Tool,
};
use rmcp::service::{
    NotificationContext, RequestContext, RoleServer, Service, SubscriptionContext,
    SubscriptionSendError,
};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::mcp::hub::{ChangeFeed, Registration};
use crate::mcp::source::{Body, Caller, DynSource, SourceError};

/// The Events extension's capability key.
pub const EVENTS_EXTENSION: &str = "io.modelcontextprotocol/events";

/// Where a token travels on byte-stream transports: each request's `_meta`.
pub const TOKEN_META_KEY: &str = "io.herald/token";

/// Server-side limits. Every field has a default and a flag.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Open `subscriptions/listen` streams per connection.
    pub max_streams_per_connection: usize,
    /// URIs one listen stream may ask for.
    pub max_uris_per_stream: usize,
    /// Largest incoming message (stdio/QUIC line, HTTP body), in bytes.
    pub max_message_bytes: usize,
    /// A listen stream whose notification cannot be written within this is ended, so the
    /// client resubscribes instead of holding a stalled stream.
    pub stall_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_streams_per_connection: 64,
            max_uris_per_stream: 256,
            max_message_bytes: 4 * 1024 * 1024,
            stall_timeout: Duration::from_secs(10),
        }
    }
}

/// Open listen streams on one connection.
#[derive(Debug, Clone, Default)]
pub struct ConnStreams(Arc<AtomicUsize>);

impl ConnStreams {
    pub fn try_acquire(&self, max: usize) -> Option<StreamSlot> {
        let prev = self.0.fetch_add(1, Ordering::AcqRel);
        if prev >= max {
            self.0.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(StreamSlot(Arc::new(SlotInner(self.0.clone()))))
    }

    /// A counter shared with other holders of `shared`.
    pub fn from_shared(shared: Arc<AtomicUsize>) -> ConnStreams {
        ConnStreams(shared)
    }

    pub fn downgrade(&self) -> std::sync::Weak<AtomicUsize> {
        Arc::downgrade(&self.0)
    }

    pub fn open(&self) -> usize {
        self.0.load(Ordering::Acquire)
    }
}

/// A reserved listen slot; it rides in the request's extensions, so it is released when rmcp
/// drops the listen request's context.
#[derive(Clone)]
pub struct StreamSlot(#[allow(dead_code)] Arc<SlotInner>);
struct SlotInner(Arc<AtomicUsize>);
impl Drop for SlotInner {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

struct Shared {
    source: DynSource,
    feed: ChangeFeed,
    limits: Limits,
    shutdown: CancellationToken,
    config: ServerConfig,
    streams_total: AtomicU64,
    /// Listen streams running now, and a wake-up for when that reaches zero.
    active_listens: AtomicUsize,
    drained: tokio::sync::Notify,
}

/// Counts a running listen; wakes [`SourceServer::listens_drained`] at zero.
struct ActiveListen<'a>(&'a Shared);

impl<'a> ActiveListen<'a> {
    fn new(shared: &'a Shared) -> Self {
        shared.active_listens.fetch_add(1, Ordering::AcqRel);
        ActiveListen(shared)
    }
}

impl Drop for ActiveListen<'_> {
    fn drop(&mut self) {
        if self.0.active_listens.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.drained.notify_waiters();
        }
    }
}

/// The handler rmcp drives: one per server, cloned per request or connection.
#[derive(Clone)]
pub struct SourceServer {
    shared: Arc<Shared>,
}

impl SourceServer {
    pub fn new(source: DynSource, limits: Limits, shutdown: CancellationToken) -> SourceServer {
        let info = source.info();
        let caps = ServerCapabilities::builder()
            .enable_resources()
            .enable_resources_subscribe()
            .enable_prompts()
            .enable_tools()
            .build();
        let mut config = ServerConfig::new(caps).with_server_info(Implementation::new(
            format!("herald-{}", info.name),
            env!("CARGO_PKG_VERSION"),
        ));
        if let Some(i) = info.instructions {
            config = config.with_instructions(i);
        }
        SourceServer {
            shared: Arc::new(Shared {
                feed: source.changes(),
                source,
                limits,
                shutdown,
                config,
                streams_total: AtomicU64::new(0),
                active_listens: AtomicUsize::new(0),
                drained: tokio::sync::Notify::new(),
            }),
        }
    }

    /// This server for stdio, with its own listen-stream count. The peer is the process that
    /// started this one, so it is a local caller (no token needed).
    pub fn for_connection(&self) -> ConnServer {
        ConnServer {
            server: self.clone(),
            conn: ConnStreams::default(),
            local: true,
        }
    }

    /// This server for a byte-stream connection that shares its listen-stream budget with
    /// others (the streams of one QUIC connection). Its callers present a token in `_meta`.
    pub fn for_connection_sharing(&self, conn: ConnStreams) -> ConnServer {
        ConnServer {
            server: self.clone(),
            conn,
            local: false,
        }
    }

    /// The HTTP handler: each request's caller comes from its `Authorization` header and the
    /// endpoint's `?servers=`.
    pub fn for_http(&self) -> HttpServer {
        HttpServer(self.clone())
    }

    pub fn limits(&self) -> &Limits {
        &self.shared.limits
    }

    pub fn feed(&self) -> &ChangeFeed {
        &self.shared.feed
    }

    /// Listen streams running now.
    pub fn active_listens(&self) -> usize {
        self.shared.active_listens.load(Ordering::Acquire)
    }

    /// Resolves once no listen stream is running (after shutdown, once every listen has
    /// returned its final result to rmcp).
    pub async fn listens_drained(&self) {
        loop {
            let notified = self.shared.drained.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.active_listens() == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// An admitted listen: its reserved stream slot and its hub registration, made before rmcp
/// acknowledges the listen so that no change published after the acknowledgment is lost.
/// It rides in the request's extensions until [`SourceServer::listen`] takes the registration.
#[derive(Clone)]
pub struct ListenAdmission {
    _slot: StreamSlot,
    registration: Arc<std::sync::Mutex<Option<Registration>>>,
    /// `(feed key, URI as the caller wrote it)` for each accepted URI.
    keys: Vec<(String, String)>,
    /// Watches the source started while admitting, held as long as the listen is.
    _held: Arc<Vec<crate::mcp::source::WatchGuard>>,
}

impl ListenAdmission {
    /// The requested URIs this caller may watch (what the ack will name).
    pub fn accepted(&self) -> Vec<String> {
        self.keys.iter().map(|(_, u)| u.clone()).collect()
    }

    fn take(&self) -> Option<Registration> {
        self.registration
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }
}

impl SourceServer {
    /// Admits a listen asking for `requested` URIs on `conn`: checks the limits, reserves a
    /// stream slot and registers the accepted URIs with the hub, all before the ack.
    pub async fn admit_listen(
        &self,
        requested: &[String],
        conn: &ConnStreams,
    ) -> Result<ListenAdmission, McpError> {
        let slot = check_listen(&self.shared.limits, requested.len(), conn)?;
        let (accepted, held) = self.shared.source.prepare_watch(requested).await;
        let keys: Vec<(String, String)> = accepted
            .iter()
            .map(|u| (self.shared.source.feed_key(u), u.clone()))
            .collect();
        let feed_keys: Vec<String> = keys.iter().map(|(k, _)| k.clone()).collect();
        let registration = self.shared.feed.register(&feed_keys);
        Ok(ListenAdmission {
            _slot: slot,
            registration: Arc::new(std::sync::Mutex::new(Some(registration))),
            keys,
            _held: Arc::new(held),
        })
    }
}

/// Checks a listen request against the limits and reserves a stream slot on `conn`.
/// Called before rmcp acknowledges the listen, so a refusal is a plain JSON-RPC error.
pub fn check_listen(
    limits: &Limits,
    requested_uris: usize,
    conn: &ConnStreams,
) -> Result<StreamSlot, McpError> {
    if requested_uris > limits.max_uris_per_stream {
        return Err(McpError::invalid_params(
            format!(
                "subscriptions/listen asks for {requested_uris} resources; one stream takes at most {}: split them across several listen requests",
                limits.max_uris_per_stream
            ),
            Some(json!({"limit": limits.max_uris_per_stream, "requested": requested_uris})),
        ));
    }
    conn.try_acquire(limits.max_streams_per_connection)
        .ok_or_else(|| {
            McpError::invalid_request(
                format!(
                    "this connection already has {} open listen streams, the most allowed; cancel one first or open another connection",
                    limits.max_streams_per_connection
                ),
                Some(json!({"limit": limits.max_streams_per_connection})),
            )
        })
}

/// [`SourceServer`] on one byte-stream connection: enforces the listen limits before rmcp
/// acknowledges a listen. (On HTTP the same check runs in the HTTP layer; see
/// `transport::http`.)
#[derive(Clone)]
pub struct ConnServer {
    server: SourceServer,
    conn: ConnStreams,
    local: bool,
}

impl Service<RoleServer> for ConnServer {
    async fn handle_request(
        &self,
        request: ClientRequest,
        mut context: RequestContext<RoleServer>,
    ) -> Result<ServerResult, McpError> {
        let caller = Caller {
            token: context
                .meta
                .0
                .0
                .get(TOKEN_META_KEY)
                .and_then(|v| v.as_str())
                .map(str::to_owned),
            servers: None,
            local: self.local,
        };
        let mut request = request;
        caller
            .scope(async move {
                if let ClientRequest::SubscriptionsListenRequest(r) = &mut request {
                    let requested = r
                        .params
                        .notifications
                        .resource_subscriptions
                        .clone()
                        .unwrap_or_default();
                    let admission = self.server.admit_listen(&requested, &self.conn).await?;
                    // rmcp acknowledges what the request names: narrow it to what was admitted.
                    if r.params.notifications.resource_subscriptions.is_some() {
                        r.params.notifications.resource_subscriptions = Some(admission.accepted());
                    }
                    context.extensions.insert(admission);
                }
                self.server.handle_request(request, context).await
            })
            .await
    }

    async fn handle_notification(
        &self,
        notification: rmcp::model::ClientNotification,
        context: NotificationContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.server.handle_notification(notification, context).await
    }

    fn get_info(&self) -> ServerConfig {
        self.server.shared.config.clone()
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(ProtocolVersion::KNOWN_VERSIONS)
    }
}

/// [`SourceServer`] on HTTP (rmcp builds one per request): the caller comes from the request's
/// `Authorization: Bearer` header and the endpoint URL's `?servers=a,b`.
#[derive(Clone)]
pub struct HttpServer(SourceServer);

/// The caller an HTTP request presents.
pub fn http_caller(headers: &http::HeaderMap, uri: &http::Uri) -> Caller {
    let token = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, rest) = v.trim().split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then_some(rest)
        })
        .map(|t| t.trim().to_owned())
        .filter(|t| !t.is_empty());
    let servers = uri.query().and_then(|q| {
        q.split('&').find_map(|p| {
            p.strip_prefix("servers=").map(|v| {
                v.split(',')
                    .map(|s| s.trim().to_owned())
                    .filter(|s| !s.is_empty())
                    .collect()
            })
        })
    });
    Caller {
        token,
        servers,
        local: false,
    }
}

fn http_caller_of(ctx: &RequestContext<RoleServer>) -> Caller {
    ctx.extensions
        .get::<http::request::Parts>()
        .map(|p| http_caller(&p.headers, &p.uri))
        .unwrap_or_default()
}

/// rmcp's HTTP service takes a [`ServerHandler`]: delegate each method, inside the caller's
/// scope.
impl ServerHandler for HttpServer {
    fn get_info(&self) -> ServerConfig {
        self.0.shared.config.clone()
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(ProtocolVersion::KNOWN_VERSIONS)
    }

    async fn discover(&self, ctx: RequestContext<RoleServer>) -> Result<DiscoverResult, McpError> {
        http_caller_of(&ctx).scope(self.0.discover(ctx)).await
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, McpError> {
        http_caller_of(&ctx)
            .scope(self.0.initialize(request, ctx))
            .await
    }

    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        http_caller_of(&ctx)
            .scope(self.0.list_resources(request, ctx))
            .await
    }

    async fn list_resource_templates(
        &self,
        request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        http_caller_of(&ctx)
            .scope(self.0.list_resource_templates(request, ctx))
            .await
    }

    async fn list_prompts(
        &self,
        request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, McpError> {
        self.0.list_prompts(request, ctx).await
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        http_caller_of(&ctx)
            .scope(self.0.read_resource(request, ctx))
            .await
    }

    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        self.0.accepted_subscription_filter(requested)
    }

    async fn listen(&self, ctx: SubscriptionContext) -> Result<(), McpError> {
        let caller = http_caller_of(ctx.request_context());
        caller.scope(self.0.listen(ctx)).await
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        http_caller_of(&ctx)
            .scope(self.0.list_tools(request, ctx))
            .await
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.0.get_tool(name)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        http_caller_of(&ctx)
            .scope(self.0.call_tool(request, ctx))
            .await
    }

    async fn on_custom_request(
        &self,
        request: CustomRequest,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CustomResult, McpError> {
        http_caller_of(&ctx)
            .scope(self.0.on_custom_request(request, ctx))
            .await
    }
}

/// Maps a source error to JSON-RPC. `uri` is attached as `data.uri` where it applies.
pub fn to_mcp_error(e: SourceError) -> McpError {
    match &e {
        SourceError::NotFound { uri } => {
            McpError::resource_not_found(e.to_string(), Some(json!({ "uri": uri })))
        }
        SourceError::InvalidParams(_) | SourceError::UnknownTool(_) => {
            McpError::invalid_params(e.to_string(), None)
        }
        SourceError::Unavailable(_) => McpError::internal_error(e.to_string(), None),
        SourceError::Forbidden => McpError::new(ErrorCode(-32024), e.to_string(), None),
        SourceError::EventNotFound(_) => McpError::new(
            ErrorCode(-32023),
            e.to_string(),
            Some(json!({"kind": "event"})),
        ),
        SourceError::Upstream {
            code,
            message,
            data,
        } => McpError::new(ErrorCode(*code), message.clone(), data.clone()),
    }
}

/// `events/poll` on `source`. A long poll (`timeoutMs`) ends early on shutdown: the poll is
/// asked again without the wait, so the client gets what is there and a valid cursor, not a
/// dropped request. (A poll consumes nothing, so asking twice is safe.)
async fn poll_until_shutdown(
    source: &DynSource,
    params: serde_json::Map<String, serde_json::Value>,
    shutdown: &CancellationToken,
) -> Result<serde_json::Value, SourceError> {
    let waits = params
        .get("timeoutMs")
        .and_then(serde_json::Value::as_u64)
        .is_some_and(|t| t > 0);
    if !waits {
        return source.events_poll(params).await;
    }
    tokio::select! {
        r = source.events_poll(params.clone()) => r,
        _ = shutdown.cancelled() => {
            let mut params = params;
            params.remove("timeoutMs");
            source.events_poll(params).await
        }
    }
}

impl SourceServer {
    /// The handshake's capabilities: the Events extension when the source serves events to
    /// this caller.
    async fn config_for_caller(&self) -> ServerConfig {
        let mut config = self.shared.config.clone();
        if self.shared.source.events_advertised().await {
            config
                .capabilities
                .extensions
                .get_or_insert_with(Default::default)
                .insert(EVENTS_EXTENSION.into(), Default::default());
        }
        config
    }
}

impl ServerHandler for SourceServer {
    fn get_info(&self) -> ServerConfig {
        self.shared.config.clone()
    }

    async fn discover(
        &self,
        _context: RequestContext<RoleServer>,
    ) -> Result<DiscoverResult, McpError> {
        Ok(DiscoverResult::from_server_info(
            ServerHandler::supported_protocol_versions(self).into_owned(),
            self.config_for_caller().await,
        ))
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, McpError> {
        context.peer.set_peer_info(request.clone());
        let mut info = self.negotiate_initialize(&request)?;
        info.capabilities = self.config_for_caller().await.capabilities;
        Ok(info)
    }

    async fn on_custom_request(
        &self,
        request: CustomRequest,
        _context: RequestContext<RoleServer>,
    ) -> Result<CustomResult, McpError> {
        let params = match request.params {
            None | Some(serde_json::Value::Null) => serde_json::Map::new(),
            Some(serde_json::Value::Object(o)) => o,
            Some(_) => return Err(McpError::invalid_params("params must be an object", None)),
        };
        let source = &self.shared.source;
        match request.method.as_str() {
            "events/list" => {
                if let Some(k) = params.keys().find(|k| *k != "cursor" && *k != "_meta") {
                    return Err(McpError::invalid_params(
                        format!("unknown parameter {k}; events/list takes cursor"),
                        None,
                    ));
                }
                let events = source.events_list().await.map_err(to_mcp_error)?;
                Ok(CustomResult::new(
                    json!({"resultType": "complete", "events": events}),
                ))
            }
            "events/poll" => {
                let result = poll_until_shutdown(source, params, &self.shared.shutdown).await;
                let mut result = result.map_err(to_mcp_error)?;
                if let Some(o) = result.as_object_mut() {
                    o.entry("resultType").or_insert_with(|| "complete".into());
                }
                Ok(CustomResult::new(result))
            }
            other => Err(McpError::new(
                ErrorCode::METHOD_NOT_FOUND,
                format!("unknown method {other}"),
                None,
            )),
        }
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        Ok(ListResourcesResult::with_all_items(
            self.shared.source.resources(),
        ))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        Ok(ListResourceTemplatesResult::with_all_items(
            self.shared.source.templates(),
        ))
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, McpError> {
        Ok(ListPromptsResult::with_all_items(Vec::new()))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        let uri = request.uri;
        let contents = self.shared.source.read(&uri).await.map_err(to_mcp_error)?;
        let rc = match contents.body {
            Body::Text(t) => ResourceContents::text(t, uri),
            Body::Blob(b) => {
                ResourceContents::blob(base64::engine::general_purpose::STANDARD.encode(b), uri)
            }
        }
        .with_mime_type(contents.mime_type);
        Ok(ReadResourceResult::new(vec![rc]).into())
    }

    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        // Admission (in the caller's scope, before this) decided, and narrowed the request to
        // what it accepted: on byte streams in `ConnServer`, on HTTP in the listen gate. This
        // method has no request context to decide with; a listen that skipped admission is
        // refused in `listen`.
        let mut accepted = SubscriptionFilter::default();
        accepted.resource_subscriptions = requested.resource_subscriptions.clone();
        Some(accepted)
    }

    async fn listen(&self, ctx: SubscriptionContext) -> Result<(), McpError> {
        let shared = &self.shared;
        let _active = ActiveListen::new(shared);
        let uris = ctx
            .accepted()
            .resource_subscriptions
            .clone()
            .unwrap_or_default();
        let stream = shared.streams_total.fetch_add(1, Ordering::Relaxed);
        let id = ctx.sink().id().clone();
        debug!(stream, ?id, uris = uris.len(), "listen stream opened");
        // Normally registered before the ack (see `admit_listen`); registering here is the
        // fallback for a path that skipped admission.
        let request = ctx.request_context();
        let admission = request.extensions.get::<ListenAdmission>().or_else(|| {
            request
                .extensions
                .get::<http::request::Parts>()
                .and_then(|p| p.extensions.get::<ListenAdmission>())
        });
        // Every listen is admitted before its ack (limits, and what this caller may watch);
        // one that was not is refused, never served unchecked.
        let Some((registration, keys)) =
            admission.and_then(|a| a.take().map(|r| (r, a.keys.clone())))
        else {
            warn!(
                stream,
                "a listen reached the handler without admission; refusing it"
            );
            return Err(McpError::internal_error(
                "this listen was not admitted; send it again",
                None,
            ));
        };
        // A feed key back to the URIs this stream wrote for it.
        let mut spelled: std::collections::HashMap<String, Vec<String>> = Default::default();
        for (k, u) in keys {
            spelled.entry(k).or_default().push(u);
        }
        let mut guards = Vec::with_capacity(uris.len());
        for uri in &uris {
            match shared.source.watch(uri).await {
                Ok(g) => guards.push(g),
                Err(e) => warn!(%uri, error = %e, "source could not start watching"),
            }
        }
        let sink = ctx.sink().clone();
        let stall = shared.limits.stall_timeout;
        loop {
            tokio::select! {
                biased;
                _ = ctx.cancelled() => {
                    debug!(stream, "listen stream cancelled by the client");
                    return Ok(());
                }
                _ = shared.shutdown.cancelled() => {
                    debug!(stream, "listen stream closed for shutdown");
                    return Ok(());
                }
                batch = registration.queue().next_batch() => {
                    // One deadline for the whole batch: a reader that takes nothing for
                    // `stall` ends the stream.
                    let deadline = tokio::time::Instant::now() + stall;
                    for uri in batch.into_iter().flat_map(|k| spelled.get(&k).cloned().unwrap_or_default()) {
                        let sent = tokio::select! {
                            _ = shared.shutdown.cancelled() => return Ok(()),
                            r = tokio::time::timeout_at(deadline, sink.notify_resource_updated(uri)) => r,
                        };
                        match sent {
                            Ok(Ok(())) => {}
                            Ok(Err(SubscriptionSendError::SubscriptionClosed)) => return Ok(()),
                            Ok(Err(e @ SubscriptionSendError::NotificationNotAccepted(_))) => {
                                debug!(stream, error = %e, "notification not accepted");
                            }
                            Ok(Err(e)) => {
                                info!(stream, error = %e, "listen stream could not deliver; ending it");
                                return Err(McpError::internal_error(
                                    format!("listen stream failed to deliver a notification ({e}); listen again"),
                                    None,
                                ));
                            }
                            Err(_) => {
                                info!(
                                    stream,
                                    stall_ms = stall.as_millis() as u64,
                                    "listen stream stalled: its reader took no notification; ending it so the client resubscribes"
                                );
                                // An error, not the graceful result: the client must listen
                                // again and re-read, since notifications were dropped.
                                return Err(McpError::internal_error(
                                    format!(
                                        "listen stream stalled: no notification could be delivered for {} ms; listen again and re-read",
                                        stall.as_millis()
                                    ),
                                    Some(json!({"reason": "stalled"})),
                                ));
                            }
                        }
                    }
                }
            }
        }
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(self.shared.source.tools()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.shared
            .source
            .tools()
            .into_iter()
            .find(|t| t.name == name)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let args = request.arguments.unwrap_or_default();
        let progress =
            context
                .meta
                .get_progress_token()
                .map(|token| crate::mcp::source::Progress {
                    token,
                    peer: context.peer.clone(),
                });
        self.shared
            .source
            .call_tool_with_progress(&request.name, args, progress)
            .await
            .map(Into::into)
            .map_err(to_mcp_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::memo::Memo;
    use crate::store::Store;

    async fn server(limits: Limits) -> SourceServer {
        let memo = Memo::open(Store::memory(), 16).await.unwrap();
        SourceServer::new(Arc::new(memo), limits, CancellationToken::new())
    }

    /// Regression: the hub registration used to happen inside `listen`, after rmcp had sent
    /// the ack, so a change published between the ack and the registration was lost.
    #[tokio::test]
    async fn admission_registers_accepted_uris_before_the_ack() {
        let s = server(Limits::default()).await;
        let conn = ConnStreams::default();
        let admission = s
            .admit_listen(&["memo://notes".into(), "memo://unknown".into()], &conn)
            .await
            .unwrap();
        assert_eq!(s.feed().listeners("memo://notes"), 1);
        assert_eq!(
            s.feed().listeners("memo://unknown"),
            0,
            "only accepted URIs"
        );
        s.feed().publish("memo://notes");
        let reg = admission.take().unwrap();
        assert_eq!(
            reg.queue().next_batch().await,
            vec!["memo://notes".to_string()]
        );
        assert!(admission.take().is_none(), "taken once");
        assert_eq!(conn.open(), 1);
        drop((reg, admission));
        assert_eq!(conn.open(), 0, "the slot is released with the admission");
        assert_eq!(s.feed().listeners("memo://notes"), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_long_poll_is_answered_at_shutdown() {
        let memo: DynSource = Arc::new(Memo::open(Store::memory(), 16).await.unwrap());
        let shutdown = CancellationToken::new();
        let params = |v: serde_json::Value| v.as_object().unwrap().clone();
        let start = memo
            .events_poll(params(json!({"name": "memo.changed"})))
            .await
            .unwrap();
        let long =
            params(json!({"name": "memo.changed", "cursor": start["cursor"], "timeoutMs": 20_000}));
        let waiting = {
            let (memo, shutdown) = (memo.clone(), shutdown.clone());
            tokio::spawn(async move { poll_until_shutdown(&memo, long, &shutdown).await })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!waiting.is_finished(), "the poll waits for an event");
        let began = tokio::time::Instant::now();
        shutdown.cancel();
        let r = waiting.await.unwrap().unwrap();
        assert_eq!(began.elapsed(), Duration::ZERO, "answered at once");
        assert_eq!(r["events"], json!([]));
        assert_eq!(r["cursor"], start["cursor"]);
    }

    #[tokio::test]
    async fn admission_enforces_both_limits() {
        let s = server(Limits {
            max_streams_per_connection: 1,
            max_uris_per_stream: 2,
            ..Limits::default()
        })
        .await;
        let conn = ConnStreams::default();
        let three: Vec<String> = (0..3).map(|i| format!("memo://{i}")).collect();
        let err = s.admit_listen(&three, &conn).await.err().unwrap();
        assert_eq!(err.code.0, -32602);
        let _one = s.admit_listen(&three[..1], &conn).await.unwrap();
        let err = s.admit_listen(&three[..1], &conn).await.err().unwrap();
        assert!(
            err.message.contains("1 open listen streams"),
            "{}",
            err.message
        );
    }
}
