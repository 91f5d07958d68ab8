//! The requests herald's HTTP gate answers itself, ahead of rmcp: a `tools/call` or
//! `resources/read` in the plain shape every 2026-07-28 client sends ([`plain_request`]: the
//! shape is this file's to judge, the answer is `SourceServer::answer`'s, written here as one
//! JSON body), and the `Mcp-Param-*` header check every `tools/call` gets first, on every path
//! ([`param_headers_refused`]).

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::{MCP_METHOD, MCP_NAME, MCP_PROTOCOL_VERSION, MCP_SESSION_ID};
use super::{error_status, params, rpc_error};
use crate::mcp::caller::Caller;
use crate::mcp::server::SourceServer;
use crate::mcp::server::dispatch::Plain;

/// The `Mcp-Param-*` check of a `tools/call` (by its `Mcp-Method` header, however its body
/// spells the method), for the tool as this caller sees it (see [`params`]): `-32020` with
/// `400`, as rmcp answers, when the headers disagree with the arguments; `-32600` with `400`
/// when such a tool's body cannot be read for the check (rmcp, which would run the tool, does
/// not check the headers of herald's tools). `None` for everything else, which goes on. The
/// tool is read from the `Mcp-Name` header, so the body is parsed only for a tool that
/// promotes an argument, and into the types rmcp and [`plain_request`] read it with (the
/// arguments a map of values), so the check sees the arguments the tool gets.
pub(super) fn param_headers_refused(
    headers: &axum::http::HeaderMap,
    body: &[u8],
    server: &SourceServer,
    caller: &Caller,
) -> Option<Response> {
    if headers.get(MCP_METHOD).is_none_or(|m| m != "tools/call") {
        return None;
    }
    let name = params::name(headers)?;
    let tool = server.tool(caller, &name)?;
    if !params::promotes(&tool.input_schema) {
        return None;
    }
    let Some((id, arguments)) = checked_arguments(body) else {
        let error = json!({"code": -32600, "message": format!(
            "cannot check the Mcp-Param-* headers of {name} against this body; send a JSON-RPC \
             request object whose params are an object with the arguments")});
        return Some(rpc_error(StatusCode::BAD_REQUEST, Value::Null, error));
    };
    let why = params::check(headers, arguments.as_ref(), &tool.input_schema).err()?;
    let error = json!({"code": rmcp::model::ErrorCode::HEADER_MISMATCH.0, "message": why});
    Some(rpc_error(StatusCode::BAD_REQUEST, id, error))
}

/// A `tools/call` body's id and arguments as the tool gets them (a map of values, as rmcp and
/// [`plain_request`] read them); `None` when it is not a request object with object params.
pub(super) fn checked_arguments(body: &[u8]) -> Option<(Value, Option<Value>)> {
    let Object(request) = serde_json::from_slice::<Object<CheckedCall>>(body).ok()?;
    let Object(params) = request.params;
    Some((request.id, params.arguments.map(Value::Object)))
}

/// What the `Mcp-Param-*` check reads of a `tools/call`.
#[derive(serde::Deserialize)]
struct CheckedCall {
    #[serde(default)]
    id: Value,
    params: Object<CheckedParams>,
}

/// Its params: the arguments alone.
#[derive(serde::Deserialize)]
struct CheckedParams {
    arguments: Option<rmcp::model::JsonObject>,
}

