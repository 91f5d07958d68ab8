//! The gateway's TOML config: upstream servers ("slugs") and the tokens entitled to them.
//!
//! ```toml
//! http = "127.0.0.1:8760"          # optional; flags override
//! quic = "127.0.0.1:8761"
//!
//! [[slug]]
//! name = "memo"
//! stdio = "herald memo --store /var/lib/herald/memo.redb"
//!
//! [[slug]]
//! name = "cluster"
//! http = "http://10.0.0.5:8750/mcp"
//! token_env = "CLUSTER_TOKEN"       # the bearer token this gateway presents upstream
//! # token_credential = "cluster"     # or: $CREDENTIALS_DIRECTORY/cluster (LoadCredential=)
//!
//! [[token]]
//! name = "ops"                      # a label for logs; never the token
//! sha256 = "9f86d081884c7d65..."    # printf %s TOKEN | sha256sum
//! slugs = ["memo", "cluster"]       # or ["*"]
//!
//! [[issuer]]                        # OAuth access tokens of an identity provider
//! url = "https://id.example.com"
//! audience = "https://edge-1.example.com/mcp"
//! ```
//!
//! Validation makes a [`GatewayConfig`] or an error naming the slug or token at fault: a slug
//! name is `[a-z0-9][a-z0-9-]*` (so `__` and `+` always separate a slug from a name or a URI),
//! each slug has one target, a token is a SHA-256 hex entitled to slugs or `*`; with
//! `open_to_loopback` every listen address must be loopback ([`open_on_loopback_only`]).
//! `herald check FILE` loads a config the same way (exit 64 on an error) and warns loudly for
//! one with no tokens that listens beyond loopback: valid for stdio callers, but every caller
//! from another host would be refused.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::transport::client::DEFAULT_CONNECT_TIMEOUT;

use crate::transport::target::Target;
use crate::transport::tls::{ClientTrust, Secret, TlsError};

