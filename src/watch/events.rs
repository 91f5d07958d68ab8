//! Turning reads into events: the state diff (lists by item key, objects by top-level key,
//! anything else as whole text). Event-log delivery by `seq` with `GAP` (and `changed`) lives
//! with the client, in [`crate::upstream::log`], shared with the agent's inbox; it is
//! re-exported here.
//!
//! Pure functions over JSON; the watch manager owns the previous read and the last seq.
//! Events are JSON objects shaped as the filter's `event` dict (without `watch` / `uri`, which
//! the manager adds).

use crate::upstream::log::{Event, changed_paths};
use std::collections::HashMap;
use std::ops::Range;

use serde_json::Value;

use crate::watch::raw::{Layout, layout};

/// A state read: JSON when it parses, else text.
#[derive(Debug, Clone, PartialEq)]
pub enum StateDoc {
    Json(Value),
    Text(String),
}

impl StateDoc {
    pub fn from_text(text: &str) -> StateDoc {
        match serde_json::from_str(text) {
            Ok(v) => StateDoc::Json(v),
            Err(_) => StateDoc::Text(text.to_owned()),
        }
    }
}

/// The key of a list item: the first present of `metadata.uid`, `uid`, `id`, `metadata.name`,
/// `name`; otherwise the whole item as compact JSON.
pub fn item_key(item: &Value) -> String {
    item_key_ref(item).into_owned()
}

/// [`item_key`] without copying when the key is a string field. Lookups stop at the first
/// key found: this runs once per item of every read.
fn item_key_ref(item: &Value) -> std::borrow::Cow<'_, str> {
    use std::borrow::Cow;
    fn scalar(v: Option<&Value>) -> Option<std::borrow::Cow<'_, str>> {
        match v? {
            Value::String(s) => Some(std::borrow::Cow::Borrowed(s.as_str())),
            Value::Number(n) => Some(std::borrow::Cow::Owned(n.to_string())),
            _ => None,
        }
    }
    let Value::Object(obj) = item else {
        return Cow::Owned(item.to_string());
    };
    let meta = obj.get("metadata").and_then(Value::as_object);
    if let Some(k) = scalar(meta.and_then(|m| m.get("uid")))
        .or_else(|| scalar(obj.get("uid")))
        .or_else(|| scalar(obj.get("id")))
    {
        return k;
    }
    if let Some(m) = meta
        && let Some(name) = scalar(m.get("name"))
    {
        // A name is only unique within its namespace.
        return match m.get("namespace").and_then(Value::as_str) {
            Some(ns) => Cow::Owned(format!("{ns}/{name}")),
            None => name,
        };
    }
    scalar(obj.get("name")).unwrap_or_else(|| Cow::Owned(item.to_string()))
}

/// Looks up a dotted path (`""` is the value itself).
pub fn at_path<'a>(v: &'a Value, path: &str) -> Option<&'a Value> {
    if path.is_empty() {
        return Some(v);
    }
    path.split('.').try_fold(v, |cur, k| cur.get(k))
}

fn modified(key: &str, old: &Value, new: &Value) -> Option<Event> {
    let changed = changed_paths(old, new);
    if changed.is_empty() {
        // A no-op MODIFIED (only bookkeeping changed) is dropped before any filter.
        return None;
    }
    let mut e = Event::new();
    e.insert("type".into(), "MODIFIED".into());
    e.insert("key".into(), key.into());
    e.insert("old".into(), old.clone());
    e.insert("new".into(), new.clone());
    e.insert("item".into(), new.clone());
    e.insert(
        "changed".into(),
        changed.into_iter().map(Value::from).collect(),
    );
    Some(e)
}

fn added_or_deleted(kind: &str, key: &str, item: &Value) -> Event {
    let mut e = Event::new();
    e.insert("type".into(), kind.into());
    e.insert("key".into(), key.into());
    e.insert("item".into(), item.clone());
    if kind == "ADDED" {
        e.insert("new".into(), item.clone());
    }
    e.insert("old".into(), Value::Null);
    e
}

