//! The event-log ring: the bounded, seq-numbered event history behind every event-log resource.
//!
//! Reads are stateless (`{"events":[...]}` of everything still held), so any number of readers
//! share one ring; each reader keeps its own last-seen `seq`. `seq` starts at the ring's creation
//! time in microseconds since the epoch, so it keeps increasing across restarts of the source, and
//! a client that watched the previous process sees a GAP instead of silently skipping events.
//!
//! Each event is serialized once, when pushed, and a read is the concatenation of those texts.
//! A ring is bounded in events (`--ring-capacity`) and in bytes ([`ring_bytes`], which grows
//! with the capacity): when full, the oldest event goes, and a reader past it sees a GAP. Each
//! event's push time is kept beside it (not in the read shape) for `events/poll`.
//!
//! Reads are bounded so each fits a message: a whole read is the newest [`RING_BYTES`] of
//! events. [`EventRing::read_json_after`] serves a reader that has everything up to a `seq`:
//! the events after it, led by the newest one at or before it as an anchor, so the reader's GAP
//! rule reads it as it reads the whole ring; oldest first, one page ([`PAGE_BYTES`]) at a time,
//! a page that stops short of the newest saying so (`"more": true`, [`more_waiting`]) so the
//! reader reads on from its last event at once.

use crate::runtime::tap::{Tap, Tapped};
use crate::sync::Recover;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use serde_json::{Map, Value};

/// MIME type of an event-log read (reference 000's wire name).
pub const EVENT_LOG_MIME: &str = "application/vnd.asyncai.events+json";

/// Default number of events a ring keeps.
pub const DEFAULT_RING_CAPACITY: usize = 256;

/// The most bytes of events a whole read holds (the newest ones): it fits a message at the
/// default limit (4 MiB) even when every character needs escaping. Also the least a ring keeps
/// ([`ring_bytes`]).
pub const RING_BYTES: usize = 1 << 20;

/// The bytes a ring keeps per event of its capacity, past [`RING_BYTES`] ([`ring_bytes`]).
pub const BYTES_PER_EVENT: usize = 4 << 10;

/// The most bytes of events a ring of `capacity` events keeps: [`BYTES_PER_EVENT`] for each,
/// at least [`RING_BYTES`] and at most [`MAX_RING_BYTES`]. A bigger `--ring-capacity` is then
/// a longer history in bytes too, so a reader that falls behind in a burst catches up page by
/// page instead of seeing a GAP.
pub fn ring_bytes(capacity: usize) -> usize {
    capacity
        .saturating_mul(BYTES_PER_EVENT)
        .clamp(RING_BYTES, MAX_RING_BYTES)
}

/// The most bytes any ring keeps, whatever its capacity ([`ring_bytes`]).
pub const MAX_RING_BYTES: usize = 64 << 20;

/// The bytes of events a read after a `seq` holds past its first two events (the anchor and
/// the first new one): a page ([`EventRing::read_json_after`]).
pub const PAGE_BYTES: usize = RING_BYTES / 4;

/// The largest event a ring keeps whole; a bigger one is kept with its biggest fields replaced
/// by a marker (`{"truncated": true, "bytes": N}`) and `"truncated": true` on the event.
pub const MAX_EVENT_BYTES: usize = RING_BYTES / 4;

/// How a page that stops short of the newest event ends ([`more_waiting`]).
const MORE: &str = ",\"more\":true}";

/// Whether an event-log read is a page with more events after it
/// ([`EventRing::read_json_after`]): the reader reads again from the page's newest `seq`.
pub fn more_waiting(text: &str) -> bool {
    text.trim_end().ends_with(MORE)
}

/// A bounded ring of events with monotonically increasing `seq`.
#[derive(Debug)]
pub struct EventRing {
    inner: Mutex<Inner>,
    /// Its URI and where its events go, when its role publishes its event logs
    /// ([`EventRing::tapped`]).
    tap: Option<(Arc<str>, Tap)>,
}

