//! The watch client's vocabulary: its limits ([`WatchConfig`]), what a watch is
//! ([`WatchSpec`], saved with `--watch-state`), what `watch_list` shows ([`WatchInfo`]), how a
//! start fails ([`WatchError`]), and what leaves it ([`Notice`]). Plain data, no I/O.

use std::time::Duration;

use crate::runtime::backoff::Backoff;
use crate::upstream::UpstreamError;
use crate::watch::notice::{DebounceConfig, notice_text};

/// The longest wait between two tries of a kept watch (one a config names: see
/// `manager/kept.rs`).
pub const KEEP_TRYING_MAX: Duration = Duration::from_secs(30);

/// Watch client limits and timings. Every field has a default and a flag.
#[derive(Debug, Clone)]
pub struct WatchConfig {
    pub debounce: DebounceConfig,
    /// Watches at once.
    pub max_watches: usize,
    /// Events processed per update; the rest are counted in one line.
    pub max_events_per_update: usize,
    /// First resubscribe delay; doubles each attempt.
    pub resubscribe_base: Duration,
    /// Resubscribe attempts before the watch fails.
    pub resubscribe_attempts: u32,
    /// Largest message accepted from a server.
    pub max_message_bytes: usize,
    /// What a watch that failed for good tells its reader to do.
    pub restart: Restart,
}

/// Who can start a failed watch again, so its notice says what to do (`watch failed: …;` then
/// [`Restart::advice`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Restart {
    /// Code mode and the agent: `watch_start` can be called again.
    #[default]
    WatchStart,
    /// `herald watch`: nothing in the process starts a watch; it exits once none runs.
    HeraldWatch,
    /// `herald up` without the agent: its watches come from its config.
    HeraldUp,
}

impl Restart {
    /// What to do about the failed watch `spec`.
    pub fn advice(self, spec: &WatchSpec) -> String {
        match self {
            Restart::WatchStart => format!(
                "start it again with watch_start(name={}, uri={}{})",
                serde_json::Value::from(spec.name.as_str()),
                serde_json::Value::from(spec.uri.as_str()),
                if spec.on_event.is_some() {
                    ", on_event=…"
                } else {
                    ""
                }
            ),
            Restart::HeraldWatch => {
                "fix what the last error says and run herald watch again (it exits once no watch runs)"
                    .to_owned()
            }
            Restart::HeraldUp => {
                "fix what the last error says and restart herald up to watch it again (everything else in it keeps running)"
                    .to_owned()
            }
        }
    }
}

impl WatchConfig {
    /// The resubscribe delays: `resubscribe_base` doubling per attempt (1, 2, 4, 8, 16 s by
    /// default), uncapped: `resubscribe_attempts` bounds the sequence.
    pub fn resubscribe_backoff(&self) -> Backoff {
        Backoff::new(self.resubscribe_base, Duration::MAX)
    }
}

impl Default for WatchConfig {
    fn default() -> Self {
        WatchConfig {
            debounce: DebounceConfig::default(),
            max_watches: 5,
            max_events_per_update: 100,
            resubscribe_base: Duration::from_secs(1),
            resubscribe_attempts: 5,
            max_message_bytes: 4 * 1024 * 1024,
            restart: Restart::default(),
        }
    }
}

/// A notice: the lines of one debounced batch for one watch.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Notice {
    pub watch: String,
    pub uri: String,
    pub lines: Vec<String>,
    /// The `<watch-event ...>` block.
    pub text: String,
}

impl Notice {
    pub(crate) fn new(watch: &str, uri: &str, lines: Vec<String>) -> Notice {
        Notice {
            text: notice_text(watch, uri, &lines),
            watch: watch.to_owned(),
            uri: uri.to_owned(),
            lines,
        }
    }
}

/// What a watch reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Shape {
    State,
    EventLog,
    /// A task (`task://ID`): its status changes, until it ends.
    Task,
    /// An event type (`events:NAME?arg=value`): its events, pushed.
    Events,
}

