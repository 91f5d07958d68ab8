//! Tests of [`WatchManager`] (`manager.rs`) against an in-process memo server: names and
//! the limit, the start checks (no server, a refused URI, a filter that can never notice), the
//! status board, and saving and restoring specs.

use super::*;

use crate::runtime::status::WatchState;
use crate::testing::MemoServer;
use crate::transport::target::Target;

fn fast() -> WatchConfig {
    let mut cfg = WatchConfig::default();
    cfg.debounce.quiet = Duration::ZERO;
    cfg.max_watches = 2;
    cfg
}

fn manager(memo: &MemoServer, store: Option<Store>) -> (WatchManager, mpsc::Receiver<Notice>) {
    let up = memo.upstream_with(crate::watch::upstream_config(
        Target::Stdio("in-process memo".into()),
        Default::default(),
        1 << 20,
    ));
    let (tx, rx) = mpsc::channel(16);
    (
        WatchManager::new(fast(), vec![up], tx, WatchLog::silent(), store),
        rx,
    )
}

async fn next(rx: &mut mpsc::Receiver<Notice>) -> Notice {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("a notice in time")
        .expect("the channel is open")
}

#[tokio::test]
async fn a_start_with_no_server_reachable_says_so_not_that_nobody_lists_the_uri() {
    let down = crate::testing::down_upstream(Default::default());
    let (tx, _rx) = mpsc::channel(16);
    let m = WatchManager::new(fast(), vec![down], tx, WatchLog::silent(), None);
    let e = m.watch_start("n", "memo://notes", None).await.unwrap_err();
    assert_eq!(
        e,
        WatchError::Unavailable("no server is connected: connection refused".into())
    );
    m.shutdown().await;
}

#[tokio::test]
async fn names_and_the_limit_are_checked_before_anything_starts() {
    let memo = MemoServer::start().await;
    let (m, _rx) = manager(&memo, None);
    for bad in ["", "a\nb"] {
        let e = m.watch_start(bad, "memo://notes", None).await.unwrap_err();
        assert!(matches!(e, WatchError::Invalid(_)), "{e}");
    }
    let long = "x".repeat(129);
    assert!(m.watch_start(&long, "memo://notes", None).await.is_err());
    assert!(m.watch_start("a", "", None).await.is_err());
    let info = m.watch_start("a", "memo://notes", None).await.unwrap();
    assert_eq!(info.shape, Some(Shape::State));
    let dup = m.watch_start("a", "memo://log", None).await.unwrap_err();
    assert!(dup.to_string().contains("already exists"), "{dup}");
    let log = m.watch_start("b", "memo://log", None).await.unwrap();
    assert_eq!(log.shape, Some(Shape::EventLog));
    let over = m.watch_start("c", "memo://notes", None).await.unwrap_err();
    assert!(over.to_string().contains("at most 2 watches"), "{over}");
    assert!(m.watch_stop("a").await);
    assert!(!m.watch_stop("a").await, "stopping twice finds nothing");
    m.watch_start("c", "memo://notes", None).await.unwrap();
    let names: Vec<String> = m.watch_list().into_iter().map(|w| w.name).collect();
    assert_eq!(names, ["b", "c"]);
    m.shutdown().await;
}

#[tokio::test]
async fn watches_are_reported_on_the_status_board_while_the_manager_lives() {
    let memo = MemoServer::start().await;
    let (m, _rx) = manager(&memo, None);
    let board = StatusBoard::new(CancellationToken::new());
    m.report_to(&board);
    m.watch_start("n", "memo://notes", None).await.unwrap();
    let watches = board.report().await.watches;
    assert_eq!(watches.len(), 1);
    assert_eq!(
        (watches[0].name.as_str(), watches[0].uri.as_str()),
        ("n", "memo://notes")
    );
    assert_eq!(watches[0].state, WatchState::Running);
    m.shutdown().await;
    drop(m);
    assert!(
        board.report().await.watches.is_empty(),
        "the board keeps no manager alive"
    );
}

#[tokio::test]
async fn a_uri_the_server_refuses_fails_the_start_with_its_reason() {
    let memo = MemoServer::start().await;
    let (m, _rx) = manager(&memo, None);
    let e = m.watch_start("x", "memo://nope", None).await.unwrap_err();
    let WatchError::Rejected { message, .. } = &e else {
        panic!("rejected, not {e:?}")
    };
    assert!(message.contains("unknown resource memo://nope"), "{e}");
    assert!(!e.is_transient());
    assert!(m.watch_list().is_empty());
}

#[tokio::test]
async fn a_filter_is_checked_before_subscribing() {
    let memo = MemoServer::start().await;
    let (m, _rx) = manager(&memo, None);
    for (code, says) in [
        ("  ", "empty"),
        ("<function f at 0x7f>", "not a function object"),
        ("event", "runs no Python filters"),
    ] {
        let e = m
            .watch_start("f", "memo://notes", Some(code))
            .await
            .unwrap_err();
        assert!(
            matches!(&e, WatchError::Invalid(m) if m.contains(says)),
            "{code:?}: {e}"
        );
    }
    assert!(m.watch_list().is_empty());
}

