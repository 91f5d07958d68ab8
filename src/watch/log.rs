//! The watch client's NDJSON event log: `watch.started`, `watch.subscribed`, `watch.event`,
//! `watch.notice`, `watch.resubscribing`, `watch.failed`, `watch.stopped`, `watch.restored`.
//! Written only when verbose (`-v`): the notices themselves go to the sink, so a notice on
//! stdout is not said again on stderr.

use crate::sync::Recover;
use std::io::Write;
use std::sync::{Arc, Mutex};

use serde_json::{Map, Value};

/// Where the log goes. Cheap to clone.
#[derive(Clone)]
pub struct WatchLog {
    verbose: bool,
    out: Arc<Mutex<Box<dyn Write + Send>>>,
}

impl WatchLog {
    /// A log on stderr.
    pub fn stderr(verbose: bool) -> WatchLog {
        WatchLog::to_writer(verbose, Box::new(std::io::stderr()))
    }

    pub fn to_writer(verbose: bool, w: Box<dyn Write + Send>) -> WatchLog {
        WatchLog {
            verbose,
            out: Arc::new(Mutex::new(w)),
        }
    }

    /// A log that writes nothing (tests, embedding).
    pub fn silent() -> WatchLog {
        WatchLog::to_writer(false, Box::new(std::io::sink()))
    }

    /// Writes `event` with `fields` (a JSON object) as one line.
    /// [`emit`](Self::emit) with the fields made only when they are written (for what runs
    /// once per event).
    pub fn emit_with(&self, event: &str, fields: impl FnOnce() -> Value) {
        if self.verbose {
            self.emit(event, fields());
        }
    }

    pub fn emit(&self, event: &str, fields: Value) {
        if !self.verbose {
            return;
        }
        let mut line = Map::new();
        line.insert(
            "ts".into(),
            Value::from(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs_f64())
                    .unwrap_or(0.0),
            ),
        );
        line.insert("event".into(), event.into());
        if let Value::Object(f) = fields {
            line.extend(f);
        }
        let mut text = Value::Object(line).to_string();
        text.push('\n');
        let mut out = self.out.locked();
        let _ = out.write_all(text.as_bytes());
        let _ = out.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);
    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// The demo used to print every notice twice: on stdout, and as `watch.notice` here.
    #[test]
    fn nothing_without_verbose_every_event_with_it() {
        let buf = Buf::default();
        let quiet = WatchLog::to_writer(false, Box::new(buf.clone()));
        quiet.emit("watch.started", serde_json::json!({"watch": "a"}));
        quiet.emit("watch.notice", serde_json::json!({"watch": "a"}));
        assert!(buf.0.lock().unwrap().is_empty());
        let buf = Buf::default();
        let loud = WatchLog::to_writer(true, Box::new(buf.clone()));
        loud.emit("watch.started", serde_json::json!({}));
        loud.emit("watch.notice", serde_json::json!({"watch": "a"}));
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[1]["event"], "watch.notice");
        assert_eq!(lines[1]["watch"], "a");
    }
}
