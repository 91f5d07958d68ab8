//! The runtime floor: what every role shares at run time, below the roles and below `mcp` and
//! `transport` (which import it; it imports neither).
//!
//! - [`context`]: [`RoleContext`](context::RoleContext), what a role runner hands the parts it
//!   builds (tracker, shutdown token, the role's name, the status board, the metrics registry,
//!   the ring tap).
//! - [`status`]: the status board the admin address reports.
//! - [`metrics`]: the registry in which each part registers its own counters and gauges, and
//!   `/metrics` renders them.
//! - [`backoff`]: the one retry pacing every role uses.
//! - [`in_place`]: a task's future polled again on the spot when it wakes itself.
//! - [`tap`]: where event-log rings send their events when a role publishes them.
//! - [`reload`]: how a reload request reaches the runner that can reload.
//! - [`secrets`]: the environment variables kept from every child process.
//! - [`percent`]: `%XX` decoding of a part of a URI.
//!
//! Nothing here names a role: each role registers what it counts.

pub mod backoff;
pub mod context;
pub mod in_place;
pub mod metrics;
pub mod percent;
pub mod reload;
pub mod secrets;
pub mod status;
pub mod tap;
