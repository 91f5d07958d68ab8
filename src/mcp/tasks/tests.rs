use std::time::Duration;

use rmcp::model::{CallToolResult, ContentBlock, ErrorData as McpError, TaskStatus};
use serde_json::json;
use tokio::sync::oneshot;

use super::*;

const WAIT: Duration = Duration::from_secs(10);

fn ctx() -> RoleContext {
    RoleContext::new("test")
}

fn ok(text: &str) -> Result<CallToolResult, McpError> {
    Ok(CallToolResult::success(vec![ContentBlock::text(text)]))
}

/// A task whose work ends when the returned sender says how.
async fn controlled(
    tasks: &Tasks,
    owner: &str,
) -> (String, oneshot::Sender<Result<CallToolResult, McpError>>) {
    let (tx, rx) = oneshot::channel();
    let task = tasks
        .start(owner, move |_| async move {
            rx.await
                .unwrap_or_else(|_| Err(McpError::internal_error("dropped", None)))
        })
        .await
        .unwrap();
    assert_eq!(task.status, TaskStatus::Working);
    assert_eq!(task.ttl_ms, Some(DEFAULT_TTL.as_millis() as u64));
    (task.task_id, tx)
}

async fn next(l: &mut TaskListen) -> DetailedTask {
    tokio::time::timeout(WAIT, l.next())
        .await
        .expect("a push in time")
        .expect("the stream is open")
}

#[tokio::test]
async fn ids_are_unguessable_and_only_their_owner_sees_them() {
    let tasks = Tasks::open(&ctx(), None, "t").await;
    let (a, _ta) = controlled(&tasks, "alice").await;
    let (b, _tb) = controlled(&tasks, "alice").await;
    assert_eq!(a.len(), 32);
    assert_ne!(a, b);
    assert_eq!(
        tasks.get("alice", &a).unwrap().status(),
        TaskStatus::Working
    );
    for (who, id) in [("bob", a.as_str()), ("alice", "nope")] {
        let e = tasks.get(who, id).unwrap_err();
        assert_eq!(e.code.0, -32602, "{e:?}");
        // Another's id and an unknown id read the same.
        assert!(e.message.contains("unknown, expired or not yours"));
        assert_eq!(tasks.cancel(who, id).unwrap_err().code.0, -32602);
        assert_eq!(
            tasks
                .update(who, id, Default::default())
                .unwrap_err()
                .code
                .0,
            -32602
        );
    }
}

#[tokio::test]
async fn completion_and_failure_carry_the_result_and_the_error() {
    let tasks = Tasks::open(&ctx(), None, "t").await;
    let (a, ta) = controlled(&tasks, "o").await;
    let (b, tb) = controlled(&tasks, "o").await;
    let mut l = tasks.listen("o", &[a.clone(), b.clone()]);
    assert_eq!(l.ids, vec![a.clone(), b.clone()]);
    assert_eq!(l.initial().len(), 2);
    ta.send(ok("done")).unwrap();
    let t = next(&mut l).await;
    assert_eq!(t.task.task_id, a);
    let wire = serde_json::to_value(&t).unwrap();
    assert_eq!(wire["status"], "completed");
    assert_eq!(wire["result"]["content"][0]["text"], "done");
    tb.send(Err(McpError::invalid_params("bad", None))).unwrap();
    let t = next(&mut l).await;
    let wire = serde_json::to_value(&t).unwrap();
    assert_eq!(
        (wire["status"].clone(), wire["error"]["code"].clone()),
        (json!("failed"), json!(-32602))
    );
    // tasks/get agrees with the push.
    assert_eq!(tasks.get("o", &b).unwrap(), t);
}

