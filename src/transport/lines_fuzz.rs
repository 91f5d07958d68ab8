//! Fuzz (property) tests of [`LineTransport`]'s reading side, bounded so they run in every
//! `cargo test` (`cargo test fuzz` runs all of herald's). Arbitrary lines (valid JSON-RPC,
//! near misses, raw bytes, invalid UTF-8, BOMs, CRLF, oversized ones) are cut into arbitrary
//! chunks, some reads pend first and, in one mode, every `receive` that pends is dropped and
//! called again (it must be cancel-safe). A model that looks at one whole line at a time says
//! what each line must give: a message, an error answer (server side), the end of the
//! connection (client side) or nothing; the transport must give exactly that, in order,
//! without hanging, and its line buffer must never outgrow the limit.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::FutureExt;
use proptest::prelude::*;

use crate::fuzzing::config;
use rmcp::service::{RxJsonRpcMessage, ServiceRole};
use rmcp::transport::Transport;
use rmcp::{RoleClient, RoleServer};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, ReadBuf};

use super::LineTransport;
use crate::transport::jsonrpc::misshapen;

/// A reader that hands out its input in the given chunk sizes (cycled), pending (and waking
/// itself at once) before the chunks marked so.
struct Chunked {
    chunks: VecDeque<(Vec<u8>, bool)>,
}

impl Chunked {
    fn new(input: &[u8], cuts: &[(usize, bool)]) -> Chunked {
        let mut chunks = VecDeque::new();
        let mut rest = input;
        let mut i = 0;
        while !rest.is_empty() {
            let (size, pend) = cuts[i % cuts.len()];
            let (chunk, tail) = rest.split_at(size.clamp(1, rest.len()));
            chunks.push_back((chunk.to_vec(), pend));
            rest = tail;
            i += 1;
        }
        Chunked { chunks }
    }
}

impl AsyncRead for Chunked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let Some((chunk, pend)) = self.chunks.front_mut() else {
            return Poll::Ready(Ok(())); // EOF
        };
        if *pend {
            *pend = false;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        let n = chunk.len().min(buf.remaining());
        buf.put_slice(&chunk[..n]);
        chunk.drain(..n);
        if chunk.is_empty() {
            self.chunks.pop_front();
        }
        Poll::Ready(Ok(()))
    }
}

/// What one line must give.
#[derive(Debug, Clone, PartialEq)]
enum Want {
    Message(Value),
    /// An error answer; `oversized` is the line's length with its newline (or all of an
    /// unterminated last line).
    Error {
        code: i64,
        id: Value,
        oversized: Option<usize>,
    },
}

/// The model: the input cut at every `\n`, each line judged on its own.
fn model<Role: ServiceRole>(input: &[u8], max: usize) -> Vec<Want> {
    let mut want = Vec::new();
    let mut lines: Vec<&[u8]> = input.split(|b| *b == b'\n').collect();
    let tail = lines.pop().unwrap_or_default();
    for line in lines {
        if line.len() + 1 > max + 1 {
            want.push(oversized(line.len() + 1));
            continue;
        }
        let mut text = line;
        while let [rest @ .., b'\r'] = text {
            text = rest;
        }
        let text = text.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(text);
        if text.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        want.extend(judge::<Role>(text));
    }
    // An unterminated last line is dropped at EOF, unless it already broke the limit.
    if tail.len() > max + 1 {
        want.push(oversized(tail.len()));
    }
    want
}

fn oversized(len: usize) -> Want {
    Want::Error {
        code: -32600,
        id: Value::Null,
        oversized: Some(len),
    }
}