/// What is wrong with a gateway config. Each message names the slug or token at fault and
/// what to write instead. Causes are part of the message, not error sources, so a chain
/// printed with `{:#}` says each thing once.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {error}")]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    /// Any of the others, found in the file at `path`.
    #[error("{path}: {error}")]
    InFile {
        path: PathBuf,
        error: Box<ConfigError>,
    },
    #[error("{0}")]
    Toml(String),
    #[error(
        "slug name {0:?} is not valid: a slug name is [a-z0-9][a-z0-9-]*, at most 64 characters (lowercase letters, digits and '-', not starting with '-'; so never '_' or '+', which separate a slug from a tool or a URI)"
    )]
    SlugName(String),
    #[error("slug {0} is defined twice")]
    SlugTwice(String),
    #[error(
        "slug {0} needs exactly one of stdio = \"CMD\", http = \"URL\", quic = \"HOST:PORT\" or nats = \"nats://HOST:PORT\""
    )]
    SlugTarget(String),
    #[error("slug {slug}: {message}")]
    SlugNats { slug: String, message: String },
    #[error("slug {slug}: http = {message}")]
    SlugUrl { slug: String, message: String },
    /// The variable is not named: a token put in `token_env` by mistake must not be shown.
    #[error(
        "slug {slug}: the variable token_env names is not set in the environment; set it to the token to present upstream (token_env holds the variable's name, not the token)"
    )]
    TokenEnvUnset { slug: String },
    #[error("slug {0}: give token_env or token_credential, not both")]
    TokenTwice(String),
    #[error(
        "slug {slug}: token_credential = {name:?} needs $CREDENTIALS_DIRECTORY, which systemd sets for a unit with LoadCredential={name}:/path/to/file; outside systemd use token_env"
    )]
    NoCredentialsDirectory { slug: String, name: String },
    #[error(
        "slug {slug}: token_credential = {name:?} must be a file name in $CREDENTIALS_DIRECTORY, without /"
    )]
    CredentialName { slug: String, name: String },
    #[error("slug {slug}: cannot read the credential {path}: {message}")]
    CredentialRead {
        slug: String,
        path: PathBuf,
        message: String,
    },
    #[error("slug {slug}: the credential {path} is empty")]
    CredentialEmpty { slug: String, path: PathBuf },
    #[error("slug {slug}: tls_pin: {error}")]
    TlsPin { slug: String, error: TlsError },
    #[error(
        "{token}: sha256 must be 64 hex digits, the SHA-256 of the token (printf %s TOKEN | sha256sum)"
    )]
    TokenSha256 { token: String },
    #[error("{token}: slugs names {slug:?}, which is not a [[slug]] (nor a role of this config)")]
    TokenSlug { token: String, slug: String },
    #[error("slug {0} is the name of a role this config runs; name the [[slug]] something else")]
    SlugIsRole(String),
    #[error(
        "open_to_loopback = true lets any process on this host in without a token, so the gateway must listen on loopback only, and {0} is not loopback: listen on 127.0.0.1 (or [::1]), or drop open_to_loopback and give callers tokens"
    )]
    OpenNotLoopback(String),
    #[error(
        "{0} is not a loopback address and there is no [[token]]: anyone who can reach it could use every server. Add a [[token]] (sha256 = the output of `printf %s TOKEN | sha256sum`, slugs = [\"*\"]) or listen on 127.0.0.1"
    )]
    NoTokenNotLoopback(String),
    #[error(
        "slugs {0} and {1} both have prefix = false: their names could collide, so at most one slug may show its names without the slug__ prefix"
    )]
    BareTwice(String, String),
    #[error("slug {slug}: [slug.oauth]: {message}")]
    SlugOAuth { slug: String, message: String },
    /// An `[[issuer]]` at fault; the message names it.
    #[error("{0}")]
    Issuer(String),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewayFile {
    pub http: Option<String>,
    pub quic: Option<String>,
    /// Callers on a loopback address need no token (default false).
    #[serde(default)]
    pub open_to_loopback: bool,
    #[serde(default, rename = "slug")]
    pub slugs: Vec<SlugFile>,
    #[serde(default, rename = "token")]
    pub tokens: Vec<TokenFile>,
    /// Identity providers whose access tokens (JWTs) are taken beside the `[[token]]`s.
    #[serde(default, rename = "issuer")]
    pub issuers: Vec<crate::auth::issuer::IssuerFile>,
    /// `[events]`: webhook subscriptions' callback allowlist and error codes.
    #[serde(default)]
    pub events: Option<crate::hooks::EventsOptions>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SlugFile {
    pub name: String,
    pub stdio: Option<String>,
    pub http: Option<String>,
    pub quic: Option<String>,
    pub tls_ca: Option<PathBuf>,
    pub tls_pin: Option<String>,
    /// Environment variable holding the token this gateway presents to the upstream.
    pub token_env: Option<String>,
    /// A systemd credential (`LoadCredential=NAME:PATH`) holding that token: the file NAME in
    /// `$CREDENTIALS_DIRECTORY`, so the secret is in neither the config nor the environment.
    pub token_credential: Option<String>,
    /// `false`: its tools and prompts keep the names the upstream gives them (no `slug__`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<bool>,
    /// `nats://HOST:PORT[,…]`: serve the event logs a role publishes there
    /// (`--publish-events`) instead of connecting to a server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nats: Option<String>,
    /// The name they are published under (`--publish-as`); default: this slug's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nats_source: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nats_creds: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nats_nkey: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nats_tls_ca: Option<PathBuf>,
    /// `[slug.oauth]`: the upstream takes OAuth (`gateway::slug_oauth`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oauth: Option<super::slug_oauth::SlugOAuth>,
}

/// A slug served from event logs published on NATS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatsSlug {
    pub config: crate::nats::NatsConfig,
    /// The publisher's name.
    pub source: String,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TokenFile {
    pub name: Option<String>,
    pub sha256: String,
    pub slugs: Vec<String>,
}

/// One upstream, validated. Two are equal when they reach the same server the same way
/// (every field but `prefix`, which only names its tools; the token too, compared but never
/// shown): a reload keeps a slug's connection only then.
#[derive(Debug, Clone)]
pub struct Slug {
    pub name: String,
    pub target: Target,
    pub trust: ClientTrust,
    /// How long it has to answer a connect when it is an HTTP or QUIC server
    /// ([`DEFAULT_CONNECT_TIMEOUT`]; `herald gateway --connect-timeout-ms` sets it for all).
    pub handshake_timeout: std::time::Duration,
    /// Served from the event logs published on NATS (no server to connect to).
    pub nats: Option<NatsSlug>,
    /// Whether its tools and prompts are named `slug__name` (else as the upstream names
    /// them; at most one slug).
    pub prefix: bool,
}

impl PartialEq for Slug {
    fn eq(&self, other: &Slug) -> bool {
        self.name == other.name
            && self.target == other.target
            && self.trust == other.trust
            && self.handshake_timeout == other.handshake_timeout
            && self.nats == other.nats
    }
}

/// One token, validated: its SHA-256 and what it may use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    pub label: String,
    pub sha256: [u8; 32],
    pub slugs: BTreeSet<String>,
}

