//! [`Lookout`]: when a follower of a JetStream stream looks at the stream again, as NATS
//! tells it to, never on a clock while the stream is there.
//!
//! A follower's consumer (async-nats's ordered consumer, or a key-value watch, which is one)
//! goes on by itself across a reconnect, from where it was. If NATS came back without its
//! data and the stream was made again, that is past all the new stream holds, and the
//! consumer waits in silence for what never comes. So a follower looks at its stream (one
//! request) when
//! - the client connected again (async-nats's events, through [`Connection::events`], and
//!   the client's own count of connects);
//! - the stream was made: JetStream's advisory `$JS.EVENT.ADVISORY.STREAM.CREATED.<stream>`,
//!   on a core subscription that async-nats renews across reconnects (another host made the
//!   stream again after this one last looked);
//! - a look went unanswered (NATS not back yet, or between leaders), or found the stream
//!   gone (the advisory can come before the stream can be looked up, and an account may not
//!   be let subscribe to it): again after a pause of [`AGAIN`], until the stream is there.
//!
//! A stream deleted and made again with no reconnect is found by [`Follow`] without any of
//! them too: its consumer went with it, and async-nats reports the missed heartbeats.
//!
//! [`Follow`]: crate::nats::ordered::Follow

use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::StreamExt;

use super::Connection;
use crate::runtime::backoff::Backoff;

/// The pause before looking again after a look that did not find the stream (NATS did not
/// answer, or the stream is gone): 200 ms doubling to 10 s, started over by one that finds it.
pub const AGAIN: Backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(10));

/// Tells a follower of one stream when to look at it again. See the module docs.
pub struct Lookout {
    client: async_nats::Client,
    /// The connection's events (`None` once the client is closed).
    events: Option<tokio::sync::watch::Receiver<()>>,
    /// The client's count of connects when the last look started.
    seen: u64,
    /// The advisory subject of the stream's creation.
    subject: String,
    /// Its subscription, made at the first look (`None` until then, and after it ended).
    made: Option<async_nats::Subscriber>,
    /// Set while the last look did not find the stream: the pauses before looking again,
    /// and when the next look is due.
    retry: Option<Backoff>,
    again_at: Option<tokio::time::Instant>,
}

impl Lookout {
    /// A lookout for `stream` on `conn`: nothing is due until something happens after the
    /// first look ([`Lookout::looking`]) ends ([`Lookout::found`]).
    pub fn new(conn: &Connection, stream: &str) -> Lookout {
        let mut events = conn.events.clone();
        events.mark_unchanged();
        Lookout {
            seen: conn.client.statistics().connects.load(Ordering::Relaxed),
            client: conn.client.clone(),
            events: Some(events),
            subject: format!("$JS.EVENT.ADVISORY.STREAM.CREATED.{stream}"),
            made: None,
            retry: None,
            again_at: None,
        }
    }

    /// Whether the last look found the stream (or none has ended yet).
    pub fn settled(&self) -> bool {
        self.retry.is_none()
    }

    /// Whether the client connected again since the last look started.
    pub fn reconnected(&self) -> bool {
        self.client.statistics().connects.load(Ordering::Relaxed) != self.seen
    }

    /// A look starts now. The first one subscribes to the stream's creation first, so that
    /// a stream made after the look is told.
    pub async fn looking(&mut self) {
        if self.made.is_none() {
            self.made = self.client.subscribe(self.subject.clone()).await.ok();
        }
        if let Some(e) = &mut self.events {
            e.mark_unchanged();
        }
        self.seen = self.client.statistics().connects.load(Ordering::Relaxed);
    }

    /// Whether the look found the stream: if not (no answer, or the stream gone), another
    /// is due after a pause.
    pub fn found(&mut self, yes: bool) {
        if yes {
            self.retry = None;
            self.again_at = None;
        } else {
            let pause = self.retry.get_or_insert(AGAIN).next_delay();
            self.again_at = Some(tokio::time::Instant::now() + pause);
        }
    }

    /// Waits until a look is due: the client connected again, the stream was made, or a
    /// look did not find the stream and its pause is over. Cancel-safe.
    pub async fn due(&mut self) {
        loop {
            if self.reconnected() {
                return;
            }
            tokio::select! {
                changed = changed_or_pending(&mut self.events) => {
                    if changed.is_err() {
                        // The client is closed: no connect comes any more.
                        self.events = None;
                    }
                }
                advisory = next_or_pending(&mut self.made) => match advisory {
                    Some(_) => return,
                    None => self.made = None,
                },
                () = sleep_or_pending(self.again_at) => {
                    // Due once: the look's answer sets the next.
                    self.again_at = None;
                    return;
                }
            }
        }
    }
}

/// Applies each value `key` of `kv` takes, from the one it holds now, for as long as the
/// caller awaits it (it does not end). The watch is opened again, and gives the value held
/// once more, whenever the bucket's lookout is due (a reconnect, the bucket made: a watch
/// async-nats made again across a reconnect goes on from where it was, past all a bucket
/// made anew holds), and after a pause when it ends or cannot be opened.
pub async fn follow_key(
    conn: &Connection,
    kv: &async_nats::jetstream::kv::Store,
    key: &str,
    mut apply: impl FnMut(&[u8]),
) {
    let mut lookout = Lookout::new(conn, &kv.stream_name);
    loop {
        lookout.looking().await;
        match kv.watch_with_history(key).await {
            Ok(mut watch) => {
                lookout.found(true);
                loop {
                    tokio::select! {
                        entry = watch.next() => match entry {
                            Some(Ok(e)) => apply(&e.value),
                            // async-nats would make its consumer again by itself, from
                            // where it was: opened again instead, after a pause.
                            Some(Err(_)) | None => {
                                lookout.found(false);
                                lookout.due().await;
                                break;
                            }
                        },
                        () = lookout.due() => break,
                    }
                }
            }
            Err(e) => {
                tracing::debug!(key, error = %e, "cannot watch the key yet; trying again");
                lookout.found(false);
                lookout.due().await;
            }
        }
    }
}

async fn changed_or_pending(
    events: &mut Option<tokio::sync::watch::Receiver<()>>,
) -> Result<(), tokio::sync::watch::error::RecvError> {
    match events {
        Some(c) => c.changed().await,
        None => std::future::pending().await,
    }
}

async fn next_or_pending(made: &mut Option<async_nats::Subscriber>) -> Option<async_nats::Message> {
    match made {
        Some(s) => s.next().await,
        None => std::future::pending().await,
    }
}

async fn sleep_or_pending(until: Option<tokio::time::Instant>) {
    match until {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}
