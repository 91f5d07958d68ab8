//! The cap on a server's open connections (`--max-connections`), shared by the HTTP and QUIC
//! accept loops.
//!
//! At the cap the accept loop stops accepting: new TCP connections wait in the kernel's listen
//! backlog and new QUIC connections in quinn's incoming queue, so clients see a slow connect,
//! never a refusal or a crash, and each is taken in as soon as an open one closes. Reaching
//! the cap is logged once per episode (a `warn` naming the limit and the flag), and its end
//! once (an `info` when the open count is back under 90 % of the cap, so a server that
//! hovers at the cap logs one pair, not one line per connection).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::runtime::metrics::{Counter, Gauge, Metrics};

/// The connection counters of a process's endpoints, registered by the transport in the
/// context's metrics (summed over the process's servers of each kind).
#[derive(Debug, Clone)]
pub struct ConnMetrics {
    pub http: Conns,
    pub quic: Conns,
}

/// One kind of endpoint's connection counters.
#[derive(Debug, Clone)]
pub struct Conns {
    /// Connections accepted (a client that pools its connections opens few; one per request
    /// is a client without keep-alive).
    pub accepted: Counter,
    /// Times an endpoint reached `--max-connections` and stopped accepting (once per
    /// episode, as the log says it).
    pub limit_reached: Counter,
    /// Connections open.
    pub open: Gauge,
}

impl ConnMetrics {
    /// Registers (or finds) the transport's counters in `metrics`.
    pub fn register(metrics: &Metrics) -> ConnMetrics {
        let http_accepted = metrics.counter(
            "herald_http_connections_accepted_total",
            "TCP connections accepted by this process's HTTP endpoints",
        );
        let quic_accepted = metrics.counter(
            "herald_quic_connections_accepted_total",
            "QUIC connections accepted by this process's QUIC endpoints",
        );
        let http_limit = metrics.counter(
            "herald_http_connection_limit_reached_total",
            "times an HTTP endpoint reached --max-connections and stopped accepting",
        );
        let quic_limit = metrics.counter(
            "herald_quic_connection_limit_reached_total",
            "times a QUIC endpoint reached --max-connections and stopped accepting",
        );
        let http_open = metrics.gauge(
            "herald_http_connections_open",
            "TCP connections open on this process's HTTP endpoints",
        );
        let quic_open = metrics.gauge(
            "herald_quic_connections_open",
            "QUIC connections open on this process's QUIC endpoints",
        );
        ConnMetrics {
            http: Conns {
                accepted: http_accepted,
                limit_reached: http_limit,
                open: http_open,
            },
            quic: Conns {
                accepted: quic_accepted,
                limit_reached: quic_limit,
                open: quic_open,
            },
        }
    }
}

/// One server's connection cap.
pub(crate) struct ConnCap {
    permits: Arc<Semaphore>,
    limit: usize,
    /// Whether the cap was reached and the open count has not yet fallen back under
    /// [`ConnCap::low_water`].
    at_limit: AtomicBool,
    /// What is counted, for the log lines ("HTTP", "QUIC").
    what: &'static str,
    /// How often the cap was reached (`/metrics`).
    reached: Counter,
    /// Open connections (`/metrics`, summed over the process's servers).
    open: Gauge,
}

/// A connection's place under the cap, given back when dropped: taken before `accept` (so
/// the loop accepts only with room), counted as an open connection once
/// [`opened`](ConnPermit::opened).
pub(crate) struct ConnPermit {
    cap: Arc<ConnCap>,
    counted: bool,
    _permit: OwnedSemaphorePermit,
}

impl ConnCap {
    /// A cap of `limit` connections (at least one); `reached` counts the episodes and `open`
    /// the connections open.
    pub(crate) fn new(
        limit: usize,
        what: &'static str,
        reached: Counter,
        open: Gauge,
    ) -> Arc<ConnCap> {
        let limit = limit.clamp(1, Semaphore::MAX_PERMITS);
        Arc::new(ConnCap {
            permits: Arc::new(Semaphore::new(limit)),
            limit,
            at_limit: AtomicBool::new(false),
            what,
            reached,
            open,
        })
    }

