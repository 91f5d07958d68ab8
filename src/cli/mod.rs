//! The command line: clap types, one file per subcommand. The only place that uses `anyhow`.

mod agent;
mod check;
mod client;
mod code;
mod completions;
mod file;
mod gateway;
mod k8s;
mod login;
mod man;
mod memo;
pub mod nats;
mod poll;
mod reload;
mod serve;
mod slack;
mod status;
mod store;
mod task;
mod top;
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
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text,
        value_name = "FORMAT", help_heading = GLOBAL)]
    pub log_format: LogFormat,
    /// More logging: -v debug for herald and info for the libraries, -vv debug for everything.
    /// `RUST_LOG` overrides (a release build logs debug at most: trace is compiled out).
    #[arg(short, long, global = true, action = clap::ArgAction::Count, help_heading = GLOBAL)]
    pub verbose: u8,
    /// The store file; `:memory:` keeps nothing on disk [default: $STATE_DIRECTORY/herald.redb,
    /// else $XDG_STATE_HOME/herald/herald.redb, else ~/.local/state/herald/herald.redb].
    #[arg(long, global = true, value_name = "PATH", help_heading = GLOBAL)]
    pub store: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

/// The help section of the flags every subcommand takes.
const GLOBAL: &str = "Global options";

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the memo source: memo://notes and memo://log, with memo_set / memo_delete.
    Memo(memo::MemoArgs),
    /// Serve Kubernetes / kcp objects as event logs (over the API; tools run kubectl).
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
    /// Check a herald up, gateway or watch config as its start would, and exit (for
    /// ExecStartPre=).
    Check(check::CheckArgs),
    /// List a server's tools, resources and templates (the server: --mcp-http URL,
    /// --mcp-quic HOST:PORT or --mcp-stdio CMD).
    Ls(client::LsArgs),
    /// Read a resource (from --mcp-http URL, --mcp-quic HOST:PORT or --mcp-stdio CMD).
    Read(client::ReadArgs),
    /// Call a tool on the server at --mcp-http URL, --mcp-quic HOST:PORT or --mcp-stdio CMD:
    /// `herald call memo_set key=todo value='"buy milk"' --mcp-http URL`; with --task, as a
    /// task followed until it ends.
    Call(client::CallArgs),
    /// Log in to a server that takes OAuth (--mcp-http URL): herald prints the address to
    /// approve it at, and keeps the tokens, sealed, in the store for every later command and
    /// a gateway's [slug.oauth].
    Login(login::LoginArgs),
    /// Ask about a task: `herald task get ID`, `herald task cancel ID`.
    Task(task::TaskArgs),
    /// Poll an event type (the MCP Events extension) and print its events as NDJSON: one
    /// poll, or long polls until Ctrl-C with --follow.
    Poll(poll::PollArgs),
    /// Ask a running herald's admin address for its roles, upstreams, listens, watches and
    /// store, as a table or --json.
    Status(status::StatusArgs),
    /// A live view of a running herald from its admin address: roles, upstreams, watches and
    /// their events per second, listen streams, the errors seen; pushed by herald, q quits.
    Top(top::TopArgs),
    /// Ask a running herald up (or herald gateway --config) to read its config again and
    /// apply what changed, keeping every unchanged slug, role and watch running (as SIGHUP
    /// and systemctl reload do).
    Reload(reload::ReloadArgs),
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
        #[arg(long, default_value_t = 256 * 1024 * 1024, value_name = "BYTES")]
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

/// Says on stderr why herald failed: `herald: …` in text, or one more log line (level
/// `ERROR`, with the exit code) with `--log-format json`, so every line there parses.
pub fn report(exit: &Exit, format: LogFormat) {
    match format {
        LogFormat::Text => eprintln!("herald: {:#}", exit.error),
        LogFormat::Json => tracing::error!(target: ANNOUNCE, code = exit.code, "{:#}", exit.error),
    }
}

/// The tracing target of what herald always writes on stderr, at info and above whatever
/// `RUST_LOG` says: where it listens (`listening`, `admin`; scripts and tests read them) and
/// why it failed.
pub const ANNOUNCE: &str = "herald::announce";

/// Exit code for bad usage or configuration.
pub const EXIT_USAGE: i32 = 64;

pub fn usage(error: anyhow::Error) -> Exit {
    Exit {
        code: EXIT_USAGE,
        error,
    }
}

