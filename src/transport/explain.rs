//! Why a connection to a server failed, as a sentence a person can act on: what happened and
//! what to try ("connection refused at http://127.0.0.1:8753/mcp — is a herald server running
//! there?"), never a library's type names (rmcp's `Transport [rmcp::transport::worker::…]`).
//!
//! The one place that reads the errors of rmcp, reqwest, hyper, rustls, quinn and herald's
//! resolver. It walks an error's source chain and downcasts ([`io::Error`] and what it wraps,
//! [`reqwest::Error`], [`hyper::Error`], [`rustls::Error`], rmcp's `StreamableHttpError`,
//! [`DnsError`]) instead of matching rendered text; only the HTTP status rmcp writes into a
//! string (`HTTP 404 Not Found: …`) is read from one. Every sentence names the server (an HTTP
//! URL without userinfo or query, a QUIC `HOST:PORT`, a command without its arguments), so a
//! caller prints it as it is. Never a token: only whether one was sent.

use std::error::Error;
use std::io;
use std::time::Duration;

use rmcp::service::ClientInitializeError;
use rmcp::transport::streamable_http_client::StreamableHttpError;

use crate::transport::dns::DnsError;
use crate::transport::target::Target;

/// What went wrong, as found in an error's chain.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Cause {
    /// Nothing listens on the port (TCP).
    Refused,
    /// The peer closed or reset the connection before it answered.
    Closed,
    /// No route to the host: the io error's text.
    Unreachable(String),
    /// The host name did not resolve: [`DnsError`]'s sentence.
    Dns(String),
    /// The TLS handshake failed: what about it.
    Tls(String),
    /// The peer answered the TLS handshake with something that is not TLS.
    NotTls,
    /// No answer in time.
    TimedOut,
    /// An HTTP status that is not success, with the start of the body.
    Status { code: u16, body: String },
    /// The peer does not speak HTTP.
    NotHttp,
    /// It speaks HTTP, but not MCP: what it answered.
    NotMcp(String),
    /// The server refused the MCP handshake with this JSON-RPC error message.
    Refusal(String),
    /// The server does not know this client's credentials (a QUIC handshake refused as HTTP
    /// refuses with 401).
    Unauthenticated,
    /// Nothing herald knows: the innermost error's own text.
    Other(String),
}

/// How a failed connect to `target` reads. `token`: whether a bearer token was sent (a 401
/// says "wrong token" or "no token" accordingly).
pub fn handshake(target: &Target, token: bool, e: &ClientInitializeError) -> String {
    sentence(target, token, init_cause(e))
}

/// How a failed request on an open connection to `target` reads (a read, a listen, a call):
/// the server's own JSON-RPC error as it is, a broken connection as what broke.
pub fn request(target: &Target, e: &rmcp::ServiceError) -> String {
    match e {
        // The server's own words, then its code and data apart (a person reads the message;
        // the code and data say what a program would match on).
        rmcp::ServiceError::McpError(d) => match &d.data {
            Some(data) => format!(
                "{} answered: {} (code {}; data {data})",
                place(target),
                d.message,
                d.code.0
            ),
            None => format!(
                "{} answered: {} (code {})",
                place(target),
                d.message,
                d.code.0
            ),
        },
        rmcp::ServiceError::TransportClosed => closed(target),
        rmcp::ServiceError::Timeout { timeout } => format!(
            "{} did not answer within {}; is it overloaded?",
            place(target),
            secs(*timeout)
        ),
        rmcp::ServiceError::TransportSend(d) => sentence(target, false, cause(d)),
        other => format!("{}: {}", place(target), innermost(other)),
    }
}

