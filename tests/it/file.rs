//! The file source on real inotify and real temporary directories: the source in-process
//! (its `watch`, change feed and `read`, as the listen plumbing drives them), then `herald file`
//! and `herald watch` end to end.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use herald::mcp::hub::Registration;
use herald::mcp::source::{Body, Caller, Source, WatchGuard};
use herald::runtime::context::RoleContext;
use herald::source::file::{FileConfig, FileSource, events_uri, state_uri};
use serde_json::{Value, json};

use crate::support::*;
use crate::watch::Watch;

struct Fixture {
    _dir: TempDir,
    root: PathBuf,
    src: Arc<FileSource>,
}

impl Fixture {
    fn new(tag: &str) -> Fixture {
        Fixture::with(tag, |_| {})
    }

    fn with(tag: &str, tweak: impl FnOnce(&mut FileConfig)) -> Fixture {
        let dir = TempDir::new(tag);
        let root = std::fs::canonicalize(dir.path()).unwrap().join("root");
        std::fs::create_dir_all(&root).unwrap();
        let mut cfg = FileConfig {
            roots: vec![root.clone()],
            ..FileConfig::default()
        };
        tweak(&mut cfg);
        Fixture {
            _dir: dir,
            root,
            src: Arc::new(FileSource::new(cfg, &RoleContext::new("file")).unwrap()),
        }
    }

    fn p(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    /// Watches `uri` (as admission does, through the same `FileSource::watch`) and registers
    /// with the feed.
    async fn watch(&self, uri: &str) -> (Registration, WatchGuard) {
        let reg = self.src.changes().register(&[uri.to_owned()]);
        let guard = tokio::time::timeout(WAIT, self.src.watch(uri))
            .await
            .expect("watch in time")
            .unwrap_or_else(|e| panic!("watch {uri}: {e}"));
        (reg, guard)
    }

    async fn read(&self, uri: &str) -> Result<Value, String> {
        let c = tokio::time::timeout(
            WAIT,
            self.src
                .read(&Caller::local(), herald::mcp::source::Read::new(uri)),
        )
        .await
        .expect("read in time")
        .map_err(|e| e.to_string())?;
        match c.body {
            Body::Text(t) => Ok(serde_json::from_str(&t).unwrap_or(Value::String(t))),
            Body::Blob(b) => Ok(json!({"blob": b.len()})),
        }
    }

    async fn events(&self, uri: &str) -> Vec<Value> {
        self.read(uri).await.unwrap()["events"]
            .as_array()
            .unwrap()
            .clone()
    }

    /// Awaits notifications of `uri` until its events satisfy `done`; returns them.
    async fn until(
        &self,
        reg: &Registration,
        uri: &str,
        done: impl Fn(&[Value]) -> bool,
    ) -> Vec<Value> {
        let mut last = Vec::new();
        let r = tokio::time::timeout(WAIT, async {
            loop {
                last = self.events(uri).await;
                if done(&last) {
                    return last.clone();
                }
                reg.queue().next_batch().await;
            }
        })
        .await;
        r.unwrap_or_else(|_| panic!("events of {uri} never got there; last read: {last:#?}"))
    }
}

impl Fixture {
    /// Writes `content` to `rel` whole: to a file outside the root, renamed into place, so a
    /// slow write on a loaded machine is never seen half done (or as two events).
    fn put(&self, rel: &str, content: &str) {
        put(self.root.parent().unwrap(), &self.p(rel), content);
    }

    /// Awaits notifications of `uri` until a read after one satisfies `done` (so it fails
    /// if no notification comes, whatever the disk holds).
    async fn until_read(
        &self,
        reg: &Registration,
        uri: &str,
        done: impl Fn(&Result<Value, String>) -> bool,
    ) {
        let mut last = Err(String::new());
        let r = tokio::time::timeout(WAIT, async {
            loop {
                reg.queue().next_batch().await;
                last = self.read(uri).await;
                if done(&last) {
                    return;
                }
            }
        })
        .await;
        r.unwrap_or_else(|_| panic!("{uri} never read as expected; last read: {last:?}"))
    }
}

/// Writes `content` to `target` through a temporary file in `staging` (outside any watched
/// directory, same file system) and a rename.
fn put(staging: &Path, target: &Path, content: &str) {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = staging.join(format!(".put-{n}"));
    std::fs::write(&tmp, content).unwrap();
    std::fs::rename(&tmp, target).unwrap();
}

fn summary(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| {
            let t = e["type"].as_str().unwrap_or("?");
            match (e.get("from"), e.get("path")) {
                (Some(f), _) => format!(
                    "{t} {} -> {}",
                    f.as_str().unwrap(),
                    e["to"].as_str().unwrap()
                ),
                (None, Some(p)) => format!("{t} {}", p.as_str().unwrap()),
                _ => t.to_owned(),
            }
        })
        .collect()
}

