//! Process-wide counters, served as Prometheus text at `/metrics` on every HTTP endpoint.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

/// `events/list` calls that failed after the upstream's handshake advertised events (a fault
/// the gateway reports; reference 002's `mcp.events_list_failed`).
pub static EVENTS_LIST_FAILED: AtomicU64 = AtomicU64::new(0);

/// The counters, name and help text.
static COUNTERS: &[(&str, &str, &AtomicU64)] = &[(
    "herald_events_list_failed_total",
    "events/list calls that failed after the handshake advertised events",
    &EVENTS_LIST_FAILED,
)];

/// The counters in the Prometheus text exposition format.
pub fn render() -> String {
    let mut out = String::new();
    for (name, help, value) in COUNTERS {
        let _ = write!(
            out,
            "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}\n",
            value.load(Ordering::Relaxed)
        );
    }
    out
}