/// How any other failure talking to `target` reads (a reqwest error of a direct call).
pub fn failure(target: &Target, token: bool, e: &(dyn Error + 'static)) -> String {
    sentence(target, token, cause(e))
}

/// What a whole connect (the handshake, then the tool, resource and template lists) not done
/// within `within` means for `target`: past the handshake's own bound, it answered, then was
/// slow (or, over stdio, slow to start).
pub fn connect_timed_out(target: &Target, within: Duration) -> String {
    match target {
        Target::Stdio(_) => format!(
            "{} did not finish starting within {} (its handshake and its tool and resource lists) — is it slow to start, or waiting for something?",
            place(target),
            secs(within)
        ),
        _ => format!(
            "{} did not send its tool and resource lists within {} of connecting — is it overloaded?",
            place(target),
            secs(within)
        ),
    }
}

/// What no answer within `within` means for `target`.
pub fn timed_out(target: &Target, within: Duration) -> String {
    match target {
        Target::Quic(_) => format!(
            "no QUIC server answered at {} within {} — is a herald server listening there (UDP)? \
             (--connect-timeout-ms waits longer)",
            place(target),
            secs(within)
        ),
        Target::Http(_) => format!(
            "no answer from {} within {} — is the host reachable and a herald server running \
             there? (--connect-timeout-ms waits longer)",
            place(target),
            secs(within)
        ),
        Target::Stdio(_) => format!(
            "{} did not answer the MCP handshake within {}; run it by hand to see what it does",
            place(target),
            secs(within)
        ),
    }
}

/// What a server that took the connection but not the MCP handshake within `within` means.
pub fn no_handshake(target: &Target, within: Duration) -> String {
    format!(
        "{} took the connection but did not answer the MCP handshake within {} — is it a herald \
         server? (--connect-timeout-ms waits longer)",
        place(target),
        secs(within)
    )
}

/// A QUIC connection to `target` that failed before it was up. Certificates are checked by
/// this client (`--tls-pin`, `--tls-ca`), so a refused certificate says which flag to look at.
pub fn quic(target: &Target, e: &quinn::ConnectionError) -> String {
    let at = place(target);
    let crypto = |code: quinn::TransportErrorCode| (0x100..0x200).contains(&u64::from(code));
    match e {
        quinn::ConnectionError::TransportError(t) if crypto(t.code) => format!(
            "the certificate of the QUIC server at {at} is not one this client trusts ({}) — \
             pass the fingerprint it printed at start with --tls-pin, or its CA with --tls-ca",
            t.reason.trim_start_matches("unexpected error: ")
        ),
        quinn::ConnectionError::ConnectionClosed(c) if crypto(c.error_code) => format!(
            "the QUIC server at {at} refused the TLS handshake ({}) — is it a herald server \
             (ALPN mcp)?",
            String::from_utf8_lossy(&c.reason)
        ),
        quinn::ConnectionError::ConnectionClosed(c)
            if c.error_code == quinn::TransportErrorCode::CONNECTION_REFUSED =>
        {
            format!("the QUIC server at {at} refused the connection (it may be at its limit)")
        }
        quinn::ConnectionError::ApplicationClosed(c) => format!(
            "the QUIC server at {at} closed the connection ({})",
            String::from_utf8_lossy(&c.reason)
        ),
        quinn::ConnectionError::Reset => {
            format!("the QUIC server at {at} reset the connection (did it just restart?)")
        }
        quinn::ConnectionError::VersionMismatch => {
            format!("{at} does not speak QUIC version 1 — is it a herald server?")
        }
        other => format!("QUIC connection to {at} failed: {other}"),
    }
}

/// Checks that `url` is an HTTP URL: `http://` or `https://`, then a host. A URL without a
/// scheme (`127.0.0.1:8753/mcp`) is told the scheme it needs, with the URL corrected.
pub fn check_http_url(url: &str) -> Result<(), String> {
    let shown = |u: &str| Target::Http(u.to_owned()).redacted();
    match reqwest::Url::parse(url) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.has_host() => Ok(()),
        Ok(u) if matches!(u.scheme(), "http" | "https") => Err(format!(
            "{} names no host (write http://HOST:PORT/mcp)",
            shown(url)
        )),
        // `localhost:8753/mcp` parses, with `localhost` as its scheme.
        // Shown as the URL it would be, so userinfo (`tok@host`) is left out there too.
        _ if !url.contains("://") => {
            let fixed = shown(&format!("http://{url}"));
            Err(format!(
                "{} is not a URL: it needs http:// (or https://) in front: {fixed}",
                fixed.trim_start_matches("http://")
            ))
        }
        Ok(u) => Err(format!(
            "{} is not an HTTP URL: the scheme must be http:// or https://, not {}:// (a QUIC \
             server is given as HOST:PORT to --mcp-quic)",
            shown(url),
            u.scheme()
        )),
        Err(e) => Err(format!("{} is not a valid URL: {e}", shown(url))),
    }
}

