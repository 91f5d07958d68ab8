//! Where the gateway keeps who started each task it handed out, beyond its own memory: in the
//! store (so a restart keeps them), or in a NATS key-value bucket (`herald gateway --backend
//! nats://…`, so every replica behind a load balancer knows them). The memory map in
//! `tasks.rs` stays the first place looked; this is written through when a task starts or
//! ends, and read when a replica meets a task id it has not seen.
//!
//! Nothing here names the caller or the task in the clear: the key is a digest of the task
//! id, and the owner a digest of the caller's principal (a token's digest, or an access
//! token's issuer and subject). Expiry is wall-clock milliseconds, as the replicas' clocks
//! tell it (a ttl of minutes to a day; seconds of skew do not matter).

use async_nats::jetstream::kv;
use serde::{Deserialize, Serialize};
use sha2::Digest as _;

use crate::mcp::ring::now_ms;
use crate::store::{Store, Table};

/// A task's owner as kept.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Row {
    /// The SHA-256 of the owner's principal, hex.
    pub owner: String,
    pub expires_ms: u64,
    pub started_ms: u64,
    pub ended: bool,
}

impl Row {
    pub fn new(principal: &str, ttl: std::time::Duration) -> Row {
        let now = now_ms();
        Row {
            owner: digest(principal),
            expires_ms: now.saturating_add(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX)),
            started_ms: now,
            ended: false,
        }
    }

    /// Whether `principal` owns it now.
    pub fn owned_by(&self, principal: &str) -> bool {
        self.owner == digest(principal) && self.expires_ms > now_ms()
    }
}

fn digest(s: &str) -> String {
    hex::encode(sha2::Sha256::digest(s.as_bytes()))
}

/// The key of task `id`: a digest (a NATS key allows few characters; an id may hold any).
fn key(id: &str) -> String {
    format!("task.{}", &digest(id)[..40])
}

/// Where the owners are kept.
#[derive(Clone)]
pub(crate) enum Keep {
    /// Nowhere but memory (tests, and a gateway made without a store).
    Memory,
    /// The gateway's store (`Table::Tasks`, under `gateway-owner/`).
    Store(Store),
    /// A NATS key-value bucket shared by the gateway's replicas.
    Nats(Box<kv::Store>),
}

const STORE_PREFIX: &str = "gateway-owner/";
/// How long past its ttl the gateway still knows who started a task.
pub(crate) const OWNER_GRACE: std::time::Duration = std::time::Duration::from_secs(60);
/// The longest the gateway keeps a task's owner (a task without a ttl included).
pub(crate) const MAX_OWNED_FOR: std::time::Duration = std::time::Duration::from_secs(24 * 3600);
/// How long a bucket keeps a row: the longest a task is kept, and its grace.
pub(crate) const MAX_AGE: std::time::Duration =
    std::time::Duration::from_secs(MAX_OWNED_FOR.as_secs() + OWNER_GRACE.as_secs());
/// How long a read or write of the keep may take before the gateway goes on without it.
const KEEP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// Whether the kept row `old` is another owner's, still live, where `row` would go.
fn standing(old: &[u8], row: &Row) -> bool {
    serde_json::from_slice::<Row>(old)
        .is_ok_and(|o| o.owner != row.owner && o.expires_ms > now_ms())
}

impl Keep {
    pub fn shared(&self) -> bool {
        !matches!(self, Keep::Memory)
    }

