//! A connection's deadlines once hyper serves it: the idle and header timers ([`Activity`]),
//! the request body's deadline ([`TimedBody`]) and the `408` it earns
//! ([`body_timeout_response`]).
//!
//! Why herald's own timers rather than hyper's `header_read_timeout`: in hyper 1.x that one
//! timer starts when a connection goes idle (at its start, and again when a response is done,
//! `State::idle` in `proto/h1/conn.rs`) and stops when a whole head is read, so it is the idle
//! timeout and the header timeout in one, with one length. herald gives them two lengths: a
//! keep-alive connection may wait longer for its next request (a pooling client reuses it)
//! than a client that began a request may take to finish its head. Neither timer runs while
//! a request is in flight, from its head until its response body is done, so a listen
//! stream is never cut, however quiet; its body has its own deadline instead.

use crate::sync::Recover;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{StatusCode, header};
use axum::response::Response;
use hyper::body::{Body as HttpBody, Frame, SizeHint};
use tokio::time::Instant;

/// Default for [`Timeouts::idle`] (`--http-idle-timeout-ms`). A minute: long enough that a
/// client's pool keeps its connections between bursts (herald's own upstream client closes
/// idle ones after 4 s, browsers and most HTTP clients after 15 s to 90 s, and a client
/// should be the one to close, so its next request never races a close), short enough that
/// a thousand abandoned connections are gone within the minute.
pub const DEFAULT_IDLE_TIMEOUT_MS: u64 = 60_000;
/// Default for [`Timeouts::header`] (`--http-header-timeout-ms`): hyper's own default, ample
/// for a head of at most a few KiB on any link that can carry MCP at all.
pub const DEFAULT_HEADER_TIMEOUT_MS: u64 = 30_000;
/// Default for [`Timeouts::body`] (`--http-body-timeout-ms`): a body at the 4 MiB message
/// limit arrives in time at about 140 KB/s.
pub const DEFAULT_BODY_TIMEOUT_MS: u64 = 30_000;

/// How long an HTTP connection may take over each part of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// With no request in flight and no byte of the next one: the connection is closed.
    pub idle: Duration,
    /// From a request's first byte to the end of its head: the connection is closed.
    pub header: Duration,
    /// From the end of a request's head to the end of its body: `408`, and the connection
    /// is closed.
    pub body: Duration,
}

impl Default for Timeouts {
    fn default() -> Timeouts {
        Timeouts {
            idle: Duration::from_millis(DEFAULT_IDLE_TIMEOUT_MS),
            header: Duration::from_millis(DEFAULT_HEADER_TIMEOUT_MS),
            body: Duration::from_millis(DEFAULT_BODY_TIMEOUT_MS),
        }
    }
}

/// Why a connection's timer closed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Expired {
    /// No request came within the idle timeout.
    Idle,
    /// A request's head was begun and not finished within the header timeout.
    Head,
}

impl std::fmt::Display for Expired {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Expired::Idle => "idle for the idle timeout",
            Expired::Head => "a request head not finished within the header timeout",
        })
    }
}

/// What one connection is doing, as its timers see it: told by the socket when bytes
/// arrive ([`Activity::read`]) and by the service when a request begins and its response
/// ends ([`Activity::busy`]).
pub(super) struct Activity {
    state: Mutex<State>,
    changed: tokio::sync::Notify,
}

struct State {
    /// Requests in flight: from the head read to the response body dropped.
    busy: usize,
    /// When the connection last had no request in flight (or was handed to hyper).
    idle_since: Instant,
    /// When the next request's first byte arrived, since then.
    begun: Option<Instant>,
}

impl State {
    /// The deadline the connection is under, and what passing it means; none while a
    /// request is in flight.
    fn deadline(&self, t: Timeouts) -> Option<(Instant, Expired)> {
        if self.busy > 0 {
            return None;
        }
        Some(match self.begun {
            Some(begun) => (begun + t.header, Expired::Head),
            None => (self.idle_since + t.idle, Expired::Idle),
        })
    }
}