#[derive(Debug, Clone)]
pub struct GatewayConfig {
    pub http: Option<String>,
    pub quic: Option<String>,
    /// Callers on a loopback address need no token.
    pub open_to_loopback: bool,
    pub slugs: Vec<Slug>,
    pub tokens: Vec<Token>,
    /// `[[issuer]]`s: identity providers whose access tokens are taken.
    pub issuers: Vec<crate::auth::issuer::IssuerConfig>,
    /// `[events]` (webhook callbacks, error codes).
    pub events: crate::hooks::EventsOptions,
}

pub use super::toml_errors::toml_message;

/// The systemd credential `name` of slug `slug`: `$CREDENTIALS_DIRECTORY/name`, without its
/// trailing newline.
fn read_credential(dir: Option<&Path>, slug: &str, name: &str) -> Result<String, ConfigError> {
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(ConfigError::CredentialName {
            slug: slug.to_owned(),
            name: name.to_owned(),
        });
    }
    let dir = dir.filter(|d| !d.as_os_str().is_empty()).ok_or_else(|| {
        ConfigError::NoCredentialsDirectory {
            slug: slug.to_owned(),
            name: name.to_owned(),
        }
    })?;
    let path = dir.join(name);
    let text = std::fs::read_to_string(&path).map_err(|e| ConfigError::CredentialRead {
        slug: slug.to_owned(),
        path: path.clone(),
        message: e.to_string(),
    })?;
    let token = text.trim_end_matches(['\n', '\r']);
    if token.is_empty() {
        return Err(ConfigError::CredentialEmpty {
            slug: slug.to_owned(),
            path,
        });
    }
    Ok(token.to_owned())
}

/// Whether `name` is a valid slug: lowercase `[a-z0-9][a-z0-9-]*` (so never `__` or `+`,
/// which separate a slug from a tool name or a URI, and never `-` alone or first).
pub fn valid_slug(name: &str) -> bool {
    name.bytes()
        .next()
        .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// The `[[slug]]` with `prefix = false`, if any (the config allows one).
pub fn bare_slug(slugs: &[Slug]) -> Option<&str> {
    slugs.iter().find(|s| !s.prefix).map(|s| s.name.as_str())
}

/// A gateway open to loopback (`open_to_loopback`, or no `[[token]]`: as `herald up`, callers
/// on this host need none) listens on loopback addresses only: `tokenless` says which of the
/// two it is, for the message.
pub fn open_on_loopback_only<'a>(
    addrs: impl IntoIterator<Item = &'a str>,
    tokenless: bool,
) -> Result<(), ConfigError> {
    match addrs
        .into_iter()
        .filter(|a| !a.trim().is_empty())
        .find(|a| !crate::transport::is_loopback(a))
    {
        Some(a) if tokenless => Err(ConfigError::NoTokenNotLoopback(a.to_owned())),
        Some(a) => Err(ConfigError::OpenNotLoopback(a.to_owned())),
        None => Ok(()),
    }
}

impl GatewayConfig {
    /// No `[[token]]` nor `[[issuer]]`: callers on this host need no token.
    pub fn tokenless(&self) -> bool {
        self.tokens.is_empty() && self.issuers.is_empty()
    }

