//! The memo source: `memo://notes`, a JSON object of notes kept in the store, changed by the
//! `memo_set` / `memo_delete` tools, plus `memo://log`, the event log of those changes.
//!
//! It is the smallest real source: its change feed is its own write path. Writes are serialized
//! (store commit, then memory, then the log, then the notification), so the log's order is the
//! store's order and a reader that gets a notification always reads the change it announces.
//!
//! With `--backend nats://…` ([`nats`]) the notes live in a NATS JetStream key-value bucket
//! instead of the store: a write is a KV put, and every change, this host's or another's,
//! reaches memory, the log and the notification through the bucket's watch, in the bucket's
//! order; a write returns once the watch has applied it, so a read after it sees it.
//!
//! The notes are bounded in total size ([`DEFAULT_MAX_NOTES_BYTES`], `--max-notes-bytes`): the
//! total of keys and values as stored is kept as each write changes it, and a `memo_set` that
//! would take it past the limit is refused before anything is written.
//!
//! The tools (their listing and calls) are `tools.rs`; the tests are `tests.rs`.

use crate::sync::RecoverRw;
use std::collections::BTreeMap;
use std::sync::RwLock;

use async_trait::async_trait;
use rmcp::model::{JsonObject, Resource, Tool};
use serde_json::{Map, Value, json};

use crate::mcp::events::{self, EventType, PollRequest};
use crate::mcp::hub::ChangeFeed;
use crate::mcp::limits::DEFAULT_MAX_MESSAGE_BYTES;
use crate::mcp::ring::{EVENT_LOG_MIME, EventRing};
use crate::mcp::source::{
    Admission, Call, Caller, Contents, ListenFilter, Read, Source, SourceError, SourceInfo,
    WatchGuard,
};
use crate::runtime::tap::Tap;
use crate::store::{Store, StoreError, Table};

pub mod nats;
mod tools;

pub const NOTES_URI: &str = "memo://notes";
pub const LOG_URI: &str = "memo://log";
/// The event type over `memo://log` (MCP Events).
pub const CHANGED_EVENT: &str = "memo.changed";

/// Longest note key accepted.
const MAX_KEY_BYTES: usize = 1024;

/// The notes' default limit in total (keys and values as stored) for a server whose messages
/// are at most `max_message_bytes`: half of it. `memo://notes` is read whole, as one message,
/// and quoting its JSON inside the read result takes room (typical notes grow by a quarter to a
/// half), so notes this big still read within the limit; bigger ones would be kept but could no
/// longer be read. It also bounds what one client can make herald hold: the notes are kept in
/// memory as well as in the store.
pub const fn default_max_notes_bytes(max_message_bytes: usize) -> usize {
    max_message_bytes / 2
}

/// [`default_max_notes_bytes`] at the default message limit: 2 MiB.
pub const DEFAULT_MAX_NOTES_BYTES: usize = default_max_notes_bytes(DEFAULT_MAX_MESSAGE_BYTES);

pub struct Memo {
    state: std::sync::Arc<State>,
    backend: Backend,
    /// The most `writes` may hold after a write that grows the notes.
    max_notes_bytes: usize,
}

/// Where the notes are kept.
enum Backend {
    Store(Store),
    Nats(Box<nats::Notes>),
}

/// What the memo holds in memory, shared with the NATS watch that applies changes.
pub struct State {
    notes: RwLock<BTreeMap<String, Value>>,
    log: EventRing,
    feed: ChangeFeed,
    /// Held across a write (writes are serialized): the notes' total size in bytes, each
    /// note's key plus its value as stored ([`stored_len`]), changed by each write.
    writes: tokio::sync::Mutex<usize>,
    /// Bumped after every change, for `memo_wait`.
    version: tokio::sync::watch::Sender<u64>,
}

impl std::ops::Deref for Memo {
    type Target = State;
    fn deref(&self) -> &State {
        &self.state
    }
}

#[cfg(test)]
impl State {
    /// Takes `changes` as a NATS watch takes a burst: into memory, logged and announced, with
    /// no await between them (and not written to a store), so no reader sees part of it.
    pub(crate) fn apply_burst(&self, changes: Vec<(String, Value)>) {
        for (key, value) in changes {
            let old = self.notes.read_locked().get(&key).cloned();
            self.applied(&key, Some(value), old);
        }
    }
}

