//! What a person reads when a server cannot be reached: the CLI's, the watch's and the
//! gateway's connect failures as a sentence saying what happened and what to try, never a
//! library's type names; a QUIC server that does not answer given up on within
//! `--connect-timeout-ms`, not QUIC's 60 s idle timeout.

use std::time::{Duration, Instant};

use crate::support::*;

/// Far under QUIC's 60 s idle timeout, yet generous for a loaded machine: a connect that is
/// not bounded by `--connect-timeout-ms` fails the test.
const GIVES_UP_WITHIN: Duration = Duration::from_secs(20);

/// A pin of the right shape that no server has.
const PIN: &str = "abababababababababababababababababababababababababababababababab";

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Nothing of the libraries herald is built on.
fn in_words(err: &str) {
    for internal in [
        "rmcp::",
        "WorkerTransport",
        "reqwest",
        "hyper",
        "Transport [",
    ] {
        assert!(!err.contains(internal), "{internal} in: {err}");
    }
}

#[tokio::test]
async fn a_quic_server_that_does_not_answer_is_given_up_on_within_the_connect_timeout() {
    // Bound and never read: the client's handshake packets go nowhere, as to a server that
    // is down.
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap().to_string();
    let started = Instant::now();
    let out = herald([
        "ls",
        "--mcp-quic",
        &addr,
        "--tls-pin",
        PIN,
        "--connect-timeout-ms",
        "300",
    ])
    .await;
    let took = started.elapsed();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "no QUIC server answered at {addr} within 300 ms — is a herald server listening there (UDP)?"
        )),
        "{err}"
    );
    assert!(took < GIVES_UP_WITHIN, "took {took:?}");
    in_words(&err);
}

#[tokio::test]
async fn a_closed_http_port_is_connection_refused_in_words() {
    let url = format!("http://127.0.0.1:{}/mcp", closed_port());
    let out = herald(["ls", "--mcp-http", &url]).await;
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(
        err.trim_end(),
        format!("herald: connection refused at {url} — is a herald server running there?")
    );
    in_words(&err);
}

#[tokio::test]
async fn an_http_url_without_its_scheme_is_told_to_add_it() {
    let out = herald(["ls", "--mcp-http", "127.0.0.1:8753/mcp"]).await;
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(64), "bad usage: {err}");
    assert!(
        err.contains("needs http:// (or https://) in front: http://127.0.0.1:8753/mcp"),
        "{err}"
    );
    in_words(&err);
    let out = herald([
        "watch",
        "--mcp-http",
        "127.0.0.1:8753/mcp",
        "--watch",
        "n=memo://notes",
    ])
    .await;
    assert_eq!(out.status.code(), Some(64), "{}", stderr(&out));
    assert!(stderr(&out).contains("http://127.0.0.1:8753/mcp"));
}

#[tokio::test]
async fn a_watch_on_unreachable_servers_says_none_is_connected_and_why() {
    let url = format!("http://127.0.0.1:{}/mcp", closed_port());
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let quic = silent.local_addr().unwrap().to_string();
    let out = herald([
        "watch",
        "--mcp-http",
        &url,
        "--mcp-quic",
        &quic,
        "--tls-pin",
        PIN,
        "--connect-timeout-ms",
        "300",
        "--watch",
        "n=memo://notes",
    ])
    .await;
    let err = stderr(&out);
    assert!(!out.status.success(), "{err}");
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("herald: watch n (memo://notes) cannot start: no server is connected: "),
        "{last}"
    );
    assert!(
        last.contains(&format!("connection refused at {url}")),
        "{last}"
    );
    assert!(
        last.contains(&format!("no QUIC server answered at {quic} within 300 ms")),
        "{last}"
    );
    assert!(
        !last.contains("lists"),
        "nobody was asked what they list: {last}"
    );
    in_words(&err);
}

#[tokio::test]
async fn the_gateways_upstream_warnings_say_what_is_wrong() {
    let dir = TempDir::new("connect-gw");
    let refused = format!("http://127.0.0.1:{}/mcp", closed_port());
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let quic = silent.local_addr().unwrap().to_string();
    let cfg = dir.path().join("gateway.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[slug]]\nname = \"web\"\nhttp = \"{refused}\"\n\n\
             [[slug]]\nname = \"udp\"\nquic = \"{quic}\"\ntls_pin = \"{PIN}\"\n"
        ),
    )
    .unwrap();
    // The warm-up tries both before the gateway says it is listening.
    let started = Instant::now();
    let gw = Server::spawn(&[
        "--store",
        ":memory:",
        "gateway",
        "--config",
        cfg.to_str().unwrap(),
        "--http",
        "127.0.0.1:0",
        "--connect-timeout-ms",
        "300",
    ])
    .await;
    assert!(started.elapsed() < GIVES_UP_WITHIN);
    let log = gw.stderr();
    assert!(
        log.contains(&format!(
            "connection refused at {refused} — is a herald server running there?"
        )),
        "{log}"
    );
    assert!(
        log.contains(&format!("no QUIC server answered at {quic} within 300 ms")),
        "{log}"
    );
    in_words(&log);
    gw.terminate().await;

    // A slug URL without its scheme is refused by the config check.
    std::fs::write(
        &cfg,
        "[[slug]]\nname = \"web\"\nhttp = \"127.0.0.1:8753/mcp\"\n",
    )
    .unwrap();
    let out = herald(["check", cfg.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(64), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("slug web: http = 127.0.0.1:8753/mcp is not a URL"),
        "{}",
        stderr(&out)
    );
}