    /// A place for the next connection: at once when there is one, else after the warning
    /// (once per episode) when an open connection closes. `None` when `shutdown` comes first.
    pub(crate) async fn admit(
        self: &Arc<Self>,
        shutdown: &CancellationToken,
    ) -> Option<ConnPermit> {
        let permit = match self.permits.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                if !self.at_limit.swap(true, Ordering::Relaxed) {
                    self.reached.inc();
                    tracing::warn!(
                        limit = self.limit,
                        "{} connections reached the limit of {} (--max-connections): new \
                         connections wait to be accepted until one closes; raise \
                         --max-connections if the host can take more",
                        self.what,
                        self.limit
                    );
                }
                tokio::select! {
                    () = shutdown.cancelled() => return None,
                    p = self.permits.clone().acquire_owned() => p.expect("the semaphore is never closed"),
                }
            }
        };
        // A connection that closed while the warning was being logged may have missed the
        // recovery; look again with this place counted.
        self.recovered(self.open_now());
        Some(ConnPermit {
            cap: self.clone(),
            counted: false,
            _permit: permit,
        })
    }

    /// Connections open now (places taken).
    fn open_now(&self) -> usize {
        self.limit - self.permits.available_permits()
    }

    /// The open count under which an episode at the cap is over: 90 % of the cap, and at
    /// least one under it.
    fn low_water(&self) -> usize {
        self.limit - (self.limit / 10).max(1)
    }

    /// Ends the episode (with its `info` line) when `open` is back under the low-water mark.
    fn recovered(&self, open: usize) {
        if open <= self.low_water()
            && self.at_limit.load(Ordering::Relaxed)
            && self.at_limit.swap(false, Ordering::Relaxed)
        {
            tracing::info!(
                limit = self.limit,
                open,
                "{} connections are below the limit of {} (--max-connections) again",
                self.what,
                self.limit
            );
        }
    }
}

impl ConnPermit {
    /// The place is a connection's now (for `/metrics`).
    pub(crate) fn opened(mut self) -> ConnPermit {
        self.cap.open.add(1);
        self.counted = true;
        self
    }
}

impl Drop for ConnPermit {
    fn drop(&mut self) {
        if self.counted {
            self.cap.open.sub(1);
        }
        // This place is still taken until the permit drops, after this body.
        self.cap.recovered(self.cap.open_now().saturating_sub(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// At the cap the next connection waits (no place, no error) until one closes; the
    /// episode is counted once however many wait, and ends when the count falls back.
    #[tokio::test(start_paused = true)]
    async fn at_the_cap_the_next_connection_waits_for_one_to_close() {
        let (reached, open) = (Counter::default(), Gauge::default());
        let cap = ConnCap::new(2, "test", reached.clone(), open.clone());
        let shutdown = CancellationToken::new();
        let a = cap.admit(&shutdown).await.expect("a place").opened();
        let b = cap.admit(&shutdown).await.expect("a place").opened();
        assert_eq!(open.get(), 2);
        assert!(!cap.at_limit.load(Ordering::Relaxed));
        let waiting = {
            let cap = cap.clone();
            let shutdown = shutdown.clone();
            tokio::spawn(async move { cap.admit(&shutdown).await.map(|_| ()) })
        };
        // The waiter never gets a place while both are open, however long it waits.
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert!(!waiting.is_finished(), "a third connection is not admitted");
        assert!(cap.at_limit.load(Ordering::Relaxed), "the episode began");
        assert_eq!(reached.get(), 1);
        drop(a);
        assert!(waiting.await.unwrap().is_some(), "admitted once one closed");
        // Its place was given back when the task ended: one open (b), under the low water.
        assert!(!cap.at_limit.load(Ordering::Relaxed), "the episode ended");
        assert_eq!(cap.open_now(), 1);
        assert_eq!(open.get(), 1, "the waiter's place was never opened");
        drop(b);
        assert_eq!(cap.open_now(), 0);
        assert_eq!(open.get(), 0);
    }

    /// A wait at the cap ends with the shutdown, with no place.
    #[tokio::test(start_paused = true)]
    async fn a_wait_at_the_cap_ends_with_the_shutdown() {
        let cap = ConnCap::new(1, "test", Counter::default(), Gauge::default());
        let shutdown = CancellationToken::new();
        let _a = cap.admit(&shutdown).await.expect("a place");
        let stop = shutdown.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            stop.cancel();
        });
        assert!(cap.admit(&shutdown).await.is_none());
    }

    #[test]
    fn the_episode_ends_under_ninety_percent_and_at_least_one_under() {
        let low = |n| ConnCap::new(n, "test", Counter::default(), Gauge::default()).low_water();
        assert_eq!(low(1), 0);
        assert_eq!(low(2), 1);
        assert_eq!(low(100), 90);
        assert_eq!(low(4096), 3687);
    }
}
