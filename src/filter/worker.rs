//! The filter worker: a child process of herald (`herald filter-worker`, hidden) that runs
//! Python scopes for the parent, so that a filter that exhausts memory or wedges inside one huge
//! builtin operation takes down only this process.
//!
//! It speaks the [`pipe`](super::pipe) protocol on stdin/stdout, one request at a time.
//!
//! The worker caps its own data segment (`RLIMIT_DATA`); an allocation past it aborts the
//! process, and the parent reports the event's failure and starts a new worker. The parent
//! starts it with an empty environment in `/`, with `no_new_privs`, and it dies with herald
//! (`PR_SET_PDEATHSIG`).

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::time::Duration;

use serde_json::{Map, Value};

use crate::filter::engine::{Host, HostError, PyExc, RunLimits, Scope};
use crate::filter::pipe::{FromWorker, Message, ToWorker};

/// A REPL keeps every snippet it was fed; a scope starts afresh after this many runs so a
/// long-lived watch cannot grow the worker without bound.
const MAX_RUNS_PER_SCOPE: u64 = 10_000;

/// The worker's scopes by name, with the runs each has had.
type Scopes = HashMap<String, (Scope, u64)>;

/// Answers a run's catalog calls by asking herald over the pipe.
struct PipeHost<'a> {
    functions: Vec<String>,
    run_id: u64,
    input: &'a mut dyn BufRead,
    output: &'a mut dyn Write,
    next_call: u64,
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
        let lost = || {
            HostError::new(
                PyExc::RuntimeError,
                "the filter lost its connection to herald",
            )
        };
        FromWorker::Call {
            id: self.run_id,
            call: self.next_call,
            name: name.to_owned(),
            args,
            kwargs,
        }
        .write_to(self.output)
        .map_err(|_| lost())?;
        let mut line = String::new();
        loop {
            line.clear();
            if self.input.read_line(&mut line).map_err(|_| lost())? == 0 {
                return Err(lost());
            }
            // herald sends nothing else while a call is open; anything else is not for us.
            if let Ok(ToWorker::Reply { id, call, answer }) = ToWorker::from_line(&line)
                && id == self.run_id
                && call == self.next_call
            {
                return answer;
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
    let mut scopes = Scopes::new();
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
        // Both ends are one binary, so an unreadable request is a bug, not an attack: skip it
        // (herald's deadline replaces a worker that never answers).
        let Ok(req) = ToWorker::from_line(&line) else {
            continue;
        };
        if handle(req, &mut scopes, &mut input, &mut output).is_err() {
            return;
        }
    }
}

