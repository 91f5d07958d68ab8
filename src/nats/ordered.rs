//! [`Follow`]: the one way herald follows a JetStream stream in order (a gateway's mirror of
//! published event logs, `nats::events`; every Slack process applying its workspace's stream,
//! `source::slack::shared`).
//!
//! It is an ordered push consumer (ephemeral, no acks, flow control and idle heartbeats, which
//! async-nats keeps in order and re-creates across reconnects) that this type re-creates
//! itself whenever it fails or ends: after the pause of a [`Backoff`], from the stream
//! sequence after the last message it yielded, so a follower loses and repeats nothing (what
//! the stream's limits dropped meanwhile is simply not delivered; the follower sees the jump in
//! sequences). A message's stream sequence comes with it, and so does what the server said
//! was still pending after it (0: caught up, as of its sending).
//!
//! A stream that starts over (NATS lost its data, and it was made again: another stream
//! under the same name, its creation time another) is followed again from its start. That is
//! checked before each consumer is made, before the first message after a reconnect
//! (async-nats re-creates a consumer across a reconnect by itself, from where it was: on a
//! stream made again that may be past all it holds), and whenever the follower's
//! [`Lookout`] says (a reconnect, the stream made, a check that did not find it): never on
//! a clock while the stream is there. A stream gone, or a check NATS did not answer, is
//! looked at again with a backoff, and no message is passed on until one finds the stream.
//! Messages read twice so are passed on twice: followers keep what they applied by its own
//! numbering. A follower told how to make the stream ([`Follow::remaking`]) makes it again
//! when it is gone, with a warning and a count (`herald_nats_streams_remade_total`).
//!
//! It adds no queue: a message is read from the consumer's subscription (async-nats's bounded
//! channel) only when [`Follow::next`] is called, so a slow follower slows the consumer's
//! flow control, never grows memory. It stops when its cancellation token is cancelled.

use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream};
use futures::StreamExt;
use tokio_util::sync::CancellationToken;

use crate::nats::Connection;
use crate::nats::lookout::Lookout;
use crate::runtime::backoff::Backoff;

/// The pause before re-creating a consumer that failed: 200 ms doubling to 10 s, started over
/// by the next message delivered.
pub const RETRY: Backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(10));

/// One message of the stream, in order.
#[derive(Debug)]
pub struct Delivered {
    pub message: jetstream::Message,
    /// Its stream sequence.
    pub sequence: u64,
    /// Messages matching the filter still to come after it, as the server counted when it sent
    /// it (0: this was the last one then).
    pub pending: u64,
}

/// Follows one stream (or one subject of it) from a sequence, in order. See the module docs.
pub struct Follow {
    client: async_nats::Client,
    stream: stream::Stream,
    /// The filter subject (empty: the whole stream).
    subject: String,
    /// The next stream sequence wanted (0 or 1: from the start).
    next: u64,
    messages: Option<consumer::push::Ordered>,
    backoff: Backoff,
    shutdown: CancellationToken,
    remake: Option<Remake>,
    /// When the followed stream was made: another time is another stream.
    created: i128,
    /// When to check the stream again.
    lookout: Lookout,
}

/// What a look at the followed stream found.
enum Look {
    /// The stream followed.
    Same,
    /// Another (made again): followed from its start.
    Reset,
    /// Nothing sure: NATS did not answer, or the stream is gone and this follower cannot make
    /// it. Looked at again after a pause; no consumer is made or read meanwhile.
    Unsure,
}

/// How a follower makes its stream again when it is gone.
struct Remake {
    js: jetstream::Context,
    config: stream::Config,
    remade: crate::runtime::metrics::Counter,
}

impl Follow {
    /// Follows `subject` of `stream` (empty: all of it) from stream sequence `from` (0 or 1:
    /// from the start) until `shutdown`; the consumer is made at the first
    /// [`next`](Self::next).
    pub fn new(
        conn: &Connection,
        stream: stream::Stream,
        subject: impl Into<String>,
        from: u64,
        shutdown: CancellationToken,
    ) -> Follow {
        let info = stream.cached_info();
        Follow {
            client: conn.client.clone(),
            created: info.created.unix_timestamp_nanos(),
            lookout: Lookout::new(conn, &info.config.name),
            stream,
            subject: subject.into(),
            next: from,
            messages: None,
            backoff: RETRY,
            shutdown,
            remake: None,
        }
    }

