//! [`Gateway`]: the gateway as a [`Source`]. See the module docs of [`crate::gateway`].

use crate::sync::Recover;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use rmcp::model::{
    CallToolResponse, JsonObject, Resource, ResourceTemplate, ServerNotification,
    SubscriptionFilter, Tool,
};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::auth::issuer::{IssuerConfig, Issuers};
use crate::gateway::access::{Access, Entitled};
use crate::gateway::config::{GatewayConfig, Slug, Token, valid_slug};
use crate::gateway::lists::RESUBSCRIBE;
use crate::gateway::names::Names;
use crate::gateway::tasks::GatewayTasks;
use crate::mcp::hub::ChangeFeed;
use crate::mcp::source::{
    Admission, Authentication, Call, Caller, Contents, ListenFilter, PROMPTS_CHANGED, Read, Source,
    SourceError, SourceInfo, TOOLS_CHANGED, WatchGuard,
};
use crate::runtime::context::RoleContext;
use crate::runtime::metrics::{Counter, Metrics};
use crate::upstream::{self, Heard, KeptListen, REQUEST_TIMEOUT, Upstream, UpstreamConfig};

/// How long the handshake waits for one slug's answer on whether it serves Events.
const EVENTS_PROBE: Duration = Duration::from_secs(3);
/// Longest one connect to an upstream (handshake plus catalog) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest long poll relayed (the upstream's own cap is 30 s).
const MAX_LONG_POLL: Duration = Duration::from_secs(60);

pub struct Gateway {
    /// The upstreams and who may use them.
    access: Arc<Access>,
    feed: ChangeFeed,
    shared: Arc<Mutex<HashMap<String, Weak<SharedListen>>>>,
    /// Where relays, connects and cancels run; its shutdown ends them.
    ctx: RoleContext,
    /// The tasks it relays (`Source::task_relay`).
    tasks: Arc<GatewayTasks>,
    /// Each slug's list follower (`lists.rs`), stopped when its slug goes or the gateway does.
    followers: Mutex<Vec<(Arc<Upstream>, tokio_util::sync::DropGuard)>>,
    /// Long polls of a slug's events, one upstream call per key ([`crate::gateway::polls`]).
    polls: crate::gateway::polls::SharedPolls,
    poll_metrics: crate::gateway::polls::PollMetrics,
    /// One upstream subscription per slug, event type and arguments
    /// ([`crate::gateway::feeds`]).
    feeds: Arc<crate::gateway::feeds::Feeds>,
}

/// What [`Gateway::reconfigure`] changed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Reconfigured {
    /// Slugs added (or replaced: their config changed), by name.
    pub added: Vec<String>,
    /// Slugs removed (or replaced), by name.
    pub removed: Vec<String>,
    /// Listen streams ended because their caller lost access (a revoked or narrowed token, a
    /// removed or replaced slug).
    pub ended_streams: usize,
}

/// One upstream subscription, shared by every client watching its URI.
struct SharedListen {
    /// The upstream it is on (a reload may replace the slug's upstream under the same name).
    up: Arc<Upstream>,
    stop: CancellationToken,
    /// Whether the upstream acknowledged it (`None` until it answers).
    acked: tokio::sync::watch::Receiver<Option<bool>>,
}

/// How long a listen's admission waits for the upstreams' acknowledgments.
const ACK_WAIT: Duration = Duration::from_secs(5);

impl Drop for SharedListen {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// The shared upstream handle of one slug: named by the slug, its stdio child supervised
/// (restarted with backoff whenever it exits) until `ctx` shuts down.
fn upstream_of(slug: &Slug, max_message_bytes: usize, ctx: &RoleContext) -> Upstream {
    Upstream::new(UpstreamConfig {
        name: slug.name.clone(),
        connect_timeout: CONNECT_TIMEOUT,
        handshake_timeout: slug.handshake_timeout,
        context: Some(ctx.clone()),
        supervise: true,
        ..UpstreamConfig::new(slug.target.clone(), slug.trust.clone(), max_message_bytes)
    })
}

impl Gateway {
    /// Keeps who started each task in `keep` too (the store, or NATS for replicas); set
    /// before serving.
    pub(crate) fn keep_tasks_in(&self, keep: crate::gateway::owners::Keep) {
        self.tasks.keep_in(keep);
    }

