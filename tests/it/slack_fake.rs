//! A fake Slack that herald's Slack source talks to over real sockets: the Web API over HTTP
//! (`{base}/api/<method>`, axum) and Socket Mode over a real WebSocket (tokio-tungstenite, on
//! its own listener, admitting only tickets that `apps.connections.open` handed out). Tests
//! shape the workspace (channels, members, posts of every kind) and Slack's moods (rate
//! limits, refreshes, dropped sockets, outages, redeliveries) directly through [`FakeSlack`],
//! and await its state with [`FakeSlack::wait_until`], never a sleep. Field names follow Slack's
//! own SDKs (docs/crates-and-fakes.md §8). It depends on nothing else under `tests/it`, so a
//! bench can include it with `#[path = "../it/slack_fake.rs"] mod slack_fake;`.
//!
//! Web API methods: `apps.connections.open`, `auth.test`, `conversations.list`, `.info`,
//! `.history`, `.replies`, `chat.postMessage`, `chat.getPermalink`, `users.info`; any other
//! answers `unknown_method`. What it does not speak: TLS (`http://` and `ws://` only),
//! automatic redelivery (Slack retries an unacked event, or one that found no socket, after a
//! few seconds; here a test calls [`FakeSlack::redeliver_last`]), server pings,
//! `slash_commands` and `interactive` envelopes, archived channels, scopes.

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::response::Response;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use futures::{SinkExt as _, StreamExt as _};
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, mpsc};
use tokio_tungstenite::tungstenite::handshake::server::{
    ErrorResponse, Request as WsRequest, Response as WsResponse,
};
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::{Message, http};

/// The bot token (`xoxb-…`) every Web API method but `apps.connections.open` wants.
pub const BOT_TOKEN: &str = "xoxb-1-fake-bot-token";
/// The app-level token (`xapp-…`) `apps.connections.open` wants.
pub const APP_TOKEN: &str = "xapp-1-A1-fake-app-token";
pub const TEAM_ID: &str = "T1";
pub const TEAM_NAME: &str = "Fake Team";
/// The workspace URL `auth.test` reports; permalinks are built on it.
pub const TEAM_URL: &str = "https://fake-team.slack.com/";
pub const APP_ID: &str = "A1";
/// The bot's user id: its own posts carry `user: UBOT` and `bot_id: BBOT`.
pub const BOT_USER: &str = "UBOT";
pub const BOT_ID: &str = "BBOT";
pub const BOT_NAME: &str = "herald";

/// How long [`FakeSlack::wait_until`] waits (the fake is shared with a bench, so it has its own).
const WAIT: Duration = Duration::from_secs(30);
/// Slack's default and largest `limit` for the `conversations.*` methods.
const DEFAULT_LIMIT: usize = 100;
const MAX_LIMIT: usize = 1000;

/// A method's parameters as the fake received them (query string, form or JSON body; the
/// token left out).
pub type Params = BTreeMap<String, String>;

/// An `events_api` envelope written to a socket: its event's ts and the moment the fake began
/// writing its frame (see [`FakeSlack::on_written`]).
pub type Written = (String, Instant);

/// What a conversation is. An IM is the bot's DM with that user; an MPIM's members are listed.
#[derive(Clone, Debug, PartialEq)]
pub enum Kind {
    Public,
    Private,
    Im(String),
    Mpim(Vec<String>),
}

impl Kind {
    /// `channel_type` in a message event.
    fn channel_type(&self) -> &'static str {
        match self {
            Kind::Public => "channel",
            Kind::Private => "group",
            Kind::Im(_) => "im",
            Kind::Mpim(_) => "mpim",
        }
    }

    /// The name `conversations.list` filters on (`types=`).
    fn list_type(&self) -> &'static str {
        match self {
            Kind::Public => "public_channel",
            Kind::Private => "private_channel",
            Kind::Im(_) => "im",
            Kind::Mpim(_) => "mpim",
        }
    }
}

