//! The reads a watch makes: the listen-then-read that starts (and restarts) a watch, the read
//! after an update, and the reads a listen's updates carry when the server offers them
//! (`io.herald/contents`: a herald server reads for its stream, one read after another, so
//! the watch gets its baseline and every change in order without a round trip of its own).

use std::sync::Arc;

use base64::Engine as _;
use rmcp::model::{ResourceUpdatedNotification, ServerNotification, SubscriptionFilter};

use super::Baseline;
use crate::mcp::ring::{more_waiting, newest_seq};
use crate::mcp::source::{Body, Contents};
use crate::upstream::log::{LogCursor, PAGES_PER_READ};
use crate::upstream::{Listening, Upstream, UpstreamError, carried};
use crate::watch::spec::WatchError;

/// One read of a watched resource.
pub(crate) struct Read {
    pub(crate) mime: String,
    pub(crate) text: String,
}

/// Reads `uri`, bounded by [`crate::upstream::REQUEST_TIMEOUT`], saying the highest `seq` of
/// the event log the watch has (`after`), so a herald server answers only what is newer
/// ([`crate::mcp::source::READ_AFTER_META`]). A blob is kept as its base64 text (the watch
/// diffs text).
pub(crate) async fn read(
    server: &Arc<Upstream>,
    uri: &str,
    after: Option<u64>,
) -> Result<Read, WatchError> {
    read_upstream(server, uri, after)
        .await
        .map_err(|e| watch_error(server, uri, "reading", e))
}

async fn read_upstream(
    server: &Arc<Upstream>,
    uri: &str,
    after: Option<u64>,
) -> Result<Read, UpstreamError> {
    Ok(Read::of(server.read(uri, after).await?))
}

impl Read {
    fn of(c: Contents) -> Read {
        Read {
            mime: c.mime_type,
            text: match c.body {
                Body::Text(t) => t,
                Body::Blob(b) => base64::engine::general_purpose::STANDARD.encode(b),
            },
        }
    }
}

/// What a run of updates of a listen that carries reads brought ([`carried_reads`]).
pub(crate) enum Carried {
    /// Every one carried its read: these, oldest first.
    Reads(Vec<Read>),
    /// One was plain (a URI too big to carry): the watch reads, which covers them all.
    Plain,
    /// One carried the server's failed read. The watch reads an event log itself (seqs keep
    /// order); a state it listens to again, since a read of its own could be newer than a
    /// read the server made before it and carries next.
    Failed(String),
}

/// What a run of `updates` (of a listen that carries them) brought.
pub(crate) fn carried_reads(updates: Vec<ResourceUpdatedNotification>) -> Carried {
    let mut reads = Vec::with_capacity(updates.len());
    let mut plain = false;
    for mut u in updates {
        match carried(&mut u) {
            Some(Ok(c)) => reads.push(Read::of(c)),
            Some(Err(why)) => return Carried::Failed(why),
            None => plain = true,
        }
    }
    if plain {
        return Carried::Plain;
    }
    Carried::Reads(reads)
}

/// How long a watch waits for its baseline update: longer than the server may take to read
/// it (30 s, then it carries the failure), so a late baseline never follows a read of the
/// watch's own.
const BASELINE_WAIT: std::time::Duration = std::time::Duration::from_secs(40);

/// The first read a listen that carries them sends for `uri` (the one right after its
/// acknowledgment): `Ok(None)` when it was plain (the watch reads itself); an error when the
/// server's read failed (as the watch's own read would have), or the listen ended or sent no
/// baseline in time.
async fn first_carried(listening: &mut Listening, uri: &str) -> Result<Option<Read>, String> {
    let first = async {
        loop {
            match listening.next().await {
                Ok(Some(ServerNotification::ResourceUpdatedNotification(u)))
                    if u.params.uri == uri =>
                {
                    return match carried_reads(vec![u]) {
                        Carried::Reads(mut r) => Ok(r.pop()),
                        Carried::Plain => Ok(None),
                        Carried::Failed(why) => Err(why),
                    };
                }
                Ok(Some(_)) => {}
                _ => return Err("the listen ended before its first update".to_owned()),
            }
        }
    };
    tokio::time::timeout(BASELINE_WAIT, first)
        .await
        .unwrap_or_else(|_| {
            Err(format!(
                "the listen sent no first update within {} s",
                BASELINE_WAIT.as_secs()
            ))
        })
}

/// What a watch makes of a failed request about `uri`: the server's verdict on the URI
/// (bad params, not found, an answer herald cannot use) is a rejection; anything else (an
/// internal error, a source still starting, a broken or slow connection) may pass. The
/// watch client's user named the server: they get the reason.
fn watch_error(server: &Upstream, uri: &str, doing: &str, e: UpstreamError) -> WatchError {
    if e.is_verdict() {
        return WatchError::Rejected {
            server: server.name.clone(),
            uri: uri.into(),
            message: match e {
                UpstreamError::Unusable { why, .. } => why,
                e => e.to_string(),
            },
        };
    }
    WatchError::Unavailable(format!("{doing} {uri} from {}: {e}", server.name))
}

