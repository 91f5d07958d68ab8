//! Event logs across hosts on NATS JetStream: a role publishes every event-log ring it keeps
//! (`--publish-events nats://…`), and a gateway on another host serves them for a `[[slug]]`
//! with `nats = "…"`, with no connection to the role itself.
//!
//! - **Publishing.** [`Publisher::start`] installs the role context's ring tap
//!   ([`RoleContext::install_tap`]): every ring made with `tapped(uri, ctx.tap())` (memo's log, each
//!   file and k8s watch) sends each event, in push order, to one task that publishes it on
//!   `herald.events.<name>.<h>` of the stream `herald_events`. Sealed ([`Seal`], the
//!   deployment's key): `h` is a keyed hash of the URI, and the URI, the event, its publisher
//!   and push time are the sealed body, the seq a header; in the clear
//!   (`--publish-plaintext`): `h` is 16 hex digits of SHA-256 of the URI, the URI, seq,
//!   publisher and push time are headers, the event's JSON the body. The stream keeps the
//!   last [`PER_URI`] events of each URI for [`MAX_AGE`]. The source's `events/list` goes to
//!   the key `<name>.catalog` of the bucket `herald_events` (sealed too), so the other side
//!   can list the event types. The name is claimed first (`claim.rs`). A full queue drops
//!   (counted), never blocks a push; an event NATS refuses is retried in order; a stream NATS
//!   lost is made again once ([`remake`]).
//! - **Serving** ([`Mirror`], a [`Source`]): follows `herald.events.<name>.>` from the start
//!   ([`Follow`], resuming after the last message applied when its consumer is made again)
//!   and keeps a ring per URI under the publisher's own seqs ([`EventRing::mirror`]), so
//!   cursors, reads, `read_json_after` anchors and pages and long polls behave as at the
//!   source (over the last [`PER_URI`] events, whatever the source's capacity). A listen
//!   to an event-log URI is admitted whether or not it has events yet (they come when the
//!   source publishes them); `events/poll` maps its arguments to the URI as the source would
//!   (the mapping is handed in: roles never import each other). The source's tools are not
//!   served: this is a read-only view of its event logs.
//!
//! A mirror keeps what it received as it was numbered: a hole in the seqs (events it never
//! received) stays a hole that readers see as a GAP or `truncated`, and a reader whose cursor
//! is past the mirror's head waits rather than being sent events again. Each event names its
//! publisher; events of another publisher below a ring's head (a restart whose clock is
//! behind) start that ring over, which readers of the old numbering see. A mirror keeps at
//! most 4,096 rings; past that, the stalest goes.

use crate::sync::{Recover, RecoverRw};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use async_nats::jetstream::{self, kv, stream};
use async_trait::async_trait;
use futures::StreamExt;
use rmcp::model::{JsonObject, Resource};
use serde_json::{Value, json};
use sha2::Digest;

use crate::mcp::events::{self, PollRequest};
use crate::mcp::hub::ChangeFeed;
use crate::mcp::ring::{DEFAULT_RING_CAPACITY, EVENT_LOG_MIME, EventRing};
use crate::mcp::source::{
    Admission, Caller, Contents, ListenFilter, Read, Source, SourceError, SourceInfo, WatchGuard,
};
use crate::nats::NatsConfig;
use crate::nats::ordered::Follow;
pub use crate::nats::seal::Seal;
use crate::runtime::backoff::Backoff;
use crate::runtime::context::RoleContext;
use crate::runtime::tap::{Tap, Tapped};

