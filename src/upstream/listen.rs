//! [`KeptListen`]: one `subscriptions/listen` kept open on an upstream's connection, listened
//! again with backoff whenever it ends or fails, until stopped. The one machinery behind the
//! gateway's shared listens: a watched URI's (`resourceSubscriptions`) and a slug's tool and
//! prompt lists (`toolsListChanged`, `promptsListChanged`). Its user asks [`KeptListen::next`]
//! for what it heard and decides what each thing means. Also here: [`Listening`], the one
//! listen [`Upstream::listen`] opens for a watch.

use std::sync::Arc;
use std::time::Instant;

use rmcp::model::{ServerNotification, SubscriptionFilter};
use rmcp::service::{Subscription, SubscriptionEnd};
use tokio_util::sync::CancellationToken;

use super::{Live, REQUEST_TIMEOUT, Upstream, UpstreamError};
use crate::runtime::backoff::Backoff;

/// One acknowledged `subscriptions/listen` on an upstream's connection ([`Upstream::listen`]).
/// Dropping it ends the listen.
#[must_use = "dropping a Listening ends the listen"]
pub struct Listening {
    pub(super) live: Arc<Live>,
    pub(super) sub: Subscription,
    /// Its updates carry their reads, the first one right after the acknowledgment.
    pub(super) carries: bool,
}

impl Listening {
    /// Whether its updates carry their reads (`io.herald/contents`): the stream starts with
    /// one update per URI carrying its read, and each later update carries the read after it
    /// (see [`carried`]).
    pub fn carries(&self) -> bool {
        self.carries
    }

    /// What the upstream's acknowledgment accepted.
    pub fn acknowledged(&self) -> &SubscriptionFilter {
        self.sub.acknowledged()
    }

    /// The next notification; `Ok(None)` or an error once the listen ended ([`Listening::end`]
    /// says how).
    pub async fn next(&mut self) -> Result<Option<ServerNotification>, rmcp::ServiceError> {
        self.sub.next().await
    }

    /// How the listen ended, once it has.
    pub fn end(&self) -> Option<&SubscriptionEnd> {
        self.sub.end()
    }

    /// Whether the connection under it is gone (not just this listen).
    pub fn connection_lost(&self) -> bool {
        self.live.conn.is_closed()
    }
}

/// What an update of a listen that [carries](Listening::carries) reads brought, taken out of
/// it: the read (text, or a blob as its base64), or why the server could not read (the client
/// reads itself). `None`: it carries nothing.
pub fn carried(
    update: &mut rmcp::model::ResourceUpdatedNotification,
) -> Option<Result<crate::mcp::source::Contents, String>> {
    use crate::mcp::admission::CONTENTS;
    use crate::mcp::source::Contents;
    use serde_json::Value;
    let taken = update
        .extensions
        .get_mut::<rmcp::model::NotificationMetaObject>()
        .and_then(|m| m.remove(CONTENTS))
        .or_else(|| update.params.meta.as_mut()?.remove(CONTENTS))?;
    let Value::Object(mut c) = taken else {
        return Some(Err("the update carried no read".into()));
    };
    let mime = match c.remove("mimeType") {
        Some(Value::String(m)) => m,
        _ => String::new(),
    };
    // A blob is kept as its base64, as the watch diffs a blob.
    match c.remove("text").or_else(|| c.remove("blob")) {
        Some(Value::String(text)) => Some(Ok(Contents::text(mime, text))),
        _ => Some(Err(c
            .get("error")
            .and_then(|e| e.get("message"))
            .and_then(Value::as_str)
            .unwrap_or("the update carried no read")
            .to_owned())),
    }
}

impl Upstream {
    /// Forgets the connection `listening` was opened on (a read on it failed, or it closed),
    /// so the next use reconnects. Other listens on it are unaffected until they end.
    pub fn forget_connection_of(&self, listening: &Listening) {
        self.reset(&listening.live);
    }
}

/// What a listen asks of a connection; `None`: nothing on this one (an older server, or one
/// that offers none of it).
pub type FilterFor = Box<dyn Fn(&Live) -> Option<SubscriptionFilter> + Send + Sync>;

/// Which connection something was heard on: opaque outside this module, handed back to
/// operations that must run on that same connection ([`Upstream::refresh_list`]).
#[derive(Clone)]
pub struct HeardOn(pub(super) Arc<Live>);

