//! Delivery of `notifications/tools/list_changed` and `notifications/prompts/list_changed`
//! on every listen path: admission, a byte stream (the session's peer), and HTTP both ways
//! herald answers a listen itself (first on its connection, straight to the socket; later,
//! through hyper). No sleeps: every wait is for a message, under a timeout.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use crate::mcp::admission::ConnStreams;
use crate::mcp::hub::ChangeFeed;
use crate::mcp::limits::Limits;
use crate::mcp::server::SourceServer;
use crate::mcp::source::{
    Admission, Caller, Contents, ListenFilter, PROMPTS_CHANGED, Source, SourceError, SourceInfo,
    TOOLS_CHANGED, WatchGuard,
};

use crate::mcp::lists::Lists;

const WAIT: Duration = Duration::from_secs(10);

/// A source whose lists change when `changing` (the conformance fixture's shape), accepting
/// every URI under the URI itself.
struct Lister {
    feed: ChangeFeed,
    changing: bool,
}

#[async_trait::async_trait]
impl Source for Lister {
    fn info(&self) -> SourceInfo {
        SourceInfo {
            name: "lister".into(),
            list_changed: self.changing,
            ..SourceInfo::default()
        }
    }
    fn resources(&self, _: &Caller) -> Vec<rmcp::model::Resource> {
        Vec::new()
    }
    async fn read(
        &self,
        _: &Caller,
        read: crate::mcp::source::Read<'_>,
    ) -> Result<Contents, SourceError> {
        Err(SourceError::NotFound {
            uri: read.uri.into(),
        })
    }
    async fn admit(&self, _: &Caller, filter: &ListenFilter) -> Admission {
        let mut a = Admission::default();
        for uri in filter.uris() {
            a.accept(&uri, uri.clone(), WatchGuard::none());
        }
        a
    }
    fn changes(&self) -> ChangeFeed {
        self.feed.clone()
    }
}

fn server(changing: bool, shutdown: &CancellationToken) -> (SourceServer, ChangeFeed) {
    let feed = ChangeFeed::new();
    let source = Lister {
        feed: feed.clone(),
        changing,
    };
    let s = SourceServer::new(Arc::new(source), Limits::default(), shutdown.clone());
    (s, feed)
}

fn meta() -> Value {
    json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"}})
}

fn listen(id: &str, notifications: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "subscriptions/listen",
        "params": {"_meta": meta(), "notifications": notifications}})
}

fn sub_id(v: &Value) -> Option<&str> {
    v.pointer("/params/_meta/io.modelcontextprotocol~1subscriptionId")
        .and_then(Value::as_str)
}

fn is(v: &Value, method: &str, id: &str) -> bool {
    v["method"] == method && sub_id(v) == Some(id)
}

#[tokio::test]
async fn admission_accepts_a_list_only_where_the_lists_change() {
    let shutdown = CancellationToken::new();
    let asked = ListenFilter::from_params(Some(&json!({"notifications": {
        "toolsListChanged": true, "resourceSubscriptions": ["x://a"]}})))
    .unwrap();
    let (changing, feed) = server(true, &shutdown);
    let l = changing
        .open(&Caller::default(), &asked, &ConnStreams::default())
        .await
        .unwrap()
        .1;
    assert_eq!(
        l.lists(),
        Lists {
            tools: true,
            prompts: false
        },
        "what was asked, no more"
    );
    assert_eq!(feed.listeners(TOOLS_CHANGED), 1, "registered under the key");
    assert_eq!(feed.listeners(PROMPTS_CHANGED), 0);
    feed.publish(TOOLS_CHANGED);
    let batch = tokio::time::timeout(WAIT, l.registration.queue().next_batch())
        .await
        .unwrap();
    assert_eq!(batch, vec![TOOLS_CHANGED.to_string()]);
    drop(l);
    assert_eq!(
        feed.listeners(TOOLS_CHANGED),
        0,
        "unregistered with the listen"
    );

    let (still, feed) = server(false, &shutdown);
    let l = still
        .open(&Caller::default(), &asked, &ConnStreams::default())
        .await
        .unwrap()
        .1;
    assert_eq!(
        l.lists(),
        Lists::default(),
        "a server whose lists never change"
    );
    assert_eq!(l.uris(), vec!["x://a".to_string()]);
    assert_eq!(feed.listeners(TOOLS_CHANGED), 0);
}