/// The stream every published event log goes to.
pub const STREAM: &str = "herald_events";
/// The bucket of the publishers' catalogs.
pub const BUCKET: &str = "herald_events";
/// Events kept per URI in the stream.
pub const PER_URI: i64 = DEFAULT_RING_CAPACITY as i64;
/// How long the stream keeps an event.
pub const MAX_AGE: Duration = Duration::from_secs(24 * 3600);
/// Events waiting to be published before the tap drops.
const QUEUE: usize = 8192;
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(10);
/// Most URIs a mirror keeps rings for; past it, the one whose newest event is oldest goes.
const MAX_RINGS: usize = 4096;
/// Refusals of one event by JetStream before it is given up (retrying will not fix them;
/// timeouts and a lost connection are retried for as long as they last).
const PUBLISH_TRIES: u32 = 5;
/// Longest a request waits for a starting mirror to catch up.
const READY_WAIT: Duration = Duration::from_secs(5);
const RETRY: Backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(10));
const URI_HEADER: &str = "Herald-Uri";
const SEQ_HEADER: &str = "Herald-Seq";
const TS_HEADER: &str = "Herald-Ts";
/// Which process published an event (`host:pid:random`).
const PUBLISHER_HEADER: &str = "Herald-Publisher";
/// Marks a sealed event: its URI and text are in the payload, sealed ([`Seal`]).
const SEALED_HEADER: &str = "Herald-Sealed";

/// The subject of `uri`'s events published as `name`.
pub fn subject(name: &str, uri: &str) -> String {
    let h = sha2::Sha256::digest(uri.as_bytes());
    format!("herald.events.{name}.{}", hex::encode(&h[..8]))
}

/// Whether `name` can name a publisher (a subject token).
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The stream's configuration.
fn stream_config() -> stream::Config {
    stream::Config {
        name: STREAM.into(),
        description: Some("herald event logs, published by role processes".into()),
        subjects: vec!["herald.events.>".into()],
        max_messages_per_subject: PER_URI,
        max_age: MAX_AGE,
        discard: stream::DiscardPolicy::Old,
        storage: stream::StorageType::File,
        ..Default::default()
    }
}

/// Makes (or opens) the stream and the bucket.
async fn open(
    js: &jetstream::Context,
    servers: &str,
) -> Result<(stream::Stream, kv::Store), String> {
    let stream = js
        .get_or_create_stream(stream_config())
        .await
        .map_err(|e| {
            format!("cannot open or make the stream {STREAM} at {servers} ({e}); JetStream must be on (nats-server -js)")
        })?;
    let kv = crate::nats::bucket(
        js,
        BUCKET,
        "herald event-log publishers' catalogs",
        1,
        servers,
    )
    .await?;
    Ok((stream, kv))
}

/// Publishes this process's event logs.
pub struct Publisher;

/// The longest wait between two tries to reach NATS for publishing.
const CONNECT_MAX: Duration = Duration::from_secs(30);

