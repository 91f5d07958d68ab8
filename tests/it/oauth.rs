//! A gateway as an OAuth 2.1 protected resource (issue 34), against access tokens minted by a
//! JOSE library no one here wrote: PyJWT with `cryptography`, in an identity provider that
//! serves its RFC 8414 metadata and JWKS over HTTP (`tests/it/py/oauth_issuer.py`). RS256,
//! ES256 and EdDSA tokens let in with their scopes; expired, wrong audience, wrong issuer,
//! unknown key, `alg: none` and HMAC-with-the-public-key refused; a key rotation picked up
//! with one fetch; the protected-resource metadata and the 401 and 403 challenges; static
//! tokens beside it; QUIC's `_meta` token the same.

use std::process::Stdio;

use herald::transport::client::{Connection, client_config, connect};
use herald::transport::target::Target;
use herald::transport::tls::{ClientTrust, Secret};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use crate::support::*;

pub const AUDIENCE: &str = "https://herald.test/mcp";
pub const STATIC: &str = "static-token-5e1d";

/// The identity provider (`oauth_issuer.py`, or `oauth_server.py` for the client's tests),
/// ordered on its stdin.
pub struct Provider {
    _child: Child,
    stdin: ChildStdin,
    out: Lines<BufReader<ChildStdout>>,
    pub url: String,
}

impl Provider {
    async fn start() -> Provider {
        Provider::start_script("oauth_issuer.py").await
    }

    /// The provider `tests/it/py/SCRIPT`.
    pub async fn start_script(script: &str) -> Provider {
        let python = std::env::var("HERALD_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
        let script = format!("{}/tests/it/py/{script}", env!("CARGO_MANIFEST_DIR"));
        let mut child = Command::new(python)
            .arg(script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("python runs the provider");
        let stdin = child.stdin.take().unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = tokio::time::timeout(WAIT, out.next_line())
            .await
            .expect("the provider starts (is PyJWT installed? .ci/run installs it)")
            .unwrap()
            .expect("the provider says its address");
        let first: Value = serde_json::from_str(&first).unwrap();
        Provider {
            _child: child,
            stdin,
            out,
            url: first["issuer"].as_str().unwrap().to_owned(),
        }
    }

    pub async fn order(&mut self, order: Value) -> Value {
        self.stdin
            .write_all(format!("{order}\n").as_bytes())
            .await
            .unwrap();
        let line = tokio::time::timeout(WAIT, self.out.next_line())
            .await
            .expect("the provider answers")
            .unwrap()
            .unwrap();
        let v: Value = serde_json::from_str(&line).unwrap();
        assert!(v.get("error").is_none(), "{order} -> {v}");
        v
    }

    /// A token signed with key `kid` by `alg`, with `claims` over the defaults (this
    /// provider's `iss`, the gateway's audience, an hour to live).
    pub async fn mint(&mut self, kid: &str, alg: &str, claims: Value) -> String {
        let mut c = json!({"aud": AUDIENCE, "exp": now() + 3600, "sub": "agent-7"});
        for (k, v) in claims.as_object().unwrap() {
            c[k] = v.clone();
        }
        let v = self.order(json!({"mint": c, "kid": kid, "alg": alg})).await;
        v["token"].as_str().unwrap().to_owned()
    }

    /// An RS256 token with `scope` valid for a few seconds more (its exp is past, within
    /// the allowed clock skew).
    pub async fn expiring(&mut self, scope: &str) -> String {
        self.mint("rsa1", "RS256", json!({"scope": scope, "exp": now() - 55}))
            .await
    }

    async fn fetches(&mut self) -> u64 {
        self.order(json!({"fetches": true})).await["fetches"]
            .as_u64()
            .unwrap()
    }
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

struct Setup {
    provider: Provider,
    gw: Server,
    _memo: Server,
    _other: Server,
    _dir: TempDir,
}

async fn setup() -> Setup {
    let provider = Provider::start().await;
    let memo = Server::spawn(&["--store", ":memory:", "memo", "--http", "127.0.0.1:0"]).await;
    let other = Server::spawn(&["--store", ":memory:", "memo", "--http", "127.0.0.1:0"]).await;
    let dir = TempDir::new("oauth");
    let cfg = dir.path().join("gateway.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[slug]]\nname = \"memo\"\nhttp = \"{}\"\n\
             [[slug]]\nname = \"other\"\nhttp = \"{}\"\n\
             [[token]]\nname = \"ops\"\nsha256 = \"{}\"\nslugs = [\"*\"]\n\
             [[issuer]]\nurl = \"{}\"\naudience = \"{AUDIENCE}\"\n",
            memo.http_url(),
            other.http_url(),
            sha(STATIC),
            provider.url,
        ),
    )
    .unwrap();
    let gw = Server::spawn(&[
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
        provider,
        gw,
        _memo: memo,
        _other: other,
        _dir: dir,
    }
}

async fn http_client(s: &Setup, token: &str) -> Result<Connection, String> {
    let trust = ClientTrust {
        token: Some(Secret(token.to_owned())),
        ..ClientTrust::default()
    };
    connect(
        &Target::Http(s.gw.http_url()),
        &trust,
        client_config(),
        4 << 20,
    )
    .await
    .map_err(|e| e.to_string())
}

async fn tool_names(c: &Connection) -> Vec<String> {
    let mut names: Vec<String> = c
        .list_all_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    names.sort();
    names
}

/// A plain POST of `body` to the gateway with `token`: the status, `WWW-Authenticate`, and
/// the body.
async fn post(s: &Setup, token: Option<&str>, body: Value) -> (u16, String, Value) {
    post_at(&s.gw.http_url(), token, body).await
}

/// [`post`] to the MCP endpoint `url`.
pub async fn post_at(url: &str, token: Option<&str>, body: Value) -> (u16, String, Value) {
    let method = body["method"].as_str().unwrap_or("").to_owned();
    let mut req = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", &method);
    if let Some(name) = body["params"]["name"].as_str() {
        req = req.header("mcp-name", name);
    }
    if let Some(uri) = body["params"]["uri"].as_str() {
        req = req.header("mcp-name", uri);
    }
    if let Some(id) = body["params"]["taskId"].as_str() {
        req = req.header("mcp-name", id);
    }
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let resp = tokio::time::timeout(WAIT, req.body(body.to_string()).send())
        .await
        .unwrap()
        .unwrap();
    let status = resp.status().as_u16();
    let challenge = resp
        .headers()
        .get("www-authenticate")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let text = resp.text().await.unwrap();
    (
        status,
        challenge,
        serde_json::from_str(&text).unwrap_or(Value::Null),
    )
}

fn set_call(id: u64, slug: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
        "name": format!("{slug}__memo_set"), "arguments": {"key": "k", "value": id},
        "_meta": meta()}})
}