    /// Makes the stream again with `config` (counted in `remade`) when it is gone.
    pub fn remaking(
        mut self,
        js: jetstream::Context,
        config: stream::Config,
        remade: crate::runtime::metrics::Counter,
    ) -> Follow {
        self.remake = Some(Remake { js, config, remade });
        self
    }

    /// Looks at the stream: is it the one followed, another (lost and made again: made at
    /// another time, or its sequences went back below where this follower was; it is then
    /// followed from its start), or not found (see [`Look`])?
    async fn check_reset(&mut self) -> Look {
        self.lookout.looking().await;
        let info = match self.stream.get_info().await {
            Ok(info) => info,
            // No answer: looked at again after a pause.
            Err(_) if !self.gone().await => {
                self.lookout.found(false);
                return Look::Unsure;
            }
            // Gone for certain: made again when this follower knows how. Otherwise looked for
            // after a pause and when the lookout says; a stream made again under the name has
            // another creation time, and is followed from its start (async-nats's consumer
            // would resume in it from here).
            Err(_) => {
                if self.remake().await {
                    self.lookout.found(true);
                    return Look::Reset;
                }
                self.lookout.found(false);
                return Look::Unsure;
            }
        };
        self.lookout.found(true);
        let made = info.created.unix_timestamp_nanos();
        let other = made != self.created;
        self.created = made;
        if other || (self.next > 1 && info.state.last_sequence + 1 < self.next) {
            tracing::warn!(
                stream = %self.name(),
                was_at = self.next,
                "the stream starts over (NATS lost it and it was made again); following it from its start"
            );
            self.next = 0;
            return Look::Reset;
        }
        Look::Same
    }

    /// Makes the stream again when it is gone and this follower knows how: `true` when it
    /// did (followed from its start).
    async fn remade(&mut self) -> bool {
        self.remake.is_some() && self.gone().await && self.remake().await
    }

    /// Whether the stream is gone for certain (JetStream says it is not found). (No `&self`
    /// across the await: the consumer held is not `Sync`.)
    async fn gone(&mut self) -> bool {
        let js = jetstream::new(self.client.clone());
        let name = self.name().to_owned();
        crate::nats::stream_gone(&js, &name).await
    }

    /// Makes the stream again, when this follower knows how: `true` when it did.
    async fn remake(&mut self) -> bool {
        let Some(r) = &self.remake else { return false };
        let name = self.name().to_owned();
        match r.js.create_stream(r.config.clone()).await {
            Ok(s) => {
                r.remade.inc();
                tracing::warn!(stream = %name, "the stream was gone (NATS lost its data); made it again, and following it from its start");
                self.created = s.cached_info().created.unix_timestamp_nanos();
                self.stream = s;
                self.next = 0;
                true
            }
            Err(_) => false,
        }
    }

    /// The same, with the consumer made now: an error (the stream missing, no permission,
    /// NATS away) is the caller's to report.
    pub async fn start(
        conn: &Connection,
        stream: stream::Stream,
        subject: impl Into<String>,
        from: u64,
        shutdown: CancellationToken,
    ) -> Result<Follow, String> {
        let mut f = Follow::new(conn, stream, subject, from, shutdown);
        f.lookout.looking().await;
        f.messages = Some(consumer(&f.client, &f.stream, &f.subject, f.next).await?);
        Ok(f)
    }

    /// Paces re-creation with `backoff` instead of [`RETRY`].
    pub fn with_backoff(mut self, backoff: Backoff) -> Follow {
        self.backoff = backoff;
        self
    }

    /// The stream sequence the next message will have at least (where a new consumer starts).
    pub fn resume_at(&self) -> u64 {
        self.next.max(1)
    }

