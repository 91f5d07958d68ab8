//! Delivering to a callback: the callback policy (https and public addresses only, unless an
//! allowlist entry says otherwise), Standard Webhooks signatures, one POST and what its answer
//! means.
//!
//! The policy is checked twice: when a subscription is made (the URL's scheme and an address
//! written in it) and at every connection (the addresses its host name resolves to, by a
//! resolver that drops every private address), so a name that later points inward is not
//! followed. No redirect is followed. TLS is checked against the URL's own host name.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use reqwest::Url;

use crate::transport::dns::Resolver;

/// The largest body one POST carries (an event bigger than this is not sent; a `gap` says so).
pub const MAX_BODY: usize = 256 * 1024;
/// How long one POST may take, from connect to the whole answer.
pub const POST_TIMEOUT: Duration = Duration::from_secs(10);
/// The shortest and longest secret, in bytes (after `whsec_` and base64).
const SECRET_BYTES: std::ops::RangeInclusive<usize> = 24..=64;

/// Where callbacks may go: https to public addresses, and whatever an allowlist entry (a URL
/// prefix) lets through.
#[derive(Debug, Clone, Default)]
pub struct CallbackPolicy {
    pub allow: Vec<String>,
}

impl CallbackPolicy {
    /// Whether an allowlist entry lets `url` through (to any address, over http too). An
    /// entry is a URL prefix read by its parts: the scheme and host must be the entry's (not
    /// merely start with it: `https://hooks.internal` does not let
    /// `https://hooks.internal.evil.com` through), its port too unless the entry ends at the
    /// colon (`http://127.0.0.1:`: any port), and the path must start with the entry's.
    pub fn allowed(&self, url: &str) -> bool {
        let Ok(u) = Url::parse(url) else { return false };
        self.allow.iter().any(|entry| {
            let any_port = entry.ends_with(':');
            let e = match Url::parse(entry.trim_end_matches(':')) {
                Ok(e) => e,
                Err(_) => return false,
            };
            u.scheme() == e.scheme()
                && u.host_str() == e.host_str()
                && (any_port || u.port_or_known_default() == e.port_or_known_default())
                && path_under(u.path(), e.path())
                && u.username().is_empty()
        })
    }

    /// Checks a callback URL as it is written; the addresses its name resolves to are checked
    /// at every connection.
    pub fn check(&self, url: &str) -> Result<Url, String> {
        let parsed =
            Url::parse(url).map_err(|e| format!("the callback URL {url:?} is not a URL ({e})"))?;
        if !parsed.username().is_empty() || parsed.password().is_some() {
            return Err(
                "the callback URL carries credentials; put them in the secret, not the URL".into(),
            );
        }
        if self.allowed(url) {
            return Ok(parsed);
        }
        if parsed.scheme() != "https" {
            return Err(format!(
                "the callback URL must be https (got {}:); an operator allows others with callback_allow",
                parsed.scheme()
            ));
        }
        let host = parsed.host_str().unwrap_or_default();
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        if let Ok(ip) = bare.parse::<IpAddr>()
            && !is_public(ip)
        {
            return Err(format!(
                "the callback URL points at a private address ({ip}); an operator allows it with callback_allow"
            ));
        }
        if host.eq_ignore_ascii_case("localhost") || host.ends_with(".localhost") {
            return Err(
                "the callback URL points at this host; an operator allows it with callback_allow"
                    .into(),
            );
        }
        Ok(parsed)
    }
}

/// Whether `path` is `prefix` or under it, segment by segment (`/mcp` lets `/mcp` and
/// `/mcp/x` through, never `/mcp-admin`).
fn path_under(path: &str, prefix: &str) -> bool {
    (prefix.ends_with('/') && path.starts_with(prefix))
        || path == prefix
        || path
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// Whether `ip` is an address on the public internet (not loopback, private, link-local,
/// shared, documentation, multicast or reserved).
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            !(v4.is_private()
                || v4.is_loopback()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_multicast()
                || v4.is_documentation()
                || o[0] == 0
                || (o[0] == 100 && (64..128).contains(&o[1]))
                || (o[0] == 192 && o[1] == 0 && o[2] == 0)
                || (o[0] == 198 && (18..20).contains(&o[1]))
                || o[0] >= 240)
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_public(IpAddr::V4(v4));
            }
            let s = v6.segments();
            !(v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (s[0] & 0xfe00) == 0xfc00
                || (s[0] & 0xffc0) == 0xfe80
                || (s[0] == 0x2001 && s[1] == 0x0db8)
                || (s[0] == 0x64 && s[1] == 0xff9b))
        }
    }
}

