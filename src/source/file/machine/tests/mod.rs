//! Unit tests of the machine, driven through an in-memory file system with fake watches
//! (`FakeDisk`) and a clock the tests set, grouped by what they exercise: `window.rs` (the net
//! change of a debounce window), `rename.rs` (rename pairing), `watches.rs` (subscriptions,
//! their watches and the chain) and `overflow.rs` (the rescan).

mod overflow;
mod rename;
mod watches;
mod window;

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;

use super::*;
use crate::mcp::ring::EventRing;

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
        ino: 0,
    }
}

fn dir() -> Meta {
    Meta {
        kind: Kind::Dir,
        size: 0,
        mtime_ns: 0,
        ino: 0,
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
                    tap: None,
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
