//! The six arguments of `message_posted`, each only narrowing, from an `events/poll`'s
//! `arguments` or from the query of a `slack-events://message_posted{?…}` URI. An unknown
//! argument is refused, never ignored: a dropped filter widens a trigger.

use std::collections::BTreeSet;

use rmcp::model::JsonObject;
use serde_json::Value;

use super::message::Posted;
use crate::mcp::events::encode_query_value;
use crate::mcp::source::SourceError;

/// The event type's name.
pub const MESSAGE_POSTED: &str = "message_posted";
/// The unfiltered event-log resource.
pub const EVENTS_URI: &str = "slack-events://message_posted";
/// Its template.
pub const EVENTS_TEMPLATE: &str = "slack-events://message_posted{?addressed_to_bot,channel_ids,include_dms,thread_ts,top_level_only,include_bot_authors}";

pub const ARGUMENTS: [&str; 6] = [
    "addressed_to_bot",
    "channel_ids",
    "include_dms",
    "thread_ts",
    "top_level_only",
    "include_bot_authors",
];

/// What one poll or one URI selects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageFilter {
    /// Only DMs to the bot and messages that mention it.
    pub addressed_to_bot: bool,
    /// Only these conversations.
    pub channel_ids: Option<BTreeSet<String>>,
    pub include_dms: bool,
    /// Only this thread: its parent and its replies.
    pub thread_ts: Option<String>,
    pub top_level_only: bool,
    pub include_bot_authors: bool,
}

impl Default for MessageFilter {
    fn default() -> MessageFilter {
        MessageFilter {
            addressed_to_bot: false,
            channel_ids: None,
            include_dms: true,
            thread_ts: None,
            top_level_only: false,
            include_bot_authors: true,
        }
    }
}

fn invalid(m: String) -> SourceError {
    SourceError::InvalidParams(m)
}

fn unknown(k: &str) -> SourceError {
    invalid(format!(
        "unknown argument {k}; {MESSAGE_POSTED} takes {}",
        ARGUMENTS.join(", ")
    ))
}

fn channel_list<'a>(items: impl Iterator<Item = &'a str>) -> Result<BTreeSet<String>, SourceError> {
    let set: BTreeSet<String> = items
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    if set.is_empty() {
        return Err(invalid(
            "channel_ids is empty; name at least one conversation id (e.g. C0123ABCD), or leave it out"
                .into(),
        ));
    }
    Ok(set)
}

impl MessageFilter {
    /// From `events/poll` arguments. `channel_ids` is an array of ids or one comma-separated
    /// string; the booleans are JSON booleans.
    pub fn from_arguments(args: &JsonObject) -> Result<MessageFilter, SourceError> {
        let mut f = MessageFilter::default();
        for (k, v) in args {
            if v.is_null() {
                if !ARGUMENTS.contains(&k.as_str()) {
                    return Err(unknown(k));
                }
                continue;
            }
            let flag = || {
                v.as_bool()
                    .ok_or_else(|| invalid(format!("argument {k} must be true or false, got {v}")))
            };
            match k.as_str() {
                "addressed_to_bot" => f.addressed_to_bot = flag()?,
                "include_dms" => f.include_dms = flag()?,
                "top_level_only" => f.top_level_only = flag()?,
                "include_bot_authors" => f.include_bot_authors = flag()?,
                "thread_ts" => {
                    f.thread_ts = Some(
                        v.as_str()
                            .filter(|s| !s.is_empty())
                            .ok_or_else(|| {
                                invalid(format!("argument thread_ts must be a Slack ts string such as \"1700000000.000100\", got {v}"))
                            })?
                            .to_owned(),
                    )
                }
                "channel_ids" => {
                    f.channel_ids = Some(match v {
                        Value::String(s) => channel_list(s.split(','))?,
                        Value::Array(a) => {
                            let ids: Option<Vec<&str>> = a.iter().map(Value::as_str).collect();
                            channel_list(
                                ids.ok_or_else(|| {
                                    invalid("channel_ids must be strings (conversation ids)".into())
                                })?
                                .into_iter(),
                            )?
                        }
                        _ => {
                            return Err(invalid(format!(
                                "argument channel_ids must be an array of conversation ids or a comma-separated string, got {v}"
                            )));
                        }
                    })
                }
                _ => return Err(unknown(k)),
            }
        }
        Ok(f)
    }

