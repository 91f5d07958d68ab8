//! [`WatchTask`]: one running watch. It waits on its subscription, its debounce deadline, a
//! filter run, or cancellation; an update means read, extract (at most 100 events), filter,
//! dedupe, debounce, and a due batch becomes a [`Notice`]. When the subscription ends it
//! resubscribes with backoff and diffs the re-read against its last state; after the last
//! attempt the watch fails and a notice says so. Also here: the listen-then-read that starts
//! (and restarts) a watch, and the read every watch request goes through.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use rmcp::model::ServerNotification;
use rmcp::service::SubscriptionEnd;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::filter::engine::Outcome as FilterOutcome;
use crate::filter::pool::FilterError;
use crate::mcp::ring::newest_seq;
use crate::runtime::backoff::Backoff;
use crate::upstream::log::{Event, LogCursor, ReadAhead, extract_log_text};
use crate::upstream::{Listening, Upstream};
use crate::watch::events::{StateBase, diff_reads};
use crate::watch::handle::{Stats, WatchHandle};
use crate::watch::notice::{Debounce, Dedupe, Line, default_line, object_key, sanitize_line};
use crate::watch::spec::{KEEP_TRYING_MAX, Notice, WatchSpec};

/// What a watch compares the next read against.
pub(super) enum Baseline {
    State(StateBase),
    Log(LogCursor),
}

mod read;
mod stream;
use read::{Carried, carried_reads};
pub(crate) use read::{Read, subscribe_and_read};
pub(crate) use stream::events_uri;

pub(super) struct WatchTask {
    /// What it shares with the manager that started it.
    handle: Arc<WatchHandle>,
    server: Arc<Upstream>,
    spec: WatchSpec,
    stats: Arc<Stats>,
    cancel: CancellationToken,
    /// A kept watch: it resubscribes for as long as it is not stopped.
    kept: bool,
    debounce: Debounce,
    dedupe: Dedupe,
    /// The filter's scope was lost (its worker died); the next notice says so.
    scope_reset: bool,
    /// Filter runs so far; a fresh scope after the first means variables were lost.
    filter_runs: u64,
    /// This watch's scope in the filter workers: unique per start, dropped when it ends.
    scope: String,
    /// Events diffed but not yet filtered, with the time they arrived. Intake goes on while
    /// the filter runs; past [`FILTER_BACKLOG`] events the oldest are dropped and counted.
    backlog: VecDeque<(Event, std::time::Instant)>,
    /// Events dropped from a full backlog since the last notice said so.
    backlog_dropped: usize,
    /// What an event-log watch read for itself past what its stream carried.
    ahead: ReadAhead,
}

/// What one turn of a watch's loop came to ([`WatchTask::turn`]).
enum Turn<T> {
    /// The watch was cancelled.
    Stop,
    /// Something of its own (a notice, a filter's results): turn again.
    Idle,
    /// What its intake brought.
    Got(T),
}

/// Events a watch holds for its filter while a run is in progress (ten full updates).
const FILTER_BACKLOG: usize = 1000;

/// One filter exchange in flight: its events and, when it ends, one result per event.
type FilterRun = std::pin::Pin<
    Box<
        dyn std::future::Future<
                Output = (
                    Vec<(Event, std::time::Instant)>,
                    Vec<Result<FilterOutcome, FilterError>>,
                ),
            > + Send,
    >,
>;

fn now() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}

impl WatchTask {
    pub(super) fn new(
        handle: Arc<WatchHandle>,
        server: Arc<Upstream>,
        spec: WatchSpec,
        stats: Arc<Stats>,
        cancel: CancellationToken,
        scope: String,
        kept: bool,
    ) -> WatchTask {
        let debounce = Debounce::new(handle.cfg.debounce);
        WatchTask {
            handle,
            server,
            spec,
            stats,
            cancel,
            kept,
            debounce,
            dedupe: Dedupe::new(4096),
            scope_reset: false,
            filter_runs: 0,
            scope,
            backlog: VecDeque::new(),
            backlog_dropped: 0,
            ahead: ReadAhead::default(),
        }
    }

    pub(super) async fn run(self, listening: Listening, base: Baseline) {
        let handle = self.handle.clone();
        let scope = self.scope.clone();
        let filtered = self.spec.on_event.is_some();
        self.watch(listening, base).await;
        // The watch is over: its filter's variables go with it.
        if filtered && let Some(pool) = handle.filters() {
            pool.drop_scope(&scope).await;
        }
    }

