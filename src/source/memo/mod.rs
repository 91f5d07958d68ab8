//! The memo source: `memo://notes`, a JSON object of notes kept in the store, changed by the
//! `memo_set` / `memo_delete` tools, plus `memo://log`, the event log of those changes.
//!
//! It is the smallest real source: its change feed is its own write path. Writes are serialized
//! (store commit, then memory, then the log, then the notification), so the log's order is the
//! store's order and a reader that gets a notification always reads the change it announces.

use std::collections::BTreeMap;
use std::sync::RwLock;

use async_trait::async_trait;
use rmcp::model::{
    CallToolResult, ContentBlock as Content, JsonObject, Resource, Tool, ToolAnnotations,
};
use serde_json::{Map, Value, json};

use crate::mcp::events::{self, EventType, PollRequest};
use crate::mcp::hub::ChangeFeed;
use crate::mcp::ring::{EVENT_LOG_MIME, EventRing};
use crate::mcp::source::{
    Admission, Call, Caller, Contents, ListenFilter, Source, SourceError, SourceInfo, WatchGuard,
    check_args, schema,
};
use crate::mcp::tasks;
use crate::store::{Store, StoreError, Table};

pub const NOTES_URI: &str = "memo://notes";
pub const LOG_URI: &str = "memo://log";
/// The event type over `memo://log` (MCP Events).
pub const CHANGED_EVENT: &str = "memo.changed";

/// Longest note key accepted.
const MAX_KEY_BYTES: usize = 1024;

pub struct Memo {
    notes: RwLock<BTreeMap<String, Value>>,
    store: Store,
    log: EventRing,
    feed: ChangeFeed,
    writes: tokio::sync::Mutex<()>,
    /// Bumped after every change, for `memo_wait`.
    version: tokio::sync::watch::Sender<u64>,
}

/// `memo_wait`'s default and longest wait.
const WAIT_DEFAULT_MS: u64 = 60_000;
const WAIT_MAX_MS: u64 = 3_600_000;

impl Memo {
    /// Loads the notes from the store.
    pub async fn open(store: Store, ring_capacity: usize) -> Result<Memo, StoreError> {
        let mut notes = BTreeMap::new();
        for (k, v) in store.scan(Table::Notes).await? {
            match serde_json::from_slice(&v) {
                Ok(v) => {
                    notes.insert(k, v);
                }
                Err(e) => tracing::warn!(key = %k, error = %e, "skipping an unreadable note"),
            }
        }
        Ok(Memo {
            notes: RwLock::new(notes),
            store,
            log: EventRing::new(ring_capacity),
            feed: ChangeFeed::new(),
            writes: tokio::sync::Mutex::new(()),
            version: tokio::sync::watch::Sender::new(0),
        })
    }

