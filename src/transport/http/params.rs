//! SEP-2243 `Mcp-Param-*` headers, checked in herald's HTTP gate for the caller who sent them.
//!
//! A tool whose input schema marks a property `x-mcp-header: "Name"` has its argument
//! repeated in the header `Mcp-Param-Name` (`=?base64?…?=` when it is not plain ASCII), so
//! middle boxes can route on it; a server must refuse a request whose header disagrees with
//! its body (`-32020`, `400`). rmcp checks them against the tool its context-free `get_tool`
//! hook returns, which cannot know who asks: the gateway shows each caller its own tools. So
//! herald checks them here, for every `tools/call` on every path (answered in the gate or by
//! rmcp), against the tool as this caller sees it
//! ([`SourceServer::tool`](crate::mcp::server::SourceServer::tool)): the gate runs the check
//! on every request whose `Mcp-Method` is `tools/call`, whatever its body spells, reads the
//! arguments as the tool gets them, and refuses a body it cannot read; `get_tool` answers
//! nothing. The rules are rmcp 3.11's (`validate_request_headers`), which
//! it does not export.

use axum::http::HeaderMap;
use base64::Engine as _;
use rmcp::model::JsonObject;
use serde_json::Value;

const PREFIX: &str = "=?base64?";
const SUFFIX: &str = "?=";

/// The tool name a `tools/call` names in its `Mcp-Name` header, decoded.
pub fn name(headers: &HeaderMap) -> Option<String> {
    let raw = headers.get(super::MCP_NAME)?.to_str().ok()?;
    decode(raw)
}

/// `value` as sent: plain, or `=?base64?…?=` around its UTF-8 bytes.
fn decode(value: &str) -> Option<String> {
    match value
        .strip_prefix(PREFIX)
        .and_then(|v| v.strip_suffix(SUFFIX))
    {
        Some(inner) => {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(inner)
                .ok()?;
            String::from_utf8(bytes).ok()
        }
        None => Some(value.to_owned()),
    }
}

/// Every `x-mcp-header` annotation reached from the root through `properties` alone: the
/// property's path and its header name.
fn annotations(schema: &JsonObject) -> Vec<(Vec<&str>, &str)> {
    fn walk<'a>(
        props: Option<&'a Value>,
        path: &mut Vec<&'a str>,
        out: &mut Vec<(Vec<&'a str>, &'a str)>,
    ) {
        let Some(Value::Object(props)) = props else {
            return;
        };
        for (name, schema) in props {
            path.push(name);
            if let Some(Value::String(h)) = schema.get("x-mcp-header")
                && !h.is_empty()
            {
                out.push((path.clone(), h.as_str()));
            }
            walk(schema.get("properties"), path, out);
            path.pop();
        }
    }
    let mut out = Vec::new();
    walk(schema.get("properties"), &mut Vec::new(), &mut out);
    out
}

/// Whether a tool's schema promotes any argument to a header.
pub fn promotes(schema: &JsonObject) -> bool {
    !annotations(schema).is_empty()
}

/// The one value of header `name`: `Ok(None)` when absent, an error when it is repeated or
/// not visible ASCII.
fn only<'a>(headers: &'a HeaderMap, name: &str) -> Result<Option<&'a str>, String> {
    let mut values = headers.get_all(name).iter();
    let Some(first) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(format!("duplicate {name} header; send it once"));
    }
    first.to_str().map(Some).map_err(|_| {
        format!(
            "{name} header contains invalid characters; Base64-encode the value as =?base64?…?="
        )
    })
}

/// Checks the request's `Mcp-Param-*` headers against its `arguments` for a tool with
/// `schema`: each annotated argument present (and not null) must have its header with the
/// same value, and no header may stand for an absent one. The error says what disagrees.
pub fn check(
    headers: &HeaderMap,
    arguments: Option<&Value>,
    schema: &JsonObject,
) -> Result<(), String> {
    for (path, header) in annotations(schema) {
        let full = format!("Mcp-Param-{header}");
        let prop = path.join(".");
        let sent = only(headers, &full)?;
        let arg = arguments
            .and_then(|a| path.iter().try_fold(a, |v, k| v.get(k)))
            .filter(|v| !v.is_null());
        let body = arg.and_then(|v| match v {
            Value::String(s) => Some(s.clone()),
            Value::Bool(b) => Some(b.to_string()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        });
        match (sent, body) {
            (None, None) => {}
            (Some(_), None) => {
                return Err(format!(
                    "unexpected {full} header for absent or null argument {prop}"
                ));
            }
            (None, Some(_)) => return Err(format!("missing {full} header for argument {prop}")),
            (Some(raw), Some(expected)) => {
                let got =
                    decode(raw).ok_or_else(|| format!("{full} header is not valid Base64"))?;
                if got != expected {
                    return Err(format!(
                        "{full} header {got:?} does not match the argument {prop} ({expected:?})"
                    ));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use axum::http::{HeaderName, HeaderValue};
    use serde_json::json;

    use super::*;

    fn schema() -> JsonObject {
        json!({"type": "object", "properties": {
            "region": {"type": "string", "x-mcp-header": "Region"},
            "n": {"type": "integer", "x-mcp-header": "N"},
            "plain": {"type": "string"}
        }})
        .as_object()
        .unwrap()
        .clone()
    }

    fn headers(pairs: &[(&str, &[u8])]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_bytes(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn headers_must_agree_with_the_arguments_they_repeat() {
        let s = schema();
        let args = json!({"region": "eu west", "n": 3, "plain": "x"});
        let ok = headers(&[("mcp-param-region", b"eu west"), ("mcp-param-n", b"3")]);
        assert_eq!(check(&ok, Some(&args), &s), Ok(()));
        // Base64 form, decoded before comparing.
        let b64 = headers(&[
            ("mcp-param-region", b"=?base64?ZXUgd2VzdA==?="),
            ("mcp-param-n", b"3"),
        ]);
        assert_eq!(check(&b64, Some(&args), &s), Ok(()));
        let wrong = headers(&[("mcp-param-region", b"us"), ("mcp-param-n", b"3")]);
        assert!(
            check(&wrong, Some(&args), &s)
                .unwrap_err()
                .contains("does not match")
        );
        let missing = headers(&[("mcp-param-n", b"3")]);
        assert!(
            check(&missing, Some(&args), &s)
                .unwrap_err()
                .contains("missing Mcp-Param-Region")
        );
        let extra = headers(&[("mcp-param-region", b"eu")]);
        assert!(
            check(&extra, Some(&json!({})), &s)
                .unwrap_err()
                .contains("unexpected")
        );
        let bad = headers(&[("mcp-param-region", b"\xff"), ("mcp-param-n", b"3")]);
        assert!(
            check(&bad, Some(&args), &s)
                .unwrap_err()
                .contains("invalid characters")
        );
        let twice = headers(&[
            ("mcp-param-region", b"eu west"),
            ("mcp-param-region", b"eu west"),
            ("mcp-param-n", b"3"),
        ]);
        assert!(
            check(&twice, Some(&args), &s)
                .unwrap_err()
                .contains("duplicate")
        );
        let bad64 = headers(&[
            ("mcp-param-region", b"=?base64?!!?="),
            ("mcp-param-n", b"3"),
        ]);
        assert!(
            check(&bad64, Some(&args), &s)
                .unwrap_err()
                .contains("Base64")
        );
        // A tool that promotes nothing checks nothing.
        let none = json!({"type": "object", "properties": {"a": {"type": "string"}}});
        assert!(!promotes(none.as_object().unwrap()));
        assert!(promotes(&s));
    }
}
