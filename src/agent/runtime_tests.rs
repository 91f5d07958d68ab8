use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::{Notify, mpsc};

use super::*;
use crate::agent::model::{ModelError, Progress, Reply, ToolCall};

const WAIT: Duration = Duration::from_secs(10);

/// A model that answers from a script, records what it was sent, and may hold an answer
/// until released.
#[derive(Default)]
struct Scripted {
    answers: Mutex<VecDeque<Result<Reply, ModelError>>>,
    seen: Mutex<Vec<Vec<Message>>>,
    /// Set: each request waits for a release first.
    gate: Option<Arc<Notify>>,
    asked: Notify,
}

impl Scripted {
    fn new(answers: Vec<Result<Reply, ModelError>>) -> Arc<Scripted> {
        Arc::new(Scripted {
            answers: Mutex::new(answers.into()),
            ..Scripted::default()
        })
    }

    fn seen(&self) -> Vec<Vec<Message>> {
        self.seen.lock().unwrap().clone()
    }
}

fn text(t: &str) -> Result<Reply, ModelError> {
    Ok(Reply {
        content: t.into(),
        ..Reply::default()
    })
}

fn calls(code: &str) -> Result<Reply, ModelError> {
    Ok(Reply {
        tool_calls: vec![ToolCall::new(
            "c1",
            "run_code",
            json!({"code": code}).to_string(),
        )],
        ..Reply::default()
    })
}

#[async_trait]
impl Model for Scripted {
    async fn complete(
        &self,
        messages: &[Message],
        _tools: &[ToolSpec],
        progress: &mut (dyn for<'s> FnMut(Progress<'s>) + Send),
    ) -> Result<Reply, ModelError> {
        self.seen.lock().unwrap().push(messages.to_vec());
        self.asked.notify_waiters();
        if let Some(g) = &self.gate {
            g.notified().await;
        }
        let a = self
            .answers
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or_else(|| text("(script ended)"));
        if let Ok(r) = &a {
            progress(Progress::Text(&r.content));
        }
        a
    }
}

/// Records what was published.
#[derive(Default)]
struct Recorded {
    published: Mutex<Vec<(ReplyTo, String)>>,
    suppressed: Mutex<usize>,
    changed: Notify,
}

#[async_trait]
impl Channel for Recorded {
    async fn publish(&self, to: &ReplyTo, text: &str) {
        self.published
            .lock()
            .unwrap()
            .push((to.clone(), text.to_owned()));
        self.changed.notify_waiters();
    }

    fn suppressed(&self) {
        *self.suppressed.lock().unwrap() += 1;
        self.changed.notify_waiters();
    }
}

impl Recorded {
    async fn until(&self, f: impl Fn(&Recorded) -> bool) {
        tokio::time::timeout(WAIT, async {
            loop {
                let n = self.changed.notified();
                tokio::pin!(n);
                n.as_mut().enable();
                if f(self) {
                    return;
                }
                n.await;
            }
        })
        .await
        .expect("in time");
    }
}

/// Echoes the code it was given.
struct Echo;

#[async_trait]
impl CodeRunner for Echo {
    async fn run(&self, code: &str) -> String {
        format!("ran {code}")
    }
}

fn agent(model: Arc<Scripted>, channel: Arc<Recorded>, log: SessionLog) -> Agent {
    Agent {
        model,
        code: Arc::new(Echo),
        channel,
        log,
        default_reply: ReplyTo::Slack {
            channel: "C-default".into(),
            thread_ts: None,
        },
        thread: vec![Message::system("sys")],
        done_when: None,
    }
}

fn input(t: &str, ch: &str) -> Event {
    Event::Input {
        text: t.into(),
        reply_to: ReplyTo::Slack {
            channel: ch.into(),
            thread_ts: None,
        },
    }
}

fn notice(n: u32) -> Event {
    Event::Notice {
        watch: "notes".into(),
        uri: "memo://notes".into(),
        block: format!(
            "<watch-event name=\"notes\" uri=\"memo://notes\">\nMODIFIED k{n}\n</watch-event>"
        ),
    }
}

#[tokio::test]
async fn an_input_runs_the_model_its_code_and_replies_where_it_came_from() {
    let model = Scripted::new(vec![
        calls("watch_start(name='n', uri='memo://notes')"),
        text("watching"),
    ]);
    let ch = Arc::new(Recorded::default());
    let (tx, rx) = mpsc::channel(16);
    let run = tokio::spawn(agent(model.clone(), ch.clone(), SessionLog::none()).run(rx));
    tx.send(input("watch my notes", "C1")).await.unwrap();
    ch.until(|c| !c.published.lock().unwrap().is_empty()).await;
    let published = ch.published.lock().unwrap().clone();
    assert_eq!(
        published,
        [(
            ReplyTo::Slack {
                channel: "C1".into(),
                thread_ts: None
            },
            "watching".to_owned()
        )]
    );
    // The second request carries the tool's result for the model to read.
    let seen = model.seen();
    assert_eq!(seen.len(), 2);
    let last = seen[1].last().unwrap();
    assert_eq!(last.role, Role::Tool);
    assert_eq!(
        last.content.as_deref(),
        Some("ran watch_start(name='n', uri='memo://notes')")
    );
    drop(tx);
    tokio::time::timeout(WAIT, run).await.unwrap().unwrap();
}

