//! `herald k8s` end to end against the fake API server, through `herald watch` and MCP
//! clients: watches over the API (herald's own client, no kubectl process), the same with
//! `--watch-via kubectl`, and the tools, which run the real kubectl.

use serde_json::{Value, json};

use crate::kube_fake::FakeApi;
use crate::support::*;
use crate::watch::Watch;

pub(crate) struct Setup {
    pub(crate) api: FakeApi,
    pub(crate) k8s: Server,
    _dir: TempDir,
}

/// `herald k8s` on HTTP against a fresh fake API server, with `extra` flags.
pub(crate) async fn setup(extra: &[&str]) -> Setup {
    let api = FakeApi::start().await;
    let dir = TempDir::new("k8s");
    let kc = api.kubeconfig(dir.path());
    setup_on(api, dir, &kc, extra).await
}

/// `herald k8s` on HTTP against `api` with the kubeconfig `kc`.
async fn setup_on(api: FakeApi, dir: TempDir, kc: &std::path::Path, extra: &[&str]) -> Setup {
    let mut args = vec![
        "--store",
        ":memory:",
        "k8s",
        "--http",
        "127.0.0.1:0",
        "--kubeconfig",
        kc.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let k8s = Server::spawn(&args).await;
    Setup {
        api,
        k8s,
        _dir: dir,
    }
}

fn watch(s: &Setup, uri: &str) -> Watch {
    let spec = format!("cm={uri}");
    Watch::spawn(
        ":memory:",
        &["--mcp-http", &s.k8s.http_url(), "--watch", &spec],
    )
}

/// Notice lines until one contains `needle`; all the lines seen, in order.
async fn lines_until(w: &mut Watch, needle: &str) -> Vec<String> {
    let mut seen = Vec::new();
    loop {
        let n = w.notice().await;
        for l in n["lines"].as_array().unwrap() {
            seen.push(l.as_str().unwrap().to_owned());
        }
        if seen.iter().any(|l| l.contains(needle)) {
            return seen;
        }
    }
}

/// The command lines of the kubectl processes running `get -w` whose parent is `pid`.
fn kubectl_cmdlines(pid: u32) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid ...
        let Some(after) = stat.rsplit_once(") ").map(|x| x.1) else {
            continue;
        };
        let mut f = after.split(' ');
        let (state, ppid) = (f.next(), f.next());
        if state == Some("Z") || ppid != Some(&pid.to_string()) {
            continue;
        }
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if cmd.contains("--output-watch-events") {
            out.push(cmd);
        }
    }
    out
}

fn kubectl_watches(pid: u32) -> usize {
    kubectl_cmdlines(pid).len()
}

