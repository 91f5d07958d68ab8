//! `herald gateway` end to end: memo servers over HTTP and stdio as upstreams, clients with
//! tokens over HTTP and QUIC.

use rmcp::model::{
    CallToolRequestParams, ClientRequest, CustomRequest, ServerNotification, SubscriptionFilter,
};
use serde_json::{Value, json};

use crate::support::*;
use herald::transport::client::{Connection, client_config, connect};
use herald::transport::target::Target;
use herald::transport::tls::{ClientTrust, Secret};

const ALL: &str = "token-all-7f3a";
const ONLY_A: &str = "token-a-91bc";

struct Setup {
    a: Server,
    _b: Server,
    gw: Server,
    _dir: TempDir,
}

async fn setup() -> Setup {
    let a = Server::spawn(&["-v", "--store", ":memory:", "memo", "--http", "127.0.0.1:0"]).await;
    let b = Server::spawn(&["--store", ":memory:", "memo", "--http", "127.0.0.1:0"]).await;
    let dir = TempDir::new("gateway");
    let cfg = dir.path().join("gateway.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[slug]]\nname = \"a\"\nhttp = \"{}\"\n\
             [[slug]]\nname = \"b\"\nhttp = \"{}\"\n\
             [[slug]]\nname = \"c\"\nstdio = \"{} --store :memory: memo\"\n\
             [[token]]\nname = \"all\"\nsha256 = \"{}\"\nslugs = [\"*\"]\n\
             [[token]]\nname = \"only-a\"\nsha256 = \"{}\"\nslugs = [\"a\"]\n",
            a.http_url(),
            b.http_url(),
            bin(),
            sha(ALL),
            sha(ONLY_A)
        ),
    )
    .unwrap();
    let gw = Server::spawn(&[
        "-v",
        "--store",
        ":memory:",
        "gateway",
        "--config",
        cfg.to_str().unwrap(),
        "--http",
        "127.0.0.1:0",
        "--quic",
        "127.0.0.1:0",
    ])
    .await;
    Setup {
        a,
        _b: b,
        gw,
        _dir: dir,
    }
}

async fn client(s: &Setup, token: Option<&str>, servers: Option<&str>) -> Connection {
    let mut url = s.gw.http_url();
    if let Some(q) = servers {
        url = format!("{url}?servers={q}");
    }
    let trust = ClientTrust {
        token: token.map(|t| Secret(t.to_owned())),
        ..ClientTrust::default()
    };
    connect(&Target::Http(url), &trust, client_config(), 4 << 20)
        .await
        .unwrap()
}

/// `herald gateway --config CFG --http` on a free port, and a client of it with `token`.
async fn http_gateway(cfg: &std::path::Path, token: &str) -> (Server, Connection) {
    let gw = http_gateway_server(cfg).await;
    let c = token_client(&gw, token).await;
    (gw, c)
}

/// A client of `gw`'s HTTP endpoint presenting `token`.
async fn token_client(gw: &Server, token: &str) -> Connection {
    let trust = ClientTrust {
        token: Some(Secret(token.to_owned())),
        ..ClientTrust::default()
    };
    connect(
        &Target::Http(gw.http_url()),
        &trust,
        client_config(),
        4 << 20,
    )
    .await
    .unwrap()
}

/// The tools `c` sees, sorted (the gateway connected its upstreams before it listened).
/// memo's tools through the gateway, sorted.
const MEMO_TOOLS: [&str; 4] = ["memo_ask", "memo_delete", "memo_set", "memo_wait"];

async fn tools(c: &Connection, n: usize) -> Vec<String> {
    let mut names: Vec<String> = c
        .list_all_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    names.sort();
    assert_eq!(names.len(), n, "{names:?}");
    names
}

/// The resource URIs `c` sees, sorted.
async fn resource_uris(c: &Connection) -> Vec<String> {
    let mut uris: Vec<String> = c
        .list_all_resources()
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.uri.clone())
        .collect();
    uris.sort();
    uris
}

async fn call_err(c: &Connection, tool: &str, a: Value) -> rmcp::ErrorData {
    match c
        .call_tool(CallToolRequestParams::new(tool.to_owned()).with_arguments(args(a)))
        .await
    {
        Err(rmcp::ServiceError::McpError(e)) => e,
        other => panic!("expected an error from {tool}, got {other:?}"),
    }
}

