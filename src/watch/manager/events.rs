//! Starting a watch on an event type (`events:NAME?arg=value`, see `task/stream.rs`): the
//! server is the first whose `events/list` names the type, and the follow's first answer (a
//! stream's `active`, or a poll's cursor) is awaited here, so a server that refuses the
//! arguments fails the start.

use std::sync::Arc;

use rmcp::model::JsonObject;
use serde_json::{Value, json};

use super::{Keeper, WatchManager};
use crate::upstream::events::{EventFollow, Fed};
use crate::upstream::{REQUEST_TIMEOUT, Upstream, UpstreamError};
use crate::watch::spec::{Shape, WatchError, WatchInfo, WatchSpec};
use crate::watch::task::WatchTask;

/// Pages of `events/list` read from one server at most.
const MAX_PAGES: usize = 16;

impl WatchManager {
    /// Starts watching event type `event` with `arguments` (`uri` is the watch's
    /// `events:` URI) as `name`.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn start_events(
        &self,
        name: &str,
        uri: &str,
        event: String,
        arguments: JsonObject,
        on_event: Option<&str>,
        save: bool,
        kept: Option<&Keeper<'_>>,
    ) -> Result<WatchInfo, WatchError> {
        let inner = &self.inner;
        let server = self.event_server(&event).await?;
        if let Some(code) = on_event {
            self.validate_filter(name, uri, code).await?;
        }
        let mut follow = EventFollow::new(server.clone(), event, arguments);
        let started = follow.next().await.map_err(|e| refused(&server, uri, e))?;
        let Fed::Started { push, .. } = started else {
            return Err(WatchError::Unavailable(format!(
                "{} did not start the event follow of {uri}",
                server.name
            )));
        };
        let spec = WatchSpec {
            name: name.into(),
            uri: uri.into(),
            on_event: on_event.map(str::to_owned),
        };
        let (stats, cancel) = self.enter(&spec, Shape::Events, &server.name, kept)?;
        if save {
            self.save(&spec).await;
        }
        inner.handle.log.emit(
            "watch.started",
            json!({"watch": name, "uri": uri, "shape": Shape::Events}),
        );
        inner.handle.log.emit(
            "watch.subscribed",
            json!({"watch": name, "uri": uri, "server": server.name, "push": push}),
        );
        let scope = format!(
            "{name}#{}",
            inner
                .validations
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let task = WatchTask::new(
            inner.handle.clone(),
            server,
            spec.clone(),
            stats,
            cancel,
            scope,
            kept.is_some(),
        );
        inner.tracker.spawn(task.run_events(follow));
        Ok(WatchInfo {
            name: spec.name,
            uri: spec.uri,
            shape: Some(Shape::Events),
            events: 0,
            notices: 0,
            restore_failed: false,
            failed: false,
            starting: false,
        })
    }

    /// The first server whose `events/list` names `event`.
    async fn event_server(&self, event: &str) -> Result<Arc<Upstream>, WatchError> {
        let mut down = None;
        let mut offered = Vec::new();
        for s in &self.inner.servers {
            match s.offers_events(REQUEST_TIMEOUT).await {
                Ok(true) => {}
                Ok(false) => continue,
                Err(e) => {
                    down = Some(format!("{}: {e}", s.name));
                    continue;
                }
            }
            match event_names(s).await {
                Ok(names) if names.iter().any(|n| n == event) => return Ok(s.clone()),
                Ok(names) => offered.extend(names),
                Err(e) => down = Some(format!("{}: {e}", s.name)),
            }
        }
        if let Some(down) = down {
            return Err(WatchError::Unavailable(format!(
                "no server reached offers event type {event} (not reached: {down})"
            )));
        }
        Err(WatchError::Invalid(match offered.is_empty() {
            true => format!("no server offers event type {event}: none offers any"),
            false => format!(
                "no server offers event type {event}; offered: {}",
                offered.join(", ")
            ),
        }))
    }
}

/// The names in `up`'s `events/list`, every page.
async fn event_names(up: &Arc<Upstream>) -> Result<Vec<String>, UpstreamError> {
    let mut names = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..MAX_PAGES {
        let params = match &cursor {
            Some(c) => json!({"cursor": c}),
            None => json!({}),
        };
        let page = up.custom("events/list", params).await?;
        names.extend(
            page.get("events")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|e| e.get("name").and_then(Value::as_str))
                .map(str::to_owned),
        );
        cursor = page
            .get("nextCursor")
            .and_then(Value::as_str)
            .map(str::to_owned);
        if cursor.is_none() {
            break;
        }
    }
    Ok(names)
}

/// A follow's first failure, as a start's error: the server's verdict is a rejection.
fn refused(server: &Upstream, uri: &str, e: UpstreamError) -> WatchError {
    if e.is_verdict() || matches!(e, UpstreamError::Forbidden { .. }) {
        return WatchError::Rejected {
            server: server.name.clone(),
            uri: uri.into(),
            message: e.to_string(),
        };
    }
    WatchError::Unavailable(format!("following {uri} on {}: {e}", server.name))
}
