//! Admitting a `subscriptions/listen`: the one path every listen takes before its
//! acknowledgment.
//!
//! A listen is admitted exactly once, when [`SourceServer::open`](crate::mcp::server::SourceServer::open)
//! opens it:
//! 1. the limits are checked and a stream slot is reserved on the caller's connection
//!    ([`check_listen`]);
//! 2. the source decides, for this caller, which of the requested URIs it accepts and starts
//!    whatever keeps them watched ([`Source::admit`](crate::mcp::source::Source::admit), which
//!    returns an [`Admission`]: accepted URIs with their feed keys, the guards); a listen's
//!    `taskIds` are registered with the server's [`Tasks`](crate::mcp::tasks::Tasks);
//! 3. the accepted feed keys (and those of the lists the listen asked for that the server
//!    announces, see [`crate::mcp::lists`]) are registered with the hub, so no change
//!    published after the acknowledgment is lost.
//!
//! The result, an [`AdmittedListen`], comes back with its acknowledgment
//! ([`Ack`](crate::mcp::listen::Ack), made once from it: exactly [`Admission::uris`], the
//! accepted lists, the admitted `taskIds`), which the transport writes before anything else of
//! the stream. Nothing watches a URI again after admission: the guards taken here are the ones
//! the listen holds until it ends.
//!
//! rmcp 3.11 builds an acknowledgment of its own from the request and a context-less hook
//! (`accepted_subscription_filter`), with no `taskIds`: herald never lets it reach a client.
//! Byte streams answer a listen in [`ConnServer`](crate::mcp::conn::ConnServer) ahead of rmcp's
//! dispatch; on HTTP, a listen the gate leaves to rmcp is claimed by the handler
//! ([`ListenClaim`]) and answered by the gate's own stream.

use crate::sync::Recover;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use rmcp::model::{ErrorData as McpError, SubscriptionFilter};
use serde_json::{Value, json};

use crate::mcp::error::SourceError;
use crate::mcp::hub::Registration;
use crate::mcp::limits::Limits;
use crate::mcp::lists::Lists;

/// What a listen asks for: the `notifications` object of `subscriptions/listen`, parsed once.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ListenFilter {
    /// `resourceSubscriptions`; `None` when the listen names none (its ack then names none).
    pub resources: Option<Vec<String>>,
    /// `taskIds` (the tasks extension). rmcp 3.11 drops this field when it parses a listen,
    /// so herald's transports take it out first: HTTP's listen gate reads the body, the line
    /// transport hands it beside the parsed request ([`ListenTaskIds`]).
    pub task_ids: Option<Vec<String>>,
    /// `toolsListChanged` / `promptsListChanged` (see [`crate::mcp::lists`]).
    pub lists: Lists,
    /// `_meta["io.herald/contents"]: true`: each update carries its URI's read ([`CONTENTS`]).
    pub contents: bool,
}

/// The `_meta` key of a listen asking that its updates carry what a read would answer (a
/// herald extension, declared in the server's capabilities), and of each update's read:
/// `{"mimeType", "text"}` (`"blob"`, base64, for bytes) or `{"error": {"code", "message"}}`.
/// The stream sends each URI's read once right after its acknowledgment, then one with every
/// update; an event log's reads after the first hold only what is past the previous one.
pub const CONTENTS: &str = "io.herald/contents";

/// Reads a URI for a listen that carries contents ([`CarriedRead`]); `None` when the read is
/// too big to carry (the stream then sends that URI's updates plain, and its client reads).
pub type ReadForUpdate = Arc<
    dyn Fn(String, Option<u64>) -> futures::future::BoxFuture<'static, Option<CarriedRead>>
        + Send
        + Sync,
>;

/// One read an update carries.
#[derive(Debug, Clone, PartialEq)]
pub struct CarriedRead {
    /// The `_meta` value to carry: the contents, or the read's error.
    pub value: Value,
    /// An event log's newest `seq` in it: the next read's `after`.
    pub newest: Option<u64>,
    /// An event log's page with more after it ([`crate::mcp::ring::more_waiting`]): the
    /// stream reads the next page at once.
    pub more: bool,
}

/// Whether a request's `_meta` asks for carried contents ([`CONTENTS`]).
pub fn asks_contents(meta: Option<&Value>) -> bool {
    meta.and_then(|m| m.get(CONTENTS)) == Some(&Value::Bool(true))
}