fn has(events: &[Value], line: &str) -> bool {
    summary(events).iter().any(|l| l == line)
}

#[tokio::test]
async fn create_modify_delete_are_events_with_size_and_mtime() {
    let f = Fixture::new("file-cmd");
    let uri = events_uri(&f.root, false);
    let (reg, _g) = f.watch(&uri).await;
    let a = f.p("a.txt");
    f.put("a.txt", "one");
    let ev = f.until(&reg, &uri, |e| !e.is_empty()).await;
    assert_eq!(summary(&ev), [format!("CREATED {}", a.display())]);
    assert_eq!(ev[0]["size"], 3);
    assert_eq!(ev[0]["kind"], "file");
    assert!(ev[0]["mtime"].as_str().unwrap().ends_with('Z'));
    f.put("a.txt", "three");
    let ev = f.until(&reg, &uri, |e| e.len() >= 2).await;
    assert_eq!(ev[1]["type"], "MODIFIED");
    assert_eq!(ev[1]["old"]["size"], 3);
    assert_eq!(ev[1]["object"]["size"], 5);
    std::fs::remove_file(&a).unwrap();
    let ev = f.until(&reg, &uri, |e| e.len() >= 3).await;
    assert_eq!(summary(&ev)[2], format!("DELETED {}", a.display()));
    assert!(ev[0]["seq"].as_u64() < ev[2]["seq"].as_u64());
}

#[tokio::test]
async fn renames_within_and_across_directories_are_moved_events() {
    let f = Fixture::new("file-mv");
    std::fs::create_dir_all(f.p("d1")).unwrap();
    std::fs::create_dir_all(f.p("d2")).unwrap();
    std::fs::write(f.p("d1/a"), "x").unwrap();
    let uri = events_uri(&f.root, true);
    let (reg, _g) = f.watch(&uri).await;
    let d2 = events_uri(&f.p("d2"), false);
    let (reg2, _g2) = f.watch(&d2).await;
    std::fs::rename(f.p("d1/a"), f.p("d1/b")).unwrap();
    let within = format!(
        "MOVED {} -> {}",
        f.p("d1/a").display(),
        f.p("d1/b").display()
    );
    let ev = f.until(&reg, &uri, |e| has(e, &within)).await;
    assert_eq!(summary(&ev), std::slice::from_ref(&within));
    std::fs::rename(f.p("d1/b"), f.p("d2/c")).unwrap();
    let across = format!(
        "MOVED {} -> {}",
        f.p("d1/b").display(),
        f.p("d2/c").display()
    );
    let ev = f.until(&reg, &uri, |e| has(e, &across)).await;
    assert_eq!(summary(&ev), [within, across.clone()]);
    // The non-recursive watch of d2 sees the file arrive from d1.
    let ev = f.until(&reg2, &d2, |e| has(e, &across)).await;
    assert_eq!(ev.len(), 1, "{ev:?}");
}

#[tokio::test]
async fn write_to_temp_then_rename_is_one_modified_not_a_delete_create_pair() {
    // A wide window: however slowly this loaded machine runs the write and the rename, they
    // land in one window, which is what an editor's save looks like to the source.
    let f = Fixture::with("file-save", |c| c.debounce = Duration::from_millis(1500));
    let a = f.p("a.txt");
    std::fs::write(&a, "v1").unwrap();
    let uri = events_uri(&f.root, false);
    let (reg, _g) = f.watch(&uri).await;
    let state = state_uri(&a);
    let (sreg, _sg) = f.watch(&state).await;
    let tmp = f.p(".a.txt.swp");
    std::fs::write(&tmp, "version 2").unwrap();
    std::fs::rename(&tmp, &a).unwrap();
    let ev = f.until(&reg, &uri, |e| !e.is_empty()).await;
    // A marker written after the save settles after anything the save could still produce.
    std::fs::write(f.p("marker"), "").unwrap();
    let ev2 = f
        .until(&reg, &uri, |e| {
            has(e, &format!("CREATED {}", f.p("marker").display()))
        })
        .await;
    assert_eq!(
        summary(&ev2),
        [
            format!("MODIFIED {}", a.display()),
            format!("CREATED {}", f.p("marker").display())
        ],
        "first read: {ev:?}"
    );
    assert_eq!(ev2[0]["object"]["size"], 9);
    tokio::time::timeout(WAIT, sreg.queue().next_batch())
        .await
        .expect("the state watch of the target is notified");
    assert_eq!(f.read(&state).await.unwrap(), json!("version 2"));
}

