//! One watcher per watched URI: seed, watch, ring, reconnect (reference 000, "kcp").
//!
//! The task lists the selection (the seed; the first read awaits it), then watches it,
//! turning each event into ring events through [`Known`], and publishes the URI on the change
//! feed for each batch of new events. Failures are `ERROR` events in the ring. The task ends
//! when the last [`Watcher`] handle is dropped.
//!
//! Two ways to watch ([`Via`]):
//! - **The API** (the default): the list's own resourceVersion starts the watch, so nothing
//!   between the two is missed (a delete during the seed arrives as an event); BOOKMARKs and
//!   every event keep that resourceVersion fresh; when the server ends the stream (its
//!   timeout, a network cut) the watcher watches again from the last resourceVersion it saw,
//!   without listing. Only `410 Gone` (an HTTP status or an in-band `ERROR`) or a stream it
//!   could not parse makes it list again and log synthetic events for what changed in the gap.
//! - **kubectl** (`--watch-via kubectl`): one `kubectl get -w` per URI; when it exits the
//!   watcher re-lists (kubectl lists again anyway) and reconciles the same way.
//!
//! Between attempts that fail or end at once it waits with exponential backoff.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Map, Value};
use tokio::io::AsyncReadExt;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::mcp::hub::ChangeFeed;
use crate::mcp::ring::EventRing;
use crate::mcp::source::{Contents, SourceError};
use crate::runtime::backoff::Backoff;
use crate::source::k8s::api::{Api, ApiError, ApiType};
use crate::source::k8s::known::{Change, Known, metadata_only};
use crate::source::k8s::kubectl::Kubectl;
use crate::source::k8s::stream::{Item, JsonStream};
use crate::source::k8s::uri::Selection;

/// How long the first read waits for the seed: well under a client's request timeout, so the
/// client gets this source's answer, not its own timeout.
pub const SEED_TIMEOUT: Duration = Duration::from_secs(20);
/// First reconnect delay; it doubles after each short-lived watch, up to [`MAX_BACKOFF`].
pub const BASE_BACKOFF: Duration = Duration::from_millis(200);
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// The reconnect delays, indexed by the short runs counted below.
const RECONNECT: Backoff = Backoff::new(BASE_BACKOFF, MAX_BACKOFF);
/// How long an exited kubectl's stderr may stay open (held by a plugin it started) before
/// its tail is given up.
const STDERR_TAIL_WAIT: Duration = Duration::from_secs(1);
/// A watch that lasted this long resets the backoff.
const HEALTHY: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, PartialEq)]
enum Seed {
    Pending,
    Ready,
    Failed(SourceError),
}

/// How a watcher reaches the cluster.
#[derive(Clone)]
pub enum Via {
    /// The Kubernetes API, directly.
    Api(Arc<Api>),
    /// `kubectl get -w`.
    Kubectl,
}

/// How one watch stream ended.
enum End {
    /// The watcher was stopped.
    Stopped,
    /// The server ended the stream: watch again from where it was.
    Ended,
    /// It failed; `relist`: what the watcher knows may be out of date (410 Gone, output it
    /// could not parse), so list again before watching.
    Failed { why: String, relist: bool },
    /// 404: the type is not where discovery said; look it up again and list.
    Missing(String),
}

/// A delay in `[0, max)` that differs between URIs and over time (no RNG needed for that).
fn jitter(uri: &str, max: Duration) -> Duration {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    uri.hash(&mut h);
    std::time::SystemTime::now().hash(&mut h);
    let ms = max.as_millis().max(1) as u64;
    Duration::from_millis(h.finish() % ms)
}

