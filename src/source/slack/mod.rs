//! The Slack source (`herald slack`): reference 002's `message_posted`, in full.
//!
//! One Socket Mode connection ([`socket`]) feeds every message the bot sees into a sealed
//! buffer ([`buffer`], [`seal`]) kept in the store; [`backfill`] reads back from history what
//! arrived while no socket was live. The buffer is served two ways, with the same six
//! arguments ([`filter`]): as the MCP Events type `message_posted` (`events/poll`, long polls
//! included) and as the event-log resource `slack-events://message_posted{?…}`, so a watch
//! client gets Slack by push.
//!
//! Until `SLACK_APP_TOKEN`, `SLACK_BOT_TOKEN` and `SLACK_EVENTS_ENCRYPTION_KEY` are all set
//! ([`settings`]) the role is inert: no socket, no Slack call, no event type, no Events
//! extension, and a poll of `message_posted` is `-32023` naming what is missing. The tools
//! (`slack_events_status`, and `slack_post_message` / `slack_conversations` with a bot token)
//! work either way.
//!
//! [`flush`] writes the buffer when it changed (never on a tick). [`core`] is what the tasks
//! share; [`message`] turns a Slack message into the payload (and
//! decides what is never an event); [`api`] is the Web API client.

pub mod api;
pub mod backfill;
pub mod buffer;
pub mod core;
pub mod filter;
pub mod flush;
pub mod message;
pub use crate::store::seal;
pub mod settings;
pub mod shared;
pub mod socket;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rmcp::model::{
    CallToolResult, ContentBlock as Content, JsonObject, Resource, ResourceTemplate, Tool,
    ToolAnnotations,
};
use serde_json::{Value, json};

use self::api::{Token, WebApi};
use self::buffer::{Buffer, Held, MAX_EVENTS};
use self::core::{ANY_EVENT_KEY, Core, ListenHold, SocketState};
use self::filter::{EVENTS_TEMPLATE, EVENTS_URI, MESSAGE_POSTED, MessageFilter};
use self::settings::Settings;
use crate::mcp::events::{self, EventType, NEXT_POLL_MS, PollRequest, encode_cursor, rfc3339};
use crate::mcp::hub::ChangeFeed;
use crate::mcp::ring::{EVENT_LOG_MIME, now_ms};
use crate::mcp::source::{
    Admission, Call, Caller, Contents, ListenFilter, Read, Source, SourceError, SourceInfo,
    WatchGuard, check_args, schema,
};
use crate::runtime::context::RoleContext;
use crate::store::Store;

/// Events a resource read returns (the newest that pass its filter).
const READ_EVENTS: usize = 256;
/// Longest a poll or read waits for a buffer on NATS to load.
const LOAD_WAIT: Duration = Duration::from_secs(10);

/// Why [`Slack::open`] failed.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The sealed buffer could not be read from the store.
    #[error("the Slack buffer: {0}")]
    Store(#[from] crate::store::StoreError),
    /// The shared feed's NATS backend did not answer, or its stream or bucket could not be
    /// opened: it may later.
    #[error("{0}")]
    Nats(String),
}

/// How the role is set up.
#[derive(Debug, Clone)]
pub struct SlackConfig {
    pub settings: Settings,
    /// The Web API's base URL (`https://slack.com/api/`).
    pub api_url: String,
    /// Most events buffered.
    pub max_events: usize,
    /// A Socket Mode connection silent this long is pinged (and taken for dead 10 s later).
    pub socket_idle: Duration,
    /// Inert is what was asked for (`herald up`'s demo, which says so in its banner): said at
    /// info, not as a warning.
    pub inert_expected: bool,
    /// The feed shared on NATS with other processes (`--backend nats://…`); `None`: the
    /// store.
    pub shared: Option<shared::SharedConfig>,
}

impl SlackConfig {
    pub fn new(settings: Settings) -> SlackConfig {
        SlackConfig {
            settings,
            api_url: api::DEFAULT_API_URL.into(),
            max_events: MAX_EVENTS,
            socket_idle: socket::DEFAULT_IDLE,
            inert_expected: false,
            shared: None,
        }
    }
}

