//! Test support: spawn `herald` roles, read their bound addresses, connect clients.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, Once};
use std::time::Duration;

use herald::transport::client::{Connection, client_config, connect};

use herald::transport::target::Target;
use herald::transport::tls::ClientTrust;
use rmcp::model::{CallToolRequestParams, ReadResourceRequestParams, ResourceContents};
use serde_json::{Map, Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// The bound for any await in a test: generous, because CI machines are loaded.
pub const WAIT: Duration = Duration::from_secs(30);

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_herald")
}

pub fn init() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// A fresh temporary directory, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("herald-it-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running `herald` server process.
pub struct Server {
    pub child: Child,
    /// The line [`Server::start`] waited for (for [`Server::spawn`], the `listening` line).
    pub listening: Value,
    pub stderr: Arc<Mutex<String>>,
    /// Every later JSON line (events and logs), in order.
    events: tokio::sync::mpsc::UnboundedReceiver<Value>,
}

impl Server {
    /// Spawns `herald --log-format json ARGS` and waits for its `listening` line.
    pub async fn spawn(args: &[&str]) -> Server {
        Server::spawn_env(args, &[]).await
    }

    /// [`spawn`](Self::spawn) with `env` set, and none of the Slack role's variables, systemd's
    /// credentials directory or proxies inherited from the test's own environment.
    pub async fn spawn_env(args: &[&str], env: &[(&str, &str)]) -> Server {
        let mut cmd = Command::new(bin());
        for v in [
            "SLACK_APP_TOKEN",
            "SLACK_BOT_TOKEN",
            "SLACK_EVENTS_ENCRYPTION_KEY",
            "SLACK_EVENTS_RETENTION_DAYS",
            "CREDENTIALS_DIRECTORY",
            "HERALD_EVENTS_KEY",
            // (Proxies of the test's environment would carry the servers' own calls.)
            "HTTP_PROXY",
            "http_proxy",
            "HTTPS_PROXY",
            "https_proxy",
            "ALL_PROXY",
            "all_proxy",
        ] {
            cmd.env_remove(v);
        }
        cmd.envs(env.iter().copied())
            .arg("--log-format")
            .arg("json")
            .args(args);
        Server::start(cmd, "listening").await
    }

    /// Spawns `cmd` (a `herald --log-format json …`, perhaps behind a wrapper) with stderr
    /// piped and waits for its first JSON line whose `event` is `until`.
    pub async fn start(mut cmd: Command, until: &str) -> Server {
        init();
        let what = format!("{:?}", cmd.as_std());
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn herald");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, mut events) = tokio::sync::mpsc::unbounded_channel();
        let log2 = log.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                log2.lock().unwrap().push_str(&line);
                log2.lock().unwrap().push('\n');
                if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    let _ = tx.send(v);
                }
            }
        });
        let listening = match tokio::time::timeout(WAIT, next_event(&mut events, until)).await {
            Ok(Some(v)) => v,
            _ => panic!(
                "{what} never said {until}; stderr:\n{}",
                log.lock().unwrap()
            ),
        };
        Server {
            child,
            listening,
            stderr: log,
            events,
        }
    }

    /// Waits for the next JSON line (an event or a log line) that `matches`, skipping the
    /// others; `what` names it in the panic when none comes.
    pub async fn line_where(&mut self, what: &str, matches: impl Fn(&Value) -> bool) -> Value {
        let found = tokio::time::timeout(WAIT, async {
            while let Some(v) = self.events.recv().await {
                if matches(&v) {
                    return Some(v);
                }
            }
            None
        })
        .await;
        match found {
            Ok(Some(v)) => v,
            _ => panic!("herald never said {what}; stderr:\n{}", self.stderr()),
        }
    }

    /// The admin address's base URL (`http://ADDR`), from the line waited for.
    pub fn admin_url(&self) -> String {
        format!(
            "http://{}",
            self.listening["admin"]
                .as_str()
                .expect("serving an admin address")
        )
    }

    pub fn http_url(&self) -> String {
        self.listening["http_url"]
            .as_str()
            .expect("serving http")
            .to_owned()
    }

    pub fn quic_addr(&self) -> String {
        self.listening["quic"]
            .as_str()
            .expect("serving quic")
            .to_owned()
    }

    pub fn fingerprint(&self) -> String {
        self.listening["quic_fingerprint"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// Everything the server wrote to stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    pub fn pid(&self) -> u32 {
        self.child.id().expect("running")
    }

    /// Sends SIGTERM and waits for exit.
    pub async fn terminate(mut self) -> std::process::ExitStatus {
        let _ = std::process::Command::new("kill")
            .arg("-TERM")
            .arg(self.pid().to_string())
            .status();
        tokio::time::timeout(WAIT, self.child.wait())
            .await
            .expect("herald exits after SIGTERM")
            .unwrap()
    }
}

async fn next_event(
    events: &mut tokio::sync::mpsc::UnboundedReceiver<Value>,
    name: &str,
) -> Option<Value> {
    while let Some(v) = events.recv().await {
        if v["event"] == name {
            return Some(v);
        }
    }
    None
}

/// The transports a test runs over.
#[derive(Debug, Clone, Copy)]
pub enum Via {
    Stdio,
    Http,
    Quic,
}

/// A memo server reachable over `via`, and a way to make clients for it.
pub struct Memo {
    pub server: Option<Server>,
    pub target: Target,
    pub trust: ClientTrust,
}