/// A handle on a running watcher; the last one dropped stops it.
pub struct Watcher {
    ring: Arc<EventRing>,
    seed: watch::Receiver<Seed>,
    stop: CancellationToken,
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Watcher {
    pub fn start(
        uri: String,
        sel: Selection,
        kubectl: Arc<Kubectl>,
        via: Via,
        feed: ChangeFeed,
        ring_capacity: usize,
    ) -> Watcher {
        let ring = Arc::new(EventRing::new(ring_capacity).tapped(&uri, kubectl.ctx().tap()));
        let (tx, seed) = watch::channel(Seed::Pending);
        // Stopped by the last handle, or at shutdown.
        let stop = kubectl.ctx().shutdown().child_token();
        let ctx = kubectl.ctx().clone();
        let task = Task {
            uri,
            sel,
            kubectl,
            feed,
            ring: ring.clone(),
            seed: tx,
            stop: stop.clone(),
            known: None,
        };
        match via {
            Via::Api(api) => ctx.spawn("k8s watch", task.run_api(api)),
            Via::Kubectl => ctx.spawn("k8s watch", task.run()),
        };
        Watcher { ring, seed, stop }
    }

    /// The event log (from `after`, the reader's hint), once the seed is in (waiting for it
    /// up to [`SEED_TIMEOUT`]).
    pub async fn read(&self, after: Option<u64>) -> Result<Contents, SourceError> {
        self.ready().await?;
        Ok(Contents::event_log(&self.ring, after))
    }

    /// Waits for the seed (up to [`SEED_TIMEOUT`]); its failure if the first list failed.
    pub async fn ready(&self) -> Result<(), SourceError> {
        let mut seed = self.seed.clone();
        let state = tokio::time::timeout(SEED_TIMEOUT, seed.wait_for(|s| *s != Seed::Pending))
            .await
            .map_err(|_| {
                SourceError::Unavailable(format!(
                    "the first list did not finish within {} s; the cluster may be unreachable",
                    SEED_TIMEOUT.as_secs()
                ))
            })?
            .map_err(|_| SourceError::Unavailable("the watcher stopped".into()))?
            .clone();
        match state {
            Seed::Failed(e) => Err(e),
            _ => Ok(()),
        }
    }

    /// The event ring (`events/poll` reads it after [`ready`](Self::ready)).
    pub fn ring(&self) -> &Arc<EventRing> {
        &self.ring
    }
}

struct Task {
    uri: String,
    sel: Selection,
    kubectl: Arc<Kubectl>,
    feed: ChangeFeed,
    ring: Arc<EventRing>,
    seed: watch::Sender<Seed>,
    stop: CancellationToken,
    known: Option<Known>,
}

impl Task {
    fn push(&self, c: Change) {
        let mut f = Map::new();
        f.insert("object".into(), c.object);
        if let Some(old) = c.old {
            f.insert("old".into(), old);
        }
        if c.synthetic {
            f.insert("synthetic".into(), Value::Bool(true));
        }
        self.ring.push(c.kind, f);
    }

    fn error(&self, message: String) {
        tracing::warn!(uri = %self.uri, %message, "k8s watcher");
        self.ring.push_error(&message);
        self.feed.publish(&self.uri);
    }

    async fn run(mut self) {
        let mut short_runs = 0u32;
        loop {
            let listed = tokio::select! {
                _ = self.stop.cancelled() => return,
                r = self.kubectl.list(&self.sel) => r,
            };
            match listed {
                Ok(items) => self.listed(items),
                Err(e) => {
                    if self.list_failed(e, &mut short_runs).await {
                        return;
                    }
                    continue;
                }
            }
            let started = Instant::now();
            match self.stream().await {
                None => return,
                Some(Ok(())) => {
                    tracing::debug!(uri = %self.uri, "the watch stream ended; reconnecting");
                }
                Some(Err(why)) => self.error(format!("{why}; reconnecting")),
            }
            short_runs = if started.elapsed() >= HEALTHY {
                0
            } else {
                short_runs + 1
            };
            if self
                .pause(RECONNECT.delay(short_runs.saturating_sub(1)))
                .await
            {
                return;
            }
        }
    }

