//! The watch client: routing, subscribe, diff, dedupe, debounce, persistence.
//!
//! Built bottom-up: [`template`] (RFC 6570 matching for routing), [`events`] (state diff and
//! event-log delivery), [`notice`] (default lines, dedupe, debounce). The manager that ties
//! them to live subscriptions comes next.

pub mod events;
pub mod notice;
pub mod template;