// === the sentences ===

/// The target as a sentence names it.
fn place(target: &Target) -> String {
    match target {
        Target::Http(_) => target.redacted(),
        Target::Quic(a) => a.trim_start_matches("quic://").to_owned(),
        // herald's own roles in this process, named by herald, not by a command line.
        Target::Stdio(c) if c.starts_with("in-process ") => c.clone(),
        Target::Stdio(_) => format!("`{}`", target.redacted().trim_start_matches("stdio:")),
    }
}

fn closed(target: &Target) -> String {
    match target {
        Target::Stdio(_) => format!(
            "{} closed its output (did it exit? its messages are above); run it by hand to see why",
            place(target)
        ),
        _ => format!(
            "the connection to {} closed (did the server stop?)",
            place(target)
        ),
    }
}

/// `5 s`, `1.5 s`, `200 ms`.
fn secs(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        format!("{ms} ms")
    } else if ms.is_multiple_of(1000) {
        format!("{} s", ms / 1000)
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}

fn sentence(target: &Target, token: bool, cause: Cause) -> String {
    let at = place(target);
    match cause {
        Cause::Refused => format!("connection refused at {at} — is a herald server running there?"),
        Cause::Closed if matches!(target, Target::Http(_)) => format!(
            "{at} closed the connection without an answer — is it an HTTP MCP endpoint (herald \
             serves /mcp)?"
        ),
        Cause::Closed => closed(target),
        Cause::Unreachable(why) => {
            format!("cannot reach {at}: {why} — check the address and the network")
        }
        Cause::Dns(why) => format!("{why} — check the host name in {at}"),
        Cause::Tls(why) => format!("TLS with {at} failed: {why}"),
        Cause::NotTls => match target {
            Target::Http(u) if u.starts_with("https://") => format!(
                "{at} does not answer TLS — is it plain HTTP? try {}",
                Target::Http(u.replacen("https://", "http://", 1)).redacted()
            ),
            _ => format!("{at} does not answer TLS"),
        },
        Cause::TimedOut => format!(
            "{at} did not answer in time — is the host reachable and a herald server running there?"
        ),
        Cause::Status { code, body } => status(target, token, code, &body),
        Cause::NotHttp => format!(
            "{at} does not answer in HTTP — is that port a herald HTTP listener (not QUIC or \
             another service)?"
        ),
        Cause::NotMcp(what) => {
            format!("{at} is not an MCP endpoint: {what} — check the URL (herald serves /mcp)")
        }
        Cause::Refusal(message) => format!("{at} refused the MCP handshake: {message}"),
        Cause::Unauthenticated => token_refused(&at, token, None),
        Cause::Other(message) => format!("{at}: {message}"),
    }
}

/// A server that does not know this client's token (or wants one): the same words whatever
/// carried the refusal (`how`, e.g. `HTTP 401`).
fn token_refused(at: &str, token: bool, how: Option<&str>) -> String {
    let how = how.map(|h| format!(" ({h})")).unwrap_or_default();
    if token {
        format!(
            "{at} refused the token{how} — check HERALD_TOKEN (a gateway slug: its token_env or \
             token_credential) against the server's [[token]] entries"
        )
    } else {
        format!(
            "{at} needs a token{how} — set HERALD_TOKEN to one the server knows (a gateway slug: \
             token_env or token_credential)"
        )
    }
}

