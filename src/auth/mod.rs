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
