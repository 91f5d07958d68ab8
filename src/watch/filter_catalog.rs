//! [`FilterCatalog`]: what Python sees. `on_event` filters get `read_resource`,
//! `list_resources` and the read-only tools of the watch client's servers; code mode gets the
//! same catalog with mutating tools and the watch built-ins (`watch_start`, `watch_stop`,
//! `watch_list`) allowed, which it calls through [`Watches`] (the manager, which this file
//! does not know). Filters see those too, only so that calling one raises a clear
//! `PermissionError` instead of a `NameError`.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Map, Value, json};

use crate::filter::engine::{HostError, PyExc};
use crate::filter::pool::Catalog as FilterHost;
use crate::upstream::{REQUEST_TIMEOUT, Upstream, pick};
use crate::watch::spec::{WatchError, WatchInfo};

/// What filters may call: `read_resource`, `list_resources`, and the read-only tools of the
/// connected servers. Mutating tools and the watch built-ins are named too, so that calling
/// one raises a clear `PermissionError` instead of a `NameError`.
pub(super) struct FilterCatalog {
    pub(super) servers: Vec<Arc<Upstream>>,
    /// Set in code mode: mutating tools and the watch built-ins are allowed.
    pub(super) code: Option<Arc<dyn Watches>>,
}

/// The watches code mode's built-ins start, stop and list: the watch manager's front door.
#[async_trait]
pub(super) trait Watches: Send + Sync {
    async fn watch_start(
        &self,
        name: &str,
        uri: &str,
        on_event: Option<&str>,
    ) -> Result<WatchInfo, WatchError>;
    async fn watch_stop(&self, name: &str) -> bool;
    fn watch_list(&self) -> Vec<WatchInfo>;
}

const WATCH_BUILTINS: [&str; 4] = [
    "watch_start",
    "watch_stop",
    "watch_list",
    "call_tool_as_task",
];

/// A function Python gets beside the servers' tools, as `help()` shows it.
#[derive(Debug, Clone, Copy)]
pub struct Builtin {
    pub name: &'static str,
    /// How to call it.
    pub call: &'static str,
    /// What it does, in one line.
    pub doc: &'static str,
    /// Offered only in code mode (a filter calling it gets a `PermissionError`, or for
    /// `help`, nothing).
    pub code_only: bool,
}

/// Every built-in. [`FilterCatalog::functions`] offers these (but `help`, which
/// [`CODE_PRELUDE`] defines in Python) and `help()` lists them: a new one needs its line here.
pub const BUILTINS: [Builtin; 7] = [
    Builtin {
        name: "list_resources",
        call: "list_resources()",
        doc: "every resource and template the servers list (dicts with uri or uriTemplate)",
        code_only: false,
    },
    Builtin {
        name: "read_resource",
        call: "read_resource(uri=...)",
        doc: "reads a resource: JSON as dicts and lists, other text as a str",
        code_only: false,
    },
    Builtin {
        name: "watch_start",
        call: "watch_start(name=..., uri=..., on_event=None)",
        doc: "watches uri (or task://ID); its notices print here; on_event: Python run per event, whose last expression is the notice",
        code_only: true,
    },
    Builtin {
        name: "watch_stop",
        call: "watch_stop(name=...)",
        doc: "stops a watch; True if it was running",
        code_only: true,
    },
    Builtin {
        name: "watch_list",
        call: "watch_list()",
        doc: "the watches, with their URIs, events and notices so far",
        code_only: true,
    },
    Builtin {
        name: "call_tool_as_task",
        call: "call_tool_as_task(name, args)",
        doc: "starts a tool as a task and returns its id; watch it with uri=\"task://\" + id",
        code_only: true,
    },
    Builtin {
        name: "help",
        call: "help(name=None)",
        doc: "this list; help(\"name\") for one built-in or tool in full",
        code_only: true,
    },
];

/// The host function behind code mode's `help`, which [`CODE_PRELUDE`] wraps: it returns
/// the text, `help` prints it.
const HELP_TEXT: &str = "_herald_help";

/// Python code mode runs in its scope before anything else (and again when the scope is
/// new): `help`, printing what [`BUILTINS`] and the servers' tools say.
pub const CODE_PRELUDE: &str = "def help(name=None):\n    print(_herald_help(name))\n";

