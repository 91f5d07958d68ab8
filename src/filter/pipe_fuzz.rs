//! Fuzz (property) tests of the filter pipe's messages, bounded so they run in every
//! `cargo test` (`cargo test fuzz` runs all of herald's): every message survives
//! encode→decode as one line; a message of one direction never reads as one of the other;
//! and arbitrary or mangled lines (herald reads what sandboxed user code may have written)
//! decode to `Err` or to a message, never a panic.

use proptest::prelude::*;

use crate::fuzzing::config;
use serde_json::{Map, Value};

use super::{FromWorker, Message, ToWorker};
use crate::filter::engine::{HostError, Location, Outcome, PyError, PyExc};

/// Strings with the characters JSON must escape.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z_]{0,8}",
        prop::collection::vec(
            prop::sample::select(
                &[
                    "\n", "\r", "\"", "\\", "\u{0}", "\u{2028}", "é", "😀", "{", "a"
                ][..]
            ),
            0..10
        )
        .prop_map(|t| t.concat()),
        any::<String>(),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        // Floats kept to a few digits: see fuzz_floats_cross_exactly for all of them.
        (-1_000_000i64..1_000_000, 0u32..4)
            .prop_map(|(m, e)| Value::from(m as f64 / 10f64.powi(e as i32))),
        text().prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 40, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((text(), inner), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

fn object() -> impl Strategy<Value = Map<String, Value>> {
    prop::collection::vec((text(), value()), 0..4).prop_map(|kv| kv.into_iter().collect())
}

fn host_error() -> impl Strategy<Value = HostError> {
    (prop::sample::select(&PyExc::ALL[..]), text()).prop_map(|(k, m)| HostError::new(k, m))
}

fn to_worker() -> impl Strategy<Value = ToWorker> {
    prop_oneof![
        (
            any::<u64>(),
            text(),
            text(),
            prop::collection::vec(text(), 0..4),
            any::<u64>(),
            any::<usize>(),
            prop::collection::vec(value(), 0..4),
        )
            .prop_map(|(id, scope, code, functions, time_ms, max_calls, events)| {
                ToWorker::Run {
                    id,
                    scope,
                    code,
                    functions,
                    time_ms,
                    max_calls,
                    events,
                }
            }),
        (
            any::<u64>(),
            any::<u64>(),
            prop_oneof![value().prop_map(Ok), host_error().prop_map(Err)],
        )
            .prop_map(|(id, call, answer)| ToWorker::Reply { id, call, answer }),
        text().prop_map(|scope| ToWorker::Drop { scope }),
    ]
}

fn location() -> impl Strategy<Value = Location> {
    (
        any::<u32>(),
        prop::option::of(any::<u32>()),
        prop::option::of(text()),
        prop::option::of(text()),
        any::<bool>(),
    )
        .prop_map(|(line, column, function, source, earlier)| Location {
            line,
            column,
            function,
            source,
            earlier,
        })
}

fn from_worker() -> impl Strategy<Value = FromWorker> {
    let result = prop_oneof![
        (value(), text(), any::<bool>()).prop_map(|(value, printed, fresh_scope)| Ok(Outcome {
            value,
            printed,
            fresh_scope,
        })),
        (text(), text(), prop::option::of(location())).prop_map(|(exc_type, message, at)| {
            Err(PyError {
                exc_type,
                message,
                at,
            })
        }),
    ];
    prop_oneof![
        (
            any::<u64>(),
            any::<u64>(),
            text(),
            prop::collection::vec(value(), 0..4),
            object(),
        )
            .prop_map(|(id, call, name, args, kwargs)| FromWorker::Call {
                id,
                call,
                name,
                args,
                kwargs,
            }),
        (any::<u64>(), any::<usize>()).prop_map(|(id, next)| FromWorker::Tick { id, next }),
        (any::<u64>(), prop::collection::vec(result, 0..4))
            .prop_map(|(id, results)| FromWorker::Done { id, results }),
    ]
}

/// Encodes `m` as the pipe does; checks it is one line and reads back as `m`.
fn round_trip<M: Message + PartialEq + std::fmt::Debug>(m: &M) -> Result<String, TestCaseError> {
    let mut bytes = Vec::new();
    m.write_to(&mut bytes).unwrap();
    let line = String::from_utf8(bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(line.find('\n'), Some(line.len() - 1), "one line: {}", line);
    let back = M::from_line(&line);
    prop_assert!(back.is_ok(), "{:?} for {}", back.err(), line);
    prop_assert_eq!(&back.unwrap(), m);
    // Without its newline, too.
    prop_assert_eq!(&M::from_line(line.trim_end_matches('\n')).unwrap(), m);
    Ok(line)
}

/// Reads `bytes` as herald reads a worker's line (invalid UTF-8: an empty line) and as the
/// worker reads herald's (lossy here); whatever decodes must survive a round trip.
fn decode_any(bytes: &[u8]) -> Result<(), TestCaseError> {
    let strict = String::from_utf8(bytes.to_vec()).unwrap_or_default();
    let lossy = String::from_utf8_lossy(bytes);
    for line in [strict.as_str(), &lossy] {
        if let Ok(m) = FromWorker::from_line(line) {
            round_trip(&m)?;
        }
        if let Ok(m) = ToWorker::from_line(line) {
            round_trip(&m)?;
        }
    }
    Ok(())
}

/// A line mangled: bytes replaced, cut out or put in, or the line cut short.
fn mangle(line: &[u8], edits: &[(prop::sample::Index, u8, u8)]) -> Vec<u8> {
    const PIECES: &[&[u8]] = &[
        b"{",
        b"}",
        b"[",
        b"]",
        b"\"",
        b"\\",
        b",",
        b":",
        b"-1",
        b"1e999",
        b"null",
        b"\"op\"",
        b"\"run\"",
        b"\"done\"",
        b"\"Ok\"",
        b"\"Err\"",
        b"\n",
        b"\xff",
        b"99999999999999999999",
    ];
    crate::fuzzing::mangle(line, edits, PIECES)
}

proptest! {
    #![proptest_config(config(300))]

    #[test]
    fn fuzz_to_worker_round_trips(m in to_worker()) {
        let line = round_trip(&m)?;
        prop_assert!(FromWorker::from_line(&line).is_err(), "read as the other way: {}", line);
    }

    #[test]
    fn fuzz_from_worker_round_trips(m in from_worker()) {
        let line = round_trip(&m)?;
        prop_assert!(ToWorker::from_line(&line).is_err(), "read as the other way: {}", line);
    }

    #[test]
    fn fuzz_arbitrary_lines_decode_without_panic(
        bytes in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..512),
            prop::collection::vec(
                prop::sample::select(&[
                    "{", "}", "[", "]", ":", ",", "\"op\"", "\"run\"", "\"reply\"", "\"drop\"",
                    "\"call\"", "\"tick\"", "\"done\"", "\"id\"", "1", "-1", "\"Ok\"", "\"Err\"",
                    "null", "\"\"", "\"results\"", "\"answer\"", "\"kind\"", "\"KeyError\"",
                ][..]),
                0..60,
            )
            .prop_map(|t| t.concat().into_bytes()),
        ],
    ) {
        decode_any(&bytes)?;
    }

    #[test]
    fn fuzz_mangled_messages_decode_without_panic(
        m in prop_oneof![
            to_worker().prop_map(|m| serde_json::to_vec(&m).unwrap()),
            from_worker().prop_map(|m| serde_json::to_vec(&m).unwrap()),
        ],
        edits in prop::collection::vec(
            (any::<prop::sample::Index>(), any::<u8>(), any::<u8>()),
            1..6,
        ),
    ) {
        decode_any(&mangle(&m, &edits))?;
    }
}

