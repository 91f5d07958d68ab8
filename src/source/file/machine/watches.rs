//! Subscriptions and the kernel watches they need. A URI's first holder watches its chain and,
//! for a directory, its tree; its last holder leaving drops every watch nobody else needs.
//! Each watched directory keeps a listing (every entry where a subscription wants the
//! contents, else only the names a chain needs): what settling and the overflow rescan
//! compare against.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{Change, DEAD, Dir, Disk, Kind, Machine, Meta, Mode, Spec, Sub};
use crate::mcp::ring::EventRing;

/// Why a subscription could not start.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SubError {
    #[error(
        "watching this needs more than {max} watched directories, the limit (--max-watches); watch a smaller tree or raise the limit"
    )]
    Limit { max: usize },
    #[error(
        "the kernel's inotify watch limit is reached; raise fs.inotify.max_user_watches (sysctl) or watch a smaller tree"
    )]
    KernelLimit,
    #[error("its directory does not exist; create it first")]
    Missing,
    #[error("cannot watch it: {0}")]
    Io(String),
}

impl Machine {
    /// One more holder of `uri`. The first one starts watching (and may fail; then nothing
    /// is left behind). Returns the event ring of an event-log subscription.
    pub fn subscribe(
        &mut self,
        disk: &mut dyn Disk,
        uri: &str,
        spec: Spec,
    ) -> Result<Option<Arc<EventRing>>, SubError> {
        if let Some(s) = self.subs.get_mut(uri) {
            s.refs += 1;
            return Ok(s.ring.clone());
        }
        let ring = match spec.mode {
            Mode::Events { .. } => Some(Arc::new(
                EventRing::new(self.cfg.ring_capacity).tapped(uri, self.cfg.tap.as_ref()),
            )),
            Mode::State => None,
        };
        let spec2 = spec.clone();
        self.subs.insert(
            uri.to_owned(),
            Sub {
                uri: uri.to_owned(),
                spec,
                refs: 1,
                ring: ring.clone(),
            },
        );
        match self.start(disk, &spec2) {
            Ok(()) => Ok(ring),
            Err(e) => {
                self.subs.remove(uri);
                self.prune(disk);
                Err(e)
            }
        }
    }

    fn start(&mut self, disk: &mut dyn Disk, spec: &Spec) -> Result<(), SubError> {
        let base = &spec.base;
        for d in spec.chain() {
            match self.watch_dir(disk, &d) {
                Ok(_) => {}
                // The root's parent (watched to see the root itself go and come back) lies
                // outside the roots and may be unreadable: best effort.
                Err(e) if !d.starts_with(&spec.root) => {
                    tracing::debug!(dir = %d.display(), error = %e, "the root's parent is not watched");
                }
                Err(e) => return Err(e),
            }
        }
        if disk.stat(base).is_some_and(|m| m.kind == Kind::Dir) {
            self.add_tree(disk, base, None)?;
        } else if base.parent().is_none() {
            return Err(SubError::Missing);
        }
        Ok(())
    }

    /// One holder of `uri` left; the last one stops watching what nobody else needs.
    pub fn unsubscribe(&mut self, disk: &mut dyn Disk, uri: &str) {
        let Some(s) = self.subs.get_mut(uri) else {
            return;
        };
        s.refs -= 1;
        if s.refs == 0 {
            self.subs.remove(uri);
            self.prune(disk);
        }
    }

    fn needs_contents(&self, d: &Path) -> bool {
        self.subs.values().any(|s| s.wants_contents(d))
    }

    pub(super) fn wants_name(&self, d: &Path, name: &str) -> bool {
        self.subs.values().any(|s| s.spec.name_in(d) == Some(name))
    }

    /// The names some subscription needs in `d` (the next component of its base).
    pub(super) fn names_in(&self, d: &Path) -> HashSet<String> {
        self.subs
            .values()
            .filter_map(|s| s.spec.name_in(d).map(str::to_owned))
            .collect()
    }

    pub(super) fn needed(&self, d: &Path) -> bool {
        self.subs
            .values()
            .any(|s| s.wants_contents(d) || s.spec.name_in(d).is_some())
    }

    /// Drops the watches nobody needs, and the entries of directories only watched for a name.
    fn prune(&mut self, disk: &mut dyn Disk) {
        let paths: Vec<PathBuf> = self.dirs.keys().cloned().collect();
        for p in paths {
            if !self.needed(&p) {
                self.drop_dir(disk, &p);
            } else if !self.needs_contents(&p) {
                let keep = self.names_in(&p);
                if let Some(d) = self.dirs.get_mut(&p) {
                    d.full = false;
                    d.entries.retain(|k, _| keep.contains(k));
                }
            }
        }
        self.pending.retain(|p, _| {
            p.parent()
                .is_some_and(|d| self.dirs.contains_key(d) || self.dirs.contains_key(p))
        });
        self.moves.retain(|_, (p, _)| self.pending.contains_key(p));
    }