impl State {
    fn new(
        notes: BTreeMap<String, Value>,
        total: usize,
        ring_capacity: usize,
        tap: Option<&Tap>,
    ) -> State {
        State {
            notes: RwLock::new(notes),
            log: EventRing::new(ring_capacity).tapped(LOG_URI, tap),
            feed: ChangeFeed::new(),
            writes: tokio::sync::Mutex::new(total),
            version: tokio::sync::watch::Sender::new(0),
        }
    }

    /// Takes a change into memory (its total size already in `total`), logs and announces it.
    fn applied(&self, key: &str, value: Option<Value>, old: Option<Value>) {
        let mut f = Map::new();
        f.insert("key".into(), Value::from(key));
        let kind = {
            let mut notes = self.notes.write_locked();
            match (value, old) {
                (Some(v), old) => {
                    notes.insert(key.to_owned(), v.clone());
                    f.insert("object".into(), v);
                    match old {
                        Some(old) => {
                            f.insert("old".into(), old);
                            "MODIFIED"
                        }
                        None => "ADDED",
                    }
                }
                (None, Some(old)) => {
                    notes.remove(key);
                    f.insert("object".into(), old);
                    "DELETED"
                }
                (None, None) => return,
            }
        };
        self.log.push(kind, f);
        self.feed.publish(NOTES_URI);
        self.feed.publish(LOG_URI);
        self.version.send_modify(|v| *v += 1);
    }
}

impl Memo {
    /// Loads the notes from the store; at most [`DEFAULT_MAX_NOTES_BYTES`] of them until
    /// [`with_max_notes_bytes`](Memo::with_max_notes_bytes) says otherwise. Its log is
    /// published through `tap` when the role publishes its event logs.
    pub async fn open(
        store: Store,
        ring_capacity: usize,
        tap: Option<&Tap>,
    ) -> Result<Memo, StoreError> {
        let mut notes = BTreeMap::new();
        let mut total = 0;
        for (k, v) in store.scan(Table::Notes).await? {
            match serde_json::from_slice(&v) {
                Ok(v) => {
                    total += k.len() + stored_len(&v);
                    notes.insert(k, v);
                }
                Err(e) => tracing::warn!(key = %k, error = %e, "skipping an unreadable note"),
            }
        }
        Ok(Memo {
            state: std::sync::Arc::new(State::new(notes, total, ring_capacity, tap)),
            backend: Backend::Store(store),
            max_notes_bytes: DEFAULT_MAX_NOTES_BYTES,
        })
    }

    /// The notes in the NATS key-value bucket `cfg` names (nothing kept in the store):
    /// connects, loads the bucket and follows its changes from every host, until `ctx` shuts
    /// down.
    pub async fn open_nats(
        cfg: &nats::NatsConfig,
        ring_capacity: usize,
        ctx: &crate::runtime::context::RoleContext,
    ) -> Result<Memo, String> {
        let state = std::sync::Arc::new(State::new(BTreeMap::new(), 0, ring_capacity, ctx.tap()));
        let notes = nats::Notes::open(cfg, state.clone(), ctx).await?;
        Ok(Memo {
            state,
            backend: Backend::Nats(Box::new(notes)),
            max_notes_bytes: DEFAULT_MAX_NOTES_BYTES,
        })
    }

    /// Bounds the notes' total size (keys and values as stored) at `max` bytes: a `memo_set`
    /// that would take them past it is refused. Notes already past it (a smaller limit than
    /// the last run's) are kept, and a write that does not grow them is still taken, so they
    /// can be brought back under it.
    pub fn with_max_notes_bytes(mut self, max: usize) -> Memo {
        let total = self.writes.try_lock().map_or(0, |t| *t);
        if total > max {
            tracing::warn!(
                total,
                limit = max,
                "the notes take more than --max-notes-bytes; memo_set is refused for anything that grows them until notes are deleted"
            );
        }
        self.max_notes_bytes = max;
        self
    }

    /// The notes' total size in bytes (keys and values as stored).
    pub async fn notes_bytes(&self) -> usize {
        *self.writes.lock().await
    }

