//! `herald ls`, `herald read`, `herald call`: a small MCP client for people and scripts.

use std::path::PathBuf;

use anyhow::anyhow;
use clap::Args;
use rmcp::model::{CallToolRequestParams, ReadResourceRequestParams, ResourceContents};
use serde_json::{Map, Value};

use crate::app::console;
use crate::cli::{Exit, usage};
use crate::mcp::limits::DEFAULT_MAX_MESSAGE_BYTES;
use crate::transport::client::{
    Connection, DEFAULT_CONNECT_TIMEOUT, client_config, connect_within,
};
use crate::transport::explain;
use crate::transport::target::Target;
use crate::transport::tls::ClientTrust;

/// Which server to talk to (exactly one).
#[derive(Debug, Clone, Args)]
#[group(required = true, multiple = false, id = "server")]
pub struct ServerArgs {
    /// Run CMD (through `sh -c`) and speak MCP on its stdin/stdout.
    #[arg(long, value_name = "CMD")]
    pub mcp_stdio: Option<String>,
    /// Streamable HTTP endpoint, e.g. http://127.0.0.1:8750/mcp.
    #[arg(long, value_name = "URL")]
    pub mcp_http: Option<String>,
    /// QUIC endpoint HOST:PORT.
    #[arg(long, value_name = "HOST:PORT")]
    pub mcp_quic: Option<String>,
}

/// Which server, and how to trust it (`herald poll` takes these; `ls`, `read`, `call` add
/// `--json`). A token for a gateway comes from `HERALD_TOKEN`.
#[derive(Debug, Clone, Args)]
pub struct ConnectArgs {
    #[command(flatten)]
    pub server: ServerArgs,
    /// Trust QUIC servers whose certificate chains to a CA in FILE (PEM).
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// Trust the QUIC server whose certificate has this SHA-256 fingerprint (printed at its start).
    #[arg(long, value_name = "SHA256")]
    pub tls_pin: Option<String>,
    #[command(flatten)]
    pub timeout: ConnectTimeout,
    /// The global `--store`: where an HTTP server's OAuth tokens are kept (`herald login`).
    #[arg(skip)]
    pub store: Option<String>,
}

/// How long a server has to answer a connect (every command that connects takes it).
#[derive(Debug, Clone, Copy, Args)]
pub struct ConnectTimeout {
    /// How long an HTTP or QUIC server has to answer a connect, up to the end of the MCP
    /// handshake (a QUIC server that is down answers nothing at all); reconnects wait as long.
    /// A stdio server's start is not bounded by it.
    #[arg(long = "connect-timeout-ms", value_name = "MS", default_value_t = DEFAULT_CONNECT_TIMEOUT.as_millis() as u64,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub ms: u64,
}

impl ConnectTimeout {
    pub fn duration(self) -> std::time::Duration {
        std::time::Duration::from_millis(self.ms)
    }
}

/// [`ConnectTimeout`] for a gateway's upstreams (`herald gateway`, `herald up`): a remote
/// upstream over TLS, or an older server that needs `server/discover` and then `initialize`,
/// may take longer than a person at a prompt should wait, and a slug that keeps missing the
/// bound never connects.
#[derive(Debug, Clone, Copy, Args)]
pub struct UpstreamConnectTimeout {
    /// How long each HTTP or QUIC upstream has to answer a connect, up to the end of the MCP
    /// handshake; reconnects wait as long. A stdio upstream's start is not bounded by it.
    #[arg(long = "connect-timeout-ms", value_name = "MS", default_value_t = UPSTREAM_CONNECT_TIMEOUT_MS,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub ms: u64,
}

/// Default of [`UpstreamConnectTimeout`].
pub const UPSTREAM_CONNECT_TIMEOUT_MS: u64 = 10_000;

impl UpstreamConnectTimeout {
    pub fn duration(self) -> std::time::Duration {
        std::time::Duration::from_millis(self.ms)
    }
}

#[derive(Debug, Clone, Args)]
pub struct ClientArgs {
    #[command(flatten)]
    pub conn: ConnectArgs,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

impl ClientArgs {
    async fn connect(&self) -> Result<Connection, Exit> {
        self.conn.connect().await
    }
}

impl ConnectArgs {
    fn target(&self) -> Target {
        let s = &self.server;
        if let Some(c) = &s.mcp_stdio {
            Target::Stdio(c.clone())
        } else if let Some(u) = &s.mcp_http {
            Target::Http(u.clone())
        } else {
            Target::Quic(s.mcp_quic.clone().unwrap_or_default())
        }
    }

