//! Root confinement: which paths the file source may serve, and opening them without leaving
//! a root.
//!
//! A requested path must be absolute, UTF-8 after percent-decoding, free of `..`, and resolve
//! (symlinks followed) to somewhere under a configured root. Resolution canonicalises the
//! longest prefix that exists, so a path that does not exist yet (a file about to be created)
//! can still be watched. Every later access (reads, stats, listings, watches) then opens the
//! path relative to the root with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`, so a
//! symlink swapped in anywhere on the path after the check cannot lead outside it. Errors name only what the caller sent (and the roots), never where a symlink points.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use crate::mcp::source::SourceError;

/// The configured roots, canonical.
#[derive(Debug, Clone)]
pub struct Roots {
    roots: Vec<PathBuf>,
}

/// A path that passed confinement.
#[derive(Debug, Clone, PartialEq)]
pub struct Confined {
    /// Canonical (symlinks resolved) for the part that exists, plus the rest as given.
    pub path: PathBuf,
    /// The root it lies under.
    pub root: PathBuf,
}

impl Roots {
    /// Canonicalises `dirs`; each must be an existing directory with a UTF-8 path.
    pub fn new(dirs: &[PathBuf]) -> Result<Roots, String> {
        if dirs.is_empty() {
            return Err(
                "no roots given; pass --root DIR (repeatable) or roots = [...] in the config file"
                    .into(),
            );
        }
        let mut roots: Vec<PathBuf> = Vec::new();
        for d in dirs {
            let c = std::fs::canonicalize(d)
                .map_err(|e| format!("root {}: {e}; create it or fix the path", d.display()))?;
            if !c.is_dir() {
                return Err(format!("root {} is not a directory", d.display()));
            }
            if c.to_str().is_none() {
                return Err(format!(
                    "root {} is not valid UTF-8; herald serves UTF-8 paths only",
                    d.display()
                ));
            }
            if !roots.contains(&c) {
                roots.push(c);
            }
        }
        Ok(Roots { roots })
    }

    pub fn list(&self) -> &[PathBuf] {
        &self.roots
    }

    fn root_of(&self, p: &Path) -> Option<&PathBuf> {
        self.roots.iter().find(|r| p.starts_with(r))
    }

