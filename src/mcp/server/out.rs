//! A listen answered on an rmcp session (byte streams: stdio, QUIC, the in-process pipes):
//! [`SourceServer::listen_on_peer`] writes its acknowledgment, then its notifications through
//! `PeerOut` (each tagged with the stream's subscription id), then its result.

use rmcp::model::{
    DetailedTask, ErrorData as McpError, GetMeta as _, RequestId, ResourceUpdatedNotification,
    ResourceUpdatedNotificationParam, ServerNotification,
};
use rmcp::service::{Peer, RequestContext, RoleServer};
use tokio_util::sync::CancellationToken;

use super::SourceServer;
use crate::mcp::admission::{AdmittedListen, CONTENTS};
use crate::mcp::listen::{Ack, ListenOut, Undelivered};
use crate::mcp::lists::List;

impl SourceServer {
    /// A listen's graceful result, for request `id` (as rmcp writes it: with `serverInfo`).
    pub fn listen_result(&self, id: rmcp::model::RequestId) -> rmcp::model::ServerResult {
        let mut result = rmcp::model::SubscriptionsListenResult::complete(id);
        result
            .meta
            .set_server_info(self.shared.config.server_info.clone());
        rmcp::model::ServerResult::SubscriptionsListenResult(result)
    }

    /// Answers an opened listen on an rmcp session's peer (byte streams): its acknowledgment,
    /// then its notifications until it ends, then its result.
    pub async fn listen_on_peer(
        &self,
        ack: Ack,
        listen: AdmittedListen,
        context: &RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ServerResult, McpError> {
        context
            .peer
            .send_notification(ack.notification(&context.id))
            .await
            .map_err(|e| {
                McpError::internal_error(format!("failed to acknowledge subscription: {e}"), None)
            })?;
        let mut out = PeerOut::new(context);
        self.deliver(listen, &mut out).await?;
        Ok(self.listen_result(context.id.clone()))
    }
}

/// A listen answered on an rmcp session: the listen request's peer, id and cancellation
/// (the client cancelling the listen, or going away).
pub(super) struct PeerOut {
    peer: Peer<RoleServer>,
    id: RequestId,
    ct: CancellationToken,
}

impl PeerOut {
    pub(super) fn new(context: &RequestContext<RoleServer>) -> PeerOut {
        PeerOut {
            peer: context.peer.clone(),
            id: context.id.clone(),
            ct: context.ct.clone(),
        }
    }

    async fn send(&self, mut n: ServerNotification) -> Result<(), Undelivered> {
        if self.ct.is_cancelled() {
            return Err(Undelivered::Closed);
        }
        n.get_meta_mut().set_subscription_id(self.id.clone());
        self.peer
            .send_notification(n)
            .await
            .map_err(|e| Undelivered::Failed(e.to_string()))
    }
}

impl ListenOut for PeerOut {
    async fn updated(
        &mut self,
        uri: &str,
        carried: Option<serde_json::Value>,
    ) -> Result<(), Undelivered> {
        let mut n = ServerNotification::ResourceUpdatedNotification(
            ResourceUpdatedNotification::new(ResourceUpdatedNotificationParam::new(uri)),
        );
        if let Some(c) = carried {
            n.get_meta_mut().insert(CONTENTS.into(), c);
        }
        self.send(n).await
    }

    async fn list_changed(&mut self, list: List) -> Result<(), Undelivered> {
        self.send(match list {
            List::Tools => ServerNotification::ToolListChangedNotification(Default::default()),
            List::Prompts => ServerNotification::PromptListChangedNotification(Default::default()),
        })
        .await
    }

    async fn task(&mut self, task: DetailedTask) -> Result<(), Undelivered> {
        self.send(ServerNotification::TaskStatusNotification(
            rmcp::model::TaskStatusNotification::new(task.into()),
        ))
        .await
    }

    fn closed(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        self.ct.clone().cancelled_owned()
    }

    fn is_closed(&self) -> bool {
        self.ct.is_cancelled()
    }
}
