//! A plain `tools/call` to a Streamable HTTP upstream that speaks 2026-07-28, posted directly
//! on a pooled client: the gateway's hot path to an HTTP slug.
//!
//! rmcp's client would carry the same request through its service loop, its transport worker
//! and a task per POST before reqwest sees it, and the answer back the same way. Here the
//! request's headers and `_meta` are built once per upstream, the body is serialized once
//! from borrowed parts, and the answer (one JSON body, or an SSE stream when the upstream sends
//! progress first) is read in the caller's own task, its progress relayed to the caller under
//! the caller's token as it arrives. Dropping the call closes its request, and the upstream
//! cancels the handler (a stateless request ends with its connection). The calls go on
//! connections of their own, plain or TLS, each driven in its caller's task (`wire.rs`: a
//! second task per call cost more than the rest of the client); on reqwest's pooled client
//! only through a proxy, with credentials in the URL, or after a 307/308. Anything else (listens,
//! reads, tasks, an upstream that does not speak 2026-07-28, a tool whose schema promotes
//! arguments to `Mcp-Param-*` headers) still goes through rmcp. An upstream that takes OAuth
//! gets its session's token on each call, and a call it refuses (`401`, `403` with a
//! challenge) is sent once more when the session brings a new one, as on rmcp's wire.

use std::sync::atomic::{AtomicU64, Ordering};

use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderValue};
use rmcp::model::{CallToolResponse, CallToolResult, JsonObject, ProgressNotificationParam};
use serde::Serialize;
use serde_json::{Map, Value};

use crate::mcp::source::{Call, Progress, SourceError};
use crate::transport::http::{MCP_METHOD, MCP_NAME, MCP_PROTOCOL_VERSION};

/// Why a direct call did not produce an answer.
#[derive(Debug)]
pub enum CallError {
    /// The upstream answered: its JSON-RPC error (or an answer the gateway cannot relay).
    Answered(SourceError),
    /// No answer: the connection or the HTTP exchange failed.
    Transport(String),
}

/// Direct `tools/call`s to one HTTP upstream.
pub struct HttpCalls {
    client: reqwest::Client,
    url: reqwest::Url,
    /// The upstream's own connections (plain or TLS), and what each request carries for them:
    /// its path (and query) and `Host`.
    wire: Option<(super::wire::Wire, http::Uri, HeaderValue)>,
    /// Every call's headers but `Mcp-Name`.
    headers: HeaderMap,
    /// Every call's `_meta`: protocol version, client info and capabilities.
    meta: Map<String, Value>,
    next_id: AtomicU64,
    /// Largest answer taken (the upstream's `max_message_bytes`).
    max_bytes: usize,
    /// The upstream's OAuth session, whose token each call carries.
    oauth: Option<std::sync::Arc<crate::transport::oauth::OAuth>>,
}

#[derive(Serialize)]
struct Request<'a> {
    jsonrpc: &'static str,
    id: String,
    method: &'static str,
    params: Params<'a>,
}

#[derive(Serialize)]
struct Params<'a> {
    name: &'a str,
    arguments: &'a JsonObject,
    #[serde(rename = "inputResponses", skip_serializing_if = "Option::is_none")]
    input_responses: Option<&'a rmcp::model::InputResponses>,
    #[serde(rename = "requestState", skip_serializing_if = "Option::is_none")]
    request_state: Option<&'a str>,
    #[serde(rename = "_meta")]
    meta: Meta<'a>,
}

#[derive(Serialize)]
struct Meta<'a> {
    #[serde(flatten)]
    base: Merged<'a>,
    #[serde(rename = "progressToken", skip_serializing_if = "Option::is_none")]
    progress_token: Option<&'a Value>,
}

/// This gateway's `_meta` with the caller's keys over it, written as one map without
/// building it (the base is cloned for no call).
struct Merged<'a> {
    base: &'a Map<String, Value>,
    over: Option<&'a Map<String, Value>>,
}

impl Serialize for Merged<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap as _;
        let mut map = s.serialize_map(None)?;
        let over = self.over.into_iter().flatten();
        for (k, v) in (self.base.iter())
            .filter(|(k, _)| self.over.is_none_or(|o| !o.contains_key(*k)))
            .chain(over)
        {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

/// An answer: its head, and its body as it arrives.
struct Reply<'a> {
    status: http::StatusCode,
    headers: HeaderMap,
    body: ReplyBody<'a>,
}

