//! Socket Mode: one WebSocket to Slack, opened with `apps.connections.open`, that delivers
//! every event as an envelope.
//!
//! - Each connection's reader is its own task: it acks an envelope the moment it arrives
//!   (before processing it, well within Slack's 3 s), then hands a message event to
//!   [`Core::ingest_event`]; redeliveries (`retry_attempt` > 0) are counted and deduped by
//!   the buffer on `channel:ts`.
//! - The supervisor holds the live connection and reacts to what readers report: `hello`
//!   (connected; the backfill scheduler is woken), `disconnect` with `refresh_requested` or
//!   `warning` (a new connection is opened and says hello *before* the old one is closed, so
//!   nothing is missed between them), `link_disabled` (stop, and say so in status), and a
//!   dropped socket (reconnect after a jittered backoff).

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;

use super::api::Token;
use super::core::{Core, SocketState, at};
use crate::mcp::ring::now_ms;
use crate::runtime::backoff::Backoff;

/// Reconnect pacing: 1 s doubling to 60 s, reset by a connection that stayed up 30 s.
const RECONNECT: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(60))
    .reset_after(Duration::from_secs(30));
/// Longest a new connection may take to say hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(15);
/// A connection silent this long gets a ping (Slack's SDKs wait 30 s too)…
pub const DEFAULT_IDLE: Duration = Duration::from_secs(30);
/// …and one still silent this much later is taken for dead: no RST ever comes from a
/// dropped NAT entry or a host that slept.
const PONG_WAIT: Duration = Duration::from_secs(10);
/// Longest a close handshake (and the drain before it) may take.
const CLOSE_WAIT: Duration = Duration::from_secs(1);
/// A replaced socket quiet this long has nothing more to deliver.
const DRAIN_QUIET: Duration = Duration::from_millis(100);
/// Slack's answers that no retry fixes: a person must change the token.
const AUTH_ERRORS: [&str; 5] = [
    "invalid_auth",
    "not_authed",
    "token_revoked",
    "account_inactive",
    "not_allowed_token_type",
];
/// Largest Socket Mode frame accepted.
const MAX_FRAME: usize = 4 << 20;

/// What a connection's reader reports to the supervisor.
#[derive(Debug)]
enum Signal {
    Hello(u64),
    Disconnect(u64, String),
    Closed(u64, Option<String>),
}

/// One open connection: its id, the token that closes it, and its reader.
struct Conn {
    id: u64,
    close: CancellationToken,
    reader: Option<tokio::task::JoinHandle<()>>,
}

impl Conn {
    /// Closes it and waits for its reader to finish the close (bounded): on NATS the next
    /// lease holder opens its socket only after this one is gone.
    async fn close(mut self) {
        self.close.cancel();
        if let Some(mut r) = self.reader.take()
            && tokio::time::timeout(CLOSE_WAIT * 3, &mut r).await.is_err()
        {
            // A reader that will not finish its close takes nothing more in.
            r.abort();
        }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.close.cancel();
    }
}

fn set_state(core: &Core, state: SocketState) {
    core.status().state = state;
}

fn set_error(core: &Core, error: String) {
    tracing::warn!(%error, "slack socket");
    core.status().last_socket_error = Some(error);
}

/// Why a connect failed, and whether only a person can fix it.
struct OpenError {
    message: String,
    auth: bool,
}

impl From<String> for OpenError {
    fn from(message: String) -> OpenError {
        OpenError {
            message,
            auth: false,
        }
    }
}

impl From<super::api::ApiError> for OpenError {
    fn from(e: super::api::ApiError) -> OpenError {
        let auth = e.slack_error().is_some_and(|c| AUTH_ERRORS.contains(&c));
        let message = if auth {
            format!("{e}: check SLACK_APP_TOKEN and SLACK_BOT_TOKEN (retrying every minute)")
        } else {
            e.to_string()
        };
        OpenError { message, auth }
    }
}

/// `d` scaled by a random factor in [0.5, 1.0), so that many hosts do not reconnect in step.
fn jitter(d: Duration) -> Duration {
    use ring::rand::{SecureRandom, SystemRandom};
    let mut b = [0u8; 2];
    let r = SystemRandom::new()
        .fill(&mut b)
        .map(|_| u16::from_le_bytes(b))
        .unwrap_or(u16::MAX / 2);
    d.mul_f64(0.5 + f64::from(r) / f64::from(u16::MAX) / 2.0)
}

