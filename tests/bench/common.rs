//! Helpers every benchmark shares (each bench is its own crate and includes this file with
//! `#[path = "common.rs"] mod common;`).
#![allow(dead_code)]

use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Child;

pub const BIN: &str = env!("CARGO_BIN_EXE_herald");

/// The `p` quantile of sorted durations.
pub fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

pub fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

/// The processes whose parent is `pid`.
pub fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        let Some(after) = stat.rsplit_once(") ").map(|x| x.1) else {
            continue;
        };
        if after.split(' ').nth(1) == Some(&pid.to_string())
            && let Some(p) = e.file_name().to_str().and_then(|s| s.parse().ok())
        {
            out.push(p);
        }
    }
    out
}

/// Resident memory of `pid`, in KiB.
pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Awaits herald's JSON `listening` line on `child`'s stderr, then keeps draining stderr.
pub async fn listening(child: &mut Child) -> Value {
    let mut lines = BufReader::new(child.stderr.take().expect("stderr piped")).lines();
    let v = loop {
        let l = lines
            .next_line()
            .await
            .unwrap()
            .expect("herald printed its addresses");
        let Ok(mut v) = serde_json::from_str::<Value>(&l) else {
            continue;
        };
        // A stdio server's own line, relayed in the client's log.
        if v["event"] == "upstream.stderr"
            && let Some(Ok(inner)) = v["message"].as_str().map(serde_json::from_str::<Value>)
        {
            v = inner;
        }
        if v["event"] == "listening" {
            break v;
        }
    };
    // HERALD_BENCH_SERVER_LOG=1: the servers' own log lines on this bench's stderr.
    let show = std::env::var_os("HERALD_BENCH_SERVER_LOG").is_some();
    tokio::spawn(async move {
        while let Ok(Some(l)) = lines.next_line().await {
            if show {
                eprintln!("server: {l}");
            }
        }
    });
    v
}

/// Runs `herald --log-format json ARGS` (a server role) and returns it with its `listening`
/// line.
pub async fn serve(args: &[&str]) -> (Child, Value) {
    serve_with(BIN, args).await
}

/// A `herald memo` on a memory store serving HTTP and QUIC on any ports, from the herald at
/// `bin`, with `extra` flags; what [`serve_with`] gives back.
#[allow(dead_code)] // not every bench starts a memo
pub async fn memo_with(bin: &str, extra: &[&str]) -> (Child, Value) {
    let mut args = vec![
        "--store",
        ":memory:",
        "memo",
        "--http",
        "127.0.0.1:0",
        "--quic",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(extra);
    serve_with(bin, &args).await
}

/// [`serve`] with the herald binary at `bin` (this build's or a baseline's).
pub async fn serve_with(bin: &str, args: &[&str]) -> (Child, Value) {
    let mut child = tokio::process::Command::new(bin)
        .arg("--log-format")
        .arg("json")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn herald");
    let v = listening(&mut child).await;
    (child, v)
}

// === Before and after: A-B-B-A against a baseline binary ===
//
// With `HERALD_BENCH_BASELINE=/path/to/an/older/herald`, a bench runs each measured case with
// that binary and with this build in turn, in the same run, and prints this build's figures
// over the baseline's. Every process a case spawns must come from the side's binary
// ([`Build::bin`]). Both binaries must be built with one profile (`cargo bench` builds this one
// with the bench profile, which measured 15-20 % slower than the release profile's fat LTO).

/// The herald binary one run of a case uses, and the share of the case's work it does.
#[derive(Clone, Copy, Debug)]
pub struct Build {
    pub bin: &'static str,
    /// The baseline's binary, not this build's.
    pub baseline: bool,
    /// How many runs of this side the case makes (1 alone, 2 in A-B-B-A).
    runs: usize,
}

impl Build {
    /// This build, alone: the whole of the work in one run.
    pub const THIS: Build = Build {
        bin: BIN,
        baseline: false,
        runs: 1,
    };

    /// `name`, or `name (baseline)`.
    pub fn label(&self, name: &str) -> String {
        if self.baseline {
            format!("{name} (baseline)")
        } else {
            name.to_owned()
        }
    }

    /// This run's share of `n` units of work (calls, rounds): all of it alone, half in
    /// A-B-B-A (at least 1).
    pub fn part(&self, n: usize) -> usize {
        (n / self.runs).max(1)
    }
}

/// The baseline binary of `HERALD_BENCH_BASELINE`, if it is set (and not empty), as an
/// absolute path (a gateway's stdio slug runs it too).
pub fn baseline() -> Option<&'static str> {
    let path = std::env::var("HERALD_BENCH_BASELINE").ok()?;
    if path.is_empty() {
        return None;
    }
    let full = std::fs::canonicalize(&path)
        .unwrap_or_else(|e| panic!("HERALD_BENCH_BASELINE={path}: {e}"));
    assert!(full.is_file(), "HERALD_BENCH_BASELINE={path}: not a file");
    let full = full
        .into_os_string()
        .into_string()
        .expect("HERALD_BENCH_BASELINE: a UTF-8 path");
    Some(Box::leak(full.into_boxed_str()))
}

