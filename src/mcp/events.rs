//! The MCP Events extension (`io.modelcontextprotocol/events`), poll mode, over event-log rings.
//!
//! Every source with an event-log ring offers it through `events/list` and `events/poll` with
//! the pieces here: [`PollRequest::parse`] validates the params (unknown keys refused, never
//! ignored), [`EventType`] is one `events/list` entry, [`poll`] answers a poll from an
//! [`EventRing`] (the cursor is the ring's `seq` as a decimal string), and [`Leases`] keeps a
//! polled URI watched between polls, so that what happens between two polls lands in the ring.
//!
//! A poll with a `timeoutMs` is a long poll: it waits on the source's [`ChangeFeed`] for the
//! ring's URI (no timer looks for work) and answers as soon as an event is there, or when the
//! timeout (at most [`MAX_TIMEOUT`]) runs out. It registers on the feed before it first looks,
//! so an event pushed in between is not missed; at shutdown the server asks a waiting poll
//! again without the wait (`server.rs`), so it answers at once.
//!
//! A result's `eventId` is `<uri>#<seq>` and its cursor the last `seq` returned; a null cursor
//! answers no events and the ring's head. A cursor the ring has dropped events past reads
//! `truncated: true`. A source leases at most [`MAX_POLL_LEASES`] URIs at once, each for
//! [`POLL_LEASE`] after its last poll, by one timer per lease.

use crate::sync::Recover;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use rmcp::model::JsonObject;
use serde_json::{Value, json};

use crate::mcp::error::SourceError;
use crate::mcp::hub::ChangeFeed;
use crate::mcp::ring::{EventRing, now_ms};
use crate::runtime::context::RoleContext;

/// `maxEvents` when the poll does not say.
pub const DEFAULT_MAX_EVENTS: usize = 100;
/// The largest `maxEvents` accepted.
pub const MAX_EVENTS: usize = 1000;
/// `nextPollMs` when nothing more is waiting (clients apply a floor of 1 s anyway).
pub const NEXT_POLL_MS: u64 = 1000;
/// The longest a long poll waits, whatever `timeoutMs` asks: the server may answer early.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a polled URI stays watched after its last poll.
pub const POLL_LEASE: Duration = Duration::from_secs(300);
/// Most URIs one source keeps watched for pollers at once (each holds a ring, and distinct
/// arguments are distinct URIs).
pub const MAX_POLL_LEASES: usize = 1024;

/// Where a herald source puts an event's own cursor in its `events/poll` results
/// (`_meta`), so a stream can give every event its resume point.
pub const EVENT_CURSOR_META: &str = "io.herald/cursor";

const POLL_PARAMS: [&str; 7] = [
    "name",
    "arguments",
    "cursor",
    "maxEvents",
    "maxAgeMs",
    "timeoutMs",
    "_meta",
];

/// A validated `events/poll` request.
#[derive(Debug, Clone, PartialEq)]
pub struct PollRequest {
    pub name: String,
    /// The event type's arguments; each source checks them against its schema.
    pub arguments: JsonObject,
    /// `None`: start from now.
    pub cursor: Option<u64>,
    pub max_events: usize,
    /// Replay no further back than this (ignored when `cursor` is `None`).
    pub max_age: Option<Duration>,
    /// How long to wait for an event when none is pending (zero: answer at once).
    pub timeout: Duration,
}

fn invalid(m: String) -> SourceError {
    SourceError::InvalidParams(m)
}

fn non_negative(params: &JsonObject, key: &str) -> Result<Option<u64>, SourceError> {
    match params.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| {
            invalid(format!(
                "{key} must be a non-negative integer (milliseconds), got {v}"
            ))
        }),
    }
}

