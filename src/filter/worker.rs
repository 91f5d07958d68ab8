//! The filter worker: a child process of herald (`herald filter-worker`, hidden) that runs
//! Python scopes for the parent, so that a filter that exhausts memory or wedges inside one huge
//! builtin operation takes down only this process.
//!
//! Protocol: NDJSON on stdin/stdout, one request at a time.
//! - parent → worker: `{"op":"run","id","scope","code","event","functions","time_ms","max_calls"}`,
//!   `{"op":"drop","scope"}`, and `{"op":"reply","id","ok"|"err"}` answering a call;
//! - worker → parent: `{"op":"call","id","name","args","kwargs"}` (a catalog function, proxied
//!   to the parent) and `{"op":"done","id","ok":{value,printed}|"err":{exc_type,message}}`.
//!
//! The worker caps its own data segment (`RLIMIT_DATA`); an allocation past it aborts the
//! process, and the parent reports the event's failure and starts a new worker.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::time::Duration;

use monty_types::ExcType;
use serde_json::{Map, Value, json};

use crate::filter::engine::{Host, HostError, RunLimits, Scope};

struct PipeHost<'a> {
    functions: Vec<String>,
    run_id: u64,
    input: &'a mut dyn BufRead,
    output: &'a mut dyn Write,
    next_call: u64,
}

fn exc_type(name: &str) -> ExcType {
    match name {
        "PermissionError" => ExcType::PermissionError,
        "ValueError" => ExcType::ValueError,
        "KeyError" => ExcType::KeyError,
        "TimeoutError" => ExcType::TimeoutError,
        _ => ExcType::RuntimeError,
    }
}

impl Host for PipeHost<'_> {
    fn provides(&self, name: &str) -> bool {
        self.functions.iter().any(|f| f == name)
    }

    fn call(
        &mut self,
        name: &str,
        args: Vec<Value>,
        kwargs: Map<String, Value>,
    ) -> Result<Value, HostError> {
        self.next_call += 1;
        let msg = json!({"op": "call", "id": self.run_id, "call": self.next_call, "name": name, "args": args, "kwargs": kwargs});
        let lost = || HostError {
            exc_type: ExcType::RuntimeError,
            message: "the filter lost its connection to herald".into(),
        };
        writeln!(self.output, "{msg}")
            .and_then(|_| self.output.flush())
            .map_err(|_| lost())?;
        let mut line = String::new();
        loop {
            line.clear();
            if self.input.read_line(&mut line).map_err(|_| lost())? == 0 {
                return Err(lost());
            }
            let Ok(v) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            if v["op"] == "reply" && v["call"] == self.next_call {
                if let Some(ok) = v.get("ok") {
                    return Ok(ok.clone());
                }
                return Err(HostError {
                    exc_type: exc_type(v["err"]["type"].as_str().unwrap_or("")),
                    message: v["err"]["message"]
                        .as_str()
                        .unwrap_or("the call failed")
                        .to_owned(),
                });
            }
        }
    }
}

/// Caps this process's data segment at `bytes`.
pub fn limit_memory(bytes: u64) {
    #[cfg(unix)]
    {
        let lim = libc::rlimit {
            rlim_cur: bytes as libc::rlim_t,
            rlim_max: bytes as libc::rlim_t,
        };
        // SAFETY: setrlimit with a valid, initialised struct has no memory-safety preconditions.
        unsafe {
            libc::setrlimit(libc::RLIMIT_DATA, &lim);
        }
    }
}

