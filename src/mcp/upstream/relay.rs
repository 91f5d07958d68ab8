//! [`Relay`]: the rmcp client handler of every upstream connection. It forwards an upstream's
//! progress notifications to the downstream caller waiting on that call (the gateway's tool
//! calls); a connection nobody registers on (the watch client's) only ever buffers a few
//! strays.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use rmcp::ClientHandler;
use rmcp::model::{ClientConfig, NumberOrString, ProgressNotificationParam, ProgressToken};
use rmcp::service::{NotificationContext, RoleClient};

use crate::mcp::context::RoleContext;
use crate::mcp::source::Progress;
use crate::transport::client::client_config;

/// Relays an upstream's progress notifications to the downstream caller waiting on that call.
#[derive(Clone, Default)]
pub struct Relay {
    waiting: Arc<Mutex<HashMap<String, Progress>>>,
    /// Progress that arrived before its call was registered (the request is on the wire before
    /// rmcp hands back its token); at most [`MAX_EARLY`], oldest dropped.
    early: Arc<Mutex<VecDeque<ProgressNotificationParam>>>,
    /// Where the flush of early progress runs; `None`: a plain task (a client role).
    ctx: Option<RoleContext>,
}

impl Relay {
    pub fn new(ctx: Option<RoleContext>) -> Relay {
        Relay {
            ctx,
            ..Relay::default()
        }
    }
}

const MAX_EARLY: usize = 64;

/// A registered progress relay; dropping it ends the relay.
pub struct Relaying {
    key: String,
    waiting: Arc<Mutex<HashMap<String, Progress>>>,
}

impl Drop for Relaying {
    fn drop(&mut self) {
        self.waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.key);
    }
}

fn token_key(t: &ProgressToken) -> String {
    match &t.0 {
        NumberOrString::Number(n) => format!("n:{n}"),
        NumberOrString::String(s) => format!("s:{s}"),
    }
}

impl Relay {
    /// Sends the upstream's progress for `token` to `to` until the returned guard drops.
    pub fn register(&self, token: ProgressToken, to: Progress) -> Relaying {
        let key = token_key(&token);
        self.waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.clone(), to.clone());
        let early: Vec<ProgressNotificationParam> = {
            let mut q = self.early.lock().unwrap_or_else(|e| e.into_inner());
            let (mine, rest): (Vec<_>, Vec<_>) = q
                .drain(..)
                .partition(|p| token_key(&p.progress_token) == key);
            q.extend(rest);
            mine
        };
        if !early.is_empty() {
            let flush = async move {
                for mut p in early {
                    p.progress_token = to.token.clone();
                    let _ = to.peer.notify_progress(p).await;
                }
            };
            match &self.ctx {
                Some(ctx) => drop(ctx.spawn_until_shutdown("early progress", flush)),
                None => drop(tokio::spawn(flush)),
            }
        }
        Relaying {
            key,
            waiting: self.waiting.clone(),
        }
    }
}

impl ClientHandler for Relay {
    fn get_info(&self) -> ClientConfig {
        client_config()
    }

    async fn on_progress(
        &self,
        mut params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let to = self
            .waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&token_key(&params.progress_token))
            .cloned();
        match to {
            Some(to) => {
                params.progress_token = to.token.clone();
                let _ = to.peer.notify_progress(params).await;
            }
            None => {
                let mut q = self.early.lock().unwrap_or_else(|e| e.into_inner());
                if q.len() == MAX_EARLY {
                    q.pop_front();
                }
                q.push_back(params);
            }
        }
    }
}