/// Diffs two state reads.
pub fn diff_state(old: &StateDoc, new: &StateDoc) -> Vec<Event> {
    match (old, new) {
        (StateDoc::Json(Value::Array(a)), StateDoc::Json(Value::Array(b))) => {
            diff_keyed(&keyed(a), &keyed(b))
        }
        (StateDoc::Json(Value::Object(a)), StateDoc::Json(Value::Object(b))) => diff_keyed(
            &a.iter().map(|(k, v)| (k.clone(), v)).collect::<Vec<_>>(),
            &b.iter().map(|(k, v)| (k.clone(), v)).collect::<Vec<_>>(),
        ),
        _ if old == new => Vec::new(),
        _ => {
            let text = |d: &StateDoc| match d {
                StateDoc::Json(v) => Value::from(v.to_string()),
                StateDoc::Text(t) => Value::from(t.as_str()),
            };
            let mut e = Event::new();
            e.insert("type".into(), "CHANGED".into());
            e.insert("old".into(), text(old));
            e.insert("new".into(), text(new));
            vec![e]
        }
    }
}

fn keyed(items: &[Value]) -> Vec<(std::borrow::Cow<'_, str>, &Value)> {
    items.iter().map(|i| (item_key_ref(i), i)).collect()
}

/// Keyed diff over borrowed items: only the items that changed are cloned (into events).
/// One hash map (of the old side); what is left in it after the new side is the deletions.
fn diff_keyed<K: AsRef<str>>(old: &[(K, &Value)], new: &[(K, &Value)]) -> Vec<Event> {
    let mut old_index: HashMap<&str, (usize, &Value)> = old
        .iter()
        .enumerate()
        .map(|(i, (k, v))| (k.as_ref(), (i, *v)))
        .collect();
    let mut out = Vec::new();
    for (k, v) in new {
        let k = k.as_ref();
        match old_index.remove(k) {
            None => out.push(added_or_deleted("ADDED", k, v)),
            Some((_, o)) if o != *v => out.extend(modified(k, o, v)),
            Some(_) => {}
        }
    }
    let mut deleted: Vec<(usize, &str, &Value)> =
        old_index.into_iter().map(|(k, (i, v))| (i, k, v)).collect();
    deleted.sort_by_key(|d| d.0);
    for (_, k, v) in deleted {
        out.push(added_or_deleted("DELETED", k, v));
    }
    out
}

/// A state read kept as the baseline for the next diff: the text and, for arrays and objects,
/// the byte ranges of its items ([`crate::watch::raw`]). No JSON tree is kept.
#[derive(Debug, Clone)]
pub struct StateBase {
    text: String,
    layout: Option<Layout>,
}

impl StateBase {
    pub fn new(text: String) -> StateBase {
        let layout = layout(&text);
        StateBase { text, layout }
    }

    pub fn text(&self) -> &str {
        &self.text
    }
}

fn parse_slices<'a>(
    text: &'a str,
    ranges: impl Iterator<Item = &'a Range<usize>>,
) -> Option<Vec<Value>> {
    ranges
        .map(|r| serde_json::from_str(&text[r.clone()]).ok())
        .collect()
}

