//! Slack for the agent, through herald's Slack source (no Slack client of its own): the inbox
//! is the source's event log `slack-events://message_posted?addressed_to_bot=true`, followed
//! by push ([`Upstream::follow_log`]: a listen, then a read of the events past the cursor on
//! each update), each message
//! an input whose reply goes to its thread; replies and notices are posted with the source's
//! `slack_post_message` tool (`slug__slack_post_message` through a gateway). The source never
//! offers the bot's own posts, so the bot never answers itself.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::agent::runtime::{Channel, Event, ReplyTo};
use crate::filter::pool::Catalog as FilterHost;
use crate::runtime::backoff::Backoff;
use crate::upstream::{LogCursor, Upstream, pick};

/// The event log of messages addressed to the bot.
pub const INBOX: &str = "slack-events://message_posted?addressed_to_bot=true";

/// Resubscribe pacing: 1 s doubling to 30 s.
const AGAIN: Backoff = Backoff::new(
    std::time::Duration::from_secs(1),
    std::time::Duration::from_secs(30),
);

/// The input a Slack message becomes: who said it where, then what they said.
pub fn input_of(event: &Map<String, Value>) -> Option<Event> {
    let channel = event.get("channel_id")?.as_str()?.to_owned();
    let ts = event.get("ts")?.as_str()?.to_owned();
    let text = event.get("text").and_then(Value::as_str).unwrap_or("");
    let who = event
        .get("user_id")
        .or_else(|| event.get("username"))
        .and_then(Value::as_str)
        .unwrap_or("someone");
    let thread = event
        .get("thread_ts")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .unwrap_or(ts);
    Some(Event::Input {
        text: format!("[Slack, <@{who}> in {channel}] {text}"),
        reply_to: ReplyTo::Slack {
            channel,
            thread_ts: Some(thread),
        },
    })
}

/// Follows the inbox on whichever of `servers` serves it, sending each new message to `tx`,
/// until `stop`. Messages from before the start are not answered; what was posted while
/// resubscribing is read on the next follow (the cursor stays), and a gap is logged.
/// Whether `servers` can serve the inbox: `Some(false)` when every one has connected and none
/// lists it or a template matching it (`--slack` then has nothing to follow), `None` while
/// one has not connected yet (it may serve it once it does).
pub async fn inbox_served(servers: &[Arc<Upstream>]) -> Option<bool> {
    futures::future::join_all(servers.iter().map(|s| s.connect())).await;
    let mut any_unknown = false;
    for s in servers {
        match s.catalog() {
            Some(c) if c.lists(INBOX) || c.template_matches(INBOX) => return Some(true),
            Some(_) => {}
            None => any_unknown = true,
        }
    }
    (!any_unknown).then_some(false)
}

pub async fn follow_inbox(
    servers: Vec<Arc<Upstream>>,
    tx: mpsc::Sender<Event>,
    stop: CancellationToken,
) {
    let mut cursor: Option<LogCursor> = None;
    let mut backoff = AGAIN;
    // Messages posted since the agent started are answered, also those the first read finds
    // (posted while it was connecting).
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
        - 5.0;
    loop {
        let attempt = async {
            // Through a gateway the URI is the slug's; `pick` routes it like any other.
            futures::future::join_all(servers.iter().map(|s| s.connect())).await;
            let server = pick(&servers, INBOX)
                .cloned()
                .ok_or_else(|| format!("no server serves {INBOX}; is herald slack (or herald up with [slack]) among --mcp-*?"))?;
            let (mut follow, first) = server
                .follow_log(INBOX, cursor)
                .await
                .map_err(|e| format!("following {INBOX} on {}: {e}", server.name))?;
            tracing::info!(server = %server.name, uri = INBOX, "following the Slack inbox");
            // The first follow's read is the baseline: of what it holds, what was posted
            // since the start is answered. A later one starts past the cursor.
            let fresh: Vec<&Map<String, Value>> = if cursor.is_none() {
                first
                    .iter()
                    .filter(|e| {
                        e.get("ts")
                            .and_then(Value::as_str)
                            .and_then(|t| t.parse::<f64>().ok())
                            .is_some_and(|t| t >= started)
                    })
                    .collect()
            } else {
                first.iter().collect()
            };
            for ev in inputs(fresh) {
                if tx.send(ev).await.is_err() {
                    return Ok(());
                }
            }
            cursor = Some(follow.cursor());
            let since = std::time::Instant::now();
            while let Some(Ok(events)) = follow.next().await {
                for ev in inputs(events.iter()) {
                    if tx.send(ev).await.is_err() {
                        return Ok(());
                    }
                }
                cursor = Some(follow.cursor());
            }
            backoff.ran_for(since.elapsed());
            Err("the subscription ended".to_owned())
        };
        let r = tokio::select! {
            _ = stop.cancelled() => return,
            r = attempt => r,
        };
        match r {
            Ok(()) => return,
            Err(e) => tracing::warn!(error = %e, "the Slack inbox is not followed; trying again"),
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(backoff.next_delay()) => {}
        }
    }
}

