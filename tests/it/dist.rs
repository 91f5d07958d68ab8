//! What a distribution relies on: upstream host names resolved by herald itself (the static
//! binary has no glibc NSS to lean on), a binary that runs with an empty environment, and the
//! completion scripts and manual pages the packages ship.

use crate::support::*;

/// `localhost` as an upstream host name, over QUIC (herald's own resolver) and HTTP (reqwest's
/// hickory resolver): both resolve in Rust, from /etc/hosts or RFC 6761's loopback answer.
#[tokio::test]
async fn upstream_host_names_resolve_in_rust() {
    let memo = Server::spawn(&[
        "--store",
        ":memory:",
        "memo",
        "--quic",
        "127.0.0.1:0",
        "--http",
        "127.0.0.1:0",
    ])
    .await;
    let quic_port = memo.quic_addr().rsplit_once(':').unwrap().1.to_owned();
    let quic = format!("localhost:{quic_port}");
    let out = herald(["ls", "--mcp-quic", &quic, "--tls-pin", &memo.fingerprint()]).await;
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(listed.contains("memo_set"), "{listed}");

    let http = memo.http_url().replace("127.0.0.1", "localhost");
    let out = herald(["ls", "--mcp-http", &http]).await;
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(listed.contains("memo_set"), "{listed}");

    // A name nobody serves fails with the resolver's answer, not a hang.
    let out = herald(["ls", "--mcp-quic", "nosuch.invalid:8751"]).await;
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot resolve nosuch.invalid"), "{err}");
    memo.terminate().await;
}

/// What `env -i herald --version` checks on the static binary in CI, on this build.
#[tokio::test]
async fn runs_with_an_empty_environment() {
    let out = tokio::process::Command::new(bin())
        .arg("--version")
        .env_clear()
        .output()
        .await
        .unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("herald {}", env!("CARGO_PKG_VERSION"))
    );
}

#[tokio::test]
async fn completions_generate_for_bash_zsh_and_fish() {
    for shell in ["bash", "zsh", "fish"] {
        let out = herald(["completions", shell]).await;
        assert!(out.status.success(), "{shell}");
        let script = String::from_utf8_lossy(&out.stdout);
        assert!(script.contains("watch"), "{shell}: {script}");
    }
    let bash = herald(["completions", "bash"]).await;
    let bash = String::from_utf8_lossy(&bash.stdout);
    assert!(bash.contains("complete -F _herald"), "{bash}");
    let out = herald(["completions", "tcsh"]).await;
    assert_eq!(out.status.code(), Some(64), "an unknown shell is bad usage");
}

#[tokio::test]
async fn man_pages_generate_one_per_subcommand() {
    let out = herald(["man"]).await;
    assert!(out.status.success());
    let page = String::from_utf8_lossy(&out.stdout);
    assert!(page.starts_with(".ie"), "roff: {page}");
    assert!(page.contains(".TH herald 1"), "{page}");

    let dir = TempDir::new("man");
    let out_dir = dir.path().join("man1");
    let out = herald(["man", "--out", out_dir.to_str().unwrap()]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = String::from_utf8_lossy(&out.stdout);
    for name in [
        "herald.1",
        "herald-watch.1",
        "herald-memo.1",
        "herald-man.1",
    ] {
        let path = out_dir.join(name);
        assert!(path.is_file(), "{name} in {printed}");
        assert!(printed.contains(path.to_str().unwrap()), "{printed}");
    }
    assert!(!out_dir.join("herald-filter-worker.1").exists(), "hidden");
    let watch = std::fs::read_to_string(out_dir.join("herald-watch.1")).unwrap();
    assert!(watch.contains("\\-\\-watch"), "{watch}");
}

/// A machine with no CA certificates (a distroless container, the minimal root in CI): an
/// HTTP upstream still works. reqwest refuses to build a default client there, and rmcp's
/// default client panicked on it.
#[tokio::test]
async fn an_http_upstream_works_without_a_ca_store() {
    let memo = Server::spawn(&["--store", ":memory:", "memo", "--http", "127.0.0.1:0"]).await;
    let dir = TempDir::new("no-ca");
    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "").unwrap();
    let out = tokio::process::Command::new(bin())
        .args(["ls", "--mcp-http", &memo.http_url()])
        // rustls-native-certs reads only these when they are set.
        .env("SSL_CERT_FILE", &empty)
        .env("SSL_CERT_DIR", dir.path())
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("memo_set"));
    memo.terminate().await;
}
