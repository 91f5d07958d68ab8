//! Backfill and settle: what Slack sent while no socket was live, read back from history.
//!
//! On every `hello` (first connect and every reconnect) a pass re-reads each conversation the
//! bot is in from two minutes before `live_through`: top-level messages from
//! `conversations.history`, replies from `conversations.replies` for the parents whose latest
//! reply falls inside the gap, every page. A parent older than the gap is found two ways:
//! history is read an hour further back for parents only (nothing older than the gap is
//! added), and the threads the buffer has seen replies in are asked too. The buffer's dedupe
//! on `channel:ts` drops what it holds.
//!
//! `live_through` moves only when a pass read every conversation: to the moment that pass
//! started (so, while a backfill is owed, it stays put). A conversation that fails is counted
//! and the gap is read again on the next pass: ~75 s after connecting (Slack may hand a few
//! events to a socket that is about to go away during a deploy overlap), then every 5 minutes
//! while connected, and on the next hello. A first-ever boot backfills nothing: "from now" is
//! the only honest start for a buffer that has never been live.

use crate::sync::Recover;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::api::ApiError;
use super::core::{Core, PassReport, SocketState, at};
use super::message::{Posted, conversation_type, ms_ts, posted, ts_ms};
use crate::mcp::ring::now_ms;

/// How far before `live_through` a pass reads.
pub const MARGIN: Duration = Duration::from_secs(120);
/// The settle pass after a hello.
pub const FIRST_SETTLE: Duration = Duration::from_secs(75);
/// Settle passes while connected.
pub const SETTLE_EVERY: Duration = Duration::from_secs(300);
/// History is read this much further back than the gap, for parents whose threads grew
/// during it.
const PARENT_LOOKBACK: Duration = Duration::from_secs(3600);
/// After a reconnect, threads the buffer saw a reply in within this window before the gap
/// are asked too (their parents may be older than the history read)…
const KNOWN_THREADS_WINDOW: Duration = Duration::from_secs(6 * 3600);
/// …at most this many per conversation, the most recently active first.
const MAX_KNOWN_THREADS: usize = 50;
/// Conversations read at once.
const CONCURRENCY: usize = 4;
/// Page size asked of Slack.
const PAGE: &str = "200";

/// Runs passes: after each hello, ~75 s later, then every 5 minutes while connected.
pub async fn run(core: Arc<Core>, stop: tokio_util::sync::CancellationToken) {
    let shutdown = stop;
    let mut next_settle: Option<tokio::time::Instant> = None;
    loop {
        let settle = async {
            match next_settle {
                Some(t) => tokio::time::sleep_until(t).await,
                None => std::future::pending().await,
            }
        };
        let reason = tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = core.hello.notified() => "hello",
            _ = settle => "settle",
        };
        let now = tokio::time::Instant::now();
        next_settle = Some(
            now + if reason == "hello" {
                FIRST_SETTLE
            } else {
                SETTLE_EVERY
            },
        );
        if core.status().state != SocketState::Connected {
            next_settle = None;
            continue;
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = pass(&core, reason) => {}
        }
    }
}

/// How one conversation's read ended.
enum Read {
    /// Read to the end: this many events added.
    Done(usize),
    /// Slack says it cannot be read and retrying will not change that (the bot left, a scope
    /// is missing, …): reported, and it does not hold the gap open.
    Skipped(String),
    /// Worth retrying: the gap stays owed.
    Failed(ApiError),
}

/// Slack errors that retrying will not fix.
fn permanent(e: &ApiError) -> bool {
    matches!(
        e.slack_error(),
        Some(
            "not_in_channel"
                | "channel_not_found"
                | "is_archived"
                | "missing_scope"
                | "access_denied"
                | "ekm_access_denied"
                | "team_access_not_granted"
                | "method_not_supported_for_channel_type"
        )
    )
}

/// One pass over every conversation the bot is in.
pub async fn pass(core: &Core, reason: &'static str) {
    let started_ms = now_ms();
    let Some(live) = core.buffer.live_through() else {
        // First-ever boot: from now.
        core.buffer.set_live_through(started_ms);
        return;
    };
    let bot = match core.identify().await {
        Ok(b) => b,
        Err(e) => {
            owe(core, vec![format!("(auth.test: {e})")]);
            return;
        }
    };
    let retention_floor = started_ms.saturating_sub(core.buffer.retention().as_millis() as u64);
    let from = live
        .saturating_sub(MARGIN.as_millis() as u64)
        .max(core.buffer.born().unwrap_or(0))
        .max(retention_floor);
    // Threads the buffer saw grow recently are asked after a reconnect only (a settle pass
    // covers minutes, and history's parents cover those).
    let known_threads = reason == "hello";
    let calls_before = core.api.calls();
    let clock = Instant::now();
    let conversations = match list(core).await {
        Ok(c) => c,
        Err(e) => {
            owe(core, vec![format!("(users.conversations: {e})")]);
            return;
        }
    };
    let gate = tokio::sync::Semaphore::new(CONCURRENCY);
    let reads = conversations.iter().map(|(id, kind)| {
        let (gate, bot) = (&gate, &bot);
        async move {
            let _turn = gate.acquire().await;
            (
                id.clone(),
                read_conversation(core, id, kind, from, bot, known_threads).await,
            )
        }
    });
    let results: Vec<(String, Read)> = futures::future::join_all(reads).await;
    let mut recovered = 0;
    let mut failed = Vec::new();
    let mut skipped = Vec::new();
    for (id, r) in results {
        match r {
            Read::Done(n) => recovered += n,
            Read::Skipped(why) => {
                tracing::info!(conversation = %id, reason = %why, "backfill skips a conversation Slack will not let it read");
                skipped.push(json!({"id": id, "reason": why}));
            }
            Read::Failed(e) => {
                tracing::warn!(conversation = %id, error = %e, "backfill could not read a conversation; it is read again next pass");
                failed.push(id);
            }
        }
    }
    let report = PassReport {
        at: at(started_ms),
        reason,
        from: at(from),
        conversations: conversations.len(),
        recovered,
        web_api_calls: core.api.calls() - calls_before,
        took_ms: clock.elapsed().as_millis() as u64,
    };
    if recovered > 0 || !failed.is_empty() {
        tracing::info!(recovered, failed = failed.len(), conversations = conversations.len(), %reason, "slack backfill pass");
    }
    let owed = !failed.is_empty();
    if !owed {
        core.buffer.set_live_through(started_ms);
    }
    let mut s = core.status();
    s.last_backfill = Some(report);
    s.failed_conversations = failed;
    s.skipped_conversations = skipped;
    s.backfill_owed = owed;
}

