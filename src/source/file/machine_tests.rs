//! Unit tests of `machine.rs`, kept beside it so the module itself stays readable.
use super::*;
use std::collections::BTreeMap;

/// An in-memory file system with fake watches.
#[derive(Default)]
struct FakeDisk {
    files: BTreeMap<PathBuf, Meta>,
    watches: BTreeMap<PathBuf, Wd>,
    next_wd: Wd,
    limit: Option<usize>,
}

fn file(size: u64, t: i64) -> Meta {
    Meta {
        kind: Kind::File,
        size,
        mtime_ns: t,
    }
}

fn dir() -> Meta {
    Meta {
        kind: Kind::Dir,
        size: 0,
        mtime_ns: 0,
    }
}

impl FakeDisk {
    fn put(&mut self, p: &str, m: Meta) {
        self.files.insert(PathBuf::from(p), m);
    }
    fn rm(&mut self, p: &str) {
        let p = PathBuf::from(p);
        self.files.retain(|k, _| !k.starts_with(&p));
    }
    fn wd(&self, p: &str) -> Wd {
        self.watches[Path::new(p)]
    }
}

impl Disk for FakeDisk {
    fn stat(&self, path: &Path) -> Option<Meta> {
        if path == Path::new("/") {
            return Some(dir());
        }
        self.files.get(path).copied()
    }
    fn list(&self, d: &Path) -> std::io::Result<Vec<(String, Meta)>> {
        if self.stat(d).map(|m| m.kind) != Some(Kind::Dir) {
            return Err(std::io::Error::from_raw_os_error(libc::ENOENT));
        }
        Ok(self
            .files
            .iter()
            .filter(|(k, _)| k.parent() == Some(d))
            .map(|(k, m)| (k.file_name().unwrap().to_str().unwrap().to_owned(), *m))
            .collect())
    }
    fn add_watch(&mut self, d: &Path) -> std::io::Result<Wd> {
        if self.stat(d).map(|m| m.kind) != Some(Kind::Dir) {
            return Err(std::io::Error::from_raw_os_error(libc::ENOENT));
        }
        if let Some(w) = self.watches.get(d) {
            return Ok(*w);
        }
        if self.limit.is_some_and(|l| self.watches.len() >= l) {
            return Err(std::io::Error::from_raw_os_error(libc::ENOSPC));
        }
        self.next_wd += 1;
        self.watches.insert(d.to_owned(), self.next_wd);
        Ok(self.next_wd)
    }
    fn rm_watch(&mut self, wd: Wd) {
        self.watches.retain(|_, w| *w != wd);
    }
}

fn rec(disk: &FakeDisk, dir: &str, mask: EventMask, name: &str, cookie: u32) -> Record {
    Record {
        wd: disk.wd(dir),
        mask,
        cookie,
        name: Some(name.into()),
    }
}

struct T {
    m: Machine,
    disk: FakeDisk,
    t0: Instant,
    feed: ChangeFeed,
}

impl T {
    fn new() -> T {
        let feed = ChangeFeed::new();
        let mut disk = FakeDisk::default();
        disk.put("/r", dir());
        disk.put("/r/d", dir());
        disk.put("/r/d/a.txt", file(1, 10));
        disk.put("/r/e", dir());
        T {
            m: Machine::new(
                Config {
                    debounce: Duration::from_millis(50),
                    max_watches: 100,
                    ring_capacity: 64,
                },
                feed.clone(),
            ),
            disk,
            t0: Instant::now(),
            feed,
        }
    }
    fn events(&mut self, uri: &str, base: &str, recursive: bool) -> Arc<EventRing> {
        self.m
            .subscribe(
                &mut self.disk,
                uri,
                Spec {
                    base: base.into(),
                    root: "/r".into(),
                    mode: Mode::Events {
                        recursive,
                        glob: None,
                    },
                },
            )
            .unwrap()
            .unwrap()
    }
    fn at(&self, ms: u64) -> Instant {
        self.t0 + Duration::from_millis(ms)
    }
    fn feed(&mut self, dir: &str, mask: EventMask, name: &str, cookie: u32, ms: u64) {
        let r = rec(&self.disk, dir, mask, name, cookie);
        let now = self.at(ms);
        self.m.feed(&mut self.disk, r, now);
    }
    fn flush(&mut self, ms: u64) {
        let now = self.at(ms);
        self.m.flush(&mut self.disk, now);
    }
}