#[tokio::test]
async fn tools_are_prefixed_forwarded_and_entitled() {
    let s = setup().await;
    let all = client(&s, Some(ALL), None).await;
    assert_eq!(
        tools(&all, 12).await,
        ["a", "b", "c"]
            .iter()
            .flat_map(|s| MEMO_TOOLS.map(|t| format!("{s}__{t}")))
            .collect::<Vec<_>>()
    );
    let t = all.list_all_tools().await.unwrap();
    // Its task support kept: the gateway relays tasks.
    let wait = t.iter().find(|t| t.name == "a__memo_wait").unwrap();
    assert!(herald::mcp::tasks::supports_tasks(wait), "{wait:?}");
    let del = t.iter().find(|t| t.name == "a__memo_delete").unwrap();
    assert_eq!(
        del.annotations.as_ref().unwrap().destructive_hint,
        Some(true),
        "annotations kept"
    );
    // Forwarded with the prefix stripped: the note lands on server a.
    call(&all, "a__memo_set", json!({"key": "k", "value": 1})).await;
    let direct = crate::watch::memo_client(&s.a.http_url()).await;
    let (notes, _) = read_json(&direct, "memo://notes").await;
    assert_eq!(notes, json!({"k": 1}));
    // The upstream's own error, unchanged.
    let e = call_err(&all, "a__memo_set", json!({"key": "k"})).await;
    assert_eq!(e.code.0, -32602);
    assert!(e.message.contains("missing argument value"), "{e:?}");

    // ?servers= narrows; a token sees only its slugs.
    let only_b = client(&s, Some(ALL), Some("b")).await;
    assert_eq!(
        tools(&only_b, 4).await,
        MEMO_TOOLS.map(|t| format!("b__{t}"))
    );
    let a_only = client(&s, Some(ONLY_A), None).await;
    assert_eq!(
        tools(&a_only, 4).await,
        MEMO_TOOLS.map(|t| format!("a__{t}"))
    );
    // ?servers= naming only what the token may not use (or what does not exist) is refused
    // (403, the same either way), never an empty listing; herald's clients exit 1 saying so.
    for q in ["b", "zz"] {
        let out = tokio::process::Command::new(bin())
            .args([
                "ls",
                "--mcp-http",
                &format!("{}?servers={q}", s.gw.http_url()),
            ])
            .env("HERALD_TOKEN", ONLY_A)
            .output()
            .await
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(
            err.contains("HTTP 403") && err.contains("?servers= names no server"),
            "{err}"
        );
        assert!(out.stdout.is_empty(), "{:?}", out.stdout);
    }
    // Outside the set: Forbidden, the same whether the slug exists or not.
    let exists = call_err(&a_only, "b__memo_set", json!({"key": "x", "value": 1})).await;
    let missing = call_err(&a_only, "zz__memo_set", json!({"key": "x", "value": 1})).await;
    assert_eq!(exists.code.0, -32024);
    assert_eq!(
        (exists.code, &exists.message),
        (missing.code, &missing.message)
    );
    // A wrong token, or none, is refused before anything is read: 401 with a Bearer
    // challenge and a JSON-RPC error saying what to do, never a token with no entitlements.
    let http = reqwest::Client::new();
    for (token, invalid, kind) in [
        (Some("not-a-token"), true, "application/json"),
        (None, false, "application/json"),
        // Any spelling rmcp would take is refused alike.
        (Some("not-a-token"), true, "Application/JSON; charset=utf-8"),
    ] {
        let mut post = http
            .post(s.gw.http_url())
            .header("content-type", kind)
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", "tools/list")
            .body(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}"#);
        if let Some(t) = token {
            post = post.header("authorization", format!("Bearer {t}"));
        }
        let r = post.send().await.unwrap();
        assert_eq!(r.status(), 401, "{token:?}");
        let challenge = r.headers()["www-authenticate"].to_str().unwrap().to_owned();
        assert!(challenge.starts_with("Bearer"), "{challenge}");
        assert_eq!(challenge.contains("invalid_token"), invalid, "{challenge}");
        let v: Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
        assert_eq!(v["error"]["code"], -32024, "{v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains("token"),
            "{v}"
        );
    }
    let trust = ClientTrust {
        token: Some(Secret("not-a-token".into())),
        ..ClientTrust::default()
    };
    let refused = connect(
        &Target::Http(s.gw.http_url()),
        &trust,
        client_config(),
        4 << 20,
    )
    .await;
    let e = refused
        .err()
        .expect("a client with a wrong token is refused");
    assert!(e.to_string().contains("HERALD_TOKEN"), "{e}");
    // No token value in the gateway's log.
    for t in [ALL, ONLY_A, "not-a-token"] {
        assert!(!s.gw.stderr().contains(t), "a token reached the log");
    }
}

#[tokio::test]
async fn resources_are_merged_and_same_uris_prefixed() {
    let s = setup().await;
    let all = client(&s, Some(ALL), None).await;
    tools(&all, 12).await;
    let uris = resource_uris(&all).await;
    assert_eq!(
        uris,
        [
            "a+memo://log",
            "a+memo://notes",
            "b+memo://log",
            "b+memo://notes",
            "c+memo://log",
            "c+memo://notes"
        ]
    );
    call(&all, "b__memo_set", json!({"key": "on-b", "value": true})).await;
    let (notes, mime) = read_json(&all, "b+memo://notes").await;
    assert_eq!(notes, json!({"on-b": true}));
    assert_eq!(mime, "application/json");
    // The bare URI three slugs serve is refused, naming the forms that say which.
    let err = all
        .read_resource(rmcp::model::ReadResourceRequestParams::new(
            "memo://notes".to_owned(),
        ))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("memo://notes is served by a, b and c: name which, as a+memo://notes or b+memo://notes or c+memo://notes"),
        "{err}"
    );
    // A token limited to a sees a's resources under their own URIs (no collision for it).
    let a_only = client(&s, Some(ONLY_A), None).await;
    tools(&a_only, 4).await;
    let uris = resource_uris(&a_only).await;
    assert_eq!(uris, ["memo://log", "memo://notes"]);
    let err = a_only
        .read_resource(rmcp::model::ReadResourceRequestParams::new(
            "b+memo://notes".to_owned(),
        ))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("forbidden"), "{err}");
}

