//! The requests to an authorization server: registration (RFC 7591, `application_type`
//! native), the authorization code with PKCE S256 and its exchange, refresh, and client
//! credentials; each token request names the resource (RFC 8707) and authenticates the client
//! the way the server takes (`client_secret_basic`, `client_secret_post`, or `none`). Every
//! answer is read up to [`MAX_ANSWER_BYTES`](super::discover::MAX_ANSWER_BYTES).

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use super::consent::{Consent, Loopback};
use super::discover::{ServerMetadata, json_body, why};

/// A client known to one authorization server.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registered {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    /// `client_secret_basic`, `client_secret_post` or `none`.
    pub method: String,
    /// The redirect URI a registration was made for (a loopback port of one login).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redirect_uri: Option<String>,
}

impl std::fmt::Debug for Registered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registered")
            .field("id", &self.id)
            .field("method", &self.method)
            .finish_non_exhaustive()
    }
}

/// Tokens from one authorization server for one resource, and the client they were issued
/// to (the one that refreshes them).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tokens {
    pub access: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh: Option<String>,
    /// Unix seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<u64>,
    /// When to refresh it (unix s), fixed when it was issued: 30 s before it expires, or
    /// halfway through a shorter life.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh_at: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    pub issuer: String,
    pub token_endpoint: String,
    pub resource: String,
    pub client: Registered,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens")
            .field("issuer", &self.issuer)
            .field("scope", &self.scope)
            .field("expires_at", &self.expires_at)
            .finish_non_exhaustive()
    }
}

/// A token request that failed: `refused` when the server answered with an OAuth error (the
/// grant or the client is no good); otherwise it could not be asked (the network, a 5xx),
/// and another try later may do.
#[derive(Debug)]
pub struct TokenError {
    pub refused: bool,
    pub message: String,
}

impl From<String> for TokenError {
    fn from(message: String) -> TokenError {
        TokenError {
            refused: false,
            message,
        }
    }
}

pub fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn random_b64(bytes: usize) -> String {
    use ring::rand::SecureRandom;
    let mut buf = vec![0u8; bytes];
    ring::rand::SystemRandom::new()
        .fill(&mut buf)
        .expect("the system's random source works");
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(buf)
}

/// The methods `meta`'s server lists (`client_secret_basic` when it lists none, as RFC 8414
/// says that means).
fn methods(meta: &ServerMetadata) -> Vec<String> {
    meta.token_endpoint_auth_methods_supported
        .clone()
        .unwrap_or_else(|| vec!["client_secret_basic".into()])
}

/// How a client with (or without) a secret authenticates at `meta`'s server: the server's
/// first choice of those herald speaks.
pub fn method_for(meta: &ServerMetadata, has_secret: bool) -> String {
    if !has_secret {
        return "none".into();
    }
    let listed = methods(meta);
    ["client_secret_basic", "client_secret_post"]
        .into_iter()
        .find(|m| listed.iter().any(|l| l == m))
        .unwrap_or("client_secret_basic")
        .into()
}

/// Registers herald with `meta`'s server for `redirect_uri` (RFC 7591).
pub async fn register(
    http: &reqwest::Client,
    meta: &ServerMetadata,
    endpoint: &str,
    redirect_uri: &str,
) -> Result<Registered, String> {
    let listed = methods(meta);
    let asked = ["none", "client_secret_basic", "client_secret_post"]
        .into_iter()
        .find(|m| listed.iter().any(|l| l == m))
        .unwrap_or("client_secret_basic");
    let body = serde_json::json!({
        "client_name": "herald",
        "redirect_uris": [redirect_uri],
        "grant_types": ["authorization_code", "refresh_token"],
        "response_types": ["code"],
        "token_endpoint_auth_method": asked,
        "application_type": "native",
    });
    let resp = http
        .post(endpoint)
        .json(&body)
        .send()
        .await
        .map_err(|e| format!("registering with {}: {}", meta.issuer, why(&e)))?;
    let status = resp.status();
    let v = json_body(resp).await?;
    if !status.is_success() {
        return Err(format!(
            "the authorization server {} refused to register herald ({status}{})",
            meta.issuer,
            oauth_error(&v)
        ));
    }
    let id = v["client_id"]
        .as_str()
        .ok_or_else(|| format!("{}'s registration answer has no client_id", meta.issuer))?
        .to_owned();
    let secret = v["client_secret"].as_str().map(str::to_owned);
    let method = match v["token_endpoint_auth_method"].as_str() {
        Some(m) => m.to_owned(),
        None if secret.is_some() && asked == "none" => "client_secret_basic".into(),
        None if secret.is_some() => asked.into(),
        None => "none".into(),
    };
    Ok(Registered {
        id,
        secret,
        method,
        redirect_uri: Some(redirect_uri.to_owned()),
    })
}

