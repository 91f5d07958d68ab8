//! The identity providers a resource server trusts (`[[issuer]]`), their signing keys kept
//! fresh, and the access tokens they issue turned into [`Grant`]s.
//!
//! An issuer's keys come from `jwks_file` (air-gapped sites: read at start and on reload) or
//! from the issuer's own metadata: RFC 8414 (`/.well-known/oauth-authorization-server`) or
//! OpenID discovery (`/.well-known/openid-configuration`) names its `jwks_uri`. They are
//! fetched at start (retried with backoff while the provider cannot be reached: a host boots
//! in any order), refreshed every [`REFRESH`], and fetched again at once when a token names a
//! key the set lacks (a rotation): once per key id in [`REFETCH_GAP`], and at most
//! [`REFETCHES`] such fetches in it, so a flood of made-up key ids cannot turn into a flood of
//! fetches.
//!
//! A verified token is remembered (by its SHA-256, never the token) until it expires, so the
//! several checks one request makes, and the next requests with the same token, cost a hash
//! lookup rather than a signature check.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sha2::Digest as _;
use tokio_util::sync::CancellationToken;

use super::jwks::KeySet;
use super::jwt::{Expect, Refusal, SKEW_SECS, Unverified, scopes};
use crate::runtime::backoff::Backoff;
use crate::sync::{Recover, RecoverRw};

/// How often an issuer's keys are fetched again when nothing asks sooner.
pub const REFRESH: Duration = Duration::from_secs(3600);
/// The window in which one key id asks for at most one fetch, and all of them for at most
/// [`REFETCHES`].
pub const REFETCH_GAP: Duration = Duration::from_secs(10);
/// Fetches that unknown key ids may ask for in one [`REFETCH_GAP`].
pub const REFETCHES: usize = 3;
/// Verified tokens remembered at most (the memory is cleared when it is full).
const REMEMBERED: usize = 16_384;
/// The largest metadata or key set document read.
const DOCUMENT_LIMIT: usize = 1 << 20;

/// One `[[issuer]]`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssuerConfig {
    /// The issuer identifier: `iss` of its tokens, and where its metadata is.
    pub url: String,
    /// This resource as the issuer names it in `aud`.
    pub audience: String,
    /// The key set, from a file instead of the issuer's metadata.
    pub jwks_file: Option<PathBuf>,
    /// The claim holding the scopes (`scope` by default).
    pub scope_claim: String,
    /// Only tokens typed as access tokens (`typ: at+jwt`, RFC 9068) are taken; else also
    /// untyped ones and `typ: JWT`, as many providers issue them.
    pub require_at_jwt: bool,
}

/// One `[[issuer]]` as written.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct IssuerFile {
    pub url: String,
    pub audience: String,
    #[serde(default)]
    pub jwks_file: Option<PathBuf>,
    #[serde(default)]
    pub scope_claim: Option<String>,
    #[serde(default)]
    pub require_at_jwt: bool,
}

impl IssuerFile {
    /// Checks the entry: an `https://` issuer (`http://` only on loopback), an audience, a
    /// `jwks_file` that holds a key set. Errors name the issuer and say what to change.
    pub fn validate(self) -> Result<IssuerConfig, String> {
        let url = self.url.trim_end_matches('/').to_owned();
        let host = url
            .strip_prefix("https://")
            .or_else(|| url.strip_prefix("http://").filter(|h| loopback_host(h)))
            .ok_or_else(|| {
                format!(
                    "[[issuer]] {url}: the url must be the issuer's https:// identifier (http:// only on loopback)"
                )
            })?;
        if host.is_empty() || url.contains(['?', '#']) {
            return Err(format!(
                "[[issuer]] {url}: the url must be the issuer's identifier, with no query or fragment"
            ));
        }
        if self.audience.trim().is_empty() {
            return Err(format!(
                "[[issuer]] {url}: audience must name this server as the issuer puts it in aud (usually its MCP endpoint's URL)"
            ));
        }
        if let Some(path) = &self.jwks_file {
            read_file(path).map_err(|e| format!("[[issuer]] {url}: {e}"))?;
        }
        Ok(IssuerConfig {
            url: self.url,
            audience: self.audience,
            jwks_file: self.jwks_file,
            scope_claim: self.scope_claim.unwrap_or_else(|| "scope".into()),
            require_at_jwt: self.require_at_jwt,
        })
    }
}