    pub async fn connect(&self) -> Result<Connection, Exit> {
        self.connect_with(client_config()).await
    }

    /// [`ConnectArgs::connect`] with another client handler (one that declares the tasks
    /// extension and takes task pushes, for `herald call --task`).
    pub async fn connect_with<H: rmcp::ClientHandler>(
        &self,
        handler: H,
    ) -> Result<Connection<H>, Exit> {
        let target = self.target();
        let trust = ClientTrust {
            ca: self.tls_ca.clone(),
            pin: self.tls_pin.clone(),
            token: crate::transport::tls::Secret::from_env(),
            oauth: oauth_for(&target, &kept_tokens(self.store.as_deref())),
        };
        check_target(&target, self.tls_pin.as_deref())?;
        let within = self.timeout.duration();
        Ok(connect_within(&target, &trust, handler, DEFAULT_MAX_MESSAGE_BYTES, within).await?)
    }
}

/// The OAuth session of a command's HTTP server: the tokens `herald login` kept for it in the
/// store (opened only if the server asks for authorization). A command asks no person; its
/// error then says to log in. `None` for other transports, or with `HERALD_TOKEN` set (a
/// static token is what the caller chose).
pub fn oauth_for(
    target: &Target,
    kept: &Option<std::sync::Arc<crate::transport::oauth::keep::Lazy>>,
) -> Option<std::sync::Arc<crate::transport::oauth::OAuth>> {
    let (Target::Http(url), Some(kept)) = (target, kept) else {
        return None;
    };
    if crate::transport::tls::Secret::from_env().is_some() {
        return None;
    }
    let oauth = crate::transport::oauth::OAuth::new(url, Default::default(), None).ok()?;
    oauth.keep_in(kept.clone());
    Some(oauth)
}

/// Where a command's OAuth sessions find the kept tokens: the store of `--store` (or the
/// default), opened only when a server asks. One per command: its sessions take turns.
pub fn kept_tokens(
    store: Option<&str>,
) -> Option<std::sync::Arc<crate::transport::oauth::keep::Lazy>> {
    let location = match store {
        Some(s) => crate::store::Location::parse(s),
        None => crate::store::Location::default_path().ok()?,
    };
    Some(std::sync::Arc::new(
        crate::transport::oauth::keep::Lazy::new(location),
    ))
}

/// What is malformed in a server as given (`--mcp-http`, `--mcp-quic`, `--tls-pin`) is bad
/// usage (64), said before any connect.
pub fn check_target(target: &Target, pin: Option<&str>) -> Result<(), Exit> {
    match target {
        Target::Http(url) => {
            explain::check_http_url(url).map_err(|e| usage(anyhow!("--mcp-http {e}")))?
        }
        Target::Quic(addr) => {
            crate::transport::dns::split_host_port(addr).map_err(|e| {
                usage(anyhow!(
                    "--mcp-quic {e} (a QUIC server is HOST:PORT; an http:// URL goes to --mcp-http)"
                ))
            })?;
        }
        Target::Stdio(_) => {}
    }
    if let Some(pin) = pin {
        crate::transport::tls::parse_pin(pin).map_err(|e| usage(anyhow!("{e}")))?;
    }
    Ok(())
}

#[derive(Debug, Args)]
pub struct LsArgs {
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Debug, Args)]
pub struct ReadArgs {
    /// The resource URI.
    pub uri: String,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Debug, Args)]
pub struct CallArgs {
    /// The tool name.
    pub tool: String,
    /// Arguments as key=value; values are parsed as JSON when they parse, else taken as strings.
    #[arg(value_name = "KEY=VALUE")]
    pub args: Vec<String>,
    /// Run the call as a task (the tasks extension) and follow it until it ends: one status
    /// line on a terminal (NDJSON with --json), an elicitation it asks for answered at the
    /// terminal, Ctrl-C cancels it. A tool that does not run as a task answers in place.
    #[arg(long)]
    pub task: bool,
    #[command(flatten)]
    pub client: ClientArgs,
}