    /// The gateway over `upstreams` (one per `cfg`'s slug) as `cfg` says: its tokens, its
    /// bare slug (`prefix = false`) and `open_to_loopback`.
    pub fn configured(
        upstreams: Vec<Arc<Upstream>>,
        cfg: &GatewayConfig,
        ctx: &RoleContext,
    ) -> Gateway {
        let g = Gateway::with_upstreams(upstreams, cfg.tokens.clone(), ctx)
            .bare(crate::gateway::config::bare_slug(&cfg.slugs))
            .loopback(cfg.open_to_loopback)
            .issuers(&cfg.issuers);
        g.feeds.set_receiver(cfg.events.receiver_url.clone());
        g
    }

    /// Slugs that deliver events only by webhook POST them to `base` (`[events]
    /// receiver_url`) instead of the gateway's own HTTP address.
    pub fn receive_webhooks_at(self, base: Option<String>) -> Gateway {
        self.feeds.set_receiver(base);
        self
    }

    /// The gateway over `upstreams` (each named by its slug: external servers, or roles in
    /// this process reached over a pipe), entitled by `tokens`. Each upstream is entered on
    /// `ctx`'s status board: the admin address's `/ready` waits for each to connect once.
    pub fn with_upstreams(
        upstreams: Vec<Arc<Upstream>>,
        tokens: Vec<Token>,
        ctx: &RoleContext,
    ) -> Gateway {
        let access = Arc::new(Access::new(Entitled::default()));
        let shared: Arc<Mutex<HashMap<String, Weak<SharedListen>>>> = Arc::default();
        let uris = {
            let shared = Arc::downgrade(&shared);
            Arc::new(move |slug: &str| {
                let Some(shared) = shared.upgrade() else {
                    return 0;
                };
                let prefix = format!("{slug}+");
                shared
                    .locked()
                    .iter()
                    .filter(|(k, w)| k.starts_with(&prefix) && w.strong_count() > 0)
                    .count()
            })
        };
        let gateway = Gateway {
            tasks: Arc::new(GatewayTasks::new(access.clone(), ctx, uris)),
            access,
            feed: ChangeFeed::new(),
            shared,
            ctx: ctx.clone(),
            followers: Mutex::default(),
            polls: Default::default(),
            poll_metrics: crate::gateway::polls::PollMetrics::register(ctx.metrics()),
            feeds: Arc::new(crate::gateway::feeds::Feeds::new(ctx)),
        };
        gateway.reconfigure(Entitled::new(upstreams, tokens));
        gateway
    }

    /// Lets callers on a loopback address in without a token (`open`). For a gateway that
    /// listens on loopback only and has no tokens: there, whoever can connect is on this host.
    pub fn loopback(self, open: bool) -> Gateway {
        let now = (*self.access.now()).clone().open_to_loopback(open);
        self.access.swap(now);
        self
    }

    /// Takes the access tokens of `[[issuer]]`s `configs` (keys fetched and kept fresh from
    /// now on). Must be called within the runtime.
    pub fn issuers(self, configs: &[IssuerConfig]) -> Gateway {
        let now = (*self.access.now()).clone();
        let issuers = issuers_for(now.issuers_now(), configs, &self.ctx);
        self.access.swap(now.issuers(issuers));
        self
    }

    /// Shows slug `name`'s tools and prompts under the names its server gives them (a
    /// `[[slug]]` with `prefix = false`; the config allows one).
    pub fn bare(self, name: Option<&str>) -> Gateway {
        let now = (*self.access.now()).clone().bare(name);
        self.access.swap(now);
        self
    }

