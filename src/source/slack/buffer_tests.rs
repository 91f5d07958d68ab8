//! Unit tests of `buffer.rs` (seqs, dedupe, eviction and `truncated`, pages and filters, the
//! shared buffer's unwritten rows, sealed rows reopened), kept beside it so the module itself
//! stays readable.
use super::*;

const DAY: Duration = Duration::from_secs(86_400);

/// A message in `channel` posted at `ts_ms` (its `channel:ts` is its identity).
pub(in crate::source::slack) fn posted(channel: &str, ts_ms: u64, text: &str) -> Posted {
    Posted {
        channel_id: channel.into(),
        channel_type: "channel".into(),
        ts: super::super::message::ms_ts(ts_ms),
        thread_ts: None,
        user_id: Some("U1".into()),
        bot_id: None,
        username: None,
        is_dm: false,
        mentions_bot: false,
        permalink: String::new(),
        text: text.into(),
    }
}

async fn open(store: &Store, cap: usize) -> Buffer {
    Buffer::open(store.clone(), &Key([3; 32]), 7 * DAY, cap)
        .await
        .unwrap()
        .0
}

#[tokio::test]
async fn seqs_grow_with_the_clock_and_duplicates_are_dropped() {
    let store = Store::memory();
    let b = open(&store, 100).await;
    let before = now_us();
    let now = now_ms();
    let a = b.insert(posted("C1", now, "a")).unwrap();
    assert!(a >= before, "a seq is at least the clock in µs");
    assert_eq!(
        b.insert(posted("C1", now, "a again")),
        None,
        "same channel:ts"
    );
    let c = b.insert(posted("C2", now, "c")).unwrap();
    assert!(c > a);
    assert_eq!(
        b.insert(posted("C1", now - 8 * 86_400_000, "old")),
        None,
        "past retention"
    );
    let page = b.since(a, &MessageFilter::default(), 10, 0);
    assert_eq!(page.events.len(), 1);
    assert_eq!(page.cursor, c);
    assert!(!page.truncated && !page.has_more);
    // A cursor from a lost buffer (above the head) waits for what comes next.
    let page = b.since(c + 1_000_000, &MessageFilter::default(), 10, 0);
    assert!(page.events.is_empty());
    assert_eq!(page.cursor, c + 1_000_000);
}

#[test]
fn a_shared_buffer_applies_seqs_as_given_and_hands_out_what_to_publish() {
    let b = Buffer::memory(&Key([3; 32]), 7 * DAY, 3);
    assert_eq!(b.head(), 0, "nothing known before the stream is applied");
    let now = now_ms();
    assert!(b.insert_at(500, posted("C1", now, "from the stream")));
    assert!(
        !b.insert_at(501, posted("C1", now, "again")),
        "same channel:ts"
    );
    assert_eq!(
        b.head(),
        500,
        "the head is what was applied, not this host's clock"
    );
    assert!(
        b.take_unwritten().is_empty(),
        "applied rows are never published again"
    );
    // An insert of this process's own goes above, invisible until the stream delivers
    // it, and is handed out once to publish.
    let own = b.insert(posted("C2", now, "heard here")).unwrap();
    assert!(own > 500);
    assert!(b.get(own).is_none(), "not visible before it is published");
    assert_eq!(b.head(), 500, "no cursor passes what the stream holds");
    assert_eq!(
        b.insert(posted("C2", now, "heard here")),
        None,
        "pending dedupes"
    );
    let rows = b.take_unwritten();
    assert_eq!(rows.iter().map(|h| h.seq).collect::<Vec<_>>(), [own]);
    assert!(b.take_unwritten().is_empty());
    b.restore_unwritten(&rows);
    assert!(b.unwritten());
    assert!(
        b.insert_at(own, posted("C2", now, "heard here")),
        "delivered by the stream"
    );
    assert!(
        !b.unwritten(),
        "published and applied: nothing left to publish"
    );
    assert_eq!(b.head(), own);
    // A lost lease forgets what was not published: the next holder backfills it.
    let lost = b.insert(posted("C5", now, "unpublished")).unwrap();
    b.forget(&b.take_unwritten());
    assert!(b.get(lost).is_none());
    assert!(
        b.insert(posted("C5", now, "unpublished")).is_some(),
        "a backfill may bring it again"
    );
    b.forget(&b.take_unwritten());
    // Shared state: live_through only moves forward; the feed's start is the holder's.
    b.merge_shared(SharedState {
        first_seq: 400,
        born_ms: Some(1),
        live_through_ms: Some(10),
    });
    b.merge_shared(SharedState {
        first_seq: 400,
        born_ms: Some(2),
        live_through_ms: Some(5),
    });
    assert_eq!((b.live_through(), b.born()), (Some(10), Some(1)));
    assert!(b.since(399, &MessageFilter::default(), 10, 0).truncated);
    // The cap applies as in the store's buffer.
    assert!(b.insert_at(own + 8, posted("C3", now, "x")));
    assert!(b.insert_at(own + 9, posted("C4", now, "y")));
    assert_eq!(b.stats().events, 3);
    // live_through is never said past an event not yet published.
    b.set_live_through(now + 60_000);
    b.insert(posted("C6", now, "pending")).unwrap();
    assert_eq!(b.take_shared().0.live_through_ms, Some(now));
    let taken = b.take_unwritten();
    assert_eq!(
        b.take_shared().0.live_through_ms,
        Some(now),
        "nor past one being published"
    );
    b.forget(&taken);
    assert_eq!(b.take_shared().0.live_through_ms, Some(now + 60_000));
}