impl Publisher {
    /// Installs the ring tap (call it before the source makes its rings) and publishes from
    /// then on. NATS not answering yet is no reason to stop a start: the publisher keeps
    /// trying with backoff (at most [`CONNECT_MAX`] apart) while `/ready` names it
    /// (`events nats`), and what the rings push meanwhile waits in the tap's bounded queue (a
    /// burst past it is dropped and counted; a mirror sees the GAP). The catalog is written
    /// once both the sources and the connection are there ([`PublisherHandle::catalog_of`]).
    pub async fn start(
        cfg: &NatsConfig,
        name: &str,
        seal: Option<Seal>,
        ctx: &RoleContext,
    ) -> Result<PublisherHandle, String> {
        if !valid_name(name) {
            return Err(format!(
                "--publish-as {name:?}: use letters, digits, '_' and '-'"
            ));
        }
        let (tx, rx) = tokio::sync::mpsc::channel(QUEUE);
        let counts = crate::nats::NatsMetrics::register(ctx.metrics());
        let tap = Tap::new(tx, counts.events_publish_dropped.clone());
        if !ctx.install_tap(tap.clone()) {
            return Err("event logs are published once per process".into());
        }
        let client = crate::nats::enter_later(ctx, "events", cfg);
        let handle = PublisherHandle {
            name: name.to_owned(),
            state: Arc::default(),
            seal: seal.clone(),
        };
        // The first try is inline, so a healthy start writes its catalog before it serves,
        // and a name another process holds is refused before it serves.
        let me = super::holder::identity();
        let first = match reach(cfg, ctx.metrics(), &client).await {
            Ok((js, kv)) => {
                let revision = super::claim::claim(&kv, name, &me).await?;
                Ok((js, kv, revision))
            }
            Err(e) => Err(e),
        };
        let (cfg, name, state, metrics) = (
            cfg.clone(),
            name.to_owned(),
            handle.state.clone(),
            ctx.metrics().clone(),
        );
        if let Ok((_, kv, _)) = &first {
            state.locked().kv = Some(kv.clone());
        }
        let ctx2 = ctx.clone();
        ctx.spawn_until_shutdown("events nats publish", async move {
            let mut backoff =
                crate::runtime::backoff::Backoff::new(Duration::from_secs(1), CONNECT_MAX);
            let mut tried = first;
            let (js, kv, revision) = loop {
                match tried {
                    Ok(ok) => break ok,
                    Err(e) => tracing::warn!(error = %e, "cannot publish event logs to NATS yet; trying again"),
                }
                tokio::time::sleep(backoff.next_delay()).await;
                tried = match reach(&cfg, &metrics, &client).await {
                    // (Another process holding the name: asked again until its claim is
                    // stale.)
                    Ok((js, kv)) => super::claim::claim(&kv, &name, &me)
                        .await
                        .map(|revision| (js, kv, revision)),
                    Err(e) => Err(e),
                };
            };
            // A claim made again after NATS lost the bucket puts the catalog back too.
            let reclaimed: super::claim::Reclaimed = {
                let (kv, name, state, seal) = (kv.clone(), name.clone(), state.clone(), seal.clone());
                Box::new(move || {
                    let (kv, name, seal) = (kv.clone(), name.clone(), seal.clone());
                    let last = state.locked().last.clone();
                    Box::pin(async move {
                        if let Some(v) = last {
                            put_catalog(&kv, &name, v, seal.as_ref()).await;
                        }
                    })
                })
            };
            let lost = super::claim::keep(kv.clone(), &name, &me, revision, reclaimed, &ctx2);
            let pending = {
                let mut st = state.locked();
                st.kv = Some(kv.clone());
                st.pending.take()
            };
            if let Some(v) = pending {
                put_catalog(&kv, &name, v, seal.as_ref()).await;
            }
            publish(js, name, me, seal, lost, state, rx, tap, counts).await
        });
        Ok(handle)
    }
}

/// One try to reach NATS for publishing: connect (within 20 s), then the stream and bucket.
async fn reach(
    cfg: &NatsConfig,
    metrics: &crate::runtime::metrics::Metrics,
    client: &std::sync::OnceLock<async_nats::Client>,
) -> Result<(jetstream::Context, kv::Store), String> {
    let servers = cfg.redacted();
    let c = tokio::time::timeout(Duration::from_secs(20), cfg.connect(metrics))
        .await
        .map_err(|_| format!("no NATS server answered at {servers} within 20 s"))??
        .client;
    let js = jetstream::new(c.clone());
    let (_, kv) = open(&js, &servers).await?;
    // On the status board's entry only once usable: a try that failed leaves nothing.
    let _ = client.set(c);
    Ok((js, kv))
}

/// Where the catalog goes: the bucket once connected, and until then the catalog to write.
#[derive(Default)]
struct CatalogState {
    kv: Option<kv::Store>,
    pending: Option<Value>,
    /// The catalog last written, put back when the bucket is made again.
    last: Option<Value>,
}

/// Writes the catalog once the source exists.
pub struct PublisherHandle {
    name: String,
    state: Arc<Mutex<CatalogState>>,
    seal: Option<Seal>,
}

impl PublisherHandle {
    /// Puts `source`'s event types (and instructions) where the mirrors read them.
    pub async fn catalog(&self, source: &dyn Source) {
        self.catalog_of(&[source]).await
    }

    /// The same for several roles publishing under one name (`herald up`'s `[publish]`).
    /// Before the publisher has reached NATS, it is written as soon as it does.
    pub async fn catalog_of(&self, sources: &[&dyn Source]) {
        let caller = Caller::local();
        let mut events = Vec::new();
        let mut instructions = Vec::new();
        for source in sources {
            events.extend(source.events_list(&caller).await.unwrap_or_default());
            if let Some(i) = source.info().instructions {
                instructions.push(i);
            }
        }
        let v =
            json!({"events": events, "name": self.name, "instructions": instructions.join(" ")});
        let kv = {
            let mut st = self.state.locked();
            st.last = Some(v.clone());
            match st.kv.clone() {
                Some(kv) => kv,
                None => {
                    st.pending = Some(v);
                    return;
                }
            }
        };
        put_catalog(&kv, &self.name, v, self.seal.as_ref()).await;
    }
}