    /// The next message in stream order, waiting for it (and re-creating the consumer as often
    /// as it takes); `None` once the shutdown token is cancelled.
    pub async fn next(&mut self) -> Option<Delivered> {
        loop {
            if self.shutdown.is_cancelled() {
                return None;
            }
            let Some(messages) = self.messages.as_mut() else {
                // A consumer only in a stream that was found (one made from `next` in another
                // would resume there).
                if let Look::Unsure = self.check_reset().await {
                    tracing::warn!(stream = %self.name(), "the stream is not there, or NATS does not answer; looking again");
                    if !self.pause().await {
                        return None;
                    }
                    continue;
                }
                let made = tokio::select! {
                    _ = self.shutdown.cancelled() => return None,
                    m = consumer(&self.client, &self.stream, &self.subject, self.next) => m,
                };
                match made {
                    Ok(m) => self.messages = Some(m),
                    Err(_) if self.remade().await => {}
                    Err(e) => {
                        tracing::warn!(stream = %self.name(), error = %e, "cannot follow the stream; retrying");
                        if !self.pause().await {
                            return None;
                        }
                    }
                }
                continue;
            };
            let got = tokio::select! {
                _ = self.shutdown.cancelled() => return None,
                m = messages.next() => m,
                () = self.lookout.due() => {
                    if let Look::Reset = self.check_reset().await {
                        self.messages = None;
                    }
                    continue;
                }
            };
            match got {
                Some(Ok(message)) => {
                    // After a reconnect async-nats makes the consumer again by itself, from
                    // where it was: in a stream made again, that is not where this follower
                    // is. Checked before its first message is passed on, and before each
                    // while the last look did not find the stream.
                    if self.lookout.reconnected() || !self.lookout.settled() {
                        match self.check_reset().await {
                            Look::Same => {}
                            Look::Reset => {
                                self.messages = None;
                                continue;
                            }
                            Look::Unsure => {
                                self.messages = None;
                                if !self.pause().await {
                                    return None;
                                }
                                continue;
                            }
                        }
                    }
                    let Ok(info) = message.info() else {
                        // Not a stream message (async-nats passes only those on): skipped.
                        continue;
                    };
                    let (sequence, pending) = (info.stream_sequence, info.pending);
                    if sequence < self.next {
                        // Delivered already (a consumer re-created by async-nats itself).
                        continue;
                    }
                    self.next = sequence + 1;
                    self.backoff.reset();
                    return Some(Delivered {
                        message,
                        sequence,
                        pending,
                    });
                }
                Some(Err(e)) => {
                    tracing::debug!(stream = %self.name(), error = %e, from = self.resume_at(), "the stream's consumer failed; following it again");
                    self.messages = None;
                    if !self.pause().await {
                        return None;
                    }
                }
                None => {
                    tracing::debug!(stream = %self.name(), from = self.resume_at(), "the stream's consumer ended; following it again");
                    self.messages = None;
                    if !self.pause().await {
                        return None;
                    }
                }
            }
        }
    }

    fn name(&self) -> &str {
        &self.stream.cached_info().config.name
    }

    /// Waits out the backoff, or until the lookout says to look (the stream made, a
    /// reconnect); `false` if shut down meanwhile.
    async fn pause(&mut self) -> bool {
        let delay = self.backoff.next_delay();
        tokio::select! {
            _ = self.shutdown.cancelled() => false,
            _ = tokio::time::sleep(delay) => true,
            () = self.lookout.due() => true,
        }
    }
}

/// A new ordered consumer of `subject` (empty: all) in `stream`, from stream sequence `next`
/// (0 or 1: from the start). (Not a method: [`Follow`] holds async-nats's consumer, which is
/// not `Sync`, so no borrow of it may live across this await.)
async fn consumer(
    client: &async_nats::Client,
    stream: &stream::Stream,
    subject: &str,
    next: u64,
) -> Result<consumer::push::Ordered, String> {
    let deliver_policy = match next {
        0 | 1 => consumer::DeliverPolicy::All,
        n => consumer::DeliverPolicy::ByStartSequence { start_sequence: n },
    };
    stream
        .create_consumer(consumer::push::OrderedConfig {
            deliver_subject: client.new_inbox(),
            filter_subject: subject.to_owned(),
            deliver_policy,
            ..Default::default()
        })
        .await
        .map_err(|e| e.to_string())?
        .messages()
        .await
        .map_err(|e| e.to_string())
}
