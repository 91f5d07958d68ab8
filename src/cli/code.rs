//! `herald code`: code mode for people. Python (Monty, sandboxed, in a worker process) with
//! the built-ins `list_resources()`, `read_resource(uri=...)`, `watch_start(name=..., uri=...,
//! on_event=None)`, `watch_stop(name=...)`, `watch_list()`, `call_tool_as_task(name, args)`,
//! `help()` and every tool of the connected servers, in one persistent scope. Reads a file (a
//! script: its last value prints), stdin piped (statement by statement, each expression's
//! value printed, as a REPL would) or a terminal (an interactive prompt with a banner, where
//! Ctrl-C cancels the line or the running statement). Values print as JSON; notices of
//! watches started here print as their blocks at a terminal and NDJSON piped, and the command keeps running while watches exist
//! (it says so when its input ends).

use std::io::{BufRead, IsTerminal};
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, anyhow};
use clap::Args;
use serde_json::Value;
use tokio::sync::mpsc;

use tokio_util::sync::CancellationToken;

use crate::app;
use crate::cli::watch::ServerFlags;
use crate::cli::{Exit, Globals, usage};
use crate::filter::pool::{
    Catalog as FilterHost, FilterError, FilterPool, Interruptible, PoolConfig,
};
use crate::filter::shape;
use crate::watch::log::WatchLog;
use crate::watch::sink::Sink;
use crate::watch::{CODE_PRELUDE, WatchConfig, WatchInfo, WatchManager, WatchOptions};

#[derive(Debug, Args)]
pub struct CodeArgs {
    /// Python file to run (default: stdin).
    pub file: Option<PathBuf>,
    #[command(flatten)]
    pub servers: ServerFlags,
    /// Quiet time before a notice goes out, in ms [default: 3000].
    #[arg(long, value_name = "MS")]
    pub debounce_ms: Option<u64>,
}

pub async fn run(args: CodeArgs, _globals: &Globals, verbose: bool) -> Result<(), Exit> {
    let mut cfg = WatchConfig::default();
    if let Some(ms) = args.debounce_ms {
        cfg.debounce.quiet = std::time::Duration::from_millis(ms);
    }
    let servers = args.servers.servers(cfg.max_message_bytes)?;
    if servers.is_empty() {
        return Err(usage(anyhow!(
            "code mode needs a server: pass --mcp-stdio, --mcp-http or --mcp-quic"
        )));
    }
    let exe = std::env::current_exe().context("finding the herald binary for Python workers")?;
    // Filters and code get separate pools: code calls watch_start, whose dry run of the
    // filter must not wait behind the very code that asked for it.
    let mut code_cfg = PoolConfig::new(exe.clone());
    code_cfg.workers = 1;
    let code_pool = FilterPool::new(code_cfg);
    let opts = WatchOptions {
        config: cfg,
        servers,
        sink: Sink::stdout(false),
        log: WatchLog::stderr(verbose),
        store: None,
        filters: Some(PoolConfig::new(exe)),
        watches: Vec::new(),
        configured: crate::watch::Configured::Kept,
        end_when_all_ended: false,
        state_prefix: "",
    };
    let shutdown = tokio_util::sync::CancellationToken::new();
    let mut outcome = Ok(true);
    let mut watches_failed = false;
    let code = async |manager: &WatchManager| {
        outcome = session(args.file.as_deref(), manager, &code_pool).await;
        // Watches started here keep the command alive until a signal: say so, or it looks
        // stuck.
        let running: Vec<WatchInfo> = manager
            .watch_list()
            .into_iter()
            .filter(|w| !w.failed)
            .collect();
        let keep = matches!(outcome, Ok(true)) && !running.is_empty();
        if keep {
            let input = match args.file.as_deref() {
                Some(f) => f.display().to_string(),
                None => "stdin".to_owned(),
            };
            // The signals are taken before this is said, so that anything told to stop after
            // reading it stops in order.
            app::cancel_on_signals(shutdown.clone());
            eprintln!("{}", still_running(&input, &running));
            // Until a signal, or until no watch runs (each ended, or failed for good).
            tokio::select! {
                _ = shutdown.cancelled() => {}
                settled = manager.none_running() => {
                    if let crate::watch::manager::Settled::Failed(f) = settled {
                        let names: Vec<String> = f
                            .iter()
                            .map(|w| format!("{} ({}): {}", w.name, w.uri, w.reason))
                            .collect();
                        eprintln!("herald code: no watch runs any more; failed: {}", names.join("; "));
                        watches_failed = true;
                    }
                }
            }
        }
        false
    };
    // No watches to start, so this never fails.
    let _ = crate::watch::run(opts, shutdown.clone(), code).await;
    match outcome? {
        true if watches_failed => Err(anyhow!("every watch started here failed (above)").into()),
        true => Ok(()),
        false => Err(anyhow!("the code raised an exception (above)").into()),
    }
}