#[tokio::test]
async fn listens_are_shared_upstream_and_survive_an_upstream_restart() {
    let s = setup().await;
    let one = client(&s, Some(ALL), None).await;
    let two = client(&s, Some(ALL), None).await;
    tools(&one, 12).await;
    let filter = |u: &str| {
        SubscriptionFilter::builder()
            .resource_subscription(u)
            .build()
    };
    let mut s1 = one.listen(filter("a+memo://notes")).await.unwrap();
    let mut s2 = two.listen(filter("a+memo://notes")).await.unwrap();
    assert_eq!(
        s1.acknowledged().resource_subscriptions,
        Some(vec!["a+memo://notes".to_owned()])
    );
    call(&one, "a__memo_set", json!({"key": "x", "value": 1})).await;
    for sub in [&mut s1, &mut s2] {
        let n = tokio::time::timeout(WAIT, sub.next())
            .await
            .unwrap()
            .unwrap();
        assert!(
            matches!(&n, Some(ServerNotification::ResourceUpdatedNotification(u)) if u.params.uri == "a+memo://notes"),
            "{n:?}"
        );
    }
    assert_eq!(
        s.a.stderr().matches("listen stream opened").count(),
        1,
        "two clients, one upstream subscription"
    );
    // The ack names what the upstream accepted: memo serves no memo://nope.
    let mixed = one
        .listen(
            SubscriptionFilter::builder()
                .resource_subscription("a+memo://notes")
                .resource_subscription("a+memo://nope")
                .build(),
        )
        .await
        .unwrap();
    assert_eq!(
        mixed.acknowledged().resource_subscriptions,
        Some(vec!["a+memo://notes".to_owned()])
    );
    drop(mixed);
    // A token may not watch what it may not see: the ack leaves it out.
    let a_only = client(&s, Some(ONLY_A), None).await;
    tools(&a_only, 4).await;
    let denied = a_only.listen(filter("b+memo://notes")).await.unwrap();
    assert!(
        denied
            .acknowledged()
            .resource_subscriptions
            .clone()
            .unwrap_or_default()
            .is_empty(),
        "{:?}",
        denied.acknowledged()
    );

    // The stdio upstream dies; the gateway restarts it and resubscribes while the client
    // stays connected. Each step waits on notifications and re-reads, as a client does.
    let mut s3 = one.listen(filter("c+memo://notes")).await.unwrap();
    call(&one, "c__memo_set", json!({"key": "y", "value": 1})).await;
    until(&mut s3, &one, "c+memo://notes", |n| n["y"] == json!(1)).await;
    let gw_pid = s.gw.pid().to_string();
    let killed = std::process::Command::new("pkill")
        .args(["-KILL", "-P", &gw_pid, "-f", "memo"])
        .status()
        .unwrap();
    assert!(killed.success());
    // The restarted upstream (an in-memory store: empty) is announced on the same stream...
    until(&mut s3, &one, "c+memo://notes", |n| n == &json!({})).await;
    // ...and its changes arrive there too.
    call(&one, "c__memo_set", json!({"key": "z", "value": 2})).await;
    until(&mut s3, &one, "c+memo://notes", |n| n["z"] == json!(2)).await;
}

/// Awaits notifications on `sub`, re-reading `uri` after each, until `done` holds.
async fn until(
    sub: &mut rmcp::service::Subscription,
    c: &Connection,
    uri: &str,
    done: impl Fn(&Value) -> bool,
) {
    loop {
        let n = tokio::time::timeout(WAIT, sub.next())
            .await
            .expect("a notification in time")
            .unwrap();
        assert!(n.is_some(), "the stream ended");
        if let Ok(r) = c
            .read_resource(rmcp::model::ReadResourceRequestParams::new(uri.to_owned()))
            .await
            && let rmcp::model::ResourceContents::TextResourceContents { text, .. } = &r.contents[0]
            && done(&serde_json::from_str(text).unwrap())
        {
            return;
        }
    }
}

async fn poll(
    c: &Connection,
    params: Value,
) -> Result<rmcp::model::ServerResult, rmcp::ServiceError> {
    c.send_request(ClientRequest::CustomRequest(CustomRequest::new(
        "events/poll",
        Some(params),
    )))
    .await
}