enum ReplyBody<'a> {
    /// On one of the upstream's own connections.
    Wire(super::wire::Body<'a>),
    /// On reqwest's.
    Pooled(reqwest::Response),
}

impl ReplyBody<'_> {
    /// The next piece of the body; `None` at its end.
    async fn chunk(&mut self, url: &reqwest::Url) -> Result<Option<bytes::Bytes>, CallError> {
        match self {
            ReplyBody::Wire(b) => b.chunk().await.map_err(|e| transport(url, &e)),
            ReplyBody::Pooled(r) => r.chunk().await.map_err(|e| transport(url, &e)),
        }
    }
}

/// A refusal an OAuth session answers: `(forbidden, WWW-Authenticate)` of a `401`, or of a
/// `403` that carries a challenge.
fn challenge(reply: &Reply) -> Option<(bool, String)> {
    let forbidden = match reply.status.as_u16() {
        401 => false,
        403 => true,
        _ => return None,
    };
    let header = reply.headers.get(reqwest::header::WWW_AUTHENTICATE)?;
    Some((forbidden, header.to_str().ok()?.to_owned()))
}

/// The MIME type of an SSE response.
const EVENT_STREAM: &str = "text/event-stream";

impl HttpCalls {
    /// Direct calls to the endpoint at `url`, with `token` as the bearer token. `None` when
    /// the URL or the token cannot be used as they are (rmcp's path is taken then).
    pub fn new(
        url: &str,
        token: Option<&str>,
        max_bytes: usize,
        oauth: Option<std::sync::Arc<crate::transport::oauth::OAuth>>,
    ) -> Option<HttpCalls> {
        let client = crate::transport::client::mcp_http_client().ok()?;
        let url = reqwest::Url::parse(url).ok()?;
        let wire = super::wire::Wire::new(&url).and_then(|w| {
            let path =
                http::Uri::try_from(&url[url::Position::BeforePath..url::Position::AfterQuery])
                    .ok()?;
            let host =
                HeaderValue::from_str(&url[url::Position::BeforeHost..url::Position::BeforePath])
                    .ok()?;
            Some((w, path, host))
        });
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(
            ACCEPT,
            HeaderValue::from_static("application/json, text/event-stream"),
        );
        headers.insert(MCP_PROTOCOL_VERSION, HeaderValue::from_static("2026-07-28"));
        headers.insert(MCP_METHOD, HeaderValue::from_static("tools/call"));
        // (An OAuth session's token is set per call instead.)
        if let Some(t) = token.filter(|_| oauth.is_none()) {
            let mut v = HeaderValue::from_str(&format!("Bearer {t}")).ok()?;
            v.set_sensitive(true);
            headers.insert(AUTHORIZATION, v);
        }
        let config = crate::transport::client::client_config();
        let mut meta = Map::new();
        meta.insert(
            "io.modelcontextprotocol/protocolVersion".into(),
            "2026-07-28".into(),
        );
        meta.insert(
            "io.modelcontextprotocol/clientInfo".into(),
            serde_json::to_value(&config.client_info).ok()?,
        );
        meta.insert(
            "io.modelcontextprotocol/clientCapabilities".into(),
            serde_json::to_value(&config.capabilities).ok()?,
        );
        Some(HttpCalls {
            client,
            url,
            wire,
            headers,
            meta,
            next_id: AtomicU64::new(1),
            max_bytes,
            oauth,
        })
    }