fn py_err(kind: PyExc, message: String) -> HostError {
    HostError::new(kind, message)
}

impl FilterCatalog {
    /// `help()`'s text: every built-in of code mode and every tool of the connected servers,
    /// one line each; with `name`, that one in full.
    fn help(&self, name: Option<&str>) -> String {
        let catalogs: Vec<_> = self
            .servers
            .iter()
            .map(|s| (s.name.as_str(), s.catalog()))
            .collect();
        if let Some(name) = name {
            if let Some(b) = BUILTINS.iter().find(|b| b.name == name) {
                return format!("{}\n    {}", b.call, b.doc);
            }
            for (server, c) in &catalogs {
                if let Some(t) = c
                    .iter()
                    .flat_map(|c| c.tools.iter())
                    .find(|t| t.name == name)
                {
                    return tool_help(server, t);
                }
            }
            return format!("no built-in or tool named {name}; help() lists them");
        }
        let mut out =
            String::from("Built-ins (call with keyword arguments; `await` is optional):\n");
        for b in &BUILTINS {
            out.push_str(&format!("  {:<46} {}\n", b.call, b.doc));
        }
        for (server, c) in &catalogs {
            match c {
                None => out.push_str(&format!("Tools of {server}: not connected yet\n")),
                Some(c) if c.tools.is_empty() => {}
                Some(c) => {
                    out.push_str(&format!("Tools of {server}:\n"));
                    for t in &c.tools {
                        let doc = t.description.as_deref().unwrap_or("");
                        let first = doc.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
                        out.push_str(&format!("  {:<46} {}\n", tool_call(t), first.trim()));
                    }
                }
            }
        }
        out.push_str("help(\"name\") shows one in full.");
        out
    }

    /// Code mode's `call_tool_as_task(name, args)`: starts the tool as a task on the server
    /// that has it and returns the task's id (watch it with `watch_start(name=...,
    /// uri="task://" + id)`).
    async fn call_as_task(&self, tool: &str, args: Map<String, Value>) -> Result<Value, HostError> {
        let owner = self.servers.iter().find_map(|s| {
            let c = s.catalog()?;
            let t = c.tools.iter().find(|t| t.name == tool)?;
            Some((s.clone(), crate::mcp::tasks::task_support(t)))
        });
        let Some((server, support)) = owner else {
            return Err(py_err(
                PyExc::ValueError,
                format!("no connected server has a tool named {tool}"),
            ));
        };
        if support == crate::mcp::tasks::TaskSupport::Forbidden {
            return Err(py_err(
                PyExc::ValueError,
                format!("{tool} does not run as a task on its server; call {tool}(...) directly"),
            ));
        }
        let params = rmcp::model::CallToolRequestParams::new(tool.to_owned()).with_arguments(args);
        let answer = server
            .tasks_request(
                rmcp::model::ClientRequest::CallToolRequest(rmcp::model::Request::new(params)),
                REQUEST_TIMEOUT,
                None,
            )
            .await
            .map_err(|e| py_err(PyExc::RuntimeError, e.to_string()))?;
        match answer {
            rmcp::model::ServerResult::CreateTaskResult(t) => Ok(Value::String(t.task.task_id)),
            // It ran already: say what it answered, so nobody runs it twice.
            rmcp::model::ServerResult::CallToolResult(r) => Err(py_err(
                PyExc::RuntimeError,
                format!(
                    "{tool} ran in place instead of as a task (its server made no task); it answered: {}",
                    serde_json::to_string(&r).unwrap_or_default()
                ),
            )),
            _ => Err(py_err(
                PyExc::RuntimeError,
                format!("{tool} answered with neither a task nor a result"),
            )),
        }
    }
}

/// How to call `t`: its arguments by name, the optional ones `=...`.
fn tool_call(t: &rmcp::model::Tool) -> String {
    let required: Vec<&str> = t
        .input_schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let args: Vec<String> = t
        .input_schema
        .get("properties")
        .and_then(Value::as_object)
        .map(|p| {
            p.keys()
                .map(|k| match required.contains(&k.as_str()) {
                    true => format!("{k}=..."),
                    false => format!("{k}=None"),
                })
                .collect()
        })
        .unwrap_or_default();
    format!("{}({})", t.name, args.join(", "))
}

