//! `nats::ordered::Follow` against a real `nats-server -js`: in order from a sequence, across
//! restarts, and told by NATS (never by a clock) when to look at its stream again
//! (`nats::lookout`).

use async_nats::jetstream;
use futures::{FutureExt, StreamExt};
use herald::nats::ordered::Follow;

use crate::nats::NatsServer;
use crate::support::*;

/// A connection made as herald's roles make theirs.
async fn connection(url: &str) -> herald::nats::Connection {
    herald::nats::NatsConfig {
        urls: url.to_owned(),
        bucket: "unused".into(),
        ..Default::default()
    }
    .connect(&herald::runtime::metrics::Metrics::default())
    .await
    .unwrap()
}

/// The next message of `f`: its stream sequence, body and what was pending after it.
async fn next_of(f: &mut herald::nats::ordered::Follow) -> (u64, String, u64) {
    let d = tokio::time::timeout(WAIT, f.next())
        .await
        .expect("a message in time")
        .expect("the follow is not stopped");
    let body = String::from_utf8(d.message.payload.to_vec()).unwrap();
    (d.sequence, body, d.pending)
}

/// Publishes `body` on `subject`, retrying while the client reconnects; its stream sequence.
async fn publish_seq(js: &async_nats::jetstream::Context, subject: &str, body: &str) -> u64 {
    for _ in 0..50 {
        let sent = async {
            js.publish(subject.to_owned(), body.to_owned().into())
                .await?
                .await
                .map_err(async_nats::Error::from)
        };
        if let Ok(Ok(ack)) = tokio::time::timeout(WAIT, sent).await {
            return ack.sequence;
        }
    }
    panic!("cannot publish {body} to {subject}");
}

#[tokio::test]
async fn the_ordered_follow_resumes_from_a_sequence_and_across_a_nats_restart() {
    let mut nats = NatsServer::start().await;
    let conn = connection(&nats.url()).await;
    let js = jetstream::new(conn.client.clone());
    let stream = js
        .create_stream(jetstream::stream::Config {
            name: "follow_it".into(),
            subjects: vec!["follow.>".into()],
            storage: jetstream::stream::StorageType::File,
            ..Default::default()
        })
        .await
        .unwrap();
    for i in 1..=3 {
        publish_seq(&js, "follow.a", &format!("a{i}")).await;
        publish_seq(&js, "follow.b", &format!("b{i}")).await;
    }
    let stop = tokio_util::sync::CancellationToken::new();
    // From the start, only its subject, in order, with stream sequences.
    let mut f = Follow::new(&conn, stream.clone(), "follow.a", 0, stop.clone());
    assert_eq!(next_of(&mut f).await, (1, "a1".into(), 2));
    assert_eq!(next_of(&mut f).await, (3, "a2".into(), 1));
    assert_eq!(next_of(&mut f).await, (5, "a3".into(), 0));
    assert_eq!(f.resume_at(), 6);
    // A second consumer started from a sequence (as after a restart of its process) gets
    // what comes from there on, and then what is published.
    let mut g = Follow::start(&conn, stream.clone(), "follow.a", 4, stop.clone())
        .await
        .unwrap();
    assert_eq!(next_of(&mut g).await, (5, "a3".into(), 0));
    let s = publish_seq(&js, "follow.a", "a4").await;
    assert_eq!(next_of(&mut g).await, (s, "a4".into(), 0));
    assert_eq!(next_of(&mut f).await, (s, "a4".into(), 0));
    // NATS restarts (its ephemeral consumers are gone): each follow goes on after its last
    // message, losing and repeating nothing.
    nats.restart().await;
    let s5 = publish_seq(&js, "follow.a", "a5").await;
    assert_eq!(next_of(&mut f).await, (s5, "a5".into(), 0));
    assert_eq!(next_of(&mut g).await, (s5, "a5".into(), 0));
    // Stopped by its token, waiting or not.
    let waiting = tokio::spawn(async move { f.next().await.is_none() });
    stop.cancel();
    assert!(tokio::time::timeout(WAIT, waiting).await.unwrap().unwrap());
    assert!(g.next().await.is_none());
}