/// Whether the host part of `rest` (after the scheme) is a loopback name or address.
fn loopback_host(rest: &str) -> bool {
    let authority = rest.split('/').next().unwrap_or("");
    let host = match authority.rsplit_once(':') {
        Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => authority,
    };
    host == "localhost" || host == "127.0.0.1" || host == "[::1]"
}

/// What a verified token grants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The issuer's URL.
    pub issuer: String,
    /// A key for the principal (issuer and `sub`, else `client_id`, hashed): the same across
    /// the principal's tokens, never a claim's value. `None` for a token naming neither: it
    /// is then known by itself alone (a principal shared by every such token would let them
    /// see each other's tasks).
    pub principal: Option<String>,
    /// The granted scopes.
    pub scopes: Vec<String>,
    /// `exp`, seconds since the Unix epoch.
    pub expires: u64,
}

impl Grant {
    /// How long the token has left, with the clock skew allowed.
    pub fn left(&self) -> Duration {
        let end = self.expires.saturating_add(SKEW_SECS);
        Duration::from_secs(end.saturating_sub(now()))
    }
}

struct Issuer {
    config: IssuerConfig,
    keys: RwLock<Arc<KeySet>>,
    /// The fetches unknown key ids asked for lately (one such fetch at a time).
    refetches: tokio::sync::Mutex<Refetches>,
    /// Held through every fetch of this issuer's keys, so they are put in place in the order
    /// they were fetched (an older set never replaces a newer one).
    fetching: tokio::sync::Mutex<()>,
    /// How the last fetch went, for the status board: when the keys came, why not.
    fetched: Mutex<(Option<Instant>, Option<String>)>,
}

#[derive(Default)]
struct Refetches {
    /// When, within the last [`REFETCH_GAP`].
    at: std::collections::VecDeque<Instant>,
    /// For which key ids (`""` for none), within it.
    kids: HashMap<String, Instant>,
}

/// Every trusted issuer, and the tokens verified lately.
pub struct Issuers {
    issuers: Vec<Issuer>,
    remembered: Mutex<HashMap<[u8; 32], Grant>>,
    /// Counts the key sets put in place that changed anything (see `verify`).
    generation: AtomicU64,
    http: reqwest::Client,
    /// Ends the task keeping the keys fresh ([`start`](Issuers::start)) when these are
    /// dropped (a reload that changed the issuers).
    stop: CancellationToken,
}

impl Drop for Issuers {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl std::fmt::Debug for Issuers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let urls: Vec<&str> = self.issuers.iter().map(|i| i.config.url.as_str()).collect();
        f.debug_struct("Issuers").field("urls", &urls).finish()
    }
}

