//! Unit tests of `server.rs`, kept beside it so the module itself stays readable.
use super::*;
use crate::mcp::limits::Limits;
use crate::mcp::source::WatchGuard;
use crate::source::memo::Memo;
use crate::store::Store;

async fn server(limits: Limits) -> SourceServer {
    let memo = Memo::open(Store::memory(), 16, None).await.unwrap();
    SourceServer::new(Arc::new(memo), limits, CancellationToken::new())
}

fn filter(uris: &[&str]) -> ListenFilter {
    ListenFilter {
        resources: Some(uris.iter().map(|u| u.to_string()).collect()),
        ..ListenFilter::default()
    }
}

/// Regression: the hub registration used to happen inside `listen`, after rmcp had sent
/// the ack, so a change published between the ack and the registration was lost.
#[tokio::test]
async fn admission_registers_accepted_uris_before_the_ack() {
    let s = server(Limits::default()).await;
    let conn = ConnStreams::default();
    let listen = s
        .admit(
            &Caller::default(),
            &filter(&["memo://notes", "memo://unknown"]),
            &conn,
        )
        .await
        .unwrap();
    assert_eq!(
        listen.uris(),
        vec!["memo://notes".to_string()],
        "the accepted subset"
    );
    assert_eq!(s.feed().listeners("memo://notes"), 1);
    assert_eq!(
        s.feed().listeners("memo://unknown"),
        0,
        "only accepted URIs"
    );
    s.feed().publish("memo://notes");
    assert_eq!(
        listen.registration.queue().next_batch().await,
        vec!["memo://notes".to_string()]
    );
    assert_eq!(conn.open(), 1);
    drop(listen);
    assert_eq!(conn.open(), 0, "the slot is released with the listen");
    assert_eq!(s.feed().listeners("memo://notes"), 0);
}

/// An HTTP listen left to rmcp is claimed once, by its handler; a request rmcp refused drops
/// its claims unclaimed, which the gate hears (and drops the listen it opened).
#[tokio::test]
async fn a_listen_claim_is_heard_once_or_dropped() {
    let (claim, claimed) = ListenClaim::new();
    let copy = claim.clone();
    assert!(copy.claim(), "the first claim is heard");
    assert!(!claim.claim(), "claimed once");
    assert!(claimed.await.is_ok());

    let (claim, unclaimed) = ListenClaim::new();
    let copy = claim.clone();
    drop(claim);
    drop(copy);
    assert!(unclaimed.await.is_err(), "dropped unclaimed");
}

/// Opening a listen admits it and builds its acknowledgment from what was admitted.
#[tokio::test]
async fn opening_a_listen_acknowledges_what_was_admitted() {
    let s = server(Limits::default()).await;
    let conn = ConnStreams::default();
    let asked = ListenFilter {
        task_ids: Some(vec!["t".into()]),
        ..filter(&["memo://notes", "memo://unknown"])
    };
    let (ack, listen) = s.open(&Caller::default(), &asked, &conn).await.unwrap();
    assert_eq!(ack.uris, Some(vec!["memo://notes".to_string()]));
    assert_eq!(
        ack.task_ids,
        Some(Vec::new()),
        "a server without tasks echoes none"
    );
    let id = rmcp::model::RequestId::Number(7);
    assert_eq!(
        ack.params(&id),
        json!({"_meta": {"io.modelcontextprotocol/subscriptionId": 7},
            "notifications": {"resourceSubscriptions": ["memo://notes"], "taskIds": []}})
    );
    drop(listen);
    let (ack, _listen) = s
        .open(&Caller::default(), &filter(&["memo://unknown"]), &conn)
        .await
        .unwrap();
    assert_eq!(ack.uris, None, "nothing accepted: no resourceSubscriptions");
}

/// A source that counts its live guards, and whose admission of `slow://` URIs waits
/// (holding a guard) until released.
struct Counting {
    live: Arc<AtomicUsize>,
    release: Arc<tokio::sync::Notify>,
    feed: ChangeFeed,
}