#[tokio::test]
async fn events_and_quic_tokens() {
    let s = setup().await;
    let all = client(&s, Some(ALL), None).await;
    tools(&all, 12).await;
    let code = |r: Result<_, rmcp::ServiceError>| match r {
        Err(rmcp::ServiceError::McpError(e)) => e.code.0,
        other => panic!("expected an error, got {other:?}"),
    };
    assert_eq!(
        code(
            poll(
                &all,
                json!({"name": "no-prefix", "arguments": {}, "cursor": null})
            )
            .await
        ),
        -32602
    );
    // Every memo upstream serves memo.changed: the gateway advertises Events and lists them
    // with prefixes.
    let caps = all.peer_info().unwrap().capabilities.clone();
    assert!(
        caps.extensions
            .as_ref()
            .is_some_and(|e| e.contains_key("io.modelcontextprotocol/events")),
        "{caps:?}"
    );
    let result = |r: Result<rmcp::model::ServerResult, rmcp::ServiceError>| match r.unwrap() {
        rmcp::model::ServerResult::CustomResult(r) => r.0,
        other => panic!("{other:?}"),
    };
    let listed = result(
        all.send_request(ClientRequest::CustomRequest(CustomRequest::new(
            "events/list",
            Some(json!({})),
        )))
        .await,
    );
    let mut names: Vec<&str> = listed["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["a__memo.changed", "b__memo.changed", "c__memo.changed"]
    );
    let start = result(
        poll(
            &all,
            json!({"name": "a__memo.changed", "arguments": {}, "cursor": null}),
        )
        .await,
    );
    assert_eq!(start["events"], json!([]));
    call(&all, "a__memo_set", json!({"key": "e", "value": 1})).await;
    let got = result(
        poll(
            &all,
            json!({"name": "a__memo.changed", "arguments": {}, "cursor": start["cursor"], "timeoutMs": 10000}),
        )
        .await,
    );
    let evs = got["events"].as_array().unwrap();
    assert_eq!(evs.len(), 1, "{got}");
    assert_eq!(evs[0]["name"], "a__memo.changed");
    // The upstream's own refusals reach the caller with their codes.
    assert_eq!(
        code(
            poll(
                &all,
                json!({"name": "a__memo.changed", "arguments": {"bogus": 1}, "cursor": null})
            )
            .await
        ),
        -32602
    );
    assert_eq!(
        code(
            poll(
                &all,
                json!({"name": "a__nope", "arguments": {}, "cursor": null})
            )
            .await
        ),
        -32023
    );
    let a_only = client(&s, Some(ONLY_A), None).await;
    assert_eq!(
        code(
            poll(
                &a_only,
                json!({"name": "b__x", "arguments": {}, "cursor": null})
            )
            .await
        ),
        -32024
    );
    assert_eq!(
        code(
            poll(
                &a_only,
                json!({"name": "zz__x", "arguments": {}, "cursor": null})
            )
            .await
        ),
        -32024
    );

    // Mcp-Method and Mcp-Name headers are accepted on events/poll.
    let body = json!({"jsonrpc": "2.0", "id": 9, "method": "events/poll",
        "params": {"_meta": meta(), "name": "a__memo.changed", "arguments": {}, "cursor": null}});
    let resp = reqwest::Client::new()
        .post(s.gw.http_url())
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "events/poll")
        .header("mcp-name", "a__memo.changed")
        .header("authorization", format!("Bearer {ALL}"))
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    assert!(text.contains("\"cursor\""), "{text}");
    // The events/list fault counter is exported.
    let metrics = reqwest::get(s.gw.http_url().replace("/mcp", "/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("\nherald_events_list_failed_total 0\n"),
        "{metrics}"
    );

    // Over QUIC, the token rides in each request's _meta.
    let trust = ClientTrust {
        pin: Some(s.gw.fingerprint()),
        token: Some(Secret(ONLY_A.to_owned())),
        ..ClientTrust::default()
    };
    let q = connect(
        &Target::Quic(s.gw.quic_addr()),
        &trust,
        client_config(),
        4 << 20,
    )
    .await
    .unwrap();
    assert_eq!(tools(&q, 4).await, MEMO_TOOLS.map(|t| format!("a__{t}")));
    // The ack over QUIC names only what the upstream accepted, and what this token may see.
    let sub = q
        .listen(
            SubscriptionFilter::builder()
                .resource_subscription("a+memo://notes")
                .resource_subscription("a+memo://nope")
                .resource_subscription("b+memo://notes")
                .build(),
        )
        .await
        .unwrap();
    assert_eq!(
        sub.acknowledged().resource_subscriptions,
        Some(vec!["a+memo://notes".to_owned()])
    );
    drop(sub);
    // No token, or one the gateway does not know, is refused at the handshake (as HTTP
    // answers 401), never served as a caller entitled to nothing; herald's clients say what
    // to do and exit 1.
    for token in [None, Some("wrong")] {
        let anon = ClientTrust {
            pin: Some(s.gw.fingerprint()),
            token: token.map(|t| Secret(t.to_owned())),
            ..ClientTrust::default()
        };
        let refused = connect(
            &Target::Quic(s.gw.quic_addr()),
            &anon,
            client_config(),
            4 << 20,
        )
        .await
        .err()
        .expect("refused");
        assert!(refused.to_string().contains("HERALD_TOKEN"), "{refused}");
        let mut cmd = vec!["ls", "--mcp-quic"];
        let addr = s.gw.quic_addr();
        let pin = s.gw.fingerprint();
        cmd.extend([addr.as_str(), "--tls-pin", pin.as_str()]);
        let out = tokio::process::Command::new(bin())
            .args(&cmd)
            .env_remove("HERALD_TOKEN")
            .envs(token.map(|t| ("HERALD_TOKEN", t)))
            .output()
            .await
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(err.contains("HERALD_TOKEN"), "{err}");
        let want = if token.is_some() {
            "refused the token"
        } else {
            "needs a token"
        };
        assert!(err.contains(want), "{err}");
        assert!(out.stdout.is_empty(), "nothing listed: {:?}", out.stdout);
    }
}

