//! JSON Web Tokens as an OAuth 2.1 resource server checks an access token (RFC 7519, RFC
//! 9068): the JWS compact form, its signature verified with ring against the issuer's key set
//! ([`KeySet`]), then `iss`, `aud`, `exp` and `nbf` with a small clock skew.
//!
//! Verified algorithms: RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384, EdDSA
//! (Ed25519). `none` and every HMAC (`HS*`) are refused whatever the key set holds, and a key
//! is used only with an algorithm of its own type (and the one it is pinned to, if the set
//! pins one), so no public key is ever taken for a shared secret.
//!
//! Written on ring (already herald's TLS crypto) rather than a JWT crate: the popular one
//! (`jsonwebtoken` 10) needs aws-lc-rs or the RustCrypto RSA stack, a second crypto library
//! in every binary, for what is about a hundred lines here.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::signature::{self, RsaPublicKeyComponents, UnparsedPublicKey};
use serde::Deserialize;
use serde_json::{Map, Value};

use super::jwks::{KeySet, PublicKey};

/// The clock skew allowed on `exp` and `nbf`, in seconds.
pub const SKEW_SECS: u64 = 60;

/// Why a token was refused. Says what is wrong with the token, never what it holds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("the bearer token is not a signed JWT (header.payload.signature)")]
    Malformed,
    #[error(
        "the token's algorithm {0} is not accepted (RS256/384/512, PS256/384/512, ES256/384, EdDSA)"
    )]
    Algorithm(String),
    #[error("the token is signed with a key its issuer does not list")]
    UnknownKey,
    #[error("the token's signature does not verify")]
    Signature,
    #[error("the token has expired")]
    Expired,
    #[error("the token is not valid yet")]
    NotYetValid,
    #[error("the token has no expiry (exp)")]
    NoExpiry,
    #[error("the token is from an issuer this server does not trust")]
    Issuer,
    #[error("the token is for another resource (aud)")]
    Audience,
    #[error("the token's type (typ) is not an access token's")]
    Type,
}

/// A token's header, read before its signature is checked (to choose the key).
#[derive(Debug, Deserialize)]
pub struct Header {
    pub alg: String,
    #[serde(default)]
    pub kid: Option<String>,
    /// The token's media type: `at+jwt` for an access token (RFC 9068), `JWT` or none as
    /// many providers issue them.
    #[serde(default)]
    pub typ: Option<String>,
    /// Extensions the signer says must be understood (RFC 7515 section 4.1.11): herald
    /// understands none, so a token naming any is refused.
    #[serde(default)]
    pub crit: Option<Value>,
}

/// A token split and decoded, not verified yet.
pub struct Unverified {
    pub header: Header,
    /// The claims as sent.
    pub claims: Map<String, Value>,
    signed: String,
    signature: Vec<u8>,
}

impl Unverified {
    /// Splits and decodes `token`; nothing is verified. Whether it looks like a JWT at all
    /// is [`looks_like_jwt`].
    pub fn parse(token: &str) -> Result<Unverified, Refusal> {
        let mut parts = token.split('.');
        let (Some(h), Some(p), Some(s), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(Refusal::Malformed);
        };
        let decode = |part: &str| URL_SAFE_NO_PAD.decode(part).map_err(|_| Refusal::Malformed);
        let header: Header = serde_json::from_slice(&decode(h)?).map_err(|_| Refusal::Malformed)?;
        if header.crit.is_some() {
            return Err(Refusal::Malformed);
        }
        let claims: Map<String, Value> =
            serde_json::from_slice(&decode(p)?).map_err(|_| Refusal::Malformed)?;
        Ok(Unverified {
            header,
            claims,
            signed: format!("{h}.{p}"),
            signature: decode(s)?,
        })
    }

    /// The `iss` claim, to choose the issuer whose keys verify the token.
    pub fn issuer(&self) -> Option<&str> {
        self.claims.get("iss").and_then(Value::as_str)
    }

    /// Verifies the signature with `keys`, then the claims against `expect`; the claims on
    /// success.
    pub fn verify(self, keys: &KeySet, expect: &Expect) -> Result<Map<String, Value>, Refusal> {
        let alg = self.header.alg.as_str();
        let family = Family::of(alg).ok_or_else(|| Refusal::Algorithm(alg.to_owned()))?;
        let key = keys
            .find(self.header.kid.as_deref())
            .ok_or(Refusal::UnknownKey)?;
        if key.alg.as_deref().is_some_and(|pinned| pinned != alg) {
            return Err(Refusal::Signature);
        }
        let msg = self.signed.as_bytes();
        let sig = &self.signature;
        let verified = match (&key.key, family) {
            (PublicKey::Rsa { n, e }, Family::Rsa(params)) => {
                RsaPublicKeyComponents { n, e }.verify(params, msg, sig)
            }
            (PublicKey::P256(point), Family::P256) => {
                UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, point).verify(msg, sig)
            }
            (PublicKey::P384(point), Family::P384) => {
                UnparsedPublicKey::new(&signature::ECDSA_P384_SHA384_FIXED, point).verify(msg, sig)
            }
            (PublicKey::Ed25519(x), Family::Ed25519) => {
                UnparsedPublicKey::new(&signature::ED25519, x).verify(msg, sig)
            }
            _ => return Err(Refusal::Signature),
        };
        verified.map_err(|_| Refusal::Signature)?;
        expect.typed(self.header.typ.as_deref())?;
        expect.check(&self.claims)?;
        Ok(self.claims)
    }
}