pub async fn ls(args: LsArgs) -> Result<(), Exit> {
    let conn = args.client.connect().await?;
    let tools = conn
        .list_all_tools()
        .await
        .map_err(failed(&conn, "tools/list"))?;
    let resources = conn
        .list_all_resources()
        .await
        .map_err(failed(&conn, "resources/list"))?;
    let templates = conn
        .list_all_resource_templates()
        .await
        .map_err(failed(&conn, "resources/templates/list"))?;
    if args.client.json {
        let v = serde_json::json!({"tools": tools, "resources": resources, "templates": templates});
        console::println(&serde_json::to_string_pretty(&v)?)?;
    } else {
        console::print(&listing(&tools, &resources, &templates))?;
        // Nothing at all through a gateway's ?servers=: the likeliest cause is a server that
        // is not up, which the listing cannot say.
        if tools.is_empty()
            && resources.is_empty()
            && templates.is_empty()
            && let Some(hint) = empty_hint(&args.client.conn)
        {
            eprintln!("{hint}");
        }
    }
    conn.close().await;
    Ok(())
}

/// What an empty listing through `?servers=` may mean, said on stderr for a person.
fn empty_hint(conn: &ConnectArgs) -> Option<String> {
    let url = conn.server.mcp_http.as_deref()?;
    let servers = reqwest::Url::parse(url)
        .ok()?
        .query_pairs()
        .find(|(k, _)| k == "servers")
        .map(|(_, v)| v.into_owned())?;
    Some(format!(
        "herald: nothing is listed for ?servers={servers}: the server may not be up yet; `herald status --admin ADDR` on the gateway's admin address says whether it is connected, and why not"
    ))
}

/// `herald ls` as text: a section per kind, each entry on its own line; a kind the server
/// has none of says `(none)` on its header's line.
fn listing(
    tools: &[rmcp::model::Tool],
    resources: &[rmcp::model::Resource],
    templates: &[rmcp::model::ResourceTemplate],
) -> String {
    let tools = tools.iter().map(|t| {
        let ro = t
            .annotations
            .as_ref()
            .and_then(|a| a.read_only_hint)
            .unwrap_or(false);
        let tag = if ro { "read-only" } else { "mutating" };
        format!(
            "{} ({tag}): {}",
            t.name,
            first_line(t.description.as_deref())
        )
    });
    let resources = resources.iter().map(|r| {
        format!(
            "{} [{}]: {}",
            r.uri,
            r.mime_type.as_deref().unwrap_or("?"),
            first_line(r.description.as_deref())
        )
    });
    let templates = templates.iter().map(|t| {
        format!(
            "{}: {}",
            t.uri_template,
            first_line(t.description.as_deref())
        )
    });
    let mut out = String::new();
    section(&mut out, "tools", tools);
    section(&mut out, "resources", resources);
    section(&mut out, "templates", templates);
    out
}

/// Appends `name:` and its entries, indented, one a line; `name: (none)` when there are none.
fn section(out: &mut String, name: &str, entries: impl Iterator<Item = String>) {
    let entries: Vec<String> = entries.collect();
    if entries.is_empty() {
        out.push_str(&format!("{name}: (none)\n"));
        return;
    }
    out.push_str(&format!("{name}:\n"));
    for e in entries {
        out.push_str(&format!("  {e}\n"));
    }
}

/// A failed request as the command's error: what was asked, and what went wrong in words.
fn failed<H: rmcp::ClientHandler>(
    conn: &Connection<H>,
    what: &str,
) -> impl FnOnce(rmcp::ServiceError) -> anyhow::Error {
    let target = conn.target().clone();
    let what = what.to_owned();
    move |e| anyhow!("{what} failed: {}", request_error(&target, &e))
}

fn first_line(s: Option<&str>) -> &str {
    s.and_then(|s| s.lines().next()).unwrap_or("")
}

