//! An incremental parser for concatenated JSON values (`kubectl get -w -o json` prints one
//! object after another, pretty or compact): bytes go in as they arrive, split anywhere, and
//! each complete top-level value comes out once its last byte is in.

use serde_json::Value;

/// Longest single value accepted; past it the stream is reset with an error (a runaway or
/// corrupt stream must not grow memory without bound).
pub const MAX_VALUE_BYTES: usize = 64 << 20;

#[derive(Debug, Default)]
pub struct JsonStream {
    /// Bytes of the value in progress (from its first byte).
    buf: Vec<u8>,
    /// Nesting depth inside the value in progress; 0 between values.
    depth: usize,
    in_string: bool,
    escaped: bool,
}

#[derive(Debug, PartialEq)]
pub enum Item {
    Value(Value),
    /// Bytes that are not JSON (or a value over the size cap); the parser resynchronises at
    /// the next top-level `{` or `[`.
    Garbage(String),
}

impl JsonStream {
    pub fn new() -> JsonStream {
        JsonStream::default()
    }

    /// Feeds `chunk`; returns the values it completed, in order.
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<Item> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < chunk.len() {
            if self.buf.is_empty() {
                // Between values: skip whitespace; only objects and arrays start a value.
                let b = chunk[i];
                if b.is_ascii_whitespace() {
                    i += 1;
                    continue;
                }
                if b != b'{' && b != b'[' {
                    let end = chunk[i..]
                        .iter()
                        .position(|&c| c == b'{' || c == b'[')
                        .map_or(chunk.len(), |n| i + n);
                    let text = String::from_utf8_lossy(&chunk[i..end]).trim().to_owned();
                    if !text.is_empty() {
                        out.push(Item::Garbage(text));
                    }
                    i = end;
                    continue;
                }
            }
            // Scan from `i` for the end of the value in progress, then copy only that much.
            let mut end = None;
            let mut j = i;
            while j < chunk.len() {
                let b = chunk[j];
                if self.in_string {
                    if self.escaped {
                        self.escaped = false;
                    } else if b == b'\\' {
                        self.escaped = true;
                    } else if b == b'"' {
                        self.in_string = false;
                    }
                } else {
                    match b {
                        b'"' => self.in_string = true,
                        b'{' | b'[' => self.depth += 1,
                        b'}' | b']' => {
                            self.depth = self.depth.saturating_sub(1);
                            if self.depth == 0 {
                                end = Some(j + 1);
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                j += 1;
            }
            let stop = end.unwrap_or(chunk.len());
            self.buf.extend_from_slice(&chunk[i..stop]);
            i = stop;
            if end.is_some() {
                let value = std::mem::take(&mut self.buf);
                out.push(match serde_json::from_slice(&value) {
                    Ok(v) => Item::Value(v),
                    Err(e) => Item::Garbage(format!("unparsable JSON value: {e}")),
                });
            } else if self.buf.len() > MAX_VALUE_BYTES {
                *self = JsonStream::new();
                out.push(Item::Garbage(format!(
                    "a value over {} MiB was dropped",
                    MAX_VALUE_BYTES >> 20
                )));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn values(items: Vec<Item>) -> Vec<Value> {
        items
            .into_iter()
            .map(|i| match i {
                Item::Value(v) => v,
                Item::Garbage(g) => panic!("garbage {g}"),
            })
            .collect()
    }

    #[test]
    fn pretty_and_compact_values_back_to_back() {
        let text = "{\"type\":\"ADDED\",\"object\":{\"a\":\"}{\\\"\"}}\n{\n  \"type\": \"DELETED\",\n  \"object\": {\"b\": [1, {\"c\": 2}]}\n}{\"x\":1}";
        let mut s = JsonStream::new();
        let got = values(s.feed(text.as_bytes()));
        assert_eq!(
            got,
            vec![
                json!({"type": "ADDED", "object": {"a": "}{\""}}),
                json!({"type": "DELETED", "object": {"b": [1, {"c": 2}]}}),
                json!({"x": 1}),
            ]
        );
    }

    #[test]
    fn garbage_between_values_is_reported_and_skipped() {
        let mut s = JsonStream::new();
        let got = s.feed(b"error: boom\n{\"a\":1}");
        assert_eq!(got[0], Item::Garbage("error: boom".into()));
        assert_eq!(got[1], Item::Value(json!({"a": 1})));
    }

    /// The property: every way of cutting the stream into three chunks (every pair of byte
    /// positions, exhaustively) gives the same values.
    #[test]
    fn chunks_split_at_every_byte() {
        let events = [
            json!({"type": "ADDED", "object": {"metadata": {"name": "cm-é", "uid": "1"}, "data": {"k": "v}\\\"{["}}}),
            json!({"type": "MODIFIED", "object": {"metadata": {"name": "b"}, "list": [1, [2, {"x": null}]]}}),
            json!({"type": "DELETED", "object": {}}),
        ];
        let mut text = String::new();
        for (i, e) in events.iter().enumerate() {
            if i == 1 {
                text.push_str(&serde_json::to_string_pretty(e).unwrap());
            } else {
                text.push_str(&e.to_string());
            }
            text.push('\n');
        }
        let bytes = text.as_bytes();
        for a in 0..=bytes.len() {
            for b in a..=bytes.len() {
                let mut s = JsonStream::new();
                let mut got = values(s.feed(&bytes[..a]));
                got.extend(values(s.feed(&bytes[a..b])));
                got.extend(values(s.feed(&bytes[b..])));
                assert_eq!(got, events.to_vec(), "cuts at {a} and {b}");
            }
        }
    }

    #[test]
    fn every_single_byte_split() {
        let text = b"{\"a\":\"x\\\\\"}{\"b\":[{}]}";
        for cut in 0..=text.len() {
            let mut s = JsonStream::new();
            let mut got = values(s.feed(&text[..cut]));
            got.extend(values(s.feed(&text[cut..])));
            assert_eq!(
                got,
                vec![json!({"a": "x\\"}), json!({"b": [{}]})],
                "cut {cut}"
            );
        }
        let mut s = JsonStream::new();
        let mut got = Vec::new();
        for b in text {
            got.extend(values(s.feed(std::slice::from_ref(b))));
        }
        assert_eq!(got.len(), 2);
    }
}

#[cfg(test)]
#[path = "stream_fuzz.rs"]
mod fuzz;
