//! Tokens signed here with ring (Ed25519, P-256) against the verifier. RSA, and tokens minted
//! by a JOSE library no one here wrote (PyJWT), are in tests/it/oauth.rs.

use super::*;
use crate::auth::jwks::Jwk;
use ring::rand::SystemRandom;
use ring::signature::{EcdsaKeyPair, Ed25519KeyPair, KeyPair};
use serde_json::json;

const NOW: u64 = 1_800_000_000;

fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

struct Signer {
    ed: Ed25519KeyPair,
    ec: EcdsaKeyPair,
}

impl Signer {
    fn new() -> Signer {
        let rng = SystemRandom::new();
        let ed = Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
        let ec_doc =
            EcdsaKeyPair::generate_pkcs8(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
                .unwrap();
        Signer {
            ed: Ed25519KeyPair::from_pkcs8(ed.as_ref()).unwrap(),
            ec: EcdsaKeyPair::from_pkcs8(
                &signature::ECDSA_P256_SHA256_FIXED_SIGNING,
                ec_doc.as_ref(),
                &rng,
            )
            .unwrap(),
        }
    }

    fn keys(&self) -> KeySet {
        KeySet {
            keys: vec![
                Jwk {
                    kid: Some("ed".into()),
                    alg: None,
                    key: PublicKey::Ed25519(self.ed.public_key().as_ref().to_vec()),
                },
                Jwk {
                    kid: Some("ec".into()),
                    alg: Some("ES256".into()),
                    key: PublicKey::P256(self.ec.public_key().as_ref().to_vec()),
                },
            ],
        }
    }

    /// A token with `header` and `claims`, signed by the key the header's `alg` names.
    fn token(&self, header: Value, claims: Value) -> String {
        let signed = format!(
            "{}.{}",
            b64(header.to_string().as_bytes()),
            b64(claims.to_string().as_bytes())
        );
        let sig = match header["alg"].as_str() {
            Some("ES256") => self
                .ec
                .sign(&SystemRandom::new(), signed.as_bytes())
                .unwrap()
                .as_ref()
                .to_vec(),
            _ => self.ed.sign(signed.as_bytes()).as_ref().to_vec(),
        };
        format!("{signed}.{}", b64(&sig))
    }
}

fn claims() -> Value {
    json!({"iss": "https://id.example", "aud": "https://herald.example/mcp",
           "exp": NOW + 300, "scope": "herald:memo herald:file:read"})
}

fn expect() -> Expect<'static> {
    Expect {
        issuer: "https://id.example",
        audience: "https://herald.example/mcp",
        now: NOW,
        at_jwt_only: false,
    }
}

fn check(s: &Signer, token: &str) -> Result<Map<String, Value>, Refusal> {
    Unverified::parse(token)?.verify(&s.keys(), &expect())
}

#[test]
fn ed25519_and_es256_tokens_verify() {
    let s = Signer::new();
    for (alg, kid) in [("EdDSA", "ed"), ("ES256", "ec")] {
        let t = s.token(json!({"alg": alg, "kid": kid, "typ": "at+jwt"}), claims());
        assert!(looks_like_jwt(&t));
        let c = check(&s, &t).unwrap_or_else(|e| panic!("{alg}: {e}"));
        assert_eq!(
            scopes(&c, "scope"),
            ["herald:memo", "herald:file:read"],
            "{alg}"
        );
    }
}

