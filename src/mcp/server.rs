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
    CallToolRequestParams, CallToolResponse, ClientRequest, ErrorData as McpError, Implementation,
    ListPromptsResult, ListResourceTemplatesResult, ListResourcesResult, ListToolsResult,
    PaginatedRequestParams, ProtocolVersion, ReadResourceRequestParams, ReadResourceResponse,
    ReadResourceResult, ResourceContents, ServerCapabilities, ServerConfig, ServerResult,
    SubscriptionFilter, Tool,
};
use rmcp::service::{
    NotificationContext, RequestContext, RoleServer, Service, SubscriptionContext,
    SubscriptionSendError,
};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::mcp::hub::{ChangeFeed, Registration};
use crate::mcp::source::{Body, DynSource, SourceError};

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
    tools: Vec<Tool>,
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
        let tools = source.tools();
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
                tools,
                streams_total: AtomicU64::new(0),
                active_listens: AtomicUsize::new(0),
                drained: tokio::sync::Notify::new(),
            }),
        }
    }

    /// This server for a new byte-stream connection (stdio, QUIC stream), with its own
    /// listen-stream count.
    pub fn for_connection(&self) -> ConnServer {
        ConnServer {
            server: self.clone(),
            conn: ConnStreams::default(),
        }
    }

    /// This server for a byte-stream connection that shares its listen-stream budget with
    /// others (the streams of one QUIC connection).
    pub fn for_connection_sharing(&self, conn: ConnStreams) -> ConnServer {
        ConnServer {
            server: self.clone(),
            conn,
        }
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
}

impl ListenAdmission {
    fn take(&self) -> Option<Registration> {
        self.registration
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }
}

impl SourceServer {
    /// The URIs of `requested` this server accepts for a listen.
    fn accepted_uris(&self, requested: &[String]) -> Vec<String> {
        requested
            .iter()
            .filter(|u| self.shared.source.watchable(u))
            .cloned()
            .collect()
    }

    /// Admits a listen asking for `requested` URIs on `conn`: checks the limits, reserves a
    /// stream slot and registers the accepted URIs with the hub, all before the ack.
    pub fn admit_listen(
        &self,
        requested: &[String],
        conn: &ConnStreams,
    ) -> Result<ListenAdmission, McpError> {
        let slot = check_listen(&self.shared.limits, requested.len(), conn)?;
        let registration = self.shared.feed.register(&self.accepted_uris(requested));
        Ok(ListenAdmission {
            _slot: slot,
            registration: Arc::new(std::sync::Mutex::new(Some(registration))),
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
}

impl Service<RoleServer> for ConnServer {
    async fn handle_request(
        &self,
        request: ClientRequest,
        mut context: RequestContext<RoleServer>,
    ) -> Result<ServerResult, McpError> {
        if let ClientRequest::SubscriptionsListenRequest(r) = &request {
            let requested = r
                .params
                .notifications
                .resource_subscriptions
                .as_deref()
                .unwrap_or_default();
            let admission = self.server.admit_listen(requested, &self.conn)?;
            context.extensions.insert(admission);
        }
        self.server.handle_request(request, context).await
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
    }
}

impl ServerHandler for SourceServer {
    fn get_info(&self) -> ServerConfig {
        self.shared.config.clone()
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
        let mut accepted = SubscriptionFilter::default();
        if let Some(uris) = &requested.resource_subscriptions {
            accepted.resource_subscriptions = Some(self.accepted_uris(uris));
        }
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
        let admitted = request
            .extensions
            .get::<ListenAdmission>()
            .or_else(|| {
                request
                    .extensions
                    .get::<http::request::Parts>()
                    .and_then(|p| p.extensions.get::<ListenAdmission>())
            })
            .and_then(ListenAdmission::take);
        let registration = admitted.unwrap_or_else(|| shared.feed.register(&uris));
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
                    for uri in batch {
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
        Ok(ListToolsResult::with_all_items(self.shared.tools.clone()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.shared.tools.iter().find(|t| t.name == name).cloned()
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let args = request.arguments.unwrap_or_default();
        self.shared
            .source
            .call_tool(&request.name, args)
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
        let err = s.admit_listen(&three, &conn).err().unwrap();
        assert_eq!(err.code.0, -32602);
        let _one = s.admit_listen(&three[..1], &conn).unwrap();
        let err = s.admit_listen(&three[..1], &conn).err().unwrap();
        assert!(
            err.message.contains("1 open listen streams"),
            "{}",
            err.message
        );
    }
}
