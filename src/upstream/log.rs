//! Following an event log (`{"events":[...]}` read by `seq`, such as `memo://log` or the Slack
//! source's `slack-events://…`): the cursor ([`LogCursor`], the highest `seq` delivered), the
//! delivery of what is past it with `GAP` ([`extract_log`], [`extract_log_text`]), the
//! `changed` paths of a MODIFIED ([`changed_paths`]), and [`LogFollow`], a listen on the log
//! and the reads past the cursor on each update ([`Upstream::follow_log`]). Pure functions over
//! JSON but for [`LogFollow`]; the watch client and the agent's Slack inbox both use them.

use std::collections::BTreeSet;
use std::sync::Arc;

use rmcp::model::SubscriptionFilter;
use serde_json::{Map, Value};

use super::{Listening, Upstream, UpstreamError};

/// An event as the filter's `event` dict shapes it (a JSON object).
pub type Event = Map<String, Value>;

/// Paths (from an item's root) never reported in `changed`.
const IGNORED: [&str; 3] = [
    "metadata.resourceVersion",
    "metadata.generation",
    "metadata.managedFields",
];

/// How deep `changed` paths go.
const CHANGED_DEPTH: usize = 3;

/// Sorted dotted paths where `old` and `new` differ, at most three levels deep, ignoring
/// the Kubernetes bookkeeping fields. Values that are not both objects differ at the root,
/// reported as the empty path.
pub fn changed_paths(old: &Value, new: &Value) -> Vec<String> {
    let mut out = BTreeSet::new();
    walk(old, new, "", 0, &mut out);
    out.into_iter().collect()
}

fn walk(old: &Value, new: &Value, path: &str, depth: usize, out: &mut BTreeSet<String>) {
    if IGNORED.contains(&path) || old == new {
        return;
    }
    match (old, new) {
        (Value::Object(a), Value::Object(b)) if depth < CHANGED_DEPTH => {
            let null = Value::Null;
            // Each key of either side once (a key of both is walked from `a`).
            let keys = a.keys().chain(b.keys().filter(|k| !a.contains_key(*k)));
            for k in keys {
                let (x, y) = (a.get(k).unwrap_or(&null), b.get(k).unwrap_or(&null));
                if x == y {
                    // Nothing under it differs: no path to make.
                    continue;
                }
                let sub = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                walk(x, y, &sub, depth + 1, out);
            }
        }
        _ => {
            out.insert(path.to_owned());
        }
    }
}

/// What a reader of an event log whose listen carries reads has read for itself past what its
/// stream carried (after listening again, or after a carried read that failed): the stream's
/// reads made before that hold nothing new, and taken, one ending below the cursor would read
/// as a log that restarted. A carried read is passed over when it continues the stream (its
/// newest at or past the last one carried) and ends at or below what the reader read itself;
/// one below the last carried is a log that really restarted, and is taken.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReadAhead {
    /// The seq the reader read up to itself, until the stream carries past it.
    floor: Option<u64>,
    /// The newest seq of the last read the stream carried.
    carried: Option<u64>,
}

impl ReadAhead {
    /// The reader read (for itself) up to `seq`.
    pub fn read_to(&mut self, seq: Option<u64>) {
        self.floor = seq;
    }

    /// The stream carried a read whose newest seq is `newest` (its baseline, say).
    pub fn carried(&mut self, newest: Option<u64>) {
        if newest.is_some() {
            self.carried = newest;
        }
    }

    /// Whether a carried read whose newest seq is `newest` is one to pass over (`newest` is
    /// only looked for while the reader is ahead: a scan of the read saved on every other).
    pub fn passed(&mut self, newest: impl FnOnce() -> Option<u64>) -> bool {
        let Some(f) = self.floor else { return false };
        let Some(n) = newest() else { return false };
        let stale = n <= f && self.carried.is_none_or(|c| n >= c);
        self.carried = Some(n);
        if !stale {
            self.floor = None;
        }
        stale
    }
}

/// The most pages of an event log one read after a change takes: a whole ring of the largest
/// size ([`crate::mcp::ring::MAX_RING_BYTES`]), so a reader that fell behind catches up whole.
pub const PAGES_PER_READ: usize =
    crate::mcp::ring::MAX_RING_BYTES / crate::mcp::ring::PAGE_BYTES + 1;

/// Where an event-log watch is: the highest seq delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LogCursor {
    pub last: Option<u64>,
}

