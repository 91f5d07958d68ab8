//! herald's OAuth client (issue 34, item 2) end to end: an authorization server on PyJWT
//! (`tests/it/py/oauth_server.py`), herald's own gateway as the protected resource
//! (`[[issuer]]` naming that server), and herald's client on the other side:
//!
//! - `herald login` prints the address to approve; the test is the browser (it GETs the
//!   address and carries the redirect to herald's loopback listener); the tokens are kept
//!   sealed in the store: neither the access nor the refresh token is in the store file.
//! - `herald call` with the same store uses them, and refreshes a token about to expire.
//! - A gateway slug with `[slug.oauth]` uses the kept tokens; another with the client
//!   credentials grant gets its own; without a login a command says to log in.

use std::process::Stdio;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

use crate::oauth::Provider;
use crate::support::*;

/// A memo behind a gateway that takes the provider's tokens, at a port chosen before it
/// starts (the audience, and so the resource its metadata names, is its URL).
async fn protected(provider: &Provider, dir: &TempDir) -> (Server, Server, String) {
    let memo = Server::spawn(&["--store", ":memory:", "memo", "--http", "127.0.0.1:0"]).await;
    let port = closed_port();
    let url = format!("http://127.0.0.1:{port}/mcp");
    let cfg = dir.path().join("rs.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[slug]]\nname = \"memo\"\nhttp = \"{}\"\n\
             [[issuer]]\nurl = \"{}\"\naudience = \"{url}\"\n",
            memo.http_url(),
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
        &format!("127.0.0.1:{port}"),
    ])
    .await;
    (memo, gw, url)
}

/// `herald login`, approved by the test as a browser would: the printed address fetched,
/// its redirect carried to herald's listener.
async fn login(store: &str, url: &str) -> String {
    let mut child = Command::new(bin())
        .args(["--store", store, "login", "--mcp-http", url])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap()).lines();
    let address = tokio::time::timeout(WAIT, async {
        let mut said = String::new();
        while let Some(line) = err.next_line().await.unwrap() {
            said.push_str(&line);
            said.push('\n');
            if let Some(a) = line
                .trim()
                .strip_prefix("http")
                .filter(|a| a.contains("/authorize?"))
            {
                return format!("http{a}");
            }
        }
        panic!("herald login printed no address to approve: {said}");
    })
    .await
    .expect("herald login prints the address");
    let browser = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let approved = browser.get(&address).send().await.unwrap();
    assert_eq!(approved.status(), 302, "the server approves at once");
    let back = approved.headers()["location"].to_str().unwrap().to_owned();
    assert!(back.starts_with("http://127.0.0.1:"), "{back}");
    let page = browser.get(&back).send().await.unwrap();
    assert_eq!(page.status(), 200);
    assert!(
        page.text()
            .await
            .unwrap()
            .contains("You can close this tab")
    );
    let out = tokio::time::timeout(WAIT, child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

async fn set_note(store: &str, url: &str, key: &str) -> std::process::Output {
    herald([
        "--store",
        store,
        "call",
        "--mcp-http",
        url,
        "memo__memo_set",
        &format!("key={key}"),
        "value=1",
    ])
    .await
}

/// `far__memo__memo_set KEY value=1` through the gateway at `url` (a store of its own).
async fn call_far(url: &str, key: &str) -> std::process::Output {
    herald([
        "--store",
        ":memory:",
        "call",
        "--mcp-http",
        url,
        "far__memo__memo_set",
        key,
        "value=1",
    ])
    .await
}

async fn issued(provider: &mut Provider) -> Value {
    provider.order(json!({"issued": true})).await
}

#[tokio::test]
async fn a_login_serves_every_command_refreshed_and_sealed_in_the_store() {
    let mut provider = Provider::start_script("oauth_server.py").await;
    let dir = TempDir::new("oauth-client");
    let (_memo, _gw, url) = protected(&provider, &dir).await;
    let store = dir.path().join("herald.redb");
    let store = store.to_str().unwrap();

    // Before any login: refused, and told what to do.
    let before = set_note(store, &url, "a").await;
    assert!(!before.status.success());
    let err = String::from_utf8_lossy(&before.stderr);
    assert!(err.contains("herald login --mcp-http"), "{err}");

    // Tokens that expire at once (the gateway's 60 s of skew still takes them): every later
    // use refreshes.
    provider.order(json!({"ttl": 0})).await;
    let said = login(store, &url).await;
    assert!(said.contains("Logged in to"), "{said}");
    assert!(said.contains(&provider.url), "{said}");
    let after_login = issued(&mut provider).await;
    assert_eq!(
        after_login["grants"]["authorization_code"], 1,
        "{after_login}"
    );

    let ok = set_note(store, &url, "b").await;
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let now = issued(&mut provider).await;
    assert!(
        now["grants"]["refresh_token"].as_u64().unwrap_or(0) >= 1,
        "{now}"
    );
    assert_eq!(
        now["grants"]["authorization_code"], 1,
        "no second login: {now}"
    );

    // Nothing the server issued is readable in the store file.
    let bytes = std::fs::read(store).unwrap();
    for t in now["tokens"].as_array().unwrap() {
        let t = t.as_str().unwrap().as_bytes();
        assert!(
            !bytes.windows(t.len()).any(|w| w == t),
            "a token is in the store in the clear"
        );
    }

    // A refresh that cannot be asked (the server is down a moment) keeps the tokens: the
    // command still gets through (the gateway's skew takes the old token) and the next one
    // refreshes. One the server refuses (invalid_grant) drops them: log in again.
    provider.order(json!({"fail_next": 503})).await;
    let blip = set_note(store, &url, "b2").await;
    assert!(
        blip.status.success(),
        "{}",
        String::from_utf8_lossy(&blip.stderr)
    );
    let refreshes = issued(&mut provider).await["grants"]["refresh_token"]
        .as_u64()
        .unwrap();
    let ok = set_note(store, &url, "b3").await;
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let after = issued(&mut provider).await;
    assert!(
        after["grants"]["refresh_token"].as_u64().unwrap() > refreshes,
        "{after}"
    );

    // A second login keeps what it has.
    let again = login_or_kept(store, &url).await;
    assert!(again.contains("Already logged in"), "{again}");

    // A gateway fronting the protected one takes the kept tokens ([slug.oauth]).
    let cfg = dir.path().join("front.toml");
    std::fs::write(
        &cfg,
        format!("[[slug]]\nname = \"far\"\nhttp = \"{url}\"\n[slug.oauth]\n"),
    )
    .unwrap();
    let front = Server::spawn(&[
        "--store",
        store,
        "gateway",
        "--config",
        cfg.to_str().unwrap(),
        "--http",
        "127.0.0.1:0",
    ])
    .await;
    let via = call_far(&front.http_url(), "key=c").await;
    assert!(
        via.status.success(),
        "{}",
        String::from_utf8_lossy(&via.stderr)
    );

    // (The front gateway holds the store; stopped, it lets it go.)
    front.terminate().await;

    // A refresh token the server refuses is dropped: the command says to log in again.
    provider.order(json!({"fail_next": 400})).await;
    let refused = set_note(store, &url, "b4").await;
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("herald login --mcp-http"), "{err}");
    let again = login(store, &url).await;
    assert!(again.contains("Logged in to"), "{again}");

    // --logout forgets them.
    let out = herald(["--store", store, "login", "--mcp-http", &url, "--logout"]).await;
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("Forgot"),
        "{out:?}"
    );
    let gone = set_note(store, &url, "d").await;
    assert!(!gone.status.success());
}