    pub fn load(path: &Path) -> Result<GatewayConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read {
            path: path.to_owned(),
            error,
        })?;
        GatewayConfig::parse(&text).map_err(|error| ConfigError::InFile {
            path: path.to_owned(),
            error: Box::new(error),
        })
    }

    pub fn parse(text: &str) -> Result<GatewayConfig, ConfigError> {
        let file: GatewayFile =
            toml::from_str(text).map_err(|e| ConfigError::Toml(toml_message(text, &e)))?;
        // "" turns an endpoint off, as in `herald up`'s [listen].
        let addr = |a| crate::transport::listen_addr(a).map(str::to_owned);
        let (http, quic) = (addr(&file.http), addr(&file.quic));
        let events = file.events.clone().unwrap_or_default();
        let (slugs, tokens) = GatewayConfig::validate(file.slugs, file.tokens, &[])?;
        let issuers = validate_issuers(file.issuers)?;
        // With no [[token]] nor [[issuer]], callers on this host need none (as in `herald up`).
        let open = file.open_to_loopback || (tokens.is_empty() && issuers.is_empty());
        if open {
            open_on_loopback_only(
                [&http, &quic].into_iter().flatten().map(String::as_str),
                !file.open_to_loopback,
            )?;
        }
        Ok(GatewayConfig {
            http,
            quic,
            open_to_loopback: open,
            slugs,
            tokens,
            issuers,
            events,
        })
    }

    /// Checks `[[slug]]`s and `[[token]]`s. `roles` are slugs served in this process (named
    /// after their roles): tokens may name them (and `*` covers them), `[[slug]]`s may not
    /// take their names.
    pub fn validate(
        slug_files: Vec<SlugFile>,
        token_files: Vec<TokenFile>,
        roles: &[&str],
    ) -> Result<(Vec<Slug>, Vec<Token>), ConfigError> {
        let mut slugs: Vec<Slug> = Vec::new();
        for s in slug_files {
            if !valid_slug(&s.name) {
                return Err(ConfigError::SlugName(s.name));
            }
            if roles.contains(&s.name.as_str()) {
                return Err(ConfigError::SlugIsRole(s.name));
            }
            if slugs.iter().any(|o| o.name == s.name) {
                return Err(ConfigError::SlugTwice(s.name));
            }
            if s.prefix == Some(false)
                && let Some(other) = slugs.iter().find(|o| !o.prefix)
            {
                return Err(ConfigError::BareTwice(other.name.clone(), s.name));
            }
            let nats = match &s.nats {
                None => {
                    if s.nats_source.is_some()
                        || s.nats_creds.is_some()
                        || s.nats_nkey.is_some()
                        || s.nats_tls_ca.is_some()
                    {
                        return Err(ConfigError::SlugNats {
                            slug: s.name.clone(),
                            message: "nats_source, nats_creds, nats_nkey and nats_tls_ca go with nats = \"nats://HOST:PORT\"".into(),
                        });
                    }
                    None
                }
                Some(urls) => {
                    if s.tls_ca.is_some()
                        || s.tls_pin.is_some()
                        || s.token_env.is_some()
                        || s.token_credential.is_some()
                    {
                        return Err(ConfigError::SlugNats {
                            slug: s.name.clone(),
                            message: "tls_ca, tls_pin, token_env and token_credential are for a server; with nats use nats_tls_ca, nats_creds or nats_nkey".into(),
                        });
                    }
                    let config = crate::nats::NatsConfig {
                        urls: urls.clone(),
                        creds: s.nats_creds.clone(),
                        nkey: s.nats_nkey.clone(),
                        tls_ca: s.nats_tls_ca.clone(),
                        bucket: crate::nats::events::BUCKET.into(),
                    };
                    config.check().map_err(|e| ConfigError::SlugNats {
                        slug: s.name.clone(),
                        message: e.replace("--backend", "nats").replace("--nats-", "nats_"),
                    })?;
                    let source = s.nats_source.clone().unwrap_or_else(|| s.name.clone());
                    if !crate::nats::events::valid_name(&source) {
                        return Err(ConfigError::SlugNats {
                            slug: s.name.clone(),
                            message: format!(
                                "nats_source {source:?}: use letters, digits, '_' and '-'"
                            ),
                        });
                    }
                    Some(NatsSlug { config, source })
                }
            };
            let target = match (s.stdio, s.http, s.quic, &nats) {
                (Some(c), None, None, None) => Target::Stdio(c),
                (None, Some(u), None, None) => Target::Http(u),
                (None, None, Some(a), None) => Target::Quic(a),
                (None, None, None, Some(n)) => Target::Stdio(format!(
                    "{}{} on {}",
                    crate::transport::target::NATS_MIRROR,
                    n.source,
                    n.config.redacted()
                )),
                _ => return Err(ConfigError::SlugTarget(s.name)),
            };
            let token = match (&s.token_env, &s.token_credential) {
                (None, None) => None,
                (Some(_), Some(_)) => return Err(ConfigError::TokenTwice(s.name)),
                (Some(var), None) => Some(Secret(
                    std::env::var(var)
                        .inspect(|_| crate::runtime::secrets::register(var))
                        .map_err(|_| ConfigError::TokenEnvUnset {
                            slug: s.name.clone(),
                        })?,
                )),
                (None, Some(name)) => {
                    let dir = std::env::var_os("CREDENTIALS_DIRECTORY").map(PathBuf::from);
                    Some(Secret(read_credential(dir.as_deref(), &s.name, name)?))
                }
            };
            if let Some(pin) = &s.tls_pin {
                crate::transport::tls::parse_pin(pin).map_err(|error| ConfigError::TlsPin {
                    slug: s.name.clone(),
                    error,
                })?;
            }
            if let Target::Http(url) = &target {
                crate::transport::explain::check_http_url(url).map_err(|message| {
                    ConfigError::SlugUrl {
                        slug: s.name.clone(),
                        message,
                    }
                })?;
            }
            let oauth = match &s.oauth {
                Some(o) => Some(super::slug_oauth::session(o, &target).map_err(|message| {
                    ConfigError::SlugOAuth {
                        slug: s.name.clone(),
                        message,
                    }
                })?),
                None => None,
            };
            slugs.push(Slug {
                name: s.name,
                target,
                trust: ClientTrust {
                    ca: s.tls_ca,
                    pin: s.tls_pin,
                    token,
                    oauth,
                },
                handshake_timeout: DEFAULT_CONNECT_TIMEOUT,
                nats,
                prefix: s.prefix != Some(false),
            });
        }
        let mut tokens = Vec::new();
        for (i, t) in token_files.into_iter().enumerate() {
            let label = t.name.unwrap_or_else(|| format!("token #{}", i + 1));
            let bytes = hex::decode(t.sha256.trim()).ok().filter(|b| b.len() == 32);
            let Some(bytes) = bytes else {
                return Err(ConfigError::TokenSha256 { token: label });
            };
            let mut sha256 = [0u8; 32];
            sha256.copy_from_slice(&bytes);
            let mut set = BTreeSet::new();
            for s in t.slugs {
                if s == "*" {
                    set.extend(slugs.iter().map(|x| x.name.clone()));
                    set.extend(roles.iter().map(|r| (*r).to_owned()));
                } else if slugs.iter().any(|x| x.name == s) || roles.contains(&s.as_str()) {
                    set.insert(s);
                } else {
                    return Err(ConfigError::TokenSlug {
                        token: label,
                        slug: s,
                    });
                }
            }
            tokens.push(Token {
                label,
                sha256,
                slugs: set,
            });
        }
        Ok((slugs, tokens))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HASH: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

    #[test]
    fn events_are_read_and_checked() {
        let c = GatewayConfig::parse(
            "[events]\ncallback_allow = [\"http://127.0.0.1:\"]\nprofile = \"chatgpt\"\n\
             [[slug]]\nname = \"a\"\nstdio = \"x\"\n",
        )
        .unwrap();
        assert_eq!(c.events.callback_allow, ["http://127.0.0.1:"]);
        assert_eq!(c.events.profile, crate::hooks::Profile::Chatgpt);
        let e = GatewayConfig::parse("[events]\nallow = []\n").unwrap_err();
        assert!(e.to_string().contains("allow"), "{e}");
        assert_eq!(
            GatewayConfig::parse("").unwrap().events,
            crate::hooks::EventsOptions::default()
        );
    }

    #[test]
    fn one_slug_may_keep_its_names_bare_and_open_to_loopback_is_read() {
        let c = GatewayConfig::parse(
            "open_to_loopback = true\n[[slug]]\nname = \"a\"\nstdio = \"x\"\nprefix = false\n\
             [[slug]]\nname = \"b\"\nstdio = \"y\"\n",
        )
        .unwrap();
        assert!(c.open_to_loopback);
        assert!(!c.slugs[0].prefix && c.slugs[1].prefix);
        // No [[token]]: callers on this host need none, as in herald up; with one, they do.
        assert!(
            GatewayConfig::parse("[[slug]]\nname = \"a\"\nstdio = \"x\"\n")
                .unwrap()
                .open_to_loopback
        );
        assert!(
            !GatewayConfig::parse(&format!(
                "[[slug]]\nname = \"a\"\nstdio = \"x\"\n[[token]]\nsha256 = \"{HASH}\"\nslugs = [\"*\"]\n"
            ))
            .unwrap()
            .open_to_loopback
        );
        let e = GatewayConfig::parse(
            "[[slug]]\nname = \"a\"\nstdio = \"x\"\nprefix = false\n\
             [[slug]]\nname = \"b\"\nstdio = \"y\"\nprefix = false\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("slugs a and b both have prefix = false"), "{e}");
    }

    #[test]
    fn an_empty_address_is_off() {
        let c = GatewayConfig::parse("http = \"127.0.0.1:0\"\nquic = \" \"\n").unwrap();
        assert_eq!((c.http.as_deref(), c.quic), (Some("127.0.0.1:0"), None));
    }

    #[test]
    fn open_to_loopback_needs_loopback_addresses() {
        let e = GatewayConfig::parse("open_to_loopback = true\nhttp = \"0.0.0.0:8770\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("0.0.0.0:8770 is not loopback"), "{e}");
        assert!(
            GatewayConfig::parse(
                "open_to_loopback = true\nhttp = \"127.0.0.1:8770\"\nquic = \"[::1]:8771\"\n"
            )
            .is_ok()
        );
        assert!(open_on_loopback_only(["localhost:1", "10.0.0.1:2"], false).is_err());
        // No [[token]] off loopback is refused, as herald up refuses it, saying what to add.
        let e = GatewayConfig::parse("http = \"0.0.0.0:8770\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("0.0.0.0:8770 is not a loopback address and there is no [[token]]")
                && e.contains("printf %s TOKEN | sha256sum"),
            "{e}"
        );
        assert!(GatewayConfig::parse("http = \"\"\nquic = \"127.0.0.1:1\"\n").is_ok());
    }

    #[test]
    fn a_valid_config() {
        let c = GatewayConfig::parse(&format!(
            "[[slug]]\nname = \"memo\"\nstdio = \"herald memo\"\n\
             [[slug]]\nname = \"k-8\"\nhttp = \"http://x/mcp\"\n\
             [[token]]\nsha256 = \"{HASH}\"\nslugs = [\"*\"]\n\
             [[token]]\nname = \"ro\"\nsha256 = \"{HASH}\"\nslugs = [\"memo\"]\n"
        ))
        .unwrap();
        assert_eq!(c.slugs.len(), 2);
        assert_eq!(c.tokens[0].slugs.len(), 2);
        assert_eq!(c.tokens[1].label, "ro");
        assert!(matches!(c.slugs[1].target, Target::Http(_)));
    }

    #[test]
    fn a_nats_slug_is_checked() {
        let c = GatewayConfig::parse(
            "[[slug]]\nname = \"edge\"\nnats = \"nats://n1:4222,nats://n2:4222\"\nnats_source = \"edge1-files\"\n",
        )
        .unwrap();
        let n = c.slugs[0].nats.as_ref().unwrap();
        assert_eq!(n.source, "edge1-files");
        assert_eq!(n.config.urls, "nats://n1:4222,nats://n2:4222");
        // `/status` names it as what it is: the event logs of a source on NATS.
        assert_eq!(
            c.slugs[0].target.redacted(),
            "nats: the event logs of edge1-files on nats://n1:4222,nats://n2:4222"
        );
        let c =
            GatewayConfig::parse("[[slug]]\nname = \"edge\"\nnats = \"nats://n1:4222\"\n").unwrap();
        assert_eq!(
            c.slugs[0].nats.as_ref().unwrap().source,
            "edge",
            "the slug's name"
        );
        for (text, needle) in [
            ("nats = \"http://x\"", "nats://HOST:PORT"),
            (
                "nats = \"nats://x:1\"\nhttp = \"http://x/mcp\"",
                "exactly one of",
            ),
            ("nats = \"nats://x:1\"\ntls_ca = \"ca.pem\"", "nats_tls_ca"),
            (
                "nats = \"nats://x:1\"\nnats_source = \"a.b\"",
                "nats_source",
            ),
            (
                "http = \"http://x/mcp\"\nnats_creds = \"c.creds\"",
                "go with nats",
            ),
        ] {
            let e = GatewayConfig::parse(&format!("[[slug]]\nname = \"edge\"\n{text}\n"))
                .unwrap_err()
                .to_string();
            assert!(e.contains("slug edge") && e.contains(needle), "{text}: {e}");
        }
    }

    #[test]
    fn bad_configs_say_what_to_fix() {
        for (text, needle) in [
            ("[[slug]]\nname = \"a__b\"\nstdio = \"x\"\n", "not valid"),
            ("[[slug]]\nname = \"a+b\"\nstdio = \"x\"\n", "not valid"),
            ("[[slug]]\nname = \"Memo\"\nstdio = \"x\"\n", "not valid"),
            ("[[slug]]\nname = \"-\"\nstdio = \"x\"\n", "not valid"),
            ("[[slug]]\nname = \"-a\"\nstdio = \"x\"\n", "not valid"),
            ("[[slug]]\nname = \"a\"\n", "exactly one of"),
            (
                "[[slug]]\nname = \"a\"\nstdio = \"x\"\nhttp = \"y\"\n",
                "exactly one of",
            ),
            (
                "[[slug]]\nname = \"a\"\nstdio = \"x\"\n[[slug]]\nname = \"a\"\nstdio = \"y\"\n",
                "defined twice",
            ),
            ("[[token]]\nsha256 = \"abc\"\nslugs = []\n", "64 hex digits"),
            (
                &format!("[[token]]\nsha256 = \"{HASH}\"\nslugs = [\"nope\"]\n"),
                "not a [[slug]]",
            ),
            (
                "[[slug]]\nname = \"a\"\nstdio = \"x\"\ncolor = 1\n",
                "unknown field",
            ),
            (
                "[[slug]]\nname = \"a\"\nhttp = \"127.0.0.1:8753/mcp\"\n",
                "slug a: http = 127.0.0.1:8753/mcp is not a URL: it needs http://",
            ),
            (
                "[[slug]]\nname = \"a\"\nhttp = \"x\"\ntoken_env = \"HERALD_SURELY_UNSET_VAR\"\n",
                "not set",
            ),
        ] {
            let e = GatewayConfig::parse(text).unwrap_err().to_string();
            assert!(e.contains(needle), "{text}: {e}");
        }
    }

    #[test]
    fn a_token_credential_is_read_from_the_credentials_directory() {
        let dir = std::env::temp_dir().join(format!("herald-cred-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("cluster"), "s3cret\n").unwrap();
        std::fs::write(dir.join("empty"), "\n").unwrap();
        assert_eq!(
            read_credential(Some(&dir), "c", "cluster").unwrap(),
            "s3cret"
        );
        for (d, name, needle) in [
            (None, "cluster", "LoadCredential=cluster:"),
            (Some(dir.as_path()), "../cluster", "without /"),
            (Some(dir.as_path()), "missing", "cannot read the credential"),
            (Some(dir.as_path()), "empty", "is empty"),
        ] {
            let e = read_credential(d, "c", name).unwrap_err().to_string();
            assert!(e.contains(needle) && e.starts_with("slug c"), "{name}: {e}");
            assert!(!e.contains("s3cret"), "{e}");
        }
        let e = GatewayConfig::parse(
            "[[slug]]\nname = \"a\"\nhttp = \"x\"\ntoken_env = \"A\"\ntoken_credential = \"b\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("not both"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_parse_error_names_its_line_but_never_shows_it() {
        let text = "[[slug]]\nname = \"a\"\nhttp = \"x\"\ntoken = \"xoxb-s3cret\"\n";
        let e = GatewayConfig::parse(text).unwrap_err().to_string();
        assert!(
            e.contains("line 4") && e.contains("unknown field `token`"),
            "{e}"
        );
        assert!(!e.contains("s3cret"), "{e}");
    }

    /// Found by `fuzz_gateway_config_mutated_structure`: `token = "s3cret-…"` (a string where
    /// the `[[token]]` tables belong) was refused with `invalid type: string "s3cret-…",
    /// expected a sequence`, the value quoted.
    #[test]
    fn a_toml_error_never_quotes_a_value() {
        for (text, needles) in [
            (
                "token = \"s3cret-a\"\n",
                &[
                    "line 1: token: expected an array, found a string",
                    "not shown",
                ][..],
            ),
            (
                "[[token]]\nsha256 = \"x\"\nslugs = [\"*\"]\nname = [\"s3cret-b\"]\n",
                &["line 4: name: expected a string, found an array"],
            ),
            (
                "token = [\"s3cret-c\"]\n",
                &["line 1: token: expected a table, found a string"],
            ),
            (
                "[[slug]]\nname = \"a\"\nstdio = 7\n",
                &["line 3: stdio: expected a string, found an integer"],
            ),
            (
                "\"s3cret-d\" = 1\n",
                &[
                    "line 1: unknown field (its name is not shown",
                    "expected one of `http`",
                ],
            ),
            (
                "[[slug]]\nname = \"a\"\nstdio = \"x\"\nstdio_cmd = \"s3cret-e\"\n",
                &["line 4: unknown field `stdio_cmd`, expected one of `name`"],
            ),
            (
                "http = s3cret-f\n",
                &["line 1: http: string values must be quoted"],
            ),
        ] {
            let e = GatewayConfig::parse(text).unwrap_err().to_string();
            assert!(!e.contains("s3cret"), "{text}: {e}");
            for needle in needles {
                assert!(e.contains(needle), "{text}: {e}");
            }
        }
    }

    #[test]
    fn an_unset_token_env_is_not_named() {
        let e = GatewayConfig::parse(
            "[[slug]]\nname = \"a\"\nhttp = \"x\"\ntoken_env = \"xoxb-s3cret\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("slug a: ") && e.contains("not set"), "{e}");
        assert!(!e.contains("s3cret"), "{e}");
    }

    #[test]
    fn a_loaded_config_names_its_file() {
        let path = std::env::temp_dir().join(format!("herald-gateway-{}.toml", std::process::id()));
        let e = GatewayConfig::load(&path).unwrap_err().to_string();
        assert!(
            e.starts_with(&format!("cannot read {}: ", path.display())),
            "{e}"
        );
        std::fs::write(&path, "[[slug]]\nname = \"a\"\n").unwrap();
        let e = GatewayConfig::load(&path).unwrap_err();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(
            e.to_string(),
            format!(
                "{}: slug a needs exactly one of stdio = \"CMD\", http = \"URL\", quic = \"HOST:PORT\" or nats = \"nats://HOST:PORT\"",
                path.display()
            )
        );
        assert!(
            std::error::Error::source(&e).is_none(),
            "the cause is in the message, so `{{:#}}` does not repeat it"
        );
    }
}

#[cfg(test)]
#[path = "config_fuzz.rs"]
pub(crate) mod fuzz;

/// Checks the `[[issuer]]`s: each valid, no issuer twice.
pub fn validate_issuers(
    files: Vec<crate::auth::issuer::IssuerFile>,
) -> Result<Vec<crate::auth::issuer::IssuerConfig>, ConfigError> {
    let mut out: Vec<crate::auth::issuer::IssuerConfig> = Vec::new();
    for f in files {
        let c = f.validate().map_err(ConfigError::Issuer)?;
        let same = |a: &str, b: &str| a.trim_end_matches('/') == b.trim_end_matches('/');
        if out.iter().any(|o| same(&o.url, &c.url)) {
            return Err(ConfigError::Issuer(format!(
                "[[issuer]] {}: named twice; give each issuer once",
                c.url
            )));
        }
        out.push(c);
    }
    Ok(out)
}
