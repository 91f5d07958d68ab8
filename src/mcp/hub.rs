//! The listen hub: which open `subscriptions/listen` streams want which URIs, and the change feed
//! sources publish into.
//!
//! A source calls [`ChangeFeed::publish`] with a URI whenever that resource changes. Publishing
//! never blocks and never allocates per subscriber beyond a set insert: each stream has a
//! [`StreamQueue`], a pending *set* of URIs (so repeated changes to one URI before the stream's
//! writer catches up coalesce into one `notifications/resources/updated`, which the protocol
//! allows: notifications carry no payload and are idempotent). The queue is therefore bounded by
//! the number of URIs the stream accepted. A stream whose writer cannot deliver within the stall
//! timeout is ended by its listen task, so a slow reader never holds anything else up.

use crate::sync::{Recover, RecoverRw};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use tokio::sync::Notify;

/// The publishing side, handed to a source. Cheap to clone.
#[derive(Clone, Default)]
pub struct ChangeFeed {
    hub: Arc<HubInner>,
}

#[derive(Default)]
struct HubInner {
    by_uri: RwLock<HashMap<String, Vec<Arc<StreamQueue>>>>,
    next_id: AtomicU64,
    published: AtomicU64,
}

/// One listen stream's pending notifications.
pub struct StreamQueue {
    id: u64,
    pending: Mutex<Pending>,
    wake: Notify,
}

#[derive(Default)]
struct Pending {
    order: VecDeque<String>,
    set: HashSet<String>,
}

impl StreamQueue {
    /// Marks `uri` pending (once, however often).
    pub(crate) fn push(&self, uri: &str) {
        let mut p = self.pending.locked();
        if !p.set.contains(uri) {
            p.set.insert(uri.to_owned());
            p.order.push_back(uri.to_owned());
        }
        drop(p);
        self.wake.notify_one();
    }

    /// Waits until something is pending, then takes all of it (oldest first).
    pub async fn next_batch(&self) -> Vec<String> {
        loop {
            {
                let mut p = self.pending.locked();
                if !p.order.is_empty() {
                    p.set.clear();
                    return p.order.drain(..).collect();
                }
            }
            // `notify_one` stores a permit when nobody waits, so a push between the check above
            // and this await is not lost.
            self.wake.notified().await;
        }
    }

    pub fn id(&self) -> u64 {
        self.id
    }
}

/// A stream's registration; dropping it removes the stream from the hub.
pub struct Registration {
    hub: Arc<HubInner>,
    queue: Arc<StreamQueue>,
    uris: Vec<String>,
}

impl Registration {
    pub fn queue(&self) -> &Arc<StreamQueue> {
        &self.queue
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut map = self.hub.by_uri.write_locked();
        for uri in &self.uris {
            if let Some(list) = map.get_mut(uri) {
                list.retain(|q| q.id != self.queue.id);
                if list.is_empty() {
                    map.remove(uri);
                }
            }
        }
    }
}

impl ChangeFeed {
    pub fn new() -> ChangeFeed {
        ChangeFeed::default()
    }

    /// Announces that `uri` changed. Never blocks.
    pub fn publish(&self, uri: &str) {
        self.hub.published.fetch_add(1, Ordering::Relaxed);
        let map = self.hub.by_uri.read_locked();
        if let Some(list) = map.get(uri) {
            for q in list {
                q.push(uri);
            }
        }
    }

    /// Registers a stream for `uris` (deduplicated).
    pub fn register(&self, uris: &[String]) -> Registration {
        let id = self.hub.next_id.fetch_add(1, Ordering::Relaxed);
        let queue = Arc::new(StreamQueue {
            id,
            pending: Mutex::new(Pending::default()),
            wake: Notify::new(),
        });
        let mut uniq: Vec<String> = Vec::with_capacity(uris.len());
        for u in uris {
            if !uniq.contains(u) {
                uniq.push(u.clone());
            }
        }
        let mut map = self.hub.by_uri.write_locked();
        for uri in &uniq {
            map.entry(uri.clone()).or_default().push(queue.clone());
        }
        drop(map);
        Registration {
            hub: self.hub.clone(),
            queue,
            uris: uniq,
        }
    }

    /// Streams currently registered for `uri`.
    pub fn listeners(&self, uri: &str) -> usize {
        self.hub.by_uri.read_locked().get(uri).map_or(0, Vec::len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn publish_reaches_only_registered_streams() {
        let feed = ChangeFeed::new();
        let a = feed.register(&["memo://notes".into()]);
        let b = feed.register(&["memo://log".into()]);
        feed.publish("memo://notes");
        feed.publish("other://x");
        let got = tokio::time::timeout(Duration::from_secs(5), a.queue().next_batch())
            .await
            .unwrap();
        assert_eq!(got, vec!["memo://notes".to_string()]);
        assert!(
            tokio::time::timeout(Duration::from_millis(20), b.queue().next_batch())
                .await
                .is_err()
        );
    }

    #[tokio::test]
    async fn repeated_changes_coalesce_and_keep_order() {
        let feed = ChangeFeed::new();
        let r = feed.register(&["a".into(), "b".into(), "a".into()]);
        for _ in 0..1000 {
            feed.publish("b");
            feed.publish("a");
        }
        assert_eq!(
            r.queue().next_batch().await,
            vec!["b".to_string(), "a".to_string()]
        );
    }

    #[test]
    fn dropping_a_registration_unregisters() {
        let feed = ChangeFeed::new();
        let r1 = feed.register(&["a".into()]);
        let r2 = feed.register(&["a".into()]);
        assert_eq!(feed.listeners("a"), 2);
        drop(r1);
        assert_eq!(feed.listeners("a"), 1);
        drop(r2);
        assert_eq!(feed.listeners("a"), 0);
        assert!(feed.hub.by_uri.read().unwrap().is_empty());
    }
}
