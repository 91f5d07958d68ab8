//! The client under test for the official MCP conformance suite's client scenarios, driving
//! herald's own client plumbing.
//!
//! The suite runs `conformance_client URL` with the scenario's name in
//! `MCP_CONFORMANCE_SCENARIO` (and, for some scenarios, test data in `MCP_CONFORMANCE_CONTEXT`,
//! JSON with `toolCalls: [{name, arguments}]`). It connects the way the gateway connects to an
//! upstream (an [`Upstream`]: `server/discover` with herald's per-request `_meta`, then the
//! catalog: tools, resources, templates), then does what a client does with a server:
//!
//! - every scenario but `request-metadata` and `json-schema-ref-no-deref` calls every tool it
//!   was offered, with the context's arguments for it or sample arguments made from its
//!   schema, all at once (so an input round's `requestState` could leak into a neighbour if
//!   anything kept it beyond its call). A plain call takes the gateway's way: posted directly
//!   ([`herald::upstream::http::HttpCalls`]) when the upstream allows it, else over the
//!   connection. In `sep-2322-client-request-state` every call goes over the connection, whose
//!   `Connection::call_tool` follows `input_required` rounds (the gateway does not relay input
//!   requests yet); elicitations are declined, as the gateway's connections decline them;
//! - `http-standard-headers` also reads every resource and gets every prompt.
//!
//! ```text
//! cargo build --example conformance_client
//! .ci/conformance-client.sh target/debug/examples/conformance_client
//! ```
//!
//! Exit status 0 when every step got an answer; 1 with the reason on stderr otherwise.

use std::sync::Arc;

use herald::mcp::limits::DEFAULT_MAX_MESSAGE_BYTES;
use herald::transport::oauth::consent::Follow;
use herald::transport::oauth::{OAuth, OAuthSettings};
use herald::transport::target::Target;
use herald::transport::tls::ClientTrust;
use herald::upstream::{Live, Upstream, UpstreamConfig};
use rmcp::model::{
    CallToolRequestParams, GetPromptRequestParams, JsonObject, ReadResourceRequestParams, Tool,
};
use serde_json::{Value, json};

/// The Client ID Metadata Document URL the suite expects of a client (auth/basic-cimd).
const CLIENT_METADATA_URL: &str = "https://conformance-test.local/client-metadata.json";

/// The scenario whose calls must follow input rounds (over the connection).
const INPUT_ROUNDS: &str = "sep-2322-client-request-state";

#[tokio::main]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    if let Err(e) = run().await {
        eprintln!("conformance_client: {e}");
        std::process::exit(1);
    }
}

async fn run() -> Result<(), String> {
    let url = std::env::args().nth(1).ok_or(
        "usage: MCP_CONFORMANCE_SCENARIO=<scenario> conformance_client <server-url> (the suite sets both)",
    )?;
    let scenario = std::env::var("MCP_CONFORMANCE_SCENARIO").unwrap_or_default();
    let context: Value = match std::env::var("MCP_CONFORMANCE_CONTEXT") {
        Ok(c) => serde_json::from_str(&c)
            .map_err(|e| format!("MCP_CONFORMANCE_CONTEXT is not JSON ({e}): {c}"))?,
        Err(_) => Value::Null,
    };
    // The auth/* scenarios: herald's OAuth client, with the suite's authorization server
    // approving at once (`Follow` carries its redirect to the loopback listener), a Client ID
    // Metadata Document URL for servers that take one, and the context's pre-registered
    // client when it gives one.
    let oauth = scenario.starts_with("auth/").then(|| {
        let settings = OAuthSettings {
            client_id: context["client_id"].as_str().map(str::to_owned),
            client_secret: context["client_secret"].as_str().map(str::to_owned),
            client_metadata_url: Some(CLIENT_METADATA_URL.to_owned()),
            ..Default::default()
        };
        OAuth::new(&url, settings, Some(Arc::new(Follow)))
    });
    let trust = ClientTrust {
        oauth: oauth.transpose()?,
        ..Default::default()
    };
    let up = Arc::new(Upstream::new(UpstreamConfig::new(
        Target::Http(url),
        trust,
        DEFAULT_MAX_MESSAGE_BYTES,
    )));
    let live = up.live().await.map_err(|e| e.to_string())?;
    eprintln!(
        "conformance_client: connected ({}), offered tools {:?}",
        live.conn.protocol_version().unwrap_or_default(),
        live.tools.iter().map(|t| &*t.name).collect::<Vec<_>>()
    );
    match scenario.as_str() {
        // Connecting (discover, with its version retry) and the lists are the scenario.
        "request-metadata" | "json-schema-ref-no-deref" => {}
        _ => {
            let calls = live
                .tools
                .iter()
                .map(|t| call(&up, &live, t, &context, scenario != INPUT_ROUNDS));
            for r in futures::future::join_all(calls).await {
                r?;
            }
        }
    }
    if scenario == "http-standard-headers" {
        browse(&live).await?;
    }
    // Close the connection before the runtime goes (rmcp logs its cut-off transport task).
    drop(live);
    up.close().await;
    Ok(())
}

