//! What a subscription watches ([`Spec`], [`Mode`]) and which paths concern it: the chain of
//! directories watched for one name each, the directories whose entries it wants, and the
//! events that belong to it (a glob narrows them by file name).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::mcp::ring::EventRing;
use crate::source::file::glob::Glob;

/// What a subscription watches.
#[derive(Debug, Clone, PartialEq)]
pub struct Spec {
    /// Canonical path of the file or directory.
    pub base: PathBuf,
    /// The root it lies under (canonical).
    pub root: PathBuf,
    pub mode: Mode,
}

impl Spec {
    /// The directories watched for one name each, so the base is seen going and coming back
    /// however much of its path goes: every directory from the root down to the base's
    /// parent (top first); for a base that is the root, the root's parent.
    pub fn chain(&self) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = self
            .base
            .ancestors()
            .skip(1)
            .filter(|a| a.starts_with(&self.root))
            .map(Path::to_owned)
            .collect();
        if v.is_empty()
            && let Some(p) = self.base.parent()
        {
            v.push(p.to_owned());
        }
        v.reverse();
        v
    }

    /// The one name this subscription needs in directory `d` of its chain: the next
    /// component of the base below `d`.
    pub(super) fn name_in(&self, d: &Path) -> Option<&str> {
        if !(d.starts_with(&self.root) || self.base.parent() == Some(d)) {
            return None;
        }
        match self.base.strip_prefix(d).ok()?.components().next()? {
            std::path::Component::Normal(n) => n.to_str(),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Mode {
    /// `file:///...`: the base itself and, for a directory, its entries.
    State,
    /// `file-events://watch/...`: an event log.
    Events { recursive: bool, glob: Option<Glob> },
}

pub(super) struct Sub {
    pub(super) uri: String,
    pub(super) spec: Spec,
    pub(super) refs: usize,
    pub(super) ring: Option<Arc<EventRing>>,
}

impl Sub {
    fn recursive(&self) -> bool {
        matches!(
            self.spec.mode,
            Mode::Events {
                recursive: true,
                ..
            }
        )
    }

    /// Whether an event about `p` belongs to this subscription.
    pub(super) fn covers(&self, p: &Path) -> bool {
        let base = &self.spec.base;
        let inside = p == base
            || p.parent() == Some(base.as_path())
            || (self.recursive() && p.starts_with(base));
        if !inside {
            return false;
        }
        match &self.spec.mode {
            Mode::Events { glob: Some(g), .. } if p != base => p
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| g.matches(n)),
            _ => true,
        }
    }

    /// Whether this subscription wants the entries of directory `d`.
    pub(super) fn wants_contents(&self, d: &Path) -> bool {
        d == self.spec.base || (self.recursive() && d.starts_with(&self.spec.base))
    }
}
