//! Slack's Web API: a form `POST` to `<base><method>` with a bearer token, answered with
//! `{"ok": …}` (HTTP 200 even for errors). A `429` is retried after its `Retry-After`, a few
//! times; everything else is the caller's to retry. Errors name the method and Slack's error
//! code, never a token.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::Value;

use crate::transport::tls::Secret;

/// Where the real Web API lives.
pub const DEFAULT_API_URL: &str = "https://slack.com/api/";
/// Longest one call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Attempts of one call that keeps getting `429`.
const RATE_LIMIT_ATTEMPTS: u32 = 5;
/// The longest `Retry-After` honoured in place; a longer one fails the call.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(120);

/// Which token a call carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Token {
    /// `xapp-…`: only `apps.connections.open`.
    App,
    /// `xoxb-…`: everything else.
    Bot,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    #[error("{method}: Slack answered {error}")]
    Slack { method: String, error: String },
    #[error(
        "{method}: rate limited by Slack {attempts} times in a row (retry after {retry_after_s} s)"
    )]
    RateLimited {
        method: String,
        attempts: u32,
        retry_after_s: u64,
    },
    #[error("{method}: HTTP {status} from {url}")]
    Status {
        method: String,
        status: u16,
        url: String,
    },
    #[error("{method}: cannot reach {url}: {message}; check --slack-api-url and the network")]
    Transport {
        method: String,
        url: String,
        message: String,
    },
    #[error("{method}: the answer is not Slack Web API JSON")]
    Decode { method: String },
    #[error("{method} needs {variable}, which is not set")]
    NoToken {
        method: String,
        variable: &'static str,
    },
}

impl ApiError {
    /// Slack's error code, when Slack answered one.
    pub fn slack_error(&self) -> Option<&str> {
        match self {
            ApiError::Slack { error, .. } => Some(error),
            _ => None,
        }
    }
}

/// A Web API client.
pub struct WebApi {
    http: reqwest::Client,
    base: String,
    /// `base` as messages show it: without credentials a proxy URL may carry.
    shown: String,
    app: Option<Secret>,
    bot: Option<Secret>,
    calls: AtomicU64,
}

