//! The admin address: `/live`, `/ready`, `/metrics` and `/status` on an HTTP listener of their
//! own, apart from the MCP endpoints, for probes, Prometheus and `herald status`. Everything it
//! answers comes from the process's [`StatusBoard`] (on the role context) and the process-wide
//! counters; it serves no MCP and has no authentication, so it belongs on loopback.
//!
//! - `/live`: 200 `ok` while the runtime answers at all.
//! - `/ready`: 200 once the runner said every role started ([`ready`](super::ready)), every
//!   role's listeners are bound and every configured upstream has connected once; 503 before
//!   that and while draining. Either way the body is a [`Readiness`].
//! - `/metrics`: Prometheus text: the counters every MCP endpoint serves, plus gauges from the
//!   status board.
//! - `/status`: a [`StatusReport`] as JSON.

use std::net::SocketAddr;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use tracing::Instrument;

use crate::app::systemd::Systemd;
use crate::app::{AppError, GRACE};
use crate::mcp::context::RoleContext;
use crate::mcp::metrics;
use crate::mcp::status::{Readiness, StatusBoard, StatusReport};
use crate::transport::http;

/// Where `herald up` serves its admin address unless told otherwise, and where
/// `herald status` looks.
pub const DEFAULT_ADMIN: &str = "127.0.0.1:8759";

/// The admin routes over `board`.
pub fn router(board: StatusBoard) -> Router {
    Router::new()
        .route("/live", axum::routing::get(|| async { "ok\n" }))
        .route("/ready", axum::routing::get(ready))
        .route("/metrics", axum::routing::get(metrics))
        .route("/status", axum::routing::get(status))
        .with_state(board)
}

async fn ready(State(board): State<StatusBoard>) -> impl IntoResponse {
    let r: Readiness = board.readiness();
    let code = if r.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    json(code, &r)
}

async fn metrics(State(board): State<StatusBoard>) -> impl IntoResponse {
    let report = board.report().await;
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        metrics::render() + &metrics::render_status(&report),
    )
}

async fn status(State(board): State<StatusBoard>) -> impl IntoResponse {
    let r: StatusReport = board.report().await;
    json(StatusCode::OK, &r)
}

fn json(code: StatusCode, body: &impl serde::Serialize) -> axum::response::Response {
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::to_string(body).unwrap_or_default() + "\n",
    )
        .into_response()
}

/// Serves the admin address for `ctx`'s process: on the socket systemd passed as `admin`
/// when there is one, else on `addr` when given; `None` when neither. Bind first: the
/// bound address is returned, and the server runs on `ctx`'s tracker until shutdown. Call it
/// before starting the roles, so `/live` answers and `/ready` says what it waits for during
/// the start.
pub async fn serve_admin(
    addr: Option<&str>,
    systemd: &Systemd,
    ctx: &RoleContext,
) -> Result<Option<SocketAddr>, AppError> {
    let listener = match (systemd.socket("admin"), addr) {
        (Some(inherited), _) => {
            let std = inherited.take_tcp().map_err(|message| AppError::Bind {
                addr: inherited.to_string(),
                message,
            })?;
            http::from_std(std).map_err(|e| AppError::Bind {
                addr: inherited.to_string(),
                message: e.to_string(),
            })?
        }
        (None, Some(addr)) => http::bind(addr).await.map_err(|e| AppError::Bind {
            addr: addr.into(),
            message: e.to_string(),
        })?,
        (None, None) => return Ok(None),
    };
    let local = listener.local_addr().map_err(|e| AppError::Bind {
        addr: addr.unwrap_or("admin").into(),
        message: e.to_string(),
    })?;
    if !local.ip().is_loopback() {
        tracing::warn!(
            %local,
            "the admin address is not on loopback: /status names upstream targets and errors, and it has no authentication"
        );
    }
    ctx.spawn(
        "admin",
        http::serve(
            listener,
            router(ctx.status().clone()),
            ctx.shutdown().clone(),
            GRACE,
        )
        .instrument(tracing::info_span!("admin", addr = %local)),
    );
    Ok(Some(local))
}