    /// Puts a new config in place (a reload): `upstreams` (an unchanged slug passed as the
    /// same `Arc` it was, so its connection, subscriptions and clients' streams are
    /// untouched; a changed one as a new upstream under its name), `tokens`, the bare slug
    /// and the loopback rule. New slugs are entered on the status board, their lists followed;
    /// removed ones stop being followed and close once nothing holds them; every listen stream
    /// whose caller lost access to what it watches ends (`Access::swap`); clients listening for
    /// list changes hear of the new tool and prompt lists.
    ///
    /// The new slugs connect first (in parallel, at most `warm` each, as the start's warm-up),
    /// before anything changes: a client whose stream a change ends, or a watch a reload
    /// starts, finds their catalogs when it comes back. One that does not answer in time
    /// connects on first use.
    pub async fn apply(
        &self,
        upstreams: Vec<Arc<Upstream>>,
        cfg: &GatewayConfig,
        warm: Duration,
    ) -> Reconfigured {
        let running = self.access.now();
        let added = upstreams
            .iter()
            .filter(|u| !running.upstreams.iter().any(|r| Arc::ptr_eq(r, u)))
            .map(|up| async move {
                let _ = tokio::time::timeout(warm, up.connect()).await;
            });
        futures::future::join_all(added).await;
        let issuers = issuers_for(running.issuers_now(), &cfg.issuers, &self.ctx);
        self.reconfigure(
            Entitled::new(upstreams, cfg.tokens.clone())
                .bare(crate::gateway::config::bare_slug(&cfg.slugs))
                .open_to_loopback(cfg.open_to_loopback)
                .issuers(issuers),
        )
    }

    fn reconfigure(&self, entitled: Entitled) -> Reconfigured {
        let new = entitled.upstreams.clone();
        let (old, ended_streams) = self.access.swap(entitled);
        let has = |set: &[Arc<Upstream>], u: &Arc<Upstream>| set.iter().any(|x| Arc::ptr_eq(x, u));
        let added: Vec<Arc<Upstream>> = new
            .iter()
            .filter(|u| !has(&old.upstreams, u))
            .cloned()
            .collect();
        let removed: Vec<Arc<Upstream>> = old
            .upstreams
            .iter()
            .filter(|u| !has(&new, u))
            .cloned()
            .collect();
        // Decided under the lock, done after it (no lock is held while taking another).
        let mut started = Vec::new();
        let stopped: Vec<_> = {
            let mut followers = self.followers.locked();
            let (gone, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut *followers)
                .into_iter()
                .partition(|(u, _)| has(&removed, u));
            *followers = kept;
            for up in &added {
                let stop = self.ctx.shutdown().child_token();
                started.push((up.clone(), stop.clone()));
                followers.push((up.clone(), stop.drop_guard()));
            }
            gone
        };
        drop(stopped);
        for (up, stop) in started {
            self.ctx.status().add_upstream(&up);
            let follow = crate::gateway::lists::follow(up, self.feed.clone(), stop);
            self.ctx.spawn("gateway lists", follow);
        }
        for up in &removed {
            // Its own tasks (a supervised child, a NATS mirror) end now; its connection
            // closes once the streams it still carries (ended above) let go of it.
            up.stop();
            let up = up.clone();
            self.ctx
                .spawn("gateway close", async move { up.close().await });
        }
        // What a caller may list changed (slugs, or a token's entitlement, or the bare slug's
        // names): listens that asked hear of it and list again.
        if !old.same_as(&self.access.now()) {
            self.feed.publish(TOOLS_CHANGED);
            self.feed.publish(PROMPTS_CHANGED);
        }
        Reconfigured {
            added: added.iter().map(|u| u.name.clone()).collect(),
            removed: removed.iter().map(|u| u.name.clone()).collect(),
            ended_streams,
        }
    }

    /// The upstream shared handles, by slug (status and readiness).
    pub fn upstreams(&self) -> Vec<Arc<Upstream>> {
        self.access.now().upstreams.clone()
    }

    /// The shared upstream handle of a configured slug (an external server), supervised.
    pub fn upstream_for(slug: &Slug, max_message_bytes: usize, ctx: &RoleContext) -> Arc<Upstream> {
        Arc::new(upstream_of(slug, max_message_bytes, ctx))
    }

