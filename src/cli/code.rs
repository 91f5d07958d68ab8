//! `herald code`: code mode for people. Python (Monty, sandboxed, in a worker process) with
//! the built-ins `list_resources()`, `read_resource(uri=...)`, `watch_start(name=..., uri=...,
//! on_event=None)`, `watch_stop(name=...)`, `watch_list()` and every tool of the connected
//! servers, in one persistent scope. Reads a file, or stdin (line by line at a terminal).
//! Each result is printed as JSON; notices of watches started here print as NDJSON, and the
//! command keeps running while watches exist.

use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;

use anyhow::{Context, anyhow};
use clap::Args;
use serde_json::Value;
use tokio::sync::mpsc;

use crate::app;
use crate::cli::watch::ServerFlags;
use crate::cli::{Exit, Globals, usage};
use crate::filter::pool::{FilterError, FilterPool, PoolConfig};
use crate::watch::log::WatchLog;
use crate::watch::sink::Sink;
use crate::watch::{WatchConfig, WatchManager, WatchOptions};

#[derive(Debug, Args)]
pub struct CodeArgs {
    /// Python file to run (default: stdin).
    pub file: Option<PathBuf>,
    #[command(flatten)]
    pub servers: ServerFlags,
    /// Quiet time before a notice goes out.
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
        sink: Sink::Stdout,
        log: WatchLog::stderr(verbose),
        store: None,
        filters: Some(PoolConfig::new(exe)),
        watches: Vec::new(),
        require_watches: false,
        end_when_all_ended: false,
        state_prefix: "",
    };
    let shutdown = tokio_util::sync::CancellationToken::new();
    let mut outcome = Ok(true);
    let code = async |manager: &WatchManager| {
        outcome = session(args.file.as_deref(), manager, &code_pool).await;
        // Watches started here keep the command alive until a signal.
        let keep = matches!(outcome, Ok(true)) && manager.watch_list().iter().any(|w| !w.failed);
        if keep {
            app::cancel_on_signals(shutdown.clone());
        }
        keep
    };
    // No watches to start, so this never fails.
    let _ = crate::watch::run(opts, shutdown.clone(), code).await;
    match outcome? {
        true => Ok(()),
        false => Err(anyhow!("the code raised an exception (above)").into()),
    }
}

/// Runs the file, or stdin, in code mode's scope. `Ok(false)`: the code raised (its error
/// is printed).
async fn session(
    file: Option<&std::path::Path>,
    manager: &WatchManager,
    code_pool: &FilterPool,
) -> Result<bool, Exit> {
    let catalog = manager.code_catalog();
    let mut failed = false;
    let run_snippet = async |code: &str| -> bool {
        match code_pool
            .run("code", code, Value::Null, catalog.clone())
            .await
        {
            Ok(o) => {
                let mut out = std::io::stdout().lock();
                if !o.printed.is_empty() {
                    let _ = write!(out, "{}", o.printed);
                    if !o.printed.ends_with('\n') {
                        let _ = writeln!(out);
                    }
                }
                if !o.value.is_null() {
                    let _ = writeln!(out, "{}", o.value);
                }
                let _ = out.flush();
                true
            }
            Err(FilterError::Python(e)) => {
                eprintln!("{e}");
                false
            }
            Err(FilterError::Worker(e)) => {
                eprintln!("herald: {e}");
                false
            }
        }
    };
    if let Some(path) = file {
        let code = std::fs::read_to_string(path)
            .with_context(|| format!("reading {}", path.display()))
            .map_err(usage)?;
        failed = !run_snippet(&code).await;
    } else if std::io::stdin().is_terminal() {
        // Interactive: a snippet ends at a line that completes it (blocks end at a blank line).
        let (ltx, mut lrx) = mpsc::channel::<String>(16);
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines().map_while(Result::ok) {
                if ltx.blocking_send(line).is_err() {
                    return;
                }
            }
        });
        let mut buf = String::new();
        // Once a snippet opens a block (`def f():`), it runs at a blank line, as in CPython.
        let mut block = false;
        eprint!(">>> ");
        while let Some(line) = lrx.recv().await {
            buf.push_str(&line);
            buf.push('\n');
            let mode = monty::detect_repl_continuation_mode(&buf);
            block |= mode == monty::ReplContinuationMode::IncompleteBlock;
            let ready =
                mode == monty::ReplContinuationMode::Complete && (!block || line.trim().is_empty());
            if ready {
                let code = std::mem::take(&mut buf);
                block = false;
                if !code.trim().is_empty() {
                    run_snippet(&code).await;
                }
                eprint!(">>> ");
            } else {
                eprint!("... ");
            }
        }
    } else {
        let mut code = String::new();
        for line in std::io::stdin().lock().lines() {
            code.push_str(&line.context("reading stdin")?);
            code.push('\n');
        }
        failed = !run_snippet(&code).await;
    }
    Ok(!failed)
}
