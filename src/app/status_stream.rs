//! `GET /status/stream` on the admin address: the [`StatusReport`] of `/status`, pushed as one
//! JSON line each time it changes, for `herald top` and for scripts (`curl -N`).
//!
//! A follower gets a report at once, then whenever the board records a change (a role, an
//! upstream or a backend entered, the watches, a reload) and at its interval for what is
//! counted rather than recorded (connections, listens, watch events): `?interval_ms=`, 1000 by
//! default, 100 to 60000. A report equal to the last one sent is not sent again. At most
//! [`MAX_FOLLOWERS`] follow at once (503 past that); each is one task, holding one report in
//! flight (a slow reader slows only its own stream), ended when the follower hangs up or the
//! process shuts down, after a last report that says `draining`.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use tokio::sync::{Semaphore, mpsc};

use crate::runtime::status::StatusBoard;

/// The most followers at once.
pub const MAX_FOLLOWERS: usize = 16;

/// How long the last report (draining) waits for a reader that reads nothing.
const LAST_WORD: Duration = Duration::from_secs(1);

/// The interval unless the follower asks for another.
pub const DEFAULT_INTERVAL: Duration = Duration::from_millis(1000);

/// The follower's interval from the query string (`interval_ms=N`), within bounds; or why not.
pub fn interval(query: Option<&str>) -> Result<Duration, String> {
    let Some(value) = query
        .unwrap_or("")
        .split('&')
        .find_map(|kv| kv.strip_prefix("interval_ms="))
    else {
        return Ok(DEFAULT_INTERVAL);
    };
    match value.parse::<u64>() {
        Ok(ms) if (100..=60_000).contains(&ms) => Ok(Duration::from_millis(ms)),
        _ => Err(format!(
            "interval_ms must be a number of milliseconds from 100 to 60000, not {value:?}"
        )),
    }
}

/// The streamed answer for one follower, or why there is none (for a 503): [`MAX_FOLLOWERS`]
/// follow already.
pub fn follow(
    board: StatusBoard,
    followers: &Arc<Semaphore>,
    every: Duration,
) -> Result<Response, String> {
    let Ok(permit) = followers.clone().try_acquire_owned() else {
        return Err(format!(
            "{MAX_FOLLOWERS} followers of /status/stream are open already; close one, or ask /status"
        ));
    };
    let (tx, rx) = mpsc::channel::<Vec<u8>>(1);
    tokio::spawn(async move {
        let _permit = permit;
        let mut changes = board.changes();
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        let mut last = Vec::new();
        loop {
            let report = board.report().await;
            // What the report says, not a second look: the last one sent says draining.
            let draining = report.draining;
            let mut line = serde_json::to_vec(&report).expect("a report serializes");
            line.push(b'\n');
            if line != last {
                // Draining, the last report waits a moment for a reader, not for ever.
                let patience = if draining { LAST_WORD } else { Duration::MAX };
                tokio::select! {
                    sent = tokio::time::timeout(patience, tx.send(line.clone())) => {
                        if !matches!(sent, Ok(Ok(()))) {
                            return;
                        }
                        last = line;
                    }
                    // Not sent: the next pass makes the report that says draining.
                    () = board.shutdown().cancelled(), if !draining => {}
                }
            }
            if draining {
                return;
            }
            tokio::select! {
                _ = tick.tick() => {}
                changed = changes.changed() => if changed.is_err() { return },
                () = tx.closed() => return,
                // One more report, which says draining, and the stream ends.
                () = board.shutdown().cancelled() => {}
            }
        }
    });
    let body = futures::stream::unfold(rx, |mut rx| async move {
        let line = rx.recv().await?;
        Some((Ok::<_, std::convert::Infallible>(line), rx))
    });
    Ok((
        [
            (header::CONTENT_TYPE, "application/x-ndjson"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(body),
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_interval_is_read_from_the_query_within_bounds() {
        assert_eq!(interval(None), Ok(DEFAULT_INTERVAL));
        assert_eq!(interval(Some("x=1")), Ok(DEFAULT_INTERVAL));
        assert_eq!(
            interval(Some("x=1&interval_ms=250")),
            Ok(Duration::from_millis(250))
        );
        for bad in ["interval_ms=99", "interval_ms=60001", "interval_ms=soon"] {
            assert!(
                interval(Some(bad)).unwrap_err().contains("100 to 60000"),
                "{bad}"
            );
        }
    }

    #[tokio::test]
    async fn a_follower_gets_a_report_at_once_and_each_change_then_draining() {
        use futures::StreamExt as _;
        let shutdown = tokio_util::sync::CancellationToken::new();
        let board = StatusBoard::new(shutdown.clone());
        let followers = Arc::new(Semaphore::new(MAX_FOLLOWERS));
        // An hour's interval: whatever comes next comes from the board's changes.
        let response = follow(board.clone(), &followers, Duration::from_secs(3600)).unwrap();
        let mut body = response.into_body().into_data_stream();
        let mut next = async || -> serde_json::Value {
            let chunk = tokio::time::timeout(Duration::from_secs(10), body.next())
                .await
                .expect("a report in time")
                .expect("the stream goes on")
                .unwrap();
            serde_json::from_slice(&chunk).unwrap()
        };
        assert_eq!(next().await["roles"], serde_json::json!([]));
        board.role_starting("memo");
        assert_eq!(next().await["roles"][0]["state"], "starting");
        board.role_serving("memo", vec!["stdio".into()], None);
        assert_eq!(next().await["roles"][0]["state"], "serving");
        // The cap: the other followers' places are taken, the next is refused.
        let held: Vec<_> = (1..MAX_FOLLOWERS)
            .map(|_| follow(board.clone(), &followers, Duration::from_secs(3600)))
            .collect();
        let refused = follow(board.clone(), &followers, Duration::from_secs(3600));
        assert!(refused.unwrap_err().contains("close one"));
        drop(held);
        shutdown.cancel();
        assert_eq!(next().await["draining"], true);
        let end = tokio::time::timeout(Duration::from_secs(10), body.next())
            .await
            .expect("the end in time");
        assert!(end.is_none(), "the stream ends after draining");
    }
}
