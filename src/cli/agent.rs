//! `herald agent`: an LLM agent over the watch client. What a person types on stdin and the
//! notices of the watches it starts become turns of the model (any OpenAI-compatible chat
//! completions API), which acts through `run_code` (code mode). See `src/agent/`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, anyhow};
use clap::Args;
use serde_json::json;
use tokio::sync::mpsc;

use crate::agent::code::{CodeMode, system_prompt};
use crate::agent::model::Message;
use crate::agent::openai::{ChatClient, ChatConfig};
use crate::agent::runtime::{Agent, Event, ReplyTo};
use crate::agent::session::SessionLog;
use crate::agent::terminal::Terminal;
use crate::app;
use crate::cli::watch::ServerFlags;
use crate::cli::{Exit, Globals, usage};
use crate::filter::pool::{FilterPool, PoolConfig};
use crate::store::Table;
use crate::transport::tls::Secret;
use crate::watch::log::WatchLog;
use crate::watch::sink::Sink;
use crate::watch::spec::Notice;
use crate::watch::{WatchConfig, WatchManager, WatchOptions};

/// Where the model's key comes from: the environment, or a file of that name in
/// `$CREDENTIALS_DIRECTORY` (systemd's `LoadCredential=`).
const KEY_VAR: &str = "HERALD_MODEL_KEY";

#[derive(Debug, Args)]
pub struct AgentArgs {
    #[command(flatten)]
    pub servers: ServerFlags,
    /// The model's OpenAI-compatible API: its base URL (llama.cpp, vLLM, Ollama:
    /// http://127.0.0.1:8080/v1) or its …/chat/completions URL. The key, if it needs one,
    /// comes from HERALD_MODEL_KEY or $CREDENTIALS_DIRECTORY/HERALD_MODEL_KEY.
    #[arg(long, env = "HERALD_MODEL_URL", value_name = "URL")]
    pub model_url: Option<String>,
    /// The model name sent with each request.
    #[arg(long, default_value = "default", value_name = "NAME")]
    pub model: String,
    /// The longest answer, in tokens (sent as max_tokens).
    #[arg(long, default_value_t = ChatConfig::DEFAULT_MAX_TOKENS, value_name = "N")]
    pub max_tokens: u32,
    /// The longest one model request may take, in seconds.
    #[arg(long, default_value_t = 600, value_name = "SECS")]
    pub model_timeout: u64,
    /// A file of the operator's instructions, added to the system prompt.
    #[arg(long, value_name = "FILE")]
    pub prompt: Option<PathBuf>,
    /// The session log (JSONL) [default: agent-session.jsonl beside the store; none with
    /// --store :memory:].
    #[arg(long, value_name = "FILE")]
    pub session: Option<PathBuf>,
    /// Continue the session: its thread from the session log, and the watches it left running
    /// (kept in the store). Without it a session starts with no watches.
    #[arg(long)]
    pub resume: bool,
    /// Quiet time before a notice goes out, in ms [default: 3000].
    #[arg(long, value_name = "MS")]
    pub debounce_ms: Option<u64>,
    /// Take input from Slack too: messages addressed to the bot (the Slack source's
    /// slack-events://message_posted?addressed_to_bot=true, by push), answered in their thread
    /// with slack_post_message. A server among --mcp-* must serve them (herald slack, or
    /// herald up with [slack]).
    #[arg(long)]
    pub slack: bool,
    /// With --slack: where notices go before anyone has addressed the bot (a conversation id;
    /// repeatable, the first is used) [default: the terminal].
    #[arg(long, value_name = "ID")]
    pub channel: Vec<String>,
}

fn model_key() -> Option<Secret> {
    if let Ok(k) = std::env::var(KEY_VAR)
        && !k.trim().is_empty()
    {
        return Some(Secret(k.trim().to_owned()));
    }
    let dir = std::env::var_os("CREDENTIALS_DIRECTORY")?;
    let k = std::fs::read_to_string(std::path::Path::new(&dir).join(KEY_VAR)).ok()?;
    let k = k.trim().to_owned();
    (!k.is_empty()).then_some(Secret(k))
}