    fn snapshot(&self) -> Value {
        let notes = self.notes.read_locked();
        Value::Object(notes.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
    }

    fn check_key(key: &str) -> Result<(), SourceError> {
        if key.is_empty() {
            return Err(SourceError::InvalidParams(
                "key must not be empty; pass key=\"name\"".into(),
            ));
        }
        if key.len() > MAX_KEY_BYTES {
            return Err(SourceError::InvalidParams(format!(
                "key is {} bytes; keys are at most {MAX_KEY_BYTES} bytes",
                key.len()
            )));
        }
        Ok(())
    }

    /// Sets `key` to `value`. Returns whether anything changed.
    pub async fn set(&self, key: &str, value: Value) -> Result<bool, SourceError> {
        Self::check_key(key)?;
        // With NATS, this host's writes go one at a time through put and apply.
        let _serial = match &self.backend {
            Backend::Nats(n) => Some(n.serial.lock().await),
            Backend::Store(_) => None,
        };
        let mut total = self.writes.lock().await;
        let old = self.notes.read_locked().get(key).cloned();
        if old.as_ref() == Some(&value) {
            return Ok(false);
        }
        let bytes = value.to_string().into_bytes();
        let old_size = old.as_ref().map_or(0, |o| key.len() + stored_len(o));
        let new_size = key.len() + bytes.len();
        let after = *total - old_size + new_size;
        // A write that does not grow the notes is always taken, so notes already past the
        // limit can be brought back under it.
        if after > self.max_notes_bytes && new_size > old_size {
            return Err(SourceError::InvalidParams(format!(
                "memo_set of {key} refused: the notes would take {after} bytes, over their \
                 {max}-byte limit (--max-notes-bytes; in herald up, max_notes_bytes in [memo]); \
                 they take {total} bytes now (keys and values as stored) and are left as they \
                 were. Delete notes with memo_delete, or raise the limit",
                max = self.max_notes_bytes,
                total = *total,
            )));
        }
        match &self.backend {
            Backend::Store(store) => {
                store
                    .put(Table::Notes, key, bytes)
                    .await
                    .map_err(|e| SourceError::Unavailable(e.to_string()))?;
                *total = after;
                self.state.applied(key, Some(value), old);
            }
            Backend::Nats(n) => {
                // The bucket's watch applies it (and the total) in the bucket's order.
                let revision = n.put(key, bytes).await?;
                drop(total);
                n.applied(revision).await?;
            }
        }
        Ok(true)
    }

    /// Deletes `key`. Returns whether it existed.
    pub async fn delete(&self, key: &str) -> Result<bool, SourceError> {
        Self::check_key(key)?;
        let _serial = match &self.backend {
            Backend::Nats(n) => Some(n.serial.lock().await),
            Backend::Store(_) => None,
        };
        let mut total = self.writes.lock().await;
        let Some(old) = self.notes.read_locked().get(key).cloned() else {
            return Ok(false);
        };
        match &self.backend {
            Backend::Store(store) => {
                store
                    .delete(Table::Notes, key)
                    .await
                    .map_err(|e| SourceError::Unavailable(e.to_string()))?;
                *total -= key.len() + stored_len(&old);
                self.state.applied(key, None, Some(old));
            }
            Backend::Nats(n) => {
                let revision = n.delete(key).await?;
                drop(total);
                n.applied(revision).await?;
            }
        }
        Ok(true)
    }

    fn get(&self, key: &str) -> Option<Value> {
        self.notes.read_locked().get(key).cloned()
    }

    /// Waits until note `key` next changes (set to another value, or deleted), at most
    /// `timeout`. Returns the new value (`Some(None)`: deleted), or `None` on timeout.
    pub async fn wait(&self, key: &str, timeout: std::time::Duration) -> Option<Option<Value>> {
        self.wait_then(key, timeout, || {}).await
    }

    /// [`Memo::wait`], calling `waiting` once the value it compares against is taken: a
    /// change after that is seen.
    async fn wait_then(
        &self,
        key: &str,
        timeout: std::time::Duration,
        waiting: impl FnOnce(),
    ) -> Option<Option<Value>> {
        let mut rx = self.version.subscribe();
        let before = self.get(key);
        waiting();
        tokio::time::timeout(timeout, async {
            loop {
                if rx.changed().await.is_err() {
                    // The memo is gone; nothing will change any more.
                    std::future::pending::<()>().await;
                }
                let now = self.get(key);
                if now != before {
                    return now;
                }
            }
        })
        .await
        .ok()
    }
}

/// The bytes `value` takes in the store (its JSON text, as [`Memo::set`] writes it), counted
/// without building the text. The same function counts a note in and out, so the total never
/// drifts.
fn stored_len(value: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut n = Count(0);
    // Writing a `Value` to a sink that never fails cannot fail.
    let _ = serde_json::to_writer(&mut n, value);
    n.0
}

#[async_trait]
impl Source for Memo {
    fn info(&self) -> SourceInfo {
        SourceInfo {
            name: "memo".into(),
            instructions: Some(
                "Notes as a JSON object. Watch memo://notes (state) or memo://log (event log); change them with memo_set and memo_delete.".into(),
            ),
            ..SourceInfo::default()
        }
    }