#[tokio::test]
async fn specs_are_saved_on_start_removed_on_stop_and_restored() {
    let memo = MemoServer::start().await;
    let store = Store::memory();
    let (m, _rx) = manager(&memo, Some(store.clone()));
    m.watch_start("a", "memo://notes", None).await.unwrap();
    m.watch_start("b", "memo://log", None).await.unwrap();
    m.watch_stop("b").await;
    let saved: Vec<String> = store
        .scan(Table::Watches)
        .await
        .unwrap()
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(saved, ["a"]);
    m.shutdown().await;

    let (m, mut rx) = manager(&memo, Some(store.clone()));
    let restored = m.restore().await;
    assert_eq!(restored.len(), 1);
    assert!(restored[0].1.is_ok());
    let n = next(&mut rx).await;
    assert_eq!(n.watch, "herald");
    assert_eq!(n.lines[0], "restored a (memo://notes)");
    assert_eq!(m.watch_list()[0].name, "a");
    m.shutdown().await;
}

#[tokio::test]
async fn a_saved_filter_the_start_check_now_refuses_is_kept_not_deleted() {
    let memo = MemoServer::start().await;
    let store = Store::memory();
    let (m, _rx) = manager(&memo, Some(store.clone()));
    // Saved by a herald from before the check: it only ever raised, as `on_event failed`.
    let code = "if event['type'] == 'X':\n    raise ValueError('x')\n";
    m.save(&WatchSpec {
        name: "old".into(),
        uri: "memo://notes".into(),
        on_event: Some(code.into()),
    })
    .await;
    m.shutdown().await;
    let (m, mut rx) = manager(&memo, Some(store.clone()));
    let restored = m.restore().await;
    assert!(restored[0].1.is_err());
    let n = next(&mut rx).await;
    assert!(
        n.lines[0].starts_with("restore failed, kept: old"),
        "{:?}",
        n.lines
    );
    assert_eq!(store.scan(Table::Watches).await.unwrap().len(), 1);
    m.shutdown().await;
}

/// Waits until every watch listed is in `state`.
async fn until(m: &WatchManager, state: WatchState) {
    tokio::time::timeout(
        Duration::from_secs(10),
        m.wait_until(|w, _| w.values().all(|e| e.state() == state).then_some(())),
    )
    .await
    .expect("the watch list changed in time")
}

/// A watch `notes` on `memo://notes`, no filter.
fn notes() -> WatchSpec {
    WatchSpec {
        name: "notes".into(),
        uri: "memo://notes".into(),
        on_event: None,
    }
}

fn kept_manager(memo: &MemoServer) -> (WatchManager, mpsc::Receiver<Notice>, StatusBoard) {
    let up = memo.upstream_with(crate::watch::upstream_config(
        Target::Stdio("in-process memo".into()),
        Default::default(),
        1 << 20,
    ));
    let (tx, rx) = mpsc::channel(16);
    let mut cfg = fast();
    cfg.resubscribe_base = Duration::from_millis(5);
    cfg.resubscribe_attempts = 2;
    let m = WatchManager::new(cfg, vec![up], tx, WatchLog::silent(), None);
    let board = StatusBoard::new(CancellationToken::new());
    board.set_started();
    m.report_to(&board);
    (m, rx, board)
}

/// `herald up` used to log one warning for a configured watch whose server was not up yet and
/// never watch it: now it is listed as starting, holds /ready, and runs once the server is up.
#[tokio::test]
async fn a_kept_watch_starts_once_its_server_is_up_and_holds_ready_until_then() {
    let memo = MemoServer::start().await;
    memo.set_down(true);
    let (m, mut rx, board) = kept_manager(&memo);
    m.watch_keep(notes()).await.expect("kept, not refused");
    let w = &m.watch_list()[0];
    assert!(w.starting && !w.failed, "{w:?}");
    let r = board.readiness();
    assert!(!r.ready, "{r:?}");
    assert_eq!(r.watches_starting[0].name, "notes");
    assert!(r.watches_starting[0].last_error.is_some(), "{r:?}");
    let report = board.report().await;
    assert_eq!(report.watches[0].state, WatchState::Starting);

    memo.set_down(false);
    until(&m, WatchState::Running).await;
    assert!(board.readiness().ready);
    memo.set("todo", json!("milk")).await;
    let n = next(&mut rx).await;
    assert!(n.lines.iter().any(|l| l.contains("todo")), "{n:?}");
    m.shutdown().await;
}