/// The Slack source. See the module docs.
pub struct Slack {
    /// `None` until configured (inert).
    core: Option<Arc<Core>>,
    api: Arc<WebApi>,
    missing: Vec<&'static str>,
    retention_days: u64,
    /// The feed when inert (nothing is ever published on it).
    idle_feed: ChangeFeed,
}

impl Slack {
    /// Opens the buffer and starts the socket, the backfill and the flusher on `ctx`, when
    /// configured; otherwise an inert source that makes no Slack call. On NATS the buffer is
    /// the shared stream's, and the socket and backfill run only while this process holds
    /// the lease ([`shared`]); the connection is made here, so a bad address fails the start.
    pub async fn open(
        cfg: SlackConfig,
        store: Store,
        ctx: &RoleContext,
    ) -> Result<Slack, OpenError> {
        // This process holds the Slack secrets from here on: its children never get them.
        for var in [
            settings::APP_TOKEN,
            settings::BOT_TOKEN,
            settings::ENCRYPTION_KEY,
        ] {
            crate::runtime::secrets::register(var);
        }
        let s = &cfg.settings;
        let api = Arc::new(WebApi::new(
            &cfg.api_url,
            s.app_token.clone(),
            s.bot_token.clone(),
        ));
        let missing = s.missing();
        let retention_days = s.retention.as_secs() / 86_400;
        let core = match s.configured() {
            None => {
                let missing = missing.join(", ");
                let what = "slack events are not configured (inert: no socket, no message_posted); set the missing variables in the environment or as files in --credentials DIR, and restart";
                if cfg.inert_expected {
                    tracing::info!(%missing, "{what}");
                } else {
                    tracing::warn!(%missing, "{what}");
                }
                None
            }
            Some(c) => match &cfg.shared {
                None => {
                    let (buffer, loaded) = Buffer::open(store, &c.key, c.retention, cfg.max_events)
                        .await
                        .map_err(OpenError::Store)?;
                    tracing::info!(events = loaded.events, "slack buffer opened");
                    let mut core = Core::new(api.clone(), buffer, ctx.clone());
                    core.socket_idle = cfg.socket_idle;
                    let core = Arc::new(core);
                    let stop = ctx.shutdown().clone();
                    ctx.spawn("slack socket mode", socket::run(core.clone(), stop.clone()));
                    ctx.spawn("slack backfill", backfill::run(core.clone(), stop));
                    ctx.spawn("slack flush", flush::run(core.clone()));
                    Some(core)
                }
                Some(sc) => {
                    let link = shared::Shared::connect(sc.clone(), ctx.metrics())
                        .await
                        .map_err(OpenError::Nats)?;
                    let buffer = Buffer::memory(&c.key, c.retention, cfg.max_events);
                    let mut core = Core::new(api.clone(), buffer, ctx.clone()).loading();
                    core.socket_idle = cfg.socket_idle;
                    let core = Arc::new(core);
                    // Ready while connected and once the stream is applied (before that, a
                    // poll here waits).
                    let (client, weak) = (link.client().clone(), Arc::downgrade(&core));
                    ctx.status().add_backend(
                        "slack nats".into(),
                        sc.nats.redacted(),
                        Arc::new(move || {
                            crate::nats::connected(&client)
                                && weak.upgrade().is_some_and(|c| c.is_loaded())
                        }),
                        ctx.shutdown().clone(),
                    );
                    ctx.spawn("slack nats", shared::run(core.clone(), link));
                    ctx.spawn("slack flush", flush::run(core.clone()));
                    Some(core)
                }
            },
        };
        Ok(Slack {
            core,
            api,
            missing,
            retention_days,
            idle_feed: ChangeFeed::new(),
        })
    }

    /// Whether the event feed runs.
    pub fn configured(&self) -> bool {
        self.core.is_some()
    }