/// What each side of a case measured, one entry per run in the order they ran (`baseline` is
/// empty without a baseline).
pub struct Sides<T> {
    pub baseline: Vec<T>,
    pub this: Vec<T>,
}

/// Runs one measured case. Without a baseline: `run(Build::THIS)` once. With one: A-B-B-A
/// (baseline, this build, this build, baseline), each run doing half the work
/// ([`Build::part`]): a run after another is a little slower on a small machine (measured:
/// 1-8 % with the same binary twice), and the order cancels that.
pub async fn compare<T>(
    baseline: Option<&'static str>,
    mut run: impl AsyncFnMut(Build) -> T,
) -> Sides<T> {
    let Some(bin) = baseline else {
        return Sides {
            baseline: Vec::new(),
            this: vec![run(Build::THIS).await],
        };
    };
    let base = Build {
        bin,
        baseline: true,
        runs: 2,
    };
    let this = Build {
        runs: 2,
        ..Build::THIS
    };
    let a1 = run(base).await;
    let b1 = run(this).await;
    let b2 = run(this).await;
    let a2 = run(base).await;
    Sides {
        baseline: vec![a1, a2],
        this: vec![b1, b2],
    }
}

/// Runs' durations together, sorted.
pub fn merged<'a>(runs: impl IntoIterator<Item = &'a [Duration]>) -> Vec<Duration> {
    let mut all: Vec<Duration> = runs.into_iter().flatten().copied().collect();
    all.sort();
    all
}

impl Sides<Vec<Duration>> {
    /// Each side's runs merged and sorted: (baseline, this build).
    pub fn latencies(&self) -> (Vec<Duration>, Vec<Duration>) {
        (
            merged(self.baseline.iter().map(Vec::as_slice)),
            merged(self.this.iter().map(Vec::as_slice)),
        )
    }
}

/// Prints `NAME: this build / baseline: p50 X.XXx, p99 Y.YYx` from each side's latencies
/// (sorted).
pub fn print_ratio(name: &str, baseline: &[Duration], this: &[Duration]) {
    let ratio = |q: f64| pct(this, q).as_secs_f64() / pct(baseline, q).as_secs_f64();
    println!(
        "{name}: this build / baseline: p50 {:.2}x, p99 {:.2}x",
        ratio(0.5),
        ratio(0.99)
    );
}

/// Prints `NAME: this build / baseline: calls/s X.XXx` (a throughput: above 1 is faster).
pub fn print_rate_ratio(name: &str, baseline: f64, this: f64) {
    println!(
        "{name}: this build / baseline: calls/s {:.2}x",
        this / baseline
    );
}

/// A header line naming the baseline, when there is one.
pub fn print_baseline(baseline: Option<&str>) {
    if let Some(b) = baseline {
        println!(
            "baseline (HERALD_BENCH_BASELINE): {b}; each case runs A-B-B-A, half the work per run"
        );
    }
}

