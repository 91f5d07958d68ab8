//! The gateway: many upstream servers ("slugs") behind one endpoint (reference 002).
//!
//! The gateway is a [`Source`](crate::mcp::source::Source) like any other, so it is served by
//! the same plumbing on stdio, HTTP and QUIC, with the same listen limits, stall handling and
//! shutdown. What it adds:
//!
//! - **Who may call what** (`access.rs`): each request's
//!   [`Caller`](crate::mcp::source::Caller) (the bearer token, `?servers=`) becomes the set of
//!   slugs it may use; anything outside it is Forbidden (-32024) with one message whether the
//!   slug exists or not. A caller is known when it is local (stdio, `herald up`'s pipes), let
//!   in by `open_to_loopback`, or presents a configured token (its SHA-256 checked against
//!   every hash in constant time); over HTTP any other caller gets `401` before its request is
//!   read, over QUIC `-32024` (`data.kind: "unauthenticated"`) for every request, the
//!   handshake first (`mcp/conn.rs`).
//! - **Tools** `slug__tool`, forwarded with the prefix stripped; results and errors unchanged.
//!   A `[[slug]]` with `prefix = false` (at most one) keeps its names bare: a name it lists
//!   routes to it first (`Access::route_name`).
//! - **Prompts and completions** (`prompts.rs`): prompts named as tools are; a completion
//!   routed by its prompt's name or its template's URI. Every relayed request carries its
//!   caller's declared capabilities, log level and SEP-2322 answers upstream, and an
//!   upstream's `InputRequiredResult` comes back to the caller as it is.
//! - **Resources**: the union; URIs are not rewritten unless two slugs list the same one, then
//!   each is `slug+URI`. Routing is the rule every client role shares
//!   ([`crate::upstream::route`]): exact, then template, then first subscribable.
//!
//! Each slug is a shared [`Upstream`](crate::upstream::Upstream): its connection, kept
//! and re-made with backoff (a stdio slug is a supervised child, started again when it exits),
//! and its catalog, refreshed on every connect.
//! - **Listens**: one upstream subscription per watched URI, shared by every client watching
//!   it (refcounted by the hub's watch guards), resubscribed with backoff while clients stay.
//!   Admission starts or joins each URI's subscription as routed for this caller and waits (at
//!   most 5 s, in parallel) for the upstream's acknowledgment, so the gateway's ack names only
//!   what the upstreams accepted. A slug holds at most its `max_listens` of them on its one
//!   connection (48 for an outside server, which allows 64; 65,536 in `herald up`); past that
//!   a URI is left out of the ack, with the reason logged.
//! - **Tool and prompt lists** (`lists.rs`): a slug whose server says its lists change is
//!   listened to for those changes (an older server tells the connection's handler); each
//!   change refreshes the slug's catalog and reaches the gateway's own listens that asked, as
//!   does a reconnect whose fresh catalog lists other tools or prompts.
//! - **Events**: advertised when a selected slug's handshake does (3 s bound per slug);
//!   `events/list` and `events/poll` forwarded with `slug__` prefixes. Long polls (and so the
//!   gateway's streams and webhooks) of one event type read one shared upstream subscription
//!   (`feeds.rs`: by stream, poll, or webhook to the gateway itself), or share one upstream
//!   long poll (`polls.rs`) when the feed cannot answer.
//! - **Tasks** (`tasks.rs`): a task-augmented `slug__tool` call goes to the slug as one; its
//!   task is shown as `slug__<id>`; `tasks/*` route by that id, for the caller that started
//!   it; a listen's `taskIds` are relayed over one shared upstream listen per task.

mod access;
pub mod config;
pub mod feeds;
mod lists;
mod names;
pub(crate) mod owners;
pub mod polls;
mod prompts;
mod slug_oauth;
pub mod source;
mod tasks;
mod toml_errors;

pub use source::Gateway;
