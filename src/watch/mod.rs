//! The watch client: routing, subscribe, diff, dedupe, debounce, persistence.
//!
//! Bottom-up: [`template`] (RFC 6570 matching for routing), [`events`] (state diff and
//! event-log delivery), [`notice`] (default lines, dedupe, debounce), [`log`] (the NDJSON
//! event log), [`manager`] (live subscriptions, one task per watch), [`sink`] (where
//! `herald watch` sends notices). Independent of any sink, so the agent can reuse it.

pub mod events;
pub mod log;
pub mod manager;
pub mod notice;
pub mod raw;
pub mod sink;
pub mod template;
