//! The session log: one JSONL file per agent session, a record per line (`ts`, `type`, and
//! the record's fields): `user` (what was said), `monitor` (a watch notice: `task_id`
//! `watch-<name>`, `description` `watch <name> <uri>`, the block as `text`; never a `user`
//! record), `assistant` (text and tool calls), `tool_result`, `reply`, `reply.suppressed`,
//! `model.error`, `run.*`. [`SessionLog::thread`] reads a log back into the thread a resumed
//! session continues.

use std::io::Write as _;
use std::path::Path;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use crate::agent::model::{Message, ToolCall};
use crate::agent::runtime::notice_message;

/// Appends records to a session file; cheap to clone. A log without a file records nothing.
#[derive(Clone, Default)]
pub struct SessionLog {
    file: Option<Arc<Mutex<std::fs::File>>>,
}

impl SessionLog {
    /// Appends to `path` (made if missing).
    pub fn open(path: &Path) -> std::io::Result<SessionLog> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        Ok(SessionLog {
            file: Some(Arc::new(Mutex::new(file))),
        })
    }

    /// A log that keeps nothing.
    pub fn none() -> SessionLog {
        SessionLog::default()
    }

    /// Appends one record. A write that fails is logged, never fatal.
    pub fn record(&self, kind: &str, fields: Value) {
        let Some(file) = &self.file else { return };
        let ts = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let mut rec = json!({"ts": ts, "type": kind});
        if let (Some(r), Value::Object(f)) = (rec.as_object_mut(), fields) {
            r.extend(f);
        }
        let mut line = rec.to_string();
        line.push('\n');
        let mut f = file.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = f.write_all(line.as_bytes()) {
            tracing::warn!(error = %e, "cannot write the session log");
        }
    }

    /// The thread a session's log records (its messages, without the system prompt), and how
    /// many records it had.
    pub fn thread(path: &Path) -> std::io::Result<(Vec<Message>, usize)> {
        let text = std::fs::read_to_string(path)?;
        let mut out = Vec::new();
        let mut n = 0;
        for line in text.lines() {
            let Ok(r) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            n += 1;
            let s = |k: &str| r[k].as_str().unwrap_or("").to_owned();
            match r["type"].as_str() {
                Some("user") => out.push(Message::user(s("text"))),
                Some("monitor") => out.push(Message::user(notice_message(&s("text")))),
                Some("assistant") => {
                    let calls: Vec<ToolCall> =
                        serde_json::from_value(r["tool_calls"].clone()).unwrap_or_default();
                    out.push(Message::assistant(s("text"), calls));
                }
                Some("tool_result") => out.push(Message::tool(s("id"), s("text"))),
                _ => {}
            }
        }
        // A log cut in the middle of a run may end with tool calls nobody answered: the
        // chat API refuses such a thread, so those calls are answered as lost.
        if let Some(last) = out.last().cloned()
            && !last.tool_calls.is_empty()
        {
            for c in &last.tool_calls {
                out.push(Message::tool(
                    c.id.clone(),
                    "error: the session ended before this call finished",
                ));
            }
        }
        Ok((out, n))
    }
}