/// Percent-encodes a form value.
fn form_encode(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl WebApi {
    /// A client of the Web API at `base` (`https://slack.com/api/` or a stand-in).
    pub fn new(base: &str, app: Option<Secret>, bot: Option<Secret>) -> WebApi {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let base = if base.ends_with('/') {
            base.to_owned()
        } else {
            format!("{base}/")
        };
        let shown = without_userinfo(&base);
        WebApi {
            // Without a system CA store this is a client trusting no CA, so the missing store
            // shows as a failed call (and in slack_events_status), not a panic.
            http: crate::transport::web::http_client(|b| b.timeout(CALL_TIMEOUT).tcp_nodelay(true))
                .expect(
                    "a client with a timeout and TCP_NODELAY builds, with or without a CA store",
                ),
            base,
            shown,
            app,
            bot,
            calls: AtomicU64::new(0),
        }
    }

    /// Calls made so far (each attempt counts).
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// Whether the bot token is there.
    pub fn has_bot_token(&self) -> bool {
        self.bot.is_some()
    }

    /// Calls `method` with `params` as a form; the answer's object when `ok` is true.
    pub async fn call(
        &self,
        method: &str,
        token: Token,
        params: &[(&str, &str)],
    ) -> Result<Value, ApiError> {
        let secret = match token {
            Token::App => self.app.as_ref().ok_or(ApiError::NoToken {
                method: method.into(),
                variable: super::settings::APP_TOKEN,
            })?,
            Token::Bot => self.bot.as_ref().ok_or(ApiError::NoToken {
                method: method.into(),
                variable: super::settings::BOT_TOKEN,
            })?,
        };
        let url = format!("{}{method}", self.base);
        let shown = format!("{}{method}", self.shown);
        let body = params
            .iter()
            .map(|(k, v)| format!("{}={}", form_encode(k), form_encode(v)))
            .collect::<Vec<_>>()
            .join("&");
        let mut attempt = 0;
        loop {
            attempt += 1;
            self.calls.fetch_add(1, Ordering::Relaxed);
            let resp = self
                .http
                .post(&url)
                .bearer_auth(&secret.0)
                .header(
                    reqwest::header::CONTENT_TYPE,
                    "application/x-www-form-urlencoded",
                )
                .body(body.clone())
                .send()
                .await
                .map_err(|e| ApiError::Transport {
                    method: method.into(),
                    url: shown.clone(),
                    message: transport_message(&e),
                })?;
            let status = resp.status();
            if status == reqwest::StatusCode::TOO_MANY_REQUESTS {
                let after = resp
                    .headers()
                    .get(reqwest::header::RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .unwrap_or(1);
                if attempt >= RATE_LIMIT_ATTEMPTS || Duration::from_secs(after) > MAX_RETRY_AFTER {
                    return Err(ApiError::RateLimited {
                        method: method.into(),
                        attempts: attempt,
                        retry_after_s: after,
                    });
                }
                tracing::info!(%method, retry_after_s = after, "rate limited by Slack; waiting");
                tokio::time::sleep(Duration::from_secs(after)).await;
                continue;
            }
            if !status.is_success() {
                return Err(ApiError::Status {
                    method: method.into(),
                    status: status.as_u16(),
                    url: shown,
                });
            }
            let v: Value = resp.json().await.map_err(|_| ApiError::Decode {
                method: method.into(),
            })?;
            return match v.get("ok").and_then(Value::as_bool) {
                Some(true) => Ok(v),
                Some(false) => Err(ApiError::Slack {
                    method: method.into(),
                    error: v
                        .get("error")
                        .and_then(Value::as_str)
                        .unwrap_or("an unnamed error")
                        .to_owned(),
                }),
                None => Err(ApiError::Decode {
                    method: method.into(),
                }),
            };
        }
    }

    /// Every page of a cursor-paginated method: calls it while `response_metadata.next_cursor`
    /// is not empty, handing each page to `each`.
    pub async fn pages(
        &self,
        method: &str,
        params: &[(&str, &str)],
        mut each: impl FnMut(&Value),
    ) -> Result<usize, ApiError> {
        let mut cursor = String::new();
        let mut pages = 0;
        loop {
            let mut p: Vec<(&str, &str)> = params.to_vec();
            if !cursor.is_empty() {
                p.push(("cursor", &cursor));
            }
            let page = self.call(method, Token::Bot, &p).await?;
            pages += 1;
            each(&page);
            let next = page
                .pointer("/response_metadata/next_cursor")
                .and_then(Value::as_str)
                .unwrap_or("");
            if next.is_empty() {
                return Ok(pages);
            }
            cursor = next.to_owned();
        }
    }
}

/// `url` without `user:password@`.
fn without_userinfo(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let host_end = rest.find('/').unwrap_or(rest.len());
            match rest[..host_end].rfind('@') {
                Some(at) => format!("{scheme}://{}", &rest[at + 1..]),
                None => url.to_owned(),
            }
        }
        None => url.to_owned(),
    }
}

/// reqwest's error without the URL (the caller names it) and with its cause.
fn transport_message(e: &reqwest::Error) -> String {
    let mut msg = if e.is_timeout() {
        "timed out".to_owned()
    } else if e.is_connect() {
        "connection failed".to_owned()
    } else {
        "request failed".to_owned()
    };
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        msg = format!("{msg}: {s}");
        src = s.source();
    }
    msg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_shown_without_credentials() {
        assert_eq!(
            without_userinfo("http://user:pw@proxy:3128/api/"),
            "http://proxy:3128/api/"
        );
        assert_eq!(
            without_userinfo("https://slack.com/api/"),
            "https://slack.com/api/"
        );
    }

    #[test]
    fn forms_are_percent_encoded() {
        assert_eq!(form_encode("1700.0001"), "1700.0001");
        assert_eq!(form_encode("a b&c=d"), "a%20b%26c%3Dd");
    }

    #[tokio::test]
    async fn a_missing_token_names_the_variable() {
        let api = WebApi::new("http://127.0.0.1:9/api", None, None);
        let e = api.call("auth.test", Token::Bot, &[]).await.unwrap_err();
        assert_eq!(
            e.to_string(),
            "auth.test needs SLACK_BOT_TOKEN, which is not set"
        );
        assert_eq!(api.calls(), 0);
    }

    #[tokio::test]
    async fn a_dead_endpoint_is_named_and_no_token_leaks() {
        let api = WebApi::new(
            "http://127.0.0.1:9/api/",
            None,
            Some(Secret("xoxb-s3cret".into())),
        );
        let e = api
            .call("auth.test", Token::Bot, &[])
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("http://127.0.0.1:9/api/auth.test"), "{e}");
        assert!(e.contains("--slack-api-url"), "{e}");
        assert!(!e.contains("s3cret"), "{e}");
    }
}