#[tokio::test]
async fn a_recursive_watch_follows_new_subdirectories() {
    let f = Fixture::new("file-rec");
    let uri = events_uri(&f.root, true);
    let (reg, _g) = f.watch(&uri).await;
    // mkdir and a file inside at once: the file may land before herald watches the new
    // directory, and is reported either way.
    std::fs::create_dir_all(f.p("sub/deep")).unwrap();
    std::fs::write(f.p("sub/deep/x.json"), "{}").unwrap();
    let want = format!("CREATED {}", f.p("sub/deep/x.json").display());
    let ev = f.until(&reg, &uri, |e| has(e, &want)).await;
    assert!(
        has(&ev, &format!("CREATED {}", f.p("sub").display())),
        "{ev:?}"
    );
    // Now watched: a later change deep inside is seen.
    std::fs::write(f.p("sub/deep/x.json"), "{\"a\":1}").unwrap();
    let want = format!("MODIFIED {}", f.p("sub/deep/x.json").display());
    f.until(&reg, &uri, |e| has(e, &want)).await;
    // A glob narrows by name.
    let json_only = format!("{}&glob=*.json", events_uri(&f.root, true));
    let (greg, _gg) = f.watch(&json_only).await;
    f.put("sub/deep/y.txt", "");
    f.put("sub/deep/z.json", "[]");
    let want = format!("CREATED {}", f.p("sub/deep/z.json").display());
    let ev = f.until(&greg, &json_only, |e| has(e, &want)).await;
    assert_eq!(summary(&ev), [want]);
}

#[tokio::test]
async fn the_watched_root_deleted_is_an_error_in_band_and_reads_fail_until_it_returns() {
    let f = Fixture::new("file-gone");
    std::fs::write(f.p("a.txt"), "x").unwrap();
    let uri = events_uri(&f.root, false);
    let state = state_uri(&f.root);
    let (reg, _g) = f.watch(&uri).await;
    let (_sreg, _sg) = f.watch(&state).await;
    assert_eq!(f.read(&state).await.unwrap()[0]["name"], "a.txt");
    std::fs::remove_dir_all(&f.root).unwrap();
    let ev = f
        .until(&reg, &uri, |e| e.iter().any(|x| x["type"] == "ERROR"))
        .await;
    let err = ev.iter().find(|x| x["type"] == "ERROR").unwrap();
    assert!(
        err["message"].as_str().unwrap().contains("is gone"),
        "{err}"
    );
    assert!(
        has(&ev, &format!("DELETED {}", f.p("a.txt").display())),
        "{ev:?}"
    );
    let e = f.read(&state).await.unwrap_err();
    assert!(e.contains("does not exist"), "{e}");
    // It comes back: watched again, readable again.
    std::fs::create_dir_all(&f.root).unwrap();
    std::fs::write(f.p("b.txt"), "y").unwrap();
    let want = format!("CREATED {}", f.p("b.txt").display());
    f.until(&reg, &uri, |e| has(e, &want)).await;
    assert_eq!(f.read(&state).await.unwrap()[0]["name"], "b.txt");
}

#[tokio::test]
async fn paths_that_leave_the_root_are_refused_and_never_read() {
    let f = Fixture::new("file-escape");
    let outside = f.root.parent().unwrap().join("secret.txt");
    std::fs::write(&outside, "s3cret").unwrap();
    std::os::unix::fs::symlink(&outside, f.p("link")).unwrap();
    std::fs::create_dir_all(f.p("sub")).unwrap();
    for (uri, needle) in [
        (state_uri(&f.p("link")), "a symlink leaves the root"),
        (events_uri(&f.p("link"), false), "a symlink leaves the root"),
        (
            format!("file://{}/sub/../../secret.txt", f.root.display()),
            "'..'",
        ),
        (state_uri(&outside), "not under a served root"),
    ] {
        let e = f.read(&uri).await.unwrap_err();
        assert!(e.contains(needle), "{uri}: {e}");
        assert!(!e.contains("s3cret"));
        if needle.contains("symlink") {
            assert!(!e.contains("secret.txt"), "the target is not revealed: {e}");
        }
        assert!(f.src.watch(&uri).await.is_err(), "{uri} is not watchable");
    }
}