    /// From a `slack-events://message_posted[?…]` URI; anything else is not this source's.
    pub fn from_uri(uri: &str) -> Result<MessageFilter, SourceError> {
        let rest = uri
            .strip_prefix(EVENTS_URI)
            .ok_or_else(|| SourceError::NotFound {
                uri: uri.to_owned(),
            })?;
        let query = match rest {
            "" => return Ok(MessageFilter::default()),
            q if q.starts_with('?') => &q[1..],
            _ => {
                return Err(SourceError::NotFound {
                    uri: uri.to_owned(),
                });
            }
        };
        let mut args = JsonObject::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let v = decode(v).ok_or_else(|| invalid(format!("bad percent-encoding in {uri}")))?;
            if args.contains_key(k) {
                return Err(invalid(format!("{k} is given twice in {uri}")));
            }
            let value = match k {
                "addressed_to_bot" | "include_dms" | "top_level_only" | "include_bot_authors" => {
                    match v.as_str() {
                        "true" => Value::Bool(true),
                        "false" => Value::Bool(false),
                        _ => {
                            return Err(invalid(format!(
                                "{k} must be true or false in {uri}, got {v:?}"
                            )));
                        }
                    }
                }
                _ => Value::String(v),
            };
            args.insert(k.to_owned(), value);
        }
        MessageFilter::from_arguments(&args)
    }

    /// The canonical URI of this filter: arguments in a fixed order, defaults left out, so
    /// two spellings of one filter share one feed key.
    pub fn uri(&self) -> String {
        let mut q: Vec<String> = Vec::new();
        if self.addressed_to_bot {
            q.push("addressed_to_bot=true".into());
        }
        if let Some(ids) = &self.channel_ids {
            let ids: Vec<String> = ids.iter().map(|i| encode_query_value(i)).collect();
            q.push(format!("channel_ids={}", ids.join(",")));
        }
        if !self.include_dms {
            q.push("include_dms=false".into());
        }
        if let Some(t) = &self.thread_ts {
            q.push(format!("thread_ts={}", encode_query_value(t)));
        }
        if self.top_level_only {
            q.push("top_level_only=true".into());
        }
        if !self.include_bot_authors {
            q.push("include_bot_authors=false".into());
        }
        if q.is_empty() {
            EVENTS_URI.to_owned()
        } else {
            format!("{EVENTS_URI}?{}", q.join("&"))
        }
    }

    /// Whether `p` passes every argument.
    pub fn matches(&self, p: &Posted) -> bool {
        (!self.addressed_to_bot || p.is_dm || p.mentions_bot)
            && self
                .channel_ids
                .as_ref()
                .is_none_or(|ids| ids.contains(&p.channel_id))
            && (self.include_dms || !p.is_dm)
            && self
                .thread_ts
                .as_ref()
                .is_none_or(|t| p.ts == *t || p.thread_ts.as_ref() == Some(t))
            && (!self.top_level_only || p.thread_ts.is_none())
            && (self.include_bot_authors || !p.by_bot())
    }
}

/// Percent-decodes a query value (`+` stays `+`: Slack ts values never hold one).
fn decode(v: &str) -> Option<String> {
    let b = v.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let h = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(h, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn p(channel: &str, ts: &str, thread: Option<&str>) -> Posted {
        Posted {
            channel_id: channel.into(),
            channel_type: if channel.starts_with('D') {
                "im"
            } else {
                "channel"
            }
            .into(),
            ts: ts.into(),
            thread_ts: thread.map(Into::into),
            user_id: Some("U1".into()),
            bot_id: None,
            username: None,
            is_dm: channel.starts_with('D'),
            mentions_bot: false,
            permalink: String::new(),
            text: String::new(),
        }
    }

    fn args(v: serde_json::Value) -> JsonObject {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn each_argument_narrows() {
        let top = p("C1", "1.0", None);
        let reply = p("C1", "2.0", Some("1.0"));
        let dm = p("D1", "3.0", None);
        let mut mention = p("C2", "4.0", None);
        mention.mentions_bot = true;
        let mut bot = p("C2", "5.0", None);
        bot.bot_id = Some("B1".into());
        let all = [&top, &reply, &dm, &mention, &bot];
        let pick = |a: serde_json::Value| -> Vec<String> {
            let f = MessageFilter::from_arguments(&args(a)).unwrap();
            all.iter()
                .filter(|m| f.matches(m))
                .map(|m| m.ts.clone())
                .collect()
        };
        assert_eq!(pick(json!({})).len(), 5);
        assert_eq!(pick(json!({"addressed_to_bot": true})), ["3.0", "4.0"]);
        assert_eq!(pick(json!({"channel_ids": ["C2"]})), ["4.0", "5.0"]);
        assert_eq!(
            pick(json!({"channel_ids": "C1, D1"})),
            ["1.0", "2.0", "3.0"]
        );
        assert_eq!(pick(json!({"include_dms": false})).len(), 4);
        assert_eq!(pick(json!({"thread_ts": "1.0"})), ["1.0", "2.0"]);
        assert_eq!(pick(json!({"top_level_only": true})).len(), 4);
        assert_eq!(pick(json!({"include_bot_authors": false})).len(), 4);
        assert_eq!(
            pick(json!({"addressed_to_bot": false, "include_dms": true})).len(),
            5
        );
    }

    #[test]
    fn bad_arguments_are_refused_by_name() {
        for (a, says) in [
            (json!({"channel": "C1"}), "unknown argument channel"),
            (
                json!({"include_dms": "no"}),
                "include_dms must be true or false",
            ),
            (json!({"channel_ids": 5}), "channel_ids must be"),
            (json!({"channel_ids": []}), "channel_ids is empty"),
            (json!({"thread_ts": 1.5}), "thread_ts must be"),
        ] {
            let e = MessageFilter::from_arguments(&args(a)).unwrap_err();
            assert!(matches!(e, SourceError::InvalidParams(_)));
            assert!(e.to_string().contains(says), "{e}");
        }
    }

    #[test]
    fn uris_parse_and_print_canonically() {
        let f = MessageFilter::from_uri(
            "slack-events://message_posted?include_dms=false&channel_ids=C2,C1&thread_ts=1.0",
        )
        .unwrap();
        assert_eq!(
            f.uri(),
            "slack-events://message_posted?channel_ids=C1,C2&include_dms=false&thread_ts=1.0"
        );
        assert_eq!(MessageFilter::from_uri(&f.uri()).unwrap(), f);
        assert_eq!(
            MessageFilter::from_uri(EVENTS_URI).unwrap(),
            MessageFilter::default()
        );
        assert!(matches!(
            MessageFilter::from_uri("slack-events://other"),
            Err(SourceError::NotFound { .. })
        ));
        assert!(MessageFilter::from_uri("slack-events://message_posted?nope=1").is_err());
        assert!(
            MessageFilter::from_uri("slack-events://message_posted?top_level_only=yes").is_err()
        );
        assert!(
            MessageFilter::from_uri(
                "slack-events://message_posted?include_dms=true&include_dms=false"
            )
            .is_err()
        );
    }
}