#[tokio::test]
async fn check_validates_configs() {
    let dir = TempDir::new("gateway-check");
    let good = dir.path().join("good.toml");
    std::fs::write(
        &good,
        format!(
            "[[slug]]\nname = \"memo\"\nstdio = \"herald memo\"\n[[token]]\nsha256 = \"{}\"\nslugs = [\"memo\"]\n",
            sha(ALL)
        ),
    )
    .unwrap();
    let out = herald(["check", good.to_str().unwrap()]).await;
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("ok (herald gateway: 1 server, 1 token)"),
        "{out:?}"
    );
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "[[slug]]\nname = \"Memo__x\"\nstdio = \"herald memo\"\n",
    )
    .unwrap();
    let out = herald(["check", bad.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(64));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not valid"),
        "{out:?}"
    );
}

#[tokio::test]
async fn check_refuses_bad_slug_names_and_a_remote_gateway_without_tokens() {
    let dir = TempDir::new("gateway-check-names");
    let cfg = dir.path().join("gateway.toml");
    let long = "a".repeat(65);
    for name in [
        "-", "-a", "", "Memo", "a_b", "a__b", "a+b", "a.b", "a b", "é", &long,
    ] {
        std::fs::write(
            &cfg,
            format!("[[slug]]\nname = {name:?}\nstdio = \"herald memo\"\n"),
        )
        .unwrap();
        let out = herald(["check", cfg.to_str().unwrap()]).await;
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{name:?}: {out:?}");
        assert!(
            err.contains(&format!("slug name {name:?} is not valid"))
                && err.contains("[a-z0-9][a-z0-9-]*"),
            "{name:?}: {err}"
        );
    }
    for name in ["a", "0", "a-", "k8s-prod-2", &"a".repeat(64)] {
        std::fs::write(
            &cfg,
            format!("[[slug]]\nname = {name:?}\nstdio = \"herald memo\"\n"),
        )
        .unwrap();
        let out = herald(["check", cfg.to_str().unwrap()]).await;
        assert!(out.status.success(), "{name:?}: {out:?}");
    }

    // Listening beyond loopback with no [[token]]: refused as herald up refuses it (callers on
    // this host need no token there), naming the address and the [[token]] to add.
    let slug = "[[slug]]\nname = \"memo\"\nstdio = \"herald memo\"\n";
    for (listen, addr) in [
        ("http = \"0.0.0.0:8760\"\n", "0.0.0.0:8760"),
        ("quic = \"[::]:8761\"\n", "[::]:8761"),
        (
            "http = \"127.0.0.1:8760\"\nquic = \"mcp.example.com:8761\"\n",
            "mcp.example.com:8761",
        ),
    ] {
        std::fs::write(&cfg, format!("{listen}{slug}")).unwrap();
        let out = herald(["check", cfg.to_str().unwrap()]).await;
        assert_eq!(out.status.code(), Some(64), "{listen}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(addr) && err.contains("no [[token]]") && err.contains("sha256sum"),
            "{listen}: {err}"
        );
        assert!(
            !err.contains("127.0.0.1:8760"),
            "loopback is not named: {err}"
        );
    }
    // On loopback, or with a token, the config is fine.
    for text in [
        format!("http = \"127.0.0.1:8760\"\nquic = \"[::1]:8761\"\n{slug}"),
        format!("http = \"localhost:8760\"\n{slug}"),
        slug.to_owned(),
        format!(
            "http = \"0.0.0.0:8760\"\n{slug}[[token]]\nsha256 = \"{}\"\nslugs = [\"*\"]\n",
            sha(ALL)
        ),
    ] {
        std::fs::write(&cfg, &text).unwrap();
        let out = herald(["check", cfg.to_str().unwrap()]).await;
        assert!(out.status.success(), "{text}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("WARNING"), "{text}: {err}");
    }
}

/// `herald gateway` with no `[[token]]` used to refuse every HTTP caller ("set HERALD_TOKEN to
/// one the server knows", though it knew none) while `herald up` let loopback in: now both do.
#[tokio::test]
async fn a_gateway_without_tokens_serves_callers_on_this_host_without_one() {
    let memo = Server::spawn(&["--store", ":memory:", "memo", "--http", "127.0.0.1:0"]).await;
    let dir = TempDir::new("gateway-tokenless");
    let cfg = dir.path().join("gateway.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[slug]]\nname = \"memo\"\nhttp = \"{}\"\n",
            memo.http_url()
        ),
    )
    .unwrap();
    let gw = http_gateway_server(&cfg).await;
    let c = connect(
        &Target::Http(gw.http_url()),
        &ClientTrust::default(),
        client_config(),
        4 << 20,
    )
    .await
    .expect("a loopback caller needs no token");
    let names = tools(&c, 4).await;
    assert_eq!(names[0], "memo__memo_ask", "{names:?}");
}