/// Diffs the last read against a new one with the same result as [`diff_state`], parsing only
/// the items whose bytes changed: unchanged items cost a byte comparison, not a tree.
pub fn diff_reads(old: &StateBase, new: &StateBase) -> Vec<Event> {
    if old.text == new.text {
        return Vec::new();
    }
    match (&old.layout, &new.layout) {
        (Some(Layout::Array(a)), Some(Layout::Array(b))) => {
            let (ot, nt) = (&old.text, &new.text);
            let same = |x: &Range<usize>, y: &Range<usize>| ot[x.clone()] == nt[y.clone()];
            // Positions whose bytes differ. Same length: compare position by position (edits in
            // place, the common case). Otherwise: trim the common prefix and suffix.
            let (dirty_old, dirty_new): (Vec<&Range<usize>>, Vec<&Range<usize>>) =
                if a.len() == b.len() {
                    a.iter().zip(b).filter(|(x, y)| !same(x, y)).unzip()
                } else {
                    let prefix = a.iter().zip(b).take_while(|(x, y)| same(x, y)).count();
                    let room = a.len().min(b.len()) - prefix;
                    let suffix = a
                        .iter()
                        .rev()
                        .zip(b.iter().rev())
                        .take(room)
                        .take_while(|(x, y)| same(x, y))
                        .count();
                    (
                        a[prefix..a.len() - suffix].iter().collect(),
                        b[prefix..b.len() - suffix].iter().collect(),
                    )
                };
            match (
                parse_slices(ot, dirty_old.into_iter()),
                parse_slices(nt, dirty_new.into_iter()),
            ) {
                (Some(o), Some(n)) => diff_keyed(&keyed(&o), &keyed(&n)),
                _ => diff_parsed(old, new),
            }
        }
        (Some(Layout::Object(a)), Some(Layout::Object(b))) => {
            let (ot, nt) = (&old.text, &new.text);
            let mut old_members: HashMap<&str, (usize, &Range<usize>)> = a
                .iter()
                .enumerate()
                .map(|(i, (k, v))| (&ot[k.clone()], (i, v)))
                .collect();
            let mut changed_old = Vec::new();
            let mut changed_new = Vec::new();
            for (k, v) in b {
                let key = &nt[k.clone()];
                match old_members.remove(key) {
                    Some((_, ov)) if ot[ov.clone()] == nt[v.clone()] => {}
                    Some((i, ov)) => {
                        changed_old.push((i, key, ov));
                        changed_new.push((key, v));
                    }
                    None => changed_new.push((key, v)),
                }
            }
            let mut gone: Vec<(usize, &str, &Range<usize>)> = old_members
                .into_iter()
                .map(|(k, (i, v))| (i, k, v))
                .collect();
            gone.sort_by_key(|g| g.0);
            changed_old.extend(gone);
            changed_old.sort_by_key(|c| c.0);
            let unquote = |raw: &str| serde_json::from_str::<String>(raw).ok();
            let parse = |text: &str, raw_key: &str, r: &Range<usize>| -> Option<(String, Value)> {
                Some((
                    unquote(raw_key)?,
                    serde_json::from_str(&text[r.clone()]).ok()?,
                ))
            };
            let o: Option<Vec<(String, Value)>> = changed_old
                .iter()
                .map(|(_, k, v)| parse(ot, k, v))
                .collect();
            let n: Option<Vec<(String, Value)>> =
                changed_new.iter().map(|(k, v)| parse(nt, k, v)).collect();
            match (o, n) {
                (Some(o), Some(n)) => diff_keyed(
                    &o.iter().map(|(k, v)| (k.as_str(), v)).collect::<Vec<_>>(),
                    &n.iter().map(|(k, v)| (k.as_str(), v)).collect::<Vec<_>>(),
                ),
                _ => diff_parsed(old, new),
            }
        }
        _ => diff_parsed(old, new),
    }
}