/// Calls `tool` with the context's arguments for it, or sample ones made from its schema.
async fn call(
    up: &Upstream,
    live: &Live,
    tool: &Tool,
    context: &Value,
    direct: bool,
) -> Result<(), String> {
    let name = &*tool.name;
    let args = context["toolCalls"]
        .as_array()
        .and_then(|calls| calls.iter().find(|c| c["name"] == name))
        .and_then(|c| c["arguments"].as_object().cloned())
        .unwrap_or_else(|| sample_arguments(&tool.input_schema));
    let how;
    let result = match up.http_calls(name).filter(|_| direct) {
        Some(calls) => {
            how = "directly";
            match calls
                .call(name, &args, &herald::mcp::source::Call::default())
                .await
                .map_err(|e| format!("{e:?}"))?
            {
                rmcp::model::CallToolResponse::Complete(r) => r,
                _ => return Err(format!("{name}: the server asked for input or made a task")),
            }
        }
        None => {
            how = "over the connection";
            live.conn
                .call_tool(CallToolRequestParams::new(name.to_owned()).with_arguments(args))
                .await
                .map_err(|e| format!("calling {name}: {e}"))?
        }
    };
    eprintln!(
        "conformance_client: {name} ({how}): {}",
        serde_json::to_string(&result.content).unwrap_or_default()
    );
    Ok(())
}

/// Arguments for the required properties of an object schema: a number, a string or a
/// boolean as each property's type asks.
fn sample_arguments(schema: &JsonObject) -> JsonObject {
    let mut args = JsonObject::new();
    let required = schema.get("required").and_then(Value::as_array);
    for name in required.into_iter().flatten().filter_map(Value::as_str) {
        let value = match schema["properties"][name]["type"].as_str() {
            Some("number") | Some("integer") => json!(2),
            Some("boolean") => json!(true),
            Some("array") => json!([]),
            Some("object") => json!({}),
            _ => json!("sample"),
        };
        args.insert(name.to_owned(), value);
    }
    args
}

/// Reads every resource offered and gets every prompt.
async fn browse(live: &Live) -> Result<(), String> {
    for r in &live.resources {
        live.conn
            .read_resource(ReadResourceRequestParams::new(r.uri.clone()))
            .await
            .map_err(|e| format!("reading {}: {e}", r.uri))?;
    }
    let prompts = live
        .conn
        .list_all_prompts()
        .await
        .map_err(|e| format!("prompts/list: {e}"))?;
    for p in prompts {
        live.conn
            .get_prompt(GetPromptRequestParams::new(p.name.clone()))
            .await
            .map_err(|e| format!("getting prompt {}: {e}", p.name))?;
    }
    Ok(())
}
