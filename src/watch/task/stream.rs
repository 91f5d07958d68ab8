//! Watches on an event type (`events:NAME?arg=value`): the events themselves are pushed
//! (`events/stream`, or `events/poll` long polls where the server has no stream, by
//! [`EventFollow`]), and each goes through the same filter, dedupe and debounce as an event
//! log's. The follow runs in a task of its own, handing what it gets to the watch through a
//! small channel, so the watch's other work (a filter run, a debounce deadline) never cuts a
//! stream short; a follow that breaks starts again from its cursor with the watch's backoff,
//! and a gap the server reports (`truncated`) is a `GAP` line.

use std::sync::atomic::Ordering;

use rmcp::model::JsonObject;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::{Turn, WatchTask};
use crate::runtime::backoff::Backoff;
use crate::upstream::UpstreamError;
use crate::upstream::events::{EventFollow, Fed};
use crate::upstream::log::Event;
use crate::watch::notice::{Line, default_line};
use crate::watch::spec::{KEEP_TRYING_MAX, WatchError};

/// The scheme of a watch on an event type.
pub const EVENTS_SCHEME: &str = "events:";

/// `events:NAME?k=v&…` as the event type's name and its arguments (each value parsed as JSON
/// when it parses, else taken as a string, after `%XX` decoding); `None` for any other URI.
pub(crate) fn events_uri(uri: &str) -> Option<Result<(String, JsonObject), WatchError>> {
    let rest = uri.strip_prefix(EVENTS_SCHEME)?;
    let bad = |why: String| Some(Err(WatchError::Invalid(format!("{uri}: {why}"))));
    let (name, query) = rest.split_once('?').unwrap_or((rest, ""));
    if name.is_empty() {
        return bad("name the event type: events:NAME?ARG=VALUE (herald poll and events/list name them; through a gateway, SERVER__EVENT)".into());
    }
    let mut arguments = JsonObject::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let Some((k, v)) = pair.split_once('=') else {
            return bad(format!("argument {pair:?} is not KEY=VALUE"));
        };
        let (Some(k), Some(v)) = (decode(k), decode(v)) else {
            return bad(format!(
                "argument {pair:?} has a malformed %-escape (write % as %25)"
            ));
        };
        if k.is_empty() {
            return bad(format!("argument {pair:?} has an empty key"));
        }
        let value = serde_json::from_str(&v).unwrap_or(Value::String(v));
        arguments.insert(k, value);
    }
    Some(Ok((name.to_owned(), arguments)))
}

fn decode(s: &str) -> Option<String> {
    crate::runtime::percent::decode(&s.replace('+', " ")).ok()
}

/// What the follow's task hands the watch.
enum Step {
    Fed(Fed),
    /// The follow failed for the `attempt`-th time in a row; it tries again after a backoff.
    Failed {
        attempt: u32,
        error: UpstreamError,
    },
}

/// Runs `follow` and hands what it gets to `to`, pacing retries with `backoff`, until the
/// watch lets go of `to`.
async fn feed(mut follow: EventFollow, to: mpsc::Sender<Step>, mut backoff: Backoff) {
    let mut failures = 0;
    loop {
        let got = tokio::select! {
            _ = to.closed() => return,
            got = follow.next() => got,
        };
        let step = match got {
            Ok(fed) => {
                failures = 0;
                backoff.reset();
                Step::Fed(fed)
            }
            Err(error) => {
                failures += 1;
                Step::Failed {
                    attempt: failures,
                    error,
                }
            }
        };
        let failed = matches!(step, Step::Failed { .. });
        if to.send(step).await.is_err() {
            return;
        }
        if failed {
            tokio::select! {
                _ = to.closed() => return,
                _ = tokio::time::sleep(backoff.next_delay()) => {}
            }
        }
    }
}