    fn roots_text(&self) -> String {
        self.roots
            .iter()
            .map(|r| r.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Confines `requested` (an absolute path, already percent-decoded). Blocking: it
    /// canonicalises, so call it off the runtime's workers.
    pub fn confine(&self, requested: &str) -> Result<Confined, SourceError> {
        let bad = |m: String| SourceError::InvalidParams(m);
        if !requested.starts_with('/') {
            return Err(bad(format!(
                "path {requested:?} is not absolute; give the full path, e.g. file:///srv/data/a.txt"
            )));
        }
        if requested.contains('\0') {
            return Err(bad("path contains a NUL byte".into()));
        }
        let mut lexical = PathBuf::from("/");
        for c in Path::new(requested).components() {
            match c {
                Component::RootDir | Component::CurDir => {}
                Component::ParentDir => {
                    return Err(bad(format!(
                        "path {requested} contains '..'; herald refuses '..' components: give the path without them"
                    )));
                }
                Component::Normal(n) => lexical.push(n),
                Component::Prefix(_) => {
                    return Err(bad(format!("path {requested} is not a Unix path")));
                }
            }
        }
        // Canonicalise the longest prefix that exists; keep the rest as given (it does not
        // exist, so it cannot be a symlink).
        let mut existing = lexical.clone();
        let mut rest = Vec::new();
        let resolved = loop {
            match std::fs::canonicalize(&existing) {
                Ok(c) => break c,
                Err(e)
                    if e.kind() == io::ErrorKind::NotFound
                        || e.raw_os_error() == Some(libc::ENOTDIR) =>
                {
                    match existing.file_name() {
                        Some(n) => {
                            rest.push(n.to_owned());
                            existing.pop();
                        }
                        None => return Err(bad(format!("path {requested} does not resolve"))),
                    }
                }
                Err(e) => {
                    return Err(bad(format!("cannot resolve {requested}: {e}")));
                }
            }
        };
        let mut path = resolved;
        for n in rest.into_iter().rev() {
            path.push(n);
        }
        let Some(root) = self.root_of(&path).cloned() else {
            return Err(if self.root_of(&lexical).is_some() {
                bad(format!(
                    "path {requested} resolves outside the served roots (a symlink leaves the root); herald only serves what lies under {}",
                    self.roots_text()
                ))
            } else {
                bad(format!(
                    "path {requested} is not under a served root; the roots are {}",
                    self.roots_text()
                ))
            });
        };
        if path.to_str().is_none() {
            return Err(bad(format!(
                "path {requested} resolves to a name that is not valid UTF-8; herald serves UTF-8 names only"
            )));
        }
        Ok(Confined { path, root })
    }
}

/// Decodes `%XX` escapes; the result must be UTF-8.
pub fn percent_decode(s: &str) -> Result<String, String> {
    use crate::runtime::percent::{Undecodable, decode};
    decode(s).map_err(|e| match e {
        Undecodable::Escape => format!("bad percent-escape in {s:?}; write % as %25"),
        Undecodable::Utf8 => format!(
            "{s:?} decodes to bytes that are not valid UTF-8; herald serves UTF-8 names only"
        ),
    })
}

/// Escapes what cannot stand in a URI path as-is (`%`, `?`, `#`, spaces, controls, non-ASCII
/// stays as it is: URIs here are IRIs).
pub fn percent_encode_path(p: &str) -> String {
    let mut out = String::with_capacity(p.len());
    for c in p.chars() {
        match c {
            '%' | '?' | '#' | ' ' | '"' | '<' | '>' | '\\' | '^' | '`' | '{' | '|' | '}' => {
                out.push_str(&format!("%{:02X}", c as u32))
            }
            c if c.is_control() => {
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    out.push_str(&format!("%{b:02X}"));
                }
            }
            c => out.push(c),
        }
    }
    out
}

/// Opens `path` (under `root`) for reading without leaving `root` and without following a
/// symlink in any component (see [`open_nofollow`]). `O_NONBLOCK` keeps a FIFO from hanging
/// the open.
pub fn open_beneath(root: &Path, path: &Path, directory: bool) -> io::Result<File> {
    let mut flags = libc::O_RDONLY | libc::O_NOCTTY | libc::O_NONBLOCK;
    if directory {
        flags |= libc::O_DIRECTORY;
    }
    open_nofollow(root, path, flags).map(File::from)
}

/// Opens `path`, which lies under `root` (a canonical root), relative to the root without
/// following a symlink in *any* component: `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`,
/// or, on kernels without `openat2` (before 5.6), a walk of `openat(O_NOFOLLOW)` one component
/// at a time. A symlink on the way is `ELOOP` (or `ENOTDIR`); with `O_PATH` a symlink as the
/// last component is opened itself (so `fstat` tells it is a symlink). `O_NOFOLLOW` and
/// `O_CLOEXEC` are always added. The root itself is opened by its path (it is configuration,
/// canonicalised at start), with `O_NOFOLLOW`.
pub fn open_nofollow(root: &Path, path: &Path, flags: i32) -> io::Result<OwnedFd> {
    let rel = path.strip_prefix(root).map_err(|_| {
        io::Error::new(
            io::ErrorKind::PermissionDenied,
            "path is not under its root",
        )
    })?;
    let flags = flags | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    let root_c = CString::new(root.as_os_str().as_bytes())?;
    if rel.as_os_str().is_empty() {
        // SAFETY: open on a NUL-terminated string; the fd is owned at once.
        let fd = unsafe { libc::open(root_c.as_ptr(), flags) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor we own.
        return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
    }
    // SAFETY: as above.
    let rootfd = unsafe {
        let fd = libc::open(
            root_c.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        );
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        OwnedFd::from_raw_fd(fd)
    };
    let rel_c = CString::new(rel.as_os_str().as_bytes())?;
    // SAFETY: openat2 with a zeroed, filled open_how and a NUL-terminated path; the fd
    // returned is owned at once.
    unsafe {
        let mut how: libc::open_how = std::mem::zeroed();
        how.flags = flags as u64;
        how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS;
        let fd = libc::syscall(
            libc::SYS_openat2,
            rootfd.as_raw_fd(),
            rel_c.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        );
        if fd >= 0 {
            return Ok(OwnedFd::from_raw_fd(fd as i32));
        }
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() != Some(libc::ENOSYS) {
        return Err(err);
    }
    walk_nofollow(rootfd, rel, flags)
}

/// `openat(O_NOFOLLOW)` one component at a time: every directory on the way is opened
/// `O_PATH | O_DIRECTORY | O_NOFOLLOW`, so a symlink anywhere fails the walk.
fn walk_nofollow(mut dir: OwnedFd, rel: &Path, flags: i32) -> io::Result<OwnedFd> {
    let parts: Vec<&std::ffi::OsStr> = rel
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(Ok(n)),
            Component::CurDir => None,
            _ => Some(Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "path leaves its root",
            ))),
        })
        .collect::<io::Result<_>>()?;
    for (i, part) in parts.iter().enumerate() {
        let last = i + 1 == parts.len();
        let f = if last {
            flags
        } else {
            libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC
        };
        let c = CString::new(part.as_bytes())?;
        // SAFETY: openat on a live directory fd and a NUL-terminated name.
        let fd = unsafe { libc::openat(dir.as_raw_fd(), c.as_ptr(), f) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor we own.
        dir = unsafe { OwnedFd::from_raw_fd(fd) };
    }
    Ok(dir)
}

