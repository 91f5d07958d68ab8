//! [`Seal`]: the deployment's key over the event logs published on NATS (`events.rs`).

use std::sync::Arc;

use serde_json::{Value, json};
use sha2::Digest;

/// How a deployment's published event logs are sealed: the key every publisher and every
/// gateway mirroring them holds (`HERALD_EVENTS_KEY`). An event's URI and text go in its
/// payload under AES-256-GCM with its subject and seq as associated data (a payload moved to
/// another subject or seq does not open); its subject names the URI by a keyed hash, so no
/// note value, file name or watched URI is in any NATS file.
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
        // The subjects' key is derived, never the sealing key itself.
        let mut h = sha2::Sha256::new();
        h.update(b"herald published event-log subjects\n");
        h.update(key);
        Seal {
            sealer: Arc::new(crate::store::seal::Sealer::new(key)),
            names: ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &h.finalize()),
        }
    }

    /// The subject of `uri`'s events published as `name`, its URI hashed under the key.
    pub(super) fn subject(&self, name: &str, uri: &str) -> String {
        let tag = ring::hmac::sign(&self.names, uri.as_bytes());
        format!("herald.events.{name}.{}", hex::encode(&tag.as_ref()[..8]))
    }

    fn aad(subject: &str, seq: u64) -> String {
        format!("{subject} {seq}")
    }

    pub(super) fn seal(&self, subject: &str, seq: u64, uri: &str, text: &str) -> Vec<u8> {
        let plain = json!({"uri": uri, "event": text}).to_string();
        self.sealer.seal(&Self::aad(subject, seq), plain.as_bytes())
    }

    /// A catalog as kept at `key` of the bucket (its instructions may name roots).
    pub(super) fn seal_catalog(&self, key: &str, v: &Value) -> Vec<u8> {
        self.sealer.seal(key, v.to_string().as_bytes())
    }

    pub(super) fn open_catalog(&self, key: &str, bytes: &[u8]) -> Option<Value> {
        serde_json::from_slice(&self.sealer.open(key, bytes).ok()?).ok()
    }

    /// The URI and text of a sealed event; `None` when it does not open with this key.
    pub(super) fn open(&self, subject: &str, seq: u64, payload: &[u8]) -> Option<(String, String)> {
        let plain = self.sealer.open(&Self::aad(subject, seq), payload).ok()?;
        let v: Value = serde_json::from_slice(&plain).ok()?;
        Some((
            v["uri"].as_str()?.to_owned(),
            v["event"].as_str()?.to_owned(),
        ))
    }
}