/// A listen's `params.notifications.taskIds` as sent (whatever its shape: admission checks
/// it), which the line transport puts in the parsed request's extensions, where rmcp hands
/// it on to the request's context untouched. The body is not rewritten, and a client cannot
/// put it there itself.
#[derive(Debug, Clone, PartialEq)]
pub struct ListenTaskIds(pub serde_json::Value);

/// The `-32021` of a listen naming `taskIds` from a client that did not declare the tasks
/// extension: decided on the field's presence alone, before anything else is checked.
pub fn tasks_not_declared() -> McpError {
    McpError::missing_required_client_capability(
        rmcp::model::ClientCapabilities::builder()
            .enable_tasks()
            .build(),
    )
}

/// Whether a request's `_meta` declares the tasks extension.
pub fn declares_tasks(meta: Option<&Value>) -> bool {
    meta.and_then(|m| m.get("io.modelcontextprotocol/clientCapabilities"))
        .and_then(|c| c.get("extensions"))
        .and_then(|e| e.get(crate::mcp::tasks::TASKS_EXTENSION))
        .is_some()
}

impl ListenFilter {
    /// The filter of a raw `subscriptions/listen` request's `params`. A field of the wrong
    /// shape is `-32602` naming it, never an empty acknowledgment.
    pub fn from_params(params: Option<&Value>) -> Result<ListenFilter, McpError> {
        let notifications = match params {
            None | Some(Value::Null) => None,
            Some(Value::Object(p)) => p.get("notifications"),
            Some(_) => {
                return Err(McpError::invalid_params(
                    "subscriptions/listen params must be an object",
                    None,
                ));
            }
        };
        // The tasks gate first: `taskIds` from a client that did not declare the extension is
        // -32021 whatever else the request holds.
        if let Some(Value::Object(n)) = notifications
            && n.contains_key("taskIds")
            && !declares_tasks(params.and_then(|p| p.get("_meta")))
        {
            return Err(tasks_not_declared());
        }
        let n = match notifications {
            Some(Value::Object(n)) => n,
            Some(_) => {
                return Err(McpError::invalid_params(
                    "subscriptions/listen params.notifications must be an object",
                    None,
                ));
            }
            None => {
                return Err(McpError::invalid_params(
                    "subscriptions/listen needs params.notifications (e.g. {\"resourceSubscriptions\":[\"memo://notes\"]})",
                    None,
                ));
            }
        };
        Ok(ListenFilter {
            resources: string_list(n.get("resourceSubscriptions"), "resourceSubscriptions")?,
            task_ids: string_list(n.get("taskIds"), "taskIds")?,
            lists: Lists::from_notifications(n)?,
            contents: asks_contents(params.and_then(|p| p.get("_meta"))),
        })
    }

    /// The filter rmcp parsed (byte streams).
    pub fn from_rmcp(f: &SubscriptionFilter) -> ListenFilter {
        ListenFilter {
            resources: f.resource_subscriptions.clone(),
            task_ids: None,
            lists: Lists::from_rmcp(f),
            contents: false,
        }
    }

    /// The filter of a listen on a byte stream: what rmcp parsed, and the `taskIds` the line
    /// transport found beside it ([`ListenTaskIds`]), gated on `declared` (the tasks
    /// extension in the request's capabilities) before their shape is checked; `contents`
    /// from the request's `_meta` ([`asks_contents`]).
    pub fn from_conn(
        f: &SubscriptionFilter,
        task_ids: Option<&ListenTaskIds>,
        declared: bool,
        contents: bool,
    ) -> Result<ListenFilter, McpError> {
        let mut filter = ListenFilter::from_rmcp(f);
        filter.contents = contents;
        if let Some(ListenTaskIds(ids)) = task_ids {
            if !declared {
                return Err(tasks_not_declared());
            }
            filter.task_ids = string_list(Some(ids), "taskIds")?;
        }
        Ok(filter)
    }

    /// The requested URIs, each once, in request order.
    pub fn uris(&self) -> Vec<String> {
        let mut seen = std::collections::HashSet::new();
        self.resources
            .iter()
            .flatten()
            .filter(|u| seen.insert(u.as_str()))
            .cloned()
            .collect()
    }

    fn requested(&self) -> usize {
        self.resources.as_ref().map_or(0, Vec::len)
    }
}

