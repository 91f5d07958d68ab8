//! The memo source's tests: the log's shapes, notes surviving a reopen, argument errors, the
//! notes' size limit (kept total, refusals, shrinking past a lowered limit), polling the log
//! and the tool descriptions.

use super::*;
use crate::mcp::source::schema;

async fn memo() -> Memo {
    Memo::open(Store::memory(), 16, None).await.unwrap()
}

fn read_json(c: Contents) -> Value {
    match c.body {
        crate::mcp::source::Body::Text(t) => serde_json::from_str(&t).unwrap(),
        _ => panic!("expected text"),
    }
}

#[tokio::test]
async fn set_modify_delete_are_logged_with_old() {
    let m = memo().await;
    let r = m.changes().register(&[NOTES_URI.into(), LOG_URI.into()]);
    assert!(m.set("a", json!(1)).await.unwrap());
    assert!(
        !m.set("a", json!(1)).await.unwrap(),
        "same value is not a change"
    );
    assert!(m.set("a", json!({"x": 2})).await.unwrap());
    assert!(m.delete("a").await.unwrap());
    assert!(!m.delete("a").await.unwrap());
    let log = read_json(m.read(&Caller::local(), Read::new(LOG_URI)).await.unwrap());
    let ev = log["events"].as_array().unwrap();
    let types: Vec<&str> = ev.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(types, ["ADDED", "MODIFIED", "DELETED"]);
    assert_eq!(ev[1]["old"], json!(1));
    assert_eq!(ev[1]["object"], json!({"x": 2}));
    assert!(ev[0]["seq"].as_u64() < ev[1]["seq"].as_u64());
    assert_eq!(
        read_json(
            m.read(&Caller::local(), Read::new(NOTES_URI))
                .await
                .unwrap()
        ),
        json!({})
    );
    let batch = r.queue().next_batch().await;
    assert_eq!(batch, vec![NOTES_URI.to_string(), LOG_URI.to_string()]);
}

#[tokio::test]
async fn notes_survive_reopen_on_the_same_store() {
    let store = Store::memory();
    let m = Memo::open(store.clone(), 16, None).await.unwrap();
    m.set("k", json!("v")).await.unwrap();
    drop(m);
    let m = Memo::open(store, 16, None).await.unwrap();
    assert_eq!(
        read_json(
            m.read(&Caller::local(), Read::new(NOTES_URI))
                .await
                .unwrap()
        ),
        json!({"k": "v"})
    );
}

#[tokio::test]
async fn bad_arguments_are_clear_errors() {
    let m = memo().await;
    let err = m
        .call_tool(
            &Caller::local(),
            "memo_set",
            schema(json!({"key": "a"})),
            Call::default(),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("missing argument value"), "{err}");
    let err = m
        .call_tool(
            &Caller::local(),
            "memo_set",
            schema(json!({"key": "a", "value": 1, "extra": 2})),
            Call::default(),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("unknown argument extra"), "{err}");
    let err = m
        .call_tool(
            &Caller::local(),
            "memo_set",
            schema(json!({"key": 5, "value": 1})),
            Call::default(),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("key must be a string"), "{err}");
    let err = m
        .read(&Caller::local(), Read::new("memo://nope"))
        .await
        .unwrap_err();
    assert_eq!(
        err,
        SourceError::NotFound {
            uri: "memo://nope".into()
        }
    );
}

/// The notes' total as a scan would count it: every key and value as stored.
async fn scanned_bytes(store: &Store) -> usize {
    let rows = store.scan(Table::Notes).await.unwrap();
    rows.iter().map(|(k, v)| k.len() + v.len()).sum()
}

#[tokio::test]
async fn the_notes_total_is_kept_as_writes_change_it() {
    let store = Store::memory();
    let m = Memo::open(store.clone(), 16, None).await.unwrap();
    assert_eq!(m.notes_bytes().await, 0);
    m.set("a", json!("xy")).await.unwrap();
    assert_eq!(m.notes_bytes().await, 1 + 4, "key a, value \"xy\"");
    m.set("b", json!({"k": [1, 2]})).await.unwrap();
    m.set("a", json!("a longer value")).await.unwrap();
    m.set("a", json!("a longer value")).await.unwrap();
    m.delete("b").await.unwrap();
    m.delete("nope").await.unwrap();
    m.set("c", json!(1.5)).await.unwrap();
    let total = m.notes_bytes().await;
    assert_eq!(total, scanned_bytes(&store).await);
    assert_eq!(total, 1 + 16 + 1 + 3);
    drop(m);
    let m = Memo::open(store, 16, None).await.unwrap();
    assert_eq!(m.notes_bytes().await, total, "a reopen counts the same");
}