/// `: error: description` from an OAuth error body, when there is one.
fn oauth_error(v: &serde_json::Value) -> String {
    match (v["error"].as_str(), v["error_description"].as_str()) {
        (Some(e), Some(d)) => format!(": {e}: {d}"),
        (Some(e), None) => format!(": {e}"),
        _ => String::new(),
    }
}

/// What one authorization asks for.
pub struct Ask<'a> {
    pub meta: &'a ServerMetadata,
    pub client: &'a Registered,
    pub resource: &'a str,
    pub scope: Option<&'a str>,
}

/// The authorization code flow: a loopback listener, the URL to `consent`, the redirect's
/// checks (state, RFC 9207 `iss`), then the code's exchange.
pub async fn authorize(
    http: &reqwest::Client,
    ask: &Ask<'_>,
    loopback: &Loopback,
    consent: &dyn Consent,
) -> Result<Tokens, TokenError> {
    let meta = ask.meta;
    let endpoint = meta.authorization_endpoint.as_deref().ok_or_else(|| {
        format!(
            "the authorization server {} has no authorization endpoint",
            meta.issuer
        )
    })?;
    if !meta
        .code_challenge_methods_supported
        .iter()
        .flatten()
        .any(|m| m == "S256")
    {
        return Err(format!(
            "the authorization server {} does not say it supports PKCE with S256; \
             herald does not authorize without it",
            meta.issuer
        )
        .into());
    }
    let verifier = random_b64(32);
    let challenge = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(ring::digest::digest(
        &ring::digest::SHA256,
        verifier.as_bytes(),
    ));
    let state = random_b64(16);
    let redirect_uri = loopback.redirect_uri();
    let mut url = reqwest::Url::parse(endpoint).map_err(|e| e.to_string())?;
    {
        let mut q = url.query_pairs_mut();
        q.append_pair("response_type", "code")
            .append_pair("client_id", &ask.client.id)
            .append_pair("redirect_uri", &redirect_uri)
            .append_pair("state", &state)
            .append_pair("code_challenge", &challenge)
            .append_pair("code_challenge_method", "S256")
            .append_pair("resource", ask.resource);
        if let Some(s) = ask.scope {
            q.append_pair("scope", s);
        }
    }
    // (A consent that fails ends the wait at once.)
    let (answer, ()) = tokio::try_join!(
        loopback.answer(&state, consent.patience()),
        consent.open(url.as_str())
    )?;
    if let Some(e) = &answer.error {
        let said = answer
            .error_description
            .as_deref()
            .map(|d| format!(" ({d})"));
        return Err(TokenError {
            refused: true,
            message: format!(
                "the authorization server refused: {e}{}",
                said.unwrap_or_default()
            ),
        });
    }
    match (
        &answer.iss,
        meta.authorization_response_iss_parameter_supported,
    ) {
        (Some(iss), _) if *iss != meta.issuer => {
            return Err(format!(
                "the authorization answer came from issuer `{iss}`, not `{}`; refusing it (RFC 9207)",
                meta.issuer
            )
            .into());
        }
        (None, Some(true)) => {
            return Err(format!(
                "the authorization answer has no `iss` though {} says it sends one; refusing it (RFC 9207)",
                meta.issuer
            )
            .into());
        }
        _ => {}
    }
    let code = answer
        .code
        .ok_or_else(|| "the authorization answer has no code".to_owned())?;
    let form = vec![
        ("grant_type", "authorization_code".to_owned()),
        ("code", code),
        ("redirect_uri", redirect_uri),
        ("code_verifier", verifier),
        ("resource", ask.resource.to_owned()),
    ];
    token_request(http, ask, form).await
}

