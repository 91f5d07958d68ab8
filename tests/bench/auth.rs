//! OAuth access tokens (issue 34): what checking one costs.
//!
//! 1. Verification alone: a token seen for the first time (its signature checked: RS256 with a
//!    2048-bit key, ES256, EdDSA) and one seen before (the grant remembered), µs per check.
//!    Target: under 20 µs per request with a warm key set (a client sends one token for many
//!    requests).
//! 2. A gateway's `tools/call` over HTTP in front of `herald memo`, with an access token
//!    (RS256) against a static `[[token]]`, alternating rounds on one gateway in one run:
//!    p50, p99 and the ratio.
//!
//! `cargo bench --bench auth` (HERALD_BENCH_N overrides the 4,000 calls per side). Needs
//! `openssl` on PATH (it makes the RSA key; ring signs with it).

use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use herald::auth::issuer::{IssuerConfig, Issuers};
use ring::rand::SystemRandom;
use ring::signature::{self, EcdsaKeyPair, Ed25519KeyPair, KeyPair, RsaKeyPair};
use serde_json::{Value, json};

#[path = "common.rs"]
mod common;
use common::*;

const ISSUER: &str = "https://id.bench.herald.test";
const AUDIENCE: &str = "https://herald.bench/mcp";
const STATIC: &str = "static-bench-token-0c4e";

fn b64(b: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(b)
}

struct Keys {
    rsa: RsaKeyPair,
    ec: EcdsaKeyPair,
    ed: Ed25519KeyPair,
}

impl Keys {
    fn new(dir: &std::path::Path) -> Keys {
        // PKCS#1 DER (ring's `from_der`): `genrsa -traditional`, then DER.
        let pem = dir.join("rsa.pem");
        let der = dir.join("rsa.der");
        let (pem_s, der_s) = (pem.to_str().unwrap(), der.to_str().unwrap());
        for args in [
            vec!["genrsa", "-traditional", "-out", pem_s, "2048"],
            vec![
                "rsa",
                "-traditional",
                "-in",
                pem_s,
                "-outform",
                "DER",
                "-out",
                der_s,
            ],
        ] {
            let ok = std::process::Command::new("openssl")
                .args(&args)
                .stderr(std::process::Stdio::null())
                .status()
                .expect("openssl runs")
                .success();
            assert!(ok, "openssl {args:?}");
        }
        let rng = SystemRandom::new();
        let ec = EcdsaKeyPair::generate_pkcs8(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
            .unwrap();
        let ed = Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
        Keys {
            rsa: RsaKeyPair::from_der(&std::fs::read(&der).unwrap()).unwrap(),
            ec: EcdsaKeyPair::from_pkcs8(
                &signature::ECDSA_P256_SHA256_FIXED_SIGNING,
                ec.as_ref(),
                &rng,
            )
            .unwrap(),
            ed: Ed25519KeyPair::from_pkcs8(ed.as_ref()).unwrap(),
        }
    }

    fn jwks(&self) -> Value {
        let public: signature::RsaPublicKeyComponents<Vec<u8>> = self.rsa.public().into();
        let ec = self.ec.public_key().as_ref();
        json!({"keys": [
            {"kty": "RSA", "kid": "rsa", "n": b64(&public.n), "e": b64(&public.e)},
            {"kty": "EC", "kid": "ec", "crv": "P-256", "x": b64(&ec[1..33]), "y": b64(&ec[33..65])},
            {"kty": "OKP", "kid": "ed", "crv": "Ed25519", "x": b64(self.ed.public_key().as_ref())},
        ]})
    }

    /// A token by `alg` (`RS256`, `ES256`, `EdDSA`), unique by `jti`.
    fn mint(&self, alg: &str, jti: u64) -> String {
        let kid = match alg {
            "RS256" => "rsa",
            "ES256" => "ec",
            _ => "ed",
        };
        let exp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
            + 3600;
        let header = json!({"alg": alg, "kid": kid, "typ": "at+jwt"});
        let claims = json!({"iss": ISSUER, "aud": AUDIENCE, "exp": exp, "sub": "bench",
                            "jti": jti, "scope": "herald:memo"});
        let signed = format!(
            "{}.{}",
            b64(header.to_string().as_bytes()),
            b64(claims.to_string().as_bytes())
        );
        let rng = SystemRandom::new();
        let sig = match alg {
            "RS256" => {
                let mut sig = vec![0; self.rsa.public().modulus_len()];
                self.rsa
                    .sign(
                        &signature::RSA_PKCS1_SHA256,
                        &rng,
                        signed.as_bytes(),
                        &mut sig,
                    )
                    .unwrap();
                sig
            }
            "ES256" => self
                .ec
                .sign(&rng, signed.as_bytes())
                .unwrap()
                .as_ref()
                .to_vec(),
            _ => self.ed.sign(signed.as_bytes()).as_ref().to_vec(),
        };
        format!("{signed}.{}", b64(&sig))
    }
}

fn verification(keys: &Keys, jwks: &std::path::Path, n: usize) -> f64 {
    let issuers = Issuers::new(vec![IssuerConfig {
        url: ISSUER.into(),
        audience: AUDIENCE.into(),
        jwks_file: Some(jwks.to_owned()),
        scope_claim: "scope".into(),
        require_at_jwt: false,
    }])
    .unwrap();
    let mut warm_worst: f64 = 0.0;
    for alg in ["RS256", "ES256", "EdDSA"] {
        let tokens: Vec<String> = (0..n as u64).map(|i| keys.mint(alg, i)).collect();
        let t0 = Instant::now();
        for t in &tokens {
            issuers.verify(t).expect("verifies");
        }
        let cold = t0.elapsed().as_secs_f64() * 1e6 / n as f64;
        let one = &tokens[0];
        let t0 = Instant::now();
        for _ in 0..n {
            issuers.verify(one).expect("verifies");
        }
        let warm = t0.elapsed().as_secs_f64() * 1e6 / n as f64;
        warm_worst = warm_worst.max(warm);
        println!(
            "verify {alg}: first sight {cold:.1} µs (signature checked), seen before {warm:.2} µs (remembered), n={n}"
        );
    }
    warm_worst
}

async fn calls(c: &mut RawHttp, n: usize, id: &mut u64) -> Vec<Duration> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        *id += 1;
        let t0 = Instant::now();
        c.call_tool(*id, "memo__memo_set", &json!({"key": "k", "value": *id}))
            .await
            .expect("the call is answered");
        out.push(t0.elapsed());
    }
    out
}