/// `herald login` when the store already holds a token: it answers without an address.
async fn login_or_kept(store: &str, url: &str) -> String {
    let out = herald(["--store", store, "login", "--mcp-http", url]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test]
async fn a_slug_gets_its_own_tokens_by_client_credentials() {
    let mut provider = Provider::start_script("oauth_server.py").await;
    let dir = TempDir::new("oauth-cc");
    let (_memo, _gw, url) = protected(&provider, &dir).await;
    let cfg = dir.path().join("edge.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[slug]]\nname = \"far\"\nhttp = \"{url}\"\n[slug.oauth]\ngrant = \"client_credentials\"\n\
             client_id = \"edge\"\nclient_secret_env = \"EDGE_SECRET\"\nissuer = \"{}\"\n",
            provider.url
        ),
    )
    .unwrap();
    let store = dir.path().join("edge.redb");
    let edge = Server::spawn_env(
        &[
            "--store",
            store.to_str().unwrap(),
            "gateway",
            "--config",
            cfg.to_str().unwrap(),
            "--http",
            "127.0.0.1:0",
        ],
        &[("EDGE_SECRET", "edge-secret")],
    )
    .await;
    let via = call_far(&edge.http_url(), "key=e").await;
    assert!(
        via.status.success(),
        "{}",
        String::from_utf8_lossy(&via.stderr)
    );
    let got = issued(&mut provider).await;
    assert_eq!(got["grants"]["client_credentials"], 1, "{got}");
    assert!(got["grants"].get("authorization_code").is_none(), "{got}");
    assert!(
        !edge.stderr().contains("edge-secret"),
        "the secret is in the log"
    );

    // A secret bound to another issuer goes nowhere: the slug stays down, saying why, and
    // the provider sees no token request from it.
    let cfg = dir.path().join("pinned.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[slug]]\nname = \"far\"\nhttp = \"{url}\"\n[slug.oauth]\ngrant = \"client_credentials\"\n\
             client_id = \"edge\"\nclient_secret_env = \"EDGE_SECRET\"\nissuer = \"https://id.elsewhere.example\"\n"
        ),
    )
    .unwrap();
    let pinned = Server::spawn_env(
        &[
            "--store",
            ":memory:",
            "gateway",
            "--config",
            cfg.to_str().unwrap(),
            "--http",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
        ],
        &[("EDGE_SECRET", "edge-secret")],
    )
    .await;
    let via = call_far(&pinned.http_url(), "key=f").await;
    assert!(!via.status.success());
    let status = herald(["status", "--admin", &pinned.admin_url(), "--json"]).await;
    let status = String::from_utf8_lossy(&status.stdout);
    assert!(status.contains("not the configured issuer"), "{status}");
    let got = issued(&mut provider).await;
    assert_eq!(got["grants"]["client_credentials"], 1, "{got}");
}

