//! The file source: files and directories under configured roots as watchable resources,
//! changes pushed from inotify.
//!
//! - `file:///ABS/PATH{?as}` is a state resource: a regular file's content (JSON for `.json`
//!   files or with `?as=json`, so the client diffs by key; other UTF-8 as text; anything else
//!   as a base64 blob), or a directory's listing (a JSON list of `{name, kind, size, mtime}`,
//!   which the client diffs by `name`). Published when the file, or an entry of the
//!   directory, changes (debounced).
//! - `file-events://watch/ABS/PATH{?recursive,glob}` is an event log on its own ring:
//!   `CREATED`, `MODIFIED` (with `old`), `DELETED`, `MOVED` (`from`, `to`), each with `path`,
//!   `kind`, `size` and `mtime`; in-band `ERROR` when the watched path goes away and
//!   `OVERFLOW` when the kernel dropped events (synthetic events from a rescan follow).
//!
//! The event logs are also offered through MCP Events as `file.changed` (arguments `path`,
//! `recursive`, `glob`: the same selection as the URI). A poll holds its URI's watch for
//! [`events::POLL_LEASE`] after the poll, so changes between polls land in the ring.
//!
//! `paths` keeps every path under a root, `machine` turns inotify records into those events,
//! `watcher` runs the one inotify instance on its own thread. A read also starts (or joins)
//! the watch and holds it for a few seconds, so a client that reads first and listens second
//! (the watch client's baseline read) misses nothing in between.

pub mod glob;
pub mod machine;
pub mod paths;
pub mod watcher;

use std::io::Read;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rmcp::model::{JsonObject, Resource, ResourceTemplate};
use serde_json::{Map, Value, json};

use self::glob::Glob;
use self::machine::{Config, Meta, Mode, Spec, SubError, rfc3339};
use self::paths::{Confined, Roots};
use self::watcher::{Subscription, Watcher};
use crate::mcp::events::{self, EventType, Leases, PollRequest};
use crate::mcp::hub::ChangeFeed;
use crate::mcp::ring::{DEFAULT_RING_CAPACITY, EVENT_LOG_MIME, EventRing};
use crate::mcp::source::{
    Admission, Caller, Contents, ListenFilter, Source, SourceError, SourceInfo, WatchGuard,
};

pub const STATE_TEMPLATE: &str = "file:///{+path}{?as}";
pub const EVENTS_TEMPLATE: &str = "file-events://watch/{+path}{?recursive,glob}";
const EVENTS_PREFIX: &str = "file-events://watch/";
/// The event type over `file-events://watch/...` rings (MCP Events).
pub const CHANGED_EVENT: &str = "file.changed";

/// Default largest file served, in bytes.
pub const DEFAULT_MAX_FILE_BYTES: u64 = 4 * 1024 * 1024;
/// Default debounce window, in milliseconds.
pub const DEFAULT_DEBOUNCE_MS: u64 = 50;
/// Default most directories watched at once.
pub const DEFAULT_MAX_WATCHES: usize = 8192;
/// How long a read keeps its URI watched when no listen holds it.
const READ_LEASE: Duration = Duration::from_secs(10);

/// How the file source is set up.
#[derive(Debug, Clone)]
pub struct FileConfig {
    pub roots: Vec<PathBuf>,
    pub max_file_bytes: u64,
    pub debounce: Duration,
    pub max_watches: usize,
    pub ring_capacity: usize,
}

impl Default for FileConfig {
    fn default() -> Self {
        FileConfig {
            roots: Vec::new(),
            max_file_bytes: DEFAULT_MAX_FILE_BYTES,
            debounce: Duration::from_millis(DEFAULT_DEBOUNCE_MS),
            max_watches: DEFAULT_MAX_WATCHES,
            ring_capacity: DEFAULT_RING_CAPACITY,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("{0}")]
    Roots(String),
    #[error("{0}")]
    Inotify(#[from] std::io::Error),
}

/// How `?as=` asks a file to be read.
#[derive(Debug, Clone, Copy, PartialEq)]
enum As {
    Auto,
    Json,
    Text,
}

/// A parsed URI of this source (syntax only; no file system access).
#[derive(Debug, Clone, PartialEq)]
enum Target {
    State {
        path: String,
        read_as: As,
    },
    Events {
        path: String,
        recursive: bool,
        glob: Option<Glob>,
    },
}

impl Target {
    fn path(&self) -> &str {
        match self {
            Target::State { path, .. } | Target::Events { path, .. } => path,
        }
    }

    fn mode(&self) -> Mode {
        match self {
            Target::State { .. } => Mode::State,
            Target::Events {
                recursive, glob, ..
            } => Mode::Events {
                recursive: *recursive,
                glob: glob.clone(),
            },
        }
    }
}

fn query_pairs(q: &str) -> Result<Vec<(String, String)>, SourceError> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            Ok((
                paths::percent_decode(k).map_err(SourceError::InvalidParams)?,
                paths::percent_decode(v).map_err(SourceError::InvalidParams)?,
            ))
        })
        .collect()
}

