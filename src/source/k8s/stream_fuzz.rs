//! Fuzz (property) tests of the kubectl watch stream splitter ([`JsonStream`]), bounded so
//! they run in every `cargo test` (`cargo test fuzz` runs all of herald's): objects written
//! back to back (compact or pretty, with noise lines between) come out whole and in order
//! however the bytes are cut, and arbitrary bytes never panic and split the same way however
//! they are cut.

use proptest::prelude::*;

use crate::fuzzing::config;
use serde_json::{Map, Value};

use super::{Item, JsonStream};

/// Any JSON value, strings full of the characters the splitter must see past.
fn json() -> impl Strategy<Value = Value> {
    let text = prop_oneof![
        "[a-z]{0,6}",
        prop::collection::vec(
            prop::sample::select(
                &["{", "}", "[", "]", "\"", "\\", "\\\"", "é", "\n", " ", "a"][..]
            ),
            0..8
        )
        .prop_map(|t| t.concat()),
        any::<String>(),
    ];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-1e6f64..1e6).prop_map(Value::from),
        text.clone().prop_map(Value::from),
    ];
    leaf.prop_recursive(5, 48, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((text.clone(), inner), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// A watch event as kubectl prints it: `{"type": ..., "object": {...}}`, or a bare list.
fn event() -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => (
            prop::sample::select(&["ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"][..]),
            prop::collection::vec(("[a-z]{1,8}", json()), 0..5),
        )
            .prop_map(|(t, fields)| {
                serde_json::json!({"type": t, "object": Value::Object(fields.into_iter().collect())})
            }),
        1 => prop::collection::vec(json(), 0..4).prop_map(Value::Array),
    ]
}

/// Writes `events` the ways kubectl may, with noise lines (no `{` or `[`) between some.
fn stream() -> impl Strategy<Value = (Vec<Value>, Vec<u8>, usize)> {
    prop::collection::vec(
        (
            event(),
            any::<bool>(),
            prop::sample::select(&["", "\n", " \n", "\r\n", "\n\n\t"][..]),
            prop::option::weighted(0.2, "[a-zA-Z:. ]{1,20}\n"),
        ),
        0..8,
    )
    .prop_map(|items| {
        let mut bytes = Vec::new();
        let mut events = Vec::new();
        let mut noise = 0;
        for (e, pretty, gap, junk) in items {
            if let Some(j) = junk {
                noise += usize::from(!j.trim().is_empty());
                bytes.extend(j.as_bytes());
            }
            let text = if pretty {
                serde_json::to_vec_pretty(&e).unwrap()
            } else {
                serde_json::to_vec(&e).unwrap()
            };
            bytes.extend(&text);
            bytes.extend(gap.as_bytes());
            // As serde_json reads it back (a float may come back a bit off: not the
            // splitter's business).
            events.push(serde_json::from_slice(&text).unwrap());
        }
        (events, bytes, noise)
    })
}

/// Feeds `bytes` cut at `cuts` (sizes, cycled; 0 feeds an empty chunk).
fn feed(bytes: &[u8], cuts: &[usize]) -> Vec<Item> {
    let mut s = JsonStream::new();
    let mut out = Vec::new();
    let mut rest = bytes;
    let mut i = 0;
    loop {
        let n = cuts[i % cuts.len()].min(rest.len());
        let (chunk, tail) = rest.split_at(n);
        out.extend(s.feed(chunk));
        rest = tail;
        i += 1;
        if rest.is_empty() {
            break;
        }
    }
    // What is left in the parser is an unfinished value: at most all of the input.
    assert!(s.buf.len() <= bytes.len());
    out
}

fn cuts() -> impl Strategy<Value = Vec<usize>> {
    prop_oneof![
        // At least one cut feeds bytes, or feeding never ends.
        prop::collection::vec(0usize..4, 1..12).prop_map(|mut c| {
            if c.iter().all(|n| *n == 0) {
                c.push(1);
            }
            c
        }),
        prop::collection::vec(1usize..64, 1..12),
        Just(vec![usize::MAX]),
    ]
}

/// The values, and the splitter's own complaints about values it could not parse (which
/// must not depend on chunking); noise between values is left out (its text is whatever
/// each chunk held).
fn values_and_broken(items: &[Item]) -> Vec<Result<&Value, &str>> {
    items
        .iter()
        .filter_map(|i| match i {
            Item::Value(v) => Some(Ok(v)),
            Item::Garbage(g) if g.starts_with("unparsable JSON value") => Some(Err(g.as_str())),
            Item::Garbage(_) => None,
        })
        .collect()
}

proptest! {
    #![proptest_config(config(300))]

    /// Objects back to back come out whole, in order, whatever the cuts; noise lines come
    /// out as garbage and cost nothing else.
    #[test]
    fn fuzz_objects_survive_any_chunking((events, bytes, noise) in stream(), cuts in cuts()) {
        let items = feed(&bytes, &cuts);
        let values: Vec<&Value> = items
            .iter()
            .filter_map(|i| match i {
                Item::Value(v) => Some(v),
                Item::Garbage(_) => None,
            })
            .collect();
        prop_assert_eq!(values, events.iter().collect::<Vec<_>>());
        let garbage: Vec<&String> = items
            .iter()
            .filter_map(|i| match i {
                Item::Garbage(g) => Some(g),
                Item::Value(_) => None,
            })
            .collect();
        prop_assert!(!garbage.iter().any(|g| g.starts_with("unparsable")), "{garbage:?}");
        prop_assert!(garbage.len() >= noise, "{garbage:?}");
        if cuts == [usize::MAX] {
            prop_assert_eq!(garbage.len(), noise, "{:?}", garbage);
        }
    }

    /// Arbitrary bytes (and JSON-ish noise) never panic, and the values and broken values
    /// found do not depend on where the bytes were cut.
    #[test]
    fn fuzz_arbitrary_bytes_split_the_same_however_cut(
        bytes in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..2048),
            prop::collection::vec(
                prop::sample::select(&[
                    "{", "}", "[", "]", "\"", "\\", ":", ",", "1", "\"a\"", "null", " ", "\n",
                    "x", "\u{FEFF}", "\u{e9}",
                ][..]),
                0..300,
            )
            .prop_map(|t| t.concat().into_bytes()),
        ],
        cuts in cuts(),
    ) {
        let whole = feed(&bytes, &[usize::MAX]);
        let cut = feed(&bytes, &cuts);
        prop_assert_eq!(values_and_broken(&cut), values_and_broken(&whole));
    }
}
