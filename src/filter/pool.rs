//! The parent side of the filter workers: a small pool of `herald filter-worker` processes.
//!
//! A scope (one per watch) lives in one worker, chosen by its name, so its variables persist.
//! Each worker is driven by a thread of its own that takes jobs from a bounded queue (blocking
//! pipe I/O: the answer wakes it directly); it sends the run, answers the worker's catalog
//! calls through the [`Catalog`] on the runtime, and waits for the result with a
//! wall-clock deadline (the in-sandbox time limit plus a grace period, restarted after each
//! catalog call). A worker that dies or misses the deadline is killed and replaced; the job
//! fails with a clear error and every scope it held is reset (the caller is told).

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde_json::{Map, Value, json};
use tokio::sync::{mpsc, oneshot};

use crate::filter::engine::{Outcome, PyError};

/// Functions a scope may call, answered by the parent.
#[async_trait]
pub trait Catalog: Send + Sync {
    /// The names callable from Python.
    fn functions(&self) -> Vec<String>;
    /// Calls one. The error is `(python exception type, message)`.
    async fn call(
        &self,
        name: &str,
        args: Vec<Value>,
        kwargs: Map<String, Value>,
    ) -> Result<Value, (String, String)>;
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

struct Job {
    scope: String,
    code: Option<String>,
    /// One event (`Value`), or a batch (`Value::Array` with `batch`).
    event: Value,
    batch: bool,
    catalog: Arc<dyn Catalog>,
    reply: oneshot::Sender<Result<Outcome, FilterError>>,
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

    /// Runs `code` in `scope` with `event` bound.
    pub async fn run(
        &self,
        scope: &str,
        code: &str,
        event: Value,
        catalog: Arc<dyn Catalog>,
    ) -> Result<Outcome, FilterError> {
        let (reply, rx) = oneshot::channel();
        let job = Job {
            scope: scope.to_owned(),
            code: Some(code.to_owned()),
            event,
            batch: false,
            catalog,
            reply,
        };
        self.queue(scope)
            .send(job)
            .await
            .map_err(|_| FilterError::Worker("the filter pool has stopped".into()))?;
        rx.await
            .map_err(|_| FilterError::Worker("the filter pool has stopped".into()))?
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
        let n = events.len();
        let (reply, rx) = oneshot::channel();
        let job = Job {
            scope: scope.to_owned(),
            code: Some(code.to_owned()),
            event: Value::Array(events),
            batch: true,
            catalog,
            reply,
        };
        self.queue(scope)
            .send(job)
            .await
            .map_err(|_| FilterError::Worker("the filter pool has stopped".into()))?;
        let packed = rx
            .await
            .map_err(|_| FilterError::Worker("the filter pool has stopped".into()))??;
        // A batch comes back packed as one outcome whose value is the list of results.
        let list = packed.value.as_array().cloned().unwrap_or_default();
        let results: Vec<Result<Outcome, FilterError>> = list.into_iter().map(unpack).collect();
        if results.len() != n {
            return Err(FilterError::Worker(
                "the filter worker answered a batch short".into(),
            ));
        }
        Ok(results)
    }