/// The TLS settings for `wss://`: herald's ring provider, the system's roots.
fn tls() -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_native_certs::load_native_certs().certs {
        let _ = roots.add(cert);
    }
    if roots.is_empty() {
        tracing::warn!(
            "no CA certificates found in the system store: wss:// to Slack will fail; install ca-certificates"
        );
    }
    let cfg = rustls::ClientConfig::builder_with_provider(crate::transport::tls::provider())
        .with_safe_default_protocol_versions()
        .map(|b| b.with_root_certificates(roots).with_no_client_auth())
        .unwrap_or_else(|e| {
            tracing::warn!(error = %e, "cannot set up TLS for Slack's WebSocket");
            rustls::ClientConfig::builder()
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth()
        });
    Arc::new(cfg)
}

/// Runs Socket Mode until `stop` (shutdown, or on NATS the lease lost) or `link_disabled`;
/// returns once the socket is closed.
pub async fn run(core: Arc<Core>, stop: CancellationToken) {
    let shutdown = stop;
    let (tx, mut rx) = mpsc::channel::<Signal>(64);
    let mut backoff = RECONNECT;
    let mut next_id = 0u64;
    let mut live: Option<Conn> = None;
    let mut up_since: Option<Instant> = None;
    // Set while the live connection has not said hello yet.
    let mut hello_by: Option<tokio::time::Instant> = None;
    loop {
        if live.is_none() {
            let ever = core.status().sockets_opened > 0;
            set_state(
                &core,
                if ever {
                    SocketState::Reconnecting
                } else {
                    SocketState::Connecting
                },
            );
            next_id += 1;
            let opened = tokio::select! {
                _ = shutdown.cancelled() => break,
                r = open(&core, next_id, tx.clone(), &shutdown) => r,
            };
            match opened {
                Ok(conn) => {
                    live = Some(conn);
                    hello_by = Some(tokio::time::Instant::now() + HELLO_TIMEOUT);
                }
                Err(e) => {
                    set_error(&core, e.message);
                    if e.auth {
                        set_state(&core, SocketState::AuthFailed);
                    }
                    let delay = jitter(backoff.next_delay());
                    tokio::select! {
                        _ = shutdown.cancelled() => break,
                        _ = tokio::time::sleep(delay) => {}
                    }
                    continue;
                }
            }
        }
        let no_hello = async {
            match hello_by {
                Some(t) => tokio::time::sleep_until(t).await,
                None => std::future::pending().await,
            }
        };
        let signal = tokio::select! {
            _ = shutdown.cancelled() => break,
            s = rx.recv() => s,
            _ = no_hello => {
                set_error(&core, format!("Slack's socket said no hello within {} s", HELLO_TIMEOUT.as_secs()));
                live = None;
                hello_by = None;
                pause(&core, &mut backoff, &mut up_since, &shutdown).await;
                continue;
            }
        };
        let Some(signal) = signal else { break };
        let live_id = live.as_ref().map(|c| c.id);
        match signal {
            Signal::Hello(id) if Some(id) == live_id => {
                hello_by = None;
                connected(&core);
                up_since = Some(Instant::now());
            }
            Signal::Disconnect(id, reason) if Some(id) == live_id => match reason.as_str() {
                "link_disabled" => {
                    set_error(
                        &core,
                        "Slack disabled this app's Socket Mode link (link_disabled); not reconnecting until herald is restarted".into(),
                    );
                    set_state(&core, SocketState::LinkDisabled);
                    if let Some(c) = live.take() {
                        c.close().await;
                    }
                    return;
                }
                "refresh_requested" | "warning" => {
                    next_id += 1;
                    let swap = tokio::select! {
                        _ = shutdown.cancelled() => break,
                        r = replace(&core, next_id, &tx, &mut rx, &shutdown) => r,
                    };
                    match swap {
                        Ok(new) => {
                            tracing::info!(%reason, "slack socket refreshed: the new one is live, the old one closed");
                            live = Some(new);
                            connected(&core);
                        }
                        // Its reports may have been consumed while waiting: start over with
                        // a fresh connection (whose hello backfills whatever was missed).
                        Err(e) => {
                            set_error(&core, format!("refresh after {reason} failed: {e}"));
                            live = None;
                            pause(&core, &mut backoff, &mut up_since, &shutdown).await;
                        }
                    }
                }
                other => {
                    set_error(&core, format!("Slack closed the socket ({other})"));
                    live = None;
                    pause(&core, &mut backoff, &mut up_since, &shutdown).await;
                }
            },
            Signal::Closed(id, error) if Some(id) == live_id => {
                set_error(
                    &core,
                    error.unwrap_or_else(|| "the socket closed".to_owned()),
                );
                live = None;
                pause(&core, &mut backoff, &mut up_since, &shutdown).await;
            }
            // From a connection already replaced.
            _ => {}
        }
    }
    if let Some(c) = live.take() {
        c.close().await;
    }
    if core.status().state != SocketState::LinkDisabled {
        set_state(&core, SocketState::Stopped);
    }
}

