//! One upstream long poll per (slug, event type, arguments, cursor), shared by every caller
//! asking the same at once: the gateway's `events/stream` streams and webhook subscriptions
//! (and plain long polls) of one event type sit at the same cursor, so however many follow it
//! downstream, the slug sees one `events/poll` in flight for them.
//!
//! The shared call asks the slug to wait the longest a long poll may ([`SHARED_WAIT`]); each
//! caller waits for it at most its own `timeoutMs`, and at its timeout answers itself with no
//! events and its own cursor (the poll's "reply early, empty" is always allowed), while the
//! call goes on for the others. The call ends when its last waiter is gone (it is dropped with
//! the shared future). Entitlements are checked per caller before it joins.

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

/// The shared calls in flight, by key. Each runs as a task of its own to its end (at most
/// [`SHARED_WAIT`] and the request timeout), whoever still waits, and leaves the map then.
#[derive(Default)]
pub struct SharedPolls {
    calls: Arc<Mutex<HashMap<String, Call>>>,
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

/// The key of a long poll: everything that decides its answer but the wait.
fn key(slug: &str, params: &JsonObject) -> String {
    let pick = |k: &str| params.get(k).cloned().unwrap_or(Value::Null);
    json!([
        slug,
        pick("name"),
        sorted(&pick("arguments")),
        pick("cursor"),
        pick("maxEvents"),
        pick("maxAgeMs"),
    ])
    .to_string()
}

/// `v` with every object's keys in order (arguments that differ in key order are one poll).
fn sorted(v: &Value) -> Value {
    match v {
        Value::Object(o) => {
            let mut keys: Vec<&String> = o.keys().collect();
            keys.sort();
            Value::Object(
                keys.into_iter()
                    .map(|k| (k.clone(), sorted(&o[k])))
                    .collect(),
            )
        }
        Value::Array(a) => Value::Array(a.iter().map(sorted).collect()),
        other => other.clone(),
    }
}

impl SharedPolls {
    /// Long-polls `up` (as `slug`) with `params` (the slug's own event name), waiting at most
    /// `wait`; joins the same poll when one is in flight. The call runs on `ctx`.
    pub async fn poll(
        &self,
        slug: &str,
        up: &Arc<Upstream>,
        mut params: JsonObject,
        wait: Duration,
        ctx: &RoleContext,
        metrics: &PollMetrics,
    ) -> Result<Value, SourceError> {
        params.remove("timeoutMs");
        params.remove("_meta");
        let k = key(slug, &params);
        let call = {
            let mut calls = self.calls.locked();
            match calls.get(&k) {
                Some(c) => {
                    metrics.joined.inc();
                    c.clone()
                }
                None => {
                    metrics.upstream.inc();
                    let (tx, rx) = tokio::sync::oneshot::channel();
                    let (up, calls_map, key2) = (up.clone(), self.calls.clone(), k.clone());
                    let mut asked = params.clone();
                    asked.insert("timeoutMs".into(), (SHARED_WAIT.as_millis() as u64).into());
                    ctx.spawn_until_shutdown("shared events poll", async move {
                        let r = up
                            .custom_within(
                                "events/poll",
                                Value::Object(asked),
                                REQUEST_TIMEOUT + SHARED_WAIT,
                            )
                            .await
                            .map_err(SourceError::from);
                        // Done: the next asker starts a call of its own.
                        calls_map.locked().remove(&key2);
                        let _ = tx.send(r);
                    });
                    let slug = slug.to_owned();
                    let fut = async move {
                        rx.await.unwrap_or_else(|_| {
                            Err(SourceError::Unavailable(format!(
                                "the poll of server {slug} was cut short (shutting down); poll again"
                            )))
                        })
                    }
                    .boxed()
                    .shared();
                    calls.insert(k.clone(), fut.clone());
                    fut
                }
            }
        };
        match tokio::time::timeout(wait, call).await {
            Ok(r) => r,
            // Its own timeout: no events, and its cursor as it was.
            Err(_) => Ok(json!({
                "events": [],
                "cursor": params.get("cursor").cloned().unwrap_or(Value::Null),
                "truncated": false,
                "hasMore": false,
                "nextPollMs": crate::mcp::events::NEXT_POLL_MS,
            })),
        }
    }
}
