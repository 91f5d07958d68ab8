//! One upstream long poll per (slug, event type, arguments, cursor), shared by every caller
//! asking the same at once: the gateway's `events/stream` streams and webhook subscriptions
//! (and plain long polls) of one event type sit at the same cursor, so however many follow it
//! downstream, the slug sees one `events/poll` in flight for them.
//!
//! The shared call asks the slug to wait the longest a long poll may ([`SHARED_WAIT`]); each
//! caller waits for it at most its own `timeoutMs`, and at its timeout answers itself with no
//! events and its own cursor (the poll's "reply early, empty" is always allowed), while the
//! call goes on for the others. The call ends when its last waiter is gone (its task is
//! aborted, which cancels the upstream request), and at most [`MAX_SHARED`] run at once
//! (past that a poll goes upstream on its own). Only the fields that key a call are sent in
//! it, and the key names the upstream itself, not only its slug. Entitlements are checked per
//! caller before it joins and again after it answered.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt as _;
use futures::future::{BoxFuture, Shared};
use rmcp::model::JsonObject;
use serde_json::{Value, json};

use crate::mcp::error::SourceError;
use crate::runtime::context::RoleContext;
use crate::runtime::metrics::{Counter, Metrics};
use crate::sync::Recover;
use crate::upstream::{REQUEST_TIMEOUT, Upstream};

/// How long the shared upstream poll asks its slug to wait.
pub const SHARED_WAIT: Duration = Duration::from_secs(30);

type Call = Shared<BoxFuture<'static, Result<Value, SourceError>>>;

/// Most shared calls in flight at once; past it a poll goes upstream on its own (and is
/// cancelled with its caller), so no caller can pile up calls that outlive it.
pub const MAX_SHARED: usize = 256;

/// One shared call: its answer, how many wait on it, and the task making it (aborted when
/// the last waiter leaves).
struct Entry {
    call: Call,
    waiters: Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::AbortHandle,
}

/// The shared calls in flight, by key. Each runs as a task of its own until it answers or its
/// last waiter leaves (then it is aborted, which cancels the upstream request), and leaves the
/// map then.
#[derive(Default)]
pub struct SharedPolls {
    calls: Arc<Mutex<HashMap<String, Entry>>>,
}

/// A waiter on one shared call; the last one to leave ends the call.
struct Waiting {
    calls: Arc<Mutex<HashMap<String, Entry>>>,
    key: String,
    waiters: Arc<std::sync::atomic::AtomicUsize>,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        use std::sync::atomic::Ordering;
        let mut calls = self.calls.locked();
        if self.waiters.fetch_sub(1, Ordering::AcqRel) == 1 {
            // Only this call's entry (a newer one under the key is not this one's).
            if calls
                .get(&self.key)
                .is_some_and(|e| Arc::ptr_eq(&e.waiters, &self.waiters))
                && let Some(e) = calls.remove(&self.key)
            {
                e.task.abort();
            }
        }
    }
}

/// Counts of the gateway's upstream polls.
#[derive(Clone)]
pub struct PollMetrics {
    pub upstream: Counter,
    pub joined: Counter,
}

impl PollMetrics {
    pub fn register(m: &Metrics) -> PollMetrics {
        PollMetrics {
            upstream: m.counter(
                "herald_gateway_event_polls_upstream_total",
                "long events/poll calls the gateway sent to its slugs (one per slug, event type, arguments and cursor at a time)",
            ),
            joined: m.counter(
                "herald_gateway_event_polls_joined_total",
                "long polls, streams' and webhooks' included, answered by an upstream poll already in flight",
            ),
        }
    }
}

/// The fields of a poll that decide its answer (the wait aside): the key, and all the shared
/// call sends (a caller's other keys never reach a call others share).
const KEYED: [&str; 5] = ["name", "arguments", "cursor", "maxEvents", "maxAgeMs"];

