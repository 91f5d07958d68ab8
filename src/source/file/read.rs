//! Reads of `file:///PATH` state resources: a file's content (JSON, text or a base64 blob,
//! capped in size) or a directory's listing, through descriptors opened beneath the root with
//! no symlink followed. Blocking: the source calls it from `spawn_blocking`.

use std::io::Read;
use std::os::fd::AsRawFd;

use serde_json::{Map, Value};

use super::machine::{Meta, rfc3339};
use super::paths::{self, Confined};
use super::uri::As;
use crate::mcp::source::{Contents, SourceError};

fn open_error(requested: &str, e: std::io::Error) -> SourceError {
    if paths::is_escape(&e) {
        SourceError::InvalidParams(format!(
            "path {requested} resolves outside the served roots (a symlink leaves the root); herald does not read it"
        ))
    } else if e.kind() == std::io::ErrorKind::NotFound {
        missing(requested)
    } else {
        SourceError::Unavailable(format!("cannot read {requested}: {e}"))
    }
}

fn missing(requested: &str) -> SourceError {
    SourceError::InvalidParams(format!(
        "{requested} does not exist (if it was watched and deleted, reads work again once it is back); \
         watch file-events://watch{requested} to see it appear"
    ))
}

/// Reads a file or a directory listing. Blocking.
pub(super) fn read_state(
    c: &Confined,
    requested: &str,
    read_as: As,
    max: u64,
) -> Result<Contents, SourceError> {
    // Stat'ed through a descriptor opened beneath the root with no symlink followed in any
    // component: a directory swapped for a symlink after the check tells nothing about what
    // it points at.
    let meta = paths::open_nofollow(&c.root, &c.path, libc::O_PATH)
        .map(std::fs::File::from)
        .and_then(|f| f.metadata())
        .map_err(|e| open_error(requested, e))?;
    let ft = meta.file_type();
    if ft.is_dir() {
        if read_as != As::Auto {
            return Err(SourceError::InvalidParams(format!(
                "{requested} is a directory; ?as= applies to files (a directory always reads as its JSON listing)"
            )));
        }
        let dir =
            paths::open_beneath(&c.root, &c.path, true).map_err(|e| open_error(requested, e))?;
        return listing(&dir, &c.path).map_err(|e| open_error(requested, e));
    }
    if ft.is_symlink() {
        // Canonicalisation resolved every symlink that leads somewhere; this one does not.
        return Err(SourceError::InvalidParams(format!(
            "{requested} is a symlink to nothing that exists under the roots; herald does not follow it"
        )));
    }
    if !ft.is_file() {
        return Err(SourceError::InvalidParams(format!(
            "{requested} is not a regular file or a directory (a FIFO, socket or device); herald serves files and directories only"
        )));
    }
    let too_big = |size: u64| {
        SourceError::InvalidParams(format!(
            "{requested} is {size} bytes, over the {max}-byte cap (--max-file-bytes); raise the cap, or watch \
             file-events://watch{requested} to follow its changes without reading it"
        ))
    };
    if meta.len() > max {
        return Err(too_big(meta.len()));
    }
    let f = paths::open_beneath(&c.root, &c.path, false).map_err(|e| open_error(requested, e))?;
    // What was opened, not what was stat'ed by name: it may have been swapped in between.
    let opened = f
        .metadata()
        .map_err(|e| SourceError::Unavailable(format!("cannot stat {requested}: {e}")))?;
    if !opened.is_file() {
        return Err(SourceError::InvalidParams(format!(
            "{requested} is not a regular file; herald serves files and directories only"
        )));
    }
    let mut bytes = Vec::with_capacity(opened.len().min(max) as usize);
    f.take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| SourceError::Unavailable(format!("cannot read {requested}: {e}")))?;
    if bytes.len() as u64 > max {
        return Err(too_big(bytes.len() as u64));
    }
    decode(requested, bytes, read_as)
}

fn decode(requested: &str, bytes: Vec<u8>, read_as: As) -> Result<Contents, SourceError> {
    let is_json_name = requested.to_ascii_lowercase().ends_with(".json");
    match read_as {
        As::Json => match serde_json::from_slice::<Value>(&bytes) {
            Ok(v) => Ok(Contents::json(&v)),
            Err(e) => Err(SourceError::InvalidParams(format!(
                "{requested} is not JSON ({e}); read it without ?as=json to get its text"
            ))),
        },
        As::Text => String::from_utf8(bytes)
            .map(|t| Contents::text("text/plain", t))
            .map_err(|_| {
                SourceError::InvalidParams(format!(
                    "{requested} is not UTF-8 text; read it without ?as=text to get it as a blob"
                ))
            }),
        As::Auto => {
            if is_json_name && let Ok(v) = serde_json::from_slice::<Value>(&bytes) {
                return Ok(Contents::json(&v));
            }
            // A .json file caught half-written (or simply broken) is served as its text.
            if !bytes.contains(&0) {
                match String::from_utf8(bytes) {
                    Ok(t) => return Ok(Contents::text("text/plain", t)),
                    Err(e) => {
                        return Ok(Contents::blob("application/octet-stream", e.into_bytes()));
                    }
                }
            }
            Ok(Contents::blob("application/octet-stream", bytes))
        }
    }
}

/// A directory's listing: `[{"name","kind","size","mtime"}]` sorted by name. Names that are
/// not UTF-8 are left out (they cannot be named in a URI here).
fn listing(dir: &std::fs::File, path: &std::path::Path) -> std::io::Result<Contents> {
    // Through the descriptor openat2 checked, not the name, which could be swapped; by name
    // only where /proc is not mounted.
    let entries_of = std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd()))
        .or_else(|_| std::fs::read_dir(path))?;
    let mut entries = Vec::new();
    for e in entries_of {
        let Ok(e) = e else { continue };
        let Ok(name) = e.file_name().into_string() else {
            continue;
        };
        let Ok(m) = e.metadata() else { continue };
        let m = Meta::from_std(&m);
        let mut o = Map::new();
        o.insert("name".into(), name.into());
        o.insert("kind".into(), m.kind.as_str().into());
        o.insert("size".into(), m.size.into());
        o.insert("mtime".into(), rfc3339(m.mtime_ns).into());
        entries.push(Value::Object(o));
    }
    entries.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
    Ok(Contents::json(&Value::Array(entries)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_is_json_text_or_blob() {
        let j = decode("/a.json", br#"{"a": 1}"#.to_vec(), As::Auto).unwrap();
        assert_eq!(j.mime_type, "application/json");
        let t = decode("/a.json", b"{broken".to_vec(), As::Auto).unwrap();
        assert_eq!(t.mime_type, "text/plain");
        let t = decode("/a.txt", b"[1]".to_vec(), As::Auto).unwrap();
        assert_eq!(t.mime_type, "text/plain", "only .json or ?as=json is JSON");
        let j = decode("/a.txt", b"[1]".to_vec(), As::Json).unwrap();
        assert_eq!(j.mime_type, "application/json");
        let b = decode("/a.bin", vec![0, 159, 146, 150], As::Auto).unwrap();
        assert_eq!(b.mime_type, "application/octet-stream");
        let e = decode("/a.txt", b"nope".to_vec(), As::Json).unwrap_err();
        assert!(e.to_string().contains("is not JSON"), "{e}");
        let e = decode("/a.bin", vec![0xff], As::Text).unwrap_err();
        assert!(e.to_string().contains("not UTF-8"), "{e}");
    }
}
