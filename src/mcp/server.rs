//! MCP server plumbing shared by every source: discover, resources, tools, `subscriptions/listen`
//! with its limits, and error mapping, on rmcp.
//!
//! [`SourceServer`] is the rmcp handler, served as it is on HTTP (rmcp builds one per request)
//! and wrapped per connection on byte streams ([`ConnServer`](crate::mcp::conn::ConnServer), made by `SourceServer::for_connection`).
//! Every handler method works out its [`Caller`] from the request context ([`Caller::of`]) and
//! hands it to the source. Every listen is opened by [`SourceServer::open`] (admission, see
//! [`crate::mcp::admission`], and its acknowledgment, built once), whatever carries it: rmcp's
//! [`ServerHandler::listen`] only claims, for the HTTP gate, a listen the gate opened (see
//! [`ListenClaim`]), and refuses one that was not.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use base64::Engine as _;
use rmcp::handler::server::ServerHandler;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CancelTaskParams, CompleteRequestParams,
    CompleteResult, CustomRequest, CustomResult, DiscoverResult, ErrorCode, ErrorData as McpError,
    GetPromptRequestParams, GetPromptResponse, GetTaskParams, GetTaskResult, Implementation,
    InitializeRequestParams, InitializeResult, ListPromptsResult, ListResourceTemplatesResult,
    ListResourcesResult, ListToolsResult, PaginatedRequestParams, ReadResourceRequestParams,
    ReadResourceResponse, ReadResourceResult, ResourceContents, ServerCapabilities, ServerConfig,
    SubscriptionFilter, Tool, UpdateTaskParams,
};
use rmcp::service::{RequestContext, RoleServer, SubscriptionContext};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::mcp::admission::{ConnStreams, ListenClaim, ListenFilter, ServerBudgets};
use crate::mcp::caller::Caller;
use crate::mcp::hub::ChangeFeed;
use crate::mcp::legacy::LegacySubscriptions;
use crate::mcp::limits::Limits;
use crate::mcp::source::{Body, DynSource, SourceError};
use crate::mcp::tasks::relaying::TaskRelay;
use crate::mcp::tasks::{TaskSupport, Tasks};

/// The Events extension's capability key.
pub const EVENTS_EXTENSION: &str = "io.modelcontextprotocol/events";

pub use crate::mcp::caller::TOKEN_META_KEY;

/// Where a result names the server that answered it (2026-07-28: results SHOULD carry it).
pub const SERVER_INFO_META_KEY: &str = "io.modelcontextprotocol/serverInfo";

/// How long a plain tool call may go on once the server is shutting down.
const CALL_GRACE: Duration = Duration::from_secs(2);

struct Shared {
    source: DynSource,
    /// `_meta["io.modelcontextprotocol/serverInfo"]`, stamped on every result (the spec's
    /// SHOULD; rmcp stamps only discover's and listen's).
    server_info: serde_json::Value,
    feed: ChangeFeed,
    limits: Limits,
    shutdown: CancellationToken,
    config: ServerConfig,
    streams_total: AtomicU64,
    /// The tasks extension, when this server serves it.
    tasks: Option<TaskBackend>,
    /// Listen streams running now, and a wake-up for when that reaches zero.
    active_listens: AtomicUsize,
    drained: tokio::sync::Notify,
    /// The stream budget of requests that came with none (no transport of herald's).
    unplaced_streams: ConnStreams,
    /// The total and the per-caller listen budgets, on every transport.
    budgets: ServerBudgets,
    /// Webhook subscriptions, when this server takes them (`events/subscribe`).
    webhooks: std::sync::OnceLock<Arc<dyn crate::mcp::server::webhooks::Webhooks>>,
}

/// Where a server's tasks are: run here, or relayed to the servers that run them.
#[derive(Clone)]
enum TaskBackend {
    Local(Tasks),
    Relayed(Arc<dyn TaskRelay>),
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
    /// The `resources/subscribe` subscriptions of the session this handler serves (made per
    /// session by [`SourceServer::for_session`]; see [`crate::mcp::legacy`]).
    legacy: Arc<LegacySubscriptions>,
}

