//! One Python scope in Monty, driven to completion with a host for the names it provides.
//!
//! A [`Scope`] is a persistent REPL: variables survive from one run to the next. Each run gets
//! a fresh time budget (Monty's is cumulative otherwise) and a cap on host calls. Host
//! functions are resolved when the code first names them; OS access (files, environment) is
//! refused with `PermissionError`. Host calls are answered synchronously, so `await f(...)` on
//! a host function is the same call as `f(...)`: the `await` is dropped before running.

use std::time::Duration;

use monty::{MontyRepl, ReplProgress};
use monty_types::{
    CompileOptions, ExcType, ExtFunctionResult, MontyException, MontyObject, NameLookupResult,
    PrintWriter, ResourceLimits, ResourceTracker,
};
use serde_json::{Map, Value};

use crate::filter::convert::{to_json, to_py};

/// Limits for one run.
#[derive(Debug, Clone, Copy)]
pub struct RunLimits {
    pub time: Duration,
    pub max_calls: usize,
    pub max_print_bytes: usize,
}

impl Default for RunLimits {
    fn default() -> Self {
        RunLimits {
            time: Duration::from_secs(2),
            max_calls: 10,
            max_print_bytes: 64 * 1024,
        }
    }
}

/// What a run produced: its last expression's value (`null` for `None`) and what it printed.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Outcome {
    pub value: Value,
    pub printed: String,
    /// The scope was new for this run (first run, or its earlier variables were lost).
    #[serde(default)]
    pub fresh_scope: bool,
}

/// A Python exception that escaped a run.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, thiserror::Error)]
pub struct PyError {
    pub exc_type: String,
    pub message: String,
    /// Where it was raised, when Monty says (it does for every exception but a time limit
    /// hit between two bytecodes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<Location>,
}

/// Where in the code an exception was raised: Monty's innermost frame.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Location {
    /// 1-based, in the code of the run (or, when `earlier`, of the run that defined it).
    pub line: u32,
    /// 1-based, in characters, as written (an `await` herald dropped is counted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub column: Option<u32>,
    /// The function it was raised in; `None` at the top level.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function: Option<String>,
    /// That line, trimmed and cut at [`SOURCE_CHARS`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// In code an earlier run defined (a function of an earlier snippet), not this run's.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub earlier: bool,
}

/// The most of a line an error quotes.
pub const SOURCE_CHARS: usize = 80;

impl std::fmt::Display for PyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.exc_type)?;
        if !self.message.is_empty() {
            write!(f, ": {}", self.message)?;
        }
        match &self.at {
            Some(at) => write!(f, " ({at})")?,
            // Monty checks the clock between bytecodes and gives that check no frame.
            None if self.exc_type == "TimeoutError" => f.write_str(
                " (Monty does not say which line was running; look for a loop that runs too long)",
            )?,
            None => {}
        }
        Ok(())
    }
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {}", self.line)?;
        if self.earlier {
            f.write_str(" of code run earlier")?;
        } else if let Some(c) = self.column {
            write!(f, ", column {c}")?;
        }
        if let Some(func) = &self.function {
            write!(f, ", in {func}")?;
        }
        if let Some(src) = &self.source {
            write!(f, ": {src}")?;
        }
        Ok(())
    }
}

impl PyError {
    /// `e` as raised by running `ran` (the code as written, before [`strip_host_awaits`]).
    fn new(e: &MontyException, ran: &Stripped, written: &str) -> PyError {
        PyError {
            exc_type: format!("{:?}", e.exc_type()),
            message: e.message().unwrap_or_default().to_owned(),
            at: locate(e, ran, written),
        }
    }
}

/// The innermost frame of `e`'s traceback, in the code as the person wrote it.
fn locate(e: &MontyException, ran: &Stripped, written: &str) -> Option<Location> {
    let tb = e.traceback();
    // The outermost frame is always the run's own code; a frame of another "file" is a
    // function an earlier run defined.
    let (outer, inner) = (tb.first()?, tb.last()?);
    let earlier = inner.filename != outer.filename;
    let line = inner.start.line;
    let (column, source) = if earlier {
        let first = inner.preview_line.as_deref().and_then(|p| p.lines().next());
        (None, first.map(str::to_owned))
    } else {
        let text = written.lines().nth(line.saturating_sub(1) as usize);
        (
            Some(ran.written_column(line, inner.start.column)),
            text.map(str::to_owned),
        )
    };
    Some(Location {
        line,
        column,
        function: inner.frame_name.clone().filter(|n| n != "<module>"),
        source: source.as_deref().and_then(quote),
        earlier,
    })
}