#[tokio::test]
async fn access_tokens_from_a_foreign_provider_entitle_by_scope() {
    let mut s = setup().await;
    let metadata_url = "https://herald.test/.well-known/oauth-protected-resource/mcp";

    // No token: 401 pointing at the metadata, which names the provider.
    let list =
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": meta()}});
    let (status, challenge, _) = post(&s, None, list.clone()).await;
    assert_eq!(status, 401);
    assert!(
        challenge.contains(&format!("resource_metadata=\"{metadata_url}\""))
            && challenge.contains("scope=\"herald:*\""),
        "{challenge}"
    );
    let base = s.gw.http_url().trim_end_matches("/mcp").to_owned();
    for path in [
        "/.well-known/oauth-protected-resource",
        "/.well-known/oauth-protected-resource/mcp",
    ] {
        let doc: Value = reqwest::get(format!("{base}{path}"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(doc["resource"], AUDIENCE, "{path}: {doc}");
        assert_eq!(
            doc["authorization_servers"],
            json!([s.provider.url]),
            "{doc}"
        );
    }

    // RS256, ES256 and EdDSA tokens of the provider's, scoped to one slug: that slug's tools.
    for (kid, alg) in [("rsa1", "RS256"), ("ec1", "ES256"), ("ed1", "EdDSA")] {
        let t = s
            .provider
            .mint(kid, alg, json!({"scope": "openid herald:memo"}))
            .await;
        let c = http_client(&s, &t)
            .await
            .unwrap_or_else(|e| panic!("{alg}: {e}"));
        assert_eq!(
            tool_names(&c).await,
            [
                "memo__memo_ask",
                "memo__memo_delete",
                "memo__memo_set",
                "memo__memo_wait"
            ],
            "{alg}"
        );
    }
    let t = s
        .provider
        .mint("rsa1", "RS256", json!({"scope": "herald:memo"}))
        .await;
    let (status, _, body) = post(&s, Some(&t), set_call(2, "memo")).await;
    assert_eq!(status, 200, "{body}");
    assert!(body["result"].is_object(), "{body}");
    // The slug it has no scope for is refused as one that does not exist.
    let (_, _, other) = post(&s, Some(&t), set_call(3, "other")).await;
    let (_, _, none) = post(&s, Some(&t), set_call(4, "nosuch")).await;
    assert_eq!(other["error"]["code"], -32024, "{other}");
    assert_eq!(other["error"]["message"], none["error"]["message"]);
    // herald:* is every slug; the static token works beside the issuer.
    let all = s
        .provider
        .mint("rsa1", "RS256", json!({"scope": "herald:*"}))
        .await;
    assert_eq!(
        tool_names(&http_client(&s, &all).await.unwrap())
            .await
            .len(),
        8
    );
    assert_eq!(
        tool_names(&http_client(&s, STATIC).await.unwrap())
            .await
            .len(),
        8
    );

    // Read-only: only the tools that say they only read, and a step-up challenge (403)
    // for one that changes things.
    let ro = s
        .provider
        .mint("rsa1", "RS256", json!({"scope": "herald:memo:read"}))
        .await;
    assert_eq!(
        tool_names(&http_client(&s, &ro).await.unwrap()).await,
        ["memo__memo_wait"]
    );
    let (status, challenge, body) = post(&s, Some(&ro), set_call(5, "memo")).await;
    assert_eq!(status, 403, "{body}");
    assert!(
        challenge.contains("error=\"insufficient_scope\"")
            && challenge.contains("scope=\"herald:memo\""),
        "{challenge}"
    );
    assert_eq!(
        body["error"]["data"]["reason"], "insufficient_scope",
        "{body}"
    );

    // Refused: 401 invalid_token, the same whatever is wrong.
    let bad = [
        ("expired", s.provider.mint("rsa1", "RS256", json!({"exp": now() - 3600})).await),
        (
            "wrong audience",
            s.provider
                .mint("rsa1", "RS256", json!({"aud": "https://elsewhere.test/mcp"}))
                .await,
        ),
        (
            "wrong issuer",
            s.provider
                .mint("rsa1", "RS256", json!({"iss": "https://evil.test"}))
                .await,
        ),
        (
            "alg none",
            s.provider.order(json!({"none": {"aud": AUDIENCE, "exp": now() + 3600}})).await["token"]
                .as_str()
                .unwrap()
                .to_owned(),
        ),
        (
            "HS256 keyed with the public key",
            s.provider
                .order(json!({"confused": {"aud": AUDIENCE, "exp": now() + 3600, "scope": "herald:*"}}))
                .await["token"]
                .as_str()
                .unwrap()
                .to_owned(),
        ),
    ];
    for (what, token) in &bad {
        let (status, challenge, body) = post(&s, Some(token), list.clone()).await;
        assert_eq!(status, 401, "{what}: {body}");
        assert!(
            challenge.contains("error=\"invalid_token\""),
            "{what}: {challenge}"
        );
    }
    // No token or claim value in the log.
    let log = s.gw.stderr();
    for (what, token) in &bad {
        assert!(!log.contains(token.as_str()), "{what} logged");
    }
    assert!(
        !log.contains("agent-7") && !log.contains(&t),
        "a claim or token logged"
    );
}

#[tokio::test]
async fn a_key_rotation_is_fetched_once_and_an_unknown_key_refused() {
    let mut s = setup().await;
    // The gateway fetched the keys at start; a first token proves it (no fetch of its own).
    let t = s
        .provider
        .mint("rsa1", "RS256", json!({"scope": "herald:memo"}))
        .await;
    http_client(&s, &t).await.unwrap();
    let before = s.provider.fetches().await;
    assert!(before >= 1, "{before}");

    // A new key: its first token makes one fetch and is let in.
    s.provider
        .order(json!({"rotate": "rsa2", "drop": ["rsa1"]}))
        .await;
    let t2 = s
        .provider
        .mint("rsa2", "RS256", json!({"scope": "herald:memo"}))
        .await;
    let c = http_client(&s, &t2).await.unwrap();
    assert_eq!(tool_names(&c).await.len(), 4);
    assert_eq!(s.provider.fetches().await, before + 1);
    // The dropped key's tokens are refused now (the fetch replaced the set), without fetching.
    let (status, _, _) = post(
        &s,
        Some(&t),
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": meta()}}),
    )
    .await;
    assert_eq!(status, 401, "a token of a key no longer listed");

    // A key the provider never had: one fetch, then refused; asking again fetches nothing.
    let list =
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {"_meta": meta()}});
    s.provider
        .order(json!({"rotate": "hidden", "drop": ["hidden"]}))
        .await;
    let ghost = s
        .provider
        .mint("hidden", "RS256", json!({"scope": "herald:*"}))
        .await;
    let fetched = s.provider.fetches().await;
    for _ in 0..3 {
        let (status, challenge, _) = post(&s, Some(&ghost), list.clone()).await;
        assert_eq!(status, 401);
        assert!(challenge.contains("invalid_token"), "{challenge}");
    }
    let after = s.provider.fetches().await;
    assert!(
        after <= fetched + 1,
        "an unknown key id fetched {} times",
        after - fetched
    );

    // QUIC: the same token in `_meta`.
    let trust = ClientTrust {
        token: Some(Secret(t2.clone())),
        pin: Some(s.gw.fingerprint()),
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
    assert_eq!(tool_names(&q).await.len(), 4);
}

#[tokio::test]
async fn a_task_belongs_to_the_principal_not_to_one_of_its_tokens() {
    let mut s = setup().await;
    let mut tmeta = meta();
    tmeta["io.modelcontextprotocol/clientCapabilities"] =
        json!({"extensions": {"io.modelcontextprotocol/tasks": {}}});
    let first = s
        .provider
        .mint("rsa1", "RS256", json!({"scope": "herald:memo"}))
        .await;
    let started = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "memo__memo_wait", "arguments": {"key": "k"}, "_meta": tmeta}});
    let (status, _, t) = post(&s, Some(&first), started).await;
    assert_eq!(status, 200, "{t}");
    let id = t["result"]["taskId"].as_str().expect("a task").to_owned();
    let get = |n: u64| {
        json!({"jsonrpc": "2.0", "id": n, "method": "tasks/get",
               "params": {"taskId": id, "_meta": tmeta}})
    };
    // A later token of the same subject (refreshed: another iat and exp) owns it still.
    let refreshed = s
        .provider
        .mint(
            "ec1",
            "ES256",
            json!({"scope": "herald:memo", "exp": now() + 7200}),
        )
        .await;
    assert_ne!(refreshed, first);
    let (_, _, got) = post(&s, Some(&refreshed), get(2)).await;
    assert_eq!(got["result"]["status"], "working", "{got}");
    // Another subject of the same provider, entitled to the slug: as if there were no task.
    let stranger = s
        .provider
        .mint(
            "rsa1",
            "RS256",
            json!({"scope": "herald:memo", "sub": "someone-else"}),
        )
        .await;
    let (_, _, theirs) = post(&s, Some(&stranger), get(3)).await;
    assert!(theirs["error"].is_object(), "{theirs}");
    assert!(theirs["result"].is_null(), "{theirs}");
}