/// A message that is not a plain post, for [`FakeSlack::post_subtype`]. Every one is delivered
/// over the socket (when the bot is in the channel); the hidden ones change history rather
/// than add to it, as in Slack.
#[derive(Clone, Copy)]
pub enum Sub<'a> {
    /// `message_changed` (hidden): message `ts` now reads `text`, edited in place in history.
    Changed { ts: &'a str, text: &'a str },
    /// `message_deleted` (hidden): message `ts` leaves history (a thread parent with replies
    /// stays as a `tombstone`).
    Deleted { ts: &'a str },
    /// `message_replied` (hidden): Slack's notice that thread `thread_ts` changed; not in
    /// history.
    Replied { thread_ts: &'a str },
    /// `channel_join`: `user` joined; lands in history.
    Join { user: &'a str },
    /// `channel_topic`: `user` set the topic; lands in history.
    Topic { user: &'a str, topic: &'a str },
    /// A visible message with another subtype (`file_share`, `me_message`, …); lands in
    /// history.
    Other {
        subtype: &'a str,
        user: &'a str,
        text: &'a str,
    },
}

// === State ===

/// Everything the fake knows, behind one lock. Tests read it through the accessors here (in
/// [`FakeSlack::wait_until`]) or their mirrors on [`FakeSlack`].
pub struct SlackState {
    ws_addr: SocketAddr,
    /// The newest ts handed out, in microseconds: every ts is unique and later than all before.
    last_ts: u64,
    channels: Vec<Channel>,
    users: BTreeMap<String, String>,
    /// Caps every page (`usize::MAX`: the client's `limit` alone decides).
    page_size: usize,
    latency: Duration,
    /// Method → (Retry-After seconds, how many more calls get a 429).
    rate_limits: BTreeMap<String, (u64, usize)>,
    /// Method → every call's parameters, in order (rate-limited calls included).
    requests: BTreeMap<String, Vec<Params>>,
    /// Method → when each call came and whether it got a 429, in order.
    call_times: BTreeMap<String, Vec<(std::time::Instant, bool)>>,
    /// Tickets handed out by `apps.connections.open` and not yet used (each admits one socket).
    tickets: HashSet<String>,
    next_id: u64,
    down: bool,
    deliver: bool,
    /// Sockets whose connection task is still running, oldest first.
    sockets: Vec<Socket>,
    sockets_opened: usize,
    /// The most sockets ever open at once (a closing one counts until it is gone).
    most_sockets_open: usize,
    refused: usize,
    /// Every envelope sent over a socket, redeliveries included, in order.
    envelopes: Vec<Value>,
    /// The `envelope_id` of every ack received, in order.
    acks: Vec<String>,
    /// Frames from clients that were not acks.
    other_frames: Vec<String>,
    /// Told of every envelope once written, when a bench asked ([`FakeSlack::on_written`]).
    written: Option<mpsc::UnboundedSender<Written>>,
}

struct Channel {
    id: String,
    name: String,
    kind: Kind,
    member: bool,
    created: u64,
    topic: String,
    /// ts (µs) → the message as `conversations.history` shows it (replies included, by their
    /// `thread_ts`).
    messages: BTreeMap<u64, Value>,
}

struct Socket {
    id: usize,
    tx: mpsc::UnboundedSender<Out>,
    /// Still receiving envelopes (false once the fake has closed or dropped it).
    live: bool,
}

/// What the fake tells one socket's task to do.
enum Out {
    Text(String),
    /// Send this envelope, then tell the hook its event's ts and when it was written.
    Stamped(String, String, mpsc::UnboundedSender<Written>),
    /// Send this text, then a close frame, then wait for the client to finish the close.
    Close(String),
    /// End the TCP connection with no close frame.
    Abort,
    /// Go silent: read nothing (so no pong) and send nothing, with the TCP connection left
    /// open, as a socket behind a dead NAT entry looks.
    Freeze,
}

impl SlackState {
    pub fn sockets_opened(&self) -> usize {
        self.sockets_opened
    }

    /// Sockets whose connection has not ended yet (a closing one counts until it is gone).
    pub fn sockets_open(&self) -> usize {
        self.sockets.len()
    }

    /// The most sockets that were ever open at once.
    pub fn most_sockets_open(&self) -> usize {
        self.most_sockets_open
    }

    /// WebSocket upgrades refused (unknown or reused ticket, or Slack down).
    pub fn refused(&self) -> usize {
        self.refused
    }

    pub fn acks(&self) -> &[String] {
        &self.acks
    }

    pub fn acked(&self, envelope_id: &str) -> bool {
        self.acks.iter().any(|a| a == envelope_id)
    }

    pub fn envelopes(&self) -> &[Value] {
        &self.envelopes
    }

    pub fn other_frames(&self) -> &[String] {
        &self.other_frames
    }

    /// Calls of a Web API method so far, the rate-limited ones included.
    pub fn calls(&self, method: &str) -> usize {
        self.requests.get(method).map_or(0, Vec::len)
    }

    pub fn requests(&self, method: &str) -> &[Params] {
        self.requests.get(method).map_or(&[], Vec::as_slice)
    }

    /// Whether a call of `method` answered 429 was made again later for the same
    /// `channel`.
    pub fn retried_after_429(&self, method: &str) -> bool {
        let times = self.call_times.get(method).map_or(&[][..], Vec::as_slice);
        let params = self.requests(method);
        times
            .iter()
            .position(|(_, limited)| *limited)
            .is_some_and(|i| {
                params.get(i).is_some_and(|p| {
                    params[i + 1..]
                        .iter()
                        .any(|q| q.get("channel") == p.get("channel"))
                })
            })
    }

    fn new(ws_addr: SocketAddr) -> SlackState {
        SlackState {
            ws_addr,
            last_ts: 0,
            channels: Vec::new(),
            users: BTreeMap::from([(BOT_USER.to_owned(), BOT_NAME.to_owned())]),
            page_size: usize::MAX,
            latency: Duration::ZERO,
            rate_limits: BTreeMap::new(),
            requests: BTreeMap::new(),
            call_times: BTreeMap::new(),
            tickets: HashSet::new(),
            next_id: 0,
            down: false,
            deliver: true,
            sockets: Vec::new(),
            sockets_opened: 0,
            most_sockets_open: 0,
            refused: 0,
            envelopes: Vec::new(),
            acks: Vec::new(),
            other_frames: Vec::new(),
            written: None,
        }
    }

    /// A fresh ts from the real clock, strictly after every ts so far.
    fn next_ts(&mut self) -> u64 {
        let now = u64::try_from(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_micros(),
        )
        .unwrap();
        self.last_ts = now.max(self.last_ts + 1);
        self.last_ts
    }

    fn next_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn channel(&self, id: &str) -> Option<&Channel> {
        self.channels.iter().find(|c| c.id == id)
    }

    fn channel_mut(&mut self, id: &str) -> &mut Channel {
        self.channels
            .iter_mut()
            .find(|c| c.id == id)
            .unwrap_or_else(|| panic!("the fake Slack has no channel {id}: add_channel it first"))
    }

    /// Stores `msg` in `channel` at `at` (or now), as a reply in `thread`'s thread if that
    /// message exists, and delivers it over the socket when `live` and the bot is a member.
    fn add(
        &mut self,
        channel: &str,
        mut msg: Value,
        thread: Option<u64>,
        at: Option<u64>,
        live: bool,
    ) -> u64 {
        let ts = match at {
            Some(ts) => {
                self.last_ts = self.last_ts.max(ts);
                ts
            }
            None => self.next_ts(),
        };
        let ch = self.channel_mut(channel);
        assert!(
            !ch.messages.contains_key(&ts),
            "{channel} already has a message at {}",
            fmt_ts(ts)
        );
        msg["ts"] = json!(fmt_ts(ts));
        let root = thread.and_then(|t| ch.messages.get(&t).map(|m| thread_of(t, m)));
        if let Some(root) = root {
            msg["thread_ts"] = json!(fmt_ts(root));
            if let Some(u) = ch.messages.get(&root).and_then(|p| p["user"].as_str()) {
                msg["parent_user_id"] = json!(u);
            }
        }
        ch.messages.insert(ts, msg.clone());
        if let Some(root) = root {
            recount(ch, root);
        }
        let member = ch.member;
        let event = ch.event(msg);
        if live && member {
            self.deliver(event);
        }
        ts
    }

    fn subtype(&mut self, channel: &str, sub: Sub) -> u64 {
        // The visible ones are messages like any other.
        let visible = match sub {
            Sub::Join { user } => Some(json!({"type": "message", "subtype": "channel_join",
                "user": user, "text": format!("<@{user}> has joined the channel")})),
            Sub::Topic { user, topic } => {
                self.channel_mut(channel).topic = topic.to_owned();
                Some(
                    json!({"type": "message", "subtype": "channel_topic", "user": user,
                    "topic": topic, "text": format!("set the channel topic: {topic}")}),
                )
            }
            Sub::Other {
                subtype,
                user,
                text,
            } => Some(json!({"type": "message", "subtype": subtype, "user": user,
                "text": text, "team": TEAM_ID})),
            Sub::Changed { .. } | Sub::Deleted { .. } | Sub::Replied { .. } => None,
        };
        if let Some(msg) = visible {
            return self.add(channel, msg, None, None, true);
        }
        // The hidden ones: an event with its own ts about an existing message, which changes
        // history rather than adding to it.
        let (Sub::Changed { ts, .. } | Sub::Deleted { ts } | Sub::Replied { thread_ts: ts }) = sub
        else {
            unreachable!("the visible subtypes returned above");
        };
        let target = parse_ts(ts).unwrap_or_else(|| panic!("not a Slack ts: {ts}"));
        let now = self.next_ts();
        let ch = self.channel_mut(channel);
        let previous = ch.messages.get(&target).cloned().unwrap_or_else(|| {
            panic!("{channel} has no message at {ts}");
        });
        let mut event = json!({"type": "message", "hidden": true, "ts": fmt_ts(now)});
        match sub {
            Sub::Changed { text, .. } => {
                let m = ch.messages.get_mut(&target).unwrap();
                m["text"] = json!(text);
                m["edited"] = json!({"user": author(m), "ts": fmt_ts(now)});
                event["subtype"] = json!("message_changed");
                event["message"] = m.clone();
                event["previous_message"] = previous;
            }
            Sub::Deleted { .. } => {
                let root = thread_of(target, &previous);
                if root == target && previous.get("reply_count").is_some() {
                    let m = ch.messages.get_mut(&target).unwrap();
                    *m = json!({"type": "message", "subtype": "tombstone", "hidden": true,
                        "user": "USLACKBOT", "text": "This message was deleted.",
                        "ts": m["ts"], "thread_ts": m["thread_ts"], "reply_count": m["reply_count"],
                        "reply_users": m["reply_users"], "reply_users_count": m["reply_users_count"],
                        "latest_reply": m["latest_reply"]});
                } else {
                    ch.messages.remove(&target);
                    if root != target {
                        recount(ch, root);
                    }
                }
                event["subtype"] = json!("message_deleted");
                event["deleted_ts"] = json!(ts);
                event["previous_message"] = previous;
            }
            _ => {
                event["subtype"] = json!("message_replied");
                event["message"] = previous;
            }
        }
        let member = ch.member;
        let event = ch.event(event);
        if member {
            self.deliver(event);
        }
        now
    }

    /// Wraps `event` in an `events_api` envelope and sends it to one socket, unless delivery
    /// is off or no socket is live (then the message is only in history).
    fn deliver(&mut self, event: Value) {
        if !self.deliver {
            return;
        }
        let n = self.next_id();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let envelope = json!({
            "envelope_id": envelope_id(n),
            "type": "events_api",
            "accepts_response_payload": false,
            "retry_attempt": 0,
            "retry_reason": "",
            "payload": {
                "token": "fake-verification-token",
                "team_id": TEAM_ID,
                "context_team_id": TEAM_ID,
                "context_enterprise_id": null,
                "api_app_id": APP_ID,
                "event": event,
                "type": "event_callback",
                "event_id": format!("Ev{n:08}"),
                "event_time": now,
                "authorizations": [{"enterprise_id": null, "team_id": TEAM_ID,
                    "user_id": BOT_USER, "is_bot": true, "is_enterprise_install": false}],
                "is_ext_shared_channel": false,
                "event_context": format!("4-fake-{n}"),
            },
        });
        self.send_envelope(envelope);
    }

    /// Slack spreads an app's events over its connections; the fake sends each to the newest
    /// live socket. False when there is none.
    fn send_envelope(&mut self, envelope: Value) -> bool {
        let Some(socket) = self.sockets.iter().rev().find(|s| s.live) else {
            return false;
        };
        let text = envelope.to_string();
        let out = match (&self.written, envelope.pointer("/payload/event/ts")) {
            (Some(hook), Some(Value::String(ts))) => Out::Stamped(text, ts.clone(), hook.clone()),
            _ => Out::Text(text),
        };
        let _ = socket.tx.send(out);
        self.envelopes.push(envelope);
        true
    }

    fn redeliver_last(&mut self) -> Option<String> {
        let mut envelope = self.envelopes.last()?.clone();
        let id = envelope_id(self.next_id());
        envelope["envelope_id"] = json!(id);
        envelope["retry_attempt"] = json!(envelope["retry_attempt"].as_u64().unwrap_or(0) + 1);
        envelope["retry_reason"] = json!("timeout");
        self.send_envelope(envelope).then_some(id)
    }

    fn disconnect(&mut self, reason: &str) {
        let msg = json!({"type": "disconnect", "reason": reason,
            "debug_info": {"host": "applink-fake"}})
        .to_string();
        // Slack closes the link itself on these; on `warning` and `refresh_requested` it waits
        // for the client to open a new connection and close the old one.
        let closes = matches!(reason, "link_disabled" | "too_many_websockets");
        for s in self.sockets.iter_mut().filter(|s| s.live) {
            if closes {
                s.live = false;
                let _ = s.tx.send(Out::Close(msg.clone()));
            } else {
                let _ = s.tx.send(Out::Text(msg.clone()));
            }
        }
    }

    fn drop_sockets(&mut self) {
        for s in &mut self.sockets {
            s.live = false;
            let _ = s.tx.send(Out::Abort);
        }
    }

    fn record_frame(&mut self, text: &str) {
        match serde_json::from_str::<Value>(text) {
            Ok(v) if v.get("type").is_none() && v["envelope_id"].is_string() => {
                self.acks
                    .push(v["envelope_id"].as_str().unwrap().to_owned());
            }
            _ => self.other_frames.push(text.to_owned()),
        }
    }

    // --- the Web API ---

    fn call(
        &mut self,
        method: &str,
        token: Option<&str>,
        p: &Params,
    ) -> Result<Value, &'static str> {
        let wants = match method {
            "apps.connections.open" => APP_TOKEN,
            "auth.test"
            | "conversations.list"
            | "users.conversations"
            | "conversations.info"
            | "conversations.history"
            | "conversations.replies"
            | "chat.postMessage"
            | "chat.getPermalink"
            | "users.info" => BOT_TOKEN,
            _ => return Err("unknown_method"),
        };
        match token {
            None => return Err("not_authed"),
            Some(t) if t == wants => {}
            Some(BOT_TOKEN | APP_TOKEN) => return Err("not_allowed_token_type"),
            Some(_) => return Err("invalid_auth"),
        }
        match method {
            "apps.connections.open" => {
                if self.down {
                    return Err("service_unavailable");
                }
                let ticket = format!("{:08x}-7e57-4c1d-8e7d-00000000fa4e", self.next_id());
                self.tickets.insert(ticket.clone());
                let url = format!(
                    "ws://{}/link/?ticket={ticket}&app_id={APP_ID}",
                    self.ws_addr
                );
                Ok(json!({"url": url}))
            }
            "auth.test" => Ok(json!({"url": TEAM_URL, "team": TEAM_NAME, "user": BOT_NAME,
                "team_id": TEAM_ID, "user_id": BOT_USER, "bot_id": BOT_ID,
                "is_enterprise_install": false})),
            "conversations.list" => self.list(p, false),
            // What the bot is a member of: conversations.list narrowed to member ones.
            "users.conversations" => self.list(p, true),
            "conversations.info" => Ok(json!({"channel": self.readable(p, false)?.json()})),
            "conversations.history" => self.history(p),
            "conversations.replies" => self.replies(p),
            "chat.postMessage" => {
                let id = self.readable(p, true)?.id.clone();
                let text = p.get("text").filter(|t| !t.is_empty()).ok_or("no_text")?;
                let thread = p.get("thread_ts").and_then(|t| parse_ts(t));
                let ts = self.add(&id, bot_itself(text), thread, None, true);
                let message = self.channel(&id).unwrap().messages[&ts].clone();
                Ok(json!({"channel": id, "ts": fmt_ts(ts), "message": message}))
            }
            "chat.getPermalink" => {
                let ch = p
                    .get("channel")
                    .and_then(|id| self.channel(id))
                    .ok_or("channel_not_found")?;
                let ts = p
                    .get("message_ts")
                    .and_then(|t| parse_ts(t))
                    .ok_or("message_not_found")?;
                let m = ch.messages.get(&ts).ok_or("message_not_found")?;
                let mut link = format!("{TEAM_URL}archives/{}/p{ts}", ch.id);
                let root = thread_of(ts, m);
                if root != ts {
                    link.push_str(&format!("?thread_ts={}&cid={}", fmt_ts(root), ch.id));
                }
                Ok(json!({"channel": ch.id, "permalink": link}))
            }
            "users.info" => {
                let id = p.get("user").ok_or("user_not_found")?;
                let name = self.users.get(id).ok_or("user_not_found")?;
                Ok(json!({"user": {"id": id, "team_id": TEAM_ID, "name": name,
                    "real_name": name, "deleted": false, "is_bot": id == BOT_USER,
                    "profile": {"real_name": name, "display_name": name}}}))
            }
            _ => unreachable!("every method above has a token type"),
        }
    }

    /// The channel named by `channel`, as the bot may see it: a public channel it is not in
    /// is `not_in_channel` when `must_be_member`; any other conversation it is not in does not
    /// exist for it.
    fn readable(&self, p: &Params, must_be_member: bool) -> Result<&Channel, &'static str> {
        let ch = p
            .get("channel")
            .and_then(|id| self.channel(id))
            .ok_or("channel_not_found")?;
        match (ch.member, &ch.kind) {
            (true, _) => Ok(ch),
            (false, Kind::Public) if !must_be_member => Ok(ch),
            (false, Kind::Public) => Err("not_in_channel"),
            (false, _) => Err("channel_not_found"),
        }
    }

    fn limit(&self, p: &Params) -> Result<usize, &'static str> {
        let n = match p.get("limit") {
            None => DEFAULT_LIMIT,
            Some(v) => v.parse::<usize>().map_err(|_| "invalid_limit")?,
        };
        let n = if n == 0 {
            DEFAULT_LIMIT
        } else {
            n.min(MAX_LIMIT)
        };
        Ok(n.min(self.page_size))
    }

    fn list(&self, p: &Params, members_only: bool) -> Result<Value, &'static str> {
        let types: Vec<&str> = p
            .get("types")
            .map_or("public_channel", String::as_str)
            .split(',')
            .map(str::trim)
            .collect();
        let known = ["public_channel", "private_channel", "im", "mpim"];
        if types.iter().any(|t| !known.contains(t)) {
            return Err("invalid_types");
        }
        let page = self.limit(p)?;
        let visible: Vec<&Channel> = self
            .channels
            .iter()
            .filter(|c| {
                types.contains(&c.kind.list_type())
                    && (c.member || (c.kind == Kind::Public && !members_only))
            })
            .collect();
        let start = match cursor(p, "team:")? {
            None => 0,
            Some(id) => visible
                .iter()
                .position(|c| c.id == id)
                .ok_or("invalid_cursor")?,
        };
        let channels: Vec<Value> = visible
            .iter()
            .skip(start)
            .take(page)
            .map(|c| c.json())
            .collect();
        let next = visible
            .get(start + page)
            .map(|c| make_cursor("team:", &c.id))
            .unwrap_or_default();
        Ok(json!({"channels": channels, "response_metadata": {"next_cursor": next}}))
    }

    fn history(&self, p: &Params) -> Result<Value, &'static str> {
        let ch = self.readable(p, true)?;
        let range = Range::parse(p)?;
        let page = self.limit(p)?;
        let from = ts_cursor(p)?;
        let mut it = ch.messages.iter().rev().filter(|(ts, m)| {
            thread_of(**ts, m) == **ts && range.contains(**ts) && from.is_none_or(|c| **ts <= c)
        });
        let messages: Vec<Value> = it.by_ref().take(page).map(|(_, m)| m.clone()).collect();
        let next = it.next().map(|(ts, _)| *ts);
        Ok(json!({
            "messages": messages,
            "has_more": next.is_some(),
            "pin_count": 0,
            "channel_actions_ts": null,
            "channel_actions_count": 0,
            "response_metadata": {"next_cursor": next.map(|ts| make_cursor("next_ts:", &ts.to_string())).unwrap_or_default()},
        }))
    }

    /// The parent comes first on every page (a client dedupes by ts either way), then up to a
    /// page of replies, oldest first.
    fn replies(&self, p: &Params) -> Result<Value, &'static str> {
        let ch = self.readable(p, true)?;
        let ts = p.get("ts").ok_or("invalid_arguments")?;
        let ts = parse_ts(ts).ok_or("thread_not_found")?;
        let root = thread_of(ts, ch.messages.get(&ts).ok_or("thread_not_found")?);
        let parent = ch.messages.get(&root).ok_or("thread_not_found")?;
        let range = Range::parse(p)?;
        let page = self.limit(p)?;
        let from = ts_cursor(p)?;
        let mut it = ch.messages.iter().filter(|(t, m)| {
            **t != root
                && thread_of(**t, m) == root
                && range.contains(**t)
                && from.is_none_or(|c| **t >= c)
        });
        let messages: Vec<Value> = std::iter::once(parent.clone())
            .chain(it.by_ref().take(page).map(|(_, m)| m.clone()))
            .collect();
        let next = it.next().map(|(ts, _)| *ts);
        Ok(json!({
            "messages": messages,
            "has_more": next.is_some(),
            "response_metadata": {"next_cursor": next.map(|ts| make_cursor("next_ts:", &ts.to_string())).unwrap_or_default()},
        }))
    }
}