/// Serves requests on stdin/stdout until stdin closes.
pub fn serve(memory_bytes: u64) {
    limit_memory(memory_bytes);
    let stdout = std::io::stdout();
    // Read fd 0 directly (not through Stdin's own buffer), so that "is a line buffered?" and
    // "is the pipe readable?" together tell whether a read would block.
    // SAFETY: fd 0 is open for the life of the process and nothing else reads it.
    let mut input = std::io::BufReader::new(unsafe {
        <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(0)
    });
    let mut output = std::io::BufWriter::new(stdout.lock());
    // herald handles Ctrl-C and shuts its workers down itself (they share its process group).
    #[cfg(unix)]
    // SAFETY: ignoring SIGINT has no memory-safety preconditions.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_IGN);
    }
    let mut scopes: HashMap<String, (Scope, u64)> = HashMap::new();
    let mut line = String::new();
    loop {
        line.clear();
        // The next request usually follows at once (the rest of a burst): spin briefly before
        // sleeping on stdin, as the parent does for answers.
        if !input.buffer().contains(&b'\n') {
            let forever = std::time::Instant::now() + Duration::from_secs(365 * 24 * 3600);
            crate::filter::pool::wait_readable(0, forever);
        }
        match input.read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let Ok(req) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        match req["op"].as_str() {
            Some("drop") => {
                scopes.remove(req["scope"].as_str().unwrap_or_default());
            }
            Some("run") => {
                let id = req["id"].as_u64().unwrap_or(0);
                let scope_name = req["scope"].as_str().unwrap_or_default().to_owned();
                let code = req["code"].as_str().unwrap_or_default().to_owned();
                let functions: Vec<String> = req["functions"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|f| f.as_str().map(str::to_owned))
                            .collect()
                    })
                    .unwrap_or_default();
                let limits = RunLimits {
                    time: Duration::from_millis(req["time_ms"].as_u64().unwrap_or(2000)),
                    max_calls: req["max_calls"].as_u64().unwrap_or(10) as usize,
                    ..RunLimits::default()
                };
                // One event, or a batch ("events"): each is its own run, with its own limits.
                let events: Vec<Value> = match req.get("events").and_then(Value::as_array) {
                    Some(list) => list.clone(),
                    None => vec![req.get("event").cloned().unwrap_or(Value::Null)],
                };
                let batch = req.get("events").is_some();
                let mut host = PipeHost {
                    functions,
                    run_id: id,
                    input: &mut input,
                    output: &mut output,
                    next_call: 0,
                };
                let mut results = Vec::with_capacity(events.len());
                for (n, ev) in events.into_iter().enumerate() {
                    let inputs = if ev.is_null() {
                        Vec::new()
                    } else {
                        vec![("event".to_owned(), ev)]
                    };
                    // A REPL keeps every snippet it was fed; start a scope afresh after this
                    // many runs so a long-lived watch cannot grow the worker without bound.
                    const MAX_RUNS_PER_SCOPE: u64 = 10_000;
                    let fresh = match scopes.get(&scope_name) {
                        Some((_, runs)) => *runs >= MAX_RUNS_PER_SCOPE,
                        None => true,
                    };
                    if fresh {
                        scopes.insert(scope_name.clone(), (Scope::new(), 0));
                    }
                    let (scope, runs) = scopes.get_mut(&scope_name).expect("inserted above");
                    *runs += 1;
                    results.push(match scope.run(&code, inputs, limits, &mut host) {
                        Ok(mut o) => {
                            o.fresh_scope = fresh;
                            json!({"ok": o})
                        }
                        Err(e) => json!({"err": e}),
                    });
                    // Progress, so the parent's deadline covers one event, not the batch.
                    if batch {
                        let tick = json!({"op": "tick", "id": id, "done": n + 1});
                        if writeln!(host.output, "{tick}")
                            .and_then(|_| host.output.flush())
                            .is_err()
                        {
                            return;
                        }
                    }
                }
                let msg = if batch {
                    json!({"op": "done", "id": id, "batch": results})
                } else {
                    let mut one = results.pop().unwrap_or_default();
                    one["op"] = "done".into();
                    one["id"] = id.into();
                    one
                };
                if writeln!(output, "{msg}")
                    .and_then(|_| output.flush())
                    .is_err()
                {
                    return;
                }
            }
            _ => {}
        }
    }
}