impl PollRequest {
    /// Validates `events/poll` params: `name` (string, required), `arguments` (object,
    /// default `{}`), `cursor` (string or null), `maxEvents` (1..=1000, default 100),
    /// `maxAgeMs`, `timeoutMs` and `_meta`. Any other key is refused by name.
    pub fn parse(params: &JsonObject) -> Result<PollRequest, SourceError> {
        if let Some(k) = params.keys().find(|k| !POLL_PARAMS.contains(&k.as_str())) {
            return Err(invalid(format!(
                "unknown parameter {k}; events/poll takes name, arguments, cursor, maxEvents, maxAgeMs and timeoutMs"
            )));
        }
        let (name, arguments) = name_and_arguments(params, "events/poll")?;
        let cursor = match params.get("cursor") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(decode_cursor(s)?),
            Some(other) => {
                return Err(invalid(format!(
                    "cursor must be a string from an earlier poll, or null to start from now; got {other}"
                )));
            }
        };
        let max_events = match params.get("maxEvents") {
            None | Some(Value::Null) => DEFAULT_MAX_EVENTS,
            Some(v) => match v.as_u64() {
                Some(n) if (1..=MAX_EVENTS as u64).contains(&n) => n as usize,
                _ => {
                    return Err(invalid(format!(
                        "maxEvents must be an integer from 1 to {MAX_EVENTS}, got {v}"
                    )));
                }
            },
        };
        let max_age = non_negative(params, "maxAgeMs")?.map(Duration::from_millis);
        let timeout = non_negative(params, "timeoutMs")?
            .map(Duration::from_millis)
            .unwrap_or_default()
            .min(MAX_TIMEOUT);
        Ok(PollRequest {
            name,
            arguments,
            cursor,
            max_events,
            max_age,
            timeout,
        })
    }
}

/// The `name` (required) and `arguments` (an object, `{}` when absent) of an `events/*`
/// request to `method`.
pub fn name_and_arguments(
    params: &JsonObject,
    method: &str,
) -> Result<(String, JsonObject), SourceError> {
    let name = match params.get("name") {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        Some(Value::String(_)) | None | Some(Value::Null) => {
            return Err(invalid(format!(
                "missing parameter name; {method} needs the event type's name (events/list names them)"
            )));
        }
        Some(other) => return Err(invalid(format!("name must be a string, got {other}"))),
    };
    let arguments = match params.get("arguments") {
        None | Some(Value::Null) => JsonObject::new(),
        Some(Value::Object(o)) => o.clone(),
        Some(other) => return Err(invalid(format!("arguments must be an object, got {other}"))),
    };
    Ok((name, arguments))
}

/// A cursor as the client sees it: the ring's seq in decimal.
pub fn encode_cursor(seq: u64) -> String {
    seq.to_string()
}

/// The seq a cursor stands for. Anything that is not a decimal seq did not come from here.
pub fn decode_cursor(s: &str) -> Result<u64, SourceError> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(foreign(s));
    }
    s.parse().map_err(|_| foreign(s))
}

fn foreign(s: &str) -> SourceError {
    invalid(format!(
        "foreign cursor {s:?}: this server's cursors are the decimal strings its polls return; pass null to start from now"
    ))
}

/// The error for an event type this source does not serve.
pub fn unknown_event(name: &str) -> SourceError {
    SourceError::EventNotFound(format!(
        "no event type {name:?}; events/list names the event types this server serves"
    ))
}

/// `v` with every object's keys in order: event-type arguments that differ only in key order
/// are the same selection (one webhook subscription, one shared upstream poll).
pub fn sorted_keys(v: &Value) -> Value {
    match v {
        Value::Object(o) => {
            let mut keys: Vec<&String> = o.keys().collect();
            keys.sort();
            Value::Object(
                keys.into_iter()
                    .map(|k| (k.clone(), sorted_keys(&o[k])))
                    .collect(),
            )
        }
        Value::Array(a) => Value::Array(a.iter().map(sorted_keys).collect()),
        other => other.clone(),
    }
}

/// A poll's answer, the parts a client of it reads (`herald poll`, an `events/stream`
/// following a source's polls).
#[derive(Debug, Clone, PartialEq)]
pub struct PollAnswer {
    pub events: Vec<Value>,
    pub cursor: Option<String>,
    pub truncated: bool,
    pub has_more: bool,
    /// `nextPollMs` ([`NEXT_POLL_MS`] when it does not say).
    pub next_poll: Duration,
}