// === Raw MCP over HTTP/1.1 (the gateway and fan-out benches) ===
//
// A load generator must cost less than what it measures, so these benches speak Streamable
// HTTP themselves: one keep-alive TCP connection per simulated client, requests written by
// hand, responses framed by Content-Length or chunked encoding, bodies read as JSON or SSE.

/// The per-request `_meta` of a 2026-07-28 request, as JSON text.
pub const META: &str = r#"{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{},"io.modelcontextprotocol/clientInfo":{"name":"herald-bench","version":"1"}}"#;

/// A `tools/call` request body.
pub fn tool_call(id: u64, name: &str, args: &Value) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"_meta":{META},"name":{},"arguments":{args}}}}}"#,
        Value::from(name)
    )
}

/// A `subscriptions/listen` request body for resource `uri`.
pub fn listen_request(id: u64, uri: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"subscriptions/listen","params":{{"_meta":{META},"notifications":{{"resourceSubscriptions":[{}]}}}}}}"#,
        Value::from(uri)
    )
}

/// `http://HOST:PORT/PATH` split up (IP literals only: the benches use what herald printed).
pub fn split_url(url: &str) -> (std::net::SocketAddr, String) {
    let rest = url.strip_prefix("http://").expect("an http:// URL");
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let path = if path.is_empty() { "/" } else { path };
    (authority.parse().expect("HOST:PORT"), path.to_owned())
}

/// How a response body is framed.
#[derive(Debug)]
pub enum Decoder {
    Length(usize),
    Chunked(Chunk),
    /// Until the server closes the connection.
    Close,
    Done,
}

#[derive(Debug, Clone, Copy)]
pub enum Chunk {
    Size,
    Data(usize),
    DataEnd,
    Trailer,
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

pub fn contains(hay: &[u8], needle: &[u8]) -> bool {
    find(hay, needle).is_some()
}

impl Decoder {
    /// Moves the body bytes of `input` (from `*pos`) to `out`, advancing `*pos` past what it
    /// consumed. True once the body is complete.
    pub fn feed(
        &mut self,
        input: &[u8],
        pos: &mut usize,
        out: &mut Vec<u8>,
    ) -> std::io::Result<bool> {
        let bad = |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, m.to_owned());
        loop {
            let avail = &input[*pos..];
            match self {
                Decoder::Done => return Ok(true),
                Decoder::Close => {
                    out.extend_from_slice(avail);
                    *pos = input.len();
                    return Ok(false);
                }
                Decoder::Length(n) => {
                    let take = (*n).min(avail.len());
                    out.extend_from_slice(&avail[..take]);
                    *pos += take;
                    *n -= take;
                    if *n == 0 {
                        *self = Decoder::Done;
                        continue;
                    }
                    return Ok(false);
                }
                Decoder::Chunked(state) => match *state {
                    Chunk::Size | Chunk::Trailer => {
                        let Some(eol) = find(avail, b"\r\n") else {
                            return Ok(false);
                        };
                        let line = &avail[..eol];
                        *pos += eol + 2;
                        if let Chunk::Trailer = state {
                            if line.is_empty() {
                                *self = Decoder::Done;
                            }
                            continue;
                        }
                        let hex = std::str::from_utf8(line).map_err(|_| bad("chunk size"))?;
                        let hex = hex.split(';').next().unwrap_or("").trim();
                        let size = usize::from_str_radix(hex, 16).map_err(|_| bad("chunk size"))?;
                        *state = if size == 0 {
                            Chunk::Trailer
                        } else {
                            Chunk::Data(size)
                        };
                    }
                    Chunk::Data(n) => {
                        if avail.is_empty() {
                            return Ok(false);
                        }
                        let take = n.min(avail.len());
                        out.extend_from_slice(&avail[..take]);
                        *pos += take;
                        *state = if take == n {
                            Chunk::DataEnd
                        } else {
                            Chunk::Data(n - take)
                        };
                    }
                    Chunk::DataEnd => {
                        if avail.len() < 2 {
                            return Ok(false);
                        }
                        if &avail[..2] != b"\r\n" {
                            return Err(bad("chunk not followed by CRLF"));
                        }
                        *pos += 2;
                        *state = Chunk::Size;
                    }
                },
            }
        }
    }
}

