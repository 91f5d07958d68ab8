//! Tasks from the command line: `herald call --task` starts a call as a task and follows it
//! (its status pushed on a listen stream naming its id, shown as one line updated in place on
//! a terminal, NDJSON with `--json`) until it ends, answering an elicitation it asks for on a
//! terminal; `herald task get|cancel ID` ask about one.

use std::io::{IsTerminal as _, Write as _};

use anyhow::{Context as _, anyhow};
use clap::{Args, Subcommand};
use rmcp::model::{
    CallToolRequestParams, CancelTaskParams, ClientRequest, CustomRequest, GetTaskParams,
    JsonObject, ServerResult, TaskStatusNotificationParams, UpdateTaskParams,
};
use rmcp::service::NotificationContext;
use rmcp::{ClientHandler, RoleClient};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::client::{CallArgs, ClientArgs, parse_kv, print_result, request_error};
use super::{Exit, usage};
use crate::app::console;
use crate::transport::client::tasks_config;

/// A client handler that hands task pushes to a channel.
#[derive(Clone)]
struct Follower {
    config: rmcp::model::ClientConfig,
    tx: mpsc::Sender<Value>,
}

impl ClientHandler for Follower {
    fn get_info(&self) -> rmcp::model::ClientConfig {
        self.config.clone()
    }

    async fn on_task_status(
        &self,
        params: TaskStatusNotificationParams,
        _context: NotificationContext<RoleClient>,
    ) {
        if let Ok(mut v) = serde_json::to_value(&params.task) {
            if let Some(o) = v.as_object_mut() {
                o.remove("_meta");
            }
            // Bounded: a server pushing faster than this prints waits on the connection.
            let _ = self.tx.send(v).await;
        }
    }
}

#[derive(Debug, Args)]
pub struct TaskArgs {
    #[command(subcommand)]
    pub command: TaskCommand,
}

#[derive(Debug, Subcommand)]
pub enum TaskCommand {
    /// Print a task's state (tasks/get): its status, and its result or error once it ended.
    Get(TaskIdArgs),
    /// Ask a task to stop (tasks/cancel); it then reads cancelled, unless it ended first.
    Cancel(TaskIdArgs),
}

#[derive(Debug, Args)]
pub struct TaskIdArgs {
    /// The task's id, as `herald call --task` printed it.
    pub id: String,
    #[command(flatten)]
    pub client: ClientArgs,
}

pub async fn run(args: TaskArgs) -> Result<(), Exit> {
    match args.command {
        TaskCommand::Get(a) => {
            let conn = a.client.conn.connect_with(tasks_config()).await?;
            let got = conn
                .get_task(GetTaskParams::new(a.id.clone()))
                .await
                .map_err(|e| anyhow!("tasks/get {}: {}", a.id, request_error(conn.target(), &e)))?;
            let mut v = serde_json::to_value(&got.task)?;
            if a.client.json {
                console::println(&v.to_string())?;
            } else {
                if let Some(o) = v.as_object_mut() {
                    o.remove("_meta");
                }
                console::println(&serde_json::to_string_pretty(&v)?)?;
            }
            conn.close().await;
            Ok(())
        }
        TaskCommand::Cancel(a) => {
            let conn = a.client.conn.connect_with(tasks_config()).await?;
            conn.cancel_task(CancelTaskParams::new(a.id.clone()))
                .await
                .map_err(|e| {
                    anyhow!(
                        "tasks/cancel {}: {}",
                        a.id,
                        request_error(conn.target(), &e)
                    )
                })?;
            if !a.client.json {
                console::println(&format!("asked task {} to stop", a.id))?;
            }
            conn.close().await;
            Ok(())
        }
    }
}

/// What a person sees of a state, on one line.
fn summary(v: &Value) -> String {
    let status = v["status"].as_str().unwrap_or("?");
    match v["statusMessage"].as_str() {
        Some(m) => format!("{status}: {m}"),
        None => status.to_owned(),
    }
}

/// What a person typed for a field of JSON type `kind`, read as `herald call` reads
/// `KEY=VALUE`: JSON when it parses, else the text. For a string field a JSON string is its
/// content (`"ana"` is ana) and anything else the text as typed (`5` is "5").
fn field_value(kind: Option<&str>, text: &str) -> Value {
    let parsed = serde_json::from_str::<Value>(text).ok();
    match (kind, parsed) {
        (Some("string") | None, Some(Value::String(s))) => Value::String(s),
        (Some("string") | None, _) => Value::String(text.to_owned()),
        (_, Some(v)) => v,
        (_, None) => Value::String(text.to_owned()),
    }
}

