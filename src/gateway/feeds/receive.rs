//! The gateway's webhook receiver: a POST to `{receiver}/{feed id}` from a slug that delivers
//! its events only by webhook, checked against the feed's own secret (see `feeds.rs`).

use serde_json::{Value, json};

use super::{Feeds, RECEIVER_PATH, TOLERANCE_SECS};
use crate::hooks::deliver::Secret;
use crate::sync::Recover;

impl crate::mcp::server::webhooks::Receiver for Feeds {
    /// The gateway serves HTTP at `addr`: webhooks come there unless the config named another
    /// base.
    fn serving_http(&self, addr: std::net::SocketAddr) {
        let mut r = self.receiver.locked();
        if r.is_none() {
            let host = match addr.ip() {
                ip if ip.is_unspecified() => {
                    tracing::info!(%addr, "the gateway listens on every address: slugs that deliver events only by webhook are told to POST to 127.0.0.1, which only slugs on this host reach; set [events] receiver_url for others");
                    "127.0.0.1".to_owned()
                }
                std::net::IpAddr::V6(ip) => format!("[{ip}]"),
                ip => ip.to_string(),
            };
            *r = Some(format!("http://{host}:{}{RECEIVER_PATH}", addr.port()));
        }
    }

    /// One webhook POST to `{receiver}/{id}`: the status and JSON body to answer.
    fn receive(
        &self,
        id: &str,
        header: &dyn Fn(&str) -> Option<String>,
        body: &[u8],
    ) -> (u16, Value) {
        let feed = self.feeds.locked().values().find(|f| f.id == id).cloned();
        let refused = |status: u16, why: &str| {
            self.metrics.refused.inc();
            // Counted; logged at debug only (anyone who reaches the address can send these).
            tracing::debug!(status, reason = why, "refused a webhook");
            (status, json!({"error": why}))
        };
        // 410: the sender drops a subscription nobody here follows any more.
        let Some(feed) = feed else {
            return refused(410, "no such subscription here");
        };
        if let Err(why) = verify(&feed.secret, header, body) {
            return refused(401, why);
        }
        let Ok(msg) = serde_json::from_slice::<Value>(body) else {
            return refused(400, "the body is not JSON");
        };
        self.metrics.received.inc();
        match msg.get("type").and_then(Value::as_str) {
            Some("verification") => {
                let challenge = msg.get("challenge").cloned().unwrap_or(Value::Null);
                return (200, json!({"challenge": challenge}));
            }
            Some("gap") => feed.state.locked().gap_next = true,
            Some("terminated") => {
                tracing::warn!(feed = %feed.id, "a slug ended the gateway's webhook subscription; subscribing again");
                feed.state.locked().gap_next = true;
                feed.resubscribe.notify_one();
            }
            // An event (one the feed took already, sent again, is dropped by its eventId).
            _ => {
                let mut event = msg;
                if let Some(o) = event.as_object_mut() {
                    o.remove("cursor");
                }
                feed.take(vec![event], false, None);
            }
        }
        (200, json!({}))
    }
}

/// A Standard Webhooks signature check: one of the `v1,` signatures over
/// `{webhook-id}.{webhook-timestamp}.{body}` matches, and the timestamp is within
/// [`TOLERANCE_SECS`] of now.
pub(super) fn verify(
    secret: &Secret,
    header: &dyn Fn(&str) -> Option<String>,
    body: &[u8],
) -> Result<(), &'static str> {
    let (Some(id), Some(ts), Some(sigs)) = (
        header("webhook-id"),
        header("webhook-timestamp"),
        header("webhook-signature"),
    ) else {
        return Err("webhook-id, webhook-timestamp and webhook-signature are required");
    };
    let ts: u64 = ts
        .trim()
        .parse()
        .map_err(|_| "webhook-timestamp is not a number")?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    if now.abs_diff(ts) > TOLERANCE_SECS {
        return Err("webhook-timestamp is more than five minutes off");
    }
    let want = secret.sign(&id, ts, body);
    let ok = sigs
        .split_whitespace()
        .any(|s| equal(s.as_bytes(), want.as_bytes()));
    if ok {
        Ok(())
    } else {
        Err("no webhook-signature matches")
    }
}

/// Compares in time that depends on the length only.
fn equal(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
