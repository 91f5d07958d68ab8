//! `herald store backup` and the admin address's `POST /backup`: a stopped store copied by the
//! command, a held one copied by the herald holding it, the refusals (an existing DEST, DEST
//! being the store), rotation in the backups directory, and a store in memory.

use std::path::{Path, PathBuf};

use herald::app::admin::{AdminError, BackupReport};
use herald::store::{Location, Store, Table};
use serde_json::{Value, json};

use crate::support::*;

/// The memo notes a store file holds, read with the Store API.
async fn notes(path: &Path) -> Vec<(String, Value)> {
    let store = Store::open(&Location::File(path.to_owned()))
        .unwrap_or_else(|e| panic!("{} opens as a store: {e}", path.display()));
    let rows = store.scan(Table::Notes).await.unwrap();
    store.close().await;
    rows.into_iter()
        .map(|(k, v)| (k, serde_json::from_slice(&v).unwrap()))
        .collect()
}

fn expected() -> Vec<(String, Value)> {
    vec![
        ("milk".into(), json!({"qty": 2})),
        ("todo".into(), json!("buy milk")),
    ]
}

/// Writes [`expected`]'s notes into `store` through a `herald memo` over stdio.
async fn write_notes(store: &Path) {
    let memo = format!("{} --store {} memo", bin(), store.display());
    for (key, value) in [("todo", "\"buy milk\""), ("milk", "{\"qty\":2}")] {
        let out = herald([
            "call",
            "--mcp-stdio",
            &memo,
            "memo_set",
            &format!("key={key}"),
            &format!("value={value}"),
        ])
        .await;
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `herald --store STORE store backup ARGS…`.
async fn backup(store: &Path, args: &[&str]) -> std::process::Output {
    let mut all = vec!["--store", store.to_str().unwrap(), "store", "backup"];
    all.extend_from_slice(args);
    herald(all).await
}

fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

async fn post(url: &str) -> (u16, String) {
    let r = tokio::time::timeout(WAIT, reqwest::Client::new().post(url).send())
        .await
        .expect("an answer in time")
        .unwrap_or_else(|e| panic!("POST {url}: {e}"));
    (r.status().as_u16(), r.text().await.unwrap())
}

fn files_in(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

#[tokio::test]
async fn a_backup_of_a_stopped_store_round_trips_the_memo_notes() {
    let dir = TempDir::new("backup-stopped");
    let store = dir.path().join("herald.redb");
    write_notes(&store).await;
    let dest = dir.path().join("copy.redb");

    let out = backup(&store, &[dest.to_str().unwrap()]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let line = text(&out.stdout);
    assert!(
        line.starts_with(&format!(
            "backed up {} to {}: ",
            store.canonicalize().unwrap().display(),
            dest.display()
        )) && line.contains(" tables, ")
            && line.contains(" entries, ")
            && line.ends_with(" bytes\n"),
        "{line}"
    );
    assert_eq!(mode(&dest), 0o600);
    assert_eq!(notes(&dest).await, expected());
    // Nothing half-written left beside it.
    assert_eq!(
        files_in(dir.path()),
        vec![dest.clone(), store.clone()],
        "{:?}",
        files_in(dir.path())
    );

    // The copy serves as a store for herald itself.
    let memo = format!("{} --store {} memo", bin(), dest.display());
    let out = herald(["read", "--mcp-stdio", &memo, "memo://notes"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let read: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(read, json!({"todo": "buy milk", "milk": {"qty": 2}}));

    // --json, for programs: meta and memo_notes, three rows.
    let dest2 = dir.path().join("copy2.redb");
    let out = backup(&store, &["--json", dest2.to_str().unwrap()]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["path"], json!(dest2));
    assert_eq!(summary["tables"], 2, "{summary}");
    assert_eq!(summary["entries"], 3, "{summary}");
    assert_eq!(
        summary["bytes"],
        json!(std::fs::metadata(&dest2).unwrap().len())
    );
    assert_eq!(summary["admin"], Value::Null);
}

#[tokio::test]
async fn an_existing_destination_is_refused_without_force() {
    let dir = TempDir::new("backup-exists");
    let store = dir.path().join("herald.redb");
    write_notes(&store).await;
    let dest = dir.path().join("copy.redb");
    std::fs::write(&dest, b"keep me").unwrap();

    let out = backup(&store, &[dest.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(64), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!("{} exists; pass --force", dest.display())),
        "{err}"
    );
    assert_eq!(std::fs::read(&dest).unwrap(), b"keep me");

    let out = backup(&store, &["--force", dest.to_str().unwrap()]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(notes(&dest).await, expected());
}

#[tokio::test]
async fn the_store_itself_is_refused_as_the_destination() {
    let dir = TempDir::new("backup-self");
    let store = dir.path().join("herald.redb");
    write_notes(&store).await;
    let link = dir.path().join("link.redb");
    std::os::unix::fs::symlink(&store, &link).unwrap();
    let other_spelling = dir.path().join(".").join("herald.redb");

    for dest in [&store, &other_spelling, &link] {
        let out = backup(&store, &["--force", dest.to_str().unwrap()]).await;
        assert_eq!(out.status.code(), Some(64), "{}", text(&out.stderr));
        let err = text(&out.stderr);
        assert!(err.contains("is the store itself"), "{err}");
    }
    assert_eq!(notes(&store).await, expected());
}

#[tokio::test]
async fn a_store_held_by_a_running_herald_is_backed_up_by_that_herald() {
    let dir = TempDir::new("backup-held");
    let store = dir.path().join("herald.redb");
    let server = Server::spawn(&[
        "--store",
        store.to_str().unwrap(),
        "memo",
        "--http",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
    ])
    .await;
    let memo = Memo {
        target: herald::transport::target::Target::Http(server.http_url()),
        trust: Default::default(),
        server: None,
    };
    let conn = memo.client().await;
    call(
        &conn,
        "memo_set",
        json!({"key": "todo", "value": "buy milk"}),
    )
    .await;
    call(
        &conn,
        "memo_set",
        json!({"key": "milk", "value": {"qty": 2}}),
    )
    .await;

    // Nothing answers at the admin address given: the error says what holds the store.
    let dest = dir.path().join("copy.redb");
    let out = backup(&store, &["--admin", "127.0.0.1:1", dest.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    // It names the holder's pid (from its pid file), whatever admin address it serves.
    let held_by = format!(
        "is held by process {}, and no herald answered at http://127.0.0.1:1",
        server.pid()
    );
    assert!(
        err.contains(&held_by) && err.contains("stop it, or pass --admin"),
        "{err}"
    );
    assert!(!dest.exists());

    let admin = server.admin_url();
    let out = backup(
        &store,
        &["--admin", &admin, "--json", dest.to_str().unwrap()],
    )
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["admin"], json!(admin), "{summary}");
    assert_eq!(summary["path"], json!(dest));
    assert_eq!(summary["entries"], 3, "{summary}");
    assert_eq!(mode(&dest), 0o600);
    assert_eq!(notes(&dest).await, expected());
    // The snapshot was moved out of the backups directory, not copied.
    let backups = dir.path().join("backups");
    assert_eq!(files_in(&backups), Vec::<PathBuf>::new());

    // An existing DEST is refused here too, before the running herald is asked.
    let out = backup(&store, &["--admin", &admin, dest.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(64), "{}", text(&out.stderr));
    assert_eq!(files_in(&backups), Vec::<PathBuf>::new());

    // POST /backup itself writes only into the backups directory, and keeps the newest 3.
    let mut written = Vec::new();
    for _ in 0..5 {
        let (code, body) = post(&format!("{admin}/backup")).await;
        assert_eq!(code, 200, "{body}");
        let report: BackupReport = serde_json::from_str(&body).unwrap();
        assert_eq!(report.store, store.canonicalize().unwrap());
        assert_eq!(report.snapshot.entries, 3);
        assert_eq!(
            report.snapshot.path.parent(),
            Some(backups.canonicalize().unwrap().as_path())
        );
        written.push(report.snapshot.path);
    }
    let mut newest = written[2..].to_vec();
    newest.sort();
    assert_eq!(files_in(&backups.canonicalize().unwrap()), newest);
    assert_eq!(mode(&backups), 0o700);
    for p in &newest {
        assert_eq!(mode(p), 0o600);
    }

    // The store is still the running herald's, and serves.
    call(&conn, "memo_set", json!({"key": "after", "value": 1})).await;
    let status = server.terminate().await;
    assert!(status.success(), "{status:?}");
    assert_eq!(notes(&dest).await, expected());
}

#[tokio::test]
async fn post_backup_on_a_store_in_memory_is_409() {
    let server = Server::spawn(&[
        "--store",
        ":memory:",
        "memo",
        "--http",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
    ])
    .await;
    let (code, body) = post(&format!("{}/backup", server.admin_url())).await;
    assert_eq!(code, 409, "{body}");
    let err: AdminError = serde_json::from_str(&body).unwrap();
    assert!(err.error.contains("in memory"), "{err:?}");
}