/// What `herald code` says when its input has ended and watches still run: what it waits
/// for, and how to stop it.
fn still_running(input: &str, watches: &[WatchInfo]) -> String {
    const SHOWN: usize = 3;
    let mut named: Vec<String> = watches
        .iter()
        .take(SHOWN)
        .map(|w| format!("{}: {}", w.name, w.uri))
        .collect();
    if watches.len() > SHOWN {
        named.push(format!("{} more", watches.len() - SHOWN));
    }
    let n = watches.len();
    format!(
        "herald code: {input} ended with {n} watch{} still running ({}); printing their notices until Ctrl-C or SIGTERM, or until none runs",
        if n == 1 { "" } else { "es" },
        named.join(", ")
    )
}

/// What an interactive session says first: what this is, how to get help, how to leave.
fn banner(servers: &[String]) -> String {
    let n = servers.len();
    format!(
        "herald code: Python (sandboxed) in one scope that keeps its variables, with the tools of \
         {n} server{} ({}) and the watch built-ins.\n\
         help() lists them. Ctrl-C cancels the line or the running statement; Ctrl-D ends the \
         input (watches started here then keep herald running, printing their notices, until \
         Ctrl-C).",
        if n == 1 { "" } else { "s" },
        servers.join(", ")
    )
}

/// Runs snippets in code mode's scope and prints what they give: what they printed, then
/// their value as JSON (nothing for `None`); errors go to stderr.
struct Runner<'a> {
    pool: &'a FilterPool,
    catalog: Arc<dyn FilterHost>,
    /// Whether the scope has `help` (what [`CODE_PRELUDE`] defines).
    helped: bool,
}

impl Runner<'_> {
    /// Runs `code`; `cancel` interrupts its tool calls (Ctrl-C). `false`: it raised.
    async fn run(&mut self, code: &str, cancel: Option<CancellationToken>) -> bool {
        if !self.helped {
            // Errors here (no worker) are the snippet's own, reported when it runs.
            self.helped = self
                .pool
                .run("code", CODE_PRELUDE, Value::Null, self.catalog.clone())
                .await
                .is_ok();
        }
        let catalog: Arc<dyn FilterHost> = match cancel {
            Some(cancel) => Arc::new(Interruptible {
                catalog: self.catalog.clone(),
                cancel,
            }),
            None => self.catalog.clone(),
        };
        match self.pool.run("code", code, Value::Null, catalog).await {
            Ok(o) => {
                // A scope that started afresh has lost `help` too.
                if o.fresh_scope {
                    self.helped = false;
                }
                let mut out = o.printed;
                if !out.is_empty() && !out.ends_with('\n') {
                    out.push('\n');
                }
                if !o.value.is_null() {
                    out.push_str(&format!("{}\n", o.value));
                }
                if let Err(e) = app::console::print(&out) {
                    tracing::error!(error = %e, "the snippet's output is lost");
                }
                true
            }
            Err(FilterError::Python(e)) => {
                eprintln!("{e}");
                false
            }
            Err(FilterError::Worker(e)) => {
                self.helped = false;
                eprintln!("herald: {e}");
                false
            }
        }
    }
}

/// Runs the file, stdin piped, or the interactive prompt in code mode's scope. `Ok(false)`:
/// the code raised (its error is printed).
async fn session(
    file: Option<&std::path::Path>,
    manager: &WatchManager,
    code_pool: &FilterPool,
) -> Result<bool, Exit> {
    let mut runner = Runner {
        pool: code_pool,
        catalog: manager.code_catalog(),
        helped: false,
    };
    if let Some(path) = file {
        let code = std::fs::read_to_string(path)
            .with_context(|| format!("reading {}", path.display()))
            .map_err(usage)?;
        return Ok(runner.run(&code, None).await);
    }
    if std::io::stdin().is_terminal() {
        let servers: Vec<String> = manager.servers().iter().map(|s| s.name.clone()).collect();
        eprintln!("{}", banner(&servers));
        interactive(&mut runner).await;
        return Ok(true);
    }
    let mut code = String::new();
    for line in std::io::stdin().lock().lines() {
        code.push_str(&line.context("reading stdin")?);
        code.push('\n');
    }
    // As a REPL would: statement by statement, each expression's value printed; the first
    // error stops the rest. Code that does not parse runs whole, to say where.
    match shape::statements(&code) {
        Some(statements) => {
            for s in statements {
                if !runner.run(&s.code, None).await {
                    return Ok(false);
                }
            }
            Ok(true)
        }
        None => Ok(runner.run(&code, None).await),
    }
}