fn events(r: &EventRing) -> Vec<Value> {
    let v: Value = serde_json::from_str(&r.read_json()).unwrap();
    v["events"].as_array().unwrap().clone()
}

fn summary(r: &EventRing) -> Vec<String> {
    events(r)
        .iter()
        .map(|e| {
            let t = e["type"].as_str().unwrap();
            match e.get("from") {
                Some(f) => format!(
                    "{t} {} -> {}",
                    f.as_str().unwrap(),
                    e["to"].as_str().unwrap()
                ),
                None => format!("{t} {}", e["path"].as_str().unwrap_or("")),
            }
        })
        .collect()
}

#[test]
fn create_write_close_is_one_created_after_the_window() {
    let mut t = T::new();
    let ring = t.events("e", "/r/d", false);
    t.disk.put("/r/d/b.txt", file(3, 20));
    t.feed("/r/d", EventMask::CREATE, "b.txt", 0, 0);
    t.feed("/r/d", EventMask::MODIFY, "b.txt", 0, 1);
    t.feed("/r/d", EventMask::CLOSE_WRITE, "b.txt", 0, 2);
    assert_eq!(t.m.next_deadline(), Some(t.at(50)));
    t.flush(49);
    assert!(summary(&ring).is_empty(), "the window is still open");
    t.flush(50);
    assert_eq!(summary(&ring), ["CREATED /r/d/b.txt"]);
    let e = &events(&ring)[0];
    assert_eq!(e["size"], 3);
    assert_eq!(e["kind"], "file");
    assert_eq!(e["key"], "/r/d/b.txt");
    assert_eq!(t.m.next_deadline(), None);
}

#[test]
fn a_burst_of_writes_is_one_modified_with_old() {
    let mut t = T::new();
    let ring = t.events("e", "/r/d", false);
    for i in 0..1000u64 {
        t.disk.put("/r/d/a.txt", file(i + 2, 100 + i as i64));
        t.feed("/r/d", EventMask::MODIFY, "a.txt", 0, i / 100);
        t.feed("/r/d", EventMask::CLOSE_WRITE, "a.txt", 0, i / 100);
    }
    t.flush(60);
    let ev = events(&ring);
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert_eq!(ev[0]["type"], "MODIFIED");
    assert_eq!(ev[0]["old"]["size"], 1);
    assert_eq!(ev[0]["object"]["size"], 1001);
}

#[test]
fn write_to_temp_then_rename_is_one_modified_of_the_target() {
    let mut t = T::new();
    let ring = t.events("e", "/r/d", false);
    let state =
        t.m.subscribe(
            &mut t.disk,
            "s",
            Spec {
                base: "/r/d/a.txt".into(),
                root: "/r".into(),
                mode: Mode::State,
            },
        )
        .unwrap();
    assert!(state.is_none());
    let reg = t.feed.register(&["s".into(), "e".into()]);
    t.disk.put("/r/d/.a.txt.swp", file(5, 30));
    t.feed("/r/d", EventMask::CREATE, ".a.txt.swp", 0, 0);
    t.feed("/r/d", EventMask::MODIFY, ".a.txt.swp", 0, 0);
    t.feed("/r/d", EventMask::CLOSE_WRITE, ".a.txt.swp", 0, 0);
    t.disk.rm("/r/d/.a.txt.swp");
    t.disk.put("/r/d/a.txt", file(5, 30));
    t.feed("/r/d", EventMask::MOVED_FROM, ".a.txt.swp", 7, 1);
    t.feed("/r/d", EventMask::MOVED_TO, "a.txt", 7, 1);
    t.flush(100);
    assert_eq!(summary(&ring), ["MODIFIED /r/d/a.txt"]);
    let mut got = futures::executor::block_on(reg.queue().next_batch());
    got.sort();
    assert_eq!(got, ["e", "s"]);
}

