//! `herald poll NAME`: the client of the MCP Events extension (`events/poll`) for people and
//! scripts. Output is NDJSON on stdout: one line per event, as the server sent it (`eventId`,
//! `name`, `timestamp`, `data`), then a cursor line, `{"cursor":"…"}`, with `"truncated":true`
//! when events after the previous cursor were lost and `"hasMore":true` when more are waiting
//! already. An event line always has an `eventId`; a cursor line never does. Pass the last
//! cursor to `--cursor` to resume.
//!
//! One poll by default. `--follow` long-polls (`timeoutMs`) until Ctrl-C or SIGTERM, each poll
//! resuming from the last cursor, printing a cursor line whenever the cursor moves; a lost
//! connection is made again with backoff. A closed stdout (`| head -1`) ends it quietly, with
//! status 0.

use std::io::Write;
use std::time::Duration;

use anyhow::anyhow;
use clap::Args;
use rmcp::model::{ClientRequest, CustomRequest, ServerResult};
use serde_json::{Value, json};

use crate::cli::client::{ConnectArgs, parse_kv};
use crate::cli::{Exit, usage};
use crate::mcp::events::MAX_TIMEOUT;
use crate::mcp::events::PollAnswer as Batch;
use crate::runtime::backoff::Backoff;
use crate::transport::client::Connection;
use crate::upstream::events::POLL_SLACK;

/// Reconnect pacing in `--follow` after a lost connection.
const RECONNECT: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));

#[derive(Debug, Args)]
pub struct PollArgs {
    /// The event type (`events/list` names them; through a gateway, SERVER__EVENT).
    pub name: String,
    /// An argument of the event type as KEY=VALUE (repeatable); values are parsed as JSON when
    /// they parse, else taken as strings.
    #[arg(long = "arg", value_name = "KEY=VALUE")]
    pub args: Vec<String>,
    /// Poll after this cursor (from an earlier poll's cursor line) [default: from now: the
    /// first poll answers no events and the cursor to poll from].
    #[arg(long, value_name = "CURSOR")]
    pub cursor: Option<String>,
    /// Most events per poll, 1 to 1000 [default: the server's, 100].
    #[arg(long, value_name = "N")]
    pub max_events: Option<u32>,
    /// Keep polling (long polls) until Ctrl-C, each poll resuming from the last cursor.
    #[arg(long)]
    pub follow: bool,
    /// How long each poll waits for an event when none is there (timeoutMs; at most 30000)
    /// [default: 0 (answer at once) for one poll, 30000 with --follow].
    #[arg(long, value_name = "MS")]
    pub timeout_ms: Option<u64>,
    #[command(flatten)]
    pub conn: ConnectArgs,
}

/// Why a poll failed.
enum Failed {
    /// The server answered with an error: polling again will not help.
    Refused(String),
    /// The connection is gone (or the answer never came).
    Lost(String),
}

/// Writes NDJSON lines; a closed pipe is remembered, not an error.
struct Out<W: Write> {
    w: W,
}