fn parse(uri: &str) -> Result<Target, SourceError> {
    let bad = SourceError::InvalidParams;
    if uri.contains('#') {
        return Err(bad(format!(
            "{uri} has a fragment; file URIs take none (write # in a name as %23)"
        )));
    }
    if let Some(rest) = uri.strip_prefix("file://") {
        if !rest.starts_with('/') {
            return Err(bad(format!(
                "{uri} names no absolute path; file URIs have three slashes, e.g. file:///srv/data/a.txt"
            )));
        }
        let (p, q) = rest.split_once('?').unwrap_or((rest, ""));
        let path = paths::percent_decode(p).map_err(bad)?;
        let mut read_as = As::Auto;
        for (k, v) in query_pairs(q)? {
            match (k.as_str(), v.as_str()) {
                ("as", "json") => read_as = As::Json,
                ("as", "text") => read_as = As::Text,
                ("as", other) => {
                    return Err(bad(format!(
                        "as={other} is not known; use as=json or as=text"
                    )));
                }
                (other, _) => {
                    return Err(bad(format!(
                        "unknown query parameter {other} in {uri}; file URIs take only ?as=json or ?as=text"
                    )));
                }
            }
        }
        return Ok(Target::State { path, read_as });
    }
    if let Some(rest) = uri.strip_prefix(EVENTS_PREFIX) {
        let (p, q) = rest.split_once('?').unwrap_or((rest, ""));
        let path = format!("/{}", paths::percent_decode(p).map_err(bad)?);
        let mut recursive = false;
        let mut glob = None;
        for (k, v) in query_pairs(q)? {
            match k.as_str() {
                "recursive" => {
                    recursive = match v.as_str() {
                        "true" | "1" | "" => true,
                        "false" | "0" => false,
                        other => {
                            return Err(bad(format!(
                                "recursive={other} is not a boolean; use recursive=true or recursive=false"
                            )));
                        }
                    }
                }
                "glob" => glob = Some(Glob::new(&v).map_err(bad)?),
                other => {
                    return Err(bad(format!(
                        "unknown query parameter {other} in {uri}; file-events URIs take recursive and glob"
                    )));
                }
            }
        }
        return Ok(Target::Events {
            path,
            recursive,
            glob,
        });
    }
    Err(SourceError::NotFound { uri: uri.into() })
}

/// The file source. See the module docs.
pub struct FileSource {
    roots: Arc<Roots>,
    max_file_bytes: u64,
    watcher: Watcher,
    feed: ChangeFeed,
    /// The watches `events/poll` keeps between polls, by URI.
    polls: Leases<Subscription>,
}

impl FileSource {
    /// Checks the roots and starts the inotify thread.
    pub fn new(cfg: FileConfig) -> Result<FileSource, FileError> {
        let roots = Roots::new(&cfg.roots).map_err(FileError::Roots)?;
        let feed = ChangeFeed::new();
        let watcher = Watcher::start(
            Config {
                // An hour is already absurd; the cap keeps deadline arithmetic from overflowing.
                debounce: cfg.debounce.min(Duration::from_secs(3600)),
                max_watches: cfg.max_watches.max(1),
                ring_capacity: cfg.ring_capacity,
            },
            feed.clone(),
            roots.list().to_vec(),
        )?;
        Ok(FileSource {
            roots: Arc::new(roots),
            max_file_bytes: cfg.max_file_bytes,
            watcher,
            feed,
            polls: Leases::new(events::POLL_LEASE, events::MAX_POLL_LEASES),
        })
    }

    pub fn roots(&self) -> &[PathBuf] {
        self.roots.list()
    }

    async fn confine(&self, target: &Target) -> Result<Confined, SourceError> {
        let roots = self.roots.clone();
        let path = target.path().to_owned();
        tokio::task::spawn_blocking(move || roots.confine(&path))
            .await
            .map_err(|e| SourceError::Unavailable(format!("path check failed: {e}")))?
    }