    /// Connects every upstream (in parallel, for at most `bound`), so catalogs are ready for
    /// the first client. A slug that is not up by then connects on first use.
    pub async fn warm_up(&self, bound: Duration) {
        let upstreams = self.upstreams();
        let all = upstreams.iter().map(|u| async move {
            let _ = tokio::time::timeout(bound, u.connect()).await;
        });
        futures::future::join_all(all).await;
    }

    pub(super) fn selected(&self, caller: &Caller) -> Vec<Arc<Upstream>> {
        self.access.selected(caller)
    }

    fn slug(&self, caller: &Caller, name: &str) -> Result<Arc<Upstream>, SourceError> {
        self.access.slug(caller, name)
    }

    /// The upstream serving `uri` and the URI to send it: `slug+URI` names the slug; else
    /// exact listing, then template, then the first subscribable.
    pub(super) fn access(&self) -> &Access {
        &self.access
    }

    fn route(&self, caller: &Caller, uri: &str) -> Result<(Arc<Upstream>, String), SourceError> {
        if let Some((slug, rest)) = uri.split_once('+')
            && valid_slug(slug)
            && rest.contains("://")
        {
            return Ok((self.slug(caller, slug)?, rest.to_owned()));
        }
        let selected = self.selected(caller);
        // A URI two of them list is theirs to tell apart: never quietly the first's.
        let listing: Vec<&str> = selected
            .iter()
            .filter(|u| u.catalog().is_some_and(|c| c.lists(uri)))
            .map(|u| u.name.as_str())
            .collect();
        if listing.len() > 1 {
            let forms: Vec<String> = listing.iter().map(|s| format!("{s}+{uri}")).collect();
            let (last, rest) = listing.split_last().expect("two or more");
            return Err(SourceError::InvalidParams(format!(
                "{uri} is served by {} and {last}: name which, as {}",
                rest.join(", "),
                forms.join(" or ")
            )));
        }
        // The last-known catalogs: a slug that is reconnecting keeps its URIs meanwhile.
        match upstream::pick(&selected, uri) {
            Some(u) => Ok((u.clone(), uri.to_owned())),
            None => Err(SourceError::NotFound { uri: uri.into() }),
        }
    }

    /// Starts (or joins) the shared upstream subscription of `uri`, as routed for this caller.
    /// Shares and feed keys are `slug+upstream URI`: the same URI can name different servers
    /// for callers with different entitlements, and one's changes must never reach the other.
    fn share(
        &self,
        caller: &Caller,
        uri: &str,
    ) -> Result<(Arc<SharedListen>, String), SourceError> {
        let (up, upstream_uri) = self.route(caller, uri)?;
        if !up.catalog().is_some_and(|l| l.modern) {
            return Err(SourceError::InvalidParams(format!(
                "server {} does not speak MCP 2026-07-28, so its resources cannot be watched",
                up.name
            )));
        }
        let key = format!("{}+{upstream_uri}", up.name);
        // Read before taking `shared`: no lock is ever held while taking another.
        let following = self.tasks.following(&up.name);
        let mut shared = self.shared.locked();
        shared.retain(|_, w| w.strong_count() > 0);
        // (One on the upstream a reload replaced is left to the streams that hold it.)
        if let Some(s) = shared.get(&key).and_then(Weak::upgrade)
            && Arc::ptr_eq(&s.up, &up)
        {
            return Ok((s, key));
        }
        let prefix = format!("{}+", up.name);
        // URIs and followed tasks alike: each is a listen stream on the slug's connection.
        let per_slug = shared
            .iter()
            .filter(|(k, w)| k.starts_with(&prefix) && w.strong_count() > 0)
            .count()
            + following;
        // Each is a listen stream on the slug's one connection.
        if per_slug >= up.max_listens {
            return Err(SourceError::Unavailable(format!(
                "server {} already has {} watched URIs and followed tasks through this gateway, its limit; stop a watch first",
                up.name, up.max_listens
            )));
        }
        let (ack, acked) = tokio::sync::watch::channel(None);
        let s = Arc::new(SharedListen {
            up: up.clone(),
            stop: self.ctx.shutdown().child_token(),
            acked,
        });
        self.ctx.spawn(
            "gateway relay",
            relay(
                up,
                upstream_uri,
                key.clone(),
                self.feed.clone(),
                s.stop.clone(),
                ack,
            ),
        );
        shared.insert(key.clone(), Arc::downgrade(&s));
        Ok((s, key))
    }

