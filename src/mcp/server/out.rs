//! `RmcpOut`: a listen's notifications written to rmcp's subscription (byte streams, and
//! HTTP listens off herald's own SSE path), tagged with the stream's subscription id.

use rmcp::service::{SubscriptionContext, SubscriptionSendError};

use crate::mcp::listen::{ListenOut, Undelivered};
use crate::mcp::lists::List;
use rmcp::model::DetailedTask;

/// A listen carried by rmcp's subscription: byte streams (stdio, QUIC, in-process pipes), and
/// HTTP requests off herald's own SSE path.
pub(super) struct RmcpOut<'a> {
    pub(super) ctx: &'a SubscriptionContext,
}

impl ListenOut for RmcpOut<'_> {
    async fn updated(&mut self, uri: &str) -> Result<(), Undelivered> {
        sent(
            self.ctx
                .sink()
                .notify_resource_updated(uri.to_owned())
                .await,
        )
    }

    async fn list_changed(&mut self, list: List) -> Result<(), Undelivered> {
        let sink = self.ctx.sink();
        sent(match list {
            List::Tools => sink.notify_tool_list_changed().await,
            List::Prompts => sink.notify_prompt_list_changed().await,
        })
    }

    /// `notifications/tasks`, tagged with the stream's subscription id: rmcp's sink refuses
    /// this notification, so it goes to the peer directly.
    async fn task(&mut self, task: DetailedTask) -> Result<(), Undelivered> {
        use rmcp::model::GetMeta as _;
        let mut n = rmcp::model::ServerNotification::TaskStatusNotification(
            rmcp::model::TaskStatusNotification::new(task.into()),
        );
        n.get_meta_mut()
            .set_subscription_id(self.ctx.sink().id().clone());
        self.ctx
            .request_context()
            .peer
            .send_notification(n)
            .await
            .map_err(|e| Undelivered::Failed(e.to_string()))
    }

    fn closed(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        self.ctx.request_context().ct.clone().cancelled_owned()
    }

    fn is_closed(&self) -> bool {
        self.ctx.request_context().ct.is_cancelled()
    }
}

/// What became of a notification given to rmcp's subscription sink.
fn sent(r: Result<(), SubscriptionSendError>) -> Result<(), Undelivered> {
    match r {
        Ok(()) => Ok(()),
        Err(SubscriptionSendError::SubscriptionClosed) => Err(Undelivered::Closed),
        Err(e @ SubscriptionSendError::NotificationNotAccepted(_)) => {
            Err(Undelivered::NotAccepted(e.to_string()))
        }
        Err(e) => Err(Undelivered::Failed(e.to_string())),
    }
}