/// herald's resolver, keeping only public addresses: a name with none is refused.
#[derive(Debug, Clone, Copy, Default)]
struct PublicOnly;

impl reqwest::dns::Resolve for PublicOnly {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let addrs: Vec<SocketAddr> = Resolver::system()?
                .lookup(&host, 0)
                .await?
                .into_iter()
                .filter(|a| is_public(a.ip()))
                .collect();
            if addrs.is_empty() {
                return Err(format!(
                    "{host} resolves to no public address; an operator allows private callbacks with callback_allow"
                )
                .into());
            }
            Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// A webhook secret: `whsec_` and the base64 of 24 to 64 bytes. Never shown.
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Secret(String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl Secret {
    pub fn parse(s: &str) -> Result<Secret, String> {
        let b64 = s.strip_prefix("whsec_").ok_or(
            "the secret must start with whsec_ and carry the base64 of 24 to 64 random bytes",
        )?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|_| "the secret after whsec_ is not base64".to_owned())?;
        if !SECRET_BYTES.contains(&bytes.len()) {
            return Err(format!(
                "the secret holds {} bytes; it must hold 24 to 64 (make one with `openssl rand -base64 32`, prefixed whsec_)",
                bytes.len()
            ));
        }
        Ok(Secret(s.to_owned()))
    }

    /// The secret itself, for the one place that must send it (an upstream subscription the
    /// gateway makes with a secret of its own).
    pub fn expose(&self) -> &str {
        &self.0
    }

    fn key(&self) -> Vec<u8> {
        let b64 = self.0.strip_prefix("whsec_").unwrap_or(&self.0);
        base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap_or_default()
    }

    /// `v1,<base64 of HMAC-SHA256(key, "{id}.{timestamp}.{body}")>` (Standard Webhooks).
    pub fn sign(&self, id: &str, timestamp: u64, body: &[u8]) -> String {
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &self.key());
        let mut ctx = ring::hmac::Context::with_key(&key);
        ctx.update(id.as_bytes());
        ctx.update(b".");
        ctx.update(timestamp.to_string().as_bytes());
        ctx.update(b".");
        ctx.update(body);
        format!(
            "v1,{}",
            base64::engine::general_purpose::STANDARD.encode(ctx.sign().as_ref())
        )
    }
}

/// What one POST came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Posted {
    /// 2xx, with the answer's body.
    Delivered(Vec<u8>),
    /// 410: the receiver wants no more; the subscription is dropped.
    Gone,
    /// 413: this body is too big for the receiver; not sent again.
    TooLarge,
    /// Anything else (no connection, a timeout, another status): tried again later.
    Failed(String),
}

/// The two clients a delivery may take: one that reaches public addresses only, and one for
/// callbacks an allowlist entry lets through.
#[derive(Clone)]
pub struct Poster {
    public: reqwest::Client,
    allowed: reqwest::Client,
    policy: Arc<CallbackPolicy>,
}

impl Poster {
    pub fn new(policy: CallbackPolicy) -> Result<Poster, String> {
        let build = |public: bool| {
            crate::transport::web::http_client(|b| {
                // No proxy from the environment: a proxy would resolve the callback's name
                // itself, past the address check.
                let b = b
                    .no_proxy()
                    .redirect(reqwest::redirect::Policy::none())
                    .timeout(POST_TIMEOUT)
                    .connect_timeout(POST_TIMEOUT)
                    .pool_max_idle_per_host(4);
                if public {
                    b.dns_resolver(Arc::new(PublicOnly))
                } else {
                    b
                }
            })
            .map_err(|e| format!("cannot make an HTTP client for webhooks: {e}"))
        };
        Ok(Poster {
            public: build(true)?,
            allowed: build(false)?,
            policy: Arc::new(policy),
        })
    }

    pub fn policy(&self) -> &CallbackPolicy {
        &self.policy
    }

