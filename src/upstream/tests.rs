use super::*;
use std::sync::atomic::AtomicUsize;

use crate::testing::{MemoServer, down_upstream};

#[tokio::test(start_paused = true)]
async fn a_connect_that_hangs_does_not_hold_the_drain() {
    let ctx = RoleContext::new("gateway");
    let dialer: Dialer = Arc::new(|_relay| Box::pin(std::future::pending()));
    let up = Arc::new(Upstream::dialing(
        UpstreamConfig {
            name: "slow".into(),
            connect_timeout: Duration::from_secs(10),
            context: Some(ctx.clone()),
            supervise: true,
            ..UpstreamConfig::new(
                Target::Http("http://slow/mcp".into()),
                Default::default(),
                1 << 20,
            )
        },
        dialer,
    ));
    // A caller (a relay, an events probe) gives up; the connect goes on, tracked.
    let _ = tokio::time::timeout(Duration::from_millis(100), up.live()).await;
    assert_eq!(
        ctx.running(),
        vec![("gateway/upstream connect".to_owned(), 1)]
    );
    let started = tokio::time::Instant::now();
    assert_eq!(ctx.drain(Duration::from_secs(6)).await, Ok(()));
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "not the 10 s connect timeout"
    );
}

#[tokio::test]
async fn a_connect_fetches_the_catalog_and_routing_uses_it() {
    let memo = MemoServer::start().await;
    let up = memo.upstream();
    assert!(
        up.catalog().is_none(),
        "nothing known before the first connect"
    );
    assert!(pick(std::slice::from_ref(&up), "memo://notes").is_none());
    let live = up.live().await.unwrap();
    assert!(live.modern && live.subscribe && live.events);
    assert!(live.lists("memo://notes") && live.lists("memo://log"));
    assert_eq!(live.read_only("memo_set"), Some(false));
    assert_eq!(
        live.listing.len(),
        live.resources.len() + live.templates.len()
    );
    let down = down_upstream(Arc::new(AtomicUsize::new(0)));
    let both = [down, up.clone()];
    assert!(Arc::ptr_eq(pick(&both, "memo://notes").unwrap(), &up));
    // The memo source is modern and subscribable: the fallback for an unlisted URI.
    assert!(Arc::ptr_eq(pick(&both, "other://x").unwrap(), &up));
    assert!(
        Arc::ptr_eq(&up.live().await.unwrap(), &live),
        "one connection, shared"
    );
}

#[tokio::test]
async fn a_failed_connect_is_not_retried_before_its_backoff() {
    let attempts = Arc::new(AtomicUsize::new(0));
    let up = down_upstream(attempts.clone());
    let e = up.live().await.err().unwrap();
    assert!(e.detail.contains("connection refused"), "{e}");
    assert_eq!(attempts.load(Ordering::SeqCst), 1);
    // Within the backoff (250 ms) the next use is refused without dialing, with the reason.
    let again = up.live().await.err().unwrap();
    assert_eq!(again, e);
    assert_eq!(attempts.load(Ordering::SeqCst), 1);
    assert!(!up.connecting());
    // What a served caller learns names the server, not the reason.
    let SourceError::Unavailable(m) = SourceError::from(e) else {
        panic!("unavailable")
    };
    assert!(
        m.contains("http://down/mcp") && !m.contains("refused"),
        "{m}"
    );
}

