//! herald's OAuth 2.1 client: how an HTTP connection to an MCP server that asks for
//! authorization gets its access token, keeps it fresh, and asks for more when the server
//! says a request needs more scope.
//!
//! One [`OAuth`] per server (its URL, the resource). The HTTP wire ([`wire::McpHttp`]) takes
//! its token for every request and hands it every `401` and `403 insufficient_scope`
//! ([`OAuth::challenged`]); the request is then sent once more. What a challenge leads to:
//!
//! 1. A token the server refused (`401`), from the authorization server the server still
//!    names, with a refresh token: a refresh, with the client the tokens were issued to. A
//!    refresh the server refuses drops the tokens; one that could not be asked (the network, a
//!    5xx) keeps them for the next try.
//! 2. Otherwise an authorization, from discovery on ([`discover`]): the server's resource
//!    metadata, its first authorization server's metadata, then a client for that server
//!    (one registered by configuration, a Client ID Metadata Document URL when the server
//!    takes them, or a registration), kept per issuer: a client is never shown to another
//!    server. Scopes: the challenge's (with those asked before: a step-up keeps what it had),
//!    else every scope the resource lists, else none; `offline_access` too when the
//!    authorization server lists it (for a refresh token). Then the client credentials grant
//!    (`client_credentials`), or the authorization code with PKCE through a [`Consent`].
//! 3. A `403` is a step-up only with `error="insufficient_scope"`, and only for a scope the
//!    token was not asked with (a server that refuses the scope it granted is not asked
//!    again); at most [`MAX_AUTHORIZATIONS`] authorizations in a row until a request gets
//!    through. A client secret goes only to the issuer configured for it (`issuer`).
//!
//! One lock orders the session: a challenge is answered by one authorization, and the
//! requests that wait for it then take its token (or, for a step-up, ask for what they still
//! lack). A request with no token to send takes no lock. A refresh runs to its end on a task
//! of its own, holding that lock, even when the request that asked is dropped (the server has
//! retired the old refresh token by the time it answers); and before asking it takes the
//! keep's tokens when another session's refresh is kept there since, so this one does not
//! send the refresh token that one retired. (Two sessions on one server due at the same
//! moment may still both ask: nothing locks across sessions.)
//!
//! Tokens and registrations are kept ([`keep`]) sealed in the store, per server, so a login
//! (`herald login`) serves every later command and a gateway's slug across restarts. A
//! session without a consent (a gateway, `herald call`) cannot ask a person: its error says
//! to run `herald login`.

pub mod consent;
pub mod discover;
pub mod flow;
pub mod keep;
pub mod wire;

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};

use crate::sync::RecoverRw;
use consent::Consent;
use discover::Challenge;
use flow::{Ask, Registered, Tokens};
use keep::{Keep, Kept};

/// Authorizations in a row, with no request getting through, before herald gives up.
pub const MAX_AUTHORIZATIONS: u32 = 3;

/// How herald's client is known to authorization servers, from flags or a slug's config.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct OAuthSettings {
    /// A client registered beforehand.
    pub client_id: Option<String>,
    /// Its secret (never in `Debug`).
    pub client_secret: Option<String>,
    /// The only authorization server (issuer) to authorize with: a configured client secret
    /// is sent to no other, whatever the resource's metadata names.
    pub issuer: Option<String>,
    /// The URL of a Client ID Metadata Document naming herald's client, for servers that
    /// take one in place of a registration.
    pub client_metadata_url: Option<String>,
    /// The client credentials grant (machine to machine): no person, no browser.
    pub client_credentials: bool,
    /// Scopes asked for beside what the server's challenge and metadata name.
    pub scope: Option<String>,
}

impl std::fmt::Debug for OAuthSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OAuthSettings")
            .field("client_id", &self.client_id)
            .field(
                "client_secret",
                &self.client_secret.as_ref().map(|_| "<redacted>"),
            )
            .field("issuer", &self.issuer)
            .field("client_metadata_url", &self.client_metadata_url)
            .field("client_credentials", &self.client_credentials)
            .field("scope", &self.scope)
            .finish()
    }
}