impl Channel {
    /// `msg` as the Events API carries it: with its channel, channel type and `event_ts`.
    fn event(&self, mut msg: Value) -> Value {
        msg["channel"] = json!(self.id);
        msg["channel_type"] = json!(self.kind.channel_type());
        msg["event_ts"] = msg["ts"].clone();
        msg
    }

    /// The conversation object of `conversations.list` and `conversations.info`.
    fn json(&self) -> Value {
        if let Kind::Im(user) = &self.kind {
            return json!({"id": self.id, "created": self.created, "is_im": true,
                "is_org_shared": false, "user": user, "is_user_deleted": false, "priority": 0});
        }
        let mpim = matches!(self.kind, Kind::Mpim(_));
        json!({
            "id": self.id, "name": self.name, "name_normalized": self.name,
            "is_channel": !mpim, "is_group": false, "is_im": false, "is_mpim": mpim,
            "is_private": self.kind != Kind::Public, "is_archived": false, "is_general": false,
            "is_shared": false, "is_ext_shared": false, "is_org_shared": false,
            "is_pending_ext_shared": false, "is_member": self.member,
            "created": self.created, "creator": "U0", "unlinked": 0,
            "topic": {"value": self.topic, "creator": "", "last_set": 0},
            "purpose": {"value": "", "creator": "", "last_set": 0},
        })
    }
}

/// `oldest` / `latest` / `inclusive` of the history methods (defaults: 0, now, exclusive).
struct Range {
    oldest: u64,
    latest: u64,
    inclusive: bool,
}

impl Range {
    fn parse(p: &Params) -> Result<Range, &'static str> {
        let bound = |key: &str, default: u64, error: &'static str| match p.get(key) {
            None => Ok(default),
            Some(v) => parse_ts(v).ok_or(error),
        };
        Ok(Range {
            oldest: bound("oldest", 0, "invalid_ts_oldest")?,
            latest: bound("latest", u64::MAX, "invalid_ts_latest")?,
            inclusive: p.get("inclusive").is_some_and(|v| v == "true" || v == "1"),
        })
    }

    fn contains(&self, ts: u64) -> bool {
        let after = ts > self.oldest || (self.inclusive && ts == self.oldest);
        let before = ts < self.latest || (self.inclusive && ts == self.latest);
        after && before
    }
}

/// Rewrites a thread parent's reply fields from the replies it has now.
fn recount(ch: &mut Channel, root: u64) {
    let replies: Vec<(u64, String)> = ch
        .messages
        .iter()
        .filter(|(t, m)| **t != root && thread_of(**t, m) == root)
        .map(|(t, m)| (*t, author(m)))
        .collect();
    let Some(parent) = ch.messages.get_mut(&root).and_then(Value::as_object_mut) else {
        return;
    };
    let Some(&(latest, _)) = replies.last() else {
        for k in [
            "reply_count",
            "reply_users",
            "reply_users_count",
            "latest_reply",
            "is_locked",
            "subscribed",
        ] {
            parent.remove(k);
        }
        return;
    };
    let mut users: Vec<String> = Vec::new();
    for (_, a) in replies.iter() {
        if !users.contains(a) {
            users.push(a.clone());
        }
    }
    for (k, v) in [
        ("thread_ts", json!(fmt_ts(root))),
        ("reply_count", json!(replies.len())),
        ("reply_users_count", json!(users.len())),
        ("latest_reply", json!(fmt_ts(latest))),
        ("reply_users", json!(users)),
        ("is_locked", json!(false)),
        ("subscribed", json!(false)),
    ] {
        parent.insert(k.to_owned(), v);
    }
}

/// The thread a message belongs to: its `thread_ts`, or its own ts.
fn thread_of(ts: u64, m: &Value) -> u64 {
    m["thread_ts"].as_str().and_then(parse_ts).unwrap_or(ts)
}

fn author(m: &Value) -> String {
    m["user"]
        .as_str()
        .or(m["bot_id"].as_str())
        .unwrap_or_default()
        .to_owned()
}

fn user_message(user: &str, text: &str) -> Value {
    json!({"type": "message", "user": user, "text": text, "team": TEAM_ID})
}

/// A post by the bot itself (what `chat.postMessage` makes).
fn bot_itself(text: &str) -> Value {
    json!({"type": "message", "user": BOT_USER, "bot_id": BOT_ID, "app_id": APP_ID,
        "text": text, "team": TEAM_ID,
        "bot_profile": {"id": BOT_ID, "app_id": APP_ID, "name": BOT_NAME,
            "team_id": TEAM_ID, "deleted": false}})
}

/// `"{secs}.{micros:06}"`, Slack's ts.
fn fmt_ts(micros: u64) -> String {
    format!("{}.{:06}", micros / 1_000_000, micros % 1_000_000)
}

fn parse_ts(s: &str) -> Option<u64> {
    let (secs, frac) = s.split_once('.').unwrap_or((s, ""));
    let digits = |d: &str| d.bytes().all(|b| b.is_ascii_digit());
    if secs.is_empty() || frac.len() > 6 || !digits(secs) || !digits(frac) {
        return None;
    }
    let micros: u64 = format!("{frac:0<6}").parse().ok()?;
    secs.parse::<u64>()
        .ok()?
        .checked_mul(1_000_000)?
        .checked_add(micros)
}