/// The variable that sets the runtime's worker threads (tokio's own name for it).
const WORKERS_VAR: &str = "TOKIO_WORKER_THREADS";

/// The cores this process may run on (its affinity and cgroup quota counted).
fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The runtime's worker threads: `TOKIO_WORKER_THREADS` when set, else one per core but one
/// (at least one). A herald shares its host with its clients, its peers (other roles,
/// kubectl, filter workers) and the kernel's network work; on the 2-core development machine
/// one worker instead of two made notices 1.2-1.4x faster, the k8s burst 1.08x and the
/// gateway's calls/s at 64 clients 1.2-1.37x, at the same p50 per call, and only a change
/// fanned out to 10,000 HTTP streams slower (1.25x the time, within its target):
/// docs/benchmarks.md. A host given to herald alone sets it to its cores.
fn worker_threads(var: Option<std::ffi::OsString>, cores: usize) -> anyhow::Result<usize> {
    let Some(var) = var else {
        return Ok(cores.saturating_sub(1).max(1));
    };
    var.to_str()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|n| *n > 0)
        .ok_or_else(|| {
            anyhow::anyhow!(
                "{WORKERS_VAR}={} is not a number of threads: set a whole number above 0, or unset it for one per core but one",
                var.to_string_lossy()
            )
        })
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
        .worker_threads(worker_threads(std::env::var_os(WORKERS_VAR), cores()).map_err(usage)?)
        .enable_all()
        .build()?;
    let verbose = cli.verbose > 0;
    let globals = Globals {
        log_format: cli.log_format,
        store: cli.store,
        systemd,
    };
    let mut command = cli.command;
    command.store_in(&globals.store);
    let result = runtime.block_on(async move {
        match command {
            Command::Memo(a) => memo::run(a, &globals).await,
            Command::File(a) => file::run(a, &globals).await,
            Command::K8s(a) => k8s::run(a, &globals).await,
            Command::Slack(a) => slack::run(a, &globals).await,
            Command::Up(a) => up::run(a, &globals).await,
            Command::Gateway(a) => gateway::run(a, &globals).await,
            Command::Check(a) => check::run(a).await,
            Command::Ls(a) => client::ls(a).await,
            Command::Read(a) => client::read(a).await,
            Command::Call(a) if a.task => task::call(a).await,
            Command::Call(a) => client::call(a).await,
            Command::Task(a) => task::run(a).await,
            Command::Login(a) => login::run(a, &globals).await,
            Command::Poll(a) => poll::run(a).await,
            Command::Status(a) => status::run(a).await,
            Command::Top(a) => top::run(a).await,
            Command::Reload(a) => reload::run(a).await,
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

impl Command {
    /// Hands the global `--store` to the commands that connect to servers: it keeps an HTTP
    /// server's OAuth tokens (`herald login`).
    fn store_in(&mut self, store: &Option<String>) {
        let conn = match self {
            Command::Ls(a) => &mut a.client.conn,
            Command::Read(a) => &mut a.client.conn,
            Command::Call(a) => &mut a.client.conn,
            Command::Poll(a) => &mut a.conn,
            Command::Task(a) => match &mut a.command {
                task::TaskCommand::Get(t) | task::TaskCommand::Cancel(t) => &mut t.client.conn,
            },
            Command::Watch(a) => return a.servers.store.clone_from(store),
            Command::Code(a) => return a.servers.store.clone_from(store),
            Command::Agent(a) => return a.servers.store.clone_from(store),
            _ => return,
        };
        conn.store.clone_from(store);
    }
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
    // RUST_LOG capped at the level compiled in (a release build has no trace level): a directive
    // above it would only make the filter print a plain-text warning past the log format.
    let max = tracing::level_filters::STATIC_MAX_LEVEL;
    let filter = std::env::var("RUST_LOG")
        .ok()
        .map(|v| capped(&v, max))
        .filter(|v| !v.is_empty())
        .and_then(|v| EnvFilter::try_new(v).ok())
        .unwrap_or_else(|| EnvFilter::new(default))
        .add_directive(
            format!("{ANNOUNCE}=info")
                .parse()
                .expect("a valid directive"),
        );
    // Colour (text format only) on a terminal, never into a file, a pipe or the journal.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(crate::app::console::stderr_colour())
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
        LogFormat::Text => builder.with_target(false).try_init(),
    };
}

/// `RUST_LOG`'s directives (`target[span{field}]=level`, a bare level, a bare target or an
/// empty level: every level of it), each trimmed and the empty ones left out, with every level
/// above `max` lowered to `max`. Nothing left: herald's default.
fn capped(directives: &str, max: tracing::level_filters::LevelFilter) -> String {
    use tracing::level_filters::LevelFilter;
    let cap = |level: &str| match level.trim() {
        "" if max < LevelFilter::TRACE => max.to_string(),
        level => match level.parse::<LevelFilter>() {
            Ok(l) if l > max => max.to_string(),
            _ => level.to_owned(),
        },
    };
    directives
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(|d| {
            let tail = d.rfind(']').map_or(0, |i| i + 1);
            match d[tail..].rfind('=') {
                Some(eq) => format!("{}={}", d[..tail + eq].trim(), cap(&d[tail + eq + 1..])),
                None if d.parse::<LevelFilter>().is_ok() => cap(d),
                None if max < LevelFilter::TRACE => format!("{d}={max}"),
                None => d.to_owned(),
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod readme_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn rust_log_is_capped_at_the_level_compiled_in() {
        use tracing::level_filters::LevelFilter;
        let (debug, trace) = (LevelFilter::DEBUG, LevelFilter::TRACE);
        for (given, max, want) in [
            ("trace", debug, "debug"),
            ("TRACE", debug, "debug"),
            ("5", debug, "debug"),
            ("info", debug, "info"),
            (
                "herald=trace,h2=info,warn",
                debug,
                "herald=debug,h2=info,warn",
            ),
            // A bare target asks for every level of it.
            ("herald", debug, "herald=debug"),
            ("herald::watch", debug, "herald::watch=debug"),
            // A span's field filter may hold `=`; the level is what follows its `]`.
            (
                "herald[call{tool=x}]=trace",
                debug,
                "herald[call{tool=x}]=debug",
            ),
            ("herald[call{tool=x}]", debug, "herald[call{tool=x}]=debug"),
            // An empty level is trace.
            ("herald=", debug, "herald=debug"),
            ("[call]=", debug, "[call]=debug"),
            // Spaces around a directive or a level are dropped (the filter would read " warn"
            // as a target); nothing left is herald's default.
            ("herald=debug, warn", debug, "herald=debug,warn"),
            (" herald = trace ,h2", debug, "herald=debug,h2=debug"),
            ("", debug, ""),
            (" , ", debug, ""),
            // What is not a level, and everything where trace is compiled in (debug builds).
            ("h2=loud", debug, "h2=loud"),
            ("herald,h2=trace", trace, "herald,h2=trace"),
            ("herald=", trace, "herald="),
        ] {
            let got = capped(given, max);
            assert_eq!(got, want, "{given:?} at most {max}");
            if max == debug && !got.is_empty() && got != "h2=loud" {
                let f = tracing_subscriber::EnvFilter::try_new(&got).unwrap();
                assert!(
                    !f.to_string().to_lowercase().contains("trace"),
                    "{given}: {f}"
                );
            }
        }
    }

    #[test]
    fn worker_threads_are_one_per_core_but_one_unless_set() {
        assert_eq!(worker_threads(None, 1).unwrap(), 1);
        assert_eq!(worker_threads(None, 2).unwrap(), 1);
        assert_eq!(worker_threads(None, 8).unwrap(), 7);
        assert_eq!(worker_threads(Some("4".into()), 2).unwrap(), 4);
        assert_eq!(worker_threads(Some(" 2 ".into()), 8).unwrap(), 2);
        for bad in ["0", "two", "", "-1"] {
            let e = worker_threads(Some(bad.into()), 2).unwrap_err().to_string();
            assert!(
                e.contains("TOKIO_WORKER_THREADS") && e.contains("whole number above 0"),
                "{e}"
            );
        }
    }

    /// Optional flags that take a value and truly have no default: leaving one out means "not
    /// at all" or "none of these", which its help says in its own words.
    const NO_DEFAULT: &[(&str, &str)] = &[
        (
            "callback-allow",
            "repeatable: none given, no webhook callback reaches a private address or plain http",
        ),
        (
            "allowed-host",
            "repeatable: extra Host names, none unless given",
        ),
        (
            "allowed-origin",
            "repeatable: extra Origins, none unless given",
        ),
        (
            "mcp-stdio",
            "which server: one of the --mcp-* flags names it",
        ),
        (
            "mcp-http",
            "which server: one of the --mcp-* flags names it",
        ),
        (
            "mcp-quic",
            "which server: one of the --mcp-* flags names it",
        ),
        ("tls-ca", "extra trust for QUIC servers: none unless given"),
        ("tls-pin", "extra trust for QUIC servers: none unless given"),
        ("token-command", "no bearer token unless given"),
        (
            "root",
            "repeatable: the directories to serve, none unless given",
        ),
        (
            "config",
            "an optional config file: without one the flags say everything",
        ),
        (
            "watch",
            "repeatable: the watches to start, none unless given",
        ),
        ("on-event", "repeatable: filters, none unless given"),
        (
            "exec",
            "another sink: without it notices go to stdout (the command's help)",
        ),
        (
            "webhook",
            "another sink: without it notices go to stdout (the command's help)",
        ),
        (
            "arg",
            "repeatable: the event type's arguments, none unless given",
        ),
        ("prompt", "the operator's instructions: none unless given"),
        ("model-url", "herald up: without it no agent runs"),
        (
            "out",
            "herald man: without it one page on stdout, as its help says",
        ),
    ];

    /// Every flag's help, with its command's path, for each `(path, arg)` in the tree.
    fn walk(cmd: &clap::Command, path: &str, f: &mut impl FnMut(&str, &clap::Arg)) {
        for arg in cmd.get_arguments() {
            f(path, arg);
        }
        for sub in cmd.get_subcommands() {
            walk(sub, &format!("{path} {}", sub.get_name()), f);
        }
    }

    fn help(arg: &clap::Arg) -> String {
        arg.get_long_help()
            .or(arg.get_help())
            .map(|h| h.to_string())
            .unwrap_or_default()
    }

    #[test]
    fn help_shows_every_default() {
        let mut missing = Vec::new();
        let mut unused: Vec<&str> = NO_DEFAULT.iter().map(|(l, _)| *l).collect();
        walk(&Cli::command(), "herald", &mut |path, arg| {
            let takes_value = arg.get_action().takes_values();
            if arg.is_positional() || arg.is_required_set() || arg.is_hide_set() || !takes_value {
                return;
            }
            let long = arg.get_long().unwrap_or_default();
            let name = format!("{path} --{long}");
            let text = help(arg);
            let stated = text.contains("[default: ");
            let defaults: Vec<String> = arg
                .get_default_values()
                .iter()
                .map(|v| v.to_string_lossy().into_owned())
                .collect();
            let by_clap = !defaults.is_empty() && !arg.is_hide_default_value_set();
            if by_clap && stated {
                missing.push(format!("{name}: the default twice (clap's and the text's)"));
            } else if arg.is_hide_default_value_set() {
                // The text says it instead (to add `(4 MiB)`): it must say the real one.
                let real = format!("[default: {}", defaults.join(","));
                if !text.contains(&real) {
                    missing.push(format!("{name}: the text does not say {real}]: {text}"));
                }
            } else if !by_clap && !stated {
                match unused.iter().position(|l| *l == long) {
                    Some(i) => {
                        unused.remove(i);
                    }
                    None if NO_DEFAULT.iter().any(|(l, _)| *l == long) => {}
                    None => missing.push(name),
                }
            }
        });
        assert!(
            missing.is_empty(),
            "flags whose --help shows no default (give one, or say `[default: …]` in the \
             text, or add them to NO_DEFAULT with the reason):\n  {}",
            missing.join("\n  ")
        );
        assert!(
            unused.is_empty(),
            "NO_DEFAULT names no such flag: {unused:?}"
        );
    }

    /// The help of `--long` in the subcommand at `path`.
    fn help_of(path: &[&str], long: &str) -> String {
        let mut cmd = Cli::command();
        for name in path {
            cmd = cmd.find_subcommand(name).expect("a subcommand").clone();
        }
        let arg = cmd
            .get_arguments()
            .find(|a| a.get_long() == Some(long))
            .unwrap_or_else(|| panic!("{path:?} has --{long}"));
        help(arg)
    }

    /// What the text of `--long` says its default is: the number after `[default: `.
    fn stated(path: &[&str], long: &str) -> u64 {
        let text = help_of(path, long);
        let rest = text
            .split_once("[default: ")
            .unwrap_or_else(|| panic!("{path:?} --{long} states no default: {text}"))
            .1;
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        digits
            .parse()
            .unwrap_or_else(|_| panic!("{path:?} --{long}: {text}"))
    }

    /// Defaults written in help texts (flags that must stay unset when left out, so a config
    /// file's value can apply) are the ones the code uses.
    #[test]
    fn stated_defaults_are_the_real_ones() {
        use crate::source::file;
        let w = crate::watch::WatchConfig::default();
        let ms = |d: std::time::Duration| d.as_millis() as u64;
        for (long, real) in [
            ("debounce-ms", ms(w.debounce.quiet)),
            ("max-wait-ms", ms(w.debounce.max_wait)),
            ("max-lines", w.debounce.max_lines as u64),
            ("max-events", w.max_events_per_update as u64),
            ("max-watches", w.max_watches as u64),
            ("resubscribe-base-ms", ms(w.resubscribe_base)),
            ("resubscribe-attempts", u64::from(w.resubscribe_attempts)),
        ] {
            assert_eq!(stated(&["watch"], long), real, "herald watch --{long}");
        }
        assert_eq!(stated(&["code"], "debounce-ms"), ms(w.debounce.quiet));
        assert_eq!(stated(&["agent"], "debounce-ms"), ms(w.debounce.quiet));
        let pool = crate::filter::pool::PoolConfig::new("herald".into());
        assert_eq!(stated(&["watch"], "filter-memory-bytes"), pool.memory_bytes);
        for (long, real) in [
            ("max-file-bytes", file::DEFAULT_MAX_FILE_BYTES),
            ("debounce-ms", file::DEFAULT_DEBOUNCE_MS),
            ("max-watches", file::DEFAULT_MAX_WATCHES as u64),
            (
                "ring-capacity",
                crate::mcp::ring::DEFAULT_RING_CAPACITY as u64,
            ),
        ] {
            assert_eq!(stated(&["file"], long), real, "herald file --{long}");
        }
        assert_eq!(
            stated(&["memo"], "max-notes-bytes"),
            crate::source::memo::DEFAULT_MAX_NOTES_BYTES as u64
        );
        assert_eq!(
            stated(&["slack"], "max-events"),
            crate::source::slack::buffer::MAX_EVENTS as u64
        );
        let api = help_of(&["slack"], "slack-api-url");
        let real = crate::source::slack::api::DEFAULT_API_URL;
        assert!(api.contains(&format!("[default: {real}]")), "{api}");
    }

    /// Byte sizes are given one way: plain bytes, in a flag named `…-bytes`, its value `BYTES`.
    #[test]
    fn byte_sizes_are_plain_bytes() {
        walk(&Cli::command(), "herald", &mut |path, arg| {
            let long = arg.get_long().unwrap_or_default();
            let text = help(arg).to_lowercase();
            let names: Vec<&str> = arg
                .get_value_names()
                .unwrap_or_default()
                .iter()
                .map(|n| n.as_str())
                .collect();
            let sized = names == ["BYTES"]
                || ["bytes", "-mb", "-kb", "-mib", "-kib", "-gb"]
                    .iter()
                    .any(|u| long.contains(u))
                || [" in bytes", " in mib", " in kib", " in mb", " in kb"]
                    .iter()
                    .any(|u| text.contains(u));
            if !arg.get_action().takes_values() || arg.is_hide_set() || !sized {
                return;
            }
            assert!(long.ends_with("-bytes"), "{path} --{long}: {text}");
            assert_eq!(names, ["BYTES"], "{path} --{long}");
        });
    }

    #[test]
    fn global_flags_have_their_own_section() {
        let cmd = Cli::command();
        for long in ["log-format", "verbose", "store"] {
            let arg = cmd
                .get_arguments()
                .find(|a| a.get_long() == Some(long))
                .expect("a global flag");
            assert!(arg.is_global_set(), "--{long}");
            assert_eq!(arg.get_help_heading(), Some(GLOBAL), "--{long}");
        }
        let mut built = Cli::command();
        built.build();
        let mut watch = built.find_subcommand("watch").unwrap().clone();
        let help = watch.render_long_help().to_string();
        let section = help.split_once("Global options:").expect("a section").1;
        assert!(section.contains("--store"), "{help}");
        assert!(!section.contains("--watch "), "{help}");
    }

    #[test]
    fn call_says_which_flags_name_the_server() {
        let cmd = Cli::command();
        let call = cmd.find_subcommand("call").unwrap();
        let about = call.get_about().unwrap().to_string();
        for flag in ["--mcp-http", "--mcp-quic", "--mcp-stdio"] {
            assert!(about.contains(flag), "{about}");
        }
    }
}
