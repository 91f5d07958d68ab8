//! OAuth 2.1 on the resource server's side: the access tokens an identity provider issues
//! for herald's endpoints, verified without asking the provider ([`jwt`]), against its
//! published keys ([`jwks`]).

pub mod issuer;
pub mod jwks;
pub mod jwt;