/// The OAuth state of one server: its current token, and how to get the next.
pub struct OAuth {
    server: String,
    settings: OAuthSettings,
    http: reqwest::Client,
    consent: Option<Arc<dyn Consent>>,
    keep: OnceLock<Arc<dyn Keep>>,
    /// The token requests carry, and when to refresh it (unix s); read on every request.
    current: RwLock<Option<(Arc<str>, Option<u64>)>>,
    state: Arc<tokio::sync::Mutex<State>>,
    attempts: AtomicU32,
    /// Authorizations made (code or client credentials), for `herald login`'s report.
    authorized: AtomicU32,
    /// Whether the keep was read (set under `state`'s lock).
    loaded: AtomicBool,
    /// No refresh is tried before this (unix s): one could not be asked lately.
    pause_until: AtomicU64,
    /// When the last authorization was made (unix s).
    last_attempt: AtomicU64,
}

/// The session's state, locked (owned, so a refresh can carry it to its end: see
/// [`OAuth::refreshed`]).
type Held = tokio::sync::OwnedMutexGuard<State>;

#[derive(Default)]
struct State {
    tokens: Option<Tokens>,
    /// Registrations, per issuer.
    clients: HashMap<String, Registered>,
    /// The scopes the current token was asked with.
    asked: BTreeSet<String>,
}

impl std::fmt::Debug for OAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OAuth")
            .field("server", &self.server)
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// Two are the same when they would authorize the same way (a reload keeps the slug then).
impl PartialEq for OAuth {
    fn eq(&self, other: &OAuth) -> bool {
        self.server == other.server && self.settings == other.settings
    }
}

fn words(s: Option<&str>) -> BTreeSet<String> {
    s.into_iter()
        .flat_map(str::split_whitespace)
        .map(str::to_owned)
        .collect()
}

/// Whether `t` is due for a refresh (and can have one).
fn due(t: &Tokens, now: u64) -> bool {
    t.refresh.is_some() && t.refresh_at.or(t.expires_at).is_some_and(|a| a <= now)
}

/// How long a refresh that could not be asked holds off the next try, meanwhile the token
/// held is sent while it has not expired.
const REFRESH_PAUSE_S: u64 = 10;

/// How long after its last authorization a session's count of them starts again.
const ATTEMPTS_FORGOTTEN_S: u64 = 60;

impl OAuth {
    /// The session for the server at `server`. Without `consent` it cannot ask a person.
    pub fn new(
        server: &str,
        settings: OAuthSettings,
        consent: Option<Arc<dyn Consent>>,
    ) -> Result<Arc<OAuth>, String> {
        let http = crate::transport::web::http_client(|b| {
            b.redirect(reqwest::redirect::Policy::none())
                .timeout(std::time::Duration::from_secs(30))
        })
        .map_err(|e| e.to_string())?;
        Ok(Arc::new(OAuth {
            server: server.to_owned(),
            settings,
            http,
            consent,
            keep: OnceLock::new(),
            current: RwLock::new(None),
            state: Arc::default(),
            attempts: AtomicU32::new(0),
            authorized: AtomicU32::new(0),
            loaded: AtomicBool::new(false),
            pause_until: AtomicU64::new(0),
            last_attempt: AtomicU64::new(0),
        }))
    }

    /// Where its tokens are kept (set once; later calls are ignored).
    pub fn keep_in(&self, keep: Arc<dyn Keep>) {
        let _ = self.keep.set(keep);
    }

    pub fn server(&self) -> &str {
        &self.server
    }

    /// How many authorizations this session made.
    pub fn authorizations(&self) -> u32 {
        self.authorized.load(Ordering::Relaxed)
    }

