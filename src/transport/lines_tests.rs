//! Tests of [`LineTransport`] (`lines.rs`): bad lines answered and serving going on, lines
//! split across reads, the in-flight limit (waiting, parking, a cancel freeing a place, the
//! burst's end giving memory back), ids reused while in flight, and responses over the
//! message limit.

use super::in_flight::BURSTS_ENDED;
use super::*;
use rmcp::RoleServer;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn run(input: &[u8], max: usize) -> (Vec<String>, String) {
    let (client, server) = tokio::io::duplex(1 << 20);
    let (sr, sw) = tokio::io::split(server);
    let (mut cr, mut cw) = tokio::io::split(client);
    let mut t = LineTransport::<RoleServer>::new(sr, sw, max, true);
    cw.write_all(input).await.unwrap();
    cw.shutdown().await.unwrap();
    let mut methods = Vec::new();
    while let Some(m) = t.receive().await {
        let v = serde_json::to_value(&m).unwrap();
        methods.push(v["method"].as_str().unwrap_or("?").to_owned());
    }
    t.close().await.unwrap();
    let mut out = String::new();
    cr.read_to_string(&mut out).await.unwrap();
    (methods, out)
}

const PING: &str = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}"#;

#[tokio::test]
async fn malformed_line_gets_parse_error_and_serving_continues() {
    let input = format!("{{not json\n{PING}\n");
    let (methods, out) = run(input.as_bytes(), 1024).await;
    assert_eq!(methods, ["tools/list"]);
    let err: Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    assert_eq!(err["error"]["code"], -32700);
    assert_eq!(err["id"], Value::Null);
}

#[tokio::test]
async fn oversized_line_is_refused_and_the_next_one_served() {
    let big = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":9,\"method\":\"x\",\"params\":{{\"p\":\"{}\"}}}}\n",
        "a".repeat(5000)
    );
    let input = format!("{big}{PING}\n");
    let (methods, out) = run(input.as_bytes(), 1024).await;
    assert_eq!(methods, ["tools/list"]);
    let err: Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    assert_eq!(err["error"]["code"], -32600);
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("1024-byte limit")
    );
}

#[tokio::test]
async fn wrong_shape_gets_invalid_request_with_its_id() {
    let input =
        format!("{{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":5,\"method\":3}}\n[1,2]\n{PING}\n");
    let (methods, out) = run(input.as_bytes(), 1024).await;
    assert_eq!(methods, ["tools/list"]);
    let lines: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert_eq!(lines[0]["id"], 7);
    assert_eq!(lines[0]["error"]["code"], -32600);
}

#[tokio::test]
async fn line_split_across_reads_and_crlf() {
    let input = format!("\r\n{PING}\r\n\n{PING}");
    let (methods, _) = run(input.as_bytes(), 1024).await;
    // The last line has no newline before EOF and is incomplete: dropped.
    assert_eq!(methods, ["tools/list"]);
}

fn request(id: u64, method: &str) -> String {
    format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"{method}\",\"params\":{{}}}}\n")
}

fn answer(id: u64, result: Value) -> TxJsonRpcMessage<RoleServer> {
    serde_json::from_value(serde_json::json!({"jsonrpc":"2.0","id":id,"result":result})).unwrap()
}

/// A server transport with an in-flight limit, and the client's ends.
fn server_with_limit(
    max_line: usize,
    in_flight: usize,
) -> (
    LineTransport<RoleServer>,
    tokio::io::ReadHalf<tokio::io::DuplexStream>,
    tokio::io::WriteHalf<tokio::io::DuplexStream>,
) {
    let (client, server) = tokio::io::duplex(1 << 20);
    let (sr, sw) = tokio::io::split(server);
    let (cr, cw) = tokio::io::split(client);
    let t = LineTransport::<RoleServer>::new(sr, sw, max_line, true)
        .with_in_flight_limit(in_flight, 1 << 30);
    (t, cr, cw)
}

