//! herald: one binary carrying a push-driven MCP watch pipeline.
//!
//! Reading order: [`store`] (the one redb file), [`runtime`] (what every role shares at run
//! time: its context, the status board, the metrics registry, backoff, secrets), [`mcp`]
//! (the server plumbing every role shares: the source trait, listen hub, event-log ring, rmcp
//! handler, the routing templates), [`transport`] (stdio, HTTP and QUIC, server and client),
//! [`upstream`] (the one client of an upstream server, above `mcp` and `transport`:
//! connection, catalog, the routing rule, calls, reads, listens, event logs), [`source`] (the
//! change sources), [`app`] (binding and running roles, systemd's notify protocol and socket
//! activation, the admin address), [`cli`] (the command line). `docs/ARCHITECTURE.md` has the
//! map and the invariants.

// stdout is written through `app::console` only: `println!` panics on a closed pipe (`herald ls
// | head`), where herald must end quietly with status 0.
#![warn(clippy::print_stdout)]

pub mod agent;
pub mod app;
pub mod auth;
pub mod cli;
pub mod filter;
#[cfg(test)]
mod fuzzing;
pub mod gateway;
pub mod hooks;
pub mod mcp;
pub mod nats;
pub mod runtime;
pub mod source;
pub mod store;
pub mod sync;
#[cfg(test)]
mod testing;
pub mod transport;
pub mod upstream;
pub mod watch;
