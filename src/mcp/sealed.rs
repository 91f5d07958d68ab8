//! Sealed strings: what a server hands a client to send back untouched (SEP-2322
//! `requestState`), signed (HMAC-SHA256) with a key made when the process starts and bound to
//! a context (who it was issued to, for what), so a value changed, forged, or sent back by
//! someone else or for something else does not open. Not encrypted: do not seal secrets.
//! A process that restarts forgets its key, and what it sealed before no longer opens.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use ring::hmac;

/// Seals and opens strings with this process's key.
pub struct Sealer {
    key: hmac::Key,
}

impl Default for Sealer {
    fn default() -> Sealer {
        Sealer::new()
    }
}

impl Sealer {
    /// A sealer with a fresh random key.
    pub fn new() -> Sealer {
        let rng = ring::rand::SystemRandom::new();
        Sealer {
            key: hmac::Key::generate(hmac::HMAC_SHA256, &rng).expect("the system's random source"),
        }
    }

    /// The signed message: each context part and the payload, length-prefixed (so no two
    /// different contexts sign the same bytes).
    fn message(context: &[&str], payload: &[u8]) -> Vec<u8> {
        let mut m = Vec::with_capacity(payload.len() + 64);
        for part in context.iter().map(|p| p.as_bytes()).chain([payload]) {
            m.extend_from_slice(&(part.len() as u64).to_be_bytes());
            m.extend_from_slice(part);
        }
        m
    }

    /// `payload` sealed for `context`: `payload.tag`, both base64url.
    pub fn seal(&self, context: &[&str], payload: &str) -> String {
        let tag = hmac::sign(&self.key, &Sealer::message(context, payload.as_bytes()));
        format!("{}.{}", B64.encode(payload), B64.encode(tag.as_ref()))
    }

    /// What `sealed` holds, when it was sealed here for exactly `context`.
    pub fn open(&self, context: &[&str], sealed: &str) -> Option<String> {
        let (payload, tag) = sealed.split_once('.')?;
        let payload = B64.decode(payload).ok()?;
        let tag = B64.decode(tag).ok()?;
        hmac::verify(&self.key, &Sealer::message(context, &payload), &tag).ok()?;
        String::from_utf8(payload).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_string_opens_only_untouched_and_for_its_context() {
        let s = Sealer::new();
        let sealed = s.seal(&["alice", "fx"], "round=1");
        assert_eq!(
            s.open(&["alice", "fx"], &sealed).as_deref(),
            Some("round=1")
        );
        assert_eq!(s.open(&["bob", "fx"], &sealed), None);
        assert_eq!(s.open(&["alice", "other"], &sealed), None);
        assert_eq!(s.open(&["alicef", "x"], &sealed), None);
        let mut tampered = sealed.clone();
        tampered.replace_range(0..1, if sealed.starts_with('A') { "B" } else { "A" });
        assert_eq!(s.open(&["alice", "fx"], &tampered), None);
        assert_eq!(s.open(&["alice", "fx"], "not sealed"), None);
        // Another process (another key) cannot open it.
        assert_eq!(Sealer::new().open(&["alice", "fx"], &sealed), None);
    }
}