#[test]
fn renames_within_and_across_directories_are_moved() {
    let mut t = T::new();
    let d = t.events("d", "/r/d", false);
    let e = t.events("e", "/r/e", false);
    t.disk.rm("/r/d/a.txt");
    t.disk.put("/r/d/b.txt", file(1, 10));
    t.feed("/r/d", EventMask::MOVED_FROM, "a.txt", 1, 0);
    t.feed("/r/d", EventMask::MOVED_TO, "b.txt", 1, 0);
    t.flush(100);
    assert_eq!(summary(&d), ["MOVED /r/d/a.txt -> /r/d/b.txt"]);
    t.disk.rm("/r/d/b.txt");
    t.disk.put("/r/e/c.txt", file(1, 10));
    t.feed("/r/d", EventMask::MOVED_FROM, "b.txt", 2, 200);
    t.feed("/r/e", EventMask::MOVED_TO, "c.txt", 2, 200);
    t.flush(300);
    assert_eq!(
        summary(&d),
        [
            "MOVED /r/d/a.txt -> /r/d/b.txt",
            "MOVED /r/d/b.txt -> /r/e/c.txt"
        ]
    );
    assert_eq!(summary(&e), ["MOVED /r/d/b.txt -> /r/e/c.txt"]);
    // Out of every watched directory: a deletion.
    t.disk.rm("/r/e/c.txt");
    t.feed("/r/e", EventMask::MOVED_FROM, "c.txt", 3, 400);
    t.flush(500);
    assert_eq!(summary(&e).last().unwrap(), "DELETED /r/e/c.txt");
}

#[test]
fn delete_then_recreate_in_the_window_is_modified_and_later_ones_still_seen() {
    let mut t = T::new();
    let ring = t.events("e", "/r/d", false);
    t.disk.put("/r/d/a.txt", file(2, 20));
    t.feed("/r/d", EventMask::DELETE, "a.txt", 0, 0);
    t.feed("/r/d", EventMask::CREATE, "a.txt", 0, 1);
    t.feed("/r/d", EventMask::CLOSE_WRITE, "a.txt", 0, 1);
    t.flush(100);
    t.disk.rm("/r/d/a.txt");
    t.feed("/r/d", EventMask::DELETE, "a.txt", 0, 200);
    t.flush(300);
    t.disk.put("/r/d/a.txt", file(4, 40));
    t.feed("/r/d", EventMask::CREATE, "a.txt", 0, 400);
    t.flush(500);
    assert_eq!(
        summary(&ring),
        [
            "MODIFIED /r/d/a.txt",
            "DELETED /r/d/a.txt",
            "CREATED /r/d/a.txt"
        ]
    );
}