fn judge<Role: ServiceRole>(text: &[u8]) -> Option<Want> {
    // The `taskIds` a listen names go beside the message (with `acks`), never into it: the
    // message is what the bytes say.
    let parsed = serde_json::from_slice::<RxJsonRpcMessage<Role>>(text);
    if let Ok(m) = parsed {
        return Some(Want::Message(serde_json::to_value(&m).unwrap()));
    }
    match serde_json::from_slice::<Value>(text) {
        Err(_) => Some(Want::Error {
            code: -32700,
            id: Value::Null,
            oversized: None,
        }),
        // An unknown notification is skipped.
        Ok(v) if v.get("id").is_none() && v.get("method").is_some() => None,
        // The code and id are what every transport answers such a message with (one
        // definition, tested on its own); this model is about the framing around it.
        Ok(v) => Some(match misshapen(&v) {
            Some(wrong) => Want::Error {
                code: wrong.code,
                id: wrong.id,
                oversized: None,
            },
            // rmcp refused what JSON-RPC allows: a request's id is echoed, a response's
            // (ours) never, as `misshapen` says.
            None => Want::Error {
                code: -32600,
                id: match v.get("method") {
                    Some(_) => v.get("id").cloned().unwrap_or(Value::Null),
                    None => Value::Null,
                },
                oversized: None,
            },
        }),
    }
}

/// Everything the transport gave: the messages, then what it wrote back.
struct Got {
    messages: Vec<Value>,
    written: Vec<u8>,
}

struct Run<'a> {
    input: &'a [u8],
    cuts: &'a [(usize, bool)],
    max: usize,
    server: bool,
    acks: bool,
    /// Drop every `receive` that pends and call it again.
    cancel: bool,
}

async fn drive<Role: ServiceRole>(run: &Run<'_>) -> Got {
    let reader = Chunked::new(run.input, run.cuts);
    // A small pipe, so a burst of error answers meets backpressure.
    let (out_w, mut out_r) = tokio::io::duplex(512);
    let mut t = LineTransport::<Role>::new(reader, out_w, run.max, run.server);
    if run.acks {
        t = t.with_task_ids_carried();
    }
    let written = tokio::spawn(async move {
        let mut v = Vec::new();
        out_r.read_to_end(&mut v).await.map(|_| v)
    });
    let mut messages = Vec::new();
    loop {
        let next = if run.cancel {
            match t.receive().now_or_never() {
                Some(next) => next,
                None => {
                    assert!(t.line.len() <= run.max + 1, "line buffer past the limit");
                    tokio::task::yield_now().await;
                    continue;
                }
            }
        } else {
            t.receive().await
        };
        assert!(
            t.line.len() <= run.max + 1,
            "line buffer of {} bytes past the {}-byte limit",
            t.line.len(),
            run.max
        );
        match next {
            Some(m) => messages.push(serde_json::to_value(&m).unwrap()),
            None => break,
        }
    }
    t.close().await.unwrap();
    let written = written.await.unwrap().unwrap();
    Got { messages, written }
}

/// Runs `run` and checks it against the model.
fn check<Role: ServiceRole>(run: Run<'_>) -> Result<(), TestCaseError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    // The timeout is made inside the runtime: its timer needs the runtime's handle.
    let got = rt
        .block_on(async {
            tokio::time::timeout(Duration::from_secs(20), drive::<Role>(&run)).await
        })
        .map_err(|_| TestCaseError::fail("the transport hung"))?;
    let want = model::<Role>(run.input, run.max);
    let answers: Vec<Value> = got
        .written
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).expect("every answer is one JSON line"))
        .collect();
    prop_assert!(
        got.written.is_empty() || got.written.ends_with(b"\n"),
        "the last answer is a whole line"
    );
    if !run.server {
        // A client never answers; the first bad line ends the connection.
        prop_assert!(answers.is_empty(), "a client answered: {answers:?}");
        let until_bad: Vec<Value> = want
            .iter()
            .map_while(|w| match w {
                Want::Message(m) => Some(m.clone()),
                Want::Error { .. } => None,
            })
            .collect();
        prop_assert_eq!(got.messages, until_bad);
        return Ok(());
    }
    let want_messages: Vec<Value> = want
        .iter()
        .filter_map(|w| match w {
            Want::Message(m) => Some(m.clone()),
            Want::Error { .. } => None,
        })
        .collect();
    prop_assert_eq!(got.messages, want_messages);
    let want_errors: Vec<(i64, Value, Option<usize>)> = want
        .into_iter()
        .filter_map(|w| match w {
            Want::Error {
                code,
                id,
                oversized,
            } => Some((code, id, oversized)),
            Want::Message(_) => None,
        })
        .collect();
    prop_assert_eq!(answers.len(), want_errors.len(), "answers {:?}", answers);
    for (a, (code, id, oversized)) in answers.iter().zip(want_errors) {
        prop_assert_eq!(&a["jsonrpc"], "2.0");
        prop_assert_eq!(&a["error"]["code"], code, "{}", a);
        prop_assert_eq!(&a["id"], &id, "{}", a);
        let message = a["error"]["message"].as_str().unwrap_or_default();
        if let Some(len) = oversized {
            prop_assert!(
                message.contains(&format!("the {}-byte limit", run.max)),
                "{}",
                a
            );
            // "at least N bytes": N is what had arrived when the limit broke.
            let n: usize = message
                .strip_prefix("message of at least ")
                .and_then(|m| m.split(' ').next())
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            prop_assert!(n > run.max + 1 && n <= len, "{n} for a line of {len}: {a}");
        } else if code == -32700 {
            prop_assert!(message.starts_with("parse error"), "{}", a);
        }
    }
    Ok(())
}

