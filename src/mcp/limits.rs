//! A server's limits: what one connection, one listen stream and one message may take, each
//! with its default and its flag.

use std::time::Duration;

/// Default for [`Limits::max_streams_per_connection`] (`--max-listen-streams`).
pub const DEFAULT_MAX_LISTEN_STREAMS: usize = 64;
/// Default for [`Limits::max_listen_streams_per_caller`] (`--max-caller-listen-streams`): as
/// many as the server's total, since a token is often shared by a whole fleet's clients; an
/// operator lowers it to keep one token from taking them all.
pub const DEFAULT_MAX_CALLER_LISTEN_STREAMS: usize = 16_384;
/// Default for [`Limits::max_listen_streams_total`] (`--max-total-listen-streams`): 10,000
/// clients' streams, and room.
pub const DEFAULT_MAX_TOTAL_LISTEN_STREAMS: usize = 16_384;
/// Default for [`Limits::max_event_streams_per_connection`] (`--max-event-streams`).
pub const DEFAULT_MAX_EVENT_STREAMS: usize = 64;
/// Default for [`Limits::max_uris_per_stream`] (`--max-listen-uris`).
pub const DEFAULT_MAX_LISTEN_URIS: usize = 256;
/// Default for [`Limits::max_message_bytes`] (`--max-message-bytes`); clients use it too.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 4 << 20;
/// Default for [`Limits::stall_timeout`] (`--listen-stall-ms`), in milliseconds.
pub const DEFAULT_LISTEN_STALL_MS: u64 = 10_000;

/// Default for [`Limits::max_connections`] (`--max-connections`): every stream of
/// [`DEFAULT_MAX_TOTAL_LISTEN_STREAMS`] on a connection of its own (HTTP/1.1 SSE) with room for
/// calls, and with a file descriptor each well under the 65,536 open files the packaged units
/// allow (a lower open-file limit caps it further, logged at start).
pub const DEFAULT_MAX_CONNECTIONS: usize = 20_000;

/// Server-side limits. Every field has a default and a flag.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Open `subscriptions/listen` streams per connection (stdio, QUIC), and on HTTP per
    /// client address of callers without a token.
    pub max_streams_per_connection: usize,
    /// Open listen streams per caller known by its token, across its connections and
    /// transports.
    pub max_listen_streams_per_caller: usize,
    /// Open listen streams of the whole server.
    pub max_listen_streams_total: usize,
    /// Open `events/stream` streams per connection (a budget of their own: they count
    /// against neither the listen streams nor the requests in flight).
    pub max_event_streams_per_connection: usize,
    /// URIs one listen stream may ask for.
    pub max_uris_per_stream: usize,
    /// Largest incoming message (stdio/QUIC line, HTTP body), in bytes.
    pub max_message_bytes: usize,
    /// A listen stream whose notification cannot be written within this is ended, so the
    /// client resubscribes instead of holding a stalled stream.
    pub stall_timeout: Duration,
    /// Open connections per server (accepted TCP connections on HTTP, connections on QUIC);
    /// at the cap the server stops accepting until one closes.
    pub max_connections: usize,
}

/// Plain requests (calls, reads, polls) one connection may have running beside its listen
/// streams; past that its transport stops reading until one is answered.
pub const CALLS_IN_FLIGHT: usize = 128;

impl Limits {
    /// The requests one line-framed connection may have running at once: one per listen
    /// stream it may open, plus [`CALLS_IN_FLIGHT`].
    pub fn max_in_flight(&self) -> usize {
        self.max_streams_per_connection
            .saturating_add(CALLS_IN_FLIGHT)
    }

    /// The bytes of requests one line-framed connection may have running at once: four
    /// messages at the limit (a request over it is refused as it is read).
    pub fn max_in_flight_bytes(&self) -> usize {
        self.max_message_bytes.saturating_mul(4)
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_streams_per_connection: DEFAULT_MAX_LISTEN_STREAMS,
            max_listen_streams_per_caller: DEFAULT_MAX_CALLER_LISTEN_STREAMS,
            max_listen_streams_total: DEFAULT_MAX_TOTAL_LISTEN_STREAMS,
            max_event_streams_per_connection: DEFAULT_MAX_EVENT_STREAMS,
            max_uris_per_stream: DEFAULT_MAX_LISTEN_URIS,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            stall_timeout: Duration::from_millis(DEFAULT_LISTEN_STALL_MS),
            max_connections: DEFAULT_MAX_CONNECTIONS,
        }
    }
}