pub async fn read(args: ReadArgs) -> Result<(), Exit> {
    let conn = args.client.connect().await?;
    let result = conn
        .read_resource(ReadResourceRequestParams::new(args.uri.clone()))
        .await
        .map_err(failed(&conn, &format!("reading {}", args.uri)))?;
    if args.client.json {
        console::println(&serde_json::to_string_pretty(&result)?)?;
    } else {
        for c in &result.contents {
            let shown = match c {
                ResourceContents::TextResourceContents { text, .. } => {
                    match serde_json::from_str::<Value>(text) {
                        Ok(v) => serde_json::to_string_pretty(&v)?,
                        Err(_) => text.clone(),
                    }
                }
                ResourceContents::BlobResourceContents {
                    blob, mime_type, ..
                } => format!(
                    "<{} bytes of {} as base64; use --json to see it>",
                    blob.len(),
                    mime_type.as_deref().unwrap_or("binary")
                ),
                #[allow(unreachable_patterns)]
                other => serde_json::to_string(other)?,
            };
            console::println(&shown)?;
        }
    }
    conn.close().await;
    Ok(())
}

/// What a failed request to `target` says to a person (`transport::explain::request`): a
/// server's JSON-RPC error as its message, then its code and data, each set apart (rmcp's own
/// text runs the data into the message: `…serves({"uri":…})`); a transport failure in words.
pub(super) fn request_error(target: &Target, e: &rmcp::ServiceError) -> String {
    explain::request(target, e)
}

/// Parses `key=value` pairs; a value is JSON when it parses as JSON, else a string.
pub fn parse_kv(pairs: &[String]) -> anyhow::Result<Map<String, Value>> {
    let mut out = Map::new();
    for p in pairs {
        let (k, v) = p
            .split_once('=')
            .ok_or_else(|| anyhow!("argument {p:?} is not KEY=VALUE"))?;
        if k.is_empty() {
            return Err(anyhow!("argument {p:?} has an empty key"));
        }
        let value = serde_json::from_str(v).unwrap_or_else(|_| Value::String(v.to_owned()));
        out.insert(k.to_owned(), value);
    }
    Ok(out)
}

/// `herald call` answered in place (`herald call --task` is `task::call`).
pub async fn call(args: CallArgs) -> Result<(), Exit> {
    let arguments = parse_kv(&args.args).map_err(usage)?;
    let conn = args.client.connect().await?;
    let result = conn
        .call_tool(CallToolRequestParams::new(args.tool.clone()).with_arguments(arguments))
        .await
        .map_err(failed(&conn, &format!("calling {}", args.tool)))?;
    conn.close().await;
    print_result(&args.tool, &result, args.client.json)
}

/// Prints a tool's result (its text content, or the whole result as JSON); an error result
/// is the command's failure.
pub(super) fn print_result(
    tool: &str,
    result: &rmcp::model::CallToolResult,
    json: bool,
) -> Result<(), Exit> {
    if json {
        console::println(&serde_json::to_string_pretty(result)?)?;
    } else {
        for c in &result.content {
            match c.as_text() {
                Some(t) => console::println(&t.text)?,
                None => console::println(&serde_json::to_string(c)?)?,
            }
        }
    }
    if result.is_error == Some(true) {
        return Err(anyhow!("{tool} reported an error").into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_servers_error_reads_as_message_code_and_data() {
        let e = rmcp::ServiceError::McpError(rmcp::model::ErrorData::invalid_params(
            "unknown resource memo://x; resources/list names what this server serves",
            Some(serde_json::json!({"uri": "memo://x"})),
        ));
        let target = Target::Http("http://127.0.0.1:8750/mcp".into());
        assert_eq!(
            request_error(&target, &e),
            "http://127.0.0.1:8750/mcp answered: unknown resource memo://x; resources/list \
             names what this server serves (code -32602; data {\"uri\":\"memo://x\"})"
        );
        let plain =
            rmcp::ServiceError::McpError(rmcp::model::ErrorData::internal_error("boom", None));
        assert_eq!(
            request_error(&target, &plain),
            "http://127.0.0.1:8750/mcp answered: boom (code -32603)"
        );
    }

    #[test]
    fn kv_values_are_json_when_they_parse() {
        let m = parse_kv(&[
            "a=1".into(),
            "b=hello".into(),
            "c={\"x\":[1]}".into(),
            "d=\"1\"".into(),
            "e=".into(),
        ])
        .unwrap();
        assert_eq!(m["a"], 1);
        assert_eq!(m["b"], "hello");
        assert_eq!(m["c"]["x"][0], 1);
        assert_eq!(m["d"], "1");
        assert_eq!(m["e"], "");
        assert!(parse_kv(&["novalue".into()]).is_err());
        assert!(parse_kv(&["=x".into()]).is_err());
    }
}