/// A byte-stream connection (stdio, QUIC) to `server`: newline-delimited JSON both ways.
struct Lines {
    write: tokio::io::WriteHalf<tokio::io::DuplexStream>,
    read: tokio::io::Lines<BufReader<tokio::io::ReadHalf<tokio::io::DuplexStream>>>,
}

impl Lines {
    fn open(server: &SourceServer, shutdown: &CancellationToken) -> Lines {
        let (client, served) = tokio::io::duplex(1 << 16);
        let (sr, sw) = tokio::io::split(served);
        let service = server.for_connection();
        tokio::spawn(super::lines::serve(service, sr, sw, shutdown.child_token()));
        let (read, write) = tokio::io::split(client);
        Lines {
            write,
            read: BufReader::new(read).lines(),
        }
    }

    async fn send(&mut self, v: &Value) {
        let line = format!("{v}\n");
        self.write.write_all(line.as_bytes()).await.unwrap();
    }

    /// Everything read until `pred` holds (the match last).
    async fn until(&mut self, pred: impl Fn(&Value) -> bool) -> Vec<Value> {
        let mut seen = Vec::new();
        loop {
            let line = tokio::time::timeout(WAIT, self.read.next_line())
                .await
                .unwrap_or_else(|_| panic!("a line in time after {seen:?}"))
                .unwrap()
                .expect("the server is still there");
            let v: Value = serde_json::from_str(&line).unwrap();
            let done = pred(&v);
            seen.push(v);
            if done {
                return seen;
            }
        }
    }
}

#[tokio::test]
async fn a_byte_stream_listen_gets_the_lists_it_asked_for_and_no_other() {
    let shutdown = CancellationToken::new();
    let (s, feed) = server(true, &shutdown);
    let mut conn = Lines::open(&s, &shutdown);
    conn.send(&listen(
        "L1",
        json!({"toolsListChanged": true, "promptsListChanged": true}),
    ))
    .await;
    let ack = conn
        .until(|v| is(v, "notifications/subscriptions/acknowledged", "L1"))
        .await
        .pop()
        .unwrap();
    assert_eq!(
        ack["params"]["notifications"],
        json!({"toolsListChanged": true, "promptsListChanged": true}),
        "{ack}"
    );
    conn.send(&listen("L2", json!({"resourceSubscriptions": ["x://a"]})))
        .await;
    conn.until(|v| is(v, "notifications/subscriptions/acknowledged", "L2"))
        .await;
    // L2 did not ask: were it registered for the list, its change would come before x://a's.
    feed.publish(TOOLS_CHANGED);
    feed.publish("x://a");
    let mut seen = conn
        .until(|v| is(v, "notifications/resources/updated", "L2"))
        .await;
    if !seen
        .iter()
        .any(|v| is(v, "notifications/tools/list_changed", "L1"))
    {
        seen.extend(
            conn.until(|v| is(v, "notifications/tools/list_changed", "L1"))
                .await,
        );
    }
    assert!(
        !seen
            .iter()
            .any(|v| sub_id(v) == Some("L2") && v["method"] == "notifications/tools/list_changed"),
        "{seen:?}"
    );
    feed.publish(PROMPTS_CHANGED);
    conn.until(|v| is(v, "notifications/prompts/list_changed", "L1"))
        .await;
    shutdown.cancel();
}