/// An idle follower asks NATS nothing: in the time of two of its consumer's idle heartbeats
/// (the server's clock: 5 s apart) it sends no request about its stream (a follower on a
/// clock would). Then NATS loses its data; the follower finds its stream gone, cannot make it,
/// and is told when another process makes it again: it follows the new stream from its
/// start.
#[tokio::test]
async fn an_idle_follow_asks_nothing_and_is_told_of_its_stream_made_again() {
    let mut nats = NatsServer::start().await;
    let conn = connection(&nats.url()).await;
    let (config, mut f) = past_a1(&conn, "told_it").await;

    // A spy on what is asked about the stream, and on the heartbeats to the follower's inbox.
    let spy = async_nats::connect(nats.url()).await.unwrap();
    let mut asks = spy.subscribe("$JS.API.STREAM.INFO.told_it").await.unwrap();
    let mut inbox = spy.subscribe("_INBOX.>").await.unwrap();
    spy.flush().await.unwrap();
    let waiting = tokio::spawn(async move {
        let d = f.next().await;
        (f, d)
    });
    tokio::time::timeout(WAIT, async {
        let mut beats = 0;
        while beats < 2 {
            let m = inbox.next().await.expect("the spy's subscription");
            if m.status == Some(async_nats::StatusCode::IDLE_HEARTBEAT) {
                beats += 1;
            }
        }
    })
    .await
    .expect("two idle heartbeats to the follower's consumer");
    spy.flush().await.unwrap();
    if let Some(Some(ask)) = asks.next().now_or_never() {
        panic!(
            "an idle follower asked about its stream: {}",
            String::from_utf8_lossy(&ask.payload)
        );
    }

    let url = nats.url();
    assert_eq!(
        remade_by_another(&mut nats, &url, config, waiting).await,
        (1, "b1".to_owned())
    );
}

/// A stream `name` of `told.>` with `a1` on `told.a`, and a follower of `told.a` that has
/// passed it on.
async fn past_a1(
    conn: &herald::nats::Connection,
    name: &str,
) -> (jetstream::stream::Config, Follow) {
    let js = jetstream::new(conn.client.clone());
    let config = jetstream::stream::Config {
        name: name.into(),
        subjects: vec!["told.>".into()],
        storage: jetstream::stream::StorageType::File,
        ..Default::default()
    };
    let stream = js.create_stream(config.clone()).await.unwrap();
    publish_seq(&js, "told.a", "a1").await;
    let shutdown = tokio_util::sync::CancellationToken::new();
    let mut f = Follow::new(conn, stream, "told.a", 0, shutdown);
    assert_eq!(next_of(&mut f).await, (1, "a1".into(), 0));
    (config, f)
}

/// NATS loses its data; once the follower (waiting in `waiting`) has looked for its stream
/// and found it gone, another process (at `url`) makes it again with `config` and publishes
/// `b1` on `told.a`: what the follower passes on next, its sequence and body.
async fn remade_by_another(
    nats: &mut NatsServer,
    url: &str,
    config: jetstream::stream::Config,
    waiting: tokio::task::JoinHandle<(Follow, Option<herald::nats::ordered::Delivered>)>,
) -> (u64, String) {
    nats.kill().await;
    std::fs::remove_dir_all(nats.dir().join("jetstream")).unwrap();
    nats.start_again().await;
    let other = connection(url).await.client;
    let mut asks = other
        .subscribe(format!("$JS.API.STREAM.INFO.{}", config.name))
        .await
        .unwrap();
    tokio::time::timeout(WAIT, asks.next())
        .await
        .expect("the follower looks for its stream after NATS is back");
    // The follower was not told how to make the stream.
    let ojs = jetstream::new(other);
    ojs.create_stream(config).await.unwrap();
    publish_seq(&ojs, "told.a", "b1").await;
    let (_f, d) = tokio::time::timeout(WAIT, waiting)
        .await
        .expect("the follower finds the stream made again")
        .unwrap();
    let d = d.expect("not stopped");
    (
        d.sequence,
        String::from_utf8_lossy(&d.message.payload).into_owned(),
    )
}

/// A follower whose NATS user may not subscribe to the streams' creation advisories still
/// finds its stream made again by another process after NATS lost its data: it looks for
/// it with a backoff while it is gone.
#[tokio::test]
async fn a_follow_refused_the_advisory_finds_its_stream_made_again() {
    let mut nats = NatsServer::start_configured(
        r#"
        authorization {
          users = [
            { user: admin, password: admin }
            { user: follower, password: follower, permissions: {
                publish: { allow: [">"] }
                subscribe: { allow: [">"], deny: ["$JS.EVENT.ADVISORY.>"] }
            } }
          ]
        }
        "#,
    )
    .await;
    // A user and password in the URL are herald's credentials; wrong ones are told as such,
    // without the password.
    let wrong = herald::nats::NatsConfig {
        urls: format!("nats://follower:wr%40ng@127.0.0.1:{}", nats.port),
        bucket: "unused".into(),
        ..Default::default()
    }
    .connect(&herald::runtime::metrics::Metrics::default())
    .await
    .err()
    .expect("a wrong password is refused");
    assert!(
        wrong.contains("refused herald's credentials")
            && !wrong.contains("wr%40ng")
            && !wrong.contains("wr@ng"),
        "{wrong}"
    );
    let admin = format!("nats://admin:admin@127.0.0.1:{}", nats.port);
    let conn = connection(&format!("nats://follower:follower@127.0.0.1:{}", nats.port)).await;
    let (config, mut f) = past_a1(&conn, "refused_it").await;
    let waiting = tokio::spawn(async move {
        let d = f.next().await;
        (f, d)
    });
    assert_eq!(
        remade_by_another(&mut nats, &admin, config, waiting).await,
        (1, "b1".to_owned())
    );
}

