//! herald under systemd, as systemd sees it: the notify protocol on a datagram socket the test
//! creates (READY only once the listeners answer, STATUS lines, WATCHDOG pings, STOPPING with
//! EXTEND_TIMEOUT_USEC at shutdown), socket activation with a listener the test binds and
//! passes as descriptor 3, and nothing of it leaking to the processes herald starts.

use std::os::fd::{AsRawFd, RawFd};
use std::process::Stdio;

use serde_json::json;
use tokio::net::UnixDatagram;
use tokio::process::Command;

use crate::support::*;

/// A notify socket in a fresh directory, as systemd's `/run/systemd/notify`.
struct NotifySocket {
    sock: UnixDatagram,
    path: std::path::PathBuf,
    _dir: TempDir,
}

impl NotifySocket {
    fn new() -> NotifySocket {
        let dir = TempDir::new("notify");
        let path = dir.path().join("notify");
        let sock = UnixDatagram::bind(&path).expect("bind the notify socket");
        NotifySocket {
            sock,
            path,
            _dir: dir,
        }
    }

    /// The next message, within [`WAIT`].
    async fn next(&self) -> String {
        let mut buf = vec![0u8; 4096];
        let n = tokio::time::timeout(WAIT, self.sock.recv(&mut buf))
            .await
            .expect("a notify message in time")
            .expect("recv");
        String::from_utf8(buf[..n].to_vec()).expect("utf-8")
    }

    /// Messages up to and including the first with `line`.
    async fn until(&self, line: &str) -> Vec<String> {
        let mut seen = Vec::new();
        loop {
            let m = self.next().await;
            let done = m.lines().any(|l| l == line);
            seen.push(m);
            if done {
                return seen;
            }
        }
    }
}

fn status_of(message: &str) -> &str {
    message
        .lines()
        .find_map(|l| l.strip_prefix("STATUS="))
        .unwrap_or_else(|| panic!("no STATUS= in {message:?}"))
}

