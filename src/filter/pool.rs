//! The parent side of the filter workers: a small pool of `herald filter-worker` processes.
//!
//! A scope (one per watch) lives in one worker, chosen by its name, so its variables persist.
//! Each worker is driven by a thread of its own that takes jobs from a bounded queue (blocking
//! pipe I/O: the answer wakes it directly); it sends the run, answers the worker's catalog
//! calls through the [`Catalog`] on the runtime, and waits for the result with a
//! wall-clock deadline (the in-sandbox time limit plus a grace period, restarted after each
//! catalog call and each event of a batch). The messages are the [`pipe`](super::pipe)'s. A
//! worker that dies, misses the deadline or sends a line that is not a pipe message is killed
//! and replaced; the job fails with a clear error and every scope it held is reset (the caller
//! is told).

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde_json::{Map, Value};
use tokio::sync::{mpsc, oneshot};

use crate::filter::engine::{HostError, Outcome, PyError, PyExc};
use crate::filter::pipe::{FromWorker, Message, ToWorker};

/// Functions a scope may call, answered by the parent.
#[async_trait]
pub trait Catalog: Send + Sync {
    /// The names callable from Python.
    fn functions(&self) -> Vec<String>;
    /// Calls one. The error is raised in the caller as its Python exception.
    async fn call(
        &self,
        name: &str,
        args: Vec<Value>,
        kwargs: Map<String, Value>,
    ) -> Result<Value, HostError>;
}

/// A catalog whose calls can be interrupted: once `cancel` fires, the call under way and
/// every later one raise `KeyboardInterrupt` in Python. It is how code mode's Ctrl-C stops a
/// running statement without losing the scope (the sandbox itself cannot be interrupted, but
/// its own code is bounded by the time limit; what runs long is a tool call).
pub struct Interruptible {
    pub catalog: Arc<dyn Catalog>,
    pub cancel: tokio_util::sync::CancellationToken,
}

#[async_trait]
impl Catalog for Interruptible {
    fn functions(&self) -> Vec<String> {
        self.catalog.functions()
    }

    async fn call(
        &self,
        name: &str,
        args: Vec<Value>,
        kwargs: Map<String, Value>,
    ) -> Result<Value, HostError> {
        let interrupted = || {
            Err(HostError::new(
                PyExc::KeyboardInterrupt,
                format!("{name} was interrupted (Ctrl-C)"),
            ))
        };
        if self.cancel.is_cancelled() {
            return interrupted();
        }
        tokio::select! {
            r = self.catalog.call(name, args, kwargs) => r,
            _ = self.cancel.cancelled() => interrupted(),
        }
    }
}

/// Why a run produced no outcome.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FilterError {
    /// The code raised.
    #[error("{0}")]
    Python(PyError),
    /// The worker died or overran; the scope's variables are gone.
    #[error("{0}")]
    Worker(String),
}

/// Pool settings.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// The herald binary to run as `filter-worker`.
    pub exe: PathBuf,
    pub workers: usize,
    pub memory_bytes: u64,
    pub time: Duration,
    pub max_calls: usize,
}

impl PoolConfig {
    pub fn new(exe: PathBuf) -> PoolConfig {
        PoolConfig {
            exe,
            workers: 2,
            memory_bytes: 256 * 1024 * 1024,
            time: Duration::from_secs(2),
            max_calls: 10,
        }
    }
}

/// Longest one catalog call from a filter may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest line a worker may answer with. Printed output and values are capped inside the
/// sandbox far below this; a longer line means the worker is not behaving, and it is replaced.
const MAX_ANSWER_BYTES: u64 = 64 << 20;

/// What one run answers: one result per event, or why there are none.
type RunReply = Result<Vec<Result<Outcome, PyError>>, FilterError>;

enum Job {
    /// Runs `code` once per event.
    Run {
        scope: String,
        code: String,
        events: Vec<Value>,
        catalog: Arc<dyn Catalog>,
        reply: oneshot::Sender<RunReply>,
    },
    /// Forgets a scope.
    Drop { scope: String },
}

/// A pool of filter workers. Cheap to clone.
#[derive(Clone)]
pub struct FilterPool {
    queues: Arc<Vec<mpsc::Sender<Job>>>,
}

