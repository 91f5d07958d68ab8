//! Process-wide counters and gauges, served as Prometheus text at `/metrics` on every HTTP
//! endpoint; the admin address's `/metrics` adds gauges from the status board
//! ([`render_status`]).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::mcp::status::StatusReport;

/// `events/list` calls that failed after the upstream's handshake advertised events (a fault
/// the gateway reports; reference 002's `mcp.events_list_failed`).
pub static EVENTS_LIST_FAILED: AtomicU64 = AtomicU64::new(0);

/// TCP connections the HTTP endpoints of this process accepted (a client that pools its
/// connections opens few; one per request is a client without keep-alive).
pub static HTTP_CONNECTIONS_ACCEPTED: AtomicU64 = AtomicU64::new(0);

/// QUIC connections the QUIC endpoints of this process accepted.
pub static QUIC_CONNECTIONS_ACCEPTED: AtomicU64 = AtomicU64::new(0);

/// Times an HTTP endpoint of this process reached `--max-connections` and stopped accepting
/// (once per episode, as the log says it).
pub static HTTP_CONNECTION_LIMIT_REACHED: AtomicU64 = AtomicU64::new(0);

/// Times a QUIC endpoint of this process reached `--max-connections` and stopped accepting.
pub static QUIC_CONNECTION_LIMIT_REACHED: AtomicU64 = AtomicU64::new(0);

/// TCP connections open on this process's HTTP endpoints.
pub static HTTP_CONNECTIONS_OPEN: AtomicU64 = AtomicU64::new(0);

/// QUIC connections open on this process's QUIC endpoints.
pub static QUIC_CONNECTIONS_OPEN: AtomicU64 = AtomicU64::new(0);

/// Connections (first and every reconnect) to a NATS backend this process made.
pub static NATS_CONNECTS: AtomicU64 = AtomicU64::new(0);

/// Times a NATS backend connection of this process was lost.
pub static NATS_DISCONNECTS: AtomicU64 = AtomicU64::new(0);

/// Messages published to a NATS JetStream stream and acknowledged (the Slack feed).
pub static NATS_PUBLISHES: AtomicU64 = AtomicU64::new(0);

/// Their publish-to-acknowledgement time in all, in microseconds (with [`NATS_PUBLISHES`],
/// the mean: a Prometheus summary's `_sum` and `_count`).
pub static NATS_PUBLISH_MICROS: AtomicU64 = AtomicU64::new(0);

/// Publishes to a NATS JetStream stream that failed (retried, or the lease was lost).
pub static NATS_PUBLISH_FAILURES: AtomicU64 = AtomicU64::new(0);

/// Event-log events not published to NATS (the tap's queue was full, or NATS refused them).
pub static EVENTS_PUBLISH_DROPPED: AtomicU64 = AtomicU64::new(0);

/// 1 while this process holds the Slack socket lease (`herald slack --backend nats://…`).
pub static SLACK_LEASE_HELD: AtomicU64 = AtomicU64::new(0);

/// Times this process took the Slack socket lease.
pub static SLACK_LEASE_ACQUIRED: AtomicU64 = AtomicU64::new(0);

/// Times this process lost the lease (taken over, a write refused, NATS out of reach too long).
pub static SLACK_LEASE_LOST: AtomicU64 = AtomicU64::new(0);

/// The counters, name and help text.
static COUNTERS: &[(&str, &str, &AtomicU64)] = &[
    (
        "herald_events_list_failed_total",
        "events/list calls that failed after the handshake advertised events",
        &EVENTS_LIST_FAILED,
    ),
    (
        "herald_http_connections_accepted_total",
        "TCP connections accepted by this process's HTTP endpoints",
        &HTTP_CONNECTIONS_ACCEPTED,
    ),
    (
        "herald_quic_connections_accepted_total",
        "QUIC connections accepted by this process's QUIC endpoints",
        &QUIC_CONNECTIONS_ACCEPTED,
    ),
    (
        "herald_http_connection_limit_reached_total",
        "times an HTTP endpoint reached --max-connections and stopped accepting",
        &HTTP_CONNECTION_LIMIT_REACHED,
    ),
    (
        "herald_quic_connection_limit_reached_total",
        "times a QUIC endpoint reached --max-connections and stopped accepting",
        &QUIC_CONNECTION_LIMIT_REACHED,
    ),
    (
        "herald_nats_connects_total",
        "connections to a NATS backend made (the first and every reconnect)",
        &NATS_CONNECTS,
    ),
    (
        "herald_nats_disconnects_total",
        "times a NATS backend connection was lost",
        &NATS_DISCONNECTS,
    ),
    (
        "herald_nats_publish_failures_total",
        "JetStream publishes that failed (retried, or the lease was lost)",
        &NATS_PUBLISH_FAILURES,
    ),
    (
        "herald_events_publish_dropped_total",
        "event-log events not published to NATS (--publish-events): the queue was full, or NATS refused them",
        &EVENTS_PUBLISH_DROPPED,
    ),
    (
        "herald_slack_lease_acquired_total",
        "times this process took the Slack socket lease",
        &SLACK_LEASE_ACQUIRED,
    ),
    (
        "herald_slack_lease_lost_total",
        "times this process lost the Slack socket lease",
        &SLACK_LEASE_LOST,
    ),
];

