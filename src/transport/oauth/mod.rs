//! herald's OAuth 2.1 client: how an HTTP connection to an MCP server that asks for
//! authorization gets its access token, keeps it fresh, and asks for more when the server
//! says a request needs more scope.
//!
//! One [`OAuth`] per server (its URL, the resource). The HTTP wire ([`wire::McpHttp`]) takes
//! its token for every request and hands it every `401` and `403 insufficient_scope`
//! ([`OAuth::challenged`]); the request is then sent once more. What a challenge leads to:
//!
//! 1. A token the server refused, from the authorization server the server still names,
//!    with a refresh token: a refresh.
//! 2. Otherwise an authorization, from discovery on ([`discover`]): the server's resource
//!    metadata, its first authorization server's metadata, then a client for that server
//!    (one registered by configuration, a Client ID Metadata Document URL when the server
//!    takes them, or a registration), kept per issuer: a client is never shown to another
//!    server. Scopes: the challenge's (with those asked before: a step-up keeps what it had),
//!    else every scope the resource lists, else none; `offline_access` too when the
//!    authorization server lists it (for a refresh token). Then the client credentials grant
//!    (`client_credentials`), or the authorization code with PKCE through a [`Consent`].
//! 3. At most [`MAX_AUTHORIZATIONS`] authorizations until a request gets through: a server
//!    that refuses every token is not asked forever.
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
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock, RwLock};

use crate::sync::RecoverRw;
use crate::transport::tls::Secret;
use consent::Consent;
use discover::Challenge;
use flow::{Ask, Registered, Tokens};
use keep::{Keep, Kept};

/// Authorizations in a row, with no request getting through, before herald gives up.
pub const MAX_AUTHORIZATIONS: u32 = 3;

/// How herald's client is known to authorization servers, from flags or a slug's config.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OAuthSettings {
    /// A client registered beforehand (used with every authorization server).
    pub client_id: Option<String>,
    pub client_secret: Option<Secret>,
    /// The URL of a Client ID Metadata Document naming herald's client, for servers that
    /// take one in place of a registration.
    pub client_metadata_url: Option<String>,
    /// The client credentials grant (machine to machine): no person, no browser.
    pub client_credentials: bool,
    /// Scopes asked for beside what the server's challenge and metadata name.
    pub scope: Option<String>,
}

/// The OAuth state of one server: its current token, and how to get the next.
pub struct OAuth {
    server: String,
    settings: OAuthSettings,
    http: reqwest::Client,
    consent: Option<Arc<dyn Consent>>,
    keep: OnceLock<Arc<dyn Keep>>,
    /// The token requests carry, and when it expires (unix s); read on every request.
    current: RwLock<Option<(Arc<str>, Option<u64>)>>,
    state: tokio::sync::Mutex<State>,
    attempts: AtomicU32,
}

#[derive(Default)]
struct State {
    loaded: bool,
    tokens: Option<Tokens>,
    clients: HashMap<String, Registered>,
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

impl OAuth {
    /// The session for the server at `server`. Without `consent` it cannot ask a person.
    pub fn new(
        server: &str,
        settings: OAuthSettings,
        consent: Option<Arc<dyn Consent>>,
    ) -> Result<Arc<OAuth>, String> {
        let http = crate::transport::client::http_client(|b| {
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
            state: tokio::sync::Mutex::new(State::default()),
            attempts: AtomicU32::new(0),
        }))
    }

    /// Where its tokens are kept (set once; later calls are ignored).
    pub fn keep_in(&self, keep: Arc<dyn Keep>) {
        let _ = self.keep.set(keep);
    }

    pub fn server(&self) -> &str {
        &self.server
    }

    /// The token for the next request: the kept one on first use, refreshed when it is
    /// about to expire. `None` before any authorization.
    pub async fn bearer(&self) -> Option<Arc<str>> {
        let now = flow::now_unix();
        if let Some((t, exp)) = &*self.current.read_locked()
            && exp.is_none_or(|e| e > now + 30)
        {
            return Some(t.clone());
        }
        let mut st = self.state.lock().await;
        self.load(&mut st).await;
        let stale = st
            .tokens
            .as_ref()
            .is_some_and(|t| t.expires_at.is_some_and(|e| e <= now + 30) && t.refresh.is_some());
        if stale && let Err(e) = self.refresh(&mut st).await {
            tracing::info!(server = %self.server, error = %e, "refreshing the access token failed");
        }
        self.current.read_locked().as_ref().map(|(t, _)| t.clone())
    }

    /// A request got through: the count of authorizations in a row starts again.
    pub fn succeeded(&self) {
        self.attempts.store(0, Ordering::Relaxed);
    }