/// The client credentials grant (no person; a client with a secret).
pub async fn client_credentials(
    http: &reqwest::Client,
    ask: &Ask<'_>,
) -> Result<Tokens, TokenError> {
    let mut form = vec![
        ("grant_type", "client_credentials".to_owned()),
        ("resource", ask.resource.to_owned()),
    ];
    if let Some(s) = ask.scope {
        form.push(("scope", s.to_owned()));
    }
    token_request(http, ask, form).await
}

/// A refresh (the tokens keep their refresh token when the answer has none).
pub async fn refresh(
    http: &reqwest::Client,
    ask: &Ask<'_>,
    refresh_token: &str,
) -> Result<Tokens, TokenError> {
    let form = vec![
        ("grant_type", "refresh_token".to_owned()),
        ("refresh_token", refresh_token.to_owned()),
        ("resource", ask.resource.to_owned()),
    ];
    let mut t = token_request(http, ask, form).await?;
    t.refresh.get_or_insert_with(|| refresh_token.to_owned());
    Ok(t)
}

/// POSTs a token request, authenticating the client as it registered.
async fn token_request(
    http: &reqwest::Client,
    ask: &Ask<'_>,
    mut form: Vec<(&'static str, String)>,
) -> Result<Tokens, TokenError> {
    let c = ask.client;
    let mut req = http.post(&ask.meta.token_endpoint);
    match (c.method.as_str(), &c.secret) {
        ("client_secret_basic", Some(secret)) => {
            // RFC 6749 §2.3.1: each form-encoded, then joined.
            let enc =
                |s: &str| url::form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
            let pair = format!("{}:{}", enc(&c.id), enc(secret));
            let b64 = base64::engine::general_purpose::STANDARD.encode(pair);
            req = req.header(reqwest::header::AUTHORIZATION, format!("Basic {b64}"));
        }
        ("client_secret_post", Some(secret)) => {
            form.push(("client_id", c.id.clone()));
            form.push(("client_secret", secret.clone()));
        }
        _ => form.push(("client_id", c.id.clone())),
    }
    let body = url::form_urlencoded::Serializer::new(String::new())
        .extend_pairs(form.iter().map(|(k, v)| (*k, v.as_str())))
        .finish();
    let resp = req
        .header(
            reqwest::header::CONTENT_TYPE,
            "application/x-www-form-urlencoded",
        )
        .header(reqwest::header::ACCEPT, "application/json")
        .body(body)
        .send()
        .await
        .map_err(|e| {
            // (reqwest's error names the URL; a token endpoint's URL holds no secret.)
            format!("token request to {}: {}", ask.meta.token_endpoint, why(&e))
        })?;
    let status = resp.status();
    let v = json_body(resp).await?;
    if !status.is_success() {
        return Err(TokenError {
            // An OAuth error answer (RFC 6749 §5.2): this grant or this client is no good.
            refused: matches!(status.as_u16(), 400 | 401) && v["error"].is_string(),
            message: format!(
                "the authorization server {} refused the token request ({status}{})",
                ask.meta.issuer,
                oauth_error(&v)
            ),
        });
    }
    let access = v["access_token"]
        .as_str()
        .ok_or_else(|| format!("{}'s token answer has no access_token", ask.meta.issuer))?;
    let kind = v["token_type"].as_str().unwrap_or("Bearer");
    if !kind.eq_ignore_ascii_case("bearer") {
        return Err(format!(
            "the authorization server {} issued a `{kind}` token; herald presents bearer tokens only",
            ask.meta.issuer
        )
        .into());
    }
    Ok(Tokens {
        access: access.to_owned(),
        refresh: v["refresh_token"].as_str().map(str::to_owned),
        expires_at: v["expires_in"]
            .as_u64()
            .map(|s| now_unix().saturating_add(s)),
        refresh_at: v["expires_in"]
            .as_u64()
            .map(|s| now_unix().saturating_add(s - (s / 2).min(30))),
        scope: v["scope"]
            .as_str()
            .map(str::to_owned)
            .or(ask.scope.map(str::to_owned)),
        issuer: ask.meta.issuer.clone(),
        token_endpoint: ask.meta.token_endpoint.clone(),
        resource: ask.resource.to_owned(),
        client: ask.client.clone(),
    })
}