/// The headers, `Accept` and `_meta` every plain request must carry, as rmcp checks them:
/// `MCP-Protocol-Version` 2026-07-28 and `Mcp-Method` `method` once each, an exact
/// `application/json` body, both media types accepted (none weighted zero, no quoted
/// parameters), no session header, and a `_meta` naming the version and the
/// client's capabilities. `Some(Mcp-Name)` when all hold (`Some(None)` when there is none).
pub(super) fn plain_headers<'h>(
    headers: &'h axum::http::HeaderMap,
    method: &str,
) -> Option<Option<&'h str>> {
    use rmcp::model::ProtocolVersion;
    let only = |name: &header::HeaderName| {
        let mut values = headers.get_all(name).iter();
        let first = values.next()?.to_str().ok()?;
        values.next().is_none().then_some(first)
    };
    if only(&MCP_PROTOCOL_VERSION)? != ProtocolVersion::V_2026_07_28.as_str()
        || only(&MCP_METHOD)? != method
        || headers.contains_key(MCP_SESSION_ID)
    {
        return None;
    }
    let essence = only(&header::CONTENT_TYPE)?
        .split(';')
        .next()
        .unwrap_or_default()
        .trim();
    if !essence.eq_ignore_ascii_case("application/json") {
        return None;
    }
    let (mut json, mut sse) = (false, false);
    for value in headers.get_all(header::ACCEPT) {
        let value = value.to_str().ok()?;
        if value.contains('"') {
            // Quoted parameters: rmcp's own parser decides.
            return None;
        }
        for range in value.split(',') {
            let mut params = range.split(';');
            let essence = params.next().unwrap_or_default().trim();
            // A range weighted zero is refused, as rmcp reads it.
            let zero = |q: &str| {
                let (whole, fraction) = q.split_once('.').unwrap_or((q, ""));
                whole == "0" && fraction.bytes().all(|b| b == b'0')
            };
            if params.any(|p| {
                p.split_once('=')
                    .is_some_and(|(k, v)| k.trim().eq_ignore_ascii_case("q") && zero(v.trim()))
            }) {
                continue;
            }
            json |= essence.eq_ignore_ascii_case("application/json");
            sse |= essence.eq_ignore_ascii_case("text/event-stream");
        }
    }
    if !json || !sse {
        return None;
    }
    Some(match headers.get_all(MCP_NAME).iter().count() {
        0 => None,
        1 => Some(headers.get(MCP_NAME)?.to_str().ok()?),
        _ => return None,
    })
}

/// Whether request `meta` names 2026-07-28 and the client's capabilities.
pub(super) fn modern_meta(meta: &rmcp::model::RequestMetaObject) -> bool {
    let modern = rmcp::model::ProtocolVersion::V_2026_07_28;
    meta.protocol_version().as_ref() == Some(&modern)
        && meta.missing_required_keys(&modern).is_empty()
}

/// A request herald answers itself, in place: see [`plain_request`].
pub(super) struct PlainRequest {
    id: rmcp::model::RequestId,
    pub(super) what: Plain,
}

/// A `tools/call` or `resources/read` in the shape every 2026-07-28 client sends for a plain
/// request (the headers of [`plain_headers`], `Mcp-Name` exactly the tool's name or the URI,
/// a well-formed request with no progress token, no log level and no tasks declared; its
/// `Mcp-Param-*` headers were checked before), which herald answers itself: the source's
/// handler, then one JSON body. rmcp would build a whole service per request for it.
/// Anything else goes on to rmcp.
pub(super) fn plain_request(headers: &axum::http::HeaderMap, body: &[u8]) -> Option<PlainRequest> {
    use rmcp::model::RequestMetaObject;
    let method = headers.get(MCP_METHOD)?.to_str().ok()?;
    if method != "tools/call" && method != "resources/read" {
        return None;
    }
    // rmcp answers a missing Mcp-Name with 400, and decodes a `=?base64?…?=` one first.
    let name_header = plain_headers(headers, method)??;
    if name_header.starts_with("=?") {
        return None;
    }
    // The header names the method, so the body is parsed once into that request's params
    // (rmcp's message type would try each request kind in turn, buffering the body for each),
    // and strictly: objects only, no field it does not know (a `task`, a stray `result`, junk
    // whose numbers or escapes a full parse would refuse). Anything else goes on to rmcp.
    let plain_meta = |meta: Option<RequestMetaObject>| {
        let meta = meta?;
        let capabilities = meta.client_capabilities();
        (modern_meta(&meta)
            && meta.get_progress_token().is_none()
            && meta.log_level().is_none()
            && !capabilities.as_ref().is_some_and(|c| c.supports_tasks()))
        .then_some(capabilities)
    };
    let (id, what) = if method == "tools/call" {
        let Object(r) = serde_json::from_slice::<Object<Envelope<CallParams>>>(body).ok()?;
        let Object(params) = r.params;
        let capabilities = plain_meta(params.meta)?;
        // (`Mcp-Param-*` headers were checked before: `param_headers_refused`.)
        if r.method != method || name_header != params.name {
            return None;
        }
        let input = crate::mcp::source::Input {
            responses: params.input_responses,
            request_state: params.request_state,
        };
        let what = Plain::Call {
            name: params.name,
            args: params.arguments.unwrap_or_default(),
            call: Box::new(crate::mcp::server::plain_call(capabilities, input)),
        };
        (r.id, what)
    } else {
        let Object(r) = serde_json::from_slice::<Object<Envelope<ReadParams>>>(body).ok()?;
        let Object(params) = r.params;
        let after = crate::mcp::source::read_after_of(params.meta.as_ref());
        plain_meta(params.meta)?;
        if r.method != method || name_header != params.uri {
            return None;
        }
        let what = Plain::Read {
            after,
            uri: params.uri,
        };
        (r.id, what)
    };
    Some(PlainRequest { id, what })
}

