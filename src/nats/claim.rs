//! A publisher's name, claimed: one process at a time publishes its event logs under a name
//! (`--publish-as`), so two replicas that both default to `memo` are told so at start
//! instead of mixing their numberings at every gateway.
//!
//! The claim is the key `<name>.claim` of the bucket `herald_events`: the holder's identity
//! ([`holder::identity`]: host, boot, pid namespace, pid) and when it last renewed it (its
//! wall clock, ms, for the message only). It is made by create (only if absent), renewed
//! every [`HEARTBEAT`] by compare-and-set on its revision, and deleted (at its revision) when
//! the process stops. Another process under the name is refused, with a message naming the
//! holder, unless the holder is gone: a process of this host that is gone (or this pid in an
//! earlier life: a container restarted) is taken over at once; any other only once its claim's
//! revision stood still for [`STALE`] by the newcomer's own clock (hosts' clocks are never
//! compared: a renewal that looks old by the wall clock is watched first). A holder that
//! finds its claim taken (it was cut off for longer than that) stops publishing and says so;
//! one that finds it gone (NATS lost the bucket) claims it again.
//!
//! At start, a claim renewed lately by the wall clock is refused at once; one that looks
//! stale is watched for up to [`STALE`] before it is taken.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_nats::jetstream::kv;
use futures::StreamExt;
use futures::future::BoxFuture;

use super::holder;
use crate::runtime::context::RoleContext;

/// How often the holder renews its claim.
pub const HEARTBEAT: Duration = Duration::from_secs(10);
/// A claim whose revision stood still this long is taken over.
pub const STALE: Duration = Duration::from_secs(30);

#[derive(serde::Serialize, serde::Deserialize)]
struct Holder {
    id: String,
    at_ms: u64,
}

impl Holder {
    fn me(id: &str) -> bytes::Bytes {
        let h = Holder {
            id: id.to_owned(),
            at_ms: crate::mcp::ring::now_ms(),
        };
        serde_json::to_vec(&h).unwrap_or_default().into()
    }

    /// `pid N on HOST`, from the identity.
    fn said(&self) -> String {
        let parts: Vec<&str> = self.id.split(':').collect();
        match parts[..] {
            [host, _, _, pid, _] => format!("pid {pid} on {host}"),
            _ => format!("the process {}", self.id),
        }
    }
}

fn key(name: &str) -> String {
    format!("{name}.claim")
}

/// Claims `name` for the process `id` ([`holder::identity`]): the claim's revision, or why
/// another holds it (its host and pid, and what to do).
pub async fn claim(kv: &kv::Store, name: &str, id: &str) -> Result<u64, String> {
    let key = key(name);
    let cannot =
        |e: &dyn std::fmt::Display| format!("cannot claim the publisher name {name} ({e})");
    match kv.create(&key, Holder::me(id)).await {
        Ok(rev) => return Ok(rev),
        Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => {}
        Err(e) => return Err(cannot(&e)),
    }
    let Some(entry) = kv.entry(&key).await.map_err(|e| cannot(&e))? else {
        // Deleted in between: claim it afresh.
        return kv
            .create(&key, Holder::me(id))
            .await
            .map_err(|e| cannot(&e));
    };
    let held: Option<Holder> = serde_json::from_slice(&entry.value).ok();
    let Some(h) = held else {
        return take(kv, &key, id, entry.revision, name).await;
    };
    if h.id == id || holder::dead_here(&h.id) || holder::earlier_life(&h.id, id) {
        return take(kv, &key, id, entry.revision, name).await;
    }
    let refused = |h: &Holder| {
        let ago = crate::mcp::ring::now_ms().saturating_sub(h.at_ms) / 1000;
        format!(
            "another process publishes event logs as {name}: {} (its claim renewed {ago} s ago by its clock); give this one its own name (--publish-as, or [publish] name), or stop that one. A claim not renewed for {} s is taken over",
            h.said(),
            STALE.as_secs()
        )
    };
    let fresh = crate::mcp::ring::now_ms().saturating_sub(h.at_ms) <= STALE.as_millis() as u64;
    if fresh {
        return Err(refused(&h));
    }
    // Old by the wall clock: the holder may be alive with its clock behind. Watch whether
    // it renews, by this process's clock.
    let mut watch = kv.watch(&key).await.map_err(|e| cannot(&e))?;
    let renewed = tokio::time::timeout(STALE, async {
        while let Some(Ok(e)) = watch.next().await {
            if e.revision > entry.revision {
                return true;
            }
        }
        false
    })
    .await
    .unwrap_or(false);
    if renewed {
        return Err(refused(&h));
    }
    take(kv, &key, id, entry.revision, name).await
}