async fn next_frame(r: &mut BufReader<tokio::io::ReadHalf<tokio::io::DuplexStream>>) -> Value {
    let mut line = String::new();
    tokio::time::timeout(std::time::Duration::from_secs(10), r.read_line(&mut line))
        .await
        .expect("a frame")
        .unwrap();
    serde_json::from_str(&line).unwrap()
}

#[tokio::test(start_paused = true)]
async fn requests_past_the_in_flight_limit_wait_until_one_is_answered() {
    let (mut t, _cr, mut cw) = server_with_limit(1024, 2);
    for id in 1..=3 {
        cw.write_all(request(id, "tools/list").as_bytes())
            .await
            .unwrap();
    }
    for _ in 0..2 {
        assert!(t.receive().await.is_some());
    }
    // Two in flight: the third is not read (the paused clock runs the timeout out at once).
    let third = tokio::time::timeout(std::time::Duration::from_secs(60), t.receive()).await;
    assert!(third.is_err(), "a third request was read past the limit");
    t.send(answer(1, serde_json::json!({}))).await.unwrap();
    let third = tokio::time::timeout(std::time::Duration::from_secs(60), t.receive())
        .await
        .expect("answering one frees a place")
        .unwrap();
    assert_eq!(serde_json::to_value(&third).unwrap()["id"], 3);
}

#[tokio::test(start_paused = true)]
async fn a_cancel_read_past_the_limit_frees_a_place() {
    let (mut t, _cr, mut cw) = server_with_limit(1024, 1);
    cw.write_all(request(1, "memo_wait").as_bytes())
        .await
        .unwrap();
    cw.write_all(request(2, "tools/list").as_bytes())
        .await
        .unwrap();
    cw.write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/cancelled\",\"params\":{\"requestId\":1}}\n").await.unwrap();
    let one = serde_json::to_value(t.receive().await.unwrap()).unwrap();
    assert_eq!(one["id"], 1);
    // Request 2 waits for a place; the cancel behind it is read and passed on, and frees
    // request 1's place (rmcp sends no answer to a cancelled request).
    let cancel = serde_json::to_value(t.receive().await.unwrap()).unwrap();
    assert_eq!(cancel["method"], "notifications/cancelled");
    let two = tokio::time::timeout(std::time::Duration::from_secs(60), t.receive())
        .await
        .expect("the cancel freed a place")
        .unwrap();
    assert_eq!(serde_json::to_value(&two).unwrap()["id"], 2);
}

#[tokio::test(start_paused = true)]
async fn reading_stops_once_the_parked_requests_fill_their_allowance() {
    let (mut t, _cr, mut cw) = server_with_limit(1 << 16, 1);
    for id in 0..(PARKED_MAX as u64 + 10) {
        cw.write_all(request(id, "tools/list").as_bytes())
            .await
            .unwrap();
    }
    assert!(t.receive().await.is_some());
    let blocked = tokio::time::timeout(std::time::Duration::from_secs(60), t.receive()).await;
    assert!(blocked.is_err());
    assert_eq!(t.parked.len(), PARKED_MAX, "parked past the allowance");
    // Answers let them through in order.
    for id in 0..5u64 {
        t.send(answer(id, serde_json::json!({}))).await.unwrap();
        let next = serde_json::to_value(t.receive().await.unwrap()).unwrap();
        assert_eq!(next["id"], id + 1);
    }
}