/// The inputs among a read's events: each message posted; a `GAP` (messages missed while the
/// inbox was not followed, or a restarted log) is logged.
fn inputs<'a>(events: impl IntoIterator<Item = &'a Map<String, Value>>) -> Vec<Event> {
    events
        .into_iter()
        .filter(|e| match e.get("type").and_then(Value::as_str) {
            Some("message_posted") => true,
            Some("GAP") => {
                let why = e.get("message").and_then(Value::as_str).unwrap_or_default();
                tracing::warn!(uri = INBOX, "the Slack inbox missed messages: {why}");
                false
            }
            _ => false,
        })
        .filter_map(input_of)
        .collect()
}

/// Replies in Slack (with the source's `slack_post_message`) or on the terminal.
pub struct SlackReplies {
    pub catalog: Arc<dyn FilterHost>,
    pub terminal: crate::agent::terminal::Terminal,
}

#[async_trait]
impl Channel for SlackReplies {
    async fn publish(&self, to: &ReplyTo, text: &str) {
        let ReplyTo::Slack { channel, thread_ts } = to else {
            self.terminal.publish(to, text).await;
            return;
        };
        let Some(tool) = self
            .catalog
            .functions()
            .into_iter()
            .find(|f| f == "slack_post_message" || f.ends_with("__slack_post_message"))
        else {
            tracing::error!(
                "no connected server has slack_post_message; the reply is lost: {text}"
            );
            return;
        };
        let mut args = Map::new();
        args.insert("channel".into(), json!(channel));
        args.insert("text".into(), json!(text));
        if let Some(t) = thread_ts {
            args.insert("thread_ts".into(), json!(t));
        }
        if let Err(e) = self.catalog.call(&tool, Vec::new(), args).await {
            tracing::error!(channel = %channel, error = %e.message, "posting the reply to Slack failed");
        }
    }

    fn suppressed(&self) {
        tracing::info!(event = "reply.suppressed", "NO_REPLY: nothing posted");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_is_an_input_answered_in_its_thread() {
        let ev: Map<String, Value> = serde_json::from_value(json!({
            "seq": 3, "type": "message_posted", "id": "slack:C1:1.2",
            "channel_id": "C1", "ts": "1.2", "user_id": "U1", "text": "<@UBOT> watch the notes"
        }))
        .unwrap();
        let Some(Event::Input { text, reply_to }) = input_of(&ev) else {
            panic!("an input")
        };
        assert_eq!(text, "[Slack, <@U1> in C1] <@UBOT> watch the notes");
        assert_eq!(
            reply_to,
            ReplyTo::Slack {
                channel: "C1".into(),
                thread_ts: Some("1.2".into())
            }
        );
        let mut reply: Map<String, Value> = ev.clone();
        reply.insert("thread_ts".into(), json!("1.0"));
        let Some(Event::Input { reply_to, .. }) = input_of(&reply) else {
            panic!("an input")
        };
        assert_eq!(
            reply_to,
            ReplyTo::Slack {
                channel: "C1".into(),
                thread_ts: Some("1.0".into())
            },
            "a reply in a thread is answered in that thread"
        );
    }
}