pub async fn run(args: AgentArgs, globals: &Globals, verbose: bool) -> Result<(), Exit> {
    let mut cfg = WatchConfig::default();
    if let Some(ms) = args.debounce_ms {
        cfg.debounce.quiet = Duration::from_millis(ms);
    }
    let servers = args.servers.servers(cfg.max_message_bytes)?;
    if servers.is_empty() {
        return Err(usage(anyhow!(
            "the agent needs a server to act on: pass --mcp-stdio, --mcp-http or --mcp-quic (herald up serves one at http://127.0.0.1:8750/mcp)"
        )));
    }
    if args.slack && crate::agent::slack::inbox_served(&servers).await == Some(false) {
        return Err(usage(anyhow!(
            "--slack takes input from a Slack source, and none of the servers has one (none lists {}): add herald slack (or herald up with [slack]) among --mcp-*, or leave --slack out",
            crate::agent::slack::INBOX
        )));
    }
    let Some(model_url) = &args.model_url else {
        return Err(usage(anyhow!(
            "the agent needs a model: pass --model-url URL or set HERALD_MODEL_URL to an OpenAI-compatible chat API (llama.cpp's llama-server, vLLM, Ollama: http://127.0.0.1:8080/v1; OpenAI: https://api.openai.com/v1 with HERALD_MODEL_KEY)"
        )));
    };
    let model = chat_client(model_url, &args.model, args.max_tokens, args.model_timeout)?;
    // A model that is not there is said now, not after the first question's retries.
    model.probe().await.map_err(|e| anyhow!("{e}"))?;
    let operator = match &args.prompt {
        Some(p) => Some(
            std::fs::read_to_string(p)
                .with_context(|| format!("reading --prompt {}", p.display()))
                .map_err(usage)?,
        ),
        None => None,
    };
    // The store keeps the session's watches (for --resume); the session log sits beside it.
    let store = globals.open_store().await?;
    let session_path = args.session.clone().or_else(|| {
        globals
            .store_path()
            .map(|p| p.with_file_name("agent-session.jsonl"))
    });
    let mut resumed = Vec::new();
    if args.resume {
        let Some(path) = &session_path else {
            return Err(usage(anyhow!(
                "--resume needs the session log: pass --session FILE (with --store :memory: there is no default)"
            )));
        };
        if path.exists() {
            let (thread, records) = SessionLog::thread(path)
                .with_context(|| format!("reading the session log {}", path.display()))?;
            tracing::info!(session = %path.display(), records, messages = thread.len(), "resuming the session");
            resumed = thread;
        }
    } else {
        // A new session starts with no watches (of its own; herald watch's stay).
        for (key, _) in store.scan(Table::Watches).await? {
            if key.starts_with(crate::watch::manager::AGENT_STATE) {
                let _ = store.delete(Table::Watches, &key).await;
            }
        }
        if let Some(path) = &session_path {
            let _ = std::fs::remove_file(path);
        }
    }
    let log = match &session_path {
        Some(p) => SessionLog::open(p)
            .with_context(|| format!("opening the session log {}", p.display()))?,
        None => SessionLog::none(),
    };
    log.record(
        "session.started",
        json!({"model": args.model, "url": model.endpoint(), "resumed": args.resume}),
    );

    let exe = std::env::current_exe().context("finding the herald binary for Python workers")?;
    let mut code_cfg = PoolConfig::new(exe.clone());
    code_cfg.workers = 1;
    let code_pool = FilterPool::new(code_cfg);
    let (ntx, nrx) = mpsc::channel::<Notice>(64);
    let opts = WatchOptions {
        config: cfg,
        servers,
        sink: Sink::Channel(ntx),
        log: WatchLog::stderr(verbose),
        store: Some(store),
        filters: Some(PoolConfig::new(exe)),
        watches: Vec::new(),
        configured: crate::watch::Configured::Kept,
        end_when_all_ended: false,
        state_prefix: crate::watch::manager::AGENT_STATE,
    };
    let shutdown = tokio_util::sync::CancellationToken::new();
    app::cancel_on_signals(shutdown.clone());
    let unanswered: Arc<std::sync::atomic::AtomicBool> = Default::default();
    let settings = Settings {
        model: Arc::new(model),
        operator,
        log: log.clone(),
        resumed,
        slack: args.slack,
        channel: args.channel.clone(),
        code_pool,
        // Input over and nothing watched: nothing more will come (Slack always may).
        end_when_idle: !args.slack,
        unanswered: unanswered.clone(),
    };
    let session = async |manager: &WatchManager| {
        serve(manager, settings, nrx, shutdown.clone()).await;
        false
    };
    let _ = crate::watch::run(opts, shutdown.clone(), session).await;
    log.record("session.ended", json!({}));
    // Piped (a script asked), a question with no answer is a failure it must see.
    if unanswered.load(std::sync::atomic::Ordering::Acquire)
        && !std::io::IsTerminal::is_terminal(&std::io::stdin())
    {
        return Err(anyhow!("a question got no answer (the model failed: see above)").into());
    }
    Ok(())
}