    async fn subscribe(
        &self,
        uri: &str,
        target: &Target,
        confined: &Confined,
    ) -> Result<Subscription, SourceError> {
        self.watcher
            .subscribe(
                uri,
                Spec {
                    base: confined.path.clone(),
                    root: confined.root.clone(),
                    mode: target.mode(),
                },
            )
            .await
            .map_err(|e| watch_error(target.path(), e))
    }
}

impl FileSource {
    /// Starts (or joins) the watch of `uri`: parsed, confined to a root, subscribed. The
    /// guard keeps it up.
    pub async fn watch(&self, uri: &str) -> Result<WatchGuard, SourceError> {
        let target = parse(uri)?;
        let confined = self.confine(&target).await?;
        Ok(WatchGuard::new(
            self.subscribe(uri, &target, &confined).await?,
        ))
    }

    /// The ring behind a `file.changed` poll of `uri`: held by the poll lease (renewed), or
    /// watched now and held from here on.
    async fn poll_ring(&self, uri: &str) -> Result<Arc<EventRing>, SourceError> {
        let ring = match self.polls.renew(uri, |s| s.ring().cloned()) {
            Some(ring) => ring,
            None => {
                self.polls.check_room()?;
                let target = parse(uri)?;
                let confined = self.confine(&target).await?;
                let sub = self.subscribe(uri, &target, &confined).await?;
                self.polls.hold(uri, sub, |s| s.ring().cloned())?
            }
        };
        ring.ok_or_else(|| SourceError::Unavailable(format!("no event ring for {uri}")))
    }

    /// URIs `events/poll` keeps watched now.
    pub fn polled(&self) -> usize {
        self.polls.len()
    }
}

/// The event-log URI a `file.changed` poll's arguments select.
fn poll_uri(args: &JsonObject) -> Result<String, SourceError> {
    events::check_arguments(args, CHANGED_EVENT, &["path", "recursive", "glob"])?;
    let path = events::required_argument(args, "path", CHANGED_EVENT)?;
    if !path.starts_with('/') {
        return Err(SourceError::InvalidParams(format!(
            "path {path:?} is not absolute; give the full path of a directory or file under a served root"
        )));
    }
    let recursive = events::bool_argument(args, "recursive")?;
    let mut uri = events_uri(std::path::Path::new(&path), recursive);
    if let Some(g) = events::str_argument(args, "glob")? {
        uri.push(if recursive { '&' } else { '?' });
        uri.push_str("glob=");
        uri.push_str(&events::encode_query_value(&g));
    }
    // The same checks as a URI (a bad glob, a bad path), so a poll and a listen agree.
    parse(&uri)?;
    Ok(uri)
}

fn file_changed() -> EventType {
    EventType {
        name: CHANGED_EVENT,
        description: "A file or directory under a served root changed: the event of \
                      file-events://watch/PATH (CREATED, MODIFIED with old, DELETED, MOVED with \
                      from and to; each with path, kind, size, mtime; ERROR and OVERFLOW in-band). \
                      The first poll starts the watch; it is kept for 5 minutes after each poll."
            .into(),
        input_schema: json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "absolute path of a directory (or one file) under a served root"},
                "recursive": {"type": "boolean", "description": "follow subdirectories (default false)"},
                "glob": {"type": "string", "description": "only names matching this pattern, e.g. *.json"}
            },
            "required": ["path"],
            "additionalProperties": false
        }),
        payload_schema: events::log_payload_schema(&[
            "CREATED", "MODIFIED", "DELETED", "MOVED", "ERROR", "OVERFLOW",
        ]),
    }
}

fn watch_error(requested: &str, e: SubError) -> SourceError {
    match e {
        SubError::Missing => SourceError::InvalidParams(format!(
            "cannot watch {requested}: its directory does not exist; create it first"
        )),
        SubError::Io(m) => SourceError::Unavailable(format!("cannot watch {requested}: {m}")),
        other => SourceError::Unavailable(format!("cannot watch {requested}: {other}")),
    }
}

fn uri_path(p: &std::path::Path) -> String {
    paths::percent_encode_path(&p.to_string_lossy())
}

/// The state URI of `p`.
pub fn state_uri(p: &std::path::Path) -> String {
    format!("file://{}", uri_path(p))
}

/// The event-log URI of `p` (`?recursive=true` when asked).
pub fn events_uri(p: &std::path::Path, recursive: bool) -> String {
    let q = if recursive { "?recursive=true" } else { "" };
    format!("file-events://watch{}{q}", uri_path(p))
}

