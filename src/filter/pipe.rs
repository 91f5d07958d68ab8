//! The filter pipe: every message between herald's filter pool ([`pool`](super::pool), the
//! parent) and a `herald filter-worker` child ([`worker`](super::worker)), defined once here
//! and used by both ends, so neither reads or writes a message by field names of its own.
//!
//! The framing is NDJSON: one message per line (JSON escapes every newline inside a string),
//! each an object tagged by `"op"`. The exchange is strictly one request at a time:
//!
//! 1. herald sends [`ToWorker::Run`] (or [`ToWorker::Drop`], which has no answer);
//! 2. the worker runs the events in order; before each event after the first it sends
//!    [`FromWorker::Tick`], and for each catalog function the code calls it sends
//!    [`FromWorker::Call`] and blocks until herald's [`ToWorker::Reply`];
//! 3. the worker ends the run with [`FromWorker::Done`], one result per event.
//!
//! Both ends are the same binary, so the format needs no versioning. herald trusts none of what
//! the worker says (it runs user code): a line that does not parse as a [`FromWorker`] is
//! [`Garbled`], and the pool replaces a worker that sends one.

use std::io::Write;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::filter::engine::{HostError, Outcome, PyError};

/// What herald sends a worker.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum ToWorker {
    /// Runs `code` in the scope named `scope` once per event of `events`, in order. Each event
    /// is bound as the global `event` (a `null` event binds nothing: code mode) and gets its own
    /// limits: `time_ms` of interpreter time and at most `max_calls` calls to `functions`, the
    /// names the code may call (answered by herald). The scope is created on first use and
    /// started afresh after 10,000 runs; its variables persist in between.
    Run {
        /// Names this run in the worker's answers; herald numbers its runs.
        id: u64,
        scope: String,
        code: String,
        functions: Vec<String>,
        time_ms: u64,
        max_calls: usize,
        events: Vec<Value>,
    },
    /// Answers the worker's [`FromWorker::Call`] number `call` of run `id`: the function's
    /// value, or the Python exception to raise in the caller.
    Reply {
        id: u64,
        call: u64,
        answer: Result<Value, HostError>,
    },
    /// Forgets a scope's variables. Not answered.
    Drop { scope: String },
}

/// What a worker sends herald, always about the run herald is waiting for.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum FromWorker {
    /// The code of run `id` called a catalog function. `call` counts from 1 within the run;
    /// the worker waits for the [`ToWorker::Reply`] with the same `id` and `call`. herald
    /// answers at most `max_calls` per event and gives each call 10 s.
    Call {
        id: u64,
        call: u64,
        name: String,
        args: Vec<Value>,
        kwargs: Map<String, Value>,
    },
    /// Event number `next` (counting from 0; never the first) of run `id` starts: herald gives
    /// it a fresh deadline and call budget, so its deadline covers one event, not the batch.
    Tick { id: u64, next: usize },
    /// Run `id` is over: one result per event, in order. An `Err` is the Python exception that
    /// escaped the code.
    Done {
        id: u64,
        results: Vec<Result<Outcome, PyError>>,
    },
}

impl FromWorker {
    /// The run this message is about.
    pub fn id(&self) -> u64 {
        match self {
            FromWorker::Call { id, .. }
            | FromWorker::Tick { id, .. }
            | FromWorker::Done { id, .. } => *id,
        }
    }
}

/// A line that is not a message of the kind expected.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Garbled(#[from] serde_json::Error);

/// A message on the pipe: one line of JSON.
pub trait Message: Serialize + DeserializeOwned {
    /// Writes the message as one line and flushes it. One `write_all` of the whole line, so
    /// an unbuffered pipe gets it in one system call.
    fn write_to<W: Write + ?Sized>(&self, w: &mut W) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(self)?;
        line.push(b'\n');
        w.write_all(&line)?;
        w.flush()
    }

    /// Reads a message from one line (its newline may be included).
    fn from_line(line: &str) -> Result<Self, Garbled> {
        Ok(serde_json::from_str(line)?)
    }
}

impl Message for ToWorker {}
impl Message for FromWorker {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::filter::engine::PyExc;
    use serde_json::json;

    fn round_trip<M: Message + PartialEq + std::fmt::Debug>(m: M) {
        let mut line = Vec::new();
        m.write_to(&mut line).unwrap();
        let text = String::from_utf8(line).unwrap();
        assert_eq!(
            text.find('\n'),
            Some(text.len() - 1),
            "one message, one line: {text}"
        );
        assert_eq!(M::from_line(&text).unwrap(), m, "{text}");
    }