/// `line` trimmed and cut to [`SOURCE_CHARS`]; `None` when blank.
fn quote(line: &str) -> Option<String> {
    let t = line.trim();
    if t.is_empty() {
        return None;
    }
    if t.chars().count() <= SOURCE_CHARS {
        return Some(t.to_owned());
    }
    let mut s: String = t.chars().take(SOURCE_CHARS - 1).collect();
    s.push('…');
    Some(s)
}

/// The Python exceptions a host function may raise: the few herald's catalogs use, so a
/// host cannot raise what only the interpreter should (`SyntaxError`, `NameError`, ...).
/// Serialized under its Python name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum PyExc {
    /// The function exists but this caller may not use it (a mutating tool in a filter).
    PermissionError,
    /// Bad or missing arguments, or nothing serves what was asked for.
    ValueError,
    /// An argument of the wrong type.
    TypeError,
    /// A name that was looked up is not there.
    KeyError,
    /// The call took too long.
    TimeoutError,
    /// Anything else: the server failed, the connection was lost, too many calls.
    RuntimeError,
    /// The person pressed Ctrl-C (code mode): like Python's, `except Exception` lets it by.
    KeyboardInterrupt,
}

impl PyExc {
    /// Every kind, for tests and documentation.
    pub const ALL: [PyExc; 7] = [
        PyExc::PermissionError,
        PyExc::ValueError,
        PyExc::TypeError,
        PyExc::KeyError,
        PyExc::TimeoutError,
        PyExc::RuntimeError,
        PyExc::KeyboardInterrupt,
    ];

    /// The exception's Python name.
    pub fn name(self) -> &'static str {
        match self {
            PyExc::PermissionError => "PermissionError",
            PyExc::ValueError => "ValueError",
            PyExc::TypeError => "TypeError",
            PyExc::KeyError => "KeyError",
            PyExc::TimeoutError => "TimeoutError",
            PyExc::RuntimeError => "RuntimeError",
            PyExc::KeyboardInterrupt => "KeyboardInterrupt",
        }
    }
}

impl std::fmt::Display for PyExc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl From<PyExc> for ExcType {
    fn from(e: PyExc) -> ExcType {
        match e {
            PyExc::PermissionError => ExcType::PermissionError,
            PyExc::ValueError => ExcType::ValueError,
            PyExc::TypeError => ExcType::TypeError,
            PyExc::KeyError => ExcType::KeyError,
            PyExc::TimeoutError => ExcType::TimeoutError,
            PyExc::RuntimeError => ExcType::RuntimeError,
            PyExc::KeyboardInterrupt => ExcType::KeyboardInterrupt,
        }
    }
}

/// What a host function call failed with, raised in Python as `kind`. The same type travels
/// from a [`Catalog`](crate::filter::pool::Catalog) over the worker pipe into the engine.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct HostError {
    pub kind: PyExc,
    pub message: String,
}

impl HostError {
    pub fn new(kind: PyExc, message: impl Into<String>) -> HostError {
        HostError {
            kind,
            message: message.into(),
        }
    }
}

/// The functions a scope can call.
pub trait Host {
    /// Whether `name` is one of the host's functions.
    fn provides(&self, name: &str) -> bool;
    /// Calls `name`.
    fn call(
        &mut self,
        name: &str,
        args: Vec<Value>,
        kwargs: Map<String, Value>,
    ) -> Result<Value, HostError>;
}

/// Code with the `await`s in front of host calls dropped, and where they were, so that a
/// column Monty reports in it can be turned back into one in the code as written.
#[derive(Debug, Default)]
pub struct Stripped {
    pub code: String,
    /// Each cut: its line and column in `code` (1-based) and the characters dropped there.
    cuts: Vec<(u32, u32, u32)>,
}