impl SourceServer {
    pub fn new(source: DynSource, limits: Limits, shutdown: CancellationToken) -> SourceServer {
        SourceServer::with_tasks(source, limits, shutdown, None)
    }

    /// [`SourceServer::new`] with the tasks extension: tools whose listing allows it run as
    /// tasks kept in `tasks`, and `tasks/*` and listen `taskIds` are served. A source that
    /// relays tasks ([`Source::task_relay`](crate::mcp::source::Source::task_relay), the
    /// gateway) serves the extension through that relay instead, with or without `tasks`.
    pub fn with_tasks(
        source: DynSource,
        limits: Limits,
        shutdown: CancellationToken,
        tasks: Option<Tasks>,
    ) -> SourceServer {
        let info = source.info();
        let tasks = match source.task_relay() {
            Some(relay) => Some(TaskBackend::Relayed(relay)),
            None => tasks.map(TaskBackend::Local),
        };
        let builder = ServerCapabilities::builder()
            .enable_resources()
            .enable_resources_subscribe()
            .enable_prompts()
            .enable_tools();
        let mut caps = if tasks.is_some() {
            builder.enable_tasks().build()
        } else {
            builder.build()
        };
        if info.completions {
            caps.completions = Some(Default::default());
        }
        // Listens may ask for their updates to carry reads (see `listens.rs`).
        caps.extensions
            .get_or_insert_with(Default::default)
            .insert(crate::mcp::admission::CONTENTS.into(), Default::default());
        if info.list_changed {
            if let Some(t) = caps.tools.as_mut() {
                t.list_changed = Some(true);
            }
            if let Some(p) = caps.prompts.as_mut() {
                p.list_changed = Some(true);
            }
        }
        let mut config = ServerConfig::new(caps).with_server_info(Implementation::new(
            format!("herald-{}", info.name),
            env!("CARGO_PKG_VERSION"),
        ));
        if let Some(i) = info.instructions {
            config = config.with_instructions(i);
        }
        let server_info = serde_json::to_value(&config.server_info).unwrap_or_default();
        SourceServer {
            shared: Arc::new(Shared {
                server_info,
                feed: source.changes(),
                source,
                limits,
                shutdown,
                config,
                streams_total: AtomicU64::new(0),
                tasks,
                active_listens: AtomicUsize::new(0),
                drained: tokio::sync::Notify::new(),
                webhooks: std::sync::OnceLock::new(),
                unplaced_streams: ConnStreams::default(),
                budgets: ServerBudgets::default(),
            }),
            legacy: Arc::default(),
        }
    }

    /// `events/poll` on this server's source for a caller in this process (a webhook
    /// subscription checking its event type), its refusal as a client would get it.
    pub async fn poll_in_process(
        &self,
        caller: &Caller,
        params: serde_json::Map<String, serde_json::Value>,
    ) -> Result<serde_json::Value, McpError> {
        self.shared
            .source
            .events_poll(caller, params)
            .await
            .map_err(to_mcp_error)
    }

    /// Takes `events/subscribe` and `events/unsubscribe` through `hooks` from now on (once;
    /// a second is ignored), and says `webhook` among every event type's delivery modes.
    pub fn serve_webhooks(&self, hooks: Arc<dyn crate::mcp::server::webhooks::Webhooks>) {
        let _ = self.shared.webhooks.set(hooks);
    }

    /// Its source as an OAuth protected resource, if it is one
    /// ([`Source::protected_resource`]).
    pub fn protected_resource(&self) -> Option<crate::mcp::source::ProtectedResource> {
        self.shared.source.protected_resource()
    }

    /// The webhooks its source receives, if any ([`Source::webhook_receiver`]).
    pub fn webhook_receiver(&self) -> Option<Arc<dyn crate::mcp::server::webhooks::Receiver>> {
        self.shared.source.webhook_receiver()
    }