/// The general path: parse both reads (JSON when they parse, else text) and diff.
fn diff_parsed(old: &StateBase, new: &StateBase) -> Vec<Event> {
    diff_state(
        &StateDoc::from_text(&old.text),
        &StateDoc::from_text(&new.text),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::log::{LogCursor, extract_log, extract_log_text};
    use serde_json::Map;
    use serde_json::json;

    fn types(evs: &[Event]) -> Vec<(String, String)> {
        evs.iter()
            .map(|e| {
                (
                    e["type"].as_str().unwrap().to_owned(),
                    e.get("key")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_owned(),
                )
            })
            .collect()
    }

    /// `diff_reads` (raw, parsing only changed items) must say exactly what `diff_state`
    /// (whole trees) says, for edits in place, insertions, deletions, reorders, and objects.
    #[test]
    fn raw_diff_agrees_with_the_tree_diff() {
        let mut seed = 7u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for round in 0..400 {
            let n = (next() % 12) as usize;
            let item =
                |i: u64, v: u64| json!({"id": format!("i{i}"), "v": v, "tags": ["a", v % 3]});
            let old: Vec<Value> = (0..n as u64).map(|i| item(i, 0)).collect();
            let mut new = old.clone();
            for _ in 0..(next() % 4) {
                let len = new.len() as u64;
                match next() % 4 {
                    0 if len > 0 => {
                        let i = (next() % len) as usize;
                        new[i]["v"] = json!(next() % 5);
                    }
                    1 => {
                        let at = (next() % (len + 1)) as usize;
                        new.insert(at, item(100 + next() % 50, 1));
                    }
                    2 if len > 0 => {
                        new.remove((next() % len) as usize);
                    }
                    _ if len > 1 => new.swap(0, (len - 1) as usize),
                    _ => {}
                }
            }
            let dedup = |v: Vec<Value>| {
                let mut seen = std::collections::HashSet::new();
                v.into_iter()
                    .filter(|x| seen.insert(item_key(x)))
                    .collect::<Vec<_>>()
            };
            let (old, new) = (dedup(old), dedup(new));
            let pretty = round % 2 == 0;
            let text = |v: &Value| {
                if pretty {
                    serde_json::to_string_pretty(v).unwrap()
                } else {
                    v.to_string()
                }
            };
            let (ov, nv) = (Value::Array(old), Value::Array(new));
            let expect = diff_state(&StateDoc::Json(ov.clone()), &StateDoc::Json(nv.clone()));
            let got = diff_reads(&StateBase::new(text(&ov)), &StateBase::new(text(&nv)));
            assert_eq!(got, expect, "{ov} -> {nv}");
            // The same as objects keyed by id.
            let obj = |v: &Value| {
                Value::Object(
                    v.as_array()
                        .unwrap()
                        .iter()
                        .map(|i| (i["id"].as_str().unwrap().to_owned(), i.clone()))
                        .collect(),
                )
            };
            let expect = diff_state(&StateDoc::Json(obj(&ov)), &StateDoc::Json(obj(&nv)));
            let got = diff_reads(
                &StateBase::new(text(&obj(&ov))),
                &StateBase::new(text(&obj(&nv))),
            );
            assert_eq!(got, expect, "objects {ov} -> {nv}");
        }
        let t = |s: &str| StateBase::new(s.to_owned());
        assert_eq!(diff_reads(&t("plain"), &t("plain!"))[0]["type"], "CHANGED");
        assert_eq!(diff_reads(&t("[1]"), &t("{\"a\":1}"))[0]["type"], "CHANGED");
        assert!(
            diff_reads(&t("[1, 2]"), &t("[1,2]")).is_empty(),
            "whitespace is not a change"
        );
    }

    #[test]
    fn list_diff_by_item_key() {
        let old = StateDoc::Json(json!([
            {"metadata": {"uid": "u1", "name": "a", "resourceVersion": "1"}, "status": {"phase": "Deciding"}},
            {"metadata": {"uid": "u2", "name": "b"}},
            {"id": 7, "v": 1},
        ]));
        let new = StateDoc::Json(json!([
            {"metadata": {"uid": "u1", "name": "a", "resourceVersion": "2"}, "status": {"phase": "Published"}},
            {"id": 7, "v": 1},
            {"name": "c"},
        ]));
        let evs = diff_state(&old, &new);
        assert_eq!(
            types(&evs),
            [
                ("MODIFIED".into(), "u1".into()),
                ("ADDED".into(), "c".into()),
                ("DELETED".into(), "u2".into())
            ]
        );
        assert_eq!(evs[0]["changed"], json!(["status.phase"]));
        assert_eq!(evs[0]["old"]["status"]["phase"], "Deciding");
    }

    #[test]
    fn names_are_keyed_within_their_namespace() {
        let a = json!({"metadata": {"name": "cm", "namespace": "a"}});
        let b = json!({"metadata": {"name": "cm", "namespace": "b"}});
        assert_eq!(item_key(&a), "a/cm");
        let evs = diff_state(&StateDoc::Json(json!([a])), &StateDoc::Json(json!([a, b])));
        assert_eq!(types(&evs), [("ADDED".into(), "b/cm".into())]);
    }

    #[test]
    fn sparse_seqs_are_not_a_gap_when_the_oldest_held_is_old() {
        let (evs, _) = extract_log(LogCursor { last: Some(5) }, &log(&[3, 5, 9])).unwrap();
        assert_eq!(evs.len(), 1, "no GAP: the read still holds seq 3");
        assert_eq!(evs[0]["seq"], 9);
    }

    #[test]
    fn items_without_keys_are_keyed_by_content() {
        let evs = diff_state(
            &StateDoc::Json(json!([1, 2])),
            &StateDoc::Json(json!([2, 3])),
        );
        assert_eq!(
            types(&evs),
            [("ADDED".into(), "3".into()), ("DELETED".into(), "1".into())]
        );
    }

    #[test]
    fn object_diff_by_top_level_key() {
        let evs = diff_state(
            &StateDoc::Json(json!({"owner": "ana", "todo": "milk"})),
            &StateDoc::Json(json!({"owner": "ana", "todo": "eggs", "new": 1})),
        );
        assert_eq!(
            types(&evs),
            [
                ("ADDED".into(), "new".into()),
                ("MODIFIED".into(), "todo".into())
            ]
        );
        assert_eq!(
            evs[1]["changed"],
            json!([""]),
            "a scalar changes at the root"
        );
    }

    #[test]
    fn text_diff_is_whole_text() {
        let evs = diff_state(&StateDoc::Text("a".into()), &StateDoc::Text("b".into()));
        assert_eq!(types(&evs), [("CHANGED".into(), "".into())]);
        assert_eq!(evs[0]["new"], "b");
        assert!(diff_state(&StateDoc::Text("a".into()), &StateDoc::Text("a".into())).is_empty());
        assert_eq!(
            StateDoc::from_text("{\"a\":1}"),
            StateDoc::Json(json!({"a": 1}))
        );
        assert_eq!(StateDoc::from_text("plain"), StateDoc::Text("plain".into()));
    }

    #[test]
    fn bookkeeping_only_modified_is_dropped() {
        let a = json!([{"metadata": {"uid": "u", "resourceVersion": "1", "generation": 1, "managedFields": [1]}}]);
        let b = json!([{"metadata": {"uid": "u", "resourceVersion": "2", "generation": 2, "managedFields": [2]}}]);
        assert!(diff_state(&StateDoc::Json(a), &StateDoc::Json(b)).is_empty());
    }

    #[test]
    fn changed_stops_at_depth_three() {
        let a = json!({"spec": {"template": {"spec": {"containers": [1]}}}});
        let b = json!({"spec": {"template": {"spec": {"containers": [2]}}}});
        assert_eq!(changed_paths(&a, &b), ["spec.template.spec"]);
        assert_eq!(
            at_path(&a, "spec.template"),
            Some(&json!({"spec": {"containers": [1]}}))
        );
    }

    /// The text path gives what the whole-body path gives, for cursors before, inside,
    /// after and beyond the log, and for a log that restarted.
    #[test]
    fn the_text_path_agrees_with_the_whole_body() {
        let logs = [
            json!({"events": []}),
            json!({"events": [{"seq": 5, "type": "ADDED", "object": {"a": 1}}]}),
            json!({"events": [
                {"seq": 7, "type": "ADDED", "object": {"k": "x"}},
                {"type": "ERROR", "message": "no seq"},
                {"seq": 8, "type": "MODIFIED", "object": {"k": "y"}, "old": {"k": "x"}},
                {"seq": 9, "type": "MODIFIED", "object": {"k": "y", "resourceVersion": "2"}, "old": {"k": "y", "resourceVersion": "1"}},
                {"seq": 11, "type": "DELETED", "object": {"k": "y"}}
            ]}),
        ];
        for log in &logs {
            for last in [
                None,
                Some(0),
                Some(1),
                Some(6),
                Some(7),
                Some(8),
                Some(10),
                Some(11),
                Some(50),
            ] {
                let cursor = LogCursor { last };
                let whole = extract_log(cursor, log).unwrap();
                let text = extract_log_text(cursor, &log.to_string()).unwrap();
                assert_eq!(whole, text, "cursor {last:?} on {log}");
            }
        }
        assert!(extract_log_text(LogCursor::default(), "[1]").is_err());
    }

    /// A read after the cursor (what a herald server answers to `io.herald/after`) gives
    /// the client what the whole ring gives, for every small ring, fill and cursor.
    #[test]
    fn a_read_after_the_cursor_reads_as_the_whole_ring() {
        use crate::mcp::ring::EventRing;
        let base = 1000;
        for cap in 1..6 {
            for pushed in 0..12u64 {
                let ring = EventRing::with_start(cap, base);
                for i in 0..pushed {
                    ring.push("ADDED", Map::from_iter([("i".into(), json!(i))]));
                }
                for last in (base - 2..base + 16).chain([1, 5_000]) {
                    let cursor = LogCursor { last: Some(last) };
                    assert_eq!(
                        extract_log_text(cursor, &ring.read_json_after(last)),
                        extract_log_text(cursor, &ring.read_json()),
                        "capacity {cap}, {pushed} pushed, cursor {last}"
                    );
                }
            }
        }
    }

    fn log(seqs: &[u64]) -> Value {
        json!({"events": seqs.iter().map(|s| json!({"seq": s, "type": "ADDED", "key": format!("k{s}")})).collect::<Vec<_>>()})
    }

    #[test]
    fn event_log_delivers_new_seqs_after_the_baseline() {
        let (evs, c) = extract_log(LogCursor::default(), &log(&[1, 2, 3])).unwrap();
        assert!(evs.is_empty(), "the baseline read delivers nothing");
        assert_eq!(c.last, Some(3));
        let (evs, c) = extract_log(c, &log(&[2, 3, 4, 5])).unwrap();
        assert_eq!(
            evs.iter()
                .map(|e| e["seq"].as_u64().unwrap())
                .collect::<Vec<_>>(),
            [4, 5]
        );
        assert_eq!(c.last, Some(5));
        let (evs, c2) = extract_log(c, &log(&[2, 3, 4, 5])).unwrap();
        assert!(evs.is_empty());
        assert_eq!(c2, c);
    }

    #[test]
    fn an_empty_baseline_never_reports_a_gap() {
        let (_, c) = extract_log(LogCursor::default(), &log(&[])).unwrap();
        assert_eq!(c.last, Some(0));
        let (evs, c) = extract_log(c, &log(&[1_796_000_000, 1_796_000_001])).unwrap();
        assert_eq!(evs.len(), 2);
        assert!(evs.iter().all(|e| e["type"] != "GAP"));
        assert_eq!(c.last, Some(1_796_000_001));
    }

    #[test]
    fn event_log_gap_when_the_ring_moved_past_us() {
        let c = LogCursor { last: Some(3) };
        let (evs, c) = extract_log(c, &log(&[7, 8])).unwrap();
        assert_eq!(evs[0]["type"], "GAP");
        assert_eq!(evs[0]["message"], "events 4 to 6 were missed");
        assert_eq!(evs.len(), 3);
        assert_eq!(c.last, Some(8));
    }

    #[test]
    fn event_log_reset_below_the_cursor_is_a_gap_then_everything() {
        let c = LogCursor { last: Some(1_000) };
        let (evs, c) = extract_log(c, &log(&[1, 2])).unwrap();
        assert_eq!(evs[0]["type"], "GAP");
        assert_eq!(evs[0]["reset"], true);
        assert_eq!(evs.len(), 3);
        assert_eq!(c.last, Some(2));
    }

    #[test]
    fn event_log_modified_gets_changed_and_no_ops_drop() {
        let body = json!({"events": [
            {"seq": 2, "type": "MODIFIED", "object": {"status": {"phase": "B"}}, "old": {"status": {"phase": "A"}}},
            {"seq": 3, "type": "MODIFIED", "object": {"metadata": {"resourceVersion": "9"}}, "old": {"metadata": {"resourceVersion": "8"}}},
        ]});
        let (evs, _) = extract_log(LogCursor { last: Some(1) }, &body).unwrap();
        assert_eq!(evs.len(), 1);
        assert_eq!(evs[0]["changed"], json!(["status.phase"]));
        assert!(extract_log(LogCursor::default(), &json!({"nope": 1})).is_err());
    }
}
