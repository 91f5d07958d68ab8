//! Finding who authorizes a server: its challenge (`WWW-Authenticate`), its protected-resource
//! metadata (RFC 9728), and the authorization server's metadata (RFC 8414, then OpenID
//! Connect Discovery), each checked before anything is sent to it.
//!
//! - The resource metadata comes from the challenge's `resource_metadata` URL when there is
//!   one, else from the well-known URL with the server's path inserted, then at the root.
//!   Its `resource` must name this server (same origin, a path prefix of the server's); a
//!   server that names another resource is refused before any authorization request.
//! - The authorization server's metadata is tried at the RFC 8414 path-inserted URL, the
//!   OpenID path-inserted URL, then the OpenID path-appended one (for an issuer without a
//!   path, the two root URLs), and its `issuer` must equal the issuer it was asked of,
//!   string for string (RFC 8414 §3.3).
//! - Every endpoint is `https`, or `http` on a loopback host.

use reqwest::Url;
use serde::Deserialize;

/// A `WWW-Authenticate: Bearer …` challenge's parameters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Challenge {
    pub resource_metadata: Option<String>,
    pub scope: Option<String>,
    pub error: Option<String>,
    pub error_description: Option<String>,
}

impl Challenge {
    /// Parses the `Bearer` challenge's auth-params (quoted or not); other schemes' and
    /// unknown parameters are ignored.
    pub fn parse(header: &str) -> Challenge {
        let mut c = Challenge::default();
        let Some(rest) = bearer_params(header) else {
            return c;
        };
        for (k, v) in auth_params(rest) {
            let slot = match k.to_ascii_lowercase().as_str() {
                "resource_metadata" => &mut c.resource_metadata,
                "scope" => &mut c.scope,
                "error" => &mut c.error,
                "error_description" => &mut c.error_description,
                _ => continue,
            };
            slot.get_or_insert(v);
        }
        c
    }
}

/// What follows `Bearer ` in a header that may list several challenges: the scheme at the
/// start or after a comma, outside quoted strings.
fn bearer_params(header: &str) -> Option<&str> {
    let bytes = header.as_bytes();
    let mut quoted = false;
    let mut start_of_item = true;
    for (i, &b) in bytes.iter().enumerate() {
        match b {
            b'"' => quoted = !quoted,
            b'\\' if quoted => {}
            b',' if !quoted => start_of_item = true,
            b' ' | b'\t' => {}
            _ if !quoted && start_of_item => {
                start_of_item = false;
                let rest = &header[i..];
                if rest.len() >= 6 && rest[..6].eq_ignore_ascii_case("bearer") {
                    let after = &rest[6..];
                    if after.is_empty() || after.starts_with(' ') {
                        return Some(after);
                    }
                }
            }
            _ => start_of_item = false,
        }
    }
    None
}

/// `k=v` and `k="v \" w"` pairs, comma separated.
fn auth_params(s: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.next_if(|c| *c == ' ' || *c == ',').is_some() {}
        let key: String = std::iter::from_fn(|| chars.next_if(|c| *c != '=' && *c != ','))
            .collect::<String>()
            .trim()
            .to_owned();
        if key.is_empty() || chars.next() != Some('=') {
            return out;
        }
        while chars.next_if(|c| *c == ' ').is_some() {}
        let mut value = String::new();
        if chars.next_if(|c| *c == '"').is_some() {
            while let Some(c) = chars.next() {
                match c {
                    '\\' => value.extend(chars.next()),
                    '"' => break,
                    c => value.push(c),
                }
            }
        } else {
            value = std::iter::from_fn(|| chars.next_if(|c| *c != ','))
                .collect::<String>()
                .trim()
                .to_owned();
        }
        out.push((key, value));
    }
}

/// Protected-resource metadata (RFC 9728), the parts used.
#[derive(Debug, Clone, Deserialize)]
pub struct ResourceMetadata {
    pub resource: String,
    #[serde(default)]
    pub authorization_servers: Vec<String>,
    #[serde(default)]
    pub scopes_supported: Option<Vec<String>>,
}

/// Authorization-server metadata (RFC 8414), the parts used.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ServerMetadata {
    pub issuer: String,
    pub authorization_endpoint: Option<String>,
    pub token_endpoint: String,
    #[serde(default)]
    pub registration_endpoint: Option<String>,
    #[serde(default)]
    pub scopes_supported: Option<Vec<String>>,
    #[serde(default)]
    pub token_endpoint_auth_methods_supported: Option<Vec<String>>,
    #[serde(default)]
    pub code_challenge_methods_supported: Option<Vec<String>>,
    #[serde(default)]
    pub client_id_metadata_document_supported: Option<bool>,
    #[serde(default)]
    pub authorization_response_iss_parameter_supported: Option<bool>,
}

