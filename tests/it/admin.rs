//! The admin address (`--admin`): `/live`, `/ready` and its transitions, `/metrics`, `/status`,
//! and `herald status` reading it as a table and as JSON.

use herald::runtime::status::{Readiness, RoleState, StatusReport};
use rmcp::model::SubscriptionFilter;
use serde_json::{Value, json};

use crate::support::*;

async fn get(url: &str) -> (u16, String) {
    let r = tokio::time::timeout(WAIT, reqwest::get(url))
        .await
        .expect("an answer in time")
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    (r.status().as_u16(), r.text().await.unwrap())
}

#[tokio::test]
async fn live_ready_metrics_and_status_on_the_admin_address() {
    let dir = TempDir::new("admin");
    let store = dir.path().join("herald.redb");
    let server = Server::spawn(&[
        "--store",
        store.to_str().unwrap(),
        "memo",
        "--http",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
    ])
    .await;
    let admin = server.admin_url();
    assert_eq!(get(&format!("{admin}/live")).await, (200, "ok\n".into()));
    let (code, body) = get(&format!("{admin}/ready")).await;
    assert_eq!(code, 200, "{body}");
    let ready: Readiness = serde_json::from_str(&body).unwrap();
    assert!(
        ready.ready && !ready.starting && !ready.draining,
        "{ready:?}"
    );

    // One open listen stream, proven running by a notification on it.
    let memo = Memo {
        target: herald::transport::target::Target::Http(server.http_url()),
        trust: Default::default(),
        server: None,
    };
    let conn = memo.client().await;
    let mut sub = conn
        .listen(
            SubscriptionFilter::builder()
                .resource_subscription("memo://notes")
                .build(),
        )
        .await
        .expect("listen");
    call(&conn, "memo_set", json!({"key": "a", "value": 1})).await;
    tokio::time::timeout(WAIT, sub.next())
        .await
        .expect("a notification in time")
        .expect("the listen is healthy")
        .expect("the listen is open");

    let (code, body) = get(&format!("{admin}/status")).await;
    assert_eq!(code, 200);
    let status: StatusReport = serde_json::from_str(&body).unwrap();
    assert!(status.ready && !status.draining, "{status:?}");
    assert_eq!(status.pid, server.pid());
    assert_eq!(status.listens, 1, "{status:?}");
    assert_eq!(status.roles.len(), 1);
    assert_eq!(status.roles[0].name, "memo");
    assert_eq!(status.roles[0].state, RoleState::Serving);
    assert_eq!(status.roles[0].endpoints, vec![server.http_url()]);
    assert_eq!(status.roles[0].listens, 1);
    assert!(status.upstreams.is_empty() && status.watches.is_empty());
    assert_eq!(status.store.path.as_deref(), Some(store.as_path()));
    assert!(status.store.bytes.unwrap() > 0, "{status:?}");

    let (code, metrics) = get(&format!("{admin}/metrics")).await;
    assert_eq!(code, 200);
    for line in [
        "herald_events_list_failed_total 0",
        "herald_ready 1",
        "herald_listen_streams{role=\"memo\"} 1",
        "herald_store_bytes ",
    ] {
        assert!(metrics.contains(line), "{line} missing:\n{metrics}");
    }

    // herald status: the same report, for a person and as JSON.
    let out = herald(["status", "--admin", &admin]).await;
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(table.contains(", ready\n"), "{table}");
    assert!(table.contains("listen streams open: 1\n"), "{table}");
    let role_line = table
        .lines()
        .find(|l| l.starts_with("memo "))
        .unwrap_or_else(|| panic!("no memo row:\n{table}"));
    let cells: Vec<&str> = role_line.split_whitespace().collect();
    assert_eq!(
        cells,
        ["memo", "serving", "1", server.http_url().as_str()],
        "{table}"
    );
    assert!(
        table.contains(&format!("store: {}", store.display())),
        "{table}"
    );
    let addr = admin.trim_start_matches("http://");
    let out = herald(["status", "--json", "--admin", addr]).await;
    assert!(out.status.success());
    let json: StatusReport = serde_json::from_slice(&out.stdout).expect("--json is the report");
    assert_eq!(json.roles, status.roles);
    assert_eq!(json.listens, 1);

    drop(sub);
    conn.close().await;
    assert!(server.terminate().await.success());
}