impl FilterPool {
    pub fn new(cfg: PoolConfig) -> FilterPool {
        let cfg = Arc::new(cfg);
        let queues = (0..cfg.workers.max(1))
            .map(|i| {
                let (tx, rx) = mpsc::channel(64);
                let (cfg, rt) = (cfg.clone(), tokio::runtime::Handle::current());
                std::thread::Builder::new()
                    .name(format!("herald-filter-{i}"))
                    .spawn(move || drive(cfg, i, rx, rt))
                    .expect("a thread for the filter worker");
                tx
            })
            .collect();
        FilterPool {
            queues: Arc::new(queues),
        }
    }

    fn queue(&self, scope: &str) -> &mpsc::Sender<Job> {
        let h = scope
            .bytes()
            .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(b as u64));
        &self.queues[(h % self.queues.len() as u64) as usize]
    }

    /// Runs `code` in `scope` with `event` bound (`null`: nothing bound).
    pub async fn run(
        &self,
        scope: &str,
        code: &str,
        event: Value,
        catalog: Arc<dyn Catalog>,
    ) -> Result<Outcome, FilterError> {
        let results = self.submit(scope, code, vec![event], catalog).await?;
        // The driver checked that there is one result per event.
        let one = results.into_iter().next().ok_or_else(|| {
            FilterError::Worker("the filter worker answered a batch short".into())
        })?;
        one.map_err(FilterError::Python)
    }

    /// Runs `code` once per event of `events`, in order, in one exchange with the worker (one
    /// pipe round trip for the lot). Each event has its own limits and its own result.
    pub async fn run_batch(
        &self,
        scope: &str,
        code: &str,
        events: Vec<Value>,
        catalog: Arc<dyn Catalog>,
    ) -> Result<Vec<Result<Outcome, FilterError>>, FilterError> {
        let results = self.submit(scope, code, events, catalog).await?;
        Ok(results
            .into_iter()
            .map(|r| r.map_err(FilterError::Python))
            .collect())
    }

    async fn submit(
        &self,
        scope: &str,
        code: &str,
        events: Vec<Value>,
        catalog: Arc<dyn Catalog>,
    ) -> RunReply {
        let stopped = || FilterError::Worker("the filter pool has stopped".into());
        let (reply, rx) = oneshot::channel();
        let job = Job::Run {
            scope: scope.to_owned(),
            code: code.to_owned(),
            events,
            catalog,
            reply,
        };
        self.queue(scope).send(job).await.map_err(|_| stopped())?;
        rx.await.map_err(|_| stopped())?
    }

    /// Forgets `scope`'s variables.
    pub async fn drop_scope(&self, scope: &str) {
        let job = Job::Drop {
            scope: scope.to_owned(),
        };
        let _ = self.queue(scope).send(job).await;
    }
}