#[tokio::test]
async fn configmap_changes_become_notices() {
    let s = setup(&[]).await;
    s.api.put("root:app", "default", "old", json!({"a": "1"}));
    let mut w = watch(&s, "kcp-events://watch/root:app/configmaps?namespace=*");
    w.event("watch.subscribed", "cm").await;
    s.api.wait("a watch", |a| a.watches() == 1).await;
    s.api.put("root:app", "default", "cm1", json!({"a": "1"}));
    let l = lines_until(&mut w, "cm1").await;
    assert_eq!(
        l,
        ["ADDED default/cm1"],
        "the seeded object is not re-announced"
    );
    s.api.put("root:app", "default", "cm1", json!({"a": "2"}));
    let l = lines_until(&mut w, "cm1").await;
    assert_eq!(l, [r#"MODIFIED default/cm1 (data.a: "1" → "2")"#]);
    s.api.delete("root:app", "default", "cm1");
    assert_eq!(lines_until(&mut w, "cm1").await, ["DELETED default/cm1"]);
    // The watch went to the workspace's own path, and another workspace is another space.
    assert!(
        s.api.requests().iter().any(
            |r| r.starts_with("GET /clusters/root:app/api/v1/configmaps?")
                && r.contains("watch=true")
        ),
        "{:?}",
        s.api.requests()
    );
    s.api.put("root:other", "default", "elsewhere", json!({}));
    s.api.put("root:app", "default", "barrier", json!({}));
    assert_eq!(
        lines_until(&mut w, "barrier").await,
        ["ADDED default/barrier"]
    );
    w.terminate().await;
}

#[tokio::test]
async fn a_dropped_stream_reconnects_and_reports_the_gap() {
    let s = setup(&[]).await;
    for name in ["keep", "change", "gone"] {
        s.api.put("", "default", name, json!({"v": "1"}));
    }
    let mut w = watch(&s, "k8s-events://watch/configmaps?namespace=default");
    w.event("watch.subscribed", "cm").await;
    s.api.wait("a watch", |a| a.watches() == 1).await;
    s.api.drop_watches_and(|gap| {
        gap.put("", "default", "change", json!({"v": "2"}));
        gap.delete("", "default", "gone");
        gap.put("", "default", "new", json!({"v": "1"}));
    });
    s.api.wait("a new watch", |a| a.watches() == 1).await;
    let l = lines_until(&mut w, "new").await;
    let mut got = l.clone();
    got.sort();
    assert_eq!(
        got,
        [
            "ADDED default/new",
            "DELETED default/gone",
            r#"MODIFIED default/change (data.v: "1" → "2")"#
        ],
        "{l:?}"
    );
    // kubectl re-listed everything as ADDED when it restarted: all suppressed.
    s.api.wait("a new watch", |a| a.watches() == 1).await;
    s.api.put("", "default", "after", json!({}));
    let l = lines_until(&mut w, "after").await;
    assert_eq!(l, ["ADDED default/after"], "no duplicate ADDED");
    w.terminate().await;
}

#[tokio::test]
async fn gone_410_is_reported_in_band_and_recovered() {
    let s = setup(&[]).await;
    let mut w = watch(&s, "k8s-events://watch/configmaps?namespace=*");
    w.event("watch.subscribed", "cm").await;
    s.api.wait("a watch", |a| a.watches() == 1).await;
    s.api.put("", "default", "before", json!({}));
    assert_eq!(
        lines_until(&mut w, "before").await,
        ["ADDED default/before"]
    );
    s.api.expire_watches();
    let l = lines_until(&mut w, "410").await;
    assert!(l.iter().any(|x| x.contains("ERROR")), "{l:?}");
    // It keeps reconnecting until a watch is accepted, then carries on.
    s.api.wait("a new watch", |a| a.watches() == 1).await;
    s.api.put("", "default", "after", json!({}));
    lines_until(&mut w, "ADDED default/after").await;
    w.terminate().await;
}

#[tokio::test]
async fn a_typo_gets_did_you_mean() {
    let s = setup(&[]).await;
    let out = herald([
        "--store",
        ":memory:",
        "watch",
        "--mcp-http",
        &s.k8s.http_url(),
        "--watch",
        "cm=kcp-events://watch/root:app/confgmaps?namespace=*",
    ])
    .await;
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("did you mean: configmaps"), "{err}");
    assert!(err.contains("confgmaps"), "{err}");
}

/// Watch requests the fake API server has seen.
fn watch_requests(api: &FakeApi) -> usize {
    api.requests()
        .iter()
        .filter(|r| r.contains("watch=true"))
        .count()
}

#[tokio::test]
async fn subscribers_share_one_watch_until_the_last_leaves() {
    let s = setup(&["--linger-ms", "0"]).await;
    let uri = "kcp-events://watch/root:app/configmaps?namespace=*";
    let mut a = watch(&s, uri);
    let mut b = watch(&s, uri);
    a.event("watch.subscribed", "cm").await;
    b.event("watch.subscribed", "cm").await;
    s.api.wait("a watch", |a| a.watches() == 1).await;
    assert_eq!(watch_requests(&s.api), 1, "one watch for two subscribers");
    assert_eq!(
        kubectl_watches(s.k8s.pid()),
        0,
        "no kubectl process watches"
    );
    s.api.put("root:app", "default", "shared", json!({}));
    assert_eq!(
        lines_until(&mut a, "shared").await,
        ["ADDED default/shared"]
    );
    assert_eq!(
        lines_until(&mut b, "shared").await,
        ["ADDED default/shared"]
    );
    assert_eq!(s.api.watches(), 1, "still one stream for two subscribers");
    a.terminate().await;
    s.api.put("root:app", "default", "still", json!({}));
    lines_until(&mut b, "still").await;
    assert_eq!(watch_requests(&s.api), 1);
    b.terminate().await;
    s.api
        .wait("the last watch closed", |a| a.watches() == 0)
        .await;
}

#[tokio::test]
async fn tools_and_api_resources() {
    let s = setup(&["--read-write"]).await;
    s.api.put_labeled(
        "",
        "default",
        "web",
        json!({"k": "v"}),
        json!({"app": "web"}),
    );
    s.api.put("", "default", "db", json!({}));
    let c = crate::watch::memo_client(&s.k8s.http_url()).await;
    let tools = c.list_all_tools().await.unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    assert_eq!(
        names,
        [
            "kubectl_get",
            "get_api_resources",
            "kubectl_wait",
            "rollout_status",
            "kubectl_apply",
            "kubectl_delete"
        ]
    );
    let read_only = tools
        .iter()
        .map(|t| t.annotations.as_ref().and_then(|a| a.read_only_hint))
        .collect::<Vec<_>>();
    assert_eq!(
        read_only,
        [
            Some(true),
            Some(true),
            Some(true),
            Some(true),
            Some(false),
            Some(false)
        ]
    );
    let got = call_json(
        &c,
        "kubectl_get",
        json!({"resource": "configmaps", "namespace": "default", "labelSelector": "app=web"}),
    )
    .await;
    let items = got["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{got}");
    assert_eq!(items[0]["metadata"]["name"], "web");
    assert!(items[0]["metadata"].get("managedFields").is_none());
    let one = call_json(
        &c,
        "kubectl_get",
        json!({"resource": "cm", "name": "db", "namespace": "default"}),
    )
    .await;
    assert_eq!(one["metadata"]["name"], "db");
    let api = call_json(&c, "get_api_resources", json!({})).await;
    assert!(
        api.as_array()
            .unwrap()
            .iter()
            .any(|r| r["name"] == "configmaps" && r["shortNames"] == json!(["cm"])),
        "{api}"
    );
    // Verbs as the real kubectl prints them (comma-separated), one per element.
    for r in api.as_array().unwrap() {
        let verbs = r["verbs"].as_array().unwrap();
        assert!(verbs.iter().any(|v| v == "watch"), "{r}");
        assert!(
            verbs
                .iter()
                .all(|v| !v.as_str().unwrap().contains([',', ' '])),
            "{r}"
        );
    }
    let (read, _) = read_json(&c, "k8s-api://resources").await;
    assert_eq!(read, api);
    call_json(
        &c,
        "kubectl_delete",
        json!({"resource": "configmaps", "name": "db", "namespace": "default"}),
    )
    .await;
    assert!(
        s.api
            .requests()
            .iter()
            .any(|r| r.starts_with("DELETE /api/v1/namespaces/default/configmaps/db")),
        "{:?}",
        s.api.requests()
    );
    let err = c
        .call_tool(
            rmcp::model::CallToolRequestParams::new("kubectl_get")
                .with_arguments(args(json!({"resource": "cm", "bogus": 1}))),
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("unknown argument bogus"), "{err}");
}

#[tokio::test]
async fn read_only_servers_have_no_mutating_tools() {
    let s = setup(&["--read-only"]).await;
    let c = crate::watch::memo_client(&s.k8s.http_url()).await;
    let names: Vec<String> = c
        .list_all_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    assert_eq!(
        names,
        [
            "kubectl_get",
            "get_api_resources",
            "kubectl_wait",
            "rollout_status"
        ]
    );
    let templates = c.list_all_resource_templates().await.unwrap();
    for t in templates {
        let d = t.description.clone().unwrap();
        assert!(
            d.lines().last().unwrap().starts_with("Example: await "),
            "{d}"
        );
    }
}

async fn call_json(c: &herald::transport::client::Connection, tool: &str, a: Value) -> Value {
    let r = c
        .call_tool(rmcp::model::CallToolRequestParams::new(tool.to_owned()).with_arguments(args(a)))
        .await
        .unwrap();
    assert_ne!(r.is_error, Some(true), "{r:?}");
    r.structured_content.expect("structured content")
}

#[tokio::test]
async fn the_token_command_mints_credentials_for_every_request() {
    let dir = TempDir::new("k8s-token-api");
    let counter = dir.path().join("n");
    let cmd = format!(
        "n=$(cat {c} 2>/dev/null || echo 0); n=$((n+1)); echo $n > {c}; echo minted-$n",
        c = counter.display()
    );
    let s = setup(&["-v", "--token-command", &cmd]).await;
    let mut w = watch(&s, "k8s-events://watch/configmaps?namespace=*");
    w.event("watch.subscribed", "cm").await;
    s.api.wait("a watch", |a| a.watches() == 1).await;
    let before = s.api.tokens();
    assert!(
        !before.is_empty() && before.iter().all(|t| t.starts_with("minted-")),
        "{before:?}"
    );
    s.api.drop_watches_and(|_| {});
    s.api.wait("a new watch", |a| a.watches() == 1).await;
    s.api.put("", "default", "x", json!({}));
    lines_until(&mut w, "ADDED default/x").await;
    let after = s.api.tokens();
    assert!(after.len() > before.len());
    assert!(
        !before.contains(after.last().unwrap()),
        "re-minted for the new watch: {after:?}"
    );
    assert!(s.k8s.stderr().contains("DEBUG"));
    assert!(
        !s.k8s.stderr().contains("minted-"),
        "a token reached the log"
    );
    w.terminate().await;
}

#[tokio::test]
async fn the_token_command_mints_credentials_for_every_kubectl_connect() {
    let dir = TempDir::new("k8s-token");
    // A directory a killed run of an earlier process with this pid left is older than this.
    let started = std::time::SystemTime::now() - std::time::Duration::from_secs(1);
    let counter = dir.path().join("n");
    // Each run prints a new token: minted-1, minted-2, ...
    let cmd = format!(
        "n=$(cat {c} 2>/dev/null || echo 0); n=$((n+1)); echo $n > {c}; echo minted-$n",
        c = counter.display()
    );
    let s = setup(&["-v", "--watch-via", "kubectl", "--token-command", &cmd]).await;
    let minted = || -> u32 {
        std::fs::read_to_string(&counter)
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let mut w = watch(&s, "k8s-events://watch/configmaps?namespace=*");
    w.event("watch.subscribed", "cm").await;
    s.api.wait("a watch", |a| a.watches() == 1).await;
    let first = minted();
    assert!(first >= 1);
    // The token travels in a private kubeconfig, never on a command line.
    let cmdlines = kubectl_cmdlines(s.k8s.pid());
    assert_eq!(cmdlines.len(), 1);
    assert!(!cmdlines[0].contains("minted-"), "{cmdlines:?}");
    s.api.drop_watches_and(|_| {});
    s.api.wait("a new watch", |a| a.watches() == 1).await;
    s.api.put("", "default", "x", json!({}));
    lines_until(&mut w, "ADDED default/x").await;
    assert!(minted() > first, "re-minted on reconnect");
    // The minted kubeconfig is private: a 0700 directory of 0600 files, gone at exit.
    let pid = s.k8s.pid();
    let private: Vec<std::path::PathBuf> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("herald-k8s-{pid}-")))
                && std::fs::metadata(p)
                    .and_then(|m| m.modified())
                    .is_ok_and(|t| t >= started)
        })
        .collect();
    assert_eq!(private.len(), 1, "{private:?}");
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&private[0]), 0o700);
    for f in std::fs::read_dir(&private[0]).unwrap().flatten() {
        assert_eq!(mode(&f.path()), 0o600, "{:?}", f.path());
        let text = std::fs::read_to_string(f.path()).unwrap();
        assert!(
            text.contains("minted-"),
            "the token is in the private kubeconfig"
        );
    }
    assert!(
        s.k8s.stderr().contains("DEBUG"),
        "verbose logging is on, so the next check means something"
    );
    assert!(
        !s.k8s.stderr().contains("minted-"),
        "a token reached the log"
    );
    w.terminate().await;
    let Setup { k8s, .. } = s;
    k8s.terminate().await;
    assert!(
        !private[0].exists(),
        "the private kubeconfig is removed at exit"
    );
}