    /// One turn of a watch's loop, whatever its intake: a filter run started when events wait
    /// for one, a due notice sent, a finished run's results taken, or what `intake` brought.
    /// `Stop` once the watch is cancelled (what is pending flushed first).
    async fn turn<T>(
        &mut self,
        running: &mut Option<FilterRun>,
        intake: impl std::future::Future<Output = T>,
    ) -> Turn<T> {
        if running.is_none() {
            *running = self.next_filter_run();
        }
        // A notice already due (with `--debounce-ms 0`, every one) goes out now: a timer
        // would add a tick of the timer wheel (a millisecond or more) to each.
        if let Some(lines) = self.debounce.take_due(now()) {
            self.emit(lines).await;
            return Turn::Idle;
        }
        let due = self.debounce.due();
        tokio::select! {
            _ = self.cancel.cancelled() => {
                self.flush_all().await;
                Turn::Stop
            }
            (evs, results) = async { running.as_mut().expect("guarded").await }, if running.is_some() => {
                *running = None;
                self.filtered(evs, results);
                Turn::Idle
            }
            _ = sleep_until(due), if due.is_some() => {
                if let Some(lines) = self.debounce.take_due(now()) {
                    self.emit(lines).await;
                }
                Turn::Idle
            }
            got = intake => Turn::Got(got),
        }
    }