#[test]
fn recursive_watch_adds_new_subdirectories_and_reports_what_they_hold() {
    let mut t = T::new();
    let ring = t.events("e", "/r", true);
    assert!(t.disk.watches.contains_key(Path::new("/r/d")));
    t.disk.put("/r/n", dir());
    t.disk.put("/r/n/early.txt", file(1, 1));
    t.feed("/r", EventMask::CREATE | EventMask::ISDIR, "n", 0, 0);
    t.flush(100);
    assert_eq!(summary(&ring), ["CREATED /r/n", "CREATED /r/n/early.txt"]);
    // Now watched: a file in it is seen.
    t.disk.put("/r/n/late.txt", file(1, 2));
    t.feed("/r/n", EventMask::CREATE, "late.txt", 0, 200);
    t.flush(300);
    assert_eq!(summary(&ring).last().unwrap(), "CREATED /r/n/late.txt");
    // Removed: dropped.
    t.disk.rm("/r/n");
    t.feed("/r/n", EventMask::DELETE, "early.txt", 0, 400);
    t.feed("/r/n", EventMask::DELETE, "late.txt", 0, 400);
    t.feed("/r", EventMask::DELETE | EventMask::ISDIR, "n", 0, 400);
    t.flush(500);
    assert!(!t.disk.watches.contains_key(Path::new("/r/n")));
    assert!(!t.m.dirs.contains_key(Path::new("/r/n")));
    // A renamed subdirectory keeps its watch under its new name.
    t.disk.rm("/r/d");
    t.disk.put("/r/d2", dir());
    t.disk.put("/r/d2/a.txt", file(1, 10));
    t.feed("/r", EventMask::MOVED_FROM | EventMask::ISDIR, "d", 9, 600);
    t.feed("/r", EventMask::MOVED_TO | EventMask::ISDIR, "d2", 9, 600);
    t.flush(700);
    assert_eq!(summary(&ring).last().unwrap(), "MOVED /r/d -> /r/d2");
    let wd = t.m.dirs[Path::new("/r/d2")].wd;
    t.disk.put("/r/d2/z", file(1, 1));
    t.m.feed(
        &mut t.disk,
        Record {
            wd,
            mask: EventMask::CREATE,
            cookie: 0,
            name: Some("z".into()),
        },
        t.t0 + Duration::from_millis(800),
    );
    t.flush(900);
    assert_eq!(summary(&ring).last().unwrap(), "CREATED /r/d2/z");
}

#[test]
fn a_directory_renamed_within_the_window_takes_its_pending_entries_along() {
    let mut t = T::new();
    let ring = t.events("e", "/r", true);
    // write d/x; mv d d2, all inside one window.
    t.disk.put("/r/d/x", file(4, 4));
    t.feed("/r/d", EventMask::CREATE, "x", 0, 0);
    t.feed("/r/d", EventMask::CLOSE_WRITE, "x", 0, 1);
    let d = t.disk.files.clone();
    t.disk.rm("/r/d");
    for (k, m) in d.range(PathBuf::from("/r/d")..) {
        if let Ok(rel) = k.strip_prefix("/r/d") {
            t.disk.files.insert(Path::new("/r/d2").join(rel), *m);
        }
    }
    t.feed("/r", EventMask::MOVED_FROM | EventMask::ISDIR, "d", 5, 2);
    t.feed("/r", EventMask::MOVED_TO | EventMask::ISDIR, "d2", 5, 2);
    t.flush(100);
    let got = summary(&ring);
    assert!(got.contains(&"CREATED /r/d2/x".to_string()), "{got:?}");
    assert!(got.contains(&"MOVED /r/d -> /r/d2".to_string()), "{got:?}");
    assert!(t.m.pending.is_empty());
    assert_eq!(
        events(&ring)
            .iter()
            .find(|e| e["path"] == "/r/d2/x")
            .unwrap()["size"],
        4
    );
}

#[test]
fn the_base_deleted_is_an_in_band_error_and_its_return_is_seen() {
    let mut t = T::new();
    let ring = t.events("e", "/r/d", false);
    t.disk.rm("/r/d");
    // What `rm -rf /r/d` makes the kernel say, in one read.
    let wd = t.disk.wd("/r/d");
    t.feed("/r/d", EventMask::DELETE, "a.txt", 0, 0);
    for mask in [EventMask::DELETE_SELF, EventMask::IGNORED] {
        let r = Record {
            wd,
            mask,
            cookie: 0,
            name: None,
        };
        t.m.feed(&mut t.disk, r, t.t0);
    }
    t.disk.watches.remove(Path::new("/r/d"));
    t.feed("/r", EventMask::DELETE | EventMask::ISDIR, "d", 0, 0);
    t.flush(100);
    let ev = events(&ring);
    let types: Vec<&str> = ev.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(types, ["DELETED", "DELETED", "ERROR"]);
    assert!(ev[2]["message"].as_str().unwrap().contains("/r/d is gone"));
    t.disk.put("/r/d", dir());
    t.disk.put("/r/d/new.txt", file(1, 1));
    t.feed("/r", EventMask::CREATE | EventMask::ISDIR, "d", 0, 200);
    t.flush(300);
    assert_eq!(
        summary(&ring)[3..],
        [
            "CREATED /r/d".to_string(),
            "CREATED /r/d/new.txt".to_string()
        ]
    );
    assert!(t.disk.watches.contains_key(Path::new("/r/d")));
}

