//! MCP server plumbing shared by every source: the [`Source`](source::Source) trait, the
//! request's [`Caller`](caller::Caller), listen [`admission`], the listen hub and change feed, the event-log ring, the Events extension over those rings, and the rmcp
//! handler that ties them together.

pub mod admission;
pub mod caller;
pub mod conn;
pub mod events;
pub mod hub;
pub mod metrics;
pub mod ring;
pub mod server;
pub mod source;
