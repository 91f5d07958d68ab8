//! Listen budgets on HTTP as deployments meet them: callers behind a reverse proxy on this host
//! counted by their own forwarded addresses (a proxy elsewhere only when named with
//! `--trusted-proxy`), callers known by their token counted per token whatever their address,
//! and the server's total; each refusal names the budget that was full and its flag.

use serde_json::{Value, json};

use crate::support::*;

/// Opens a plain HTTP listen on `memo://notes` at `url` with `headers`, on a connection of
/// its own: the open stream (held: dropping it ends the stream) or the JSON-RPC error it was
/// refused with.
async fn listen(url: &str, headers: &[(&str, &str)]) -> Result<reqwest::Response, Value> {
    listen_on(&reqwest::Client::new(), url, headers).await
}

/// [`listen`] with `client`, on a connection it keeps alive if it has one.
async fn listen_on(
    client: &reqwest::Client,
    url: &str,
    headers: &[(&str, &str)],
) -> Result<reqwest::Response, Value> {
    let body = json!({"jsonrpc":"2.0","id":"L","method":"subscriptions/listen",
        "params":{"_meta":meta(),"notifications":{"resourceSubscriptions":["memo://notes"]}}});
    let mut req = client
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "subscriptions/listen")
        .body(body.to_string());
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let mut response = tokio::time::timeout(WAIT, req.send())
        .await
        .expect("an answer in time")
        .expect("the server answers");
    let stream = response
        .headers()
        .get("content-type")
        .is_some_and(|t| t.to_str().unwrap_or("").starts_with("text/event-stream"));
    if stream {
        // The acknowledgment comes first: the stream is admitted.
        let first = tokio::time::timeout(WAIT, response.chunk())
            .await
            .expect("the ack in time")
            .unwrap()
            .expect("a first chunk");
        assert!(
            String::from_utf8_lossy(&first).contains("subscriptions/acknowledged"),
            "{first:?}"
        );
        return Ok(response);
    }
    let answer: Value = response.json().await.expect("a JSON answer");
    Err(answer["error"].clone())
}

/// `herald memo` on HTTP with `flags`.
async fn memo(flags: &[&str]) -> Server {
    let mut args = vec!["--store", ":memory:", "memo", "--http", "127.0.0.1:0"];
    args.extend_from_slice(flags);
    Server::spawn(&args).await
}

fn from(ip: &str) -> [(&'static str, String); 1] {
    [("x-forwarded-for", ip.to_owned())]
}

fn headers<'a>(h: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    h.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

#[tokio::test]
async fn clients_behind_a_proxy_on_this_host_have_budgets_of_their_own_and_the_server_a_total() {
    let s = memo(&[
        "--max-listen-streams",
        "2",
        "--max-total-listen-streams",
        "5",
    ])
    .await;
    let url = s.http_url();
    let one = from("203.0.113.1");
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(listen(&url, &headers(&one)).await.expect("admitted"));
    }
    let refused = listen(&url, &headers(&one)).await.unwrap_err();
    assert_eq!(refused["data"]["budget"], "address", "{refused}");
    let message = refused["message"].as_str().unwrap();
    assert!(
        message.contains("203.0.113.1") && message.contains("--max-listen-streams"),
        "{message}"
    );

    // Another client behind the same proxy: its own budget.
    let two = from("203.0.113.2");
    for _ in 0..2 {
        held.push(listen(&url, &headers(&two)).await.expect("admitted"));
    }
    held.push(
        listen(&url, &headers(&from("203.0.113.3")))
            .await
            .expect("admitted"),
    );
    // Five open: the server's total is full, whoever asks.
    let refused = listen(&url, &headers(&from("203.0.113.4")))
        .await
        .unwrap_err();
    assert_eq!(refused["data"]["budget"], "server", "{refused}");
    assert!(
        refused["message"]
            .as_str()
            .unwrap()
            .contains("--max-total-listen-streams"),
        "{refused}"
    );
    // A stream that ends gives its places back.
    drop(held.pop());
    let again = tokio::time::timeout(WAIT, async {
        loop {
            match listen(&url, &headers(&from("203.0.113.4"))).await {
                Ok(r) => return r,
                // The server sees the hang-up as its connection closes; until then the place
                // is held. Each refused try is a round trip, not a sleep.
                Err(e) => assert_eq!(e["data"]["budget"], "server", "{e}"),
            }
        }
    })
    .await;
    assert!(again.is_ok(), "the place came back");
}

#[tokio::test]
async fn forwarded_addresses_from_an_untrusted_peer_are_ignored() {
    // Only 10.0.0.0/8 is a trusted proxy: this test's loopback peer is not.
    let s = memo(&["--max-listen-streams", "1", "--trusted-proxy", "10.0.0.0/8"]).await;
    let url = s.http_url();
    let _held = listen(&url, &headers(&from("203.0.113.1")))
        .await
        .expect("admitted");
    let refused = listen(&url, &headers(&from("203.0.113.2")))
        .await
        .unwrap_err();
    assert_eq!(refused["data"]["budget"], "address", "{refused}");
    assert!(
        refused["message"].as_str().unwrap().contains("127.0.0.1"),
        "the peer's own address counts: {refused}"
    );
}

const OPS: &str = "ops-token-0123456789";
const DEV: &str = "dev-token-0123456789";

