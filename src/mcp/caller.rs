//! Who is asking: the [`Caller`] of one request, as the transport knows it.
//!
//! A caller is worked out once per request from what the request carried, and then passed
//! explicitly (`&Caller`) to every [`Source`](crate::mcp::source::Source) method that may
//! depend on it. There is no ambient caller: a function that decides something per caller
//! says so in its signature.
//!
//! Where it comes from:
//! - stdio: the process that started this one ([`Caller::local`]); no token needed;
//! - QUIC (any byte stream but stdio): `_meta["io.herald/token"]` of each request;
//! - HTTP: the `Authorization: Bearer` header and the endpoint's `?servers=a,b`, read from
//!   the request parts rmcp keeps in the request context.
//!
//! The byte-stream server ([`ConnServer`](crate::mcp::conn::ConnServer)) inserts the caller
//! it worked out into the request context's extensions; [`Caller::of`] reads it back there,
//! or from the HTTP parts.

use rmcp::service::{RequestContext, RoleServer};

/// Where a token travels on byte-stream transports: each request's `_meta`.
pub const TOKEN_META_KEY: &str = "io.herald/token";

/// The credentials one request presented. Sources that serve everyone ignore it; the gateway
/// turns it into the set of servers the request may use.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Caller {
    /// The bearer token: HTTP `Authorization: Bearer`, or `_meta["io.herald/token"]` of the
    /// requests on a QUIC connection.
    pub token: Option<String>,
    /// `?servers=a,b` on the HTTP endpoint URL: narrows what the token may use.
    pub servers: Option<Vec<String>>,
    /// The request came over stdio from the process that started this one (or from a client
    /// in this process), which needs no token.
    pub local: bool,
    /// The peer connected from a loopback address (HTTP, QUIC). A gateway bound only to
    /// loopback with no tokens configured lets such callers in.
    pub loopback: bool,
    /// Who the source knows the caller as, when it said so once the caller was let in (an
    /// access token's issuer and subject: the same across the principal's tokens). See
    /// [`Caller::principal`].
    pub known_as: Option<String>,
    /// The token's SHA-256, worked out once ([`Caller::token_sha256`]).
    pub token_digest: std::sync::OnceLock<[u8; 32]>,
}

/// A known caller's principal, put in an HTTP request's extensions by the transport once the
/// source let the caller in ([`Caller::from_parts`] reads it back).
#[derive(Debug, Clone)]
pub struct KnownAs(pub String);

/// The peer address of an HTTP request, put in its extensions by the transport.
#[derive(Debug, Clone, Copy)]
pub struct PeerAddr(pub std::net::SocketAddr);

impl std::fmt::Debug for Caller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token itself.
        f.debug_struct("Caller")
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("servers", &self.servers)
            .field("local", &self.local)
            .field("loopback", &self.loopback)
            .field("known_as", &self.known_as)
            .finish()
    }
}

impl Caller {
    /// Who owns what this caller makes (a task): who the source knows it as (an access
    /// token's principal, so a refreshed token still owns its tasks), else the SHA-256 of its
    /// token, or `anonymous`. Never the token itself.
    pub fn principal(&self) -> String {
        if let Some(p) = &self.known_as {
            return p.clone();
        }
        match self.token_sha256() {
            Some(d) => format!("token:{}", hex::encode(d)),
            None => "anonymous".into(),
        }
    }

    /// The SHA-256 of the token, worked out on first use (a request's checks compare it
    /// several times; an access token is long). Set `token` before asking.
    pub fn token_sha256(&self) -> Option<&[u8; 32]> {
        use sha2::Digest as _;
        let t = self.token.as_deref()?;
        Some(
            self.token_digest
                .get_or_init(|| sha2::Sha256::digest(t.as_bytes()).into()),
        )
    }

    /// The process that started this one (stdio): may use everything, needs no token.
    pub fn local() -> Caller {
        Caller {
            local: true,
            loopback: true,
            ..Caller::default()
        }
    }

    /// A byte-stream caller whose token (if any) rides in each request's `_meta`.
    pub fn from_meta(meta: &rmcp::model::RequestMetaObject, local: bool, loopback: bool) -> Caller {
        Caller {
            token: meta
                .0
                .0
                .get(TOKEN_META_KEY)
                .and_then(|v| v.as_str())
                .map(str::to_owned)
                .filter(|t| !t.is_empty()),
            servers: None,
            local,
            loopback,
            known_as: None,
            token_digest: Default::default(),
        }
    }

