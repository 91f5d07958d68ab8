//! Where a person approves: the authorization request goes to a browser, and the answer comes
//! back to a listener on the loopback address (RFC 8252 §7.3: a native app's redirect URI is
//! `http://127.0.0.1:PORT/callback`, on a port of its own for this one login).
//!
//! A [`Consent`] shows the authorization URL: [`Print`] writes it for a person (`herald
//! login`); [`Follow`] fetches it and carries the authorization server's redirect to the
//! listener itself, for a server that approves without a person (the conformance suite's, a
//! test's). Either way the answer arrives at the [`Loopback`] listener, which takes the one
//! request whose `state` matches and answers it with a page that says what happened.

use std::time::Duration;

use futures::future::BoxFuture;
use reqwest::Url;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Shows an authorization URL to whoever approves it.
pub trait Consent: Send + Sync {
    fn open<'a>(&'a self, url: &'a str) -> BoxFuture<'a, Result<(), String>>;
    /// How long the answer may take.
    fn patience(&self) -> Duration;
}

/// For a person: prints the URL on stderr and waits up to five minutes.
pub struct Print;

impl Consent for Print {
    fn open<'a>(&'a self, url: &'a str) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            eprintln!(
                "Open this address in a browser to log in (it waits 5 minutes):\n\n  {url}\n"
            );
            Ok(())
        })
    }
    fn patience(&self) -> Duration {
        Duration::from_secs(300)
    }
}

/// For an authorization server that approves at once: GETs the URL, takes its redirect
/// (`Location`) and GETs that, which is the loopback listener.
pub struct Follow;

impl Consent for Follow {
    fn open<'a>(&'a self, url: &'a str) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let http = crate::transport::web::http_client(|b| {
                b.redirect(reqwest::redirect::Policy::none())
                    .timeout(Duration::from_secs(10))
            })
            .map_err(|e| e.to_string())?;
            let resp = http
                .get(url)
                .send()
                .await
                .map_err(|e| format!("authorization request: {e}"))?;
            let location = resp
                .headers()
                .get(reqwest::header::LOCATION)
                .and_then(|l| l.to_str().ok())
                .ok_or_else(|| {
                    format!(
                        "the authorization server answered {} without a redirect",
                        resp.status()
                    )
                })?
                .to_owned();
            // Only to herald's own listener (where else the server points is not followed).
            let to = Url::parse(&location).ok();
            let ours = to.as_ref().is_some_and(|u| {
                u.scheme() == "http"
                    && u.host_str() == Some("127.0.0.1")
                    && u.username().is_empty()
                    && u.password().is_none()
                    && u.path() == "/callback"
            });
            if !ours {
                return Err(
                    "the authorization server redirected elsewhere than herald's listener".into(),
                );
            }
            http.get(&location)
                .send()
                .await
                .map_err(|e| format!("delivering the redirect: {e}"))?;
            Ok(())
        })
    }
    fn patience(&self) -> Duration {
        Duration::from_secs(30)
    }
}

/// The authorization server's answer, as the redirect carried it.
#[derive(Debug, Clone, Default)]
pub struct Answer {
    pub code: Option<String>,
    pub state: Option<String>,
    pub iss: Option<String>,
    pub error: Option<String>,
    pub error_description: Option<String>,
}

/// A listener on 127.0.0.1 for one login's redirect.
pub struct Loopback {
    listener: TcpListener,
    port: u16,
}

impl Loopback {
    pub async fn bind() -> Result<Loopback, String> {
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .await
            .map_err(|e| format!("cannot listen on 127.0.0.1 for the login's redirect: {e}"))?;
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
        Ok(Loopback { listener, port })
    }

    /// The redirect URI to register and send.
    pub fn redirect_uri(&self) -> String {
        format!("http://127.0.0.1:{}/callback", self.port)
    }

    /// Waits for the redirect carrying `state`, up to `patience`; other requests (a
    /// browser's favicon, a stale tab) are answered 404 and waited past.
    pub async fn answer(&self, state: &str, patience: Duration) -> Result<Answer, String> {
        let wait = async {
            loop {
                let (mut sock, _) = self
                    .listener
                    .accept()
                    .await
                    .map_err(|e| format!("the login's listener failed: {e}"))?;
                let Some(target) = request_target(&mut sock).await else {
                    continue;
                };
                let answer = parse_answer(&target);
                if !target.starts_with("/callback?") || answer.state.as_deref() != Some(state) {
                    let _ = respond(
                        &mut sock,
                        "404 Not Found",
                        "Not the login herald waits for.",
                    )
                    .await;
                    continue;
                }
                let page = match &answer.error {
                    Some(e) => {
                        format!("The authorization server refused: {e}. You can close this tab.")
                    }
                    None => "herald has the authorization. You can close this tab.".to_owned(),
                };
                let _ = respond(&mut sock, "200 OK", &page).await;
                return Ok(answer);
            }
        };
        tokio::time::timeout(patience, wait).await.map_err(|_| {
            format!(
                "no answer from the browser within {} s; run the login again",
                patience.as_secs()
            )
        })?
    }
}

/// The request target of one HTTP/1 request (`/callback?…`), read within 5 s.
async fn request_target(sock: &mut tokio::net::TcpStream) -> Option<String> {
    let mut buf = Vec::with_capacity(1024);
    let read = async {
        let mut chunk = [0u8; 1024];
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 16 * 1024 {
            let n = sock.read(&mut chunk).await.ok()?;
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        Some(())
    };
    tokio::time::timeout(Duration::from_secs(5), read)
        .await
        .ok()??;
    let line = buf.split(|b| *b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?;
    let mut parts = line.split_whitespace();
    (parts.next()? == "GET").then_some(())?;
    parts.next().map(str::to_owned)
}

fn parse_answer(target: &str) -> Answer {
    let mut a = Answer::default();
    let Ok(url) = Url::parse(&format!("http://127.0.0.1{target}")) else {
        return a;
    };
    for (k, v) in url.query_pairs() {
        let slot = match &*k {
            "code" => &mut a.code,
            "state" => &mut a.state,
            "iss" => &mut a.iss,
            "error" => &mut a.error,
            "error_description" => &mut a.error_description,
            _ => continue,
        };
        slot.get_or_insert(v.into_owned());
    }
    a
}

async fn respond(
    sock: &mut tokio::net::TcpStream,
    status: &str,
    text: &str,
) -> std::io::Result<()> {
    let body = format!(
        "<!doctype html><meta charset=utf-8><title>herald</title><p>{}</p>\n",
        text.replace('<', "&lt;")
    );
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\nCache-Control: no-store\r\n\r\n",
        body.len()
    );
    sock.write_all(head.as_bytes()).await?;
    sock.write_all(body.as_bytes()).await?;
    sock.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_listener_takes_only_its_own_state() {
        let lb = Loopback::bind().await.unwrap();
        let base = lb.redirect_uri();
        let http = crate::transport::web::http_client(|b| b).unwrap();
        let hits = async {
            let stale = http
                .get(format!("{base}?code=old&state=other"))
                .send()
                .await
                .unwrap();
            assert_eq!(stale.status(), 404);
            let ok = http
                .get(format!("{base}?code=c1&state=s1&iss=https%3A%2F%2Fas"))
                .send()
                .await
                .unwrap();
            assert_eq!(ok.status(), 200);
        };
        let (answer, ()) = tokio::join!(lb.answer("s1", Duration::from_secs(10)), hits);
        let answer = answer.unwrap();
        assert_eq!(answer.code.as_deref(), Some("c1"));
        assert_eq!(answer.iss.as_deref(), Some("https://as"));
    }
}