/// `herald ls` through `?servers=` naming a slug that is not up lists nothing, and says on
/// stderr what that may mean and where to look.
#[tokio::test]
async fn an_empty_listing_through_servers_says_the_server_may_not_be_up() {
    let dir = TempDir::new("gateway-down-slug");
    let cfg = dir.path().join("gateway.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[slug]]\nname = \"down\"\nhttp = \"http://127.0.0.1:{}/mcp\"\n",
            closed_port()
        ),
    )
    .unwrap();
    let gw = http_gateway_server(&cfg).await;
    let out = tokio::process::Command::new(bin())
        .args([
            "ls",
            "--mcp-http",
            &format!("{}?servers=down", gw.http_url()),
        ])
        .env_remove("HERALD_TOKEN")
        .output()
        .await
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("nothing is listed for ?servers=down") && err.contains("herald status"),
        "{err}"
    );
}

/// A client that keeps the progress notifications and log messages it receives.
#[derive(Clone)]
struct Catcher(
    tokio::sync::mpsc::UnboundedSender<rmcp::model::ProgressNotificationParam>,
    tokio::sync::mpsc::UnboundedSender<Value>,
);

impl rmcp::ClientHandler for Catcher {
    fn get_info(&self) -> rmcp::model::ClientConfig {
        client_config()
    }

    async fn on_progress(
        &self,
        params: rmcp::model::ProgressNotificationParam,
        _context: rmcp::service::NotificationContext<rmcp::RoleClient>,
    ) {
        let _ = self.0.send(params);
    }

    #[allow(deprecated)]
    async fn on_logging_message(
        &self,
        params: rmcp::model::LoggingMessageNotificationParam,
        _context: rmcp::service::NotificationContext<rmcp::RoleClient>,
    ) {
        let _ = self.1.send(serde_json::to_value(params).unwrap());
    }
}

/// What the test client's connection received, in wire order: progress (by its number) and
/// answers.
#[derive(Default)]
struct Wire(std::sync::Mutex<Vec<String>>);

impl herald::transport::client::Tap for Wire {
    fn seen(&self, message: &rmcp::service::RxJsonRpcMessage<rmcp::RoleClient>) {
        let seen = match message {
            rmcp::model::JsonRpcMessage::Notification(n) => match &n.notification {
                rmcp::model::ServerNotification::ProgressNotification(p) => {
                    format!("progress {}", p.params.progress)
                }
                _ => return,
            },
            rmcp::model::JsonRpcMessage::Response(_) => "answer".to_owned(),
            _ => return,
        };
        self.0.lock().unwrap().push(seen);
    }
}

