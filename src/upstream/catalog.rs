//! [`Catalog`]: what an upstream offered when it connected, and [`route`], the one rule every
//! client role uses to pick the upstream for a URI.

use rmcp::ClientHandler;
use rmcp::model::{Resource, ResourceContents, ResourceTemplate, Tool};
use serde_json::{Value, json};

use crate::mcp::server::EVENTS_EXTENSION;
use crate::mcp::source::{Body, Contents};
use crate::mcp::template::Template;
use crate::transport::client::Connection;

/// What an upstream offered on its last connect: refreshed on every connect, and kept while
/// it reconnects, so routing and listings keep a server's URIs and tools through a restart.
#[derive(Debug, Clone, Default)]
pub struct Catalog {
    /// The full tool entries (the gateway relists them; [`Catalog::read_only`] reads the
    /// annotations).
    pub tools: Vec<Tool>,
    pub resources: Vec<Resource>,
    /// Each template as the upstream wrote it, and parsed; one that does not parse is left
    /// out (it could never route anything).
    pub templates: Vec<(String, Template)>,
    /// The entries of [`Catalog::templates`] whole (name, description, MIME type), for the
    /// gateway to relist: a template's description carries its `watch_start` example.
    pub template_entries: Vec<ResourceTemplate>,
    /// The resource and template entries as Python's `list_resources()` returns them.
    pub listing: Vec<Value>,
    /// Whether it advertises `resources.subscribe`.
    pub subscribe: bool,
    /// Whether it speaks 2026-07-28 (and so `subscriptions/listen`).
    pub modern: bool,
    /// Whether its handshake advertises the Events extension.
    pub events: bool,
    /// Tools whose input schema promotes arguments to `Mcp-Param-*` HTTP headers
    /// (`x-mcp-header`): rmcp's client sends those, a direct call does not.
    pub header_tools: Vec<String>,
    /// Its prompts, when it advertises prompts.
    pub prompts: Vec<rmcp::model::Prompt>,
    /// Whether it advertises `completions`.
    pub completions: bool,
    /// Whether it advertises `tools.listChanged` / `prompts.listChanged`: its lists may
    /// change while connected, and it says so (on a listen that asks, or to an older
    /// client's handler).
    pub tools_list_changed: bool,
    pub prompts_list_changed: bool,
    /// Whether its listens' updates can carry reads (`io.herald/contents`: a herald server).
    pub contents: bool,
}

impl AsRef<Catalog> for Catalog {
    fn as_ref(&self) -> &Catalog {
        self
    }
}

/// The tools whose input schema promotes arguments to headers (`x-mcp-header`).
fn header_tools(tools: &[Tool]) -> Vec<String> {
    tools
        .iter()
        .filter(|t| {
            serde_json::to_string(&*t.input_schema).is_ok_and(|s| s.contains("x-mcp-header"))
        })
        .map(|t| t.name.to_string())
        .collect()
}

pub use crate::mcp::source::is_read_only;

/// The `Example:` line of a description (its last one), for `list_resources()`.
fn example(description: Option<&str>) -> Value {
    description
        .and_then(|d| {
            d.lines()
                .rev()
                .find_map(|l| l.trim().strip_prefix("Example:"))
        })
        .map(|e| Value::from(e.trim()))
        .unwrap_or(Value::Null)
}

/// How long a server has to answer the `events/list` probe.
const EVENTS_PROBE: std::time::Duration = std::time::Duration::from_secs(1);

/// Whether a 2026-07-28 server answers `events/list` (within [`EVENTS_PROBE`], cancelled
/// upstream past it): servers written for ChatGPT advertise Events as a top-level
/// `capabilities.events`, which rmcp's types do not keep, so such a server is asked instead.
/// One that does not know the method says so at once.
async fn answers_events_list<H: ClientHandler>(conn: &Connection<H>) -> bool {
    use rmcp::model::{ClientRequest, CustomRequest, ServerResult};
    let req = ClientRequest::CustomRequest(CustomRequest::new(
        "events/list",
        Some(serde_json::json!({})),
    ));
    let options = rmcp::service::PeerRequestOptions::with_timeout(EVENTS_PROBE);
    let Ok(handle) = conn.send_cancellable_request(req, options).await else {
        return false;
    };
    matches!(
        handle.await_response().await,
        Ok(ServerResult::CustomResult(r)) if r.0.get("events").is_some_and(Value::is_array)
    )
}