/// Listens first, then reads: a change between the two is then announced, never missed.
pub(crate) async fn subscribe_and_read(
    server: &Arc<Upstream>,
    uri: &str,
) -> Result<(Listening, Read), WatchError> {
    let filter = SubscriptionFilter::builder()
        .resource_subscription(uri)
        .build();
    let listening = match server.listen(filter).await {
        Ok(l) => l,
        // A server that speaks no 2026-07-28 can never be watched.
        Err(UpstreamError::Unusable { server: name, why }) => {
            return Err(WatchError::Invalid(format!("{name} {why}")));
        }
        // Any error the server answered is its verdict on the URI.
        Err(e) if e.is_answered() => {
            return Err(WatchError::Rejected {
                server: server.name.clone(),
                uri: uri.into(),
                message: e.to_string(),
            });
        }
        Err(e) => return Err(watch_error(server, uri, "subscribing to", e)),
    };
    let accepted = listening
        .acknowledged()
        .resource_subscriptions
        .as_ref()
        .is_some_and(|u| u.iter().any(|a| a == uri));
    // A listen that carries reads starts with this URI's: the baseline, in order with every
    // read after it.
    let mut listening = listening;
    if accepted && listening.carries() {
        match first_carried(&mut listening, uri).await {
            Ok(Some(r)) => return Ok((listening, r)),
            Ok(None) => {}
            Err(why) => {
                return Err(WatchError::Unavailable(format!(
                    "reading {uri} from {}: {why}",
                    server.name
                )));
            }
        }
    }
    // Only a broken connection is forgotten: a source still starting or one slow read says
    // nothing about the connection other watches share.
    let r = match read_upstream(server, uri, None).await {
        Ok(r) => r,
        Err(e) => {
            if e.is_broken() {
                server.forget_connection_of(&listening);
            }
            return Err(watch_error(server, uri, "reading", e));
        }
    };
    if !accepted {
        return Err(WatchError::Rejected {
            server: server.name.clone(),
            uri: uri.into(),
            message: "the server does not accept subscriptions to this URI".into(),
        });
    }
    Ok((listening, r))
}

impl super::WatchTask {
    /// Reads what changed: a state whole; an event log past its cursor, page by page until
    /// its newest event (a whole ring at most, [`PAGES_PER_READ`]). An error says whether
    /// some pages were taken before it.
    pub(super) async fn read_pages(
        &mut self,
        base: &mut Baseline,
        filtering: bool,
    ) -> Result<(), (bool, WatchError)> {
        for page in 0..PAGES_PER_READ {
            let after = match &*base {
                Baseline::Log(c) => c.last,
                Baseline::State(_) => None,
            };
            let r = (read(&self.server, &self.spec.uri, after).await).map_err(|e| (page > 0, e))?;
            let more = after.is_some() && more_waiting(&r.text);
            self.update(base, r, filtering);
            if let Baseline::Log(c) = &*base {
                self.ahead.read_to(c.last);
            }
            // A log that restarted below the cursor moves back.
            let moved = matches!(&*base, Baseline::Log(c) if c.last != after);
            if !(more && moved) || self.cancel.is_cancelled() {
                break;
            }
        }
        Ok(())
    }

    /// Takes the read made on listening again: a state's is diffed against the last; an event
    /// log that has a cursor reads on from it instead, page by page (the listen is open, so
    /// nothing is missed), so a watch that fell behind by more than one read holds catches up
    /// without a GAP. That read stands in when the first page fails; after a later page fails,
    /// what was taken stands (the stream's next reads say any GAP).
    pub(super) async fn catch_up(&mut self, base: &mut Baseline, r: Read, filtering: bool) {
        if let Baseline::Log(LogCursor { last: Some(_) }) = base {
            // The stream's baseline: its later reads continue from it.
            self.ahead.carried(newest_seq(&r.text));
            match self.read_pages(base, filtering).await {
                Ok(()) => return,
                Err((true, e)) => {
                    tracing::warn!(watch = %self.spec.name, error = %e, "a read while catching up failed");
                    return;
                }
                Err((false, _)) => {}
            }
        }
        self.update(base, r, filtering);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::{NotificationMetaObject, ResourceUpdatedNotificationParam};
    use serde_json::json;

    fn update(carried: Option<serde_json::Value>) -> ResourceUpdatedNotification {
        let mut u =
            ResourceUpdatedNotification::new(ResourceUpdatedNotificationParam::new("memo://notes"));
        if let Some(c) = carried {
            let mut meta = NotificationMetaObject::default();
            meta.insert(crate::mcp::admission::CONTENTS.into(), c);
            u.extensions.insert(meta);
        }
        u
    }

    #[test]
    fn carried_reads_are_taken_in_order_and_one_without_makes_the_watch_read() {
        let text = |t: &str| json!({"mimeType": "application/json", "text": t});
        let Carried::Reads(reads) =
            carried_reads(vec![update(Some(text("1"))), update(Some(text("2")))])
        else {
            panic!("both carried their reads");
        };
        let texts: Vec<&str> = reads.iter().map(|r| r.text.as_str()).collect();
        assert_eq!(texts, ["1", "2"]);
        // A blob is kept as its base64.
        let blob = json!({"mimeType": "image/png", "blob": "AAEC"});
        let Carried::Reads(reads) = carried_reads(vec![update(Some(blob))]) else {
            panic!("a blob is a read");
        };
        assert_eq!(reads[0].text, "AAEC");
        // The server's read failed: said, whatever else came with it.
        let failed = json!({"error": {"code": -32603, "message": "boom"}});
        let got = carried_reads(vec![
            update(Some(text("1"))),
            update(None),
            update(Some(failed)),
        ]);
        assert!(matches!(got, Carried::Failed(ref why) if why == "boom"));
        // A plain update: the watch reads itself.
        assert!(matches!(
            carried_reads(vec![update(Some(text("1"))), update(None)]),
            Carried::Plain
        ));
    }
}