#[test]
fn none_and_hmac_are_refused_whatever_the_keys() {
    let s = Signer::new();
    let body = b64(claims().to_string().as_bytes());
    let none = format!("{}.{body}.", b64(br#"{"alg":"none","kid":"ed"}"#));
    assert_eq!(
        check(&s, &none).unwrap_err(),
        Refusal::Algorithm("none".into())
    );
    // HS256 keyed with the public key's bytes: the classic confusion.
    let header = b64(br#"{"alg":"HS256","kid":"ed"}"#);
    let signed = format!("{header}.{body}");
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, s.ed.public_key().as_ref());
    let tag = ring::hmac::sign(&key, signed.as_bytes());
    let hs = format!("{signed}.{}", b64(tag.as_ref()));
    assert_eq!(
        check(&s, &hs).unwrap_err(),
        Refusal::Algorithm("HS256".into())
    );
}

#[test]
fn a_key_is_used_only_with_its_own_algorithm() {
    let s = Signer::new();
    // An Ed25519 signature presented as ES256 under the Ed25519 key's id.
    let t = s.token(json!({"alg": "EdDSA", "kid": "ed"}), claims());
    let (_, rest) = t.split_once('.').unwrap();
    let forged = format!("{}.{rest}", b64(br#"{"alg":"ES256","kid":"ed"}"#));
    assert_eq!(check(&s, &forged).unwrap_err(), Refusal::Signature);
    // The EC key is pinned to ES256: an ES384 header on it is refused.
    let t = s.token(json!({"alg": "ES256", "kid": "ec"}), claims());
    let (_, rest) = t.split_once('.').unwrap();
    let forged = format!("{}.{rest}", b64(br#"{"alg":"ES384","kid":"ec"}"#));
    assert_eq!(check(&s, &forged).unwrap_err(), Refusal::Signature);
}

#[test]
fn tampering_and_unknown_keys_are_refused() {
    let s = Signer::new();
    let t = s.token(json!({"alg": "EdDSA", "kid": "ed"}), claims());
    let parts: Vec<&str> = t.split('.').collect();
    let mut more = claims();
    more["scope"] = json!("herald:*");
    let tampered = format!(
        "{}.{}.{}",
        parts[0],
        b64(more.to_string().as_bytes()),
        parts[2]
    );
    assert_eq!(check(&s, &tampered).unwrap_err(), Refusal::Signature);
    let other = s.token(json!({"alg": "EdDSA", "kid": "gone"}), claims());
    assert_eq!(check(&s, &other).unwrap_err(), Refusal::UnknownKey);
    let nokid = s.token(json!({"alg": "EdDSA"}), claims());
    assert_eq!(
        check(&s, &nokid).unwrap_err(),
        Refusal::UnknownKey,
        "no kid and two keys: no guess"
    );
    let crit = s.token(
        json!({"alg": "EdDSA", "kid": "ed", "crit": ["exp"]}),
        claims(),
    );
    assert_eq!(check(&s, &crit).unwrap_err(), Refusal::Malformed, "crit");
    for junk in ["", "a.b", "a.b.c.d", "eyJ.eyJ.x", "not a token"] {
        assert_eq!(check(&s, junk).unwrap_err(), Refusal::Malformed, "{junk}");
    }
}

#[test]
fn claims_are_checked_with_a_small_skew() {
    let s = Signer::new();
    let cases = [
        (json!({"exp": NOW - SKEW_SECS - 1}), Err(Refusal::Expired)),
        (json!({"exp": NOW - SKEW_SECS + 1}), Ok(())),
        (json!({"exp": null}), Err(Refusal::NoExpiry)),
        (
            json!({"nbf": NOW + SKEW_SECS + 5}),
            Err(Refusal::NotYetValid),
        ),
        (json!({"nbf": NOW + 10}), Ok(())),
        (json!({"iss": "https://evil.example"}), Err(Refusal::Issuer)),
        (
            json!({"aud": "https://other.example"}),
            Err(Refusal::Audience),
        ),
        (json!({"aud": ["x", "https://herald.example/mcp"]}), Ok(())),
        (json!({"aud": null}), Err(Refusal::Audience)),
    ];
    for (change, want) in cases {
        let mut c = claims();
        for (k, v) in change.as_object().unwrap() {
            if v.is_null() {
                c.as_object_mut().unwrap().remove(k);
            } else {
                c[k] = v.clone();
            }
        }
        let t = s.token(json!({"alg": "EdDSA", "kid": "ed"}), c);
        assert_eq!(check(&s, &t).map(|_| ()), want, "{change}");
    }
}

#[test]
fn scopes_read_strings_and_arrays() {
    let c = json!({"scope": "a  b", "scp": ["c", 1, "d"]});
    let c = c.as_object().unwrap();
    assert_eq!(scopes(c, "scope"), ["a", "b"]);
    assert_eq!(scopes(c, "scp"), ["c", "d"]);
    assert!(scopes(c, "missing").is_empty());
}

#[test]
fn only_jwt_shaped_tokens_are_read_as_jwts() {
    assert!(!looks_like_jwt("s3cret-static-token"));
    assert!(!looks_like_jwt("eyJhbGciOiJub25lIn0.e30"));
    assert!(!looks_like_jwt("eyJ a.b.c"));
    assert!(looks_like_jwt("eyJhbGciOiJub25lIn0.e30.sig"));
}

#[test]
fn an_access_token_is_typed_as_one_or_untyped_and_nothing_else() {
    let s = Signer::new();
    let typed = |typ: Option<&str>| {
        let mut h = json!({"alg": "EdDSA", "kid": "ed"});
        if let Some(t) = typ {
            h["typ"] = t.into();
        }
        s.token(h, claims())
    };
    let strict = Expect {
        at_jwt_only: true,
        ..expect()
    };
    for (typ, taken, taken_strict) in [
        (Some("at+jwt"), true, true),
        (Some("application/at+JWT"), true, true),
        (Some("JWT"), true, false),
        (None, true, false),
        (Some("logout+jwt"), false, false),
        (Some("secevent+jwt"), false, false),
        (Some("dpop+jwt"), false, false),
    ] {
        let t = typed(typ);
        let got = check(&s, &t);
        assert_eq!(got.is_ok(), taken, "{typ:?}: {got:?}");
        if !taken {
            assert_eq!(got.unwrap_err(), Refusal::Type, "{typ:?}");
        }
        let got = Unverified::parse(&t).unwrap().verify(&s.keys(), &strict);
        assert_eq!(got.is_ok(), taken_strict, "strict, {typ:?}: {got:?}");
    }
}