    fn snapshot(&self) -> Value {
        let notes = self.notes.read().unwrap_or_else(|e| e.into_inner());
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
        let _w = self.writes.lock().await;
        let old = self
            .notes
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .cloned();
        if old.as_ref() == Some(&value) {
            return Ok(false);
        }
        self.store
            .put(Table::Notes, key, value.to_string().into_bytes())
            .await
            .map_err(|e| SourceError::Unavailable(e.to_string()))?;
        self.notes
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.to_owned(), value.clone());
        let mut f = Map::new();
        f.insert("key".into(), Value::from(key));
        f.insert("object".into(), value);
        let kind = match old {
            Some(old) => {
                f.insert("old".into(), old);
                "MODIFIED"
            }
            None => "ADDED",
        };
        self.log.push(kind, f);
        self.feed.publish(NOTES_URI);
        self.feed.publish(LOG_URI);
        self.version.send_modify(|v| *v += 1);
        Ok(true)
    }

    /// Deletes `key`. Returns whether it existed.
    pub async fn delete(&self, key: &str) -> Result<bool, SourceError> {
        Self::check_key(key)?;
        let _w = self.writes.lock().await;
        let Some(old) = self
            .notes
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .cloned()
        else {
            return Ok(false);
        };
        self.store
            .delete(Table::Notes, key)
            .await
            .map_err(|e| SourceError::Unavailable(e.to_string()))?;
        self.notes
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
        let mut f = Map::new();
        f.insert("key".into(), Value::from(key));
        f.insert("object".into(), old);
        self.log.push("DELETED", f);
        self.feed.publish(NOTES_URI);
        self.feed.publish(LOG_URI);
        self.version.send_modify(|v| *v += 1);
        Ok(true)
    }

    fn get(&self, key: &str) -> Option<Value> {
        self.notes
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .cloned()
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

    async fn memo_wait(
        &self,
        args: &JsonObject,
        task: Option<&crate::mcp::tasks::TaskHandle>,
    ) -> Result<CallToolResult, SourceError> {
        check_args(args, &["key", "timeout_ms"])?;
        let key = key_arg(args)?;
        Self::check_key(&key)?;
        let ms = match args.get("timeout_ms") {
            None => WAIT_DEFAULT_MS,
            Some(v) => v
                .as_u64()
                .filter(|&m| m > 0 && m <= WAIT_MAX_MS)
                .ok_or_else(|| {
                    SourceError::InvalidParams(format!(
                        "timeout_ms must be a whole number of milliseconds from 1 to {WAIT_MAX_MS}"
                    ))
                })?,
        };
        // As a task, its status says when a change will be seen (a caller that sets the note
        // after this push knows the wait sees it).
        let waiting = || {
            if let Some(t) = task {
                t.message(format!("waiting for {key} to change"));
            }
        };
        Ok(
            match self
                .wait_then(&key, std::time::Duration::from_millis(ms), waiting)
                .await
            {
                Some(value) => {
                    let text = match &value {
                        Some(v) => format!("{key} changed to {v}"),
                        None => format!("{key} was deleted"),
                    };
                    let mut r = CallToolResult::success(vec![Content::text(text)]);
                    r.structured_content =
                        Some(json!({"key": key, "changed": true, "value": value}));
                    r
                }
                None => {
                    let mut r = CallToolResult::success(vec![Content::text(format!(
                        "{key} did not change within {ms} ms"
                    ))]);
                    r.structured_content = Some(json!({"key": key, "changed": false}));
                    r
                }
            },
        )
    }

    /// `memo_ask`: asks the client for a value (an elicitation, through the task's
    /// `input_required`), then sets the note to it.
    async fn memo_ask(&self, args: &JsonObject, call: Call) -> Result<CallToolResult, SourceError> {
        check_args(args, &["key", "message"])?;
        let key = key_arg(args)?;
        Self::check_key(&key)?;
        let message = match args.get("message") {
            None => format!("A value for note {key}"),
            Some(Value::String(m)) => m.clone(),
            Some(_) => {
                return Err(SourceError::InvalidParams(
                    "message must be a string".into(),
                ));
            }
        };
        let Some(task) = call.task else {
            return Err(SourceError::InvalidParams(
                "memo_ask asks the client for input, so it runs only as a task: call it with the tasks extension declared (io.modelcontextprotocol/tasks)".into(),
            ));
        };
        let request: rmcp::model::InputRequest = serde_json::from_value(json!({
            "method": "elicitation/create",
            "params": {
                "mode": "form",
                "message": message,
                "requestedSchema": {
                    "type": "object",
                    "properties": {"value": {"type": "string", "description": format!("the new value of {key}")}},
                    "required": ["value"]
                }
            }
        }))
        .map_err(|e| SourceError::Unavailable(format!("cannot build the input request: {e}")))?;
        let input_key = format!("value-of-{key}");
        let answers = task
            .ask([(input_key.clone(), request)].into_iter().collect())
            .await?;
        let answer = answers.get(&input_key).cloned().unwrap_or_default();
        match answer.get("action").and_then(Value::as_str) {
            Some("accept") => {}
            other => {
                let mut r = CallToolResult::success(vec![Content::text(format!(
                    "{key} left as it was: the input was {}",
                    other.unwrap_or("not given")
                ))]);
                r.structured_content = Some(json!({"key": key, "changed": false}));
                return Ok(r);
            }
        }
        let value = answer
            .get("content")
            .and_then(|c| c.get("value"))
            .cloned()
            .ok_or_else(|| {
                SourceError::InvalidParams("the accepted input has no content.value".into())
            })?;
        let changed = self.set(&key, value.clone()).await?;
        let mut r = CallToolResult::success(vec![Content::text(format!("set {key} to {value}"))]);
        r.structured_content = Some(json!({"key": key, "changed": changed, "value": value}));
        Ok(r)
    }
}

fn key_arg(args: &JsonObject) -> Result<String, SourceError> {
    match args.get("key") {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other) => Err(SourceError::InvalidParams(format!(
            "key must be a string, got {other}"
        ))),
        None => Err(SourceError::InvalidParams(
            "missing argument key; call with key=\"name\"".into(),
        )),
    }
}