    /// Keeps `row` for task `id`, unless another owner's row for that id is kept and live (an
    /// upstream that used an id twice): that one stands, and this task is known here only.
    /// A failure is logged: the task works on this replica, and another one does not know it.
    pub async fn put(&self, id: &str, row: &Row) {
        let r = tokio::time::timeout(KEEP_TIMEOUT, async {
            let bytes = serde_json::to_vec(row).expect("a row serializes");
            match self {
                Keep::Memory => Ok(()),
                Keep::Store(s) => {
                    let k = format!("{STORE_PREFIX}{}", key(id));
                    if let Ok(Some(old)) = s.get(Table::Tasks, &k).await
                        && standing(&old, row)
                    {
                        return Err("another caller's task has that id".to_owned());
                    }
                    s.put(Table::Tasks, &k, bytes)
                        .await
                        .map_err(|e| e.to_string())
                }
                Keep::Nats(kv) => match kv.create(key(id), bytes.clone().into()).await {
                    Ok(_) => Ok(()),
                    Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => {
                        if let Ok(Some(old)) = kv.get(key(id)).await
                            && standing(&old, row)
                        {
                            return Err("another caller's task has that id".to_owned());
                        }
                        kv.put(key(id), bytes.into())
                            .await
                            .map(|_| ())
                            .map_err(|e| e.to_string())
                    }
                    Err(e) => Err(e.to_string()),
                },
            }
        })
        .await
        .unwrap_or_else(|_| Err("no answer in time".into()));
        if let Err(e) = r {
            tracing::warn!(error = %e, "cannot keep a task's owner: other gateway replicas, or this one after a restart, will not know the task");
        }
    }

    /// Deletes the store's rows whose time has passed (at start: a row is otherwise deleted
    /// only when its slug forgets the task). A bucket expires its own (`max_age`).
    pub async fn sweep(&self) {
        let Keep::Store(s) = self else {
            return;
        };
        let Ok(rows) = s.scan(Table::Tasks).await else {
            return;
        };
        let now = now_ms();
        for (k, v) in rows {
            if !k.starts_with(STORE_PREFIX) {
                continue;
            }
            let gone = serde_json::from_slice::<Row>(&v).map_or(true, |r| r.expires_ms <= now);
            if gone {
                let _ = s.delete(Table::Tasks, &k).await;
            }
        }
    }

    /// The row of task `id`, if one is kept (and readable in time).
    pub async fn get(&self, id: &str) -> Option<Row> {
        let bytes = tokio::time::timeout(KEEP_TIMEOUT, async {
            match self {
                Keep::Memory => None,
                Keep::Store(s) => s
                    .get(Table::Tasks, &format!("{STORE_PREFIX}{}", key(id)))
                    .await
                    .ok()?,
                Keep::Nats(kv) => Some(kv.get(key(id)).await.ok()??.to_vec()),
            }
        })
        .await
        .ok()??;
        serde_json::from_slice(&bytes).ok()
    }

    pub async fn delete(&self, id: &str) {
        match self {
            Keep::Memory => {}
            Keep::Store(s) => {
                let _ = s
                    .delete(Table::Tasks, &format!("{STORE_PREFIX}{}", key(id)))
                    .await;
            }
            Keep::Nats(kv) => {
                let _ = kv.delete(key(id)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_row_kept_in_the_store_is_its_owners_alone_and_names_nobody() {
        let store = Store::memory();
        let keep = Keep::Store(store.clone());
        let row = Row::new("token:abc", Duration::from_secs(60));
        keep.put("notes__t-1", &row).await;
        let got = keep.get("notes__t-1").await.expect("kept");
        assert!(got.owned_by("token:abc"));
        assert!(!got.owned_by("token:abd"));
        assert_eq!(keep.get("notes__t-2").await, None);
        for (k, v) in store.scan(Table::Tasks).await.unwrap() {
            let text = format!("{k} {}", String::from_utf8_lossy(&v));
            assert!(!text.contains("t-1") && !text.contains("abc"), "{text}");
        }
        // Another caller's task under the same id does not take the row.
        keep.put(
            "notes__t-1",
            &Row::new("token:xyz", Duration::from_secs(60)),
        )
        .await;
        assert!(keep.get("notes__t-1").await.unwrap().owned_by("token:abc"));
        keep.delete("notes__t-1").await;
        assert_eq!(keep.get("notes__t-1").await, None);
        // Expired rows are swept.
        keep.put("notes__old", &Row::new("token:abc", Duration::ZERO))
            .await;
        keep.put(
            "notes__new",
            &Row::new("token:abc", Duration::from_secs(60)),
        )
        .await;
        keep.sweep().await;
        assert_eq!(keep.get("notes__old").await, None);
        assert!(keep.get("notes__new").await.is_some());
        let expired = Row::new("token:abc", Duration::ZERO);
        assert!(!expired.owned_by("token:abc"));
    }
}