#[tokio::test]
async fn callers_at_once_share_one_connect() {
    let memo = MemoServer::start().await;
    let dials = Arc::new(AtomicUsize::new(0));
    let inner = memo.dialer();
    let counted: Dialer = {
        let dials = dials.clone();
        Arc::new(move |relay| {
            dials.fetch_add(1, Ordering::SeqCst);
            inner(relay)
        })
    };
    let up = Arc::new(Upstream::dialing(
        UpstreamConfig::new(Target::Stdio("m".into()), Default::default(), 1 << 20),
        counted,
    ));
    let (a, b, c) = tokio::join!(up.live(), up.live(), up.live());
    let (a, b, c) = (a.unwrap(), b.unwrap(), c.unwrap());
    assert!(Arc::ptr_eq(&a, &b) && Arc::ptr_eq(&b, &c));
    assert_eq!(dials.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_broken_connection_is_replaced_and_the_catalog_kept_meanwhile() {
    let memo = MemoServer::start().await;
    let up = memo.upstream();
    let first = up.live().await.unwrap();
    memo.drop_connections();
    tokio::time::timeout(Duration::from_secs(5), async {
        while !first.conn.is_closed() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the connection ends");
    assert!(up.cached().is_none());
    assert!(up.catalog().is_some(), "routing keeps the server's URIs");
    let second = up.live().await.unwrap();
    assert!(!Arc::ptr_eq(&first, &second));
    // `reset` forgets a connection a caller found broken; the next use connects again.
    up.reset(&second);
    let third = up.live().await.unwrap();
    assert!(!Arc::ptr_eq(&second, &third));
}

#[tokio::test]
async fn an_event_log_is_followed_by_cursor_from_where_the_last_follow_got_to() {
    let memo = MemoServer::start().await;
    memo.set("before", serde_json::json!(1)).await;
    let up = memo.upstream();
    // The first follow is the baseline: what the log holds, as read.
    let (mut follow, held) = up.follow_log("memo://log", None).await.unwrap();
    assert!(
        held.iter()
            .any(|e| e.get("key") == Some(&"before".into()) || format!("{e:?}").contains("before")),
        "{held:?}"
    );
    let at = follow.cursor();
    memo.set("after", serde_json::json!(2)).await;
    let fresh = tokio::time::timeout(Duration::from_secs(10), follow.next())
        .await
        .expect("an update in time")
        .expect("still subscribed")
        .unwrap();
    assert!(
        !fresh.is_empty() && format!("{fresh:?}").contains("after"),
        "{fresh:?}"
    );
    assert!(
        !format!("{fresh:?}").contains("before"),
        "only what is past the cursor: {fresh:?}"
    );
    assert!(follow.cursor().last > at.last);
    // A new follow from that cursor starts past it: nothing again, then what comes next.
    drop(follow);
    let (mut again, first) = up.follow_log("memo://log", Some(at)).await.unwrap();
    assert!(format!("{first:?}").contains("after"), "{first:?}");
    memo.set("third", serde_json::json!(3)).await;
    let next = tokio::time::timeout(Duration::from_secs(10), again.next())
        .await
        .expect("an update in time")
        .expect("still subscribed")
        .unwrap();
    assert!(
        format!("{next:?}").contains("third") && !format!("{next:?}").contains("after"),
        "{next:?}"
    );
}

#[tokio::test]
async fn the_last_error_is_reported_only_while_not_connected() {
    let memo = MemoServer::start().await;
    let up = memo.upstream();
    let live = up.live().await.unwrap();
    // A failure seen while the connection is up (a stdio child that exited, say) is not shown
    // beside CONNECTED...
    let _ = up.failed("the process exited (exit status: 1); restarting it".into());
    let r = up.report();
    assert!(r.connected);
    assert_eq!(r.last_error, None);
    // ...and is, once the connection is gone.
    up.reset(&live);
    let r = up.report();
    assert!(!r.connected);
    assert_eq!(
        r.last_error.as_deref(),
        Some("the process exited (exit status: 1); restarting it")
    );
}

/// A call's future is moved whole when it starts (into the gateway's boxed handler): the
/// rmcp path is boxed, so it does not make every call's future, the direct HTTP path's too,
/// larger than rmcp's own request (unboxed it was the two together).
#[test]
fn a_calls_future_is_smaller_than_the_rmcp_path_it_may_take() {
    let up = down_upstream(Default::default());
    let call = crate::mcp::source::Call::default();
    let params = rmcp::model::CallToolRequestParams::new("t");
    let request = ClientRequest::CallToolRequest(rmcp::model::Request::new(params));
    let rmcp = std::mem::size_of_val(&up.request(request, &call));
    let whole = std::mem::size_of_val(&up.call_tool("t", rmcp::model::JsonObject::new(), call));
    assert!(
        whole < rmcp,
        "{whole} bytes for a call; rmcp's request alone is {rmcp}"
    );
}
