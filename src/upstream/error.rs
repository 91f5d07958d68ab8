//! [`UpstreamError`]: what went wrong with a request to an upstream server, by cause. It is
//! built in one place from each way a request can fail (rmcp's `ServiceError`, an in-process
//! server's answered error, a direct HTTP call's failure, a connect that failed, a bound that
//! ran out, an answer herald cannot use: [`UpstreamError::answered`], [`UpstreamError::service`],
//! [`UpstreamError::in_process`], [`UpstreamError::direct`], the `From` impls) and mapped to what a served caller learns in one place
//! (`From<UpstreamError> for SourceError`, whose wire codes `mcp::server` assigns). Callers
//! match on the cause, never on JSON-RPC code numbers.
//!
//! An error the server answered is passed on unchanged (code, message, data); a failure of the
//! connection keeps its reason (`why`, which may name hosts and command lines) for logs and
//! for `herald watch`'s user, and a served caller learns only that the server is down.

use std::time::Duration;

use rmcp::model::ErrorData;
use serde_json::Value;

use super::Unavailable;
use crate::mcp::source::SourceError;

/// What went wrong with a request to an upstream, by cause.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum UpstreamError {
    /// The server answered that the request is wrong: invalid params (`-32602`), an invalid
    /// request, a client capability missing. Its verdict: asking again will not help.
    #[error("{message}")]
    Rejected {
        code: i32,
        message: String,
        data: Option<Value>,
    },
    /// The server does not know the resource, tool, prompt (`-32002`) or method (`-32601`).
    #[error("{message}")]
    NotFound {
        code: i32,
        message: String,
        data: Option<Value>,
    },
    /// The server refused this caller (`-32024`).
    #[error("{message}")]
    Forbidden {
        code: i32,
        message: String,
        data: Option<Value>,
    },
    /// The server answered with an error that may pass (an internal error, a source still
    /// starting, anything else it answered).
    #[error("{message}")]
    Failed {
        code: i32,
        message: String,
        data: Option<Value>,
    },
    /// The server answered with something herald cannot use (no contents, a blob for an
    /// event log, a log that is not `{"events":[...]}`, a listen it did not accept): its
    /// verdict too.
    #[error("server {server} {why}")]
    Unusable { server: String, why: String },
    /// No connection: a connect failed or is not due yet, or the connection broke. `why` may
    /// name command lines and hosts: log it, or show it to the user who configured them.
    #[error("{why}")]
    Unavailable { server: String, why: String },
    /// No answer within `after` (the request was given up; the connection is kept).
    #[error("server {server} did not answer within {} s", after.as_secs())]
    TimedOut { server: String, after: Duration },
}

impl UpstreamError {
    /// An error the server answered, sorted by its code.
    pub fn answered(code: i32, message: String, data: Option<Value>) -> UpstreamError {
        match code {
            -32002 | -32601 => UpstreamError::NotFound {
                code,
                message,
                data,
            },
            -32024 => UpstreamError::Forbidden {
                code,
                message,
                data,
            },
            -32602 | -32600 | -32021 => UpstreamError::Rejected {
                code,
                message,
                data,
            },
            _ => UpstreamError::Failed {
                code,
                message,
                data,
            },
        }
    }

    /// A request over `server`'s rmcp connection that failed: its answered error, rmcp's own
    /// timeout (`bound`), or a broken connection, explained for `target`.
    pub fn service(
        server: &str,
        target: &crate::transport::target::Target,
        bound: Duration,
        e: rmcp::ServiceError,
    ) -> UpstreamError {
        match e {
            rmcp::ServiceError::McpError(ErrorData {
                code,
                message,
                data,
            }) => UpstreamError::answered(code.0, message.into_owned(), data),
            rmcp::ServiceError::Timeout { .. } => UpstreamError::TimedOut {
                server: server.to_owned(),
                after: bound,
            },
            other => UpstreamError::Unavailable {
                server: server.to_owned(),
                why: crate::transport::explain::request(target, &other),
            },
        }
    }

    /// What a server in this process answered: its handler's error is the JSON-RPC error a
    /// connection would carry (`SourceError::Upstream`); anything else is its own failure.
    pub fn in_process(e: SourceError) -> UpstreamError {
        match e {
            SourceError::Upstream {
                code,
                message,
                data,
            } => UpstreamError::answered(code, message, data),
            // Its own error before any handler ran: the one wire mapping, as a connection
            // would have carried it.
            other => {
                let e = crate::mcp::server::to_mcp_error(other);
                UpstreamError::answered(e.code.0, e.message.into_owned(), e.data)
            }
        }
    }