/// Whether a bearer token is shaped as a JWT (three base64url parts, the first a JSON
/// object): a static token never is, so it is not checked as one.
pub fn looks_like_jwt(token: &str) -> bool {
    token.starts_with("eyJ")
        && token.bytes().filter(|b| *b == b'.').count() == 2
        && token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// The key type an algorithm needs.
#[derive(Clone, Copy)]
enum Family {
    Rsa(&'static signature::RsaParameters),
    P256,
    P384,
    Ed25519,
}

impl Family {
    fn of(alg: &str) -> Option<Family> {
        Some(match alg {
            "RS256" => Family::Rsa(&signature::RSA_PKCS1_2048_8192_SHA256),
            "RS384" => Family::Rsa(&signature::RSA_PKCS1_2048_8192_SHA384),
            "RS512" => Family::Rsa(&signature::RSA_PKCS1_2048_8192_SHA512),
            "PS256" => Family::Rsa(&signature::RSA_PSS_2048_8192_SHA256),
            "PS384" => Family::Rsa(&signature::RSA_PSS_2048_8192_SHA384),
            "PS512" => Family::Rsa(&signature::RSA_PSS_2048_8192_SHA512),
            "ES256" => Family::P256,
            "ES384" => Family::P384,
            "EdDSA" | "Ed25519" => Family::Ed25519,
            _ => return None,
        })
    }
}

/// What a token's claims must say.
pub struct Expect<'a> {
    /// `iss`, exactly.
    pub issuer: &'a str,
    /// One of `aud` (a string or an array of them).
    pub audience: &'a str,
    /// Seconds since the Unix epoch.
    pub now: u64,
    /// Only `typ: at+jwt` (the issuer's `require_at_jwt`); else also none and `JWT`.
    pub at_jwt_only: bool,
}

impl Expect<'_> {
    /// Whether a token of type `typ` (RFC 7515: case-insensitive, `application/` implied)
    /// may be an access token: `at+jwt` always; untyped and `JWT` unless only `at+jwt` is
    /// taken; any other type (a logout token, a security event, a DPoP proof) never.
    fn typed(&self, typ: Option<&str>) -> Result<(), Refusal> {
        let t = typ.map(|t| t.to_ascii_lowercase());
        let t = t
            .as_deref()
            .map(|t| t.strip_prefix("application/").unwrap_or(t));
        match t {
            Some("at+jwt") => Ok(()),
            None | Some("jwt") if !self.at_jwt_only => Ok(()),
            _ => Err(Refusal::Type),
        }
    }

    fn check(&self, claims: &Map<String, Value>) -> Result<(), Refusal> {
        if claims.get("iss").and_then(Value::as_str) != Some(self.issuer) {
            return Err(Refusal::Issuer);
        }
        let aud_ok = match claims.get("aud") {
            Some(Value::String(a)) => a == self.audience,
            Some(Value::Array(a)) => a.iter().any(|v| v.as_str() == Some(self.audience)),
            _ => false,
        };
        if !aud_ok {
            return Err(Refusal::Audience);
        }
        let exp = claims
            .get("exp")
            .and_then(Value::as_f64)
            .ok_or(Refusal::NoExpiry)?;
        if exp + SKEW_SECS as f64 <= self.now as f64 {
            return Err(Refusal::Expired);
        }
        if let Some(nbf) = claims.get("nbf").and_then(Value::as_f64)
            && nbf > (self.now + SKEW_SECS) as f64
        {
            return Err(Refusal::NotYetValid);
        }
        Ok(())
    }
}

/// The scopes a token grants: its `claim` (`scope` by default) as a space-separated string
/// (RFC 9068) or an array of strings (as some providers send `scp`).
pub fn scopes(claims: &Map<String, Value>, claim: &str) -> Vec<String> {
    match claims.get(claim) {
        Some(Value::String(s)) => s.split_whitespace().map(str::to_owned).collect(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
#[path = "jwt_tests.rs"]
mod tests;
