//! Legacy (2025-11-25) HTTP sessions: who opened each, and whether its client is still there.
//!
//! rmcp's session manager keeps a session while anything passes through it, the server's own
//! notifications included: a client that vanished while its subscribed resources kept
//! changing kept its session (and its watches) until restart, and a quiet live one was dropped
//! after five minutes. So rmcp's keep-alive is off and [`Sessions`] decides instead:
//! - **Liveness** is the client's own: a session lives while a response stream of its is open
//!   (its GET stream, a call answered as a stream) and for `--session-idle-timeout-ms` after
//!   its last request or its last stream closing. Then it is closed, and its watches with it.
//! - **Ownership**: a session belongs to the caller that opened it (its principal: an access
//!   token's issuer and subject, a static token's digest, else the peer's address). Anyone
//!   else naming it gets rmcp's own answer for an unknown session, so a session id learnt
//!   elsewhere neither works nor tells whether it exists.
//!
//! The reaper sleeps until the earliest session could expire, or until a stream closes; it
//! never wakes to look.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, header};
use axum::middleware::Next;
use axum::response::Response;
use rmcp::transport::streamable_http_server::SessionManager as _;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::MCP_SESSION_ID;
use super::budget::{self, Cidr};
use crate::mcp::caller::{Caller, PeerAddr};
use crate::runtime::metrics::{Gauge, Metrics};
use crate::sync::Recover;

/// Default of `--session-idle-timeout-ms`: rmcp's own keep-alive, counted from the client.
pub const DEFAULT_SESSION_IDLE_MS: u64 = 300_000;
/// Most sessions one owner keeps: a new one past it closes that owner's longest idle one.
pub const MAX_SESSIONS_PER_OWNER: usize = 64;

struct Entry {
    owner: String,
    /// The client's last request, or its last stream closing.
    seen: Instant,
    /// Response streams of the session open now.
    streams: usize,
}

/// The sessions of one HTTP endpoint.
pub struct Sessions {
    manager: Arc<LocalSessionManager>,
    idle: Duration,
    /// The proxies whose `X-Forwarded-For` names a token-less caller's address.
    trusted: Vec<Cidr>,
    /// `herald_http_sessions`: the sessions open now.
    open: Gauge,
    table: Mutex<HashMap<String, Entry>>,
    wake: Notify,
}

/// What the table says of a request naming a session.
#[derive(Debug, PartialEq, Eq)]
enum Known {
    /// Its owner's.
    Mine,
    /// Another caller's: answered as unknown.
    Foreign,
    /// Not one this endpoint opened (or one closed): rmcp answers.
    Unknown,
}

impl Sessions {
    /// Sessions closed after `idle` without their client; the reaper runs until `stop`.
    pub fn start(
        idle: Duration,
        trusted: Vec<Cidr>,
        stop: CancellationToken,
        metrics: &Metrics,
    ) -> Arc<Sessions> {
        let mut manager = LocalSessionManager::default();
        manager.session_config.keep_alive = None;
        let s = Arc::new(Sessions {
            manager: Arc::new(manager),
            idle,
            trusted,
            open: metrics.gauge(
                "herald_http_sessions",
                "legacy (2025-11-25) HTTP sessions open on this process's endpoints",
            ),
            table: Mutex::new(HashMap::new()),
            wake: Notify::new(),
        });
        tokio::spawn(s.clone().reap(stop));
        s
    }

    pub fn manager(&self) -> Arc<LocalSessionManager> {
        self.manager.clone()
    }

    fn opened(&self, id: &str, owner: String) {
        let evicted = {
            let mut t = self.table.locked();
            // Past the cap, the owner's longest idle session makes way (one with a stream
            // open only when every one has).
            let mut evicted = None;
            let theirs = t.values().filter(|e| e.owner == owner).count();
            if theirs >= MAX_SESSIONS_PER_OWNER {
                evicted = t
                    .iter()
                    .filter(|(_, e)| e.owner == owner)
                    .min_by_key(|(_, e)| (e.streams > 0, e.seen))
                    .map(|(k, _)| k.clone());
                if let Some(k) = &evicted {
                    t.remove(k);
                    self.open.sub(1);
                }
            }
            let fresh = Entry {
                owner,
                seen: Instant::now(),
                streams: 0,
            };
            if t.insert(id.to_owned(), fresh).is_none() {
                self.open.add(1);
            }
            evicted
        };
        if let Some(id) = evicted {
            self.close(id);
        }
        self.wake.notify_one();
    }

