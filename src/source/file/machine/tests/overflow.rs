//! `IN_Q_OVERFLOW`: the in-band notice, the rescan, and watches added again.

use super::*;

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