/// One tool in full: how to call it, its description, and each argument's own.
fn tool_help(server: &str, t: &rmcp::model::Tool) -> String {
    let mut out = format!("{} (a tool of {server})", tool_call(t));
    if let Some(d) = t.description.as_deref() {
        for l in d.trim().lines() {
            out.push_str(&format!("\n    {}", l.trim_end()));
        }
    }
    if let Some(props) = t.input_schema.get("properties").and_then(Value::as_object) {
        for (k, v) in props {
            let doc = v.get("description").and_then(Value::as_str).unwrap_or("");
            out.push_str(&format!("\n  {k}: {doc}"));
        }
    }
    out
}

#[async_trait::async_trait]
impl FilterHost for FilterCatalog {
    fn functions(&self) -> Vec<String> {
        let mut names: Vec<String> = BUILTINS
            .iter()
            // help is Python (CODE_PRELUDE); the watch built-ins are named in filters too,
            // to refuse them clearly.
            .filter(|b| b.name != "help")
            .map(|b| b.name.to_owned())
            .collect();
        if self.code.is_some() {
            names.push(HELP_TEXT.to_owned());
        }
        for c in self.servers.iter().filter_map(|s| s.catalog()) {
            names.extend(c.tools.iter().map(|t| t.name.to_string()));
        }
        names.sort();
        names.dedup();
        names
    }

