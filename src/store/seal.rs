//! Sealing rows that hold credentials or private text (the Slack buffer, webhook
//! subscriptions): AES-256-GCM (ring's, the AEAD rustls already links) under the configured key, with the row's key as authenticated data, so the store holds no readable
//! message text and a row copied under another key does not open. A sealed row is
//! `version (1 byte) | nonce (12) | ciphertext | tag (16)`; the nonce is random per write.

use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};

const VERSION: u8 = 1;

/// Decodes a 32-byte sealing key from hex (64 digits) or base64 (standard or URL-safe,
/// padded or not); the error says why, never the text.
pub fn decode_key(text: &str) -> Result<[u8; 32], String> {
    use base64::Engine as _;
    let text = text.trim();
    let bytes = if text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit()) {
        hex::decode(text).map_err(|_| "it is not valid hex".to_owned())?
    } else {
        let engines = [
            base64::engine::general_purpose::STANDARD,
            base64::engine::general_purpose::STANDARD_NO_PAD,
            base64::engine::general_purpose::URL_SAFE,
            base64::engine::general_purpose::URL_SAFE_NO_PAD,
        ];
        engines
            .iter()
            .find_map(|e| e.decode(text).ok())
            .ok_or_else(|| "it is neither 64 hex digits nor base64".to_owned())?
    };
    bytes
        .as_slice()
        .try_into()
        .map_err(|_| format!("it decodes to {} bytes", bytes.len()))
}

/// Seals and opens rows under one key.
pub struct Sealer {
    key: LessSafeKey,
    rng: SystemRandom,
}

/// A row that does not open: another key sealed it, it was moved to another row key, or its
/// bytes were changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the row does not open with this key")]
pub struct Unsealable;

impl Sealer {
    pub fn new(key: &[u8; 32]) -> Sealer {
        let unbound = UnboundKey::new(&AES_256_GCM, key).expect("a 32-byte key fits AES-256");
        Sealer {
            key: LessSafeKey::new(unbound),
            rng: SystemRandom::new(),
        }
    }

    /// Seals `plain` for the row `row_key`.
    pub fn seal(&self, row_key: &str, plain: &[u8]) -> Vec<u8> {
        let mut nonce = [0u8; NONCE_LEN];
        self.rng
            .fill(&mut nonce)
            .expect("the system's random source works");
        let mut out = Vec::with_capacity(1 + NONCE_LEN + plain.len() + AES_256_GCM.tag_len());
        out.push(VERSION);
        out.extend_from_slice(&nonce);
        let mut body = plain.to_vec();
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(row_key.as_bytes()),
                &mut body,
            )
            .expect("sealing a buffer-sized row cannot fail");
        out.extend_from_slice(&body);
        out
    }

    /// Opens a row sealed for `row_key`.
    pub fn open(&self, row_key: &str, sealed: &[u8]) -> Result<Vec<u8>, Unsealable> {
        if sealed.len() < 1 + NONCE_LEN + AES_256_GCM.tag_len() || sealed[0] != VERSION {
            return Err(Unsealable);
        }
        let nonce: [u8; NONCE_LEN] = sealed[1..1 + NONCE_LEN]
            .try_into()
            .map_err(|_| Unsealable)?;
        let mut body = sealed[1 + NONCE_LEN..].to_vec();
        let plain = self
            .key
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(row_key.as_bytes()),
                &mut body,
            )
            .map_err(|_| Unsealable)?;
        Ok(plain.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_opens_only_under_its_key_and_row() {
        let s = Sealer::new(&[7; 32]);
        let sealed = s.seal("m:C1:1.000100", b"hello world");
        assert!(
            !sealed.windows(5).any(|w| w == b"hello"),
            "no plain text in the sealed bytes"
        );
        assert_eq!(s.open("m:C1:1.000100", &sealed).unwrap(), b"hello world");
        assert_eq!(
            s.open("m:C1:2.000100", &sealed),
            Err(Unsealable),
            "moved row"
        );
        let other = Sealer::new(&[8; 32]);
        assert_eq!(other.open("m:C1:1.000100", &sealed), Err(Unsealable));
        let mut flipped = sealed.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert_eq!(s.open("m:C1:1.000100", &flipped), Err(Unsealable));
        assert_eq!(s.open("m:C1:1.000100", &sealed[..10]), Err(Unsealable));
        assert_ne!(
            s.seal("k", b"x"),
            s.seal("k", b"x"),
            "a fresh nonce each time"
        );
    }
}