    /// This server for one session (a byte-stream connection, an HTTP session or request):
    /// the same server, with its own `resources/subscribe` subscriptions, which end when the
    /// session's handler is dropped.
    pub fn for_session(&self) -> SourceServer {
        self.for_session_on(ConnStreams::default())
    }

    /// [`for_session`](Self::for_session) on a connection whose listen-stream budget `conn`
    /// its subscriptions share (a byte stream's; on HTTP the request's client address's is
    /// used instead).
    pub fn for_session_on(&self, conn: ConnStreams) -> SourceServer {
        SourceServer {
            shared: self.shared.clone(),
            legacy: Arc::new(LegacySubscriptions::on(conn)),
        }
    }

    /// Stamps this server's `_meta["io.modelcontextprotocol/serverInfo"]` on a result's
    /// `_meta`.
    pub fn stamp(&self, meta: &mut Option<rmcp::model::MetaObject>) {
        meta.get_or_insert_with(Default::default)
            .0
            .insert(SERVER_INFO_META_KEY.into(), self.shared.server_info.clone());
    }

    /// [`stamp`](Self::stamp) on a custom result's JSON object.
    fn stamp_json(&self, result: &mut serde_json::Value) {
        if let Some(o) = result.as_object_mut() {
            let meta = o
                .entry("_meta")
                .or_insert_with(|| serde_json::Value::Object(Default::default()));
            if let Some(m) = meta.as_object_mut() {
                m.insert(SERVER_INFO_META_KEY.into(), self.shared.server_info.clone());
            }
        }
    }

    /// The handshake configuration every connection starts from.
    pub(crate) fn config(&self) -> &ServerConfig {
        &self.shared.config
    }

    pub fn limits(&self) -> &Limits {
        &self.shared.limits
    }

    /// Tool `name` as `caller` sees it.
    pub fn tool(&self, caller: &Caller, name: &str) -> Option<Tool> {
        self.shared.source.tool(caller, name)
    }

    /// What the source makes of `caller`'s credentials (see
    /// [`Source::authenticates`](crate::mcp::source::Source::authenticates)); a caller let
    /// in is given the principal the source knows it as ([`Source::known_as`]).
    pub async fn authenticates(&self, caller: &mut Caller) -> crate::mcp::source::Authentication {
        let auth = self.shared.source.authenticates(caller).await;
        if auth == crate::mcp::source::Authentication::Known {
            caller.known_as = self.shared.source.known_as(caller);
        }
        auth
    }

    /// The name this server knows `caller` by (see [`Source::identity`]).
    pub fn identity(&self, caller: &Caller) -> Option<(String, String)> {
        self.shared.source.identity(caller)
    }

    pub fn feed(&self) -> &ChangeFeed {
        &self.shared.feed
    }

    /// The tasks this server runs itself, if it does.
    pub fn tasks(&self) -> Option<&Tasks> {
        match self.shared.tasks.as_ref()? {
            TaskBackend::Local(t) => Some(t),
            TaskBackend::Relayed(_) => None,
        }
    }

    /// Listen streams running now.
    pub fn active_listens(&self) -> usize {
        self.shared.active_listens.load(Ordering::Acquire)
    }