/// An event as the watch sees it: its `data`'s fields (a herald event log's `seq`, `type`,
/// `key`, …), with `event` (the type's name), `eventId` and `timestamp` beside them.
fn watch_event(occurrence: Value) -> Event {
    let Value::Object(mut o) = occurrence else {
        let mut ev = Event::new();
        ev.insert("data".into(), occurrence);
        return ev;
    };
    let mut ev = match o.remove("data") {
        Some(Value::Object(d)) => d,
        Some(other) => Event::from_iter([("data".to_owned(), other)]),
        None => Event::new(),
    };
    for (from, to) in [
        ("name", "event"),
        ("eventId", "eventId"),
        ("timestamp", "timestamp"),
    ] {
        if let Some(v) = o.remove(from) {
            ev.entry(to).or_insert(v);
        }
    }
    ev
}

/// The line of an event with no filter: a herald event log's own line when the data is one
/// of its events (it has a `type`), else the type's name and the data.
fn event_line(ev: &Event) -> Line {
    if ev.contains_key("type") {
        return default_line(ev);
    }
    let mut data = ev.clone();
    for k in ["event", "eventId", "timestamp", "watch", "uri"] {
        data.remove(k);
    }
    let name = ev.get("event").and_then(Value::as_str).unwrap_or("EVENT");
    Line::Text(format!("{name} {}", Value::Object(data)))
}

impl WatchTask {
    /// Runs a watch on an event type whose follow has started (its first [`Fed::Started`]
    /// taken by the manager).
    pub(in crate::watch) async fn run_events(self, follow: EventFollow) {
        let handle = self.handle.clone();
        let scope = self.scope.clone();
        let filtered = self.spec.on_event.is_some();
        self.follow_events(follow).await;
        if filtered && let Some(pool) = handle.filters() {
            pool.drop_scope(&scope).await;
        }
    }

    async fn follow_events(mut self, follow: EventFollow) {
        let cfg = &self.handle.cfg;
        let backoff = match self.kept {
            false => cfg.resubscribe_backoff(),
            true => Backoff::new(cfg.resubscribe_base, KEEP_TRYING_MAX),
        };
        // A few batches: the follow's own channel holds the rest, and one that overflows
        // resumes from its cursor.
        let (tx, mut rx) = mpsc::channel(4);
        // Ends with the watch (a panic in the watch included).
        let _feeder =
            tokio_util::task::AbortOnDropHandle::new(tokio::spawn(feed(follow, tx, backoff)));
        let mut running = None;
        loop {
            let step = match self.turn(&mut running, rx.recv()).await {
                Turn::Stop => return,
                Turn::Idle => continue,
                Turn::Got(step) => step,
            };
            match step {
                Some(Step::Fed(Fed::Events {
                    events, truncated, ..
                })) => {
                    let mut evs = Vec::with_capacity(events.len() + 1);
                    if truncated {
                        evs.push(gap());
                    }
                    evs.extend(events.into_iter().map(watch_event));
                    // Every event is taken: a batch is split at the per-update limit
                    // (which bounds what one read of a log may bring, not a stream).
                    let max = self.handle.cfg.max_events_per_update.max(1);
                    let mut evs = evs.into_iter().peekable();
                    while evs.peek().is_some() {
                        let chunk: Vec<Event> = evs.by_ref().take(max).collect();
                        self.take_in(chunk, running.is_some(), event_line);
                    }
                }
                Some(Step::Fed(Fed::Started { truncated, push })) => {
                    self.handle.log.emit(
                        "watch.subscribed",
                        json!({"watch": self.spec.name, "uri": self.spec.uri,
                               "server": self.server.name.clone(), "push": push}),
                    );
                    if self.stats.starting.swap(false, Ordering::Relaxed) {
                        tracing::info!(watch = %self.spec.name, uri = %self.spec.uri, "watch following its events again");
                        self.handle.changed();
                    }
                    if truncated {
                        self.take_in(vec![gap()], running.is_some(), event_line);
                    }
                }
                Some(Step::Fed(Fed::Trouble(why))) => {
                    tracing::warn!(watch = %self.spec.name, server = %self.server.name, reason = %why,
                        "the server reports trouble on the event stream; it goes on");
                }
                Some(Step::Failed { attempt, error }) => {
                    if !self.failed(attempt, error).await {
                        return;
                    }
                }
                // The follow's task ended on its own: it panicked.
                None => {
                    self.fail("the event follow stopped").await;
                    return;
                }
            }
        }
    }