    fn event() -> Value {
        json!({"type": "ADDED", "text": "two\nlines, \"quoted\", ünïcode", "n": [1, -2, 2.5, u64::MAX],
               "object": {"metadata": {"name": "cm1"}}, "old": null})
    }

    #[test]
    fn every_message_survives_a_round_trip() {
        round_trip(ToWorker::Run {
            id: 7,
            scope: "watch:cm".into(),
            code: "event['type']\n".into(),
            functions: vec!["read_resource".into(), "list_resources".into()],
            time_ms: 2000,
            max_calls: 10,
            events: vec![event(), Value::Null, json!("plain")],
        });
        round_trip(ToWorker::Run {
            id: 0,
            scope: String::new(),
            code: String::new(),
            functions: vec![],
            time_ms: 0,
            max_calls: 0,
            events: vec![],
        });
        round_trip(ToWorker::Reply {
            id: 7,
            call: 1,
            answer: Ok(event()),
        });
        round_trip(ToWorker::Reply {
            id: 7,
            call: 2,
            answer: Ok(Value::Null),
        });
        for kind in PyExc::ALL {
            round_trip(ToWorker::Reply {
                id: 7,
                call: 3,
                answer: Err(HostError::new(kind, format!("{kind} with\na newline"))),
            });
        }
        round_trip(ToWorker::Drop {
            scope: "watch:cm".into(),
        });
        round_trip(FromWorker::Call {
            id: 7,
            call: 1,
            name: "read_resource".into(),
            args: vec![json!("memo://notes"), event()],
            kwargs: json!({"uri": "memo://notes", "deep": {"x": [1]}})
                .as_object()
                .cloned()
                .unwrap(),
        });
        round_trip(FromWorker::Tick { id: 7, next: 1 });
        round_trip(FromWorker::Done {
            id: 7,
            results: vec![
                Ok(Outcome {
                    value: event(),
                    printed: "hi\n".into(),
                    fresh_scope: true,
                }),
                Ok(Outcome {
                    value: Value::Null,
                    printed: String::new(),
                    fresh_scope: false,
                }),
                Err(PyError {
                    exc_type: "NameError".into(),
                    message: "name 'x' is not defined".into(),
                    at: Some(crate::filter::engine::Location {
                        line: 2,
                        column: Some(5),
                        function: Some("f".into()),
                        source: Some("return x".into()),
                        earlier: false,
                    }),
                }),
            ],
        });
        round_trip(FromWorker::Done {
            id: 8,
            results: vec![],
        });
    }

    #[test]
    fn host_errors_travel_under_their_python_names() {
        let mut line = Vec::new();
        ToWorker::Reply {
            id: 1,
            call: 1,
            answer: Err(HostError::new(PyExc::PermissionError, "no")),
        }
        .write_to(&mut line)
        .unwrap();
        let v: Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(
            v,
            json!({"op": "reply", "id": 1, "call": 1,
                   "answer": {"Err": {"kind": "PermissionError", "message": "no"}}})
        );
    }

    #[test]
    fn garbled_lines_from_a_worker_are_refused() {
        for bad in [
            "",
            "\n",
            "not json",
            "[1, 2]",
            "{}",
            r#"{"id": 1}"#,
            r#"{"op": "done", "id": 1"#,
            r#"{"op": "done", "id": 1}"#,
            r#"{"op": "done", "id": 1, "results": [{"Maybe": 1}]}"#,
            r#"{"op": "done", "id": 1, "results": [{"Ok": {"value": 1}}]}"#,
            r#"{"op": "tick", "id": "one", "next": 1}"#,
            r#"{"op": "tick", "id": -1, "next": 1}"#,
            r#"{"op": "call", "id": 1, "call": 1, "name": "f", "args": {}, "kwargs": {}}"#,
            r#"{"op": "run", "id": 1, "scope": "s", "code": "", "functions": [], "time_ms": 1, "max_calls": 1, "events": []}"#,
            r#"{"op": "done", "id": 1, "results": []} trailing"#,
        ] {
            let e = FromWorker::from_line(bad).expect_err(bad);
            assert!(!e.to_string().is_empty(), "{bad}");
        }
        let e = FromWorker::from_line(r#"{"op": "bogus", "id": 1}"#).unwrap_err();
        assert!(e.to_string().contains("unknown variant `bogus`"), "{e}");
    }
}

#[cfg(test)]
#[path = "pipe_fuzz.rs"]
mod fuzz;