/// Takes the claim at `revision` by compare-and-set.
async fn take(
    kv: &kv::Store,
    key: &str,
    id: &str,
    revision: u64,
    name: &str,
) -> Result<u64, String> {
    kv.update(key, Holder::me(id), revision)
        .await
        .map_err(|e| format!("cannot take over the claim on the publisher name {name} ({e})"))
}

/// What a holder does when it claimed its name again after NATS lost the bucket (puts its
/// catalog back).
pub type Reclaimed = Box<dyn Fn() -> BoxFuture<'static, ()> + Send + Sync>;

/// Renews the claim made at `revision` every [`HEARTBEAT`] until `ctx` shuts down, then
/// deletes it. Returns the flag set once the claim is lost (taken over): publishing stops.
pub fn keep(
    kv: kv::Store,
    name: &str,
    id: &str,
    revision: u64,
    reclaimed: Reclaimed,
    ctx: &RoleContext,
) -> Arc<AtomicBool> {
    let lost = Arc::new(AtomicBool::new(false));
    let (name, id, flag, shutdown) = (
        name.to_owned(),
        id.to_owned(),
        lost.clone(),
        ctx.shutdown().clone(),
    );
    ctx.spawn("events nats claim", async move {
        let key = key(&name);
        let mut revision = revision;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => {
                    // Let a successor claim the name at once (only this claim: one taken
                    // over is not ours to delete).
                    let _ = tokio::time::timeout(
                        Duration::from_secs(2),
                        kv.delete_expect_revision(&key, Some(revision)),
                    )
                    .await;
                    return;
                }
                _ = tokio::time::sleep(HEARTBEAT) => {}
            }
            match kv.update(&key, Holder::me(&id), revision).await {
                Ok(r) => revision = r,
                Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => {
                    let now = kv.entry(&key).await;
                    let holder = match &now {
                        Ok(Some(e)) => serde_json::from_slice::<Holder>(&e.value).ok(),
                        _ => None,
                    };
                    match (now, holder) {
                        // A renewal stored though its answer was lost: this one's, carry on.
                        (Ok(Some(e)), Some(h)) if h.id == id => revision = e.revision,
                        // Gone (NATS lost the bucket, made again since): claimed afresh.
                        (Ok(None), _) => match kv.create(&key, Holder::me(&id)).await {
                            Ok(r) => {
                                revision = r;
                                tracing::warn!(publisher = %name, "the claim on the publisher name was gone (NATS lost its data); claimed it again");
                                reclaimed().await;
                            }
                            Err(e) => tracing::warn!(publisher = %name, error = %e, "cannot claim the publisher name again"),
                        },
                        (Ok(Some(_)), _) => {
                            flag.store(true, Ordering::Release);
                            tracing::error!(
                                publisher = %name,
                                "another process took over the publisher name {name} (this one was cut off from NATS for longer than {} s); this process publishes no more event logs: restart it under its own --publish-as",
                                STALE.as_secs()
                            );
                            return;
                        }
                        (Err(e), _) => tracing::warn!(publisher = %name, error = %e, "cannot read the claim on the publisher name"),
                    }
                }
                // Not reached (NATS away): tried again at the next beat.
                Err(e) => tracing::warn!(publisher = %name, error = %e, "cannot renew the claim on the publisher name"),
            }
        }
    });
    lost
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_holder_is_said_by_its_pid_and_host() {
        let h = Holder {
            id: "edge-1:0a1b2c3d:4026531836:4242:deadbeef".into(),
            at_ms: 0,
        };
        assert_eq!(h.said(), "pid 4242 on edge-1");
        let me = holder::identity();
        assert!(!holder::earlier_life(&me, &me));
        let mut parts: Vec<&str> = me.split(':').collect();
        parts[4] = "00000000";
        assert!(
            holder::earlier_life(&parts.join(":"), &me),
            "this pid, another life"
        );
        parts[3] = "1";
        assert!(!holder::earlier_life(&parts.join(":"), &me) || std::process::id() == 1);
    }
}