/// Whether an open error means "this would leave the root".
pub fn is_escape(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EXDEV) | Some(libc::ELOOP))
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Tmp(PathBuf);
    impl Tmp {
        fn new(tag: &str) -> Tmp {
            let p = std::env::temp_dir().join(format!("herald-paths-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).unwrap();
            Tmp(std::fs::canonicalize(p).unwrap())
        }
    }
    impl Drop for Tmp {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn confinement_refuses_dotdot_escapes_and_outsiders() {
        let t = Tmp::new("confine");
        let root = t.0.join("root");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(t.0.join("secret"), "x").unwrap();
        std::fs::write(root.join("a.txt"), "x").unwrap();
        std::os::unix::fs::symlink(t.0.join("secret"), root.join("out")).unwrap();
        std::os::unix::fs::symlink(root.join("a.txt"), root.join("in")).unwrap();
        let roots = Roots::new(std::slice::from_ref(&root)).unwrap();
        let s = |p: &Path| p.to_str().unwrap().to_owned();

        let ok = roots.confine(&s(&root.join("a.txt"))).unwrap();
        assert_eq!(ok.path, root.join("a.txt"));
        assert_eq!(ok.root, root);
        assert_eq!(roots.confine(&s(&root)).unwrap().path, root);
        // A symlink that stays inside resolves to its target.
        assert_eq!(
            roots.confine(&s(&root.join("in"))).unwrap().path,
            root.join("a.txt")
        );
        // Not existing yet is fine.
        assert_eq!(
            roots.confine(&s(&root.join("sub/new/x"))).unwrap().path,
            root.join("sub/new/x")
        );
        // `.` and doubled slashes are harmless.
        assert_eq!(
            roots
                .confine(&format!("{}/./sub//", root.display()))
                .unwrap()
                .path,
            root.join("sub")
        );

        let e = roots
            .confine(&format!("{}/sub/../../secret", root.display()))
            .unwrap_err();
        assert!(e.to_string().contains("'..'"), "{e}");
        let e = roots
            .confine(&s(&root.join("out")))
            .unwrap_err()
            .to_string();
        assert!(e.contains("a symlink leaves the root"), "{e}");
        assert!(!e.contains("secret"), "the target is not revealed: {e}");
        let e = roots
            .confine(&s(&t.0.join("secret")))
            .unwrap_err()
            .to_string();
        assert!(e.contains("not under a served root"), "{e}");
        let e = roots.confine("relative/a").unwrap_err().to_string();
        assert!(e.contains("not absolute"), "{e}");
    }

    #[test]
    fn open_beneath_refuses_a_symlink_swapped_in() {
        let t = Tmp::new("beneath");
        let root = t.0.join("root");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::write(t.0.join("secret"), "x").unwrap();
        std::fs::write(root.join("a"), "hello").unwrap();
        let mut f = open_beneath(&root, &root.join("a"), false).unwrap();
        let mut s = String::new();
        std::io::Read::read_to_string(&mut f, &mut s).unwrap();
        assert_eq!(s, "hello");
        // Passed the check as a plain file, then replaced by a symlink leaving the root.
        std::fs::remove_file(root.join("a")).unwrap();
        std::os::unix::fs::symlink(t.0.join("secret"), root.join("a")).unwrap();
        let e = open_beneath(&root, &root.join("a"), false).unwrap_err();
        assert!(is_escape(&e), "{e}");
        assert!(open_beneath(&root, &root, true).is_ok());
        // A directory in the middle of the path swapped for a symlink (to somewhere outside,
        // or even inside): refused by openat2 and by the component walk alike.
        std::fs::create_dir_all(t.0.join("etc")).unwrap();
        std::fs::write(t.0.join("etc/passwd"), "x").unwrap();
        std::fs::create_dir_all(root.join("inner")).unwrap();
        std::fs::write(root.join("inner/passwd"), "x").unwrap();
        std::os::unix::fs::symlink(t.0.join("etc"), root.join("mid")).unwrap();
        std::os::unix::fs::symlink(root.join("inner"), root.join("mid2")).unwrap();
        for mid in ["mid", "mid2"] {
            let p = root.join(mid).join("passwd");
            let e = open_nofollow(&root, &p, libc::O_PATH).unwrap_err();
            assert!(is_escape(&e), "{mid}: {e}");
            let rootfd = open_nofollow(&root, &root, libc::O_PATH).unwrap();
            let rel = Path::new(mid).join("passwd");
            let e = walk_nofollow(rootfd, &rel, libc::O_PATH | libc::O_NOFOLLOW).unwrap_err();
            assert!(
                matches!(e.raw_os_error(), Some(libc::ENOTDIR) | Some(libc::ELOOP)),
                "{mid}: {e}"
            );
        }
        // The walk reaches what the path names when nothing on it is a symlink.
        let rootfd = open_nofollow(&root, &root, libc::O_PATH).unwrap();
        let f = walk_nofollow(rootfd, Path::new("inner/passwd"), libc::O_RDONLY).unwrap();
        assert_eq!(File::from(f).metadata().unwrap().len(), 1);
    }

    #[test]
    fn percent_coding() {
        assert_eq!(percent_decode("/a%20b/%C3%A9").unwrap(), "/a b/é");
        assert!(percent_decode("/a%FF").unwrap_err().contains("UTF-8"));
        assert!(
            percent_decode("/a%2")
                .unwrap_err()
                .contains("percent-escape")
        );
        let p = "/a b/100%?#é";
        assert_eq!(percent_encode_path(p), "/a%20b/100%25%3F%23é");
        assert_eq!(percent_decode(&percent_encode_path(p)).unwrap(), p);
    }
}