#[tokio::test]
async fn a_cursor_from_before_the_buffer_says_truncated() {
    let store = Store::memory();
    let b = open(&store, 10).await;
    let start = b.head();
    assert!(start > 0, "a new buffer starts at the clock");
    let f = MessageFilter::default();
    assert!(!b.since(start, &f, 10, 0).truncated, "from now is fine");
    let lost = b.since(start - 1, &f, 10, 0);
    assert!(
        lost.truncated,
        "a cursor of a lost buffer learns it missed something"
    );
    assert_eq!(lost.cursor, start);
}

#[tokio::test]
async fn eviction_past_a_cursor_says_truncated() {
    let store = Store::memory();
    let b = open(&store, 3).await;
    let now = now_ms();
    let first = b.insert(posted("C1", now, "0")).unwrap();
    for i in 1..5 {
        b.insert(posted("C1", now + i, &i.to_string())).unwrap();
    }
    assert_eq!(b.stats().events, 3);
    let page = b.since(first - 1, &MessageFilter::default(), 10, 0);
    assert!(
        page.truncated,
        "events after the cursor were evicted by the cap"
    );
    assert_eq!(page.events.len(), 3);
    let page = b.since(page.cursor, &MessageFilter::default(), 10, 0);
    assert!(!page.truncated);
    // Retention: everything posted more than 7 days before "now" goes.
    b.expire(now + 8 * 86_400_000);
    assert_eq!(b.stats().events, 0);
    assert!(
        b.since(page.cursor - 1, &MessageFilter::default(), 10, 0)
            .truncated
    );
}

#[tokio::test]
async fn pages_stop_at_max_and_filters_skip() {
    let store = Store::memory();
    let b = open(&store, 100).await;
    let now = now_ms();
    let start = b.head();
    for i in 0..6 {
        let ch = if i % 2 == 0 { "C1" } else { "C2" };
        b.insert(posted(ch, now + i, "x")).unwrap();
    }
    let f = MessageFilter {
        channel_ids: Some(["C1".to_owned()].into()),
        ..MessageFilter::default()
    };
    let page = b.since(start, &f, 2, 0);
    assert_eq!(page.events.len(), 2);
    assert!(page.has_more);
    let rest = b.since(page.cursor, &f, 2, 0);
    assert_eq!(rest.events.len(), 1);
    assert!(!rest.has_more);
    assert_eq!(rest.cursor, b.head());
    assert_eq!(b.recent(&f, 2).len(), 2);
}

#[tokio::test]
async fn a_flushed_buffer_reopens_sealed_and_keeps_its_cursors() {
    let dir = std::env::temp_dir().join(format!("herald-slack-buf-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let path = dir.join("store.redb");
    let now = now_ms();
    let (cursor, live) = {
        let store = Store::open(&crate::store::Location::File(path.clone())).unwrap();
        let b = open(&store, 100).await;
        b.insert(posted("C1", now, "secret words in a message"))
            .unwrap();
        let cursor = b.head();
        b.insert(posted("C1", now + 1, "second")).unwrap();
        b.set_live_through(now);
        let w = b.flush().await.unwrap();
        assert_eq!(w.rows, 3, "two messages and the state row");
        assert_eq!(b.flush().await.unwrap(), Written::default(), "nothing new");
        let head = b.head();
        drop(b);
        store.close().await;
        (cursor, head)
    };
    let bytes = std::fs::read(&path).unwrap();
    assert!(
        !bytes.windows(12).any(|w| w == b"secret words"),
        "the store file holds no message text"
    );
    let store = Store::open(&crate::store::Location::File(path.clone())).unwrap();
    let (b, loaded) = Buffer::open(store.clone(), &Key([3; 32]), 7 * DAY, 100)
        .await
        .unwrap();
    assert_eq!(
        loaded,
        Loaded {
            events: 2,
            unopenable: 0
        }
    );
    assert_eq!(b.head(), live);
    assert_eq!(b.live_through(), Some(now));
    let page = b.since(cursor, &MessageFilter::default(), 10, 0);
    assert_eq!(page.events.len(), 1);
    assert_eq!(page.events[0].posted.text, "second");
    let next = b.insert(posted("C2", now, "after restart")).unwrap();
    assert!(next > live, "new seqs stay above old cursors");
    drop(b);
    // Another key opens nothing.
    let (_, loaded) = Buffer::open(store, &Key([4; 32]), 7 * DAY, 100)
        .await
        .unwrap();
    assert_eq!(
        loaded,
        Loaded {
            events: 0,
            unopenable: 3
        }
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