#[tokio::test]
async fn a_byte_stream_ack_leaves_lists_out_where_they_never_change() {
    let shutdown = CancellationToken::new();
    let (s, _feed) = server(false, &shutdown);
    let mut conn = Lines::open(&s, &shutdown);
    conn.send(&listen(
        "L",
        json!({"toolsListChanged": true, "resourceSubscriptions": ["x://a"]}),
    ))
    .await;
    let ack = conn
        .until(|v| is(v, "notifications/subscriptions/acknowledged", "L"))
        .await
        .pop()
        .unwrap();
    assert_eq!(
        ack["params"]["notifications"],
        json!({"resourceSubscriptions": ["x://a"]}),
        "{ack}"
    );
    shutdown.cancel();
}

/// `server` on HTTP at a port-0 address.
async fn http(server: SourceServer, shutdown: &CancellationToken) -> std::net::SocketAddr {
    use super::http;
    let listener = http::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let endpoint = http::router(
        server,
        addr,
        &http::HttpOptions::default(),
        shutdown.clone(),
        &crate::runtime::metrics::Metrics::default(),
    );
    tokio::spawn(http::serve(
        listener,
        endpoint,
        shutdown.clone(),
        Duration::from_secs(1),
    ));
    addr
}

fn post(body: &Value) -> Vec<u8> {
    post_as(body, "application/json, text/event-stream")
}