fn connected(core: &Core) {
    let mut s = core.status();
    s.state = SocketState::Connected;
    s.socket_opened_at = Some(at(now_ms()));
    s.sockets_opened += 1;
    drop(s);
    core.hello.notify_one();
}

/// Waits the backoff after a dropped connection (a healthy one resets it).
async fn pause(
    core: &Core,
    backoff: &mut Backoff,
    up_since: &mut Option<Instant>,
    shutdown: &CancellationToken,
) {
    set_state(core, SocketState::Reconnecting);
    if let Some(t) = up_since.take() {
        backoff.ran_for(t.elapsed());
    }
    let delay = jitter(backoff.next_delay());
    tokio::select! {
        _ = shutdown.cancelled() => {}
        _ = tokio::time::sleep(delay) => {}
    }
}

/// Opens connection `id` and waits for its hello; the caller closes the old one after.
async fn replace(
    core: &Arc<Core>,
    id: u64,
    tx: &mpsc::Sender<Signal>,
    rx: &mut mpsc::Receiver<Signal>,
    stop: &CancellationToken,
) -> Result<Conn, String> {
    let conn = open(core, id, tx.clone(), stop)
        .await
        .map_err(|e| e.message)?;
    let deadline = tokio::time::Instant::now() + HELLO_TIMEOUT;
    loop {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Err(_) => return Err("the new socket said no hello".into()),
            Ok(None) => return Err("stopped".into()),
            Ok(Some(Signal::Hello(i))) if i == id => return Ok(conn),
            Ok(Some(Signal::Closed(i, e))) if i == id => {
                return Err(e.unwrap_or_else(|| "the new socket closed".into()));
            }
            // The old socket's own reports: it is being replaced anyway.
            Ok(Some(_)) => {}
        }
    }
}