impl PollAnswer {
    /// Reads an `events/poll` result: an object with an `events` list and a string (or null)
    /// `cursor`; anything else is said.
    pub fn parse(v: Value) -> Result<PollAnswer, String> {
        let Value::Object(mut o) = v else {
            return Err(format!("the answer is not an object: {v}"));
        };
        let events = match o.remove("events") {
            Some(Value::Array(a)) => a,
            other => return Err(format!("the answer has no events list (events: {other:?})")),
        };
        let cursor = match o.remove("cursor") {
            Some(Value::String(s)) => Some(s),
            Some(Value::Null) | None => None,
            Some(other) => return Err(format!("the answer's cursor is not a string: {other}")),
        };
        let flag = |k: &str| o.get(k).and_then(Value::as_bool) == Some(true);
        Ok(PollAnswer {
            events,
            truncated: flag("truncated"),
            has_more: flag("hasMore"),
            next_poll: Duration::from_millis(
                o.get("nextPollMs")
                    .and_then(Value::as_u64)
                    .unwrap_or(NEXT_POLL_MS),
            ),
            cursor,
        })
    }
}

/// One event type, as `events/list` shows it.
#[derive(Debug, Clone)]
pub struct EventType {
    pub name: &'static str,
    pub description: String,
    /// The JSON Schema of `arguments` (`additionalProperties: false`: unknown arguments are
    /// refused).
    pub input_schema: Value,
    /// The JSON Schema of each event's `data`.
    pub payload_schema: Value,
}

impl EventType {
    pub fn to_json(&self) -> Value {
        json!({
            "name": self.name,
            "description": self.description,
            "delivery": ["poll", "push"],
            "inputSchema": self.input_schema,
            "payloadSchema": self.payload_schema,
        })
    }
}

/// The payload schema of an event-log event whose `type` is one of `types`.
pub fn log_payload_schema(types: &[&str]) -> Value {
    json!({
        "type": "object",
        "description": "the event-log event as the resource's read shows it",
        "properties": {
            "seq": {"type": "integer"},
            "type": {"type": "string", "enum": types}
        },
        "required": ["seq", "type"]
    })
}

/// Refuses arguments an event type does not take (never ignores them: a dropped filter widens
/// what the poll returns).
pub fn check_arguments(
    args: &JsonObject,
    event: &str,
    allowed: &[&str],
) -> Result<(), SourceError> {
    if let Some(k) = args.keys().find(|k| !allowed.contains(&k.as_str())) {
        let takes = if allowed.is_empty() {
            "no arguments".to_owned()
        } else {
            allowed.join(", ")
        };
        return Err(invalid(format!(
            "unknown argument {k}; {event} takes {takes}"
        )));
    }
    Ok(())
}

/// A string argument (`None` when absent or null).
pub fn str_argument(args: &JsonObject, key: &str) -> Result<Option<String>, SourceError> {
    match args.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(invalid(format!(
            "argument {key} must be a string, got {other}"
        ))),
    }
}

/// A boolean argument (`false` when absent or null).
pub fn bool_argument(args: &JsonObject, key: &str) -> Result<bool, SourceError> {
    match args.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(invalid(format!(
            "argument {key} must be true or false, got {other}"
        ))),
    }
}

/// A required string argument.
pub fn required_argument(args: &JsonObject, key: &str, event: &str) -> Result<String, SourceError> {
    str_argument(args, key)?.ok_or_else(|| {
        invalid(format!(
            "missing argument {key}; {event} needs it (see its inputSchema in events/list)"
        ))
    })
}

/// Percent-encodes one URI query value: everything but unreserved characters (and `*`, which
/// URIs in this crate use bare, as in `namespace=*`).
pub fn encode_query_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~*:".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A poll result from `ring`, whose URI is `uri`, at `now_ms` (milliseconds since the epoch).
/// Returns the result and whether it carries events.
pub fn poll_result(ring: &EventRing, uri: &str, req: &PollRequest, now_ms: u64) -> (Value, bool) {
    let Some(cursor) = req.cursor else {
        // From now: no events, and a cursor at the head.
        return (
            json!({
                "events": [],
                "cursor": encode_cursor(ring.head()),
                "truncated": false,
                "hasMore": false,
                "nextPollMs": NEXT_POLL_MS,
            }),
            false,
        );
    };
    let not_before = req
        .max_age
        .map_or(0, |a| now_ms.saturating_sub(a.as_millis() as u64));
    let since = ring.since(cursor, req.max_events, not_before);
    let events: Vec<Value> = since
        .events
        .into_iter()
        .map(|e| {
            json!({
                "eventId": format!("{uri}#{}", e.seq),
                "name": req.name,
                "timestamp": rfc3339(e.ts_ms as i64 * 1_000_000),
                "data": e.event,
                // Its own resume point, which a stream gives each event it pushes.
                "_meta": {EVENT_CURSOR_META: encode_cursor(e.seq)},
            })
        })
        .collect();
    let any = !events.is_empty();
    (
        json!({
            "events": events,
            "cursor": encode_cursor(since.cursor),
            "truncated": since.truncated,
            "hasMore": since.has_more,
            "nextPollMs": if since.has_more { 0 } else { NEXT_POLL_MS },
        }),
        any,
    )
}

