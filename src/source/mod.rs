//! Change sources. Each implements [`crate::mcp::source::Source`] and nothing else; sources
//! never import each other, the gateway or the watch client.

pub mod file;
pub mod k8s;
pub mod memo;
pub mod slack;