#[tokio::test]
async fn input_required_then_update_then_working_then_completed() {
    let tasks = Tasks::open(&ctx(), None, "t").await;
    let task = tasks
        .start("o", |h| async move {
            let req: rmcp::model::InputRequest = serde_json::from_value(json!({
                "method": "elicitation/create",
                "params": {"mode": "form", "message": "name?", "requestedSchema": {"type": "object", "properties": {"n": {"type": "string"}}}}
            }))
            .unwrap();
            let answers = h
                .ask([("name".to_owned(), req)].into_iter().collect())
                .await
                .map_err(|e| McpError::internal_error(e.to_string(), None))?;
            ok(answers["name"]["content"]["n"].as_str().unwrap_or("?"))
        })
        .await
        .unwrap();
    let id = task.task_id;
    let mut l = tasks.listen("o", std::slice::from_ref(&id));
    let first = l.initial();
    // The work may have parked already: either way the first push is the current state.
    let mut t = first.into_iter().next().unwrap();
    if t.status() == TaskStatus::Working {
        t = next(&mut l).await;
    }
    let wire = serde_json::to_value(&t).unwrap();
    assert_eq!(wire["status"], "input_required");
    assert_eq!(
        wire["inputRequests"]["name"]["method"],
        "elicitation/create"
    );
    // A key that is not outstanding is ignored; the right one resumes the work.
    tasks
        .update(
            "o",
            &id,
            [("other".to_owned(), json!({}))].into_iter().collect(),
        )
        .unwrap();
    assert_eq!(
        tasks.get("o", &id).unwrap().status(),
        TaskStatus::InputRequired
    );
    tasks
        .update(
            "o",
            &id,
            [(
                "name".to_owned(),
                json!({"action": "accept", "content": {"n": "Luca"}}),
            )]
            .into_iter()
            .collect(),
        )
        .unwrap();
    assert_eq!(next(&mut l).await.status(), TaskStatus::Working);
    let done = serde_json::to_value(next(&mut l).await).unwrap();
    assert_eq!(done["status"], "completed");
    assert_eq!(done["result"]["content"][0]["text"], "Luca");
}

/// Two questions at once, answered one by one: the first answer narrows what the task asks
/// (pushed), the second resumes it.
#[tokio::test]
async fn a_partial_answer_narrows_the_input_requests() {
    let tasks = Tasks::open(&ctx(), None, "t").await;
    let task = tasks
        .start("o", |h| async move {
            let req = |m: &str| -> rmcp::model::InputRequest {
                serde_json::from_value(json!({
                    "method": "elicitation/create",
                    "params": {"mode": "form", "message": m, "requestedSchema": {"type": "object", "properties": {}}}
                }))
                .unwrap()
            };
            let asks = [("a".to_owned(), req("a?")), ("b".to_owned(), req("b?"))];
            h.ask(asks.into_iter().collect())
                .await
                .map_err(|e| McpError::internal_error(e.to_string(), None))?;
            ok("both")
        })
        .await
        .unwrap();
    let id = task.task_id;
    let mut l = tasks.listen("o", std::slice::from_ref(&id));
    let mut t = l.initial().into_iter().next().unwrap();
    while t.status() != TaskStatus::InputRequired {
        t = next(&mut l).await;
    }
    let accept = || json!({"action": "accept", "content": {}});
    tasks
        .update("o", &id, [("a".to_owned(), accept())].into_iter().collect())
        .unwrap();
    let narrowed = serde_json::to_value(next(&mut l).await).unwrap();
    assert_eq!(narrowed["status"], "input_required", "{narrowed}");
    let keys: Vec<&String> = narrowed["inputRequests"]
        .as_object()
        .unwrap()
        .keys()
        .collect();
    assert_eq!(keys, ["b"], "{narrowed}");
    assert_eq!(
        serde_json::to_value(tasks.get("o", &id).unwrap()).unwrap(),
        narrowed
    );
    tasks
        .update("o", &id, [("b".to_owned(), accept())].into_iter().collect())
        .unwrap();
    assert_eq!(next(&mut l).await.status(), TaskStatus::Working);
    assert_eq!(next(&mut l).await.status(), TaskStatus::Completed);
}

#[tokio::test]
async fn cancel_drops_the_work_and_reads_cancelled() {
    let tasks = Tasks::open(&ctx(), None, "t").await;
    let (dropped_tx, dropped_rx) = oneshot::channel::<()>();
    struct OnDrop(Option<oneshot::Sender<()>>);
    impl Drop for OnDrop {
        fn drop(&mut self) {
            let _ = self.0.take().map(|t| t.send(()));
        }
    }
    let task = tasks
        .start("o", move |_| {
            let guard = OnDrop(Some(dropped_tx));
            async move {
                let _guard = guard;
                std::future::pending::<Result<CallToolResult, McpError>>().await
            }
        })
        .await
        .unwrap();
    let mut l = tasks.listen("o", std::slice::from_ref(&task.task_id));
    l.initial();
    tasks.cancel("o", &task.task_id).unwrap();
    tokio::time::timeout(WAIT, dropped_rx)
        .await
        .expect("the work is dropped")
        .unwrap();
    assert_eq!(next(&mut l).await.status(), TaskStatus::Cancelled);
    assert_eq!(
        tasks.get("o", &task.task_id).unwrap().status(),
        TaskStatus::Cancelled
    );
}

