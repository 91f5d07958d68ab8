//! The requests that run something on the source: `tools/call` (in place, as a task, or
//! relayed as one), `prompts/get` and `completion/complete`, with what each carries besides
//! its name and arguments (a [`Call`]: progress, log level, the client's capabilities and its
//! SEP-2322 answers). One path per request kind: the rmcp handler and callers in this process
//! (the HTTP gate's plain calls, `herald up`'s gateway) both come here.

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ClientCapabilities, CompleteRequestParams,
    CompleteResult, CreateTaskResult, ErrorData as McpError, GetPromptRequestParams,
    GetPromptResponse, JsonObject, ResultType,
};
use rmcp::service::{RequestContext, RoleServer};

use super::{CALL_GRACE, SourceServer, TaskBackend, as_answered, to_mcp_error};
use crate::mcp::caller::Caller;
use crate::mcp::source::{Call, Input, Log, Progress, SourceError};
use crate::mcp::tasks::TaskSupport;
use crate::mcp::tasks::relaying::Started;

/// What a request over a connection carries besides its name and arguments: from its
/// context (progress token, log level, declared capabilities) and its SEP-2322 answers.
pub(super) fn call_of(context: &RequestContext<RoleServer>, input: Input) -> Call {
    Call {
        progress: context.meta.get_progress_token().map(|token| Progress {
            token,
            peer: context.peer.clone(),
        }),
        task: None,
        input,
        capabilities: context.client_capabilities(),
        log: context.meta.log_level().map(|level| Log {
            level,
            peer: context.peer.clone(),
        }),
    }
}

/// What a request with no connection in between carries (the HTTP gate's plain requests):
/// its declared capabilities and its SEP-2322 answers. It has no progress and no log level
/// (requests that ask for either go through rmcp, which has a peer to send them on).
pub fn plain_call(capabilities: Option<ClientCapabilities>, input: Input) -> Call {
    Call {
        input,
        capabilities,
        ..Call::default()
    }
}

/// The `-32021` of a request that needs the tasks extension declared.
fn tasks_required() -> McpError {
    McpError::missing_required_client_capability(
        ClientCapabilities::builder().enable_tasks().build(),
    )
}

impl SourceServer {
    /// `tools/call` from a connection: as a task when the tool allows it and the client
    /// declared the extension (after any SEP-2322 rounds the source asks for first), else in
    /// place.
    pub(super) async fn call(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let caller = Caller::of(&context);
        let declared = context
            .client_capabilities()
            .is_some_and(|c| c.supports_tasks());
        let args = request.arguments.unwrap_or_default();
        let name = request.name.to_string();
        let input = Input {
            responses: request.input_responses,
            request_state: request.request_state,
        };
        let call = call_of(&context, input);
        let source = &self.shared.source;
        let support = match &self.shared.tasks {
            Some(_) => source.task_support(&caller, &name),
            None => TaskSupport::Forbidden,
        };
        match (support, &self.shared.tasks) {
            (TaskSupport::Required, _) if !declared => return Err(tasks_required()),
            (TaskSupport::Optional | TaskSupport::Required, Some(TaskBackend::Relayed(relay)))
                if declared =>
            {
                // A caller that gives up stops the call going out (a task made upstream
                // meanwhile ends by its ttl).
                let started = tokio::select! {
                    r = relay.call(&caller, &name, args, call) => r?,
                    _ = context.ct.cancelled() => {
                        return Err(McpError::internal_error("the call was cancelled", None));
                    }
                    _ = self.shared.shutdown.cancelled() => {
                        return Err(McpError::internal_error(
                            "the server is shutting down; call again once it is back",
                            None,
                        ));
                    }
                };
                return Ok(match started {
                    Started::Task(task) => CallToolResponse::Task(CreateTaskResult::new(task)),
                    Started::Done(mut result) => {
                        result.result_type.get_or_insert(ResultType::COMPLETE);
                        self.stamp(&mut result.meta);
                        result.into()
                    }
                    Started::InputRequired(mut result) => {
                        self.stamp(&mut result.meta);
                        CallToolResponse::InputRequired(result)
                    }
                });
            }
            (TaskSupport::Optional | TaskSupport::Required, Some(TaskBackend::Local(tasks)))
                if declared =>
            {
                if let Some(mut first) = source
                    .before_task(&caller, &name, &args, &call)
                    .await
                    .map_err(to_mcp_error)?
                {
                    self.stamp(&mut first.meta);
                    return Ok(CallToolResponse::InputRequired(first));
                }
                let source = source.clone();
                let owner = caller.principal();
                let Call {
                    input,
                    capabilities,
                    ..
                } = call;
                let task = tasks
                    .start(&owner, move |handle| async move {
                        let call = Call {
                            task: Some(handle),
                            input,
                            capabilities,
                            ..Call::default()
                        };
                        match source.call_tool(&caller, &name, args, call).await {
                            Ok(CallToolResponse::Complete(r)) => Ok(r),
                            Ok(_) => Err(McpError::internal_error(
                                "a tool running as a task asks for input through its task, not \
                                 with an InputRequiredResult",
                                None,
                            )),
                            Err(e) => Err(to_mcp_error(e)),
                        }
                    })
                    .await?;
                return Ok(CallToolResponse::Task(CreateTaskResult::new(task)));
            }
            _ => {}
        }
        // A plain call ends when its caller cancels it, or 2 s into a shutdown (time for a
        // short call to finish): the tool's future is dropped (a long wait, a kubectl child,
        // an upstream call, with it).
        tokio::select! {
            r = self.run_in_place(&caller, &name, args, call) => r,
            _ = context.ct.cancelled() => Err(McpError::internal_error("the call was cancelled", None)),
        }
    }