/// A running worker. Killed and reaped when dropped.
struct Proc {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    out: std::process::ChildStdout,
    /// Bytes read from `out` past the last complete line.
    pending: Vec<u8>,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn(cfg: &PoolConfig) -> std::io::Result<Proc> {
    let mut command = std::process::Command::new(&cfg.exe);
    // The sandbox needs nothing from herald's environment (which may hold tokens), nor its
    // working directory.
    command.env_clear().current_dir("/");
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: only async-signal-safe prctl calls between fork and exec.
        unsafe {
            command.pre_exec(|| {
                // No privilege gain through exec, and die with the parent.
                libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
    }
    let mut child = command
        .arg("filter-worker")
        .arg("--memory-bytes")
        .arg(cfg.memory_bytes.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let stdin = child.stdin.take().expect("piped");
    let out = child.stdout.take().expect("piped");
    Ok(Proc {
        child,
        stdin,
        out,
        pending: Vec::new(),
    })
}

enum ReadLine {
    Line(String),
    Eof,
    Timeout,
    TooLong,
}

/// Reads one line, waiting at most until `deadline` for all of it (a worker that writes half
/// a line and stalls is caught too).
fn read_line(p: &mut Proc, deadline: Instant) -> ReadLine {
    use std::io::Read;
    use std::os::fd::AsRawFd;
    loop {
        if let Some(i) = p.pending.iter().position(|&c| c == b'\n') {
            let rest = p.pending.split_off(i + 1);
            let line = std::mem::replace(&mut p.pending, rest);
            return match String::from_utf8(line) {
                Ok(l) => ReadLine::Line(l),
                Err(_) => ReadLine::Line(String::new()),
            };
        }
        if p.pending.len() as u64 >= MAX_ANSWER_BYTES {
            return ReadLine::TooLong;
        }
        if !wait_readable(p.out.as_raw_fd(), deadline) {
            return ReadLine::Timeout;
        }
        let mut buf = [0u8; 64 * 1024];
        match p.out.read(&mut buf) {
            Ok(0) | Err(_) => return ReadLine::Eof,
            Ok(n) => p.pending.extend_from_slice(&buf[..n]),
        }
    }
}

/// Drives one worker from a thread of its own: blocking pipe I/O wakes on the data itself,
/// without a trip through the async reactor, which is most of a filter run's cost.
fn drive(
    cfg: Arc<PoolConfig>,
    index: usize,
    mut rx: mpsc::Receiver<Job>,
    rt: tokio::runtime::Handle,
) {
    let mut proc: Option<Proc> = None;
    let mut next_id = 0u64;
    let grace = Duration::from_secs(3);
    while let Some(job) = next_job(&mut rx) {
        let (scope, code, events, catalog, reply) = match job {
            Job::Drop { scope } => {
                // A worker that is not running holds no scopes.
                if let Some(p) = proc.as_mut() {
                    let _ = ToWorker::Drop { scope }.write_to(&mut p.stdin);
                }
                continue;
            }
            Job::Run {
                scope,
                code,
                events,
                catalog,
                reply,
            } => (scope, code, events, catalog, reply),
        };
        if proc.is_none() {
            match spawn(&cfg) {
                Ok(p) => proc = Some(p),
                Err(e) => {
                    let _ = reply.send(Err(FilterError::Worker(format!(
                        "cannot start a filter worker ({}): {e}",
                        cfg.exe.display()
                    ))));
                    continue;
                }
            }
        }
        let p = proc.as_mut().expect("started above");
        next_id += 1;
        let id = next_id;
        let budget = Budget {
            per_event: cfg.time + grace,
            max_calls: cfg.max_calls,
            events: events.len(),
        };
        let req = ToWorker::Run {
            id,
            scope,
            code,
            functions: catalog.functions(),
            time_ms: cfg.time.as_millis() as u64,
            max_calls: cfg.max_calls,
            events,
        };
        let result = match req.write_to(&mut p.stdin) {
            Err(_) => Err(None),
            Ok(()) => exchange(p, id, &catalog, budget, &rt),
        };
        match result {
            Ok(results) => {
                let _ = reply.send(Ok(results));
            }
            Err(reason) => {
                // Dead or wedged: replace it (dropping it kills and reaps it). Every scope it
                // held is gone; the next run of each reports a fresh scope.
                if let Some(mut dead) = proc.take() {
                    let _ = dead.child.kill();
                    let status = dead.child.wait().ok();
                    tracing::warn!(worker = index, ?status, "filter worker replaced");
                }
                let why = reason.unwrap_or_else(|| {
                    format!(
                        "the filter worker died (over its {} MiB memory limit, or crashed)",
                        cfg.memory_bytes / (1024 * 1024)
                    )
                });
                let _ = reply.send(Err(FilterError::Worker(format!(
                    "{why}; the event was not filtered and the filter's variables were reset"
                ))));
            }
        }
    }
}

/// What one exchange may spend.
struct Budget {
    /// Time per event (the sandbox's limit plus a grace period).
    per_event: Duration,
    max_calls: usize,
    /// Events in the request.
    events: usize,
}

/// Runs one request to completion: one result per event. `Err(None)`: the worker died;
/// `Err(Some(why))`: it overran or answered garbage.
fn exchange(
    p: &mut Proc,
    id: u64,
    catalog: &Arc<dyn Catalog>,
    limits: Budget,
    rt: &tokio::runtime::Handle,
) -> Result<Vec<Result<Outcome, PyError>>, Option<String>> {
    let Budget {
        per_event: budget,
        max_calls,
        events,
    } = limits;
    let mut deadline = Instant::now() + budget;
    // The sandbox counts calls too; these counts hold even if the sandbox is subverted: at
    // most `max_calls` per event, and one fresh budget per event of the batch, no more.
    let mut calls = 0usize;
    let mut ticks = 0usize;
    loop {
        let line = match read_line(p, deadline) {
            ReadLine::Timeout => {
                return Err(Some(
                    "the filter ran past its time limit inside one operation and was stopped"
                        .into(),
                ));
            }
            ReadLine::Eof => return Err(None),
            ReadLine::TooLong => {
                return Err(Some(format!(
                    "the filter worker answered with over {} MiB in one line",
                    MAX_ANSWER_BYTES >> 20
                )));
            }
            ReadLine::Line(l) => l,
        };
        // The worker's state is unknown after a line we cannot read: replace it.
        let msg = FromWorker::from_line(&line).map_err(|e| {
            Some(format!(
                "the filter worker sent an answer herald cannot read ({e})"
            ))
        })?;
        if msg.id() != id {
            continue;
        }
        match msg {
            FromWorker::Tick { next, .. } => {
                // The next event of a batch starts: its own time and calls.
                ticks += 1;
                if ticks >= events {
                    return Err(Some(
                        "the filter worker reported more events than it was sent".into(),
                    ));
                }
                if next != ticks {
                    return Err(Some(format!(
                        "the filter worker reported event {next} where herald expected {ticks}"
                    )));
                }
                deadline = Instant::now() + budget;
                calls = 0;
            }
            FromWorker::Call {
                call,
                name,
                args,
                kwargs,
                ..
            } => {
                calls += 1;
                let answer = if calls > max_calls {
                    Err(HostError::new(
                        PyExc::RuntimeError,
                        format!("more than {max_calls} tool calls in one run; do less per event"),
                    ))
                } else {
                    rt.block_on(async {
                        tokio::time::timeout(CALL_TIMEOUT, catalog.call(&name, args, kwargs))
                            .await
                            .unwrap_or_else(|_| {
                                Err(HostError::new(
                                    PyExc::TimeoutError,
                                    format!("{name} took over {} s", CALL_TIMEOUT.as_secs()),
                                ))
                            })
                    })
                };
                if (ToWorker::Reply { id, call, answer })
                    .write_to(&mut p.stdin)
                    .is_err()
                {
                    return Err(None);
                }
                // The sandbox's clock stopped while the host worked; so does this one.
                deadline = Instant::now() + budget;
            }
            FromWorker::Done { results, .. } => {
                if results.len() != events {
                    return Err(Some(format!(
                        "the filter worker answered {} results for {events} events",
                        results.len()
                    )));
                }
                return Ok(results);
            }
        }
    }
}

/// How long to spin for a worker's answer before sleeping on it. A filter usually answers in
/// tens of microseconds, and a sleeping thread's wake-up on a small VM costs more than that.
pub const SPIN: Duration = Duration::from_micros(300);

/// Waits until `fd` is readable (true) or `deadline` passes (false): spinning for [`SPIN`]
/// first, then sleeping in `poll`.
pub fn wait_readable(fd: i32, deadline: Instant) -> bool {
    let mut fds = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let spin_until = Instant::now() + SPIN;
    loop {
        // SAFETY: one valid pollfd for a descriptor the caller owns, for the call's duration.
        if unsafe { libc::poll(&mut fds, 1, 0) } != 0 {
            return true;
        }
        if Instant::now() >= spin_until {
            break;
        }
        std::hint::spin_loop();
    }
    let left = deadline.saturating_duration_since(Instant::now());
    let ms = left.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: as above.
    unsafe { libc::poll(&mut fds, 1, ms) != 0 }
}

/// The next job: spinning for [`SPIN`] (the next event of a watch usually follows at once),
/// then sleeping on the queue. `None` once the pool is gone.
fn next_job(rx: &mut mpsc::Receiver<Job>) -> Option<Job> {
    let spin_until = Instant::now() + SPIN;
    loop {
        match rx.try_recv() {
            Ok(job) => return Some(job),
            Err(mpsc::error::TryRecvError::Disconnected) => return None,
            Err(mpsc::error::TryRecvError::Empty) if Instant::now() < spin_until => {
                std::hint::spin_loop()
            }
            Err(mpsc::error::TryRecvError::Empty) => return rx.blocking_recv(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    struct NoCatalog;

    #[async_trait]
    impl Catalog for NoCatalog {
        fn functions(&self) -> Vec<String> {
            Vec::new()
        }
        async fn call(
            &self,
            name: &str,
            _: Vec<Value>,
            _: Map<String, Value>,
        ) -> Result<Value, HostError> {
            Err(HostError::new(
                PyExc::RuntimeError,
                format!("{name} is not available"),
            ))
        }
    }

    /// A fake worker: answers each request with `line` (no single quotes), `@ID@` replaced by
    /// the request's id.
    fn fake_worker(dir: &std::path::Path, n: usize, line: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join(format!("worker-{n}"));
        let script = format!(
            r#"#!/bin/sh
out='{line}'
while read -r request; do
    id=${{request#*\"id\":}}
    id=${{id%%,*}}
    case "$out" in
    *@ID@*) printf '%s%s%s\n' "${{out%%@ID@*}}" "$id" "${{out#*@ID@}}" ;;
    *) printf '%s\n' "$out" ;;
    esac
done
"#
        );
        std::fs::write(&path, script).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    /// A catalog whose one function, `wait`, never answers.
    struct Forever;

    #[async_trait]
    impl Catalog for Forever {
        fn functions(&self) -> Vec<String> {
            vec!["wait".into()]
        }
        async fn call(
            &self,
            _: &str,
            _: Vec<Value>,
            _: Map<String, Value>,
        ) -> Result<Value, HostError> {
            std::future::pending().await
        }
    }

    #[tokio::test]
    async fn an_interrupted_catalog_raises_keyboard_interrupt_in_the_call_and_after() {
        let cancel = tokio_util::sync::CancellationToken::new();
        let cat = Arc::new(Interruptible {
            catalog: Arc::new(Forever),
            cancel: cancel.clone(),
        });
        let call = tokio::spawn({
            let cat = cat.clone();
            async move { cat.call("wait", vec![], Map::new()).await }
        });
        cancel.cancel();
        let e = tokio::time::timeout(Duration::from_secs(10), call)
            .await
            .expect("the waiting call ends")
            .unwrap()
            .unwrap_err();
        assert_eq!(
            (e.kind, e.message.as_str()),
            (PyExc::KeyboardInterrupt, "wait was interrupted (Ctrl-C)")
        );
        let later = cat.call("wait", vec![], Map::new()).await.unwrap_err();
        assert_eq!(
            later.kind,
            PyExc::KeyboardInterrupt,
            "a later call does not wait"
        );
        assert_eq!(cat.functions(), ["wait"]);
    }

    #[tokio::test]
    async fn a_worker_that_answers_garbage_is_refused_and_replaced() {
        // What the fake answers, to how many events, and what herald says.
        let cases = [
            ("not json", 1, "cannot read"),
            (r#"{"op":"bogus","id":@ID@}"#, 1, "unknown variant `bogus`"),
            (
                r#"{"op":"done","id":@ID@,"results":[{"Ok":{"value":1}}]}"#,
                1,
                "missing field `printed`",
            ),
            (
                r#"{"op":"done","id":@ID@,"results":[]}"#,
                3,
                "answered 0 results for 3 events",
            ),
            (
                r#"{"op":"tick","id":@ID@,"next":1}"#,
                1,
                "more events than it was sent",
            ),
            (
                r#"{"op":"tick","id":@ID@,"next":2}"#,
                3,
                "reported event 2 where herald expected 1",
            ),
        ];
        let dir = std::env::temp_dir().join(format!("herald-pool-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // Every script is written before any runs, so none is still open for writing when one
        // is executed.
        let good = fake_worker(
            &dir,
            0,
            r#"{"op":"done","id":@ID@,"results":[{"Ok":{"value":"hi","printed":""}}]}"#,
        );
        let fakes: Vec<PathBuf> = (1..)
            .zip(&cases)
            .map(|(n, (line, _, _))| fake_worker(&dir, n, line))
            .collect();
        let catalog: Arc<dyn Catalog> = Arc::new(NoCatalog);
        let pool = FilterPool::new(PoolConfig::new(good));
        for _ in 0..2 {
            let o = pool.run("s", "x", json!(1), catalog.clone()).await.unwrap();
            assert_eq!(o.value, json!("hi"), "the fake speaks the pipe");
        }
        for (exe, (line, events, why)) in fakes.into_iter().zip(cases) {
            let pool = FilterPool::new(PoolConfig::new(exe));
            for attempt in ["first", "after the replacement"] {
                let batch = vec![json!(1); events];
                let Err(FilterError::Worker(e)) =
                    pool.run_batch("s", "x", batch, catalog.clone()).await
                else {
                    panic!("{line} was accepted");
                };
                assert!(e.contains(why), "{line}, {attempt}: {e}");
                assert!(e.ends_with("the filter's variables were reset"), "{e}");
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
