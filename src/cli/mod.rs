//! The command line: clap types, one file per subcommand. The only place that uses `anyhow`.

mod agent;
mod client;
mod code;
mod completions;
mod file;
mod gateway;
mod k8s;
mod man;
mod memo;
mod poll;
mod serve;
mod slack;
mod status;
mod store;
mod task;
mod up;
pub(crate) mod watch;

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

use crate::app::systemd::Systemd;
use crate::store::{Location, Store};

/// herald: a push-driven MCP watch pipeline in one binary.
#[derive(Debug, Parser)]
#[command(name = "herald", version, about, propagate_version = true)]
pub struct Cli {
    /// Log format on stderr. `json` writes one JSON object per line (and the bound-address
    /// line as JSON too).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// More logging (repeat for more). `RUST_LOG` overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// The store file. Default: $STATE_DIRECTORY/herald.redb, else
    /// $XDG_STATE_HOME/herald/herald.redb, else ~/.local/state/herald/herald.redb.
    /// `:memory:` keeps nothing on disk.
    #[arg(long, global = true, value_name = "PATH")]
    pub store: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the memo source: memo://notes and memo://log, with memo_set / memo_delete.
    Memo(memo::MemoArgs),
    /// Serve Kubernetes / kcp objects as event logs over the real kubectl.
    K8s(k8s::K8sArgs),
    /// Serve files and directories under --root DIRs: file:///PATH (content or listing) and
    /// file-events://watch/PATH (event log), changes pushed from inotify.
    File(file::FileArgs),
    /// Serve Slack messages the bot sees (Socket Mode, a sealed buffer, backfill) as the MCP
    /// Events type message_posted and the event log slack-events://message_posted. Secrets
    /// come from SLACK_* variables or --credentials DIR.
    Slack(slack::SlackArgs),
    /// Run the appliance: the roles and servers a config names behind one gateway endpoint
    /// (HTTP 127.0.0.1:8750, QUIC :8751) with a watch client; with no config, the demo (memo,
    /// the files of ./herald-demo, Slack inert until configured).
    Up(up::UpArgs),
    /// Serve many MCP servers behind one endpoint: tools server__tool, resources and listens
    /// routed and shared, Events aggregated, per-token entitlements.
    Gateway(gateway::GatewayArgs),
    /// Validate a herald up or gateway config and exit (for ExecStartPre=).
    Check(gateway::CheckArgs),
    /// List a server's tools, resources and templates.
    Ls(client::LsArgs),
    /// Read a resource.
    Read(client::ReadArgs),
    /// Call a tool: `herald call memo_set key=todo value='"buy milk"'`; with --task, as a task
    /// followed until it ends.
    Call(client::CallArgs),
    /// Ask about a task: `herald task get ID`, `herald task cancel ID`.
    Task(task::TaskArgs),
    /// Poll an event type (the MCP Events extension) and print its events as NDJSON: one
    /// poll, or long polls until Ctrl-C with --follow.
    Poll(poll::PollArgs),
    /// Ask a running herald's admin address for its roles, upstreams, listens, watches and
    /// store, as a table or --json.
    Status(status::StatusArgs),
    /// Work on the store file: `herald store backup DEST` writes a consistent copy, also of a
    /// store a running herald holds.
    Store(store::StoreArgs),
    /// Watch resources and print notices (or run a command, or POST a webhook) when they change.
    Watch(watch::WatchArgs),
    /// Code mode: run Python with the watch built-ins and the servers' tools (a file, stdin, or
    /// an interactive prompt).
    Code(code::CodeArgs),
    /// An LLM agent (any OpenAI-compatible chat API) acting on the servers through code mode:
    /// what you type and the notices of the watches it starts become its turns.
    Agent(agent::AgentArgs),
    /// Print a shell completion script (bash, zsh, fish) on stdout.
    Completions(completions::CompletionsArgs),
    /// Print herald's manual page, or write one page per subcommand with --out DIR.
    Man(man::ManArgs),
    /// Internal: a sandboxed Python worker for on_event filters (started by herald itself).
    #[command(hide = true)]
    FilterWorker {
        /// Data segment cap for this worker, in bytes.
        #[arg(long, default_value_t = 256 * 1024 * 1024)]
        memory_bytes: u64,
    },
}

