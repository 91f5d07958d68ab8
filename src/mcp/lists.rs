//! `toolsListChanged` and `promptsListChanged` on a `subscriptions/listen`: what a listen
//! asks, what admission accepts, how the acknowledgment echoes it, and the notification each
//! one delivers.
//!
//! A source whose tool and prompt lists change declares it
//! ([`SourceInfo::list_changed`](crate::mcp::source::SourceInfo::list_changed): the server
//! then advertises `tools.listChanged` and `prompts.listChanged`) and publishes
//! [`TOOLS_CHANGED`] / [`PROMPTS_CHANGED`] on its change feed. A listen that asked for a list
//! on such a server is registered with the hub under that key, beside its URIs' keys, so the
//! same pending set carries it (coalesced, bounded) and the same delivery loop writes it
//! ([`ListenOut::list_changed`](crate::mcp::listen::ListenOut::list_changed)). Admission
//! accepts a list only when the server advertises its `listChanged`; otherwise the
//! acknowledgment leaves it out.
//! (`resourcesListChanged` is never accepted: no source's resource list announces changes.)

use rmcp::model::{ErrorData as McpError, ServerCapabilities, SubscriptionFilter};
use serde_json::{Map, Value, json};

/// The feed key a source publishes when its tool list changed: listens that asked for
/// `toolsListChanged` get `notifications/tools/list_changed`.
pub const TOOLS_CHANGED: &str = "herald:list/tools";
/// The feed key for a changed prompt list (`promptsListChanged`).
pub const PROMPTS_CHANGED: &str = "herald:list/prompts";

/// A list whose changes a listen may ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum List {
    Tools,
    Prompts,
}

impl List {
    pub const ALL: [List; 2] = [List::Tools, List::Prompts];

    /// The feed key a source publishes when this list changed.
    pub fn key(self) -> &'static str {
        match self {
            List::Tools => TOOLS_CHANGED,
            List::Prompts => PROMPTS_CHANGED,
        }
    }

    /// The `subscriptions/listen` filter field that asks for it.
    pub fn field(self) -> &'static str {
        match self {
            List::Tools => "toolsListChanged",
            List::Prompts => "promptsListChanged",
        }
    }

    /// The notification a listen that asked for it receives.
    pub fn method(self) -> &'static str {
        match self {
            List::Tools => "notifications/tools/list_changed",
            List::Prompts => "notifications/prompts/list_changed",
        }
    }

    /// The notification on subscription `id` (a JSON value, as `_meta` carries it), as
    /// herald's own SSE writers send it.
    pub fn notification(self, id: &Value) -> Value {
        json!({"jsonrpc": "2.0", "method": self.method(),
            "params": {"_meta": {"io.modelcontextprotocol/subscriptionId": id}}})
    }
}

/// Which lists a listen asks for, or was accepted for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Lists {
    pub tools: bool,
    pub prompts: bool,
}

impl Lists {
    /// Whether `list` is among them.
    pub fn has(self, list: List) -> bool {
        match list {
            List::Tools => self.tools,
            List::Prompts => self.prompts,
        }
    }

    /// The lists named in a listen's `notifications` object. `true` asks; `false`, `null`
    /// and absence do not; anything else is `-32602` naming the field.
    pub fn from_notifications(n: &Map<String, Value>) -> Result<Lists, McpError> {
        let flag = |list: List| match n.get(list.field()) {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err(McpError::invalid_params(
                format!(
                    "subscriptions/listen notifications.{} must be a boolean",
                    list.field()
                ),
                Some(json!({"field": list.field()})),
            )),
        };
        Ok(Lists {
            tools: flag(List::Tools)?,
            prompts: flag(List::Prompts)?,
        })
    }

    /// The lists in the filter rmcp parsed (byte streams).
    pub fn from_rmcp(f: &SubscriptionFilter) -> Lists {
        Lists {
            tools: f.tools_list_changed == Some(true),
            prompts: f.prompts_list_changed == Some(true),
        }
    }

    /// What a server advertising `caps` accepts of these: each list whose `listChanged` it
    /// advertises (as rmcp's `supported_by` reads them), so the acknowledgment never names
    /// one the server does not announce.
    pub fn accepted(self, caps: &ServerCapabilities) -> Lists {
        Lists {
            tools: self.tools
                && caps
                    .tools
                    .as_ref()
                    .is_some_and(|t| t.list_changed == Some(true)),
            prompts: self.prompts
                && caps
                    .prompts
                    .as_ref()
                    .is_some_and(|p| p.list_changed == Some(true)),
        }
    }

    /// The feed keys to register a listen under.
    pub fn keys(self) -> impl Iterator<Item = &'static str> {
        List::ALL
            .into_iter()
            .filter(move |l| self.has(*l))
            .map(List::key)
    }

    /// Sets a typed filter's list fields to these (rmcp acknowledges what the request names).
    pub fn narrow(self, f: &mut SubscriptionFilter) {
        f.tools_list_changed = self.tools.then_some(true);
        f.prompts_list_changed = self.prompts.then_some(true);
    }

    /// Adds these to an acknowledgment's `notifications` object (`true` fields only, as rmcp
    /// writes them).
    pub fn echo(self, notifications: &mut Map<String, Value>) {
        for list in List::ALL.into_iter().filter(|l| self.has(*l)) {
            notifications.insert(list.field().into(), Value::Bool(true));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: Value) -> Result<Lists, McpError> {
        Lists::from_notifications(v.as_object().unwrap())
    }

    #[test]
    fn a_listen_asks_for_a_list_with_true_only() {
        assert_eq!(
            parse(json!({"toolsListChanged": true})).unwrap(),
            Lists {
                tools: true,
                prompts: false
            }
        );
        assert_eq!(
            parse(json!({"toolsListChanged": false, "promptsListChanged": null})).unwrap(),
            Lists::default()
        );
        let e = parse(json!({"promptsListChanged": "yes"})).unwrap_err();
        assert_eq!(e.code.0, -32602);
        assert!(e.message.contains("promptsListChanged"), "{}", e.message);
    }

    #[test]
    fn only_a_server_whose_lists_change_accepts_them() {
        let both = Lists {
            tools: true,
            prompts: true,
        };
        let still = ServerCapabilities::builder()
            .enable_tools()
            .enable_prompts()
            .build();
        assert_eq!(both.accepted(&still), Lists::default());
        assert_eq!(both.accepted(&still).keys().count(), 0);
        let changing = ServerCapabilities::builder()
            .enable_tools()
            .enable_tool_list_changed()
            .enable_prompts()
            .enable_prompts_list_changed()
            .build();
        assert_eq!(
            both.accepted(&changing).keys().collect::<Vec<_>>(),
            vec![TOOLS_CHANGED, PROMPTS_CHANGED]
        );
        let mut echoed = Map::new();
        both.accepted(&changing).echo(&mut echoed);
        assert_eq!(
            Value::Object(echoed),
            json!({"toolsListChanged": true, "promptsListChanged": true})
        );
    }
}
