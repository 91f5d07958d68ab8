//! A publisher's name, claimed: one process at a time publishes its event logs under a name
//! (`--publish-as`), so two replicas that both default to `memo` are told so at start
//! instead of mixing their numberings at every gateway.
//!
//! The claim is the key `<name>.claim` of the bucket `herald_events`: the holder's id (host,
//! pid and a random part), its host and pid, and when it last renewed it (its wall clock,
//! ms). It is made by create (only if absent), renewed every [`HEARTBEAT`] by compare-and-set
//! on its revision, and deleted (at its revision) when the process stops. Another process
//! under the name is refused with a message naming the holder, unless the claim is stale:
//! unrenewed for [`STALE`] by the newcomer's clock, or held by a process of this host that is
//! gone (a crash, restarted at once). It then takes the claim over by compare-and-set, and a
//! holder that finds its claim taken (it was cut off for longer than that) stops publishing
//! and says so.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_nats::jetstream::kv;

use crate::runtime::context::RoleContext;

/// How often the holder renews its claim.
pub const HEARTBEAT: Duration = Duration::from_secs(10);
/// A claim unrenewed for this long is taken over.
pub const STALE: Duration = Duration::from_secs(30);

#[derive(serde::Serialize, serde::Deserialize)]
struct Holder {
    id: String,
    host: String,
    pid: u32,
    at_ms: u64,
}

impl Holder {
    fn me(id: &str) -> Holder {
        Holder {
            id: id.to_owned(),
            host: crate::nats::hostname(),
            pid: std::process::id(),
            at_ms: crate::mcp::ring::now_ms(),
        }
    }

    fn bytes(&self) -> bytes::Bytes {
        serde_json::to_vec(self).unwrap_or_default().into()
    }

    /// Whether a newcomer may take this claim over now.
    fn stale(&self, now_ms: u64) -> bool {
        let gone_here = self.host == crate::nats::hostname()
            && self.pid != std::process::id()
            && !std::path::Path::new(&format!("/proc/{}", self.pid)).exists();
        gone_here || now_ms.saturating_sub(self.at_ms) > STALE.as_millis() as u64
    }
}

fn key(name: &str) -> String {
    format!("{name}.claim")
}

/// Claims `name` for the process `id`: the claim's revision, or why another holds it (its
/// host and pid, and what to do).
pub async fn claim(kv: &kv::Store, name: &str, id: &str) -> Result<u64, String> {
    let key = key(name);
    let mine = Holder::me(id);
    match kv.create(&key, mine.bytes()).await {
        Ok(rev) => return Ok(rev),
        Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("cannot claim the publisher name {name} ({e})")),
    }
    let entry = kv
        .entry(&key)
        .await
        .map_err(|e| format!("cannot read the claim on the publisher name {name} ({e})"))?;
    let Some(entry) = entry else {
        // Deleted in between: claim it afresh.
        return kv
            .create(&key, mine.bytes())
            .await
            .map_err(|e| format!("cannot claim the publisher name {name} ({e})"));
    };
    let held: Option<Holder> = serde_json::from_slice(&entry.value).ok();
    match held {
        Some(h) if h.id != id && !h.stale(crate::mcp::ring::now_ms()) => {
            let ago = crate::mcp::ring::now_ms().saturating_sub(h.at_ms) / 1000;
            Err(format!(
                "another process publishes event logs as {name}: pid {} on {} (its claim renewed {ago} s ago); give this one its own name (--publish-as, or [publish] name), or stop that one. A claim unrenewed for {} s is taken over",
                h.pid,
                h.host,
                STALE.as_secs()
            ))
        }
        _ => kv
            .update(&key, mine.bytes(), entry.revision)
            .await
            .map_err(|e| {
                format!("cannot take over the stale claim on the publisher name {name} ({e})")
            }),
    }
}

/// Renews the claim made at `revision` every [`HEARTBEAT`] until `ctx` shuts down, then
/// deletes it. Returns the flag set once the claim is lost (taken over): publishing stops.
pub fn keep(
    kv: kv::Store,
    name: &str,
    id: &str,
    revision: u64,
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
            match kv.update(&key, Holder::me(&id).bytes(), revision).await {
                Ok(r) => revision = r,
                // Gone (NATS lost the bucket, made again since): claimed afresh.
                Err(e)
                    if e.kind() == kv::UpdateErrorKind::WrongLastRevision
                        && matches!(kv.entry(&key).await, Ok(None)) =>
                {
                    match kv.create(&key, Holder::me(&id).bytes()).await {
                        Ok(r) => revision = r,
                        Err(e) => tracing::warn!(publisher = %name, error = %e, "cannot claim the publisher name again"),
                    }
                }
                Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => {
                    flag.store(true, Ordering::Release);
                    tracing::error!(
                        publisher = %name,
                        "another process took over the publisher name {name} (this one was cut off from NATS for longer than {} s); this process publishes no more event logs: restart it under its own --publish-as",
                        STALE.as_secs()
                    );
                    return;
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
    fn a_claim_is_stale_unrenewed_or_when_its_process_here_is_gone() {
        let now = 1_000_000;
        let h = |host: String, pid: u32, at_ms: u64| Holder {
            id: "x".into(),
            host,
            pid,
            at_ms,
        };
        let here = crate::nats::hostname();
        assert!(!h("elsewhere".into(), 1, now - 1_000).stale(now));
        assert!(h("elsewhere".into(), 1, now - 31_000).stale(now));
        // A process of this host that is alive (this one's parent, pid 1) holds it; one
        // that is gone does not.
        assert!(!h(here.clone(), 1, now).stale(now));
        assert!(h(here.clone(), u32::MAX - 7, now).stale(now));
        assert!(!h(here, std::process::id(), now).stale(now));
    }
}
