//! What a stat tells: a path's [`Kind`], size and mtime ([`Meta`]), read from `std::fs` or a raw
//! `stat`, and how the events and listings write them.

use serde_json::{Map, Value};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    Other,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::File => "file",
            Kind::Dir => "dir",
            Kind::Symlink => "symlink",
            Kind::Other => "other",
        }
    }
}

/// What a stat tells (without following symlinks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meta {
    pub kind: Kind,
    pub size: u64,
    /// Nanoseconds since the epoch.
    pub mtime_ns: i64,
    /// The inode of what is not a directory (0 for one): a file replaced by a rename is a
    /// change even when its size and mtime match, as they do for two writes within one tick
    /// of the file system's coarse clock.
    pub ino: u64,
}

impl Meta {
    pub fn from_std(m: &std::fs::Metadata) -> Meta {
        use std::os::unix::fs::MetadataExt;
        let ft = m.file_type();
        let kind = if ft.is_symlink() {
            Kind::Symlink
        } else if ft.is_dir() {
            Kind::Dir
        } else if ft.is_file() {
            Kind::File
        } else {
            Kind::Other
        };
        Meta {
            kind,
            size: if kind == Kind::Dir { 0 } else { m.len() },
            mtime_ns: mtime_ns(m.mtime(), m.mtime_nsec()),
            ino: if kind == Kind::Dir { 0 } else { m.ino() },
        }
    }

    /// From a raw `stat` (an `fstatat` with `AT_SYMLINK_NOFOLLOW`).
    pub fn from_stat(st: &libc::stat) -> Meta {
        let kind = match st.st_mode & libc::S_IFMT {
            libc::S_IFLNK => Kind::Symlink,
            libc::S_IFDIR => Kind::Dir,
            libc::S_IFREG => Kind::File,
            _ => Kind::Other,
        };
        Meta {
            kind,
            size: if kind == Kind::Dir {
                0
            } else {
                st.st_size.max(0) as u64
            },
            mtime_ns: mtime_ns(st.st_mtime, st.st_mtime_nsec),
            ino: if kind == Kind::Dir { 0 } else { st.st_ino },
        }
    }

    /// `{"kind", "size", "mtime"}`.
    pub fn json(&self) -> Value {
        let mut o = Map::new();
        o.insert("kind".into(), self.kind.as_str().into());
        o.insert("size".into(), self.size.into());
        o.insert("mtime".into(), rfc3339(self.mtime_ns).into());
        Value::Object(o)
    }
}

/// Seconds and nanoseconds as nanoseconds since the epoch, saturating at the ends of `i64`
/// (a file system can hold mtimes far past 2262).
pub fn mtime_ns(sec: i64, nsec: i64) -> i64 {
    (i128::from(sec) * 1_000_000_000 + i128::from(nsec)).clamp(i64::MIN.into(), i64::MAX.into())
        as i64
}

/// RFC 3339 UTC with milliseconds, e.g. `2026-11-30T10:13:30.123Z` (shared with the event
/// timestamps of `events/poll`).
pub use crate::mcp::events::rfc3339;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtimes_far_from_now_saturate_instead_of_overflowing() {
        assert_eq!(mtime_ns(1, 5), 1_000_000_005);
        assert_eq!(mtime_ns(-1, 0), -1_000_000_000);
        assert_eq!(mtime_ns(i64::MAX, 999_999_999), i64::MAX);
        assert_eq!(mtime_ns(i64::MIN, 0), i64::MIN);
        assert_eq!(mtime_ns(9_223_372_036, 999_999_999), i64::MAX);
    }

    #[test]
    fn rfc3339_formats_utc_milliseconds() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            rfc3339(1_764_497_610_123_456_789),
            "2025-11-30T10:13:30.123Z"
        );
        assert_eq!(rfc3339(951_782_400_000_000_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(rfc3339(-1_000_000), "1969-12-31T23:59:59.999Z");
    }
}