impl Stripped {
    /// The column in the code as written of `column` on `line` of [`Stripped::code`].
    pub fn written_column(&self, line: u32, column: u32) -> u32 {
        let dropped: u32 = self
            .cuts
            .iter()
            .filter(|(l, c, _)| *l == line && *c <= column)
            .map(|(_, _, n)| n)
            .sum();
        column + dropped
    }
}

/// Drops `await` in front of calls to host functions (see the module docs). String literals
/// and comments are left exactly as written, and so are line breaks: every line keeps its
/// number.
pub fn strip_host_awaits(code: &str, is_host: impl Fn(&str) -> bool) -> Stripped {
    let mut out = Stripped {
        code: String::with_capacity(code.len()),
        cuts: Vec::new(),
    };
    for (is_code, part) in python_segments(code) {
        if is_code {
            strip_in_code(part, &is_host, &mut out);
        } else {
            out.code.push_str(part);
        }
    }
    out
}

/// Splits Python source into code and non-code (string literals, comments) runs. The
/// replacement fields of f-strings (`{...}`) are code. Quotes, braces, `#` and `\\` are
/// ASCII, so byte offsets are always on character boundaries.
fn python_segments(code: &str) -> Vec<(bool, &str)> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    let mut push = |is_code: bool, from: usize, to: usize| {
        if from < to {
            out.push((is_code, &code[from..to]));
        }
    };
    let (mut start, mut i) = (0, 0);
    while i < b.len() {
        match b[i] {
            b'#' => {
                let end = code[i..].find('\n').map_or(b.len(), |n| i + n);
                push(true, start, i);
                push(false, i, end);
                (start, i) = (end, end);
            }
            q @ (b'\'' | b'"') => {
                let f = is_f_string(b, i);
                push(true, start, i);
                let triple = b[i..].starts_with(&[q, q, q]);
                let open = if triple { 3 } else { 1 };
                let mut j = i + open;
                let mut seg = i;
                let end = loop {
                    match b.get(j) {
                        None => break b.len(),
                        Some(b'\\') => j += 2,
                        Some(b'{') if f && b.get(j + 1) == Some(&b'{') => j += 2,
                        Some(b'{') if f => {
                            // A replacement field: code up to its matching brace.
                            push(false, seg, j + 1);
                            let mut depth = 1;
                            let mut k = j + 1;
                            while k < b.len() {
                                match b[k] {
                                    b'{' => depth += 1,
                                    b'}' => depth -= 1,
                                    b'\n' if !triple => break,
                                    _ => {}
                                }
                                if depth == 0 {
                                    break;
                                }
                                k += 1;
                            }
                            push(true, j + 1, k);
                            (seg, j) = (k, k.max(j + 1));
                        }
                        Some(&c) if c == q && (!triple || b[j..].starts_with(&[q, q, q])) => {
                            break j + open;
                        }
                        // An unterminated one-line string ends at the line's end.
                        Some(b'\n') if !triple => break j,
                        Some(_) => j += 1,
                    }
                };
                let end = end.min(b.len());
                push(false, seg, end);
                (start, i) = (end, end);
            }
            _ => i += 1,
        }
    }
    push(true, start, b.len());
    out
}

/// Whether the quote at `i` opens an f-string (a prefix like `f`, `rf`, `Fr`).
fn is_f_string(b: &[u8], i: usize) -> bool {
    let mut p = i;
    while p > 0 && i - p < 2 && b"rRbBfFuU".contains(&b[p - 1]) {
        p -= 1;
    }
    let standalone = p == 0 || !(b[p - 1].is_ascii_alphanumeric() || b[p - 1] == b'_');
    standalone && b[p..i].iter().any(|c| *c == b'f' || *c == b'F')
}

