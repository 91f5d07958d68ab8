//! Subscriptions and their watches: limits, globs, recursive trees, and the chain that sees a
//! deleted base or parent come back.

use super::*;
use crate::source::file::glob::Glob;

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