/// Serves one request, reading the replies to its catalog calls from `input`. An error means
/// herald is gone.
fn handle(
    req: ToWorker,
    scopes: &mut Scopes,
    input: &mut dyn BufRead,
    output: &mut dyn Write,
) -> std::io::Result<()> {
    let (id, scope_name, code, functions, limits, events) = match req {
        ToWorker::Drop { scope } => {
            scopes.remove(&scope);
            return Ok(());
        }
        // Replies are read while a call waits (in `PipeHost::call`); one here answers nothing.
        ToWorker::Reply { .. } => return Ok(()),
        ToWorker::Run {
            id,
            scope,
            code,
            functions,
            time_ms,
            max_calls,
            events,
        } => {
            let limits = RunLimits {
                time: Duration::from_millis(time_ms),
                max_calls,
                ..RunLimits::default()
            };
            (id, scope, code, functions, limits, events)
        }
    };
    let mut host = PipeHost {
        functions,
        run_id: id,
        input,
        output,
        next_call: 0,
    };
    let mut results = Vec::with_capacity(events.len());
    for (n, ev) in events.into_iter().enumerate() {
        // Each event is its own run, with its own limits: tell herald the next one starts.
        if n > 0 {
            FromWorker::Tick { id, next: n }.write_to(host.output)?;
        }
        let inputs = if ev.is_null() {
            Vec::new()
        } else {
            vec![("event".to_owned(), ev)]
        };
        let fresh = match scopes.get(&scope_name) {
            Some((_, runs)) => *runs >= MAX_RUNS_PER_SCOPE,
            None => true,
        };
        if fresh {
            scopes.insert(scope_name.clone(), (Scope::new(), 0));
        }
        let (scope, runs) = scopes.get_mut(&scope_name).expect("inserted above");
        *runs += 1;
        results.push(scope.run(&code, inputs, limits, &mut host).map(|mut o| {
            o.fresh_scope = fresh;
            o
        }));
    }
    FromWorker::Done { id, results }.write_to(host.output)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::filter::engine::{Outcome, PyError};
    use serde_json::json;

    fn run(id: u64, code: &str, events: Vec<Value>) -> ToWorker {
        ToWorker::Run {
            id,
            scope: "s".into(),
            code: code.into(),
            functions: vec!["f".into()],
            time_ms: 2000,
            max_calls: 10,
            events,
        }
    }

    /// Serves `req` with `replies` waiting on the input; what the worker answered.
    fn serve_one(scopes: &mut Scopes, req: ToWorker, replies: &[ToWorker]) -> Vec<FromWorker> {
        let mut input = Vec::new();
        for r in replies {
            r.write_to(&mut input).unwrap();
        }
        let mut output = Vec::new();
        handle(req, scopes, &mut &input[..], &mut output).unwrap();
        String::from_utf8(output)
            .unwrap()
            .lines()
            .map(|l| FromWorker::from_line(l).unwrap())
            .collect()
    }

    fn ok(value: Value, fresh_scope: bool) -> Result<Outcome, PyError> {
        Ok(Outcome {
            value,
            printed: String::new(),
            fresh_scope,
        })
    }

    #[test]
    fn a_batch_ticks_between_its_events_and_answers_each() {
        let mut scopes = Scopes::new();
        let got = serve_one(
            &mut scopes,
            run(3, "event * 2", vec![json!(1), json!(2), json!(3)]),
            &[],
        );
        assert_eq!(
            got,
            vec![
                FromWorker::Tick { id: 3, next: 1 },
                FromWorker::Tick { id: 3, next: 2 },
                FromWorker::Done {
                    id: 3,
                    results: vec![ok(json!(2), true), ok(json!(4), false), ok(json!(6), false)],
                },
            ]
        );
        let got = serve_one(&mut scopes, run(4, "event", vec![json!("one")]), &[]);
        assert_eq!(
            got,
            vec![FromWorker::Done {
                id: 4,
                results: vec![ok(json!("one"), false)]
            }],
            "a single event: no tick"
        );
    }

    #[test]
    fn a_dropped_scope_starts_afresh() {
        let mut scopes = Scopes::new();
        serve_one(&mut scopes, run(1, "x = 1", vec![Value::Null]), &[]);
        serve_one(&mut scopes, ToWorker::Drop { scope: "s".into() }, &[]);
        let got = serve_one(&mut scopes, run(2, "x", vec![Value::Null]), &[]);
        let [FromWorker::Done { results, .. }] = &got[..] else {
            panic!("{got:?}")
        };
        assert_eq!(results[0].as_ref().unwrap_err().exc_type, "NameError");
    }

    #[test]
    fn catalog_calls_go_to_herald_and_its_errors_raise_their_python_type() {
        let call = FromWorker::Call {
            id: 1,
            call: 1,
            name: "f".into(),
            args: vec![json!(1)],
            kwargs: json!({"x": 2}).as_object().cloned().unwrap(),
        };
        let reply = |answer| ToWorker::Reply {
            id: 1,
            call: 1,
            answer,
        };
        let got = serve_one(
            &mut Scopes::new(),
            run(1, "f(1, x=2)['n']", vec![Value::Null]),
            &[reply(Ok(json!({"n": 5})))],
        );
        assert_eq!(
            got,
            vec![
                call.clone(),
                FromWorker::Done {
                    id: 1,
                    results: vec![ok(json!(5), true)]
                }
            ]
        );
        for kind in PyExc::ALL {
            let code = format!("try:\n    r = f(1, x=2)\nexcept {kind}:\n    r = 'caught'\nr");
            // A stale reply and one to another run come first: both are passed over.
            let stale = ToWorker::Reply {
                id: 0,
                call: 1,
                answer: Ok(json!("stale")),
            };
            let got = serve_one(
                &mut Scopes::new(),
                run(1, &code, vec![Value::Null]),
                &[stale, reply(Err(HostError::new(kind, "no")))],
            );
            assert_eq!(
                got,
                vec![
                    call.clone(),
                    FromWorker::Done {
                        id: 1,
                        results: vec![ok(json!("caught"), true)]
                    }
                ],
                "{kind}"
            );
        }
        // herald went away while the call waited.
        let got = serve_one(
            &mut Scopes::new(),
            run(1, "f(1, x=2)", vec![Value::Null]),
            &[],
        );
        let Some(FromWorker::Done { results, .. }) = got.last() else {
            panic!("{got:?}")
        };
        let e = results[0].as_ref().unwrap_err();
        assert_eq!(
            (e.exc_type.as_str(), e.message.as_str()),
            ("RuntimeError", "the filter lost its connection to herald")
        );
    }
}
