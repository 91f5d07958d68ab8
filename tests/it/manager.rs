//! The watch manager in-process, against an in-process memo source over HTTP: limits,
//! names, stats, and the --watch-state round trip (save on start and stop, restore, keep
//! transient failures, drop specs that can never start).

use std::sync::Arc;
use std::time::Duration;

use herald::app::{ServeOptions, serve_source};
use herald::runtime::context::RoleContext;
use herald::source::memo::Memo;
use herald::store::{Store, Table};
use herald::transport::target::Target;
use herald::watch::log::WatchLog;
use herald::watch::{Notice, WatchConfig, WatchError, WatchManager};
use serde_json::json;
use tokio::sync::mpsc;

use crate::support::*;

struct InProcess {
    url: String,
    ctx: RoleContext,
}

impl Drop for InProcess {
    fn drop(&mut self) {
        self.ctx.shutdown().cancel();
    }
}

async fn memo_server() -> InProcess {
    init();
    let store = Store::memory();
    let memo = Memo::open(store.clone(), 64, None).await.unwrap();
    let ctx = RoleContext::new("memo");
    let opts = ServeOptions {
        http: Some("127.0.0.1:0".into()),
        ..ServeOptions::default()
    };
    let bound = serve_source(Arc::new(memo), &opts, &store, &ctx)
        .await
        .unwrap();
    InProcess {
        url: bound.http_url().unwrap(),
        ctx,
    }
}

fn manager(
    url: &str,
    cfg: WatchConfig,
    store: Option<Store>,
) -> (WatchManager, mpsc::Receiver<Notice>) {
    let (tx, rx) = mpsc::channel(64);
    let servers = vec![herald::watch::upstream(
        Target::Http(url.to_owned()),
        Default::default(),
        4 << 20,
    )];
    (
        WatchManager::new(cfg, servers, tx, WatchLog::silent(), store),
        rx,
    )
}

fn fast() -> WatchConfig {
    let mut cfg = WatchConfig::default();
    cfg.debounce.quiet = Duration::ZERO;
    cfg.resubscribe_base = Duration::from_millis(10);
    cfg.resubscribe_attempts = 2;
    cfg
}

async fn next(rx: &mut mpsc::Receiver<Notice>) -> Notice {
    tokio::time::timeout(WAIT, rx.recv())
        .await
        .expect("a notice in time")
        .expect("open")
}

#[tokio::test]
async fn limits_names_and_stats() {
    let srv = memo_server().await;
    let mut cfg = fast();
    cfg.max_watches = 2;
    let (m, mut rx) = manager(&srv.url, cfg, None);
    m.watch_start("a", "memo://notes", None).await.unwrap();
    let dup = m.watch_start("a", "memo://log", None).await.unwrap_err();
    assert!(
        matches!(dup, WatchError::Invalid(ref s) if s.contains("already exists")),
        "{dup}"
    );
    let info = m.watch_start("b", "memo://log", None).await.unwrap();
    assert_eq!(serde_json::to_value(info.shape).unwrap(), "event-log");
    let over = m.watch_start("c", "memo://notes", None).await.unwrap_err();
    assert!(over.to_string().contains("at most 2 watches"), "{over}");
    let unknown = m.watch_start("c", "memo://nope", None).await;
    assert!(unknown.is_err());

    let conn = crate::support::Memo {
        target: Target::Http(srv.url.clone()),
        trust: Default::default(),
        server: None,
    }
    .client()
    .await;
    call(&conn, "memo_set", json!({"key": "k", "value": 1})).await;
    let mut names = vec![next(&mut rx).await.watch, next(&mut rx).await.watch];
    names.sort();
    assert_eq!(names, ["a", "b"]);
    let list = m.watch_list();
    assert_eq!(list.len(), 2);
    assert!(
        list.iter()
            .all(|w| w.events == 1 && w.notices == 1 && !w.failed),
        "{list:?}"
    );
    assert!(m.watch_stop("a").await);
    assert!(!m.watch_stop("a").await);
    m.watch_start("c", "memo://notes", None).await.unwrap();
    m.shutdown().await;
}

#[tokio::test]
async fn watch_state_round_trip() {
    let srv = memo_server().await;
    let store = Store::memory();
    let (m, _rx) = manager(&srv.url, fast(), Some(store.clone()));
    m.watch_start("notes", "memo://notes", None).await.unwrap();
    m.watch_start("log", "memo://log", None).await.unwrap();
    assert!(m.watch_stop("log").await);
    let saved: Vec<String> = store
        .scan(Table::Watches)
        .await
        .unwrap()
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(saved, ["notes"], "saved on start, removed on stop");
    m.shutdown().await;
    drop(m);

    let (m, mut rx) = manager(&srv.url, fast(), Some(store.clone()));
    let results = m.restore().await;
    assert_eq!(results.len(), 1);
    assert!(results[0].1.is_ok());
    let notice = next(&mut rx).await;
    assert_eq!(notice.watch, "herald");
    assert_eq!(notice.lines[0], "restored notes (memo://notes)");
    assert_eq!(
        m.watch_list()
            .iter()
            .map(|w| w.name.as_str())
            .collect::<Vec<_>>(),
        ["notes"]
    );
    m.shutdown().await;
}

#[tokio::test]
async fn restore_keeps_transient_failures_and_drops_specs_that_cannot_start() {
    let srv = memo_server().await;
    let store = Store::memory();
    let spec = |n: &str, u: &str| serde_json::to_vec(&json!({"name": n, "uri": u})).unwrap();
    store
        .put(Table::Watches, "gone", spec("gone", "memo://nope"))
        .await
        .unwrap();
    store
        .put(Table::Watches, "ok", spec("ok", "memo://notes"))
        .await
        .unwrap();
    let (m, mut rx) = manager(&srv.url, fast(), Some(store.clone()));
    m.restore().await;
    let notice = next(&mut rx).await;
    assert!(
        notice.lines.iter().any(|l| l.starts_with("dropped gone")),
        "{notice:?}"
    );
    let saved: Vec<String> = store
        .scan(Table::Watches)
        .await
        .unwrap()
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(saved, ["ok"]);
    m.shutdown().await;

    // The same saved spec against a server that is down: kept, and listed as restore_failed.
    let (m, mut rx) = manager("http://127.0.0.1:9/mcp", fast(), Some(store.clone()));
    m.restore().await;
    let notice = next(&mut rx).await;
    assert!(
        notice.lines[0].starts_with("restore failed, kept: ok"),
        "{notice:?}"
    );
    let list = m.watch_list();
    assert_eq!(list.len(), 1);
    assert!(list[0].restore_failed);
    assert_eq!(store.scan(Table::Watches).await.unwrap().len(), 1);
    m.shutdown().await;
}