#[async_trait]
impl Source for Memo {
    fn info(&self) -> SourceInfo {
        SourceInfo {
            name: "memo".into(),
            instructions: Some(
                "Notes as a JSON object. Watch memo://notes (state) or memo://log (event log); change them with memo_set and memo_delete.".into(),
            ),
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

    async fn read(&self, _caller: &Caller, uri: &str) -> Result<Contents, SourceError> {
        match uri {
            NOTES_URI => Ok(Contents::json(&self.snapshot())),
            LOG_URI => Ok(Contents::event_log(&self.log)),
            _ => Err(SourceError::NotFound { uri: uri.into() }),
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

    fn tools(&self, _caller: &Caller) -> Vec<Tool> {
        vec![
            Tool::new(
                "memo_set",
                "Set note `key` to `value` (any JSON value). Watchers of memo://notes and memo://log are notified.",
                schema(json!({
                    "type": "object",
                    "properties": {
                        "key": {"type": "string", "description": "note name"},
                        "value": {"description": "any JSON value"}
                    },
                    "required": ["key", "value"],
                    "additionalProperties": false
                })),
            )
            .with_annotations(
                ToolAnnotations::with_title("Set a note")
                    .read_only(false)
                    .destructive(false)
                    .idempotent(true)
                    .open_world(false),
            ),
            Tool::new(
                "memo_delete",
                "Delete note `key`. Watchers of memo://notes and memo://log are notified.",
                schema(json!({
                    "type": "object",
                    "properties": {"key": {"type": "string", "description": "note name"}},
                    "required": ["key"],
                    "additionalProperties": false
                })),
            )
            .with_annotations(
                ToolAnnotations::with_title("Delete a note")
                    .read_only(false)
                    .destructive(true)
                    .idempotent(true)
                    .open_world(false),
            ),
            tasks::optional(
                Tool::new(
                    "memo_wait",
                    "Wait until note `key` next changes (set to another value or deleted), at most `timeout_ms` (default 60000). May run as a task.",
                    schema(json!({
                        "type": "object",
                        "properties": {
                            "key": {"type": "string", "description": "note name"},
                            "timeout_ms": {"type": "integer", "minimum": 1, "maximum": WAIT_MAX_MS, "description": "longest wait, ms"}
                        },
                        "required": ["key"],
                        "additionalProperties": false
                    })),
                )
                .with_annotations(
                    ToolAnnotations::with_title("Wait for a note to change")
                        .read_only(true)
                        .open_world(false),
                ),
            ),
            tasks::required(
                Tool::new(
                    "memo_ask",
                    "Ask the client for a value of note `key` (an elicitation with `message`, answered with tasks/update), then set the note. Runs only as a task.",
                    schema(json!({
                        "type": "object",
                        "properties": {
                            "key": {"type": "string", "description": "note name"},
                            "message": {"type": "string", "description": "what to ask"}
                        },
                        "required": ["key"],
                        "additionalProperties": false
                    })),
                )
                .with_annotations(
                    ToolAnnotations::with_title("Ask for a note's value")
                        .read_only(false)
                        .destructive(false)
                        .open_world(false),
                ),
            ),
        ]
    }

    async fn call_tool(
        &self,
        _caller: &Caller,
        name: &str,
        args: JsonObject,
        call: Call,
    ) -> Result<CallToolResult, SourceError> {
        match name {
            "memo_set" => {
                check_args(&args, &["key", "value"])?;
                let key = key_arg(&args)?;
                let value = args.get("value").cloned().ok_or_else(|| {
                    SourceError::InvalidParams(
                        "missing argument value; call with value=<any JSON>".into(),
                    )
                })?;
                let changed = self.set(&key, value).await?;
                let text = if changed {
                    format!("set {key}")
                } else {
                    format!("{key} unchanged")
                };
                let mut r = CallToolResult::success(vec![Content::text(text)]);
                r.structured_content = Some(json!({"key": key, "changed": changed}));
                Ok(r)
            }
            "memo_delete" => {
                check_args(&args, &["key"])?;
                let key = key_arg(&args)?;
                let existed = self.delete(&key).await?;
                let text = if existed {
                    format!("deleted {key}")
                } else {
                    format!("{key} did not exist")
                };
                let mut r = CallToolResult::success(vec![Content::text(text)]);
                r.structured_content = Some(json!({"key": key, "deleted": existed}));
                Ok(r)
            }
            "memo_wait" => self.memo_wait(&args, call.task.as_ref()).await,
            "memo_ask" => self.memo_ask(&args, call).await,
            other => Err(SourceError::UnknownTool(other.to_owned())),
        }
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
mod tests {
    use super::*;

    async fn memo() -> Memo {
        Memo::open(Store::memory(), 16).await.unwrap()
    }

    fn read_json(c: Contents) -> Value {
        match c.body {
            crate::mcp::source::Body::Text(t) => serde_json::from_str(&t).unwrap(),
            _ => panic!("expected text"),
        }
    }

    #[tokio::test]
    async fn set_modify_delete_are_logged_with_old() {
        let m = memo().await;
        let r = m.changes().register(&[NOTES_URI.into(), LOG_URI.into()]);
        assert!(m.set("a", json!(1)).await.unwrap());
        assert!(
            !m.set("a", json!(1)).await.unwrap(),
            "same value is not a change"
        );
        assert!(m.set("a", json!({"x": 2})).await.unwrap());
        assert!(m.delete("a").await.unwrap());
        assert!(!m.delete("a").await.unwrap());
        let log = read_json(m.read(&Caller::local(), LOG_URI).await.unwrap());
        let ev = log["events"].as_array().unwrap();
        let types: Vec<&str> = ev.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(types, ["ADDED", "MODIFIED", "DELETED"]);
        assert_eq!(ev[1]["old"], json!(1));
        assert_eq!(ev[1]["object"], json!({"x": 2}));
        assert!(ev[0]["seq"].as_u64() < ev[1]["seq"].as_u64());
        assert_eq!(
            read_json(m.read(&Caller::local(), NOTES_URI).await.unwrap()),
            json!({})
        );
        let batch = r.queue().next_batch().await;
        assert_eq!(batch, vec![NOTES_URI.to_string(), LOG_URI.to_string()]);
    }

    #[tokio::test]
    async fn notes_survive_reopen_on_the_same_store() {
        let store = Store::memory();
        let m = Memo::open(store.clone(), 16).await.unwrap();
        m.set("k", json!("v")).await.unwrap();
        drop(m);
        let m = Memo::open(store, 16).await.unwrap();
        assert_eq!(
            read_json(m.read(&Caller::local(), NOTES_URI).await.unwrap()),
            json!({"k": "v"})
        );
    }

    #[tokio::test]
    async fn bad_arguments_are_clear_errors() {
        let m = memo().await;
        let err = m
            .call_tool(
                &Caller::local(),
                "memo_set",
                schema(json!({"key": "a"})),
                Call::default(),
            )
            .await
            .unwrap_err();
        assert!(err.to_string().contains("missing argument value"), "{err}");
        let err = m
            .call_tool(
                &Caller::local(),
                "memo_set",
                schema(json!({"key": "a", "value": 1, "extra": 2})),
                Call::default(),
            )
            .await
            .unwrap_err();
        assert!(err.to_string().contains("unknown argument extra"), "{err}");
        let err = m
            .call_tool(
                &Caller::local(),
                "memo_set",
                schema(json!({"key": 5, "value": 1})),
                Call::default(),
            )
            .await
            .unwrap_err();
        assert!(err.to_string().contains("key must be a string"), "{err}");
        let err = m.read(&Caller::local(), "memo://nope").await.unwrap_err();
        assert_eq!(
            err,
            SourceError::NotFound {
                uri: "memo://nope".into()
            }
        );
    }

    #[tokio::test]
    async fn memo_changes_are_polled_from_the_log() {
        let m = memo().await;
        assert!(m.events_advertised(&Caller::local()).await);
        let list = m.events_list(&Caller::local()).await.unwrap();
        assert_eq!(list[0]["name"], CHANGED_EVENT);
        assert_eq!(list[0]["inputSchema"]["additionalProperties"], false);
        let first = m
            .events_poll(
                &Caller::local(),
                schema(json!({"name": CHANGED_EVENT, "cursor": null})),
            )
            .await
            .unwrap();
        assert_eq!(first["events"], json!([]));
        m.set("a", json!(1)).await.unwrap();
        let next = m
            .events_poll(
                &Caller::local(),
                schema(json!({"name": CHANGED_EVENT, "cursor": first["cursor"]})),
            )
            .await
            .unwrap();
        assert_eq!(next["events"][0]["data"]["type"], "ADDED");
        assert_eq!(next["events"][0]["data"]["key"], "a");
        let err = m
            .events_poll(
                &Caller::local(),
                schema(json!({"name": CHANGED_EVENT, "arguments": {"key": "a"}})),
            )
            .await
            .unwrap_err();
        assert!(err.to_string().contains("unknown argument key"), "{err}");
        let err = m
            .events_poll(&Caller::local(), schema(json!({"name": "memo.deleted"})))
            .await
            .unwrap_err();
        assert!(matches!(err, SourceError::EventNotFound(_)), "{err}");
    }

    #[tokio::test]
    async fn descriptions_end_with_a_code_mode_example() {
        let m = memo().await;
        for r in m.resources(&Caller::local()) {
            let d = r.description.unwrap();
            let last = d.lines().last().unwrap();
            assert!(last.starts_with("Example: await watch_start("), "{last}");
            assert!(last.contains(&format!("uri=\"{}\"", r.uri)));
        }
    }
}