/// A listen posted with `accept` (one with a quoted parameter is not the plain shape herald
/// answers itself: rmcp's own listen handling answers it).
fn post_as(body: &Value, accept: &str) -> Vec<u8> {
    let body = body.to_string();
    format!(
        "POST /mcp HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n\
         accept: {accept}\r\nmcp-protocol-version: 2026-07-28\r\n\
         mcp-method: subscriptions/listen\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Reads SSE events from `client` (after `seen`) until one satisfies `pred`; returns it.
async fn event(client: &mut TcpStream, seen: &mut Vec<u8>, pred: impl Fn(&Value) -> bool) -> Value {
    loop {
        let text = String::from_utf8_lossy(seen).into_owned();
        let found = text
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter_map(|d| serde_json::from_str::<Value>(d).ok())
            .find(|v| pred(v));
        if let Some(v) = found {
            return v;
        }
        let mut buf = [0u8; 4096];
        let n = tokio::time::timeout(WAIT, client.read(&mut buf))
            .await
            .unwrap_or_else(|_| panic!("an event in time after {text}"))
            .unwrap();
        assert!(n > 0, "closed after {text}");
        seen.extend_from_slice(&buf[..n]);
    }
}

#[tokio::test]
async fn an_http_listen_gets_list_changes_first_on_its_connection_and_later() {
    let shutdown = CancellationToken::new();
    let (s, feed) = server(true, &shutdown);
    let addr = http(s, &shutdown).await;
    // First on its connection: answered on the socket.
    let mut first = TcpStream::connect(addr).await.unwrap();
    first
        .write_all(&post(&listen("F", json!({"toolsListChanged": true}))))
        .await
        .unwrap();
    let mut first_seen = Vec::new();
    let ack = event(&mut first, &mut first_seen, |v| {
        is(v, "notifications/subscriptions/acknowledged", "F")
    })
    .await;
    assert_eq!(
        ack["params"]["notifications"],
        json!({"toolsListChanged": true})
    );
    // After another request on its connection: through hyper, herald's SSE body.
    let mut later = TcpStream::connect(addr).await.unwrap();
    later
        .write_all(b"GET /live HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let mut live = Vec::new();
    while !String::from_utf8_lossy(&live).ends_with("ok\n") {
        let mut buf = [0u8; 1024];
        let n = tokio::time::timeout(WAIT, later.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0);
        live.extend_from_slice(&buf[..n]);
    }
    later
        .write_all(&post(&listen(
            "H",
            json!({"promptsListChanged": true, "resourceSubscriptions": ["x://a"]}),
        )))
        .await
        .unwrap();
    let mut later_seen = Vec::new();
    let ack = event(&mut later, &mut later_seen, |v| {
        is(v, "notifications/subscriptions/acknowledged", "H")
    })
    .await;
    assert_eq!(
        ack["params"]["notifications"],
        json!({"promptsListChanged": true, "resourceSubscriptions": ["x://a"]})
    );
    // Each stream gets its own list, and not the other's (the other's change goes first).
    feed.publish(PROMPTS_CHANGED);
    feed.publish(TOOLS_CHANGED);
    feed.publish("x://a");
    event(&mut first, &mut first_seen, |v| {
        is(v, "notifications/tools/list_changed", "F")
    })
    .await;
    event(&mut later, &mut later_seen, |v| {
        is(v, "notifications/prompts/list_changed", "H")
    })
    .await;
    event(&mut later, &mut later_seen, |v| {
        is(v, "notifications/resources/updated", "H")
    })
    .await;
    let text = String::from_utf8_lossy(&later_seen);
    assert!(!text.contains("tools/list_changed"), "{text}");
    let text = String::from_utf8_lossy(&first_seen);
    assert!(!text.contains("prompts/list_changed"), "{text}");
    shutdown.cancel();
}

#[tokio::test]
async fn an_http_listen_rmcp_answers_gets_list_changes_too() {
    let shutdown = CancellationToken::new();
    let (s, feed) = server(true, &shutdown);
    let addr = http(s, &shutdown).await;
    let mut client = TcpStream::connect(addr).await.unwrap();
    let body = listen("R", json!({"toolsListChanged": true}));
    client
        .write_all(&post_as(
            &body,
            "application/json, text/event-stream;x=\"1\"",
        ))
        .await
        .unwrap();
    let mut seen = Vec::new();
    let ack = event(&mut client, &mut seen, |v| {
        is(v, "notifications/subscriptions/acknowledged", "R")
    })
    .await;
    assert_eq!(
        ack["params"]["notifications"],
        json!({"toolsListChanged": true})
    );
    feed.publish(PROMPTS_CHANGED);
    feed.publish(TOOLS_CHANGED);
    event(&mut client, &mut seen, |v| {
        is(v, "notifications/tools/list_changed", "R")
    })
    .await;
    let text = String::from_utf8_lossy(&seen);
    assert!(!text.contains("prompts/list_changed"), "{text}");
    shutdown.cancel();
}

/// A listen in a shape rmcp checks (a quoted `Accept` parameter) gets the acknowledgment
/// admission built, as a plain one does: the lists the server never changes left out and the
/// `taskIds` echoed (none of this caller's), where rmcp's own acknowledgment would name the
/// request as sent and could not carry `taskIds`.
#[tokio::test]
async fn an_http_listen_rmcp_checks_gets_the_acknowledgment_admission_built() {
    let shutdown = CancellationToken::new();
    let (s, _feed) = server(false, &shutdown);
    let addr = http(s, &shutdown).await;
    let mut client = TcpStream::connect(addr).await.unwrap();
    let mut body = listen("K", json!({"toolsListChanged": true, "taskIds": ["t1"]}));
    body["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"] =
        json!({"extensions": {"io.modelcontextprotocol/tasks": {}}});
    client
        .write_all(&post_as(
            &body,
            "application/json, text/event-stream;x=\"1\"",
        ))
        .await
        .unwrap();
    let mut seen = Vec::new();
    let ack = event(&mut client, &mut seen, |v| {
        is(v, "notifications/subscriptions/acknowledged", "K")
    })
    .await;
    assert_eq!(ack["params"]["notifications"], json!({"taskIds": []}));
    shutdown.cancel();
}

#[tokio::test]
async fn an_http_ack_leaves_lists_out_where_they_never_change() {
    let shutdown = CancellationToken::new();
    let (s, _feed) = server(false, &shutdown);
    let addr = http(s, &shutdown).await;
    let mut client = TcpStream::connect(addr).await.unwrap();
    client
        .write_all(&post(&listen(
            "N",
            json!({"toolsListChanged": true, "promptsListChanged": true}),
        )))
        .await
        .unwrap();
    let mut seen = Vec::new();
    let ack = event(&mut client, &mut seen, |v| {
        is(v, "notifications/subscriptions/acknowledged", "N")
    })
    .await;
    assert_eq!(ack["params"]["notifications"], json!({}), "{ack}");
    shutdown.cancel();
}