async fn put_catalog(kv: &kv::Store, name: &str, v: Value, seal: Option<&Seal>) {
    let key = format!("{name}.catalog");
    let value = match seal {
        Some(seal) => seal.seal_catalog(&key, &v),
        None => v.to_string().into_bytes(),
    };
    match kv.put(&key, value.into()).await {
        Ok(_) => tracing::info!(
            publisher = name,
            "event logs published to NATS, catalog written"
        ),
        Err(e) => tracing::warn!(error = %e, "cannot write the event-log catalog to NATS"),
    }
}

/// Makes the stream and the bucket again after NATS lost them, and puts the catalog back:
/// `true` when they are there again.
async fn remake(
    js: &jetstream::Context,
    name: &str,
    catalog: &Mutex<CatalogState>,
    seal: Option<&Seal>,
    counts: &crate::nats::NatsMetrics,
) -> bool {
    // Only a stream that is gone: "no stream" also answers a stream between leaders.
    if !crate::nats::stream_gone(js, STREAM).await {
        return false;
    }
    let Ok((_, kv)) = open(js, name).await else {
        return false;
    };
    counts.remade.inc();
    tracing::warn!(
        publisher = name,
        "the event-log stream was gone (NATS lost its data); made it again: mirrors see the events from here on, readers of what was lost see truncated"
    );
    let last = {
        let mut st = catalog.locked();
        st.kv = Some(kv.clone());
        st.last.clone()
    };
    if let Some(v) = last {
        put_catalog(&kv, name, v, seal).await;
    }
    true
}

#[allow(clippy::too_many_arguments)]
async fn publish(
    js: jetstream::Context,
    name: String,
    me: String,
    seal: Option<Seal>,
    lost: Arc<std::sync::atomic::AtomicBool>,
    catalog: Arc<Mutex<CatalogState>>,
    mut rx: tokio::sync::mpsc::Receiver<Tapped>,
    tap: Tap,
    counts: crate::nats::NatsMetrics,
) {
    let mut backoff = RETRY;
    while let Some(t) = rx.recv().await {
        // The name was taken over: nothing more goes out under it (counted as dropped).
        if lost.load(std::sync::atomic::Ordering::Acquire) {
            tap.dropped();
            continue;
        }
        let (subject, payload) = match &seal {
            Some(seal) => {
                let subject = seal.subject(&name, &t.uri);
                let sealed = seal.seal(&subject, t.seq, &t.uri, &t.text, &me, t.ts_ms);
                (subject, bytes::Bytes::from(sealed))
            }
            None => (subject(&name, &t.uri), bytes::Bytes::from(t.text.clone())),
        };
        // A retry after a lost acknowledgement is dropped by the stream, not stored twice.
        let id = format!("{subject}:{}", t.seq);
        let mut tries = 0;
        let mut remade = false;
        loop {
            tries += 1;
            let mut msg = jetstream::message::PublishMessage::build()
                .payload(payload.clone())
                .message_id(&id)
                .header(SEQ_HEADER, t.seq.to_string().as_str());
            msg = match seal {
                Some(_) => msg.header(SEALED_HEADER, "1"),
                None => msg
                    .header(URI_HEADER, &*t.uri)
                    .header(PUBLISHER_HEADER, me.as_str())
                    .header(TS_HEADER, t.ts_ms.to_string().as_str()),
            };
            let clock = std::time::Instant::now();
            let r = tokio::time::timeout(PUBLISH_TIMEOUT, async {
                js.send_publish(subject.clone(), msg).await?.await
            })
            .await;
            let transient = match &r {
                Err(_) => true,
                Ok(Err(e)) => matches!(
                    e.kind(),
                    jetstream::context::PublishErrorKind::TimedOut
                        | jetstream::context::PublishErrorKind::BrokenPipe
                        | jetstream::context::PublishErrorKind::MaxAckPending
                ),
                Ok(Ok(_)) => false,
            };
            if transient {
                tries -= 1;
            }
            // The stream is gone (NATS lost its data): made again (once per event), with
            // the bucket and the catalog, and the event sent again at once.
            if let Ok(Err(e)) = &r
                && e.kind() == jetstream::context::PublishErrorKind::StreamNotFound
                && !remade
            {
                remade = true;
                if remake(&js, &name, &catalog, seal.as_ref(), &counts).await {
                    continue;
                }
            }
            match r {
                Ok(Ok(_)) => {
                    counts.publish_seconds.observe(clock.elapsed());
                    backoff = RETRY;
                    break;
                }
                other => {
                    counts.publish_failures.inc();
                    let why = match other {
                        Ok(Err(e)) => e.to_string(),
                        _ => "no acknowledgement in time".into(),
                    };
                    if tries >= PUBLISH_TRIES {
                        tap.dropped();
                        tracing::warn!(error = %why, seq = t.seq, "cannot publish an event log's event to NATS; giving it up (mirrors report the hole as truncated)");
                        break;
                    }
                    tracing::warn!(error = %why, "cannot publish an event log's event to NATS; retrying");
                    tokio::time::sleep(backoff.next_delay()).await;
                }
            }
        }
    }
}

