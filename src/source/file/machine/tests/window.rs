//! The net change of a debounce window: created, modified, deleted, and a write left open.

use super::*;

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