#[tokio::main]
async fn main() {
    let n: usize = std::env::var("HERALD_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4000);
    let dir = std::env::temp_dir().join(format!("herald-bench-auth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let keys = Keys::new(&dir);
    let jwks = dir.join("jwks.json");
    std::fs::write(&jwks, keys.jwks().to_string()).unwrap();

    let warm = verification(&keys, &jwks, n);
    println!(
        "target verify (warm): {warm:.2} µs vs 20 µs -> {}",
        verdict(warm < 20.0)
    );

    // The gateway, with both kinds of credential.
    let (_memo, info) = memo_with(BIN, &[]).await;
    let sha = {
        use sha2::Digest as _;
        hex::encode(sha2::Sha256::digest(STATIC.as_bytes()))
    };
    let cfg = dir.join("gateway.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[slug]]\nname = \"memo\"\nhttp = \"{}\"\n\
             [[token]]\nsha256 = \"{sha}\"\nslugs = [\"*\"]\n\
             [[issuer]]\nurl = \"{ISSUER}\"\naudience = \"{AUDIENCE}\"\njwks_file = \"{}\"\n",
            info["http_url"].as_str().unwrap(),
            jwks.display()
        ),
    )
    .unwrap();
    let (_gw, ginfo) = serve(&[
        "--store",
        ":memory:",
        "gateway",
        "--config",
        cfg.to_str().unwrap(),
        "--http",
        "127.0.0.1:0",
    ])
    .await;
    let url = ginfo["http_url"].as_str().unwrap().to_owned();
    let jwt = keys.mint("RS256", u64::MAX);
    let mut fixed = RawHttp::connect(&url, Some(STATIC)).await.unwrap();
    let mut access = RawHttp::connect(&url, Some(&jwt)).await.unwrap();
    let mut id = 0;
    // Warm both (connections, the remembered grant).
    calls(&mut fixed, 200, &mut id).await;
    calls(&mut access, 200, &mut id).await;
    let (mut a, mut b) = (Vec::new(), Vec::new());
    let round = (n / 8).max(1);
    for r in 0..8 {
        if r % 2 == 0 {
            a.extend(calls(&mut fixed, round, &mut id).await);
            b.extend(calls(&mut access, round, &mut id).await);
        } else {
            b.extend(calls(&mut access, round, &mut id).await);
            a.extend(calls(&mut fixed, round, &mut id).await);
        }
    }
    a.sort();
    b.sort();
    println!(
        "gateway tools/call, static [[token]]: p50={} p99={} (n={})",
        ms(pct(&a, 0.5)),
        ms(pct(&a, 0.99)),
        a.len()
    );
    println!(
        "gateway tools/call, access token (RS256): p50={} p99={} (n={})",
        ms(pct(&b, 0.5)),
        ms(pct(&b, 0.99)),
        b.len()
    );
    println!(
        "access token / static token: p50 {:.2}x, p99 {:.2}x",
        pct(&b, 0.5).as_secs_f64() / pct(&a, 0.5).as_secs_f64(),
        pct(&b, 0.99).as_secs_f64() / pct(&a, 0.99).as_secs_f64()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