fn string_list(v: Option<&Value>, field: &str) -> Result<Option<Vec<String>>, McpError> {
    let bad = || {
        McpError::invalid_params(
            format!("subscriptions/listen notifications.{field} must be a list of strings"),
            Some(json!({"field": field})),
        )
    };
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| x.as_str().map(str::to_owned).ok_or_else(bad))
            .collect::<Result<Vec<_>, _>>()
            .map(Some),
        Some(_) => Err(bad()),
    }
}

/// One accepted URI: as the caller wrote it, and the key its changes are published under on
/// the source's change feed (most sources publish the URI itself; the gateway publishes
/// `slug+URI`, since one URI may name different servers for different callers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accepted {
    pub uri: String,
    pub key: String,
}

/// A source's answer to a listen: what it accepts for this caller, and what keeps it watched.
#[derive(Default)]
pub struct Admission {
    /// Accepted URIs, in request order.
    pub accepted: Vec<Accepted>,
    /// Requested URIs left out, with why (logged, never sent: the ack simply omits them).
    pub refused: Vec<(String, SourceError)>,
    /// Held for as long as the listen runs; dropping them lets the source stop watching.
    pub guards: Vec<WatchGuard>,
    /// Cancelled when the caller loses access to what the stream watches (a gateway's
    /// reload revoked its token, or removed or replaced a server it watches): the stream
    /// then ends with an error saying to listen again.
    pub revoked: Option<tokio_util::sync::CancellationToken>,
}

impl Admission {
    /// Accepts `uri`, published under `key`, kept watched by `guard`.
    pub fn accept(&mut self, uri: &str, key: impl Into<String>, guard: WatchGuard) {
        self.accepted.push(Accepted {
            uri: uri.to_owned(),
            key: key.into(),
        });
        self.guards.push(guard);
    }

    /// Leaves `uri` out of the acknowledgment.
    pub fn refuse(&mut self, uri: &str, why: SourceError) {
        self.refused.push((uri.to_owned(), why));
    }

    /// The URIs the acknowledgment names.
    pub fn uris(&self) -> Vec<String> {
        self.accepted.iter().map(|a| a.uri.clone()).collect()
    }
}

/// Open streams against one budget (a stdio process, a QUIC connection; on HTTP a caller or a
/// client address; a whole server): `subscriptions/listen` streams and `events/stream`
/// streams, each kind counted against its own cap.
#[derive(Debug, Clone, Default)]
pub struct ConnStreams {
    counts: Arc<StreamCounts>,
    budget: Budget,
}

/// Whose streams a [`ConnStreams`] counts, which says which limit applies and what a refusal
/// names.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub enum Budget {
    /// One connection (stdio, QUIC): `--max-listen-streams`.
    #[default]
    Connection,
    /// HTTP callers with no identity, by client address (a trusted proxy's forwarded one):
    /// `--max-listen-streams`.
    Address(std::net::IpAddr),
    /// A caller the server knows by its token, on every transport: `key` tells tokens apart (a
    /// digest, never the token), `name` is its `[[token]]` name, for the refusal:
    /// `--max-caller-listen-streams`.
    Caller { key: String, name: String },
    /// Every stream of a server: `--max-total-listen-streams`.
    Server,
}

impl Budget {
    /// The most listen streams this budget holds under `limits`.
    pub fn listen_limit(&self, limits: &Limits) -> usize {
        match self {
            Budget::Connection | Budget::Address(_) => limits.max_streams_per_connection,
            Budget::Caller { .. } => limits.max_listen_streams_per_caller,
            Budget::Server => limits.max_listen_streams_total,
        }
    }

    /// The refusal of a listen past this budget's `limit`, naming the budget and what to do.
    fn refusal(&self, limit: usize) -> McpError {
        let (kind, message) = match self {
            Budget::Connection => (
                "connection",
                format!(
                    "this connection already has {limit} open listen streams, the most allowed (--max-listen-streams); cancel one first or open another connection"
                ),
            ),
            Budget::Address(ip) => (
                "address",
                format!(
                    "the client address {ip} already has {limit} open listen streams, the most one address may hold without a token (--max-listen-streams); cancel one first; callers with tokens have budgets of their own, and behind a proxy, name it with --trusted-proxy so each client's own address counts"
                ),
            ),
            Budget::Caller { name, .. } => (
                "caller",
                format!(
                    "the caller {name:?} already has {limit} open listen streams, the most one token may hold (--max-caller-listen-streams); cancel one first"
                ),
            ),
            Budget::Server => (
                "server",
                format!(
                    "this server already has {limit} open listen streams, all it takes (--max-total-listen-streams); cancel one first, or ask the operator to raise it"
                ),
            ),
        };
        McpError::invalid_request(message, Some(json!({"limit": limit, "budget": kind})))
    }
}

