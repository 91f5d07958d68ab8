//! Splitting JSON text into the raw text of its top-level items, without building a tree.
//!
//! A state watch diffs each read against the last one. Building `serde_json::Value` trees for
//! a 100,000-item list costs far more than the diff itself (every item is a dozen scattered
//! heap nodes), so the state baseline keeps the read's text and the byte ranges of its items:
//! items whose bytes are unchanged are unchanged, and only items whose bytes differ are parsed.
//! The scanner only tracks strings, escapes and nesting; anything it cannot split is handled as
//! whole text by the caller, and items that are parsed are fully validated by serde_json.

use std::ops::Range;

/// The raw layout of a JSON document's top level.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    /// An array: each item's byte range.
    Array(Vec<Range<usize>>),
    /// An object: each member's key range (the quoted key) and value range.
    Object(Vec<(Range<usize>, Range<usize>)>),
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && matches!(b[i], b' ' | b'\t' | b'\n' | b'\r') {
        i += 1;
    }
    i
}

/// The end (exclusive) of the string starting with the quote at `i`.
fn string_end(b: &[u8], i: usize) -> Option<usize> {
    let mut j = i + 1;
    while j < b.len() {
        match b[j] {
            b'\\' => j += 2,
            b'"' => return Some(j + 1),
            _ => j += 1,
        }
    }
    None
}

/// The end (exclusive) of the value starting at `i` (not whitespace).
fn value_end(b: &[u8], i: usize) -> Option<usize> {
    match *b.get(i)? {
        b'"' => string_end(b, i),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut j = i;
            while j < b.len() {
                match b[j] {
                    b'"' => {
                        j = string_end(b, j)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth = depth.checked_sub(1)?;
                        if depth == 0 {
                            return Some(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            None
        }
        _ => {
            // A number, true, false or null: up to the next delimiter.
            let mut j = i;
            while j < b.len() && !matches!(b[j], b',' | b']' | b'}' | b' ' | b'\t' | b'\n' | b'\r')
            {
                j += 1;
            }
            (j > i).then_some(j)
        }
    }
}

/// Splits `text` when it is a JSON array or object; `None` for anything else (including text
/// the scanner finds malformed).
pub fn layout(text: &str) -> Option<Layout> {
    let b = text.as_bytes();
    let start = skip_ws(b, 0);
    let (open, close) = match b.get(start)? {
        b'[' => (b'[', b']'),
        b'{' => (b'{', b'}'),
        _ => return None,
    };
    let mut items = Vec::new();
    let mut members = Vec::new();
    let mut i = skip_ws(b, start + 1);
    if b.get(i) == Some(&close) {
        i += 1;
    } else {
        loop {
            if open == b'{' {
                if b.get(i) != Some(&b'"') {
                    return None;
                }
                let kend = string_end(b, i)?;
                let colon = skip_ws(b, kend);
                if b.get(colon) != Some(&b':') {
                    return None;
                }
                let vstart = skip_ws(b, colon + 1);
                let vend = value_end(b, vstart)?;
                members.push((i..kend, vstart..vend));
                i = skip_ws(b, vend);
            } else {
                let vend = value_end(b, i)?;
                items.push(i..vend);
                i = skip_ws(b, vend);
            }
            match b.get(i) {
                Some(b',') => i = skip_ws(b, i + 1),
                Some(c) if *c == close => {
                    i += 1;
                    break;
                }
                _ => return None,
            }
        }
    }
    if skip_ws(b, i) != b.len() {
        return None;
    }
    Some(if open == b'[' {
        Layout::Array(items)
    } else {
        Layout::Object(members)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn items(text: &str) -> Vec<Value> {
        match layout(text).unwrap() {
            Layout::Array(r) => r
                .into_iter()
                .map(|r| serde_json::from_str(&text[r]).unwrap())
                .collect(),
            Layout::Object(m) => m
                .into_iter()
                .map(|(k, v)| {
                    let k: String = serde_json::from_str(&text[k]).unwrap();
                    json!([k, serde_json::from_str::<Value>(&text[v]).unwrap()])
                })
                .collect(),
        }
    }

    #[test]
    fn arrays_and_objects_split_into_their_items() {
        let t = r#" [ {"a":"x,]}\"y"}, [1,[2]] ,"s\\",3.5e2,true,null, {} ] "#;
        assert_eq!(
            items(t),
            vec![
                json!({"a":"x,]}\"y"}),
                json!([1, [2]]),
                json!("s\\"),
                json!(350.0),
                json!(true),
                json!(null),
                json!({})
            ]
        );
        assert_eq!(items("[]"), Vec::<Value>::new());
        assert_eq!(
            items(r#"{"k":1,"q\"":{"z":[]}}"#),
            vec![json!(["k", 1]), json!(["q\"", {"z": []}])]
        );
    }

    #[test]
    fn other_documents_are_not_split() {
        for t in [
            "",
            "3",
            "\"s\"",
            "[1,2",
            "[1 2]",
            "{\"a\" 1}",
            "[1]]",
            "{\"a\":1,}",
            "[,1]",
            "x",
        ] {
            assert_eq!(layout(t), None, "{t:?}");
        }
    }

    #[test]
    fn splitting_agrees_with_serde_json_on_generated_documents() {
        // A deterministic generator of nested JSON with awkward strings.
        let mut seed = 42u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        fn generate(next: &mut dyn FnMut() -> u64, depth: u32) -> Value {
            match next() % if depth > 3 { 4 } else { 6 } {
                0 => json!(null),
                1 => json!(next() % 1000),
                2 => json!(["a\"b", "c\\", "],{", "é\n"][(next() % 4) as usize]),
                3 => json!(next().is_multiple_of(2)),
                4 => Value::Array((0..next() % 4).map(|_| generate(next, depth + 1)).collect()),
                _ => Value::Object(
                    (0..next() % 4)
                        .map(|i| (format!("k{i}\"]"), generate(next, depth + 1)))
                        .collect(),
                ),
            }
        }
        for _ in 0..500 {
            let list: Vec<Value> = (0..next() % 6).map(|_| generate(&mut next, 0)).collect();
            for text in [
                serde_json::to_string(&list).unwrap(),
                serde_json::to_string_pretty(&list).unwrap(),
            ] {
                assert_eq!(items(&text), list, "{text}");
            }
        }
    }
}
