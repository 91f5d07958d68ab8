//! Rename pairing: a temp file renamed over its target, moves within and across directories,
//! and a directory renamed within a window.

use super::*;

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
fn a_file_renamed_over_its_target_within_one_clock_tick_is_modified() {
    // A second write through a temp file outside the watched tree, landing in the same tick
    // of the file system's coarse clock: same size, same mtime, another inode.
    let mut t = T::new();
    let ring = t.events("e", "/r/d", false);
    t.disk.put(
        "/r/d/a.txt",
        Meta {
            ino: 2,
            ..file(1, 10)
        },
    );
    t.feed("/r/d", EventMask::MOVED_TO, "a.txt", 9, 0);
    t.flush(100);
    assert_eq!(summary(&ring), ["MODIFIED /r/d/a.txt"]);
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
