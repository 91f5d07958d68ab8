//! OAuth 2.1 on the resource server's side: the access tokens an identity provider issues
//! for herald's endpoints, verified without asking the provider ([`jwt`]), against its
//! published keys ([`jwks`]).

pub mod guard;
pub mod issuer;
pub mod jwks;
pub mod jwt;

/// Whether two SHA-256 digests are equal, compared in constant time (a token's digest
/// against a configured one).
pub fn same_digest(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// `caller`'s token when it is to be checked as an access token: a JWT that is no static
/// token (`is_static`), with issuers configured; and the issuers to check it with. The one
/// rule for the gateway and a role's own gate alike.
pub fn access_token<'a>(
    caller: &'a crate::mcp::source::Caller,
    issuers: Option<&'a std::sync::Arc<issuer::Issuers>>,
    is_static: bool,
) -> Option<(&'a str, &'a std::sync::Arc<issuer::Issuers>)> {
    let t = caller.token.as_deref()?;
    let issuers = issuers?;
    (jwt::looks_like_jwt(t) && !is_static).then_some((t, issuers))
}

/// What `caller`'s access token grants ([`access_token`]), with the keys held now.
pub fn grant(
    caller: &crate::mcp::source::Caller,
    issuers: Option<&std::sync::Arc<issuer::Issuers>>,
    is_static: bool,
) -> Option<issuer::Grant> {
    let (t, issuers) = access_token(caller, issuers, is_static)?;
    issuers.verify_digest(t, caller.token_sha256()?).ok()
}

/// How long `caller`'s access token ([`access_token`]) has left, with the clock skew
/// allowed: nothing for one that no longer verifies (expired since it was let in, its key
/// dropped); `None` for a caller known otherwise.
pub fn expires_in(
    caller: &crate::mcp::source::Caller,
    issuers: Option<&std::sync::Arc<issuer::Issuers>>,
    is_static: bool,
) -> Option<std::time::Duration> {
    access_token(caller, issuers, is_static)?;
    Some(grant(caller, issuers, is_static).map_or(std::time::Duration::ZERO, |g| g.left()))
}

impl issuer::Grant {
    /// Who its caller is for listen budgets: the principal across its tokens (a refreshed
    /// token is the same caller), else the token's digest; named by its issuer, never by a
    /// claim's value.
    pub fn identity(self, caller: &crate::mcp::source::Caller) -> (String, String) {
        let key = self
            .principal
            .unwrap_or_else(|| hex::encode(&caller.token_sha256().unwrap_or(&[0; 32])[..16]));
        (key, format!("a token from {}", self.issuer))
    }

    /// Who owns what its caller makes: `oauth:` and the principal, when the token names one.
    pub fn known_as(self) -> Option<String> {
        self.principal.map(|p| format!("oauth:{p}"))
    }
}

impl issuer::Issuers {
    /// These issuers' resource as RFC 9728 metadata says it.
    pub fn protected_resource(&self) -> Option<crate::mcp::source::ProtectedResource> {
        Some(crate::mcp::source::ProtectedResource {
            resource: self.resource()?.to_owned(),
            authorization_servers: self.urls(),
        })
    }
}