    /// Takes a list: the seed the first time, else the synthetic events for the gap.
    fn listed(&mut self, mut items: Vec<Value>) {
        if self.sel.metadata {
            items.iter_mut().for_each(metadata_only);
        }
        match &mut self.known {
            None => {
                self.known = Some(Known::seed(items));
                self.seed.send_replace(Seed::Ready);
            }
            Some(k) => {
                let changes = k.reconcile(items);
                if !changes.is_empty() {
                    for c in changes {
                        self.push(c);
                    }
                    self.feed.publish(&self.uri);
                }
            }
        }
    }

    /// The watcher over the API: list once, then watch from the last resourceVersion seen,
    /// listing again only after a 410 or a stream it could not trust.
    async fn run_api(mut self, api: Arc<Api>) {
        let mut short_runs = 0u32;
        // None: list (again) before watching.
        let mut rv: Option<String> = None;
        // The resource type, resolved once (again after a 404: it moved).
        let mut ty: Option<ApiType> = None;
        let mut moved = false;
        loop {
            if rv.is_none() {
                let listed = tokio::select! {
                    _ = self.stop.cancelled() => return,
                    r = self.list_api(&api, &mut ty, moved) => r,
                };
                moved = false;
                match listed {
                    Ok((items, list_rv)) => {
                        self.listed(items);
                        rv = Some(list_rv);
                    }
                    Err(e) => {
                        if matches!(e, ApiError::Missing(_)) {
                            ty = None;
                            moved = true;
                        }
                        if self.list_failed(e.into_source(), &mut short_runs).await {
                            return;
                        }
                        continue;
                    }
                }
            }
            let Some(t) = ty.clone() else {
                rv = None;
                continue;
            };
            let started = Instant::now();
            let mut at = rv.clone().unwrap_or_default();
            let end = self.stream_api(&api, &t, &mut at).await;
            rv = Some(at);
            let healthy = started.elapsed() >= HEALTHY;
            let mut failed = false;
            match end {
                End::Stopped => return,
                End::Ended => {
                    tracing::debug!(uri = %self.uri, "the watch stream ended; watching again");
                }
                End::Missing(why) => {
                    failed = true;
                    rv = None;
                    ty = None;
                    moved = true;
                    self.error(format!("{why}; looking the resource type up again"));
                }
                End::Failed { why, relist } => {
                    failed = true;
                    if relist {
                        rv = None;
                        self.error(format!("{why}; re-listing"));
                    } else {
                        self.error(format!("{why}; reconnecting"));
                    }
                }
            }
            short_runs = if healthy { 0 } else { short_runs + 1 };
            let pause = if short_runs > 0 {
                RECONNECT.delay(short_runs.saturating_sub(1))
            } else if failed {
                // A long-lived stream that broke (its connection died, as every other watch
                // on it did): spread the reconnects of a cluster's watchers over a moment.
                jitter(&self.uri, Duration::from_millis(500))
            } else {
                Duration::ZERO
            };
            if !pause.is_zero() && self.pause(pause).await {
                return;
            }
        }
    }

    /// Lists the selection, resolving its type first when it is not known (`fresh`: after a
    /// 404, discovering again); a list that 404s is tried once more after a fresh look-up.
    async fn list_api(
        &self,
        api: &Api,
        ty: &mut Option<ApiType>,
        fresh: bool,
    ) -> Result<(Vec<Value>, String), ApiError> {
        let t = match ty {
            Some(t) => t.clone(),
            None => {
                let t = api.resolve(&self.sel, fresh).await?;
                *ty = Some(t.clone());
                t
            }
        };
        match api.list(&t, &self.sel).await {
            Err(ApiError::Missing(_)) if !fresh => {
                let t = api.resolve(&self.sel, true).await?;
                *ty = Some(t.clone());
                api.list(&t, &self.sel).await
            }
            r => r,
        }
    }

