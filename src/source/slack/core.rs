//! What the Slack role's tasks share: the Web API client, the buffer, who the bot is, the
//! conversations it is in, the listens to wake, and the status the tool reports. Every event
//! enters through [`Core::ingest`], whether from the socket or from a backfill.

use crate::sync::{Recover, RecoverRw};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

use serde::Serialize;
use serde_json::Value;
use tokio::sync::Notify;

use super::api::{ApiError, Token, WebApi};
use super::buffer::{Buffer, BufferStats};
use super::filter::{EVENTS_URI, MessageFilter};
use super::message::{BotIdentity, Posted, posted};
use crate::mcp::events::rfc3339;
use crate::mcp::hub::ChangeFeed;
use crate::mcp::ring::now_ms;
use crate::runtime::context::RoleContext;

/// The feed key every insert publishes: long polls wait on it, whatever their arguments.
pub const ANY_EVENT_KEY: &str = EVENTS_URI;

/// The socket's state, as `slack_events_status` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SocketState {
    NotConfigured,
    Connecting,
    Connected,
    Reconnecting,
    /// Slack disabled the app's Socket Mode link: no reconnect until restarted.
    LinkDisabled,
    /// Slack refuses the tokens (revoked, wrong, inactive): retried slowly, but it needs a
    /// person to fix the token.
    AuthFailed,
    /// Shut down.
    Stopped,
    /// On NATS, another process holds the socket lease: this one serves the shared feed and
    /// takes the socket over if the holder goes quiet.
    Standby,
}

/// The socket lease, on NATS (`herald slack --backend nats://…`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct LeaseReport {
    /// This process holds the socket.
    pub held: bool,
    /// Who holds it, as far as this process knows (`host:pid:id`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    /// When this process took it last.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub acquired_at: Option<String>,
    pub takeovers: u64,
    pub lost: u64,
    /// The workspace's stream and how far this process has applied it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stream: Option<String>,
    pub applied_sequence: u64,
}

/// What the last backfill (or settle) pass did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PassReport {
    pub at: String,
    /// What started it: `hello` or `settle`.
    pub reason: &'static str,
    /// The gap it read: from this moment to the pass's start.
    pub from: String,
    pub conversations: usize,
    /// Events it added that the buffer did not hold.
    pub recovered: usize,
    pub web_api_calls: u64,
    pub took_ms: u64,
}

/// The live part of the status.
#[derive(Debug, Clone, Serialize)]
pub struct Status {
    pub state: SocketState,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub socket_opened_at: Option<String>,
    pub sockets_opened: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_socket_error: Option<String>,
    pub envelopes_received: u64,
    pub redeliveries: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_backfill: Option<PassReport>,
    /// Conversations the last pass could not read; the gap is read again next pass.
    pub failed_conversations: Vec<String>,
    /// Conversations Slack will not let the bot read (`{id, reason}`): not retried, and they
    /// do not hold the gap open.
    pub skipped_conversations: Vec<Value>,
    pub backfill_owed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_write_at: Option<String>,
    pub last_write_rows: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_write_error: Option<String>,
    /// The lease, when the feed is shared on NATS.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease: Option<LeaseReport>,
}

impl Default for Status {
    fn default() -> Status {
        Status {
            state: SocketState::Connecting,
            socket_opened_at: None,
            sockets_opened: 0,
            last_socket_error: None,
            envelopes_received: 0,
            redeliveries: 0,
            last_backfill: None,
            failed_conversations: Vec::new(),
            skipped_conversations: Vec::new(),
            backfill_owed: false,
            last_write_at: None,
            last_write_rows: 0,
            last_write_error: None,
            lease: None,
        }
    }
}

/// The time `ms` as RFC 3339.
pub fn at(ms: u64) -> String {
    rfc3339(ms as i64 * 1_000_000)
}

/// Shared by the socket, the backfill, the flusher and the source.
pub struct Core {
    pub api: Arc<WebApi>,
    pub buffer: Buffer,
    pub ctx: RoleContext,
    pub feed: ChangeFeed,
    /// Who the bot is (from `auth.test`, before the first socket).
    pub bot: RwLock<Option<BotIdentity>>,
    /// Conversation id → type (`channel`, `group`, `im`, `mpim`), from `conversations.list`.
    pub conversations: Mutex<HashMap<String, &'static str>>,
    /// Listened URIs with their filters and how many listens hold each.
    pub listens: Mutex<HashMap<String, (MessageFilter, usize)>>,
    pub status: Mutex<Status>,
    /// Wakes the backfill scheduler: a socket said hello.
    pub hello: Notify,
    /// A socket silent this long is pinged; silent 10 s more, it is taken for dead.
    pub socket_idle: std::time::Duration,
    /// Woken by every insert: on NATS, the publisher takes it to the stream at once.
    pub unwritten: Notify,
    /// The buffer holds what it should: at once from the store; on NATS once the stream is
    /// applied through where it was when the process started. Polls and reads wait for it.
    loaded: tokio::sync::watch::Sender<bool>,
}

impl Core {
    pub fn new(api: Arc<WebApi>, buffer: Buffer, ctx: RoleContext) -> Core {
        Core {
            api,
            buffer,
            ctx,
            feed: ChangeFeed::new(),
            bot: RwLock::new(None),
            conversations: Mutex::new(HashMap::new()),
            listens: Mutex::new(HashMap::new()),
            status: Mutex::new(Status::default()),
            hello: Notify::new(),
            socket_idle: std::time::Duration::from_secs(30),
            unwritten: Notify::new(),
            loaded: tokio::sync::watch::channel(true).0,
        }
    }