fn status(target: &Target, token: bool, code: u16, body: &str) -> String {
    let at = place(target);
    // A line of the server's own words, when it gave some (herald's say what is wrong).
    let said = match one_line(body) {
        b if b.is_empty() => String::new(),
        b => format!(": {b}"),
    };
    match code {
        401 => token_refused(&at, token, Some("HTTP 401")),
        403 => format!(
            "{at} refused this client (HTTP 403{said}) — a token not entitled to this server \
             (HERALD_TOKEN), or a Host the server does not allow (herald's --allowed-host)"
        ),
        404 => match with_path(target, "/mcp") {
            Some(u) => format!(
                "nothing at {at} (HTTP 404) — wrong path? herald serves MCP at /mcp: try {u}"
            ),
            // The path was /mcp already: another port (an admin address serves /live, /ready,
            // /metrics and /status only), or not herald.
            None => format!(
                "nothing at {at} (HTTP 404) — is that port a herald MCP address? (an admin \
                 address, --admin, serves /live, /ready, /metrics and /status, not MCP; herald \
                 up's MCP is on 8750, its admin on 8759)"
            ),
        },
        429 => format!("{at} is rate-limiting this client (HTTP 429); try again later"),
        500..=599 => format!("{at} failed with HTTP {code}{said} — see the server's log"),
        _ => {
            format!("{at} answered HTTP {code}{said} — is it an MCP endpoint? (herald serves /mcp)")
        }
    }
}

/// The first line of `s`, at most 200 characters.
fn one_line(s: &str) -> String {
    // A JSON-RPC error body (herald's refusals): its message, not its JSON.
    if let Ok(v) = serde_json::from_str::<serde_json::Value>(s.trim())
        && let Some(m) = v.pointer("/error/message").and_then(|m| m.as_str())
    {
        return one_line(m);
    }
    let line = s.trim().lines().next().unwrap_or_default().trim();
    match line.char_indices().nth(200) {
        Some((i, _)) => format!("{}…", &line[..i]),
        None => line.to_owned(),
    }
}

/// `target`'s URL with its path replaced by `path`, unless that is its path already.
fn with_path(target: &Target, path: &str) -> Option<String> {
    let Target::Http(u) = target else {
        return None;
    };
    let mut url = reqwest::Url::parse(u).ok()?;
    if url.path() == path {
        return None;
    }
    url.set_path(path);
    url.set_query(None);
    url.set_fragment(None);
    Some(Target::Http(url.to_string()).redacted())
}

// === reading errors ===

fn init_cause(e: &ClientInitializeError) -> Cause {
    match e {
        ClientInitializeError::TransportError { error, .. } => cause(error),
        // A 404 from a path with nothing on it fails discovery and then `initialize`: the
        // second answer says it best, unless it says nothing.
        ClientInitializeError::LegacyFallbackFailed { discover, fallback } => {
            match init_cause(fallback) {
                Cause::Other(_) => init_cause(discover),
                c => c,
            }
        }
        ClientInitializeError::ConnectionClosed(_) => Cause::Closed,
        ClientInitializeError::JsonRpcError(d)
            if d.data
                .as_ref()
                .and_then(|v| v.get("kind"))
                .and_then(|k| k.as_str())
                == Some(crate::mcp::source::UNAUTHENTICATED) =>
        {
            Cause::Unauthenticated
        }
        ClientInitializeError::JsonRpcError(d) => Cause::Refusal(d.message.to_string()),
        other => Cause::Other(other.to_string()),
    }
}

