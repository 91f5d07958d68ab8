//! An upstream's tool and prompt lists changing while it is connected: how its users hear of
//! it, and how its catalog follows.
//!
//! A 2026-07-28 server says so only on a listen that asked (`toolsListChanged`,
//! `promptsListChanged`): its user keeps one ([`super::KeptListen`], [`filter`]). An older
//! server sends `notifications/tools/list_changed` to the connection's handler ([`super::Relay`]),
//! which counts it on the upstream's [`ListSignal`], beside each new connection (a restarted
//! server may offer other tools). Either way the user then fetches the list again with
//! [`Upstream::refresh_list`].

use crate::sync::Recover;
use std::sync::Arc;

use rmcp::model::SubscriptionFilter;
use tokio::sync::watch;

use super::{HeardOn, Live, REQUEST_TIMEOUT, Upstream};
use crate::mcp::lists::{List, Lists};

/// Counts of what happened to an upstream, each only ever growing: a watcher compares them
/// with the last it saw.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ListEvents {
    /// Connects that succeeded (each with a fresh catalog).
    pub connects: u64,
    /// `notifications/tools/list_changed` sent to the handler (an older server).
    pub tools: u64,
    /// `notifications/prompts/list_changed` sent to the handler.
    pub prompts: u64,
}

impl ListEvents {
    /// The lists whose count grew since `before`.
    pub fn changed_since(&self, before: &ListEvents) -> Lists {
        Lists {
            tools: self.tools != before.tools,
            prompts: self.prompts != before.prompts,
        }
    }
}

/// Where an upstream's [`ListEvents`] are counted: one value, overwritten (a watch channel),
/// so nothing queues however often they come.
#[derive(Clone)]
pub struct ListSignal(Arc<watch::Sender<ListEvents>>);

impl Default for ListSignal {
    fn default() -> ListSignal {
        ListSignal(Arc::new(watch::channel(ListEvents::default()).0))
    }
}

impl ListSignal {
    pub(super) fn count(&self, f: impl FnOnce(&mut ListEvents)) {
        self.0.send_modify(f);
    }
}

/// What to ask of connection `live` to hear its lists change: the lists it says change, on a
/// 2026-07-28 server (an older one tells the handler unasked); `None` when there are none.
pub fn filter(live: &Live) -> Option<SubscriptionFilter> {
    let lists = declared(live);
    if !live.modern || lists == Lists::default() {
        return None;
    }
    let mut f = SubscriptionFilter::new();
    lists.narrow(&mut f);
    Some(f)
}

/// The lists a connection's server says change.
pub fn declared(live: &Live) -> Lists {
    Lists {
        tools: live.tools_list_changed,
        prompts: live.prompts_list_changed,
    }
}

impl Upstream {
    /// Its [`ListEvents`], marked seen as they are now.
    pub fn list_events(&self) -> watch::Receiver<ListEvents> {
        self.relay.lists.0.subscribe()
    }

    /// Fetches `list` again on connection `on` and makes it the catalog's, unless a newer
    /// connection has replaced it meanwhile (its catalog is newer).
    pub async fn refresh_list(&self, on: &HeardOn, list: List) -> Result<(), String> {
        let live = &on.0;
        let fetch = async {
            match list {
                List::Tools => live.conn.list_all_tools().await.map(Fetched::Tools),
                List::Prompts => live.conn.list_all_prompts().await.map(Fetched::Prompts),
            }
        };
        let fetched = tokio::time::timeout(REQUEST_TIMEOUT, fetch)
            .await
            .map_err(|_| {
                format!(
                    "no {} list within {} s",
                    list.field(),
                    REQUEST_TIMEOUT.as_secs()
                )
            })?
            .map_err(|e| e.to_string())?;
        if !self.cached().is_some_and(|l| Arc::ptr_eq(&l, live)) {
            return Ok(());
        }
        let mut catalog = self.catalog.locked();
        let base = catalog.clone().unwrap_or_else(|| live.catalog.clone());
        *catalog = Some(Arc::new(match fetched {
            Fetched::Tools(t) => base.with_tools(t),
            Fetched::Prompts(p) => base.with_prompts(p),
        }));
        Ok(())
    }
}

enum Fetched {
    Tools(Vec<rmcp::model::Tool>),
    Prompts(Vec<rmcp::model::Prompt>),
}