/// Server-sent events from body bytes: each complete event's `data` (lines joined by `\n`).
#[derive(Default)]
pub struct Sse {
    line: Vec<u8>,
    data: Vec<u8>,
    has_data: bool,
}

impl Sse {
    pub fn feed(&mut self, bytes: &[u8], mut on_event: impl FnMut(&[u8])) {
        for &b in bytes {
            if b != b'\n' {
                self.line.push(b);
                continue;
            }
            if self.line.last() == Some(&b'\r') {
                self.line.pop();
            }
            if self.line.is_empty() {
                if self.has_data {
                    on_event(&self.data);
                }
                self.data.clear();
                self.has_data = false;
            } else if let Some(v) = self.line.strip_prefix(b"data:") {
                if self.has_data {
                    self.data.push(b'\n');
                }
                self.data
                    .extend_from_slice(v.strip_prefix(b" ").unwrap_or(v));
                self.has_data = true;
            }
            // Comments (`:` keep-alives), `event:`, `id:` and `retry:` lines are skipped.
            self.line.clear();
        }
    }
}

/// A response's status line and headers.
#[derive(Debug)]
pub struct Head {
    pub status: u16,
    pub content_type: String,
    pub decoder: Decoder,
}

/// One keep-alive HTTP/1.1 connection to an MCP endpoint (`TCP_NODELAY` on).
pub struct RawHttp {
    stream: tokio::net::TcpStream,
    buf: Vec<u8>,
    pos: usize,
    host: String,
    path: String,
    auth: Option<String>,
    /// Sent as `X-Forwarded-For`: this connection as a client behind a proxy on this host.
    pub forwarded_for: Option<String>,
    req: Vec<u8>,
}

impl RawHttp {
    /// Connects to the endpoint at `url`; `token` goes in `Authorization: Bearer`.
    pub async fn connect(url: &str, token: Option<&str>) -> std::io::Result<RawHttp> {
        let (addr, path) = split_url(url);
        let stream = tokio::net::TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(RawHttp {
            stream,
            buf: Vec::with_capacity(2048),
            pos: 0,
            host: addr.to_string(),
            path,
            auth: token.map(str::to_owned),
            forwarded_for: None,
            req: Vec::with_capacity(1024),
        })
    }

    /// Writes a POST of JSON-RPC `body` with the 2026-07-28 headers (`Mcp-Method`, and
    /// `Mcp-Name` when given).
    pub async fn send_rpc(
        &mut self,
        body: &str,
        method: &str,
        name: Option<&str>,
    ) -> std::io::Result<()> {
        use std::io::Write as _;
        use tokio::io::AsyncWriteExt as _;
        self.req.clear();
        let r = &mut self.req;
        write!(
            r,
            "POST {} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2026-07-28\r\nMcp-Method: {method}\r\nContent-Length: {}\r\n",
            self.path,
            self.host,
            body.len()
        )?;
        if let Some(n) = name {
            write!(r, "Mcp-Name: {n}\r\n")?;
        }
        if let Some(t) = &self.auth {
            write!(r, "Authorization: Bearer {t}\r\n")?;
        }
        if let Some(ip) = &self.forwarded_for {
            write!(r, "X-Forwarded-For: {ip}\r\n")?;
        }
        r.extend_from_slice(b"\r\n");
        r.extend_from_slice(body.as_bytes());
        self.stream.write_all(&self.req).await
    }

    /// Writes a GET of `path` on this connection's host.
    pub async fn send_get(&mut self, path: &str) -> std::io::Result<()> {
        use tokio::io::AsyncWriteExt as _;
        let req = format!("GET {path} HTTP/1.1\r\nHost: {}\r\n\r\n", self.host);
        self.stream.write_all(req.as_bytes()).await
    }