#[tokio::test(start_paused = true)]
async fn memory_is_given_back_when_a_burst_ends() {
    use std::sync::atomic::Ordering;
    let (mut t, _cr, mut cw) = server_with_limit(1024, 2);
    let burst = |t: &LineTransport<RoleServer>| t.in_flight.as_ref().unwrap().0.running().burst;
    for id in 1..=2 {
        cw.write_all(request(id, "tools/list").as_bytes())
            .await
            .unwrap();
        assert!(t.receive().await.is_some());
    }
    t.send(answer(1, serde_json::json!({}))).await.unwrap();
    t.send(answer(2, serde_json::json!({}))).await.unwrap();
    assert!(!burst(&t), "within the limit is no burst");
    for id in 3..=5 {
        cw.write_all(request(id, "tools/list").as_bytes())
            .await
            .unwrap();
    }
    assert!(t.receive().await.is_some());
    assert!(t.receive().await.is_some());
    // The fifth finds no room: parked, and the connection is in a burst (the paused clock
    // runs the timeout out at once).
    let fifth = tokio::time::timeout(std::time::Duration::from_secs(60), t.receive()).await;
    assert!(fifth.is_err());
    assert!(burst(&t));
    let before = BURSTS_ENDED.load(Ordering::Relaxed);
    t.send(answer(3, serde_json::json!({}))).await.unwrap();
    assert!(t.receive().await.is_some(), "the fifth gets the place");
    t.send(answer(4, serde_json::json!({}))).await.unwrap();
    assert!(burst(&t), "one still in flight: the burst goes on");
    t.send(answer(5, serde_json::json!({}))).await.unwrap();
    assert!(!burst(&t), "nothing in flight: the burst is over");
    assert!(BURSTS_ENDED.load(Ordering::Relaxed) > before);
}

#[tokio::test]
async fn a_request_reusing_an_id_in_flight_is_refused_by_id() {
    let (mut t, cr, mut cw) = server_with_limit(1024, 8);
    let mut cr = BufReader::new(cr);
    cw.write_all(request(7, "events/poll").as_bytes())
        .await
        .unwrap();
    cw.write_all(request(7, "tools/list").as_bytes())
        .await
        .unwrap();
    cw.write_all(request(8, "tools/list").as_bytes())
        .await
        .unwrap();
    let first = serde_json::to_value(t.receive().await.unwrap()).unwrap();
    assert_eq!(first["method"], "events/poll");
    // The duplicate is answered by the transport, and the next request comes through.
    let next = serde_json::to_value(t.receive().await.unwrap()).unwrap();
    assert_eq!(next["id"], 8);
    let refused = next_frame(&mut cr).await;
    assert_eq!(refused["id"], 7);
    assert_eq!(refused["error"]["code"], -32600);
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("request id 7 is already in flight"),
        "{refused}"
    );
    // Once 7 is answered its id may be used again.
    t.send(answer(7, serde_json::json!({"events": []})))
        .await
        .unwrap();
    assert_eq!(
        next_frame(&mut cr).await["result"]["events"],
        serde_json::json!([])
    );
    cw.write_all(request(7, "tools/list").as_bytes())
        .await
        .unwrap();
    let again = serde_json::to_value(t.receive().await.unwrap()).unwrap();
    assert_eq!(
        (again["id"].clone(), again["method"].clone()),
        (7.into(), "tools/list".into())
    );
}

#[tokio::test]
async fn a_response_over_the_message_limit_goes_out_as_an_error() {
    let (mut t, cr, mut cw) = server_with_limit(256, 8);
    let mut cr = BufReader::new(cr);
    cw.write_all(request(3, "resources/read").as_bytes())
        .await
        .unwrap();
    assert!(t.receive().await.is_some());
    t.send(answer(3, serde_json::json!({"text": "x".repeat(1000)})))
        .await
        .unwrap();
    let frame = next_frame(&mut cr).await;
    assert_eq!(frame["id"], 3);
    assert_eq!(frame["error"]["code"], -32603);
    assert_eq!(frame["error"]["data"]["reason"], "too_large");
    assert_eq!(frame["error"]["data"]["limit"], 256);
    assert!(
        frame["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--max-message-bytes")
    );
    // A small answer goes out as it is.
    cw.write_all(request(4, "tools/list").as_bytes())
        .await
        .unwrap();
    assert!(t.receive().await.is_some());
    t.send(answer(4, serde_json::json!({"tools": []})))
        .await
        .unwrap();
    assert_eq!(
        next_frame(&mut cr).await["result"]["tools"],
        serde_json::json!([])
    );
}