#[tokio::test]
async fn a_client_that_resubscribes_finds_its_ring() {
    // A client that listens again (as the watch client does after a failed read) keeps the
    // same watcher, ring and seq: the next event is first + 1, no GAP, one kubectl. (That the
    // watcher lingers with no subscriber at all is tested in the source's unit tests.)
    use rmcp::model::SubscriptionFilter;
    let s = setup(&[]).await;
    let uri = "k8s-events://watch/configmaps?namespace=default";
    let c = crate::watch::memo_client(&s.k8s.http_url()).await;
    let filter = || {
        SubscriptionFilter::builder()
            .resource_subscription(uri)
            .build()
    };
    let mut sub = c.listen(filter()).await.unwrap();
    let (log, _) = read_json(&c, uri).await;
    assert_eq!(log["events"], json!([]));
    s.api.wait("a watch", |a| a.watches() == 1).await;
    s.api.put("", "default", "one", json!({}));
    sub.next().await.unwrap().expect("an update");
    let (log, _) = read_json(&c, uri).await;
    let first = log["events"][0]["seq"].as_u64().unwrap();
    drop(sub);
    // No subscriber now; the change still lands in the lingering watcher's ring. A listener
    // of another URI on the same server would not see it, so listen again and wait for it.
    let mut sub = c.listen(filter()).await.unwrap();
    s.api.put("", "default", "two", json!({}));
    let mut seen = Vec::new();
    for _ in 0..3 {
        let (log, _) = read_json(&c, uri).await;
        seen = log["events"].as_array().unwrap().clone();
        if seen.len() == 2 {
            break;
        }
        tokio::time::timeout(WAIT, sub.next())
            .await
            .expect("an update in time")
            .unwrap();
    }
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(seen[1]["seq"].as_u64().unwrap(), first + 1);
    assert_eq!(seen[1]["object"]["metadata"]["name"], "two");
    assert_eq!(watch_requests(&s.api), 1, "the same watch all along");
}