fn envelope_id(n: u64) -> String {
    format!(
        "{n:08x}-e7e1-4d0e-9a5e-{:012x}",
        n.wrapping_mul(0x9e37_79b9)
    )
}

/// Cursors are opaque base64, shaped like Slack's (`team:C…`, `next_ts:…`).
fn make_cursor(prefix: &str, value: &str) -> String {
    B64.encode(format!("{prefix}{value}"))
}

fn cursor(p: &Params, prefix: &str) -> Result<Option<String>, &'static str> {
    let Some(c) = p.get("cursor").filter(|c| !c.is_empty()) else {
        return Ok(None);
    };
    let raw = B64.decode(c).map_err(|_| "invalid_cursor")?;
    let raw = String::from_utf8(raw).map_err(|_| "invalid_cursor")?;
    raw.strip_prefix(prefix)
        .map(|v| Some(v.to_owned()))
        .ok_or("invalid_cursor")
}

fn ts_cursor(p: &Params) -> Result<Option<u64>, &'static str> {
    cursor(p, "next_ts:")?
        .map(|v| v.parse().map_err(|_| "invalid_cursor"))
        .transpose()
}

/// `application/x-www-form-urlencoded` (a query string or a form body).
fn parse_urlencoded(s: &str) -> Params {
    s.split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = b
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (b[i], hex) {
            (b'+', _) => out.push(b' '),
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 2;
            }
            (c, _) => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

// === the Web API over HTTP ===

fn json_response(status: StatusCode, body: &Value) -> Response {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json; charset=utf-8")
        .body(Body::from(body.to_string()))
        .unwrap()
}

async fn handle(State(slack): State<FakeSlack>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let Some(method) = parts.uri.path().strip_prefix("/api/").map(str::to_owned) else {
        return json_response(
            StatusCode::NOT_FOUND,
            &json!({"ok": false, "error": "not_found"}),
        );
    };
    let bytes = axum::body::to_bytes(body, 1 << 20)
        .await
        .unwrap_or_default();
    let mut params = parse_urlencoded(parts.uri.query().unwrap_or(""));
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if content_type.starts_with("application/json") {
        let Ok(Value::Object(fields)) = serde_json::from_slice::<Value>(&bytes) else {
            return json_response(
                StatusCode::OK,
                &json!({"ok": false, "error": "invalid_json"}),
            );
        };
        for (k, v) in fields {
            let v = match v {
                Value::String(s) => s,
                other => other.to_string(),
            };
            params.insert(k, v);
        }
    } else if !bytes.is_empty() {
        params.extend(parse_urlencoded(&String::from_utf8_lossy(&bytes)));
    }
    let form_token = params.remove("token");
    let token = parts
        .headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_owned)
        .or(form_token);

    let (latency, limited) = slack.with(|s| {
        s.requests
            .entry(method.clone())
            .or_default()
            .push(params.clone());
        let limited = match s.rate_limits.get_mut(&method) {
            Some((secs, left)) if *left > 0 => {
                *left -= 1;
                Some(*secs)
            }
            _ => None,
        };
        s.call_times
            .entry(method.clone())
            .or_default()
            .push((std::time::Instant::now(), limited.is_some()));
        (s.latency, limited)
    });
    if !latency.is_zero() {
        // Slack's own response time, for the bench; tests leave it at zero.
        tokio::time::sleep(latency).await;
    }
    if let Some(secs) = limited {
        let mut resp = json_response(
            StatusCode::TOO_MANY_REQUESTS,
            &json!({"ok": false, "error": "ratelimited"}),
        );
        resp.headers_mut()
            .insert(header::RETRY_AFTER, secs.to_string().parse().unwrap());
        return resp;
    }
    let body = match slack.with(|s| s.call(&method, token.as_deref(), &params)) {
        Ok(mut v) => {
            v["ok"] = json!(true);
            v
        }
        Err(error) => json!({"ok": false, "error": error}),
    };
    json_response(StatusCode::OK, &body)
}

// === Socket Mode over a WebSocket ===

async fn accept_sockets(slack: FakeSlack, listener: TcpListener) {
    while let Ok((tcp, _)) = listener.accept().await {
        tokio::spawn(serve_socket(slack.clone(), tcp));
    }
}