#[derive(Debug)]
struct Inner {
    capacity: usize,
    /// The most bytes of events held ([`ring_bytes`]).
    max_bytes: usize,
    next_seq: u64,
    events: VecDeque<Entry>,
    /// The bytes of `events`' texts, at most `max_bytes`.
    bytes: usize,
    /// A mirror of a ring kept elsewhere ([`EventRing::mirror_of`]).
    mirrored: bool,
    /// In a mirror: seqs that arrived after a hole (events the mirror never got).
    gaps: VecDeque<u64>,
    /// In a mirror: the first seq it got (a cursor 0 skips nothing while it is still held).
    first_mirrored: u64,
    /// In a mirror that was reset to lower seqs (its publisher restarted with its clock
    /// behind): the head before the reset. A cursor up to it is from the old numbering and
    /// reads everything, truncated, as a replaced ring's would.
    reset_from: u64,
}

/// One held event: serialized once, when pushed. The push time is kept beside the event, not
/// in it, so the event-log read shape (`{"events":[{"seq","type",...}]}`) is unchanged.
#[derive(Debug)]
struct Entry {
    seq: u64,
    /// Milliseconds since the epoch when the event was pushed.
    ts_ms: u64,
    text: String,
}

/// One event handed to `events/poll`.
#[derive(Debug, PartialEq)]
pub struct Logged {
    pub seq: u64,
    /// Milliseconds since the epoch when the ring took the event.
    pub ts_ms: u64,
    pub event: Value,
}

/// The events after a cursor, for `events/poll`.
#[derive(Debug, PartialEq)]
pub struct Since {
    pub events: Vec<Logged>,
    /// The cursor to continue from: the seq of the last event returned when more are waiting,
    /// else the ring's head (everything up to it was looked at).
    pub cursor: u64,
    /// Events past the cursor were skipped: dropped by the ring before this read, older than
    /// the age floor, or the cursor does not belong to this ring's history.
    pub truncated: bool,
    /// More events are waiting beyond `max`.
    pub has_more: bool,
}

/// The events of an event-log read (`{"events":[...]}`), each still text; `None` when the
/// text is not that shape.
pub fn raw_events(text: &str) -> Option<Vec<&serde_json::value::RawValue>> {
    #[derive(serde::Deserialize)]
    struct Log<'a> {
        #[serde(borrow)]
        events: Vec<&'a serde_json::value::RawValue>,
    }
    serde_json::from_str::<Log>(text).ok().map(|l| l.events)
}

/// An event's `seq` ([`raw_events`]), when it has a whole number there.
pub fn seq_of(event: &serde_json::value::RawValue) -> Option<u64> {
    #[derive(serde::Deserialize)]
    struct Seq {
        seq: Option<Value>,
    }
    serde_json::from_str::<Seq>(event.get()).ok()?.seq?.as_u64()
}

/// The `seq` of the last event of an event-log read (oldest first, as a ring reads), without
/// building the events.
pub fn newest_seq(text: &str) -> Option<u64> {
    seq_of(raw_events(text)?.last()?)
}

/// An event-log read cut to its newest events within `bytes` (at least the newest one), still
/// an event-log read; `None` when the text is not one.
pub fn newest_within(text: &str, bytes: usize) -> Option<String> {
    let events = raw_events(text)?;
    let start = newest_start(events.iter().map(|e| e.get().len()), bytes);
    let kept: Vec<&str> = events[start..].iter().map(|e| e.get()).collect();
    Some(format!("{{\"events\":[{}]}}", kept.join(",")))
}

/// Where the newest of the items `lens` (their sizes, oldest first) that fit `budget` bytes
/// (with a comma each) start: at least the newest one.
fn newest_start(
    lens: impl DoubleEndedIterator<Item = usize> + ExactSizeIterator,
    budget: usize,
) -> usize {
    let mut start = lens.len();
    let mut held = 0;
    for len in lens.rev() {
        if held > 0 && held + len + 1 > budget {
            break;
        }
        held += len + 1;
        start -= 1;
    }
    start
}