    /// Upstream subscriptions running now (tests and metrics).
    pub fn shared_listens(&self) -> usize {
        self.shared
            .locked()
            .values()
            .filter(|w| w.strong_count() > 0)
            .count()
    }

    /// Slugs selected for this request whose handshake advertises Events (3 s per slug).
    async fn event_slugs(&self, caller: &Caller) -> Vec<Arc<Upstream>> {
        let probes = self.selected(caller).into_iter().map(|u| async move {
            u.offers_events(EVENTS_PROBE)
                .await
                .is_ok_and(|yes| yes)
                .then_some(u)
        });
        futures::future::join_all(probes)
            .await
            .into_iter()
            .flatten()
            .collect()
    }
}

/// Keeps one upstream subscription to `upstream_uri` ([`KeptListen`]) and publishes `key` on
/// the feed for each of its notifications, and once for each (re)subscription, until stopped.
async fn relay(
    up: Arc<Upstream>,
    upstream_uri: String,
    key: String,
    feed: ChangeFeed,
    stop: CancellationToken,
    ack: tokio::sync::watch::Sender<Option<bool>>,
) {
    let uri = upstream_uri.clone();
    let filter: upstream::FilterFor = Box::new(move |_| {
        Some(
            SubscriptionFilter::builder()
                .resource_subscription(uri.clone())
                .build(),
        )
    });
    let mut kept = KeptListen::new(up.clone(), filter, RESUBSCRIBE, stop, &upstream_uri);
    while let Some(heard) = kept.next().await {
        match heard {
            Heard::Acknowledged { .. } => {
                // A resubscription: anything that changed while the streams already on it
                // had no upstream listen is caught by the re-read this prompts. Published
                // before the ack, so a stream admitted by this ack (registered after it,
                // reading after its own ack) is not told of a change it never missed.
                feed.publish(&key);
                ack.send_replace(Some(true));
            }
            Heard::Notification(_, ServerNotification::ResourceUpdatedNotification(u))
                if u.params.uri == upstream_uri =>
            {
                feed.publish(&key);
            }
            Heard::Notification(..) | Heard::Nothing(_) => {}
            Heard::Failed(e) => {
                if ack.borrow().is_none() {
                    ack.send_replace(Some(false));
                }
                tracing::warn!(slug = %up.name, uri = %upstream_uri, error = %e, "upstream subscription failed");
            }
        }
    }
}

/// The issuers of `configs`: the `running` ones when they are the same (their keys and the
/// tokens they verified kept), else new ones, their keys fetched anew (a `jwks_file` is read
/// again on every reload: that is how an air-gapped site rotates). An issuer that cannot be
/// set up is logged and left out (its tokens are refused). New ones are entered on the
/// status board.
fn issuers_for(
    running: Option<&Arc<Issuers>>,
    configs: &[IssuerConfig],
    ctx: &RoleContext,
) -> Option<Arc<Issuers>> {
    if configs.is_empty() {
        return None;
    }
    if let Some(r) = running
        && r.same(configs)
        && configs.iter().all(|c| c.jwks_file.is_none())
    {
        return Some(r.clone());
    }
    match Issuers::new(configs.to_vec()) {
        Ok(i) => {
            if let Some(r) = running {
                i.inherit(r);
            }
            let i = Arc::new(i);
            i.start();
            ctx.status().add_issuers(&i);
            Some(i)
        }
        Err(e) => {
            tracing::error!("[[issuer]]: {e}; access tokens are refused until a reload mends it");
            None
        }
    }
}

fn prefixed(slug: &str, name: &str) -> String {
    format!("{slug}__{name}")
}

#[async_trait]
impl Source for Gateway {
    async fn authenticates(&self, caller: &Caller) -> Authentication {
        self.access.authenticates_fresh(caller).await
    }

    fn identity(&self, caller: &Caller) -> Option<(String, String)> {
        self.access.identity(caller)
    }

