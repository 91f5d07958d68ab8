//! A closed window into events: each due path is stat'ed and compared with the last settled
//! listing of its directory, the net change becomes a [`Change`], and the changes are written
//! into the rings that cover them and published.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde_json::{Map, Value};

use super::{DEAD, Disk, Kind, Machine, Meta, Pending, rfc3339};

/// One settled change.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub kind: &'static str,
    pub path: PathBuf,
    pub from: Option<PathBuf>,
    pub meta: Option<Meta>,
    pub old: Option<Meta>,
    pub replaced: bool,
}

impl Change {
    pub(super) fn new(
        kind: &'static str,
        path: PathBuf,
        meta: Option<Meta>,
        old: Option<Meta>,
    ) -> Change {
        Change {
            kind,
            path,
            from: None,
            meta,
            old,
            replaced: false,
        }
    }

    /// The event's fields: `path` (and `key`, for the watch client's default line and
    /// per-object dedupe), `kind`, `size`, `mtime`, `object`; `old` on MODIFIED; `from`/`to`
    /// on MOVED.
    pub fn fields(&self) -> Map<String, Value> {
        let mut f = Map::new();
        let path = self.path.to_string_lossy().into_owned();
        f.insert("path".into(), path.clone().into());
        match &self.from {
            Some(from) => {
                let from = from.to_string_lossy().into_owned();
                f.insert("key".into(), format!("{from} → {path}").into());
                f.insert("from".into(), from.into());
                f.insert("to".into(), path.into());
                if self.replaced {
                    f.insert("replaced".into(), true.into());
                }
            }
            None => {
                f.insert("key".into(), path.into());
            }
        }
        if let Some(m) = self.meta.or(self.old) {
            f.insert("kind".into(), m.kind.as_str().into());
            f.insert("size".into(), m.size.into());
            f.insert("mtime".into(), rfc3339(m.mtime_ns).into());
            f.insert("object".into(), m.json());
        }
        if self.kind == "MODIFIED"
            && let Some(o) = self.old
        {
            f.insert("old".into(), o.json());
        }
        f
    }
}

impl Machine {
    /// Settles every path whose window has closed by `now`, and emits what changed.
    pub fn flush(&mut self, disk: &mut dyn Disk, now: Instant) {
        let mut due: Vec<(PathBuf, Pending)> = Vec::new();
        let keys: Vec<PathBuf> = self
            .pending
            .iter()
            .filter(|(_, p)| p.deadline <= now)
            .map(|(k, _)| k.clone())
            .collect();
        for k in keys {
            if let Some(p) = self.pending.remove(&k) {
                due.push((k, p));
            }
        }
        if due.is_empty() {
            return;
        }
        // Oldest first; at the same instant, deeper paths first, so the entries of a removed
        // directory settle before the directory does.
        due.sort_by_key(|(k, p)| (p.first, std::cmp::Reverse(k.components().count())));
        let mut changes = Vec::new();
        for (path, p) in due {
            self.settle(disk, path, p, &mut changes);
        }
        self.emit(changes, false);
    }

    fn set_snapshot(&mut self, p: &Path, m: Option<Meta>) {
        let (Some(parent), Some(name)) = (p.parent(), p.file_name().and_then(|n| n.to_str()))
        else {
            return;
        };
        let wanted = self.dirs.get(parent).is_some_and(|d| d.full) || self.wants_name(parent, name);
        if let Some(d) = self.dirs.get_mut(parent) {
            match m {
                Some(m) if wanted => {
                    d.entries.insert(name.to_owned(), m);
                }
                _ => {
                    d.entries.remove(name);
                }
            }
        }
    }