    /// Posts `body` (a call of tool `name`), with `bearer` as the token when given: on the
    /// upstream's own connections when it has them ([`Wire::new`](super::wire::Wire::new)),
    /// else on reqwest's.
    async fn send(
        &self,
        body: bytes::Bytes,
        name: &HeaderValue,
        bearer: Option<String>,
    ) -> Result<Reply<'_>, CallError> {
        let bearer = match bearer {
            Some(t) => {
                let mut v = HeaderValue::from_str(&format!("Bearer {t}")).map_err(|_| {
                    CallError::Transport("the upstream's token is not a header value".into())
                })?;
                v.set_sensitive(true);
                Some(v)
            }
            None => None,
        };
        let mcp_name = MCP_NAME;
        if let Some((wire, path, host)) = &self.wire {
            let request = || {
                let mut req = http::Request::post(path.clone())
                    .body(http_body_util::Full::new(body.clone()))
                    .expect("a request from parts already checked");
                let headers = req.headers_mut();
                headers.clone_from(&self.headers);
                headers.insert(http::header::HOST, host.clone());
                headers.insert(mcp_name.clone(), name.clone());
                if let Some(b) = &bearer {
                    headers.insert(AUTHORIZATION, b.clone());
                }
                req
            };
            let (head, body) = wire
                .send(request)
                .await
                .map_err(|e| transport(&self.url, &e))?;
            // A redirect goes through reqwest, which follows one to the same origin.
            if !matches!(head.status.as_u16(), 307 | 308) {
                return Ok(Reply {
                    status: head.status,
                    headers: head.headers,
                    body: ReplyBody::Wire(body),
                });
            }
        }
        let mut req = self
            .client
            .post(self.url.clone())
            .headers(self.headers.clone())
            .header(mcp_name, name.clone());
        if let Some(b) = bearer {
            req = req.header(AUTHORIZATION, b);
        }
        let response = req
            .body(body)
            .send()
            .await
            .map_err(|e| transport(&self.url, &e))?;
        Ok(Reply {
            status: response.status(),
            headers: response.headers().clone(),
            body: ReplyBody::Pooled(response),
        })
    }

    /// Calls `tool` with `args` for a caller's `call`: its SEP-2322 answers, declared
    /// capabilities and log level go upstream; the upstream's progress and log messages go
    /// to the caller; an `InputRequiredResult` comes back as it is.
    pub async fn call(
        &self,
        tool: &str,
        args: &JsonObject,
        call: &Call,
    ) -> Result<CallToolResponse, CallError> {
        let progress = call.progress.as_ref();
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        let id = format!("herald-{n}");
        // The upstream's progress comes under a token of this call's own.
        let token = progress.map(|_| Value::String(id.clone()));
        // The caller's capabilities and log level over this gateway's own ([`Merged`]).
        let forwarded = call.upstream_meta().map(|m| m.0.0);
        let body = serde_json::to_vec(&Request {
            jsonrpc: "2.0",
            id: id.clone(),
            method: "tools/call",
            params: Params {
                name: tool,
                arguments: args,
                input_responses: call.input.responses.as_ref(),
                request_state: call.input.request_state.as_deref(),
                meta: Meta {
                    base: Merged {
                        base: &self.meta,
                        over: forwarded.as_ref(),
                    },
                    progress_token: token.as_ref(),
                },
            },
        })
        .map_err(|e| CallError::Transport(format!("cannot encode the call: {e}")))?;
        let name = HeaderValue::from_str(tool).map_err(|_| {
            CallError::Answered(SourceError::UnknownTool(format!(
                "{tool} (not a name an HTTP header can carry)"
            )))
        })?;
        let body = bytes::Bytes::from(body);
        let send = |bearer: Option<String>| self.send(body.clone(), &name, bearer);
        let mut reply = match &self.oauth {
            None => send(None).await,
            Some(oauth) => oauth
                .send(None, send, |r| r.as_ref().ok().and_then(challenge))
                .await
                .map_err(CallError::Transport)?,
        }?;
        let status = reply.status;
        let sse = reply
            .headers
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim_start().starts_with(EVENT_STREAM));
        let mut buf: Vec<u8> = Vec::new();
        // Where the search for the next event's end goes on (what is before has none).
        let mut scanned = 0;
        while let Some(chunk) = reply.body.chunk(&self.url).await? {
            buf.extend_from_slice(&chunk);
            if buf.len() > self.max_bytes {
                return Err(CallError::Transport(format!(
                    "the answer passed the {}-byte limit",
                    self.max_bytes
                )));
            }
            if !sse {
                continue;
            }
            // An SSE stream: progress, perhaps, then the answer.
            while let Some(end) = event_end(&buf, scanned) {
                let event: Vec<u8> = buf.drain(..end).collect();
                scanned = 0;
                let Some(data) = event_data(&event) else {
                    continue;
                };
                let method = serde_json::from_str::<Method>(&data).ok();
                let method = method.as_ref().and_then(|m| m.method.as_deref());
                if let Some(p) = progress
                    && method == Some("notifications/progress")
                {
                    if let Ok(message) = serde_json::from_str(&data) {
                        relay_progress(p, message).await;
                    }
                    continue;
                }
                if method == Some("notifications/message") {
                    if let Some(log) = &call.log
                        && let Ok(message) = serde_json::from_str(&data)
                    {
                        relay_log(log, message).await;
                    }
                    continue;
                }
                if let Ok(message) = serde_json::from_str::<Answer>(&data)
                    && let Some(a) = answer(&id, message)
                {
                    // The stream ends right after its answer: read that end, so the
                    // connection goes back to the pool rather than being closed.
                    let _ = tokio::time::timeout(std::time::Duration::from_millis(50), async {
                        while let Ok(Some(_)) = reply.body.chunk(&self.url).await {}
                    })
                    .await;
                    return a;
                }
            }
            // A partial event: its end, when it comes, is no earlier than 3 bytes back.
            scanned = buf.len().saturating_sub(3);
        }
        if sse {
            return Err(CallError::Transport(
                "the answer's event stream ended before the answer".into(),
            ));
        }
        let message = std::str::from_utf8(&buf)
            .ok()
            .and_then(|text| serde_json::from_str::<Answer>(text).ok());
        let Some(message) = message else {
            return Err(CallError::Transport(format!(
                "HTTP {status} with a body that is not JSON-RPC"
            )));
        };
        answer(&id, message).unwrap_or_else(|| {
            Err(CallError::Transport(format!(
                "HTTP {status} with no answer to the call"
            )))
        })
    }
}