    fn known_as(&self, caller: &Caller) -> Option<String> {
        self.access.known_as(caller)
    }

    fn expires_in(&self, caller: &Caller) -> Option<std::time::Duration> {
        self.access.expires_in(caller)
    }

    fn protected_resource(&self) -> Option<crate::mcp::source::ProtectedResource> {
        self.access.now().issuers_now()?.protected_resource()
    }

    fn info(&self) -> SourceInfo {
        SourceInfo {
            name: "gateway".into(),
            instructions: Some(
                "Many MCP servers behind one endpoint. Tools are named server__tool; resources keep their \
                 URIs (server+URI when two servers list the same one); events are server__event."
                    .into(),
            ),
            completions: true,
            // Each slug's changes are relayed (`lists.rs`).
            list_changed: true,
        }
    }

    fn prompts(&self, caller: &Caller) -> Vec<rmcp::model::Prompt> {
        self.prompt_list(caller)
    }

    async fn get_prompt(
        &self,
        caller: &Caller,
        name: &str,
        args: JsonObject,
        call: Call,
    ) -> Result<rmcp::model::GetPromptResponse, SourceError> {
        self.prompt_get(caller, name, args, call).await
    }

    async fn complete(
        &self,
        caller: &Caller,
        request: rmcp::model::CompleteRequestParams,
    ) -> Result<rmcp::model::CompleteResult, SourceError> {
        self.completion(caller, request).await
    }

    fn resources(&self, caller: &Caller) -> Vec<Resource> {
        let selected = self.selected(caller);
        let lists: Vec<(String, Vec<Resource>)> = selected
            .iter()
            .filter_map(|u| u.catalog().map(|l| (u.name.clone(), l.resources.clone())))
            .collect();
        let mut count: HashMap<String, usize> = HashMap::new();
        for (_, rs) in &lists {
            for r in rs {
                *count.entry(r.uri.clone()).or_default() += 1;
            }
        }
        let mut out = Vec::new();
        for (slug, rs) in lists {
            for mut r in rs {
                if count[&r.uri] > 1 {
                    r.uri = format!("{slug}+{}", r.uri);
                }
                out.push(r);
            }
        }
        out
    }

    fn templates(&self, caller: &Caller) -> Vec<ResourceTemplate> {
        let selected = self.selected(caller);
        let mut out = Vec::new();
        for u in selected {
            let Some(l) = u.catalog() else { continue };
            // Relisted whole: the description (with its `watch_start` example) and the MIME
            // type are what a client, or an agent's prompt, learns the template from.
            out.extend(l.template_entries.iter().cloned());
        }
        out
    }

    async fn read(&self, caller: &Caller, read: Read<'_>) -> Result<Contents, SourceError> {
        let (up, upstream_uri) = self.route(caller, read.uri)?;
        // The reader's `io.herald/after` hint goes on upstream.
        Ok(up.read(&upstream_uri, read.after).await?)
    }

