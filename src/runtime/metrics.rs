//! The metrics registry: each part of herald registers its own counters, gauges and
//! summaries here, with name and help text ([`Metrics::counter`], [`Metrics::gauge`],
//! [`Metrics::summary`]), and keeps the handle it counts with. `/metrics` on every HTTP
//! endpoint renders what is registered ([`Metrics::render`]), in a stable order: counters,
//! then gauges, then summaries, each in the order they were first registered; the admin
//! address's `/metrics` adds gauges from the status board ([`render_status`]).
//!
//! One registry per role context ([`crate::runtime::context::RoleContext::metrics`]), shared
//! by every role of it, so one process renders one set. Registering a name again returns the
//! metric already registered under it, so a part may register whenever it builds; the role
//! runner registers every part's metrics once when it makes the context (`cli`), so every
//! process names the same series in the same order whichever roles it runs. Nothing here
//! names a role.

use crate::sync::RecoverRw;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use crate::runtime::status::{StatusReport, WatchState};

/// A monotonically increasing count. Cheap to clone; clones count together.
#[derive(Debug, Clone, Default)]
pub struct Counter(Arc<AtomicU64>);

impl Counter {
    pub fn inc(&self) {
        self.add(1);
    }

    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A value that goes up and down. Cheap to clone; clones share the value.
#[derive(Debug, Clone, Default)]
pub struct Gauge(Arc<AtomicU64>);

impl Gauge {
    pub fn set(&self, n: u64) {
        self.0.store(n, Ordering::Relaxed);
    }

    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    pub fn sub(&self, n: u64) {
        self.0.fetch_sub(n, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Durations observed, as a Prometheus summary's `_sum` (seconds) and `_count`, kept in
/// microseconds.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    micros: Arc<AtomicU64>,
    count: Arc<AtomicU64>,
}

impl Summary {
    pub fn observe(&self, d: std::time::Duration) {
        self.observe_micros(d.as_micros() as u64);
    }

    pub fn observe_micros(&self, micros: u64) {
        self.count.fetch_add(1, Ordering::Relaxed);
        self.micros.fetch_add(micros, Ordering::Relaxed);
    }
}

#[derive(Debug, Clone)]
enum Value {
    Counter(Counter),
    Gauge(Gauge),
    Summary(Summary),
}

impl Value {
    /// Rendering order of the kinds.
    fn rank(&self) -> u8 {
        match self {
            Value::Counter(_) => 0,
            Value::Gauge(_) => 1,
            Value::Summary(_) => 2,
        }
    }
}

#[derive(Debug)]
struct Entry {
    name: &'static str,
    help: &'static str,
    value: Value,
}

/// The registry. Cheap to clone; clones share what is registered.
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    entries: Arc<RwLock<Vec<Entry>>>,
}

impl Metrics {
    /// The value registered as `name`, or `make()` registered under it.
    fn register(&self, name: &'static str, help: &'static str, make: impl Fn() -> Value) -> Value {
        let mut entries = self.entries.write_locked();
        if let Some(e) = entries.iter().find(|e| e.name == name) {
            return e.value.clone();
        }
        let value = make();
        entries.push(Entry {
            name,
            help,
            value: value.clone(),
        });
        value
    }

    /// The counter `name` (registered with `help` the first time).
    ///
    /// # Panics
    ///
    /// When `name` is registered as another kind: a programming error.
    pub fn counter(&self, name: &'static str, help: &'static str) -> Counter {
        match self.register(name, help, || Value::Counter(Counter::default())) {
            Value::Counter(c) => c,
            other => panic!("metric {name} is registered as {other:?}, not a counter"),
        }
    }

    /// The gauge `name` (registered with `help` the first time).
    ///
    /// # Panics
    ///
    /// When `name` is registered as another kind: a programming error.
    pub fn gauge(&self, name: &'static str, help: &'static str) -> Gauge {
        match self.register(name, help, || Value::Gauge(Gauge::default())) {
            Value::Gauge(g) => g,
            other => panic!("metric {name} is registered as {other:?}, not a gauge"),
        }
    }