impl Catalog {
    /// Asks a freshly connected upstream what it offers: tools when it advertises tools,
    /// resources and templates when it advertises resources. A list that fails is empty (the
    /// connection is still useful for the rest). `server` names it in the listing entries.
    pub async fn fetch<H: ClientHandler>(conn: &Connection<H>, server: &str) -> Catalog {
        let caps = conn.peer_info().map(|i| i.capabilities.clone());
        let subscribe = caps
            .as_ref()
            .and_then(|c| c.resources.as_ref())
            .and_then(|r| r.subscribe)
            .unwrap_or(false);
        let tools = if caps.as_ref().is_some_and(|c| c.tools.is_some()) {
            conn.list_all_tools().await.unwrap_or_default()
        } else {
            Vec::new()
        };
        let (resources, templates) = if caps.as_ref().is_some_and(|c| c.resources.is_some()) {
            (
                conn.list_all_resources().await.unwrap_or_default(),
                conn.list_all_resource_templates().await.unwrap_or_default(),
            )
        } else {
            (Vec::new(), Vec::new())
        };
        let events = caps.as_ref().is_some_and(|c| {
            c.extensions
                .as_ref()
                .is_some_and(|e| e.contains_key(EVENTS_EXTENSION))
        }) || (conn.is_modern() && answers_events_list(conn).await);
        let mut catalog = Catalog::new(
            server,
            tools,
            resources,
            &templates,
            subscribe,
            conn.is_modern(),
            events,
        );
        if caps.as_ref().is_some_and(|c| c.prompts.is_some()) {
            catalog.prompts = conn.list_all_prompts().await.unwrap_or_default();
        }
        catalog.completions = caps.as_ref().is_some_and(|c| c.completions.is_some());
        catalog.tools_list_changed = caps
            .as_ref()
            .and_then(|c| c.tools.as_ref())
            .is_some_and(|t| t.list_changed == Some(true));
        catalog.prompts_list_changed = caps
            .as_ref()
            .and_then(|c| c.prompts.as_ref())
            .is_some_and(|p| p.list_changed == Some(true));
        catalog.contents = caps.as_ref().is_some_and(|c| {
            c.extensions
                .as_ref()
                .is_some_and(|e| e.contains_key(crate::mcp::admission::CONTENTS))
        });
        catalog
    }

    /// A catalog from its lists (what [`Catalog::fetch`] got, or a test's).
    pub fn new(
        server: &str,
        tools: Vec<Tool>,
        resources: Vec<Resource>,
        templates: &[ResourceTemplate],
        subscribe: bool,
        modern: bool,
        events: bool,
    ) -> Catalog {
        let mut listing = Vec::with_capacity(resources.len() + templates.len());
        for r in &resources {
            listing.push(json!({"uri": r.uri, "template": false, "name": r.name,
                "description": r.description, "example": example(r.description.as_deref()),
                "mime_type": r.mime_type, "server": server, "subscribable": subscribe}));
        }
        for t in templates {
            listing.push(
                json!({"uri": t.uri_template, "template": true, "name": t.name,
                "description": t.description, "example": example(t.description.as_deref()),
                "mime_type": t.mime_type, "server": server, "subscribable": subscribe}),
            );
        }
        let header_tools = header_tools(&tools);
        let parsed: Vec<(&ResourceTemplate, Template)> = templates
            .iter()
            .filter_map(|t| Template::parse(&t.uri_template).ok().map(|p| (t, p)))
            .collect();
        Catalog {
            header_tools,
            tools,
            resources,
            template_entries: parsed.iter().map(|(t, _)| (*t).clone()).collect(),
            templates: parsed
                .into_iter()
                .map(|(t, p)| (t.uri_template.clone(), p))
                .collect(),
            listing,
            subscribe,
            modern,
            events,
            prompts: Vec::new(),
            completions: false,
            tools_list_changed: false,
            prompts_list_changed: false,
            contents: false,
        }
    }

    /// This catalog with `tools` fetched again (the server said its list changed).
    pub fn with_tools(&self, tools: Vec<Tool>) -> Catalog {
        Catalog {
            header_tools: header_tools(&tools),
            tools,
            ..self.clone()
        }
    }