#[test]
fn a_deleted_parent_is_watched_for_again_and_each_level_re_arms_the_next() {
    let mut t = T::new();
    t.disk.put("/r/d/e", dir());
    t.disk.put("/r/d/e/f.json", file(1, 1));
    t.m.subscribe(
        &mut t.disk,
        "s",
        Spec {
            base: "/r/d/e/f.json".into(),
            root: "/r".into(),
            mode: Mode::State,
        },
    )
    .unwrap();
    // The whole chain from the root down, each for one name.
    for d in ["/r", "/r/d", "/r/d/e"] {
        assert!(t.disk.watches.contains_key(Path::new(d)), "{d}");
    }
    let reg = t.feed.register(&["s".into()]);
    // rm -rf /r/d
    let (wd_d, wd_e) = (t.disk.wd("/r/d"), t.disk.wd("/r/d/e"));
    t.disk.rm("/r/d");
    t.feed("/r/d/e", EventMask::DELETE, "f.json", 0, 0);
    for wd in [wd_e, wd_d] {
        for mask in [EventMask::DELETE_SELF, EventMask::IGNORED] {
            let r = Record {
                wd,
                mask,
                cookie: 0,
                name: None,
            };
            t.m.feed(&mut t.disk, r, t.t0);
        }
    }
    t.disk.watches.remove(Path::new("/r/d"));
    t.disk.watches.remove(Path::new("/r/d/e"));
    t.feed("/r", EventMask::DELETE | EventMask::ISDIR, "d", 0, 0);
    t.flush(100);
    assert_eq!(futures::executor::block_on(reg.queue().next_batch()), ["s"]);
    assert!(
        t.disk.watches.contains_key(Path::new("/r")),
        "still watched for d"
    );
    assert!(!t.m.dirs.contains_key(Path::new("/r/d")));
    // mkdir -p /r/d/e && cp f.json /r/d/e/: all of it before herald looks.
    t.disk.put("/r/d", dir());
    t.disk.put("/r/d/e", dir());
    t.disk.put("/r/d/e/f.json", file(2, 2));
    t.feed("/r", EventMask::CREATE | EventMask::ISDIR, "d", 0, 200);
    t.flush(300);
    assert_eq!(futures::executor::block_on(reg.queue().next_batch()), ["s"]);
    assert!(t.disk.watches.contains_key(Path::new("/r/d/e")), "re-armed");
    // Later writes are seen through the new watch.
    t.disk.put("/r/d/e/f.json", file(3, 3));
    t.feed("/r/d/e", EventMask::CLOSE_WRITE, "f.json", 0, 400);
    t.flush(500);
    assert_eq!(futures::executor::block_on(reg.queue().next_batch()), ["s"]);
    // The last holder gone: nothing left.
    t.m.unsubscribe(&mut t.disk, "s");
    assert!(t.disk.watches.is_empty());
}

