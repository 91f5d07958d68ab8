//! The event-log ring: the bounded, seq-numbered event history behind every event-log resource.
//!
//! Reads are stateless (`{"events":[...]}` of everything still held), so any number of readers
//! share one ring; each reader keeps its own last-seen `seq`. `seq` starts at the ring's creation
//! time in microseconds since the epoch, so it keeps increasing across restarts of the source, and
//! a client that watched the previous process sees a GAP instead of silently skipping events.

use std::collections::VecDeque;
use std::sync::Mutex;

use serde_json::{Map, Value};

/// MIME type of an event-log read (reference 000's wire name).
pub const EVENT_LOG_MIME: &str = "application/vnd.asyncai.events+json";

/// Default number of events a ring keeps.
pub const DEFAULT_RING_CAPACITY: usize = 256;

/// A bounded ring of events with monotonically increasing `seq`.
#[derive(Debug)]
pub struct EventRing {
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    capacity: usize,
    next_seq: u64,
    /// `(seq, serialized event)`; serialized once, when pushed.
    events: VecDeque<(u64, String)>,
}

/// The events after a cursor, for `events/poll`.
#[derive(Debug, PartialEq)]
pub struct Since {
    pub events: Vec<Value>,
    /// The cursor to continue from: the seq of the last event returned, or the input cursor.
    pub cursor: u64,
    /// Events past the cursor were dropped by the ring before this read.
    pub truncated: bool,
    /// More events are waiting beyond `max`.
    pub has_more: bool,
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
                next_seq: first_seq.max(1),
                events: VecDeque::new(),
            }),
        }
    }

    /// Appends an event of `kind` with `fields`; returns its seq. `seq` and `type` are set here
    /// and override any of the same name in `fields`.
    pub fn push(&self, kind: &str, fields: Map<String, Value>) -> u64 {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
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
        let text = Value::Object(event).to_string();
        if inner.events.len() == inner.capacity {
            inner.events.pop_front();
        }
        inner.events.push_back((seq, text));
        seq
    }

    /// An in-band `ERROR` event: source failures are reported in the log, not as read errors.
    pub fn push_error(&self, message: &str) -> u64 {
        let mut f = Map::new();
        f.insert("message".into(), Value::from(message));
        self.push("ERROR", f)
    }

    /// The read body: `{"events":[...]}`, oldest first.
    pub fn read_json(&self) -> String {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let mut out =
            String::with_capacity(16 + inner.events.iter().map(|e| e.1.len() + 1).sum::<usize>());
        out.push_str("{\"events\":[");
        for (i, (_, text)) in inner.events.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(text);
        }
        out.push_str("]}");
        out
    }

    /// The seq the next event will get; a cursor meaning "from now".
    pub fn head(&self) -> u64 {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .next_seq
            - 1
    }

    /// Events with seq greater than `cursor`, at most `max`.
    pub fn since(&self, cursor: u64, max: usize) -> Since {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let oldest = inner.events.front().map(|e| e.0).unwrap_or(inner.next_seq);
        let truncated = oldest > cursor.saturating_add(1) && cursor < inner.next_seq - 1;
        let mut events = Vec::new();
        let mut last = cursor;
        let mut has_more = false;
        for (seq, text) in inner.events.iter().filter(|(s, _)| *s > cursor) {
            if events.len() == max {
                has_more = true;
                break;
            }
            events.push(serde_json::from_str(text).unwrap_or(Value::Null));
            last = *seq;
        }
        Since {
            events,
            cursor: last,
            truncated,
            has_more,
        }
    }

    pub fn len(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .events
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
        let s = r.since(1, 10);
        assert!(s.truncated);
        assert_eq!(s.cursor, 5);
        assert_eq!(s.events.len(), 3);
        let s = r.since(3, 1);
        assert!(!s.truncated && s.has_more);
        assert_eq!(s.cursor, 4);
        let s = r.since(5, 10);
        assert!(!s.truncated && !s.has_more && s.events.is_empty());
        assert_eq!(s.cursor, 5);
    }
}