    fn not_configured(&self) -> String {
        format!(
            "Slack events are not configured on this server: set {} (environment, or files in --credentials DIR / $CREDENTIALS_DIRECTORY) and restart herald slack",
            self.missing.join(", ")
        )
    }

    fn core(&self) -> Result<&Arc<Core>, SourceError> {
        self.core
            .as_ref()
            .ok_or_else(|| SourceError::Unavailable(self.not_configured()))
    }

    /// The core once its buffer holds what it should (on NATS: the stream applied).
    async fn loaded_core(&self) -> Result<&Arc<Core>, SourceError> {
        let core = self.core()?;
        if !core.wait_loaded(LOAD_WAIT).await {
            return Err(SourceError::Unavailable(format!(
                "the Slack feed is still loading from NATS ({}); try again in a moment, and see slack_events_status",
                core.status()
                    .last_socket_error
                    .clone()
                    .unwrap_or_else(|| "waiting for Slack's auth.test and the stream".into())
            )));
        }
        Ok(core)
    }

    /// What `slack_events_status` reports. Never a secret: only names of variables.
    pub fn status(&self) -> Value {
        let Some(core) = &self.core else {
            return json!({
                "state": SocketState::NotConfigured,
                "missing": self.missing,
                "bot_token": self.api.has_bot_token(),
                "retention_days": self.retention_days,
            });
        };
        let mut v = serde_json::to_value(&*core.status()).unwrap_or_default();
        v["buffer"] = core.buffer_status();
        v["retention_days"] = self.retention_days.into();
        v["missing"] = json!([]);
        v["web_api_calls"] = core.api.calls().into();
        if let Some(bot) = core.bot() {
            v["bot_user_id"] = bot.user_id.into();
            v["workspace_url"] = bot.workspace_url.into();
        }
        v
    }
}

/// One event as `events/poll` returns it.
fn poll_event(h: &Held) -> Value {
    json!({
        "eventId": h.posted.event_id(),
        "name": MESSAGE_POSTED,
        "timestamp": rfc3339(h.posted.posted_ms() as i64 * 1_000_000),
        "data": serde_json::from_str::<Value>(&h.json).unwrap_or(Value::Null),
    })
}

/// The event-log read of `events`.
fn event_log(events: &[Held]) -> String {
    let mut out = String::from("{\"events\":[");
    for (i, h) in events.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        // `{"seq":…,"type":"message_posted","id":…,` + the payload's own fields.
        out.push_str(&format!(
            "{{\"seq\":{},\"type\":\"{MESSAGE_POSTED}\",\"id\":{},",
            h.seq,
            Value::from(h.posted.event_id())
        ));
        out.push_str(&h.json[1..]);
    }
    out.push_str("]}");
    out
}

fn message_posted() -> EventType {
    EventType {
        name: MESSAGE_POSTED,
        description: "A message posted in a channel, a private channel or a DM the bot is in \
            (never the bot's own posts, edits, deletes, joins, topic changes, hidden subtypes or \
            group DMs). The event id is slack:<channel_id>:<ts>. Every argument only narrows; \
            an unknown one is refused. The same selection is the push resource \
            slack-events://message_posted{?addressed_to_bot,channel_ids,include_dms,thread_ts,top_level_only,include_bot_authors}."
            .into(),
        input_schema: json!({
            "type": "object",
            "properties": {
                "addressed_to_bot": {"type": "boolean", "description": "only DMs to the bot and messages mentioning it"},
                "channel_ids": {"description": "only these conversations (an array of ids, or one comma-separated string)",
                                "anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "string"}]},
                "include_dms": {"type": "boolean", "default": true, "description": "false drops DMs"},
                "thread_ts": {"type": "string", "description": "only this thread: its parent and its replies"},
                "top_level_only": {"type": "boolean", "description": "only messages that are not thread replies"},
                "include_bot_authors": {"type": "boolean", "default": true, "description": "false drops bot and integration posts"}
            },
            "additionalProperties": false
        }),
        payload_schema: json!({
            "type": "object",
            "properties": {
                "channel_id": {"type": "string"},
                "channel_type": {"type": "string", "enum": ["channel", "group", "im"]},
                "ts": {"type": "string"},
                "thread_ts": {"type": "string", "description": "on a thread reply only"},
                "user_id": {"type": "string", "description": "absent on a bot or integration post"},
                "bot_id": {"type": "string"},
                "username": {"type": "string"},
                "is_dm": {"type": "boolean"},
                "mentions_bot": {"type": "boolean"},
                "permalink": {"type": "string"},
                "text": {"type": "string", "description": "Slack mrkdwn, at most 4,000 characters"}
            },
            "required": ["channel_id", "channel_type", "ts", "is_dm", "mentions_bot", "permalink", "text"]
        }),
    }
}

fn str_arg(args: &JsonObject, key: &str) -> Result<Option<String>, SourceError> {
    match args.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if !s.is_empty() => Ok(Some(s.clone())),
        Some(other) => Err(SourceError::InvalidParams(format!(
            "{key} must be a non-empty string, got {other}"
        ))),
    }
}

