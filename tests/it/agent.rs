//! `herald agent` end to end against a scripted model (tests/it/fake_model.rs) and a real
//! `herald memo`: a watch started by the model's code, a notice turn whose message is exactly
//! the `<watch-event>` block and its instruction, `NO_REPLY` published nowhere; and the chat
//! client's retries and errors.

use std::process::Stdio;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::fake_model::{FakeModel, Step};
use crate::support::*;
use herald::agent::model::NOTICE_INSTRUCTION;
use herald::agent::model::{Message, Model, ModelError, Progress};
use herald::agent::openai::{ChatClient, ChatConfig};

#[tokio::test]
async fn a_watch_the_model_starts_turns_each_change_into_one_notice_turn() {
    let memo = Server::spawn(&["--store", ":memory:", "memo", "--http", "127.0.0.1:0"]).await;
    let model = FakeModel::start(vec![
        Step::Code("watch_start(name=\"notes\", uri=\"memo://notes\")".into()),
        Step::Text("Watching your notes.".into()),
        Step::Text("NO_REPLY".into()),
    ])
    .await;
    let dir = TempDir::new("agent");
    let session = dir.path().join("session.jsonl");
    let mut child = tokio::process::Command::new(bin())
        .args([
            "--store",
            ":memory:",
            "agent",
            "--mcp-http",
            &memo.http_url(),
            "--model-url",
            &model.url,
            "--model",
            "scripted",
            "--debounce-ms",
            "0",
            "--session",
            session.to_str().unwrap(),
        ])
        .env_remove("HERALD_MODEL_KEY")
        .env("HERALD_MODEL_KEY", "sk-secret-7d1f")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
    // Its log lines, read as they come (an unread pipe would stall it).
    let (ltx, mut lrx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let mut err = BufReader::new(child.stderr.take().unwrap()).lines();
    tokio::spawn(async move {
        while let Ok(Some(l)) = err.next_line().await {
            let _ = ltx.send(l);
        }
    });
    stdin
        .write_all(b"watch my notes and tell me what changes\n")
        .await
        .unwrap();
    stdin.flush().await.unwrap();
    let reply = tokio::time::timeout(WAIT, out.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(reply, "Watching your notes.");
    let bodies = model.bodies();
    assert_eq!(bodies[0]["max_tokens"], 8192, "max_tokens is always sent");
    assert_eq!(bodies[0]["stream"], true);
    assert_eq!(bodies[0]["model"], "scripted");
    assert_eq!(bodies[0]["tools"][0]["function"]["name"], "run_code");
    assert_eq!(
        model.headers(0)["authorization"].to_str().unwrap(),
        "Bearer sk-secret-7d1f"
    );
    let system = bodies[0]["messages"][0]["content"].as_str().unwrap();
    assert!(system.contains("memo://notes"), "{system}");
    // The tool's answer went back to the model.
    let tool = bodies[1]["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(tool["role"], "tool", "{tool}");
    assert_eq!(tool["tool_call_id"], "call_1");

    // A change from outside: one notice turn, the block and the instruction as its message.
    let c = crate::watch::memo_client(&memo.http_url()).await;
    call(&c, "memo_set", json!({"key": "k", "value": 1})).await;
    model.until_asked(3).await;
    let third = &model.bodies()[2];
    let last = third["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last["role"], "user");
    assert_eq!(
        last["content"],
        format!(
            "<watch-event name=\"notes\" uri=\"memo://notes\">\nADDED k = 1\n</watch-event>\n{NOTICE_INSTRUCTION}"
        )
    );
    // NO_REPLY: nothing on stdout; the log says so, and holds the notice as a monitor record.
    drop(stdin);
    // The log line comes after the session record.
    let mut stderr = String::new();
    tokio::time::timeout(WAIT, async {
        while let Some(l) = lrx.recv().await {
            stderr.push_str(&l);
            stderr.push('\n');
            if l.contains("reply.suppressed") {
                return;
            }
        }
        panic!("the agent ended before it suppressed the reply");
    })
    .await
    .expect("the suppressed reply is logged");
    let log = std::fs::read_to_string(&session).unwrap();
    assert!(log.contains("reply.suppressed"), "{log}");
    let records: Vec<Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let monitor = records.iter().find(|r| r["type"] == "monitor").unwrap();
    assert_eq!(monitor["task_id"], "watch-notes");
    assert_eq!(monitor["description"], "watch notes memo://notes");
    assert_eq!(
        records.iter().filter(|r| r["type"] == "user").count(),
        1,
        "only what was typed is a user record"
    );
    assert!(!log.contains("sk-secret"), "the key never reaches the log");
    let _ = child.start_kill();
    let _ = child.wait().await;
    while let Ok(l) = lrx.try_recv() {
        stderr.push_str(&l);
    }
    assert!(!stderr.contains("sk-secret"), "{stderr}");
    // Nothing was printed for the notice.
    assert_eq!(
        tokio::time::timeout(WAIT, out.next_line())
            .await
            .unwrap()
            .unwrap(),
        None
    );
}

#[tokio::test]
async fn the_chat_client_retries_a_5xx_and_names_the_url_when_nothing_answers() {
    let model = FakeModel::start(vec![
        Step::Status(500),
        Step::Status(429),
        Step::Text("hello".into()),
    ])
    .await;
    let client = |url: &str, retries| {
        ChatClient::new(ChatConfig {
            url: url.to_owned(),
            model: "m".into(),
            key: None,
            max_tokens: 64,
            timeout: std::time::Duration::from_secs(20),
            retries,
        })
        .unwrap()
    };
    let (mut text, mut retries) = (String::new(), Vec::new());
    let r = client(&model.url, 3)
        .complete(&[Message::user("hi")], &[], &mut |p| match p {
            Progress::Text(t) => text.push_str(t),
            Progress::Retrying { attempt, of, .. } => retries.push((attempt, of)),
        })
        .await
        .unwrap();
    assert_eq!(r.content, "hello");
    assert_eq!(text, "hello", "streamed as it came");
    assert_eq!(retries, [(1, 4), (2, 4)], "each retry said");
    assert_eq!(model.bodies().len(), 3);
    assert_eq!(model.bodies()[2]["max_tokens"], 64);

    // Nothing listens there: a clear error naming the URL.
    let gone = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let url = format!("http://{gone}/v1");
    let e = client(&url, 0)
        .complete(&[Message::user("hi")], &[], &mut |_| {})
        .await
        .unwrap_err();
    assert!(matches!(e, ModelError::Unreachable { .. }), "{e:?}");
    assert!(
        e.to_string().contains(&format!("{url}/chat/completions")),
        "{e}"
    );
    // A 500 that stays: the status and the URL.
    let down = FakeModel::start(vec![Step::Status(503), Step::Status(503)]).await;
    let e = client(&down.url, 1)
        .complete(&[Message::user("hi")], &[], &mut |_| {})
        .await
        .unwrap_err();
    assert!(e.to_string().contains("HTTP 503"), "{e}");
    // A model that never answers: the timeout, named with the URL.
    let hung = FakeModel::start(vec![Step::Hang]).await;
    let c = ChatClient::new(ChatConfig {
        url: hung.url.clone(),
        model: "m".into(),
        key: None,
        max_tokens: 64,
        timeout: std::time::Duration::from_millis(300),
        retries: 0,
    })
    .unwrap();
    let e = c
        .complete(&[Message::user("hi")], &[], &mut |_| {})
        .await
        .unwrap_err();
    assert!(matches!(e, ModelError::Timeout { .. }), "{e:?}");
    assert!(e.to_string().contains(&hung.url), "{e}");
}

/// `herald agent` on `memo` with a store and a session log under `dir`.
fn agent_cmd(
    memo: &Server,
    model: &FakeModel,
    dir: &std::path::Path,
    extra: &[&str],
) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(bin());
    cmd.args([
        "--store",
        dir.join("store.redb").to_str().unwrap(),
        "agent",
        "--mcp-http",
        &memo.http_url(),
        "--model-url",
        &model.url,
        "--debounce-ms",
        "0",
        "--session",
        dir.join("session.jsonl").to_str().unwrap(),
    ])
    .args(extra)
    .env_remove("HERALD_MODEL_KEY")
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .stderr(Stdio::null())
    .kill_on_drop(true);
    cmd
}

/// `--resume` continues the thread from the session log and restores the watches the session
/// left running; the restore notice is part of the first turn.
#[tokio::test]
async fn resume_restores_the_thread_and_the_watches() {
    let memo = Server::spawn(&["--store", ":memory:", "memo", "--http", "127.0.0.1:0"]).await;
    let dir = TempDir::new("agent-resume");
    let first = FakeModel::start(vec![
        Step::Code("watch_start(name=\"notes\", uri=\"memo://notes\")".into()),
        Step::Text("Watching.".into()),
    ])
    .await;
    let mut child = agent_cmd(&memo, &first, dir.path(), &[]).spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
    stdin.write_all(b"watch my notes\n").await.unwrap();
    stdin.flush().await.unwrap();
    let reply = tokio::time::timeout(WAIT, out.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(reply, "Watching.");
    let pid = child.id().unwrap().to_string();
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status();
    let st = tokio::time::timeout(WAIT, child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(st.success(), "{st}");

    let second = FakeModel::start(vec![
        Step::Text("NO_REPLY".into()),
        Step::Text("NO_REPLY".into()),
    ])
    .await;
    let mut child = agent_cmd(&memo, &second, dir.path(), &["--resume"])
        .spawn()
        .unwrap();
    let _stdin = child.stdin.take().unwrap();
    // The first turn: the earlier thread, then the restore notice.
    second.until_asked(1).await;
    let messages = second.bodies()[0]["messages"].as_array().unwrap().clone();
    let texts: Vec<String> = messages
        .iter()
        .map(|m| m["content"].as_str().unwrap_or("").to_owned())
        .collect();
    assert!(texts.iter().any(|t| t == "watch my notes"), "{texts:?}");
    assert!(texts.iter().any(|t| t == "Watching."), "{texts:?}");
    let restore = texts.last().unwrap();
    assert!(
        restore.contains("restored notes (memo://notes)") && restore.ends_with(NOTICE_INSTRUCTION),
        "{restore}"
    );
    // The restored watch runs: a change is the next turn.
    let c = crate::watch::memo_client(&memo.http_url()).await;
    call(&c, "memo_set", json!({"key": "after", "value": 2})).await;
    second.until_asked(2).await;
    let last = second.bodies()[1]["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert!(
        last["content"].as_str().unwrap().contains("ADDED after"),
        "{last}"
    );
}

/// `--slack`: a message addressed to the bot (through `herald slack` on the fake Slack) is an
/// input, and the model's reply is posted in its thread with `slack_post_message`.
#[tokio::test]
async fn in_slack_a_message_to_the_bot_is_answered_in_its_thread() {
    use crate::slack_fake::{APP_TOKEN, BOT_TOKEN, BOT_USER, FakeSlack, Kind};
    let fake = FakeSlack::start().await;
    fake.add_channel("C1", "general", Kind::Public);
    let url = fake.api_url();
    let slack = Server::spawn_env(
        &[
            "--store",
            ":memory:",
            "slack",
            "--http",
            "127.0.0.1:0",
            "--slack-api-url",
            &url,
        ],
        &[
            ("SLACK_APP_TOKEN", APP_TOKEN),
            ("SLACK_BOT_TOKEN", BOT_TOKEN),
            (
                "SLACK_EVENTS_ENCRYPTION_KEY",
                "8f2c6e1d4b7a9035c1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f1a2b3c4",
            ),
        ],
    )
    .await;
    fake.wait_until("herald's socket open", |s| s.sockets_open() == 1)
        .await;
    let model = FakeModel::start(vec![Step::Text("Hello from herald.".into())]).await;
    let mut child = tokio::process::Command::new(bin())
        .args([
            "--log-format",
            "json",
            "--store",
            ":memory:",
            "agent",
            "--slack",
            "--mcp-http",
            &slack.http_url(),
            "--model-url",
            &model.url,
        ])
        .env_remove("HERALD_MODEL_KEY")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap()).lines();
    tokio::time::timeout(WAIT, async {
        while let Some(l) = err.next_line().await.unwrap() {
            if l.contains("following the Slack inbox") {
                return;
            }
        }
        panic!("the agent ended before it followed the inbox");
    })
    .await
    .expect("the agent follows the inbox in time");
    tokio::spawn(async move { while let Ok(Some(_)) = err.next_line().await {} });
    let ts = fake.post("C1", "U1", &format!("<@{BOT_USER}> hello"));
    model.until_asked(1).await;
    let input = model.bodies()[0]["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(
        input["content"],
        format!("[Slack, <@U1> in C1] <@{BOT_USER}> hello"),
        "{input}"
    );
    fake.wait_until("the reply posted", |s| s.calls("chat.postMessage") == 1)
        .await;
    let posted = fake.requests("chat.postMessage");
    let p = format!("{:?}", posted[0]);
    assert!(
        p.contains("C1") && p.contains("Hello from herald.") && p.contains(&ts),
        "{p}"
    );
    let _ = child.start_kill();
}

/// A model that is not there is said at start, with what to do, and the agent exits 1; no
/// model at all is bad usage naming HERALD_MODEL_URL.
#[tokio::test]
async fn a_missing_model_is_said_at_start() {
    init();
    let memo = Server::spawn(&["--store", ":memory:", "memo", "--http", "127.0.0.1:0"]).await;
    let port = closed_port();
    let out = tokio::process::Command::new(bin())
        .args([
            "--store",
            ":memory:",
            "agent",
            "--mcp-http",
            &memo.http_url(),
        ])
        .args(["--model-url", &format!("http://127.0.0.1:{port}/v1")])
        .stdin(Stdio::null())
        .env_remove("HERALD_MODEL_URL")
        .output()
        .await
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("no model answered at"), "{err}");
    assert!(err.contains("--model-url"), "{err}");
    let out = tokio::process::Command::new(bin())
        .args([
            "--store",
            ":memory:",
            "agent",
            "--mcp-http",
            &memo.http_url(),
        ])
        .stdin(Stdio::null())
        .env_remove("HERALD_MODEL_URL")
        .output()
        .await
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{err}");
    assert!(err.contains("HERALD_MODEL_URL"), "{err}");
}

/// `--slack` with no server that has a Slack source is refused at start, saying what to add,
/// instead of retrying an unknown resource forever.
#[tokio::test]
async fn slack_input_without_a_slack_source_is_refused() {
    init();
    let memo = Server::spawn(&["--store", ":memory:", "memo", "--http", "127.0.0.1:0"]).await;
    let out = tokio::process::Command::new(bin())
        .args([
            "--store",
            ":memory:",
            "agent",
            "--slack",
            "--mcp-http",
            &memo.http_url(),
        ])
        .args(["--model-url", "http://127.0.0.1:1/v1"])
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{err}");
    assert!(
        err.contains("--slack") && err.contains("herald slack"),
        "{err}"
    );
}

/// Piped, a question the model failed to answer makes herald agent exit 1 (a script must see
/// it), after saying why; one that was answered exits 0.
#[tokio::test]
async fn a_piped_question_with_no_answer_exits_1() {
    init();
    let memo = Server::spawn(&["--store", ":memory:", "memo", "--http", "127.0.0.1:0"]).await;
    for (step, code) in [(Step::Status(400), 1), (Step::Text("Hello.".into()), 0)] {
        let model = FakeModel::start(vec![step]).await;
        let mut child = tokio::process::Command::new(bin())
            .args([
                "--store",
                ":memory:",
                "agent",
                "--mcp-http",
                &memo.http_url(),
            ])
            .args(["--model-url", &model.url])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        tokio::io::AsyncWriteExt::write_all(&mut stdin, b"hello\n")
            .await
            .unwrap();
        drop(stdin);
        let out = tokio::time::timeout(WAIT, child.wait_with_output())
            .await
            .expect("it ends with its input")
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{err}");
        if code == 1 {
            assert!(err.contains("a question got no answer"), "{err}");
        }
    }
}

/// On a terminal, a failing model's retries are said on the spinner's line, redrawn in place,
/// not as log lines written through it; the answer follows once the model answers.
#[tokio::test]
async fn on_a_terminal_retries_are_said_on_the_spinner_line() {
    init();
    let memo = Server::spawn(&["--store", ":memory:", "memo", "--http", "127.0.0.1:0"]).await;
    let model = FakeModel::start(vec![
        Step::Status(503),
        Step::Status(503),
        Step::Text("Hello.".into()),
    ])
    .await;
    let (master, slave) = crate::watch::pty();
    let mut child = tokio::process::Command::new(bin())
        .args([
            "--store",
            ":memory:",
            "agent",
            "--mcp-http",
            &memo.http_url(),
        ])
        .args(["--model-url", &model.url])
        .env_remove("NO_COLOR")
        .stdin(Stdio::piped())
        .stdout(Stdio::from(slave.try_clone().unwrap()))
        .stderr(Stdio::from(slave))
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // The screen, read raw on a thread of its own until the answer is on it.
    let (tx, rx) = tokio::sync::oneshot::channel::<String>();
    std::thread::spawn(move || {
        use std::io::Read as _;
        let (mut master, mut screen, mut buf) = (master, Vec::new(), [0u8; 4096]);
        while let Ok(n) = master.read(&mut buf) {
            if n == 0 {
                break;
            }
            screen.extend_from_slice(&buf[..n]);
            if String::from_utf8_lossy(&screen).contains("Hello.") {
                break;
            }
        }
        let _ = tx.send(String::from_utf8_lossy(&screen).into_owned());
    });
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"hi\n").await.unwrap();
    let screen = tokio::time::timeout(WAIT, rx)
        .await
        .expect("the answer in time")
        .unwrap();
    drop(stdin);
    assert!(screen.contains("Hello."), "{screen:?}");
    for attempt in ["attempt 2 of", "attempt 3 of"] {
        assert!(
            screen.contains(&format!(
                "\r\x1b[2K⠿ thinking… (the model failed (HTTP 503); trying again, {attempt}"
            )),
            "the retry is said on the spinner's line: {screen:?}"
        );
    }
    let spinning = &screen[screen.find("thinking…").expect("a spinner")..];
    assert!(
        !spinning.contains("INFO") && !spinning.contains("retrying"),
        "no log line is written through the spinner: {screen:?}"
    );
    let _ = tokio::time::timeout(WAIT, child.wait()).await;
}