    /// The follow failed for the `attempt`-th time in a row; whether the watch goes on (it
    /// fails for good on the server's verdict, or after its resubscribe attempts unless it is
    /// kept).
    async fn failed(&mut self, attempt: u32, error: UpstreamError) -> bool {
        let handle = self.handle.clone();
        let cfg = &handle.cfg;
        let last_error = format!("{} on {}: {error}", self.spec.uri, self.server.name);
        if error.is_verdict() {
            self.stats.set_reason(last_error.clone());
            self.stats.failed.store(true, Ordering::Relaxed);
            let line = format!(
                "watch failed: {} refused {}: {error}; {}",
                self.server.name,
                self.spec.uri,
                cfg.restart.advice(&self.spec)
            );
            self.stats.notices.fetch_add(1, Ordering::Relaxed);
            self.handle
                .deliver(crate::watch::spec::Notice::new(
                    &self.spec.name,
                    &self.spec.uri,
                    vec![line],
                ))
                .await;
            self.handle.changed();
            return false;
        }
        self.flush_all().await;
        self.handle.log.emit(
            "watch.resubscribing",
            json!({"watch": self.spec.name, "uri": self.spec.uri, "attempt": attempt,
                   "reason": last_error}),
        );
        if self.kept {
            if attempt == cfg.resubscribe_attempts + 1 {
                self.lost_source(&last_error).await;
            } else if self.stats.starting.load(Ordering::Relaxed) {
                self.stats.set_reason(last_error);
            }
            return true;
        }
        if attempt > cfg.resubscribe_attempts {
            self.fail(&last_error).await;
            return false;
        }
        true
    }
}

/// The line a gap the server reported becomes.
fn gap() -> Event {
    let mut g = Event::new();
    g.insert("type".into(), "GAP".into());
    g.insert(
        "message".into(),
        "events were dropped before the next one (the server no longer held them)".into(),
    );
    g
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_events_uri_gives_the_name_and_typed_arguments() {
        let (name, args) = events_uri("events:memo__memo_changed?key=a%20b&n=3&on=true&s=x+y")
            .unwrap()
            .unwrap();
        assert_eq!(name, "memo__memo_changed");
        assert_eq!(
            Value::Object(args),
            json!({"key": "a b", "n": 3, "on": true, "s": "x y"})
        );
        assert!(events_uri("memo://notes").is_none());
        let (name, args) = events_uri("events:plain").unwrap().unwrap();
        assert_eq!((name.as_str(), args.len()), ("plain", 0));
        for bad in [
            "events:",
            "events:?a=1",
            "events:x?a",
            "events:x?=1",
            "events:x?a=%zz",
        ] {
            let e = events_uri(bad).unwrap().unwrap_err();
            assert!(matches!(e, WatchError::Invalid(_)), "{bad}: {e:?}");
        }
    }

    #[test]
    fn an_occurrence_becomes_its_data_with_its_name_beside_it() {
        let herald = watch_event(json!({"eventId": "memo://log#3", "name": "memo_changed",
            "timestamp": "t", "data": {"seq": 3, "type": "ADDED", "key": "a", "object": 1}}));
        assert_eq!(herald["event"], "memo_changed");
        assert_eq!(herald["eventId"], "memo://log#3");
        assert_eq!(event_line(&herald).text(), "ADDED a = 1");
        let foreign = watch_event(json!({"eventId": "evt_1", "name": "ticket.updated",
            "timestamp": "t", "data": {"ticket_id": "T-1", "summary": "replied"}}));
        assert_eq!(
            event_line(&foreign).text(),
            r#"ticket.updated {"summary":"replied","ticket_id":"T-1"}"#
        );
        let scalar = watch_event(json!({"eventId": "e", "name": "n", "data": 5}));
        assert_eq!(scalar["data"], 5);
    }
}