    /// Each URI this caller may watch starts (or joins) its shared upstream subscription;
    /// the ack names what the upstreams accepted (each asked in parallel, at most
    /// [`ACK_WAIT`]). Feed keys are `slug+upstream URI` as routed for this caller.
    async fn admit(&self, caller: &Caller, filter: &ListenFilter) -> Admission {
        let mut admission = Admission::default();
        let mut waits = Vec::new();
        for uri in filter.uris() {
            match self.share(caller, &uri) {
                Ok((share, key)) => waits.push(async move {
                    let mut acked = share.acked.clone();
                    let ok = tokio::time::timeout(ACK_WAIT, acked.wait_for(Option::is_some))
                        .await
                        .ok()
                        .and_then(Result::ok)
                        .is_some_and(|a| *a == Some(true));
                    (uri, key, ok, share)
                }),
                Err(e) => admission.refuse(&uri, e),
            }
        }
        let mut watched: Vec<Arc<Upstream>> = Vec::new();
        for (uri, key, ok, share) in futures::future::join_all(waits).await {
            if ok {
                if !watched.iter().any(|u| Arc::ptr_eq(u, &share.up)) {
                    watched.push(share.up.clone());
                }
                admission.accept(&uri, key, WatchGuard::new(share));
            } else {
                admission.refuse(
                    &uri,
                    SourceError::Unavailable("the upstream did not accept the subscription".into()),
                );
            }
        }
        // The slugs of the tasks it follows are watched too: a reload that takes one away
        // ends the stream as it does for a URI.
        for id in filter.task_ids.iter().flatten() {
            if let Some((slug, _)) = crate::gateway::tasks::split(id)
                && let Ok(up) = self.access.slug(caller, slug)
                && !watched.iter().any(|u| Arc::ptr_eq(u, &up))
            {
                watched.push(up);
            }
        }
        // A caller this gateway does not know was let in by no gate (QUIC has none): it was
        // given nothing, and has no access a reload could take.
        if self.access.authenticates(caller) != Authentication::Known {
            return admission;
        }
        // Every stream is held (one that follows only lists or tasks too: a revoked token
        // ends it), then checked against the config now: a reload that swapped it in between
        // either saw this stream or is seen here.
        let revoked = self.access.hold(caller, &watched);
        if !self.access.keeps(caller, &watched) {
            revoked.cancel();
        }
        admission
            .guards
            .push(WatchGuard::new(revoked.clone().drop_guard()));
        admission.revoked = Some(revoked);
        admission
    }

    fn changes(&self) -> ChangeFeed {
        self.feed.clone()
    }

    fn tools(&self, caller: &Caller) -> std::borrow::Cow<'_, [Tool]> {
        let mut out = Vec::new();
        // One snapshot for the whole list (a reload swaps it whole).
        let now = self.access.now();
        for u in now.selected(caller) {
            let Some(l) = u.catalog() else { continue };
            let read_only = now.read_only(caller, &u.name);
            for t in &l.tools {
                if read_only && !crate::upstream::is_read_only(t) {
                    continue;
                }
                let mut t = t.clone();
                t.name = now.shown(&u.name, &t.name).into();
                out.push(t);
            }
        }
        out.into()
    }

    /// From the slug's catalog alone (never the whole listing).
    fn tool(&self, caller: &Caller, name: &str) -> Option<Tool> {
        let (up, tool) = self.access.route_name(caller, name, Names::Tools)?.ok()?;
        let mut t = up.catalog()?.tools.iter().find(|t| t.name == tool)?.clone();
        if self.access.read_only(caller, &up.name) && !crate::upstream::is_read_only(&t) {
            return None;
        }
        t.name = name.to_owned().into();
        Some(t)
    }

    /// What the slug's own listing says of the tool (the caller's entitlement is checked
    /// when the call goes out).
    fn task_support(&self, caller: &Caller, name: &str) -> crate::mcp::tasks::TaskSupport {
        // A slug this caller may not use says nothing of its tools: the call goes on to its
        // one refusal (-32024), never to a -32021 that would tell a task-only tool exists.
        let Some(Ok((up, tool))) = self.access.route_name(caller, name, Names::Tools) else {
            return crate::mcp::tasks::TaskSupport::Forbidden;
        };
        let tool = tool.as_str();
        match up.catalog() {
            Some(c) => c.tools.iter().find(|t| t.name == tool).map_or(
                crate::mcp::tasks::TaskSupport::Forbidden,
                crate::mcp::tasks::task_support,
            ),
            // Not connected yet: a declaring caller's call goes out as a task, and the slug
            // decides (it answers in place when the tool runs only that way).
            None => crate::mcp::tasks::TaskSupport::Optional,
        }
    }

    fn task_relay(&self) -> Option<Arc<dyn crate::mcp::tasks::relaying::TaskRelay>> {
        Some(self.tasks.clone())
    }

    fn webhook_receiver(&self) -> Option<Arc<dyn crate::mcp::server::webhooks::Receiver>> {
        Some(self.feeds.clone())
    }