    /// POSTs `body` to `url`, signed with each of `secrets` (more than one while a secret is
    /// being replaced), as message `id` of subscription `sub`.
    pub async fn post(
        &self,
        url: &str,
        sub: &str,
        id: &str,
        secrets: &[&Secret],
        body: &[u8],
    ) -> Posted {
        if let Err(e) = self.policy.check(url) {
            return Posted::Failed(e);
        }
        let ts = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let signature = secrets
            .iter()
            .map(|s| s.sign(id, ts, body))
            .collect::<Vec<_>>()
            .join(" ");
        let client = if self.policy.allowed(url) {
            &self.allowed
        } else {
            &self.public
        };
        let sent = client
            .post(url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header("webhook-id", id)
            .header("webhook-timestamp", ts.to_string())
            .header("webhook-signature", signature)
            .header("X-MCP-Subscription-Id", sub)
            .body(body.to_vec())
            .send()
            .await;
        let resp = match sent {
            Ok(r) => r,
            // reqwest's error names the URL; the reason is what matters.
            Err(e) => return Posted::Failed(reason(&e)),
        };
        let status = resp.status();
        if status.is_success() {
            let mut answer = Vec::new();
            let mut resp = resp;
            while let Ok(Some(chunk)) = resp.chunk().await {
                if answer.len() + chunk.len() > 64 * 1024 {
                    break;
                }
                answer.extend_from_slice(&chunk);
            }
            return Posted::Delivered(answer);
        }
        match status.as_u16() {
            410 => Posted::Gone,
            413 => Posted::TooLarge,
            s if status.is_redirection() => Posted::Failed(format!(
                "HTTP {s}: the receiver redirected, and redirects are not followed"
            )),
            s => Posted::Failed(format!("HTTP {s}")),
        }
    }
}

/// Why a request failed, in a few words, with its source's reason (never the URL's query).
fn reason(e: &reqwest::Error) -> String {
    use std::error::Error as _;
    let what = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "cannot connect"
    } else {
        "failed"
    };
    let mut why = String::new();
    let mut source = e.source();
    while let Some(s) = source {
        why = s.to_string();
        source = s.source();
    }
    if why.is_empty() {
        what.to_owned()
    } else {
        format!("{what}: {why}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn callbacks_are_https_and_public_unless_allowed() {
        let p = CallbackPolicy::default();
        assert!(p.check("https://hooks.example.com/x").is_ok());
        for (url, needle) in [
            ("http://hooks.example.com/x", "must be https"),
            ("https://127.0.0.1/x", "private address"),
            ("https://[::1]/x", "private address"),
            ("https://10.1.2.3/x", "private address"),
            ("https://169.254.169.254/latest", "private address"),
            ("https://localhost:8443/x", "this host"),
            ("https://u:p@hooks.example.com/", "credentials"),
            ("not a url", "not a URL"),
        ] {
            let e = p.check(url).unwrap_err();
            assert!(e.contains(needle), "{url}: {e}");
        }
        let p = CallbackPolicy {
            allow: vec!["http://127.0.0.1:".into()],
        };
        assert!(p.check("http://127.0.0.1:9000/hook").is_ok());
        assert!(p.check("http://127.0.0.2:9000/hook").is_err());
        assert!(p.check("http://127.0.0.1.evil.com:9000/hook").is_err());
        let p = CallbackPolicy {
            allow: vec!["https://hooks.internal:8443/mcp/".into()],
        };
        assert!(p.allowed("https://hooks.internal:8443/mcp/a"));
        assert!(!p.allowed("https://hooks.internal.evil.com:8443/mcp/a"));
        assert!(!p.allowed("https://hooks.internal:8444/mcp/a"));
        assert!(!p.allowed("https://hooks.internal:8443/other"));
        assert!(!p.allowed("http://hooks.internal:8443/mcp/a"));
        let p = CallbackPolicy {
            allow: vec!["https://hooks.internal/mcp".into()],
        };
        assert!(p.allowed("https://hooks.internal/mcp/x"));
        assert!(!p.allowed("https://hooks.internal/mcp-admin"));
    }

    #[test]
    fn public_addresses() {
        for ip in ["8.8.8.8", "2606:4700::1111", "1.1.1.1"] {
            assert!(is_public(ip.parse().unwrap()), "{ip}");
        }
        for ip in [
            "127.0.0.1",
            "10.0.0.1",
            "172.16.0.1",
            "192.168.1.1",
            "100.64.0.1",
            "169.254.1.1",
            "0.0.0.0",
            "::1",
            "fd00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "192.0.2.1",
        ] {
            assert!(!is_public(ip.parse().unwrap()), "{ip}");
        }
    }

    #[test]
    fn secrets_are_checked_and_sign_as_standard_webhooks_does() {
        assert!(Secret::parse("abc").is_err());
        assert!(Secret::parse("whsec_!!").is_err());
        let short = format!(
            "whsec_{}",
            base64::engine::general_purpose::STANDARD.encode([1u8; 16])
        );
        assert!(
            Secret::parse(&short)
                .unwrap_err()
                .contains("holds 16 bytes")
        );
        // The example of the Standard Webhooks specification (its reference libraries' test).
        let s = Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        assert_eq!(
            s.sign(
                "msg_p5jXN8AQM9LWM0D4loKWxJek",
                1614265330,
                br#"{"test": 2432232314}"#
            ),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
        assert_eq!(format!("{s:?}"), "Secret(<redacted>)");
    }
}