    /// A call run in place (not as a task), stamped, cut 2 s into a shutdown.
    async fn run_in_place(
        &self,
        caller: &Caller,
        name: &str,
        args: JsonObject,
        call: Call,
    ) -> Result<CallToolResponse, McpError> {
        let shutdown = self.shared.shutdown.clone();
        let cut = async move {
            shutdown.cancelled().await;
            tokio::time::sleep(CALL_GRACE).await;
        };
        tokio::select! {
            r = self.shared.source.call_tool(caller, name, args, call) => {
                let mut r = r.map_err(to_mcp_error)?;
                match &mut r {
                    CallToolResponse::Complete(r) => {
                        // A result a source built from JSON (a fixture's, an upstream's) may
                        // lack it; 2026-07-28 requires it, and rmcp drops it for older peers.
                        r.result_type.get_or_insert(ResultType::COMPLETE);
                        self.stamp(&mut r.meta);
                    }
                    CallToolResponse::InputRequired(r) => self.stamp(&mut r.meta),
                    _ => {}
                }
                Ok(r)
            }
            _ = cut => Err(McpError::internal_error(
                "the server is shutting down; call again once it is back",
                None,
            )),
        }
    }

    /// A plain (not task-augmented) tool call from a role in this process, with no JSON-RPC in
    /// between: how the gateway of `herald up` calls its in-process roles, and how the HTTP
    /// gate answers plain calls. It answers exactly what the call over a connection would (a
    /// source's error as the JSON-RPC error a client would have received, in
    /// [`SourceError::Upstream`]); the caller's progress and log messages go straight to the
    /// caller's own peer. Dropping the future cancels the call; a shutdown cuts it after the
    /// same grace a connection's call gets.
    pub async fn call_in_process(
        &self,
        caller: &Caller,
        name: &str,
        args: JsonObject,
        call: Call,
    ) -> Result<CallToolResponse, SourceError> {
        self.call_plain(caller, name, args, call)
            .await
            .map_err(as_answered)
    }

    /// A plain `tools/call` for `caller`, whatever carried it (a role in this process, the
    /// HTTP gate): refused when the tool runs only as a task, else run in place as rmcp's
    /// handler runs it ([`call`](Self::call)).
    pub(super) async fn call_plain(
        &self,
        caller: &Caller,
        name: &str,
        args: JsonObject,
        call: Call,
    ) -> Result<CallToolResponse, McpError> {
        if self.shared.tasks.is_some()
            && self.shared.source.task_support(caller, name) == TaskSupport::Required
        {
            return Err(tasks_required());
        }
        self.run_in_place(caller, name, args, call).await
    }

    /// `prompts/get` from a connection.
    pub(super) async fn prompt(
        &self,
        request: GetPromptRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, McpError> {
        let caller = Caller::of(&context);
        let input = Input {
            responses: request.input_responses,
            request_state: request.request_state,
        };
        let call = call_of(&context, input);
        let args = request.arguments.unwrap_or_default();
        self.until_cut(
            &context,
            self.prompt_in_process(&caller, &request.name, args, call),
        )
        .await
    }

    /// `completion/complete` from a connection.
    pub(super) async fn complete(
        &self,
        request: CompleteRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, McpError> {
        let caller = Caller::of(&context);
        self.until_cut(&context, self.complete_in_process(&caller, request))
            .await
    }

    /// A request's work, ended (its future dropped, and an upstream request with it) when its
    /// caller cancels it, or 2 s into a shutdown, as a call in place is.
    async fn until_cut<T>(
        &self,
        context: &RequestContext<RoleServer>,
        work: impl std::future::Future<Output = Result<T, SourceError>>,
    ) -> Result<T, McpError> {
        let shutdown = self.shared.shutdown.clone();
        let cut = async move {
            shutdown.cancelled().await;
            tokio::time::sleep(CALL_GRACE).await;
        };
        tokio::select! {
            r = work => r.map_err(to_mcp_error),
            _ = context.ct.cancelled() => Err(McpError::internal_error("the request was cancelled", None)),
            _ = cut => Err(McpError::internal_error(
                "the server is shutting down; ask again once it is back",
                None,
            )),
        }
    }

    /// `prompts/get` with no connection in between (see
    /// [`call_in_process`](Self::call_in_process)), stamped.
    pub async fn prompt_in_process(
        &self,
        caller: &Caller,
        name: &str,
        args: JsonObject,
        call: Call,
    ) -> Result<GetPromptResponse, SourceError> {
        let mut r = self
            .shared
            .source
            .get_prompt(caller, name, args, call)
            .await?;
        match &mut r {
            GetPromptResponse::Complete(r) => {
                r.result_type.get_or_insert(ResultType::COMPLETE);
                self.stamp(&mut r.meta);
            }
            GetPromptResponse::InputRequired(r) => self.stamp(&mut r.meta),
            _ => {}
        }
        Ok(r)
    }

    /// `completion/complete`: the source's, when it declared the capability; else the
    /// method is unknown here.
    pub async fn complete_in_process(
        &self,
        caller: &Caller,
        request: CompleteRequestParams,
    ) -> Result<CompleteResult, SourceError> {
        if self.shared.config.capabilities.completions.is_none() {
            return Err(SourceError::Upstream {
                code: rmcp::model::ErrorCode::METHOD_NOT_FOUND.0,
                message: "completion/complete: this server offers no completions".into(),
                data: None,
            });
        }
        let mut r = self.shared.source.complete(caller, request).await?;
        r.result_type.get_or_insert(ResultType::COMPLETE);
        self.stamp(&mut r.meta);
        Ok(r)
    }
}