/// Seconds since the Unix epoch.
fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Issuers {
    /// The issuers of `configs`; a `jwks_file` is read now (an error names the file and
    /// what is wrong with it).
    pub fn new(configs: Vec<IssuerConfig>) -> Result<Issuers, String> {
        let http = crate::transport::web::http_client(|b| {
            b.timeout(Duration::from_secs(10))
                .redirect(reqwest::redirect::Policy::custom(|attempt| {
                    if attempt.previous().len() > 3 {
                        attempt.error("more than 3 redirects")
                    } else if !secure(attempt.url().as_str()) {
                        attempt.error("a redirect away from https")
                    } else {
                        attempt.follow()
                    }
                }))
        })
        .map_err(|e| format!("cannot build the HTTP client for [[issuer]] keys: {e}"))?;
        let mut issuers = Vec::with_capacity(configs.len());
        for config in configs {
            let keys = match &config.jwks_file {
                Some(path) => read_file(path)?,
                None => KeySet::default(),
            };
            issuers.push(Issuer {
                config,
                keys: RwLock::new(Arc::new(keys)),
                refetches: tokio::sync::Mutex::default(),
                fetching: tokio::sync::Mutex::new(()),
                fetched: Mutex::default(),
            });
        }
        Ok(Issuers {
            issuers,
            remembered: Mutex::default(),
            generation: AtomicU64::new(0),
            http,
            stop: CancellationToken::new(),
        })
    }

    /// Whether these are the issuers `configs` configure.
    pub fn same(&self, configs: &[IssuerConfig]) -> bool {
        self.issuers.len() == configs.len()
            && self
                .issuers
                .iter()
                .zip(configs)
                .all(|(i, c)| i.config == *c)
    }

    /// Whether any issuer is configured.
    pub fn is_empty(&self) -> bool {
        self.issuers.is_empty()
    }

    /// The issuers' URLs, in config order.
    pub fn urls(&self) -> Vec<String> {
        self.issuers.iter().map(|i| i.config.url.clone()).collect()
    }

    /// The first issuer's audience: the resource these issuers grant access to.
    pub fn resource(&self) -> Option<&str> {
        self.issuers.first().map(|i| i.config.audience.as_str())
    }

    /// The grant `token` carries, with the keys held now (no fetch). Remembered tokens cost a
    /// hash lookup.
    pub fn verify(&self, token: &str) -> Result<Grant, Refusal> {
        self.verify_digest(token, &sha2::Sha256::digest(token.as_bytes()).into())
    }

    /// [`verify`](Self::verify), given the token's SHA-256 (a caller hashes its token once).
    pub fn verify_digest(&self, token: &str, digest: &[u8; 32]) -> Result<Grant, Refusal> {
        let digest = *digest;
        let now = now();
        if let Some(g) = self.remembered.locked().get(&digest)
            && g.expires.saturating_add(SKEW_SECS) > now
        {
            return Ok(g.clone());
        }
        let unverified = Unverified::parse(token)?;
        let issuer = self.issuer_of(&unverified)?;
        // Read before the keys: a fetch that changes them after this forgets what is
        // remembered, and this token is then not remembered either (see `fetch`).
        let generation = self.generation.load(Ordering::Acquire);
        let keys = issuer.keys.read_locked().clone();
        let claims = unverified.verify(
            &keys,
            &Expect {
                issuer: &issuer.config.url,
                audience: &issuer.config.audience,
                now,
                at_jwt_only: issuer.config.require_at_jwt,
            },
        )?;
        let subject = ["sub", "client_id"].iter().find_map(|c| {
            let v = claims.get(*c)?.as_str().filter(|v| !v.is_empty())?;
            Some(format!("{c}:{v}"))
        });
        let principal = subject.map(|s| {
            let h: [u8; 32] =
                sha2::Sha256::digest(format!("{}\u{0}{s}", issuer.config.url).as_bytes()).into();
            hex::encode(&h[..16])
        });
        let grant = Grant {
            issuer: issuer.config.url.clone(),
            principal,
            scopes: scopes(&claims, &issuer.config.scope_claim),
            expires: claims
                .get("exp")
                .and_then(|v| v.as_f64())
                .map_or(0, |e| e as u64),
        };
        let mut remembered = self.remembered.locked();
        if self.generation.load(Ordering::Acquire) == generation {
            if remembered.len() >= REMEMBERED {
                remembered.clear();
            }
            remembered.insert(digest, grant.clone());
        }
        Ok(grant)
    }

    /// [`verify`](Self::verify), first fetching the issuer's keys again when the token names
    /// one its set lacks (a rotation; within the limits of the module docs); then, if the key
    /// is still unknown, refused.
    pub async fn verify_fresh(&self, token: &str) -> Result<Grant, Refusal> {
        match self.verify(token) {
            Err(Refusal::UnknownKey) => {}
            other => return other,
        }
        let Ok(unverified) = Unverified::parse(token) else {
            return Err(Refusal::Malformed);
        };
        let issuer = self.issuer_of(&unverified)?;
        // Bounded: a request waits at most this long for a provider that is slow to answer.
        let refetch = tokio::time::timeout(
            Duration::from_secs(5),
            self.refetch_for(issuer, unverified.header.kid.as_deref()),
        );
        if issuer.config.jwks_file.is_none()
            && let Err(e) = refetch
                .await
                .unwrap_or_else(|_| Err("no answer within 5 s".into()))
        {
            tracing::warn!(issuer = %issuer.config.url, "cannot fetch the issuer's signing keys ({e})");
        }
        self.verify(token)
    }

    /// The configured issuer a token names in `iss`.
    fn issuer_of(&self, token: &Unverified) -> Result<&Issuer, Refusal> {
        let iss = token.issuer().ok_or(Refusal::Issuer)?;
        self.issuers
            .iter()
            .find(|i| i.config.url == iss)
            .ok_or(Refusal::Issuer)
    }

    /// Fetches `issuer`'s keys for a token naming `kid`, which its set lacks: unless that
    /// key id asked within [`REFETCH_GAP`], or [`REFETCHES`] fetches did, or the fetch of a
    /// request this one waited on brought it.
    async fn refetch_for(&self, issuer: &Issuer, kid: Option<&str>) -> Result<(), String> {
        let mut lately = issuer.refetches.lock().await;
        // (After any fetch under way: it may bring the key.)
        let _one = issuer.fetching.lock().await;
        if issuer.keys.read_locked().find(kid).is_some() {
            return Ok(());
        }
        let now = Instant::now();
        lately.at.retain(|t| now.duration_since(*t) < REFETCH_GAP);
        lately
            .kids
            .retain(|_, t| now.duration_since(*t) < REFETCH_GAP);
        let kid = kid.unwrap_or("").to_owned();
        if lately.kids.contains_key(&kid) || lately.at.len() >= REFETCHES {
            return Ok(());
        }
        lately.kids.insert(kid, now);
        lately.at.push_back(now);
        self.fetch_held(issuer).await
    }

    /// Fetches `issuer`'s keys and puts them in place. When they changed, the tokens
    /// remembered are forgotten: a key dropped from the set (revoked) lets nothing in after.
    async fn fetch(&self, issuer: &Issuer) -> Result<(), String> {
        let _one = issuer.fetching.lock().await;
        self.fetch_held(issuer).await
    }

    /// [`fetch`](Self::fetch), with `issuer.fetching` held by the caller.
    async fn fetch_held(&self, issuer: &Issuer) -> Result<(), String> {
        let keys = match fetch_keys(&self.http, &issuer.config.url).await {
            Ok(k) => k,
            Err(e) => {
                issuer.fetched.locked().1 = Some(e.clone());
                return Err(e);
            }
        };
        *issuer.fetched.locked() = (Some(Instant::now()), None);
        // Under the memory's lock: a `verify` that read the old keys cannot remember its
        // token after this.
        let mut remembered = self.remembered.locked();
        let old = std::mem::replace(&mut *issuer.keys.write_locked(), Arc::new(keys.clone()));
        if *old != keys {
            self.generation.fetch_add(1, Ordering::AcqRel);
            remembered.clear();
        }
        Ok(())
    }

    /// Takes the keys of `running`'s issuers that these configure the same way (fetched ones:
    /// a file's are read anew), so a reload does not leave tokens unverifiable until the
    /// first fetch.
    pub fn inherit(&self, running: &Issuers) {
        for i in &self.issuers {
            if i.config.jwks_file.is_some() {
                continue;
            }
            if let Some(old) = running.issuers.iter().find(|o| o.config == i.config) {
                *i.keys.write_locked() = old.keys.read_locked().clone();
            }
        }
    }

    /// Starts keeping every issuer's keys fresh, until these issuers are dropped: the
    /// metadata's fetched at once (retried with backoff while it fails), then every
    /// [`REFRESH`]. Must be called within the runtime.
    pub fn start(self: &Arc<Self>) {
        for i in 0..self.issuers.len() {
            if self.issuers[i].config.jwks_file.is_some() {
                continue;
            }
            let this = Arc::downgrade(self);
            let stop = self.stop.clone();
            tokio::spawn(async move {
                let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
                loop {
                    let wait = {
                        let Some(this) = this.upgrade() else { return };
                        let issuer = &this.issuers[i];
                        match this.fetch(issuer).await {
                            Ok(()) => {
                                backoff.reset();
                                REFRESH
                            }
                            Err(e) => {
                                let wait = backoff.next_delay();
                                tracing::warn!(
                                    issuer = %issuer.config.url,
                                    "cannot fetch the issuer's signing keys ({e}); its tokens are refused until they come, retrying in {} s",
                                    wait.as_secs()
                                );
                                wait
                            }
                        }
                    };
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(wait) => {}
                    }
                }
            });
        }
    }
}