/// One event as a mirror takes it.
struct Opened {
    uri: String,
    text: String,
    publisher: String,
    ts_ms: u64,
}

/// Maps an `events/poll`'s event type and arguments to the event-log URI the source would
/// poll (the roles' own mappings, handed in by whoever puts the mirror together).
pub type PollUri = fn(&str, &JsonObject) -> Result<String, SourceError>;

/// A gateway's view of the event logs a role publishes as `name`.
pub struct Mirror {
    name: String,
    servers: String,
    rings: Mutex<BTreeMap<String, Arc<EventRing>>>,
    /// Each URI's last publisher (a change with lower seqs is a restart, or a second process
    /// publishing under the same name).
    publishers: Mutex<std::collections::HashMap<String, String>>,
    feed: ChangeFeed,
    catalog: RwLock<Value>,
    poll_uri: PollUri,
    /// Set once the catalog is read and the stream applied through where it was at the start:
    /// requests wait for it (a while), so a gateway that just started answers as it will.
    ready: tokio::sync::watch::Sender<bool>,
    /// The deployment's key: only events sealed with it are taken. Without one, only events
    /// in the clear (`--publish-plaintext`).
    seal: Option<Seal>,
    /// Whether the log said that events are left out (sealed with another key, or not as
    /// this mirror takes them): it says so once.
    refused: std::sync::atomic::AtomicBool,
}

impl Mirror {
    /// The mirror of `name`'s event logs at `cfg`'s servers; it connects and follows on `ctx`
    /// (retrying until it can), so a gateway starts whether or not NATS is up.
    pub fn start(
        cfg: NatsConfig,
        name: &str,
        seal: Option<Seal>,
        poll_uri: PollUri,
        ctx: &RoleContext,
    ) -> Arc<Mirror> {
        let mirror = Arc::new(Mirror {
            name: name.to_owned(),
            servers: cfg.redacted(),
            rings: Mutex::new(BTreeMap::new()),
            publishers: Mutex::new(std::collections::HashMap::new()),
            feed: ChangeFeed::new(),
            catalog: RwLock::new(json!({})),
            poll_uri,
            ready: tokio::sync::watch::channel(false).0,
            seal,
            refused: Default::default(),
        });
        // On the board from the start: /ready waits while NATS is not reached.
        let client: Arc<std::sync::OnceLock<async_nats::Client>> = Arc::default();
        let seen = client.clone();
        ctx.status().add_backend(
            format!("{name} events nats"),
            cfg.redacted(),
            Arc::new(move || seen.get().is_some_and(crate::nats::connected)),
            ctx.shutdown().clone(),
        );
        ctx.spawn_until_shutdown(
            "events nats mirror",
            follow(mirror.clone(), cfg, client, ctx.clone()),
        );
        mirror
    }

