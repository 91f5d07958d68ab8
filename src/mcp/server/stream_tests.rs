//! Unit tests of `stream.rs`: the stream core against memo's ring (paused time for the
//! heartbeat) and against a source whose polls are scripted (errors, the end).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use rmcp::model::Resource;
use tokio::sync::mpsc;

use super::*;
use crate::mcp::admission::{Admission, ListenFilter};
use crate::mcp::error::SourceError;
use crate::mcp::hub::ChangeFeed;
use crate::mcp::limits::Limits;
use crate::mcp::source::{Contents, Read, Source, SourceInfo};
use crate::source::memo::Memo;
use crate::store::Store;
use crate::sync::Recover;

/// What a stream wrote: (kind, params).
struct Collect {
    tx: mpsc::UnboundedSender<(&'static str, Value)>,
    gone: CancellationToken,
}

impl EventsOut for Collect {
    async fn send(&mut self, kind: &'static str, params: Value) -> Result<(), Undelivered> {
        if self.gone.is_cancelled() {
            return Err(Undelivered::Closed);
        }
        self.tx
            .send((kind, params))
            .map_err(|_| Undelivered::Closed)
    }
    fn closed(&self) -> impl Future<Output = ()> + Send + 'static {
        self.gone.clone().cancelled_owned()
    }
}

