//! The Host and Origin allowlists of the HTTP endpoint, checked by herald before it does any
//! work for a request ahead of rmcp.
//!
//! rmcp checks the same lists (DNS-rebinding and cross-origin protection) when it handles the
//! request, but herald's listen gate admits a listen, and so starts watches, before rmcp sees
//! the request. The gate therefore asks [`Allowlist::admits`] first and leaves a request that
//! fails it untouched for rmcp to refuse (403). The matching follows rmcp's: a host entry is
//! `name` (any port) or `name:port`; an origin entry is `scheme://host:*`, `scheme://host:port`,
//! `scheme://host` (any port) or `null`; a request without an `Origin` header passes.

use http::HeaderMap;

/// The hosts and origins the endpoint serves.
#[derive(Debug, Clone, Default)]
pub struct Allowlist {
    hosts: Vec<(String, Option<u16>)>,
    origins: Vec<AllowedOrigin>,
}

#[derive(Debug, Clone, PartialEq)]
enum AllowedOrigin {
    Null,
    Tuple {
        scheme: String,
        host: String,
        /// `None`: any port.
        port: Option<u16>,
    },
}

fn normalize_host(host: &str) -> String {
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .to_ascii_lowercase()
}

fn authority(s: &str) -> Option<(String, Option<u16>)> {
    // A bare IPv6 address (`::1`) is an entry too, though not an authority.
    if let Ok(ip) = s.trim().parse::<std::net::Ipv6Addr>() {
        return Some((ip.to_string(), None));
    }
    let a = http::uri::Authority::try_from(s.trim()).ok()?;
    Some((normalize_host(a.host()), a.port_u16()))
}

/// `(scheme, host, port)` of an origin value; `None` for `null` or garbage.
fn origin_tuple(s: &str) -> Option<(String, String, Option<u16>)> {
    let uri = http::Uri::try_from(s.trim()).ok()?;
    let scheme = uri.scheme_str()?.to_ascii_lowercase();
    let a = uri.authority()?;
    Some((scheme, normalize_host(a.host()), a.port_u16()))
}

fn default_port(scheme: &str) -> Option<u16> {
    match scheme {
        "http" => Some(80),
        "https" => Some(443),
        _ => None,
    }
}

impl Allowlist {
    pub fn new(hosts: &[String], origins: &[String]) -> Allowlist {
        Allowlist {
            hosts: hosts.iter().filter_map(|h| authority(h)).collect(),
            origins: origins
                .iter()
                .filter_map(|o| {
                    let o = o.trim();
                    if o.eq_ignore_ascii_case("null") {
                        return Some(AllowedOrigin::Null);
                    }
                    let (base, any) = match o.strip_suffix(":*") {
                        Some(b) => (b, true),
                        None => (o, false),
                    };
                    let (scheme, host, port) = origin_tuple(base)?;
                    if any && port.is_some() {
                        return None;
                    }
                    Some(AllowedOrigin::Tuple { scheme, host, port })
                })
                .collect(),
        }
    }

    /// Whether a request with this URI and these headers passes both lists.
    pub fn admits(&self, uri: &http::Uri, headers: &HeaderMap) -> bool {
        let host = match headers.get(http::header::HOST) {
            // A request's Host is an authority: a bare IPv6 address is refused, as rmcp does.
            Some(h) => h
                .to_str()
                .ok()
                .and_then(|h| http::uri::Authority::try_from(h.trim()).ok())
                .map(|a| (normalize_host(a.host()), a.port_u16())),
            None => uri
                .authority()
                .map(|a| (normalize_host(a.host()), a.port_u16())),
        };
        let Some((host, port)) = host else {
            return false;
        };
        let host_ok = self
            .hosts
            .iter()
            .any(|(h, p)| *h == host && p.is_none_or(|p| Some(p) == port));
        if !host_ok {
            return false;
        }
        let Some(origin) = headers.get(http::header::ORIGIN) else {
            return true;
        };
        let Ok(origin) = origin.to_str() else {
            return false;
        };
        if origin.trim().eq_ignore_ascii_case("null") {
            return self.origins.contains(&AllowedOrigin::Null);
        }
        let Some((scheme, host, port)) = origin_tuple(origin) else {
            return false;
        };
        let port = port.or_else(|| default_port(&scheme));
        self.origins.iter().any(|a| match a {
            AllowedOrigin::Null => false,
            AllowedOrigin::Tuple {
                scheme: s,
                host: h,
                port: p,
            } => *s == scheme && *h == host && p.is_none_or(|p| Some(p) == port),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list() -> Allowlist {
        Allowlist::new(
            &[
                "localhost".into(),
                "127.0.0.1".into(),
                "::1".into(),
                "mcp.example:8443".into(),
            ],
            &[
                "http://localhost:*".into(),
                "http://[::1]:*".into(),
                "https://app.example.com:443".into(),
            ],
        )
    }

    fn req(host: &str, origin: Option<&str>) -> bool {
        let mut h = HeaderMap::new();
        h.insert(http::header::HOST, host.parse().unwrap());
        if let Some(o) = origin {
            h.insert(http::header::ORIGIN, o.parse().unwrap());
        }
        list().admits(&"/mcp".parse().unwrap(), &h)
    }

    #[test]
    fn hosts_and_origins_match_like_rmcp() {
        assert!(req("127.0.0.1:8750", None));
        assert!(req("[::1]:1", Some("http://[::1]:3000")));
        assert!(
            !req("::1", None),
            "a Host is an authority: IPv6 in brackets"
        );
        assert!(req("localhost", Some("http://localhost:3000")));
        assert!(req("mcp.example:8443", Some("https://app.example.com")));
        assert!(!req("evil.example:8750", None), "DNS rebinding");
        assert!(
            !req("mcp.example:9999", None),
            "the port is part of the entry"
        );
        assert!(!req("localhost:8750", Some("http://evil.example.com")));
        assert!(
            !req("localhost:8750", Some("https://localhost:3000")),
            "scheme"
        );
        assert!(!req("localhost:8750", Some("null")));
        assert!(!req("localhost:8750", Some("not an origin")));
    }
}
