//! Reloading a runner's config without a restart (`herald up`, `herald gateway --config`):
//! SIGHUP (what `systemctl reload` sends a `Type=notify-reload` unit) and the admin address's
//! `POST /reload` (what `herald reload` asks) both queue a reload; one runs at a time. systemd
//! hears `RELOADING=1` with `MONOTONIC_USEC=` as it begins and `READY=1` with the serving
//! status when it ends, whatever its outcome; the status board counts it
//! (`herald_reload_total{result}`) and keeps the last one's outcome for `/status`.
//!
//! What a reload does is the runner's ([`Reload`]): read the config again, check it exactly as
//! `herald check` does, and apply what changed; a config that fails the check, or that changes
//! what cannot change live, is refused and the running one kept.

use std::time::Instant;

use async_trait::async_trait;

use crate::app::systemd::{Notify, Systemd};
use crate::runtime::context::RoleContext;
use crate::runtime::reload::{ReloadOutcome, channel};

/// A runner's reload.
#[async_trait]
pub trait Reload: Send + 'static {
    /// Reads the config again, checks it, and applies what changed: what changed, one line
    /// each; or why it was refused (nothing applied).
    async fn reload(&mut self) -> Result<Vec<String>, String>;
}

/// Serves reloads for `ctx`'s runner until it shuts down: takes SIGHUP from now on (so a
/// reload signal never kills the process) and installs the queue the admin address asks on.
/// `status` is the `STATUS=` line systemd hears again once a reload ends.
pub fn serve(ctx: &RoleContext, systemd: &Systemd, status: String, mut reload: Box<dyn Reload>) {
    let (reloads, mut queue) = channel();
    if !ctx.install_reloads(reloads) {
        tracing::error!("reloads are already served in this process; SIGHUP is not taken");
        return;
    }
    #[cfg(unix)]
    let mut hup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, "cannot take SIGHUP: reload through the admin address (herald reload)");
            None
        }
    };
    let (ctx2, systemd) = (ctx.clone(), systemd.clone());
    ctx.spawn("reload", async move {
        let ctx = ctx2;
        loop {
            let hangup = async {
                #[cfg(unix)]
                if let Some(h) = hup.as_mut() {
                    return h.recv().await;
                }
                std::future::pending::<Option<()>>().await
            };
            let reply = tokio::select! {
                _ = ctx.shutdown().cancelled() => return,
                Some(()) = hangup => None,
                r = queue.rx.recv() => match r {
                    Some(r) => Some(r.reply),
                    None => return,
                },
            };
            let via = if reply.is_some() { "admin" } else { "SIGHUP" };
            systemd
                .notify(&[Notify::Reloading, Notify::Status("reloading the config")])
                .await;
            let start = Instant::now();
            // A shutdown during a reload ends it where it is (the process goes anyway); it
            // never holds up the drain.
            let done = tokio::select! {
                r = reload.reload() => r,
                _ = ctx.shutdown().cancelled() => return,
            };
            let mut outcome = match done {
                Ok(changes) => ReloadOutcome::applied(changes),
                Err(e) => ReloadOutcome::refused(e),
            };
            outcome.millis = start.elapsed().as_millis() as u64;
            match &outcome.error {
                None if outcome.changes.is_empty() => {
                    tracing::info!(
                        via,
                        millis = outcome.millis,
                        "config reloaded: nothing changed"
                    );
                }
                None => tracing::info!(
                    via,
                    millis = outcome.millis,
                    changes = %outcome.changes.join("; "),
                    "config reloaded"
                ),
                Some(e) => tracing::error!(via, "reload refused, the running config is kept: {e}"),
            }
            ctx.status().reloaded(&outcome);
            systemd
                .notify(&[Notify::Ready, Notify::Status(&status)])
                .await;
            if let Some(reply) = reply {
                let _ = reply.send(outcome);
            }
        }
    });
}

/// For a runner with nothing to reload (a server role: its settings are flags): SIGHUP, whose
/// default action would end the process, is taken and answered in the log instead.
pub fn hangup_says_nothing_to_reload(ctx: &RoleContext) {
    #[cfg(unix)]
    {
        let Ok(mut hup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        else {
            return;
        };
        let (role, shutdown) = (ctx.role().to_owned(), ctx.shutdown().clone());
        ctx.spawn("sighup", async move {
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    r = hup.recv() => if r.is_none() { return },
                }
                tracing::warn!(
                    "SIGHUP: herald {role} has no config to reload (its settings are its flags); restart it to change them"
                );
            }
        });
    }
}