/// What [`KeptListen::next`] heard.
pub enum Heard {
    /// A listen was acknowledged (the first, or one after the last ended), naming something
    /// the filter asked for. Whatever changed while none was open is for the caller to catch.
    Acknowledged {
        on: HeardOn,
        accepted: SubscriptionFilter,
    },
    /// A notification on the open listen, on that connection.
    Notification(HeardOn, ServerNotification),
    /// That connection offers nothing to listen for. Asked again, `next` looks again at
    /// once: the caller waits for something to change first.
    Nothing(HeardOn),
    /// No connection, or the listen failed or was refused; the next listen waits for the
    /// backoff (unless [`KeptListen::now`]).
    Failed(String),
}

struct Open {
    live: Arc<Live>,
    sub: Subscription,
    since: Instant,
}

/// One listen on `up`, kept: see the module docs.
pub struct KeptListen {
    up: Arc<Upstream>,
    filter: FilterFor,
    backoff: Backoff,
    stop: CancellationToken,
    /// What logs call it (a URI, "lists").
    what: String,
    open: Option<Open>,
    /// Wait for the backoff before the next listen.
    pause: bool,
}

impl KeptListen {
    pub fn new(
        up: Arc<Upstream>,
        filter: FilterFor,
        backoff: Backoff,
        stop: CancellationToken,
        what: impl Into<String>,
    ) -> KeptListen {
        KeptListen {
            up,
            filter,
            backoff,
            stop,
            what: what.into(),
            open: None,
            pause: false,
        }
    }

    /// Listen again without waiting out the backoff (the caller waited for a new connection).
    pub fn now(&mut self) {
        self.pause = false;
    }

    /// What it heard next, listening (again) as needed; `None` once stopped. Not cancel-safe
    /// while listening again: call it to completion, and stop it with its token.
    pub async fn next(&mut self) -> Option<Heard> {
        loop {
            if let Some(open) = self.open.as_mut() {
                let n = tokio::select! {
                    _ = self.stop.cancelled() => return None,
                    n = open.sub.next() => n,
                };
                match n {
                    Ok(Some(n)) => return Some(Heard::Notification(HeardOn(open.live.clone()), n)),
                    Ok(None) | Err(_) => {
                        let open = self.open.take()?;
                        if open.live.conn.is_closed() {
                            self.up.reset(&open.live);
                        }
                        self.backoff.ran_for(open.since.elapsed());
                        self.pause = true;
                        tracing::info!(slug = %self.up.name, what = %self.what, "upstream subscription ended; resubscribing");
                        continue;
                    }
                }
            }
            if std::mem::take(&mut self.pause) {
                let delay = self.backoff.next_delay();
                tokio::select! {
                    _ = self.stop.cancelled() => return None,
                    _ = tokio::time::sleep(delay) => {}
                }
            }
            let attempt = tokio::select! {
                _ = self.stop.cancelled() => return None,
                r = self.attempt() => r,
            };
            return Some(match attempt {
                Ok(Ok(open)) => {
                    let heard = Heard::Acknowledged {
                        on: HeardOn(open.live.clone()),
                        accepted: open.sub.acknowledged().clone(),
                    };
                    self.open = Some(open);
                    heard
                }
                Ok(Err(live)) => Heard::Nothing(HeardOn(live)),
                Err(e) => {
                    self.pause = true;
                    Heard::Failed(e)
                }
            });
        }
    }

    /// One listen on the current connection (made if need be), or that connection when there
    /// is nothing to ask of it.
    async fn attempt(&self) -> Result<Result<Open, Arc<Live>>, String> {
        let up = &self.up;
        let live = up.live().await.map_err(|e| e.to_string())?;
        let Some(filter) = (self.filter)(&live) else {
            return Ok(Err(live));
        };
        let sub = tokio::time::timeout(REQUEST_TIMEOUT, live.conn.listen(filter))
            .await
            .map_err(|_| "no acknowledgment in time".to_owned())?;
        match sub {
            Ok(sub) if names_something(sub.acknowledged()) => Ok(Ok(Open {
                live,
                sub,
                since: Instant::now(),
            })),
            Ok(_) => Err("the upstream did not accept the subscription".to_owned()),
            Err(e) => {
                let why = crate::transport::explain::request(&up.target, &e);
                if !UpstreamError::service(&up.name, &up.target, REQUEST_TIMEOUT, e).is_answered() {
                    up.reset(&live);
                }
                Err(format!("the upstream failed the subscription: {why}"))
            }
        }
    }
}