#[tokio::test]
async fn object_names_are_never_flags() {
    let s = setup(&["--read-write"]).await;
    s.api.put("", "default", "keep", json!({}));
    let c = crate::watch::memo_client(&s.k8s.http_url()).await;
    let err = c
        .call_tool(
            rmcp::model::CallToolRequestParams::new("kubectl_delete").with_arguments(args(
                json!({"resource": "configmaps", "name": "--all", "namespace": "default"}),
            )),
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("bad object name"), "{err}");
    assert!(
        !s.api.requests().iter().any(|r| r.starts_with("DELETE")),
        "{:?}",
        s.api.requests()
    );
}

/// A watch URI's event log, read through an MCP client.
async fn event_log(s: &Setup, uri: &str) -> Vec<Value> {
    let c = crate::watch::memo_client(&s.k8s.http_url()).await;
    let (log, _) = read_json(&c, uri).await;
    log["events"].as_array().unwrap().clone()
}

#[tokio::test]
async fn gone_410_relists_and_logs_the_gap_as_synthetic_events() {
    let s = setup(&[]).await;
    for name in ["keep", "change", "gone"] {
        s.api.put("", "default", name, json!({"v": "1"}));
    }
    let uri = "k8s-events://watch/configmaps?namespace=default";
    let mut w = watch(&s, uri);
    w.event("watch.subscribed", "cm").await;
    s.api.wait("a watch", |a| a.watches() == 1).await;
    let lists = |a: &FakeApi| {
        a.requests()
            .iter()
            .filter(|r| {
                r.starts_with("GET /api/v1/namespaces/default/configmaps?")
                    && !r.contains("watch=true")
            })
            .count()
    };
    assert_eq!(lists(&s.api), 1);
    // The history is gone (410) and things changed meanwhile: only a new list can tell.
    s.api.expire_watches_and(|gap| {
        gap.put("", "default", "change", json!({"v": "2"}));
        gap.delete("", "default", "gone");
        gap.put("", "default", "new", json!({"v": "1"}));
    });
    let l = lines_until(&mut w, "new").await;
    assert!(l.iter().any(|x| x.contains("410")), "{l:?}");
    assert_eq!(lists(&s.api), 2, "listed again after the 410");
    let events = event_log(&s, uri).await;
    let gap: Vec<(String, String, bool)> = events
        .iter()
        .filter(|e| e["type"] != "ERROR")
        .map(|e| {
            (
                e["type"].as_str().unwrap().to_owned(),
                e["object"]["metadata"]["name"].as_str().unwrap().to_owned(),
                e["synthetic"] == true,
            )
        })
        .collect();
    assert_eq!(
        gap,
        [
            ("MODIFIED".to_owned(), "change".to_owned(), true),
            ("DELETED".to_owned(), "gone".to_owned(), true),
            ("ADDED".to_owned(), "new".to_owned(), true),
        ],
        "{events:?}"
    );
    w.terminate().await;
}

