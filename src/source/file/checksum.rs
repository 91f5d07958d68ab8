//! `file_checksum`: the SHA-256 of a file, or of a tree under a root, as `sha256sum` would
//! list it. It may run as a task: progress goes to the task's status message, and a
//! `tasks/cancel` stops it between two reads.
//!
//! Everything is opened beneath its root without following a symlink
//! ([`open_beneath`](super::paths::open_beneath)); a directory is listed through the
//! descriptor it was opened as, so a symlink swapped in during the walk cannot lead outside
//! the root. Symlinks met in a tree are counted and skipped, never followed.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rmcp::model::{CallToolResult, ContentBlock as Content};
use serde_json::json;
use sha2::{Digest as _, Sha256};
use tokio_util::sync::CancellationToken;

use super::paths::{Confined, open_beneath};
use crate::mcp::source::SourceError;
use crate::mcp::tasks::TaskHandle;

/// Bytes read at a time.
const CHUNK: usize = 1 << 20;
/// How often progress is told.
const PROGRESS_EVERY: Duration = Duration::from_millis(250);
/// Files listed one by one in a tree's answer (the digest covers all of them).
const MAX_LISTED: usize = 1000;

/// What the walk reports as it goes.
struct Progress {
    task: Option<TaskHandle>,
    cancel: CancellationToken,
    last: Instant,
    files: u64,
    bytes: u64,
}

impl Progress {
    fn tick(&mut self, force: bool) -> Result<(), SourceError> {
        if self.cancel.is_cancelled() {
            return Err(SourceError::Unavailable("cancelled".into()));
        }
        if let Some(t) = &self.task
            && (force || self.last.elapsed() >= PROGRESS_EVERY)
        {
            self.last = Instant::now();
            t.message(format!(
                "hashed {} files, {:.1} MiB",
                self.files,
                self.bytes as f64 / (1 << 20) as f64
            ));
        }
        Ok(())
    }
}

fn io_error(path: &Path, e: std::io::Error) -> SourceError {
    SourceError::InvalidParams(format!("cannot read {}: {e}", path.display()))
}

/// The SHA-256 of the file `path` (under `root`), hex.
fn hash_file(root: &Path, path: &Path, p: &mut Progress) -> Result<String, SourceError> {
    let mut f = open_beneath(root, path, false).map_err(|e| io_error(path, e))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io_error(path, e)),
        };
        h.update(&buf[..n]);
        p.bytes += n as u64;
        p.tick(false)?;
    }
    p.files += 1;
    Ok(hex::encode(h.finalize()))
}

/// Every regular file under `dir`, sorted by path, with its digest; symlinks and other kinds
/// counted apart.
fn walk(
    root: &Path,
    dir: &Path,
    out: &mut Vec<(PathBuf, String)>,
    skipped: &mut u64,
    p: &mut Progress,
) -> Result<(), SourceError> {
    let d = open_beneath(root, dir, true).map_err(|e| io_error(dir, e))?;
    // The open descriptor, listed by its /proc name: the directory that was opened, whatever
    // the path now leads to.
    use std::os::fd::AsRawFd as _;
    let listing = format!("/proc/self/fd/{}", d.as_raw_fd());
    let mut entries: Vec<(std::ffi::OsString, std::fs::FileType)> = std::fs::read_dir(&listing)
        .map_err(|e| io_error(dir, e))?
        .filter_map(Result::ok)
        .filter_map(|e| e.file_type().ok().map(|t| (e.file_name(), t)))
        .collect();
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, kind) in entries {
        let path = dir.join(&name);
        if kind.is_dir() {
            walk(root, &path, out, skipped, p)?;
        } else if kind.is_file() {
            let sum = hash_file(root, &path, p)?;
            out.push((path, sum));
        } else {
            *skipped += 1;
        }
    }
    Ok(())
}

/// The checksum of `target` (a confined file or directory); blocking.
pub fn checksum(
    target: &Confined,
    task: Option<TaskHandle>,
    cancel: CancellationToken,
) -> Result<CallToolResult, SourceError> {
    let mut p = Progress {
        task,
        cancel,
        last: Instant::now(),
        files: 0,
        bytes: 0,
    };
    let (root, path) = (&target.root, &target.path);
    let meta = std::fs::symlink_metadata(path).map_err(|e| io_error(path, e))?;
    if meta.is_file() {
        let sum = hash_file(root, path, &mut p)?;
        let mut r =
            CallToolResult::success(vec![Content::text(format!("{sum}  {}", path.display()))]);
        r.structured_content = Some(json!({
            "path": path, "kind": "file", "sha256": sum, "bytes": p.bytes
        }));
        return Ok(r);
    }
    if !meta.is_dir() {
        return Err(SourceError::InvalidParams(format!(
            "{} is neither a regular file nor a directory",
            path.display()
        )));
    }
    let mut files = Vec::new();
    let mut skipped = 0;
    walk(root, path, &mut files, &mut skipped, &mut p)?;
    p.tick(true)?;
    // Byte order of the whole relative path, as `LC_ALL=C sort` orders them.
    use std::os::unix::ffi::OsStrExt as _;
    files.sort_by(|a, b| a.0.as_os_str().as_bytes().cmp(b.0.as_os_str().as_bytes()));
    // The tree's digest: SHA-256 of the `sha256sum`-style listing (`HASH  RELATIVE/PATH\n`,
    // in byte order of the path), so `(cd DIR && find . -type f -printf '%P\n' | LC_ALL=C
    // sort | xargs sha256sum) | sha256sum` gives the same.
    let mut listing = String::new();
    for (f, sum) in &files {
        let rel = f.strip_prefix(path).unwrap_or(f);
        listing.push_str(&format!("{sum}  {}\n", rel.display()));
    }
    let sum = hex::encode(Sha256::digest(listing.as_bytes()));
    let listed: Vec<_> = files
        .iter()
        .take(MAX_LISTED)
        .map(|(f, s)| json!({"path": f.strip_prefix(path).unwrap_or(f), "sha256": s}))
        .collect();
    let mut r = CallToolResult::success(vec![Content::text(format!(
        "{sum}  {} ({} files, {} bytes{})",
        path.display(),
        files.len(),
        p.bytes,
        if skipped > 0 {
            format!(", {skipped} symlinks or special files skipped")
        } else {
            String::new()
        }
    ))]);
    r.structured_content = Some(json!({
        "path": path, "kind": "directory", "sha256": sum, "files": files.len(),
        "bytes": p.bytes, "skipped": skipped, "listed": listed,
        "truncated": files.len() > MAX_LISTED
    }));
    Ok(r)
}
