//! MCP plumbing shared by every role. Server side: the [`Source`](source::Source) trait, the
//! request's [`Caller`](caller::Caller), listen [`admission`], the listen hub and change feed,
//! the event-log ring, the Events extension over those rings, the rmcp handler that ties
//! them together, with [`template`] (RFC 6570 matching, which the client side's routing uses
//! too). The client side is [`crate::upstream`], above this module and [`crate::transport`];
//! what every role shares at run time (its context, the status board, metrics, backoff,
//! secrets) is [`crate::runtime`], below this module.

pub mod admission;
pub mod call;
pub mod caller;
pub mod conn;
pub mod error;
pub mod events;
pub mod hub;
pub mod legacy;
pub mod limits;
pub mod listen;
pub mod lists;
pub mod ring;
pub mod sealed;
pub mod server;
pub mod source;
pub mod tasks;
pub mod template;
