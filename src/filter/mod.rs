//! Python filters and code mode in Monty (pydantic's sandboxed Python).
//!
//! [`engine`] runs code in a persistent scope with a host for the catalog functions;
//! [`worker`] is the child process that hosts scopes (`herald filter-worker`); [`pool`] is the
//! parent side that drives workers and proxies their catalog calls; [`pipe`] types every
//! message between the two; [`convert`] maps JSON to Python values and back; [`shape`] reads
//! code's syntax before it runs (whether a filter can give a notice, code mode's statements).

pub mod convert;
pub mod engine;
pub mod pipe;
pub mod pool;
pub mod shape;
pub mod worker;