/// Asks the person at the terminal for each elicitation's string fields; `None` when there
/// is no terminal to ask at.
fn answer_on_terminal(requests: &JsonObject) -> anyhow::Result<Option<JsonObject>> {
    if !std::io::stdin().is_terminal() {
        return Ok(None);
    }
    let mut answers = JsonObject::new();
    for (key, req) in requests {
        let params = &req["params"];
        eprintln!("\n{}", params["message"].as_str().unwrap_or(key));
        let mut content = JsonObject::new();
        let props = params["requestedSchema"]["properties"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        for (name, schema) in props {
            let about = schema["description"].as_str().unwrap_or(&name).to_owned();
            eprint!("  {about} (JSON or text): ");
            std::io::stderr().flush()?;
            let mut line = String::new();
            std::io::stdin().read_line(&mut line)?;
            let text = line.trim_end_matches(['\n', '\r']);
            content.insert(name, field_value(schema["type"].as_str(), text));
        }
        answers.insert(key.clone(), json!({"action": "accept", "content": content}));
    }
    Ok(Some(answers))
}

/// `herald call --task`: the call as a task, followed until it ends. Ctrl-C cancels it.
pub async fn call(args: CallArgs) -> Result<(), Exit> {
    let arguments = parse_kv(&args.args).map_err(usage)?;
    let (client, tool) = (&args.client, args.tool.as_str());
    let (tx, mut rx) = mpsc::channel(64);
    let follower = Follower {
        config: tasks_config(),
        tx,
    };
    let conn = client.conn.connect_with(follower).await?;
    let answer = conn
        .send_request(ClientRequest::CallToolRequest(rmcp::model::Request::new(
            CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments),
        )))
        .await
        .map_err(|e| anyhow!("calling {tool}: {}", request_error(conn.target(), &e)))?;
    let task = match answer {
        ServerResult::CreateTaskResult(t) => t.task,
        // The server answered in place (the tool does not run as a task there).
        ServerResult::CallToolResult(r) => {
            conn.close().await;
            return print_result(tool, &r, client.json);
        }
        other => return Err(anyhow!("calling {tool}: unexpected answer {other:?}").into()),
    };
    let id = task.task_id.clone();
    let json_out = client.json;
    let live = !json_out && std::io::stderr().is_terminal();
    if json_out {
        console::println(&serde_json::to_string(&task)?)?;
    } else {
        eprintln!("task {id} (herald task get|cancel {id})");
    }
    // The pushes: a listen naming the task; its state at registration comes first.
    let listen = conn
        .send_cancellable_request(
            ClientRequest::CustomRequest(CustomRequest::new(
                "subscriptions/listen",
                Some(json!({"notifications": {"taskIds": [id]}})),
            )),
            Default::default(),
        )
        .await
        .map_err(|e| anyhow!("subscriptions/listen: {}", request_error(conn.target(), &e)))?;
    let mut shown = String::new();
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let mut cancelling = false;
    let end = loop {
        let state = tokio::select! {
            s = rx.recv() => s,
            _ = &mut ctrl_c, if !cancelling => {
                cancelling = true;
                eprintln!("\ncancelling task {id}…");
                conn.cancel_task(CancelTaskParams::new(id.clone()))
                    .await
                    .map_err(|e| anyhow!("tasks/cancel {id}: {}", request_error(conn.target(), &e)))?;
                continue;
            }
        };
        let Some(state) = state else {
            break None;
        };
        if state["taskId"] != id.as_str() {
            continue;
        }
        if json_out {
            console::println(&state.to_string())?;
        } else if live {
            let line = summary(&state);
            eprint!("\r\x1b[2K{line}");
            shown = line;
        } else {
            let line = summary(&state);
            if line != shown {
                eprintln!("{line}");
                shown = line;
            }
        }
        match state["status"].as_str() {
            Some("input_required") => {
                let requests = state["inputRequests"]
                    .as_object()
                    .cloned()
                    .unwrap_or_default();
                match answer_on_terminal(&requests)? {
                    Some(answers) => {
                        conn.update_task(UpdateTaskParams::new(
                            id.clone(),
                            answers.into_iter().collect(),
                        ))
                        .await
                        .map_err(|e| {
                            anyhow!("tasks/update {id}: {}", request_error(conn.target(), &e))
                        })?;
                    }
                    None => {
                        break Some(Err(anyhow!(
                            "task {id} needs input ({}), and there is no terminal to ask at; run herald call --task from a terminal, or herald task cancel {id}",
                            requests.keys().cloned().collect::<Vec<_>>().join(", ")
                        )));
                    }
                }
            }
            Some("completed") | Some("failed") | Some("cancelled") => break Some(Ok(state)),
            _ => {}
        }
    };
    if live {
        eprintln!();
    }
    let _ = listen.cancel(None).await;
    conn.close().await;
    let state = match end {
        Some(Ok(s)) => s,
        Some(Err(e)) => return Err(e.into()),
        None => return Err(anyhow!("the connection closed before task {id} ended").into()),
    };
    match state["status"].as_str() {
        Some("completed") => {
            let result: rmcp::model::CallToolResult =
                serde_json::from_value(state["result"].clone())
                    .context("the task's result is not a tool result")?;
            if json_out {
                return if result.is_error == Some(true) {
                    Err(anyhow!("{tool} reported an error").into())
                } else {
                    Ok(())
                };
            }
            print_result(tool, &result, false)
        }
        Some("failed") => Err(anyhow!(
            "task {id} failed: {}",
            state["error"]["message"]
                .as_str()
                .unwrap_or("no reason given")
        )
        .into()),
        _ => Err(anyhow!("task {id} was cancelled").into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_typed_answer_reads_as_herald_call_reads_it() {
        assert_eq!(field_value(Some("string"), "ana"), json!("ana"));
        assert_eq!(field_value(Some("string"), "\"ana\""), json!("ana"));
        assert_eq!(field_value(Some("string"), "5"), json!("5"));
        assert_eq!(field_value(None, "\"a b\""), json!("a b"));
        assert_eq!(field_value(Some("integer"), "5"), json!(5));
        assert_eq!(field_value(Some("boolean"), "true"), json!(true));
        assert_eq!(field_value(Some("integer"), "five"), json!("five"));
    }
}