fn api_error(e: api::ApiError) -> SourceError {
    match e {
        api::ApiError::NoToken { .. } => SourceError::Unavailable(e.to_string()),
        api::ApiError::Slack { ref error, .. }
            if matches!(
                error.as_str(),
                "channel_not_found"
                    | "not_in_channel"
                    | "invalid_arguments"
                    | "no_text"
                    | "thread_not_found"
            ) =>
        {
            SourceError::InvalidParams(e.to_string())
        }
        other => SourceError::Unavailable(other.to_string()),
    }
}

impl Slack {
    async fn run_call(
        &self,
        _caller: &Caller,
        name: &str,
        args: JsonObject,
        _call: Call,
    ) -> Result<rmcp::model::CallToolResult, SourceError> {
        match name {
            "slack_events_status" => {
                check_args(&args, &[])?;
                let status = self.status();
                let mut r = CallToolResult::success(vec![Content::text(
                    serde_json::to_string_pretty(&status).unwrap_or_default(),
                )]);
                r.structured_content = Some(status);
                Ok(r)
            }
            "slack_post_message" => {
                check_args(&args, &["channel", "text", "thread_ts"])?;
                let channel = str_arg(&args, "channel")?.ok_or_else(|| {
                    SourceError::InvalidParams(
                        "missing argument channel (a conversation id)".into(),
                    )
                })?;
                let text = str_arg(&args, "text")?
                    .ok_or_else(|| SourceError::InvalidParams("missing argument text".into()))?;
                let thread = str_arg(&args, "thread_ts")?;
                let mut params = vec![("channel", channel.as_str()), ("text", text.as_str())];
                if let Some(t) = &thread {
                    params.push(("thread_ts", t));
                }
                let v = self
                    .api
                    .call("chat.postMessage", Token::Bot, &params)
                    .await
                    .map_err(api_error)?;
                let ts = v.get("ts").and_then(Value::as_str).unwrap_or("").to_owned();
                let mut r = CallToolResult::success(vec![Content::text(format!(
                    "posted to {channel} at {ts}"
                ))]);
                r.structured_content = Some(json!({"channel": channel, "ts": ts}));
                Ok(r)
            }
            "slack_conversations" => {
                check_args(&args, &[])?;
                let mut out = Vec::new();
                self.api
                    .pages(
                        "users.conversations",
                        &[
                            ("types", "public_channel,private_channel,mpim,im"),
                            ("exclude_archived", "true"),
                            ("limit", "200"),
                        ],
                        |page| {
                            for c in page
                                .get("channels")
                                .and_then(Value::as_array)
                                .into_iter()
                                .flatten()
                            {
                                out.push(json!({
                                    "id": c.get("id"),
                                    "name": c.get("name").or(c.get("user")),
                                    "type": message::conversation_type(c),
                                }));
                            }
                        },
                    )
                    .await
                    .map_err(api_error)?;
                let v = json!({ "conversations": out });
                let mut r = CallToolResult::success(vec![Content::text(v.to_string())]);
                r.structured_content = Some(v);
                Ok(r)
            }
            other => Err(SourceError::UnknownTool(other.to_owned())),
        }
    }
}