    /// A count of this server's running listen streams for the status board, which does not
    /// keep the server alive (0 once it is gone).
    pub fn listen_count(&self) -> crate::runtime::status::ListenCount {
        let weak = Arc::downgrade(&self.shared);
        Arc::new(move || {
            weak.upgrade()
                .map_or(0, |s| s.active_listens.load(Ordering::Acquire))
        })
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

impl SourceServer {
    /// A read from a role in this process, with no JSON-RPC in between (see
    /// [`call_in_process`](Self::call_in_process)).
    pub async fn read_in_process(
        &self,
        caller: &Caller,
        read: crate::mcp::source::Read<'_>,
    ) -> Result<crate::mcp::source::Contents, SourceError> {
        self.read_cut(caller, read).await.map_err(as_answered)
    }

    /// The one way every read runs, whatever asked: the source's read, cut 2 s into a
    /// shutdown as a plain call is.
    async fn read_cut(
        &self,
        caller: &Caller,
        read: crate::mcp::source::Read<'_>,
    ) -> Result<crate::mcp::source::Contents, McpError> {
        let shutdown = self.shared.shutdown.clone();
        let cut = async move {
            shutdown.cancelled().await;
            tokio::time::sleep(CALL_GRACE).await;
        };
        tokio::select! {
            r = self.shared.source.read(caller, read) => r.map_err(to_mcp_error),
            _ = cut => Err(McpError::internal_error(
                "the server is shutting down; read again once it is back",
                None,
            )),
        }
    }
}

/// rmcp takes a standard method whose params it cannot parse for a custom request; answer it
/// as what it is, a known method with bad params (`-32602`, naming what is wrong), never as
/// an unknown method.
fn misshapen_standard_request(request: &CustomRequest) -> Option<McpError> {
    // The standard methods herald serves; for the others rmcp's own answer stands.
    // `initialize` is left out on purpose: 2026-07-28 removed it, so a request rmcp could not
    // parse as one is answered as an unknown method (-32601, HTTP 404), as the conformance
    // suite's sep-2575 scenario requires.
    const STANDARD: &[&str] = &[
        "server/discover",
        "prompts/list",
        "resources/list",
        "resources/templates/list",
        "resources/read",
        "subscriptions/listen",
        "tools/call",
        "tools/list",
    ];
    let method = request.method.as_str();
    if !STANDARD.contains(&method) {
        return None;
    }
    let params = request.params.clone().unwrap_or(serde_json::Value::Null);
    let why = match method {
        "subscriptions/listen" => match ListenFilter::from_params(Some(&params)) {
            // The tasks gate's answer stands as it is: it comes before any other check.
            Err(e) if e.code == ErrorCode::MISSING_REQUIRED_CLIENT_CAPABILITY => return Some(e),
            r => r.err().map(|e| e.message.into_owned()),
        },
        "tools/call" => serde_json::from_value::<CallToolRequestParams>(params)
            .err()
            .map(|e| e.to_string()),
        "resources/read" => serde_json::from_value::<ReadResourceRequestParams>(params)
            .err()
            .map(|e| e.to_string()),
        _ => None,
    };
    let why = why.unwrap_or_else(|| "params of the wrong shape".into());
    Some(McpError::invalid_params(
        format!(
            "invalid params for {method}: {why}; check the request against the method's schema"
        ),
        Some(json!({"method": method})),
    ))
}

/// An error as a client of this server receives it: what a caller in this process gets
/// from [`SourceServer::call_in_process`], the same as a gateway gets over a connection.
/// (rmcp answers an unknown resource's `-32002` as `-32602` to a 2026-07-28 peer only; a
/// caller in process passes the error on to its own peer, whose revision decides.)
fn as_answered(e: McpError) -> SourceError {
    SourceError::Upstream {
        code: e.code.0,
        message: e.message.into_owned(),
        data: e.data,
    }
}

/// A read's answer: `contents` of `uri` as one text or Base64 blob item with its MIME type.
pub fn read_result(uri: String, contents: crate::mcp::source::Contents) -> ReadResourceResult {
    let rc = match contents.body {
        Body::Text(t) => ResourceContents::text(t, uri),
        Body::Blob(b) => {
            ResourceContents::blob(base64::engine::general_purpose::STANDARD.encode(b), uri)
        }
    }
    .with_mime_type(contents.mime_type);
    ReadResourceResult::new(vec![rc])
}

/// An upstream's error `data` as relayed: an upstream's own step-up (`reason:
/// "insufficient_scope"`, the scope its authorization server grants) is said as
/// `"upstream_insufficient_scope"`, so it is never taken for this server's (an HTTP `403`
/// challenge naming a scope this server's issuers do not grant: the caller cannot mend it).
fn relayed(mut data: Option<serde_json::Value>) -> Option<serde_json::Value> {
    if let Some(reason) = data.as_mut().and_then(|d| d.get_mut("reason"))
        && reason == "insufficient_scope"
    {
        *reason = serde_json::Value::from("upstream_insufficient_scope");
    }
    data
}

/// Maps a source error to JSON-RPC. `uri` is attached as `data.uri` where it applies.
pub fn to_mcp_error(e: SourceError) -> McpError {
    match &e {
        SourceError::NotFound { uri } => {
            McpError::resource_not_found(e.to_string(), Some(json!({ "uri": uri })))
        }
        SourceError::InvalidParams(_)
        | SourceError::UnknownTool(_)
        | SourceError::UnknownPrompt(_) => McpError::invalid_params(e.to_string(), None),
        SourceError::MissingCapability(required) => McpError::new(
            ErrorCode::MISSING_REQUIRED_CLIENT_CAPABILITY,
            e.to_string(),
            Some(json!({ "requiredCapabilities": required })),
        ),
        SourceError::Unavailable(_) => McpError::internal_error(e.to_string(), None),
        SourceError::Forbidden => McpError::new(ErrorCode(-32024), e.to_string(), None),
        SourceError::InsufficientScope { scope, .. } => McpError::new(
            ErrorCode(-32024),
            e.to_string(),
            Some(json!({"reason": "insufficient_scope", "scope": scope})),
        ),
        SourceError::EventNotFound(_) => McpError::new(
            ErrorCode(-32023),
            e.to_string(),
            Some(json!({"kind": "event"})),
        ),
        SourceError::Upstream {
            code,
            message,
            data,
        } => McpError::new(ErrorCode(*code), message.clone(), relayed(data.clone())),
    }
}

/// `events/poll` on `source`. A long poll (`timeoutMs`) ends early on shutdown: the poll is
/// asked again without the wait, so the client gets what is there and a valid cursor, not a
/// dropped request. (A poll consumes nothing, so asking twice is safe.)
async fn poll_until_shutdown(
    source: &DynSource,
    caller: &Caller,
    params: serde_json::Map<String, serde_json::Value>,
    shutdown: &CancellationToken,
) -> Result<serde_json::Value, SourceError> {
    let waits = params
        .get("timeoutMs")
        .and_then(serde_json::Value::as_u64)
        .is_some_and(|t| t > 0);
    if !waits {
        return source.events_poll(caller, params).await;
    }
    tokio::select! {
        r = source.events_poll(caller, params.clone()) => r,
        _ = shutdown.cancelled() => {
            let mut params = params;
            params.remove("timeoutMs");
            source.events_poll(caller, params).await
        }
    }
}

impl SourceServer {
    /// The handshake's capabilities: the Events extension when the source serves events to
    /// this caller.
    async fn config_for_caller(&self, caller: &Caller) -> ServerConfig {
        let mut config = self.shared.config.clone();
        if self.shared.source.events_advertised(caller).await {
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
        context: RequestContext<RoleServer>,
    ) -> Result<DiscoverResult, McpError> {
        Ok(DiscoverResult::from_server_info(
            ServerHandler::supported_protocol_versions(self).into_owned(),
            self.config_for_caller(&Caller::of(&context)).await,
        ))
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, McpError> {
        context.peer.set_peer_info(request.clone());
        let mut info = self.negotiate_initialize(&request)?;
        info.capabilities = self
            .config_for_caller(&Caller::of(&context))
            .await
            .capabilities;
        Ok(info)
    }

    async fn on_custom_request(
        &self,
        request: CustomRequest,
        context: RequestContext<RoleServer>,
    ) -> Result<CustomResult, McpError> {
        let caller = Caller::of(&context);
        if let Some(e) = misshapen_standard_request(&request) {
            return Err(e);
        }
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
                let mut events = source.events_list(&caller).await.map_err(to_mcp_error)?;
                // Webhooks are this server's own (whatever a slug says), for every type it
                // can poll.
                let hooks = self.shared.webhooks.get().is_some();
                for e in &mut events {
                    if let Some(modes) = e.get_mut("delivery").and_then(|d| d.as_array_mut()) {
                        modes.retain(|m| m != "webhook");
                        if hooks && modes.iter().any(|m| m == "poll") {
                            modes.push("webhook".into());
                        }
                    }
                }
                let mut result = json!({"resultType": "complete", "events": events});
                self.stamp_json(&mut result);
                Ok(CustomResult::new(result))
            }
            "events/poll" => {
                let result =
                    poll_until_shutdown(source, &caller, params, &self.shared.shutdown).await;
                let mut result = result.map_err(to_mcp_error)?;
                if let Some(o) = result.as_object_mut() {
                    o.entry("resultType").or_insert_with(|| "complete".into());
                }
                self.stamp_json(&mut result);
                Ok(CustomResult::new(result))
            }
            "events/subscribe" | "events/unsubscribe" => {
                let Some(hooks) = self.shared.webhooks.get() else {
                    return Err(McpError::new(
                        ErrorCode(-32026),
                        "this server takes no webhook subscriptions (its operator sets HERALD_EVENTS_KEY to turn them on); use events/stream or events/poll",
                        Some(json!({"feature": "deliveryMode", "value": "webhook"})),
                    ));
                };
                let mut result = if request.method == "events/subscribe" {
                    hooks.subscribe(self, &caller, params).await?
                } else {
                    hooks.unsubscribe(&caller, params).await?
                };
                self.stamp_json(&mut result);
                Ok(CustomResult::new(result))
            }
            "events/stream" => {
                // In an HTTP session of the `initialize` era rmcp sends a request's
                // notifications to the session's GET stream, not to its own answer.
                let parts = context.extensions.get::<http::request::Parts>();
                // (A session is what decides it, whatever version its requests name.)
                let legacy = parts.is_some_and(|p| p.headers.contains_key("mcp-session-id"));
                if legacy {
                    return Err(McpError::invalid_request(
                        "events/stream needs MCP 2026-07-28 on HTTP (this is an initialize-era session); use events/poll, or send 2026-07-28 requests",
                        None,
                    ));
                }
                // The connection's budget: a byte stream's own (`ConnServer` puts it in the
                // context), an HTTP client address's (in the request's parts); else the
                // server's own, never none.
                let budget = context
                    .extensions
                    .get::<ConnStreams>()
                    .or_else(|| parts.and_then(|p| p.extensions.get::<ConnStreams>()))
                    .cloned()
                    .unwrap_or_else(|| self.shared.unplaced_streams.clone());
                let mut out = stream::PeerEvents::new(&context);
                let result = self
                    .event_stream(&caller, params, &budget, &mut out)
                    .await?;
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
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        let mut r = ListResourcesResult::with_all_items(
            self.shared.source.resources(&Caller::of(&context)),
        );
        self.stamp(&mut r.meta);
        Ok(r)
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        let mut r = ListResourceTemplatesResult::with_all_items(
            self.shared.source.templates(&Caller::of(&context)),
        );
        self.stamp(&mut r.meta);
        Ok(r)
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, McpError> {
        let mut r =
            ListPromptsResult::with_all_items(self.shared.source.prompts(&Caller::of(&context)));
        self.stamp(&mut r.meta);
        Ok(r)
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        // rmcp moves a request's `_meta` into its context.
        let after = crate::mcp::source::read_after_of(Some(&context.meta))
            .or_else(|| crate::mcp::source::read_after_of(request.meta.as_ref()));
        let caller = Caller::of(&context);
        Ok(self.read_plain(&caller, request.uri, after).await?.into())
    }

    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        // This hook has no request context to decide with, and the acknowledgment rmcp builds
        // from it never reaches a client (see `listen`): it echoes the request.
        Some(requested.clone())
    }

    async fn listen(&self, ctx: SubscriptionContext) -> Result<(), McpError> {
        // Only an HTTP listen the gate opened and left to rmcp gets here (byte streams answer
        // every listen ahead of rmcp's dispatch): claim it, and the gate answers it with its
        // own stream in place of rmcp's. One that was not opened is refused, never served
        // unchecked.
        let claim = ctx
            .request_context()
            .extensions
            .get::<http::request::Parts>()
            .and_then(|p| p.extensions.get::<ListenClaim>());
        if claim.is_some_and(ListenClaim::claim) {
            return Ok(());
        }
        warn!("a listen reached the handler without admission; refusing it");
        Err(McpError::internal_error(
            "this listen was not admitted; send it again",
            None,
        ))
    }

    #[allow(deprecated)]
    async fn subscribe(
        &self,
        request: rmcp::model::SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.legacy_subscribe(request.uri, context).await
    }

    #[allow(deprecated)]
    async fn unsubscribe(
        &self,
        request: rmcp::model::UnsubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.legacy.remove(&request.uri).await;
        Ok(())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let mut tools = self.shared.source.tools(&Caller::of(&context)).into_owned();
        if self.shared.tasks.is_none() {
            // A server without the extension runs every tool in place: no listing says a
            // tool may run as a task, and one that can only run as a task is left out.
            tools.retain_mut(|t| crate::mcp::tasks::unmark(t) != TaskSupport::Required);
        }
        let mut r = ListToolsResult::with_all_items(tools);
        self.stamp(&mut r.meta);
        Ok(r)
    }

    /// rmcp asks this, with no request context, only to check HTTP `Mcp-Param-*` headers
    /// against a tool's schema. herald's HTTP gate checks them first, against the tool as the
    /// caller sees it (`transport::http::params`), so rmcp is told of none.
    fn get_tool(&self, _name: &str) -> Option<Tool> {
        None
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        self.call(request, context).await
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, McpError> {
        self.prompt(request, context).await
    }

    async fn complete(
        &self,
        request: CompleteRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, McpError> {
        self.complete(request, context).await
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, McpError> {
        let caller = Caller::of(&context);
        let task = match self.tasks_or_unknown()? {
            TaskBackend::Local(t) => t.get(&caller.principal(), &request.task_id)?,
            TaskBackend::Relayed(r) => r.get(&caller, &request.task_id).await?,
        };
        Ok(GetTaskResult::new(task))
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let caller = Caller::of(&context);
        match self.tasks_or_unknown()? {
            TaskBackend::Local(t) => t.update(
                &caller.principal(),
                &request.task_id,
                request.input_responses,
            ),
            TaskBackend::Relayed(r) => {
                r.update(&caller, &request.task_id, request.input_responses)
                    .await
            }
        }
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let caller = Caller::of(&context);
        match self.tasks_or_unknown()? {
            TaskBackend::Local(t) => t.cancel(&caller.principal(), &request.task_id),
            TaskBackend::Relayed(r) => r.cancel(&caller, &request.task_id).await,
        }
    }
}

impl SourceServer {
    /// rmcp answers `tasks/*` with `-32601` itself when the server does not advertise the
    /// extension; this is only reached when it does.
    fn tasks_or_unknown(&self) -> Result<&TaskBackend, McpError> {
        self.shared.tasks.as_ref().ok_or_else(|| {
            McpError::new(
                ErrorCode::METHOD_NOT_FOUND,
                "this server runs no tasks",
                None,
            )
        })
    }
}

mod calls;
pub mod dispatch;
mod legacy;
mod listens;
mod out;
pub mod stream;
pub mod webhooks;
pub use calls::plain_call;

#[cfg(test)]
#[path = "server_tests.rs"]
mod tests;
