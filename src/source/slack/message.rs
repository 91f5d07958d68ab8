//! A Slack message as the `message_posted` event (reference 002's payload, field for field),
//! and what is never one: the bot's own posts, edits, deletes, joins, topic changes, every
//! hidden subtype, group DMs. The same conversion serves Socket Mode envelopes and backfilled
//! history, so a message reads the same however it arrived.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Longest `text` kept, in characters.
pub const MAX_TEXT_CHARS: usize = 4_000;

/// Subtypes that are a message being posted. Every other subtype (edits, deletes, joins,
/// topic and purpose changes, pins, …) is not.
const POSTED_SUBTYPES: [&str; 4] = [
    "bot_message",
    "thread_broadcast",
    "file_share",
    "me_message",
];

/// Who the bot is and where its workspace lives (from `auth.test`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BotIdentity {
    pub user_id: String,
    /// The workspace (`T…`): on NATS it names the shared stream.
    pub team_id: String,
    pub bot_id: Option<String>,
    /// `https://team.slack.com/`: permalinks are built from it, with no API call.
    pub workspace_url: String,
}

/// One `message_posted` event's payload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Posted {
    pub channel_id: String,
    /// `channel`, `group` (a private channel) or `im`.
    pub channel_type: String,
    pub ts: String,
    /// Present on a thread reply only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_ts: Option<String>,
    /// Absent on a bot or integration post.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bot_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    pub is_dm: bool,
    pub mentions_bot: bool,
    pub permalink: String,
    pub text: String,
}

impl Posted {
    /// `slack:<channel_id>:<ts>`: the event id and the dedupe key.
    pub fn event_id(&self) -> String {
        format!("slack:{}:{}", self.channel_id, self.ts)
    }

    /// When it was posted, in milliseconds since the epoch (from `ts`).
    pub fn posted_ms(&self) -> u64 {
        ts_ms(&self.ts)
    }

    /// A bot or integration post.
    pub fn by_bot(&self) -> bool {
        self.bot_id.is_some()
    }
}

/// A Slack `ts` (`"1700000000.000100"`) in milliseconds since the epoch; 0 if malformed.
pub fn ts_ms(ts: &str) -> u64 {
    let (secs, frac) = ts.split_once('.').unwrap_or((ts, ""));
    let secs: u64 = secs.parse().unwrap_or(0);
    let millis: u64 = frac
        .get(..3.min(frac.len()))
        .and_then(|f| format!("{f:0<3}").parse().ok())
        .unwrap_or(0);
    secs * 1000 + millis
}

/// A time in milliseconds since the epoch as a Slack `ts` (for `oldest`).
pub fn ms_ts(ms: u64) -> String {
    format!("{}.{:06}", ms / 1000, (ms % 1000) * 1000)
}

/// The conversation type Slack names in an event (`channel_type`) or a listing entry.
pub fn conversation_type(c: &Value) -> &'static str {
    if c.get("is_im").and_then(Value::as_bool) == Some(true) {
        "im"
    } else if c.get("is_mpim").and_then(Value::as_bool) == Some(true) {
        "mpim"
    } else if c.get("is_private").and_then(Value::as_bool) == Some(true)
        || c.get("is_group").and_then(Value::as_bool) == Some(true)
    {
        "group"
    } else {
        "channel"
    }
}

fn s<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str).filter(|s| !s.is_empty())
}

/// The event for `msg` (a Socket Mode `event` or a history entry) in `channel_id`, whose type
/// is `channel_type`; `None` for everything that is not a message being posted.
pub fn posted(
    channel_id: &str,
    channel_type: &str,
    msg: &Value,
    bot: &BotIdentity,
) -> Option<Posted> {
    if s(msg, "type").is_some_and(|t| t != "message") {
        return None;
    }
    if msg.get("hidden").and_then(Value::as_bool) == Some(true) {
        return None;
    }
    if let Some(sub) = s(msg, "subtype")
        && !POSTED_SUBTYPES.contains(&sub)
    {
        return None;
    }
    let channel_type = match channel_type {
        "channel" | "group" | "im" => channel_type,
        // Group DMs, and anything Slack may add later, are not events.
        _ => return None,
    };
    let ts = s(msg, "ts")?;
    let user = s(msg, "user");
    let bot_id = s(msg, "bot_id");
    let own = user.is_some_and(|u| u == bot.user_id)
        || bot_id.is_some_and(|b| bot.bot_id.as_deref() == Some(b));
    if own {
        return None;
    }
    let thread_ts = s(msg, "thread_ts").filter(|t| *t != ts).map(str::to_owned);
    let text = s(msg, "text").unwrap_or("");
    let mention = format!("<@{}", bot.user_id);
    let mentions_bot = !bot.user_id.is_empty()
        && text
            .match_indices(&mention)
            .any(|(i, _)| matches!(text.as_bytes().get(i + mention.len()), Some(b'>' | b'|')));
    let username = bot_id.and(
        s(msg, "username")
            .or_else(|| msg.get("bot_profile").and_then(|p| s(p, "name")))
            .map(str::to_owned),
    );
    Some(Posted {
        channel_id: channel_id.to_owned(),
        channel_type: channel_type.to_owned(),
        ts: ts.to_owned(),
        permalink: permalink(&bot.workspace_url, channel_id, ts, thread_ts.as_deref()),
        thread_ts,
        user_id: if bot_id.is_some() {
            None
        } else {
            user.map(str::to_owned)
        },
        bot_id: bot_id.map(str::to_owned),
        username,
        is_dm: channel_type == "im",
        mentions_bot,
        text: cut(text),
    })
}