fn strip_in_code(code: &str, is_host: &impl Fn(&str) -> bool, out: &mut Stripped) {
    let mut rest = code;
    while let Some(i) = rest.find("await") {
        let before_ok = rest[..i]
            .chars()
            .last()
            .is_none_or(|c| !(c.is_alphanumeric() || c == '_'));
        let after = &rest[i + 5..];
        let trimmed = after.trim_start();
        let ident: String = trimmed
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let called = trimmed[ident.len()..].trim_start().starts_with('(');
        let spaced = after.len() > trimmed.len();
        if before_ok && spaced && !ident.is_empty() && called && is_host(&ident) {
            out.code.push_str(&rest[..i]);
            // Only the `await` and the blanks after it on its own line go: a line break
            // (inside brackets) stays, so every line keeps its number.
            let blanks = after.len() - after.trim_start_matches([' ', '\t']).len();
            let kept = if after[blanks..].starts_with(['\n', '\r']) {
                &after[blanks..]
            } else {
                trimmed
            };
            let line_start = out.code.rfind('\n').map_or(0, |n| n + 1);
            let line = out.code.matches('\n').count() as u32 + 1;
            let column = out.code[line_start..].chars().count() as u32 + 1;
            let dropped = rest[i..].len() - kept.len();
            out.cuts
                .push((line, column, rest[i..i + dropped].chars().count() as u32));
            rest = kept;
        } else {
            out.code.push_str(&rest[..i + 5]);
            rest = after;
        }
    }
    out.code.push_str(rest);
}

/// A persistent Python scope.
pub struct Scope {
    repl: Option<MontyRepl>,
}

impl Default for Scope {
    fn default() -> Self {
        Scope::new()
    }
}

fn fresh_repl(time: Duration) -> MontyRepl {
    let limits = ResourceLimits::default()
        .max_duration(time)
        .max_recursion_depth(200);
    MontyRepl::new(
        "on_event.py",
        ResourceTracker::new(limits),
        CompileOptions::default(),
    )
}

impl Scope {
    pub fn new() -> Scope {
        Scope { repl: None }
    }