async fn serve_socket(slack: FakeSlack, tcp: TcpStream) {
    // Each ticket admits one connection, and none while Slack is down. (The Result is
    // tungstenite's `Callback` signature, large error and all.)
    #[allow(clippy::result_large_err)]
    let admit = |req: &WsRequest, resp: WsResponse| -> Result<WsResponse, ErrorResponse> {
        let ticket = req
            .uri()
            .query()
            .and_then(|q| parse_urlencoded(q).remove("ticket"));
        let admitted = slack.with(|s| {
            let ok = !s.down
                && req.uri().path().starts_with("/link")
                && ticket.is_some_and(|t| s.tickets.remove(&t));
            s.refused += usize::from(!ok);
            ok
        });
        if admitted {
            return Ok(resp);
        }
        Err(http::Response::builder()
            .status(401)
            .body(Some("invalid or used ticket".to_owned()))
            .unwrap())
    };
    let Ok(ws) = tokio_tungstenite::accept_hdr_async(tcp, admit).await else {
        return;
    };
    let (tx, mut rx) = mpsc::unbounded_channel();
    let id = slack.with(|s| {
        s.sockets_opened += 1;
        let id = s.sockets_opened;
        s.sockets.push(Socket {
            id,
            tx: tx.clone(),
            live: true,
        });
        s.most_sockets_open = s.most_sockets_open.max(s.sockets.len());
        // Queued under the lock, so nothing can be sent ahead of it.
        let hello = json!({"type": "hello", "num_connections": s.sockets.len(),
            "debug_info": {"host": format!("applink-fake-{id}"), "approximate_connection_time": 18060},
            "connection_info": {"app_id": APP_ID}});
        let _ = tx.send(Out::Text(hello.to_string()));
        id
    });
    drop(tx);
    let (mut sink, mut stream) = ws.split();
    loop {
        tokio::select! {
            out = rx.recv() => match out {
                Some(Out::Text(t)) => {
                    if sink.send(Message::text(t)).await.is_err() {
                        break;
                    }
                }
                Some(Out::Stamped(t, ts, hook)) => {
                    // Stamped as the write starts: time spent waiting on a full socket (a
                    // client not reading) counts as the client's.
                    let at = Instant::now();
                    if sink.send(Message::text(t)).await.is_err() {
                        break;
                    }
                    let _ = hook.send((ts, at));
                }
                Some(Out::Close(t)) => {
                    let _ = sink.send(Message::text(t)).await;
                    let close = CloseFrame { code: CloseCode::Normal, reason: "".into() };
                    let _ = sink.send(Message::Close(Some(close))).await;
                    // Read on until the client answers the close.
                }
                Some(Out::Abort) | None => break,
                Some(Out::Freeze) => {
                    // Hold the connection open and answer nothing, until the runtime ends.
                    let _hold = (sink, stream);
                    std::future::pending::<()>().await;
                    return;
                }
            },
            frame = stream.next() => match frame {
                Some(Ok(Message::Text(t))) => slack.with(|s| s.record_frame(t.as_str())),
                Some(Ok(Message::Binary(b))) => {
                    slack.with(|s| s.other_frames.push(String::from_utf8_lossy(&b).into_owned()));
                }
                Some(Ok(Message::Close(_))) => {
                    // Sends tungstenite's queued close reply.
                    let _ = sink.close().await;
                    break;
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => break,
            },
        }
    }
    slack.with(|s| s.sockets.retain(|k| k.id != id));
}

// === impl FakeSlack ===

/// The fake Slack: a handle to its state, cheap to clone. Serves until the runtime ends.
///
/// A socket hears events from the moment the fake queues its `hello` (the same moment
/// `sockets_open()` counts it), which can be a moment after the client's upgrade returns: a
/// test awaits the hello, or `wait_until(|s| s.sockets_open() == 1)`, before posting.
#[derive(Clone)]
pub struct FakeSlack {
    state: Arc<Mutex<SlackState>>,
    changed: Arc<Notify>,
    api_url: String,
}

impl FakeSlack {
    /// Binds the Web API and the Socket Mode listener on 127.0.0.1:0 and serves both.
    pub async fn start() -> FakeSlack {
        let api = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let ws = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let slack = FakeSlack {
            state: Arc::new(Mutex::new(SlackState::new(ws.local_addr().unwrap()))),
            changed: Arc::new(Notify::new()),
            api_url: format!("http://{}/api/", api.local_addr().unwrap()),
        };
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(slack.clone());
        tokio::spawn(async move {
            let _ = axum::serve(api, app).await;
        });
        tokio::spawn(accept_sockets(slack.clone(), ws));
        slack
    }

    fn lock(&self) -> MutexGuard<'_, SlackState> {
        self.state.lock().unwrap()
    }

    /// Runs `f` on the state, then wakes every [`FakeSlack::wait_until`].
    fn with<R>(&self, f: impl FnOnce(&mut SlackState) -> R) -> R {
        let r = f(&mut self.lock());
        self.changed.notify_waiters();
        r
    }

    /// `http://127.0.0.1:PORT/api/`: herald's `--slack-api-url` (it appends the method name).
    pub fn api_url(&self) -> String {
        self.api_url.clone()
    }

    // --- the workspace ---

    /// A conversation the bot is a member of (see [`FakeSlack::set_member`]).
    pub fn add_channel(&self, id: &str, name: &str, kind: Kind) {
        let created = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        self.with(|s| {
            assert!(s.channel(id).is_none(), "channel {id} already exists");
            s.channels.push(Channel {
                id: id.to_owned(),
                name: name.to_owned(),
                kind,
                member: true,
                created,
                topic: String::new(),
                messages: BTreeMap::new(),
            });
        });
    }

    /// Whether the bot is in `channel`: it hears a channel's messages over the socket and may
    /// read its history only while it is.
    pub fn set_member(&self, channel: &str, member: bool) {
        self.with(|s| s.channel_mut(channel).member = member);
    }

    /// A user `users.info` knows (posting needs none: any user id may post).
    pub fn add_user(&self, id: &str, name: &str) {
        self.with(|s| s.users.insert(id.to_owned(), name.to_owned()));
    }

    // --- posting (every post lands in history; the socket hears it if one is live) ---

    /// A user's top-level post; returns its ts.
    pub fn post(&self, channel: &str, user: &str, text: &str) -> String {
        fmt_ts(self.with(|s| s.add(channel, user_message(user, text), None, None, true)))
    }

    /// A user's reply in the thread of `thread_ts` (the parent's reply fields follow).
    pub fn post_reply(&self, channel: &str, thread_ts: &str, user: &str, text: &str) -> String {
        let thread = Some(self.existing(channel, thread_ts));
        fmt_ts(self.with(|s| s.add(channel, user_message(user, text), thread, None, true)))
    }

    /// Another bot's or an integration's post: `subtype: bot_message`, `bot_id`, `username`,
    /// no `user`.
    pub fn post_bot(&self, channel: &str, bot_id: &str, username: &str, text: &str) -> String {
        let msg = json!({"type": "message", "subtype": "bot_message", "bot_id": bot_id,
            "username": username, "text": text});
        fmt_ts(self.with(|s| s.add(channel, msg, None, None, true)))
    }

    /// The bot's own post (`user: UBOT`, `bot_id: BBOT`), as `chat.postMessage` makes it.
    pub fn post_as_bot_itself(&self, channel: &str, text: &str) -> String {
        fmt_ts(self.with(|s| s.add(channel, bot_itself(text), None, None, true)))
    }

    /// An edit, a delete, a join, a topic change, a hidden notice or another subtype; returns
    /// the event's ts (for a join, topic or other: the new message's).
    pub fn post_subtype(&self, channel: &str, sub: Sub) -> String {
        fmt_ts(self.with(|s| s.subtype(channel, sub)))
    }

    /// A post placed at `ts` in history only, never on the socket: what happened while
    /// nobody listened, for backfill tests.
    pub fn post_at(&self, channel: &str, ts: &str, user: &str, text: &str) {
        let at = Some(parse_ts(ts).expect("a Slack ts"));
        self.with(|s| s.add(channel, user_message(user, text), None, at, false));
    }

    /// A reply placed at `ts` in `thread_ts`'s thread, in history only (the parent's
    /// `reply_count` and `latest_reply` follow).
    pub fn post_reply_at(&self, channel: &str, thread_ts: &str, ts: &str, user: &str, text: &str) {
        let thread = Some(self.existing(channel, thread_ts));
        let at = Some(parse_ts(ts).expect("a Slack ts"));
        self.with(|s| s.add(channel, user_message(user, text), thread, at, false));
    }

    /// The ts of a message in `channel` (a reply's parent must exist: chat.postMessage makes a
    /// top-level post of a reply to nothing, a test never means to).
    fn existing(&self, channel: &str, ts: &str) -> u64 {
        let t = parse_ts(ts).unwrap_or_else(|| panic!("not a Slack ts: {ts}"));
        let s = self.lock();
        let ch = s.channel(channel).expect("a channel of the fake Slack");
        assert!(
            ch.messages.contains_key(&t),
            "{channel} has no message at {ts}"
        );
        t
    }

    /// Everything stored for `channel`, oldest first (replies and tombstones included).
    pub fn history(&self, channel: &str) -> Vec<Value> {
        let s = self.lock();
        let ch = s.channel(channel).expect("a channel of the fake Slack");
        ch.messages.values().cloned().collect()
    }

    // --- the Web API's moods ---

    /// Caps every page of the paginated methods at `n` items, whatever `limit` asks.
    pub fn set_page_size(&self, n: usize) {
        self.with(|s| s.page_size = n.max(1));
    }

    /// Delays every Web API answer by `latency` (for the bench).
    pub fn set_latency(&self, latency: Duration) {
        self.with(|s| s.latency = latency);
    }

    /// The next `times` calls of `method` get HTTP 429 with `Retry-After: retry_after_secs`.
    pub fn rate_limit(&self, method: &str, retry_after_secs: u64, times: usize) {
        self.with(|s| {
            s.rate_limits
                .insert(method.to_owned(), (retry_after_secs, times))
        });
    }

    pub fn calls(&self, method: &str) -> usize {
        self.lock().calls(method)
    }

    pub fn requests(&self, method: &str) -> Vec<Params> {
        self.lock().requests(method).to_vec()
    }

    // --- Socket Mode's moods ---

    /// Sends `{"type":"disconnect","reason":…}` to every live socket. `link_disabled` and
    /// `too_many_websockets` then close them; `warning` and `refresh_requested` leave them
    /// open (and delivering, to the newest) until the client closes them.
    pub fn disconnect(&self, reason: &str) {
        self.with(|s| s.disconnect(reason));
    }

    /// Ends every socket's TCP connection with no close frame.
    pub fn drop_sockets(&self) {
        self.with(SlackState::drop_sockets);
    }

    /// Every live socket goes silent: no frames either way, no pong, the TCP connection left
    /// open (a dead NAT entry, a host that slept). New sockets work.
    pub fn freeze_sockets(&self) {
        self.with(|s| {
            for k in &mut s.sockets {
                k.live = false;
                let _ = k.tx.send(Out::Freeze);
            }
        });
    }

    /// When each call of `method` came, and whether it was answered 429.
    pub fn call_times(&self, method: &str) -> Vec<(std::time::Instant, bool)> {
        self.with(|s| s.call_times.get(method).cloned().unwrap_or_default())
    }

    /// While down, `apps.connections.open` answers `service_unavailable`, tickets already
    /// handed out are void and live sockets are dropped, so posts are only in history. The
    /// rest of the Web API keeps answering.
    pub fn set_down(&self, down: bool) {
        self.with(|s| {
            s.down = down;
            if down {
                s.tickets.clear();
                s.drop_sockets();
            }
        });
    }

    /// From now on, every `events_api` envelope written to a socket is reported on the
    /// returned channel, once written, with its event's ts and the moment the write began
    /// (for the bench's post-to-event latency: the fake's own queueing before the socket is
    /// left out). A second call replaces the first receiver.
    pub fn on_written(&self) -> mpsc::UnboundedReceiver<Written> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.with(|s| s.written = Some(tx));
        rx
    }

    /// Off: sockets stay up but hear no events; posts are only in history.
    pub fn set_socket_delivery(&self, on: bool) {
        self.with(|s| s.deliver = on);
    }

    /// Sends the last envelope again to the newest live socket, with a fresh `envelope_id`,
    /// `retry_attempt` one higher and `retry_reason: "timeout"` (same `event_id` and event).
    /// Returns the new envelope id, or None with no envelope or no live socket.
    pub fn redeliver_last(&self) -> Option<String> {
        self.with(SlackState::redeliver_last)
    }

    pub fn sockets_opened(&self) -> usize {
        self.lock().sockets_opened()
    }

    pub fn sockets_open(&self) -> usize {
        self.lock().sockets_open()
    }

    pub fn most_sockets_open(&self) -> usize {
        self.lock().most_sockets_open()
    }

    pub fn acks(&self) -> Vec<String> {
        self.lock().acks().to_vec()
    }

    pub fn envelopes(&self) -> Vec<Value> {
        self.lock().envelopes().to_vec()
    }

    /// Awaits `cond` on the state (re-checked on every request, frame, socket change and
    /// post); panics naming `what` after 30 s.
    pub async fn wait_until(&self, what: &str, cond: impl Fn(&SlackState) -> bool) {
        let fut = async {
            loop {
                let notified = self.changed.notified();
                if cond(&self.lock()) {
                    return;
                }
                notified.await;
            }
        };
        tokio::time::timeout(WAIT, fut)
            .await
            .unwrap_or_else(|_| panic!("the fake Slack never saw: {what}"));
    }
}

#[cfg(test)]
mod tests {
    //! The fake against plain clients (reqwest, tungstenite), so it is known good before
    //! herald meets it.

    use super::*;
    use tokio_tungstenite::{MaybeTlsStream, WebSocketStream, connect_async};

    type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

    /// How long a test waits for one answer or frame.
    const T: Duration = Duration::from_secs(10);

    fn client() -> reqwest::Client {
        let _ = rustls::crypto::ring::default_provider().install_default();
        reqwest::Client::new()
    }

    fn enc(s: &str) -> String {
        s.bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect()
    }

    fn form(params: &[(&str, &str)]) -> String {
        let pairs: Vec<String> = params
            .iter()
            .map(|(k, v)| format!("{}={}", enc(k), enc(v)))
            .collect();
        pairs.join("&")
    }