    /// The token for the next request: the kept one on first use (from an eager keep; a lazy
    /// one is read at the server's first challenge), refreshed when it nears expiry. `None`
    /// before any authorization: the request goes without, and a server that wants one says
    /// so.
    pub async fn bearer(self: &Arc<Self>) -> Option<Arc<str>> {
        let now = flow::now_unix();
        let held = match &*self.current.read_locked() {
            Some((t, at)) if at.is_none_or(|a| a > now) => return Some(t.clone()),
            held => held.is_some(),
        };
        let unread =
            !self.loaded.load(Ordering::Acquire) && self.keep.get().is_some_and(|k| k.eager());
        if !held && !unread {
            return None;
        }
        let mut st = self.lock().await;
        self.load(&mut st).await;
        let stale = st.tokens.as_ref().is_some_and(|t| due(t, now));
        let paused = now < self.pause_until.load(Ordering::Relaxed);
        if stale && !paused {
            let (_, r) = self.refreshed(st).await;
            if let Err(e) = r {
                tracing::info!(server = %self.server, error = %e, "refreshing the access token failed");
            }
        }
        self.current.read_locked().as_ref().map(|(t, _)| t.clone())
    }

    /// The one way a request carries the session's token (the connection's wire and the
    /// direct calls alike): `send` with it (or `fallback`, a static token, before there is
    /// one); when `refusal` finds a challenge in the answer (`(forbidden, WWW-Authenticate)`),
    /// the session answers it and `send` goes once more with the new token. An answer that is
    /// not a refusal starts the count of authorizations in a row again. `Err`: the session's
    /// reason it has no token to send.
    pub async fn send<R, F, Fut>(
        self: &Arc<Self>,
        fallback: Option<String>,
        send: F,
        refusal: impl Fn(&R) -> Option<(bool, String)>,
    ) -> Result<R, String>
    where
        F: Fn(Option<String>) -> Fut,
        Fut: Future<Output = R>,
    {
        let token = self.bearer().await.map(|t| t.to_string()).or(fallback);
        let first = send(token.clone()).await;
        let Some((forbidden, header)) = refusal(&first) else {
            self.attempts.store(0, Ordering::Relaxed);
            return Ok(first);
        };
        if !self
            .challenged(forbidden, &header, token.as_deref())
            .await?
        {
            return Ok(first);
        }
        let again = send(self.bearer().await.map(|t| t.to_string())).await;
        if refusal(&again).is_none() {
            self.attempts.store(0, Ordering::Relaxed);
        }
        Ok(again)
    }

