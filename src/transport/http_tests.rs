use super::*;
use crate::mcp::server::dispatch::Plain as PlainWhat;

fn headers(pairs: &[(&'static str, &'static str)]) -> axum::http::HeaderMap {
    pairs
        .iter()
        .map(|(k, v)| (header::HeaderName::from_static(k), v.parse().unwrap()))
        .collect()
}

fn call_body(name: &str, meta: Value) -> Vec<u8> {
    serde_json::to_vec(&json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
        "params": {"_meta": meta, "name": name, "arguments": {"key": "k", "value": 1}}}))
    .unwrap()
}

/// The plain call herald answers itself is the one every 2026-07-28 client sends; a
/// progress token, a second `Mcp-Name` or a name that differs from the body's goes to rmcp.
#[test]
fn a_plain_call_is_recognised_and_anything_else_left_to_rmcp() {
    let meta = json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"}});
    let plain = headers(&[
        ("content-type", "application/json"),
        ("accept", "application/json, text/event-stream"),
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", "tools/call"),
        ("mcp-name", "memo_set"),
    ]);
    let call = plain_request(&plain, &call_body("memo_set", meta.clone()))
        .expect("a plain call is answered in place");
    let PlainWhat::Call { name, args, .. } = call.what else {
        panic!("a call")
    };
    assert_eq!(name, "memo_set");
    assert_eq!(args["key"], "k");
    let read = serde_json::to_vec(&json!({"jsonrpc": "2.0", "id": 8,
        "method": "resources/read", "params": {"_meta": meta, "uri": "memo://notes"}}))
    .unwrap();
    let mut read_headers = plain.clone();
    read_headers.insert("mcp-method", "resources/read".parse().unwrap());
    read_headers.insert("mcp-name", "memo://notes".parse().unwrap());
    let PlainWhat::Read { uri, .. } = plain_request(&read_headers, &read).unwrap().what else {
        panic!("a read")
    };
    assert_eq!(uri, "memo://notes");
    read_headers.insert("mcp-name", "memo://log".parse().unwrap());
    assert!(plain_request(&read_headers, &read).is_none());

    let mut with_progress = meta.clone();
    with_progress["progressToken"] = json!("p");
    assert!(plain_request(&plain, &call_body("memo_set", with_progress)).is_none());
    assert!(plain_request(&plain, &call_body("memo_delete", meta.clone())).is_none());
    let mut no_name = plain.clone();
    no_name.remove("mcp-name");
    assert!(plain_request(&no_name, &call_body("memo_set", meta.clone())).is_none());
    let mut encoded = plain.clone();
    encoded.insert("mcp-name", "=?base64?bWVtb19zZXQ=?=".parse().unwrap());
    assert!(plain_request(&encoded, &call_body("memo_set", meta.clone())).is_none());
    let mut two_names = plain.clone();
    two_names.append("mcp-name", "memo_set".parse().unwrap());
    assert!(plain_request(&two_names, &call_body("memo_set", meta.clone())).is_none());
    let mut old = plain.clone();
    old.insert("mcp-protocol-version", "2025-11-25".parse().unwrap());
    assert!(plain_request(&old, &call_body("memo_set", meta)).is_none());
}