/// A request for a server, `pad` bytes longer than the shortest.
fn request(id: u64, pad: usize) -> Vec<u8> {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/list","params":{{"cursor":"{}"}}}}"#,
        "c".repeat(pad)
    )
    .into_bytes()
}

const FIXED: &[&str] = &[
    r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
    r#"{"jsonrpc":"2.0","id":"s-1","method":"ping"}"#,
    r#"{"jsonrpc":"2.0","id":3,"result":{}}"#,
    r#"{"jsonrpc":"2.0","id":4,"error":{"code":-1,"message":"no"}}"#,
    r#"{"jsonrpc":"2.0","method":"notifications/resources/updated","params":{"uri":"memo://notes"}}"#,
    r#"{"jsonrpc":"2.0","method":"notifications/bogus"}"#,
    r#"{"jsonrpc":"2.0","id":5,"method":"subscriptions/listen","params":{"notifications":{"taskIds":["t1"]}}}"#,
    r#"{"jsonrpc":"2.0","id":6,"method":"tools\u002flist"}"#,
    r#"{"jsonrpc":"2.0","id":7,"result":5,"method":3}"#,
    r#"[1,2]"#,
    r#"{"id":8}"#,
    r#""just a string""#,
    "null",
    "{not json",
];

/// Pieces that make JSON-like lines likelier to be near misses than noise.
const TOKENS: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    ":",
    ",",
    "\"jsonrpc\"",
    "\"2.0\"",
    "\"id\"",
    "1",
    "\"method\"",
    "\"ping\"",
    "\"params\"",
    "\"result\"",
    "null",
    "\"taskIds\"",
    "\"\\u0041\"",
    " ",
    "\r",
    "\u{FEFF}",
    "é",
    "\"",
];

/// One line's bytes, without its newline.
fn line() -> impl Strategy<Value = Vec<u8>> {
    let no_newline = |v: Vec<u8>| v.into_iter().filter(|b| *b != b'\n').collect::<Vec<u8>>();
    prop_oneof![
        4 => (0u64..1000, 0usize..120).prop_map(|(id, pad)| request(id, pad)),
        1 => (0u64..1000, 120usize..700).prop_map(|(id, pad)| request(id, pad)),
        3 => prop::sample::select(FIXED).prop_map(|s| s.as_bytes().to_vec()),
        1 => (0u64..10).prop_map(|id| {
            let mut v = b"\xEF\xBB\xBF".to_vec();
            v.extend(request(id, 0));
            v
        }),
        1 => prop::collection::vec(prop::sample::select(&b" \t\r"[..]), 0..4),
        2 => prop::collection::vec(any::<u8>(), 0..200).prop_map(no_newline),
        2 => prop::collection::vec(prop::sample::select(TOKENS), 0..40)
            .prop_map(|t| t.concat().into_bytes()),
        2 => (
            (0u64..100, 0usize..40).prop_map(|(id, pad)| request(id, pad)),
            prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        )
            .prop_map(move |(mut v, flips)| {
                for (at, b) in flips {
                    let i = at.index(v.len());
                    v[i] = b;
                }
                no_newline(v)
            }),
    ]
}

