//! Records in: each inotify record opens or extends its path's debounce window (a `Pending`),
//! `MOVED_FROM` and `MOVED_TO` are paired by cookie, and a directory renamed within a window
//! takes its watches and pending paths along. Nothing is decided here; `settle.rs` does that
//! when the window closes.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use inotify::EventMask;

use super::{DEAD, DIRTY_MIN, Disk, Machine, Meta, Pending, Record};

impl Machine {
    /// The next time [`Machine::flush`] has work.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.pending.values().map(|p| p.deadline).min()
    }

    fn pend(&mut self, path: PathBuf, now: Instant, min_wait: Duration) -> &mut Pending {
        let w = self.cfg.debounce.max(min_wait);
        self.pending.entry(path).or_insert_with(|| Pending {
            first: now,
            deadline: now + w,
            created: false,
            wrote: false,
            moved_from: None,
            moved_to: None,
            cookie: None,
        })
    }

    pub(super) fn snapshot(&self, p: &Path) -> Option<Meta> {
        let dir = self.dirs.get(p.parent()?)?;
        dir.entries.get(p.file_name()?.to_str()?).copied()
    }

    /// Feeds one record read at `now`.
    pub fn feed(&mut self, disk: &mut dyn Disk, rec: Record, now: Instant) {
        if rec.mask.contains(EventMask::Q_OVERFLOW) {
            self.overflow(disk, now);
            return;
        }
        let Some(dir) = self.by_wd.get(&rec.wd).cloned() else {
            return;
        };
        if rec.mask.intersects(EventMask::IGNORED | EventMask::UNMOUNT) {
            // The kernel dropped the watch (directory gone). Keep the directory's listing
            // until its path settles, so its entries' deletions (read in the same batch,
            // just before this) still know what they were.
            if let Some(d) = self.dirs.get_mut(&dir)
                && d.wd == rec.wd
            {
                d.wd = DEAD;
            }
            self.by_wd.remove(&rec.wd);
            self.pend(dir, now, Duration::ZERO);
            return;
        }
        if rec.mask.contains(EventMask::DELETE_SELF) {
            // The parent's watch normally reports this too (same pending entry); a directory
            // whose parent is not watched learns it only here.
            self.pend(dir, now, Duration::ZERO);
            return;
        }
        let Some(name) = rec.name else {
            return;
        };
        let Some(name) = name.to_str() else {
            tracing::debug!(dir = %dir.display(), "skipping an entry whose name is not UTF-8");
            return;
        };
        let full = self.dirs.get(&dir).is_some_and(|d| d.full);
        if !full && !self.wants_name(&dir, name) {
            return;
        }
        let path = dir.join(name);
        let m = rec.mask;
        if m.contains(EventMask::CREATE) {
            self.pend(path, now, Duration::ZERO).created = true;
        } else if m.contains(EventMask::MODIFY) {
            self.pend(path, now, DIRTY_MIN).wrote = true;
        } else if m.contains(EventMask::CLOSE_WRITE) {
            let w = self.cfg.debounce;
            let p = self.pend(path, now, Duration::ZERO);
            p.wrote = true;
            p.deadline = p.deadline.min(p.first + w);
        } else if m.contains(EventMask::DELETE) {
            self.pend(path, now, Duration::ZERO);
        } else if m.contains(EventMask::MOVED_FROM) {
            let before = self.snapshot(&path);
            self.moves.insert(rec.cookie, (path.clone(), before));
            self.pend(path, now, Duration::ZERO).cookie = Some(rec.cookie);
        } else if m.contains(EventMask::MOVED_TO) {
            match self.moves.remove(&rec.cookie) {
                // A file that was not there when its window began: a temp file renamed over
                // the target is a write to the target.
                Some((_, None)) => {
                    self.pend(path, now, Duration::ZERO).wrote = true;
                }
                Some((from, Some(was))) => {
                    if let Some(src) = self.pending.get_mut(&from) {
                        src.moved_to = Some(path.clone());
                    }
                    if m.contains(EventMask::ISDIR) {
                        self.repath(&from, &path);
                    }
                    self.pend(path, now, Duration::ZERO).moved_from = Some((from, was));
                }
                None => {
                    self.pend(path, now, Duration::ZERO).created = true;
                }
            }
        }
    }

    /// A watched directory moved from `from` to `to`: its watches follow the inode, so only
    /// the paths change.
    fn repath(&mut self, from: &Path, to: &Path) {
        let moved: Vec<PathBuf> = self
            .dirs
            .keys()
            .filter(|d| d.starts_with(from))
            .cloned()
            .collect();
        for old in moved {
            let Ok(rel) = old.strip_prefix(from) else {
                continue;
            };
            let new = if rel.as_os_str().is_empty() {
                to.to_owned()
            } else {
                to.join(rel)
            };
            if let Some(d) = self.dirs.remove(&old) {
                self.by_wd.insert(d.wd, new.clone());
                self.dirs.insert(new, d);
            }
        }
        // What is pending inside moved with it: it settles under its new name (a file written
        // just before its directory was renamed is created at the new path).
        let under = |p: &Path| p.starts_with(from) && p != from;
        let re = |p: &Path| to.join(p.strip_prefix(from).expect("under from"));
        let keys: Vec<PathBuf> = self.pending.keys().filter(|p| under(p)).cloned().collect();
        for k in keys {
            let Some(mut p) = self.pending.remove(&k) else {
                continue;
            };
            if let Some(t) = p.moved_to.as_mut()
                && under(t)
            {
                *t = re(t);
            }
            let new = re(&k);
            match self.pending.get_mut(&new) {
                Some(q) => {
                    q.first = q.first.min(p.first);
                    q.deadline = q.deadline.min(p.deadline);
                    q.created |= p.created;
                    q.wrote |= p.wrote;
                }
                None => {
                    self.pending.insert(new, p);
                }
            }
        }
        for (path, _) in self.moves.values_mut() {
            if under(path) {
                *path = re(path);
            }
        }
    }
}