impl crate::runtime::status::IssuerStatus for Issuers {
    fn report(&self) -> Vec<crate::runtime::status::IssuerReport> {
        self.issuers
            .iter()
            .map(|i| {
                let (at, error) = i.fetched.locked().clone();
                crate::runtime::status::IssuerReport {
                    url: i.config.url.clone(),
                    keys: i.keys.read_locked().keys.len(),
                    source: match i.config.jwks_file {
                        Some(_) => "file".into(),
                        None => "metadata".into(),
                    },
                    fetched_secs_ago: at.map(|t| t.elapsed().as_secs()),
                    error,
                }
            })
            .collect()
    }
}

/// The key set in `path`.
fn read_file(path: &std::path::Path) -> Result<KeySet, String> {
    let bytes = std::fs::read(path)
        .map_err(|e| format!("jwks_file {}: cannot read it: {e}", path.display()))?;
    KeySet::parse(&bytes).map_err(|e| format!("jwks_file {}: {e}", path.display()))
}

/// Where an issuer's metadata may be, in the order tried: RFC 8414's (the well-known path
/// before the issuer's path), then OpenID's (after it).
pub fn metadata_urls(issuer: &str) -> Vec<String> {
    let trimmed = issuer.trim_end_matches('/');
    let (origin, path) = match trimmed.find("://").map(|i| i + 3) {
        Some(start) => match trimmed[start..].find('/') {
            Some(p) => trimmed.split_at(start + p),
            None => (trimmed, ""),
        },
        None => (trimmed, ""),
    };
    let mut urls = vec![format!(
        "{origin}/.well-known/oauth-authorization-server{path}"
    )];
    urls.push(format!("{trimmed}/.well-known/openid-configuration"));
    if !path.is_empty() {
        urls.push(format!("{origin}/.well-known/openid-configuration{path}"));
    }
    urls
}