#[tokio::test]
async fn ready_comes_once_the_listeners_answer_then_watchdog_pings_and_stopping() {
    init();
    let notify = NotifySocket::new();
    let mut cmd = Command::new(bin());
    cmd.env("NOTIFY_SOCKET", &notify.path)
        .env("WATCHDOG_USEC", "200000")
        .args(["--store", ":memory:", "memo", "--http", "127.0.0.1:0"])
        .args(["--admin", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    let mut child = cmd.spawn().expect("spawn herald");

    // Nothing is read from herald but the notify socket: READY alone must say where to go.
    let before = notify.until("READY=1").await;
    let ready = before.last().unwrap();
    assert!(
        before[..before.len() - 1]
            .iter()
            .all(|m| !m.contains("READY=1")),
        "{before:?}"
    );
    assert_eq!(status_of(&before[0]), "starting memo", "{before:?}");
    let status = status_of(ready);
    assert!(
        status.starts_with("serving memo on http://127.0.0.1:"),
        "{status}"
    );
    let url = status
        .split_whitespace()
        .find(|w| w.starts_with("http://") && w.ends_with("/mcp;"))
        .expect("the MCP URL in STATUS")
        .trim_end_matches(';')
        .to_owned();
    let admin = status
        .rsplit("admin on ")
        .next()
        .expect("the admin address in STATUS")
        .to_owned();
    // The moment READY arrives, both listeners answer.
    let conn = tokio::time::timeout(
        WAIT,
        herald::transport::client::connect(
            &herald::transport::target::Target::Http(url),
            &Default::default(),
            herald::transport::client::client_config(),
            1 << 20,
        ),
    )
    .await
    .expect("connect in time")
    .expect("the MCP endpoint answers at READY");
    call(&conn, "memo_set", json!({"key": "k", "value": 1})).await;
    let ready_body = reqwest::get(format!("{admin}/ready")).await.unwrap();
    assert_eq!(ready_body.status(), 200);

    // WATCHDOG_USEC=200000: a ping every 100 ms.
    assert_eq!(notify.next().await, "WATCHDOG=1\n");
    assert_eq!(notify.next().await, "WATCHDOG=1\n");
    conn.close().await;

    let _ = std::process::Command::new("kill")
        .arg("-TERM")
        .arg(child.id().unwrap().to_string())
        .status();
    let stopping = notify.until("STOPPING=1").await;
    let last = stopping.last().unwrap();
    assert_eq!(status_of(last), "draining", "{last:?}");
    let extend = last
        .lines()
        .find_map(|l| l.strip_prefix("EXTEND_TIMEOUT_USEC="))
        .expect("EXTEND_TIMEOUT_USEC with STOPPING")
        .parse::<u64>()
        .unwrap();
    assert!(extend >= 6_000_000, "covers the drain: {extend}");
    let status = tokio::time::timeout(WAIT, child.wait())
        .await
        .expect("exits after SIGTERM")
        .unwrap();
    assert!(status.success(), "{status:?}");
}

/// `herald ARGS` with `fd` as descriptor 3 named `names`, and `LISTEN_PID` set to the herald
/// process's own pid (a shell sets it to `$$` and execs herald, which keeps the pid).
fn activated(fd: RawFd, names: &str, args: &[&str]) -> std::process::Command {
    let mut cmd = std::process::Command::new("sh");
    cmd.arg("-c")
        .arg("LISTEN_PID=$$; export LISTEN_PID; exec \"$0\" \"$@\"")
        .arg(bin())
        .args(args)
        .env("LISTEN_FDS", "1")
        .env("LISTEN_FDNAMES", names);
    crate::fd3::pass_as_fd_3(&mut cmd, fd);
    cmd
}

#[tokio::test]
async fn socket_activation_serves_mcp_on_the_inherited_listener() {
    init();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    // No --http: the socket systemd passes is the HTTP listener (and there is no stdio).
    let cmd = activated(
        listener.as_raw_fd(),
        "herald-memo.socket",
        &["--log-format", "json", "--store", ":memory:", "memo"],
    );
    let server = Server::start(cmd.into(), "listening").await;
    drop(listener);
    assert_eq!(
        server.listening["http"],
        addr.to_string(),
        "{}",
        server.listening
    );
    assert_eq!(server.listening["stdio"], false);
    let conn = Memo {
        target: herald::transport::target::Target::Http(server.http_url()),
        trust: Default::default(),
        server: None,
    }
    .client()
    .await;
    call(
        &conn,
        "memo_set",
        json!({"key": "via", "value": "socket activation"}),
    )
    .await;
    let (notes, _) = read_json(&conn, "memo://notes").await;
    assert_eq!(notes, json!({"via": "socket activation"}));
    conn.close().await;
    assert!(server.terminate().await.success());
}

#[tokio::test]
async fn an_inherited_admin_socket_serves_the_admin_address_and_http_still_binds() {
    init();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let cmd = activated(
        listener.as_raw_fd(),
        "admin",
        &[
            "--log-format",
            "json",
            "--store",
            ":memory:",
            "memo",
            "--http",
            "127.0.0.1:0",
        ],
    );
    let server = Server::start(cmd.into(), "listening").await;
    drop(listener);
    assert_eq!(server.listening["admin"], addr.to_string());
    assert_ne!(server.listening["http"], addr.to_string());
    let live = reqwest::get(format!("http://{addr}/live")).await.unwrap();
    assert_eq!(live.text().await.unwrap(), "ok\n");
    assert!(server.terminate().await.success());
}

#[tokio::test]
async fn processes_herald_starts_see_no_notify_socket_and_no_listen_fds() {
    init();
    let notify = NotifySocket::new();
    let dir = TempDir::new("notify-env");
    let env_file = dir.path().join("env");
    let config = dir.path().join("gateway.toml");
    // The upstream writes its environment, then is a memo server. The gateway connects to it
    // before it is ready, so the file is written by the time READY arrives.
    std::fs::write(
        &config,
        format!(
            "[[slug]]\nname = \"memo\"\nstdio = \"sh -c 'env > {} && exec {} --store :memory: memo'\"\n",
            env_file.display(),
            bin()
        ),
    )
    .unwrap();
    let server = Server::spawn_env(
        &[
            "--store",
            ":memory:",
            "gateway",
            "--config",
            config.to_str().unwrap(),
            "--http",
            "127.0.0.1:0",
        ],
        &[
            ("NOTIFY_SOCKET", notify.path.to_str().unwrap()),
            ("WATCHDOG_USEC", "30000000"),
            ("LISTEN_FDS", "1"),
            ("LISTEN_PID", "1"),
        ],
    )
    .await;
    let ready = notify.until("READY=1").await;
    assert!(
        status_of(ready.last().unwrap()).starts_with("serving gateway on http://"),
        "{ready:?}"
    );
    let env = std::fs::read_to_string(&env_file).expect("the upstream wrote its environment");
    for var in ["NOTIFY_SOCKET", "WATCHDOG_USEC", "LISTEN_FDS", "LISTEN_PID"] {
        assert!(
            !env.lines().any(|l| l.starts_with(&format!("{var}="))),
            "{var} leaked to a child:\n{env}"
        );
    }
    assert!(server.terminate().await.success());
}

#[tokio::test]
async fn a_passed_socket_that_is_not_a_tcp_listener_is_refused_with_exit_64() {
    init();
    // A UDP socket where a stream listener belongs.
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut cmd = activated(udp.as_raw_fd(), "http", &["--store", ":memory:", "memo"]);
    cmd.stdin(Stdio::null());
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .unwrap()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("is not a listening TCP socket"), "{stderr}");
}

/// The admin address's `/status`.
async fn status_json(admin: &str) -> serde_json::Value {
    reqwest::get(format!("{admin}/status"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// `systemctl reload` of a `Type=notify-reload` unit: systemd sends SIGHUP and waits for
/// `RELOADING=1` with `MONOTONIC_USEC=`, then `READY=1`. The reload is done (and on the
/// board) when READY comes; a broken config is answered the same way, the running one kept.
#[tokio::test]
async fn sighup_reloads_with_reloading_then_ready() {
    init();
    let notify = NotifySocket::new();
    let dir = TempDir::new("notify-reload");
    let cfg = dir.path().join("gateway.toml");
    let slug = |name: &str| {
        format!(
            "[[slug]]\nname = \"{name}\"\nhttp = \"http://127.0.0.1:{}/mcp\"\n\n",
            closed_port()
        )
    };
    let a = slug("a");
    std::fs::write(&cfg, &a).unwrap();
    let mut cmd = Command::new(bin());
    cmd.env("NOTIFY_SOCKET", &notify.path)
        .args(["--store", ":memory:", "gateway", "--config"])
        .arg(&cfg)
        .args(["--http", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    let child = cmd.spawn().expect("spawn herald");
    let ready = notify.until("READY=1").await;
    let admin = status_of(ready.last().unwrap())
        .rsplit("admin on ")
        .next()
        .expect("the admin address in STATUS")
        .to_owned();
    let hup = || {
        let ok = std::process::Command::new("kill")
            .arg("-HUP")
            .arg(child.id().unwrap().to_string())
            .status()
            .unwrap();
        assert!(ok.success());
    };

    std::fs::write(&cfg, format!("{a}{}", slug("b"))).unwrap();
    hup();
    let seen = notify.until("READY=1").await;
    let reloading = seen
        .iter()
        .find(|m| m.lines().any(|l| l == "RELOADING=1"))
        .unwrap_or_else(|| panic!("RELOADING=1 before READY=1: {seen:?}"));
    let usec: u64 = reloading
        .lines()
        .find_map(|l| l.strip_prefix("MONOTONIC_USEC="))
        .expect("MONOTONIC_USEC with RELOADING")
        .parse()
        .expect("a number");
    assert!(usec > 0);
    assert!(
        status_of(seen.last().unwrap()).starts_with("serving gateway"),
        "{seen:?}"
    );
    let status = status_json(&admin).await;
    assert_eq!(status["reloads"]["applied"], 1, "{status}");
    assert_eq!(
        status["reloads"]["last"]["changes"][0], "slug b added",
        "{status}"
    );

    // A broken config: the same two messages, the reload counted as refused.
    std::fs::write(&cfg, "[[slug]]\nname = 5\n").unwrap();
    hup();
    let seen = notify.until("READY=1").await;
    assert!(seen.iter().any(|m| m.contains("RELOADING=1")), "{seen:?}");
    let status = status_json(&admin).await;
    assert_eq!(status["reloads"]["refused"], 1, "{status}");
    assert_eq!(status["upstreams"].as_array().unwrap().len(), 2, "{status}");
}