/// `text` cut to [`MAX_TEXT_CHARS`] characters.
fn cut(text: &str) -> String {
    match text.char_indices().nth(MAX_TEXT_CHARS) {
        Some((at, _)) => text[..at].to_owned(),
        None => text.to_owned(),
    }
}

/// A message's permalink, as Slack's `chat.getPermalink` builds it: the workspace URL,
/// `archives/<channel>/p<ts without the dot>`, and for a reply `?thread_ts=…&cid=<channel>`.
pub fn permalink(workspace_url: &str, channel: &str, ts: &str, thread_ts: Option<&str>) -> String {
    let base = workspace_url.trim_end_matches('/');
    let p: String = ts.chars().filter(|c| *c != '.').collect();
    match thread_ts {
        Some(t) => format!("{base}/archives/{channel}/p{p}?thread_ts={t}&cid={channel}"),
        None => format!("{base}/archives/{channel}/p{p}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn bot() -> BotIdentity {
        BotIdentity {
            user_id: "UBOT".into(),
            team_id: "T1".into(),
            bot_id: Some("BBOT".into()),
            workspace_url: "https://team.slack.com/".into(),
        }
    }

    #[test]
    fn a_post_has_every_field_of_the_payload() {
        let m = json!({"type":"message","user":"U1","text":"hi <@UBOT> there","ts":"1700000000.000100"});
        let p = posted("C1", "channel", &m, &bot()).unwrap();
        assert_eq!(
            serde_json::to_value(&p).unwrap(),
            json!({
                "channel_id": "C1", "channel_type": "channel", "ts": "1700000000.000100",
                "user_id": "U1", "is_dm": false, "mentions_bot": true,
                "permalink": "https://team.slack.com/archives/C1/p1700000000000100",
                "text": "hi <@UBOT> there"
            })
        );
        assert_eq!(p.event_id(), "slack:C1:1700000000.000100");
        assert_eq!(p.posted_ms(), 1_700_000_000_000);
    }

    #[test]
    fn replies_bots_and_dms() {
        let reply =
            json!({"type":"message","user":"U1","text":"r","ts":"2.000200","thread_ts":"1.000100"});
        let p = posted("C1", "group", &reply, &bot()).unwrap();
        assert_eq!(p.thread_ts.as_deref(), Some("1.000100"));
        assert_eq!(
            p.permalink,
            "https://team.slack.com/archives/C1/p2000200?thread_ts=1.000100&cid=C1"
        );
        let parent = json!({"type":"message","user":"U1","text":"p","ts":"1.000100","thread_ts":"1.000100","reply_count":3});
        assert_eq!(
            posted("C1", "channel", &parent, &bot()).unwrap().thread_ts,
            None
        );
        let b = json!({"type":"message","subtype":"bot_message","bot_id":"B9","username":"ci","text":"built","ts":"3.000000"});
        let p = posted("D1", "im", &b, &bot()).unwrap();
        assert_eq!(
            (p.user_id, p.bot_id.as_deref(), p.username.as_deref()),
            (None, Some("B9"), Some("ci"))
        );
        assert!(p.is_dm);
        let m = json!({"type":"message","user":"U1","text":"<@UBOT|bot> and <@UBOTX>","ts":"4.0"});
        assert!(posted("C1", "channel", &m, &bot()).unwrap().mentions_bot);
        let m = json!({"type":"message","user":"U1","text":"<@UBOTX>","ts":"4.0"});
        assert!(!posted("C1", "channel", &m, &bot()).unwrap().mentions_bot);
    }

    #[test]
    fn what_is_never_an_event() {
        let b = bot();
        let own_user = json!({"type":"message","user":"UBOT","text":"x","ts":"1.0"});
        let own_bot = json!({"type":"message","bot_id":"BBOT","text":"x","ts":"1.0"});
        let edit = json!({"type":"message","subtype":"message_changed","hidden":true,"ts":"1.0"});
        let delete = json!({"type":"message","subtype":"message_deleted","ts":"1.0"});
        let join = json!({"type":"message","subtype":"channel_join","user":"U1","ts":"1.0"});
        let topic = json!({"type":"message","subtype":"channel_topic","user":"U1","ts":"1.0"});
        let hidden = json!({"type":"message","user":"U1","hidden":true,"ts":"1.0"});
        for m in [own_user, own_bot, edit, delete, join, topic, hidden] {
            assert_eq!(posted("C1", "channel", &m, &b), None, "{m}");
        }
        let plain = json!({"type":"message","user":"U1","text":"x","ts":"1.0"});
        assert_eq!(
            posted("G1", "mpim", &plain, &b),
            None,
            "group DMs are not events"
        );
        assert_eq!(
            posted("C1", "channel", &json!({"type":"message","user":"U1"}), &b),
            None
        );
    }

    #[test]
    fn text_is_cut_to_4000_characters() {
        let long = "é".repeat(5_000);
        let m = json!({"type":"message","user":"U1","text":long,"ts":"1.0"});
        assert_eq!(
            posted("C1", "channel", &m, &bot())
                .unwrap()
                .text
                .chars()
                .count(),
            4_000
        );
    }

    #[test]
    fn ts_round_trips_through_milliseconds() {
        assert_eq!(ts_ms("1700000000.123456"), 1_700_000_000_123);
        assert_eq!(ts_ms("5"), 5_000);
        assert_eq!(ms_ts(1_700_000_000_123), "1700000000.123000");
        assert_eq!(ts_ms("junk"), 0);
    }
}