/// Nesting past serde_json's limit is an error, not a stack overflow.
#[test]
fn fuzz_regression_deep_nesting_is_an_error() {
    for depth in [200, 100_000] {
        let line = format!(
            r#"{{"op":"tick","id":1,"next":{}1{}}}"#,
            "[".repeat(depth),
            "]".repeat(depth)
        );
        assert!(FromWorker::from_line(&line).is_err());
        let line = format!(
            r#"{{"op":"done","id":1,"results":[{{"Ok":{{"value":{}{},"printed":""}}}}]}}"#,
            "[".repeat(depth),
            "]".repeat(depth)
        );
        assert!(FromWorker::from_line(&line).is_err());
    }
}

proptest! {
    #![proptest_config(config(1000))]

    /// A float in an event reaches the filter as it was (a filter compares what it is given).
    #[test]
    fn fuzz_floats_cross_exactly(f in any::<f64>().prop_filter("finite", |f| f.is_finite())) {
        round_trip(&ToWorker::Reply { id: 1, call: 1, answer: Ok(Value::from(f)) })?;
    }
}

/// Found by `fuzz_floats_cross_exactly`: serde_json's default float parsing read this one
/// back one ulp off (`-8.735481373431928e-166`); herald enables its `float_roundtrip`.
#[test]
fn fuzz_regression_a_float_crosses_to_the_last_bit() {
    let f: f64 = -8.735481373431927e-166;
    round_trip(&ToWorker::Reply {
        id: 1,
        call: 1,
        answer: Ok(Value::from(f)),
    })
    .unwrap();
    let back: Value = serde_json::from_str(&serde_json::to_string(&f).unwrap()).unwrap();
    assert_eq!(back.as_f64().map(f64::to_bits), Some(f.to_bits()));
}
