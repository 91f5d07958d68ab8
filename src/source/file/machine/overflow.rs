//! `IN_Q_OVERFLOW`: the kernel dropped events. Every event log is told in band, every watch is
//! added again, every watched directory is rescanned against its last listing, and the
//! differences are emitted as synthetic events.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::Instant;

use serde_json::Map;

use super::{Change, DEAD, Disk, Kind, Machine, Meta, Pending, Wd};

impl Machine {
    /// `IN_Q_OVERFLOW`: events were lost. Tell every event log, settle what is pending,
    /// rescan every watched directory against its last listing, and emit the differences.
    pub fn overflow(&mut self, disk: &mut dyn Disk, _now: Instant) {
        for s in self.subs.values() {
            if let Some(r) = &s.ring {
                let mut f = Map::new();
                f.insert(
                    "message".into(),
                    "the kernel's inotify queue overflowed and events were lost; herald rescanned the watched directories and the events that follow are what changed".into(),
                );
                r.push("OVERFLOW", f);
            }
        }
        let mut changes = Vec::new();
        let mut due: Vec<(PathBuf, Pending)> = self.pending.drain().collect();
        due.sort_by_key(|(k, p)| (p.first, std::cmp::Reverse(k.components().count())));
        for (path, p) in due {
            self.settle(disk, path, p, &mut changes);
        }
        self.moves.clear();
        let mut dirs: Vec<PathBuf> = self.dirs.keys().cloned().collect();
        dirs.sort();
        // The kernel's own notices (IGNORED) may be among what was lost, or a path may now be
        // another directory: add every watch again. The same wd is the same directory; another
        // one means the old watch is dead or on a directory elsewhere, so the new one replaces
        // it (and the rescan below compares the directory against its last listing).
        let mut live: HashSet<Wd> = HashSet::new();
        let mut stale: Vec<Wd> = Vec::new();
        let mut gone: HashSet<PathBuf> = HashSet::new();
        for d in &dirs {
            let Some(old) = self.dirs.get(d).map(|x| x.wd) else {
                continue;
            };
            match disk.add_watch(d) {
                Ok(wd) => {
                    live.insert(wd);
                    if wd != old {
                        stale.push(old);
                        if let Some(x) = self.dirs.get_mut(d) {
                            x.wd = wd;
                        }
                    }
                }
                Err(_) => {
                    gone.insert(d.clone());
                }
            }
        }
        for w in stale {
            if w != DEAD && !live.contains(&w) {
                disk.rm_watch(w);
            }
        }
        self.by_wd = self
            .dirs
            .iter()
            .filter(|(p, d)| d.wd != DEAD && !gone.contains(*p))
            .map(|(p, d)| (d.wd, p.clone()))
            .collect();
        for d in dirs {
            if gone.contains(&d) {
                // Gone (or no longer a directory beneath the root): its parent's rescan
                // reports it.
                self.drop_tree(disk, &d);
                continue;
            }
            let Some(dir) = self.dirs.get(&d) else {
                continue;
            };
            let full = dir.full;
            let fresh: HashMap<String, Meta> = if full {
                match disk.list(&d) {
                    Ok(l) => l.into_iter().collect(),
                    Err(_) => {
                        // Gone: its parent's rescan reports it.
                        self.drop_tree(disk, &d);
                        continue;
                    }
                }
            } else {
                self.names_in(&d)
                    .into_iter()
                    .filter_map(|n| {
                        let m = disk.stat(&d.join(&n))?;
                        Some((n, m))
                    })
                    .collect()
            };
            let old = std::mem::take(&mut self.dirs.get_mut(&d).expect("present").entries);
            let mut names: Vec<&String> = old.keys().chain(fresh.keys()).collect();
            names.sort();
            names.dedup();
            let mut appeared_dirs = Vec::new();
            for n in names {
                let p = d.join(n);
                match (old.get(n), fresh.get(n)) {
                    (None, Some(m)) => {
                        changes.push(Change::new("CREATED", p.clone(), Some(*m), None));
                        if m.kind == Kind::Dir {
                            appeared_dirs.push(p);
                        }
                    }
                    (Some(o), None) => {
                        changes.push(Change::new("DELETED", p.clone(), None, Some(*o)));
                        self.drop_tree(disk, &p);
                    }
                    (Some(o), Some(m)) if o != m => {
                        changes.push(Change::new("MODIFIED", p.clone(), Some(*m), Some(*o)));
                        if o.kind == Kind::Dir && m.kind != Kind::Dir {
                            self.drop_tree(disk, &p);
                        } else if m.kind == Kind::Dir {
                            appeared_dirs.push(p);
                        }
                    }
                    _ => {}
                }
            }
            if let Some(dir) = self.dirs.get_mut(&d) {
                dir.entries = fresh;
            }
            for p in appeared_dirs {
                if self.needed(&p) && !self.dirs.get(&p).is_some_and(|x| x.full) {
                    let mut found = Vec::new();
                    if let Err(e) = self.add_tree(disk, &p, Some(&mut found)) {
                        self.error_for(&p, &format!("{} is not watched: {e}", p.display()));
                    }
                    changes.extend(found);
                }
            }
        }
        self.emit(changes, true);
    }
}
