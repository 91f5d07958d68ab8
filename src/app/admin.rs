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
//! - `/status/stream`: that report pushed as a JSON line whenever it changes (`status_stream`).
//! - `POST /reload`: reloads the config of `herald up` or `herald gateway --config` and
//!   answers what changed, or why the new config was refused (the running one kept).
//! - `POST /backup`: a consistent snapshot of the store, written by this process (which holds
//!   the store's lock) into the store's own `backups/` directory, never a path the caller
//!   names, keeping the newest [`KEEP_BACKUPS`]; answers a [`BackupReport`]. 409 for a store in
//!   memory. `herald store backup` asks for it when the store is held, then moves the file.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use tracing::Instrument;

use crate::app::systemd::Systemd;
use crate::app::{AppError, GRACE};
use crate::runtime::context::RoleContext;
use crate::runtime::metrics;
use crate::runtime::status::{Readiness, StatusBoard, StatusReport};
use crate::store::{KEEP_BACKUPS, Location, Snapshot, Store, StoreError};
use crate::transport::http;

/// Where `herald up` serves its admin address unless told otherwise, and where
/// `herald status` looks.
pub const DEFAULT_ADMIN: &str = "127.0.0.1:8759";

/// What `POST /backup` answers: the snapshot written, and the store it copies.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BackupReport {
    /// The store file the snapshot is of.
    pub store: PathBuf,
    #[serde(flatten)]
    pub snapshot: Snapshot,
}

/// The body of an admin answer that is not a success: what went wrong and what to do.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AdminError {
    pub error: String,
}

#[derive(Clone)]
struct Admin {
    board: StatusBoard,
    store: Option<Store>,
    /// One backup at a time: naming and rotation look at the directory as they leave it. The
    /// backup runs as a task of its own holding this, so a caller that hangs up neither stops
    /// it nor lets another start beside it.
    backups: Arc<tokio::sync::Mutex<()>>,
    /// The places for followers of `/status/stream`.
    followers: Arc<tokio::sync::Semaphore>,
    ctx: RoleContext,
}

/// Why a request to a mutating admin route looks like it comes from a web page (a form post
/// from any site, or a name rebound to this host), which the address, having no
/// authentication, must refuse; `None` for `herald store backup`, curl and scripts.
fn from_a_browser(headers: &axum::http::HeaderMap) -> Option<String> {
    if headers.contains_key(header::ORIGIN) {
        return Some("requests from a web page (with an Origin header) are refused".into());
    }
    let host = headers.get(header::HOST)?.to_str().unwrap_or_default();
    let name = host
        .rsplit_once(':')
        .filter(|(_, port)| port.chars().all(|c| c.is_ascii_digit()))
        .map_or(host, |(name, _)| name);
    let name = name.trim_start_matches('[').trim_end_matches(']');
    if name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::IpAddr>().is_ok() {
        None
    } else {
        Some(format!(
            "Host {host:?} is not an address or localhost: ask the admin address by its IP"
        ))
    }
}

/// Every admin route refuses what looks like a web page's request ([`from_a_browser`]): with
/// no authentication, a page that rebinds its name to 127.0.0.1 could otherwise read
/// `/status` or trigger `/backup`.
async fn refuse_browsers(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    match from_a_browser(request.headers()) {
        Some(why) => json(StatusCode::FORBIDDEN, &AdminError { error: why }),
        None => next.run(request).await,
    }
}

/// The admin routes over `board`, and `/backup` over `store` when the process has one.
pub fn router(ctx: &RoleContext, store: Option<Store>) -> Router {
    let board = ctx.status().clone();
    Router::new()
        .route("/live", axum::routing::get(|| async { "ok\n" }))
        .route("/ready", axum::routing::get(ready))
        .route("/metrics", axum::routing::get(metrics))
        .route("/status", axum::routing::get(status))
        .route("/status/stream", axum::routing::get(status_stream))
        .route("/backup", axum::routing::post(backup))
        .route("/reload", axum::routing::post(reload))
        .layer(axum::middleware::from_fn(refuse_browsers))
        .with_state(Admin {
            board,
            store,
            backups: Arc::default(),
            followers: Arc::new(tokio::sync::Semaphore::new(
                super::status_stream::MAX_FOLLOWERS,
            )),
            ctx: ctx.clone(),
        })
}

async fn ready(State(admin): State<Admin>) -> impl IntoResponse {
    let r: Readiness = admin.board.readiness();
    let code = if r.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    json(code, &r)
}

async fn metrics(State(admin): State<Admin>) -> impl IntoResponse {
    let report = admin.board.report().await;
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        admin.ctx.metrics().render() + &metrics::render_status(&report),
    )
}

async fn status(State(admin): State<Admin>) -> impl IntoResponse {
    let r: StatusReport = admin.board.report().await;
    json(StatusCode::OK, &r)
}