#[tokio::test(start_paused = true)]
async fn the_ttl_fails_a_running_task_then_forgets_it() {
    let tasks = Tasks::with_ttl(&ctx(), None, "t", Duration::from_secs(5)).await;
    let (id, _tx) = controlled_ttl(&tasks).await;
    let mut l = tasks.listen("o", std::slice::from_ref(&id));
    l.initial();
    let t = next(&mut l).await;
    let wire = serde_json::to_value(&t).unwrap();
    assert_eq!(wire["status"], "failed");
    assert!(
        wire["error"]["message"]
            .as_str()
            .unwrap()
            .contains("within its ttl of 5000 ms"),
        "{wire}"
    );
    // Forgotten right after: an expired id is -32602.
    tokio::time::timeout(WAIT, async {
        while tasks.get("o", &id).is_ok() {
            tokio::task::yield_now().await;
        }
    })
    .await
    .unwrap();
    assert_eq!(tasks.get("o", &id).unwrap_err().code.0, -32602);
}

async fn controlled_ttl(
    tasks: &Tasks,
) -> (String, oneshot::Sender<Result<CallToolResult, McpError>>) {
    let (tx, rx) = oneshot::channel();
    let task = tasks
        .start("o", move |_| async move {
            rx.await
                .unwrap_or_else(|_| Err(McpError::internal_error("dropped", None)))
        })
        .await
        .unwrap();
    assert_eq!(task.ttl_ms, Some(5000));
    (task.task_id, tx)
}

#[tokio::test]
async fn a_stream_never_gets_an_older_state_than_it_has() {
    let tasks = Tasks::open(&ctx(), None, "t").await;
    let (id, tx) = controlled(&tasks, "o").await;
    let (marker, marker_tx) = controlled(&tasks, "o").await;
    tx.send(ok("done")).unwrap();
    tokio::time::timeout(WAIT, async {
        while tasks.get("o", &id).unwrap().status() != TaskStatus::Completed {
            tokio::task::yield_now().await;
        }
    })
    .await
    .unwrap();
    // Registered after the end: the first push is the end; `working`, still queued or
    // dispatched late, must not follow it.
    let mut l = tasks.listen("o", &[id.clone(), marker.clone()]);
    let first = l.initial();
    assert_eq!(first.len(), 2);
    assert_eq!(first[0].status(), TaskStatus::Completed);
    // The dispatcher keeps order: once the marker's later end arrives, anything queued for
    // `id` before it has been offered (and dropped as older).
    marker_tx.send(ok("marker")).unwrap();
    let t = next(&mut l).await;
    assert_eq!(
        (t.task.task_id.as_str(), t.status()),
        (marker.as_str(), TaskStatus::Completed)
    );
}

#[tokio::test]
async fn foreign_and_unknown_ids_are_left_out_of_a_listen() {
    let tasks = Tasks::open(&ctx(), None, "t").await;
    let (mine, _a) = controlled(&tasks, "o").await;
    let (theirs, _b) = controlled(&tasks, "x").await;
    let l = tasks.listen(
        "o",
        &[theirs.clone(), "nope".into(), mine.clone(), mine.clone()],
    );
    assert_eq!(l.ids, vec![mine.clone()]);
    assert_eq!(tasks.streams_open(), 1);
    drop(l);
    assert_eq!(tasks.streams_open(), 0);
}