/// Answers `req` from `ring`. With a cursor and a `timeoutMs`, waits on `feed` for `uri` until
/// an event is there or the timeout runs out. The registration comes before the first look,
/// so an event pushed in between wakes the wait.
pub async fn poll(ring: &EventRing, feed: &ChangeFeed, uri: &str, req: &PollRequest) -> Value {
    if req.cursor.is_none() || req.timeout.is_zero() {
        return poll_result(ring, uri, req, now_ms()).0;
    }
    let deadline = tokio::time::Instant::now() + req.timeout;
    let registration = feed.register(&[uri.to_owned()]);
    loop {
        let (result, any) = poll_result(ring, uri, req, now_ms());
        if any {
            return result;
        }
        if tokio::time::timeout_at(deadline, registration.queue().next_batch())
            .await
            .is_err()
        {
            return poll_result(ring, uri, req, now_ms()).0;
        }
    }
}

/// Holds per-URI watches for pollers: each poll renews its URI's hold for [`POLL_LEASE`] (or
/// the duration given), and a timer set by the hold (not a loop looking for work) lets it go
/// once no poll came for that long. At most `max` URIs are held at once.
pub struct Leases<T> {
    held: Arc<Mutex<HashMap<String, Held<T>>>>,
    hold: Duration,
    max: usize,
    /// Where the expiry timers run (they end at shutdown).
    ctx: RoleContext,
}

struct Held<T> {
    value: T,
    expires: tokio::time::Instant,
}