#[tokio::test]
async fn notices_during_a_run_make_one_follow_up_run_that_sees_them_all() {
    let gate = Arc::new(Notify::new());
    let model = Arc::new(Scripted {
        answers: Mutex::new(vec![text("first"), text("NO_REPLY")].into()),
        gate: Some(gate.clone()),
        ..Scripted::default()
    });
    let ch = Arc::new(Recorded::default());
    let (tx, rx) = mpsc::channel(16);
    let run = tokio::spawn(agent(model.clone(), ch.clone(), SessionLog::none()).run(rx));
    let asked = model.asked.notified();
    tokio::pin!(asked);
    asked.as_mut().enable();
    tx.send(input("hello", "C1")).await.unwrap();
    tokio::time::timeout(WAIT, asked).await.unwrap();
    // The run is waiting on the model: three notices arrive.
    for n in 0..3 {
        tx.send(notice(n)).await.unwrap();
    }
    // Let the loop take them in before the run ends (the channel is empty again).
    while tx.capacity() < 16 {
        tokio::task::yield_now().await;
    }
    let asked = model.asked.notified();
    tokio::pin!(asked);
    asked.as_mut().enable();
    gate.notify_one();
    tokio::time::timeout(WAIT, asked).await.unwrap();
    gate.notify_one();
    ch.until(|c| *c.suppressed.lock().unwrap() == 1).await;
    drop(tx);
    tokio::time::timeout(WAIT, run).await.unwrap().unwrap();
    let seen = model.seen();
    assert_eq!(seen.len(), 2, "one follow-up run, not three");
    let follow = &seen[1];
    let notices: Vec<&Message> = follow
        .iter()
        .filter(|m| {
            m.content
                .as_deref()
                .is_some_and(|c| c.starts_with("<watch-event"))
        })
        .collect();
    assert_eq!(notices.len(), 3, "{follow:?}");
    assert_eq!(
        notices[0].content.as_deref().unwrap(),
        format!(
            "<watch-event name=\"notes\" uri=\"memo://notes\">\nMODIFIED k0\n</watch-event>\n{NOTICE_INSTRUCTION}"
        )
    );
    assert!(notices.iter().all(|m| m.role == Role::User));
    // Only the input's reply was published; the notices' NO_REPLY was not.
    assert_eq!(ch.published.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn no_reply_publishes_nothing_and_is_logged() {
    let dir = std::env::temp_dir().join(format!("herald-agent-log-{}", std::process::id()));
    let path = dir.join("session.jsonl");
    let _ = std::fs::remove_file(&path);
    let log = SessionLog::open(&path).unwrap();
    let model = Scripted::new(vec![text("nothing new\nNO_REPLY"), calls("NO_REPLY")]);
    let ch = Arc::new(Recorded::default());
    let (tx, rx) = mpsc::channel(16);
    let run = tokio::spawn(agent(model.clone(), ch.clone(), log).run(rx));
    tx.send(notice(1)).await.unwrap();
    ch.until(|c| *c.suppressed.lock().unwrap() == 1).await;
    tx.send(notice(2)).await.unwrap();
    ch.until(|c| *c.suppressed.lock().unwrap() == 2).await;
    drop(tx);
    tokio::time::timeout(WAIT, run).await.unwrap().unwrap();
    assert!(ch.published.lock().unwrap().is_empty());
    let text = std::fs::read_to_string(&path).unwrap();
    let kinds: Vec<String> = text
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["type"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(
        kinds.iter().filter(|k| *k == "reply.suppressed").count(),
        2,
        "{kinds:?}"
    );
    assert!(
        !kinds.iter().any(|k| k == "user"),
        "notices are never user records: {kinds:?}"
    );
    let monitor: Value =
        serde_json::from_str(text.lines().find(|l| l.contains("\"monitor\"")).unwrap()).unwrap();
    assert_eq!(monitor["task_id"], "watch-notes");
    assert_eq!(monitor["description"], "watch notes memo://notes");
    // The log reads back as the thread a resumed session continues.
    let (thread, _) = SessionLog::thread(&path).unwrap();
    assert_eq!(
        thread[0].content.as_deref(),
        Some(
            notice_message(&match notice(1) {
                Event::Notice { block, .. } => block,
                _ => unreachable!(),
            })
            .as_str()
        )
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_malformed_tool_call_is_answered_with_an_error_the_model_reads() {
    let bad = Ok(Reply {
        tool_calls: vec![
            ToolCall::new("c1", "run_code", "{not json"),
            ToolCall::new("c2", "shell", "{}"),
        ],
        ..Reply::default()
    });
    let model = Scripted::new(vec![bad, text("sorry")]);
    let ch = Arc::new(Recorded::default());
    let (tx, rx) = mpsc::channel(16);
    let run = tokio::spawn(agent(model.clone(), ch.clone(), SessionLog::none()).run(rx));
    tx.send(input("go", "C1")).await.unwrap();
    ch.until(|c| !c.published.lock().unwrap().is_empty()).await;
    drop(tx);
    tokio::time::timeout(WAIT, run).await.unwrap().unwrap();
    let seen = model.seen();
    let results: Vec<&str> = seen[1]
        .iter()
        .filter(|m| m.role == Role::Tool)
        .filter_map(|m| m.content.as_deref())
        .collect();
    assert!(results[0].contains("not JSON"), "{results:?}");
    assert!(
        results[1].contains("the only tool is run_code"),
        "{results:?}"
    );
}

#[tokio::test]
async fn a_failing_model_is_reported_and_the_agent_serves_on() {
    let down = Err(ModelError::Status {
        url: "http://model/v1/chat/completions".into(),
        status: 500,
        body: "boom".into(),
    });
    let model = Scripted::new(vec![down, text("back")]);
    let ch = Arc::new(Recorded::default());
    let (tx, rx) = mpsc::channel(16);
    let run = tokio::spawn(agent(model.clone(), ch.clone(), SessionLog::none()).run(rx));
    tx.send(input("one", "C1")).await.unwrap();
    ch.until(|c| c.published.lock().unwrap().len() == 1).await;
    tx.send(input("two", "C2")).await.unwrap();
    ch.until(|c| c.published.lock().unwrap().len() == 2).await;
    let p = ch.published.lock().unwrap().clone();
    assert!(
        p[0].1.contains("HTTP 500") && p[0].1.contains("http://model/v1"),
        "{p:?}"
    );
    assert_eq!(p[1].1, "back");
    drop(tx);
    tokio::time::timeout(WAIT, run).await.unwrap().unwrap();
}

#[test]
fn no_reply_rules() {
    assert!(is_no_reply(""));
    assert!(is_no_reply("  \n"));
    assert!(is_no_reply("NO_REPLY"));
    assert!(is_no_reply("nothing to say\n NO_REPLY \n"));
    assert!(!is_no_reply("NO_REPLY is what I would say"));
    assert!(!is_no_reply("a configmap appeared"));
}

#[test]
fn the_thread_keeps_to_its_budget_by_whole_turns() {
    let call = ToolCall::new("c1", "run_code", "{}");
    let mut thread = vec![
        Message::system("sys"),
        Message::user("a".repeat(100)),
        Message::assistant("", vec![call]),
        Message::tool("c1", "r".repeat(100)),
        Message::assistant("done", vec![]),
        Message::user("b".repeat(100)),
        Message::assistant("ok", vec![]),
    ];
    trim(&mut thread, 150);
    let roles: Vec<Role> = thread.iter().map(|m| m.role).collect();
    assert_eq!(
        roles,
        [Role::System, Role::User, Role::Assistant],
        "the first turn went whole"
    );
    // The last turn stays even over budget.
    trim(&mut thread, 10);
    assert_eq!(thread.len(), 3);
}

#[test]
fn past_fifty_notices_the_older_are_counted_not_kept() {
    let mut pending = Vec::new();
    let (mut unclaimed, mut last, mut closed) = (Vec::new(), None, false);
    for n in 0..60 {
        take(
            notice(n),
            &mut pending,
            &mut unclaimed,
            &mut last,
            &mut closed,
        );
    }
    take(
        input("hi", "C1"),
        &mut pending,
        &mut unclaimed,
        &mut last,
        &mut closed,
    );
    let kept = coalesce(pending);
    assert_eq!(kept.len(), 1 + MAX_NOTICES_PER_RUN + 1);
    assert!(
        kept[0]
            .message
            .content
            .as_deref()
            .unwrap()
            .starts_with("(10 earlier watch notices")
    );
    assert!(
        kept[1]
            .message
            .content
            .as_deref()
            .unwrap()
            .contains("MODIFIED k10")
    );
    assert_eq!(kept.last().unwrap().message.content.as_deref(), Some("hi"));
}