#[tokio::test]
async fn a_stream_that_stops_reading_sheds_without_stalling_others() {
    let tasks = Tasks::open(&ctx(), None, "t").await;
    let task = tasks
        .start("o", |h| async move {
            for i in 0..(STREAM_QUEUE * 2) {
                h.message(format!("step {i}"));
                tokio::task::yield_now().await;
            }
            ok("done")
        })
        .await
        .unwrap();
    let id = task.task_id;
    let stuck = tasks.listen("o", std::slice::from_ref(&id));
    let mut live = tasks.listen("o", std::slice::from_ref(&id));
    live.initial();
    // The live stream sees the end although the stuck one never reads.
    tokio::time::timeout(WAIT, async {
        loop {
            if next(&mut live).await.status() == TaskStatus::Completed {
                return;
            }
        }
    })
    .await
    .unwrap();
    assert!(tasks.shed() > 0, "the stuck stream's pushes were shed");
    // The stuck stream, reading at last, still ends with the final state: it reads its tasks
    // again once it has taken what was queued, and never goes back.
    let mut stuck = stuck;
    let mut last = None;
    tokio::time::timeout(WAIT, async {
        loop {
            let t = next(&mut stuck).await;
            if let Some(prev) = &last {
                assert_ne!(prev, &TaskStatus::Completed, "nothing after the end");
            }
            last = Some(t.status());
            if t.status() == TaskStatus::Completed {
                return;
            }
        }
    })
    .await
    .expect("the final state after a shed");
}

#[tokio::test]
async fn an_unfinished_task_reads_failed_after_a_restart() {
    let store = Store::memory();
    let ctx = ctx();
    let tasks = Tasks::open(&ctx, Some(store.clone()), "memo").await;
    let (running, _tx) = controlled(&tasks, "o").await;
    let (done, tx) = controlled(&tasks, "o").await;
    tx.send(ok("kept")).unwrap();
    tokio::time::timeout(WAIT, async {
        while tasks.get("o", &done).unwrap().status() != TaskStatus::Completed {
            tokio::task::yield_now().await;
        }
    })
    .await
    .unwrap();
    // The end is written after the transition: wait until the store has it.
    tokio::time::timeout(WAIT, async {
        loop {
            let row = store
                .get(Table::Tasks, &format!("memo/{done}"))
                .await
                .unwrap()
                .unwrap();
            if String::from_utf8_lossy(&row).contains("kept") {
                return;
            }
            tokio::task::yield_now().await;
        }
    })
    .await
    .unwrap();
    // Another role's tasks in the same store stay apart.
    let other = Tasks::open(&ctx, Some(store.clone()), "file").await;
    assert!(other.is_empty());

    let again = Tasks::open(&RoleContext::new("test2"), Some(store), "memo").await;
    let t = serde_json::to_value(again.get("o", &running).unwrap()).unwrap();
    assert_eq!(t["status"], "failed");
    assert_eq!(t["error"]["message"], RESTARTED);
    let t = serde_json::to_value(again.get("o", &done).unwrap()).unwrap();
    assert_eq!(t["status"], "completed");
    assert_eq!(t["result"]["content"][0]["text"], "kept");
    assert_eq!(again.get("x", &done).unwrap_err().code.0, -32602);
}

#[test]
fn tool_markers_round_trip() {
    let t = rmcp::model::Tool::new("a", "b", JsonObject::new());
    assert!(!supports_tasks(&t));
    assert!(supports_tasks(&optional(t.clone())));
    assert!(supports_tasks(&required(t)));
}

#[tokio::test]
async fn past_the_cap_the_oldest_ended_task_of_that_caller_makes_way() {
    let tasks = Tasks::open(&ctx(), None, "t").await;
    let mut ids = Vec::new();
    for _ in 0..MAX_TASKS_PER_OWNER {
        ids.push(
            tasks
                .start("o", |_| async { ok("x") })
                .await
                .unwrap()
                .task_id,
        );
    }
    tokio::time::timeout(WAIT, async {
        while ids
            .iter()
            .any(|id| tasks.get("o", id).unwrap().status() != TaskStatus::Completed)
        {
            tokio::task::yield_now().await;
        }
    })
    .await
    .unwrap();
    // Another caller is not held up, and this one's oldest ended task goes.
    tasks.start("x", |_| async { ok("x") }).await.unwrap();
    tasks.start("o", |_| async { ok("x") }).await.unwrap();
    assert_eq!(tasks.len(), MAX_TASKS_PER_OWNER + 2 - 1);
    let gone = ids.iter().filter(|id| tasks.get("o", id).is_err()).count();
    assert_eq!(gone, 1);
}