fn collect() -> (
    Collect,
    mpsc::UnboundedReceiver<(&'static str, Value)>,
    CancellationToken,
) {
    let (tx, rx) = mpsc::unbounded_channel();
    let gone = CancellationToken::new();
    (
        Collect {
            tx,
            gone: gone.clone(),
        },
        rx,
        gone,
    )
}

fn params(v: Value) -> JsonObject {
    v.as_object().unwrap().clone()
}

async fn memo_server(shutdown: CancellationToken) -> (SourceServer, Arc<Memo>) {
    let memo = Arc::new(Memo::open(Store::memory(), 16, None).await.unwrap());
    let s = SourceServer::new(memo.clone(), Limits::default(), shutdown);
    (s, memo)
}

async fn set(memo: &Memo, key: &str) {
    let mut a = JsonObject::new();
    a.insert("key".into(), key.into());
    a.insert("value".into(), "v".into());
    memo.call_tool(&Caller::default(), "memo_set", a, Default::default())
        .await
        .unwrap();
}

#[test]
fn params_are_checked_by_name() {
    let e = StreamRequest::parse(&params(json!({"name": "a", "maxEvents": 3}))).unwrap_err();
    assert!(e.message.contains("unknown parameter maxEvents"), "{e:?}");
    let e = StreamRequest::parse(&params(json!({}))).unwrap_err();
    assert!(e.message.contains("missing parameter name"), "{e:?}");
    let e = StreamRequest::parse(&params(json!({"name": "a", "cursor": 3}))).unwrap_err();
    assert!(e.message.contains("cursor must be a string"), "{e:?}");
    let r = StreamRequest::parse(&params(
        json!({"name": "a", "cursor": "7", "maxAgeMs": 5, "_meta": {}}),
    ))
    .unwrap();
    assert_eq!(r.cursor.as_deref(), Some("7"));
    assert_eq!(r.max_age_ms, Some(5));
    let p = r.poll(Some("9"), Duration::from_secs(2), true);
    assert_eq!(p["cursor"], "9");
    assert_eq!(p["timeoutMs"], 2000);
    assert_eq!(p["maxAgeMs"], 5);
    assert!(
        !r.poll(Some("9"), Duration::ZERO, false)
            .contains_key("maxAgeMs"),
        "maxAgeMs bounds the replay only"
    );
}

/// Active, then each event with its own cursor, in order; replay from an event's cursor
/// gives what follows it; a heartbeat once nothing was written for HEARTBEAT; the shutdown
/// ends the stream with a result naming the cursor.
#[tokio::test(start_paused = true)]
async fn events_are_pushed_with_cursors_and_heartbeats_keep_a_quiet_stream() {
    let shutdown = CancellationToken::new();
    let (s, memo) = memo_server(shutdown.clone()).await;
    let (mut out, mut rx, _gone) = collect();
    let budget = ConnStreams::default();
    let stream = {
        let (s, budget) = (s.clone(), budget.clone());
        tokio::spawn(async move {
            s.event_stream(
                &Caller::default(),
                params(json!({"name": "memo.changed"})),
                &budget,
                &mut out,
            )
            .await
        })
    };
    let (kind, active) = rx.recv().await.unwrap();
    assert_eq!(kind, "active");
    assert_eq!(active["truncated"], false);
    assert_eq!(budget.open_events(), 1);
    assert_eq!(budget.open(), 0, "not a listen stream");
    set(&memo, "a").await;
    set(&memo, "b").await;
    let mut cursors = Vec::new();
    for key in ["a", "b"] {
        // (The store writes on a thread of its own, so the paused clock may run on to a
        // heartbeat meanwhile.)
        let (kind, e) = loop {
            match rx.recv().await.unwrap() {
                ("heartbeat", _) => continue,
                other => break other,
            }
        };
        assert_eq!(kind, "event");
        assert_eq!(e["name"], "memo.changed");
        assert_eq!(e["data"]["key"], key);
        assert_eq!(e["cursor"], e["data"]["seq"].as_u64().unwrap().to_string());
        assert!(
            e.get("_meta").is_none(),
            "herald's own cursor key is taken out: {e}"
        );
        cursors.push(e["cursor"].as_str().unwrap().to_owned());
    }
    let quiet = Instant::now();
    let (kind, beat) = rx.recv().await.unwrap();
    assert_eq!(kind, "heartbeat");
    assert_eq!(beat["cursor"], cursors[1]);
    assert!(quiet.elapsed() <= HEARTBEAT, "{:?}", quiet.elapsed());
    let beat_at = Instant::now();
    let (kind, _) = rx.recv().await.unwrap();
    assert_eq!(kind, "heartbeat");
    assert_eq!(beat_at.elapsed(), HEARTBEAT, "one per HEARTBEAT of silence");
    shutdown.cancel();
    let result = stream.await.unwrap().unwrap();
    assert_eq!(result["resultType"], "complete");
    assert_eq!(result["cursor"], cursors[1]);
    assert_eq!(budget.open_events(), 0, "the slot goes with the stream");

    // From the first event's cursor: the second is replayed.
    let (s, _) = (
        SourceServer::new(memo.clone(), Limits::default(), CancellationToken::new()),
        (),
    );
    let (mut out, mut rx, gone) = collect();
    let replay = tokio::spawn(async move {
        s.event_stream(
            &Caller::default(),
            params(json!({"name": "memo.changed", "cursor": cursors[0]})),
            &ConnStreams::default(),
            &mut out,
        )
        .await
    });
    let (_, active) = rx.recv().await.unwrap();
    assert_eq!(active["truncated"], false);
    let (kind, e) = rx.recv().await.unwrap();
    assert_eq!((kind, &e["data"]["key"]), ("event", &json!("b")));
    gone.cancel();
    assert!(
        replay.await.unwrap().is_err(),
        "a cancelled stream gets no result"
    );
}

#[tokio::test]
async fn refusals_come_before_active_and_the_cap_is_its_own() {
    let limits = Limits {
        max_event_streams_per_connection: 1,
        ..Limits::default()
    };
    let memo = Arc::new(Memo::open(Store::memory(), 16, None).await.unwrap());
    let s = SourceServer::new(memo, limits, CancellationToken::new());
    let budget = ConnStreams::default();
    let (mut out, _rx, _gone) = collect();
    let e = s
        .event_stream(
            &Caller::default(),
            params(json!({"name": "nosuch"})),
            &budget,
            &mut out,
        )
        .await
        .unwrap_err();
    assert_eq!(e.code.0, -32023, "{e:?}");
    let held = budget.try_acquire_events(1).unwrap();
    let listen = budget.try_acquire(1);
    assert!(listen.is_some(), "listens have their own budget");
    let e = s
        .event_stream(
            &Caller::default(),
            params(json!({"name": "memo.changed"})),
            &budget,
            &mut out,
        )
        .await
        .unwrap_err();
    assert_eq!(e.code.0, -32025, "{e:?}");
    assert!(e.message.contains("--max-event-streams"), "{e:?}");
    drop(held);
}

/// A source whose polls answer from a script (then wait forever).
struct Scripted {
    answers: Mutex<VecDeque<Result<Value, SourceError>>>,
    feed: ChangeFeed,
}

#[async_trait]
impl Source for Scripted {
    fn info(&self) -> SourceInfo {
        SourceInfo {
            name: "scripted".into(),
            ..SourceInfo::default()
        }
    }
    fn resources(&self, _caller: &Caller) -> Vec<Resource> {
        Vec::new()
    }
    async fn read(&self, _caller: &Caller, read: Read<'_>) -> Result<Contents, SourceError> {
        Err(SourceError::NotFound {
            uri: read.uri.to_owned(),
        })
    }
    async fn admit(&self, _caller: &Caller, _filter: &ListenFilter) -> Admission {
        Admission::default()
    }
    fn changes(&self) -> ChangeFeed {
        self.feed.clone()
    }
    async fn events_poll(
        &self,
        _caller: &Caller,
        _params: JsonObject,
    ) -> Result<Value, SourceError> {
        let next = self.answers.locked().pop_front();
        match next {
            Some(a) => a,
            None => std::future::pending().await,
        }
    }
}

fn batch(cursor: &str, ids: &[&str]) -> Result<Value, SourceError> {
    let events: Vec<Value> = ids
        .iter()
        .map(|id| json!({"eventId": id, "name": "x", "timestamp": "t", "data": {}}))
        .collect();
    Ok(json!({"events": events, "cursor": cursor, "truncated": false, "hasMore": false}))
}

/// A failing poll is an `error` and is tried again; a foreign batch gives its cursor to its
/// last event only; a gap found mid-stream marks the next event; a refusal ends the stream
/// with `terminated` and the result.
#[tokio::test(start_paused = true)]
async fn errors_are_retried_and_a_refusal_terminates() {
    let mut gap = batch("c4", &["e4"]).unwrap();
    gap["truncated"] = true.into();
    let source = Scripted {
        answers: Mutex::new(VecDeque::from([
            batch("c0", &[]),
            Err(SourceError::Unavailable(
                "upstream m is not connected".into(),
            )),
            batch("c2", &["e1", "e2"]),
            Ok(gap),
            Err(SourceError::Forbidden),
        ])),
        feed: ChangeFeed::new(),
    };
    let s = SourceServer::new(
        Arc::new(source),
        Limits::default(),
        CancellationToken::new(),
    );
    let (mut out, mut rx, _gone) = collect();
    let stream = tokio::spawn(async move {
        s.event_stream(
            &Caller::default(),
            params(json!({"name": "x"})),
            &ConnStreams::default(),
            &mut out,
        )
        .await
    });
    let mut seen = Vec::new();
    while let Some((kind, p)) = rx.recv().await {
        seen.push((kind, p));
    }
    let kinds: Vec<&str> = seen.iter().map(|(k, _)| *k).collect();
    assert_eq!(
        kinds,
        ["active", "error", "event", "event", "event", "terminated"]
    );
    assert_eq!(seen[0].1["cursor"], "c0");
    assert!(
        seen[1].1["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not connected")
    );
    assert!(
        seen[2].1.get("cursor").is_none(),
        "mid-batch: no cursor of its own"
    );
    assert_eq!(seen[3].1["cursor"], "c2");
    assert_eq!(seen[4].1["truncated"], true);
    assert_eq!(seen[4].1["cursor"], "c4");
    assert_eq!(seen[5].1["error"]["code"], -32024);
    let result = stream.await.unwrap().unwrap();
    assert_eq!(result["cursor"], "c4");
}