/// A kept watch that loses its server goes on trying past the usual attempts (listed as
/// starting, its reader told once), and picks up what changed meanwhile once it is back.
#[tokio::test]
async fn a_kept_watch_that_loses_its_server_keeps_trying_and_catches_up() {
    let memo = MemoServer::start().await;
    let (m, mut rx, board) = kept_manager(&memo);
    m.watch_keep(notes()).await.unwrap();
    assert!(m.watch_list()[0].shape.is_some(), "it runs at once");
    memo.set_down(true);
    let lost = next(&mut rx).await;
    assert!(
        lost.lines[0].starts_with("watch lost its source"),
        "{lost:?}"
    );
    until(&m, WatchState::Starting).await;
    assert!(!board.readiness().ready);
    memo.set("while-down", json!(1)).await;
    memo.set_down(false);
    let back = next(&mut rx).await;
    assert!(
        back.lines.iter().any(|l| l.contains("while-down")),
        "{back:?}"
    );
    until(&m, WatchState::Running).await;
    assert!(board.readiness().ready);
    m.shutdown().await;
}

/// Stopping a kept watch that is still trying ends its tries: it never comes back.
#[tokio::test]
async fn a_kept_watch_stopped_while_it_tries_stays_stopped() {
    let memo = MemoServer::start().await;
    memo.set_down(true);
    let (m, _rx, _board) = kept_manager(&memo);
    m.watch_keep(notes()).await.unwrap();
    assert!(m.watch_stop("notes").await);
    memo.set_down(false);
    // The tries end by themselves (nothing else is cancelled): the tracker empties.
    m.inner.tracker.close();
    tokio::time::timeout(Duration::from_secs(10), m.inner.tracker.wait())
        .await
        .expect("the tries ended");
    assert!(m.watch_list().is_empty());
}

/// A kept watch still trying holds its name: another start of it is refused (it used to
/// replace the entry while the tries went on, so two watches ran under one name).
#[tokio::test]
async fn a_kept_watch_still_trying_holds_its_name() {
    let memo = MemoServer::start().await;
    memo.set_down(true);
    let (m, _rx, _board) = kept_manager(&memo);
    m.watch_keep(notes()).await.unwrap();
    memo.set_down(false);
    let e = m
        .watch_start("notes", "memo://log", None)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("trying to start"), "{e}");
    // The kept one starts on its own, on its own URI.
    until(&m, WatchState::Running).await;
    assert_eq!(m.watch_list()[0].uri, "memo://notes");
    m.shutdown().await;
}

/// Every line of the notices that come until `want` lines are in.
async fn lines(rx: &mut mpsc::Receiver<Notice>, want: usize) -> Vec<String> {
    let mut got = Vec::new();
    while got.len() < want {
        got.extend(next(rx).await.lines);
    }
    got
}

#[tokio::test]
async fn an_events_watch_gets_each_event_pushed_and_resumes_from_its_cursor() {
    let memo = MemoServer::start().await;
    let (m, mut rx) = manager(&memo, None);
    let info = m
        .watch_start("e", "events:memo.changed", None)
        .await
        .unwrap();
    assert_eq!(info.shape, Some(Shape::Events));
    memo.set("a", json!(1)).await;
    assert_eq!(next(&mut rx).await.lines, ["ADDED a = 1"]);
    // A burst, read as it comes (a sink does): every event, in order, none reported lost.
    let reader = tokio::spawn(async move {
        let got = lines(&mut rx, 1000).await;
        (got, rx)
    });
    for i in 0..1000 {
        memo.set(&format!("k{i}"), json!(i)).await;
    }
    let (got, mut rx) = reader.await.unwrap();
    let want: Vec<String> = (0..1000).map(|i| format!("ADDED k{i} = {i}")).collect();
    assert_eq!(got, want);
    // The server goes away; what changes meanwhile comes once it is back, from the cursor.
    memo.set_down(true);
    memo.set("b", json!(2)).await;
    memo.set_down(false);
    assert_eq!(next(&mut rx).await.lines, ["ADDED b = 2"]);
    assert!(!m.watch_list()[0].failed);
    m.shutdown().await;
}

#[tokio::test]
async fn an_events_watch_is_refused_for_an_unknown_type_or_bad_arguments() {
    let memo = MemoServer::start().await;
    let (m, _rx) = manager(&memo, None);
    let e = m.watch_start("e", "events:nosuch", None).await.unwrap_err();
    assert!(
        matches!(&e, WatchError::Invalid(m) if m.contains("offered: memo.changed")),
        "{e:?}"
    );
    let e = m
        .watch_start("e", "events:memo.changed?x=1", None)
        .await
        .unwrap_err();
    assert!(matches!(e, WatchError::Rejected { .. }), "{e:?}");
    assert!(e.to_string().contains('x'), "{e}");
    let e = m.watch_start("e", "events:", None).await.unwrap_err();
    assert!(matches!(e, WatchError::Invalid(_)), "{e:?}");
    assert!(m.watch_list().is_empty());
    m.shutdown().await;
}