    /// One watch over the API from `rv` to its end; `rv` follows every event and BOOKMARK.
    async fn stream_api(&mut self, api: &Api, t: &ApiType, rv: &mut String) -> End {
        let opened = tokio::select! {
            _ = self.stop.cancelled() => return End::Stopped,
            w = api.watch(t, &self.sel, rv) => w,
        };
        let mut body = match opened {
            Ok(b) => b,
            Err(ApiError::Gone(m)) => {
                return End::Failed {
                    why: format!("the watch was refused with 410 Gone ({m})"),
                    relist: true,
                };
            }
            Err(ApiError::Missing(e)) => return End::Missing(e.to_string()),
            Err(ApiError::Other(e)) => {
                return End::Failed {
                    why: e.to_string(),
                    relist: false,
                };
            }
        };
        let mut parser = JsonStream::new();
        loop {
            let chunk = tokio::select! {
                _ = self.stop.cancelled() => return End::Stopped,
                c = body.chunk() => c,
            };
            let chunk = match chunk {
                None => return End::Ended,
                Some(Err(why)) => return End::Failed { why, relist: false },
                Some(Ok(c)) => c,
            };
            let mut fresh = false;
            let mut failure = None;
            for item in parser.feed(&chunk) {
                match item {
                    Item::Value(mut v) => {
                        let object = v.get_mut("object").map(Value::take).unwrap_or(Value::Null);
                        let kind = v["type"].as_str().unwrap_or_default();
                        if kind == "ERROR" {
                            let msg = object["message"].as_str().unwrap_or("unknown error");
                            let code = object["code"].as_u64().unwrap_or(0);
                            failure = Some(End::Failed {
                                why: format!("the watch stream reported {code}: {msg}"),
                                relist: code == 410,
                            });
                            continue;
                        }
                        if let Some(r) = object["metadata"]["resourceVersion"].as_str()
                            && !r.is_empty()
                        {
                            r.clone_into(rv);
                        }
                        let mut object = object;
                        if self.sel.metadata {
                            t.name(&mut object);
                            metadata_only(&mut object);
                        }
                        let change = self.known.as_mut().and_then(|k| k.apply(kind, object));
                        if let Some(c) = change {
                            self.push(c);
                            fresh = true;
                        }
                    }
                    Item::Garbage(g) => {
                        tracing::warn!(uri = %self.uri, output = %g, "the watch stream sent something that is not JSON");
                        failure.get_or_insert(End::Failed {
                            why: format!("the watch stream sent output that is not JSON ({g})"),
                            relist: true,
                        });
                    }
                }
            }
            if fresh {
                self.feed.publish(&self.uri);
            }
            if let Some(f) = failure {
                return f;
            }
        }
    }

    /// A list that failed: the seed's failure if there is no seed yet, an ERROR event, and
    /// the backoff before the next list. True if the watcher was stopped meanwhile.
    async fn list_failed(&mut self, e: SourceError, short_runs: &mut u32) -> bool {
        if self.known.is_none() {
            self.seed.send_replace(Seed::Failed(e.clone()));
        }
        self.error(format!("listing failed: {e}; retrying"));
        *short_runs += 1;
        self.pause(RECONNECT.delay(*short_runs)).await
    }

    /// Waits `d`; true if the watcher was stopped meanwhile.
    async fn pause(&self, d: Duration) -> bool {
        tokio::select! {
            _ = self.stop.cancelled() => true,
            _ = tokio::time::sleep(d) => false,
        }
    }

