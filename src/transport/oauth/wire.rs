//! The HTTP client under every Streamable HTTP connection: reqwest, and, for a server that
//! takes OAuth, the session's token on each request. A request the server refuses (`401`, or
//! `403` with `insufficient_scope`) goes to [`OAuth::challenged`] and, when that brings a
//! token, is sent once more; a request that gets through resets the session's count of
//! authorizations. Without a session it is reqwest as rmcp drives it, with the configured
//! static token.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use futures::stream::BoxStream;
use http::{HeaderName, HeaderValue};
use rmcp::model::ClientJsonRpcMessage;
use rmcp::transport::streamable_http_client::{
    SseError, StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse,
    StreamableHttpResponseLimits,
};

use super::OAuth;

type Error = StreamableHttpError<reqwest::Error>;

/// reqwest, with an OAuth session when the server takes one.
#[derive(Clone)]
pub struct McpHttp {
    pub client: reqwest::Client,
    pub oauth: Option<Arc<OAuth>>,
}

impl McpHttp {
    /// Runs `send` with the session's token ([`OAuth::send`]), or with the static one.
    async fn authorized<T, F, Fut>(&self, static_token: Option<String>, send: F) -> Result<T, Error>
    where
        F: Fn(Option<String>) -> Fut,
        Fut: Future<Output = Result<T, Error>>,
    {
        let Some(oauth) = &self.oauth else {
            return send(static_token).await;
        };
        let refusal = |r: &Result<T, Error>| match r {
            Err(StreamableHttpError::AuthRequired(c)) => {
                Some((false, c.www_authenticate_header.clone()))
            }
            Err(StreamableHttpError::InsufficientScope(c)) => {
                Some((true, c.www_authenticate_header.clone()))
            }
            _ => None,
        };
        oauth
            .send(static_token, send, refusal)
            .await
            .unwrap_or_else(|e| Err(StreamableHttpError::UnexpectedServerResponse(Cow::Owned(e))))
    }
}

impl StreamableHttpClient for McpHttp {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_token: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, Error> {
        self.post_message_with_response_limits(
            uri,
            message,
            session_id,
            auth_token,
            custom_headers,
            StreamableHttpResponseLimits::default(),
        )
        .await
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_token: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<StreamableHttpPostResponse, Error> {
        self.authorized(auth_token, |token| {
            self.client.post_message_with_max_sse_event_size(
                uri.clone(),
                message.clone(),
                session_id.clone(),
                token,
                custom_headers.clone(),
                max_sse_event_size,
            )
        })
        .await
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_token: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> Result<StreamableHttpPostResponse, Error> {
        self.authorized(auth_token, |token| {
            self.client.post_message_with_response_limits(
                uri.clone(),
                message.clone(),
                session_id.clone(),
                token,
                custom_headers.clone(),
                limits,
            )
        })
        .await
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_token: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), Error> {
        self.authorized(auth_token, |token| {
            self.client.delete_session(
                uri.clone(),
                session_id.clone(),
                token,
                custom_headers.clone(),
            )
        })
        .await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_token: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<BoxStream<'static, Result<sse_stream::Sse, SseError>>, Error> {
        self.authorized(auth_token, |token| {
            self.client.get_stream(
                uri.clone(),
                session_id.clone(),
                last_event_id.clone(),
                token,
                custom_headers.clone(),
            )
        })
        .await
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_token: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<BoxStream<'static, Result<sse_stream::Sse, SseError>>, Error> {
        self.authorized(auth_token, |token| {
            self.client.get_stream_with_max_sse_event_size(
                uri.clone(),
                session_id.clone(),
                last_event_id.clone(),
                token,
                custom_headers.clone(),
                max_sse_event_size,
            )
        })
        .await
    }
}