/// A whole input: lines with assorted line ends, the last one maybe unterminated.
fn input() -> impl Strategy<Value = Vec<u8>> {
    (
        prop::collection::vec(
            (
                line(),
                prop::sample::select(&["\n", "\r\n", "\n\n", "\r\r\n"][..]),
            ),
            0..24,
        ),
        prop::option::of(line()),
    )
        .prop_map(|(lines, last)| {
            let mut v = Vec::new();
            for (l, end) in lines {
                v.extend(l);
                v.extend(end.as_bytes());
            }
            v.extend(last.unwrap_or_default());
            v
        })
}

fn cuts() -> impl Strategy<Value = Vec<(usize, bool)>> {
    prop_oneof![
        prop::collection::vec((1usize..8, prop::bool::weighted(0.2)), 1..16),
        prop::collection::vec((1usize..300, prop::bool::weighted(0.2)), 1..16),
        Just(vec![(1 << 20, false)]),
    ]
}

proptest! {
    #![proptest_config(config(200))]

    /// Server side: every line gives what the model says, in order, whatever the chunking.
    #[test]
    fn fuzz_server_lines_match_the_model(
        input in input(),
        cuts in cuts(),
        max in 16usize..400,
        acks in any::<bool>(),
        cancel in any::<bool>(),
    ) {
        check::<RoleServer>(Run { input: &input, cuts: &cuts, max, server: true, acks, cancel })?;
    }

    /// Client side: the messages before the first bad line, then the end; never an answer.
    #[test]
    fn fuzz_client_lines_match_the_model(
        input in input(),
        cuts in cuts(),
        max in 16usize..400,
        cancel in any::<bool>(),
    ) {
        check::<RoleClient>(Run { input: &input, cuts: &cuts, max, server: false, acks: false, cancel })?;
    }
}

proptest! {
    #![proptest_config(config(64))]

    /// Pure noise, in big lumps and small, with the smallest and a large limit.
    #[test]
    fn fuzz_raw_bytes_never_panic_or_hang(
        input in prop::collection::vec(any::<u8>(), 0..4096),
        cuts in cuts(),
        max in prop_oneof![Just(0usize), Just(1), 2usize..64, Just(1 << 16)],
        server in any::<bool>(),
        cancel in any::<bool>(),
    ) {
        let run = Run { input: &input, cuts: &cuts, max, server, acks: server, cancel };
        if server {
            check::<RoleServer>(run)?;
        } else {
            check::<RoleClient>(run)?;
        }
    }
}

/// A line at the limit is served, one byte over is refused, with `\n` and `\r\n` ends.
#[test]
fn fuzz_regression_the_limit_is_exact() {
    let line = request(1, 0);
    let max = line.len();
    for (input, server) in [
        ([&line[..], b"\n"].concat(), true),
        ([&line[..], b" \n"].concat(), true),
        ([&line[..], b"\r\n"].concat(), true),
        ([&line[..], b"\n"].concat(), false),
    ] {
        let run = Run {
            input: &input,
            cuts: &[(3, true)],
            max,
            server,
            acks: false,
            cancel: true,
        };
        let r = if server {
            check::<RoleServer>(run)
        } else {
            check::<RoleClient>(run)
        };
        r.unwrap();
    }
}

/// Found by `fuzz_client_lines_match_the_model`: a client skipped an unparsable or misshapen
/// line from the server and read on (only an oversized line closed the connection), so a
/// response it could not read left its request waiting. It closes now.
#[test]
fn fuzz_regression_a_client_closes_on_a_bad_frame() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let initialized = br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
    for (first, delivered) in [
        (&b"\x0e"[..], 0),
        (b"{not json", 0),
        (br#"{"id":8}"#, 0),
        (br#"{"jsonrpc":"2.0","id":3,"result":5,"method":3}"#, 0),
        // Not a bad frame: rmcp reads any notification (a custom one here), and both go on.
        (br#"{"jsonrpc":"2.0","method":"notifications/bogus"}"#, 2),
    ] {
        let input = [first, b"\n", initialized, b"\n"].concat();
        let run = Run {
            input: &input,
            cuts: &[(1 << 20, false)],
            max: 400,
            server: false,
            acks: false,
            cancel: false,
        };
        let got = rt.block_on(drive::<RoleClient>(&run));
        assert_eq!(
            got.messages.len(),
            delivered,
            "{}: {:?}",
            String::from_utf8_lossy(first),
            got.messages
        );
        assert!(got.written.is_empty(), "a client answered");
    }
}
