//! Each slug's tool and prompt lists followed while the gateway runs: when the upstream says
//! a list changed, the slug's catalog fetches it again and the gateway publishes
//! [`TOOLS_CHANGED`] / [`PROMPTS_CHANGED`] on its feed, so its own listens that asked get
//! `notifications/tools/list_changed` or `notifications/prompts/list_changed`. A connect whose
//! fresh catalog lists other tools or prompts than the last one (a restarted server) is
//! announced the same way.
//!
//! A 2026-07-28 upstream that declares `listChanged` is heard on one listen per connection
//! ([`KeptListen`], the machinery of the shared URI listens, so the same backoff), asking for
//! the lists it declares; an older one tells the connection's handler, counted on the
//! upstream's [`ListEvents`]. A slug that declares neither costs nothing: the follower waits
//! for its next connect and compares catalogs.
//!
//! The feed keys are the gateway's, not a slug's: every listen that asked hears of a change
//! in any slug (and lists again to see what its caller may use).

use std::sync::Arc;

use rmcp::model::ServerNotification;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::mcp::hub::ChangeFeed;
use crate::mcp::lists::{List, Lists};
use crate::mcp::source::{PROMPTS_CHANGED, TOOLS_CHANGED};
use crate::runtime::backoff::Backoff;
use crate::upstream::{self, Catalog, Heard, HeardOn, KeptListen, ListEvents, Upstream, lists};

/// Resubscribe pacing of a kept upstream listen (a slug's list follower here, a shared URI
/// subscription in `source.rs`): the connect's (250 ms doubling to 30 s, reset by a
/// subscription that lived 10 s).
pub(super) const RESUBSCRIBE: Backoff = upstream::RECONNECT;

/// Follows `up`'s lists, publishing their changes on `feed`, until `stop`.
pub(super) async fn follow(up: Arc<Upstream>, feed: ChangeFeed, stop: CancellationToken) {
    let mut events = up.list_events();
    let mut last = *events.borrow_and_update();
    let mut seen = up.catalog();
    // Nothing to follow before something connects it (the warm-up, a caller, a supervisor).
    if !up.is_connected() && !next_connect(&mut events, &mut last, &stop).await {
        return;
    }
    let mut kept = KeptListen::new(
        up.clone(),
        Box::new(lists::filter),
        RESUBSCRIBE,
        stop.clone(),
        "tool and prompt lists",
    );
    while let Some(heard) = kept.next().await {
        match heard {
            Heard::Acknowledged { on, accepted } => {
                // What changed since the connect's catalog was fetched, or across a reconnect,
                // shows in a fresh list.
                refresh(&up, &on, Lists::from_rmcp(&accepted)).await;
                announce_differences(&mut seen, up.catalog(), &feed);
            }
            Heard::Notification(on, n) => {
                let list = match n {
                    ServerNotification::ToolListChangedNotification(_) => List::Tools,
                    ServerNotification::PromptListChangedNotification(_) => List::Prompts,
                    _ => continue,
                };
                changed(&up, &on, list, &mut seen, &feed).await;
            }
            Heard::Nothing(on) => {
                announce_differences(&mut seen, up.catalog(), &feed);
                // An older server tells the handler; either kind waits here for its next
                // connect, when the lists are looked at again.
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        r = events.changed() => if r.is_err() { return },
                    }
                    let now = *events.borrow_and_update();
                    let asked = now.changed_since(&last);
                    let reconnected = now.connects != last.connects;
                    last = now;
                    if reconnected {
                        break;
                    }
                    for list in List::ALL.into_iter().filter(|l| asked.has(*l)) {
                        changed(&up, &on, list, &mut seen, &feed).await;
                    }
                }
                kept.now();
            }
            Heard::Failed(e) => {
                tracing::info!(slug = %up.name, error = %e, "could not listen for the upstream's list changes");
                // A server that never said its lists change is not kept connected for them:
                // its next connect (by anyone) is soon enough to compare catalogs.
                let changing = up
                    .catalog()
                    .is_some_and(|c| c.modern && (c.tools_list_changed || c.prompts_list_changed));
                if !changing {
                    if !next_connect(&mut events, &mut last, &stop).await {
                        return;
                    }
                    kept.now();
                }
            }
        }
    }
}

/// Waits for `up`'s next connect (`events` past `last`); false once stopped.
async fn next_connect(
    events: &mut watch::Receiver<ListEvents>,
    last: &mut ListEvents,
    stop: &CancellationToken,
) -> bool {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return false,
            r = events.changed() => if r.is_err() { return false },
        }
        let now = *events.borrow_and_update();
        let connected = now.connects != last.connects;
        *last = now;
        if connected {
            return true;
        }
    }
}

/// The upstream said `list` changed: fetch it again, then tell the gateway's listens (even
/// when it reads the same: the upstream knows better, and a listener lists once more).
async fn changed(
    up: &Arc<Upstream>,
    on: &HeardOn,
    list: List,
    seen: &mut Option<Arc<Catalog>>,
    feed: &ChangeFeed,
) {
    refresh(
        up,
        on,
        Lists {
            tools: list == List::Tools,
            prompts: list == List::Prompts,
        },
    )
    .await;
    feed.publish(list.key());
    *seen = up.catalog();
}

async fn refresh(up: &Upstream, on: &HeardOn, lists: Lists) {
    for list in List::ALL.into_iter().filter(|l| lists.has(*l)) {
        if let Err(e) = up.refresh_list(on, list).await {
            tracing::info!(slug = %up.name, list = list.field(), error = %e, "could not fetch the upstream's list again");
        }
    }
}

/// Publishes each list that differs between `seen` and `now` (a slug never connected before
/// lists nothing), and remembers `now`.
fn announce_differences(
    seen: &mut Option<Arc<Catalog>>,
    now: Option<Arc<Catalog>>,
    feed: &ChangeFeed,
) {
    let Some(after) = now else { return };
    let before = seen.take().unwrap_or_default();
    if before.tools != after.tools {
        feed.publish(TOOLS_CHANGED);
    }
    if before.prompts != after.prompts {
        feed.publish(PROMPTS_CHANGED);
    }
    *seen = Some(after);
}

#[cfg(test)]
#[path = "lists_tests.rs"]
mod tests;