    /// This catalog with `prompts` fetched again.
    pub fn with_prompts(&self, prompts: Vec<rmcp::model::Prompt>) -> Catalog {
        Catalog {
            prompts,
            ..self.clone()
        }
    }

    /// Whether a plain call of `tool` may go straight to the upstream's HTTP endpoint
    /// ([`super::http::HttpCalls`]): it speaks 2026-07-28 and the tool promotes no argument
    /// to a header.
    pub fn direct_call(&self, tool: &str) -> bool {
        self.modern && !self.header_tools.iter().any(|t| t == tool)
    }

    /// Whether it lists `uri` exactly.
    pub fn lists(&self, uri: &str) -> bool {
        self.resources.iter().any(|r| r.uri == uri)
    }

    /// Whether one of its templates matches `uri`.
    pub fn template_matches(&self, uri: &str) -> bool {
        self.templates.iter().any(|(_, t)| t.matches(uri))
    }

    /// `Some(read-only)` when it has a tool named `name`.
    pub fn read_only(&self, name: &str) -> Option<bool> {
        self.tools.iter().find(|t| t.name == name).map(is_read_only)
    }
}

/// The routing rule, the same for every client role: among `catalogs` (in their order), the
/// first that lists `uri` exactly; else the first with a template matching it; else the first
/// that advertises `resources.subscribe` and speaks 2026-07-28 (a URI nobody lists may still
/// be watchable there; an older server could never watch it). Returns its index.
pub fn route<C: AsRef<Catalog>>(catalogs: &[C], uri: &str) -> Option<usize> {
    let all = || catalogs.iter().map(AsRef::as_ref).enumerate();
    all()
        .find(|(_, c)| c.lists(uri))
        .or_else(|| all().find(|(_, c)| c.template_matches(uri)))
        .or_else(|| all().find(|(_, c)| c.subscribe && c.modern))
        .map(|(i, _)| i)
}

/// Why a read result could not become [`Contents`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ContentsError {
    #[error("the read returned no contents")]
    Empty,
    #[error("the read returned contents of a kind herald does not handle")]
    Unsupported,
}

