//! A role served on its own behind `--access FILE` (issue 34): its HTTP and QUIC endpoints
//! let in the file's `[[token]]`s and the access tokens its `[[issuer]]` mints (PyJWT, in
//! `tests/it/py/oauth_issuer.py`) by scope, read-only scopes narrowed to the read-only tools,
//! everyone else refused as a gateway refuses them; a file that would let no one in, or names
//! another role, is refused at start.

use herald::transport::client::{client_config, connect};
use herald::transport::target::Target;
use herald::transport::tls::{ClientTrust, Secret};
use serde_json::{Value, json};

use crate::oauth::{AUDIENCE, Provider, STATIC, post_at, until_it_ends};
use crate::support::*;

fn list(id: u64) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/list", "params": {"_meta": meta()}})
}

fn set(id: u64) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
        "name": "memo_set", "arguments": {"key": "k", "value": id}, "_meta": meta()}})
}

fn names(answer: &Value) -> Vec<String> {
    let mut n: Vec<String> = answer["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("a tool list: {answer}"))
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect();
    n.sort();
    n
}

#[tokio::test]
async fn a_role_on_its_own_lets_in_its_tokens_and_scopes_alone() {
    let mut provider = Provider::start_script("oauth_issuer.py").await;
    let dir = TempDir::new("role-access");
    let file = dir.path().join("access.toml");
    std::fs::write(
        &file,
        format!(
            "[[token]]\nname = \"ops\"\nsha256 = \"{}\"\nslugs = [\"memo\"]\n\
             [[issuer]]\nurl = \"{}\"\naudience = \"{AUDIENCE}\"\n",
            sha(STATIC),
            provider.url,
        ),
    )
    .unwrap();
    let memo = Server::spawn(&[
        "--store",
        ":memory:",
        "memo",
        "--http",
        "127.0.0.1:0",
        "--quic",
        "127.0.0.1:0",
        "--access",
        file.to_str().unwrap(),
        "--admin",
        "127.0.0.1:0",
    ])
    .await;
    let url = memo.http_url();

    // No token: 401, pointing at the metadata, which names the provider.
    let (status, challenge, _) = post_at(&url, None, list(1)).await;
    assert_eq!(status, 401);
    assert!(challenge.contains("resource_metadata="), "{challenge}");
    let base = url.trim_end_matches("/mcp");
    let metadata: Value = reqwest::get(format!("{base}/.well-known/oauth-protected-resource/mcp"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(metadata["resource"], AUDIENCE, "{metadata}");
    assert_eq!(metadata["authorization_servers"], json!([provider.url]));

    // A token the file does not hold, and one that is no JWT of the issuer: refused alike.
    for bad in ["not-a-known-token", "eyJhbGciOiJub25lIn0.e30."] {
        let (status, challenge, _) = post_at(&url, Some(bad), list(2)).await;
        assert_eq!(status, 401, "{bad}");
        assert!(challenge.contains("invalid_token"), "{challenge}");
    }

    // The static token: everything.
    let (status, _, all) = post_at(&url, Some(STATIC), list(3)).await;
    assert_eq!(status, 200, "{all}");
    let every = names(&all);
    assert!(every.contains(&"memo_set".to_owned()), "{every:?}");
    let (status, _, done) = post_at(&url, Some(STATIC), set(4)).await;
    assert_eq!(
        (status, &done["result"]["isError"]),
        (200, &json!(false)),
        "{done}"
    );

    // Scopes: herald:memo and herald:* let in whole, herald:memo:read to read alone.
    for scope in [
        "herald:memo",
        "herald:*",
        "openid herald:memo:read herald:memo",
    ] {
        let t = provider
            .mint("rsa1", "RS256", json!({"scope": scope}))
            .await;
        let (status, _, listed) = post_at(&url, Some(&t), list(5)).await;
        assert_eq!((status, names(&listed)), (200, every.clone()), "{scope}");
        let (status, _, done) = post_at(&url, Some(&t), set(6)).await;
        assert_eq!(status, 200, "{scope}: {done}");
    }
    let read = provider
        .mint("ec1", "ES256", json!({"scope": "herald:memo:read"}))
        .await;
    let (status, _, listed) = post_at(&url, Some(&read), list(7)).await;
    assert_eq!(status, 200);
    let readable = names(&listed);
    assert!(
        !readable.is_empty()
            && readable.len() < every.len()
            && !readable.contains(&"memo_set".into()),
        "{readable:?}"
    );
    let (status, challenge, refused) = post_at(&url, Some(&read), set(8)).await;
    assert_eq!(status, 403, "{refused}");
    assert!(
        challenge.contains("insufficient_scope") && challenge.contains("scope=\"herald:memo\""),
        "{challenge}"
    );
    // Reading is let in.
    let read_call = json!({"jsonrpc": "2.0", "id": 9, "method": "resources/read",
        "params": {"uri": "memo://notes", "_meta": meta()}});
    let (status, _, notes) = post_at(&url, Some(&read), read_call).await;
    assert_eq!(status, 200, "{notes}");

    // `herald status` shows the issuer and its keys (fetched by now: tokens were let in).
    let status = herald(["status", "--admin", &memo.admin_url()]).await;
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(status.status.success(), "{text}");
    let row = text
        .lines()
        .find(|l| l.starts_with(&provider.url))
        .unwrap_or_else(|| panic!("an issuer row: {text}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        cells[1], "3",
        "its three keys (RSA, P-256, Ed25519): {text}"
    );
    assert!(cells[2].ends_with('s') && cells[3] == "ago", "{text}");
    assert_eq!(cells[4], "-", "no error: {text}");

    // Scopes for another role, or none of herald's: an unknown token.
    for scope in ["herald:file", "openid profile", "herald:file:read"] {
        let t = provider
            .mint("rsa1", "RS256", json!({"scope": scope}))
            .await;
        let (status, challenge, _) = post_at(&url, Some(&t), list(10)).await;
        assert_eq!(status, 401, "{scope}");
        assert!(challenge.contains("invalid_token"), "{scope}: {challenge}");
    }

    // QUIC: the token in `_meta`, the same rules.
    let quic = |token: Option<&str>| ClientTrust {
        token: token.map(|t| Secret(t.to_owned())),
        pin: Some(memo.fingerprint()),
        ..ClientTrust::default()
    };
    let target = Target::Quic(memo.quic_addr());
    let q = connect(&target, &quic(Some(&read)), client_config(), 4 << 20)
        .await
        .unwrap();
    let tools = q.list_all_tools().await.unwrap();
    assert_eq!(tools.len(), readable.len());
    let refused = match connect(&target, &quic(None), client_config(), 4 << 20).await {
        Err(e) => e.to_string(),
        Ok(c) => match c.list_all_tools().await {
            Err(e) => e.to_string(),
            Ok(t) => panic!("QUIC without a token listed {} tools", t.len()),
        },
    };
    assert!(refused.contains("token"), "{refused}");

    // An events/stream opened with a token about to expire ends when it does.
    let short = provider.expiring("herald:memo").await;
    let stream = json!({"jsonrpc": "2.0", "id": 11, "method": "events/stream", "params": {
        "_meta": meta(), "name": "memo.changed"}});
    let seen = until_it_ends(&url, &short, stream).await;
    assert!(seen.contains("notifications/events/terminated"), "{seen}");
    assert!(seen.contains("\"expired\""), "{seen}");
}

#[tokio::test]
async fn an_access_file_that_lets_no_one_in_or_names_another_role_is_refused() {
    let dir = TempDir::new("role-access-bad");
    let cases = [
        ("", "no [[token]] and no [[issuer]]"),
        (
            &*format!(
                "[[token]]\nsha256 = \"{}\"\nslugs = [\"file\"]\n",
                sha(STATIC)
            ),
            "slugs must name memo",
        ),
        (
            "[[token]]\nsha256 = \"abc\"\nslugs = [\"*\"]\n",
            "64 hex digits",
        ),
        ("[[slug]]\nname = \"x\"\n", "unknown field"),
        (
            "[[issuer]]\nurl = \"http://id.example.com\"\naudience = \"a\"\n",
            "https://",
        ),
    ];
    for (i, (text, says)) in cases.iter().enumerate() {
        let file = dir.path().join(format!("access-{i}.toml"));
        std::fs::write(&file, text).unwrap();
        let out = herald([
            "--store",
            ":memory:",
            "memo",
            "--http",
            "127.0.0.1:0",
            "--access",
            file.to_str().unwrap(),
        ])
        .await;
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{text}: {err}");
        assert!(
            err.contains("--access") && err.contains(says),
            "{text}: {err}"
        );
        assert!(!err.contains(STATIC), "{err}");
    }
}

/// A role with static tokens alone takes no OAuth: herald's client, sent without a token,
/// says to set HERALD_TOKEN (not that the endpoint is not MCP), and with it gets through.
#[tokio::test]
async fn a_static_token_role_tells_the_client_to_set_herald_token() {
    let dir = TempDir::new("role-access-static");
    let file = dir.path().join("access.toml");
    std::fs::write(
        &file,
        format!("[[token]]\nsha256 = \"{}\"\nslugs = [\"*\"]\n", sha(STATIC)),
    )
    .unwrap();
    let memo = Server::spawn(&[
        "--store",
        ":memory:",
        "memo",
        "--http",
        "127.0.0.1:0",
        "--access",
        file.to_str().unwrap(),
    ])
    .await;
    let call = |token: Option<&str>| {
        let mut cmd = tokio::process::Command::new(bin());
        cmd.args([
            "--store",
            ":memory:",
            "call",
            "--mcp-http",
            &memo.http_url(),
            "memo_set",
            "key=a",
            "value=1",
        ])
        .env_remove("HERALD_TOKEN")
        .stdin(std::process::Stdio::null());
        if let Some(t) = token {
            cmd.env("HERALD_TOKEN", t);
        }
        async move {
            tokio::time::timeout(WAIT, cmd.output())
                .await
                .unwrap()
                .unwrap()
        }
    };
    let without = call(None).await;
    let err = String::from_utf8_lossy(&without.stderr);
    assert!(!without.status.success());
    assert!(
        err.contains("needs a token")
            && err.contains("HERALD_TOKEN")
            && !err.contains("not an MCP"),
        "{err}"
    );
    let with = call(Some(STATIC)).await;
    assert!(
        with.status.success(),
        "{}",
        String::from_utf8_lossy(&with.stderr)
    );
}