#[tokio::test]
async fn progress_of_upstream_calls_is_relayed() {
    let dir = TempDir::new("gateway-progress");
    let cfg = dir.path().join("gateway.toml");
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/legacy_server.py"
    );
    std::fs::write(
        &cfg,
        format!(
            "[[slug]]\nname = \"old\"\nstdio = \"python3 {fixture}\"\n\
             [[slug]]\nname = \"fx\"\nstdio = \"{} --stdio\"\n\
             [[token]]\nsha256 = \"{}\"\nslugs = [\"*\"]\n",
            conformance_fixture().display(),
            sha(ALL)
        ),
    )
    .unwrap();
    let gw = Server::spawn(&[
        "--store",
        ":memory:",
        "gateway",
        "--config",
        cfg.to_str().unwrap(),
        "--quic",
        "127.0.0.1:0",
    ])
    .await;
    // Over QUIC, a byte stream (as stdio is): the client's own tap sees the wire's order.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let (log_tx, mut logs) = tokio::sync::mpsc::unbounded_channel();
    let trust = ClientTrust {
        pin: Some(gw.fingerprint()),
        token: Some(Secret(ALL.to_owned())),
        ..ClientTrust::default()
    };
    let wire = std::sync::Arc::new(Wire::default());
    let c = herald::transport::client::connect_tapped(
        &Target::Quic(gw.quic_addr()),
        &trust,
        Catcher(tx, log_tx),
        4 << 20,
        herald::transport::client::DEFAULT_CONNECT_TIMEOUT,
        Some(wire.clone()),
    )
    .await
    .unwrap();
    wire.0.lock().unwrap().clear();
    let token = rmcp::model::ProgressToken(rmcp::model::NumberOrString::String("mine-1".into()));
    let mut params =
        CallToolRequestParams::new("old__echo").with_arguments(args(json!({"say": "hi"})));
    params.meta = Some(rmcp::model::RequestMetaObject::with_progress_token(
        token.clone(),
    ));
    let r = c.call_tool(params).await.unwrap();
    assert!(format!("{r:?}").contains("hi"), "{r:?}");
    // The gateway relays the upstream's progress in order, and before its answer.
    assert_eq!(
        *wire.0.lock().unwrap(),
        ["progress 1", "progress 2", "answer"],
        "on the wire"
    );
    // This client's rmcp handles notifications in tasks of its own, so its handler may see
    // the two in either order.
    let mut got = Vec::new();
    for _ in 0..2 {
        let p = tokio::time::timeout(WAIT, rx.recv())
            .await
            .expect("progress in time")
            .unwrap();
        // Under the token this client's call carried (rmcp assigns its own), not the
        // gateway's upstream one.
        assert!(
            !format!("{:?}", p.progress_token).contains("herald"),
            "{p:?}"
        );
        got.push((p.progress as u32, p.message.clone().unwrap_or_default()));
    }
    got.sort();
    assert_eq!(got, [(1, "step 1".to_owned()), (2, "step 2".to_owned())]);
    // A call that asks for log messages gets the upstream's, over the shared stdio
    // connection, when the upstream speaks 2026-07-28 (which logs only for a request that
    // asked). An older server logs for its whole session, whoever's call it serves, so its
    // log messages go to no caller: the legacy fixture's line for the first call here is
    // never relayed, and the first log message this client gets is the second call's.
    #[allow(deprecated)]
    let logged = |name: &str, a: Value| {
        let mut params = CallToolRequestParams::new(name.to_owned()).with_arguments(args(a));
        let mut meta = rmcp::model::RequestMetaObject::default();
        meta.set_log_level(rmcp::model::LoggingLevel::Info);
        params.meta = Some(meta);
        params
    };
    c.call_tool(logged("old__echo", json!({"say": "logged"})))
        .await
        .unwrap();
    c.call_tool(logged("fx__test_logging_tool", json!({})))
        .await
        .unwrap();
    let log = tokio::time::timeout(WAIT, logs.recv())
        .await
        .expect("a log message in time")
        .unwrap();
    assert_eq!(log["logger"], "test_logging_tool", "{log}");
    assert_eq!(log["data"], "Diagnostic trace logging activated", "{log}");
    // The fixture advertises Events but cannot list them: an empty union, and a fault
    // counted in /metrics (served on the gateway's HTTP endpoint).
    let (gw_http, h) = http_gateway(&cfg, ALL).await;
    let listed = h
        .send_request(ClientRequest::CustomRequest(CustomRequest::new(
            "events/list",
            Some(json!({})),
        )))
        .await
        .unwrap();
    assert!(
        format!("{listed:?}").contains("\"events\": Array []"),
        "{listed:?}"
    );
    let metrics = reqwest::get(gw_http.http_url().replace("/mcp", "/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("\nherald_events_list_failed_total 1\n"),
        "{metrics}"
    );
}

/// `herald_http_connections_accepted_total` from the `/metrics` of the server at `mcp_url`.
async fn accepted_connections(mcp_url: &str) -> u64 {
    metric(
        &mcp_url.replace("/mcp", "/metrics"),
        "herald_http_connections_accepted_total",
    )
    .await
    .expect("the connection counter")
}

#[tokio::test]
async fn an_http_upstream_is_called_on_pooled_connections_that_survive_its_restart() {
    let up = Server::spawn(&["--store", ":memory:", "memo", "--http", "127.0.0.1:0"]).await;
    let url = up.http_url();
    let dir = TempDir::new("gateway-pool");
    let cfg = dir.path().join("gateway.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[slug]]\nname = \"a\"\nhttp = \"{url}\"\n\
             [[token]]\nname = \"all\"\nsha256 = \"{}\"\nslugs = [\"*\"]\n",
            sha(ALL)
        ),
    )
    .unwrap();
    let (_gw, c) = http_gateway(&cfg, ALL).await;
    let before = accepted_connections(&url).await;
    // 100 calls one after another, then 8 callers at once with 25 calls each.
    for i in 0..100 {
        call(&c, "a__memo_set", json!({"key": "k", "value": i})).await;
    }
    let c = std::sync::Arc::new(c);
    let mut callers = tokio::task::JoinSet::new();
    for n in 0..8 {
        let c = c.clone();
        callers.spawn(async move {
            for i in 0..25 {
                call(
                    &c,
                    "a__memo_set",
                    json!({"key": format!("k{n}"), "value": i}),
                )
                .await;
            }
        });
    }
    while let Some(r) = callers.join_next().await {
        r.unwrap();
    }
    // The metrics request itself is one connection.
    let opened = accepted_connections(&url).await - before - 1;
    assert!(
        opened <= 8,
        "300 calls from at most 8 callers at once opened {opened} upstream connections"
    );

    // The upstream restarts on the same port: the pooled connections are dead, and the next
    // call goes out on a new one.
    let addr = url
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .to_owned();
    // Gone for sure before the new one binds the port (a kill that has not landed yet would
    // leave the port taken).
    up.terminate().await;
    let up = Server::spawn(&["--store", ":memory:", "memo", "--http", &addr]).await;
    assert_eq!(up.http_url(), url);
    let mut failed = 0;
    for i in 0..5 {
        let r = c
            .call_tool(
                CallToolRequestParams::new("a__memo_set")
                    .with_arguments(args(json!({"key": "after", "value": i}))),
            )
            .await;
        match r {
            Ok(r) if r.is_error != Some(true) => {}
            other => {
                failed += 1;
                assert!(
                    failed < 2,
                    "a second call failed after the upstream restarted: {other:?}"
                );
            }
        }
    }
}