    /// Waits (a few seconds at most) until the mirror has caught up after its start; an
    /// error saying so if it has not.
    async fn caught_up(&self) -> Result<(), SourceError> {
        let mut rx = self.ready.subscribe();
        match tokio::time::timeout(READY_WAIT, rx.wait_for(|r| *r)).await {
            Ok(Ok(_)) => Ok(()),
            _ => Err(SourceError::Unavailable(format!(
                "the event logs {} publishes are not loaded from NATS at {} yet (is NATS reachable from here?); try again in a moment",
                self.name, self.servers
            ))),
        }
    }

    /// The ring of `uri` (made for an event that arrived, or a poll; at most [`MAX_RINGS`]).
    fn ring(&self, uri: &str) -> Arc<EventRing> {
        let mut rings = self.rings.locked();
        if let Some(r) = rings.get(uri) {
            return r.clone();
        }
        if rings.len() >= MAX_RINGS
            && let Some(stalest) = rings
                .iter()
                .min_by_key(|(_, r)| r.newest_ts_ms().unwrap_or(0))
                .map(|(k, _)| k.clone())
        {
            rings.remove(&stalest);
            // (Never held while the rings are locked elsewhere: no lock order to keep.)
            self.publishers.locked().remove(&stalest);
        }
        let r = Arc::new(EventRing::mirror_of(PER_URI as usize));
        rings.insert(uri.to_owned(), r.clone());
        r
    }

    fn held(&self, uri: &str) -> Option<Arc<EventRing>> {
        self.rings.locked().get(uri).cloned()
    }

    /// An event-log URI: `memo://log` or a `*-events://` one.
    fn is_event_log(uri: &str) -> bool {
        uri == "memo://log"
            || uri
                .split_once("://")
                .is_some_and(|(scheme, _)| scheme.ends_with("-events"))
    }

    /// The catalog kept at `key`: opened with the key when this mirror has one (only a
    /// sealed one is taken then), as written otherwise.
    fn catalog_from(&self, key: &str, bytes: &[u8]) -> Option<Value> {
        match &self.seal {
            Some(seal) => seal.open_catalog(key, bytes),
            None => serde_json::from_slice(bytes).ok(),
        }
    }

    /// Says once that events are left out, and why.
    fn refuse(&self, why: &str) {
        use std::sync::atomic::Ordering;
        if !self.refused.swap(true, Ordering::Relaxed) {
            tracing::warn!(source = %self.name, "published events are left out: {why}");
        }
    }

    /// The URI, text, publisher and push time of `m`: opened with the key when sealed (then
    /// only: what it says of itself is in the sealed body, so a message sent again under
    /// other headers changes nothing), as sent when in the clear (then only without a key).
    fn event_of(&self, m: &async_nats::Message, seq: u64) -> Option<Opened> {
        let h = m.headers.as_ref()?;
        match (h.get(SEALED_HEADER).is_some(), &self.seal) {
            (true, Some(seal)) => {
                let opened = seal.open(m.subject.as_str(), seq, &m.payload).map(
                    |(uri, text, publisher, ts_ms)| Opened {
                        uri,
                        text,
                        publisher,
                        ts_ms,
                    },
                );
                if opened.is_none() {
                    self.refuse("they do not open with this HERALD_EVENTS_KEY (the publisher has another: every publisher and gateway of a deployment holds the same)");
                }
                opened
            }
            (true, None) => {
                self.refuse("they are sealed and this gateway has no HERALD_EVENTS_KEY: set the deployment's key");
                None
            }
            (false, Some(_)) => {
                self.refuse("they are in the clear and this gateway takes only events sealed with its HERALD_EVENTS_KEY (publish with the key, not --publish-plaintext)");
                None
            }
            (false, None) => Some(Opened {
                uri: h.get(URI_HEADER)?.as_str().to_owned(),
                text: std::str::from_utf8(&m.payload).ok()?.to_owned(),
                publisher: h
                    .get(PUBLISHER_HEADER)
                    .map(|v| v.as_str().to_owned())
                    .unwrap_or_default(),
                ts_ms: h
                    .get(TS_HEADER)
                    .and_then(|v| v.as_str().parse::<u64>().ok())
                    .unwrap_or_else(crate::mcp::ring::now_ms),
            }),
        }
    }