    async fn watch(mut self, mut sub: Listening, mut base: Baseline) {
        // The filter runs beside intake: notifications are read and diffed while a batch is
        // in the worker, and queue in `backlog` for the next one.
        let mut running: Option<FilterRun> = None;
        loop {
            let n = match self.turn(&mut running, sub.next()).await {
                Turn::Stop => return,
                Turn::Idle => continue,
                Turn::Got(n) => n,
            };
            match n {
                Ok(Some(ServerNotification::ResourceUpdatedNotification(u)))
                    if u.params.uri == self.spec.uri =>
                {
                    // Notifications are idempotent: one read covers every one already
                    // queued, so a slow moment never turns into a backlog of reads. Updates
                    // that carry their reads are taken in order instead (a state's last).
                    let mut updates = vec![u];
                    let mut ended = false;
                    while let Some(more) = futures::FutureExt::now_or_never(sub.next()) {
                        match more {
                            Ok(Some(ServerNotification::ResourceUpdatedNotification(m)))
                                if m.params.uri == self.spec.uri =>
                            {
                                updates.push(m);
                            }
                            Ok(Some(_)) => {}
                            _ => {
                                ended = true;
                                break;
                            }
                        }
                    }
                    let carried = match sub.carries() {
                        true => carried_reads(updates),
                        false => Carried::Plain,
                    };
                    if let Carried::Failed(why) = &carried
                        && matches!(base, Baseline::State(_))
                    {
                        // A read of its own could be newer than one the server made before
                        // it and carries next: listen again for a baseline in order.
                        tracing::warn!(watch = %self.spec.name, error = %why, "an update carried a failed read; resubscribing");
                        ended = true;
                    } else if let Carried::Reads(mut reads) = carried {
                        if matches!(base, Baseline::State(_)) {
                            reads.drain(..reads.len().saturating_sub(1));
                        }
                        for r in reads {
                            if matches!(base, Baseline::Log(_))
                                && self.ahead.passed(|| newest_seq(&r.text))
                            {
                                continue;
                            }
                            self.update(&mut base, r, running.is_some());
                        }
                    } else {
                        // Where the stream got to: its reads below that continue from it.
                        if let Baseline::Log(c) = &base {
                            self.ahead.carried(c.last);
                        }
                        if let Err((_, e)) = self.read_pages(&mut base, running.is_some()).await {
                            // Treat it as a lost subscription: the resubscribe path re-reads
                            // and diffs, so the change is not lost.
                            tracing::warn!(watch = %self.spec.name, error = %e, "read after an update failed; resubscribing");
                            ended = true;
                        }
                    }
                    if ended {
                        match self
                            .resubscribe(sub, "a read after an update failed or the stream ended")
                            .await
                        {
                            Some((s, r)) => {
                                sub = s;
                                self.catch_up(&mut base, r, running.is_some()).await;
                            }
                            None => return,
                        }
                    }
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => {
                    let why = match (&n, sub.end()) {
                        (Err(e), _) => format!("the subscription failed: {e}"),
                        (_, Some(SubscriptionEnd::Graceful(_))) => {
                            "the server ended the subscription".to_owned()
                        }
                        (_, Some(SubscriptionEnd::Lagged { .. })) => {
                            "notifications were not read in time".to_owned()
                        }
                        (_, Some(SubscriptionEnd::Cancelled)) => {
                            "the subscription was cancelled".to_owned()
                        }
                        _ => "the connection to the server was lost".to_owned(),
                    };
                    match self.resubscribe(sub, &why).await {
                        Some((s, r)) => {
                            sub = s;
                            // The re-read is diffed against the last state (or cursor), so
                            // changes made while unsubscribed are reported now.
                            self.catch_up(&mut base, r, running.is_some()).await;
                        }
                        None => return,
                    }
                }
            }
        }
    }

    /// Listens again after `ended` ended (dropped here, which ends it upstream too), once
    /// what is pending has been delivered (with the old listen already let go: a slow sink
    /// does not hold its slot).
    async fn resubscribe(&mut self, ended: Listening, why: &str) -> Option<(Listening, Read)> {
        // Other watches may share this connection: drop it only when it is really gone. A
        // subscription that ended on a live connection (server-side end, lag) is re-listened
        // at once on the same connection.
        let live = !ended.connection_lost();
        if !live {
            self.server.forget_connection_of(&ended);
        }
        drop(ended);
        self.flush_all().await;
        let cfg = &self.handle.cfg;
        let log = &self.handle.log;
        let mut last_error = String::from(why);
        // A kept watch (`manager/kept.rs`) tries for as long as it is not stopped, at most
        // KEEP_TRYING_MAX apart, and is listed as starting once the usual attempts are spent.
        let (mut backoff, attempts) = match self.kept {
            false => (cfg.resubscribe_backoff(), cfg.resubscribe_attempts),
            true => (
                Backoff::new(cfg.resubscribe_base, KEEP_TRYING_MAX),
                u32::MAX,
            ),
        };
        for attempt in 0..attempts {
            if self.kept && attempt == cfg.resubscribe_attempts {
                self.lost_source(&last_error).await;
            }
            let delay = backoff.next_delay();
            let delay = if live && attempt == 0 {
                Duration::ZERO
            } else {
                delay
            };
            log.emit(
                "watch.resubscribing",
                json!({"watch": self.spec.name, "uri": self.spec.uri, "attempt": attempt + 1,
                       "delay_ms": delay.as_millis() as u64, "reason": last_error}),
            );
            tokio::select! {
                _ = self.cancel.cancelled() => return None,
                _ = tokio::time::sleep(delay) => {}
            }
            match subscribe_and_read(&self.server, &self.spec.uri).await {
                Ok(ok) => {
                    log.emit(
                        "watch.subscribed",
                        json!({"watch": self.spec.name, "uri": self.spec.uri,
                               "server": self.server.name.clone(), "attempt": attempt + 1}),
                    );
                    if self.stats.starting.swap(false, Ordering::Relaxed) {
                        tracing::info!(watch = %self.spec.name, uri = %self.spec.uri, tries = attempt + 1, "watch subscribed again");
                        self.handle.changed();
                    }
                    return Some(ok);
                }
                Err(e) if self.kept && self.stats.starting.load(Ordering::Relaxed) => {
                    last_error = e.to_string();
                    self.stats.set_reason(last_error.clone());
                }
                Err(e) => last_error = e.to_string(),
            }
        }
        self.fail(&last_error).await;
        None
    }

    /// The watch failed for good after its resubscribe attempts (the last with
    /// `last_error`): marked failed, logged, and its reader told what to do.
    async fn fail(&mut self, last_error: &str) {
        let cfg = &self.handle.cfg;
        let log = &self.handle.log;
        let reason = format!(
            "the subscription ended and {} resubscribe attempts failed (last error: {last_error})",
            cfg.resubscribe_attempts
        );
        self.stats.set_reason(reason.clone());
        self.stats.failed.store(true, Ordering::Relaxed);
        log.emit(
            "watch.failed",
            json!({"watch": self.spec.name, "uri": self.spec.uri,
                   "attempts": cfg.resubscribe_attempts, "error": last_error}),
        );
        let line = format!("watch failed: {reason}; {}", cfg.restart.advice(&self.spec));
        self.stats.notices.fetch_add(1, Ordering::Relaxed);
        self.handle
            .deliver(Notice::new(&self.spec.name, &self.spec.uri, vec![line]))
            .await;
        // After the notice: a run that ends once none runs says it first.
        self.handle.changed();
    }

    /// A kept watch spent the usual resubscribe attempts: it is listed as starting (holding
    /// `/ready`), and its reader is told once, while it goes on trying.
    async fn lost_source(&self, last_error: &str) {
        self.stats.set_reason(last_error.to_owned());
        self.stats.starting.store(true, Ordering::Relaxed);
        tracing::warn!(watch = %self.spec.name, uri = %self.spec.uri, error = %last_error,
            "watch lost its source; trying again (at most {} s apart) until it is back", KEEP_TRYING_MAX.as_secs());
        let line = format!(
            "watch lost its source ({last_error}); trying again, at most {} s apart, until it is back",
            KEEP_TRYING_MAX.as_secs()
        );
        self.stats.notices.fetch_add(1, Ordering::Relaxed);
        self.handle
            .deliver(Notice::new(&self.spec.name, &self.spec.uri, vec![line]))
            .await;
        self.handle.changed();
    }

    /// Diffs one read against the baseline; `filtering` says a filter run is in progress.
    fn update(&mut self, base: &mut Baseline, r: Read, filtering: bool) {
        let events: Vec<Event> = match base {
            Baseline::State(old) => {
                let new = StateBase::new(r.text);
                let evs = diff_reads(old, &new);
                *old = new;
                evs
            }
            Baseline::Log(cursor) => match extract_log_text(*cursor, &r.text) {
                Ok((evs, c)) => {
                    *cursor = c;
                    evs
                }
                Err(e) => {
                    tracing::warn!(watch = %self.spec.name, error = %e, "unreadable event log");
                    Vec::new()
                }
            },
        };
        self.take_in(events, filtering, default_line);
    }

    /// Takes in one update's events (at most `max_events_per_update`; the rest counted in one
    /// line): to the filter's backlog when the watch has a filter, else each as its `line`.
    fn take_in(&mut self, events: Vec<Event>, filtering: bool, line: fn(&Event) -> Line) {
        let max = self.handle.cfg.max_events_per_update;
        let total = events.len();
        let t = now();
        let mut evs: Vec<Event> = events.into_iter().take(max).collect();
        for ev in &mut evs {
            self.stats.events.fetch_add(1, Ordering::Relaxed);
            ev.insert("watch".into(), self.spec.name.clone().into());
            ev.insert("uri".into(), self.spec.uri.clone().into());
        }
        if total > max {
            self.debounce.push(
                format!(
                    "+{} more events in this update were not processed (limit {max})",
                    total - max
                ),
                t,
            );
        }
        if self.spec.on_event.is_some() && self.handle.filters().is_some() {
            // Filtered events wait for the filter stage (see `watch`); intake goes on.
            self.handle.log.emit(
                "watch.update",
                json!({"watch": self.spec.name, "events": evs.len(), "filtering": filtering,
                       "queued": self.backlog.len() + evs.len()}),
            );
            for ev in evs {
                if self.backlog.len() == FILTER_BACKLOG {
                    self.backlog.pop_front();
                    self.backlog_dropped += 1;
                }
                self.backlog.push_back((ev, t));
            }
            return;
        }
        for ev in evs {
            let text = line(&ev);
            self.admit(&ev, Some(text), t);
        }
    }

    /// Starts the filter on the backlog, when there is one: the whole backlog (up to one
    /// update's worth) goes to the worker in one exchange, and each event keeps its own limits.
    fn next_filter_run(&mut self) -> Option<FilterRun> {
        if self.backlog.is_empty() {
            return None;
        }
        let (Some(code), Some(pool)) = (self.spec.on_event.clone(), self.handle.filters()) else {
            return None;
        };
        let n = self
            .backlog
            .len()
            .min(self.handle.cfg.max_events_per_update.max(1));
        let evs: Vec<(Event, std::time::Instant)> = self.backlog.drain(..n).collect();
        let scope = self.scope.clone();
        let catalog = self.handle.filter_catalog();
        Some(Box::pin(async move {
            let batch: Vec<Value> = evs.iter().map(|(e, _)| Value::Object(e.clone())).collect();
            let results = match pool.run_batch(&scope, &code, batch, catalog).await {
                Ok(results) => results,
                Err(e) => vec![Err(e); evs.len()],
            };
            (evs, results)
        }))
    }

    /// Turns one filter exchange's results into notice lines.
    fn filtered(
        &mut self,
        evs: Vec<(Event, std::time::Instant)>,
        results: Vec<Result<FilterOutcome, FilterError>>,
    ) {
        let mut results = results.into_iter();
        for (ev, t) in evs {
            self.filter_runs += 1;
            let line = match results.next() {
                Some(Ok(o)) => {
                    if o.fresh_scope && self.filter_runs > 1 {
                        self.scope_reset = true;
                    }
                    let mut parts = Vec::new();
                    let printed = o.printed.trim_end();
                    if !printed.is_empty() {
                        parts.push(printed.to_owned());
                    }
                    match &o.value {
                        Value::Null => {}
                        Value::String(s) => parts.push(s.clone()),
                        other => parts.push(other.to_string()),
                    }
                    (!parts.is_empty()).then(|| parts.join(" "))
                }
                Some(Err(FilterError::Python(e))) => Some(format!("on_event raised {e}")),
                Some(Err(FilterError::Worker(e))) => {
                    self.scope_reset = true;
                    Some(format!("on_event failed: {e}"))
                }
                None => {
                    Some("on_event failed: the filter worker gave no result for this event".into())
                }
            };
            self.admit(&ev, line.map(Line::Text), t);
        }
        if self.backlog_dropped > 0 {
            let n = std::mem::take(&mut self.backlog_dropped);
            self.debounce.push(
                format!(
                    "+{n} events were dropped while the filter was busy (at most {FILTER_BACKLOG} wait for it)"
                ),
                now(),
            );
        }
    }

    /// Dedupes and debounces one event's notice line; `None` means the filter dropped it.
    fn admit(&mut self, ev: &Event, line: Option<Line>, t: std::time::Instant) {
        let log = &self.handle.log;
        let Some(line) = line else {
            log.emit_with("watch.event", || {
                json!({"watch": self.spec.name, "type": ev.get("type"), "kept": false, "reason": "filter"})
            });
            return;
        };
        let line = match line {
            Line::Text(text) => {
                let mut text = sanitize_line(&text);
                if !text.starts_with("on_event failed") && std::mem::take(&mut self.scope_reset) {
                    text = format!("{text} (the filter's variables were reset before this event)");
                }
                Line::Text(text)
            }
            modified => modified,
        };
        let object = object_key(ev);
        let fresh = self.dedupe.admit(&object, &sanitize_line(&line.text()));
        log.emit_with("watch.event", || {
            json!({"watch": self.spec.name, "type": ev.get("type"), "kept": fresh,
                   "reason": if fresh { Value::Null } else { "duplicate".into() }})
        });
        if fresh {
            self.debounce.push_event(&object, line, ev, t);
        }
    }

    async fn emit(&mut self, lines: Vec<String>) {
        if lines.is_empty() {
            return;
        }
        self.stats.notices.fetch_add(1, Ordering::Relaxed);
        self.handle
            .deliver(Notice::new(&self.spec.name, &self.spec.uri, lines))
            .await;
    }

    async fn flush_all(&mut self) {
        let lines = self.debounce.take();
        self.emit(lines).await;
    }
}

async fn sleep_until(due: Option<std::time::Instant>) {
    match due {
        Some(d) => tokio::time::sleep_until(tokio::time::Instant::from_std(d)).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    use tokio::sync::mpsc;

    use crate::testing::{MemoServer, down_upstream};
    use crate::watch::WatchManager;
    use crate::watch::filter_catalog::FilterCatalog;
    use crate::watch::log::WatchLog;
    use crate::watch::spec::WatchConfig;

    fn fast() -> WatchConfig {
        let mut cfg = WatchConfig::default();
        cfg.debounce.quiet = Duration::ZERO;
        cfg.resubscribe_base = Duration::from_millis(10);
        cfg.resubscribe_attempts = 2;
        cfg
    }

    /// A task with no server behind it: enough for what happens between two reads.
    fn task(cfg: WatchConfig) -> WatchTask {
        let (tx, _rx) = mpsc::channel(1);
        let catalog = Arc::new(FilterCatalog {
            servers: Vec::new(),
            code: None,
        });
        let handle = Arc::new(WatchHandle::new(cfg, WatchLog::silent(), tx, catalog));
        let spec = WatchSpec {
            name: "w".into(),
            uri: "memo://notes".into(),
            on_event: None,
        };
        let down = down_upstream(Arc::new(AtomicUsize::new(0)));
        let stats = Arc::new(Stats::default());
        WatchTask::new(
            handle,
            down,
            spec,
            stats,
            CancellationToken::new(),
            "w#0".into(),
            false,
        )
    }

    fn json_read(text: &str) -> Read {
        Read {
            mime: "application/json".into(),
            text: text.into(),
        }
    }

    #[test]
    fn a_state_update_becomes_one_line_per_change() {
        let mut t = task(fast());
        let mut base = Baseline::State(StateBase::new(r#"{"a":1,"c":3}"#.into()));
        t.update(&mut base, json_read(r#"{"a":2,"b":2}"#), false);
        let lines = t.debounce.take();
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert!(lines.contains(&"ADDED b = 2".to_owned()), "{lines:?}");
        assert!(lines.contains(&"DELETED c (was 3)".to_owned()), "{lines:?}");
        assert!(
            lines.iter().any(|l| l.starts_with("MODIFIED a")),
            "{lines:?}"
        );
        assert_eq!(t.stats.events.load(Ordering::Relaxed), 3);
        // The baseline moved: the same read again is no change.
        t.update(&mut base, json_read(r#"{"a":2,"b":2}"#), false);
        assert!(t.debounce.take().is_empty());
    }

    #[test]
    fn a_repeated_line_for_the_same_object_is_dropped() {
        let mut t = task(fast());
        let (_, cursor) =
            crate::upstream::log::extract_log(LogCursor::default(), &json!({"events": []}))
                .unwrap();
        let mut base = Baseline::Log(cursor);
        let log = json!({"events": [
            {"seq": 1, "type": "ADDED", "key": "k"},
            {"seq": 2, "type": "ADDED", "key": "k"},
            {"seq": 3, "type": "ADDED", "key": "j"},
        ]});
        t.update(&mut base, json_read(&log.to_string()), false);
        assert_eq!(t.debounce.take(), ["ADDED k", "ADDED j"]);
    }

    #[test]
    fn events_past_the_per_update_limit_are_counted_in_one_line() {
        let mut cfg = fast();
        cfg.max_events_per_update = 2;
        let mut t = task(cfg);
        let mut base = Baseline::State(StateBase::new("{}".into()));
        t.update(&mut base, json_read(r#"{"a":1,"b":1,"c":1}"#), false);
        let lines = t.debounce.take();
        assert_eq!(
            lines,
            [
                "+1 more events in this update were not processed (limit 2)",
                "ADDED a = 1",
                "ADDED b = 1",
            ]
        );
    }

    #[test]
    fn filter_results_become_lines_and_a_lost_scope_is_said_once() {
        let mut t = task(fast());
        let ev = |k: &str| {
            let mut e = Event::new();
            e.insert("type".into(), "ADDED".into());
            e.insert("key".into(), k.into());
            (e, now())
        };
        let kept = FilterOutcome {
            value: Value::String("kept a".into()),
            printed: String::new(),
            fresh_scope: true,
        };
        let dropped = FilterOutcome {
            value: Value::Null,
            printed: String::new(),
            fresh_scope: false,
        };
        let after = FilterOutcome {
            value: Value::String("kept d".into()),
            printed: String::new(),
            fresh_scope: false,
        };
        t.filtered(
            vec![ev("a"), ev("b"), ev("c"), ev("d")],
            vec![
                Ok(kept),
                Ok(dropped),
                Err(FilterError::Worker("the worker died".into())),
                Ok(after),
            ],
        );
        assert_eq!(
            t.debounce.take(),
            [
                "kept a",
                "on_event failed: the worker died",
                "kept d (the filter's variables were reset before this event)",
            ]
        );
        // Fewer results than events: each missing one says so.
        t.filtered(vec![ev("e")], Vec::new());
        assert_eq!(
            t.debounce.take(),
            ["on_event failed: the filter worker gave no result for this event"]
        );
    }

    /// The in-process memo server, reached the way the watch client reaches its servers.
    fn memo_upstream(memo: &MemoServer) -> Arc<Upstream> {
        memo.upstream_with(crate::watch::upstream_config(
            crate::transport::target::Target::Stdio("in-process memo".into()),
            Default::default(),
            1 << 20,
        ))
    }

    async fn next(rx: &mut mpsc::Receiver<Notice>) -> Notice {
        tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("a notice in time")
            .expect("the channel is open")
    }

    #[tokio::test]
    async fn a_burst_past_a_page_reaches_the_watch_whole_carried_or_read() {
        for (contents, away) in [(true, false), (false, false), (true, true), (false, true)] {
            let memo = MemoServer::with_ring(512).await;
            memo.set("a", json!(1)).await;
            let (tx, mut rx) = mpsc::channel(64);
            let mut up = crate::watch::upstream_config(
                crate::transport::target::Target::Stdio("in-process memo".into()),
                Default::default(),
                1 << 20,
            );
            up.contents = contents;
            // Every event its own line, in notices of any size.
            let mut cfg = fast();
            cfg.max_events_per_update = usize::MAX;
            cfg.debounce.max_lines = usize::MAX;
            let mgr = WatchManager::new(
                cfg,
                vec![memo.upstream_with(up)],
                tx,
                WatchLog::silent(),
                None,
            );
            mgr.watch_start("log", "memo://log", None).await.unwrap();
            // 200 events of 8 KiB (seven pages, more than a whole read holds), taken with no
            // await between them; `away`: while the watch's connection is lost, so it catches
            // up on listening again.
            let keys: Vec<String> = (0..200).map(|i| format!("k{i:03}")).collect();
            let big = json!("x".repeat(8 << 10));
            memo.set_down(away);
            memo.memo
                .apply_burst(keys.iter().map(|k| (k.clone(), big.clone())).collect());
            memo.set_down(false);
            let mut lines = Vec::new();
            while lines.len() < keys.len() {
                lines.extend(next(&mut rx).await.lines);
            }
            let got: Vec<&str> = lines.iter().map(|l| l.split(' ').nth(1).unwrap()).collect();
            assert_eq!(
                got, keys,
                "contents {contents}, away {away}: every event once, in order"
            );
            mgr.shutdown().await;
        }
    }

    #[tokio::test]
    async fn a_change_made_while_resubscribing_is_reported() {
        let memo = MemoServer::start().await;
        let (tx, mut rx) = mpsc::channel(16);
        let mut cfg = fast();
        cfg.resubscribe_base = Duration::from_millis(50);
        cfg.resubscribe_attempts = 4;
        let mgr = WatchManager::new(
            cfg,
            vec![memo_upstream(&memo)],
            tx,
            WatchLog::silent(),
            None,
        );
        mgr.watch_start("n", "memo://notes", None).await.unwrap();
        memo.set("a", json!(1)).await;
        assert_eq!(next(&mut rx).await.lines, ["ADDED a = 1"]);
        // The server goes away, a change lands while it is away, and it comes back.
        memo.set_down(true);
        memo.set("b", json!(2)).await;
        memo.set_down(false);
        assert_eq!(next(&mut rx).await.lines, ["ADDED b = 2"]);
        memo.set("c", json!(3)).await;
        assert_eq!(next(&mut rx).await.lines, ["ADDED c = 3"]);
        assert!(!mgr.watch_list()[0].failed);
        mgr.shutdown().await;
    }

    #[tokio::test]
    async fn a_server_that_stays_away_fails_the_watch_with_a_notice() {
        let memo = MemoServer::start().await;
        let (tx, mut rx) = mpsc::channel(16);
        let mgr = WatchManager::new(
            fast(),
            vec![memo_upstream(&memo)],
            tx,
            WatchLog::silent(),
            None,
        );
        mgr.watch_start("n", "memo://notes", None).await.unwrap();
        memo.set_down(true);
        let n = next(&mut rx).await;
        assert_eq!(n.watch, "n");
        assert!(n.lines[0].starts_with("watch failed"), "{n:?}");
        assert!(n.lines[0].contains("2 resubscribe attempts"), "{n:?}");
        let list = mgr.watch_list();
        assert!(list[0].failed, "{list:?}");
        // A failed watch frees its name: it can be started again once the server is back.
        memo.set_down(false);
        mgr.watch_start("n", "memo://notes", None).await.unwrap();
        mgr.shutdown().await;
    }
}