#[async_trait]
impl Source for FileSource {
    fn info(&self) -> SourceInfo {
        let roots: Vec<String> = self
            .roots
            .list()
            .iter()
            .map(|r| r.display().to_string())
            .collect();
        SourceInfo {
            name: "file".into(),
            instructions: Some(format!(
                "Files and directories under {} as resources, changes pushed from inotify. \
                 Read or watch file:///PATH (state: a file's content, a directory's listing) or \
                 file-events://watch/PATH?recursive=true&glob=*.json (event log).",
                roots.join(", ")
            )),
        }
    }

    fn resources(&self, _caller: &Caller) -> Vec<Resource> {
        let mut out = Vec::new();
        for r in self.roots.list() {
            let name = r
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "/".into());
            let state = state_uri(r);
            let events = events_uri(r, true);
            out.push(
                Resource::new(state.clone(), format!("{name} listing"))
                    .with_mime_type("application/json")
                    .with_description(format!(
                        "The directory {} as a JSON list of entries (name, kind, size, mtime); a state \
                         resource, diffed by name: ADDED / DELETED / MODIFIED per entry.\n\
                         Example: await watch_start(name=\"{name}\", uri=\"{state}\")",
                        r.display()
                    )),
            );
            out.push(
                Resource::new(events.clone(), format!("{name} events"))
                    .with_mime_type(EVENT_LOG_MIME)
                    .with_description(format!(
                        "Event log of everything under {}: CREATED / MODIFIED (with old) / DELETED / \
                         MOVED (from, to), each with path, kind, size and mtime; ERROR and OVERFLOW in-band.\n\
                         Example: await watch_start(name=\"{name}-events\", uri=\"{events}\")",
                        r.display()
                    )),
            );
        }
        out
    }

    fn templates(&self, _caller: &Caller) -> Vec<ResourceTemplate> {
        let example_root = self
            .roots
            .list()
            .first()
            .map(|r| uri_path(r))
            .unwrap_or_else(|| "/srv/data".into());
        let bare = example_root.trim_start_matches('/');
        vec![
            ResourceTemplate::new(STATE_TEMPLATE, "file")
                .with_mime_type("application/json")
                .with_description(format!(
                    "A file under a served root: JSON for .json files or with ?as=json (diffed by key), \
                     other UTF-8 as text, anything else as a base64 blob; at most the size cap. \
                     A directory reads as its listing. path is absolute without the leading slash.\n\
                     Example: await watch_start(name=\"config\", uri=\"file:///{bare}/config.json\")"
                )),
            ResourceTemplate::new(EVENTS_TEMPLATE, "file events")
                .with_mime_type(EVENT_LOG_MIME)
                .with_description(format!(
                    "Event log of a directory (or one file): CREATED / MODIFIED / DELETED / MOVED with path, \
                     kind, size, mtime; recursive=true follows subdirectories, glob narrows by file name.\n\
                     Example: await watch_start(name=\"json\", uri=\"file-events://watch/{bare}?recursive=true&glob=*.json\")"
                )),
        ]
    }

    async fn read(&self, _caller: &Caller, uri: &str) -> Result<Contents, SourceError> {
        let target = parse(uri)?;
        let confined = self.confine(&target).await?;
        // Watch from the read on, so that nothing between a baseline read and the listen that
        // follows it is missed; a URI already watched needs no round trip.
        // For a state URI the lease is best effort: a read is served even when no watch can
        // be made (the watch limit reached, a directory that is not there); an event log has
        // nothing to read without its watch.
        let ring = match self.watcher.active(uri) {
            Some(ring) => ring,
            None => match self.subscribe(uri, &target, &confined).await {
                Ok(sub) => {
                    let ring = sub.ring().cloned();
                    tokio::spawn(async move {
                        tokio::time::sleep(READ_LEASE).await;
                        drop(sub);
                    });
                    ring
                }
                Err(e) if matches!(target, Target::State { .. }) => {
                    tracing::debug!(%uri, error = %e, "read served without a watch lease");
                    None
                }
                Err(e) => return Err(e),
            },
        };
        match target {
            Target::Events { .. } => match ring {
                Some(r) => Ok(Contents::event_log(&r)),
                None => Err(SourceError::Unavailable(
                    "no event ring for this URI".into(),
                )),
            },
            Target::State { path, read_as } => {
                let max = self.max_file_bytes;
                tokio::task::spawn_blocking(move || read_state(&confined, &path, read_as, max))
                    .await
                    .map_err(|e| SourceError::Unavailable(format!("read failed: {e}")))?
            }
        }
    }

    /// A URI is accepted once its watch is up: parsed, confined to a root and subscribed.
    /// One outside the roots (or past `--max-watches`) is left out of the acknowledgment.
    async fn admit(&self, _caller: &Caller, filter: &ListenFilter) -> Admission {
        let mut admission = Admission::default();
        for uri in filter.uris() {
            match self.watch(&uri).await {
                Ok(guard) => admission.accept(&uri, uri.as_str(), guard),
                Err(e) => admission.refuse(&uri, e),
            }
        }
        admission
    }

    fn changes(&self) -> ChangeFeed {
        self.feed.clone()
    }

    async fn events_advertised(&self, _caller: &Caller) -> bool {
        true
    }

    async fn events_list(&self, _caller: &Caller) -> Result<Vec<Value>, SourceError> {
        Ok(vec![file_changed().to_json()])
    }

    async fn events_poll(
        &self,
        _caller: &Caller,
        params: JsonObject,
    ) -> Result<Value, SourceError> {
        let req = PollRequest::parse(&params)?;
        if req.name != CHANGED_EVENT {
            return Err(events::unknown_event(&req.name));
        }
        let uri = poll_uri(&req.arguments)?;
        let ring = self.poll_ring(&uri).await?;
        Ok(events::poll(&ring, &self.feed, &uri, &req).await)
    }
}

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
fn read_state(
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
    fn uris_parse_strictly() {
        assert_eq!(
            parse("file:///srv/a%20b.json?as=json").unwrap(),
            Target::State {
                path: "/srv/a b.json".into(),
                read_as: As::Json
            }
        );
        assert_eq!(
            parse("file-events://watch/srv/d?recursive=true&glob=*.json").unwrap(),
            Target::Events {
                path: "/srv/d".into(),
                recursive: true,
                glob: Some(Glob::new("*.json").unwrap())
            }
        );
        assert_eq!(
            parse("file-events://watch//srv/d").unwrap().path(),
            "//srv/d",
            "a doubled slash is the same path once confined"
        );
        for (uri, needle) in [
            ("file://srv/a", "three slashes"),
            ("file:///a?x=1", "unknown query parameter x"),
            ("file:///a?as=yaml", "as=yaml"),
            ("file:///a#b", "fragment"),
            ("file-events://watch/a?recursive=maybe", "not a boolean"),
            ("file-events://watch/a?glob=[x", "without ']'"),
            ("file:///a%FF", "UTF-8"),
        ] {
            let e = parse(uri).unwrap_err().to_string();
            assert!(e.contains(needle), "{uri}: {e}");
        }
        assert!(matches!(
            parse("memo://notes"),
            Err(SourceError::NotFound { .. })
        ));
    }

    #[test]
    fn uris_round_trip_through_the_builders() {
        let p = std::path::Path::new("/srv/my dir/100%");
        let s = state_uri(p);
        assert_eq!(s, "file:///srv/my%20dir/100%25");
        assert_eq!(parse(&s).unwrap().path(), "/srv/my dir/100%");
        let e = events_uri(p, true);
        assert_eq!(e, "file-events://watch/srv/my%20dir/100%25?recursive=true");
        assert_eq!(parse(&e).unwrap().path(), "/srv/my dir/100%");
    }

    #[test]
    fn poll_arguments_select_the_event_log_uri() {
        let a = |v: Value| v.as_object().unwrap().clone();
        assert_eq!(
            poll_uri(&a(json!({"path": "/srv/d"}))).unwrap(),
            "file-events://watch/srv/d"
        );
        assert_eq!(
            poll_uri(&a(
                json!({"path": "/srv/my d", "recursive": true, "glob": "*.json"})
            ))
            .unwrap(),
            "file-events://watch/srv/my%20d?recursive=true&glob=*.json"
        );
        assert_eq!(
            poll_uri(&a(json!({"path": "/srv/d", "glob": "a&b?"}))).unwrap(),
            "file-events://watch/srv/d?glob=a%26b%3F"
        );
        for (v, needle) in [
            (json!({}), "missing argument path"),
            (json!({"path": "srv"}), "not absolute"),
            (json!({"path": "/a", "depth": 1}), "unknown argument depth"),
            (json!({"path": "/a", "recursive": "yes"}), "true or false"),
            (json!({"path": "/a", "glob": "[x"}), "without ']'"),
        ] {
            let e = poll_uri(&a(v.clone())).unwrap_err().to_string();
            assert!(e.contains(needle), "{v}: {e}");
        }
    }

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