#[tokio::test]
async fn ready_waits_for_every_upstream_to_connect_once() {
    init();
    let dir = TempDir::new("admin-ready");
    let gate = dir.path().join("gate");
    let made = std::process::Command::new("mkfifo")
        .arg(&gate)
        .status()
        .unwrap();
    assert!(made.success());
    let config = dir.path().join("gateway.toml");
    // The upstream waits at the gate before it becomes a memo server.
    std::fs::write(
        &config,
        format!(
            "[[slug]]\nname = \"slow\"\nstdio = \"sh -c 'read x < {}; exec {} --store :memory: memo'\"\n",
            gate.display(),
            bin()
        ),
    )
    .unwrap();
    let mut cmd = tokio::process::Command::new(bin());
    cmd.args(["--log-format", "json", "--store", ":memory:", "gateway"])
        .arg("--config")
        .arg(&config)
        .args(["--http", "127.0.0.1:0", "--admin", "127.0.0.1:0"]);
    // The admin address answers while the gateway still warms up.
    let mut server = Server::start(cmd, "admin").await;
    let admin = server.admin_url();
    assert_eq!(get(&format!("{admin}/live")).await.0, 200);
    let (code, body) = get(&format!("{admin}/ready")).await;
    assert_eq!(code, 503, "{body}");
    let ready: Readiness = serde_json::from_str(&body).unwrap();
    assert!(!ready.ready && ready.starting, "{ready:?}");
    let waiting: Vec<&str> = ready
        .upstreams_never_connected
        .iter()
        .map(|u| u.name.as_str())
        .collect();
    assert_eq!(waiting, ["slow"], "{ready:?}");
    let (_, body) = get(&format!("{admin}/status")).await;
    let status: StatusReport = serde_json::from_str(&body).unwrap();
    assert!(!status.upstreams[0].connected && !status.upstreams[0].ever_connected);
    let out = herald(["status", "--admin", &admin]).await;
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains(", not ready\n"), "{table}");
    assert!(
        table.lines().any(|l| l.starts_with("slow      never")),
        "{table}"
    );

    // Open the gate: the upstream connects, the warm-up ends, the gateway serves.
    let g = gate.clone();
    tokio::task::spawn_blocking(move || std::fs::write(g, "go\n"))
        .await
        .unwrap()
        .unwrap();
    // Both come, in either order: the gateway serves once its warm-up ends (at the latest
    // after 5 s, the connect still under way on a slow machine).
    let (mut listening, mut connected) = (false, false);
    while !(listening && connected) {
        let v = server
            .line_where("listening and upstream connected", |v| {
                v["event"] == "listening" || v["message"] == "upstream connected"
            })
            .await;
        listening |= v["event"] == "listening";
        connected |= v["message"] == "upstream connected";
    }
    let (code, body) = get(&format!("{admin}/ready")).await;
    assert_eq!(code, 200, "{body}");
    let ready: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(ready["upstreams_never_connected"], json!([]));
    let (_, body) = get(&format!("{admin}/status")).await;
    let status: StatusReport = serde_json::from_str(&body).unwrap();
    assert_eq!(status.roles[0].name, "gateway");
    assert!(status.upstreams[0].connected && status.upstreams[0].ever_connected);
    let (_, metrics) = get(&format!("{admin}/metrics")).await;
    assert!(
        metrics.contains("herald_upstream_connected{upstream=\"slow\"} 1"),
        "{metrics}"
    );
    assert!(server.terminate().await.success());
}

#[tokio::test]
async fn herald_status_says_when_nothing_answers() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let out = herald(["status", "--admin", &format!("127.0.0.1:{port}")]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("no herald answered at http://127.0.0.1:{port}"))
            && stderr.contains("is `herald up` running? pass --admin URL"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());
}