#[async_trait]
impl Source for Slack {
    fn info(&self) -> SourceInfo {
        SourceInfo {
            name: "slack".into(),
            instructions: Some(if self.configured() {
                "Slack messages the bot sees, as the MCP Events type message_posted (events/poll) \
                 and as the event-log resource slack-events://message_posted{?…} (watch it for push). \
                 slack_events_status says how the feed is doing."
                    .into()
            } else {
                format!(
                    "Slack events are not configured ({} missing); slack_events_status says what to set.",
                    self.missing.join(", ")
                )
            }),
            ..SourceInfo::default()
        }
    }

    fn resources(&self, _caller: &Caller) -> Vec<Resource> {
        if !self.configured() {
            return Vec::new();
        }
        vec![
            Resource::new(EVENTS_URI, "slack messages")
                .with_mime_type(EVENT_LOG_MIME)
                .with_description(
                    "Event log of message_posted: every message the bot sees (newest 256 in a read). \
                     Narrow it with the template's arguments.\n\
                     Example: await watch_start(name=\"slack\", uri=\"slack-events://message_posted?addressed_to_bot=true\")",
                ),
        ]
    }

    fn templates(&self, _caller: &Caller) -> Vec<ResourceTemplate> {
        if !self.configured() {
            return Vec::new();
        }
        vec![
            ResourceTemplate::new(EVENTS_TEMPLATE, "slack messages, narrowed")
                .with_mime_type(EVENT_LOG_MIME)
                .with_description(
                    "message_posted narrowed by its arguments (each only narrows): addressed_to_bot, \
                     channel_ids (comma-separated), include_dms, thread_ts, top_level_only, include_bot_authors.\n\
                     Example: await watch_start(name=\"ops\", uri=\"slack-events://message_posted?channel_ids=C0123ABCD&top_level_only=true\")",
                ),
        ]
    }

    /// Slack's log is its recent buffer, not a ring: the reader's hint is not needed.
    async fn read(&self, _caller: &Caller, read: Read<'_>) -> Result<Contents, SourceError> {
        let filter = MessageFilter::from_uri(read.uri)?;
        let core = self.loaded_core().await?;
        let events = core.buffer.recent(&filter, READ_EVENTS);
        Ok(Contents::text(EVENT_LOG_MIME, event_log(&events)))
    }

    async fn admit(&self, _caller: &Caller, filter: &ListenFilter) -> Admission {
        let mut admission = Admission::default();
        for uri in filter.uris() {
            let parsed = MessageFilter::from_uri(&uri).and_then(|f| self.core().map(|c| (f, c)));
            match parsed {
                Ok((f, core)) => {
                    let key = f.uri();
                    let hold = ListenHold::new(core.clone(), key.clone(), f);
                    admission.accept(&uri, key, WatchGuard::new(hold));
                }
                Err(e) => admission.refuse(&uri, e),
            }
        }
        admission
    }

    fn changes(&self) -> ChangeFeed {
        match &self.core {
            Some(c) => c.feed.clone(),
            None => self.idle_feed.clone(),
        }
    }