/// A long request (`subscriptions/listen`, `events/stream`) with `token`, read until the
/// server ends it (within [`WAIT`]): what it wrote.
pub async fn until_it_ends(url: &str, token: &str, body: Value) -> String {
    let method = body["method"].as_str().unwrap().to_owned();
    let mut req = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", &method);
    if let Some(name) = body["params"]["name"].as_str() {
        req = req.header("mcp-name", name);
    }
    let mut resp = req
        .bearer_auth(token)
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut seen = String::new();
    let ended = tokio::time::timeout(WAIT, async {
        while let Ok(Some(chunk)) = resp.chunk().await {
            seen.push_str(&String::from_utf8_lossy(&chunk));
        }
    })
    .await;
    assert!(ended.is_ok(), "the stream outlived its token: {seen}");
    seen
}

#[tokio::test]
async fn a_listen_stream_ends_when_its_access_token_does() {
    let mut s = setup().await;
    // Valid for a few seconds more (its exp is past, within the allowed clock skew).
    let short = s.provider.expiring("herald:memo").await;
    let listen = json!({"jsonrpc": "2.0", "id": 1, "method": "subscriptions/listen", "params": {
        "_meta": meta(),
        "notifications": {"resourceSubscriptions": ["memo+memo://notes"]}}});
    let seen = until_it_ends(&s.gw.http_url(), &short, listen).await;
    assert!(
        seen.contains("acknowledged") || seen.contains("\"result\""),
        "{seen}"
    );
    assert!(seen.contains("-32024"), "the end says why: {seen}");

    // An events/stream too: `terminated`, saying the token expired, then the result with
    // the cursor to resume from.
    let short = s.provider.expiring("herald:memo").await;
    let stream = json!({"jsonrpc": "2.0", "id": 2, "method": "events/stream", "params": {
        "_meta": meta(), "name": "memo__memo.changed"}});
    let seen = until_it_ends(&s.gw.http_url(), &short, stream).await;
    assert!(seen.contains("notifications/events/active"), "{seen}");
    assert!(seen.contains("notifications/events/terminated"), "{seen}");
    assert!(seen.contains("\"expired\""), "{seen}");
    assert!(seen.contains("\"resultType\":\"complete\""), "{seen}");
}