    /// Runs `code` with `inputs` bound as globals.
    pub fn run(
        &mut self,
        code: &str,
        inputs: Vec<(String, Value)>,
        limits: RunLimits,
        host: &mut dyn Host,
    ) -> Result<Outcome, PyError> {
        let mut repl = self.repl.take().unwrap_or_else(|| fresh_repl(limits.time));
        // Monty's time budget accumulates over the REPL's life; give every run its own.
        repl.tracker_mut().set_max_duration(limits.time);
        let written = code;
        let ran = strip_host_awaits(code, |n| host.provides(n));
        let inputs: Vec<(String, MontyObject)> =
            inputs.into_iter().map(|(k, v)| (k, to_py(&v))).collect();
        let mut printed = String::new();
        let mut calls = 0usize;
        let mut progress = repl.feed_start(
            &ran.code,
            inputs,
            PrintWriter::CollectString(&mut printed, Some(limits.max_print_bytes)),
        );
        loop {
            let step = match progress {
                Err(e) => {
                    let err = PyError::new(&e.error, &ran, written);
                    self.repl = Some(e.repl);
                    return Err(err);
                }
                Ok(ReplProgress::Complete { repl, value }) => {
                    self.repl = Some(repl);
                    return Ok(Outcome {
                        value: to_json(&value),
                        printed,
                        fresh_scope: false,
                    });
                }
                Ok(ReplProgress::NameLookup(l)) => {
                    let found = if host.provides(&l.name) {
                        NameLookupResult::Value(MontyObject::Function {
                            name: l.name.clone(),
                            docstring: None,
                        })
                    } else {
                        NameLookupResult::Undefined
                    };
                    l.resume(
                        found,
                        PrintWriter::CollectString(&mut printed, Some(limits.max_print_bytes)),
                    )
                }
                Ok(ReplProgress::FunctionCall(c)) => {
                    let known = host.provides(&c.function_name);
                    if known {
                        calls += 1;
                    }
                    let result = if !known {
                        // Monty calls an unknown global straight through to the host; to
                        // Python it is simply an undefined name.
                        ExtFunctionResult::Error(MontyException::new(
                            ExcType::NameError,
                            Some(format!("name '{}' is not defined", c.function_name)),
                        ))
                    } else if calls > limits.max_calls {
                        ExtFunctionResult::Error(MontyException::new(
                            ExcType::RuntimeError,
                            Some(format!(
                                "more than {} tool calls in one run; do less per event",
                                limits.max_calls
                            )),
                        ))
                    } else {
                        let args = c.args.iter().map(to_json).collect();
                        let kwargs = c
                            .kwargs
                            .iter()
                            .map(|(k, v)| {
                                let key = match to_json(k) {
                                    Value::String(s) => s,
                                    other => other.to_string(),
                                };
                                (key, to_json(v))
                            })
                            .collect();
                        match host.call(&c.function_name, args, kwargs) {
                            Ok(v) => ExtFunctionResult::Return(to_py(&v)),
                            Err(e) => ExtFunctionResult::Error(MontyException::new(
                                e.kind.into(),
                                Some(e.message),
                            )),
                        }
                    };
                    c.resume(
                        result,
                        PrintWriter::CollectString(&mut printed, Some(limits.max_print_bytes)),
                    )
                }
                Ok(ReplProgress::OsCall(o)) => o.abort(
                    MontyException::new(
                        ExcType::PermissionError,
                        Some("the sandbox has no file, environment or process access".into()),
                    ),
                    PrintWriter::CollectString(&mut printed, Some(limits.max_print_bytes)),
                ),
                Ok(ReplProgress::ResolveFutures(f)) => {
                    // Host calls resolve synchronously, so nothing can be pending here.
                    let ids: Vec<(u32, ExtFunctionResult)> = f
                        .pending_call_ids()
                        .iter()
                        .map(|id| {
                            (
                                *id,
                                ExtFunctionResult::Error(MontyException::new(
                                    ExcType::RuntimeError,
                                    Some("nothing to await".into()),
                                )),
                            )
                        })
                        .collect();
                    f.resume(
                        ids,
                        PrintWriter::CollectString(&mut printed, Some(limits.max_print_bytes)),
                    )
                }
            };
            progress = step;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    struct Catalog {
        calls: Vec<String>,
    }

    impl Host for Catalog {
        fn provides(&self, name: &str) -> bool {
            matches!(name, "read_resource" | "memo_set")
        }
        fn call(
            &mut self,
            name: &str,
            _args: Vec<Value>,
            kwargs: Map<String, Value>,
        ) -> Result<Value, HostError> {
            self.calls.push(name.to_owned());
            match name {
                "read_resource" => Ok(json!({"uri": kwargs.get("uri"), "n": 1})),
                _ => Err(HostError::new(
                    PyExc::PermissionError,
                    format!("{name} is not available in filters: they are read-only"),
                )),
            }
        }
    }

    fn run(scope: &mut Scope, code: &str, event: Value) -> Result<Outcome, PyError> {
        scope.run(
            code,
            vec![("event".into(), event)],
            RunLimits::default(),
            &mut Catalog { calls: vec![] },
        )
    }

    const REFERENCE: &str = r#"
m = event["object"]["metadata"]
f'{event["type"].lower()} {m["namespace"]}/{m["name"]}' if event["type"] in ("ADDED", "DELETED") else None
"#;

    #[test]
    fn the_reference_filter_transforms_and_drops() {
        let mut s = Scope::new();
        let ev = |t: &str| json!({"type": t, "object": {"metadata": {"name": "cm1", "namespace": "default"}}});
        assert_eq!(
            run(&mut s, REFERENCE, ev("ADDED")).unwrap().value,
            json!("added default/cm1")
        );
        assert_eq!(
            run(&mut s, REFERENCE, ev("MODIFIED")).unwrap().value,
            Value::Null
        );
        assert_eq!(
            run(&mut s, "m['name']", json!(null)).unwrap().value,
            json!("cm1"),
            "variables persist"
        );
    }

    #[test]
    fn errors_print_host_calls_and_limits() {
        let mut s = Scope::new();
        let e = run(&mut s, "x = (", json!(null)).unwrap_err();
        assert_eq!(e.exc_type, "SyntaxError");
        let e = run(&mut s, "undefined_name + 1", json!(null)).unwrap_err();
        assert_eq!(e.exc_type, "NameError");
        let e = run(&mut s, "undefined_helper(event)", json!(null)).unwrap_err();
        assert_eq!(
            e.exc_type, "NameError",
            "calling an unknown name is a NameError too"
        );
        let o = run(&mut s, "print('hi')\nNone", json!(null)).unwrap();
        assert_eq!((o.value, o.printed.trim()), (Value::Null, "hi"));
        let o = run(
            &mut s,
            "r = await read_resource(uri='memo://notes')\nr['uri']",
            json!(null),
        )
        .unwrap();
        assert_eq!(o.value, json!("memo://notes"));
        let e = run(&mut s, "memo_set(key='a', value=1)", json!(null)).unwrap_err();
        assert_eq!(e.exc_type, "PermissionError");
        let e = run(
            &mut s,
            "for i in range(11):\n    read_resource(uri='x')\n",
            json!(null),
        )
        .unwrap_err();
        assert!(e.message.contains("more than 10 tool calls"), "{e}");
        let e = run(&mut s, "open('/etc/passwd').read()", json!(null)).unwrap_err();
        assert!(
            e.exc_type == "PermissionError" || e.exc_type == "NameError",
            "{e}"
        );
        let e = run(&mut s, "import os\nos.getenv('HOME')", json!(null)).unwrap_err();
        assert!(!e.exc_type.is_empty(), "{e}");
    }

    /// Why `filter::shape::never_notices` may refuse code that ends in a statement: Monty
    /// gives it no value, whatever its branches hold.
    #[test]
    fn code_that_ends_in_a_statement_has_no_value() {
        let mut s = Scope::new();
        for code in [
            "if True:\n    'added'\nelse:\n    None\n",
            "msg = 'added'\n",
            "for x in [1]:\n    'added'\n",
        ] {
            assert_eq!(
                run(&mut s, code, json!(null)).unwrap().value,
                Value::Null,
                "{code}"
            );
        }
        assert_eq!(
            run(&mut s, "msg", json!(null)).unwrap().value,
            json!("added")
        );
    }

    /// Where `code` raised, as herald says it.
    fn raised_at(s: &mut Scope, code: &str) -> String {
        let e = run(s, code, json!(null)).unwrap_err();
        format!("{e}")
    }

    #[test]
    fn every_error_names_its_line_and_column_in_the_code_as_written() {
        let mut s = Scope::new();
        assert_eq!(
            raised_at(&mut s, "x = 1\nx +\n"),
            "SyntaxError: Expected an expression (line 2, column 4: x +)"
        );
        assert_eq!(
            raised_at(&mut s, "a = 1\nb = {}\nb['k']\n"),
            "KeyError: k (line 3, column 1: b['k'])"
        );
        assert_eq!(
            raised_at(&mut s, "x = 1\n\nundefined_name + 1"),
            "NameError: name 'undefined_name' is not defined (line 3, column 1: undefined_name + 1)"
        );
        assert_eq!(
            raised_at(&mut s, "def f(d):\n    return d['k']\nf({})"),
            "KeyError: k (line 2, column 12, in f: return d['k'])"
        );
        // A column after a dropped `await` counts it, as the person wrote it.
        assert_eq!(
            raised_at(
                &mut s,
                "r = {'a': await read_resource(uri='u'), 'b': {}['k']}"
            ),
            "KeyError: k (line 1, column 46: r = {'a': await read_resource(uri='u'), 'b': {}['k']})"
        );
        // Limits: the call cap and recursion name the line too.
        assert_eq!(
            raised_at(&mut s, "for i in range(11):\n    read_resource(uri='x')\n"),
            "RuntimeError: more than 10 tool calls in one run; do less per event (line 2, column 5: read_resource(uri='x'))"
        );
        let e = raised_at(&mut s, "def f(n):\n    return f(n + 1)\nf(0)");
        assert!(
            e.starts_with(
                "RecursionError: maximum recursion depth exceeded (line 2, column 12, in f:"
            ),
            "{e}"
        );
        // A function an earlier run defined: its line there, not a column of this run.
        run(&mut s, "def g(d):\n    return d['k']\n", json!(null)).unwrap();
        assert_eq!(
            raised_at(&mut s, "\n\ng({})"),
            "KeyError: k (line 2 of code run earlier, in g: return d['k'])"
        );
        let long = format!("x = {{}}['{}']", "k".repeat(200));
        let e = raised_at(&mut s, &long);
        assert!(e.ends_with("…)") && e.len() < 400, "{e}");
    }

    #[test]
    fn dropping_an_await_keeps_every_line_break() {
        let host = |n: &str| n == "read_resource";
        let code = "x = [await\n  read_resource(uri='u')]\ny = 1";
        let s = strip_host_awaits(code, host);
        assert_eq!(s.code, "x = [\n  read_resource(uri='u')]\ny = 1");
        assert_eq!(s.code.lines().count(), code.lines().count());
        let s = strip_host_awaits(
            "a = await read_resource(uri='u') + await read_resource(uri='v')",
            host,
        );
        assert_eq!(
            s.code,
            "a = read_resource(uri='u') + read_resource(uri='v')"
        );
        assert_eq!((s.written_column(1, 1), s.written_column(1, 5)), (1, 11));
        assert_eq!(s.written_column(1, 30), 42, "after both cuts");
    }

    /// A host whose one function `f` always fails with `0`.
    struct Raising(PyExc);

    impl Host for Raising {
        fn provides(&self, name: &str) -> bool {
            name == "f"
        }
        fn call(
            &mut self,
            _: &str,
            _: Vec<Value>,
            _: Map<String, Value>,
        ) -> Result<Value, HostError> {
            Err(HostError::new(self.0, "it failed"))
        }
    }

    #[test]
    fn host_errors_reach_python_as_their_exception_type() {
        for kind in PyExc::ALL {
            let mut s = Scope::new();
            let mut host = Raising(kind);
            let e = s
                .run("f()", vec![], RunLimits::default(), &mut host)
                .unwrap_err();
            assert_eq!(
                (e.exc_type.as_str(), e.message.as_str()),
                (kind.name(), "it failed")
            );
            let caught = format!("try:\n    f()\nexcept {kind}:\n    r = 'caught'\nr");
            let o = s
                .run(&caught, vec![], RunLimits::default(), &mut host)
                .unwrap();
            assert_eq!(o.value, json!("caught"), "{kind} is catchable as itself");
        }
    }

    #[test]
    fn each_run_gets_its_own_time_budget() {
        let mut s = Scope::new();
        let limits = RunLimits {
            time: Duration::from_millis(200),
            ..RunLimits::default()
        };
        let mut host = Catalog { calls: vec![] };
        let e = s
            .run("while True:\n    pass\n", vec![], limits, &mut host)
            .unwrap_err();
        assert_eq!(e.exc_type, "TimeoutError");
        assert!(e.to_string().contains("look for a loop"), "{e}");
        let o = s.run("1 + 1", vec![], limits, &mut host).unwrap();
        assert_eq!(
            o.value,
            json!(2),
            "the next run is not starved by the last one"
        );
    }

    fn stripped(code: &str, is_host: impl Fn(&str) -> bool) -> String {
        strip_host_awaits(code, is_host).code
    }

    #[test]
    fn awaits_on_host_calls_only_are_dropped() {
        let host = |n: &str| n == "read_resource";
        assert_eq!(
            stripped("x = await read_resource(uri=u)", host),
            "x = read_resource(uri=u)"
        );
        assert_eq!(stripped("await other()", host), "await other()");
        assert_eq!(stripped("awaited = 1", host), "awaited = 1");
        for literal in [
            "s = 'await read_resource(x)'",
            "s = \"it's await read_resource(x)\"",
            "s = '''\nawait read_resource(x)\n'''",
            "s = 'a\\' await read_resource(x)'",
            "# await read_resource(x)\ny = 1",
        ] {
            assert_eq!(stripped(literal, host), literal);
        }
        assert_eq!(
            stripped("s = 'x' + await read_resource(uri='await')", host),
            "s = 'x' + read_resource(uri='await')"
        );
        assert_eq!(
            stripped("bad = 'open\nx = await read_resource(u)", host),
            "bad = 'open\nx = read_resource(u)"
        );
        // f-string fields are code; the text around them is not.
        assert_eq!(
            stripped(
                "s = f'{await read_resource(uri=u)} await read_resource(x)'",
                host
            ),
            "s = f'{read_resource(uri=u)} await read_resource(x)'"
        );
        assert_eq!(
            stripped(
                "s = rf\"{{await read_resource(x)}} {len(await list_resources())}\"",
                |n: &str| n == "list_resources"
            ),
            "s = rf\"{{await read_resource(x)}} {len(list_resources())}\""
        );
        assert_eq!(
            stripped("elif'await read_resource(x)'", host),
            "elif'await read_resource(x)'"
        );
    }
}