/// A saved watch spec (`--watch-state`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct WatchSpec {
    pub name: String,
    pub uri: String,
    /// Python source run once per event (`None`: default notice lines).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_event: Option<String>,
}

/// One row of `watch_list`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct WatchInfo {
    pub name: String,
    pub uri: String,
    pub shape: Option<Shape>,
    pub events: u64,
    pub notices: u64,
    pub restore_failed: bool,
    pub failed: bool,
    /// A configured watch that does not run yet (or lost its source) and keeps trying.
    pub starting: bool,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WatchError {
    /// Bad input that will never work: never retried, dropped from saved state.
    #[error("{0}")]
    Invalid(String),
    /// The server refused the URI (its own error).
    #[error("{server} refused {uri}: {message}")]
    Rejected {
        server: String,
        uri: String,
        message: String,
    },
    /// Could not reach a server now; may work later.
    #[error("{0}")]
    Unavailable(String),
}

impl WatchError {
    /// A connect that failed: it may pass, so it is retried when a watch needs that server.
    /// (Not a `From`: a read's or a listen's failure is judged by `task::watch_error`.) The
    /// watch client's user is the one who named the server: they get the reason.
    pub fn connect_failed(e: UpstreamError) -> WatchError {
        WatchError::Unavailable(e.to_string())
    }

    /// Whether a saved spec failing this way should be kept for a later start.
    pub fn is_transient(&self) -> bool {
        matches!(self, WatchError::Unavailable(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_resubscribe_delays_are_one_to_sixteen_seconds() {
        let cfg = WatchConfig::default();
        let mut b = cfg.resubscribe_backoff();
        let delays: Vec<u64> = (0..cfg.resubscribe_attempts)
            .map(|_| b.next_delay().as_secs())
            .collect();
        assert_eq!(delays, [1, 2, 4, 8, 16]);
    }

    #[test]
    fn only_unavailable_is_transient() {
        assert!(WatchError::Unavailable("down".into()).is_transient());
        assert!(!WatchError::Invalid("bad".into()).is_transient());
        let rejected = WatchError::Rejected {
            server: "s".into(),
            uri: "memo://nope".into(),
            message: "unknown resource".into(),
        };
        assert!(!rejected.is_transient());
        assert_eq!(
            rejected.to_string(),
            "s refused memo://nope: unknown resource"
        );
    }

    #[test]
    fn a_spec_round_trips_and_omits_a_missing_filter() {
        let spec = WatchSpec {
            name: "n".into(),
            uri: "memo://notes".into(),
            on_event: None,
        };
        let text = serde_json::to_string(&spec).unwrap();
        assert_eq!(text, r#"{"name":"n","uri":"memo://notes"}"#);
        assert_eq!(serde_json::from_str::<WatchSpec>(&text).unwrap(), spec);
    }

    #[test]
    fn a_failed_watch_says_what_to_do_where_it_runs() {
        let spec = WatchSpec {
            name: "n".into(),
            uri: "memo://notes".into(),
            on_event: None,
        };
        assert_eq!(
            Restart::WatchStart.advice(&spec),
            r#"start it again with watch_start(name="n", uri="memo://notes")"#
        );
        assert!(
            Restart::HeraldWatch
                .advice(&spec)
                .contains("run herald watch again")
        );
        assert!(
            Restart::HeraldUp
                .advice(&spec)
                .contains("restart herald up")
        );
        let filtered = WatchSpec {
            on_event: Some("event".into()),
            ..spec
        };
        assert!(
            Restart::WatchStart
                .advice(&filtered)
                .ends_with(", on_event=…)")
        );
    }

    #[test]
    fn a_notice_carries_its_block() {
        let n = Notice::new("w", "memo://notes", vec!["ADDED a".into()]);
        assert!(
            n.text.contains("ADDED a") && n.text.contains("memo://notes"),
            "{}",
            n.text
        );
    }
}