/// An error with the exit code it maps to.
#[derive(Debug)]
pub struct Exit {
    pub code: i32,
    pub error: anyhow::Error,
}

impl<E: Into<anyhow::Error>> From<E> for Exit {
    fn from(e: E) -> Self {
        Exit {
            code: 1,
            error: e.into(),
        }
    }
}

/// Exit code for bad usage or configuration.
pub const EXIT_USAGE: i32 = 64;

pub fn usage(error: anyhow::Error) -> Exit {
    Exit {
        code: EXIT_USAGE,
        error,
    }
}

/// Runs the parsed command line; `systemd` is what systemd passed the process (taken from
/// the environment first thing in `main`).
pub fn run(cli: Cli, systemd: Systemd) -> Result<(), Exit> {
    if let Command::FilterWorker { memory_bytes } = cli.command {
        // No runtime, no logging: a small single-threaded process with a memory cap.
        crate::filter::worker::serve(memory_bytes);
        return Ok(());
    }
    init_logging(cli.log_format, cli.verbose);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let verbose = cli.verbose > 0;
    let globals = Globals {
        log_format: cli.log_format,
        store: cli.store,
        systemd,
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Memo(a) => memo::run(a, &globals).await,
            Command::File(a) => file::run(a, &globals).await,
            Command::K8s(a) => k8s::run(a, &globals).await,
            Command::Slack(a) => slack::run(a, &globals).await,
            Command::Up(a) => up::run(a, &globals).await,
            Command::Gateway(a) => gateway::run(a, &globals).await,
            Command::Check(a) => gateway::check(a),
            Command::Ls(a) => client::ls(a).await,
            Command::Read(a) => client::read(a).await,
            Command::Call(a) => client::call(a).await,
            Command::Task(a) => task::run(a).await,
            Command::Poll(a) => poll::run(a).await,
            Command::Status(a) => status::run(a).await,
            Command::Store(a) => store::run(a, &globals).await,
            Command::Watch(a) => watch::run(a, &globals, verbose).await,
            Command::Code(a) => code::run(a, &globals, verbose).await,
            Command::Agent(a) => agent::run(a, &globals, verbose).await,
            Command::Completions(a) => completions::run(a),
            Command::Man(a) => man::run(a),
            Command::FilterWorker { .. } => Ok(()),
        }
    });
    // A blocked stdin read cannot be cancelled; do not wait for it after the roles drained.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    result
}

/// Options every subcommand sees.
#[derive(Debug)]
pub struct Globals {
    pub log_format: LogFormat,
    pub store: Option<String>,
    /// The notify socket, watchdog and sockets systemd passed (all empty outside systemd).
    pub systemd: Systemd,
}

impl Globals {
    /// Opens the store named by `--store`, or the default one.
    pub async fn open_store(&self) -> Result<Store, Exit> {
        let location = match &self.store {
            Some(s) => Location::parse(s),
            None => Location::default_path().map_err(|e| usage(e.into()))?,
        };
        let store = tokio::task::spawn_blocking(move || Store::open(&location)).await??;
        Ok(store)
    }

    pub fn store_path(&self) -> Option<PathBuf> {
        match self.store.as_deref().map(Location::parse) {
            Some(Location::File(p)) => Some(p),
            Some(Location::Memory) => None,
            None => match Location::default_path() {
                Ok(Location::File(p)) => Some(p),
                _ => None,
            },
        }
    }
}

fn init_logging(format: LogFormat, verbose: u8) {
    use tracing_subscriber::EnvFilter;
    let default = match verbose {
        // rmcp logs every error response and reconnect at its own levels; herald reports what
        // matters itself, so rmcp stays quiet unless asked for with -vv or RUST_LOG.
        0 => "herald=info,rmcp=off,warn",
        1 => "herald=debug,rmcp=off,info",
        _ => "debug",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
        LogFormat::Text => builder.with_target(false).try_init(),
    };
}

#[cfg(test)]
mod readme_tests;
