//! The watch client's NDJSON event log: `watch.started`, `watch.subscribed`, `watch.event`,
//! `watch.notice`, `watch.resubscribing`, `watch.failed`, `watch.stopped`, `watch.restored`.
//! `watch.notice` is always written; the rest only when verbose.

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
    pub fn emit(&self, event: &str, fields: Value) {
        if event != "watch.notice" && !self.verbose {
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
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
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

    #[test]
    fn notice_always_the_rest_when_verbose() {
        let buf = Buf::default();
        let quiet = WatchLog::to_writer(false, Box::new(buf.clone()));
        quiet.emit("watch.started", serde_json::json!({"watch": "a"}));
        quiet.emit("watch.notice", serde_json::json!({"watch": "a"}));
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text.lines().count(), 1);
        let v: Value = serde_json::from_str(text.trim()).unwrap();
        assert_eq!(v["event"], "watch.notice");
        assert_eq!(v["watch"], "a");
        let buf = Buf::default();
        let loud = WatchLog::to_writer(true, Box::new(buf.clone()));
        loud.emit("watch.started", serde_json::json!({}));
        assert_eq!(
            String::from_utf8(buf.0.lock().unwrap().clone())
                .unwrap()
                .lines()
                .count(),
            1
        );
    }
}
