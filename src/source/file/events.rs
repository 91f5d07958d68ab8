//! The file source in MCP Events: the `file.changed` event type, the ring URI its poll
//! arguments select, and the watch a poll keeps between polls.

use std::sync::Arc;

use rmcp::model::JsonObject;
use serde_json::{Value, json};

use super::FileSource;
use super::uri::{events_uri, parse};
use crate::mcp::events::{self, EventType, PollRequest};
use crate::mcp::ring::EventRing;
use crate::mcp::source::SourceError;

/// The event type over `file-events://watch/...` rings (MCP Events).
pub const CHANGED_EVENT: &str = "file.changed";

impl FileSource {
    /// Answers an `events/poll`: `file.changed` only, its arguments turned into the ring's
    /// URI, the ring watched (or held) by the poll lease.
    pub(super) async fn poll(&self, params: JsonObject) -> Result<Value, SourceError> {
        let req = PollRequest::parse(&params)?;
        if req.name != CHANGED_EVENT {
            return Err(events::unknown_event(&req.name));
        }
        let uri = poll_uri(&req.arguments)?;
        let ring = self.poll_ring(&uri).await?;
        Ok(events::poll(&ring, &self.feed, &uri, &req).await)
    }

    /// The ring behind a `file.changed` poll of `uri`: held by the poll lease (renewed), or
    /// watched now and held from here on.
    async fn poll_ring(&self, uri: &str) -> Result<Arc<EventRing>, SourceError> {
        let ring = match self.polls.renew(uri, |s| s.ring().cloned()) {
            Some(ring) => ring,
            None => {
                self.polls.check_room()?;
                let target = parse(uri)?;
                let confined = self.confine(&target).await?;
                let sub = self.subscribe(uri, &target, &confined).await?;
                self.polls.hold(uri, sub, |s| s.ring().cloned())?
            }
        };
        ring.ok_or_else(|| SourceError::Unavailable(format!("no event ring for {uri}")))
    }

    /// URIs `events/poll` keeps watched now.
    pub fn polled(&self) -> usize {
        self.polls.len()
    }
}

/// The event-log URI a `file.changed` poll's arguments select.
pub(crate) fn poll_uri(args: &JsonObject) -> Result<String, SourceError> {
    events::check_arguments(args, CHANGED_EVENT, &["path", "recursive", "glob"])?;
    let path = events::required_argument(args, "path", CHANGED_EVENT)?;
    if !path.starts_with('/') {
        return Err(SourceError::InvalidParams(format!(
            "path {path:?} is not absolute; give the full path of a directory or file under a served root"
        )));
    }
    let recursive = events::bool_argument(args, "recursive")?;
    let mut uri = events_uri(std::path::Path::new(&path), recursive);
    if let Some(g) = events::str_argument(args, "glob")? {
        uri.push(if recursive { '&' } else { '?' });
        uri.push_str("glob=");
        uri.push_str(&events::encode_query_value(&g));
    }
    // The same checks as a URI (a bad glob, a bad path), so a poll and a listen agree.
    parse(&uri)?;
    Ok(uri)
}

pub(super) fn file_changed() -> EventType {
    EventType {
        name: CHANGED_EVENT,
        description: "A file or directory under a served root changed: the event of \
                      file-events://watch/PATH (CREATED, MODIFIED with old, DELETED, MOVED with \
                      from and to; each with path, kind, size, mtime; ERROR and OVERFLOW in-band). \
                      The first poll starts the watch; it is kept for 5 minutes after each poll."
            .into(),
        input_schema: json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "absolute path of a directory (or one file) under a served root"},
                "recursive": {"type": "boolean", "description": "follow subdirectories (default false)"},
                "glob": {"type": "string", "description": "only names matching this pattern, e.g. *.json"}
            },
            "required": ["path"],
            "additionalProperties": false
        }),
        payload_schema: events::log_payload_schema(&[
            "CREATED", "MODIFIED", "DELETED", "MOVED", "ERROR", "OVERFLOW",
        ]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poll_arguments_select_the_event_log_uri() {
        let a = |v: Value| v.as_object().unwrap().clone();
        assert_eq!(
            poll_uri(&a(json!({"path": "/srv/d"}))).unwrap(),
            "file-events://watch/srv/d"
        );
        assert_eq!(
            poll_uri(&a(
                json!({"path": "/srv/my d", "recursive": true, "glob": "*.json"})
            ))
            .unwrap(),
            "file-events://watch/srv/my%20d?recursive=true&glob=*.json"
        );
        assert_eq!(
            poll_uri(&a(json!({"path": "/srv/d", "glob": "a&b?"}))).unwrap(),
            "file-events://watch/srv/d?glob=a%26b%3F"
        );
        for (v, needle) in [
            (json!({}), "missing argument path"),
            (json!({"path": "srv"}), "not absolute"),
            (json!({"path": "/a", "depth": 1}), "unknown argument depth"),
            (json!({"path": "/a", "recursive": "yes"}), "true or false"),
            (json!({"path": "/a", "glob": "[x"}), "without ']'"),
        ] {
            let e = poll_uri(&a(v.clone())).unwrap_err().to_string();
            assert!(e.contains(needle), "{v}: {e}");
        }
    }
}