/// `apps.connections.open`, then the WebSocket; its reader runs on the role's context.
async fn open(
    core: &Arc<Core>,
    id: u64,
    tx: mpsc::Sender<Signal>,
    stop: &CancellationToken,
) -> Result<Conn, OpenError> {
    core.identify().await?;
    let v = core
        .api
        .call("apps.connections.open", Token::App, &[])
        .await?;
    let url = v
        .get("url")
        .and_then(Value::as_str)
        .ok_or_else(|| "apps.connections.open answered no url".to_owned())?;
    let config = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
        .max_message_size(Some(MAX_FRAME))
        .max_frame_size(Some(MAX_FRAME));
    let connector = url
        .starts_with("wss:")
        .then(|| tokio_tungstenite::Connector::Rustls(tls()));
    let (ws, _) = tokio::time::timeout(HELLO_TIMEOUT, async {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        let request = url.into_client_request()?;
        let uri = request.uri();
        let host = uri.host().unwrap_or_default().to_owned();
        let port = uri
            .port_u16()
            .unwrap_or(if uri.scheme_str() == Some("wss") {
                443
            } else {
                80
            });
        // The host is resolved in Rust (transport::dns), not through glibc's NSS.
        let stream = crate::transport::dns::connect_tcp(&host, port).await?;
        tokio_tungstenite::client_async_tls_with_config(request, stream, Some(config), connector)
            .await
    })
    .await
    .map_err(|_| "the Socket Mode WebSocket did not open in time".to_owned())?
    // The URL carries a one-time ticket: name the host only.
    .map_err(|e| format!("cannot open the Socket Mode WebSocket: {e}"))?;
    let close = stop.child_token();
    let reader = core.ctx.spawn(
        "slack socket",
        read(core.clone(), id, ws, tx, close.clone()),
    );
    Ok(Conn {
        id,
        close,
        reader: Some(reader),
    })
}

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// One connection's reader: acks, ingests, reports; pings a connection that went quiet and
/// gives up on one that stays quiet.
async fn read(
    core: Arc<Core>,
    id: u64,
    mut ws: Ws,
    tx: mpsc::Sender<Signal>,
    close: CancellationToken,
) {
    let idle = core.socket_idle;
    let pong_wait = PONG_WAIT.min(idle);
    let mut heard = tokio::time::Instant::now();
    let mut pinged = false;
    let error = loop {
        let quiet_until = heard + if pinged { idle + pong_wait } else { idle };
        let frame = tokio::select! {
            // A frame already here is read before a close is noticed.
            biased;
            f = ws.next() => f,
            _ = close.cancelled() => {
                drain(&core, &mut ws).await;
                let _ = tokio::time::timeout(CLOSE_WAIT, ws.close(None)).await;
                return;
            }
            _ = tokio::time::sleep_until(quiet_until) => {
                if pinged {
                    break Some(format!(
                        "nothing from Slack for {:.1} s, not even a pong: the connection is dead",
                        (idle + pong_wait).as_secs_f64()
                    ));
                }
                pinged = true;
                if let Err(e) = ws.send(Message::Ping(Default::default())).await {
                    break Some(format!("the socket failed: {e}"));
                }
                continue;
            }
        };
        heard = tokio::time::Instant::now();
        pinged = false;
        let text = match frame {
            None => break None,
            Some(Err(e)) => break Some(format!("the socket failed: {e}")),
            Some(Ok(Message::Text(t))) => t,
            Some(Ok(Message::Close(c))) => {
                // Sends tungstenite's queued close reply.
                let _ = tokio::time::timeout(CLOSE_WAIT, ws.flush()).await;
                break c.map(|c| format!("Slack closed the socket ({} {})", c.code, c.reason));
            }
            // tungstenite queues the pong; flushing sends it.
            Some(Ok(Message::Ping(_))) => {
                if let Err(e) = ws.flush().await {
                    break Some(format!("the socket failed: {e}"));
                }
                continue;
            }
            Some(Ok(_)) => continue,
        };
        let Ok(v) = serde_json::from_str::<Value>(text.as_str()) else {
            tracing::debug!("slack sent a frame that is not JSON; ignored");
            continue;
        };
        if let Some(envelope) = v.get("envelope_id").and_then(Value::as_str) {
            // Ack first, then process: Slack redelivers what is not acked within 3 s.
            let ack = json!({ "envelope_id": envelope }).to_string();
            if let Err(e) = ws.send(Message::text(ack)).await {
                break Some(format!("cannot ack an envelope: {e}"));
            }
            envelope_received(&core, &v);
            continue;
        }
        let signal = match v.get("type").and_then(Value::as_str) {
            Some("hello") => Signal::Hello(id),
            Some("disconnect") => Signal::Disconnect(
                id,
                v.get("reason")
                    .and_then(Value::as_str)
                    .unwrap_or("unknown")
                    .to_owned(),
            ),
            _ => continue,
        };
        if tx.send(signal).await.is_err() {
            return;
        }
    };
    let _ = tx.send(Signal::Closed(id, error)).await;
}

/// Before a replaced socket closes: acks and takes whatever Slack still sends on it, until it
/// has been quiet for [`DRAIN_QUIET`] (at most [`CLOSE_WAIT`]), so an event Slack handed to
/// the old socket during a refresh is neither lost nor left to a redelivery.
async fn drain(core: &Core, ws: &mut Ws) {
    let deadline = tokio::time::Instant::now() + CLOSE_WAIT;
    loop {
        let quiet = (tokio::time::Instant::now() + DRAIN_QUIET).min(deadline);
        let Ok(Some(Ok(frame))) = tokio::time::timeout_at(quiet, ws.next()).await else {
            return;
        };
        let Message::Text(t) = frame else { continue };
        let Ok(v) = serde_json::from_str::<Value>(t.as_str()) else {
            continue;
        };
        if let Some(envelope) = v.get("envelope_id").and_then(Value::as_str) {
            let ack = json!({ "envelope_id": envelope }).to_string();
            if ws.send(Message::text(ack)).await.is_err() {
                return;
            }
            envelope_received(core, &v);
        }
    }
}

fn envelope_received(core: &Core, v: &Value) {
    {
        let mut s = core.status();
        s.envelopes_received += 1;
        if v.get("retry_attempt").and_then(Value::as_u64).unwrap_or(0) > 0 {
            s.redeliveries += 1;
        }
    }
    if v.get("type").and_then(Value::as_str) != Some("events_api") {
        return;
    }
    if let Some(event) = v.pointer("/payload/event")
        && event.get("type").and_then(Value::as_str) == Some("message")
    {
        core.ingest_event(event);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_within_half_to_whole() {
        for _ in 0..100 {
            let d = jitter(Duration::from_secs(10));
            assert!(
                d >= Duration::from_secs(5) && d <= Duration::from_secs(10),
                "{d:?}"
            );
        }
    }
}