    /// The summary `name` (registered with `help` the first time).
    ///
    /// # Panics
    ///
    /// When `name` is registered as another kind: a programming error.
    pub fn summary(&self, name: &'static str, help: &'static str) -> Summary {
        match self.register(name, help, || Value::Summary(Summary::default())) {
            Value::Summary(s) => s,
            other => panic!("metric {name} is registered as {other:?}, not a summary"),
        }
    }

    /// What is registered, in the Prometheus text exposition format: counters, gauges, then
    /// summaries, each in registration order.
    pub fn render(&self) -> String {
        let entries = self.entries.read_locked();
        let mut out = String::new();
        for rank in 0..3 {
            for Entry { name, help, value } in entries.iter().filter(|e| e.value.rank() == rank) {
                let _ = match value {
                    Value::Counter(c) => write!(
                        out,
                        "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}\n",
                        c.get()
                    ),
                    Value::Gauge(g) => write!(
                        out,
                        "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {}\n",
                        g.get()
                    ),
                    Value::Summary(s) => write!(
                        out,
                        "# HELP {name} {help}\n# TYPE {name} summary\n{name}_sum {:.6}\n{name}_count {}\n",
                        s.micros.load(Ordering::Relaxed) as f64 / 1e6,
                        s.count.load(Ordering::Relaxed)
                    ),
                };
            }
        }
        out
    }
}

/// Gauges from a status report: readiness, listen streams by role, upstream connections,
/// watches, the store's size; and the reloads counted.
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
        "watches of the watch client by state (running, starting: configured and still trying, failed)",
        [
            WatchState::Running,
            WatchState::Starting,
            WatchState::Failed,
        ]
        .into_iter()
        .map(|s| {
            let n = report.watches.iter().filter(|w| w.state == s).count();
            (label("state", s.as_str()), n as u64)
        })
        .collect(),
    );
    if let Some(bytes) = report.store.bytes {
        gauge(
            "herald_store_bytes",
            "size of the store file",
            vec![(String::new(), bytes)],
        );
    }
    let _ = write!(
        out,
        "# HELP herald_reload_total config reloads, by result (applied; refused: the running config kept)\n# TYPE herald_reload_total counter\n"
    );
    for (result, n) in [
        ("applied", report.reloads.applied),
        ("refused", report.reloads.refused),
    ] {
        let _ = writeln!(out, "herald_reload_total{} {n}", label("result", result));
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
    fn counters_then_gauges_then_summaries_each_in_registration_order() {
        let m = Metrics::default();
        let a = m.counter("a_total", "a help");
        let g = m.gauge("g", "g help");
        let s = m.summary("s_seconds", "s help");
        let b = m.counter("b_total", "b help");
        a.inc();
        b.add(2);
        g.add(3);
        g.sub(1);
        s.observe_micros(1_500_000);
        assert_eq!(
            m.render(),
            "# HELP a_total a help\n# TYPE a_total counter\na_total 1\n\
             # HELP b_total b help\n# TYPE b_total counter\nb_total 2\n\
             # HELP g g help\n# TYPE g gauge\ng 2\n\
             # HELP s_seconds s help\n# TYPE s_seconds summary\ns_seconds_sum 1.500000\ns_seconds_count 1\n"
        );
    }

    #[test]
    fn registering_a_name_again_gives_the_same_metric() {
        let m = Metrics::default();
        m.counter("a_total", "a help").inc();
        m.counter("a_total", "a help").inc();
        assert_eq!(m.counter("a_total", "a help").get(), 2);
        assert_eq!(m.render().matches("# TYPE a_total").count(), 1);
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(
            label("upstream", "a\"b\\c\nd"),
            r#"{upstream="a\"b\\c\nd"}"#
        );
    }
}