    /// Closes session `id` in rmcp, on a task of its own (a worker slow to stop holds up
    /// nothing else).
    fn close(&self, id: String) {
        let manager = self.manager.clone();
        tokio::spawn(async move {
            let _ = manager.close_session(&id.as_str().into()).await;
        });
    }

    /// A request of `owner` naming session `id`: counted as its client's traffic if it is
    /// the owner's.
    fn touch(&self, id: &str, owner: &str) -> Known {
        match self.table.locked().get_mut(id) {
            Some(e) if e.owner == owner => {
                e.seen = Instant::now();
                Known::Mine
            }
            Some(_) => Known::Foreign,
            None => Known::Unknown,
        }
    }

    fn stream(self: &Arc<Self>, id: &str) -> Option<StreamGuard> {
        let mut t = self.table.locked();
        let e = t.get_mut(id)?;
        e.streams += 1;
        Some(StreamGuard {
            sessions: self.clone(),
            id: id.to_owned(),
        })
    }

    fn forget(&self, id: &str) {
        if self.table.locked().remove(id).is_some() {
            self.open.sub(1);
        }
    }

    /// Closes every session whose client has been gone for the idle time, sleeping until the
    /// next one could be.
    async fn reap(self: Arc<Self>, stop: CancellationToken) {
        loop {
            let next = {
                let t = self.table.locked();
                t.values()
                    .filter(|e| e.streams == 0)
                    .map(|e| e.seen + self.idle)
                    .min()
            };
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = self.wake.notified() => continue,
                _ = tokio::time::sleep_until(next.unwrap_or_else(Instant::now)), if next.is_some() => {}
            }
            let now = Instant::now();
            let expired: Vec<String> = {
                let mut t = self.table.locked();
                let ids: Vec<String> = t
                    .iter()
                    .filter(|(_, e)| e.streams == 0 && e.seen + self.idle <= now)
                    .map(|(id, _)| id.clone())
                    .collect();
                for id in &ids {
                    t.remove(id);
                }
                self.open.sub(ids.len() as u64);
                ids
            };
            for id in expired {
                tracing::debug!(session = %id, idle_s = self.idle.as_secs_f64(), "closing a session its client left");
                self.close(id);
            }
        }
    }
}

/// One open response stream of a session; dropping it counts the client as seen now.
struct StreamGuard {
    sessions: Arc<Sessions>,
    id: String,
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        if let Some(e) = self.sessions.table.locked().get_mut(&self.id) {
            e.streams = e.streams.saturating_sub(1);
            e.seen = Instant::now();
        }
        self.sessions.wake.notify_one();
    }
}

/// Who a session belongs to: the caller's principal, or for a caller with no token its
/// address (behind a trusted proxy, the client's, as listen budgets count it).
fn owner(parts: &axum::http::request::Parts, trusted: &[Cidr]) -> String {
    let caller = Caller::from_parts(parts);
    match caller.token {
        Some(_) => caller.principal(),
        None => match parts.extensions.get::<PeerAddr>() {
            Some(p) => {
                let ip = budget::client(p.0.ip(), &parts.headers, trusted);
                format!("anonymous@{}", ip.to_canonical())
            }
            None => "anonymous".into(),
        },
    }
}

/// A session id no session has: what a foreign caller's request is handed to rmcp with, so
/// every answer (a 404, a 202 to a DELETE, a 406 or 415 first) is the one an unknown session
/// gets.
fn unknown_id() -> HeaderValue {
    use ring::rand::SecureRandom as _;
    let mut raw = [0u8; 16];
    let _ = ring::rand::SystemRandom::new().fill(&mut raw);
    HeaderValue::from_str(&format!("unknown-{}", hex::encode(raw))).expect("hex is a header")
}