/// What the agent runs with, however it was started (`herald agent`, `herald up`).
pub(crate) struct Settings {
    pub model: Arc<dyn crate::agent::model::Model>,
    pub operator: Option<String>,
    pub log: SessionLog,
    pub resumed: Vec<Message>,
    pub slack: bool,
    pub channel: Vec<String>,
    pub code_pool: FilterPool,
    /// End once stdin has ended and no watch runs.
    pub end_when_idle: bool,
    /// Set when a person's question got no answer.
    pub unanswered: Arc<std::sync::atomic::AtomicBool>,
}

/// Runs the agent on `manager` (its servers, its watches) with the notices of `nrx` until
/// `shutdown`, or until it is idle with nothing to wait for.
pub(crate) async fn serve(
    manager: &WatchManager,
    s: Settings,
    mut nrx: mpsc::Receiver<Notice>,
    shutdown: tokio_util::sync::CancellationToken,
) {
    let (etx, erx) = mpsc::channel::<Event>(64);
    // Notices enter the loop as events, the way input does.
    let notices = {
        let etx = etx.clone();
        tokio::spawn(async move {
            while let Some(n) = nrx.recv().await {
                let ev = Event::Notice {
                    watch: n.watch,
                    uri: n.uri,
                    block: n.text,
                };
                if etx.send(ev).await.is_err() {
                    return;
                }
            }
        })
    };
    if s.slack {
        tokio::spawn(crate::agent::slack::follow_inbox(
            manager.servers().to_vec(),
            etx.clone(),
            shutdown.child_token(),
        ));
    }
    // With Slack, stdin is read only at a terminal (under systemd it is /dev/null).
    if !s.slack || std::io::IsTerminal::is_terminal(&std::io::stdin()) {
        Terminal::read_stdin(etx);
    }
    let mut thread = vec![Message::system(system_prompt(
        manager.servers(),
        s.operator.as_deref(),
    ))];
    thread.extend(s.resumed);
    let watching = manager.clone();
    let agent = Agent {
        model: s.model,
        code: Arc::new(CodeMode {
            pool: s.code_pool,
            catalog: manager.code_catalog(),
        }),
        channel: if s.slack {
            Arc::new(crate::agent::slack::SlackReplies {
                catalog: manager.code_catalog(),
                terminal: Terminal::counting(s.unanswered.clone()),
            })
        } else {
            Arc::new(Terminal::counting(s.unanswered.clone()))
        },
        log: s.log,
        default_reply: match s.channel.first() {
            Some(c) if s.slack => ReplyTo::Slack {
                channel: c.clone(),
                thread_ts: None,
            },
            _ => ReplyTo::Terminal,
        },
        thread,
        done_when: s
            .end_when_idle
            .then(|| -> Arc<dyn Fn() -> bool + Send + Sync> {
                Arc::new(move || watching.watch_list().iter().all(|w| w.failed))
            }),
    };
    tokio::select! {
        _ = agent.run(erx) => {}
        _ = shutdown.cancelled() => {}
    }
    notices.abort();
}

/// The chat client for `url` (the key from the environment or the credentials directory).
pub(crate) fn chat_client(
    url: &str,
    model: &str,
    max_tokens: u32,
    timeout_secs: u64,
) -> Result<ChatClient, Exit> {
    crate::runtime::secrets::register(KEY_VAR);
    ChatClient::new(ChatConfig {
        url: url.to_owned(),
        model: model.to_owned(),
        key: model_key(),
        max_tokens,
        timeout: Duration::from_secs(timeout_secs.max(1)),
        retries: ChatConfig::DEFAULT_RETRIES,
    })
    .map_err(|e| usage(e.into()))
}
