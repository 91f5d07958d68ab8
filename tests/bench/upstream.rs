//! The gateway's upstream client against the floor: one `tools/call` of `memo_set` to a
//! `herald memo` over Streamable HTTP on a kept-alive loopback connection, four ways, in turn
//! (one call of each, round after round, so the host's load falls on all alike):
//!
//! 1. raw: this bench's own HTTP/1.1 client (a `write` and a `read` on the socket), the floor;
//! 2. herald's upstream client, as the gateway calls an HTTP slug ([`Upstream::call_tool`],
//!    its direct path: reqwest's pooled client);
//! 3. hyper's HTTP/1.1 client with its connection on a task of its own (what reqwest runs on);
//! 4. hyper's HTTP/1.1 client with its connection driven in the caller's task.
//!
//! Prints each one's p50 and p90 and what it adds to raw at p50. No target: this is where
//! issue 33 item 4's hop goes (the HTTP slug's hop over direct is what the gateway's client
//! adds to an exchange, with the gateway's own handling), measured against what would replace
//! it. `cargo bench --bench upstream` (HERALD_BENCH_N overrides the 4,000 calls of each).

#[path = "common.rs"]
mod common;

use std::future::Future;
use std::pin::{Pin, pin};
use std::task::Poll;
use std::time::{Duration, Instant};

use bytes::Bytes;
use herald::mcp::call::Call;
use herald::transport::target::Target;
use herald::transport::tls::ClientTrust;
use herald::upstream::{Upstream, UpstreamConfig};
use http_body_util::{BodyExt as _, Full};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use serde_json::json;

const WARMUP: u64 = 400;
const WAYS: [&str; 4] = [
    "raw HTTP/1.1",
    "herald's client",
    "hyper, conn task",
    "hyper, in-task",
];

type Conn = http1::Connection<TokioIo<tokio::net::TcpStream>, Full<Bytes>>;

/// A `memo_set` request as hyper sends it.
fn request(path: &str, host: &str, id: u64) -> hyper::Request<Full<Bytes>> {
    let body = common::tool_call(id, "memo_set", &json!({"key": "k", "value": id}));
    hyper::Request::post(path)
        .header("host", host)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", "memo_set")
        .body(Full::new(Bytes::from(body)))
        .expect("a request")
}

/// Runs `f` while driving `conn` in this task (hyper's connection future does the I/O).
async fn driving<F: Future>(conn: &mut Pin<Box<Conn>>, f: F) -> F::Output {
    let mut f = pin!(f);
    std::future::poll_fn(|cx| {
        if let Poll::Ready(v) = f.as_mut().poll(cx) {
            return Poll::Ready(v);
        }
        if let Poll::Ready(r) = conn.as_mut().poll(cx) {
            panic!("the connection to the memo server ended: {r:?}");
        }
        f.as_mut().poll(cx)
    })
    .await
}

async fn hyper_connection(addr: std::net::SocketAddr) -> (http1::SendRequest<Full<Bytes>>, Conn) {
    let s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.set_nodelay(true).expect("TCP_NODELAY");
    http1::handshake(TokioIo::new(s)).await.expect("handshake")
}

/// A hyper answer holds the call's result.
fn check(way: usize, answer: &[u8]) {
    assert!(
        answer.windows(8).any(|w| w == b"\"result\""),
        "{}: no result in {:?}",
        WAYS[way],
        String::from_utf8_lossy(answer)
    );
}

#[tokio::main]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let n: u64 = std::env::var("HERALD_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4_000);
    println!(
        "upstream bench: tools/call memo_set to herald memo over Streamable HTTP, {n} calls each way, in turn; load {} ({})",
        common::load(),
        common::BIN
    );
    let (memo, v) = common::memo_with(common::BIN, &[]).await;
    let url = v["http_url"].as_str().expect("http_url").to_owned();
    let (addr, path) = common::split_url(&url);
    let host = addr.to_string();

    let mut raw = common::RawHttp::connect(&url, None).await.expect("connect");
    let herald = std::sync::Arc::new(Upstream::new(UpstreamConfig::new(
        Target::Http(url.clone()),
        ClientTrust::default(),
        4 << 20,
    )));
    herald.connect().await.expect("herald's client connects");
    let (mut spawned, conn) = hyper_connection(addr).await;
    tokio::spawn(conn);
    let (mut driven, conn) = hyper_connection(addr).await;
    let mut conn = Box::pin(conn);

    let mut times: [Vec<Duration>; 4] = Default::default();
    for round in 0..n + WARMUP {
        for (way, t) in times.iter_mut().enumerate() {
            let id = round * 4 + way as u64;
            let args = json!({"key": "k", "value": id});
            let t0 = Instant::now();
            match way {
                0 => raw
                    .call_tool(id, "memo_set", &args)
                    .await
                    .expect("a raw call"),
                1 => {
                    let answer = herald
                        .call_tool(
                            "memo_set",
                            args.as_object().unwrap().clone(),
                            Call::default(),
                        )
                        .await
                        .expect("a call through herald's client");
                    assert!(
                        format!("{answer:?}").contains("Result"),
                        "herald's client: {answer:?}"
                    );
                }
                2 => {
                    spawned.ready().await.expect("the connection is ready");
                    let r = spawned
                        .send_request(request(&path, &host, id))
                        .await
                        .expect("a hyper call");
                    check(
                        way,
                        &r.into_body().collect().await.expect("its body").to_bytes(),
                    );
                }
                _ => {
                    let answer = driving(&mut conn, async {
                        driven.ready().await.expect("the connection is ready");
                        let r = driven
                            .send_request(request(&path, &host, id))
                            .await
                            .expect("a hyper call");
                        r.into_body().collect().await.expect("its body").to_bytes()
                    })
                    .await;
                    check(way, &answer);
                }
            }
            if round >= WARMUP {
                t.push(t0.elapsed());
            }
        }
    }
    let mut raw_p50 = None;
    for (name, t) in WAYS.iter().zip(times.iter_mut()) {
        t.sort();
        let p50 = common::pct(t, 0.5);
        let floor = *raw_p50.get_or_insert(p50);
        println!(
            "{name:<17} p50 {} p90 {} | adds {} to raw at p50 ({:.2}x)",
            common::ms(p50),
            common::ms(common::pct(t, 0.9)),
            common::ms(p50.saturating_sub(floor)),
            p50.as_secs_f64() / floor.as_secs_f64()
        );
    }
    drop(memo);
}