/// The interactive prompt: a snippet runs at a line that completes it (a block at a blank
/// line, as in CPython). Ctrl-C drops the lines typed so far, or interrupts the snippet that
/// runs (its tool call raises `KeyboardInterrupt`, the scope stays); Ctrl-D ends it.
async fn interactive(runner: &mut Runner<'_>) {
    let (ltx, mut lrx) = mpsc::channel::<String>(16);
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines().map_while(Result::ok) {
            if ltx.blocking_send(line).is_err() {
                return;
            }
        }
    });
    let mut interrupts = Interrupts::take();
    let mut buf = String::new();
    // Once a snippet opens a block (`def f():`), it runs at a blank line, as in CPython.
    let mut block = false;
    loop {
        eprint!("{}", if buf.is_empty() { ">>> " } else { "... " });
        let line = tokio::select! {
            line = lrx.recv() => line,
            _ = interrupts.next() => {
                buf.clear();
                block = false;
                eprintln!("\nKeyboardInterrupt");
                continue;
            }
        };
        let Some(line) = line else {
            // Ctrl-D: the next message starts on a line of its own.
            eprintln!();
            return;
        };
        buf.push_str(&line);
        buf.push('\n');
        let mode = monty::detect_repl_continuation_mode(&buf);
        block |= mode == monty::ReplContinuationMode::IncompleteBlock;
        let ready =
            mode == monty::ReplContinuationMode::Complete && (!block || line.trim().is_empty());
        if !ready {
            continue;
        }
        let code = std::mem::take(&mut buf);
        block = false;
        if code.trim().is_empty() {
            continue;
        }
        let cancel = CancellationToken::new();
        let run = runner.run(&code, Some(cancel.clone()));
        tokio::pin!(run);
        loop {
            tokio::select! {
                _ = &mut run => break,
                // Its tool call raises at once; Python of its own runs to its time limit.
                _ = interrupts.next() => cancel.cancel(),
            }
        }
    }
}

/// Ctrl-C at the prompt (SIGINT), taken from its default (ending herald) while the prompt
/// runs.
struct Interrupts(Option<tokio::signal::unix::Signal>);

impl Interrupts {
    fn take() -> Interrupts {
        use tokio::signal::unix::{SignalKind, signal};
        Interrupts(signal(SignalKind::interrupt()).ok())
    }

    /// The next Ctrl-C (never, when it could not be taken).
    async fn next(&mut self) {
        match &mut self.0 {
            Some(s) => {
                s.recv().await;
            }
            None => std::future::pending().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(name: &str, uri: &str) -> WatchInfo {
        WatchInfo {
            name: name.into(),
            uri: uri.into(),
            shape: None,
            events: 0,
            notices: 0,
            restore_failed: false,
            failed: false,
            starting: false,
        }
    }

    #[test]
    fn the_end_of_input_says_which_watches_it_waits_for_and_how_to_stop() {
        assert_eq!(
            still_running("stdin", &[info("notes", "memo://notes")]),
            "herald code: stdin ended with 1 watch still running (notes: memo://notes); printing their notices until Ctrl-C or SIGTERM, or until none runs"
        );
        let many: Vec<WatchInfo> = (1..=5)
            .map(|i| info(&format!("w{i}"), "memo://log"))
            .collect();
        let s = still_running("watch.py", &many);
        assert!(
            s.starts_with("herald code: watch.py ended with 5 watches still running (w1: memo://log, w2: memo://log, w3: memo://log, 2 more);"),
            "{s}"
        );
    }

    #[test]
    fn the_banner_says_what_this_is_how_to_get_help_and_how_to_leave() {
        let b = banner(&["http://127.0.0.1:8750/mcp".into()]);
        assert!(
            b.contains("the tools of 1 server (http://127.0.0.1:8750/mcp)"),
            "{b}"
        );
        for what in [
            "help()",
            "Ctrl-C cancels the line or the running statement",
            "Ctrl-D ends the input",
        ] {
            assert!(b.contains(what), "{what}: {b}");
        }
    }
}