    fn resources(&self, _caller: &Caller) -> Vec<Resource> {
        vec![
            Resource::new(NOTES_URI, "notes")
                .with_mime_type("application/json")
                .with_description(
                    "All notes as one JSON object (key -> value); a state resource, diffed by key. \
                     Change it with memo_set / memo_delete.\n\
                     Example: await watch_start(name=\"notes\", uri=\"memo://notes\")",
                ),
            Resource::new(LOG_URI, "notes log")
                .with_mime_type(EVENT_LOG_MIME)
                .with_description(
                    "Event log of note changes: ADDED / MODIFIED (with old) / DELETED, each with key and object, \
                     numbered by seq.\n\
                     Example: await watch_start(name=\"memo-log\", uri=\"memo://log\")",
                ),
        ]
    }

    async fn read(&self, _caller: &Caller, read: Read<'_>) -> Result<Contents, SourceError> {
        match read.uri {
            NOTES_URI => Ok(Contents::json(&self.snapshot())),
            LOG_URI => Ok(Contents::event_log(&self.log, read.after)),
            uri => Err(SourceError::NotFound { uri: uri.into() }),
        }
    }

    /// Both resources are always watchable; memo keeps nothing per listener.
    async fn admit(&self, _caller: &Caller, filter: &ListenFilter) -> Admission {
        let mut admission = Admission::default();
        for uri in filter.uris() {
            if uri == NOTES_URI || uri == LOG_URI {
                admission.accept(&uri, uri.as_str(), WatchGuard::none());
            } else {
                admission.refuse(&uri, SourceError::NotFound { uri: uri.clone() });
            }
        }
        admission
    }

    fn changes(&self) -> ChangeFeed {
        self.feed.clone()
    }

    fn tools(&self, _caller: &Caller) -> std::borrow::Cow<'_, [Tool]> {
        std::borrow::Cow::Borrowed(tools::list())
    }

    async fn call_tool(
        &self,
        caller: &Caller,
        name: &str,
        args: JsonObject,
        call: Call,
    ) -> Result<rmcp::model::CallToolResponse, SourceError> {
        self.run_call(caller, name, args, call)
            .await
            .map(Into::into)
    }

    async fn events_advertised(&self, _caller: &Caller) -> bool {
        true
    }

    async fn events_list(&self, _caller: &Caller) -> Result<Vec<Value>, SourceError> {
        Ok(vec![memo_changed().to_json()])
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
        events::check_arguments(&req.arguments, CHANGED_EVENT, &[])?;
        Ok(events::poll(&self.log, &self.feed, LOG_URI, &req).await)
    }
}

fn memo_changed() -> EventType {
    EventType {
        name: CHANGED_EVENT,
        description:
            "A note was added, modified or deleted: the memo://log event (ADDED, MODIFIED \
                      with old, DELETED; each with key and object). Takes no arguments."
                .into(),
        input_schema: json!({"type": "object", "properties": {}, "additionalProperties": false}),
        payload_schema: events::log_payload_schema(&["ADDED", "MODIFIED", "DELETED"]),
    }
}

#[cfg(test)]
mod tests;