    /// Polls and reads wait until [`set_loaded`](Self::set_loaded) (a buffer on NATS).
    pub fn loading(self) -> Core {
        self.loaded.send_replace(false);
        self
    }

    /// Whether the buffer holds what it should now.
    pub fn is_loaded(&self) -> bool {
        *self.loaded.borrow()
    }

    /// The buffer has caught up with the shared stream.
    pub fn set_loaded(&self) {
        self.loaded.send_replace(true);
    }

    /// Waits (at most `limit`) until the buffer holds what it should; `false` if it does not
    /// yet.
    pub async fn wait_loaded(&self, limit: std::time::Duration) -> bool {
        let mut rx = self.loaded.subscribe();
        matches!(
            tokio::time::timeout(limit, rx.wait_for(|l| *l)).await,
            Ok(Ok(_))
        )
    }

    pub fn status(&self) -> std::sync::MutexGuard<'_, Status> {
        self.status.locked()
    }

    pub fn bot(&self) -> Option<BotIdentity> {
        self.bot.read_locked().clone()
    }

    /// Asks `auth.test` who the bot is, unless that is known.
    pub async fn identify(&self) -> Result<BotIdentity, ApiError> {
        if let Some(b) = self.bot() {
            return Ok(b);
        }
        let v = self.api.call("auth.test", Token::Bot, &[]).await?;
        let field = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
        let bot = BotIdentity {
            user_id: field("user_id"),
            team_id: field("team_id"),
            bot_id: Some(field("bot_id")).filter(|b| !b.is_empty()),
            workspace_url: field("url"),
        };
        tracing::info!(user_id = %bot.user_id, workspace = %bot.workspace_url, "slack bot identified");
        *self.bot.write_locked() = Some(bot.clone());
        Ok(bot)
    }

    /// A message from Socket Mode (an `events_api` envelope's `payload.event`).
    pub fn ingest_event(&self, event: &Value) -> bool {
        let Some(bot) = self.bot() else { return false };
        let Some(channel) = event.get("channel").and_then(Value::as_str) else {
            return false;
        };
        let channel_type = match event.get("channel_type").and_then(Value::as_str) {
            Some(t) => t.to_owned(),
            None => self
                .conversations
                .locked()
                .get(channel)
                .map(|t| (*t).to_owned())
                .unwrap_or_else(|| "channel".to_owned()),
        };
        match posted(channel, &channel_type, event, &bot) {
            Some(p) => self.ingest(p),
            None => false,
        }
    }

    /// Adds `p` to the buffer and wakes whoever waits for it; `false` if it was held already.
    ///
    /// Inserted first, listens looked up after: a listen admitted after the lookup reads the
    /// event in its first read; one admitted before it is woken.
    pub fn ingest(&self, p: Posted) -> bool {
        let Some(seq) = self.buffer.insert(p) else {
            return false;
        };
        self.unwritten.notify_one();
        self.wake(seq);
        true
    }

    /// Adds `p` under `seq` as the shared stream delivered it, and wakes whoever waits for
    /// it; `false` if it was held already (this process's own, published).
    pub fn apply(&self, seq: u64, p: Posted) -> bool {
        if !self.buffer.insert_at(seq, p) {
            return false;
        }
        self.wake(seq);
        true
    }

    /// Wakes the long polls and the listens `seq` passes.
    fn wake(&self, seq: u64) {
        let Some(held) = self.buffer.get(seq) else {
            return;
        };
        let matching: Vec<String> = {
            let listens = self.listens.locked();
            listens
                .iter()
                .filter(|(_, (f, _))| f.matches(&held.posted))
                .map(|(uri, _)| uri.clone())
                .collect()
        };
        self.feed.publish(ANY_EVENT_KEY);
        for uri in matching {
            if uri != ANY_EVENT_KEY {
                self.feed.publish(&uri);
            }
        }
    }

    /// The buffer's figures with readable times.
    pub fn buffer_status(&self) -> Value {
        let BufferStats {
            events,
            oldest_posted_ms,
            newest_posted_ms,
            evicted_through,
            unwritten_rows,
        } = self.buffer.stats();
        let mut v = serde_json::json!({
            "events": events,
            "evicted_through_cursor": evicted_through.to_string(),
            "unwritten_rows": unwritten_rows,
        });
        if let Some(o) = oldest_posted_ms {
            v["oldest_posted_at"] = at(o).into();
            v["age_s"] = (now_ms().saturating_sub(o) / 1000).into();
        }
        if let Some(n) = newest_posted_ms {
            v["newest_posted_at"] = at(n).into();
        }
        if let Some(l) = self.buffer.live_through() {
            v["live_through"] = at(l).into();
        }
        v
    }
}

/// A listen's hold on one URI: counted in [`Core::listens`] until dropped.
pub struct ListenHold {
    core: Arc<Core>,
    uri: String,
}

impl ListenHold {
    pub fn new(core: Arc<Core>, uri: String, filter: MessageFilter) -> ListenHold {
        core.listens
            .locked()
            .entry(uri.clone())
            .or_insert((filter, 0))
            .1 += 1;
        ListenHold { core, uri }
    }
}

impl Drop for ListenHold {
    fn drop(&mut self) {
        let mut listens = self.core.listens.locked();
        if let Some((_, n)) = listens.get_mut(&self.uri) {
            *n -= 1;
            if *n == 0 {
                listens.remove(&self.uri);
            }
        }
    }
}