    fn tools(&self, _caller: &Caller) -> std::borrow::Cow<'_, [Tool]> {
        static LIST: std::sync::LazyLock<Vec<Tool>> = std::sync::LazyLock::new(|| {
            vec![
            Tool::new(
                "slack_events_status",
                "How the Slack event feed is doing: state (not_configured, connecting, connected, \
                 reconnecting, link_disabled, stopped), when the socket opened, the last backfill and \
                 what it recovered, conversations it could not read, the buffer's size and age, the \
                 last write, and the names of missing variables (never their values).",
                schema(json!({"type": "object", "properties": {}, "additionalProperties": false})),
            )
            .annotate(ToolAnnotations::new().read_only(true)),
            Tool::new(
                "slack_post_message",
                "Post `text` (Slack mrkdwn) to conversation `channel` as the bot; `thread_ts` replies \
                 in that thread. Needs SLACK_BOT_TOKEN. The bot's own posts never become message_posted events.",
                schema(json!({
                    "type": "object",
                    "properties": {
                        "channel": {"type": "string", "description": "conversation id, e.g. C0123ABCD or D0123ABCD"},
                        "text": {"type": "string"},
                        "thread_ts": {"type": "string", "description": "reply in this thread"}
                    },
                    "required": ["channel", "text"],
                    "additionalProperties": false
                })),
            )
            .annotate(ToolAnnotations::new().read_only(false).destructive(false)),
            Tool::new(
                "slack_conversations",
                "The conversations the bot is in (public and private channels, DMs): id, name, type. Needs SLACK_BOT_TOKEN.",
                schema(json!({"type": "object", "properties": {}, "additionalProperties": false})),
            )
            .annotate(ToolAnnotations::new().read_only(true)),
        ]
        });
        std::borrow::Cow::Borrowed(&LIST)
    }

    async fn call_tool(
        &self,
        caller: &Caller,
        name: &str,
        args: JsonObject,
        call: Call,
    ) -> Result<rmcp::model::CallToolResponse, SourceError> {
        self.run_call(caller, name, args, call)
            .await
            .map(Into::into)
    }

    async fn events_advertised(&self, _caller: &Caller) -> bool {
        self.configured()
    }

    async fn events_list(&self, _caller: &Caller) -> Result<Vec<Value>, SourceError> {
        Ok(if self.configured() {
            vec![message_posted().to_json()]
        } else {
            Vec::new()
        })
    }

    async fn events_poll(
        &self,
        _caller: &Caller,
        params: JsonObject,
    ) -> Result<Value, SourceError> {
        let req = PollRequest::parse(&params)?;
        if req.name != MESSAGE_POSTED {
            return Err(events::unknown_event(&req.name));
        }
        if self.core.is_none() {
            return Err(SourceError::EventNotFound(self.not_configured()));
        }
        let filter = MessageFilter::from_arguments(&req.arguments)?;
        let core = self.loaded_core().await?;
        Ok(poll(core, &filter, &req).await)
    }
}

/// Answers a poll; with a cursor and a `timeoutMs`, waits for an event that passes `filter`.
async fn poll(core: &Core, filter: &MessageFilter, req: &PollRequest) -> Value {
    let Some(cursor) = req.cursor else {
        return json!({
            "events": [],
            "cursor": encode_cursor(core.buffer.head()),
            "truncated": false,
            "hasMore": false,
            "nextPollMs": NEXT_POLL_MS,
        });
    };
    let deadline = tokio::time::Instant::now() + req.timeout;
    // Registered before the first look, so an insert in between wakes the wait.
    let registration =
        (!req.timeout.is_zero()).then(|| core.feed.register(&[ANY_EVENT_KEY.to_owned()]));
    loop {
        let not_before = req
            .max_age
            .map_or(0, |a| now_ms().saturating_sub(a.as_millis() as u64));
        let page = core
            .buffer
            .since(cursor, filter, req.max_events, not_before);
        let waited_out = tokio::time::Instant::now() >= deadline;
        if !page.events.is_empty() || registration.is_none() || waited_out {
            return json!({
                "events": page.events.iter().map(poll_event).collect::<Vec<_>>(),
                "cursor": encode_cursor(page.cursor),
                "truncated": page.truncated,
                "hasMore": page.has_more,
                "nextPollMs": if page.has_more { 0 } else { NEXT_POLL_MS },
            });
        }
        if let Some(reg) = &registration {
            let _ = tokio::time::timeout_at(deadline, reg.queue().next_batch()).await;
        }
    }
}