/// Milliseconds since the epoch, now.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl EventRing {
    /// A ring holding at most `capacity` events (at least 1).
    pub fn new(capacity: usize) -> EventRing {
        let start = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(1);
        EventRing::with_start(capacity, start.max(1))
    }

    /// A ring whose first event gets `first_seq` (tests).
    pub fn with_start(capacity: usize, first_seq: u64) -> EventRing {
        EventRing {
            inner: Mutex::new(Inner {
                capacity: capacity.max(1),
                max_bytes: ring_bytes(capacity.max(1)),
                next_seq: first_seq.max(1),
                events: VecDeque::new(),
                bytes: 0,
                mirrored: false,
                gaps: VecDeque::new(),
                first_mirrored: 0,
                reset_from: 0,
            }),
            tap: None,
        }
    }

    /// A mirror of a ring kept by another process ([`mirror`](Self::mirror) fills it): a
    /// cursor past its head is one it has not caught up with (answered with nothing, the
    /// cursor kept), and a hole in the seqs it receives is reported as `truncated`.
    pub fn mirror_of(capacity: usize) -> EventRing {
        let ring = EventRing::with_start(capacity, 1);
        ring.inner.locked().mirrored = true;
        ring
    }

    /// Starts a mirror over at `seq`, below its head (its publisher restarted, numbering from a
    /// clock that is behind): what it held is dropped, and readers learn of the reset.
    pub fn reset_mirror(&self, seq: u64, ts_ms: u64, text: String) {
        let mut inner = self.inner.locked();
        inner.reset_from = inner.reset_from.max(inner.next_seq - 1);
        inner.events.clear();
        inner.gaps.clear();
        inner.bytes = text.len();
        inner.next_seq = seq + 1;
        inner.gaps.push_back(seq);
        inner.events.push_back(Entry { seq, ts_ms, text });
    }

    /// When the newest event held was pushed (milliseconds since the epoch).
    pub fn newest_ts_ms(&self) -> Option<u64> {
        self.inner.locked().events.back().map(|e| e.ts_ms)
    }

    /// This ring is the event log `uri`: when its role publishes its event logs (`tap`, the
    /// context's [`RoleContext::tap`](crate::runtime::context::RoleContext::tap)), its events
    /// are sent to the publisher too (in push order, never blocking a push: a full queue
    /// drops and counts).
    pub fn tapped(mut self, uri: &str, tap: Option<&Tap>) -> EventRing {
        self.tap = tap.map(|t| (uri.into(), t.clone()));
        self
    }

    /// Appends an event that another ring numbered (a mirror of a published ring): kept
    /// under its own `seq` if that is past the head; `false` (and nothing kept) otherwise.
    pub fn mirror(&self, seq: u64, ts_ms: u64, text: String) -> bool {
        let mut inner = self.inner.locked();
        if seq < inner.next_seq {
            return false;
        }
        // The first event a mirror gets starts it; after that, a seq past the next is a hole.
        if inner.next_seq > 1 && seq != inner.next_seq {
            inner.gaps.push_back(seq);
        }
        if inner.first_mirrored == 0 {
            inner.first_mirrored = seq;
        }
        inner.next_seq = seq + 1;
        while inner.events.len() >= inner.capacity
            || (inner.bytes + text.len() > inner.max_bytes && !inner.events.is_empty())
        {
            if let Some(old) = inner.events.pop_front() {
                inner.bytes -= old.text.len();
            }
        }
        let oldest = inner.events.front().map_or(seq, |e| e.seq);
        while inner.gaps.front().is_some_and(|&g| g <= oldest) {
            inner.gaps.pop_front();
        }
        inner.bytes += text.len();
        inner.events.push_back(Entry { seq, ts_ms, text });
        true
    }

    /// Appends an event of `kind` with `fields`; returns its seq. `seq` and `type` are set here
    /// and override any of the same name in `fields`.
    pub fn push(&self, kind: &str, fields: Map<String, Value>) -> u64 {
        self.push_at(kind, fields, now_ms())
    }

    /// [`push`](Self::push) with the push time given (milliseconds since the epoch).
    pub(crate) fn push_at(&self, kind: &str, fields: Map<String, Value>, ts_ms: u64) -> u64 {
        let mut inner = self.inner.locked();
        let seq = inner.next_seq;
        inner.next_seq += 1;
        let mut event = Map::with_capacity(fields.len() + 2);
        event.insert("seq".into(), Value::from(seq));
        event.insert("type".into(), Value::from(kind));
        for (k, v) in fields {
            if k != "seq" && k != "type" {
                event.insert(k, v);
            }
        }
        let mut text = serde_json::to_string(&event).unwrap_or_default();
        if text.len() > MAX_EVENT_BYTES {
            text = truncated(event, text.len());
        }
        while inner.events.len() >= inner.capacity
            || (inner.bytes + text.len() > inner.max_bytes && !inner.events.is_empty())
        {
            if let Some(old) = inner.events.pop_front() {
                inner.bytes -= old.text.len();
            }
        }
        inner.bytes += text.len();
        // Sent under the lock, so the publisher sees this ring's events in seq order.
        if let Some((uri, tap)) = &self.tap {
            tap.send(Tapped {
                uri: uri.clone(),
                seq,
                ts_ms,
                text: text.clone(),
            });
        }
        inner.events.push_back(Entry { seq, ts_ms, text });
        seq
    }

    /// The bytes of events held.
    pub fn bytes(&self) -> usize {
        self.inner.locked().bytes
    }

    /// An in-band `ERROR` event: source failures are reported in the log, not as read errors.
    pub fn push_error(&self, message: &str) -> u64 {
        let mut f = Map::new();
        f.insert("message".into(), Value::from(message));
        self.push("ERROR", f)
    }

    /// The read body: `{"events":[...]}`, oldest first: the newest [`RING_BYTES`] of events
    /// (at least the newest one), so a read fits a message whatever the ring holds.
    pub fn read_json(&self) -> String {
        let inner = self.inner.locked();
        let start = newest_start(inner.events.iter().map(|e| e.text.len()), RING_BYTES);
        Self::page(&inner, start, inner.events.len(), usize::MAX)
    }

    /// `{"events":[...]}` of the events from `start` (before `stop`), as many as `budget` bytes
    /// hold past the first two (at least those); `"more": true` when it stops short of the
    /// newest.
    fn page(inner: &Inner, start: usize, stop: usize, budget: usize) -> String {
        let mut end = start;
        let mut bytes = 0usize;
        for (i, e) in inner.events.range(start..stop).enumerate() {
            if i >= 2 && bytes.saturating_add(e.text.len() + 1) > budget {
                break;
            }
            if i >= 2 {
                bytes += e.text.len() + 1;
            }
            end += 1;
        }
        let held = inner.events.range(start..end);
        let mut out =
            String::with_capacity(24 + held.clone().map(|e| e.text.len() + 1).sum::<usize>());
        out.push_str("{\"events\":[");
        for (i, e) in held.enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(&e.text);
        }
        out.push(']');
        if end < inner.events.len() {
            out.push_str(MORE);
        } else {
            out.push('}');
        }
        out
    }

    /// The read body for a reader that has everything up to `after`: the events after it, led
    /// by the newest one at or before it (an anchor, so a reader whose log is sparse sees no
    /// gap that is not there, and one the ring moved past sees the gap), oldest first, one
    /// page: [`PAGE_BYTES`] past the anchor and the first new event, ending `"more": true`
    /// when newer events wait ([`more_waiting`]). A ring that restarted below `after` is read
    /// from its oldest, so the reader sees the reset.
    pub fn read_json_after(&self, after: u64) -> String {
        let inner = self.inner.locked();
        let newest = inner.events.back().map_or(0, |e| e.seq);
        let hole = inner
            .gaps
            .iter()
            .find(|&&g| g > after.saturating_add(1))
            .copied();
        // The last event at or before `after`, else the first.
        let anchor = inner
            .events
            .partition_point(|e| e.seq <= after)
            .saturating_sub(1);
        let mut stop = inner.events.len();
        let start = if inner.mirrored && newest < after && after > inner.reset_from {
            // A mirror behind the reader: nothing new yet (never a replay).
            inner.events.len()
        } else if let Some(g) = hole.filter(|_| inner.mirrored) {
            // A hole after the reader's seq: what is held before it first (a page that stops
            // there, saying more), then from past it with no anchor, so the reader sees the gap.
            let at = inner.events.partition_point(|e| e.seq < g);
            match inner.events.range(anchor..at).any(|e| e.seq > after) {
                true => {
                    stop = at;
                    anchor
                }
                false => at,
            }
        } else if newest < after {
            0
        } else {
            anchor
        };
        Self::page(&inner, start, stop, PAGE_BYTES)
    }

    /// The seq the next event will get; a cursor meaning "from now".
    pub fn head(&self) -> u64 {
        self.inner.locked().next_seq - 1
    }

    /// Events with seq greater than `cursor` and pushed at or after `not_before_ms`, at most
    /// `max` (at least 1).
    ///
    /// A cursor past the head is not from this ring's history (seq starts at the wall clock, so
    /// a ring that replaced an older one for the same URI always starts above the older one's
    /// cursors): everything held is returned, marked truncated, rather than skipping what
    /// comes until the ring catches up with a stranger's number.
    pub fn since(&self, cursor: u64, max: usize, not_before_ms: u64) -> Since {
        let max = max.max(1);
        let inner = self.inner.locked();
        let head = inner.next_seq - 1;
        let oldest = inner.events.front().map_or(inner.next_seq, |e| e.seq);
        if inner.mirrored && cursor > head && cursor > inner.reset_from {
            // Not caught up with this cursor yet: nothing now, the cursor kept.
            return Since {
                events: Vec::new(),
                cursor,
                truncated: false,
                has_more: false,
            };
        }
        let (cursor, mut truncated) = if cursor > head {
            (oldest - 1, true)
        } else {
            (cursor, false)
        };
        // Seqs between the cursor and the oldest held event were dropped (or, in a ring that
        // started after the cursor was handed out, never seen here): either way, skipped. A
        // mirror's cursor 0 is "from its start", which skips nothing.
        truncated |= oldest > cursor.saturating_add(1)
            && !(inner.mirrored && cursor == 0 && oldest == inner.first_mirrored);
        truncated |= inner.gaps.iter().any(|&g| g > cursor.saturating_add(1));
        let mut events = Vec::new();
        let mut has_more = false;
        for e in inner.events.iter().filter(|e| e.seq > cursor) {
            if e.ts_ms < not_before_ms {
                truncated = true;
                continue;
            }
            if events.len() == max {
                has_more = true;
                break;
            }
            events.push(Logged {
                seq: e.seq,
                ts_ms: e.ts_ms,
                event: serde_json::from_str(&e.text).unwrap_or(Value::Null),
            });
        }
        let cursor = match (has_more, events.last()) {
            (true, Some(last)) => last.seq,
            _ => head,
        };
        Since {
            events,
            cursor,
            truncated,
            has_more,
        }
    }

    pub fn len(&self) -> usize {
        self.inner.locked().events.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// `event` (serialized to `size` bytes, over [`MAX_EVENT_BYTES`]) with its biggest fields
/// replaced by a marker saying how big each was, biggest first, until it fits; `seq` and
/// `type` are kept, and `"truncated": true` says the event is not whole.
fn truncated(mut event: Map<String, Value>, size: usize) -> String {
    let mut sizes: Vec<(String, usize)> = event
        .iter()
        .filter(|(k, _)| *k != "seq" && *k != "type")
        .map(|(k, v)| (k.clone(), v.to_string().len()))
        .collect();
    sizes.sort_by_key(|s| std::cmp::Reverse(s.1));
    let mut size = size;
    for (key, bytes) in sizes {
        if size <= MAX_EVENT_BYTES {
            break;
        }
        let marker = serde_json::json!({"truncated": true, "bytes": bytes});
        size = size + marker.to_string().len() - bytes;
        event.insert(key, marker);
    }
    event.insert("truncated".into(), Value::Bool(true));
    let text = Value::Object(event).to_string();
    if text.len() <= MAX_EVENT_BYTES {
        return text;
    }
    // Too many fields even as markers: keep what names the event.
    let mut kept = Map::new();
    for k in ["seq", "type", "truncated"] {
        if let Some(v) = serde_json::from_str::<Map<String, Value>>(&text)
            .ok()
            .and_then(|m| m.get(k).cloned())
        {
            kept.insert(k.into(), v);
        }
    }
    Value::Object(kept).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ev(seq: u64) -> String {
        format!("{{\"seq\":{seq},\"type\":\"ADDED\"}}")
    }

    #[test]
    fn a_mirror_keeps_the_publishers_seqs_and_says_where_it_has_holes() {
        let m = EventRing::mirror_of(8);
        let empty = m.since(0, 10, 0);
        assert_eq!((empty.cursor, empty.truncated), (0, false));
        assert!(m.mirror(1000, 1, ev(1000)));
        assert!(m.mirror(1001, 1, ev(1001)));
        assert!(!m.mirror(1001, 1, ev(1001)), "a repeat is not kept");
        assert!(!m.mirror(999, 1, ev(999)), "nor an older one");
        let all = m.since(0, 10, 0);
        assert_eq!(all.events.len(), 2);
        assert!(!all.truncated, "a mirror's cursor 0 is its start");
        assert_eq!(all.cursor, 1001);
        // A cursor it has not caught up with yet: nothing, the cursor kept.
        let ahead = m.since(1005, 10, 0);
        assert!(ahead.events.is_empty() && !ahead.truncated);
        assert_eq!(ahead.cursor, 1005);
        // A hole (1002..1004 never came): a reader from before it learns it.
        assert!(m.mirror(1005, 1, ev(1005)));
        assert!(m.since(1001, 10, 0).truncated);
        assert!(!m.since(1005, 10, 0).truncated);
        assert_eq!(m.newest_ts_ms(), Some(1));
        // Read-based readers: behind them, nothing (no replay); a hole after their seq, from
        // past it with no anchor (the reader sees the gap).
        assert_eq!(m.read_json_after(2000), "{\"events\":[]}");
        assert_eq!(
            m.read_json_after(1001),
            format!("{{\"events\":[{}]}}", ev(1005))
        );
        // A reader further back gets what is held before the hole first, saying more; then
        // from past the hole, where it sees the gap.
        let page = m.read_json_after(1000);
        assert_eq!(
            page,
            format!("{{\"events\":[{},{}],\"more\":true}}", ev(1000), ev(1001))
        );
        assert!(more_waiting(&page));
        // Once the mirror's first event is evicted, a cursor 0 learns what it missed.
        let small = EventRing::mirror_of(2);
        for seq in [10, 11, 12] {
            assert!(small.mirror(seq, 1, ev(seq)));
        }
        assert!(small.since(0, 10, 0).truncated);
        // Its publisher restarted with its clock behind: the log starts over, and a reader of
        // the old numbering reads it whole, truncated (a cursor past both still waits).
        small.reset_mirror(5, 1, ev(5));
        let after = small.since(12, 10, 0);
        assert!(after.truncated, "{:?}", after.cursor);
        assert_eq!(after.events.len(), 1);
        assert_eq!(after.cursor, 5);
        assert!(small.since(20, 10, 0).events.is_empty());
        assert_eq!(
            small.read_json_after(12),
            format!("{{\"events\":[{}]}}", ev(5))
        );
        assert!(small.mirror(6, 1, ev(6)), "and goes on from there");
    }

    fn seqs(text: &str) -> Vec<u64> {
        let v: serde_json::Value = serde_json::from_str(text).unwrap();
        v["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["seq"].as_u64().unwrap())
            .collect()
    }

    #[test]
    fn a_read_after_a_seq_has_the_anchor_and_what_is_newer() {
        let r = EventRing::with_start(4, 10);
        for i in 0..6 {
            r.push(
                "ADDED",
                serde_json::Map::from_iter([("i".into(), json!(i))]),
            );
        }
        // Held: 12..=15 (the ring keeps 4).
        assert_eq!(seqs(&r.read_json()), [12, 13, 14, 15]);
        assert_eq!(seqs(&r.read_json_after(13)), [13, 14, 15], "13 anchors");
        assert_eq!(
            seqs(&r.read_json_after(15)),
            [15],
            "nothing newer: the anchor alone"
        );
        // Moved past the reader: no anchor, the first held shows the gap.
        assert_eq!(seqs(&r.read_json_after(5)), [12, 13, 14, 15]);
        assert_eq!(seqs(&r.read_json_after(11)), [12, 13, 14, 15]);
        // Restarted below the reader: whole, so it sees the reset.
        assert_eq!(seqs(&r.read_json_after(99)), [12, 13, 14, 15]);
        assert_eq!(
            seqs(&EventRing::new(4).read_json_after(3)),
            Vec::<u64>::new()
        );
    }

    #[test]
    fn the_ring_is_bounded_by_bytes_and_a_huge_event_is_kept_truncated() {
        let r = EventRing::with_start(256, 1);
        let big = "x".repeat(MAX_EVENT_BYTES / 2);
        for i in 0..40 {
            r.push(
                "MODIFIED",
                fields(json!({"key": i, "object": big, "old": big})),
            );
            assert!(r.bytes() <= RING_BYTES, "{} bytes held", r.bytes());
        }
        assert!(r.len() < 40 && r.len() >= RING_BYTES / (MAX_EVENT_BYTES + 1));
        assert!(r.read_json().len() <= RING_BYTES + 64);
        let body: Value = serde_json::from_str(&r.read_json()).unwrap();
        let last = body["events"].as_array().unwrap().last().unwrap().clone();
        assert_eq!(last["key"], 39, "the newest is kept");
        assert_eq!(last["truncated"], true);
        assert_eq!(last["type"], "MODIFIED");
        // The biggest field goes first (ties in key order), and only as many as it takes.
        assert_eq!(last["object"]["truncated"], true);
        assert_eq!(last["object"]["bytes"], big.len() + 2);
        assert_eq!(last["old"], big, "one marker was enough");
        // An event that fits is kept whole, with no marker.
        r.push("ADDED", fields(json!({"key": "small", "object": 1})));
        let s = r.since(r.head() - 1, 10, 0);
        assert_eq!(
            s.events[0].event,
            json!({"seq": r.head(), "type": "ADDED", "key": "small", "object": 1})
        );
        // One event bigger than the whole ring replaces everything before it, truncated.
        r.push(
            "ADDED",
            fields(json!({"key": "huge", "object": "y".repeat(RING_BYTES * 2)})),
        );
        assert!(r.bytes() <= RING_BYTES);
        let s = r.since(r.head() - 1, 10, 0);
        assert_eq!(s.events[0].event["object"]["bytes"], RING_BYTES * 2 + 2);
    }

    #[test]
    fn a_read_cut_to_its_newest_events_is_still_a_read() {
        let r = EventRing::with_start(16, 1);
        for i in 0..10 {
            r.push(
                "ADDED",
                fields(json!({"key": i, "object": "x".repeat(100)})),
            );
        }
        let cut = newest_within(&r.read_json(), 500).unwrap();
        assert_eq!(seqs(&cut), [8, 9, 10]);
        assert_eq!(
            seqs(&newest_within(&r.read_json(), 1).unwrap()),
            [10],
            "at least one"
        );
        assert_eq!(
            newest_within("{\"events\":[]}", 10).as_deref(),
            Some("{\"events\":[]}")
        );
        assert!(newest_within("[1]", 10).is_none());
    }

    #[test]
    fn the_byte_bound_follows_the_capacity() {
        assert_eq!(ring_bytes(16), RING_BYTES);
        assert_eq!(ring_bytes(4096), 4096 * BYTES_PER_EVENT);
        assert_eq!(ring_bytes(1 << 20), MAX_RING_BYTES);
        let kib = "x".repeat(1000);
        let (small, large) = (EventRing::new(64), EventRing::new(4096));
        for i in 0..3000 {
            small.push("ADDED", fields(json!({"key": i, "object": kib})));
            large.push("ADDED", fields(json!({"key": i, "object": kib})));
        }
        assert_eq!(small.len(), 64, "bounded in events");
        assert_eq!(
            large.len(),
            3000,
            "3 MB held: the bound grew with the capacity"
        );
        // A whole read stays one message: the newest RING_BYTES.
        let whole = large.read_json();
        assert!(whole.len() <= RING_BYTES + 64, "{} bytes", whole.len());
        assert!(!more_waiting(&whole));
        assert_eq!(*seqs(&whole).last().unwrap(), large.head());
    }

    #[test]
    fn a_read_after_a_seq_comes_in_pages_each_saying_whether_more_waits() {
        let r = EventRing::with_start(4096, 1);
        let kib = "x".repeat(2000);
        for i in 0..1000 {
            r.push("ADDED", fields(json!({"key": i, "object": kib})));
        }
        let (mut after, mut got, mut pages) = (0, Vec::new(), 0);
        loop {
            let text = r.read_json_after(after);
            pages += 1;
            assert!(
                text.len() <= PAGE_BYTES + 3 * 2100,
                "a page of {} bytes",
                text.len()
            );
            let page = seqs(&text);
            assert!(page[0] <= after.max(1), "led by the anchor");
            got.extend(page.iter().copied().filter(|&s| s > after));
            after = *page.last().unwrap();
            if !more_waiting(&text) {
                break;
            }
        }
        assert_eq!(
            got,
            (1..=1000).collect::<Vec<u64>>(),
            "every event once, in order"
        );
        assert!(pages >= 8, "{pages} pages");
        assert_eq!(
            seqs(&r.read_json_after(1000)),
            [1000],
            "caught up: the anchor alone"
        );
        assert!(!more_waiting(&r.read_json_after(1000)));
        // A page still reads as an event log.
        let page = r.read_json_after(10);
        assert_eq!(newest_seq(&page), seqs(&page).last().copied());
        assert_eq!(raw_events(&page).map(|e| e.len()), Some(seqs(&page).len()));
    }

    fn fields(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn seq_increases_and_ring_is_bounded() {
        let r = EventRing::with_start(3, 10);
        for i in 0..5 {
            r.push("ADDED", fields(json!({"key": i, "seq": 999})));
        }
        let body: Value = serde_json::from_str(&r.read_json()).unwrap();
        let seqs: Vec<u64> = body["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["seq"].as_u64().unwrap())
            .collect();
        assert_eq!(seqs, vec![12, 13, 14]);
        assert_eq!(body["events"][0]["type"], "ADDED");
        assert_eq!(body["events"][2]["key"], 4);
    }

    #[test]
    fn empty_ring_reads_as_empty_list() {
        let r = EventRing::new(4);
        assert_eq!(r.read_json(), r#"{"events":[]}"#);
        assert!(r.head() > 1_000_000, "seq starts at the wall clock in µs");
    }

    #[test]
    fn error_events_are_in_band() {
        let r = EventRing::with_start(4, 1);
        r.push_error("kubectl exited: boom");
        let body: Value = serde_json::from_str(&r.read_json()).unwrap();
        assert_eq!(
            body["events"][0],
            json!({"seq":1,"type":"ERROR","message":"kubectl exited: boom"})
        );
    }

    #[test]
    fn since_reports_truncation_and_more() {
        let r = EventRing::with_start(3, 1);
        for _ in 0..5 {
            r.push("X", Map::new());
        }
        // held: 3, 4, 5
        let seqs = |s: &Since| s.events.iter().map(|e| e.seq).collect::<Vec<_>>();
        let s = r.since(1, 10, 0);
        assert!(s.truncated);
        assert_eq!(s.cursor, 5);
        assert_eq!(seqs(&s), [3, 4, 5]);
        assert_eq!(s.events[0].event["seq"], 3);
        let s = r.since(3, 1, 0);
        assert!(!s.truncated && s.has_more);
        assert_eq!(s.cursor, 4);
        assert_eq!(seqs(&s), [4]);
        let s = r.since(5, 10, 0);
        assert!(!s.truncated && !s.has_more && s.events.is_empty());
        assert_eq!(s.cursor, 5);
    }

    #[test]
    fn a_cursor_from_before_a_fresh_ring_is_truncated_once() {
        // The ring of a URI that was let go and watched again starts above old cursors.
        let r = EventRing::with_start(4, 100);
        let s = r.since(50, 10, 0);
        assert!(s.truncated && s.events.is_empty());
        assert_eq!(
            s.cursor, 99,
            "advanced to the head, so the gap is reported once"
        );
        let s = r.since(s.cursor, 10, 0);
        assert!(!s.truncated);
    }

    #[test]
    fn a_cursor_past_the_head_is_a_reset() {
        let r = EventRing::with_start(4, 10);
        r.push("X", Map::new());
        let s = r.since(1_000, 10, 0);
        assert!(s.truncated);
        assert_eq!(
            s.events.len(),
            1,
            "everything held, not silence until seq 1000"
        );
        assert_eq!(s.cursor, 10);
    }

    #[test]
    fn events_older_than_the_floor_are_skipped_as_truncated() {
        let r = EventRing::with_start(8, 1);
        r.push_at("OLD", Map::new(), 1_000);
        r.push_at("NEW", Map::new(), 5_000);
        let s = r.since(0, 10, 4_000);
        assert!(s.truncated);
        assert_eq!(s.events.len(), 1);
        assert_eq!(s.events[0].event["type"], "NEW");
        assert_eq!(s.events[0].ts_ms, 5_000);
        let s = r.since(0, 10, 0);
        assert!(!s.truncated && s.events.len() == 2);
    }

    #[test]
    fn the_read_shape_carries_no_push_time() {
        let r = EventRing::with_start(2, 7);
        r.push_at("X", Map::new(), 123);
        assert_eq!(r.read_json(), r#"{"events":[{"seq":7,"type":"X"}]}"#);
    }
}