impl Activity {
    /// A connection handed to hyper now, with the first bytes of a request already read
    /// (`begun`) or none.
    pub(super) fn new(begun: bool) -> Arc<Activity> {
        let now = Instant::now();
        Arc::new(Activity {
            state: Mutex::new(State {
                busy: 0,
                idle_since: now,
                begun: begun.then_some(now),
            }),
            changed: tokio::sync::Notify::new(),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.locked()
    }

    /// Bytes arrived on the socket. With no request in flight they begin the next one's head,
    /// which puts the connection under the header timeout. (Bytes read while a request is in
    /// flight are the next request pipelined; when its head is still partial once the
    /// connection goes idle, the idle timeout bounds it instead.)
    pub(super) fn read(&self) {
        let mut s = self.state();
        if s.busy == 0 && s.begun.is_none() {
            s.begun = Some(Instant::now());
            drop(s);
            self.changed.notify_one();
        }
    }

    /// A request's head was read: no timer runs until the returned guard is dropped (with
    /// the response body, once it is written or abandoned).
    pub(super) fn busy(self: &Arc<Self>) -> Busy {
        self.state().busy += 1;
        self.changed.notify_one();
        Busy(self.clone())
    }

    /// Resolves when the connection has passed its deadline: idle too long, or a head begun
    /// and not finished in time. Never while a request is in flight.
    pub(super) async fn expired(&self, t: Timeouts) -> Expired {
        loop {
            // `notify_one` keeps a permit when nobody waits, so a change between reading
            // the state and waiting is never missed.
            let deadline = self.state().deadline(t);
            match deadline {
                None => self.changed.notified().await,
                Some((at, why)) => {
                    tokio::select! {
                        () = tokio::time::sleep_until(at) => {
                            let now = Instant::now();
                            if self.state().deadline(t).is_some_and(|(at, _)| at <= now) {
                                return why;
                            }
                        }
                        () = self.changed.notified() => {}
                    }
                }
            }
        }
    }
}

/// A request in flight on a connection; dropping it makes the connection idle again when it
/// was the last.
pub(super) struct Busy(Arc<Activity>);

impl Drop for Busy {
    fn drop(&mut self) {
        let mut s = self.0.state();
        s.busy -= 1;
        if s.busy == 0 {
            s.idle_since = Instant::now();
            s.begun = None;
        }
        drop(s);
        self.0.changed.notify_one();
    }
}

/// A response body that keeps its request counted as in flight until hyper drops it.
pub(super) struct Guarded {
    body: Body,
    _busy: Busy,
}

impl Guarded {
    pub(super) fn new(body: Body, busy: Busy) -> Guarded {
        Guarded { body, _busy: busy }
    }
}

impl HttpBody for Guarded {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The error a [`TimedBody`] ends with when its deadline passes.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within {0:?}")]
pub(super) struct BodyTimedOut(Duration);

/// A request body that must arrive whole by a deadline; past it, reading it fails and the
/// flag returned with it is set, so the response can be made a `408`.
pub(super) struct TimedBody<B> {
    inner: B,
    deadline: Instant,
    timeout: Duration,
    /// Armed on the first read that has to wait (a body already whole costs no timer).
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    late: Arc<AtomicBool>,
    done: bool,
}

impl<B> TimedBody<B> {
    /// `inner`, due whole within `timeout` from now; and the flag set when it was not.
    pub(super) fn new(inner: B, timeout: Duration) -> (TimedBody<B>, Arc<AtomicBool>) {
        let late = Arc::new(AtomicBool::new(false));
        let body = TimedBody {
            inner,
            deadline: Instant::now() + timeout,
            timeout,
            sleep: None,
            late: late.clone(),
            done: false,
        };
        (body, late)
    }
}

impl<B> HttpBody for TimedBody<B>
where
    B: HttpBody<Data = Bytes> + Unpin,
    B::Error: Into<axum::BoxError>,
{
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::BoxError>>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(None) => {
                this.done = true;
                this.sleep = None;
                Poll::Ready(None)
            }
            Poll::Ready(Some(frame)) => Poll::Ready(Some(frame.map_err(Into::into))),
            Poll::Pending => {
                let deadline = this.deadline;
                let sleep = this
                    .sleep
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                this.done = true;
                this.late.store(true, Ordering::Relaxed);
                Poll::Ready(Some(Err(Box::new(BodyTimedOut(this.timeout)))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// What a client whose body did not arrive in time is told.
fn body_timeout_message(timeout: Duration) -> String {
    format!(
        "the request body did not arrive within {} ms (--http-body-timeout-ms); send the whole body at once",
        timeout.as_millis()
    )
}

/// The JSON-RPC error a late body is answered with.
fn body_timeout_json(timeout: Duration) -> String {
    serde_json::json!({"jsonrpc": "2.0", "id": null,
        "error": {"code": -32600, "message": body_timeout_message(timeout)}})
    .to_string()
}

/// `408` for a request whose body did not arrive within `timeout`, closing the connection
/// (the rest of the body may still come, and nothing could tell it from the next request).
pub(super) fn body_timeout_response(timeout: Duration) -> Response {
    Response::builder()
        .status(StatusCode::REQUEST_TIMEOUT)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CONNECTION, "close")
        .body(Body::from(body_timeout_json(timeout)))
        .expect("a valid response")
}

/// [`body_timeout_response`] as bytes on the wire, for a body read ahead of hyper.
pub(super) fn body_timeout_bytes(timeout: Duration) -> Vec<u8> {
    let body = body_timeout_json(timeout);
    format!(
        "HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n\
         content-length: {}\r\ndate: {}\r\n\r\n{body}",
        body.len(),
        httpdate::fmt_http_date(std::time::SystemTime::now())
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Timeouts = Timeouts {
        idle: Duration::from_secs(60),
        header: Duration::from_secs(30),
        body: Duration::from_secs(30),
    };

    /// A connection with nothing sent is closed after the idle timeout; one whose head has
    /// begun after the header timeout from its first byte.
    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_expires_after_the_idle_timeout_and_a_begun_head_after_the_header_timeout()
     {
        let start = Instant::now();
        let a = Activity::new(false);
        assert_eq!(a.expired(T).await, Expired::Idle);
        assert_eq!(start.elapsed(), T.idle);

        let start = Instant::now();
        let a = Activity::new(false);
        let reader = a.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(50)).await;
            reader.read();
        });
        assert_eq!(a.expired(T).await, Expired::Head);
        assert_eq!(start.elapsed(), Duration::from_secs(50) + T.header);
    }

    /// No timer runs while a request is in flight, however long (a listen stream); the idle
    /// timeout starts again when its response is done.
    #[tokio::test(start_paused = true)]
    async fn a_request_in_flight_is_never_expired_and_idle_starts_when_it_ends() {
        let a = Activity::new(true);
        let busy = a.busy();
        let expired = {
            let a = a.clone();
            tokio::spawn(async move { a.expired(T).await })
        };
        tokio::time::sleep(Duration::from_secs(24 * 3600)).await;
        // Bytes pipelined meanwhile start no header timer.
        a.read();
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert!(
            !expired.is_finished(),
            "a request in flight is never expired"
        );
        let ended = Instant::now();
        drop(busy);
        assert_eq!(expired.await.unwrap(), Expired::Idle);
        assert_eq!(ended.elapsed(), T.idle);
    }

    /// A body that stops arriving fails at its deadline and sets the flag; one that arrives
    /// whole does not.
    #[tokio::test(start_paused = true)]
    async fn a_body_that_does_not_arrive_in_time_fails_at_its_deadline() {
        use bodies::collect;
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(1);
        tx.send(Ok(Frame::data(Bytes::from_static(b"{\"jsonrpc\""))))
            .await
            .unwrap();
        let start = Instant::now();
        let (body, late) = TimedBody::new(Body::new(bodies::Channel(rx)), Duration::from_secs(30));
        let err = collect(body).await.expect_err("the body never ends");
        assert!(err.to_string().contains("did not arrive"), "{err}");
        assert!(late.load(Ordering::Relaxed));
        assert_eq!(start.elapsed(), Duration::from_secs(30));
        drop(tx);

        let (body, late) = TimedBody::new(Body::from("{}"), Duration::from_secs(30));
        assert_eq!(collect(body).await.unwrap(), b"{}".as_slice());
        assert!(!late.load(Ordering::Relaxed));
    }

    /// Just enough of a body channel and a collector for the tests, without another crate.
    mod bodies {
        use super::*;

        pub struct Channel(pub tokio::sync::mpsc::Receiver<Result<Frame<Bytes>, std::io::Error>>);

        impl HttpBody for Channel {
            type Data = Bytes;
            type Error = std::io::Error;

            fn poll_frame(
                mut self: Pin<&mut Self>,
                cx: &mut Context<'_>,
            ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
                self.0.poll_recv(cx)
            }
        }

        pub async fn collect<B>(body: B) -> Result<Vec<u8>, axum::BoxError>
        where
            B: HttpBody<Data = Bytes, Error = axum::BoxError> + Unpin,
        {
            let mut body = body;
            let mut out = Vec::new();
            while let Some(frame) =
                std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await
            {
                if let Ok(data) = frame?.into_data() {
                    out.extend_from_slice(&data);
                }
            }
            Ok(out)
        }
    }
}