/// A transport failure as a sentence ([`explain`](crate::transport::explain)), naming the
/// endpoint without its userinfo or query (which may carry a key).
fn transport(url: &reqwest::Url, e: &(dyn std::error::Error + 'static)) -> CallError {
    let target = crate::transport::target::Target::Http(url.to_string());
    CallError::Transport(crate::transport::explain::failure(&target, false, e))
}

/// Whether `name` goes in an HTTP header as it is: visible ASCII with no surrounding space,
/// not in the `=?base64?…?=` form. Any other name is encoded by rmcp's client, whose path
/// such a call then takes.
pub fn plain_header_value(name: &str) -> bool {
    !name.is_empty()
        && name.bytes().all(|b| b.is_ascii_graphic() || b == b' ')
        && !name.starts_with(' ')
        && !name.ends_with(' ')
        && !name.starts_with("=?")
}

/// A JSON-RPC message's method, when it has one (an SSE event's message is told by it).
#[derive(serde::Deserialize)]
struct Method<'a> {
    #[serde(default, borrow)]
    method: Option<std::borrow::Cow<'a, str>>,
}

/// A JSON-RPC message as an answer is read: its result left as text, read once into its
/// own type (not into a `Value` first).
#[derive(serde::Deserialize)]
struct Answer<'a> {
    #[serde(default)]
    id: Value,
    #[serde(default, borrow)]
    result: Option<&'a serde_json::value::RawValue>,
    #[serde(default)]
    error: Option<Value>,
}

/// What a result says it is (`resultType`, 2026-07-28).
#[derive(serde::Deserialize)]
struct Kind<'a> {
    #[serde(rename = "resultType", default, borrow)]
    kind: Option<std::borrow::Cow<'a, str>>,
}

/// What `result` says it is. rmcp's servers (herald's among them) write `resultType` first: a
/// result that starts with it complete is complete (the whole read would say so too, or fail on
/// a second `resultType` and take it as complete), with no read of the rest for it.
fn result_kind(result: &str) -> Option<std::borrow::Cow<'_, str>> {
    const COMPLETE: &str = r#"{"resultType":"complete""#;
    if let Some(after) = result.strip_prefix(COMPLETE)
        && (after.starts_with(',') || after.starts_with('}'))
    {
        return Some("complete".into());
    }
    // (A result that is not an object is no tool result, said below.)
    serde_json::from_str::<Kind>(result)
        .ok()
        .and_then(|k| k.kind)
}