/// The one mapping from a read's result to herald's [`Contents`]: its first item; text as
/// text (MIME type `text/plain` when the upstream named none), a blob decoded from base64
/// (`application/octet-stream` when unnamed; undecodable base64 reads as empty).
pub fn contents(result: rmcp::model::ReadResourceResult) -> Result<Contents, ContentsError> {
    match result.contents.into_iter().next() {
        Some(ResourceContents::TextResourceContents {
            text, mime_type, ..
        }) => Ok(Contents {
            mime_type: mime_type.unwrap_or_else(|| "text/plain".into()),
            body: Body::Text(text),
        }),
        Some(ResourceContents::BlobResourceContents {
            blob, mime_type, ..
        }) => {
            use base64::Engine as _;
            Ok(Contents {
                mime_type: mime_type.unwrap_or_else(|| "application/octet-stream".into()),
                body: Body::Blob(
                    base64::engine::general_purpose::STANDARD
                        .decode(blob)
                        .unwrap_or_default(),
                ),
            })
        }
        None => Err(ContentsError::Empty),
        #[allow(unreachable_patterns)]
        Some(_) => Err(ContentsError::Unsupported),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::{ReadResourceResult, ToolAnnotations};

    fn catalog(resources: &[&str], templates: &[&str], subscribe: bool, modern: bool) -> Catalog {
        Catalog::new(
            "test",
            Vec::new(),
            resources.iter().map(|u| Resource::new(*u, "r")).collect(),
            &templates
                .iter()
                .map(|t| ResourceTemplate::new(*t, "t"))
                .collect::<Vec<_>>(),
            subscribe,
            modern,
            false,
        )
    }

    #[test]
    fn an_exact_listing_beats_a_template_which_beats_the_first_subscribable() {
        let subscribable = catalog(&[], &[], true, true);
        let templated = catalog(&[], &["memo://{name}"], false, true);
        let listing = catalog(&["memo://notes"], &[], false, true);
        let all = [subscribable.clone(), templated.clone(), listing.clone()];
        assert_eq!(route(&all, "memo://notes"), Some(2), "exact listing");
        assert_eq!(route(&all, "memo://log"), Some(1), "template");
        assert_eq!(route(&all, "file:///x"), Some(0), "first subscribable");
        // The first of equals wins.
        let two = [listing.clone(), listing];
        assert_eq!(route(&two, "memo://notes"), Some(0));
    }

    #[test]
    fn an_older_server_is_never_picked_by_the_fallback() {
        let legacy = catalog(&["legacy://thing"], &["legacy://{x}/y"], true, false);
        let modern = catalog(&[], &[], true, true);
        assert_eq!(route(&[&legacy, &modern], "memo://notes"), Some(1));
        assert_eq!(route(&[&legacy], "memo://notes"), None);
        // What it lists or templates is still routed to it (and fails there with its reason).
        assert_eq!(route(&[&modern, &legacy], "legacy://thing"), Some(1));
        assert_eq!(route(&[&modern, &legacy], "legacy://a/y"), Some(1));
    }

    #[test]
    fn no_server_routes_nothing() {
        let none: [Catalog; 0] = [];
        assert_eq!(route(&none, "memo://notes"), None);
        let unsubscribable = catalog(&["memo://notes"], &[], false, true);
        assert_eq!(route(&[unsubscribable], "memo://log"), None);
    }

    #[test]
    fn bad_templates_are_dropped_and_listing_entries_name_the_server() {
        let mut r = Resource::new("memo://notes", "notes");
        r.description = Some("All notes.\nExample: memo://notes".into());
        let c = Catalog::new(
            "http://h/mcp",
            Vec::new(),
            vec![r],
            &[
                ResourceTemplate::new("a{b", "bad"),
                ResourceTemplate::new("x://{y}", "good"),
            ],
            true,
            true,
            false,
        );
        assert_eq!(c.templates.len(), 1);
        assert_eq!(c.templates[0].0, "x://{y}");
        assert_eq!(c.listing.len(), 3, "the listing keeps every entry");
        assert_eq!(c.listing[0]["server"], "http://h/mcp");
        assert_eq!(c.listing[0]["example"], "memo://notes");
        assert_eq!(c.listing[0]["subscribable"], true);
        assert_eq!(c.listing[2]["template"], true);
    }

    #[test]
    fn read_only_needs_the_hint_and_no_destructive_hint() {
        let tool = |ro: Option<bool>, destructive: Option<bool>| {
            let mut t = Tool::new("t", "a tool", serde_json::Map::new());
            let mut a = ToolAnnotations::default();
            a.read_only_hint = ro;
            a.destructive_hint = destructive;
            t.annotations = Some(a);
            t
        };
        assert!(is_read_only(&tool(Some(true), None)));
        assert!(is_read_only(&tool(Some(true), Some(false))));
        assert!(!is_read_only(&tool(Some(true), Some(true))));
        assert!(!is_read_only(&tool(None, None)));
        assert!(!is_read_only(&Tool::new(
            "t",
            "no annotations",
            serde_json::Map::new()
        )));
        let c = Catalog {
            tools: vec![tool(Some(true), None)],
            ..Catalog::default()
        };
        assert_eq!(c.read_only("t"), Some(true));
        assert_eq!(c.read_only("u"), None);
    }

    #[test]
    fn contents_map_text_blobs_and_nothing() {
        let text = contents(ReadResourceResult::new(vec![
            ResourceContents::text("{}", "memo://notes").with_mime_type("application/json"),
        ]))
        .unwrap();
        assert_eq!(text.mime_type, "application/json");
        assert_eq!(text.body, Body::Text("{}".into()));
        let plain = contents(ReadResourceResult::new(vec![ResourceContents::text(
            "hi", "x://",
        )]))
        .unwrap();
        assert_eq!(plain.mime_type, "text/plain");
        let blob = contents(ReadResourceResult::new(vec![ResourceContents::blob(
            "aGVsbG8=", "x://",
        )]))
        .unwrap();
        assert_eq!(blob.mime_type, "application/octet-stream");
        assert_eq!(blob.body, Body::Blob(b"hello".to_vec()));
        assert_eq!(
            contents(ReadResourceResult::new(Vec::new())),
            Err(ContentsError::Empty)
        );
    }
}
