//! The session log: one JSONL file per agent session, a record per line (`ts`, `type`, and
//! the record's fields): `user` (what was said), `monitor` (a watch notice: `task_id`
//! `watch-<name>`, `description` `watch <name> <uri>`, the block as `text`; never a `user`
//! record), `assistant` (text and tool calls), `tool_result`, `reply`, `reply.suppressed`,
//! `model.error`, `run.*`. [`SessionLog::thread`] reads a log back into the thread a resumed
//! session continues.

use crate::sync::Recover;
use std::io::Write as _;
use std::path::Path;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use crate::agent::model::{Message, ToolCall, notice_message};

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
        // Conversations and tool output: for its owner only.
        let file = {
            use std::os::unix::fs::OpenOptionsExt as _;
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o600)
                .open(path)?
        };
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
        let mut f = file.locked();
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
        Ok((repair(out), n))
    }
}

/// A thread the chat API accepts: each assistant message's tool calls followed at once by
/// their results (a call a crash left unanswered answered as lost; a message that came
/// between them moved after), and no result without its call.
pub fn repair(thread: Vec<Message>) -> Vec<Message> {
    use crate::agent::model::Role;
    let mut out: Vec<Message> = Vec::with_capacity(thread.len());
    let mut i = 0;
    while i < thread.len() {
        let m = thread[i].clone();
        i += 1;
        if m.role == Role::Tool {
            // A result whose call is not right before it: dropped.
            continue;
        }
        if m.tool_calls.is_empty() {
            out.push(m);
            continue;
        }
        // The results up to the next assistant message, and what else came meanwhile.
        let mut results = Vec::new();
        let mut others = Vec::new();
        while i < thread.len() && thread[i].role != Role::Assistant {
            let n = thread[i].clone();
            i += 1;
            if n.role == Role::Tool {
                results.push(n);
            } else {
                others.push(n);
            }
        }
        let calls = m.tool_calls.clone();
        out.push(m);
        for c in &calls {
            match results
                .iter()
                .position(|r| r.tool_call_id.as_deref() == Some(c.id.as_str()))
            {
                Some(p) => out.push(results.remove(p)),
                None => out.push(Message::tool(
                    c.id.clone(),
                    "error: the session ended before this call finished",
                )),
            }
        }
        out.extend(others);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::model::{Role, ToolCall};

    #[test]
    fn a_thread_cut_mid_run_is_repaired_for_the_chat_api() {
        let call = |id: &str| ToolCall::new(id, "run_code", "{}");
        let thread = vec![
            Message::user("a"),
            Message::assistant("", vec![call("c1"), call("c2")]),
            Message::user("a notice that came meanwhile"),
            Message::tool("c1", "one"),
            Message::tool("zz", "an orphan"),
            Message::assistant("", vec![call("c3")]),
        ];
        let r = repair(thread);
        let shape: Vec<(Role, Option<&str>)> = r
            .iter()
            .map(|m| (m.role, m.tool_call_id.as_deref()))
            .collect();
        assert_eq!(
            shape,
            [
                (Role::User, None),
                (Role::Assistant, None),
                (Role::Tool, Some("c1")),
                (Role::Tool, Some("c2")),
                (Role::User, None),
                (Role::Assistant, None),
                (Role::Tool, Some("c3")),
            ]
        );
        assert!(r[3].content.as_deref().unwrap().contains("ended before"));
    }
}