/// `url` if herald may send credentials to it: https, or http on a loopback host.
pub fn endpoint(url: &str, what: &str) -> Result<Url, String> {
    let u = Url::parse(url).map_err(|e| format!("{what} `{url}` is not a URL ({e})"))?;
    let loopback = match u.host() {
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    };
    match u.scheme() {
        "https" => Ok(u),
        "http" if loopback => Ok(u),
        _ => Err(format!(
            "{what} `{url}` is not https (plain http is only taken on a loopback host)"
        )),
    }
}

/// GETs `url` as JSON: `Ok(None)` when it is not there (404 and the like).
async fn get_json<T: for<'de> Deserialize<'de>>(
    http: &reqwest::Client,
    url: &Url,
) -> Result<Option<T>, String> {
    let resp = http
        .get(url.clone())
        .header(reqwest::header::ACCEPT, "application/json")
        .send()
        .await
        .map_err(|e| format!("cannot fetch {url}: {}", why(&e)))?;
    if !resp.status().is_success() {
        return Ok(None);
    }
    let body = json_body(resp).await?;
    serde_json::from_value(body)
        .map(Some)
        .map_err(|e| format!("{url} is not the metadata document expected ({e})"))
}

/// An error and its causes, on one line.
pub fn why(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let more = c.to_string();
        if !s.contains(&more) {
            s.push_str(": ");
            s.push_str(&more);
        }
        cause = c.source();
    }
    s
}

/// The most of a metadata, registration or token answer herald reads.
pub const MAX_ANSWER_BYTES: usize = 256 * 1024;