/// The issuer's key set, by way of its metadata's `jwks_uri`. The metadata must name the
/// issuer itself (RFC 8414 section 3.3).
async fn fetch_keys(http: &reqwest::Client, issuer: &str) -> Result<KeySet, String> {
    let mut last = String::new();
    for url in metadata_urls(issuer) {
        let body = match get(http, &url).await {
            Ok(Some(b)) => b,
            Ok(None) => continue,
            Err(e) => {
                last = e;
                continue;
            }
        };
        let meta: serde_json::Value = match serde_json::from_slice(&body) {
            Ok(m) => m,
            Err(e) => {
                last = format!("{url} is not JSON metadata: {e}");
                continue;
            }
        };
        if meta["issuer"].as_str() != Some(issuer) {
            return Err(format!(
                "{url} names another issuer ({}): the configured url must be the issuer's identifier exactly",
                meta["issuer"]
            ));
        }
        let jwks = meta["jwks_uri"]
            .as_str()
            .ok_or_else(|| format!("{url} names no jwks_uri: set jwks_file instead"))?;
        let keys = get(http, jwks)
            .await?
            .ok_or_else(|| format!("{jwks} (the jwks_uri) is not found"))?;
        return KeySet::parse(&keys).map_err(|e| format!("{jwks}: {e}"));
    }
    Err(if last.is_empty() {
        format!("no metadata at {}", metadata_urls(issuer).join(" nor "))
    } else {
        last
    })
}

