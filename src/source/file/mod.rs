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
//! [`POLL_LEASE`] after the poll, so changes between polls land in the ring.
//!
//! `uri` parses and builds the URIs, `read` reads a file or a directory listing from disk,
//! `events` is the `file.changed` event type and its poll, `paths` keeps every path under a
//! root, `machine` turns inotify records into those events, `watcher` runs the one inotify
//! instance on its own thread. This file holds the source itself: its configuration, its
//! watches and the [`Source`] implementation. A read also starts (or joins)
//! the watch and holds it for a few seconds, so a client that reads first and listens second
//! (the watch client's baseline read) misses nothing in between.

mod checksum;
mod events;
pub(crate) use events::poll_uri;
pub mod glob;
pub mod machine;
pub mod paths;
mod read;
mod uri;
pub mod watcher;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rmcp::model::{JsonObject, Resource, ResourceTemplate};
use serde_json::Value;

use self::machine::{Config, Spec, SubError};
use self::paths::{Confined, Roots};
use self::uri::{Target, parse, uri_path};
use self::watcher::{Subscription, Watcher};
use crate::mcp::events::{Leases, MAX_POLL_LEASES, POLL_LEASE};
use crate::mcp::hub::ChangeFeed;
use crate::mcp::ring::{DEFAULT_RING_CAPACITY, EVENT_LOG_MIME};
use crate::mcp::source::{
    Admission, Caller, Contents, ListenFilter, Read, Source, SourceError, SourceInfo, WatchGuard,
};
use crate::runtime::context::RoleContext;

pub use self::events::CHANGED_EVENT;
pub use self::uri::{EVENTS_TEMPLATE, STATE_TEMPLATE, events_uri, state_uri};

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

/// The file source. See the module docs.
pub struct FileSource {
    roots: Arc<Roots>,
    max_file_bytes: u64,
    watcher: Watcher,
    feed: ChangeFeed,
    /// The watches `events/poll` keeps between polls, by URI.
    polls: Leases<Subscription>,
    /// Where the read leases' timers run.
    ctx: RoleContext,
}

impl FileSource {
    /// Checks the roots and starts the inotify thread; helper tasks go on `ctx`.
    pub fn new(cfg: FileConfig, ctx: &RoleContext) -> Result<FileSource, FileError> {
        let roots = Roots::new(&cfg.roots).map_err(FileError::Roots)?;
        let feed = ChangeFeed::new();
        let watcher = Watcher::start(
            Config {
                // An hour is already absurd; the cap keeps deadline arithmetic from overflowing.
                debounce: cfg.debounce.min(Duration::from_secs(3600)),
                max_watches: cfg.max_watches.max(1),
                ring_capacity: cfg.ring_capacity,
                tap: ctx.tap().cloned(),
            },
            feed.clone(),
            roots.list().to_vec(),
        )?;
        Ok(FileSource {
            roots: Arc::new(roots),
            max_file_bytes: cfg.max_file_bytes,
            watcher,
            feed,
            polls: Leases::new(POLL_LEASE, MAX_POLL_LEASES, ctx.clone()),
            ctx: ctx.clone(),
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

    /// Starts (or joins) the watch of `uri`: parsed, confined to a root, subscribed. The
    /// guard keeps it up.
    pub async fn watch(&self, uri: &str) -> Result<WatchGuard, SourceError> {
        let target = parse(uri)?;
        let confined = self.confine(&target).await?;
        Ok(WatchGuard::new(
            self.subscribe(uri, &target, &confined).await?,
        ))
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

impl FileSource {
    async fn run_call(
        &self,
        _caller: &Caller,
        name: &str,
        args: JsonObject,
        call: crate::mcp::source::Call,
    ) -> Result<rmcp::model::CallToolResult, SourceError> {
        if name != "file_checksum" {
            return Err(SourceError::UnknownTool(name.to_owned()));
        }
        crate::mcp::source::check_args(&args, &["path"])?;
        let path = match args.get("path") {
            Some(Value::String(p)) => p.clone(),
            _ => {
                return Err(SourceError::InvalidParams(
                    "missing argument path; call with path=\"/srv/data\"".into(),
                ));
            }
        };
        let target = match parse(&path) {
            Ok(t) => t,
            Err(_) => parse(&state_uri(std::path::Path::new(&path)))?,
        };
        let confined = self.confine(&target).await?;
        let cancel = call
            .task
            .as_ref()
            .map(|t| t.cancelled().clone())
            .unwrap_or_default();
        // Dropping this call (a cancelled request, or a cancelled task) stops the walk too.
        let stop = cancel.clone().drop_guard();
        let task = call.task;
        let r = tokio::task::spawn_blocking(move || checksum::checksum(&confined, task, cancel))
            .await
            .map_err(|e| SourceError::Unavailable(format!("checksum failed: {e}")))?;
        drop(stop);
        r
    }
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
            ..SourceInfo::default()
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

    async fn read(&self, _caller: &Caller, read: Read<'_>) -> Result<Contents, SourceError> {
        let uri = read.uri;
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
                    // Dropped at shutdown, like the sleep.
                    self.ctx.spawn_until_shutdown("read lease", async move {
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
                Some(r) => Ok(Contents::event_log(&r, read.after)),
                None => Err(SourceError::Unavailable(
                    "no event ring for this URI".into(),
                )),
            },
            Target::State { path, read_as } => {
                let max = self.max_file_bytes;
                tokio::task::spawn_blocking(move || {
                    read::read_state(&confined, &path, read_as, max)
                })
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

    fn tools(&self, _caller: &Caller) -> std::borrow::Cow<'_, [rmcp::model::Tool]> {
        static LIST: std::sync::LazyLock<Vec<rmcp::model::Tool>> = std::sync::LazyLock::new(|| {
            vec![crate::mcp::tasks::optional(
            rmcp::model::Tool::new(
                "file_checksum",
                "SHA-256 of a file, or of a directory tree (the digest of its sha256sum listing, in byte order of the relative paths; symlinks are skipped), under the roots. May run as a task, with progress in its status message.",
                crate::mcp::source::schema(serde_json::json!({
                    "type": "object",
                    "properties": {"path": {"type": "string", "description": "absolute path of a file or directory under a root (or its file:// URI)"}},
                    "required": ["path"],
                    "additionalProperties": false
                })),
            )
            .with_annotations(
                rmcp::model::ToolAnnotations::with_title("Checksum a file or tree")
                    .read_only(true)
                    .open_world(false),
            ),
        )]
        });
        std::borrow::Cow::Borrowed(&LIST)
    }

    async fn call_tool(
        &self,
        caller: &Caller,
        name: &str,
        args: JsonObject,
        call: crate::mcp::source::Call,
    ) -> Result<rmcp::model::CallToolResponse, SourceError> {
        self.run_call(caller, name, args, call)
            .await
            .map(Into::into)
    }

    async fn events_advertised(&self, _caller: &Caller) -> bool {
        true
    }

    async fn events_list(&self, _caller: &Caller) -> Result<Vec<Value>, SourceError> {
        Ok(vec![events::file_changed().to_json()])
    }

    async fn events_poll(
        &self,
        _caller: &Caller,
        params: JsonObject,
    ) -> Result<Value, SourceError> {
        self.poll(params).await
    }
}