/// An answer's body as JSON (`Null` when it is not JSON), read up to [`MAX_ANSWER_BYTES`].
pub async fn json_body(mut resp: reqwest::Response) -> Result<serde_json::Value, String> {
    let mut body = Vec::new();
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| format!("reading an answer from {}: {}", resp.url(), why(&e)))?
    {
        if body.len() + chunk.len() > MAX_ANSWER_BYTES {
            return Err(format!(
                "{} answered more than {} KiB; not read",
                resp.url(),
                MAX_ANSWER_BYTES / 1024
            ));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(serde_json::from_slice(&body).unwrap_or_default())
}

/// The protected-resource metadata of the MCP server at `server`; `None` when its challenge
/// named none and there is none at the well-known addresses (a server that takes no OAuth,
/// only tokens of its own).
pub async fn resource(
    http: &reqwest::Client,
    server: &str,
    from_challenge: Option<&str>,
) -> Result<Option<ResourceMetadata>, String> {
    let server_url = endpoint(server, "the server")?;
    let candidates: Vec<Url> = match from_challenge {
        Some(u) => vec![endpoint(u, "the server's resource_metadata")?],
        None => {
            let path = server_url.path().trim_end_matches('/');
            let mut v = Vec::new();
            if !path.is_empty() {
                v.push(well_known(&server_url, "oauth-protected-resource", path));
            }
            v.push(well_known(&server_url, "oauth-protected-resource", ""));
            v
        }
    };
    for url in &candidates {
        if let Some(m) = get_json::<ResourceMetadata>(http, url).await? {
            check_resource(&m.resource, &server_url)?;
            if m.authorization_servers.is_empty() {
                return Err(format!(
                    "{url} names no authorization server; the server cannot be authorized with"
                ));
            }
            return Ok(Some(m));
        }
    }
    if from_challenge.is_none() {
        return Ok(None);
    }
    Err(format!(
        "{server} asks for authorization but publishes no protected-resource metadata (tried {})",
        candidates
            .iter()
            .map(Url::as_str)
            .collect::<Vec<_>>()
            .join(", ")
    ))
}

/// `origin/.well-known/NAME{path}`.
fn well_known(origin: &Url, name: &str, path: &str) -> Url {
    let mut u = origin.clone();
    u.set_path(&format!("/.well-known/{name}{path}"));
    u.set_query(None);
    u.set_fragment(None);
    u
}

/// A resource metadata document's `resource` must name the server it came for: the same
/// origin, and a path the server's path starts with.
fn check_resource(resource: &str, server: &Url) -> Result<(), String> {
    let refuse = || {
        format!(
            "the server at {server} publishes metadata for another resource ({resource}); \
             refusing to authorize, as the token would be for that resource"
        )
    };
    let r = Url::parse(resource).map_err(|_| refuse())?;
    if r.fragment().is_some() || r.origin() != server.origin() {
        return Err(refuse());
    }
    let rp = r.path().trim_end_matches('/');
    let sp = server.path();
    let inside = rp.is_empty() || sp == rp || sp.starts_with(&format!("{rp}/"));
    if inside { Ok(()) } else { Err(refuse()) }
}

/// The metadata of the authorization server whose issuer identifier is `issuer`.
pub async fn authorization_server(
    http: &reqwest::Client,
    issuer: &str,
) -> Result<ServerMetadata, String> {
    let url = endpoint(issuer, "the authorization server")?;
    let path = url.path().trim_end_matches('/');
    let mut candidates = vec![well_known(&url, "oauth-authorization-server", path)];
    if path.is_empty() {
        candidates.push(well_known(&url, "openid-configuration", ""));
    } else {
        candidates.push(well_known(&url, "openid-configuration", path));
        let mut appended = url.clone();
        appended.set_path(&format!("{path}/.well-known/openid-configuration"));
        appended.set_query(None);
        candidates.push(appended);
    }
    for c in &candidates {
        if let Some(m) = get_json::<ServerMetadata>(http, c).await? {
            if m.issuer != issuer {
                return Err(format!(
                    "the authorization server's metadata at {c} names issuer `{}`, not `{issuer}`; \
                     refusing it (RFC 8414 §3.3)",
                    m.issuer
                ));
            }
            endpoint(&m.token_endpoint, "the token endpoint")?;
            if let Some(a) = &m.authorization_endpoint {
                endpoint(a, "the authorization endpoint")?;
            }
            if let Some(r) = &m.registration_endpoint {
                endpoint(r, "the registration endpoint")?;
            }
            return Ok(m);
        }
    }
    Err(format!(
        "the authorization server {issuer} publishes no metadata (tried {})",
        candidates
            .iter()
            .map(Url::as_str)
            .collect::<Vec<_>>()
            .join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenges_parse_quoted_and_bare_params() {
        let c = Challenge::parse(
            r#"Bearer error="insufficient_scope", scope="a b", resource_metadata="http://h/.well-known/x", error_description="say \"no\"""#,
        );
        assert_eq!(c.error.as_deref(), Some("insufficient_scope"));
        assert_eq!(c.scope.as_deref(), Some("a b"));
        assert_eq!(
            c.resource_metadata.as_deref(),
            Some("http://h/.well-known/x")
        );
        assert_eq!(c.error_description.as_deref(), Some("say \"no\""));
        let bare = Challenge::parse("Basic realm=x, Bearer scope=read,error=invalid_token");
        assert_eq!(bare.scope.as_deref(), Some("read"));
        let decoy = Challenge::parse(r#"Basic realm="bearer api", Bearer scope="s1""#);
        assert_eq!(decoy.scope.as_deref(), Some("s1"));
        assert_eq!(bare.error.as_deref(), Some("invalid_token"));
        assert_eq!(Challenge::parse("Basic realm=x"), Challenge::default());
    }

    #[test]
    fn a_resource_must_contain_the_server() {
        let server = Url::parse("http://localhost:9/mcp").unwrap();
        assert!(check_resource("http://localhost:9/mcp", &server).is_ok());
        assert!(check_resource("http://localhost:9", &server).is_ok());
        assert!(check_resource("http://localhost:9/", &server).is_ok());
        assert!(check_resource("https://evil.example.com/mcp", &server).is_err());
        assert!(check_resource("http://localhost:9/mc", &server).is_err());
        assert!(check_resource("http://localhost:10/mcp", &server).is_err());
    }

    #[test]
    fn endpoints_are_https_or_loopback() {
        assert!(endpoint("https://as.example.com/token", "t").is_ok());
        assert!(endpoint("http://127.0.0.1:8/token", "t").is_ok());
        assert!(endpoint("http://localhost:8/token", "t").is_ok());
        assert!(endpoint("http://[::1]:8/token", "t").is_ok());
        assert!(endpoint("http://as.example.com/token", "t").is_err());
        assert!(endpoint("ftp://localhost/x", "t").is_err());
    }
}