    fn drop_dir(&mut self, disk: &mut dyn Disk, p: &Path) {
        if let Some(d) = self.dirs.remove(p) {
            if d.wd != DEAD {
                disk.rm_watch(d.wd);
            }
            if self.by_wd.get(&d.wd).map(PathBuf::as_path) == Some(p) {
                self.by_wd.remove(&d.wd);
            }
        }
    }

    /// Drops `p` and every watched directory under it.
    pub(super) fn drop_tree(&mut self, disk: &mut dyn Disk, p: &Path) {
        let under: Vec<PathBuf> = self
            .dirs
            .keys()
            .filter(|d| d.starts_with(p))
            .cloned()
            .collect();
        for d in under {
            self.drop_dir(disk, &d);
        }
    }

    /// Watches directory `p` (if not yet), and makes sure its snapshot is full if someone
    /// wants its contents. Returns the entries found when the watch was new.
    fn watch_dir(
        &mut self,
        disk: &mut dyn Disk,
        p: &Path,
    ) -> Result<Option<Vec<(String, Meta)>>, SubError> {
        let full = self.needs_contents(p);
        if let Some(d) = self.dirs.get_mut(p) {
            if full && !d.full {
                d.full = true;
                d.entries = disk.list(p).unwrap_or_default().into_iter().collect();
            } else if !full {
                for n in self.subs.values().filter_map(|s| s.spec.name_in(p)) {
                    if !d.entries.contains_key(n)
                        && let Some(m) = disk.stat(&p.join(n))
                    {
                        d.entries.insert(n.to_owned(), m);
                    }
                }
            }
            return Ok(None);
        }
        if self.dirs.len() >= self.cfg.max_watches {
            return Err(SubError::Limit {
                max: self.cfg.max_watches,
            });
        }
        let wd = disk.add_watch(p).map_err(|e| match e.raw_os_error() {
            Some(libc::ENOSPC) => SubError::KernelLimit,
            Some(libc::ENOENT) | Some(libc::ENOTDIR) => SubError::Missing,
            _ => SubError::Io(e.to_string()),
        })?;
        // After the watch exists, so nothing that happens from here on is missed.
        let listed: Vec<(String, Meta)> = if full {
            disk.list(p).unwrap_or_default()
        } else {
            self.names_in(p)
                .into_iter()
                .filter_map(|n| {
                    let m = disk.stat(&p.join(&n))?;
                    Some((n, m))
                })
                .collect()
        };
        self.by_wd.insert(wd, p.to_owned());
        self.dirs.insert(
            p.to_owned(),
            Dir {
                wd,
                full,
                entries: listed.iter().cloned().collect(),
            },
        );
        Ok(Some(listed))
    }

    /// Watches directory `p` and, where a recursive subscription covers them, its
    /// subdirectories. With `found`, what the scans of newly watched directories hold is
    /// reported as created (a directory that appeared at run time).
    pub(super) fn add_tree(
        &mut self,
        disk: &mut dyn Disk,
        p: &Path,
        mut found: Option<&mut Vec<Change>>,
    ) -> Result<(), SubError> {
        let mut stack = vec![p.to_owned()];
        while let Some(d) = stack.pop() {
            let listed = self.watch_dir(disk, &d)?;
            let entries: Vec<(String, Meta)> = match listed {
                Some(l) => {
                    if let Some(found) = found.as_deref_mut() {
                        for (n, m) in &l {
                            found.push(Change::new("CREATED", d.join(n), Some(*m), None));
                        }
                    }
                    l
                }
                None => self.dirs[&d]
                    .entries
                    .iter()
                    .map(|(n, m)| (n.clone(), *m))
                    .collect(),
            };
            for (n, m) in entries {
                let child = d.join(&n);
                // Wanted whole and not yet listed whole, or on a subscription's chain (the
                // next directory down to its base, come back) and not watched yet.
                if m.kind == Kind::Dir
                    && ((self.needs_contents(&child)
                        && !self.dirs.get(&child).is_some_and(|c| c.full))
                        || (self.needed(&child) && !self.dirs.contains_key(&child)))
                {
                    stack.push(child);
                }
            }
        }
        Ok(())
    }
}