/// A listen's `taskIds` go beside the parsed request, its body as sent; a client cannot put
/// them there through `_meta`.
#[tokio::test]
async fn a_listens_task_ids_go_beside_the_request_and_cannot_be_forged() {
    let (client, server) = tokio::io::duplex(1 << 20);
    let (sr, sw) = tokio::io::split(server);
    let (_cr, mut cw) = tokio::io::split(client);
    let mut t = LineTransport::<RoleServer>::new(sr, sw, 1 << 20, true).with_task_ids_carried();
    let listen = |id: u64, notifications: Value, meta: Value| {
        json!({"jsonrpc": "2.0", "id": id, "method": "subscriptions/listen",
               "params": {"notifications": notifications, "_meta": meta}})
        .to_string()
            + "\n"
    };
    let input = listen(1, json!({"taskIds": ["t1"]}), json!({}))
        + &listen(
            2,
            json!({"toolsListChanged": true}),
            json!({"io.herald/taskIds": ["t2"]}),
        );
    cw.write_all(input.as_bytes()).await.unwrap();
    cw.shutdown().await.unwrap();
    let mut seen = Vec::new();
    while let Some(m) = t.receive().await {
        let JsonRpcMessage::Request(r) = m else {
            panic!("a request")
        };
        let ids = rmcp::model::GetExtensions::extensions(&r.request)
            .get::<ListenTaskIds>()
            .cloned();
        let meta = serde_json::to_value(&r.request).unwrap()["params"]["_meta"].clone();
        seen.push((ids, meta));
    }
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].0, Some(ListenTaskIds(json!(["t1"]))));
    assert_eq!(seen[0].1, json!({}), "the body is as sent");
    assert_eq!(seen[1].0, None, "`_meta` carries no taskIds");
}

/// Sends requests on a client transport whose peer reads nothing until its way out is full:
/// the stream's buffer, the writer task stuck writing, the queue full and more sends waiting
/// for room (as rmcp's spawned sends would).
async fn fill_client_output(t: &mut LineTransport<rmcp::RoleClient>) -> usize {
    use futures::FutureExt as _;
    let mut waiting = 0;
    let mut sent = 0;
    for id in 0.. {
        sent += 1;
        let ping: TxJsonRpcMessage<rmcp::RoleClient> =
            serde_json::from_value(json!({"jsonrpc":"2.0","id":id,"method":"ping"})).unwrap();
        let mut sent = Box::pin(t.send(ping));
        if (&mut sent).now_or_never().is_none() {
            tokio::spawn(sent);
            waiting += 1;
            if waiting > 2 * out::WRITE_QUEUE {
                break;
            }
        }
    }
    // The writer task and the waiting sends run until the queue stays full.
    let out = t.out.as_ref().unwrap();
    for _ in 0..10_000 {
        if out.room().now_or_never().is_none() {
            return sent;
        }
        tokio::task::yield_now().await;
    }
    panic!("the way out never filled");
}

#[tokio::test]
async fn a_client_reads_its_answers_while_its_own_output_waits() {
    // The server reads nothing (as a server at its own output's limit does): the client's
    // queue fills. Its answers must still be read, or both sides would wait on each other.
    let (client, server) = tokio::io::duplex(1024);
    let (cr, cw) = tokio::io::split(client);
    let (_sr, mut sw) = tokio::io::split(server);
    let mut t = LineTransport::<rmcp::RoleClient>::new(cr, cw, 1 << 20, false);
    fill_client_output(&mut t).await;
    sw.write_all(b"{\"jsonrpc\":\"2.0\",\"id\":0,\"result\":{}}\n")
        .await
        .unwrap();
    let read = tokio::time::timeout(std::time::Duration::from_secs(10), t.receive())
        .await
        .expect("the answer is read while the output waits")
        .expect("a message");
    assert_eq!(serde_json::to_value(&read).unwrap()["id"], 0);
}

