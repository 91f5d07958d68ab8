//! The endpoint as an OAuth 2.1 protected resource (RFC 9728), when its source takes
//! identity providers' access tokens: the metadata document at
//! `/.well-known/oauth-protected-resource` (and with the endpoint's path after it, where RFC
//! 9728 puts it for a resource at `/mcp`), and the `WWW-Authenticate` challenge of a `401`
//! pointing there, as MCP's authorization spec has clients discover the authorization server.
//!
//! The scope asked for is `herald:*`: naming the slugs would tell an unknown caller which
//! exist. The identity provider decides what it grants.

use axum::Router;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::mcp::server::SourceServer;
use crate::mcp::source::ProtectedResource;

/// Where the metadata is served.
pub const METADATA_PATH: &str = "/.well-known/oauth-protected-resource";

/// The scope a challenge asks for.
pub const SCOPE: &str = "herald:*";

/// `router` with the metadata document's routes (404 while the source takes no access
/// tokens: a reload may add `[[issuer]]`s).
pub fn routes(router: Router, server: SourceServer) -> Router {
    let doc = move || {
        let server = server.clone();
        async move { document(server.protected_resource()) }
    };
    // With any path after it: a resource behind a proxy's prefix (`/prefix/mcp`) has its
    // metadata there (see [`metadata_url`]).
    router
        .route(METADATA_PATH, axum::routing::get(doc.clone()))
        .route(
            &format!("{METADATA_PATH}/{{*resource}}"),
            axum::routing::get(doc),
        )
}

fn document(pr: Option<ProtectedResource>) -> Response {
    let Some(pr) = pr else {
        return (
            StatusCode::NOT_FOUND,
            "this server takes no OAuth access tokens ([[issuer]])\n",
        )
            .into_response();
    };
    (
        [(header::CONTENT_TYPE, "application/json")],
        json!({
            "resource": pr.resource,
            "authorization_servers": pr.authorization_servers,
            "bearer_methods_supported": ["header"],
            "scopes_supported": [SCOPE],
            "resource_name": "herald",
        })
        .to_string(),
    )
        .into_response()
}

/// The metadata document's URL for resource `resource` (RFC 9728 section 3.1: the
/// well-known path between the origin and the resource's path).
pub fn metadata_url(resource: &str) -> String {
    let start = resource.find("://").map_or(0, |i| i + 3);
    let (origin, path) = match resource[start..].find('/') {
        Some(p) => resource.split_at(start + p),
        None => (resource, ""),
    };
    format!("{origin}{METADATA_PATH}{}", path.trim_end_matches('/'))
}

/// The `WWW-Authenticate` value of a `401`: `error` (`invalid_token` for a token refused)
/// and, for a protected resource, where its metadata is and the scope to ask for.
pub fn challenge(server: &SourceServer, error: Option<&str>) -> HeaderValue {
    let mut v = String::from(r#"Bearer realm="herald""#);
    if let Some(e) = error {
        v.push_str(&format!(r#", error="{e}""#));
    }
    if let Some(pr) = server.protected_resource() {
        v.push_str(&format!(
            r#", resource_metadata="{}", scope="{SCOPE}""#,
            metadata_url(&pr.resource)
        ));
    }
    HeaderValue::from_str(&v)
        .unwrap_or_else(|_| HeaderValue::from_static(r#"Bearer realm="herald""#))
}

/// The `WWW-Authenticate` value of a `403` for a step-up: `scope` would do. Only a scope of
/// herald's own form (`herald:` and a slug name) is said: an error's data may come from an
/// upstream, and must not put its words in a header.
pub fn insufficient_scope(scope: &str) -> Option<HeaderValue> {
    let slug = scope.strip_prefix("herald:")?;
    let ok = !slug.is_empty()
        && slug
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    ok.then(|| {
        HeaderValue::from_str(&format!(
            r#"Bearer realm="herald", error="insufficient_scope", scope="{scope}""#
        ))
        .ok()
    })
    .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_up_names_only_a_scope_of_herald_s_form() {
        assert!(insufficient_scope("herald:memo-2").is_some());
        for bad in [
            "herald:",
            "openid",
            r#"herald:x", resource_metadata="https://evil"#,
            "herald:A",
        ] {
            assert!(insufficient_scope(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn the_metadata_url_puts_the_well_known_path_before_the_resource_path() {
        assert_eq!(
            metadata_url("https://herald.example/mcp"),
            "https://herald.example/.well-known/oauth-protected-resource/mcp"
        );
        assert_eq!(
            metadata_url("https://herald.example"),
            "https://herald.example/.well-known/oauth-protected-resource"
        );
    }
}
