//! A slug's `[slug.oauth]`: how the gateway authorizes with an upstream that takes OAuth.
//!
//! ```toml
//! [[slug]]
//! name = "linear"
//! http = "https://mcp.linear.app/mcp"
//! [slug.oauth]                      # the tokens `herald login --mcp-http URL` kept, refreshed here
//! # grant = "client_credentials"    # machine to machine (no person), with:
//! # client_id = "herald-edge"
//! # client_secret_env = "LINEAR_SECRET"          # or client_secret_credential = "linear"
//! # issuer = "https://id.example.com"             # where that secret may go (required with it)
//! # client_metadata_url = "https://example.com/herald.json"   # a Client ID Metadata Document
//! # scope = "read"
//! ```
//!
//! Tokens are kept sealed in the gateway's store; a login is made with the same `--store`
//! before the gateway starts (or while it is stopped).

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::transport::oauth::{OAuth, OAuthSettings};
use crate::transport::target::Target;

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SlugOAuth {
    /// `login` (default: the tokens of `herald login`) or `client_credentials`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_secret_env: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_secret_credential: Option<String>,
    /// The authorization server a client secret is for (required with one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issuer: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_metadata_url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
}

/// The session of a slug's `[slug.oauth]`, checked; the error says what to write instead.
pub fn session(o: &SlugOAuth, target: &Target) -> Result<Arc<OAuth>, String> {
    let bad = |message: String| message;
    let Target::Http(url) = target else {
        return Err(bad("[slug.oauth] is for an http = \"URL\" server".into()));
    };
    let client_credentials = match o.grant.as_deref() {
        None | Some("login") => false,
        Some("client_credentials") => true,
        Some(g) => {
            return Err(bad(format!(
                "grant = {g:?}: use \"login\" (the tokens of herald login) or \"client_credentials\""
            )));
        }
    };
    let secret = match (&o.client_secret_env, &o.client_secret_credential) {
        (Some(_), Some(_)) => {
            return Err(bad(
                "give client_secret_env or client_secret_credential, not both".into(),
            ));
        }
        (Some(var), None) => {
            crate::runtime::secrets::register(var);
            Some(std::env::var(var).map_err(|_| {
                bad(format!(
                    "client_secret_env names {var}, which is not set in the environment"
                ))
            })?)
        }
        (None, Some(name)) => {
            let dir = std::env::var_os("CREDENTIALS_DIRECTORY").ok_or_else(|| {
                bad(format!(
                    "client_secret_credential = {name:?} needs $CREDENTIALS_DIRECTORY (systemd's LoadCredential=)"
                ))
            })?;
            if name.is_empty() || name.contains('/') {
                return Err(bad(format!(
                    "client_secret_credential = {name:?} must be a file name"
                )));
            }
            let path = std::path::PathBuf::from(dir).join(name);
            let text = std::fs::read_to_string(&path)
                .map_err(|e| bad(format!("cannot read {}: {}", path.display(), e.kind())))?;
            Some(text.trim_end_matches(['\r', '\n']).to_owned())
        }
        (None, None) => None,
    };
    if client_credentials && (o.client_id.is_none() || secret.is_none()) {
        return Err(bad(
            "grant = \"client_credentials\" needs client_id and client_secret_env (or client_secret_credential)".into(),
        ));
    }
    if secret.is_some() && o.client_id.is_none() {
        return Err(bad("a client secret needs its client_id".into()));
    }
    if secret.is_some() && o.issuer.is_none() {
        return Err(bad(
            "a client secret needs issuer = \"URL\", the authorization server it is for: \
             herald sends it to no other, whatever the upstream names"
                .into(),
        ));
    }
    if let Some(i) = &o.issuer {
        crate::transport::oauth::discover::endpoint(i, "issuer").map_err(bad)?;
    }
    if let Some(u) = &o.client_metadata_url {
        crate::transport::oauth::discover::endpoint(u, "client_metadata_url").map_err(bad)?;
    }
    let settings = OAuthSettings {
        client_id: o.client_id.clone(),
        client_secret: secret,
        issuer: o.issuer.clone(),
        client_metadata_url: o.client_metadata_url.clone(),
        client_credentials,
        scope: o.scope.clone(),
    };
    OAuth::new(url, settings, None).map_err(bad)
}