    /// Reads more bytes into the buffer; false at EOF.
    pub async fn fill(&mut self) -> std::io::Result<bool> {
        use tokio::io::AsyncReadExt as _;
        if self.pos == self.buf.len() {
            self.buf.clear();
            self.pos = 0;
        } else if self.pos > 4096 {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        if self.buf.capacity() - self.buf.len() < 1024 {
            self.buf.reserve(4096);
        }
        Ok(self.stream.read_buf(&mut self.buf).await? > 0)
    }

    /// Reads a response's status line and headers.
    pub async fn read_head(&mut self) -> std::io::Result<Head> {
        let eof = || std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "connection closed");
        let bad = |m: String| std::io::Error::new(std::io::ErrorKind::InvalidData, m);
        let end = loop {
            if let Some(i) = find(&self.buf[self.pos..], b"\r\n\r\n") {
                break self.pos + i;
            }
            if !self.fill().await? {
                return Err(eof());
            }
        };
        let text = std::str::from_utf8(&self.buf[self.pos..end])
            .map_err(|_| bad("non-UTF-8 head".into()))?;
        let mut lines = text.split("\r\n");
        let status_line = lines.next().unwrap_or("");
        let status = status_line
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad(format!("bad status line {status_line:?}")))?;
        let mut content_type = String::new();
        let mut decoder = Decoder::Close;
        for l in lines {
            let Some((k, v)) = l.split_once(':') else {
                continue;
            };
            let v = v.trim();
            if k.eq_ignore_ascii_case("content-type") {
                content_type = v.to_owned();
            } else if k.eq_ignore_ascii_case("content-length") {
                let n = v
                    .parse()
                    .map_err(|_| bad(format!("content-length {v:?}")))?;
                decoder = Decoder::Length(n);
            } else if k.eq_ignore_ascii_case("transfer-encoding")
                && v.to_ascii_lowercase().contains("chunked")
            {
                decoder = Decoder::Chunked(Chunk::Size);
            }
        }
        if let Decoder::Length(0) = decoder {
            decoder = Decoder::Done;
        }
        self.pos = end + 4;
        Ok(Head {
            status,
            content_type,
            decoder,
        })
    }

    /// Decodes whatever body bytes are buffered into `out`, reading more only when nothing is
    /// buffered. Returns (body complete, at EOF).
    pub async fn read_body_some(
        &mut self,
        decoder: &mut Decoder,
        out: &mut Vec<u8>,
    ) -> std::io::Result<bool> {
        loop {
            let before = out.len();
            if decoder.feed(&self.buf, &mut self.pos, out)? {
                return Ok(true);
            }
            if out.len() > before {
                return Ok(false);
            }
            if !self.fill().await? {
                return match decoder {
                    Decoder::Close => {
                        *decoder = Decoder::Done;
                        Ok(true)
                    }
                    _ => Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "connection closed mid-body",
                    )),
                };
            }
        }
    }

    /// Reads a whole response: status, content type, body.
    pub async fn read_response(&mut self) -> std::io::Result<(u16, String, Vec<u8>)> {
        let mut head = self.read_head().await?;
        let mut body = Vec::new();
        while !self.read_body_some(&mut head.decoder, &mut body).await? {}
        Ok((head.status, head.content_type, body))
    }

    /// One JSON-RPC round trip: the response message with `id`, whether the server sent it as
    /// JSON or as an SSE stream.
    pub async fn rpc(
        &mut self,
        body: &str,
        method: &str,
        name: Option<&str>,
    ) -> std::io::Result<(u16, Value)> {
        self.send_rpc(body, method, name).await?;
        let (status, ctype, bytes) = self.read_response().await?;
        let bad = |m: String| std::io::Error::new(std::io::ErrorKind::InvalidData, m);
        if ctype.starts_with("text/event-stream") {
            let mut found = None;
            Sse::default().feed(&bytes, |data| {
                if found.is_none()
                    && let Ok(v) = serde_json::from_slice::<Value>(data)
                    && (v.get("result").is_some() || v.get("error").is_some())
                {
                    found = Some(v);
                }
            });
            let v = found.ok_or_else(|| {
                bad(format!(
                    "HTTP {status}: no response in the SSE body {:?}",
                    String::from_utf8_lossy(&bytes)
                ))
            })?;
            Ok((status, v))
        } else {
            let v = serde_json::from_slice(&bytes).map_err(|_| {
                bad(format!(
                    "HTTP {status} {ctype}: {:?}",
                    String::from_utf8_lossy(&bytes)
                ))
            })?;
            Ok((status, v))
        }
    }

    /// A `tools/call` of `name` that must succeed (no JSON-RPC error, not `isError`).
    pub async fn call_tool(&mut self, id: u64, name: &str, args: &Value) -> Result<(), String> {
        let (status, v) = self
            .rpc(&tool_call(id, name, args), "tools/call", Some(name))
            .await
            .map_err(|e| format!("{name}: {e}"))?;
        if status != 200 || v.get("error").is_some() || v["result"]["isError"] == true {
            return Err(format!("{name}: HTTP {status}: {v}"));
        }
        Ok(())
    }
}