/// `herald gateway` with tokens `ops` and `dev` over a memo slug, on HTTP and QUIC, with
/// `flags`.
async fn gateway(dir: &TempDir, flags: &[&str]) -> Server {
    let cfg = dir.path().join("gateway.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[slug]]\nname = \"memo\"\nstdio = \"{} --store :memory: memo\"\n\
             [[token]]\nname = \"ops\"\nsha256 = \"{}\"\nslugs = [\"*\"]\n\
             [[token]]\nname = \"dev\"\nsha256 = \"{}\"\nslugs = [\"*\"]\n",
            bin(),
            sha(OPS),
            sha(DEV)
        ),
    )
    .unwrap();
    let mut args = vec![
        "--store",
        ":memory:",
        "gateway",
        "--config",
        cfg.to_str().unwrap(),
        "--http",
        "127.0.0.1:0",
        "--quic",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(flags);
    Server::spawn(&args).await
}

#[tokio::test]
async fn a_caller_known_by_its_token_has_its_budget_wherever_it_comes_from() {
    let dir = TempDir::new("budgets");
    let gw = gateway(
        &dir,
        &[
            "--max-caller-listen-streams",
            "2",
            "--max-listen-streams",
            "1",
        ],
    )
    .await;
    let url = gw.http_url();
    let bearer = |t: &str| format!("Bearer {t}");
    let (ops, dev) = (bearer(OPS), bearer(DEV));
    // Two of ops' streams from one address, past the per-address 1: its token's budget.
    let mut held = Vec::new();
    for _ in 0..2 {
        let h = [
            ("authorization", ops.as_str()),
            ("x-forwarded-for", "203.0.113.1"),
        ];
        held.push(listen(&url, &h).await.expect("admitted"));
    }
    let h = [
        ("authorization", ops.as_str()),
        ("x-forwarded-for", "203.0.113.3"),
    ];
    let refused = listen(&url, &h).await.unwrap_err();
    assert_eq!(refused["data"]["budget"], "caller", "{refused}");
    let message = refused["message"].as_str().unwrap();
    assert!(
        message.contains("\"ops\"") && message.contains("--max-caller-listen-streams"),
        "the token's name, never the token: {message}"
    );
    assert!(!message.contains(OPS), "{message}");
    // Another token, from the same address: its own budget.
    let h = [
        ("authorization", dev.as_str()),
        ("x-forwarded-for", "203.0.113.1"),
    ];
    held.push(listen(&url, &h).await.expect("admitted"));
}

/// The issue's case: 70 clients on one host, each on its own connections, through a proxy on
/// this host; with no flag at all every stream is admitted (each client's own 64 count).
#[tokio::test]
async fn seventy_clients_behind_a_local_proxy_need_no_flag() {
    let s = memo(&[]).await;
    let url = s.http_url();
    let opened = futures::future::join_all((0..70).map(|i| {
        let url = url.clone();
        async move {
            let client = [("x-forwarded-for", format!("198.51.100.{i}"))];
            listen(&url, &headers(&client)).await
        }
    }))
    .await;
    let refused: Vec<&Value> = opened.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(refused.is_empty(), "{refused:?}");
}

/// A listen that comes after a call on a kept-alive connection (the gate behind hyper, not the
/// first-request path) counts against the same budget as one that opens its connection.
#[tokio::test]
async fn a_listen_on_a_kept_alive_connection_counts_against_the_same_budget() {
    let s = memo(&["--max-listen-streams", "1"]).await;
    let url = s.http_url();
    let client = reqwest::Client::new();
    let read = json!({"jsonrpc":"2.0","id":"r","method":"resources/read",
        "params":{"_meta":meta(),"uri":"memo://notes"}});
    let answer = client
        .post(&url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "resources/read")
        .header("mcp-name", "memo://notes")
        .body(read.to_string())
        .send()
        .await
        .unwrap();
    assert!(answer.status().is_success(), "{answer:?}");
    answer.bytes().await.unwrap();
    let client_at = [("x-forwarded-for", "203.0.113.7")];
    let _held = listen_on(&client, &url, &client_at)
        .await
        .expect("admitted");
    let refused = listen(&url, &client_at).await.unwrap_err();
    assert_eq!(refused["data"]["budget"], "address", "{refused}");
}

/// On QUIC too a token's streams count together, across its connections: a connection's own
/// budget (64) is not the caller's.
#[tokio::test]
async fn a_tokens_budget_spans_its_quic_connections() {
    use herald::transport::client::{client_config, connect};
    use herald::transport::target::Target;
    use herald::transport::tls::{ClientTrust, Secret};
    let dir = TempDir::new("budgets-quic");
    let gw = gateway(&dir, &["--max-caller-listen-streams", "2"]).await;
    let client = |token: &str| {
        let trust = ClientTrust {
            pin: Some(gw.fingerprint()),
            token: Some(Secret(token.to_owned())),
            ..ClientTrust::default()
        };
        let target = Target::Quic(gw.quic_addr());
        async move {
            connect(&target, &trust, client_config(), 4 << 20)
                .await
                .expect("a QUIC connection")
        }
    };
    let filter = || {
        rmcp::model::SubscriptionFilter::builder()
            .resource_subscription("memo://notes")
            .build()
    };
    let (one, two, three) = (client(OPS).await, client(OPS).await, client(OPS).await);
    let _a = one.listen(filter()).await.expect("admitted");
    let _b = two.listen(filter()).await.expect("admitted");
    let refused = match three.listen(filter()).await {
        Ok(_) => panic!("a third stream of one token past its budget of 2 was admitted"),
        Err(e) => e.to_string(),
    };
    assert!(
        refused.contains("\"ops\"") && refused.contains("--max-caller-listen-streams"),
        "{refused}"
    );
    // Another token, its own budget.
    let other = client(DEV).await;
    let _c = other.listen(filter()).await.expect("admitted");
}