    /// Decides the net change of one path from what it was, what it is, and what happened.
    pub(super) fn settle(
        &mut self,
        disk: &mut dyn Disk,
        path: PathBuf,
        p: Pending,
        out: &mut Vec<Change>,
    ) {
        if let Some(c) = p.cookie {
            self.moves.remove(&c);
        }
        let mut before = self.snapshot(&path);
        if before.is_none() && self.dirs.contains_key(&path) && p.moved_from.is_none() {
            // A watched directory whose parent is not watched.
            before = Some(Meta {
                kind: Kind::Dir,
                size: 0,
                mtime_ns: 0,
                ino: 0,
            });
        }
        let now = disk.stat(&path);
        self.set_snapshot(&path, now);
        if let Some((from, was)) = p.moved_from {
            match now {
                Some(m) => out.push(Change {
                    kind: "MOVED",
                    path: path.clone(),
                    from: Some(from),
                    meta: Some(m),
                    old: Some(was),
                    replaced: before.is_some(),
                }),
                None => {
                    // Moved, then gone again within the window.
                    out.push(Change::new("DELETED", from, None, Some(was)));
                    if let Some(b) = before {
                        out.push(Change::new("DELETED", path.clone(), None, Some(b)));
                    }
                }
            }
        } else if p.moved_to.is_some() {
            // Renamed away: the target's settle reports the move. Something new at the old
            // name is a creation.
            if let Some(m) = now {
                out.push(Change::new("CREATED", path.clone(), Some(m), None));
            }
        } else {
            match (before, now) {
                (None, None) => {}
                (None, Some(m)) => out.push(Change::new("CREATED", path.clone(), Some(m), None)),
                (Some(b), None) => out.push(Change::new("DELETED", path.clone(), None, Some(b))),
                (Some(b), Some(m)) => {
                    if b != m || (p.wrote && !p.created) {
                        out.push(Change::new("MODIFIED", path.clone(), Some(m), Some(b)));
                    }
                }
            }
        }
        match now {
            Some(m) if m.kind == Kind::Dir => {
                if self.dirs.get(&path).is_some_and(|d| d.wd == DEAD) {
                    // The kernel dropped its watch (unmounted over, or removed and made again
                    // within the window): start afresh.
                    self.dirs.remove(&path);
                }
                if self.needed(&path) && !self.dirs.get(&path).is_some_and(|d| d.full) {
                    let mut found = Vec::new();
                    if let Err(e) = self.add_tree(disk, &path, Some(&mut found)) {
                        self.error_for(&path, &format!("{} is not watched: {e}", path.display()));
                    }
                    out.extend(found);
                }
            }
            // A file that is still there: there is nothing under it to drop.
            Some(_) if before.is_none_or(|b| b.kind != Kind::Dir) => {}
            _ => {
                // Whatever is still pending under it settles first, against the listings
                // that are about to go.
                let mut under: Vec<PathBuf> = self
                    .pending
                    .keys()
                    .filter(|k| k.starts_with(&path) && **k != path)
                    .cloned()
                    .collect();
                under.sort_by_key(|k| std::cmp::Reverse(k.components().count()));
                for k in under {
                    if let Some(p) = self.pending.remove(&k) {
                        self.settle(disk, k, p, out);
                    }
                }
                self.drop_tree(disk, &path)
            }
        }
    }

    /// An in-band ERROR for every event log that covers `p`.
    pub(super) fn error_for(&self, p: &Path, message: &str) {
        for s in self.subs.values() {
            if let Some(r) = &s.ring
                && s.covers(p)
            {
                r.push_error(message);
                self.feed.publish(&s.uri);
            }
        }
    }

    /// Writes `changes` into the rings that cover them and publishes the URIs they touch.
    /// With `all`, every subscription is published as well (after an overflow: every event
    /// log got its `OVERFLOW`, every state may have changed).
    pub(super) fn emit(&self, changes: Vec<Change>, all: bool) {
        let mut publish: Vec<&str> = Vec::new();
        for c in &changes {
            let fields = c.fields();
            for s in self.subs.values() {
                let hit = s.covers(&c.path) || c.from.as_deref().is_some_and(|f| s.covers(f));
                if !hit {
                    continue;
                }
                if let Some(r) = &s.ring {
                    r.push(c.kind, fields.clone());
                    let base_gone = (c.kind == "DELETED" && c.path == s.spec.base)
                        || (c.kind == "MOVED" && c.from.as_deref() == Some(s.spec.base.as_path()));
                    if base_gone {
                        r.push_error(&format!(
                            "{} is gone (deleted or moved away); reads of it fail until it exists again, and events resume then",
                            s.spec.base.display()
                        ));
                    }
                }
                if !publish.contains(&s.uri.as_str()) {
                    publish.push(&s.uri);
                }
            }
        }
        if all {
            for s in self.subs.values() {
                if !publish.contains(&s.uri.as_str()) {
                    publish.push(&s.uri);
                }
            }
        }
        for uri in publish {
            self.feed.publish(uri);
        }
    }
}