/// [`extract_log`] on a read's text, building in full only the events it can return: the
/// others (those at or below the cursor, most of a busy ring) are only scanned for their
/// `seq`. Same result as parsing the whole body and calling [`extract_log`].
pub fn extract_log_text(cursor: LogCursor, text: &str) -> Result<(Vec<Event>, LogCursor), String> {
    use crate::mcp::ring::{raw_events, seq_of};
    const SHAPE: &str = "an event-log read must be {\"events\":[...]}";
    let events = raw_events(text).ok_or(SHAPE)?;
    let held: Vec<(u64, &serde_json::value::RawValue)> = events
        .into_iter()
        .filter_map(|r| Some((seq_of(r)?, r)))
        .collect();
    let newest = held.iter().map(|(s, _)| *s).max();
    let oldest = held.iter().map(|(s, _)| *s).min();
    // What extract_log looks at: the oldest and newest seqs, and every event past the
    // cursor (all of them when the log restarted below it).
    let keep = |s: u64| match cursor.last {
        None => Some(s) == newest,
        Some(last) => {
            newest.is_some_and(|n| n < last) || s > last || Some(s) == oldest || Some(s) == newest
        }
    };
    let mut kept = Vec::new();
    for (s, r) in held {
        if keep(s) {
            kept.push((
                s,
                serde_json::from_str::<Value>(r.get()).map_err(|e| e.to_string())?,
            ));
        }
    }
    Ok(extract_held(cursor, kept))
}

/// Reads an event-log body (`{"events":[...]}`) against `cursor`: returns the events with seq
/// greater than the last seen (a `GAP` first when the oldest held seq is beyond last + 1; a
/// `GAP` with `reset` when the log restarted below the cursor) and the new cursor. The first
/// read only sets the cursor (the baseline). A MODIFIED carrying `old` and `object` gets
/// `changed`, and is dropped when nothing but bookkeeping changed.
pub fn extract_log(cursor: LogCursor, body: &Value) -> Result<(Vec<Event>, LogCursor), String> {
    let events = body
        .get("events")
        .and_then(Value::as_array)
        .ok_or("an event-log read must be {\"events\":[...]}")?;
    let seq = |e: &Value| e.get("seq").and_then(Value::as_u64);
    // The baseline keeps nothing but the newest seq: copy no event for it.
    let held: Vec<(u64, Value)> = match cursor.last {
        None => events
            .iter()
            .filter_map(seq)
            .max()
            .map(|s| (s, Value::Null))
            .into_iter()
            .collect(),
        Some(_) => events
            .iter()
            .filter_map(|e| seq(e).map(|s| (s, e.clone())))
            .collect(),
    };
    Ok(extract_held(cursor, held))
}

/// [`extract_log`] over the events held, each with its seq, taken (not copied) into what it
/// returns.
fn extract_held(cursor: LogCursor, mut held: Vec<(u64, Value)>) -> (Vec<Event>, LogCursor) {
    held.sort_by_key(|(s, _)| *s);
    let newest = held.last().map(|(s, _)| *s);
    let Some(last) = cursor.last else {
        return (
            Vec::new(),
            LogCursor {
                last: newest.or(Some(0)),
            },
        );
    };
    let mut out = Vec::new();
    let (from, reset) = match newest {
        Some(n) if n < last => (0, true),
        _ => (last, false),
    };
    let first_new = held.iter().map(|(s, _)| *s).find(|s| *s > from);
    // `last == 0` means the baseline read found an empty log: nothing was seen, so nothing
    // can have been missed (seq numbers start at 1, often far above it).
    let oldest_held = held.first().map(|(s, _)| *s);
    if let (Some(first_new), Some(oldest)) = (first_new, oldest_held)
        && (reset || (last > 0 && oldest > from + 1))
    {
        let mut gap = Event::new();
        gap.insert("type".into(), "GAP".into());
        gap.insert("after_seq".into(), last.into());
        gap.insert("next_seq".into(), first_new.into());
        if reset {
            gap.insert("reset".into(), true.into());
            gap.insert(
                "message".into(),
                "the event log restarted; events since the last one seen may be missing".into(),
            );
        } else {
            gap.insert(
                "message".into(),
                format!("events {} to {} were missed", from + 1, first_new - 1).into(),
            );
        }
        out.push(gap);
    }
    for (s, e) in held {
        let Value::Object(mut ev) = e else { continue };
        if s <= from {
            continue;
        }
        if ev.get("type").and_then(Value::as_str) == Some("MODIFIED")
            && let (Some(old), Some(new)) = (ev.get("old"), ev.get("object"))
        {
            let changed = changed_paths(old, new);
            if changed.is_empty() {
                continue;
            }
            ev.insert(
                "changed".into(),
                changed.into_iter().map(Value::from).collect(),
            );
        }
        ev.entry("old").or_insert(Value::Null);
        out.push(ev);
    }
    let last = newest.map_or(last, |n| if reset { n } else { n.max(last) });
    (out, LogCursor { last: Some(last) })
}

/// An event log followed on one upstream: see [`Upstream::follow_log`].
pub struct LogFollow {
    up: Arc<Upstream>,
    uri: String,
    sub: Listening,
    cursor: LogCursor,
    ahead: ReadAhead,
}

