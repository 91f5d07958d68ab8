//! `herald up --config`: roles in one process behind one gateway endpoint, an external
//! server beside them, a watch client going through the gateway; the loopback rule;
//! `herald check` and `--print-config` on the same file.

use std::process::Stdio;
use std::time::Duration;

use rmcp::model::ListToolsResult;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::support::*;

pub(crate) struct Up {
    pub(crate) child: tokio::process::Child,
    pub(crate) url: String,
    /// The admin address, `HOST:PORT`.
    pub(crate) admin: String,
    /// The whole `listening` line.
    pub(crate) listening: Value,
    notices: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

/// Starts `herald up --config CFG EXTRA` (admin on a free port) and waits for its gateway's
/// listening line.
pub(crate) async fn up(cfg: &std::path::Path, extra: &[&str]) -> Up {
    up_on(":memory:", cfg, extra).await
}

/// [`up`] on the store `store`.
pub(crate) async fn up_on(store: &str, cfg: &std::path::Path, extra: &[&str]) -> Up {
    let args: Vec<&str> = ["--admin", "127.0.0.1:0"]
        .into_iter()
        .chain(extra.iter().copied())
        .collect();
    let (mut child, outcome) = up_until_listening_on(store, cfg, &args).await;
    let (listening, _) = outcome.expect("herald up says where it listens");
    let notices = BufReader::new(child.stdout.take().unwrap()).lines();
    Up {
        child,
        url: listening["http_url"].as_str().unwrap().to_owned(),
        admin: listening["admin"].as_str().unwrap_or_default().to_owned(),
        listening,
        notices,
    }
}

impl Up {
    /// The next notice on stdout.
    pub(crate) async fn notice(&mut self) -> Value {
        let l = tokio::time::timeout(WAIT, self.notices.next_line())
            .await
            .expect("a notice in time")
            .unwrap()
            .expect("herald up still runs");
        serde_json::from_str(&l).unwrap()
    }
}

fn config(dir: &TempDir, data: &std::path::Path, listen: &str) -> std::path::PathBuf {
    let cfg = dir.path().join("up.toml");
    std::fs::write(
        &cfg,
        format!(
            "[listen]\nhttp = \"{listen}\"\nquic = \"\"\n\n\
             [memo]\n\n\
             [file]\nroots = [\"data\"]\n\n\
             [[slug]]\nname = \"ext\"\nstdio = \"{} --store :memory: memo\"\n\n\
             [[watch]]\nname = \"notes\"\nuri = \"memo+memo://notes\"\n\n\
             [[watch]]\nname = \"files\"\nuri = \"{}\"\n\n\
             [[watch]]\nname = \"ext-notes\"\nuri = \"ext+memo://notes\"\n",
            bin(),
            herald::source::file::events_uri(data, true),
        ),
    )
    .unwrap();
    cfg
}

#[tokio::test]
async fn roles_and_an_external_server_share_one_endpoint_and_the_watch_sees_each() {
    let dir = TempDir::new("up-config");
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let data = std::fs::canonicalize(&data).unwrap();
    let cfg = config(&dir, &data, "127.0.0.1:0");
    let mut up = up(&cfg, &[]).await;

    // One endpoint: the in-process roles' tools and resources, and the external server's.
    let conn = Memo {
        target: herald::transport::target::Target::Http(up.url.clone()),
        trust: Default::default(),
        server: None,
    }
    .client()
    .await;
    let tools: ListToolsResult = conn.list_tools(None).await.unwrap();
    let names: Vec<&str> = tools.tools.iter().map(|t| t.name.as_ref()).collect();
    assert!(names.contains(&"memo__memo_set"), "{names:?}");
    assert!(names.contains(&"ext__memo_set"), "{names:?}");
    let resources = conn.list_resources(None).await.unwrap();
    let uris: Vec<&str> = resources.resources.iter().map(|r| r.uri.as_str()).collect();
    let files = herald::source::file::events_uri(&data, true);
    assert!(uris.contains(&files.as_str()), "{uris:?}");
    assert!(
        uris.contains(&"memo+memo://notes") && uris.contains(&"ext+memo://notes"),
        "{uris:?}"
    );

    // A change in each reaches the watch client (loopback, no token: it just works). The
    // watches start after the listening line: keep changing until each has said so.
    let mut seen = std::collections::BTreeSet::new();
    let mut i = 0;
    while seen.len() < 3 {
        assert!(i < 50, "only {seen:?} reached the watch");
        call(&conn, "memo__memo_set", json!({"key": "k", "value": i})).await;
        call(&conn, "ext__memo_set", json!({"key": "k", "value": i})).await;
        std::fs::write(data.join(format!("f{i}.txt")), "x").unwrap();
        i += 1;
        // Each round produces notices; read what came for up to the round's batch.
        let n = tokio::time::timeout(Duration::from_secs(5), up.notice()).await;
        if let Ok(n) = n {
            seen.insert(n["watch"].as_str().unwrap().to_owned());
        }
    }
    assert_eq!(
        seen,
        ["ext-notes", "files", "notes"].map(str::to_owned).into()
    );

    // The in-process roles run tasks, relayed by the gateway under `memo__<id>`.
    let declared = || {
        let mut o = rmcp::service::PeerRequestOptions::no_options();
        o.meta = Some(herald::transport::client::tasks_meta(None));
        o
    };
    let call = rmcp::model::ClientRequest::CallToolRequest(rmcp::model::Request::new(
        rmcp::model::CallToolRequestParams::new("memo__memo_wait")
            .with_arguments(args(json!({"key": "t"}))),
    ));
    let created = conn
        .send_cancellable_request(call, declared())
        .await
        .unwrap()
        .await_response()
        .await
        .unwrap();
    let rmcp::model::ServerResult::CreateTaskResult(created) = created else {
        panic!("a task: {created:?}")
    };
    let id = created.task.task_id;
    assert!(id.starts_with("memo__"), "{id}");
    let get = rmcp::model::ClientRequest::GetTaskRequest(rmcp::model::GetTaskRequest::new(
        rmcp::model::GetTaskParams::new(id.clone()),
    ));
    let got = conn
        .send_cancellable_request(get, declared())
        .await
        .unwrap()
        .await_response()
        .await
        .unwrap();
    let rmcp::model::ServerResult::GetTaskResult(got) = got else {
        panic!("the task: {got:?}")
    };
    assert_eq!(got.task.task.task_id, id);
    let _ = up.child.start_kill();
}

#[tokio::test]
async fn no_token_off_loopback_refuses_to_start_and_check_names_the_line() {
    let dir = TempDir::new("up-refuse");
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let cfg = config(&dir, &data, "0.0.0.0:0");
    let out = herald([
        "--store",
        ":memory:",
        "up",
        "--config",
        cfg.to_str().unwrap(),
    ])
    .await;
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("0.0.0.0:0") && err.contains("[[token]]"),
        "{err}"
    );
    let out = herald(["check", cfg.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(64));

    std::fs::write(
        &cfg,
        "[memo]\n\n[file]\nroots = [\"data\"]\ncolour = \"red\"\n",
    )
    .unwrap();
    let out = herald(["check", cfg.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 5") && err.contains("colour"), "{err}");

    std::fs::write(&cfg, "[memo]\n").unwrap();
    let out = herald(["check", cfg.to_str().unwrap()]).await;
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("roles memo"));
    let out = herald(["up", "--config", cfg.to_str().unwrap(), "--print-config"]).await;
    assert!(out.status.success(), "{out:?}");
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(printed.contains("http = \"127.0.0.1:8750\""), "{printed}");
    assert!(printed.contains("ring_capacity = 256"), "{printed}");
    assert!(printed.contains("max_notes_bytes = 2097152"), "{printed}");
}

/// Starts `herald up --config CFG ARGS` (stdout piped: the notices) and reads its stderr
/// until the gateway's listening line (`Ok((that line, the lines before it))`, stderr drained
/// from then on) or its exit (`Err(all of stderr)`).
async fn up_until_listening(
    cfg: &std::path::Path,
    args: &[&str],
) -> (tokio::process::Child, Result<(Value, Vec<String>), String>) {
    up_until_listening_on(":memory:", cfg, args).await
}

async fn up_until_listening_on(
    store: &str,
    cfg: &std::path::Path,
    args: &[&str],
) -> (tokio::process::Child, Result<(Value, Vec<String>), String>) {
    init();
    let mut child = tokio::process::Command::new(bin())
        .args(["--log-format", "json", "--store", store, "up", "--config"])
        .arg(cfg)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = Vec::new();
    let outcome = tokio::time::timeout(WAIT, async {
        while let Some(l) = err.next_line().await.unwrap() {
            if let Ok(v) = serde_json::from_str::<Value>(&l)
                && v["event"] == "listening"
            {
                return Ok((v, std::mem::take(&mut seen)));
            }
            seen.push(l);
        }
        Err(seen.join("\n"))
    })
    .await
    .expect("herald up listens or exits in time");
    tokio::spawn(async move { while let Ok(Some(_)) = err.next_line().await {} });
    (child, outcome)
}

#[tokio::test]
async fn a_taken_admin_address_stops_the_start_only_when_it_was_chosen() {
    let dir = TempDir::new("up-admin-taken");
    let cfg = dir.path().join("up.toml");
    std::fs::write(
        &cfg,
        "[listen]\nhttp = \"127.0.0.1:0\"\nquic = \"\"\n\n[memo]\n",
    )
    .unwrap();

    // Chosen (--admin): a clear usage error naming the address.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let (mut child, outcome) = up_until_listening(&cfg, &["--admin", &addr]).await;
    let err = outcome.expect_err("herald up refuses a taken --admin address");
    assert!(
        err.contains(&addr) && err.contains("cannot listen"),
        "{err}"
    );
    assert_eq!(child.wait().await.unwrap().code(), Some(64));

    // The default (127.0.0.1:8759), taken by this test or by another herald on the host: a
    // warning, and the appliance serves anyway.
    let _default = std::net::TcpListener::bind(herald::app::admin::DEFAULT_ADMIN);
    let (mut child, outcome) = up_until_listening(&cfg, &[]).await;
    let (_, before) = outcome.expect("herald up starts without its default admin address");
    assert!(
        before
            .iter()
            .any(|l| l.contains("running without the admin endpoints")),
        "{before:?}"
    );
    let _ = child.start_kill();
}

#[tokio::test]
async fn every_configured_watch_runs_past_the_watch_clients_own_cap() {
    const WATCHES: usize = 70;
    let dir = TempDir::new("up-many-watches");
    let cfg = dir.path().join("up.toml");
    let root = dir.path().join("root");
    let mut text = format!(
        "[listen]\nhttp = \"127.0.0.1:0\"\nquic = \"\"\n\n[memo]\n\n[file]\nroots = [{:?}]\n",
        root.display().to_string()
    );
    // More than `herald watch`'s default --max-watches (5), more listen streams than one
    // outside connection may hold (64), and more URIs of one slug than the gateway shares
    // with an outside server (48): the in-process pipes carry them all.
    for i in 0..WATCHES {
        let uri = if i < 10 {
            "memo://notes".to_owned()
        } else {
            let d = root.join(format!("d{i}"));
            std::fs::create_dir_all(&d).unwrap();
            herald::source::file::events_uri(&std::fs::canonicalize(&d).unwrap(), false)
        };
        text.push_str(&format!("\n[[watch]]\nname = \"w{i}\"\nuri = {uri:?}\n"));
    }
    std::fs::write(&cfg, text).unwrap();
    let mut up = up(&cfg, &[]).await;
    // The admin address lists the watches once every one has started (or failed).
    let client = herald::transport::web::http_client(|b| b).unwrap();
    let status = tokio::time::timeout(WAIT, async {
        loop {
            if let Ok(r) = client
                .get(format!("http://{}/status", up.admin))
                .send()
                .await
                && let Ok(v) = r.json::<Value>().await
                && v["watches"].as_array().is_some_and(|w| !w.is_empty())
            {
                return v;
            }
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the watches are listed in time");
    let watches = status["watches"].as_array().unwrap();
    assert_eq!(watches.len(), WATCHES);
    let failed: Vec<&Value> = watches.iter().filter(|w| w["state"] != "running").collect();
    assert!(failed.is_empty(), "{failed:?}");
    // The watch client's streams are counted, on its row and in all.
    let row = status["roles"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "watch")
        .expect("the watch client's row");
    assert!(row["listens"].as_u64().unwrap() > 0, "{status}");
    assert!(status["listens"].as_u64().unwrap() >= row["listens"].as_u64().unwrap());
    // And a change reaches them.
    let c = crate::watch::memo_client(&up.url).await;
    call(&c, "memo__memo_set", json!({"key": "k", "value": 1})).await;
    let n = up.notice().await;
    assert!(n["watch"].as_str().unwrap().starts_with('w'), "{n}");
    let _ = up.child.start_kill();
}

/// `herald up --model-url`: the agent runs in the appliance, and the watch client's notices
/// are its turns.
#[tokio::test]
async fn with_a_model_the_agent_takes_the_notices_as_turns() {
    let dir = TempDir::new("up-agent");
    let cfg = dir.path().join("up.toml");
    std::fs::write(
        &cfg,
        "[listen]\nhttp = \"127.0.0.1:0\"\nquic = \"\"\n\n[memo]\n\n\
         [[watch]]\nname = \"notes\"\nuri = \"memo+memo://notes\"\n",
    )
    .unwrap();
    let model = crate::fake_model::FakeModel::start(vec![]).await;
    let mut up = up(&cfg, &["--model-url", &model.url]).await;
    let conn = Memo {
        target: herald::transport::target::Target::Http(up.url.clone()),
        trust: Default::default(),
        server: None,
    }
    .client()
    .await;
    // The watch starts after the listening line: change until a notice reaches the model.
    let mut i = 0;
    loop {
        call(&conn, "memo__memo_set", json!({"key": "k", "value": i})).await;
        i += 1;
        if tokio::time::timeout(Duration::from_secs(5), model.until_asked(1))
            .await
            .is_ok()
        {
            break;
        }
        assert!(i < 10, "no notice reached the model");
    }
    let body = &model.bodies()[0];
    let last = body["messages"].as_array().unwrap().last().unwrap().clone();
    assert!(
        last["content"]
            .as_str()
            .unwrap()
            .starts_with("<watch-event name=\"notes\" uri=\"memo+memo://notes\">"),
        "{last}"
    );
    assert!(
        body["messages"][0]["content"]
            .as_str()
            .unwrap()
            .contains("memo__memo_set"),
        "the system prompt names the gateway's tools"
    );
    let _ = up.child.start_kill();
}