/// Whether an acknowledgment accepted anything (it names only what was asked: rmcp checks).
fn names_something(f: &SubscriptionFilter) -> bool {
    [
        f.tools_list_changed,
        f.prompts_list_changed,
        f.resources_list_changed,
    ]
    .contains(&Some(true))
        || f.resource_subscriptions
            .as_ref()
            .is_some_and(|u| !u.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcp::source::{Body, Contents};
    use crate::testing::MemoServer;
    use crate::transport::target::Target;
    use rmcp::model::ResourceUpdatedNotification;
    use serde_json::{Value, json};
    use std::time::Duration;

    fn upstream(memo: &MemoServer, contents: bool) -> Arc<Upstream> {
        memo.upstream_with(super::super::UpstreamConfig {
            contents,
            ..super::super::UpstreamConfig::new(
                Target::Stdio("in-process memo".into()),
                Default::default(),
                1 << 20,
            )
        })
    }

    async fn update(l: &mut Listening) -> ResourceUpdatedNotification {
        loop {
            let n = tokio::time::timeout(Duration::from_secs(10), l.next())
                .await
                .expect("an update in time")
                .unwrap()
                .expect("the listen is open");
            if let ServerNotification::ResourceUpdatedNotification(u) = n {
                return u;
            }
        }
    }

    fn text(c: Contents) -> Value {
        match c.body {
            Body::Text(t) => serde_json::from_str(&t).unwrap(),
            Body::Blob(_) => panic!("a blob"),
        }
    }

    fn keys(log: &Value) -> Vec<&str> {
        log["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["key"].as_str().unwrap())
            .collect()
    }

    fn listen_to(uri: &str) -> SubscriptionFilter {
        SubscriptionFilter::builder()
            .resource_subscription(uri)
            .build()
    }

    #[tokio::test]
    async fn updates_carry_their_reads_the_baseline_first_then_only_what_is_new() {
        let memo = MemoServer::start().await;
        memo.set("a", json!(1)).await;
        let up = upstream(&memo, true);
        let mut l = up.listen(listen_to("memo://log")).await.unwrap();
        assert!(l.carries());
        // The baseline: the whole log, right after the acknowledgment.
        let base = text(carried(&mut update(&mut l).await).unwrap().unwrap());
        assert_eq!(keys(&base), ["a"]);
        memo.set("b", json!(2)).await;
        let next = text(carried(&mut update(&mut l).await).unwrap().unwrap());
        // What is past the last read, led by its newest event (the anchor a reader's gap
        // rule needs).
        assert_eq!(keys(&next), ["a", "b"]);
        memo.set("c", json!(3)).await;
        let next = text(carried(&mut update(&mut l).await).unwrap().unwrap());
        assert_eq!(keys(&next), ["b", "c"]);
        // A state resource's update carries the whole state.
        let mut s = up.listen(listen_to("memo://notes")).await.unwrap();
        let notes = text(carried(&mut update(&mut s).await).unwrap().unwrap());
        assert_eq!(notes, json!({"a": 1, "b": 2, "c": 3}));
    }

    /// The keys of events in `reads` past the first read's, each once (pages overlap by their
    /// anchor), in order.
    fn new_keys(reads: &[Value]) -> Vec<String> {
        let mut last = newest(&reads[0]);
        let mut keys = Vec::new();
        for r in &reads[1..] {
            for e in r["events"].as_array().unwrap() {
                if e["seq"].as_u64().unwrap() > last {
                    last = e["seq"].as_u64().unwrap();
                    keys.push(e["key"].as_str().unwrap().to_owned());
                }
            }
        }
        keys
    }

    fn newest(log: &Value) -> u64 {
        log["events"]
            .as_array()
            .unwrap()
            .last()
            .map_or(0, |e| e["seq"].as_u64().unwrap())
    }

    /// A burst of 200 events of 8 KiB each: 1.6 MB, seven pages (more than a stream sends
    /// in one turn).
    fn burst(memo: &MemoServer) -> Vec<String> {
        let keys: Vec<String> = (0..200).map(|i| format!("k{i:03}")).collect();
        let big = json!("x".repeat(8 << 10));
        memo.memo
            .apply_burst(keys.iter().map(|k| (k.clone(), big.clone())).collect());
        keys
    }

    #[test]
    fn carried_reads_made_before_the_readers_own_are_passed_over_but_a_restart_is_not() {
        use crate::upstream::log::ReadAhead;
        let mut a = ReadAhead::default();
        // Nothing read ahead: every carried read is taken.
        assert!(!a.passed(|| Some(10)));
        // The stream's baseline was 80; the reader then read up to 100 itself.
        a.carried(Some(80));
        a.read_to(Some(100));
        assert!(a.passed(|| Some(90)), "made before: nothing new");
        assert!(a.passed(|| Some(100)));
        assert!(
            !a.passed(|| Some(120)),
            "past it: taken, and the floor is gone"
        );
        assert!(
            !a.passed(|| Some(110)),
            "no floor: taken (a restart below the last)"
        );
        // A restart while the floor stands: below the last one carried, taken.
        a.carried(Some(80));
        a.read_to(Some(100));
        assert!(a.passed(|| Some(85)));
        assert!(
            !a.passed(|| Some(5)),
            "the log restarted below the stream's own reads"
        );
        assert!(!a.passed(|| None));
    }

    #[tokio::test]
    async fn a_burst_past_a_page_is_carried_page_by_page_every_event_once() {
        let memo = MemoServer::with_ring(512).await;
        memo.set("a", json!(1)).await;
        let up = upstream(&memo, true);
        let mut l = up.listen(listen_to("memo://log")).await.unwrap();
        let mut reads = vec![text(carried(&mut update(&mut l).await).unwrap().unwrap())];
        let keys = burst(&memo);
        let mut pages_with_more = 0;
        while new_keys(&reads).len() < keys.len() {
            let mut u = update(&mut l).await;
            let c = carried(&mut u)
                .expect("an event log is paged, never sent plain")
                .unwrap();
            let Body::Text(t) = &c.body else {
                panic!("a blob")
            };
            pages_with_more += usize::from(crate::mcp::ring::more_waiting(t));
            assert!(t.len() < 600 << 10, "a page of {} bytes", t.len());
            reads.push(text(c));
        }
        assert_eq!(new_keys(&reads), keys, "every event once, in order");
        assert!(
            pages_with_more >= 5,
            "{pages_with_more} pages said more was waiting"
        );
    }

    #[tokio::test]
    async fn a_follow_that_reads_for_itself_reads_page_by_page() {
        let memo = MemoServer::with_ring(512).await;
        memo.set("a", json!(1)).await;
        let up = upstream(&memo, false);
        let (mut follow, _) = up.follow_log("memo://log", None).await.unwrap();
        let keys = burst(&memo);
        let mut got = Vec::new();
        while got.len() < keys.len() {
            let events = tokio::time::timeout(Duration::from_secs(10), follow.next())
                .await
                .expect("events in time")
                .expect("the follow is open")
                .unwrap();
            got.extend(events.iter().map(|e| e["key"].as_str().unwrap().to_owned()));
        }
        assert_eq!(got, keys, "every event once, in order, no GAP");
    }

    #[tokio::test]
    async fn a_uri_too_big_to_carry_gets_plain_updates_and_its_client_reads() {
        let memo = MemoServer::start().await;
        memo.set("big", json!("x".repeat(300 << 10))).await;
        let up = upstream(&memo, true);
        let mut l = up.listen(listen_to("memo://notes")).await.unwrap();
        assert!(l.carries());
        // The baseline is over 256 KiB: a plain update, read by the client.
        assert!(carried(&mut update(&mut l).await).is_none());
        memo.set("a", json!(1)).await;
        assert!(carried(&mut update(&mut l).await).is_none());
        // Small again: still plain (it stays so on this stream), never wrong.
        memo.set("big", json!(0)).await;
        assert!(carried(&mut update(&mut l).await).is_none());
        let read = up.read("memo://notes", None).await.unwrap();
        assert_eq!(text(read), json!({"a": 1, "big": 0}));
    }

    #[tokio::test]
    async fn a_listen_that_did_not_ask_gets_plain_updates() {
        let memo = MemoServer::start().await;
        let up = upstream(&memo, false);
        let mut l = up.listen(listen_to("memo://notes")).await.unwrap();
        assert!(!l.carries());
        memo.set("a", json!(1)).await;
        let mut u = update(&mut l).await;
        assert!(carried(&mut u).is_none());
    }
}