    /// A direct HTTP call's failure ([`super::http::HttpCalls`]).
    pub fn direct(server: &str, e: super::http::CallError) -> UpstreamError {
        match e {
            super::http::CallError::Answered(e) => UpstreamError::in_process(e),
            super::http::CallError::Transport(why) => UpstreamError::Unavailable {
                server: server.to_owned(),
                why,
            },
        }
    }

    /// The server's verdict on what was asked (a URI, arguments): asking again will not help.
    pub fn is_verdict(&self) -> bool {
        matches!(
            self,
            UpstreamError::Rejected { .. }
                | UpstreamError::NotFound { .. }
                | UpstreamError::Unusable { .. }
        )
    }

    /// The connection is gone (not one slow or refused request): forget it and reconnect.
    pub fn is_broken(&self) -> bool {
        matches!(self, UpstreamError::Unavailable { .. })
    }

    /// The server answered (an error of its own), as opposed to not answering.
    pub fn is_answered(&self) -> bool {
        !matches!(
            self,
            UpstreamError::Unavailable { .. } | UpstreamError::TimedOut { .. }
        )
    }

    /// The reason, for a log or a user who configured the server (may name hosts).
    pub fn detail(&self) -> String {
        self.to_string()
    }
}

impl From<Unavailable> for UpstreamError {
    fn from(e: Unavailable) -> UpstreamError {
        UpstreamError::Unavailable {
            server: e.name,
            why: e.detail,
        }
    }
}

impl From<UpstreamError> for SourceError {
    /// What a served caller (the gateway's) learns: the server's own error unchanged, or that
    /// the server is down or slow, never why (the reason may name hosts and command lines).
    fn from(e: UpstreamError) -> SourceError {
        match e {
            UpstreamError::Rejected {
                code,
                message,
                data,
            }
            | UpstreamError::NotFound {
                code,
                message,
                data,
            }
            | UpstreamError::Forbidden {
                code,
                message,
                data,
            }
            | UpstreamError::Failed {
                code,
                message,
                data,
            } => SourceError::Upstream {
                code,
                message,
                data,
            },
            e @ UpstreamError::Unusable { .. } => SourceError::Unavailable(e.to_string()),
            UpstreamError::Unavailable { server, .. } => SourceError::Unavailable(format!(
                "server {server} is unavailable right now; the gateway is reconnecting to it, try again shortly"
            )),
            UpstreamError::TimedOut { server, after } => SourceError::Unavailable(format!(
                "server {server} did not answer within {} s; try again shortly",
                after.as_secs()
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answered_errors_are_sorted_by_cause_and_passed_on_unchanged() {
        let e = UpstreamError::answered(-32602, "bad uri".into(), None);
        assert!(matches!(e, UpstreamError::Rejected { .. }) && e.is_verdict());
        let e = UpstreamError::answered(-32002, "no such".into(), Some(Value::from(1)));
        assert!(matches!(e, UpstreamError::NotFound { .. }) && e.is_verdict());
        let e = UpstreamError::answered(-32603, "boom".into(), None);
        assert!(matches!(e, UpstreamError::Failed { .. }) && !e.is_verdict());
        assert!(e.is_answered() && !e.is_broken());
        let e = UpstreamError::answered(-32024, "no".into(), None);
        assert!(matches!(e, UpstreamError::Forbidden { .. }));
        assert_eq!(
            SourceError::from(UpstreamError::answered(
                -32002,
                "gone".into(),
                Some(1.into())
            )),
            SourceError::Upstream {
                code: -32002,
                message: "gone".into(),
                data: Some(1.into())
            }
        );
    }

    #[test]
    fn a_served_caller_learns_that_a_server_is_down_not_why() {
        let e = UpstreamError::Unavailable {
            server: "s".into(),
            why: "connection refused at 10.0.0.1".into(),
        };
        assert!(e.is_broken() && !e.is_answered());
        let SourceError::Unavailable(m) = SourceError::from(e) else {
            panic!("unavailable")
        };
        assert!(
            m.contains("server s is unavailable") && !m.contains("10.0.0.1"),
            "{m}"
        );
        let SourceError::Unavailable(m) = SourceError::from(UpstreamError::TimedOut {
            server: "s".into(),
            after: Duration::from_secs(30),
        }) else {
            panic!("unavailable")
        };
        assert!(m.contains("did not answer within 30 s"), "{m}");
    }
}