#[tokio::test]
async fn a_stream_the_server_ends_is_watched_again_from_where_it_was() {
    // No re-list after a plain end of the stream: the next watch starts at the last
    // resourceVersion seen, and what happened in between is replayed as real events.
    let s = setup(&[]).await;
    let uri = "k8s-events://watch/configmaps?namespace=default";
    let mut w = watch(&s, uri);
    w.event("watch.subscribed", "cm").await;
    s.api.wait("a watch", |a| a.watches() == 1).await;
    s.api.put("", "default", "a", json!({}));
    lines_until(&mut w, "ADDED default/a").await;
    s.api
        .drop_watches_and(|gap| gap.put("", "default", "b", json!({})));
    lines_until(&mut w, "ADDED default/b").await;
    let events = event_log(&s, uri).await;
    assert!(
        events.iter().all(|e| e.get("synthetic").is_none()),
        "{events:?}"
    );
    let lists = s
        .api
        .requests()
        .iter()
        .filter(|r| !r.contains("watch=true") && r.contains("/configmaps?"))
        .count();
    assert_eq!(lists, 1, "{:?}", s.api.requests());
    w.terminate().await;
}

#[tokio::test]
async fn a_bookmark_advances_the_resource_version() {
    let s = setup(&[]).await;
    let mut w = watch(&s, "k8s-events://watch/configmaps?namespace=default");
    w.event("watch.subscribed", "cm").await;
    s.api.wait("a watch", |a| a.watches() == 1).await;
    // Changes this watch does not select move the server's resourceVersion on; a BOOKMARK
    // tells the watcher so.
    for i in 0..3 {
        s.api.put("", "elsewhere", &format!("x{i}"), json!({}));
    }
    let rv = s.api.bookmark();
    s.api.drop_watches_and(|_| {});
    s.api.wait("a new watch", |a| a.watches() == 1).await;
    let last = s
        .api
        .requests()
        .into_iter()
        .rfind(|r| r.contains("watch=true"))
        .unwrap();
    assert!(last.contains("allowWatchBookmarks=true"), "{last}");
    assert!(last.contains(&format!("resourceVersion={rv}")), "{last}");
    s.api.put("", "default", "after", json!({}));
    assert_eq!(lines_until(&mut w, "after").await, ["ADDED default/after"]);
    w.terminate().await;
}

