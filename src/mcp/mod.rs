//! MCP plumbing shared by every role. Server side: the [`Source`](source::Source) trait, the
//! request's [`Caller`](caller::Caller), listen [`admission`], the listen hub and change feed,
//! the event-log ring, the Events extension over those rings, the rmcp handler that ties
//! them together, and the process's [`status`] board (what the admin address reports). For the
//! client side ([`crate::upstream`], above this module and [`crate::transport`]): [`template`]
//! (RFC 6570 matching for routing) and [`backoff`] (the one retry pacing every role uses).

pub mod admission;
pub mod backoff;
pub mod caller;
pub mod conn;
pub mod context;
pub mod events;
pub mod hub;
pub mod legacy;
pub mod listen;
pub mod lists;
pub mod metrics;
pub mod ring;
pub mod sealed;
pub mod server;
pub mod source;
pub mod status;
pub mod tasks;
pub mod template;