/// The key of a long poll on `up` (this upstream, not merely its slug's name: a reload that
/// replaces the slug starts new calls).
fn key(slug: &str, up: &Arc<Upstream>, params: &JsonObject) -> String {
    let pick = |k: &str| params.get(k).cloned().unwrap_or(Value::Null);
    json!([
        slug,
        Arc::as_ptr(up) as usize,
        pick("name"),
        crate::mcp::events::sorted_keys(&pick("arguments")),
        pick("cursor"),
        pick("maxEvents"),
        pick("maxAgeMs"),
    ])
    .to_string()
}

impl SharedPolls {
    /// Long-polls `up` (as `slug`) with `params` (the slug's own event name), waiting at most
    /// `wait`; joins the same poll when one is in flight. The call runs on `ctx`.
    pub async fn poll(
        &self,
        slug: &str,
        up: &Arc<Upstream>,
        params: JsonObject,
        wait: Duration,
        ctx: &RoleContext,
        metrics: &PollMetrics,
    ) -> Result<Value, SourceError> {
        use std::sync::atomic::Ordering;
        let asked: JsonObject = params
            .iter()
            .filter(|(k, _)| KEYED.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let k = key(slug, up, &asked);
        let (call, _waiting): (Option<Call>, Option<Waiting>) = {
            let mut calls = self.calls.locked();
            if let Some(e) = calls.get(&k) {
                metrics.joined.inc();
                e.waiters.fetch_add(1, Ordering::AcqRel);
                let waiting = Waiting {
                    calls: self.calls.clone(),
                    key: k.clone(),
                    waiters: e.waiters.clone(),
                };
                (Some(e.call.clone()), Some(waiting))
            } else if calls.len() >= MAX_SHARED {
                (None, None)
            } else {
                metrics.upstream.inc();
                let (tx, rx) = tokio::sync::oneshot::channel();
                let waiters = Arc::new(std::sync::atomic::AtomicUsize::new(1));
                let (up, calls_map, key2, mine) =
                    (up.clone(), self.calls.clone(), k.clone(), waiters.clone());
                let mut sent = asked.clone();
                sent.insert("timeoutMs".into(), (SHARED_WAIT.as_millis() as u64).into());
                let task = ctx.spawn_until_shutdown("shared events poll", async move {
                    let r = up
                        .custom_within(
                            "events/poll",
                            Value::Object(sent),
                            REQUEST_TIMEOUT + SHARED_WAIT,
                        )
                        .await
                        .map_err(SourceError::from);
                    // Done: the next asker starts a call of its own.
                    {
                        let mut calls = calls_map.locked();
                        if calls
                            .get(&key2)
                            .is_some_and(|e| Arc::ptr_eq(&e.waiters, &mine))
                        {
                            calls.remove(&key2);
                        }
                    }
                    let _ = tx.send(r);
                });
                let slug = slug.to_owned();
                let call = async move {
                    rx.await.unwrap_or_else(|_| {
                        Err(SourceError::Unavailable(format!(
                            "the poll of server {slug} was cut short; poll again"
                        )))
                    })
                }
                .boxed()
                .shared();
                calls.insert(
                    k.clone(),
                    Entry {
                        call: call.clone(),
                        waiters: waiters.clone(),
                        task: task.abort_handle(),
                    },
                );
                let waiting = Waiting {
                    calls: self.calls.clone(),
                    key: k.clone(),
                    waiters,
                };
                (Some(call), Some(waiting))
            }
        };
        let Some(call) = call else {
            // Too many shared calls: this one goes on its own, cancelled with its caller.
            let mut own = asked.clone();
            own.insert("timeoutMs".into(), (wait.as_millis() as u64).into());
            return up
                .custom_within("events/poll", Value::Object(own), REQUEST_TIMEOUT + wait)
                .await
                .map_err(SourceError::from);
        };
        match tokio::time::timeout(wait, call).await {
            Ok(r) => r,
            // Its own timeout: no events, and its cursor as it was.
            Err(_) => Ok(json!({
                "events": [],
                "cursor": asked.get("cursor").cloned().unwrap_or(Value::Null),
                "truncated": false,
                "hasMore": false,
                "nextPollMs": crate::mcp::events::NEXT_POLL_MS,
            })),
        }
    }
}