impl Upstream {
    /// Follows the event log `uri`: listens, then reads (so a change between the two is seen,
    /// never missed). From `cursor` (where an earlier follow got to) the first answer is what
    /// is past it, a `GAP` first when some was missed; without one the read is the baseline:
    /// the cursor is set at its newest event and the first answer is every event a whole read
    /// holds now (the newest 1 MiB of a herald log), for a caller that picks from them itself.
    /// A server that refuses the
    /// listen, or does not accept this URI, is [`UpstreamError::is_verdict`].
    pub async fn follow_log(
        self: &Arc<Self>,
        uri: &str,
        cursor: Option<LogCursor>,
    ) -> Result<(LogFollow, Vec<Event>), UpstreamError> {
        let sub = self
            .listen(
                SubscriptionFilter::builder()
                    .resource_subscription(uri)
                    .build(),
            )
            .await?;
        let accepted = sub
            .acknowledged()
            .resource_subscriptions
            .as_ref()
            .is_some_and(|u| u.iter().any(|a| a == uri));
        if !accepted {
            return Err(self.unusable("does not accept subscriptions to this URI"));
        }
        let mut follow = LogFollow {
            up: self.clone(),
            uri: uri.to_owned(),
            sub,
            cursor: cursor.unwrap_or_default(),
            ahead: ReadAhead::default(),
        };
        let first = match cursor {
            Some(_) => follow.read().await?,
            None => {
                let text = follow.read_text().await?;
                let body: Value = serde_json::from_str(&text)
                    .map_err(|_| self.unusable("answered an event-log read that is not JSON"))?;
                let (_, at) =
                    extract_log(LogCursor::default(), &body).map_err(|e| self.unusable(&e))?;
                follow.cursor = at;
                body["events"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|e| e.as_object().cloned())
                    .collect()
            }
        };
        // The stream's first carried read (its baseline) was made before this one, or after.
        follow.ahead.read_to(follow.cursor.last);
        Ok((follow, first))
    }
}

impl LogFollow {
    /// Where the follow has got to: pass it to the next [`Upstream::follow_log`].
    pub fn cursor(&self) -> LogCursor {
        self.cursor
    }

    /// Waits for the log to change, then reads what is past the cursor (a `GAP` first when
    /// some was missed). Updates already queued are folded into the one read. `None`: the
    /// subscription ended; follow again from [`LogFollow::cursor`].
    pub async fn next(&mut self) -> Option<Result<Vec<Event>, UpstreamError>> {
        let mut heard = match self.sub.next().await {
            Ok(Some(n)) => vec![n],
            _ => return None,
        };
        while let Some(Ok(Some(n))) = futures::FutureExt::now_or_never(self.sub.next()) {
            heard.push(n);
        }
        // Updates that carry their reads are taken in order, with no read of its own.
        if self.sub.carries()
            && let Some(events) = self.take_carried(heard)
        {
            return Some(Ok(events));
        }
        // Where the stream got to: its reads below that continue from it.
        self.ahead.carried(self.cursor.last);
        let r = self.read().await;
        if r.as_ref().is_err_and(UpstreamError::is_broken) {
            self.up.forget_connection_of(&self.sub);
        }
        Some(r)
    }

    /// The events the updates among `heard` carried, past the cursor; `None` when one of
    /// them carried none (the follow reads instead).
    fn take_carried(&mut self, heard: Vec<rmcp::model::ServerNotification>) -> Option<Vec<Event>> {
        let mut cursor = self.cursor;
        let mut events = Vec::new();
        for n in heard {
            let rmcp::model::ServerNotification::ResourceUpdatedNotification(mut u) = n else {
                continue;
            };
            let crate::mcp::source::Body::Text(text) = super::carried(&mut u)?.ok()?.body else {
                return None;
            };
            if self.ahead.passed(|| crate::mcp::ring::newest_seq(&text)) {
                continue;
            }
            let (more, next) = extract_log_text(cursor, &text).ok()?;
            events.extend(more);
            cursor = next;
        }
        self.cursor = cursor;
        Some(events)
    }

    async fn read_text(&self) -> Result<String, UpstreamError> {
        let c = self.up.read(&self.uri, self.cursor.last).await?;
        match c.body {
            crate::mcp::source::Body::Text(t) => Ok(t),
            crate::mcp::source::Body::Blob(_) => {
                Err(self.up.unusable("answered an event-log read with a blob"))
            }
        }
    }

    /// What is past the cursor, page by page until the log's newest event (at most
    /// [`PAGES_PER_READ`]). A page that fails after others were read leaves them taken: they
    /// are returned, the cursor past them.
    async fn read(&mut self) -> Result<Vec<Event>, UpstreamError> {
        let mut events = Vec::new();
        for _ in 0..PAGES_PER_READ {
            let before = self.cursor.last;
            let page = match self.read_text().await {
                Ok(text) => extract_log_text(self.cursor, &text)
                    .map(|p| (p, crate::mcp::ring::more_waiting(&text)))
                    .map_err(|e| self.up.unusable(&e)),
                Err(e) => Err(e),
            };
            let ((page, next), more) = match page {
                Ok(p) => p,
                Err(e) if events.is_empty() => return Err(e),
                Err(_) => break,
            };
            events.extend(page);
            self.cursor = next;
            self.ahead.read_to(next.last);
            // A log that restarted below the cursor moves back.
            if !(before.is_some() && more && next.last != before) {
                break;
            }
        }
        Ok(events)
    }
}