fn owe(core: &Core, failed: Vec<String>) {
    let mut s = core.status();
    s.failed_conversations = failed;
    s.backfill_owed = true;
}

/// The conversations the bot is a member of (public and private channels, DMs; never group
/// DMs), with their types, from `users.conversations`; remembered for events that do not name
/// their type.
pub async fn list(core: &Core) -> Result<Vec<(String, &'static str)>, ApiError> {
    let mut out = Vec::new();
    core.api
        .pages(
            "users.conversations",
            &[
                ("types", "public_channel,private_channel,im"),
                ("exclude_archived", "true"),
                ("limit", PAGE),
            ],
            |page| {
                for c in page
                    .get("channels")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    let Some(id) = c.get("id").and_then(Value::as_str) else {
                        continue;
                    };
                    let kind = conversation_type(c);
                    if kind != "mpim" {
                        out.push((id.to_owned(), kind));
                    }
                }
            },
        )
        .await?;
    let mut known = core.conversations.locked();
    for (id, kind) in &out {
        known.insert(id.clone(), kind);
    }
    Ok(out)
}

/// Reads one conversation's gap, and adds what it found oldest first (parents before their
/// replies), so seqs follow posting order.
async fn read_conversation(
    core: &Core,
    channel: &str,
    kind: &'static str,
    from_ms: u64,
    bot: &super::message::BotIdentity,
    known_threads: bool,
) -> Read {
    let oldest = ms_ts(from_ms);
    let parents_from = ms_ts(from_ms.saturating_sub(PARENT_LOOKBACK.as_millis() as u64));
    let mut found: Vec<Posted> = Vec::new();
    let mut parents = BTreeSet::new();
    let history = core
        .api
        .pages(
            "conversations.history",
            &[
                ("channel", channel),
                ("oldest", &parents_from),
                ("inclusive", "true"),
                ("limit", PAGE),
            ],
            |page| {
                for m in messages(page) {
                    let ts = m.get("ts").and_then(Value::as_str).map(ts_ms).unwrap_or(0);
                    if ts >= from_ms
                        && let Some(p) = posted(channel, kind, m, bot)
                    {
                        found.push(p);
                    }
                    let latest = m.get("latest_reply").and_then(Value::as_str).map(ts_ms);
                    if m.get("reply_count").and_then(Value::as_u64).unwrap_or(0) > 0
                        && latest.is_some_and(|l| l >= from_ms)
                        && let Some(ts) = m.get("ts").and_then(Value::as_str)
                    {
                        parents.insert(ts.to_owned());
                    }
                }
            },
        )
        .await;
    match history {
        Ok(_) => {}
        Err(e) if permanent(&e) => return Read::Skipped(e.to_string()),
        Err(e) => return Read::Failed(e),
    }
    if known_threads {
        let since = from_ms.saturating_sub(KNOWN_THREADS_WINDOW.as_millis() as u64);
        parents.extend(core.buffer.threads(channel, since, MAX_KNOWN_THREADS));
    }
    for parent in parents {
        let r = core
            .api
            .pages(
                "conversations.replies",
                &[
                    ("channel", channel),
                    ("ts", &parent),
                    ("oldest", &oldest),
                    ("inclusive", "true"),
                    ("limit", PAGE),
                ],
                |page| {
                    for m in messages(page) {
                        let ts = m.get("ts").and_then(Value::as_str).map(ts_ms).unwrap_or(0);
                        if ts >= from_ms
                            && let Some(p) = posted(channel, kind, m, bot)
                        {
                            found.push(p);
                        }
                    }
                },
            )
            .await;
        match r {
            Ok(_) => {}
            // A parent deleted since: nothing to read under it.
            Err(e) if permanent(&e) || e.slack_error() == Some("thread_not_found") => {}
            Err(e) => return Read::Failed(e),
        }
    }
    found.sort_by(|a, b| (a.posted_ms(), a.ts.as_str()).cmp(&(b.posted_ms(), b.ts.as_str())));
    let added = found.into_iter().filter(|p| core.ingest(p.clone())).count();
    Read::Done(added)
}

fn messages(page: &Value) -> impl Iterator<Item = &Value> {
    page.get("messages")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
}