#[test]
fn overflow_is_reported_in_band_and_a_rescan_converges() {
    let mut t = T::new();
    let ring = t.events("e", "/r", true);
    let _ = t.m.subscribe(
        &mut t.disk,
        "s",
        Spec {
            base: "/r/e".into(),
            root: "/r".into(),
            mode: Mode::State,
        },
    );
    let reg = t.feed.register(&["s".into()]);
    // Changes the kernel never reported.
    t.disk.put("/r/d/a.txt", file(9, 99));
    t.disk.put("/r/e/new.txt", file(1, 1));
    t.disk.put("/r/e/sub", dir());
    t.disk.put("/r/e/sub/deep.txt", file(1, 1));
    t.disk.rm("/r/d");
    t.disk.put("/r/d", dir());
    t.m.feed(
        &mut t.disk,
        Record {
            wd: -1,
            mask: EventMask::Q_OVERFLOW,
            cookie: 0,
            name: None,
        },
        t.t0,
    );
    assert_eq!(
        summary(&ring),
        [
            "OVERFLOW ",
            "DELETED /r/d/a.txt",
            "CREATED /r/e/new.txt",
            "CREATED /r/e/sub",
            "CREATED /r/e/sub/deep.txt",
        ]
    );
    assert!(t.disk.watches.contains_key(Path::new("/r/e/sub")));
    assert_eq!(
        futures::executor::block_on(reg.queue().next_batch()),
        ["s"],
        "state watchers re-read after an overflow"
    );
    // Converged: a second overflow with nothing changed adds only its notice.
    t.m.overflow(&mut t.disk, t.t0);
    assert_eq!(summary(&ring).len(), 6);
}

#[test]
fn overflow_re_adds_every_watch_and_replaces_a_dead_one() {
    let mut t = T::new();
    let ring = t.events("e", "/r", true);
    let quiet = t.events("q", "/r/e", false);
    let reg = t.feed.register(&["e".into(), "q".into()]);
    let old = t.disk.wd("/r/d");
    // Lost with the overflow: /r/d removed (its IGNORED too) and made again.
    t.disk.watches.remove(Path::new("/r/d"));
    t.disk.rm("/r/d");
    t.disk.put("/r/d", dir());
    t.disk.put("/r/d/n.txt", file(1, 1));
    t.m.overflow(&mut t.disk, t.t0);
    let new = t.disk.wd("/r/d");
    assert_ne!(new, old);
    assert_eq!(t.m.dirs[Path::new("/r/d")].wd, new);
    assert_eq!(t.m.by_wd[&new], Path::new("/r/d"));
    assert!(!t.m.by_wd.contains_key(&old), "the dead wd is forgotten");
    assert_eq!(
        summary(&ring),
        ["OVERFLOW ", "DELETED /r/d/a.txt", "CREATED /r/d/n.txt"]
    );
    // Every event log is told, even one with nothing changed.
    assert_eq!(summary(&quiet), ["OVERFLOW "]);
    let mut got = futures::executor::block_on(reg.queue().next_batch());
    got.sort();
    assert_eq!(got, ["e", "q"]);
    // Events on the new watch are seen.
    t.disk.put("/r/d/z", file(1, 2));
    t.feed("/r/d", EventMask::CREATE, "z", 0, 10);
    t.flush(100);
    assert_eq!(summary(&ring).last().unwrap(), "CREATED /r/d/z");
}

#[test]
fn limits_refuse_cleanly_and_last_unsubscribe_drops_watches() {
    let mut t = T::new();
    t.m.cfg.max_watches = 2;
    let spec = Spec {
        base: "/r".into(),
        root: "/r".into(),
        mode: Mode::Events {
            recursive: true,
            glob: None,
        },
    };
    let e = t.m.subscribe(&mut t.disk, "e", spec).unwrap_err();
    assert_eq!(e, SubError::Limit { max: 2 });
    assert!(t.disk.watches.is_empty(), "nothing left behind");
    assert!(!t.m.is_subscribed("e"));
    t.m.cfg.max_watches = 100;
    t.disk.limit = Some(1);
    let spec = Spec {
        base: "/r/d".into(),
        root: "/r".into(),
        mode: Mode::Events {
            recursive: false,
            glob: None,
        },
    };
    let e = t.m.subscribe(&mut t.disk, "e", spec.clone()).unwrap_err();
    assert_eq!(e, SubError::KernelLimit);
    t.disk.limit = None;
    t.m.subscribe(&mut t.disk, "e", spec.clone()).unwrap();
    t.m.subscribe(&mut t.disk, "e", spec).unwrap();
    assert_eq!(t.disk.watches.len(), 2, "/r/d and its parent /r");
    t.m.unsubscribe(&mut t.disk, "e");
    assert_eq!(t.disk.watches.len(), 2, "one holder left");
    t.m.unsubscribe(&mut t.disk, "e");
    assert!(t.disk.watches.is_empty());
}