#[tokio::test]
async fn a_watched_directory_swapped_for_a_symlink_reports_nothing_from_outside() {
    // A wide window: the write, the swap and the marker all land before anything settles,
    // so the pending a/x is stat'ed after `a` has become a symlink to a directory outside.
    let f = Fixture::with("file-swap", |c| c.debounce = Duration::from_millis(1500));
    let top = f.root.parent().unwrap().to_owned();
    let outside = top.join("elsewhere");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("x"), vec![b's'; 31337]).unwrap();
    std::fs::create_dir_all(f.p("a")).unwrap();
    let uri = events_uri(&f.root, true);
    let (reg, _g) = f.watch(&uri).await;
    let state = state_uri(&f.p("a/x"));
    let (_sreg, _sg) = f.watch(&state).await;
    std::fs::write(f.p("a/x"), "1").unwrap();
    std::fs::rename(f.p("a"), top.join("away")).unwrap();
    std::os::unix::fs::symlink(&outside, f.p("a")).unwrap();
    std::fs::write(f.p("marker"), "").unwrap();
    let marker = format!("CREATED {}", f.p("marker").display());
    let ev = f.until(&reg, &uri, |e| has(e, &marker)).await;
    for e in &ev {
        assert_ne!(e["size"], 31337, "the outside file's size leaked: {ev:#?}");
        assert_ne!(e["object"]["size"], 31337, "{ev:#?}");
    }
    assert!(
        !has(&ev, &format!("CREATED {}", f.p("a/x").display())),
        "nothing is reported through the symlink: {ev:#?}"
    );
    // Reads through it are refused without a word about what lies there.
    let e = f.read(&state).await.unwrap_err();
    assert!(!e.contains("31337") && !e.contains("elsewhere"), "{e}");
    let e = f.read(&state_uri(&f.p("a"))).await.unwrap_err();
    assert!(!e.contains("elsewhere"), "{e}");
}