    /// The server refused the token `sent` (`forbidden`: a `403`, else a `401`) with `header`
    /// (its `WWW-Authenticate`). `Ok(true)` when there is a new token to send; `Ok(false)`
    /// when the server takes no OAuth (a `401` naming no metadata, and none where it would
    /// be): its refusal stands as it is (a static token it wants).
    pub async fn challenged(
        self: &Arc<Self>,
        forbidden: bool,
        header: &str,
        sent: Option<&str>,
    ) -> Result<bool, String> {
        let ch = Challenge::parse(header);
        if forbidden && ch.error.as_deref() != Some("insufficient_scope") {
            return Err(format!(
                "{} refused the request (HTTP 403{})",
                self.server,
                describe(&ch)
            ));
        }
        let wanted = words(ch.scope.as_deref());
        let mut st = self.lock().await;
        self.load(&mut st).await;
        let covered = wanted.is_subset(&st.asked);
        let other = st
            .tokens
            .as_ref()
            .is_some_and(|t| Some(t.access.as_str()) != sent);
        if other && (!forbidden || covered) {
            // A token the request did not carry (kept, or another request's challenge
            // brought it) should do, refreshed first when it is due.
            let is_due = st.tokens.as_ref().is_some_and(|t| due(t, flow::now_unix()));
            if !is_due {
                return Ok(true);
            }
            let (held, refreshed) = self.refreshed(st).await;
            st = held;
            match refreshed {
                Ok(()) => return Ok(true),
                // Not asked (the network): the token held is sent as it is.
                Err(_) if st.tokens.is_some() => return Ok(true),
                // Refused: authorize afresh.
                Err(e) => tracing::info!(server = %self.server, error = %e, "refresh refused"),
            }
        }
        let now = st.tokens.as_ref().map(|t| t.access.as_str());
        if forbidden && now.is_some() && covered && !wanted.is_empty() {
            return Err(format!(
                "{} refuses the token though it was granted the scope asked for{}; not asking again",
                self.server,
                describe(&ch)
            ));
        }
        let since = flow::now_unix().saturating_sub(self.last_attempt.load(Ordering::Relaxed));
        if since > ATTEMPTS_FORGOTTEN_S {
            self.attempts.store(0, Ordering::Relaxed);
        }
        if self.attempts.load(Ordering::Relaxed) >= MAX_AUTHORIZATIONS {
            return Err(format!(
                "{} refused {MAX_AUTHORIZATIONS} fresh authorizations in a row{}; giving up",
                self.server,
                describe(&ch)
            ));
        }
        let Some(prm) =
            discover::resource(&self.http, &self.server, ch.resource_metadata.as_deref()).await?
        else {
            return Ok(false);
        };
        let issuer = prm.authorization_servers[0].clone();
        if let Some(pinned) = &self.settings.issuer
            && *pinned != issuer
        {
            return Err(format!(
                "{} names the authorization server {issuer}, not the configured issuer {pinned}; \
                 refusing to authorize there",
                self.server
            ));
        }
        let same_issuer = st.tokens.as_ref().is_some_and(|t| t.issuer == issuer);
        if !forbidden && same_issuer && st.tokens.as_ref().is_some_and(|t| t.refresh.is_some()) {
            let (held, refreshed) = self.refreshed(st).await;
            st = held;
            match refreshed {
                Ok(()) => return Ok(true),
                Err(e) => {
                    tracing::info!(server = %self.server, error = %e, "refresh failed; authorizing again")
                }
            }
        }
        let meta = discover::authorization_server(&self.http, &issuer).await?;
        // What to ask for: the challenge's scope with what was asked before (a step-up keeps
        // what it had), else every scope the resource lists; the configured ones; and
        // offline_access where the server offers it, for a refresh token.
        let mut scopes = if ch.scope.is_some() {
            wanted.union(&st.asked).cloned().collect()
        } else {
            prm.scopes_supported
                .iter()
                .flatten()
                .cloned()
                .collect::<BTreeSet<_>>()
        };
        scopes.extend(words(self.settings.scope.as_deref()));
        let offline = meta
            .scopes_supported
            .iter()
            .flatten()
            .any(|s| s == "offline_access");
        if offline && !self.settings.client_credentials {
            scopes.insert("offline_access".into());
        }
        let scope =
            (!scopes.is_empty()).then(|| scopes.iter().cloned().collect::<Vec<_>>().join(" "));
        let tokens = if self.settings.client_credentials {
            let client = self.configured_client(&meta).ok_or_else(|| {
                "the client credentials grant needs a client id and secret".to_owned()
            })?;
            let ask = Ask {
                meta: &meta,
                client: &client,
                resource: &prm.resource,
                scope: scope.as_deref(),
            };
            flow::client_credentials(&self.http, &ask)
                .await
                .map_err(|e| e.message)?
        } else {
            let Some(consent) = &self.consent else {
                return Err(format!(
                    "{} needs an OAuth login (authorization server {issuer}{}): run `herald login --mcp-http {}` on this host, with the same --store",
                    self.server,
                    describe(&ch),
                    self.server
                ));
            };
            let loopback = consent::Loopback::bind().await?;
            let client = self
                .client_for(&mut st, &meta, &loopback.redirect_uri())
                .await?;
            let ask = Ask {
                meta: &meta,
                client: &client,
                resource: &prm.resource,
                scope: scope.as_deref(),
            };
            flow::authorize(&self.http, &ask, &loopback, consent.as_ref())
                .await
                .map_err(|e| e.message)?
        };
        self.attempts.fetch_add(1, Ordering::Relaxed);
        self.last_attempt.store(flow::now_unix(), Ordering::Relaxed);
        self.authorized.fetch_add(1, Ordering::Relaxed);
        st.asked = scopes;
        self.set_tokens(&mut st, Some(tokens)).await;
        Ok(true)
    }

    /// The configured client, when there is one.
    fn configured_client(&self, meta: &discover::ServerMetadata) -> Option<Registered> {
        let id = self.settings.client_id.clone()?;
        let secret = self.settings.client_secret.clone();
        let method = flow::method_for(meta, secret.is_some());
        Some(Registered {
            id,
            secret,
            method,
            redirect_uri: None,
        })
    }