#[tokio::test]
async fn a_delete_during_the_seed_arrives_without_a_reconnect() {
    let s = setup(&[]).await;
    s.api.put("", "default", "doomed", json!({}));
    // Deleted after the list was answered, before the watch starts: the watch from the
    // list's resourceVersion carries it. The watch's first bytes wait until the watch client
    // has its baseline (its first read awaits only the list): a client that reads after the
    // delete arrived has it in its baseline, which a loaded machine used to make happen.
    s.api
        .after_next_list(|gap| gap.delete("", "default", "doomed"));
    s.api.hold_watches();
    let mut w = watch(&s, "k8s-events://watch/configmaps?namespace=default");
    w.event("watch.subscribed", "cm").await;
    s.api.release_watches();
    assert_eq!(
        lines_until(&mut w, "doomed").await,
        ["DELETED default/doomed"]
    );
    assert_eq!(watch_requests(&s.api), 1, "no reconnect was needed");
    w.terminate().await;
}

/// A kubeconfig whose user is an exec credential plugin (a script in `dir`) printing an
/// ExecCredential whose token is what `token_cmd` (shell) prints.
fn exec_kubeconfig(api: &FakeApi, dir: &TempDir, token_cmd: &str) -> std::path::PathBuf {
    let plugin = dir.path().join("plugin.sh");
    std::fs::write(
        &plugin,
        format!(
            "#!/bin/sh\nprintf '{{\"apiVersion\": \"client.authentication.k8s.io/v1\", \"kind\": \"ExecCredential\", \"status\": {{\"token\": \"%s\"}}}}' \"$({token_cmd})\"\n"
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755)).unwrap();
    api.kubeconfig_with(
        dir.path(),
        json!({"exec": {"apiVersion": "client.authentication.k8s.io/v1",
                        "command": plugin.to_str().unwrap()}}),
    )
}

#[tokio::test]
async fn an_exec_credential_plugin_mints_the_token() {
    let api = FakeApi::start().await;
    api.require_token("from-the-plugin");
    let dir = TempDir::new("k8s-exec");
    let kc = exec_kubeconfig(&api, &dir, "printf '%s' from-the-plugin");
    let s = setup_on(api, dir, &kc, &[]).await;
    let mut w = watch(&s, "k8s-events://watch/configmaps?namespace=default");
    w.event("watch.subscribed", "cm").await;
    s.api.put("", "default", "seen", json!({}));
    assert_eq!(lines_until(&mut w, "seen").await, ["ADDED default/seen"]);
    assert!(
        s.api.tokens().iter().all(|t| t == "from-the-plugin"),
        "{:?}",
        s.api.tokens()
    );
    w.terminate().await;
}