    async fn call(
        &self,
        name: &str,
        args: Vec<Value>,
        kwargs: Map<String, Value>,
    ) -> Result<Value, HostError> {
        if self.code.is_some() && name == HELP_TEXT {
            let name = kwargs.get("name").or_else(|| args.first());
            return match name {
                None | Some(Value::Null) => Ok(Value::String(self.help(None))),
                Some(Value::String(n)) => Ok(Value::String(self.help(Some(n)))),
                Some(other) => Err(py_err(
                    PyExc::TypeError,
                    format!("help takes the name of a built-in or tool as a str, not {other}"),
                )),
            };
        }
        if let Some(watches) = &self.code
            && WATCH_BUILTINS.contains(&name)
        {
            let arg = |k: &str, i: usize| kwargs.get(k).or_else(|| args.get(i)).cloned();
            return match name {
                "watch_start" => {
                    let (Some(Value::String(n)), Some(Value::String(u))) =
                        (arg("name", 0), arg("uri", 1))
                    else {
                        return Err(py_err(
                            PyExc::ValueError,
                            "watch_start needs name=\"...\" and uri=\"...\"".into(),
                        ));
                    };
                    let on_event = match arg("on_event", 2) {
                        None | Some(Value::Null) => None,
                        Some(Value::String(code)) => Some(code),
                        Some(other) => {
                            return Err(py_err(
                                PyExc::TypeError,
                                format!(
                                    "on_event must be Python source text (a str), not {other}; pass the code as a string"
                                ),
                            ));
                        }
                    };
                    let info = watches
                        .watch_start(&n, &u, on_event.as_deref())
                        .await
                        .map_err(|e| py_err(PyExc::ValueError, e.to_string()))?;
                    Ok(json!({"name": info.name, "uri": info.uri, "shape": info.shape}))
                }
                "call_tool_as_task" => {
                    let Some(Value::String(tool)) = arg("name", 0) else {
                        return Err(py_err(
                            PyExc::ValueError,
                            "call_tool_as_task needs name=\"...\" (and args={...})".into(),
                        ));
                    };
                    let args = match arg("args", 1) {
                        None | Some(Value::Null) => Map::new(),
                        Some(Value::Object(m)) => m,
                        Some(other) => {
                            return Err(py_err(
                                PyExc::TypeError,
                                format!("args must be a dict of the tool's arguments, not {other}"),
                            ));
                        }
                    };
                    self.call_as_task(&tool, args).await
                }
                "watch_stop" => {
                    let Some(Value::String(n)) = arg("name", 0) else {
                        return Err(py_err(
                            PyExc::ValueError,
                            "watch_stop needs name=\"...\"".into(),
                        ));
                    };
                    Ok(Value::Bool(watches.watch_stop(&n).await))
                }
                _ => Ok(serde_json::to_value(watches.watch_list()).unwrap_or_default()),
            };
        }
        if WATCH_BUILTINS.contains(&name) {
            return Err(py_err(
                PyExc::PermissionError,
                format!(
                    "{name} is not available in filters: a filter cannot start or stop watches or tasks"
                ),
            ));
        }
        match name {
            "read_resource" => {
                let uri = kwargs
                    .get("uri")
                    .or_else(|| args.first())
                    .and_then(Value::as_str)
                    .ok_or_else(|| {
                        py_err(PyExc::ValueError, "read_resource needs uri=\"...\"".into())
                    })?;
                let server = pick(&self.servers, uri).cloned().ok_or_else(|| {
                    py_err(
                        PyExc::ValueError,
                        format!("no connected server serves {uri}"),
                    )
                })?;
                let c = server.read(uri, None).await.map_err(|e| {
                    py_err(
                        PyExc::RuntimeError,
                        format!("reading {uri} from {}: {e}", server.name),
                    )
                })?;
                let text = match c.body {
                    crate::mcp::source::Body::Text(t) => t,
                    crate::mcp::source::Body::Blob(b) => {
                        use base64::Engine as _;
                        base64::engine::general_purpose::STANDARD.encode(b)
                    }
                };
                Ok(serde_json::from_str(&text).unwrap_or(Value::String(text)))
            }
            "list_resources" => {
                let mut all = Vec::new();
                for c in self.servers.iter().filter_map(|s| s.catalog()) {
                    all.extend(c.listing.iter().cloned());
                }
                Ok(Value::Array(all))
            }
            tool => {
                let owner = self.servers.iter().find_map(|s| {
                    let ro = s.catalog()?.read_only(tool)?;
                    Some((s.clone(), ro))
                });
                let Some((server, read_only)) = owner else {
                    return Err(py_err(
                        PyExc::ValueError,
                        format!("no connected server has a tool named {tool}"),
                    ));
                };
                if !read_only && self.code.is_none() {
                    return Err(py_err(
                        PyExc::PermissionError,
                        format!(
                            "{tool} is a mutating tool (not annotated readOnlyHint): filters are read-only"
                        ),
                    ));
                }
                if !args.is_empty() {
                    return Err(py_err(
                        PyExc::ValueError,
                        format!("call {tool} with keyword arguments, e.g. {tool}(name=...)"),
                    ));
                }
                // Through the upstream client, as every call to a server goes: in-process,
                // direct HTTP or its connection, bounded by its request timeout.
                let r = server
                    .call_tool(tool, kwargs, crate::mcp::source::Call::default())
                    .await
                    .map_err(|e| match e {
                        crate::upstream::UpstreamError::TimedOut { .. } => {
                            py_err(PyExc::TimeoutError, format!("{tool} took too long"))
                        }
                        e => py_err(PyExc::RuntimeError, e.to_string()),
                    })?;
                let r = match r {
                    rmcp::model::CallToolResponse::Complete(r) => r,
                    _ => {
                        return Err(py_err(
                            PyExc::RuntimeError,
                            format!("{tool} asks for input, which a filter cannot give"),
                        ));
                    }
                };
                let text: Vec<String> = r
                    .content
                    .iter()
                    .filter_map(|c| c.as_text().map(|t| t.text.clone()))
                    .collect();
                if r.is_error == Some(true) {
                    return Err(py_err(
                        PyExc::RuntimeError,
                        format!("{tool} failed: {}", text.join(" ")),
                    ));
                }
                if let Some(v) = r.structured_content {
                    return Ok(v);
                }
                let text = text.join("\n");
                Ok(serde_json::from_str(&text).unwrap_or(Value::String(text)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use tokio::sync::mpsc;

    use crate::testing::MemoServer;
    use crate::watch::WatchManager;
    use crate::watch::log::WatchLog;
    use crate::watch::spec::WatchConfig;

    /// The catalog in filter mode (`code: false`) or code mode, over a connected memo source.
    async fn catalog(memo: &MemoServer, code: bool) -> (FilterCatalog, WatchManager) {
        let (cat, mgr, _) = catalog_with_notices(memo, code).await;
        (cat, mgr)
    }

    /// [`catalog`], and the notices of the watches its manager runs.
    async fn catalog_with_notices(
        memo: &MemoServer,
        code: bool,
    ) -> (
        FilterCatalog,
        WatchManager,
        mpsc::Receiver<crate::watch::spec::Notice>,
    ) {
        let up = memo.upstream_with(crate::watch::upstream_config(
            crate::transport::target::Target::Stdio("in-process memo".into()),
            Default::default(),
            1 << 20,
        ));
        up.connect().await.unwrap();
        let (tx, rx) = mpsc::channel(16);
        let mgr = WatchManager::new(
            WatchConfig::default(),
            vec![up.clone()],
            tx,
            WatchLog::silent(),
            None,
        );
        let cat = FilterCatalog {
            servers: vec![up],
            code: code.then(|| Arc::new(mgr.clone()) as Arc<dyn Watches>),
        };
        (cat, mgr, rx)
    }

    fn kwargs(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    /// The Python exception type of a refused call.
    fn exc(r: Result<Value, HostError>) -> String {
        r.expect_err("the call is refused").kind.to_string()
    }

    #[tokio::test]
    async fn filters_see_every_name_but_may_not_mutate_or_start_watches() {
        let memo = MemoServer::start().await;
        let (cat, _mgr) = catalog(&memo, false).await;
        let names = cat.functions();
        for n in ["read_resource", "list_resources", "watch_start", "memo_set"] {
            assert!(names.iter().any(|x| x == n), "{n} in {names:?}");
        }
        let set = cat
            .call(
                "memo_set",
                Vec::new(),
                kwargs(json!({"key": "k", "value": 1})),
            )
            .await;
        assert_eq!(exc(set), "PermissionError");
        let notes = cat
            .call("read_resource", vec![json!("memo://notes")], Map::new())
            .await
            .unwrap();
        assert_eq!(notes, json!({}), "nothing was written");
        for builtin in WATCH_BUILTINS {
            let r = cat.call(builtin, Vec::new(), Map::new()).await;
            assert_eq!(exc(r), "PermissionError", "{builtin}");
        }
        let unknown = cat.call("no_such_tool", Vec::new(), Map::new()).await;
        assert_eq!(exc(unknown), "ValueError");
    }

    #[tokio::test]
    async fn help_lists_every_builtin_and_every_tool_with_its_line() {
        let memo = MemoServer::start().await;
        let (cat, mgr) = catalog(&memo, true).await;
        let help = |name: Option<&str>| {
            let args = name.map(|n| vec![json!(n)]).unwrap_or_default();
            let cat = &cat;
            async move { cat.call(HELP_TEXT, args, Map::new()).await.unwrap() }
        };
        let all = help(None).await;
        let all = all.as_str().unwrap();
        for b in &BUILTINS {
            assert!(!b.doc.is_empty() && b.call.starts_with(b.name), "{b:?}");
            let line = all
                .lines()
                .find(|l| l.trim_start().starts_with(b.call))
                .unwrap_or_else(|| panic!("{} is not in help():\n{all}", b.name));
            assert!(line.ends_with(b.doc), "{line}");
        }
        // Every function Python gets is a tool or has its line above; the watch built-ins
        // (refused in filters) are among them.
        let tools: Vec<String> = cat.servers[0]
            .catalog()
            .map(|c| c.tools.iter().map(|t| t.name.to_string()).collect())
            .unwrap_or_default();
        for f in cat.functions() {
            assert!(
                f == HELP_TEXT || tools.contains(&f) || BUILTINS.iter().any(|b| b.name == f),
                "{f} has no line in BUILTINS"
            );
        }
        for w in WATCH_BUILTINS {
            assert!(BUILTINS.iter().any(|b| b.name == w && b.code_only), "{w}");
        }
        assert!(
            all.contains("memo_set(key=..., value=...)"),
            "the tools, with their arguments:\n{all}"
        );
        let one = help(Some("memo_wait")).await;
        let one = one.as_str().unwrap();
        assert!(
            one.starts_with("memo_wait(key=..., timeout_ms=None) (a tool of "),
            "{one}"
        );
        assert!(one.contains("\n  timeout_ms: "), "{one}");
        let b = help(Some("watch_start")).await;
        assert!(
            b.as_str()
                .unwrap()
                .starts_with("watch_start(name=..., uri=..., on_event=None)\n    "),
            "{b}"
        );
        let none = help(Some("nope")).await;
        assert_eq!(
            none,
            json!("no built-in or tool named nope; help() lists them")
        );
        // Filters get no help.
        let (filters, _) = catalog(&memo, false).await;
        assert!(!filters.functions().iter().any(|f| f == HELP_TEXT));
        mgr.shutdown().await;
    }

    #[tokio::test]
    async fn filters_read_and_list_resources() {
        let memo = MemoServer::start().await;
        memo.set("k", json!(1)).await;
        let (cat, _mgr) = catalog(&memo, false).await;
        let notes = cat
            .call("read_resource", vec![json!("memo://notes")], Map::new())
            .await
            .unwrap();
        assert_eq!(notes, json!({"k": 1}));
        let listed = cat
            .call("list_resources", Vec::new(), Map::new())
            .await
            .unwrap();
        let uris: Vec<&str> = listed
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|e| e["uri"].as_str())
            .collect();
        assert!(uris.contains(&"memo://notes"), "{uris:?}");
    }

    #[tokio::test]
    async fn code_mode_may_mutate_and_run_watches() {
        let memo = MemoServer::start().await;
        let (cat, mgr) = catalog(&memo, true).await;
        cat.call(
            "memo_set",
            Vec::new(),
            kwargs(json!({"key": "k", "value": 1})),
        )
        .await
        .unwrap();
        let notes = cat
            .call("read_resource", vec![json!("memo://notes")], Map::new())
            .await
            .unwrap();
        assert_eq!(notes, json!({"k": 1}));
        // Positional arguments to a tool are refused with a hint, even in code mode.
        let positional = cat.call("memo_set", vec![json!("k")], Map::new()).await;
        assert_eq!(exc(positional), "ValueError");
        let started = cat
            .call(
                "watch_start",
                Vec::new(),
                kwargs(json!({"name": "n", "uri": "memo://notes"})),
            )
            .await
            .unwrap();
        assert_eq!(started["shape"], "state");
        let list = cat
            .call("watch_list", Vec::new(), Map::new())
            .await
            .unwrap();
        assert_eq!(list[0]["name"], "n");
        let stopped = cat
            .call("watch_stop", vec![json!("n")], Map::new())
            .await
            .unwrap();
        assert_eq!(stopped, json!(true));
        let bad = cat
            .call(
                "watch_start",
                Vec::new(),
                kwargs(json!({"name": "x", "uri": "memo://notes", "on_event": 3})),
            )
            .await;
        assert_eq!(exc(bad), "TypeError");
        mgr.shutdown().await;
    }

    /// Code mode starts a tool as a task and watches it: a notice per status change, the
    /// result in the last, and the watch leaves by itself.
    #[tokio::test]
    async fn code_mode_starts_a_task_and_a_task_watch_ends_with_it() {
        let memo = MemoServer::start().await;
        let (cat, mgr, mut rx) = catalog_with_notices(&memo, true).await;
        let plain = cat
            .call("call_tool_as_task", vec![json!("memo_set")], Map::new())
            .await;
        assert_eq!(exc(plain), "ValueError", "memo_set does not run as a task");
        let id = cat
            .call(
                "call_tool_as_task",
                vec![json!("memo_wait"), json!({"key": "k"})],
                Map::new(),
            )
            .await
            .unwrap();
        let id = id.as_str().unwrap().to_owned();
        let started = cat
            .call(
                "watch_start",
                Vec::new(),
                kwargs(json!({"name": "t", "uri": format!("task://{id}")})),
            )
            .await
            .unwrap();
        assert_eq!(started["shape"], "task");
        let wait = std::time::Duration::from_secs(10);
        // Its state at the start, then (or at once) the wait's own status message.
        loop {
            let n = tokio::time::timeout(wait, rx.recv())
                .await
                .unwrap()
                .unwrap();
            assert!(
                n.lines[0].starts_with(&format!("task {id} working")),
                "{n:?}"
            );
            if n.lines == [format!("task {id} working: waiting for k to change")] {
                break;
            }
        }
        memo.set("k", json!(2)).await;
        let last = tokio::time::timeout(wait, rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(last.lines[0], format!("task {id} completed"), "{last:?}");
        assert!(last.lines[1].contains("\"value\":2"), "{last:?}");
        tokio::time::timeout(wait, mgr.all_ended()).await.unwrap();
        assert!(mgr.watch_list().is_empty());
        // An unknown task: refused at start, with why.
        let e = mgr.watch_start("u", "task://nope", None).await.unwrap_err();
        assert!(e.to_string().contains("no server knows task nope"), "{e}");
        mgr.shutdown().await;
    }
}