struct Held(Arc<AtomicUsize>);
impl Drop for Held {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[async_trait::async_trait]
impl crate::mcp::source::Source for Counting {
    fn info(&self) -> crate::mcp::source::SourceInfo {
        crate::mcp::source::SourceInfo {
            name: "counting".into(),
            instructions: None,
            ..crate::mcp::source::SourceInfo::default()
        }
    }
    fn resources(&self, _: &Caller) -> Vec<rmcp::model::Resource> {
        Vec::new()
    }
    async fn read(
        &self,
        _: &Caller,
        read: crate::mcp::source::Read<'_>,
    ) -> Result<crate::mcp::source::Contents, SourceError> {
        Err(SourceError::NotFound {
            uri: read.uri.into(),
        })
    }
    async fn admit(&self, caller: &Caller, filter: &ListenFilter) -> crate::mcp::source::Admission {
        let mut a = crate::mcp::source::Admission::default();
        for uri in filter.uris() {
            self.live.fetch_add(1, Ordering::AcqRel);
            let held = Held(self.live.clone());
            if uri.starts_with("slow://") {
                self.release.notified().await;
            }
            if caller.local {
                a.accept(&uri, format!("key:{uri}"), WatchGuard::new(held));
            } else {
                a.refuse(&uri, SourceError::Forbidden);
            }
        }
        a
    }
    fn changes(&self) -> ChangeFeed {
        self.feed.clone()
    }
}

fn counting() -> (SourceServer, Arc<AtomicUsize>, Arc<tokio::sync::Notify>) {
    let live = Arc::new(AtomicUsize::new(0));
    let release = Arc::new(tokio::sync::Notify::new());
    let source = Counting {
        live: live.clone(),
        release: release.clone(),
        feed: ChangeFeed::new(),
    };
    let s = SourceServer::new(
        Arc::new(source),
        Limits::default(),
        CancellationToken::new(),
    );
    (s, live, release)
}

#[tokio::test]
async fn admission_is_per_caller_and_keyed_by_the_source() {
    let (s, live, _) = counting();
    let conn = ConnStreams::default();
    let refused = s
        .admit(&Caller::default(), &filter(&["a://1"]), &conn)
        .await
        .unwrap();
    assert!(refused.uris().is_empty(), "this caller may watch nothing");
    assert_eq!(
        live.load(Ordering::Acquire),
        0,
        "a refused URI holds nothing"
    );
    let listen = s
        .admit(&Caller::local(), &filter(&["a://1", "a://2"]), &conn)
        .await
        .unwrap();
    assert_eq!(listen.uris(), vec!["a://1".to_string(), "a://2".into()]);
    assert_eq!(live.load(Ordering::Acquire), 2);
    assert_eq!(
        s.feed().listeners("key:a://1"),
        1,
        "registered under the key"
    );
    assert_eq!(s.feed().listeners("a://1"), 0);
    drop(listen);
    assert_eq!(live.load(Ordering::Acquire), 0, "guards go with the listen");
}

/// A client that gives up while its listen is being admitted (the source still waiting,
/// say, on an upstream's ack) leaves nothing behind: guards, slot, registration.
#[tokio::test]
async fn a_cancelled_admission_drops_its_guards() {
    let (s, live, release) = counting();
    let conn = ConnStreams::default();
    let (me, asked) = (Caller::local(), filter(&["a://1", "slow://2"]));
    let mut admitting = Box::pin(s.admit(&me, &asked, &conn));
    tokio::select! {
        biased;
        _ = admitting.as_mut() => panic!("admission waits for the slow URI"),
        _ = tokio::task::yield_now() => {}
    }
    assert_eq!(
        live.load(Ordering::Acquire),
        2,
        "both guards taken meanwhile"
    );
    assert_eq!(conn.open(), 1, "the slot is reserved first");
    drop(admitting);
    assert_eq!(live.load(Ordering::Acquire), 0);
    assert_eq!(conn.open(), 0);
    assert_eq!(s.feed().listeners("key:a://1"), 0);
    release.notify_waiters();
}

#[test]
fn a_standard_method_with_bad_params_is_invalid_params_not_unknown() {
    let req = |m: &str, p: serde_json::Value| CustomRequest::new(m.to_owned(), Some(p));
    let e = misshapen_standard_request(&req(
        "subscriptions/listen",
        json!({"notifications": {"resourceSubscriptions": "memo://notes"}}),
    ))
    .unwrap();
    assert_eq!(e.code.0, -32602);
    assert!(e.message.contains("resourceSubscriptions"), "{}", e.message);
    let e = misshapen_standard_request(&req("tools/call", json!({"arguments": "x"}))).unwrap();
    assert_eq!(e.code.0, -32602);
    assert!(e.message.contains("tools/call"), "{}", e.message);
    assert!(misshapen_standard_request(&req("events/poll", json!({}))).is_none());
    assert!(
        misshapen_standard_request(&req("tasks/get", json!({"taskId": 5}))).is_none(),
        "a method herald does not serve is not described as one with bad params"
    );
    assert!(
        misshapen_standard_request(&req("initialize", json!({}))).is_none(),
        "initialize is removed in 2026-07-28: an unparsable one stays an unknown method"
    );
}

#[tokio::test(start_paused = true)]
async fn a_long_poll_is_answered_at_shutdown() {
    let memo: DynSource = Arc::new(Memo::open(Store::memory(), 16, None).await.unwrap());
    let shutdown = CancellationToken::new();
    let params = |v: serde_json::Value| v.as_object().unwrap().clone();
    let start = memo
        .events_poll(&Caller::default(), params(json!({"name": "memo.changed"})))
        .await
        .unwrap();
    let long =
        params(json!({"name": "memo.changed", "cursor": start["cursor"], "timeoutMs": 20_000}));
    let waiting = {
        let (memo, shutdown) = (memo.clone(), shutdown.clone());
        tokio::spawn(async move {
            poll_until_shutdown(&memo, &Caller::default(), long, &shutdown).await
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!waiting.is_finished(), "the poll waits for an event");
    let began = tokio::time::Instant::now();
    shutdown.cancel();
    let r = waiting.await.unwrap().unwrap();
    assert_eq!(began.elapsed(), Duration::ZERO, "answered at once");
    assert_eq!(r["events"], json!([]));
    assert_eq!(r["cursor"], start["cursor"]);
}

#[tokio::test]
async fn admission_enforces_both_limits() {
    let s = server(Limits {
        max_streams_per_connection: 1,
        max_uris_per_stream: 2,
        ..Limits::default()
    })
    .await;
    let conn = ConnStreams::default();
    let anyone = Caller::default();
    let three = filter(&["memo://0", "memo://1", "memo://2"]);
    let err = s.admit(&anyone, &three, &conn).await.err().unwrap();
    assert_eq!(err.code.0, -32602);
    let one = filter(&["memo://notes"]);
    let _one = s.admit(&anyone, &one, &conn).await.unwrap();
    let err = s.admit(&anyone, &one, &conn).await.err().unwrap();
    assert!(
        err.message.contains("1 open listen streams"),
        "{}",
        err.message
    );
}

/// Only this server's own step-up says `insufficient_scope` (the HTTP gate answers it with a
/// `403` challenge): an upstream's, relayed, is said as the upstream's.
#[test]
fn an_upstreams_step_up_is_not_taken_for_this_servers() {
    let own = to_mcp_error(SourceError::InsufficientScope {
        slug: "memo".into(),
        tool: "memo_set".into(),
        scope: "herald:memo".into(),
    });
    assert_eq!(
        own.data,
        Some(json!({"reason": "insufficient_scope", "scope": "herald:memo"}))
    );
    let relayed = to_mcp_error(SourceError::Upstream {
        code: -32024,
        message: "no".into(),
        data: Some(json!({"reason": "insufficient_scope", "scope": "repo:write", "x": 1})),
    });
    assert_eq!(
        relayed.data,
        Some(json!({"reason": "upstream_insufficient_scope", "scope": "repo:write", "x": 1}))
    );
    let other = to_mcp_error(SourceError::Upstream {
        code: -32024,
        message: "no".into(),
        data: Some(json!({"reason": "revoked"})),
    });
    assert_eq!(other.data, Some(json!({"reason": "revoked"})));
}