/// The plain parse is strict, so no body that a full parse (the `Mcp-Param-*` check's, or
/// rmcp's) would read otherwise or refuse is answered in place: an array for the request or
/// its params (a derived struct takes its fields in order), a field it does not know (junk
/// a full parse refuses, a stray `result`, a `task`), each left to rmcp.
#[test]
fn only_a_plain_object_of_known_fields_is_answered_in_place() {
    let meta = json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {}});
    let plain = headers(&[
        ("content-type", "application/json"),
        ("accept", "application/json, text/event-stream"),
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", "tools/call"),
        ("mcp-name", "deploy"),
    ]);
    let params = json!({"_meta": meta, "name": "deploy", "arguments": {"region": "eu-west"}});
    let good = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params});
    assert!(plain_request(&plain, good.to_string().as_bytes()).is_some());
    let m = meta.to_string();
    let args = r#"{"region":"eu-west"}"#;
    let head = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":"#;
    for body in [
        // Junk that a full parse refuses (a number out of range, a lone surrogate).
        format!(r#"{head}{{"_meta":{m},"name":"deploy","arguments":{args}}},"x":1e400}}"#),
        format!(r#"{head}{{"_meta":{m},"name":"deploy","arguments":{args},"x":"\udc00"}}}}"#),
        // The request, or its params, as an array of fields in order.
        format!(r#"["2.0",1,"tools/call",{{"_meta":{m},"name":"deploy","arguments":{args}}}]"#),
        format!(r#"{head}[{m},"deploy",{args},null,null]}}"#),
        // A stray result, and a task (the tasks extension is rmcp's to judge).
        format!(r#"{head}{{"_meta":{m},"name":"deploy"}},"result":{{}}}}"#),
        format!(r#"{head}{{"_meta":{m},"name":"deploy","task":{{}}}}}}"#),
    ] {
        assert!(
            plain_request(&plain, body.as_bytes()).is_none(),
            "answered in place: {body}"
        );
    }
}

/// The `Mcp-Param-*` check reads the arguments the tool gets: a map of values at the top (the
/// `raw_value` marker key is an ordinary key there, as rmcp reads it, not JSON text to
/// parse), and refuses (None) what is not a request object with object params.
#[test]
fn the_header_check_reads_the_arguments_the_tool_gets() {
    let (id, args) = checked_arguments(
        br#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"t","arguments":{"region":"eu"}}}"#,
    )
    .unwrap();
    assert_eq!(id, json!(3));
    assert_eq!(args, Some(json!({"region": "eu"})));
    let marker = br#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"t","arguments":{"$serde_json::private::RawValue":"{\"region\":\"eu\"}"}}}"#;
    let (_, args) = checked_arguments(marker).unwrap();
    assert!(
        args.as_ref().and_then(|a| a.get("region")).is_none(),
        "the marker's text is not taken as the arguments: {args:?}"
    );
    // rmcp reads the same arguments from the same bytes.
    let rmcp::model::ClientJsonRpcMessage::Request(r) =
        serde_json::from_slice::<rmcp::model::ClientJsonRpcMessage>(marker).unwrap()
    else {
        panic!("a request")
    };
    let rmcp::model::ClientRequest::CallToolRequest(call) = r.request else {
        panic!("a call")
    };
    assert_eq!(call.params.arguments.map(Value::Object), args);
    for bad in [
        &br#"["2.0",3,"tools/call",{"name":"t","arguments":{"region":"eu"}}]"#[..],
        br#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":[null,"t",{"region":"eu"}]}"#,
        br#"{"jsonrpc":"2.0","id":3,"method":"tools/call"}"#,
        br#"not json"#,
    ] {
        assert!(
            checked_arguments(bad).is_none(),
            "{}",
            String::from_utf8_lossy(bad)
        );
    }
}

/// rmcp's table (`jsonrpc_http_status` and its tests in rmcp 3.11's
/// `streamable_http_server/tower.rs`), code by code: the protocol's request errors are
/// `400`, an unknown method `404`, `-32602` `400` only for a malformed `_meta`, and every
/// other error `200` with the error in the body.
#[test]
fn an_error_gets_the_status_rmcp_gives_it() {
    use rmcp::model::ErrorCode;
    for (code, malformed, status) in [
        (ErrorCode::HEADER_MISMATCH, false, 400),
        (ErrorCode::MISSING_REQUIRED_CLIENT_CAPABILITY, false, 400),
        (ErrorCode::UNSUPPORTED_PROTOCOL_VERSION, false, 400),
        (ErrorCode::INVALID_PARAMS, true, 400),
        (ErrorCode::INVALID_PARAMS, false, 200),
        (ErrorCode::METHOD_NOT_FOUND, false, 404),
        (ErrorCode::INTERNAL_ERROR, false, 200),
        (ErrorCode::INVALID_REQUEST, false, 200),
        (ErrorCode(-32023), false, 200),
        (ErrorCode(-32024), false, 200),
    ] {
        assert_eq!(error_status(code, malformed).as_u16(), status, "{code:?}");
    }
}

/// The cap leaves the process room under its open-file limit, and is never zero.
#[test]
fn the_connection_cap_fits_under_the_open_file_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the valid, initialised struct it is given.
    let got = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    assert_eq!(got, 0);
    let soft = usize::try_from(limit.rlim_cur).unwrap_or(usize::MAX);
    let capped = within_open_files(usize::MAX);
    assert!(capped >= 1);
    if limit.rlim_cur != libc::RLIM_INFINITY {
        assert_eq!(capped, soft - (soft / 4).min(256));
    }
    assert_eq!(within_open_files(1), 1);
}
