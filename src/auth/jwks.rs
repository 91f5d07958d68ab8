//! JSON Web Key sets (RFC 7517) as a resource server uses them: the public keys an issuer
//! signs access tokens with. Only signing keys herald can verify with are kept (RSA, EC P-256
//! and P-384, Ed25519); a key of another type, or marked for encryption, is skipped, never an
//! error (an issuer's set often holds both). Symmetric keys (`kty: oct`) are never kept: a
//! token is never checked with a shared secret.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Deserialize;

/// One public key, as ring takes it.
#[derive(Clone, PartialEq, Eq)]
pub enum PublicKey {
    /// RSA: the modulus and exponent, big-endian.
    Rsa { n: Vec<u8>, e: Vec<u8> },
    /// EC P-256: the uncompressed point (`04 || x || y`).
    P256(Vec<u8>),
    /// EC P-384: the uncompressed point.
    P384(Vec<u8>),
    /// Ed25519: the 32-byte public key.
    Ed25519(Vec<u8>),
}

/// A key of a set: its id, the algorithm it is pinned to (if the set says), and the key.
#[derive(Clone, PartialEq, Eq)]
pub struct Jwk {
    pub kid: Option<String>,
    pub alg: Option<String>,
    pub key: PublicKey,
}

/// The keys of one issuer.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct KeySet {
    pub keys: Vec<Jwk>,
}

impl std::fmt::Debug for KeySet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Key ids only: public keys are not secret, but a log has no use for them.
        let kids: Vec<&str> = self
            .keys
            .iter()
            .map(|k| k.kid.as_deref().unwrap_or("-"))
            .collect();
        f.debug_struct("KeySet").field("kids", &kids).finish()
    }
}

#[derive(Deserialize)]
struct RawSet {
    keys: Vec<serde_json::Value>,
}

#[derive(Deserialize)]
struct RawKey {
    kty: String,
    #[serde(default)]
    kid: Option<String>,
    #[serde(default)]
    alg: Option<String>,
    #[serde(default, rename = "use")]
    use_: Option<String>,
    #[serde(default)]
    crv: Option<String>,
    #[serde(default)]
    n: Option<String>,
    #[serde(default)]
    e: Option<String>,
    #[serde(default)]
    x: Option<String>,
    #[serde(default)]
    y: Option<String>,
}

impl KeySet {
    /// The usable keys of a JWKS document (`{"keys": [...]}`). Fails only when the document
    /// is not a key set at all; keys herald cannot use are skipped.
    pub fn parse(json: &[u8]) -> Result<KeySet, String> {
        let raw: RawSet = serde_json::from_slice(json)
            .map_err(|e| format!("not a JSON Web Key set ({{\"keys\": [...]}}): {e}"))?;
        let keys = raw
            .keys
            .into_iter()
            .filter_map(|v| serde_json::from_value::<RawKey>(v).ok())
            .filter_map(usable)
            .collect();
        Ok(KeySet { keys })
    }

    /// The key named `kid`; with no `kid`, the one key if the set has just one.
    pub fn find(&self, kid: Option<&str>) -> Option<&Jwk> {
        match kid {
            Some(kid) => self.keys.iter().find(|k| k.kid.as_deref() == Some(kid)),
            None if self.keys.len() == 1 => self.keys.first(),
            None => None,
        }
    }
}

/// The key `raw` holds, if it is a signing key of a type herald verifies with.
fn usable(raw: RawKey) -> Option<Jwk> {
    if raw.use_.as_deref().is_some_and(|u| u != "sig") {
        return None;
    }
    let b64 = |s: &Option<String>| URL_SAFE_NO_PAD.decode(s.as_deref()?.as_bytes()).ok();
    let key = match (raw.kty.as_str(), raw.crv.as_deref()) {
        ("RSA", _) => PublicKey::Rsa {
            n: b64(&raw.n)?,
            e: b64(&raw.e)?,
        },
        ("EC", Some(crv @ ("P-256" | "P-384"))) => {
            let (x, y) = (b64(&raw.x)?, b64(&raw.y)?);
            let size = if crv == "P-256" { 32 } else { 48 };
            if x.len() != size || y.len() != size {
                return None;
            }
            let mut point = Vec::with_capacity(1 + 2 * size);
            point.push(4);
            point.extend_from_slice(&x);
            point.extend_from_slice(&y);
            if crv == "P-256" {
                PublicKey::P256(point)
            } else {
                PublicKey::P384(point)
            }
        }
        ("OKP", Some("Ed25519")) => {
            let x = b64(&raw.x)?;
            if x.len() != 32 {
                return None;
            }
            PublicKey::Ed25519(x)
        }
        _ => return None,
    };
    Some(Jwk {
        kid: raw.kid,
        alg: raw.alg,
        key,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_signing_keys_and_skips_the_rest() {
        let set = KeySet::parse(
            br#"{"keys": [
                {"kty": "oct", "k": "c2VjcmV0", "kid": "hmac"},
                {"kty": "RSA", "kid": "enc", "use": "enc", "n": "AQAB", "e": "AQAB"},
                {"kty": "RSA", "kid": "r1", "n": "AQAB", "e": "AQAB"},
                {"kty": "EC", "kid": "e1", "crv": "P-256",
                 "x": "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
                 "y": "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"},
                {"kty": "EC", "kid": "short", "crv": "P-256", "x": "AA", "y": "AA"},
                {"kty": "OKP", "kid": "x", "crv": "X25519",
                 "x": "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"},
                {"kty": "OKP", "kid": "d1", "crv": "Ed25519",
                 "x": "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"},
                "not a key"
            ]}"#,
        )
        .unwrap();
        let kids: Vec<_> = set.keys.iter().map(|k| k.kid.clone().unwrap()).collect();
        assert_eq!(kids, ["r1", "e1", "d1"]);
        assert!(
            matches!(set.find(Some("e1")).unwrap().key, PublicKey::P256(ref p) if p.len() == 65 && p[0] == 4)
        );
        assert!(set.find(Some("hmac")).is_none());
        assert!(set.find(None).is_none(), "no kid and three keys: no guess");
    }

    #[test]
    fn a_lone_key_serves_a_token_without_kid() {
        let set =
            KeySet::parse(br#"{"keys": [{"kty": "RSA", "n": "AQAB", "e": "AQAB"}]}"#).unwrap();
        assert!(set.find(None).is_some());
        assert!(set.find(Some("other")).is_none());
    }

    #[test]
    fn a_document_that_is_no_key_set_is_refused() {
        let e = KeySet::parse(b"{\"issuer\": \"x\"}").unwrap_err();
        assert!(e.contains("not a JSON Web Key set"), "{e}");
    }
}