    /// The caller an HTTP request presents.
    pub fn from_http(headers: &http::HeaderMap, uri: &http::Uri) -> Caller {
        let token = headers
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                let (scheme, rest) = v.trim().split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then_some(rest)
            })
            .map(|t| t.trim().to_owned())
            .filter(|t| !t.is_empty());
        let servers = uri.query().and_then(|q| {
            q.split('&').find_map(|p| {
                p.strip_prefix("servers=").map(|v| {
                    v.split(',')
                        .map(|s| s.trim().to_owned())
                        .filter(|s| !s.is_empty())
                        .collect()
                })
            })
        });
        Caller {
            token,
            servers,
            local: false,
            loopback: false,
            known_as: None,
            token_digest: Default::default(),
        }
    }

    /// The caller of an HTTP request, with its peer's address when the transport put it there.
    pub fn from_parts(parts: &http::request::Parts) -> Caller {
        // A request a proxy forwarded came from wherever the proxy's client is, not from this
        // host, whatever address the proxy connected from.
        const X_FORWARDED_FOR: http::HeaderName = http::HeaderName::from_static("x-forwarded-for");
        const X_REAL_IP: http::HeaderName = http::HeaderName::from_static("x-real-ip");
        let forwarded = [
            http::header::FORWARDED,
            X_FORWARDED_FOR,
            X_REAL_IP,
            http::header::VIA,
        ]
        .iter()
        .any(|h| parts.headers.contains_key(h));
        Caller {
            loopback: !forwarded
                && parts
                    .extensions
                    .get::<PeerAddr>()
                    .is_some_and(|p| p.0.ip().to_canonical().is_loopback()),
            known_as: parts.extensions.get::<KnownAs>().map(|k| k.0.clone()),
            ..Caller::from_http(&parts.headers, &parts.uri)
        }
    }

    /// The caller of the request `ctx` belongs to: the one the byte-stream server inserted,
    /// else the one the HTTP request parts present, else an anonymous caller (who may use
    /// what needs no entitlement, and nothing else).
    pub fn of(ctx: &RequestContext<RoleServer>) -> Caller {
        if let Some(c) = ctx.extensions.get::<Caller>() {
            return c.clone();
        }
        ctx.extensions
            .get::<http::request::Parts>()
            .map(Caller::from_parts)
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_bearer_is_case_insensitive_and_empty_tokens_are_none() {
        let mut h = http::HeaderMap::new();
        let uri: http::Uri = "/mcp?servers=a,%20b,,c".parse().unwrap();
        h.insert(
            http::header::AUTHORIZATION,
            "bEaReR  s3cret ".parse().unwrap(),
        );
        let c = Caller::from_http(&h, &uri);
        assert_eq!(c.token.as_deref(), Some("s3cret"));
        assert_eq!(
            c.servers,
            Some(vec!["a".to_string(), "%20b".into(), "c".into()])
        );
        assert!(!c.local);
        h.insert(http::header::AUTHORIZATION, "Bearer  ".parse().unwrap());
        assert_eq!(Caller::from_http(&h, &uri).token, None);
        h.insert(http::header::AUTHORIZATION, "Basic abc".parse().unwrap());
        assert_eq!(Caller::from_http(&h, &uri).token, None);
    }

    #[test]
    fn a_forwarded_request_is_not_loopback_and_principals_hide_the_token() {
        let mut parts = http::Request::new(()).into_parts().0;
        parts
            .extensions
            .insert(PeerAddr("127.0.0.1:9".parse().unwrap()));
        assert!(Caller::from_parts(&parts).loopback);
        parts
            .headers
            .insert("x-forwarded-for", "203.0.113.7".parse().unwrap());
        assert!(!Caller::from_parts(&parts).loopback);

        let a = Caller {
            token: Some("hunter2".into()),
            ..Caller::default()
        };
        assert!(a.principal().starts_with("token:") && !a.principal().contains("hunter2"));
        assert_ne!(a.principal(), Caller::default().principal());
        assert_eq!(Caller::local().principal(), Caller::default().principal());
    }

    #[test]
    fn the_token_never_shows_in_debug() {
        let c = Caller {
            token: Some("hunter2".into()),
            ..Caller::default()
        };
        let shown = format!("{c:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("redacted"), "{shown}");
    }

    #[test]
    fn meta_token_is_read_and_empty_is_none() {
        let mut meta = rmcp::model::RequestMetaObject::default();
        meta.0.0.insert(TOKEN_META_KEY.into(), "t0k".into());
        assert_eq!(
            Caller::from_meta(&meta, false, false).token.as_deref(),
            Some("t0k")
        );
        meta.0.0.insert(TOKEN_META_KEY.into(), "".into());
        assert_eq!(Caller::from_meta(&meta, true, true), Caller::local());
    }
}