/// `GET path` on a fresh connection to `url`'s host: (status, body as text).
pub async fn http_get(url: &str, path: &str) -> std::io::Result<(u16, String)> {
    let mut c = RawHttp::connect(url, None).await?;
    c.send_get(path).await?;
    let (status, _, body) = c.read_response().await?;
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// The value of Prometheus counter `name` at `url`'s `/metrics`, if it is there.
pub async fn metric(url: &str, name: &str) -> Option<u64> {
    let (status, text) = http_get(url, "/metrics").await.ok()?;
    if status != 200 {
        return None;
    }
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// The TCP connections (by the peer's port) in /proc/net/tcp with `port` at one end, in any
/// state but LISTEN. On loopback both ends are listed; each connection is named by its other
/// port.
pub fn tcp_peers(port: u16) -> std::collections::HashSet<u16> {
    let mut out = std::collections::HashSet::new();
    let text = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    let port_of = |a: &str| {
        a.rsplit_once(':')
            .and_then(|(_, p)| u16::from_str_radix(p, 16).ok())
    };
    for l in text.lines().skip(1) {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() < 4 || f[3] == "0A" {
            continue;
        }
        let (Some(local), Some(remote)) = (port_of(f[1]), port_of(f[2])) else {
            continue;
        };
        if local == port {
            out.insert(remote);
        } else if remote == port {
            out.insert(local);
        }
    }
    out
}

/// Raises this process's open-file limit to its hard limit (children inherit it); the new
/// soft limit.
pub fn raise_nofile() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return 0;
    }
    lim.rlim_cur = lim.rlim_max;
    // SAFETY: setrlimit reads the struct we own; raising the soft limit to the hard one is
    // always allowed.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
        return 0;
    }
    lim.rlim_cur
}

pub fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "MISSED" }
}

/// The machine's load average, for the header line.
pub fn load() -> String {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    load.split(' ').take(3).collect::<Vec<_>>().join(" ")
}

/// CPU time (user + system) `pid` has used so far.
pub fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let Some(after) = stat.rsplit_once(") ").map(|x| x.1) else {
        return Duration::ZERO;
    };
    // After the command: state is field 3; utime and stime are fields 14 and 15.
    let f: Vec<&str> = after.split(' ').collect();
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| f.get(i).and_then(|v| v.parse::<u64>().ok()))
        .sum();
    // SAFETY: sysconf only reads a configuration value.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_secs_f64(ticks as f64 / hz as f64)
}

/// Starts `inotifywait ARGS` and waits for "Watches established."; returns the child, its
/// stdout lines, and how long establishing took.
#[allow(dead_code)] // the file and burst benches
pub async fn inotifywait(
    args: &[&str],
) -> (
    tokio::process::Child,
    tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    Duration,
) {
    let started = std::time::Instant::now();
    let mut child = tokio::process::Command::new("inotifywait")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("inotifywait is installed (apt-get install inotify-tools)");
    let mut err = BufReader::new(child.stderr.take().unwrap()).lines();
    loop {
        let l = err
            .next_line()
            .await
            .unwrap()
            .expect("inotifywait says when its watches are established");
        if l.contains("Watches established") {
            break;
        }
    }
    let took = started.elapsed();
    tokio::spawn(async move { while let Ok(Some(_)) = err.next_line().await {} });
    let out = BufReader::new(child.stdout.take().unwrap()).lines();
    (child, out, took)
}