    /// Forgets `scope`'s variables.
    pub async fn drop_scope(&self, scope: &str) {
        let (reply, _rx) = oneshot::channel();
        let _ = self
            .queue(scope)
            .send(Job {
                scope: scope.to_owned(),
                code: None,
                event: Value::Null,
                batch: false,
                catalog: Arc::new(NoCatalog),
                reply,
            })
            .await;
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
        name: &str,
        _: Vec<Value>,
        _: Map<String, Value>,
    ) -> Result<Value, (String, String)> {
        Err(("RuntimeError".into(), format!("{name} is not available")))
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

fn send(p: &mut Proc, v: &Value) -> std::io::Result<()> {
    use std::io::Write;
    let mut line = v.to_string();
    line.push('\n');
    p.stdin.write_all(line.as_bytes())?;
    p.stdin.flush()
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
        if proc.is_none() {
            match spawn(&cfg) {
                Ok(p) => proc = Some(p),
                Err(e) => {
                    let _ = job.reply.send(Err(FilterError::Worker(format!(
                        "cannot start a filter worker ({}): {e}",
                        cfg.exe.display()
                    ))));
                    continue;
                }
            }
        }
        let p = proc.as_mut().expect("started above");
        let Some(code) = job.code else {
            let _ = send(p, &json!({"op": "drop", "scope": job.scope}));
            continue;
        };
        next_id += 1;
        let id = next_id;
        let batch_len = match &job.event {
            Value::Array(a) if job.batch => a.len(),
            _ => 1,
        };
        let mut req = json!({"op": "run", "id": id, "scope": job.scope, "code": code,
                         "functions": job.catalog.functions(), "time_ms": cfg.time.as_millis() as u64,
                         "max_calls": cfg.max_calls});
        req[if job.batch { "events" } else { "event" }] = job.event;
        let result = match send(p, &req) {
            Err(_) => Err(None),
            Ok(()) => exchange(
                p,
                id,
                &job.catalog,
                Budget {
                    per_event: cfg.time + grace,
                    max_calls: cfg.max_calls,
                    events: batch_len,
                },
                &rt,
            ),
        };
        match result {
            Ok(r) => {
                let _ = job.reply.send(r);
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
                let _ = job.reply.send(Err(FilterError::Worker(format!(
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

/// Runs one request to completion. `Err(None)`: the worker died; `Err(Some(why))`: it overran
/// or answered garbage.
fn exchange(
    p: &mut Proc,
    id: u64,
    catalog: &Arc<dyn Catalog>,
    limits: Budget,
    rt: &tokio::runtime::Handle,
) -> Result<Result<Outcome, FilterError>, Option<String>> {
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
        let Ok(msg) = serde_json::from_str::<Value>(&line) else {
            // The worker's state is unknown after a line we cannot read: replace it.
            return Err(Some(
                "the filter worker sent an answer herald cannot read".into(),
            ));
        };
        if msg["id"].as_u64() != Some(id) {
            continue;
        }
        match msg["op"].as_str() {
            Some("tick") => {
                // The next event of a batch starts: its own time and calls.
                ticks += 1;
                if ticks > events {
                    return Err(Some(
                        "the filter worker reported more events than it was sent".into(),
                    ));
                }
                deadline = Instant::now() + budget;
                calls = 0;
            }
            Some("done") if msg.get("batch").is_some() => {
                return Ok(Ok(Outcome {
                    value: msg["batch"].clone(),
                    printed: String::new(),
                    fresh_scope: false,
                }));
            }
            Some("call") => {
                let name = msg["name"].as_str().unwrap_or_default().to_owned();
                let args = msg["args"].as_array().cloned().unwrap_or_default();
                let kwargs = msg["kwargs"].as_object().cloned().unwrap_or_default();
                calls += 1;
                let answer = if calls > max_calls {
                    Err((
                        "RuntimeError".into(),
                        format!("more than {max_calls} tool calls in one run; do less per event"),
                    ))
                } else {
                    rt.block_on(async {
                        tokio::time::timeout(CALL_TIMEOUT, catalog.call(&name, args, kwargs))
                            .await
                            .unwrap_or_else(|_| {
                                Err((
                                    "TimeoutError".into(),
                                    format!("{name} took over {} s", CALL_TIMEOUT.as_secs()),
                                ))
                            })
                    })
                };
                let reply = match answer {
                    Ok(v) => json!({"op": "reply", "call": msg["call"], "ok": v}),
                    Err((t, m)) => {
                        json!({"op": "reply", "call": msg["call"], "err": {"type": t, "message": m}})
                    }
                };
                if send(p, &reply).is_err() {
                    return Err(None);
                }
                // The sandbox's clock stopped while the host worked; so does this one.
                deadline = Instant::now() + budget;
            }
            Some("done") => {
                if let Some(ok) = msg.get("ok") {
                    return Ok(serde_json::from_value::<Outcome>(ok.clone()).map_err(|e| {
                        FilterError::Worker(format!("bad answer from the filter worker: {e}"))
                    }));
                }
                let err: PyError = serde_json::from_value(msg["err"].clone()).unwrap_or(PyError {
                    exc_type: "RuntimeError".into(),
                    message: "unknown error".into(),
                });
                return Ok(Err(FilterError::Python(err)));
            }
            _ => {}
        }
    }
}

/// One `{"ok": outcome}` / `{"err": python error}` entry of a batch answer.
fn unpack(v: Value) -> Result<Outcome, FilterError> {
    if let Some(ok) = v.get("ok") {
        return serde_json::from_value::<Outcome>(ok.clone())
            .map_err(|e| FilterError::Worker(format!("bad answer from the filter worker: {e}")));
    }
    let err: PyError = serde_json::from_value(v["err"].clone()).unwrap_or(PyError {
        exc_type: "RuntimeError".into(),
        message: "unknown error".into(),
    });
    Err(FilterError::Python(err))
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