impl Memo {
    pub async fn start(via: Via) -> Memo {
        Memo::start_with(via, &[]).await
    }

    pub async fn start_with(via: Via, extra: &[&str]) -> Memo {
        init();
        match via {
            Via::Stdio => Memo {
                server: None,
                target: Target::Stdio(format!(
                    "{} --store :memory: memo {}",
                    bin(),
                    extra.join(" ")
                )),
                trust: ClientTrust::default(),
            },
            Via::Http => {
                let mut args = vec!["--store", ":memory:", "memo", "--http", "127.0.0.1:0"];
                args.extend_from_slice(extra);
                let s = Server::spawn(&args).await;
                Memo {
                    target: Target::Http(s.http_url()),
                    trust: ClientTrust::default(),
                    server: Some(s),
                }
            }
            Via::Quic => {
                let mut args = vec!["--store", ":memory:", "memo", "--quic", "127.0.0.1:0"];
                args.extend_from_slice(extra);
                let s = Server::spawn(&args).await;
                Memo {
                    target: Target::Quic(s.quic_addr()),
                    trust: ClientTrust {
                        ca: None,
                        pin: Some(s.fingerprint()),
                        token: None,
                        oauth: None,
                    },
                    server: Some(s),
                }
            }
        }
    }

    /// A new client connection. Over stdio that is a new server process, so tests that need
    /// two clients of one server use HTTP or QUIC.
    pub async fn client(&self) -> Connection {
        tokio::time::timeout(
            WAIT,
            connect(&self.target, &self.trust, client_config(), 4 * 1024 * 1024),
        )
        .await
        .expect("connect in time")
        .expect("connect")
    }
}

/// `herald gateway --config CFG --http` on a free port (an in-memory store).
pub async fn http_gateway_server(cfg: &Path) -> Server {
    gateway_server(cfg, ":memory:", &[]).await
}

/// `herald --store STORE gateway --config CFG --http 127.0.0.1:0 EXTRA…`.
pub async fn gateway_server(cfg: &Path, store: &str, extra: &[&str]) -> Server {
    gateway_server_env(cfg, store, extra, &[]).await
}

/// [`gateway_server`] with `env` set.
pub async fn gateway_server_env(
    cfg: &Path,
    store: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Server {
    let mut args = vec![
        "--store",
        store,
        "gateway",
        "--config",
        cfg.to_str().unwrap(),
        "--http",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(extra);
    Server::spawn_env(&args, env).await
}

/// The value of the first line of the Prometheus text at `url` that starts with `series`
/// and a space (`name` or `name{labels}`), if there is one.
pub async fn metric(url: &str, series: &str) -> Option<u64> {
    let text = reqwest::get(url).await.unwrap().text().await.unwrap();
    let prefix = format!("{series} ");
    text.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|v| v.trim().parse().ok())
}

/// Runs `herald ARGS` to completion (stdin closed, bounded by [`WAIT`]) and returns its output.
pub async fn herald<S: AsRef<std::ffi::OsStr>>(
    args: impl IntoIterator<Item = S>,
) -> std::process::Output {
    tokio::time::timeout(
        WAIT,
        Command::new(bin()).args(args).stdin(Stdio::null()).output(),
    )
    .await
    .expect("herald finishes in time")
    .expect("herald runs")
}

pub fn args(v: Value) -> Map<String, Value> {
    v.as_object().unwrap().clone()
}

pub async fn call(conn: &Connection, tool: &str, a: Value) {
    let r = tokio::time::timeout(
        WAIT,
        conn.call_tool(CallToolRequestParams::new(tool.to_owned()).with_arguments(args(a))),
    )
    .await
    .expect("call in time")
    .expect("call succeeds");
    assert_ne!(r.is_error, Some(true), "{tool} failed: {r:?}");
}

/// Reads `uri` and parses its text as JSON; also returns the mimeType.
pub async fn read_json(conn: &Connection, uri: &str) -> (Value, String) {
    let r = tokio::time::timeout(
        WAIT,
        conn.read_resource(ReadResourceRequestParams::new(uri.to_owned())),
    )
    .await
    .expect("read in time")
    .expect("read succeeds");
    match &r.contents[0] {
        ResourceContents::TextResourceContents {
            text, mime_type, ..
        } => (
            serde_json::from_str(text).expect("json"),
            mime_type.clone().unwrap_or_default(),
        ),
        other => panic!("unexpected contents {other:?}"),
    }
}

pub fn meta() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "wire-test", "version": "1"}
    })
}

/// A TCP port nothing listens on (bound, then let go).
pub fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A token's SHA-256 in hex, as a `[[token]]`'s `sha256` takes it.
pub fn sha(t: &str) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(t.as_bytes()))
}

/// `herald up`'s demo on an in-memory store, HTTP only (no QUIC, no admin address), with
/// `extra` flags and `env`; its demo directory under `demo`. Returns the server and a way to
/// make clients of its gateway.
pub async fn up_demo_http(demo: &TempDir, extra: &[&str], env: &[(&str, &str)]) -> (Server, Memo) {
    let dir = demo.path().join("d");
    let mut args = vec![
        "--store",
        ":memory:",
        "up",
        "--http",
        "127.0.0.1:0",
        "--quic",
        "",
        "--admin",
        "",
        "--demo-dir",
        dir.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let up = Server::spawn_env(&args, env).await;
    let memo = Memo {
        target: Target::Http(up.http_url()),
        trust: ClientTrust::default(),
        server: None,
    };
    (up, memo)
}
