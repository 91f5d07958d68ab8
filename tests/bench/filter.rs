//! Filter cost per event for reference 000's example filter: Monty in-process alone vs through a
//! `herald filter-worker` process (the pool, the pipe, the JSON both ways). The ratio and the
//! absolute µs per event are the figures; target under 100 µs per event through the worker.
//!
//! `cargo bench --bench filter` (HERALD_BENCH_N overrides the 10,000 events). For scale, the
//! machine's own floor for one pipe round trip between two processes is printed by
//! `perf bench sched pipe` (about 180 µs on the 2-core development VM).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use herald::filter::engine::{Host, HostError, PyExc, RunLimits, Scope};
use herald::filter::pool::{Catalog, FilterPool, PoolConfig};
use serde_json::{Map, Value, json};

const FILTER: &str = r#"
m = event["object"]["metadata"]
f'{event["type"].lower()} {m["namespace"]}/{m["name"]}' if event["type"] in ("ADDED", "DELETED") else None
"#;

struct NoHost;
impl Host for NoHost {
    fn provides(&self, _: &str) -> bool {
        false
    }
    fn call(&mut self, _: &str, _: Vec<Value>, _: Map<String, Value>) -> Result<Value, HostError> {
        unreachable!()
    }
}

struct NoCatalog;
#[async_trait]
impl Catalog for NoCatalog {
    fn functions(&self) -> Vec<String> {
        Vec::new()
    }
    async fn call(
        &self,
        _: &str,
        _: Vec<Value>,
        _: Map<String, Value>,
    ) -> Result<Value, HostError> {
        Err(HostError::new(PyExc::RuntimeError, "none"))
    }
}

fn event(i: usize) -> Value {
    let kind = if i.is_multiple_of(2) {
        "ADDED"
    } else {
        "MODIFIED"
    };
    json!({"type": kind, "seq": i, "watch": "cm", "uri": "kcp-events://watch/root:app/configmaps?namespace=*",
           "object": {"metadata": {"name": format!("cm-{i}"), "namespace": "default", "uid": format!("u{i}")},
                      "data": {"a": "b"}}, "old": null})
}

#[tokio::main]
async fn main() {
    let n: usize = std::env::var("HERALD_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);

    let mut scope = Scope::new();
    for i in 0..100 {
        scope
            .run(
                FILTER,
                vec![("event".into(), event(i))],
                RunLimits::default(),
                &mut NoHost,
            )
            .unwrap();
    }
    let t = Instant::now();
    for i in 0..n {
        let o = scope
            .run(
                FILTER,
                vec![("event".into(), event(i))],
                RunLimits::default(),
                &mut NoHost,
            )
            .unwrap();
        debug_assert!(o.value.is_null() || o.value.is_string());
    }
    let inproc = t.elapsed().as_secs_f64() * 1e6 / n as f64;

    let exe = PathBuf::from(env!("CARGO_BIN_EXE_herald"));
    let pool = FilterPool::new(PoolConfig::new(exe));
    let catalog: Arc<dyn Catalog> = Arc::new(NoCatalog);
    for i in 0..100 {
        pool.run("cm", FILTER, event(i), catalog.clone())
            .await
            .unwrap();
    }
    let t = Instant::now();
    for i in 0..n {
        let o = pool
            .run("cm", FILTER, event(i), catalog.clone())
            .await
            .unwrap();
        if i.is_multiple_of(2) {
            assert_eq!(o.value, json!(format!("added default/cm-{i}")));
        }
    }
    let worker = t.elapsed().as_secs_f64() * 1e6 / n as f64;
    // A burst: one update carrying 100 events goes to the worker in one exchange.
    let t = Instant::now();
    let mut done = 0;
    while done < n {
        let batch: Vec<Value> = (done..(done + 100).min(n)).map(event).collect();
        let k = batch.len();
        let results = pool
            .run_batch("cm", FILTER, batch, catalog.clone())
            .await
            .unwrap();
        assert_eq!(results.len(), k);
        done += k;
    }
    let batched = t.elapsed().as_secs_f64() * 1e6 / n as f64;
    println!(
        "reference filter, {n} events: in-process Monty {inproc:.1} µs/event; through the worker {worker:.1} µs/event; ratio {:.2}x",
        worker / inproc
    );
    println!(
        "through the worker in bursts of 100 events per update: {batched:.1} µs/event; ratio {:.2}x",
        batched / inproc
    );
    println!(
        "target: through the worker {worker:.1} µs per single event, {batched:.1} µs per event in bursts, vs 100 µs -> single {}, bursts {}",
        if worker < 100.0 { "met" } else { "MISSED" },
        if batched < 100.0 { "met" } else { "MISSED" }
    );
}