#[tokio::test(start_paused = true)]
async fn closing_gives_up_on_a_peer_that_does_not_read() {
    let (client, server) = tokio::io::duplex(1024);
    let (cr, cw) = tokio::io::split(client);
    let (_sr, _sw) = tokio::io::split(server);
    let mut t = LineTransport::<rmcp::RoleClient>::new(cr, cw, 1 << 20, false);
    fill_client_output(&mut t).await;
    let started = tokio::time::Instant::now();
    tokio::time::timeout(CLOSE_WAIT * 2, t.close())
        .await
        .expect("close ends though the peer reads nothing")
        .unwrap();
    assert!(
        started.elapsed() >= CLOSE_WAIT,
        "it waited for the writer first"
    );
}

#[tokio::test(start_paused = true)]
async fn closing_waits_for_a_slow_peer_that_still_reads() {
    let (client, server) = tokio::io::duplex(1024);
    let (cr, cw) = tokio::io::split(client);
    let (mut sr, _sw) = tokio::io::split(server);
    let mut t = LineTransport::<rmcp::RoleClient>::new(cr, cw, 1 << 20, false);
    let sent = fill_client_output(&mut t).await;
    // A kilobyte every 6 s: slower than the whole wait, never idle for all of it.
    let reader = tokio::spawn(async move {
        let mut all = Vec::new();
        let mut buf = [0u8; 1024];
        loop {
            tokio::time::sleep(std::time::Duration::from_secs(6)).await;
            match sr.read(&mut buf).await.unwrap() {
                0 => return all,
                n => all.extend_from_slice(&buf[..n]),
            }
        }
    });
    t.close().await.unwrap();
    let all = tokio::time::timeout(std::time::Duration::from_secs(3600), reader)
        .await
        .expect("the stream ends once everything is written")
        .unwrap();
    let ids: Vec<u64> = String::from_utf8(all)
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["id"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(ids.len(), sent, "every frame sent reached the slow peer");
}

#[tokio::test]
async fn a_client_closes_on_a_server_that_floods_requests_and_reads_no_answer() {
    use futures::FutureExt as _;
    let (client, server) = tokio::io::duplex(1024);
    let (cr, cw) = tokio::io::split(client);
    let (_sr, mut sw) = tokio::io::split(server);
    let mut t = LineTransport::<rmcp::RoleClient>::new(cr, cw, 1 << 20, false);
    tokio::spawn(async move {
        for id in 0..4000 {
            let ping = format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"ping\"}}\n");
            if sw.write_all(ping.as_bytes()).await.is_err() {
                return;
            }
        }
        std::future::pending::<()>().await;
    });
    let mut pings = 0;
    loop {
        let read = tokio::time::timeout(std::time::Duration::from_secs(10), t.receive())
            .await
            .expect("the client reads on while its answers wait");
        let Some(m) = read else { break };
        let id = serde_json::to_value(&m).unwrap()["id"].clone();
        pings += 1;
        // Answered as rmcp would: the send's future spawned when it has to wait.
        let pong: TxJsonRpcMessage<rmcp::RoleClient> =
            serde_json::from_value(json!({"jsonrpc":"2.0","id":id,"result":{}})).unwrap();
        let mut sent = Box::pin(t.send(pong));
        if (&mut sent).now_or_never().is_none() {
            tokio::spawn(sent);
        }
    }
    assert!(
        pings > OWED_MAX && pings < 2 * OWED_MAX + out::WRITE_QUEUE,
        "closed after {pings} requests"
    );
}

#[tokio::test]
async fn a_client_stops_reading_once_nothing_it_sends_gets_out() {
    // The way out is a pipe whose other end is gone; the way in stays open and quiet.
    let (gone, dead) = tokio::io::duplex(1024);
    drop(gone);
    let (client, _server) = tokio::io::duplex(1024);
    let (cr, _cw) = tokio::io::split(client);
    let mut t = LineTransport::<rmcp::RoleClient>::new(cr, dead, 1 << 20, false);
    let ping: TxJsonRpcMessage<rmcp::RoleClient> =
        serde_json::from_value(json!({"jsonrpc":"2.0","id":1,"method":"ping"})).unwrap();
    assert!(t.send(ping).await.is_err());
    let read = tokio::time::timeout(std::time::Duration::from_secs(10), t.receive())
        .await
        .expect("reading ends with the writer");
    assert!(read.is_none());
}