    async fn send(req: reqwest::RequestBuilder) -> (u16, Option<String>, Value) {
        let resp = tokio::time::timeout(T, req.send())
            .await
            .expect("the fake Slack answers")
            .expect("an HTTP response");
        let retry_after = resp
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_owned());
        (
            resp.status().as_u16(),
            retry_after,
            resp.json().await.unwrap(),
        )
    }

    /// A form POST, the way Slack's SDKs call every method.
    async fn api_post(
        slack: &FakeSlack,
        method: &str,
        token: &str,
        params: &[(&str, &str)],
    ) -> Value {
        let req = client()
            .post(format!("{}{method}", slack.api_url()))
            .bearer_auth(token)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form(params));
        let (status, _, body) = send(req).await;
        assert_eq!(status, 200, "{body}");
        body
    }

    async fn api_get(slack: &FakeSlack, method: &str, params: &[(&str, &str)]) -> Value {
        let url = format!("{}{method}?{}", slack.api_url(), form(params));
        let (status, _, body) = send(client().get(url).bearer_auth(BOT_TOKEN)).await;
        assert_eq!(status, 200, "{body}");
        body
    }

    async fn connect(slack: &FakeSlack) -> Ws {
        let open = api_post(slack, "apps.connections.open", APP_TOKEN, &[]).await;
        assert_eq!(open["ok"], true, "{open}");
        let url = open["url"].as_str().unwrap();
        assert!(
            url.starts_with("ws://127.0.0.1:") && url.contains("/link/?ticket="),
            "{url}"
        );
        let (ws, _) = tokio::time::timeout(T, connect_async(url))
            .await
            .expect("the upgrade answers")
            .expect("the upgrade succeeds");
        ws
    }

    async fn recv(ws: &mut Ws) -> Value {
        loop {
            match tokio::time::timeout(T, ws.next()).await.expect("a frame") {
                Some(Ok(Message::Text(t))) => return serde_json::from_str(t.as_str()).unwrap(),
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
                other => panic!("expected a text frame, got {other:?}"),
            }
        }
    }

    async fn ack(ws: &mut Ws, envelope: &Value) {
        let id = envelope["envelope_id"].as_str().unwrap();
        ws.send(Message::text(json!({"envelope_id": id}).to_string()))
            .await
            .unwrap();
    }

    /// Reads a socket to its end, failing on any text frame: true if a close frame came, false
    /// if the connection just went away.
    async fn closed_cleanly(ws: &mut Ws) -> bool {
        let mut close_frame = false;
        loop {
            // Reading on after the close frame sends tungstenite's reply, as a real client does.
            match tokio::time::timeout(T, ws.next()).await.expect("the end") {
                Some(Ok(Message::Close(_))) => close_frame = true,
                Some(Ok(Message::Text(t))) => panic!("unexpected frame {t}"),
                Some(Ok(_)) => {}
                Some(Err(_)) | None => return close_frame,
            }
        }
    }

    fn texts(messages: &Value) -> Vec<&str> {
        messages
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["text"].as_str().unwrap())
            .collect()
    }

    #[test]
    fn ts_are_unique_increasing_and_slack_formatted() {
        let mut s = SlackState::new("127.0.0.1:1".parse().unwrap());
        let ts: Vec<String> = (0..1000).map(|_| fmt_ts(s.next_ts())).collect();
        for pair in ts.windows(2) {
            assert!(parse_ts(&pair[0]) < parse_ts(&pair[1]), "{pair:?}");
        }
        let (secs, micros) = ts[0].split_once('.').unwrap();
        assert_eq!((secs.len(), micros.len()), (10, 6), "{}", ts[0]);
        assert_eq!(parse_ts("1700000000.000100"), Some(1_700_000_000_000_100));
        assert_eq!(parse_ts("1700000000.5"), Some(1_700_000_000_500_000));
        assert_eq!(parse_ts("1700000000"), Some(1_700_000_000_000_000));
        assert_eq!(parse_ts("17e8"), None);
        assert_eq!(percent_decode("a%20b+c%3D%zz"), "a b c=%zz");
    }

    #[tokio::test]
    async fn slack_fake_says_hello_delivers_an_envelope_and_records_the_ack() {
        let slack = FakeSlack::start().await;
        slack.add_channel("C1", "general", Kind::Public);
        let mut ws = connect(&slack).await;
        let hello = recv(&mut ws).await;
        assert_eq!(hello["type"], "hello");
        assert_eq!(hello["num_connections"], 1);
        assert_eq!(hello["connection_info"]["app_id"], APP_ID);
        assert!(hello["debug_info"]["host"].is_string(), "{hello}");
        assert!(hello["debug_info"]["approximate_connection_time"].is_number());

        let ts = slack.post("C1", "U1", "hello <@UBOT>");
        let env = recv(&mut ws).await;
        assert_eq!(env["type"], "events_api");
        assert_eq!(env["accepts_response_payload"], false);
        assert_eq!(
            (&env["retry_attempt"], &env["retry_reason"]),
            (&json!(0), &json!(""))
        );
        let payload = &env["payload"];
        assert_eq!(payload["type"], "event_callback");
        assert_eq!(
            (&payload["team_id"], &payload["api_app_id"]),
            (&json!(TEAM_ID), &json!(APP_ID))
        );
        assert!(payload["event_id"].as_str().unwrap().starts_with("Ev"));
        assert!(payload["event_time"].is_u64());
        let ev = &payload["event"];
        assert_eq!(
            (
                &ev["type"],
                &ev["channel"],
                &ev["channel_type"],
                &ev["user"],
                &ev["text"]
            ),
            (
                &json!("message"),
                &json!("C1"),
                &json!("channel"),
                &json!("U1"),
                &json!("hello <@UBOT>")
            )
        );
        assert_eq!((&ev["ts"], &ev["event_ts"]), (&json!(ts), &json!(ts)));
        assert!(
            ev.get("subtype").is_none() && ev.get("thread_ts").is_none(),
            "{ev}"
        );

        ack(&mut ws, &env).await;
        let id = env["envelope_id"].as_str().unwrap().to_owned();
        slack.wait_until("the ack", |s| s.acked(&id)).await;
        assert_eq!(slack.acks(), vec![id]);
        assert_eq!(slack.envelopes().len(), 1);
        assert_eq!((slack.sockets_opened(), slack.sockets_open()), (1, 1));

        ws.send(Message::text("not an ack")).await.unwrap();
        slack
            .wait_until("the stray frame", |s| s.other_frames() == ["not an ack"])
            .await;

        let history = api_post(
            &slack,
            "conversations.history",
            BOT_TOKEN,
            &[("channel", "C1")],
        )
        .await;
        assert_eq!(history["messages"][0]["ts"], ts.as_str());
        assert_eq!(slack.history("C1").len(), 1);
    }

    #[tokio::test]
    async fn slack_fake_checks_tokens_and_reads_form_json_and_query_params() {
        let slack = FakeSlack::start().await;
        slack.add_channel("C1", "general", Kind::Public);
        slack.add_channel("C2", "elsewhere", Kind::Public);
        slack.add_channel("G1", "secret", Kind::Private);
        slack.set_member("C2", false);
        slack.set_member("G1", false);
        slack.add_user("U2", "ada");

        let me = api_post(&slack, "auth.test", BOT_TOKEN, &[]).await;
        assert_eq!(
            (
                &me["ok"],
                &me["url"],
                &me["user_id"],
                &me["bot_id"],
                &me["team_id"]
            ),
            (
                &json!(true),
                &json!(TEAM_URL),
                &json!(BOT_USER),
                &json!(BOT_ID),
                &json!(TEAM_ID)
            )
        );
        let error = |v: Value| v["error"].as_str().unwrap().to_owned();
        assert_eq!(
            error(api_post(&slack, "auth.test", "xoxb-wrong", &[]).await),
            "invalid_auth"
        );
        assert_eq!(
            error(api_post(&slack, "auth.test", APP_TOKEN, &[]).await),
            "not_allowed_token_type"
        );
        assert_eq!(
            error(api_post(&slack, "apps.connections.open", BOT_TOKEN, &[]).await),
            "not_allowed_token_type"
        );
        assert_eq!(
            error(api_post(&slack, "chat.scheduleMessage", BOT_TOKEN, &[]).await),
            "unknown_method"
        );
        let url = format!("{}auth.test", slack.api_url());
        let (status, _, body) = send(client().post(&url)).await;
        assert_eq!((status, error(body)), (200, "not_authed".to_owned()));
        // The token may come in the form instead.
        let (_, _, body) = send(
            client()
                .post(&url)
                .header("content-type", "application/x-www-form-urlencoded")
                .body(form(&[("token", BOT_TOKEN)])),
        )
        .await;
        assert_eq!(body["ok"], true, "{body}");

        // A JSON body, as SDKs send chat.postMessage.
        let req = client()
            .post(format!("{}chat.postMessage", slack.api_url()))
            .bearer_auth(BOT_TOKEN)
            .json(&json!({"channel": "C1", "text": "hi & bye = 100%"}));
        let (_, _, posted) = send(req).await;
        assert_eq!(posted["ok"], true, "{posted}");
        assert_eq!(
            (
                &posted["channel"],
                &posted["message"]["user"],
                &posted["message"]["bot_id"]
            ),
            (&json!("C1"), &json!(BOT_USER), &json!(BOT_ID))
        );
        assert_eq!(
            slack.requests("chat.postMessage")[0]["text"],
            "hi & bye = 100%"
        );
        assert!(!slack.requests("auth.test")[4].contains_key("token"));

        // Query parameters on a GET.
        let h = api_get(
            &slack,
            "conversations.history",
            &[("channel", "C1"), ("limit", "1")],
        )
        .await;
        assert_eq!(texts(&h["messages"]), ["hi & bye = 100%"]);
        assert_eq!(
            error(api_get(&slack, "conversations.history", &[("channel", "C2")]).await),
            "not_in_channel"
        );
        assert_eq!(
            error(api_get(&slack, "conversations.history", &[("channel", "G1")]).await),
            "channel_not_found"
        );
        assert_eq!(
            error(api_get(&slack, "conversations.history", &[("channel", "C9")]).await),
            "channel_not_found"
        );
        assert_eq!(
            error(api_get(&slack, "conversations.history", &[]).await),
            "channel_not_found"
        );
        assert_eq!(
            error(
                api_post(
                    &slack,
                    "chat.postMessage",
                    BOT_TOKEN,
                    &[("channel", "C2"), ("text", "x")]
                )
                .await
            ),
            "not_in_channel"
        );
        assert_eq!(
            error(api_post(&slack, "chat.postMessage", BOT_TOKEN, &[("channel", "C1")]).await),
            "no_text"
        );
        assert_eq!(
            error(
                api_get(
                    &slack,
                    "conversations.history",
                    &[("channel", "C1"), ("cursor", "garbage")]
                )
                .await
            ),
            "invalid_cursor"
        );
        let info = api_get(&slack, "conversations.info", &[("channel", "C2")]).await;
        assert_eq!(
            (&info["channel"]["name"], &info["channel"]["is_member"]),
            (&json!("elsewhere"), &json!(false))
        );
        let user = api_get(&slack, "users.info", &[("user", "U2")]).await;
        assert_eq!(user["user"]["name"], "ada");
        assert_eq!(
            error(api_get(&slack, "users.info", &[("user", "U9")]).await),
            "user_not_found"
        );
        assert_eq!(slack.calls("auth.test"), 5);
        assert_eq!(slack.calls("conversations.history"), 6);
    }

    #[tokio::test]
    async fn slack_fake_pages_history_newest_first_with_thread_parents_only() {
        let slack = FakeSlack::start().await;
        slack.add_channel("C1", "general", Kind::Public);
        let t: Vec<String> = (0..5)
            .map(|i| slack.post("C1", "U1", &format!("m{i}")))
            .collect();
        let r1 = slack.post_reply("C1", &t[1], "U2", "r1");
        let r2 = slack.post_reply("C1", &r1, "U3", "r2"); // a reply to a reply joins the thread
        slack.set_page_size(2);

        let (mut seen, mut cursor, mut pages) = (Vec::new(), String::new(), 0);
        loop {
            let page = api_get(
                &slack,
                "conversations.history",
                &[
                    ("channel", "C1"),
                    ("limit", "100"),
                    ("cursor", cursor.as_str()),
                ],
            )
            .await;
            pages += 1;
            seen.extend(page["messages"].as_array().unwrap().iter().cloned());
            cursor = page["response_metadata"]["next_cursor"]
                .as_str()
                .unwrap()
                .to_owned();
            assert_eq!(page["has_more"], !cursor.is_empty(), "{page}");
            if cursor.is_empty() {
                break;
            }
        }
        assert_eq!(pages, 3);
        let order: Vec<&str> = seen.iter().map(|m| m["ts"].as_str().unwrap()).collect();
        let newest_first: Vec<&str> = t.iter().rev().map(String::as_str).collect();
        assert_eq!(order, newest_first, "top-level only, newest first");
        let parent = &seen[3];
        assert_eq!(
            (
                &parent["thread_ts"],
                &parent["reply_count"],
                &parent["latest_reply"],
                &parent["reply_users"]
            ),
            (&json!(t[1]), &json!(2), &json!(r2), &json!(["U2", "U3"]))
        );
        assert!(seen[0].get("reply_count").is_none());

        slack.set_page_size(100);
        let window = [
            ("channel", "C1"),
            ("oldest", t[1].as_str()),
            ("latest", t[3].as_str()),
        ];
        let h = api_get(&slack, "conversations.history", &window).await;
        assert_eq!(texts(&h["messages"]), ["m2"]);
        let inclusive = [window[0], window[1], window[2], ("inclusive", "true")];
        let h = api_get(&slack, "conversations.history", &inclusive).await;
        assert_eq!(texts(&h["messages"]), ["m3", "m2", "m1"]);

        slack.set_page_size(1);
        let p1 = api_get(
            &slack,
            "conversations.replies",
            &[("channel", "C1"), ("ts", t[1].as_str())],
        )
        .await;
        assert_eq!(
            (texts(&p1["messages"]), &p1["has_more"]),
            (vec!["m1", "r1"], &json!(true))
        );
        assert_eq!(p1["messages"][1]["thread_ts"], t[1].as_str());
        assert_eq!(p1["messages"][1]["parent_user_id"], "U1");
        let next = p1["response_metadata"]["next_cursor"].as_str().unwrap();
        let p2 = api_get(
            &slack,
            "conversations.replies",
            &[("channel", "C1"), ("ts", t[1].as_str()), ("cursor", next)],
        )
        .await;
        assert_eq!(
            (texts(&p2["messages"]), &p2["has_more"]),
            (vec!["m1", "r2"], &json!(false))
        );
        assert_eq!(p2["response_metadata"]["next_cursor"], "");
        slack.set_page_size(100);
        let by_reply = api_get(
            &slack,
            "conversations.replies",
            &[
                ("channel", "C1"),
                ("ts", r1.as_str()),
                ("oldest", r1.as_str()),
            ],
        )
        .await;
        assert_eq!(
            texts(&by_reply["messages"]),
            ["m1", "r2"],
            "a reply's ts finds its thread; oldest narrows"
        );
        let lone = api_get(
            &slack,
            "conversations.replies",
            &[("channel", "C1"), ("ts", t[0].as_str())],
        )
        .await;
        assert_eq!(texts(&lone["messages"]), ["m0"]);
        let missing = api_get(
            &slack,
            "conversations.replies",
            &[("channel", "C1"), ("ts", "1.000001")],
        )
        .await;
        assert_eq!(missing["error"], "thread_not_found");
    }

    #[tokio::test]
    async fn slack_fake_rate_limits_with_retry_after_then_succeeds() {
        let slack = FakeSlack::start().await;
        slack.add_channel("C1", "general", Kind::Public);
        slack.rate_limit("conversations.history", 7, 2);
        let url = format!("{}conversations.history?channel=C1", slack.api_url());
        for _ in 0..2 {
            let (status, retry_after, body) = send(client().get(&url).bearer_auth(BOT_TOKEN)).await;
            assert_eq!((status, retry_after.as_deref()), (429, Some("7")));
            assert_eq!(body["error"], "ratelimited");
        }
        let (status, retry_after, body) = send(client().get(&url).bearer_auth(BOT_TOKEN)).await;
        assert_eq!(
            (status, retry_after, &body["ok"]),
            (200, None, &json!(true))
        );
        assert_eq!(slack.calls("conversations.history"), 3);
        assert_eq!(slack.calls("auth.test"), 0);

        slack.set_latency(Duration::from_millis(30));
        let started = Instant::now();
        api_post(&slack, "auth.test", BOT_TOKEN, &[]).await;
        assert!(started.elapsed() >= Duration::from_millis(30));
    }

    #[tokio::test]
    async fn slack_fake_lists_conversations_by_type_and_membership_in_pages() {
        let slack = FakeSlack::start().await;
        slack.add_channel("C1", "general", Kind::Public);
        slack.add_channel("C2", "random", Kind::Public);
        slack.add_channel("G1", "secret", Kind::Private);
        slack.add_channel("G2", "not-ours", Kind::Private);
        slack.add_channel("D1", "", Kind::Im("U2".into()));
        slack.add_channel(
            "G3",
            "mpdm-a--b-1",
            Kind::Mpim(vec!["U2".into(), "U3".into()]),
        );
        slack.set_member("C2", false);
        slack.set_member("G2", false);
        slack.set_page_size(2);

        let all = [("types", "public_channel,private_channel,im,mpim")];
        let (mut seen, mut cursor, mut pages) = (Vec::new(), String::new(), 0);
        loop {
            let page = api_get(
                &slack,
                "conversations.list",
                &[all[0], ("cursor", cursor.as_str())],
            )
            .await;
            pages += 1;
            seen.extend(page["channels"].as_array().unwrap().iter().cloned());
            cursor = page["response_metadata"]["next_cursor"]
                .as_str()
                .unwrap()
                .to_owned();
            if cursor.is_empty() {
                break;
            }
        }
        let ids: Vec<&str> = seen.iter().map(|c| c["id"].as_str().unwrap()).collect();
        assert_eq!((ids, pages), (vec!["C1", "C2", "G1", "D1", "G3"], 3));
        let by_id = |id: &str| seen.iter().find(|c| c["id"] == id).unwrap();
        assert_eq!(
            (&by_id("C1")["is_member"], &by_id("C1")["is_private"]),
            (&json!(true), &json!(false))
        );
        assert_eq!(by_id("C2")["is_member"], false);
        assert_eq!(
            (&by_id("G1")["is_private"], &by_id("G1")["is_channel"]),
            (&json!(true), &json!(true))
        );
        assert_eq!(
            (&by_id("D1")["is_im"], &by_id("D1")["user"]),
            (&json!(true), &json!("U2"))
        );
        assert_eq!(by_id("G3")["is_mpim"], true);

        slack.set_page_size(100);
        let public = api_get(&slack, "conversations.list", &[]).await;
        let ids: Vec<&str> = public["channels"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, ["C1", "C2"], "public_channel is the default");
        let bad = api_get(
            &slack,
            "conversations.list",
            &[("types", "public_channel,dms")],
        )
        .await;
        assert_eq!(bad["error"], "invalid_types");
    }

    #[tokio::test]
    async fn slack_fake_refuses_unknown_and_reused_tickets() {
        let slack = FakeSlack::start().await;
        let open = api_post(&slack, "apps.connections.open", APP_TOKEN, &[]).await;
        let url = open["url"].as_str().unwrap().to_owned();
        let (base, _) = url.split_once("ticket=").unwrap();
        assert!(
            connect_async(format!("{base}ticket=forged&app_id=A1"))
                .await
                .is_err()
        );
        let (_first, _) = connect_async(url.as_str()).await.unwrap();
        assert!(
            connect_async(url.as_str()).await.is_err(),
            "a ticket admits one socket"
        );
        slack.wait_until("two refusals", |s| s.refused() == 2).await;
        assert_eq!(slack.sockets_opened(), 1);
    }

    #[tokio::test]
    async fn slack_fake_refresh_requested_keeps_the_old_socket_and_delivers_to_the_newest() {
        let slack = FakeSlack::start().await;
        slack.add_channel("C1", "general", Kind::Public);
        let mut old = connect(&slack).await;
        recv(&mut old).await;

        slack.disconnect("refresh_requested");
        let bye = recv(&mut old).await;
        assert_eq!(
            (&bye["type"], &bye["reason"]),
            (&json!("disconnect"), &json!("refresh_requested"))
        );
        assert!(bye["debug_info"]["host"].is_string());
        // The old socket still hears events until a new one opens.
        let before = slack.post("C1", "U1", "still here");
        assert_eq!(
            recv(&mut old).await["payload"]["event"]["ts"],
            before.as_str()
        );

        let mut new = connect(&slack).await;
        assert_eq!(recv(&mut new).await["num_connections"], 2);
        let ts = slack.post("C1", "U1", "after the refresh");
        assert_eq!(recv(&mut new).await["payload"]["event"]["ts"], ts.as_str());
        old.close(None).await.unwrap();
        assert!(
            closed_cleanly(&mut old).await,
            "the old socket heard nothing more"
        );
        slack
            .wait_until("the old socket closed", |s| s.sockets_open() == 1)
            .await;
        assert_eq!(slack.sockets_opened(), 2);
    }

    #[tokio::test]
    async fn slack_fake_warns_then_disables_the_link_with_a_close_frame() {
        let slack = FakeSlack::start().await;
        slack.add_channel("C1", "general", Kind::Public);
        let mut ws = connect(&slack).await;
        recv(&mut ws).await;
        slack.disconnect("warning");
        assert_eq!(recv(&mut ws).await["reason"], "warning");
        slack.post("C1", "U1", "after the warning");
        assert_eq!(recv(&mut ws).await["type"], "events_api");
        slack.disconnect("link_disabled");
        assert_eq!(recv(&mut ws).await["reason"], "link_disabled");
        assert!(closed_cleanly(&mut ws).await);
        slack
            .wait_until("the socket closed", |s| s.sockets_open() == 0)
            .await;
    }

    #[tokio::test]
    async fn slack_fake_drops_sockets_and_goes_down_leaving_posts_in_history() {
        let slack = FakeSlack::start().await;
        slack.add_channel("C1", "general", Kind::Public);
        let mut ws = connect(&slack).await;
        recv(&mut ws).await;
        slack.drop_sockets();
        assert!(
            !closed_cleanly(&mut ws).await,
            "dropped without a close frame"
        );
        slack
            .wait_until("no socket open", |s| s.sockets_open() == 0)
            .await;

        let ticket = api_post(&slack, "apps.connections.open", APP_TOKEN, &[]).await;
        slack.set_down(true);
        let open = api_post(&slack, "apps.connections.open", APP_TOKEN, &[]).await;
        assert_eq!(
            (&open["ok"], &open["error"]),
            (&json!(false), &json!("service_unavailable"))
        );
        assert!(
            connect_async(ticket["url"].as_str().unwrap())
                .await
                .is_err(),
            "tickets die with the outage"
        );
        let missed = slack.post("C1", "U1", "while down");
        assert!(slack.envelopes().is_empty());

        slack.set_down(false);
        let mut ws = connect(&slack).await;
        recv(&mut ws).await;
        let ts = slack.post("C1", "U1", "back");
        assert_eq!(
            recv(&mut ws).await["payload"]["event"]["ts"],
            ts.as_str(),
            "the missed post never comes"
        );
        let h = api_post(
            &slack,
            "conversations.history",
            BOT_TOKEN,
            &[("channel", "C1")],
        )
        .await;
        assert_eq!(texts(&h["messages"]), ["back", "while down"]);
        assert_eq!(h["messages"][1]["ts"], missed.as_str());
    }

    #[tokio::test]
    async fn slack_fake_reports_each_envelope_once_written_to_the_socket() {
        let slack = FakeSlack::start().await;
        slack.add_channel("C1", "general", Kind::Public);
        let mut ws = connect(&slack).await;
        recv(&mut ws).await;
        slack.post("C1", "U1", "before the hook");
        recv(&mut ws).await;
        let mut written = slack.on_written();
        let posted = Instant::now();
        let ts = slack.post("C1", "U1", "stamped");
        let (got, at) = tokio::time::timeout(T, written.recv())
            .await
            .expect("reported")
            .expect("the hook is open");
        assert_eq!(got, ts);
        assert!(at >= posted);
        assert_eq!(recv(&mut ws).await["payload"]["event"]["ts"], ts.as_str());
        slack.disconnect("warning");
        recv(&mut ws).await;
        assert!(written.try_recv().is_err(), "only envelopes are reported");
    }

    #[tokio::test]
    async fn slack_fake_redelivers_the_last_envelope_with_a_retry_attempt() {
        let slack = FakeSlack::start().await;
        slack.add_channel("C1", "general", Kind::Public);
        assert_eq!(slack.redeliver_last(), None);
        let mut ws = connect(&slack).await;
        recv(&mut ws).await;
        slack.post("C1", "U1", "once");
        let first = recv(&mut ws).await;
        let id = slack.redeliver_last().unwrap();
        let again = recv(&mut ws).await;
        assert_eq!(again["envelope_id"], id.as_str());
        assert_ne!(again["envelope_id"], first["envelope_id"]);
        assert_eq!(
            (&again["retry_attempt"], &again["retry_reason"]),
            (&json!(1), &json!("timeout"))
        );
        assert_eq!(again["payload"]["event_id"], first["payload"]["event_id"]);
        assert_eq!(again["payload"]["event"], first["payload"]["event"]);
        slack.redeliver_last().unwrap();
        let third = recv(&mut ws).await;
        assert_eq!(third["retry_attempt"], 2);
        ack(&mut ws, &third).await;
        slack
            .wait_until("the ack of the retry", |s| s.acks().len() == 1)
            .await;
        assert_eq!(slack.acks()[0], third["envelope_id"].as_str().unwrap());
    }

    #[tokio::test]
    async fn slack_fake_shapes_subtypes_bot_posts_and_replies_like_slack() {
        let slack = FakeSlack::start().await;
        slack.add_channel("C1", "general", Kind::Public);
        slack.add_channel("D1", "", Kind::Im("U2".into()));
        slack.add_channel(
            "G9",
            "mpdm-u2--u3-1",
            Kind::Mpim(vec!["U2".into(), "U3".into()]),
        );
        let mut ws = connect(&slack).await;
        recv(&mut ws).await;
        let mut next = async || recv(&mut ws).await["payload"]["event"].clone();

        let ts = slack.post("C1", "U1", "first");
        next().await;
        let reply = slack.post_reply("C1", &ts, "U2", "in thread");
        let ev = next().await;
        assert_eq!(
            (&ev["thread_ts"], &ev["parent_user_id"], &ev["ts"]),
            (&json!(ts), &json!("U1"), &json!(reply))
        );

        let edit = slack.post_subtype(
            "C1",
            Sub::Changed {
                ts: &ts,
                text: "edited",
            },
        );
        let ev = next().await;
        assert_eq!(
            (&ev["subtype"], &ev["hidden"], &ev["ts"]),
            (&json!("message_changed"), &json!(true), &json!(edit))
        );
        assert_eq!(
            (&ev["message"]["text"], &ev["message"]["ts"]),
            (&json!("edited"), &json!(ts))
        );
        assert_eq!(ev["message"]["edited"]["ts"], edit.as_str());
        assert_eq!(
            (&ev["previous_message"]["text"], &ev["channel"]),
            (&json!("first"), &json!("C1"))
        );
        assert!(ev.get("user").is_none(), "{ev}");

        slack.post_subtype("C1", Sub::Join { user: "U3" });
        let ev = next().await;
        assert_eq!(
            (&ev["subtype"], &ev["user"]),
            (&json!("channel_join"), &json!("U3"))
        );
        slack.post_subtype(
            "C1",
            Sub::Topic {
                user: "U3",
                topic: "ships",
            },
        );
        let ev = next().await;
        assert_eq!(
            (&ev["subtype"], &ev["topic"]),
            (&json!("channel_topic"), &json!("ships"))
        );
        slack.post_subtype("C1", Sub::Replied { thread_ts: &ts });
        let ev = next().await;
        assert_eq!(
            (&ev["subtype"], &ev["hidden"], &ev["message"]["reply_count"]),
            (&json!("message_replied"), &json!(true), &json!(1))
        );
        slack.post_subtype(
            "C1",
            Sub::Other {
                subtype: "file_share",
                user: "U2",
                text: "a file",
            },
        );
        assert_eq!(next().await["subtype"], "file_share");

        slack.post_bot("C1", "B2", "deploybot", "shipped");
        let ev = next().await;
        assert_eq!(
            (
                &ev["subtype"],
                &ev["bot_id"],
                &ev["username"],
                ev.get("user")
            ),
            (
                &json!("bot_message"),
                &json!("B2"),
                &json!("deploybot"),
                None
            )
        );
        slack.post_as_bot_itself("C1", "mine");
        let ev = next().await;
        assert_eq!(
            (&ev["user"], &ev["bot_id"], ev.get("subtype")),
            (&json!(BOT_USER), &json!(BOT_ID), None)
        );
        let posted = api_post(
            &slack,
            "chat.postMessage",
            BOT_TOKEN,
            &[
                ("channel", "C1"),
                ("text", "via api"),
                ("thread_ts", ts.as_str()),
            ],
        )
        .await;
        let ev = next().await;
        assert_eq!(
            (&ev["bot_id"], &ev["thread_ts"], &ev["ts"]),
            (&json!(BOT_ID), &json!(ts), &posted["ts"])
        );
        slack.post("D1", "U2", "dm");
        assert_eq!(next().await["channel_type"], "im");
        slack.post("G9", "U2", "group dm");
        assert_eq!(next().await["channel_type"], "mpim");

        let link = api_get(
            &slack,
            "chat.getPermalink",
            &[("channel", "C1"), ("message_ts", ts.as_str())],
        )
        .await;
        let digits = ts.replace('.', "");
        assert_eq!(
            link["permalink"],
            format!("https://fake-team.slack.com/archives/C1/p{digits}")
        );
        let link = api_get(
            &slack,
            "chat.getPermalink",
            &[("channel", "C1"), ("message_ts", reply.as_str())],
        )
        .await;
        let reply_digits = reply.replace('.', "");
        assert_eq!(
            link["permalink"],
            format!(
                "https://fake-team.slack.com/archives/C1/p{reply_digits}?thread_ts={ts}&cid=C1"
            )
        );

        let gone = slack.post_subtype("C1", Sub::Deleted { ts: &reply });
        let ev = next().await;
        assert_eq!(
            (&ev["subtype"], &ev["deleted_ts"], &ev["ts"]),
            (&json!("message_deleted"), &json!(reply), &json!(gone))
        );
        assert_eq!(ev["previous_message"]["text"], "in thread");
        let history = slack.history("C1");
        let texts: Vec<&str> = history
            .iter()
            .map(|m| m["text"].as_str().unwrap())
            .collect();
        assert_eq!(
            texts,
            [
                "edited",
                "<@U3> has joined the channel",
                "set the channel topic: ships",
                "a file",
                "shipped",
                "mine",
                "via api"
            ]
        );
        assert_eq!(history[0]["reply_count"], 1, "only the bot's reply is left");
        slack.post_subtype("C1", Sub::Deleted { ts: &ts });
        next().await;
        assert_eq!(
            slack.history("C1")[0]["subtype"],
            "tombstone",
            "a parent with replies leaves a tombstone"
        );
    }

    #[tokio::test]
    async fn slack_fake_keeps_posts_off_the_socket_when_delivery_is_off_or_the_bot_is_out() {
        let slack = FakeSlack::start().await;
        slack.add_channel("C1", "general", Kind::Public);
        slack.add_channel("C2", "random", Kind::Public);
        slack.set_member("C2", false);
        let mut ws = connect(&slack).await;
        recv(&mut ws).await;

        slack.set_socket_delivery(false);
        slack.post("C1", "U1", "quiet");
        slack.set_socket_delivery(true);
        slack.post("C2", "U1", "not our channel");
        slack.post_at("C1", "1600000000.000100", "U1", "long ago");
        slack.post_reply_at(
            "C1",
            "1600000000.000100",
            "1600000001.000000",
            "U2",
            "old reply",
        );
        assert!(slack.envelopes().is_empty());
        slack.set_member("C2", true);
        let ts = slack.post("C2", "U1", "now ours");
        assert_eq!(
            recv(&mut ws).await["payload"]["event"]["ts"],
            ts.as_str(),
            "nothing before it"
        );

        let h = api_post(
            &slack,
            "conversations.history",
            BOT_TOKEN,
            &[("channel", "C1")],
        )
        .await;
        assert_eq!(texts(&h["messages"]), ["quiet", "long ago"]);
        let old = &h["messages"][1];
        assert_eq!(
            (&old["ts"], &old["reply_count"], &old["latest_reply"]),
            (
                &json!("1600000000.000100"),
                &json!(1),
                &json!("1600000001.000000")
            )
        );
        let h = api_post(
            &slack,
            "conversations.history",
            BOT_TOKEN,
            &[("channel", "C1"), ("latest", "1600000000.5")],
        )
        .await;
        assert_eq!(texts(&h["messages"]), ["long ago"]);
    }
}