#[test]
fn glob_narrows_by_name_and_state_watches_see_only_their_file() {
    let mut t = T::new();
    let ring =
        t.m.subscribe(
            &mut t.disk,
            "g",
            Spec {
                base: "/r/d".into(),
                root: "/r".into(),
                mode: Mode::Events {
                    recursive: false,
                    glob: Some(Glob::new("*.json").unwrap()),
                },
            },
        )
        .unwrap()
        .unwrap();
    t.m.subscribe(
        &mut t.disk,
        "s",
        Spec {
            base: "/r/e/x.json".into(),
            root: "/r".into(),
            mode: Mode::State,
        },
    )
    .unwrap();
    let reg = t.feed.register(&["s".into()]);
    t.disk.put("/r/d/a.json", file(1, 1));
    t.disk.put("/r/d/b.txt", file(1, 1));
    t.disk.put("/r/e/other", file(1, 1));
    t.feed("/r/d", EventMask::CREATE, "a.json", 0, 0);
    t.feed("/r/d", EventMask::CREATE, "b.txt", 0, 0);
    t.feed("/r/e", EventMask::CREATE, "other", 0, 0);
    t.flush(100);
    assert_eq!(summary(&ring), ["CREATED /r/d/a.json"]);
    assert!(t.m.pending.is_empty());
    assert!(
        futures::FutureExt::now_or_never(reg.queue().next_batch()).is_none(),
        "nothing for the state watch"
    );
    t.disk.put("/r/e/x.json", file(2, 2));
    t.feed("/r/e", EventMask::CREATE, "x.json", 0, 200);
    t.flush(300);
    assert_eq!(futures::executor::block_on(reg.queue().next_batch()), ["s"]);
}

#[test]
fn modify_without_close_waits_at_least_the_dirty_minimum() {
    let mut t = T::new();
    t.m.cfg.debounce = Duration::ZERO;
    let ring = t.events("e", "/r/d", false);
    t.disk.put("/r/d/a.txt", file(2, 20));
    t.feed("/r/d", EventMask::MODIFY, "a.txt", 0, 0);
    t.flush(0);
    assert!(summary(&ring).is_empty());
    t.feed("/r/d", EventMask::CLOSE_WRITE, "a.txt", 0, 1);
    t.flush(1);
    assert_eq!(summary(&ring), ["MODIFIED /r/d/a.txt"]);
    t.disk.put("/r/d/a.txt", file(3, 30));
    t.feed("/r/d", EventMask::MODIFY, "a.txt", 0, 10);
    t.flush(59);
    assert_eq!(summary(&ring).len(), 1);
    t.flush(60);
    assert_eq!(summary(&ring).len(), 2);
}

#[test]
fn mtimes_far_from_now_saturate_instead_of_overflowing() {
    assert_eq!(mtime_ns(1, 5), 1_000_000_005);
    assert_eq!(mtime_ns(-1, 0), -1_000_000_000);
    assert_eq!(mtime_ns(i64::MAX, 999_999_999), i64::MAX);
    assert_eq!(mtime_ns(i64::MIN, 0), i64::MIN);
    assert_eq!(mtime_ns(9_223_372_036, 999_999_999), i64::MAX);
}

#[test]
fn rfc3339_formats_utc_milliseconds() {
    assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
    assert_eq!(
        rfc3339(1_764_497_610_123_456_789),
        "2025-11-30T10:13:30.123Z"
    );
    assert_eq!(rfc3339(951_782_400_000_000_000), "2000-02-29T00:00:00.000Z");
    assert_eq!(rfc3339(-1_000_000), "1969-12-31T23:59:59.999Z");
}