async fn status_stream(
    State(admin): State<Admin>,
    uri: axum::http::Uri,
) -> axum::response::Response {
    let every = match super::status_stream::interval(uri.query()) {
        Ok(every) => every,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    super::status_stream::follow(admin.board.clone(), &admin.followers, every)
        .unwrap_or_else(|e| error(StatusCode::SERVICE_UNAVAILABLE, e))
}

async fn backup(
    State(admin): State<Admin>,
    headers: axum::http::HeaderMap,
) -> axum::response::Response {
    let refuse = |code, error: String| json(code, &AdminError { error });
    if let Some(why) = from_a_browser(&headers) {
        return refuse(StatusCode::FORBIDDEN, why);
    }
    let Some(store) = &admin.store else {
        return refuse(
            StatusCode::CONFLICT,
            "this herald keeps no store: there is nothing to back up".into(),
        );
    };
    let Location::File(path) = store.location() else {
        return refuse(StatusCode::CONFLICT, StoreError::InMemory.to_string());
    };
    let one = admin.backups.clone().lock_owned().await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let backup = {
        let store = store.clone();
        admin.ctx.spawn("backup", async move {
            let _one = one;
            store
                .backup_rotated(&stamp(now.as_secs()), KEEP_BACKUPS)
                .await
        })
    };
    let done = backup
        .await
        .unwrap_or_else(|e| Err(StoreError::Io(format!("the backup task ended: {e}"))));
    match done {
        Ok(snapshot) => {
            tracing::info!(
                path = %snapshot.path.display(),
                tables = snapshot.tables,
                entries = snapshot.entries,
                bytes = snapshot.bytes,
                "store backup written"
            );
            json(
                StatusCode::OK,
                &BackupReport {
                    store: tokio::fs::canonicalize(path)
                        .await
                        .unwrap_or_else(|_| path.clone()),
                    snapshot,
                },
            )
        }
        Err(e) => {
            tracing::error!(error = %e, "store backup failed");
            refuse(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
        }
    }
}

/// `POST /reload`: reloads the runner's config ([`crate::app::reload`]) and answers its
/// [`ReloadOutcome`](crate::runtime::reload::ReloadOutcome): 200 when applied, 422 when
/// refused (the running config is kept), 409 when this process has no config to reload.
async fn reload(
    State(admin): State<Admin>,
    headers: axum::http::HeaderMap,
) -> axum::response::Response {
    if let Some(why) = from_a_browser(&headers) {
        return json(StatusCode::FORBIDDEN, &AdminError { error: why });
    }
    let Some(reloads) = admin.ctx.reloads() else {
        return json(
            StatusCode::CONFLICT,
            &AdminError {
                error: "this herald has no config to reload: herald up and herald gateway --config reload theirs; a server role takes its settings at start (restart it)".into(),
            },
        );
    };
    match reloads.ask().await {
        Ok(outcome) if outcome.applied => json(StatusCode::OK, &outcome),
        Ok(outcome) => json(StatusCode::UNPROCESSABLE_ENTITY, &outcome),
        Err(error) => json(StatusCode::SERVICE_UNAVAILABLE, &AdminError { error }),
    }
}

/// `YYYYmmddTHHMMSSZ` for `secs` since the epoch, UTC.
fn stamp(secs: u64) -> String {
    let ns = i64::try_from(secs).unwrap_or(i64::MAX / 1_000_000_000) * 1_000_000_000;
    // 2026-01-02T03:04:05.000Z
    let t = crate::mcp::events::rfc3339(ns);
    let mut s: String = t[..19]
        .chars()
        .filter(|c| !matches!(c, '-' | ':'))
        .collect();
    s.push('Z');
    s
}

/// An [`AdminError`] answer.
fn error(code: StatusCode, error: String) -> axum::response::Response {
    json(code, &AdminError { error })
}

fn json(code: StatusCode, body: &impl serde::Serialize) -> axum::response::Response {
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::to_string(body).unwrap_or_default() + "\n",
    )
        .into_response()
}

/// Serves the admin address for `ctx`'s process (and `POST /backup` for its `store`, when it
/// has one): on the socket systemd passed as `admin` when there is one, else on `addr` when
/// given; `None` when neither. Bind first: the
/// bound address is returned, and the server runs on `ctx`'s tracker until shutdown. Call it
/// before starting the roles, so `/live` answers and `/ready` says what it waits for during
/// the start.
pub async fn serve_admin(
    addr: Option<&str>,
    systemd: &Systemd,
    ctx: &RoleContext,
    store: Option<&Store>,
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
            http::Endpoint::plain(router(ctx, store.cloned()), ctx.metrics()),
            ctx.shutdown().clone(),
            GRACE,
        )
        .instrument(tracing::info_span!("admin", addr = %local)),
    );
    Ok(Some(local))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backup_request_from_a_web_page_is_refused() {
        let with = |pairs: &[(&str, &str)]| {
            let mut h = axum::http::HeaderMap::new();
            for (k, v) in pairs {
                h.insert(
                    axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                    v.parse().unwrap(),
                );
            }
            from_a_browser(&h)
        };
        assert_eq!(with(&[]), None);
        assert_eq!(with(&[("host", "127.0.0.1:8759")]), None);
        assert_eq!(with(&[("host", "[::1]:8759")]), None);
        assert_eq!(with(&[("host", "localhost:8759")]), None);
        assert!(with(&[("host", "evil.example:8759")]).is_some());
        assert!(
            with(&[
                ("host", "127.0.0.1:8759"),
                ("origin", "https://evil.example")
            ])
            .unwrap()
            .contains("Origin")
        );
    }

    #[test]
    fn a_backup_stamp_is_utc_seconds() {
        assert_eq!(stamp(0), "19700101T000000Z");
        assert_eq!(stamp(1_767_323_045), "20260102T030405Z");
    }
}