#[tokio::test]
async fn a_client_certificate_over_tls_and_h2_shares_one_connection() {
    let (api, pki) = FakeApi::start_tls().await;
    let dir = TempDir::new("k8s-tls");
    let kc = api.kubeconfig_tls(dir.path(), &pki);
    let s = setup_on(api, dir, &kc, &[]).await;
    let mut a = watch(&s, "k8s-events://watch/configmaps?namespace=default");
    let mut b = watch(&s, "k8s-events://watch/configmaps?namespace=*");
    a.event("watch.subscribed", "cm").await;
    b.event("watch.subscribed", "cm").await;
    s.api.wait("two watches", |a| a.watches() == 2).await;
    s.api.put("", "default", "secure", json!({}));
    assert_eq!(
        lines_until(&mut a, "secure").await,
        ["ADDED default/secure"]
    );
    assert_eq!(
        lines_until(&mut b, "secure").await,
        ["ADDED default/secure"]
    );
    assert_eq!(
        s.api.connections(),
        1,
        "discovery, both lists and both watches on one h2 connection"
    );
    a.terminate().await;
    b.terminate().await;
}

#[tokio::test]
async fn a_kubeconfig_the_client_cannot_use_is_refused_at_start() {
    let dir = TempDir::new("k8s-bad-kc");
    let kc = dir.path().join("kubeconfig");
    std::fs::write(
        &kc,
        json!({"apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1",
                          "proxy-url": "http://127.0.0.1:3128"}}],
            "users": [{"name": "u", "user": {}}],
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "x"})
        .to_string(),
    )
    .unwrap();
    let out = herald([
        "--store",
        ":memory:",
        "k8s",
        "--http",
        "127.0.0.1:0",
        "--kubeconfig",
        kc.to_str().unwrap(),
    ])
    .await;
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("proxy-url"), "{err}");
    assert!(err.contains("--watch-via kubectl"), "{err}");
}

#[tokio::test]
async fn a_stream_cut_mid_chunk_is_watched_again_without_an_error() {
    let s = setup(&[]).await;
    let uri = "k8s-events://watch/configmaps?namespace=default";
    let mut w = watch(&s, uri);
    w.event("watch.subscribed", "cm").await;
    s.api.wait("a watch", |a| a.watches() == 1).await;
    s.api
        .cut_watches_and(|gap| gap.put("", "default", "meanwhile", json!({})));
    assert_eq!(
        lines_until(&mut w, "meanwhile").await,
        ["ADDED default/meanwhile"]
    );
    let events = event_log(&s, uri).await;
    assert!(
        events.iter().all(|e| e["type"] != "ERROR"),
        "a cut connection is an end, not an error: {events:?}"
    );
    assert_eq!(watch_requests(&s.api), 2);
    w.terminate().await;
}

#[tokio::test]
async fn refused_credentials_are_minted_again_by_the_exec_plugin() {
    // The plugin prints whatever token the file holds; the server starts refusing the first
    // one. The client is built again (the plugin run again) and the watch carries on.
    let api = FakeApi::start().await;
    api.require_token("t1");
    let dir = TempDir::new("k8s-exec-401");
    let tok = dir.path().join("tok");
    std::fs::write(&tok, "t1").unwrap();
    let kc = exec_kubeconfig(&api, &dir, &format!("cat {}", tok.display()));
    let s = setup_on(api, dir, &kc, &[]).await;
    let uri = "k8s-events://watch/configmaps?namespace=default";
    let mut w = watch(&s, uri);
    w.event("watch.subscribed", "cm").await;
    s.api.wait("a watch", |a| a.watches() == 1).await;
    std::fs::write(&tok, "t2").unwrap();
    s.api.require_token("t2");
    s.api
        .drop_watches_and(|gap| gap.put("", "default", "later", json!({})));
    let lines = lines_until(&mut w, "later").await;
    assert_eq!(
        lines.last().map(String::as_str),
        Some("ADDED default/later")
    );
    assert!(
        lines[..lines.len() - 1].iter().all(|l| l.contains("401")),
        "only the refusals came before it: {lines:?}"
    );
    assert_eq!(s.api.tokens().last().map(String::as_str), Some("t2"));
    w.terminate().await;
}