/// The process-wide gauges, name and help text.
static GAUGES: &[(&str, &str, &AtomicU64)] = &[
    (
        "herald_http_connections_open",
        "TCP connections open on this process's HTTP endpoints",
        &HTTP_CONNECTIONS_OPEN,
    ),
    (
        "herald_quic_connections_open",
        "QUIC connections open on this process's QUIC endpoints",
        &QUIC_CONNECTIONS_OPEN,
    ),
    (
        "herald_slack_lease_held",
        "1 while this process holds the Slack socket lease (herald slack --backend nats://…)",
        &SLACK_LEASE_HELD,
    ),
];

/// The counters and gauges in the Prometheus text exposition format.
pub fn render() -> String {
    let mut out = String::new();
    let kinds = [("counter", COUNTERS), ("gauge", GAUGES)];
    for (kind, metrics) in kinds {
        for (name, help, value) in metrics {
            let _ = write!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {}\n",
                value.load(Ordering::Relaxed)
            );
        }
    }
    let name = "herald_nats_publish_seconds";
    let _ = write!(
        out,
        "# HELP {name} time from a JetStream publish to its acknowledgement\n# TYPE {name} summary\n{name}_sum {:.6}\n{name}_count {}\n",
        NATS_PUBLISH_MICROS.load(Ordering::Relaxed) as f64 / 1e6,
        NATS_PUBLISHES.load(Ordering::Relaxed)
    );
    out
}

/// Gauges from a status report: readiness, listen streams by role, upstream connections,
/// watches, the store's size.
pub fn render_status(report: &StatusReport) -> String {
    let mut out = String::new();
    let mut gauge = |name: &str, help: &str, rows: Vec<(String, u64)>| {
        let _ = write!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n");
        for (labels, value) in rows {
            let _ = writeln!(out, "{name}{labels} {value}");
        }
    };
    gauge(
        "herald_ready",
        "1 when every role started and every configured upstream connected once",
        vec![(String::new(), report.ready.into())],
    );
    gauge(
        "herald_listen_streams",
        "open subscriptions/listen streams, by role",
        report
            .roles
            .iter()
            .map(|r| (label("role", &r.name), r.listens as u64))
            .collect(),
    );
    gauge(
        "herald_upstream_connected",
        "1 while the upstream server is connected",
        report
            .upstreams
            .iter()
            .map(|u| (label("upstream", &u.name), u.connected.into()))
            .collect(),
    );
    gauge(
        "herald_backend_connected",
        "1 while the role's NATS backend connection is up",
        report
            .backends
            .iter()
            .map(|b| (label("backend", &b.name), b.connected.into()))
            .collect(),
    );
    gauge(
        "herald_watches",
        "watches of the watch client, and how many of them failed",
        vec![
            (
                label("state", "running"),
                report.watches.iter().filter(|w| !w.failed).count() as u64,
            ),
            (
                label("state", "failed"),
                report.watches.iter().filter(|w| w.failed).count() as u64,
            ),
        ],
    );
    if let Some(bytes) = report.store.bytes {
        gauge(
            "herald_store_bytes",
            "size of the store file",
            vec![(String::new(), bytes)],
        );
    }
    out
}

/// `{key="value"}` with the value escaped as the exposition format wants.
fn label(key: &str, value: &str) -> String {
    let v = value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n");
    format!("{{{key}=\"{v}\"}}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(
            label("upstream", "a\"b\\c\nd"),
            r#"{upstream="a\"b\\c\nd"}"#
        );
    }
}
