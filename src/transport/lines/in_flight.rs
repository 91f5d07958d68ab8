//! The server side's in-flight bookkeeping: the ids of the peer's requests not answered yet,
//! with their sizes ([`InFlight`]), checked against how much one connection runs at once
//! ([`InFlightLimit`]); waiting for room when it is full; and the end of a burst (a
//! connection that reached its limit and has nothing in flight again, or closes), which gives
//! the allocator's free memory back to the system ([`give_back_memory`]).

use crate::sync::Recover;
use std::sync::Mutex;

use rmcp::model::RequestId;

/// The ids of a peer's requests that have not been answered yet, with their sizes (server
/// side).
#[derive(Default)]
pub(super) struct InFlight {
    state: Mutex<Running>,
    /// Woken when a request leaves.
    answered: tokio::sync::Notify,
}

#[derive(Default)]
pub(super) struct Running {
    ids: std::collections::HashMap<RequestId, usize>,
    bytes: usize,
    /// `events/stream` requests: in flight (their ids are taken), but outside the limit.
    streams: std::collections::HashSet<RequestId>,
    /// The connection reached its limit since it last had nothing in flight: a burst, whose
    /// memory is given back to the system when it ends ([`give_back_memory`]).
    pub(super) burst: bool,
}

/// How much of the peer's requests one connection runs at once.
#[derive(Clone, Copy)]
pub(super) struct InFlightLimit {
    pub(super) requests: usize,
    pub(super) bytes: usize,
}

impl InFlight {
    pub(super) fn running(&self) -> std::sync::MutexGuard<'_, Running> {
        self.state.locked()
    }

    pub(super) fn has_room(&self, limit: InFlightLimit) -> bool {
        let r = self.running();
        r.ids.len() < limit.requests && r.bytes < limit.bytes
    }

    pub(super) fn contains(&self, id: &RequestId) -> bool {
        let r = self.running();
        r.ids.contains_key(id) || r.streams.contains(id)
    }

    /// An `events/stream` request: its id is taken until it is answered, and it takes no
    /// place under the limit.
    pub(super) fn insert_stream(&self, id: RequestId) {
        self.running().streams.insert(id);
    }

    pub(super) fn insert(&self, id: RequestId, size: usize) {
        let mut r = self.running();
        if let Some(old) = r.ids.insert(id, size) {
            r.bytes -= old;
        }
        r.bytes += size;
    }

    pub(super) fn remove(&self, id: &RequestId) {
        let mut r = self.running();
        if r.streams.remove(id) {
            return;
        }
        if let Some(size) = r.ids.remove(id) {
            r.bytes -= size;
            let burst_ended = r.burst && r.ids.is_empty();
            if burst_ended {
                r.burst = false;
            }
            drop(r);
            self.answered.notify_waiters();
            if burst_ended {
                give_back_memory();
            }
        }
    }

    /// A request found no room: the connection is in a burst.
    pub(super) fn at_limit(&self) {
        self.running().burst = true;
    }

    /// Resolves once there is room under `limit`.
    pub(super) async fn room(&self, limit: InFlightLimit) {
        loop {
            let answered = self.answered.notified();
            tokio::pin!(answered);
            answered.as_mut().enable();
            if self.has_room(limit) {
                return;
            }
            answered.await;
        }
    }
}

/// A connection that goes away in a burst ends it too.
impl Drop for InFlight {
    fn drop(&mut self) {
        let r = self.state.locked_mut();
        if r.burst {
            give_back_memory();
        }
    }
}

/// Gives the memory the allocator holds free back to the system, once a burst on a connection
/// has ended. glibc's malloc keeps what a burst freed in its arenas and returns only the top of
/// each heap on its own; `malloc_trim` also hands back the free pages inside them (after a
/// 100,000-call flood without the in-flight bound, 1.09 GB went down to 33 MB; with the bound,
/// the release binary's heap after 100,000 small calls is about 4 MB instead of 9, after 2,000
/// of 256 KiB about 24 MB instead of 28-46: docs/benchmarks.md). Settings at start were
/// no better: `M_ARENA_MAX=2` gave back little, and a fixed `M_MMAP_THRESHOLD` (or
/// `M_TRIM_THRESHOLD`, which fixes it too) gave back more after big messages but made a flood
/// of them half again slower. Run on the blocking pool, since it walks every arena; one at a
/// time, since a second would find nothing more to return. A burst's end is rare (a flood of
/// 100,000 calls trims a few times), so this costs no request anything.
fn give_back_memory() {
    static TRIMMING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    use std::sync::atomic::Ordering;
    #[cfg(test)]
    BURSTS_ENDED.fetch_add(1, Ordering::Relaxed);
    if TRIMMING.swap(true, Ordering::AcqRel) {
        return;
    }
    let trim = || {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: malloc_trim takes each arena's lock itself and only hands free pages back
        // (madvise); it is safe to call from any thread at any time.
        unsafe {
            libc::malloc_trim(0);
        }
        TRIMMING.store(false, Ordering::Release);
    };
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => drop(rt.spawn_blocking(trim)),
        Err(_) => trim(),
    }
}

/// How many times [`give_back_memory`] was called, for the tests.
#[cfg(test)]
pub(super) static BURSTS_ENDED: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(0);
