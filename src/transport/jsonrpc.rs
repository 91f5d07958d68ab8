//! What is wrong with a JSON value that is not one JSON-RPC message: the one answer every
//! transport gives (stdio and QUIC lines, HTTP bodies rmcp refused), so the same bad message
//! gets the same error code everywhere.

use serde_json::Value;

/// Why a message is not one JSON-RPC message herald can take, and how to answer it.
#[derive(Debug, PartialEq)]
pub struct Misshapen {
    /// The id to answer with: the request's own when it is usable, else `null`.
    pub id: Value,
    /// `-32600` for a message that is not a JSON-RPC request or response, `-32602` for a
    /// request whose `_meta` is not an object.
    pub code: i64,
    pub message: String,
}

/// What is wrong with `v` as a JSON-RPC message; `None` when nothing JSON-RPC itself forbids
/// is (the message may still be one the server refuses for its method or params).
pub fn misshapen(v: &Value) -> Option<Misshapen> {
    let invalid = |id: Value, message: &str| Misshapen {
        id,
        code: -32600,
        message: message.to_owned(),
    };
    let Value::Object(m) = v else {
        let message = if v.is_array() {
            "batches are not part of MCP; send one JSON-RPC message per request"
        } else {
            "a JSON-RPC message must be a JSON object"
        };
        return Some(invalid(Value::Null, message));
    };
    // A response's id is the server's own request's: never echoed back.
    let request = m.contains_key("method");
    let id = match m.get("id") {
        Some(id @ Value::String(_)) if request => id.clone(),
        // rmcp's numeric ids are i64: a bigger one could not be answered by id.
        Some(Value::Number(n)) if request && n.is_i64() => Value::Number(n.clone()),
        Some(Value::Number(n)) if request => {
            return Some(invalid(
                Value::Null,
                &format!("a request's id must be a string or an integer, not {n}"),
            ));
        }
        Some(Value::String(_) | Value::Number(_)) | None => Value::Null,
        Some(Value::Null) if !request => Value::Null,
        Some(Value::Null) => {
            return Some(invalid(
                Value::Null,
                "a request's id must be a string or an integer, never null",
            ));
        }
        Some(_) => {
            return Some(invalid(
                Value::Null,
                "a message's id must be a string or an integer",
            ));
        }
    };
    if m.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Some(invalid(
            id,
            r#"a JSON-RPC message must carry "jsonrpc": "2.0""#,
        ));
    }
    if let Some(method) = m.get("method") {
        let Some(method) = method.as_str() else {
            return Some(invalid(id, "a message's method must be a string"));
        };
        if m.contains_key("result") || m.contains_key("error") {
            return Some(invalid(
                id,
                "a JSON-RPC message is a request (method) or a response (result or error), never both",
            ));
        }
        match m.get("params") {
            None | Some(Value::Null) => {}
            Some(Value::Object(p)) => {
                if p.get("_meta").is_some_and(|meta| !meta.is_object()) {
                    return Some(Misshapen {
                        id,
                        code: -32602,
                        message: format!("invalid params for {method}: _meta must be an object"),
                    });
                }
            }
            // JSON-RPC 2.0: params, when present, is a structured value; MCP's are objects.
            Some(_) => {
                return Some(invalid(
                    id,
                    &format!("invalid request: {method}'s params must be an object"),
                ));
            }
        }
    } else if !m.contains_key("result") && !m.contains_key("error") {
        return Some(invalid(
            id,
            "a JSON-RPC message must be a request (method), or a response (result or error)",
        ));
    }
    None
}

/// Just the `method` of a JSON-RPC message (escapes decoded, nothing else kept).
#[derive(serde::Deserialize)]
pub(crate) struct MethodProbe<'a> {
    #[serde(borrow, default)]
    pub(crate) method: Option<std::borrow::Cow<'a, str>>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn code(v: Value) -> Option<(Value, i64)> {
        misshapen(&v).map(|w| (w.id, w.code))
    }

    #[test]
    fn each_shape_gets_its_code_and_a_usable_id() {
        let m = json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28"});
        assert_eq!(code(json!([1])), Some((Value::Null, -32600)));
        assert_eq!(code(json!("x")), Some((Value::Null, -32600)));
        assert_eq!(
            code(json!({"jsonrpc": "2.0", "id": 1.5, "method": "tools/list"})),
            Some((Value::Null, -32600))
        );
        assert_eq!(
            code(json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list", "params": "x"})),
            Some((json!(3), -32600))
        );
        assert_eq!(
            code(
                json!({"jsonrpc": "2.0", "id": "a", "method": "tools/list", "params": {"_meta": "x"}})
            ),
            Some((json!("a"), -32602))
        );
        assert_eq!(
            code(json!({"jsonrpc": "2.0", "id": 4, "method": 5})),
            Some((json!(4), -32600))
        );
        assert_eq!(
            code(json!({"jsonrpc": "2.0", "id": 4, "method": "x", "result": 1})),
            Some((json!(4), -32600))
        );
        // A response's id is never echoed.
        assert_eq!(
            code(json!({"jsonrpc": "1.0", "id": 9, "result": {}})),
            Some((Value::Null, -32600))
        );
        // Well-formed JSON-RPC is not this module's to refuse.
        assert_eq!(
            code(
                json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": m}})
            ),
            None
        );
        assert_eq!(
            code(json!({"jsonrpc": "2.0", "id": -1, "result": {}})),
            None
        );
    }
}