    /// Runs one `kubectl get -w` to its end. `None`: stopped; `Ok`: the server ended the
    /// stream; `Err`: why it failed.
    async fn stream(&mut self) -> Option<Result<(), String>> {
        let started = tokio::select! {
            _ = self.stop.cancelled() => return None,
            c = self.kubectl.watch(&self.sel) => c,
        };
        let mut child = match started {
            Ok(c) => c,
            Err(e) => return Some(Err(e.to_string())),
        };
        let mut stdout = child.stdout.take().expect("piped");
        let mut stderr = child.stderr.take().expect("piped");
        let stop = self.stop.clone();
        let errors = self.kubectl.ctx().spawn("kubectl stderr", async move {
            // Keep the tail only: a chatty kubectl must not grow memory.
            let mut tail = Vec::new();
            let mut buf = [0u8; 4096];
            loop {
                // A credential plugin kubectl started may hold stderr open after kubectl is
                // gone: a stop (or shutdown) ends the reader whatever the pipe does.
                let n = tokio::select! {
                    _ = stop.cancelled() => break,
                    n = stderr.read(&mut buf) => n,
                };
                let Ok(n) = n else { break };
                if n == 0 {
                    break;
                }
                tail.extend_from_slice(&buf[..n]);
                if tail.len() > 8192 {
                    tail.drain(..tail.len() - 4096);
                }
            }
            tail
        });
        let mut parser = JsonStream::new();
        let mut buf = vec![0u8; 64 * 1024];
        let mut failure = None;
        loop {
            let n = tokio::select! {
                _ = self.stop.cancelled() => return None,
                n = stdout.read(&mut buf) => n,
            };
            let n = match n {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let mut fresh = false;
            for item in parser.feed(&buf[..n]) {
                match item {
                    Item::Value(v) => {
                        let kind = v["type"].as_str().unwrap_or_default().to_owned();
                        let object = v.get("object").cloned().unwrap_or(Value::Null);
                        if kind == "ERROR" {
                            let msg = object["message"].as_str().unwrap_or("unknown error");
                            let code = object["code"].as_u64().unwrap_or(0);
                            failure = Some(format!("the watch stream reported {code}: {msg}"));
                            continue;
                        }
                        let mut object = object;
                        if self.sel.metadata {
                            metadata_only(&mut object);
                        }
                        let change = self.known.as_mut().and_then(|k| k.apply(&kind, object));
                        if let Some(c) = change {
                            self.push(c);
                            fresh = true;
                        }
                    }
                    Item::Garbage(g) => {
                        // An event may be lost in there: report it and re-list to converge.
                        tracing::warn!(uri = %self.uri, output = %g, "kubectl printed something that is not JSON");
                        failure.get_or_insert_with(|| {
                            format!("kubectl printed output that is not JSON ({g}); re-listing")
                        });
                    }
                }
            }
            if fresh {
                self.feed.publish(&self.uri);
            }
            if failure.is_some() {
                // Re-list now rather than trust the rest of this stream.
                let _ = child.start_kill();
                break;
            }
        }
        let status = tokio::select! {
            _ = self.stop.cancelled() => return None,
            s = child.wait() => s,
        };
        // The stderr reader ends with kubectl; a credential plugin that keeps stderr open must
        // not hold the watcher past a stop, nor its next attempt for more than a moment.
        let abort = errors.abort_handle();
        let tail = tokio::select! {
            _ = self.stop.cancelled() => return None,
            t = tokio::time::timeout(STDERR_TAIL_WAIT, errors) => match t {
                Ok(t) => t.unwrap_or_default(),
                Err(_) => {
                    abort.abort();
                    Vec::new()
                }
            },
        };
        match status {
            Ok(s) if s.success() && failure.is_none() => Some(Ok(())),
            Ok(_) if failure.is_some() => Some(Err(failure.unwrap_or_default())),
            Ok(s) => {
                let text = String::from_utf8_lossy(&tail).trim().to_owned();
                Some(Err(match (failure, text.is_empty()) {
                    (Some(f), _) => f,
                    (None, true) => format!("kubectl get -w exited with {s}"),
                    (None, false) => format!("kubectl get -w exited with {s}: {text}"),
                }))
            }
            Err(e) => Some(Err(format!("kubectl get -w: {e}"))),
        }
    }
}