impl<T: Send + 'static> Leases<T> {
    pub fn new(hold: Duration, max: usize, ctx: RoleContext) -> Leases<T> {
        Leases {
            held: Arc::default(),
            hold,
            max: max.max(1),
            ctx,
        }
    }

    fn full(&self) -> SourceError {
        SourceError::Unavailable(format!(
            "this server already keeps {} polled selections watched, its limit; poll one of those, \
             or wait until one lapses ({} s after its last poll)",
            self.max,
            self.hold.as_secs()
        ))
    }

    /// Refuses early (before the caller starts a watch) when no new URI can be held.
    pub fn check_room(&self) -> Result<(), SourceError> {
        if self.len() >= self.max {
            return Err(self.full());
        }
        Ok(())
    }

    /// If `key` is held, renews it and returns `f` of the held value.
    pub fn renew<R>(&self, key: &str, f: impl FnOnce(&T) -> R) -> Option<R> {
        let mut held = self.held.locked();
        let h = held.get_mut(key)?;
        h.expires = tokio::time::Instant::now() + self.hold;
        Some(f(&h.value))
    }

    /// Holds `value` for `key` and returns `f` of what is held. When a concurrent poll got
    /// there first, its value is kept (and renewed) and `value` is dropped; when `max` URIs
    /// are held already, `value` is dropped and the poll refused.
    pub fn hold<R>(&self, key: &str, value: T, f: impl FnOnce(&T) -> R) -> Result<R, SourceError> {
        let expires = tokio::time::Instant::now() + self.hold;
        let mut held = self.held.locked();
        if let Some(h) = held.get_mut(key) {
            h.expires = expires;
            return Ok(f(&h.value));
        }
        if held.len() >= self.max {
            return Err(self.full());
        }
        let r = f(&value);
        held.insert(key.to_owned(), Held { value, expires });
        drop(held);
        self.ctx.spawn_until_shutdown(
            "poll lease",
            expire(Arc::downgrade(&self.held), key.to_owned(), expires),
        );
        Ok(r)
    }

    /// Lets go of `key` now (a watch that failed to start should not be kept).
    pub fn release(&self, key: &str) {
        let gone = self.held.locked().remove(key);
        drop(gone);
    }

    /// URIs held now.
    pub fn len(&self) -> usize {
        self.held.locked().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Sleeps until the hold of `key` runs out, following renewals; then lets it go.
async fn expire<T>(
    held: Weak<Mutex<HashMap<String, Held<T>>>>,
    key: String,
    first: tokio::time::Instant,
) {
    let mut at = first;
    loop {
        tokio::time::sleep_until(at).await;
        let Some(held) = held.upgrade() else { return };
        let mut map = held.locked();
        match map.get(&key) {
            Some(h) if h.expires > at => at = h.expires,
            Some(_) => {
                let gone = map.remove(&key);
                drop(map);
                tracing::debug!(uri = %key, "events poll lease expired");
                drop(gone);
                return;
            }
            None => return,
        }
    }
}

/// UTC RFC 3339 with milliseconds from nanoseconds since the epoch.
pub fn rfc3339(ns: i64) -> String {
    let secs = ns.div_euclid(1_000_000_000);
    let ms = ns.rem_euclid(1_000_000_000) / 1_000_000;
    let (days, sod) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{ms:03}Z",
        sod / 3600,
        sod % 3600 / 60,
        sod % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Map;

    fn params(v: Value) -> JsonObject {
        v.as_object().unwrap().clone()
    }

    fn req(v: Value) -> PollRequest {
        PollRequest::parse(&params(v)).unwrap()
    }

    fn err(v: Value) -> String {
        PollRequest::parse(&params(v)).unwrap_err().to_string()
    }

    #[test]
    fn params_have_defaults_and_bounds() {
        let r = req(json!({"name": "memo.changed", "_meta": {"x": 1}}));
        assert_eq!(r.name, "memo.changed");
        assert!(r.arguments.is_empty());
        assert_eq!(r.cursor, None);
        assert_eq!(r.max_events, DEFAULT_MAX_EVENTS);
        assert_eq!(r.timeout, Duration::ZERO);
        let r = req(
            json!({"name": "a", "cursor": "42", "maxEvents": 1000, "maxAgeMs": 5,
                           "timeoutMs": 3_600_000, "arguments": {"k": 1}}),
        );
        assert_eq!(r.cursor, Some(42));
        assert_eq!(r.max_events, 1000);
        assert_eq!(r.max_age, Some(Duration::from_millis(5)));
        assert_eq!(
            r.timeout, MAX_TIMEOUT,
            "a long poll is capped, never refused"
        );
        assert_eq!(r.arguments["k"], 1);
        assert_eq!(req(json!({"name": "a", "cursor": null})).cursor, None);
    }

    #[test]
    fn unknown_parameters_are_refused_by_name() {
        let e = err(json!({"name": "a", "since": "1"}));
        assert!(e.contains("unknown parameter since"), "{e}");
    }

    #[test]
    fn bad_params_say_what_is_wrong() {
        for (v, needle) in [
            (json!({}), "missing parameter name"),
            (json!({"name": 3}), "name must be a string"),
            (
                json!({"name": "a", "arguments": [1]}),
                "arguments must be an object",
            ),
            (json!({"name": "a", "cursor": 5}), "cursor must be a string"),
            (json!({"name": "a", "cursor": "abc"}), "foreign cursor"),
            (json!({"name": "a", "cursor": "-1"}), "foreign cursor"),
            (
                json!({"name": "a", "cursor": "99999999999999999999999"}),
                "foreign cursor",
            ),
            (json!({"name": "a", "maxEvents": 0}), "from 1 to 1000"),
            (json!({"name": "a", "maxEvents": 1001}), "from 1 to 1000"),
            (json!({"name": "a", "maxEvents": 2.5}), "from 1 to 1000"),
            (json!({"name": "a", "maxAgeMs": -1}), "maxAgeMs must be"),
            (json!({"name": "a", "timeoutMs": "1"}), "timeoutMs must be"),
        ] {
            let e = err(v.clone());
            assert!(e.contains(needle), "{v}: {e}");
        }
    }

    #[test]
    fn cursors_round_trip() {
        assert_eq!(
            decode_cursor(&encode_cursor(1_764_497_610_123_456)).unwrap(),
            1_764_497_610_123_456
        );
        assert!(decode_cursor("").is_err());
        assert!(decode_cursor("+1").is_err());
    }

    #[test]
    fn unknown_arguments_are_refused() {
        let e = check_arguments(
            &params(json!({"path": "/a", "depth": 2})),
            "file.changed",
            &["path"],
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("unknown argument depth; file.changed takes path"),
            "{e}"
        );
        let e = check_arguments(&params(json!({"x": 1})), "memo.changed", &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("takes no arguments"), "{e}");
        assert!(bool_argument(&params(json!({"r": "yes"})), "r").is_err());
        assert!(str_argument(&params(json!({"s": 1})), "s").is_err());
    }

    fn push(r: &EventRing, n: usize) {
        for i in 0..n {
            let mut f = Map::new();
            f.insert("i".into(), i.into());
            r.push("X", f);
        }
    }

    #[test]
    fn a_null_cursor_starts_from_now() {
        let r = EventRing::with_start(8, 10);
        push(&r, 3);
        let (v, any) = poll_result(&r, "x://log", &req(json!({"name": "x"})), 0);
        assert!(!any);
        assert_eq!(v["events"], json!([]));
        assert_eq!(v["cursor"], "12");
        assert_eq!(v["truncated"], false);
        assert_eq!(v["hasMore"], false);
        assert_eq!(v["nextPollMs"], NEXT_POLL_MS);
    }

    #[test]
    fn events_after_the_cursor_in_order_with_more() {
        let r = EventRing::with_start(8, 10);
        push(&r, 3);
        let (v, any) = poll_result(
            &r,
            "x://log",
            &req(json!({"name": "x.changed", "cursor": "10", "maxEvents": 1})),
            0,
        );
        assert!(any);
        assert_eq!(v["events"].as_array().unwrap().len(), 1);
        let e = &v["events"][0];
        assert_eq!(e["eventId"], "x://log#11");
        assert_eq!(e["name"], "x.changed");
        assert_eq!(e["data"]["seq"], 11);
        assert_eq!(e["data"]["i"], 1);
        assert!(e["timestamp"].as_str().unwrap().ends_with('Z'));
        assert_eq!(v["cursor"], "11");
        assert_eq!(v["hasMore"], true);
        assert_eq!(v["nextPollMs"], 0);
        let (v, _) = poll_result(&r, "x://log", &req(json!({"name": "x", "cursor": "11"})), 0);
        assert_eq!(v["events"][0]["data"]["seq"], 12);
        assert_eq!(v["cursor"], "12");
        assert_eq!(v["hasMore"], false);
        assert_eq!(v["truncated"], false);
    }

    #[test]
    fn truncated_when_the_ring_dropped_past_the_cursor() {
        let r = EventRing::with_start(2, 1);
        push(&r, 5); // holds 4, 5
        let (v, _) = poll_result(&r, "x://log", &req(json!({"name": "x", "cursor": "1"})), 0);
        assert_eq!(v["truncated"], true);
        let seqs: Vec<u64> = v["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["data"]["seq"].as_u64().unwrap())
            .collect();
        assert_eq!(seqs, [4, 5]);
        let (v, _) = poll_result(&r, "x://log", &req(json!({"name": "x", "cursor": "3"})), 0);
        assert_eq!(v["truncated"], false, "nothing after 3 was dropped");
    }

    #[test]
    fn max_age_skips_old_events_only_with_a_cursor() {
        let r = EventRing::with_start(8, 1);
        r.push_at("OLD", Map::new(), 1_000);
        r.push_at("NEW", Map::new(), 9_000);
        let q = req(json!({"name": "x", "cursor": "0", "maxAgeMs": 2_000}));
        let (v, _) = poll_result(&r, "x://log", &q, 10_000);
        assert_eq!(v["truncated"], true);
        assert_eq!(v["events"].as_array().unwrap().len(), 1);
        assert_eq!(v["events"][0]["timestamp"], "1970-01-01T00:00:09.000Z");
        let q = req(json!({"name": "x", "maxAgeMs": 2_000}));
        let (v, _) = poll_result(&r, "x://log", &q, 10_000);
        assert_eq!(
            v["cursor"], "2",
            "a null cursor ignores maxAgeMs and starts from now"
        );
    }

    #[tokio::test]
    async fn a_long_poll_answers_when_an_event_arrives() {
        let ring = Arc::new(EventRing::with_start(8, 1));
        let feed = ChangeFeed::new();
        let q = req(json!({"name": "x", "cursor": "0", "timeoutMs": 20_000}));
        let waiting = {
            let (ring, feed, q) = (ring.clone(), feed.clone(), q.clone());
            tokio::spawn(async move { poll(&ring, &feed, "x://log", &q).await })
        };
        // The poll registers before it looks; wait until it has.
        while feed.listeners("x://log") == 0 {
            tokio::task::yield_now().await;
        }
        ring.push("X", Map::new());
        feed.publish("x://log");
        let v = tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(v["events"][0]["data"]["seq"], 1);
        assert_eq!(feed.listeners("x://log"), 0, "the wait let go of the feed");
    }

    #[tokio::test(start_paused = true)]
    async fn a_long_poll_times_out_empty() {
        let ring = EventRing::with_start(8, 1);
        let feed = ChangeFeed::new();
        let q = req(json!({"name": "x", "cursor": "0", "timeoutMs": 5_000}));
        let started = tokio::time::Instant::now();
        let v = poll(&ring, &feed, "x://log", &q).await;
        assert_eq!(v["events"], json!([]));
        assert_eq!(started.elapsed(), Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn leases_expire_after_the_last_renewal() {
        let leases: Leases<Arc<()>> =
            Leases::new(Duration::from_secs(300), 8, RoleContext::new("test"));
        let token = Arc::new(());
        assert_eq!(leases.hold("u", token.clone(), |_| 1).unwrap(), 1);
        let other = Arc::new(());
        leases.hold("u", other.clone(), |_| ()).unwrap();
        assert_eq!(
            Arc::strong_count(&other),
            1,
            "a second hold keeps the first value"
        );
        tokio::time::sleep(Duration::from_secs(200)).await;
        assert_eq!(leases.renew("u", |_| 2), Some(2));
        tokio::time::sleep(Duration::from_secs(200)).await;
        assert_eq!(leases.len(), 1, "renewed at 200 s, so held until 500 s");
        assert_eq!(Arc::strong_count(&token), 2);
        tokio::time::sleep(Duration::from_secs(101)).await;
        assert!(leases.is_empty());
        assert_eq!(Arc::strong_count(&token), 1, "the held value was dropped");
        assert_eq!(leases.renew("u", |_| ()), None);
        leases.hold("v", token.clone(), |_| ()).unwrap();
        leases.release("v");
        assert!(leases.is_empty());
        assert_eq!(Arc::strong_count(&token), 1);
        // The timer of the released hold finds nothing and ends quietly.
        tokio::time::sleep(Duration::from_secs(301)).await;
    }

    #[tokio::test(start_paused = true)]
    async fn leases_are_bounded() {
        let leases: Leases<Arc<()>> =
            Leases::new(Duration::from_secs(300), 2, RoleContext::new("test"));
        let token = Arc::new(());
        leases.hold("a", token.clone(), |_| ()).unwrap();
        leases.hold("b", token.clone(), |_| ()).unwrap();
        assert!(leases.check_room().is_err());
        let e = leases.hold("c", token.clone(), |_| ()).unwrap_err();
        assert!(e.to_string().contains("its limit"), "{e}");
        assert_eq!(
            Arc::strong_count(&token),
            3,
            "the refused value was dropped"
        );
        leases.hold("a", token.clone(), |_| ()).unwrap();
        tokio::time::sleep(Duration::from_secs(301)).await;
        assert!(leases.check_room().is_ok(), "room again once holds lapse");
    }

    #[tokio::test(start_paused = true)]
    async fn lease_timers_are_named_and_end_at_shutdown() {
        let ctx = RoleContext::new("test");
        let leases: Leases<Arc<()>> = Leases::new(Duration::from_secs(300), 2, ctx.clone());
        leases.hold("a", Arc::new(()), |_| ()).unwrap();
        assert_eq!(ctx.running(), vec![("test/poll lease".to_owned(), 1)]);
        let started = tokio::time::Instant::now();
        assert_eq!(ctx.drain(Duration::from_secs(10)).await, Ok(()));
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "not the 300 s hold"
        );
    }

    #[test]
    fn rfc3339_formats_utc_milliseconds() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            rfc3339(1_764_497_610_123_456_789),
            "2025-11-30T10:13:30.123Z"
        );
        assert_eq!(rfc3339(-1_000_000), "1969-12-31T23:59:59.999Z");
    }

    #[test]
    fn query_values_are_encoded() {
        assert_eq!(
            encode_query_value("app=web,tier in (a)"),
            "app%3Dweb%2Ctier%20in%20%28a%29"
        );
        assert_eq!(encode_query_value("*"), "*");
        assert_eq!(encode_query_value("a+b&c"), "a%2Bb%26c");
    }
}