#[tokio::test]
async fn a_set_past_the_notes_limit_is_refused_and_changes_nothing() {
    let store = Store::memory();
    let m = Memo::open(store.clone(), 16, None)
        .await
        .unwrap()
        .with_max_notes_bytes(100);
    let r = m.changes().register(&[NOTES_URI.into()]);
    m.set("a", json!("x".repeat(40))).await.unwrap();
    m.set("b", json!("y".repeat(40))).await.unwrap();
    assert_eq!(m.notes_bytes().await, 2 * 43);
    let _ = r.queue().next_batch().await;
    let before_log = read_json(m.read(&Caller::local(), Read::new(LOG_URI)).await.unwrap());
    let err = m
        .call_tool(
            &Caller::local(),
            "memo_set",
            schema(json!({"key": "c", "value": "z".repeat(20)})),
            Call::default(),
        )
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, SourceError::InvalidParams(_)), "{err:?}");
    for needle in [
        "100-byte limit",
        "--max-notes-bytes",
        "they take 86 bytes now",
        "would take 109 bytes",
    ] {
        assert!(text.contains(needle), "{needle}: {text}");
    }
    // Growing a note past the limit is refused the same way.
    let err = m.set("a", json!("x".repeat(60))).await.unwrap_err();
    assert!(err.to_string().contains("--max-notes-bytes"), "{err}");
    // Nothing changed: the notes, the store, the log, the total, and no notification.
    assert_eq!(
        read_json(
            m.read(&Caller::local(), Read::new(NOTES_URI))
                .await
                .unwrap()
        ),
        json!({"a": "x".repeat(40), "b": "y".repeat(40)})
    );
    assert_eq!(
        read_json(m.read(&Caller::local(), Read::new(LOG_URI)).await.unwrap()),
        before_log
    );
    assert_eq!(m.notes_bytes().await, 86);
    assert_eq!(scanned_bytes(&store).await, 86);
    assert!(
        futures::FutureExt::now_or_never(r.queue().next_batch()).is_none(),
        "a refused set publishes nothing"
    );
    // A write that fits, exactly up to the limit, is taken.
    m.set("c", json!("z".repeat(11))).await.unwrap();
    assert_eq!(m.notes_bytes().await, 100);
}

#[tokio::test]
async fn notes_past_a_lowered_limit_can_still_shrink() {
    let store = Store::memory();
    let m = Memo::open(store.clone(), 16, None).await.unwrap();
    m.set("a", json!("x".repeat(100))).await.unwrap();
    drop(m);
    let m = Memo::open(store, 16, None)
        .await
        .unwrap()
        .with_max_notes_bytes(50);
    assert_eq!(m.notes_bytes().await, 103);
    assert!(m.set("b", json!(1)).await.is_err(), "growing is refused");
    assert!(m.set("a", json!("x".repeat(101))).await.is_err());
    m.set("a", json!("x".repeat(80))).await.unwrap();
    assert_eq!(m.notes_bytes().await, 83);
    m.delete("a").await.unwrap();
    assert_eq!(m.notes_bytes().await, 0);
    m.set("b", json!(1)).await.unwrap();
}

#[tokio::test]
async fn memo_changes_are_polled_from_the_log() {
    let m = memo().await;
    assert!(m.events_advertised(&Caller::local()).await);
    let list = m.events_list(&Caller::local()).await.unwrap();
    assert_eq!(list[0]["name"], CHANGED_EVENT);
    assert_eq!(list[0]["inputSchema"]["additionalProperties"], false);
    let first = m
        .events_poll(
            &Caller::local(),
            schema(json!({"name": CHANGED_EVENT, "cursor": null})),
        )
        .await
        .unwrap();
    assert_eq!(first["events"], json!([]));
    m.set("a", json!(1)).await.unwrap();
    let next = m
        .events_poll(
            &Caller::local(),
            schema(json!({"name": CHANGED_EVENT, "cursor": first["cursor"]})),
        )
        .await
        .unwrap();
    assert_eq!(next["events"][0]["data"]["type"], "ADDED");
    assert_eq!(next["events"][0]["data"]["key"], "a");
    let err = m
        .events_poll(
            &Caller::local(),
            schema(json!({"name": CHANGED_EVENT, "arguments": {"key": "a"}})),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("unknown argument key"), "{err}");
    let err = m
        .events_poll(&Caller::local(), schema(json!({"name": "memo.deleted"})))
        .await
        .unwrap_err();
    assert!(matches!(err, SourceError::EventNotFound(_)), "{err}");
}

#[tokio::test]
async fn descriptions_end_with_a_code_mode_example() {
    let m = memo().await;
    for r in m.resources(&Caller::local()) {
        let d = r.description.unwrap();
        let last = d.lines().last().unwrap();
        assert!(last.starts_with("Example: await watch_start("), "{last}");
        assert!(last.contains(&format!("uri=\"{}\"", r.uri)));
    }
}