#[tokio::test]
async fn a_watched_file_whose_directories_are_removed_and_made_again_is_followed() {
    let f = Fixture::new("file-rearm");
    std::fs::create_dir_all(f.p("d/e")).unwrap();
    std::fs::write(f.p("d/e/f.json"), r#"{"v": 1}"#).unwrap();
    let state = state_uri(&f.p("d/e/f.json"));
    let (reg, _g) = f.watch(&state).await;
    assert_eq!(f.read(&state).await.unwrap(), json!({"v": 1}));
    std::fs::remove_dir_all(f.p("d")).unwrap();
    f.until_read(&reg, &state, |r| r.is_err()).await;
    // Made again, file and all, faster than a debounce window.
    std::fs::create_dir_all(f.p("d/e")).unwrap();
    f.put("d/e/f.json", r#"{"v": 2}"#);
    f.until_read(&reg, &state, |r| r.as_ref().ok() == Some(&json!({"v": 2})))
        .await;
    // Watched again all the way down: a later write is seen too.
    f.put("d/e/f.json", r#"{"v": 3}"#);
    f.until_read(&reg, &state, |r| r.as_ref().ok() == Some(&json!({"v": 3})))
        .await;
}

#[tokio::test]
async fn a_file_over_the_cap_is_refused_with_the_limit() {
    let f = Fixture::new("file-cap");
    let big = f.p("big.bin");
    std::fs::write(&big, vec![b'x'; 10 * 1024 * 1024]).unwrap();
    let e = f.read(&state_uri(&big)).await.unwrap_err();
    assert!(e.contains("10485760 bytes"), "{e}");
    assert!(e.contains("4194304-byte cap (--max-file-bytes)"), "{e}");
    // Content shapes under the cap.
    std::fs::write(f.p("c.json"), r#"{"a": [1, 2]}"#).unwrap();
    assert_eq!(
        f.read(&state_uri(&f.p("c.json"))).await.unwrap(),
        json!({"a": [1, 2]})
    );
    std::fs::write(f.p("b.bin"), [0u8, 255, 1]).unwrap();
    assert_eq!(
        f.read(&state_uri(&f.p("b.bin"))).await.unwrap(),
        json!({"blob": 3})
    );
}

#[tokio::test]
async fn a_burst_of_writes_makes_a_bounded_number_of_events_and_the_last_content_reads() {
    let f = Fixture::new("file-burst");
    let a = f.p("burst.txt");
    std::fs::write(&a, "start").unwrap();
    let uri = events_uri(&f.root, false);
    let state = state_uri(&a);
    let (_reg, _g) = f.watch(&uri).await;
    let (sreg, _sg) = f.watch(&state).await;
    tokio::task::spawn_blocking({
        let a = a.clone();
        move || {
            for i in 0..1000 {
                std::fs::write(&a, format!("write {i}")).unwrap();
            }
        }
    })
    .await
    .unwrap();
    let mut notifications = 0;
    tokio::time::timeout(WAIT, async {
        loop {
            sreg.queue().next_batch().await;
            notifications += 1;
            if f.read(&state).await.unwrap() == json!("write 999") {
                break;
            }
        }
    })
    .await
    .expect("the last write is read after a notification");
    let modified = f
        .events(&uri)
        .await
        .iter()
        .filter(|e| e["type"] == "MODIFIED")
        .count();
    assert!(
        (1..=100).contains(&modified),
        "1,000 writes made {modified} MODIFIED events"
    );
    assert!(notifications <= 100, "{notifications} notifications");
}

#[tokio::test]
async fn the_watch_limit_is_a_clear_error() {
    let f = Fixture::with("file-limit", |c| c.max_watches = 3);
    for d in ["a", "b", "c", "d"] {
        std::fs::create_dir_all(f.p(d)).unwrap();
    }
    let e = f.read(&events_uri(&f.root, true)).await.unwrap_err();
    assert!(e.contains("--max-watches"), "{e}");
    // Non-recursive fits: the root and its parent.
    assert!(f.read(&events_uri(&f.root, false)).await.is_ok());
}

#[tokio::test]
async fn a_read_is_served_even_when_its_watch_cannot_be_made() {
    // At most one watched directory.
    let f = Fixture::with("file-lease", |c| c.max_watches = 1);
    std::fs::create_dir_all(f.p("a/b")).unwrap();
    std::fs::write(f.p("a/b/c.json"), "[1]").unwrap();
    // Its chain (root, a, a/b) needs three watches: past the limit, yet the read works.
    assert_eq!(
        f.read(&state_uri(&f.p("a/b/c.json"))).await.unwrap(),
        json!([1])
    );
    let e = f.read(&events_uri(&f.p("a/b"), false)).await.unwrap_err();
    assert!(
        e.contains("--max-watches"),
        "an event log needs its watch: {e}"
    );
}

#[tokio::test]
async fn the_templates_and_listed_resources_end_with_an_example() {
    let f = Fixture::new("file-list");
    let templates = f.src.templates(&Caller::local());
    let uris: Vec<&str> = templates.iter().map(|t| t.uri_template.as_str()).collect();
    assert_eq!(
        uris,
        [
            "file:///{+path}{?as}",
            "file-events://watch/{+path}{?recursive,glob}"
        ]
    );
    let descriptions = templates
        .iter()
        .map(|t| t.description.clone().unwrap())
        .chain(
            f.src
                .resources(&Caller::local())
                .into_iter()
                .map(|r| r.description.unwrap()),
        );
    for d in descriptions {
        let last = d.lines().last().unwrap();
        assert!(last.starts_with("Example: await watch_start("), "{last}");
    }
    let listed: Vec<String> = f
        .src
        .resources(&Caller::local())
        .iter()
        .map(|r| r.uri.clone())
        .collect();
    assert_eq!(listed, [state_uri(&f.root), events_uri(&f.root, true)]);
}

// === end to end ===

async fn file_server(root: &Path) -> Server {
    Server::spawn(&[
        "--store",
        ":memory:",
        "file",
        "--root",
        root.to_str().unwrap(),
        "--http",
        "127.0.0.1:0",
    ])
    .await
}

#[tokio::test]
async fn herald_watch_prints_notices_for_file_and_file_events_uris() {
    let dir = TempDir::new("file-e2e");
    let root = std::fs::canonicalize(dir.path()).unwrap();
    std::fs::write(root.join("config.json"), r#"{"mode": "a"}"#).unwrap();
    // Files are written whole (through a rename from here), so a slow write is never two
    // notices.
    let staging = TempDir::new("file-e2e-staging");
    let server = file_server(&root).await;
    let events = events_uri(&root, true);
    let listing = state_uri(&root);
    let config = state_uri(&root.join("config.json"));
    let mut w = Watch::spawn(
        ":memory:",
        &[
            "--mcp-http",
            &server.http_url(),
            "--watch",
            &format!("events={events}"),
            "--watch",
            &format!("listing={listing}"),
            "--watch",
            &format!("config={config}"),
        ],
    );
    for name in ["events", "listing", "config"] {
        w.event("watch.subscribed", name).await;
    }
    put(staging.path(), &root.join("notes.txt"), "hello");
    let mut got = Vec::new();
    while got.len() < 2 {
        let n = w.notice().await;
        got.push((n["watch"].as_str().unwrap().to_owned(), n["lines"].clone()));
    }
    got.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(got[0], ("events".into(), json!(["CREATED notes.txt"])));
    assert_eq!(got[1].0, "listing");
    let added = got[1].1[0].as_str().unwrap();
    assert!(
        added.starts_with(r#"ADDED notes.txt = {"kind":"file","#),
        "a listing's entry, with its value: {added}"
    );
    // A JSON file is diffed by key.
    put(
        staging.path(),
        &root.join("config.json"),
        r#"{"mode": "b"}"#,
    );
    let mut lines = Vec::new();
    while !lines.iter().any(|(w, _): &(String, Value)| w == "config") {
        let n = w.notice().await;
        lines.push((n["watch"].as_str().unwrap().to_owned(), n["lines"].clone()));
    }
    let config_lines = &lines.iter().find(|(w, _)| w == "config").unwrap().1;
    assert_eq!(config_lines, &json!([r#"MODIFIED mode: "a" → "b""#]));
    w.terminate().await;
}

#[tokio::test]
async fn herald_file_needs_a_root_and_says_so() {
    let out = herald(["--store", ":memory:", "file", "--http", "127.0.0.1:0"]).await;
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("pass --root DIR"), "{err}");
    let dir = TempDir::new("file-badcfg");
    let cfg = dir.path().join("f.toml");
    std::fs::write(&cfg, "roots = [\"/tmp\"]\nbogus = 1\n").unwrap();
    let out = herald(["file", "--config", cfg.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown field `bogus`"), "{err}");
}

#[tokio::test]
async fn herald_up_creates_the_demo_directory_and_watches_it() {
    use tokio::io::{AsyncBufReadExt, BufReader};
    init();
    let tmp = TempDir::new("file-up");
    let demo = tmp.path().join("herald-demo");
    let mut child = tokio::process::Command::new(bin())
        .args([
            "--log-format",
            "json",
            "--store",
            ":memory:",
            "up",
            "--http",
            "127.0.0.1:0",
            "--quic",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
            "--demo-dir",
            demo.to_str().unwrap(),
        ])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap()).lines();
    let file_url = tokio::time::timeout(WAIT, async {
        loop {
            let l = err.next_line().await.unwrap().expect("herald up runs");
            if let Ok(v) = serde_json::from_str::<Value>(&l)
                && v["event"] == "listening"
            {
                return v["http_url"].as_str().unwrap().to_owned();
            }
        }
    })
    .await
    .expect("herald up says where its gateway listens");
    tokio::spawn(async move { while let Ok(Some(_)) = err.next_line().await {} });
    assert!(demo.is_dir(), "herald up created {}", demo.display());
    let demo = std::fs::canonicalize(&demo).unwrap();
    let out = herald(["ls", "--mcp-http", file_url.as_str()]).await;
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(listed.contains(&events_uri(&demo, true)), "{listed}");
    // The gateway relists the file source's templates whole: a client learns a template (and
    // its watch_start example) from its description.
    assert!(
        listed.contains("file-events://watch/{+path}{?recursive,glob}: Event log of a directory"),
        "{listed}"
    );
    // The demo's watches start right after the listening lines: write new files until the
    // first notice shows the watch is live.
    let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut i = 0;
    let notice = loop {
        std::fs::write(demo.join(format!("hello-{i}.txt")), "hi").unwrap();
        i += 1;
        if let Ok(Ok(Some(l))) = tokio::time::timeout(Duration::from_secs(5), out.next_line()).await
        {
            break serde_json::from_str::<Value>(&l).unwrap();
        }
        assert!(i < 10, "no notice from herald up's file watch");
    };
    assert_eq!(notice["watch"], "demo-files", "{notice}");
    let line = notice["lines"][0].as_str().unwrap();
    assert!(
        line.starts_with("CREATED hello-"),
        "relative to the demo directory: {line}"
    );
}