    fn apply(&self, m: &async_nats::Message) {
        let Some(h) = m.headers.as_ref() else { return };
        let Some(seq) = h
            .get(SEQ_HEADER)
            .and_then(|v| v.as_str().parse::<u64>().ok())
        else {
            return;
        };
        let Some(Opened {
            uri,
            text,
            publisher,
            ts_ms: ts,
        }) = self.event_of(m, seq)
        else {
            return;
        };
        let text = text.as_str();
        let previous = self
            .publishers
            .locked()
            .insert(uri.clone(), publisher.clone());
        let ring = self.ring(&uri);
        if ring.mirror(seq, ts, text.to_owned()) {
            self.feed.publish(&uri);
        } else if previous.is_some_and(|p| p != publisher) {
            // Another process, numbering below this ring's head: a restart whose clock is
            // behind, or a second process publishing under this name. Start over with it,
            // and say so (readers learn of the reset).
            tracing::warn!(
                source = %self.name,
                %uri,
                %publisher,
                "events of this log now come from another process with lower seqs: the log starts over \
                 (if two processes publish as {}, give each its own --publish-as)",
                self.name
            );
            ring.reset_mirror(seq, ts, text.to_owned());
            self.feed.publish(&uri);
        }
    }
}

/// Connects (retrying), then follows the stream and the catalog until shutdown.
async fn follow(
    mirror: Arc<Mirror>,
    cfg: NatsConfig,
    on_board: Arc<std::sync::OnceLock<async_nats::Client>>,
    ctx: RoleContext,
) {
    let mut backoff = RETRY;
    let (stream, kv, conn) = loop {
        let r = async {
            let conn = cfg.connect(ctx.metrics()).await?;
            let js = jetstream::new(conn.client.clone());
            let (stream, kv) = open(&js, &mirror.servers).await?;
            Ok::<_, String>((stream, kv, conn))
        }
        .await;
        match r {
            Ok(x) => break x,
            Err(e) => {
                tracing::warn!(source = %mirror.name, error = %e, "cannot follow published event logs yet; retrying");
                tokio::time::sleep(backoff.next_delay()).await;
            }
        }
    };
    let _ = on_board.set(conn.client.clone());
    let catalog_key = format!("{}.catalog", mirror.name);
    if let Ok(Some(v)) = kv.get(&catalog_key).await
        && let Some(v) = mirror.catalog_from(&catalog_key, &v)
    {
        *mirror.catalog.write_locked() = v;
    }
    let (m2, c2) = (mirror.clone(), conn.clone());
    ctx.spawn_until_shutdown("events nats catalog", async move {
        crate::nats::lookout::follow_key(&c2, &kv, &catalog_key, |value| {
            if let Some(v) = m2.catalog_from(&catalog_key, value) {
                *m2.catalog.write_locked() = v;
            }
        })
        .await
    });
    let filter = format!("herald.events.{}.>", mirror.name);
    // Nothing published yet: caught up at once; else when the replay has no more pending.
    let held = async {
        let s = stream.clone();
        let info = s.info_with_subjects(filter.clone()).await.ok()?;
        let mut n = 0u64;
        let mut subjects = info;
        while let Some(Ok((_, count))) = subjects.next().await {
            n += count as u64;
        }
        Some(n)
    }
    .await;
    if held == Some(0) {
        mirror.ready.send_replace(true);
    }
    // Each event is kept once (a mirror keeps only seqs past its head), and a consumer made
    // again resumes after the last message applied: nothing is lost or repeated.
    // A stream NATS lost is made again by the publishers, at their next event, with the
    // bucket and their catalogs (a mirror that made the stream first would leave the bucket
    // unmade); its making tells the follow, which follows it from its start.
    let mut follow = Follow::new(&conn, stream, filter, 0, ctx.shutdown().clone());
    tracing::info!(source = %mirror.name, "following published event logs");
    while let Some(d) = follow.next().await {
        mirror.apply(&d.message);
        if d.pending == 0 {
            mirror.ready.send_replace(true);
        }
    }
}