/// The call's result or error, when `message` answers request `id`.
fn answer(id: &str, message: Answer<'_>) -> Option<Result<CallToolResponse, CallError>> {
    if message.id.as_str() != Some(id) {
        return None;
    }
    if let Some(mut error) = message.error {
        let code = error.get("code").and_then(Value::as_i64).unwrap_or(-32603) as i32;
        let text = error
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let data = error.get_mut("data").map(Value::take);
        return Some(Err(CallError::Answered(SourceError::Upstream {
            code,
            message: text,
            data,
        })));
    }
    let result = message.result?.get();
    let kind = result_kind(result);
    match kind.as_deref() {
        None | Some("complete") => Some(
            serde_json::from_str::<CallToolResult>(result)
                .map(CallToolResponse::Complete)
                .map_err(|e| {
                    CallError::Transport(format!("the server's result is not a tool result: {e}"))
                }),
        ),
        Some("input_required") => Some(
            serde_json::from_str::<rmcp::model::InputRequiredResult>(result)
                .map(CallToolResponse::InputRequired)
                .map_err(|e| {
                    CallError::Transport(format!("the server's input request is malformed: {e}"))
                }),
        ),
        Some(_) => Some(Err(CallError::Answered(SourceError::Unavailable(
            "the server answered a plain call with a task, which it may not".into(),
        )))),
    }
}

/// Sends an upstream log message to the caller (its level filter applies).
async fn relay_log(to: &crate::mcp::source::Log, message: Value) {
    let Some(params) = message.get("params") else {
        return;
    };
    #[allow(deprecated)]
    let level = params
        .get("level")
        .and_then(|l| serde_json::from_value::<rmcp::model::LoggingLevel>(l.clone()).ok());
    let Some(level) = level else { return };
    let logger = params.get("logger").and_then(Value::as_str).unwrap_or("");
    let data = params.get("data").cloned().unwrap_or(Value::Null);
    to.send(level, logger, data).await;
}

/// Sends an upstream progress notification to the caller, under the caller's token.
async fn relay_progress(to: &Progress, message: Value) {
    let Some(params) = message.get("params").cloned() else {
        return;
    };
    if let Ok(mut p) = serde_json::from_value::<ProgressNotificationParam>(params) {
        p.progress_token = to.token.clone();
        let _ = to.peer.notify_progress(p).await;
    }
}

/// Where the first complete SSE event in `buf` ends (after its blank line), searching from
/// `from`.
fn event_end(buf: &[u8], from: usize) -> Option<usize> {
    let tail = buf.get(from..)?;
    let find = |needle: &[u8]| {
        tail.windows(needle.len())
            .position(|w| w == needle)
            .map(|i| from + i + needle.len())
    };
    [find(b"\n\n"), find(b"\r\n\r\n")]
        .into_iter()
        .flatten()
        .min()
}