#[tokio::test]
async fn a_context_in_the_uri_picks_its_namespace() {
    let api = FakeApi::start().await;
    let dir = TempDir::new("k8s-context");
    let kc = dir.path().join("kubeconfig");
    std::fs::write(
        &kc,
        json!({"apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": api.url}}],
            "users": [{"name": "fake", "user": {}}],
            "contexts": [
                {"name": "fake", "context": {"cluster": "fake", "user": "fake", "namespace": "default"}},
                {"name": "team", "context": {"cluster": "fake", "user": "fake", "namespace": "team-a"}}],
            "current-context": "fake"})
        .to_string(),
    )
    .unwrap();
    let s = setup_on(api, dir, &kc, &[]).await;
    let mut w = watch(&s, "k8s-events://watch/configmaps?context=team");
    w.event("watch.subscribed", "cm").await;
    s.api.wait("a watch", |a| a.watches() == 1).await;
    assert!(
        s.api.requests().iter().any(
            |r| r.starts_with("GET /api/v1/namespaces/team-a/configmaps?")
                && r.contains("watch=true")
        ),
        "the context's namespace: {:?}",
        s.api.requests()
    );
    s.api.put("", "default", "not-mine", json!({}));
    s.api.put("", "team-a", "mine", json!({}));
    assert_eq!(lines_until(&mut w, "mine").await, ["ADDED team-a/mine"]);
    // A context the kubeconfig lacks is refused, naming it.
    let c = crate::watch::memo_client(&s.k8s.http_url()).await;
    let err = c
        .read_resource(rmcp::model::ReadResourceRequestParams::new(
            "k8s-events://watch/configmaps?context=nope",
        ))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("no context nope"), "{err}");
    w.terminate().await;
}

/// `?metadata=true`: the list and the watch ask the API for PartialObjectMetadata (each the
/// form that fits it), and the ring keeps each object's metadata alone, named as its type;
/// whole objects (a server that ignores the request, `--watch-via kubectl`) are cut down.
#[tokio::test]
async fn a_metadata_watch_asks_for_metadata_and_keeps_no_more() {
    for (case, extra, whole_only) in [
        ("the API, metadata forms", &[][..], false),
        ("the API, a server that sends whole objects", &[][..], true),
        (
            "--watch-via kubectl",
            &["--watch-via", "kubectl"][..],
            false,
        ),
    ] {
        let s = setup(extra).await;
        if whole_only {
            s.api.whole_objects_only();
        }
        s.api
            .put("root:app", "default", "old", json!({"secret": "x"}));
        let uri = "kcp-events://watch/root:app/configmaps?namespace=*&metadata=true";
        let mut w = watch(&s, uri);
        w.event("watch.subscribed", "cm").await;
        s.api.wait("a watch", |a| a.watches() == 1).await;
        s.api.put("root:app", "default", "cm1", json!({"a": "1"}));
        assert_eq!(
            lines_until(&mut w, "cm1").await,
            ["ADDED default/cm1"],
            "{case}"
        );
        s.api.delete("root:app", "default", "cm1");
        assert_eq!(
            lines_until(&mut w, "cm1").await,
            ["DELETED default/cm1"],
            "{case}"
        );
        if extra.is_empty() {
            // Each request asked the form that fits it.
            let asked: Vec<(String, String)> = s
                .api
                .requests()
                .into_iter()
                .zip(s.api.accepts())
                .filter(|(r, _)| r.contains("/configmaps?"))
                .collect();
            assert!(asked.len() >= 2, "{case}: {asked:?}");
            for (r, accept) in &asked {
                let want = if r.contains("watch=true") {
                    "as=PartialObjectMetadata;"
                } else {
                    "as=PartialObjectMetadataList;"
                };
                assert!(accept.contains(want), "{case}: {r} asked {accept}");
            }
        }
        let c = crate::watch::memo_client(&s.k8s.http_url()).await;
        let (ring, _) = read_json(&c, uri).await;
        let events = ring["events"].as_array().unwrap();
        assert_eq!(events.len(), 2, "{case}: {ring}");
        for e in events {
            let o = &e["object"];
            assert_eq!(o["kind"], "ConfigMap", "{case}: named as its type: {o}");
            assert_eq!(o["apiVersion"], "v1", "{case}: {o}");
            assert!(o.get("data").is_none(), "{case}: metadata alone: {o}");
            assert_eq!(o["metadata"]["name"], "cm1", "{case}");
        }
        if !whole_only && extra.is_empty() {
            // A bad value says what it takes.
            let err = c
                .read_resource(rmcp::model::ReadResourceRequestParams::new(
                    "kcp-events://watch/root:app/configmaps?metadata=yes".to_owned(),
                ))
                .await
                .unwrap_err();
            assert!(err.to_string().contains("metadata=true"), "{err}");
        }
        w.terminate().await;
    }
}