/// Whether keys may be fetched from `url`: `https://`, or `http://` on loopback (a test's
/// provider). Keys that came over plain HTTP from elsewhere could be anyone's.
fn secure(url: &str) -> bool {
    url.starts_with("https://") || url.strip_prefix("http://").is_some_and(loopback_host)
}

/// The body at `url` (at most [`DOCUMENT_LIMIT`] bytes), `None` for a 404.
async fn get(http: &reqwest::Client, url: &str) -> Result<Option<Vec<u8>>, String> {
    if !secure(url) {
        return Err(format!(
            "{url}: keys are fetched over https only (http only on loopback)"
        ));
    }
    let mut response = http
        .get(url)
        .header(reqwest::header::ACCEPT, "application/json")
        .send()
        .await
        .map_err(|e| format!("cannot reach {url}: {}", e.without_url()))?;
    let status = response.status();
    if status == reqwest::StatusCode::NOT_FOUND {
        return Ok(None);
    }
    if !status.is_success() {
        return Err(format!("{url} answered {status}"));
    }
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| format!("reading {url}: {}", e.without_url()))?
    {
        body.extend_from_slice(&chunk);
        if body.len() > DOCUMENT_LIMIT {
            return Err(format!("{url} is over {DOCUMENT_LIMIT} bytes"));
        }
    }
    Ok(Some(body))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(url: &str, audience: &str) -> IssuerFile {
        IssuerFile {
            url: url.into(),
            audience: audience.into(),
            jwks_file: None,
            scope_claim: None,
            require_at_jwt: false,
        }
    }

    #[test]
    fn an_issuer_is_https_or_loopback_with_an_audience() {
        let ok = file("https://id.example/realms/edge", "https://h/mcp")
            .validate()
            .unwrap();
        assert_eq!(ok.scope_claim, "scope");
        assert!(file("http://127.0.0.1:8080", "a").validate().is_ok());
        assert!(file("http://localhost", "a").validate().is_ok());
        for (url, aud, says) in [
            ("http://id.example", "a", "https://"),
            ("http://127.0.0.1.evil.example", "a", "https://"),
            ("id.example", "a", "https://"),
            ("https://id.example?x=1", "a", "no query"),
            ("https://id.example", " ", "audience"),
        ] {
            let e = file(url, aud).validate().unwrap_err();
            assert!(e.contains(says) && e.contains("[[issuer]]"), "{url}: {e}");
        }
        let mut missing = file("https://id.example", "a");
        missing.jwks_file = Some("/nonexistent/keys.json".into());
        let e = missing.validate().unwrap_err();
        assert!(e.contains("jwks_file /nonexistent/keys.json"), "{e}");
    }

    #[test]
    fn metadata_is_looked_for_where_both_specs_put_it() {
        assert_eq!(
            metadata_urls("https://id.example"),
            [
                "https://id.example/.well-known/oauth-authorization-server",
                "https://id.example/.well-known/openid-configuration"
            ]
        );
        assert_eq!(
            metadata_urls("https://id.example/realms/edge/"),
            [
                "https://id.example/.well-known/oauth-authorization-server/realms/edge",
                "https://id.example/realms/edge/.well-known/openid-configuration",
                "https://id.example/.well-known/openid-configuration/realms/edge"
            ]
        );
    }
}