/// The layer in front of rmcp's service: binds each new session to its opener, refuses
/// another caller's use of it as an unknown session, and counts its client's traffic and
/// streams.
pub async fn session_gate(
    State(sessions): State<Arc<Sessions>>,
    req: Request,
    next: Next,
) -> Response {
    let (parts, body) = req.into_parts();
    let owner = owner(&parts, &sessions.trusted);
    let mut req = Request::from_parts(parts, body);
    let id = req
        .headers()
        .get(MCP_SESSION_ID)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let Some(id) = id else {
        let response = next.run(req).await;
        if let Some(id) = response
            .headers()
            .get(MCP_SESSION_ID)
            .and_then(|v| v.to_str().ok())
        {
            sessions.opened(id, owner);
        }
        return response;
    };
    match sessions.touch(&id, &owner) {
        Known::Unknown => next.run(req).await,
        Known::Foreign => {
            req.headers_mut().insert(MCP_SESSION_ID, unknown_id());
            next.run(req).await
        }
        Known::Mine => {
            let delete = req.method() == Method::DELETE;
            let response = next.run(req).await;
            if delete && response.status().is_success() {
                sessions.forget(&id);
                return response;
            }
            let streaming = response
                .headers()
                .get(header::CONTENT_TYPE)
                .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
            match (streaming, sessions.stream(&id)) {
                (true, Some(guard)) => {
                    let (parts, body) = response.into_parts();
                    let body = Body::from_stream(Guarded {
                        inner: body.into_data_stream(),
                        _guard: guard,
                    });
                    Response::from_parts(parts, body)
                }
                _ => response,
            }
        }
    }
}

/// A response body that holds its session's stream count while it is open.
struct Guarded<S> {
    inner: S,
    _guard: StreamGuard,
}

impl<S: futures::Stream + Unpin> futures::Stream for Guarded<S> {
    type Item = S::Item;
    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<S::Item>> {
        std::pin::Pin::new(&mut self.inner).poll_next(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sessions(idle_ms: u64) -> Arc<Sessions> {
        Sessions::start(
            Duration::from_millis(idle_ms),
            Vec::new(),
            CancellationToken::new(),
            &Metrics::default(),
        )
    }

    /// Lets the reaper run at the paused clock's present.
    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_session_lives_on_its_clients_traffic_and_streams_only() {
        let s = sessions(1000);
        s.opened("quiet", "a".into());
        s.opened("busy", "a".into());
        s.opened("streaming", "a".into());
        let guard = s.stream("streaming").expect("a known session");
        settle().await;
        tokio::time::advance(Duration::from_millis(600)).await;
        assert_eq!(s.touch("busy", "a"), Known::Mine);
        tokio::time::advance(Duration::from_millis(600)).await;
        settle().await;
        assert_eq!(s.touch("quiet", "a"), Known::Unknown, "idle past its time");
        assert_eq!(
            s.touch("busy", "a"),
            Known::Mine,
            "its client spoke 600 ms ago"
        );
        tokio::time::advance(Duration::from_millis(5000)).await;
        settle().await;
        assert_eq!(s.touch("busy", "a"), Known::Unknown);
        // An open stream keeps its session however long; closing it starts the idle time.
        assert_eq!(s.touch("streaming", "a"), Known::Mine);
        drop(guard);
        settle().await;
        tokio::time::advance(Duration::from_millis(999)).await;
        settle().await;
        assert_eq!(s.open.get(), 1);
        tokio::time::advance(Duration::from_millis(2)).await;
        settle().await;
        assert_eq!(s.open.get(), 0, "closed a second after its stream");
    }

    #[test]
    fn a_session_is_its_openers_alone() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let s = sessions(60_000);
            s.opened("s", "token:aa".into());
            assert_eq!(s.touch("s", "token:bb"), Known::Foreign);
            assert_eq!(s.touch("s", "anonymous@127.0.0.1"), Known::Foreign);
            assert_eq!(s.touch("s", "token:aa"), Known::Mine);
            assert_eq!(s.touch("other", "token:aa"), Known::Unknown);
            s.forget("s");
            assert_eq!(s.touch("s", "token:aa"), Known::Unknown);
            assert_eq!(s.open.get(), 0);
        });
    }
}