impl<W: Write> Out<W> {
    /// Writes `v` as one line. `Ok(false)`: the reader has gone.
    fn line(&mut self, v: &Value) -> std::io::Result<bool> {
        let r = writeln!(self.w, "{v}").and_then(|()| self.w.flush());
        match r {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// The cursor line of a poll's answer.
fn cursor_line(batch: &Batch) -> Value {
    let mut v = json!({"cursor": batch.cursor});
    if batch.truncated {
        v["truncated"] = true.into();
    }
    if batch.has_more {
        v["hasMore"] = true.into();
    }
    v
}

pub async fn run(args: PollArgs) -> Result<(), Exit> {
    let arguments = parse_kv(&args.args).map_err(usage)?;
    let timeout = Duration::from_millis(args.timeout_ms.unwrap_or(if args.follow {
        MAX_TIMEOUT.as_millis() as u64
    } else {
        0
    }));
    let stop = stopped();
    tokio::pin!(stop);
    let mut out = Out {
        w: std::io::stdout().lock(),
    };
    let mut cursor = args.cursor.clone();
    let mut backoff = RECONNECT;
    let mut conn: Option<Connection> = None;
    loop {
        let live = match conn.take() {
            Some(c) => c,
            None => {
                let connected = tokio::select! {
                    _ = &mut stop => return Ok(()),
                    c = args.conn.connect() => c,
                };
                match connected {
                    Ok(c) => c,
                    Err(e) if args.follow => {
                        let delay = backoff.next_delay();
                        tracing::warn!(error = %format!("{:#}", e.error), retry_ms = delay.as_millis() as u64, "cannot connect; trying again");
                        tokio::select! {
                            _ = &mut stop => return Ok(()),
                            _ = tokio::time::sleep(delay) => continue,
                        }
                    }
                    Err(e) => return Err(e),
                }
            }
        };
        let mut params = json!({
            "name": args.name,
            "arguments": arguments,
            "cursor": cursor,
        });
        if let Some(n) = args.max_events {
            params["maxEvents"] = n.into();
        }
        if !timeout.is_zero() {
            params["timeoutMs"] = (timeout.as_millis() as u64).into();
        }
        let started = tokio::time::Instant::now();
        let answer = tokio::select! {
            _ = &mut stop => {
                live.close().await;
                return Ok(());
            }
            a = poll(&live, params, timeout + POLL_SLACK) => a,
        };
        let batch = match answer {
            Ok(b) => b,
            Err(Failed::Refused(e)) => {
                live.close().await;
                return Err(anyhow!("polling {}: {e}", args.name).into());
            }
            Err(Failed::Lost(e)) if args.follow => {
                let delay = backoff.next_delay();
                tracing::warn!(error = %e, retry_ms = delay.as_millis() as u64, "lost the server; reconnecting");
                drop(live);
                tokio::select! {
                    _ = &mut stop => return Ok(()),
                    _ = tokio::time::sleep(delay) => continue,
                }
            }
            Err(Failed::Lost(e)) => return Err(anyhow!("polling {}: {e}", args.name).into()),
        };
        backoff.reset();
        let moved = batch.cursor != cursor || batch.truncated || batch.has_more;
        let mut reader_there = true;
        for e in &batch.events {
            reader_there = reader_there && out.line(e)?;
        }
        if reader_there && (moved || !args.follow) {
            reader_there = out.line(&cursor_line(&batch))?;
        }
        if !reader_there {
            // `| head`: the reader has what it wanted.
            live.close().await;
            return Ok(());
        }
        if batch.cursor.is_some() {
            cursor = batch.cursor.clone();
        }
        if !args.follow {
            live.close().await;
            return Ok(());
        }
        // A server that answers an empty long poll at once (one shutting down, or one that
        // does not wait) is asked again no sooner than it said.
        if batch.events.is_empty() && !batch.has_more {
            let due = started + batch.next_poll;
            tokio::select! {
                _ = &mut stop => {
                    live.close().await;
                    return Ok(());
                }
                _ = tokio::time::sleep_until(due) => {}
            }
        }
        conn = Some(live);
    }
}

/// One `events/poll`, bounded by `bound`.
async fn poll(conn: &Connection, params: Value, bound: Duration) -> Result<Batch, Failed> {
    let req = ClientRequest::CustomRequest(CustomRequest::new("events/poll", Some(params)));
    match tokio::time::timeout(bound, conn.send_request(req)).await {
        Err(_) => Err(Failed::Lost(format!(
            "no answer within {} s",
            bound.as_secs()
        ))),
        Ok(Ok(ServerResult::CustomResult(r))) => Batch::parse(r.0).map_err(Failed::Refused),
        Ok(Ok(other)) => Batch::parse(serde_json::to_value(other).unwrap_or(Value::Null))
            .map_err(Failed::Refused),
        Ok(Err(rmcp::ServiceError::McpError(e))) => {
            Err(Failed::Refused(format!("{} ({})", e.message, e.code.0)))
        }
        Ok(Err(e)) => Err(Failed::Lost(crate::transport::explain::request(
            conn.target(),
            &e,
        ))),
    }
}

/// Resolves on Ctrl-C or SIGTERM.
async fn stopped() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_reads_events_cursor_and_flags() {
        let b = Batch::parse(json!({
            "events": [{"eventId": "memo://log#2", "data": {"seq": 2}}],
            "cursor": "2", "truncated": true, "hasMore": false, "nextPollMs": 500
        }))
        .unwrap();
        assert_eq!(b.events.len(), 1);
        assert_eq!(b.cursor.as_deref(), Some("2"));
        assert!(b.truncated && !b.has_more);
        assert_eq!(b.next_poll, Duration::from_millis(500));
        assert_eq!(cursor_line(&b), json!({"cursor": "2", "truncated": true}));
        assert!(Batch::parse(json!({"cursor": "1"})).is_err());
        assert!(Batch::parse(json!({"events": [], "cursor": 1})).is_err());
    }

    #[test]
    fn a_closed_reader_is_not_an_error() {
        struct Closed;
        impl Write for Closed {
            fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
                Err(std::io::ErrorKind::BrokenPipe.into())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        assert!(!Out { w: Closed }.line(&json!({})).unwrap());
        let mut buf = Vec::new();
        assert!(Out { w: &mut buf }.line(&json!({"cursor": "1"})).unwrap());
        assert_eq!(buf, b"{\"cursor\":\"1\"}\n");
    }
}