    /// The client to authorize with at `meta`'s server for `redirect_uri`: configured, kept
    /// for that issuer (a registration for another redirect URI is made again: servers may
    /// match it exactly), a metadata document's URL, or a new registration (kept at once).
    async fn client_for(
        &self,
        st: &mut State,
        meta: &discover::ServerMetadata,
        redirect_uri: &str,
    ) -> Result<Registered, String> {
        if let Some(c) = self.configured_client(meta) {
            return Ok(c);
        }
        if let Some(c) = st.clients.get(&meta.issuer)
            && c.redirect_uri.as_deref().is_none_or(|r| r == redirect_uri)
        {
            return Ok(c.clone());
        }
        if let (Some(url), Some(true)) = (
            &self.settings.client_metadata_url,
            meta.client_id_metadata_document_supported,
        ) {
            return Ok(Registered {
                id: url.clone(),
                secret: None,
                method: "none".into(),
                redirect_uri: None,
            });
        }
        let Some(endpoint) = &meta.registration_endpoint else {
            return Err(format!(
                "the authorization server {} takes neither registrations nor client metadata documents: \
                 register herald there and pass its client id (--oauth-client-id, or client_id in [slug.oauth])",
                meta.issuer
            ));
        };
        let c = flow::register(&self.http, meta, endpoint, redirect_uri).await?;
        st.clients.insert(meta.issuer.clone(), c.clone());
        self.save(st).await;
        Ok(c)
    }

    /// The session's state, locked.
    async fn lock(&self) -> Held {
        self.state.clone().lock_owned().await
    }

    /// [`refresh`](Self::refresh), carried to its end on a task of its own with the lock
    /// held: a request dropped while its refresh is out (a cancelled call, a client gone)
    /// would otherwise lose the answer, and with it a rotated refresh token the server has
    /// already retired the old one for. The lock comes back with the outcome.
    async fn refreshed(self: &Arc<Self>, mut st: Held) -> (Held, Result<(), String>) {
        let this = self.clone();
        let task = tokio::spawn(async move {
            let r = this.refresh(&mut st).await;
            (st, r)
        });
        match task.await {
            Ok(done) => done,
            Err(e) => (
                self.lock().await,
                Err(format!("the token refresh did not finish: {e}")),
            ),
        }
    }

    /// Refreshes the kept token at its token endpoint, with the client it was issued to.
    /// A refusal drops the tokens; a failure to ask keeps them.
    async fn refresh(&self, st: &mut State) -> Result<(), String> {
        let t = st.tokens.clone().ok_or("no token to refresh")?;
        let rt = t.refresh.clone().ok_or("no refresh token")?;
        // Another session on this server (in this process or another on the store) may have
        // refreshed since this one read the keep: its tokens are taken, and the refresh token
        // it retired is not sent again (a server that rotates them may take a reuse as theft).
        if let Some(newer) = self.kept_newer(&rt).await
            && !due(&newer, flow::now_unix())
        {
            self.adopt(st, newer);
            return Ok(());
        }
        let meta = discover::ServerMetadata {
            issuer: t.issuer.clone(),
            token_endpoint: t.token_endpoint.clone(),
            ..Default::default()
        };
        let ask = Ask {
            meta: &meta,
            client: &t.client,
            resource: &t.resource,
            scope: None,
        };
        match flow::refresh(&self.http, &ask, &rt).await {
            Ok(mut fresh) => {
                fresh.scope = fresh.scope.or(t.scope);
                self.set_tokens(st, Some(fresh)).await;
                Ok(())
            }
            Err(e) if e.refused => {
                // Another process may have refreshed (or logged in) meanwhile: its tokens are
                // taken rather than dropped.
                if let Some(newer) = self.kept_newer(&rt).await {
                    self.adopt(st, newer);
                    return Ok(());
                }
                self.set_tokens(st, None).await;
                Err(e.message)
            }
            Err(e) => {
                self.pause_until
                    .store(flow::now_unix() + REFRESH_PAUSE_S, Ordering::Relaxed);
                Err(e.message)
            }
        }
    }

