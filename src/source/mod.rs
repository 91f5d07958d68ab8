//! Change sources. Each implements [`crate::mcp::source::Source`] and nothing else; sources
//! never import each other, the gateway or the watch client.

pub mod file;
pub mod k8s;
pub mod memo;
pub mod slack;

use rmcp::model::JsonObject;

use crate::mcp::source::SourceError;

/// The event-log URI an `events/poll` of `event` with `args` selects, as the role serving that
/// event type maps it: what a gateway serving published event logs (`crate::nats::events`)
/// is handed, so it answers polls as the role would.
pub fn poll_uri(event: &str, args: &JsonObject) -> Result<String, SourceError> {
    match event {
        memo::CHANGED_EVENT => {
            crate::mcp::events::check_arguments(args, event, &[])?;
            Ok(memo::LOG_URI.to_owned())
        }
        file::CHANGED_EVENT => file::poll_uri(args),
        k8s::K8S_CHANGED | k8s::KCP_CHANGED => k8s::poll_uri(event, args).map(|(uri, _)| uri),
        other => Err(crate::mcp::events::unknown_event(other)),
    }
}