    async fn call_tool(
        &self,
        caller: &Caller,
        name: &str,
        args: JsonObject,
        mut call: Call,
    ) -> Result<CallToolResponse, SourceError> {
        let Some(route) = self.access.route_name(caller, name, Names::Tools) else {
            return Err(SourceError::UnknownTool(format!(
                "{name} (gateway tools are named server__tool)"
            )));
        };
        let (up, tool) = route?;
        self.access.may_call(caller, &up, &tool)?;
        self.access.open_state(caller, &up.name, &mut call.input)?;
        let r = up.call_tool(&tool, args, call).await?;
        Ok(self.access.sealed_call(caller, &up.name, r))
    }

    async fn events_advertised(&self, caller: &Caller) -> bool {
        !self.event_slugs(caller).await.is_empty()
    }

    async fn events_list(&self, caller: &Caller) -> Result<Vec<Value>, SourceError> {
        let slugs = self.event_slugs(caller).await;
        let lists = slugs
            .iter()
            .map(|u| async move { (u.clone(), u.custom("events/list", json!({})).await) });
        let mut out = Vec::new();
        for (u, r) in futures::future::join_all(lists).await {
            match r {
                Ok(v) => {
                    for mut e in v["events"].as_array().cloned().unwrap_or_default() {
                        if let Some(n) = e["name"].as_str() {
                            e["name"] = prefixed(&u.name, n).into();
                        }
                        // The gateway polls and streams every event type, from its feed
                        // (`feeds.rs`) whatever the slug delivers by; webhooks are its own.
                        e["delivery"] = json!(["poll", "push"]);
                        out.push(e);
                    }
                }
                Err(e) => {
                    events_list_failed(self.ctx.metrics()).inc();
                    tracing::error!(slug = %u.name, error = %e, "events/list failed after the handshake advertised events");
                }
            }
        }
        Ok(out)
    }

    async fn events_poll(
        &self,
        caller: &Caller,
        mut params: JsonObject,
    ) -> Result<Value, SourceError> {
        let name = params
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let Some((slug, event)) = name
            .split_once("__")
            .filter(|(s, e)| valid_slug(s) && !e.is_empty())
        else {
            return Err(SourceError::InvalidParams(format!(
                "event name {name:?} is not <server>__<event>; events/list names the events"
            )));
        };
        let up = self.slug(caller, slug)?;
        if !up.offers_events(EVENTS_PROBE).await? {
            return Err(SourceError::EventNotFound(format!(
                "server {slug} serves no events; events/list names the events"
            )));
        }
        // A long poll may legitimately take its whole timeoutMs.
        let wait = params
            .get("timeoutMs")
            .and_then(Value::as_u64)
            .map_or(Duration::ZERO, |ms| {
                Duration::from_millis(ms.min(MAX_LONG_POLL.as_millis() as u64))
            });
        params.insert("name".into(), event.into());
        // Every poll of this event type (and so every stream and webhook of it) reads one
        // upstream subscription; one its feed cannot answer goes to the slug, a long one
        // sharing one upstream call per cursor.
        let mut v = match self.feeds.poll(slug, &up, &params, wait).await {
            Some(v) => v?,
            None if wait.is_zero() => {
                up.custom_within("events/poll", Value::Object(params), REQUEST_TIMEOUT)
                    .await?
            }
            None => {
                self.polls
                    .poll(slug, &up, params, wait, &self.ctx, &self.poll_metrics)
                    .await?
            }
        };
        // The caller's entitlement is asked again for what the wait brought: a token revoked
        // meanwhile gets nothing of it.
        self.slug(caller, slug)?;
        if let Some(evs) = v.get_mut("events").and_then(Value::as_array_mut) {
            for e in evs {
                if let Some(n) = e["name"].as_str() {
                    e["name"] = prefixed(slug, n).into();
                }
            }
        }
        Ok(v)
    }
}

/// The gateway's counter of `events/list` calls that failed after the upstream's handshake
/// advertised events (a fault it reports; reference 002's `mcp.events_list_failed`),
/// registered (or found) in `metrics`.
pub fn events_list_failed(metrics: &Metrics) -> Counter {
    metrics.counter(
        "herald_events_list_failed_total",
        "events/list calls that failed after the handshake advertised events",
    )
}

#[cfg(test)]
#[path = "source_tests.rs"]
mod tests;