/// The two counts behind [`ConnStreams`].
#[derive(Debug, Default)]
pub struct StreamCounts {
    listens: AtomicUsize,
    events: AtomicUsize,
}

impl ConnStreams {
    /// A listen stream's slot, if fewer than `max` are open.
    pub fn try_acquire(&self, max: usize) -> Option<StreamSlot> {
        self.acquire(max, false)
    }

    /// An `events/stream` stream's slot, if fewer than `max` are open.
    pub fn try_acquire_events(&self, max: usize) -> Option<StreamSlot> {
        self.acquire(max, true)
    }

    fn acquire(&self, max: usize, events: bool) -> Option<StreamSlot> {
        let count = self.counts.count(events);
        let prev = count.fetch_add(1, Ordering::AcqRel);
        if prev >= max {
            count.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(StreamSlot(Arc::new(SlotInner(self.counts.clone(), events))))
    }

    /// A fresh budget of `budget`'s kind.
    pub fn of(budget: Budget) -> ConnStreams {
        ConnStreams {
            counts: Arc::default(),
            budget,
        }
    }

    /// Counts shared with other holders of `shared`, under `budget`.
    pub fn from_shared(shared: Arc<StreamCounts>, budget: Budget) -> ConnStreams {
        ConnStreams {
            counts: shared,
            budget,
        }
    }

    pub fn downgrade(&self) -> std::sync::Weak<StreamCounts> {
        Arc::downgrade(&self.counts)
    }

    /// Whose streams these are.
    pub fn budget(&self) -> &Budget {
        &self.budget
    }

    /// Listen streams open now.
    pub fn open(&self) -> usize {
        self.counts.listens.load(Ordering::Acquire)
    }

    /// `events/stream` streams open now.
    pub fn open_events(&self) -> usize {
        self.counts.events.load(Ordering::Acquire)
    }
}

impl StreamCounts {
    fn count(&self, events: bool) -> &AtomicUsize {
        if events { &self.events } else { &self.listens }
    }
}

/// A reserved stream slot, released when the stream that holds it is dropped.
#[derive(Clone)]
pub struct StreamSlot(#[allow(dead_code)] Arc<SlotInner>);
struct SlotInner(Arc<StreamCounts>, bool);
impl Drop for SlotInner {
    fn drop(&mut self) {
        self.0.count(self.1).fetch_sub(1, Ordering::AcqRel);
    }
}

/// A listen's slots: on its own budget, on its caller's (when the server knows the caller by
/// its token) and on the server's total.
pub struct ListenSlots {
    _own: StreamSlot,
    _caller: Option<StreamSlot>,
    _total: StreamSlot,
}

/// Budgets by whose they are, each shared while anything holds it and pruned after (when the
/// map has doubled since it last was: amortised constant work).
#[derive(Default)]
pub struct Budgets {
    map: Mutex<KeptBudgets>,
}

#[derive(Default)]
struct KeptBudgets {
    budgets: HashMap<Budget, std::sync::Weak<StreamCounts>>,
    prune_at: usize,
}

impl Budgets {
    /// The streams of `budget`, shared with every other holder of it.
    pub fn get(&self, budget: Budget) -> ConnStreams {
        let mut kept = self.map.locked();
        if let Some(live) = kept.budgets.get(&budget).and_then(std::sync::Weak::upgrade) {
            return ConnStreams::from_shared(live, budget);
        }
        if kept.budgets.len() >= kept.prune_at.max(1024) {
            kept.budgets.retain(|_, w| w.strong_count() > 0);
            kept.prune_at = kept.budgets.len() * 2;
        }
        let fresh = ConnStreams::of(budget.clone());
        kept.budgets.insert(budget, fresh.downgrade());
        fresh
    }

    /// Budgets kept now, live or not yet pruned (tests).
    #[cfg(test)]
    pub fn kept(&self) -> usize {
        self.map.locked().budgets.len()
    }
}

/// A server's own listen budgets, on every transport: its total, and one per caller it knows
/// by its token ([`Source::identity`](crate::mcp::source::Source::identity)).
pub struct ServerBudgets {
    total: ConnStreams,
    callers: Budgets,
}

impl Default for ServerBudgets {
    fn default() -> Self {
        ServerBudgets {
            total: ConnStreams::of(Budget::Server),
            callers: Budgets::default(),
        }
    }
}

impl ServerBudgets {
    /// [`check_listen`] with the caller's budget (for `identity`) and the total.
    pub fn check(
        &self,
        limits: &Limits,
        filter: &ListenFilter,
        own: &ConnStreams,
        identity: Option<(String, String)>,
    ) -> Result<ListenSlots, McpError> {
        let caller = identity.map(|(key, name)| self.callers.get(Budget::Caller { key, name }));
        check_listen(limits, filter, own, caller.as_ref(), &self.total)
    }
}

/// Checks a listen against the limits and reserves a stream slot on `conn` (under its
/// budget's limit), on its `caller`'s budget when there is one, and on the server's `total`.
/// Runs before rmcp acknowledges the listen, so a refusal is a plain JSON-RPC error naming the
/// budget that was full; a slot taken before it is given back.
pub fn check_listen(
    limits: &Limits,
    filter: &ListenFilter,
    conn: &ConnStreams,
    caller: Option<&ConnStreams>,
    total: &ConnStreams,
) -> Result<ListenSlots, McpError> {
    let tasks = filter.task_ids.as_ref().map_or(0, Vec::len);
    if tasks > crate::mcp::tasks::MAX_LISTEN_TASK_IDS {
        return Err(McpError::invalid_params(
            format!(
                "subscriptions/listen names {tasks} task ids; one stream takes at most {}: split them across several listen requests",
                crate::mcp::tasks::MAX_LISTEN_TASK_IDS
            ),
            Some(json!({"limit": crate::mcp::tasks::MAX_LISTEN_TASK_IDS, "requested": tasks})),
        ));
    }
    let requested = filter.requested();
    if requested > limits.max_uris_per_stream {
        return Err(McpError::invalid_params(
            format!(
                "subscriptions/listen asks for {requested} resources; one stream takes at most {}: split them across several listen requests",
                limits.max_uris_per_stream
            ),
            Some(json!({"limit": limits.max_uris_per_stream, "requested": requested})),
        ));
    }
    let slot = |streams: &ConnStreams| {
        let limit = streams.budget.listen_limit(limits);
        streams
            .try_acquire(limit)
            .ok_or_else(|| streams.budget.refusal(limit))
    };
    let own = slot(conn)?;
    let caller = caller.map(slot).transpose()?;
    let total = slot(total)?;
    Ok(ListenSlots {
        _own: own,
        _caller: caller,
        _total: total,
    })
}

/// A listen that passed admission: everything its stream needs, made before the ack.
pub struct AdmittedListen {
    _slots: ListenSlots,
    pub(crate) registration: Registration,
    /// Each feed key, back to the URIs this stream wrote for it.
    pub(crate) spelled: HashMap<String, Vec<String>>,
    admission: Admission,
    /// The task pushes, when the listen named `taskIds` (and the server runs tasks).
    pub(crate) tasks: Option<crate::mcp::tasks::TaskFeed>,
    /// The acknowledgment's `taskIds`: `None` when the listen named none.
    pub(crate) task_echo: Option<Vec<String>>,
    /// The lists whose changes this stream accepted (registered under their feed keys).
    pub(crate) lists: Lists,
    /// The reads its updates carry, when the listen asked for them ([`CONTENTS`]).
    pub(crate) reads: Option<ReadForUpdate>,
}

impl AdmittedListen {
    /// Cancelled when the source takes the caller's access away (never, for most sources).
    pub(crate) fn revoked(&self) -> tokio_util::sync::CancellationToken {
        self.admission.revoked.clone().unwrap_or_default()
    }

    pub(crate) fn new(
        slots: ListenSlots,
        registration: Registration,
        admission: Admission,
    ) -> Self {
        let mut spelled: HashMap<String, Vec<String>> = HashMap::new();
        for a in &admission.accepted {
            spelled
                .entry(a.key.clone())
                .or_default()
                .push(a.uri.clone());
        }
        AdmittedListen {
            _slots: slots,
            registration,
            spelled,
            admission,
            tasks: None,
            task_echo: None,
            lists: Lists::default(),
            reads: None,
        }
    }

    /// The task ids the acknowledgment names: `None` when the listen named no `taskIds`.
    pub fn task_ids(&self) -> Option<Vec<String>> {
        self.task_echo.clone()
    }

    /// The URIs the acknowledgment names.
    pub fn uris(&self) -> Vec<String> {
        self.admission.uris()
    }

    /// The lists (`toolsListChanged`, `promptsListChanged`) the acknowledgment names.
    pub fn lists(&self) -> Lists {
        self.lists
    }

    /// What the source accepted.
    pub fn admission(&self) -> &Admission {
        &self.admission
    }
}

/// rmcp's word that it took an HTTP listen the gate left to it (a shape other than the plain
/// one herald answers at once): the gate admitted the listen and holds it, rmcp checks the
/// request as it checks any, and its `listen` handler claims the listen, telling the gate to
/// answer with herald's own stream (see `transport::http`). rmcp keeps this in the request's
/// extensions (which must be `Clone`); dropped unclaimed (rmcp refused the request), the
/// gate's receiver hears so.
#[derive(Clone)]
pub struct ListenClaim(Arc<Mutex<Option<tokio::sync::oneshot::Sender<()>>>>);

impl ListenClaim {
    /// A claim, and what hears it.
    pub fn new() -> (ListenClaim, tokio::sync::oneshot::Receiver<()>) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        (ListenClaim(Arc::new(Mutex::new(Some(tx)))), rx)
    }

    /// Claims the listen; `false` when it was claimed before or its holder is gone.
    pub fn claim(&self) -> bool {
        self.0.locked().take().is_some_and(|tx| tx.send(()).is_ok())
    }
}

/// Held while a listen stream (or a read, or a poll) watches a URI; dropping it tells the
/// source one watcher left.
/// Sources that start work per URI (a kubectl process, an inotify watch) refcount with it.
pub struct WatchGuard(#[allow(dead_code)] Option<Box<dyn Send + Sync>>);

impl WatchGuard {
    pub fn none() -> WatchGuard {
        WatchGuard(None)
    }

    pub fn new(inner: impl Send + Sync + 'static) -> WatchGuard {
        WatchGuard(Some(Box::new(inner)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter(v: Value) -> Result<ListenFilter, McpError> {
        ListenFilter::from_params(Some(&v))
    }

    fn declared() -> Value {
        json!({"io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}}})
    }

    #[test]
    fn task_ids_without_the_extension_are_32021_whatever_their_shape() {
        for ids in [json!([]), json!("x"), json!([1]), json!(vec!["t"; 300])] {
            let e = filter(json!({"notifications": {"taskIds": ids}})).unwrap_err();
            assert_eq!(e.code.0, -32021, "{ids}: {e:?}");
        }
    }

    #[test]
    fn a_filter_of_the_wrong_shape_is_invalid_params() {
        for bad in [
            json!({"notifications": {"resourceSubscriptions": "memo://notes"}}),
            json!({"notifications": {"resourceSubscriptions": [1]}}),
            json!({"notifications": {"resourceSubscriptions": {}}}),
            json!({"_meta": declared(), "notifications": {"taskIds": "t1"}}),
            json!({"notifications": 5}),
            json!({}),
            json!("x"),
        ] {
            let e = filter(bad.clone()).unwrap_err();
            assert_eq!(e.code.0, -32602, "{bad}: {e:?}");
        }
        assert!(
            filter(json!({"notifications": {"resourceSubscriptions": 7}}))
                .unwrap_err()
                .message
                .contains("resourceSubscriptions"),
            "the error names the field"
        );
    }

    #[test]
    fn a_filter_keeps_order_and_drops_repeats() {
        let f = filter(json!({"_meta": declared(), "notifications": {
            "resourceSubscriptions": ["b://1", "a://2", "b://1"], "taskIds": ["t"]}}))
        .unwrap();
        assert_eq!(f.uris(), vec!["b://1".to_string(), "a://2".into()]);
        assert_eq!(f.task_ids, Some(vec!["t".to_string()]));
        assert_eq!(f.requested(), 3, "limits count what was asked");
        let none = filter(json!({"notifications": {}})).unwrap();
        assert_eq!(none, ListenFilter::default());
    }

    #[test]
    fn slots_are_released_when_dropped() {
        let conn = ConnStreams::default();
        let a = conn.try_acquire(2).unwrap();
        let b = conn.try_acquire(2).unwrap();
        assert!(conn.try_acquire(2).is_none());
        drop(a);
        assert_eq!(conn.open(), 1);
        drop(b);
        assert_eq!(conn.open(), 0);
    }
}