/// The cause of `e`, from the first error in its chain herald knows.
fn cause(e: &(dyn Error + 'static)) -> Cause {
    find(e).unwrap_or_else(|| Cause::Other(innermost(e)))
}

fn find(e: &(dyn Error + 'static)) -> Option<Cause> {
    if let Some(c) = one(e) {
        return Some(c);
    }
    for next in children(e) {
        if let Some(c) = find(next) {
            return Some(c);
        }
    }
    None
}

/// What `e` says by itself, when it says something herald knows.
fn one(e: &(dyn Error + 'static)) -> Option<Cause> {
    if let Some(i) = e.downcast_ref::<ClientInitializeError>() {
        return Some(init_cause(i));
    }
    if let Some(h) = e.downcast_ref::<StreamableHttpError<reqwest::Error>>() {
        return http(h);
    }
    if let Some(r) = e.downcast_ref::<reqwest::Error>() {
        if let Some(status) = r.status() {
            return Some(Cause::Status {
                code: status.as_u16(),
                body: String::new(),
            });
        }
        // The deeper errors say more (a refused connect also counts as a connect error).
        return None;
    }
    if let Some(h) = e.downcast_ref::<hyper::Error>() {
        if h.is_parse() || h.is_parse_status() {
            return Some(Cause::NotHttp);
        }
        if h.is_incomplete_message() || h.is_closed() || h.is_canceled() {
            return Some(Cause::Closed);
        }
        if h.is_timeout() {
            return Some(Cause::TimedOut);
        }
        return None;
    }
    if let Some(io) = e.downcast_ref::<io::Error>() {
        use io::ErrorKind::*;
        return match io.kind() {
            ConnectionRefused => Some(Cause::Refused),
            ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof => Some(Cause::Closed),
            TimedOut => Some(Cause::TimedOut),
            HostUnreachable | NetworkUnreachable | NetworkDown | AddrNotAvailable => {
                Some(Cause::Unreachable(io_text(io)))
            }
            _ => None,
        };
    }
    if let Some(t) = e.downcast_ref::<rustls::Error>() {
        return Some(tls(t));
    }
    if let Some(d) = e.downcast_ref::<DnsError>() {
        return Some(Cause::Dns(d.to_string()));
    }
    if let Some(q) = e.downcast_ref::<quinn::ConnectionError>() {
        return match q {
            quinn::ConnectionError::TimedOut => Some(Cause::TimedOut),
            quinn::ConnectionError::Reset
            | quinn::ConnectionError::ApplicationClosed(_)
            | quinn::ConnectionError::ConnectionClosed(_)
            | quinn::ConnectionError::LocallyClosed => Some(Cause::Closed),
            _ => None,
        };
    }
    None
}

/// The errors under `e`: its source, what an [`io::Error`] wraps (its `source` skips the
/// wrapped error itself, which is where rustls puts its own), and the reqwest error rmcp's
/// `Client` variant holds without naming it as a source.
fn children<'a>(e: &'a (dyn Error + 'static)) -> Vec<&'a (dyn Error + 'static)> {
    let mut out: Vec<&'a (dyn Error + 'static)> = Vec::new();
    if let Some(io) = e.downcast_ref::<io::Error>()
        && let Some(inner) = io.get_ref()
    {
        out.push(inner);
    }
    if let Some(StreamableHttpError::Client(r)) =
        e.downcast_ref::<StreamableHttpError<reqwest::Error>>()
    {
        out.push(r);
    }
    if let Some(ClientInitializeError::TransportError { error, .. }) =
        e.downcast_ref::<ClientInitializeError>()
    {
        out.push(error);
    }
    out.extend(e.source());
    out
}

/// The text of the deepest error under `e` (the one with the least wrapping).
fn innermost(e: &(dyn Error + 'static)) -> String {
    let mut e = e;
    while let Some(next) = children(e).into_iter().next() {
        e = next;
    }
    match e.downcast_ref::<io::Error>() {
        Some(io) => io_text(io),
        None => e.to_string(),
    }
}

/// An io error's text without the `(os error N)` tail.
fn io_text(e: &io::Error) -> String {
    let s = e.to_string();
    match s.find(" (os error") {
        Some(i) => s[..i].to_owned(),
        None => s,
    }
}

fn http(e: &StreamableHttpError<reqwest::Error>) -> Option<Cause> {
    match e {
        StreamableHttpError::Client(_) | StreamableHttpError::Io(_) => None,
        StreamableHttpError::AuthRequired(_) => Some(Cause::Status {
            code: 401,
            body: String::new(),
        }),
        // (An OAuth session asked for that scope once already: the server still refuses.)
        StreamableHttpError::InsufficientScope(c) => Some(Cause::Status {
            code: 403,
            body: match &c.required_scope {
                Some(s) => format!("insufficient_scope, it asks for scope \"{s}\""),
                None => "insufficient_scope".into(),
            },
        }),
        StreamableHttpError::HttpStatus(s) => Some(Cause::Status {
            code: s.status,
            body: String::new(),
        }),
        // rmcp writes the status of any other failed POST into this text:
        // `HTTP 404 Not Found: <body>`.
        StreamableHttpError::UnexpectedServerResponse(text) => {
            let status = text
                .strip_prefix("HTTP ")
                .and_then(|rest| rest.get(..3))
                .and_then(|code| code.parse::<u16>().ok());
            Some(match status {
                Some(code) => Cause::Status {
                    code,
                    body: text
                        .split_once(": ")
                        .map(|(_, body)| body.to_owned())
                        .unwrap_or_default(),
                },
                None => Cause::NotMcp(format!("its answer is not MCP ({})", one_line(text))),
            })
        }
        StreamableHttpError::UnexpectedContentType(ct) => Some(Cause::NotMcp(match ct {
            Some(ct) => format!("it answered {ct}, not JSON or an event stream"),
            None => "its answer has no Content-Type (MCP answers JSON or an event stream)".into(),
        })),
        StreamableHttpError::Deserialize(_) => {
            Some(Cause::NotMcp("its answer is not a JSON-RPC message".into()))
        }
        StreamableHttpError::UnexpectedEndOfStream
        | StreamableHttpError::TransportChannelClosed => Some(Cause::Closed),
        StreamableHttpError::ServerDoesNotSupportSse => Some(Cause::NotMcp(
            "it does not stream events (HTTP 405 to GET)".into(),
        )),
        _ => None,
    }
}

fn tls(e: &rustls::Error) -> Cause {
    use rustls::CertificateError as C;
    Cause::Tls(match e {
        rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateMessage { .. } => {
            return Cause::NotTls;
        }
        rustls::Error::InvalidCertificate(c) => match c {
            C::UnknownIssuer => "its certificate is not signed by a CA this system trusts \
                                 (unknown issuer; herald reads the system's CA store, or \
                                 SSL_CERT_FILE)"
                .to_owned(),
            C::NotValidForName | C::NotValidForNameContext { .. } => {
                "its certificate is not valid for this host name".to_owned()
            }
            C::Expired | C::ExpiredContext { .. } => "its certificate has expired".to_owned(),
            C::NotValidYet | C::NotValidYetContext { .. } => {
                "its certificate is not valid yet (is this host's clock right?)".to_owned()
            }
            C::Revoked => "its certificate has been revoked".to_owned(),
            C::BadSignature => "its certificate has a bad signature".to_owned(),
            other => format!("its certificate was refused ({other:?})"),
        },
        rustls::Error::NoCertificatesPresented => "it presented no certificate".to_owned(),
        rustls::Error::AlertReceived(a) => format!("the server refused the handshake ({a:?})"),
        rustls::Error::NoApplicationProtocol => {
            "it offers no protocol this client speaks (ALPN)".to_owned()
        }
        rustls::Error::General(s) => s.clone(),
        other => other.to_string(),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_url_without_a_scheme_never_shows_its_userinfo() {
        let e = super::check_http_url("tok3n@127.0.0.1:8750/mcp?key=s3cret").unwrap_err();
        assert!(!e.contains("tok3n") && !e.contains("s3cret"), "{e}");
        assert!(e.ends_with("in front: http://127.0.0.1:8750/mcp"), "{e}");
    }

    #[test]
    fn a_slow_whole_connect_does_not_blame_the_handshake_flag() {
        use super::*;
        let http = Target::Http("http://h:8750/mcp?token=x".into());
        let m = connect_timed_out(&http, Duration::from_secs(30));
        assert_eq!(
            m,
            "http://h:8750/mcp did not send its tool and resource lists within 30 s of connecting — is it overloaded?"
        );
        let stdio = Target::Stdio("npx server --key secret".into());
        let m = connect_timed_out(&stdio, Duration::from_secs(30));
        assert!(
            m.starts_with("`npx …` did not finish starting within 30 s"),
            "{m}"
        );
        assert!(
            !m.contains("secret") && !m.contains("--connect-timeout-ms"),
            "{m}"
        );
    }

    use super::*;

    use crate::transport::client::{client_config, connect};
    use crate::transport::tls::{ClientTrust, Secret};

    /// What connecting to `url` fails with.
    async fn connect_error(url: &str, token: bool) -> String {
        let trust = ClientTrust {
            token: token.then(|| Secret("t0ken".into())),
            ..ClientTrust::default()
        };
        match connect(&Target::Http(url.into()), &trust, client_config(), 1 << 20).await {
            Ok(_) => panic!("{url} connected"),
            Err(e) => e.to_string(),
        }
    }

    /// A TCP port with nothing listening on it.
    async fn closed_port() -> u16 {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        l.local_addr().unwrap().port()
    }

    /// A plain HTTP server answering every request with `response` (a whole HTTP response).
    async fn answering(response: &'static str) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    // Reads the request (headers and the small JSON body come in one write).
                    let mut buf = vec![0u8; 64 << 10];
                    let _ = s.read(&mut buf).await;
                    let _ = s.write_all(response.as_bytes()).await;
                    let _ = s.shutdown().await;
                });
            }
        });
        addr.to_string()
    }

    fn no_internals(s: &str) {
        for word in [
            "rmcp::",
            "WorkerTransport",
            "reqwest",
            "hyper",
            "Transport [",
            "os error",
        ] {
            assert!(!s.contains(word), "{word} in {s:?}");
        }
    }

    #[tokio::test]
    async fn a_closed_port_is_connection_refused() {
        let url = format!("http://127.0.0.1:{}/mcp", closed_port().await);
        let e = connect_error(&url, false).await;
        assert_eq!(
            e,
            format!("connection refused at {url} — is a herald server running there?")
        );
    }

    #[tokio::test]
    async fn an_unknown_host_names_the_host() {
        let e = connect_error("http://nosuch.invalid:8753/mcp", false).await;
        assert!(e.starts_with("cannot resolve nosuch.invalid"), "{e}");
        assert!(
            e.contains("check the host name in http://nosuch.invalid:8753/mcp"),
            "{e}"
        );
        no_internals(&e);
    }

    #[tokio::test]
    async fn a_404_names_the_path_herald_serves() {
        let addr = answering(
            "HTTP/1.1 404 Not Found\r\ncontent-length: 9\r\nconnection: close\r\n\r\nnot found",
        )
        .await;
        let e = connect_error(&format!("http://{addr}/wrong"), false).await;
        assert_eq!(
            e,
            format!(
                "nothing at http://{addr}/wrong (HTTP 404) — wrong path? herald serves MCP at \
                 /mcp: try http://{addr}/mcp"
            )
        );
        // The path was /mcp already (an admin address, say): no "try" of the same URL.
        let e = connect_error(&format!("http://{addr}/mcp"), false).await;
        assert!(e.contains("is that port a herald MCP address?"), "{e}");
        assert!(!e.contains("try http"), "{e}");
    }

    #[tokio::test]
    async fn a_401_says_which_token_to_set() {
        let addr = answering(
            "HTTP/1.1 401 Unauthorized\r\nwww-authenticate: Bearer realm=\"herald\"\r\n\
             content-length: 0\r\nconnection: close\r\n\r\n",
        )
        .await;
        let url = format!("http://{addr}/mcp");
        let e = connect_error(&url, false).await;
        assert!(
            e.starts_with(&format!("{url} needs a token (HTTP 401)")),
            "{e}"
        );
        assert!(e.contains("HERALD_TOKEN"), "{e}");
        let e = connect_error(&url, true).await;
        assert!(
            e.starts_with(&format!("{url} refused the token (HTTP 401)")),
            "{e}"
        );
        assert!(!e.contains("t0ken"), "never the token: {e}");
    }

    #[tokio::test]
    async fn a_403_passes_on_the_servers_reason() {
        let addr = answering(
            "HTTP/1.1 403 Forbidden\r\ncontent-length: 37\r\nconnection: close\r\n\r\n\
             Forbidden: Host header is not allowed",
        )
        .await;
        let e = connect_error(&format!("http://{addr}/mcp"), false).await;
        assert!(
            e.contains("(HTTP 403: Forbidden: Host header is not allowed)"),
            "{e}"
        );
        assert!(e.contains("--allowed-host"), "{e}");
    }

    #[tokio::test]
    async fn a_server_that_is_not_mcp_says_what_it_answered() {
        let addr = answering(
            "HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: 5\r\n\
             connection: close\r\n\r\nhello",
        )
        .await;
        let e = connect_error(&format!("http://{addr}/mcp"), false).await;
        assert_eq!(
            e,
            format!(
                "http://{addr}/mcp is not an MCP endpoint: it answered text/html, not JSON or an \
                 event stream — check the URL (herald serves /mcp)"
            )
        );
        let addr = answering("SSH-2.0-OpenSSH_9.6\r\n").await;
        let e = connect_error(&format!("http://{addr}/mcp"), false).await;
        assert!(e.contains("does not answer in HTTP"), "{e}");
    }

    #[tokio::test]
    async fn https_to_a_plain_http_port_suggests_http() {
        let addr = answering("HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n").await;
        let e = connect_error(&format!("https://{addr}/mcp"), false).await;
        assert_eq!(
            e,
            format!(
                "https://{addr}/mcp does not answer TLS — is it plain HTTP? try http://{addr}/mcp"
            )
        );
    }

    #[tokio::test]
    async fn a_server_error_points_at_its_log() {
        let addr = answering(
            "HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
        )
        .await;
        let e = connect_error(&format!("http://{addr}/mcp"), false).await;
        assert_eq!(
            e,
            format!("http://{addr}/mcp failed with HTTP 503 — see the server's log")
        );
    }

    #[test]
    fn a_url_without_a_scheme_is_told_to_add_http() {
        assert_eq!(
            check_http_url("127.0.0.1:8753/mcp").unwrap_err(),
            "127.0.0.1:8753/mcp is not a URL: it needs http:// (or https://) in front: \
             http://127.0.0.1:8753/mcp"
        );
        // `localhost:8753/mcp` parses as a URL of scheme `localhost`.
        assert!(
            check_http_url("localhost:8753/mcp")
                .unwrap_err()
                .ends_with("http://localhost:8753/mcp")
        );
        assert!(
            check_http_url("quic://h:1")
                .unwrap_err()
                .contains("not quic://")
        );
        // No query (it may hold a key) in the message.
        assert!(
            !check_http_url("h:1/mcp?key=s3cret")
                .unwrap_err()
                .contains("s3cret")
        );
        assert!(check_http_url("http://127.0.0.1:8753/mcp").is_ok());
        assert!(check_http_url("https://h.example/mcp").is_ok());
    }

    #[test]
    fn durations_read_as_people_write_them() {
        assert_eq!(secs(Duration::from_secs(5)), "5 s");
        assert_eq!(secs(Duration::from_millis(1500)), "1.5 s");
        assert_eq!(secs(Duration::from_millis(200)), "200 ms");
    }

    #[test]
    fn a_stdio_command_is_named_without_its_arguments() {
        let t = Target::Stdio("npx server --api-key s3cret".into());
        assert_eq!(
            request(&t, &rmcp::ServiceError::TransportClosed),
            "`npx …` closed its output (did it exit? its messages are above); run it by hand to \
             see why"
        );
    }
}