/// A JSON-RPC request whose params are `P`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Envelope<P> {
    #[serde(rename = "jsonrpc")]
    _version: rmcp::model::JsonRpcVersion2_0,
    id: rmcp::model::RequestId,
    method: String,
    params: Object<P>,
}

/// A plain `tools/call`'s params: rmcp's `CallToolRequestParams`, strictly.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct CallParams {
    #[serde(rename = "_meta")]
    meta: Option<rmcp::model::RequestMetaObject>,
    name: String,
    arguments: Option<rmcp::model::JsonObject>,
    input_responses: Option<rmcp::model::InputResponses>,
    request_state: Option<String>,
}

/// A plain `resources/read`'s params: rmcp's `ReadResourceRequestParams`, strictly.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ReadParams {
    #[serde(rename = "_meta")]
    meta: Option<rmcp::model::RequestMetaObject>,
    uri: String,
    #[serde(rename = "inputResponses")]
    _input_responses: Option<rmcp::model::InputResponses>,
    #[serde(rename = "requestState")]
    _request_state: Option<String>,
}

/// `T` from a JSON object only (a derived struct takes an array of its fields in order too).
struct Object<T>(T);

impl<'de, T: serde::Deserialize<'de>> serde::Deserialize<'de> for Object<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit<T>(std::marker::PhantomData<T>);
        impl<'de, T: serde::Deserialize<'de>> serde::de::Visitor<'de> for Visit<T> {
            type Value = T;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(serde::de::value::MapAccessDeserializer::new(map))
            }
        }
        d.deserialize_map(Visit(std::marker::PhantomData))
            .map(Object)
    }
}

impl PlainRequest {
    /// Runs the request for `caller` ([`SourceServer::answer`]) and writes its answer as
    /// one JSON body, an error with the status rmcp gives it ([`error_status`]: `400` for a
    /// tool that only runs as a task, `-32021`).
    pub(super) async fn answer(self, server: &SourceServer, caller: &Caller) -> Response {
        let message = server.answer(caller, self.id, self.what).await;
        let status = match &message {
            // A plain request's `_meta` is whole ([`plain_request`]).
            rmcp::model::ServerJsonRpcMessage::Error(e) => error_status(e.error.code, false),
            _ => StatusCode::OK,
        };
        // A read-only grant calling a tool that changes things: 403 and the scope that would
        // do, so an OAuth client can step up.
        let step_up = match &message {
            rmcp::model::ServerJsonRpcMessage::Error(e)
                if e.error.data.as_ref().and_then(|d| d.get("reason"))
                    == Some(&serde_json::Value::from("insufficient_scope")) =>
            {
                e.error
                    .data
                    .as_ref()
                    .and_then(|d| d["scope"].as_str())
                    .and_then(super::oauth::insufficient_scope)
            }
            _ => None,
        };
        match serde_json::to_vec(&message) {
            Ok(body) => match step_up {
                Some(challenge) => (
                    StatusCode::FORBIDDEN,
                    [
                        (
                            header::CONTENT_TYPE,
                            header::HeaderValue::from_static("application/json"),
                        ),
                        (header::WWW_AUTHENTICATE, challenge),
                    ],
                    body,
                )
                    .into_response(),
                None => {
                    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
                }
            },
            Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
        }
    }
}