#[async_trait]
impl Source for Mirror {
    fn info(&self) -> SourceInfo {
        SourceInfo {
            name: self.name.clone(),
            instructions: Some(format!(
                "The event logs {} publishes to NATS at {}, served here without a connection to it \
                 (read-only: its tools are not here). {}",
                self.name,
                self.servers,
                self.catalog
                    .read_locked()
                    .get("instructions")
                    .and_then(Value::as_str)
                    .unwrap_or("")
            )),
            ..SourceInfo::default()
        }
    }

    fn resources(&self, _caller: &Caller) -> Vec<Resource> {
        self.rings
            .locked()
            .iter()
            .filter(|(_, r)| !r.is_empty())
            .map(|(uri, _)| {
                Resource::new(uri.clone(), uri.clone())
                    .with_mime_type(EVENT_LOG_MIME)
                    .with_description(format!("published by {} over NATS", self.name))
            })
            .collect()
    }

    async fn read(&self, _caller: &Caller, read: Read<'_>) -> Result<Contents, SourceError> {
        let uri = read.uri;
        self.caught_up().await?;
        match self.held(uri) {
            Some(ring) => Ok(Contents::event_log(&ring, read.after)),
            None if Mirror::is_event_log(uri) => {
                Ok(Contents::text(EVENT_LOG_MIME, "{\"events\":[]}"))
            }
            None => Err(SourceError::NotFound { uri: uri.into() }),
        }
    }

    async fn admit(&self, _caller: &Caller, filter: &ListenFilter) -> Admission {
        let mut admission = Admission::default();
        for uri in filter.uris() {
            if Mirror::is_event_log(&uri) {
                admission.accept(&uri, uri.as_str(), WatchGuard::none());
            } else {
                admission.refuse(&uri, SourceError::NotFound { uri: uri.clone() });
            }
        }
        admission
    }

    fn changes(&self) -> ChangeFeed {
        self.feed.clone()
    }

    async fn events_advertised(&self, _caller: &Caller) -> bool {
        true
    }

    async fn events_list(&self, _caller: &Caller) -> Result<Vec<Value>, SourceError> {
        let _ = self.caught_up().await;
        let mut list = self
            .catalog
            .read_locked()
            .get("events")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for e in &mut list {
            if let Some(d) = e.get("description").and_then(Value::as_str) {
                e["description"] = format!(
                    "{d} Served here from NATS: only the logs {} keeps (watched or polled there) \
                     are published, and a poll here starts no watch there.",
                    self.name
                )
                .into();
            }
        }
        Ok(list)
    }

    async fn events_poll(
        &self,
        _caller: &Caller,
        params: JsonObject,
    ) -> Result<Value, SourceError> {
        self.caught_up().await?;
        let req = PollRequest::parse(&params)?;
        let known = self
            .catalog
            .read_locked()
            .get("events")
            .and_then(Value::as_array)
            .is_some_and(|l| l.iter().any(|e| e["name"] == req.name.as_str()));
        if !known {
            return Err(events::unknown_event(&req.name));
        }
        let uri = (self.poll_uri)(&req.name, &req.arguments)?;
        // Made if nothing was published to it yet (within the cap), so a long poll wakes
        // when the first event comes.
        let ring = self.ring(&uri);
        Ok(events::poll(&ring, &self.feed, &uri, &req).await)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_are_per_uri_and_names_are_tokens() {
        let a = subject("edge1", "memo://log");
        assert!(a.starts_with("herald.events.edge1."), "{a}");
        assert_eq!(a.len(), "herald.events.edge1.".len() + 16);
        assert_ne!(a, subject("edge1", "file-events://watch/srv"));
        assert!(valid_name("edge-1_a") && !valid_name("a.b") && !valid_name(""));
        assert!(Mirror::is_event_log("k8s-events://watch/pods"));
        assert!(Mirror::is_event_log("memo://log"));
        assert!(!Mirror::is_event_log("memo://notes"));
    }
}
