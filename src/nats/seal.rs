//! [`Seal`]: the deployment's key over the event logs published on NATS (`events.rs`).

use std::sync::Arc;

use serde_json::{Value, json};
use sha2::Digest;

/// How a deployment's published event logs are sealed: the key every publisher and every
/// gateway mirroring them holds (`HERALD_EVENTS_KEY`). An event's URI, text, publisher and
/// push time go in its payload under AES-256-GCM with its subject and seq as associated data
/// (a payload moved to another subject or seq does not open); its subject names the URI by a
/// keyed hash, so no note value, file name or watched URI is in any NATS file. Each use has a
/// key of its own, derived from the deployment's (which also seals webhook subscriptions).
/// The key gives secrecy and says an event came from a holder of it; any holder can publish
/// as any name, and what is left in the clear (the seq, a subject's rate, a payload's length)
/// is not secret.
#[derive(Clone)]
pub struct Seal {
    sealer: Arc<crate::store::seal::Sealer>,
    names: ring::hmac::Key,
}

impl std::fmt::Debug for Seal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Seal(<key>)")
    }
}

impl Seal {
    pub fn new(key: &[u8; 32]) -> Seal {
        // A key per use, derived: never the deployment's key itself.
        let derive = |purpose: &[u8]| -> [u8; 32] {
            let mut h = sha2::Sha256::new();
            h.update(purpose);
            h.update(key);
            h.finalize().into()
        };
        Seal {
            sealer: Arc::new(crate::store::seal::Sealer::new(&derive(
                b"herald published event logs: sealing\n",
            ))),
            names: ring::hmac::Key::new(
                ring::hmac::HMAC_SHA256,
                &derive(b"herald published event-log subjects\n"),
            ),
        }
    }

    /// A seal under a key no one holds: opens nothing, and takes nothing in the clear (a
    /// gateway whose key cannot be read takes no event rather than forged ones).
    pub fn nothing() -> Seal {
        use ring::rand::SecureRandom;
        let mut k = [0u8; 32];
        let _ = ring::rand::SystemRandom::new().fill(&mut k);
        Seal::new(&k)
    }

    /// The subject of `uri`'s events published as `name`, its URI hashed under the key.
    pub(super) fn subject(&self, name: &str, uri: &str) -> String {
        let tag = ring::hmac::sign(&self.names, uri.as_bytes());
        format!("herald.events.{name}.{}", hex::encode(&tag.as_ref()[..8]))
    }

    fn aad(subject: &str, seq: u64) -> String {
        format!("{subject} {seq}")
    }

    /// An event of `uri`, pushed at `ts_ms` by `publisher`, sealed under its subject and seq.
    pub(super) fn seal(
        &self,
        subject: &str,
        seq: u64,
        uri: &str,
        text: &str,
        publisher: &str,
        ts_ms: u64,
    ) -> Vec<u8> {
        let plain =
            json!({"uri": uri, "event": text, "publisher": publisher, "ts": ts_ms}).to_string();
        self.sealer.seal(&Self::aad(subject, seq), plain.as_bytes())
    }

    /// A catalog as kept at `key` of the bucket (its instructions may name roots).
    pub(super) fn seal_catalog(&self, key: &str, v: &Value) -> Vec<u8> {
        self.sealer.seal(key, v.to_string().as_bytes())
    }

    pub(super) fn open_catalog(&self, key: &str, bytes: &[u8]) -> Option<Value> {
        serde_json::from_slice(&self.sealer.open(key, bytes).ok()?).ok()
    }

    /// The URI, text, publisher and push time of a sealed event; `None` when it does not
    /// open with this key.
    pub(super) fn open(
        &self,
        subject: &str,
        seq: u64,
        payload: &[u8],
    ) -> Option<(String, String, String, u64)> {
        let plain = self.sealer.open(&Self::aad(subject, seq), payload).ok()?;
        let v: Value = serde_json::from_slice(&plain).ok()?;
        Some((
            v["uri"].as_str()?.to_owned(),
            v["event"].as_str()?.to_owned(),
            v["publisher"].as_str().unwrap_or_default().to_owned(),
            v["ts"].as_u64().unwrap_or_else(crate::mcp::ring::now_ms),
        ))
    }
}