    /// The server refused the token `sent` (`forbidden`: 403 `insufficient_scope`, else
    /// 401) with `header` (its `WWW-Authenticate`). `Ok` when there is a new token to send.
    pub async fn challenged(
        &self,
        forbidden: bool,
        header: &str,
        sent: Option<&str>,
    ) -> Result<(), String> {
        let mut st = self.state.lock().await;
        self.load(&mut st).await;
        let now = st.tokens.as_ref().map(|t| t.access.as_str());
        if now.is_some() && now != sent {
            // Another request's challenge already brought a new token.
            return Ok(());
        }
        let ch = Challenge::parse(header);
        if self.attempts.load(Ordering::Relaxed) >= MAX_AUTHORIZATIONS {
            return Err(format!(
                "{} refused {MAX_AUTHORIZATIONS} fresh authorizations in a row{}; giving up",
                self.server,
                describe(&ch)
            ));
        }
        let prm =
            discover::resource(&self.http, &self.server, ch.resource_metadata.as_deref()).await?;
        let issuer = prm.authorization_servers[0].clone();
        let same_issuer = st.tokens.as_ref().is_some_and(|t| t.issuer == issuer);
        if !forbidden && same_issuer && self.refresh(&mut st).await.is_ok() {
            return Ok(());
        }
        let meta = discover::authorization_server(&self.http, &issuer).await?;
        // What to ask for.
        let mut scopes: BTreeSet<String> = BTreeSet::new();
        match &ch.scope {
            Some(s) => {
                scopes.extend(s.split_whitespace().map(str::to_owned));
                scopes.extend(st.asked.iter().cloned());
            }
            None => scopes.extend(prm.scopes_supported.iter().flatten().cloned()),
        }
        scopes.extend(
            self.settings
                .scope
                .iter()
                .flat_map(|s| s.split_whitespace().map(str::to_owned)),
        );
        let offline = meta
            .scopes_supported
            .as_ref()
            .is_some_and(|s| s.iter().any(|s| s == "offline_access"));
        if offline && !self.settings.client_credentials {
            scopes.insert("offline_access".into());
        }
        let scope =
            (!scopes.is_empty()).then(|| scopes.iter().cloned().collect::<Vec<_>>().join(" "));
        self.attempts.fetch_add(1, Ordering::Relaxed);
        let tokens = if self.settings.client_credentials {
            let client = self.configured_client(&meta).ok_or_else(|| {
                "the client credentials grant needs a client id and secret (oauth_client_id, oauth_client_secret_*)".to_owned()
            })?;
            let ask = Ask {
                meta: &meta,
                client: &client,
                resource: &prm.resource,
                scope: scope.as_deref(),
            };
            flow::client_credentials(&self.http, &ask).await?
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
            flow::authorize(&self.http, &ask, &loopback, consent.as_ref()).await?
        };
        st.asked = scopes;
        self.set_tokens(&mut st, Some(tokens)).await;
        Ok(())
    }

    /// The configured client, when there is one.
    fn configured_client(&self, meta: &discover::ServerMetadata) -> Option<Registered> {
        let id = self.settings.client_id.clone()?;
        let secret = self.settings.client_secret.as_ref().map(|s| s.0.clone());
        let method = flow::method_for(meta, secret.is_some());
        Some(Registered { id, secret, method })
    }

    /// The client to authorize with at `meta`'s server: configured, kept for that issuer,
    /// a metadata document's URL, or a new registration.
    async fn client_for(
        &self,
        st: &mut State,
        meta: &discover::ServerMetadata,
        redirect_uri: &str,
    ) -> Result<Registered, String> {
        if let Some(c) = self.configured_client(meta) {
            return Ok(c);
        }
        if let Some(c) = st.clients.get(&meta.issuer) {
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
            });
        }
        let Some(endpoint) = &meta.registration_endpoint else {
            return Err(format!(
                "the authorization server {} takes neither registrations nor client metadata documents: \
                 register herald there and pass its client id (--oauth-client-id, or oauth_client_id in a slug)",
                meta.issuer
            ));
        };
        let c = flow::register(&self.http, meta, endpoint, redirect_uri).await?;
        st.clients.insert(meta.issuer.clone(), c.clone());
        Ok(c)
    }

    /// Refreshes the kept token at the server that issued it.
    async fn refresh(&self, st: &mut State) -> Result<(), String> {
        let t = st.tokens.clone().ok_or("no token to refresh")?;
        let rt = t.refresh.clone().ok_or("no refresh token")?;
        let meta = discover::authorization_server(&self.http, &t.issuer).await?;
        let client = match self.configured_client(&meta) {
            Some(c) => c,
            None => st
                .clients
                .get(&t.issuer)
                .cloned()
                .ok_or("no client for the issuer")?,
        };
        let ask = Ask {
            meta: &meta,
            client: &client,
            resource: &t.resource,
            scope: None,
        };
        match flow::refresh(&self.http, &ask, &rt).await {
            Ok(mut fresh) => {
                fresh.scope = fresh.scope.or(t.scope);
                self.set_tokens(st, Some(fresh)).await;
                Ok(())
            }
            Err(e) => {
                self.set_tokens(st, None).await;
                Err(e)
            }
        }
    }

    /// Takes what the keep holds, once.
    async fn load(&self, st: &mut State) {
        if st.loaded {
            return;
        }
        st.loaded = true;
        let Some(keep) = self.keep.get() else { return };
        match keep.load(&self.server).await {
            Ok(Some(k)) => {
                st.clients = k.clients;
                if let Some(t) = k.tokens {
                    st.asked = t
                        .scope
                        .iter()
                        .flat_map(|s| s.split_whitespace().map(str::to_owned))
                        .collect();
                    *self.current.write_locked() = Some((t.access.as_str().into(), t.expires_at));
                    st.tokens = Some(t);
                }
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(server = %self.server, error = %e, "cannot read the kept OAuth tokens")
            }
        }
    }

    async fn set_tokens(&self, st: &mut State, tokens: Option<Tokens>) {
        *self.current.write_locked() = tokens
            .as_ref()
            .map(|t| (t.access.as_str().into(), t.expires_at));
        st.tokens = tokens;
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

    /// What it holds, for `herald login`'s report: the issuer, the scope, and when the access
    /// token expires (unix s), or `None` before any authorization.
    pub async fn held(&self) -> Option<(String, Option<String>, Option<u64>, bool)> {
        let mut st = self.state.lock().await;
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

/// ` (error: description)` from a challenge, when it says.
fn describe(ch: &Challenge) -> String {
    match (&ch.error, &ch.error_description) {
        (Some(e), Some(d)) => format!(" ({e}: {d})"),
        (Some(e), None) => format!(" ({e})"),
        _ => String::new(),
    }
}
