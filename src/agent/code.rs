//! `run_code`'s backend, herald's code mode (one persistent sandboxed scope with the servers'
//! tools and the watch built-ins), and the system prompt that tells the model what it has.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;

use crate::agent::runtime::CodeRunner;
use crate::filter::pool::{Catalog as FilterHost, FilterError, FilterPool};
use crate::upstream::Upstream;

/// The most of a result the model reads back.
const MAX_RESULT: usize = 16 * 1024;

/// Code mode for the agent: its scope lives in a worker of `pool`.
pub struct CodeMode {
    pub pool: FilterPool,
    pub catalog: Arc<dyn FilterHost>,
}

#[async_trait]
impl CodeRunner for CodeMode {
    async fn run(&self, code: &str) -> String {
        let out = match self
            .pool
            .run("agent", code, Value::Null, self.catalog.clone())
            .await
        {
            Ok(o) => {
                let mut s = o.printed;
                if !o.value.is_null() {
                    if !s.is_empty() && !s.ends_with('\n') {
                        s.push('\n');
                    }
                    s.push_str(&o.value.to_string());
                }
                if o.fresh_scope {
                    s.insert_str(0, "(a fresh scope: earlier variables are gone)\n");
                }
                if s.trim().is_empty() {
                    "ok (no value, nothing printed)".to_owned()
                } else {
                    s
                }
            }
            Err(FilterError::Python(e)) => format!("Python raised: {e}"),
            Err(FilterError::Worker(e)) => {
                format!("error: {e} (the scope was lost; define what you need again)")
            }
        };
        clip(out)
    }
}

fn clip(mut s: String) -> String {
    if s.len() <= MAX_RESULT {
        return s;
    }
    let mut end = MAX_RESULT;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    let total = s.len();
    s.truncate(end);
    s.push_str(&format!(
        "\n… ({} more bytes cut; print less, or slice the value)",
        total - end
    ));
    s
}

/// The system prompt: what the agent is, its one tool, the servers with their tools,
/// resources and templates (with their example lines), how to watch, and the operator's own
/// instructions last.
pub fn system_prompt(servers: &[Arc<Upstream>], operator: Option<&str>) -> String {
    let mut p = String::from(
        "You are herald's agent. You act only through the tool run_code: Python in one persistent \
         sandboxed scope (variables survive between calls). In it, every tool of the servers \
         below is a function taking keyword arguments, and so are list_resources(), \
         read_resource(uri=...), watch_start(name=..., uri=..., on_event=None), \
         watch_stop(name=...), watch_list() and call_tool_as_task(name, args).\n\n\
         Watching: watch_start subscribes to a resource (or `task://ID`, a task) and you get a \
         message starting with <watch-event name=... uri=...> each time it changes, ending \
         with an instruction. Those are not the user speaking. on_event is optional Python \
         source run once per event with `event` in scope; what it leaves becomes the notice \
         line, None drops the event. Reply exactly NO_REPLY when a notice does not matter to \
         what was asked, or when there is nothing to say. Keep replies short.\n\nServers:\n",
    );
    for s in servers {
        let Some(c) = s.catalog() else {
            p.push_str(&format!("- {} (not connected yet)\n", s.name));
            continue;
        };
        p.push_str(&format!("- {}\n", s.name));
        if !c.tools.is_empty() {
            let names: Vec<&str> = c.tools.iter().map(|t| t.name.as_ref()).collect();
            p.push_str(&format!("  tools: {}\n", names.join(", ")));
        }
        for r in &c.listing {
            let uri = r
                .get("uri")
                .or_else(|| r.get("uriTemplate"))
                .and_then(Value::as_str)
                .unwrap_or("?");
            let desc = r.get("description").and_then(Value::as_str).unwrap_or("");
            p.push_str(&format!("  - {uri}"));
            let mut lines = desc.lines().filter(|l| !l.trim().is_empty());
            if let Some(first) = lines.next() {
                p.push_str(&format!(": {first}"));
            }
            p.push('\n');
            for l in lines {
                p.push_str(&format!("    {l}\n"));
            }
        }
    }
    if let Some(o) = operator.filter(|o| !o.trim().is_empty()) {
        p.push_str("\nOperator's instructions:\n");
        p.push_str(o.trim_end());
        p.push('\n');
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_prompt_names_each_server_its_tools_and_its_resources_with_their_examples() {
        let memo = crate::testing::MemoServer::start().await;
        let up = memo.upstream();
        up.connect().await.unwrap();
        let p = system_prompt(&[up], Some("Answer in French."));
        assert!(
            p.contains("tools: memo_set, memo_delete, memo_wait, memo_ask"),
            "{p}"
        );
        assert!(
            p.contains("- memo://notes: All notes as one JSON object"),
            "{p}"
        );
        assert!(
            p.contains("Example: await watch_start(name=\"notes\", uri=\"memo://notes\")"),
            "{p}"
        );
        assert!(
            p.trim_end()
                .ends_with("Operator's instructions:\nAnswer in French."),
            "{p}"
        );
    }

    #[test]
    fn a_long_result_is_cut_with_a_note() {
        let s = clip("é".repeat(MAX_RESULT));
        assert!(s.len() < MAX_RESULT + 100);
        assert!(
            s.ends_with("print less, or slice the value)"),
            "{}",
            &s[s.len() - 80..]
        );
    }
}
