//! A watch on a task (`task://ID`): one notice per status change (its state when the watch
//! starts first), the result or the error in the last one, and then the watch ends by
//! itself. The task's pushes come over a listen naming it (`taskIds`), followed and resumed by
//! [`follow_tasks`]; what reaches the notices is only ever newer than what came before.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use rmcp::model::DetailedTask;
use tokio_util::sync::CancellationToken;

use crate::mcp::tasks::relay::{Relayed, RelayedListen, Watched};
use crate::upstream::{Upstream, follow_tasks};
use crate::watch::handle::{Stats, WatchHandle};
use crate::watch::spec::{Notice, WatchSpec};

/// Longest line of a task's result in a notice, and how many lines it may take.
const RESULT_LINE: usize = 500;
const RESULT_LINES: usize = 10;

/// Runs a task watch until the task ends or the watch is stopped. True when the task ended
/// (its last state delivered): the watch then leaves the manager's list, which the manager
/// sees to.
pub(super) async fn run(
    handle: Arc<WatchHandle>,
    server: Arc<Upstream>,
    spec: WatchSpec,
    id: String,
    stats: Arc<Stats>,
    cancel: CancellationToken,
    relayed: Arc<Relayed>,
) -> bool {
    let follow = follow_tasks(
        server,
        vec![(id.clone(), id.clone(), relayed.clone())],
        cancel.child_token(),
    );
    tokio::pin!(follow);
    let mut followed = false;
    let mut states = RelayedListen::new(
        vec![Watched {
            id,
            relayed,
            keep: Arc::new(()),
        }],
        Arc::new(|_| true),
    );
    loop {
        let state = tokio::select! {
            _ = cancel.cancelled() => return false,
            // It returns once the task has ended; its last state is still to be noticed.
            _ = &mut follow, if !followed => {
                followed = true;
                continue;
            }
            s = states.next() => s,
        };
        let Some(state) = state else { return false };
        stats.events.fetch_add(1, Ordering::Relaxed);
        stats.notices.fetch_add(1, Ordering::Relaxed);
        let ended = state.status().is_terminal();
        // A watch stopped meanwhile says nothing more.
        tokio::select! {
            _ = cancel.cancelled() => return false,
            _ = handle.deliver(Notice::new(&spec.name, &spec.uri, lines(&state))) => {}
        }
        if ended {
            return true;
        }
    }
}

/// What a person (or an agent) reads of a task's state.
pub(super) fn lines(task: &DetailedTask) -> Vec<String> {
    let v = serde_json::to_value(task).unwrap_or_default();
    let id = &task.task.task_id;
    let status = v["status"].as_str().unwrap_or("?");
    let mut head = format!("task {id} {status}");
    let message = v["statusMessage"]
        .as_str()
        .or_else(|| v["error"]["message"].as_str());
    if let Some(m) = message {
        head.push_str(": ");
        head.push_str(m);
    }
    let mut out = vec![head];
    match status {
        "input_required" => {
            if let Some(reqs) = v["inputRequests"].as_object() {
                for (key, req) in reqs {
                    let asks = req["params"]["message"].as_str().unwrap_or("(no message)");
                    out.push(format!("needs input {key}: {asks}"));
                }
            }
            out.push(format!(
                "answer with tasks/update on task {id} (herald call --task asks at a terminal)"
            ));
        }
        "completed" => {
            let result = &v["result"];
            if result["isError"] == true {
                out[0].push_str(" (the tool reported an error)");
            }
            let texts: Vec<&str> = result["content"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|c| c["text"].as_str())
                .collect();
            let body = if let Some(s) = result.get("structuredContent").filter(|s| !s.is_null()) {
                s.to_string()
            } else {
                texts.join("\n")
            };
            let all: Vec<&str> = body.lines().filter(|l| !l.trim().is_empty()).collect();
            for l in all.iter().take(RESULT_LINES) {
                out.push(clip(l));
            }
            if all.len() > RESULT_LINES {
                out.push(format!(
                    "+{} more lines (tasks/get {id} has the whole result)",
                    all.len() - RESULT_LINES
                ));
            }
        }
        _ => {}
    }
    out
}

fn clip(line: &str) -> String {
    if line.len() <= RESULT_LINE {
        return line.to_owned();
    }
    let mut end = RESULT_LINE;
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &line[..end])
}

/// `task://ID` → `ID`.
pub(super) fn task_id(uri: &str) -> Option<&str> {
    uri.strip_prefix("task://")
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::{Task, TaskPayload, TaskStatus};
    use serde_json::json;

    fn task(payload: TaskPayload) -> DetailedTask {
        DetailedTask::new(
            Task::new(
                "memo__ab12",
                TaskStatus::Working,
                "2026-12-01T00:00:00Z".to_owned(),
                "2026-12-01T00:00:00Z".to_owned(),
            ),
            payload,
        )
    }

    #[test]
    fn each_status_reads_as_a_line_and_the_end_carries_the_outcome() {
        assert_eq!(
            lines(&task(TaskPayload::Working)),
            ["task memo__ab12 working"]
        );
        let done = task(TaskPayload::Completed {
            result: json!({"content": [{"type": "text", "text": "{\"changed\":true}"}],
                "structuredContent": {"changed": true, "value": 2}})
            .as_object()
            .unwrap()
            .clone(),
        });
        assert_eq!(
            lines(&done),
            ["task memo__ab12 completed", r#"{"changed":true,"value":2}"#]
        );
        let failed = task(TaskPayload::Failed {
            error: json!({"code": -32603, "message": "the server restarted"})
                .as_object()
                .unwrap()
                .clone(),
        });
        assert_eq!(
            lines(&failed),
            ["task memo__ab12 failed: the server restarted"]
        );
        let long = task(TaskPayload::Completed {
            result:
                json!({"content": [{"type": "text", "text": "x\n".repeat(12) + &"y".repeat(900)}]})
                    .as_object()
                    .unwrap()
                    .clone(),
        });
        let l = lines(&long);
        assert_eq!(l.len(), 1 + RESULT_LINES + 1, "{l:?}");
        assert!(l.last().unwrap().starts_with("+3 more lines"), "{l:?}");
    }
}
