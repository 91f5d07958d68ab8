//! Reload requests: how the admin address's `POST /reload` (and `herald reload`) reach the
//! runner that can reload its config, and what they hear back. The runner installs the
//! sending side on its [`RoleContext`](crate::runtime::context::RoleContext)
//! ([`install_reloads`](crate::runtime::context::RoleContext::install_reloads)); the admin
//! address asks through it; `app::reload` serves the queue (and SIGHUP) one reload at a time.

use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};

/// Reload requests waiting at most (a caller past them is told to try again).
const QUEUE: usize = 4;

/// What one reload did: applied (with what changed, one line each), or refused (the running
/// config is kept) with why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReloadOutcome {
    pub applied: bool,
    /// What changed (`slug m added`, `token ops revoked (2 streams ended)`, …); empty for a
    /// config that did not change.
    #[serde(default)]
    pub changes: Vec<String>,
    /// Why it was refused (the running config is kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// How long it took, in milliseconds.
    #[serde(default)]
    pub millis: u64,
}

impl ReloadOutcome {
    pub fn applied(changes: Vec<String>) -> ReloadOutcome {
        ReloadOutcome {
            applied: true,
            changes,
            error: None,
            millis: 0,
        }
    }

    pub fn refused(error: impl Into<String>) -> ReloadOutcome {
        ReloadOutcome {
            applied: false,
            changes: Vec::new(),
            error: Some(error.into()),
            millis: 0,
        }
    }
}

/// One request: the answer goes back on `reply`.
pub struct ReloadRequest {
    pub reply: oneshot::Sender<ReloadOutcome>,
}

/// Where reload requests go. Cheap to clone.
#[derive(Clone)]
pub struct Reloads {
    tx: mpsc::Sender<ReloadRequest>,
}

/// The runner's side: the requests to serve.
pub struct ReloadQueue {
    pub rx: mpsc::Receiver<ReloadRequest>,
}

/// A bounded queue of reload requests.
pub fn channel() -> (Reloads, ReloadQueue) {
    let (tx, rx) = mpsc::channel(QUEUE);
    (Reloads { tx }, ReloadQueue { rx })
}

impl Reloads {
    /// Asks for a reload and waits for its outcome.
    pub async fn ask(&self) -> Result<ReloadOutcome, String> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .try_send(ReloadRequest { reply })
            .map_err(|e| match e {
                mpsc::error::TrySendError::Full(_) => {
                    "reloads are already queued; wait for them and ask again".to_owned()
                }
                mpsc::error::TrySendError::Closed(_) => "herald is shutting down".to_owned(),
            })?;
        answer
            .await
            .map_err(|_| "herald is shutting down".to_owned())
    }
}