/// A read of an event log with `io.herald/after` gets what is newer (and its anchor), from a
/// server directly and through the gateway; the watch client's reads stay correct with it.
#[tokio::test]
async fn an_event_log_read_after_a_seq_has_only_what_is_newer() {
    use rmcp::model::{ReadResourceRequestParams, RequestMetaObject};
    let s = setup().await;
    let direct = crate::watch::memo_client(&s.a.http_url()).await;
    for i in 0..5 {
        call(
            &direct,
            "memo_set",
            json!({"key": format!("k{i}"), "value": i}),
        )
        .await;
    }
    let (log, _) = read_json(&direct, "memo://log").await;
    let all: Vec<u64> = log["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(all.len(), 5);
    let after = |uri: &str| {
        let mut p = ReadResourceRequestParams::new(uri.to_owned());
        let mut meta = RequestMetaObject::new();
        meta.0.0.insert("io.herald/after".into(), all[2].into());
        p.meta = Some(meta);
        p
    };
    let seqs = |r: rmcp::model::ReadResourceResult| -> Vec<u64> {
        let c = herald::upstream::contents(r).unwrap();
        let herald::mcp::source::Body::Text(t) = c.body else {
            panic!("text")
        };
        let v: Value = serde_json::from_str(&t).unwrap();
        v["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["seq"].as_u64().unwrap())
            .collect()
    };
    let r = direct.read_resource(after("memo://log")).await.unwrap();
    assert_eq!(seqs(r), all[2..]);
    let gw = client(&s, Some(ALL), None).await;
    let r = gw.read_resource(after("a+memo://log")).await.unwrap();
    assert_eq!(seqs(r), all[2..], "the hint reaches the upstream");
}

/// The conformance fixture (`examples/conformance_fixture`), built beside the `herald` binary
/// by `cargo test`: a 2026-07-28 server on herald's own plumbing.
fn conformance_fixture() -> std::path::PathBuf {
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_herald"));
    let fixture = bin.with_file_name("examples").join("conformance_fixture");
    assert!(
        fixture.exists(),
        "{} is missing: `cargo test` builds the examples (or run `cargo build --example conformance_fixture`)",
        fixture.display()
    );
    fixture
}

/// An `https://` slug: the gateway's calls go over TLS (HAProxy, Debian's, terminating it in
/// front of a memo) on its own connections, trusting the system's CA store, here
/// `SSL_CERT_FILE` naming the memo's certificate.
#[tokio::test]
async fn an_https_slug_is_called_over_tls_trusting_the_systems_store() {
    use std::os::fd::AsRawFd;
    let memo = Memo::start(Via::Http).await;
    let Target::Http(memo_url) = &memo.target else {
        unreachable!()
    };
    let dir = TempDir::new("gateway-https");
    let made = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, made.cert.pem()).unwrap();
    let site = dir.path().join("site.pem");
    std::fs::write(
        &site,
        format!("{}{}", made.cert.pem(), made.signing_key.serialize_pem()),
    )
    .unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let memo_addr = memo_url
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .to_owned();
    let tls = format!(
        "frontend tls\n    bind fd@3 ssl crt {} alpn http/1.1\n    default_backend memo\n\
         backend memo\n    server m {memo_addr}\n",
        site.display()
    );
    let _haproxy = crate::fd3::start_haproxy(dir.path(), 64, &tls, listener.as_raw_fd())
        .unwrap_or_else(|e| panic!("{e}"));
    drop(listener);
    let cfg = dir.path().join("gateway.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[slug]]\nname = \"a\"\nhttp = \"https://localhost:{port}/mcp\"\n\
             [[token]]\nname = \"all\"\nsha256 = \"{}\"\nslugs = [\"*\"]\n",
            sha(ALL)
        ),
    )
    .unwrap();
    let mut gw = gateway_server_env(
        &cfg,
        ":memory:",
        &[],
        &[
            ("SSL_CERT_FILE", ca.to_str().unwrap()),
            ("RUST_LOG", "herald=debug,rmcp=off,warn"),
        ],
    )
    .await;
    let c = token_client(&gw, ALL).await;
    for i in 0..20 {
        call(&c, "a__memo_set", json!({"key": "k", "value": i})).await;
    }
    let (notes, _) = read_json(&memo.client().await, "memo://notes").await;
    assert_eq!(
        notes["k"],
        json!(19),
        "the calls reached the memo behind TLS: {notes}"
    );
    // On the gateway's own connections (reqwest's would say nothing of the kind).
    gw.line_where("its own TLS connection to the upstream", |v| {
        v["message"] == "upstream connection opened" && v["tls"] == true
    })
    .await;
}