/// A lookout is due when its client connected again, when its stream is made, and after the
/// pause of a look that did not find the stream; not otherwise.
#[tokio::test]
async fn a_lookout_is_due_at_a_reconnect_its_stream_made_or_after_a_look_that_failed() {
    use herald::nats::lookout::{AGAIN, Lookout};
    let mut nats = NatsServer::start().await;
    let conn = connection(&nats.url()).await;
    let js = jetstream::new(conn.client.clone());
    let mut lookout = Lookout::new(&conn, "watched_it");
    lookout.looking().await;
    let not_due = |l: &mut Lookout| l.due().now_or_never().is_none();

    // Its stream made: due.
    js.create_stream(jetstream::stream::Config {
        name: "watched_it".into(),
        subjects: vec!["watched.>".into()],
        ..Default::default()
    })
    .await
    .unwrap();
    tokio::time::timeout(WAIT, lookout.due())
        .await
        .expect("due when the stream is made");
    lookout.looking().await;
    lookout.found(true);
    conn.client.flush().await.unwrap();
    assert!(not_due(&mut lookout), "due again with nothing new");

    // A look that did not find the stream: due again after a pause, once.
    lookout.looking().await;
    let looked = std::time::Instant::now();
    lookout.found(false);
    let early = not_due(&mut lookout);
    // (Only while the pause can still be running: a stalled test may be past it.)
    if looked.elapsed() < AGAIN.delay(0) {
        assert!(early, "due before the pause");
    }
    tokio::time::timeout(WAIT, lookout.due())
        .await
        .expect("due after the pause");
    assert!(not_due(&mut lookout), "due twice for one look that failed");

    // NATS restarted: due once the client is back, and told so.
    lookout.looking().await;
    lookout.found(true);
    assert!(!lookout.reconnected());
    nats.restart().await;
    tokio::time::timeout(WAIT, lookout.due())
        .await
        .expect("due at the reconnect");
    assert!(lookout.reconnected());
    lookout.looking().await;
    assert!(!lookout.reconnected());
}

/// A key followed with `follow_key` is applied as it changes, and after NATS lost its data,
/// with the bucket made again by another process, the value put back is applied too (a
/// plain watch, re-made by async-nats from where it was, would never see it).
#[tokio::test]
async fn a_key_followed_is_applied_again_from_a_bucket_made_anew() {
    let mut nats = NatsServer::start().await;
    let conn = connection(&nats.url()).await;
    let js = jetstream::new(conn.client.clone());
    let bucket = jetstream::kv::Config {
        bucket: "keys_it".into(),
        history: 1,
        ..Default::default()
    };
    let kv = js.create_key_value(bucket.clone()).await.unwrap();
    kv.put("k", "1".into()).await.unwrap();
    let (tx, mut seen) = tokio::sync::mpsc::channel::<String>(64);
    let follower = tokio::spawn(async move {
        herald::nats::lookout::follow_key(&conn, &kv, "k", |v| {
            let _ = tx.try_send(String::from_utf8_lossy(v).into_owned());
        })
        .await
    });
    let mut next = async || {
        tokio::time::timeout(WAIT, seen.recv())
            .await
            .expect("a value in time")
            .unwrap()
    };
    assert_eq!(next().await, "1");

    nats.kill().await;
    std::fs::remove_dir_all(nats.dir().join("jetstream")).unwrap();
    nats.start_again().await;
    let other = async_nats::connect(nats.url()).await.unwrap();
    let okv = jetstream::new(other)
        .create_key_value(bucket)
        .await
        .unwrap();
    okv.put("k", "2".into()).await.unwrap();
    // Applied again on the way, maybe ("1" is gone with the bucket): at last "2".
    while next().await != "2" {}
    follower.abort();
}