    /// The tokens kept now when they are another session's since (not the ones refresh
    /// token `rt` belongs to), still good for a while, and refreshable as these are: never an
    /// expired token, nor one without a refresh token in place of one with.
    async fn kept_newer(&self, rt: &str) -> Option<Tokens> {
        let kept = self.keep.get()?.load(&self.server).await.ok()??;
        let now = flow::now_unix();
        kept.tokens.filter(|n| {
            n.refresh.is_some()
                && n.refresh.as_deref() != Some(rt)
                && n.expires_at.is_none_or(|e| e > now + REFRESH_PAUSE_S)
        })
    }

    /// Takes what the keep holds, once.
    async fn load(&self, st: &mut State) {
        if self.loaded.load(Ordering::Acquire) {
            return;
        }
        let Some(keep) = self.keep.get() else {
            self.loaded.store(true, Ordering::Release);
            return;
        };
        let read = keep.load(&self.server).await;
        // (One that failed is read again next time: the store may be free then.)
        self.loaded.store(read.is_ok(), Ordering::Release);
        match read {
            Ok(Some(k)) => {
                st.clients = k.clients;
                if let Some(t) = k.tokens {
                    self.adopt(st, t);
                }
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(server = %self.server, error = %e, "cannot read the kept OAuth tokens")
            }
        }
    }

    /// Takes kept tokens (read, not made here): the scopes they were asked with too.
    fn adopt(&self, st: &mut State, t: Tokens) {
        st.asked = words(t.scope.as_deref());
        self.hold(st, Some(t));
    }

    /// `tokens` become the ones requests carry.
    fn hold(&self, st: &mut State, tokens: Option<Tokens>) {
        *self.current.write_locked() = tokens
            .as_ref()
            .map(|t| (t.access.as_str().into(), t.refresh_at.or(t.expires_at)));
        st.tokens = tokens;
    }

    /// [`hold`](Self::hold), and kept.
    async fn set_tokens(&self, st: &mut State, tokens: Option<Tokens>) {
        self.hold(st, tokens);
        self.save(st).await;
    }

    async fn save(&self, st: &State) {
        if let Some(keep) = self.keep.get() {
            let kept = Kept {
                tokens: st.tokens.clone(),
                clients: st.clients.clone(),
            };
            if let Err(e) = keep.save(&self.server, &kept).await {
                tracing::warn!(server = %self.server, error = %e, "cannot keep the OAuth tokens");
            }
        }
    }

    /// What it holds, for `herald login`'s report: the issuer, the scope, when the access
    /// token expires (unix s) and whether it can be refreshed; `None` before any
    /// authorization.
    pub async fn held(&self) -> Option<(String, Option<String>, Option<u64>, bool)> {
        let mut st = self.lock().await;
        self.load(&mut st).await;
        st.tokens.as_ref().map(|t| {
            (
                t.issuer.clone(),
                t.scope.clone(),
                t.expires_at,
                t.refresh.is_some(),
            )
        })
    }
}

/// ` (error: description; scope "s")` from a challenge, when it says.
fn describe(ch: &Challenge) -> String {
    let mut parts = Vec::new();
    match (&ch.error, &ch.error_description) {
        (Some(e), Some(d)) => parts.push(format!("{e}: {d}")),
        (Some(e), None) => parts.push(e.clone()),
        _ => {}
    }
    if let Some(s) = &ch.scope {
        parts.push(format!("it asks for scope \"{s}\""));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!(": {}", parts.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_due_at_its_refresh_time_and_only_with_a_refresh_token() {
        let t = |refresh: Option<&str>, refresh_at, expires_at| Tokens {
            access: "a".into(),
            refresh: refresh.map(str::to_owned),
            expires_at,
            refresh_at,
            scope: None,
            issuer: "i".into(),
            token_endpoint: "e".into(),
            resource: "r".into(),
            client: Registered {
                id: "c".into(),
                secret: None,
                method: "none".into(),
                redirect_uri: None,
            },
        };
        assert!(!due(&t(Some("r"), Some(100), Some(130)), 99));
        assert!(due(&t(Some("r"), Some(100), Some(130)), 100));
        assert!(!due(&t(None, Some(100), Some(130)), 200));
        assert!(due(&t(Some("r"), None, Some(130)), 130));
        assert!(!due(&t(Some("r"), None, None), u64::MAX));
    }
}