/// The JSON of one SSE event's `data:` lines.
fn event_data(event: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(event).ok()?;
    let mut data = String::new();
    for line in text.lines() {
        if let Some(d) = line.strip_prefix("data:") {
            if !data.is_empty() {
                data.push('\n');
            }
            data.push_str(d.strip_prefix(' ').unwrap_or(d));
        }
    }
    (!data.is_empty()).then_some(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_result_that_starts_complete_is_read_as_the_whole_read_would() {
        fn full(r: &str) -> Option<std::borrow::Cow<'_, str>> {
            serde_json::from_str::<Kind>(r).ok().and_then(|k| k.kind)
        }
        for (result, kind) in [
            (
                r#"{"resultType":"complete","content":[]}"#,
                Some("complete"),
            ),
            (r#"{"resultType":"complete"}"#, Some("complete")),
            (
                r#"{"resultType":"completed","content":[]}"#,
                Some("completed"),
            ),
            (
                r#"{"resultType":"complete" ,"content":[]}"#,
                Some("complete"),
            ),
            (
                r#"{"content":[],"resultType":"input_required"}"#,
                Some("input_required"),
            ),
            (
                r#"{ "resultType": "input_required" }"#,
                Some("input_required"),
            ),
            (r#"{"content":[]}"#, None),
            ("[1]", None),
        ] {
            assert_eq!(result_kind(result).as_deref(), kind, "{result}");
            assert_eq!(full(result).as_deref(), kind, "{result}");
        }
        // A second resultType: the whole read fails (taken as complete); the start says so.
        let twice = r#"{"resultType":"complete","resultType":"input_required"}"#;
        assert_eq!(full(twice), None);
        assert_eq!(result_kind(twice).as_deref(), Some("complete"));
    }

    #[test]
    fn the_callers_meta_keys_go_over_the_gateways_once_each() {
        let map = |v: Value| v.as_object().unwrap().clone();
        let base = map(serde_json::json!({"a": 1, "b": 2}));
        let over = map(serde_json::json!({"b": 3, "c": 4}));
        let text = |over| serde_json::to_string(&Merged { base: &base, over }).unwrap();
        let merged = text(Some(&over));
        assert_eq!(merged.matches("\"b\"").count(), 1, "{merged}");
        let merged: Value = serde_json::from_str(&merged).unwrap();
        assert_eq!(merged, serde_json::json!({"a": 1, "b": 3, "c": 4}));
        let alone: Value = serde_json::from_str(&text(None)).unwrap();
        assert_eq!(alone, serde_json::json!({"a": 1, "b": 2}));
        // Flattened into the request's `_meta`, beside a progress token.
        let token = Value::from("herald-7");
        let meta = Meta {
            base: Merged {
                base: &base,
                over: Some(&over),
            },
            progress_token: Some(&token),
        };
        let meta = serde_json::to_value(&meta).unwrap();
        let want = serde_json::json!({"a": 1, "b": 3, "c": 4, "progressToken": "herald-7"});
        assert_eq!(meta, want);
    }

    #[test]
    fn sse_events_split_and_decode() {
        let buf = b"data: {\"a\":1}\n\n: keep-alive\n\ndata: {\"b\"\r\n\r\n";
        let end = event_end(buf, 0).unwrap();
        assert_eq!(event_data(&buf[..end]).as_deref(), Some("{\"a\":1}"));
        let rest = &buf[end..];
        let end2 = event_end(rest, 0).unwrap();
        assert_eq!(event_data(&rest[..end2]), None, "a comment has no data");
        let last = &rest[end2..];
        assert_eq!(
            event_data(&last[..event_end(last, 0).unwrap()]).as_deref(),
            Some("{\"b\""),
            "the data as it came (an answer is read from it, or nothing)"
        );
        assert_eq!(
            event_end(b"data: 1\n\n", 5),
            Some(9),
            "found from an offset"
        );
        assert_eq!(event_end(b"data: 1\n", 5), None);
    }

    #[test]
    fn only_plain_names_go_in_a_header_as_they_are() {
        assert!(plain_header_value("memo_set"));
        assert!(plain_header_value("a tool"));
        for bad in ["", " memo", "memo ", "=?base64?x?=", "café", "a\tb"] {
            assert!(!plain_header_value(bad), "{bad:?}");
        }
    }

    fn parse(text: &str) -> Answer<'_> {
        serde_json::from_str(text).unwrap()
    }

    #[test]
    fn an_answer_is_matched_by_id() {
        let ok = serde_json::json!({"jsonrpc": "2.0", "id": "herald-1",
            "result": {"resultType": "complete", "content": [{"type": "text", "text": "hi"}]}});
        let ok = ok.to_string();
        assert!(answer("herald-2", parse(&ok)).is_none());
        let Ok(CallToolResponse::Complete(r)) = answer("herald-1", parse(&ok)).unwrap() else {
            panic!("a complete result")
        };
        assert_eq!(r.content.len(), 1);
        let err = serde_json::json!({"jsonrpc": "2.0", "id": "herald-1",
            "error": {"code": -32602, "message": "missing argument key", "data": {"x": 1}}});
        match answer("herald-1", parse(&err.to_string())) {
            Some(Err(CallError::Answered(SourceError::Upstream {
                code: -32602,
                message,
                data: Some(_),
            }))) => assert_eq!(message, "missing argument key"),
            other => panic!("{other:?}"),
        }
        let task = serde_json::json!({"jsonrpc": "2.0", "id": "herald-1",
            "result": {"resultType": "task", "taskId": "t"}});
        assert!(matches!(
            answer("herald-1", parse(&task.to_string())),
            Some(Err(CallError::Answered(SourceError::Unavailable(_))))
        ));
        let odd = serde_json::json!({"jsonrpc": "2.0", "id": "herald-1", "result": 5});
        assert!(matches!(
            answer("herald-1", parse(&odd.to_string())),
            Some(Err(CallError::Transport(m))) if m.contains("not a tool result")
        ));
    }
}