/// A refresh whose request is dropped midway (a cancelled call, a client gone) still takes
/// its answer: the server has retired the old refresh token by then, so losing the new one
/// would cost a login. The session's later requests carry the refreshed token, and the
/// refresh token after it still works.
#[tokio::test]
async fn a_refresh_dropped_midway_still_takes_the_rotated_token() {
    use herald::transport::client::{client_config, connect};
    use herald::transport::oauth::consent::Follow;
    use herald::transport::oauth::keep::StoreKeep;
    use herald::transport::oauth::{OAuth, OAuthSettings};
    use herald::transport::target::Target;
    use herald::transport::tls::ClientTrust;
    use std::sync::Arc;

    let mut provider = Provider::start_script("oauth_server.py").await;
    let dir = TempDir::new("oauth-dropped");
    let (_memo, _gw, url) = protected(&provider, &dir).await;
    let oauth = OAuth::new(&url, OAuthSettings::default(), Some(Arc::new(Follow))).unwrap();
    oauth.keep_in(Arc::new(
        StoreKeep::new(herald::store::Store::memory()).unwrap(),
    ));
    // Tokens due for a refresh at once (the gateway's skew still takes them).
    provider.order(json!({"ttl": 0})).await;
    let trust = ClientTrust {
        oauth: Some(oauth.clone()),
        ..ClientTrust::default()
    };
    let conn = connect(&Target::Http(url.clone()), &trust, client_config(), 4 << 20)
        .await
        .expect("authorized by the consent");
    drop(conn);
    let first = issued(&mut provider).await;
    assert_eq!(first["grants"]["authorization_code"], 1, "{first}");
    // (Its requests after the authorization may have refreshed already: ttl 0.)
    let refreshes = first["grants"]["refresh_token"].as_u64().unwrap_or(0);

    // The next refresh is held at the server, after it retired the old refresh token; the
    // request that asked for it is dropped meanwhile.
    provider.order(json!({"ttl": 3600})).await;
    provider.order(json!({"hold_next": true})).await;
    let asking = tokio::spawn({
        let oauth = oauth.clone();
        async move { oauth.bearer().await }
    });
    assert_eq!(
        provider.order(json!({"wait_held": true})).await["held"],
        true
    );
    asking.abort();
    assert!(asking.await.unwrap_err().is_cancelled());
    provider.order(json!({"release": true})).await;

    // The refreshed token is the session's: the latest the server issued, taken by the
    // resource server, with no second refresh nor a new authorization.
    let held = tokio::time::timeout(WAIT, async {
        loop {
            let t = oauth.bearer().await.expect("a token");
            let now = issued(&mut provider).await;
            if now["grants"]["refresh_token"] == refreshes + 1
                && now["tokens"].as_array().unwrap().iter().any(|x| x == &*t)
            {
                return (t, now);
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    let (token, now) = held.expect("the dropped refresh's token is taken");
    assert_eq!(now["grants"]["authorization_code"], 1, "{now}");
    let tokens = now["tokens"].as_array().unwrap();
    // (JWTs have two dots; refresh tokens are url-safe base64, none.)
    let access: Vec<&Value> = tokens
        .iter()
        .filter(|t| t.as_str().unwrap().matches('.').count() == 2)
        .collect();
    assert_eq!(
        access.last().unwrap().as_str(),
        Some(&*token),
        "the newest access token"
    );
    let again = connect(&Target::Http(url.clone()), &trust, client_config(), 4 << 20).await;
    assert!(again.is_ok(), "{:?}", again.err());
}
