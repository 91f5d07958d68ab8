//! The Slack source against the fake Slack the tests use (Web API over HTTP, Socket Mode over
//! a real WebSocket), with the release `herald slack` as a real process and herald's own client
//! on HTTP:
//!
//! 1. Post → event latency, from the moment the fake begins writing the envelope to the socket
//!    (its `on_written` hook) to (a) the event in the answer of a long `events/poll` and (b)
//!    the end of the `resources/read` that follows a `notifications/resources/updated` on a
//!    `subscriptions/listen` stream for `slack-events://message_posted`. 20,000 messages over
//!    five conversations, paced at 1,000/s, then the same as one burst. Target: p99 < 10 ms.
//!    Also: when herald acked the last envelope (its socket reader's pace, apart from the
//!    consumer's), and where the slowest 1% fall in herald's 2 s buffer-flush cycle.
//! 2. Backfill of 10,000 messages posted to 50 conversations while the socket was down: time
//!    from `set_down(false)` until the bench has polled all of them (herald's reconnect
//!    backoff, then socket open to all polled, with herald's own pass time), and the Web API
//!    calls; again with 20 ms of Slack latency per call, to show the pass is bound by Slack's
//!    answers, not by herald. The fake's own answer times are measured too, as the floor.
//! 3. Store bytes per buffered event: the redb file after the final flush (SIGTERM) with
//!    20,000 events, against the plain JSON of the payloads and the sealed rows in it.
//! 4. herald's RSS before and after its buffer holds 20,000 events.
//!
//! Every run has a fresh `herald slack` (1a, 3 and 4 share the first, which keeps its buffer
//! in a file), so no settle pass (due 75 s after a hello) falls inside a measurement. The fake
//! serves from its own thread, so the bench's parsing of polls and reads does not slow its
//! answers. The figures move with the machine's load, which is printed with them.
//!
//! `cargo bench --bench slack` (HERALD_BENCH_N overrides the 20,000).

#[allow(dead_code)]
#[path = "../it/slack_fake.rs"]
mod slack_fake;

#[path = "common.rs"]
mod common;

use std::collections::{HashMap, HashSet};
use std::process::Stdio;
use std::time::{Duration, Instant};

use futures::FutureExt as _;
use herald::transport::client::{Connection, client_config, connect};
use herald::transport::target::Target;
use herald::transport::tls::ClientTrust;
use rmcp::model::{
    CallToolRequestParams, ClientRequest, CustomRequest, ReadResourceRequestParams,
    ResourceContents, ServerNotification, ServerResult, SubscriptionFilter,
};
use serde_json::{Value, json};
use slack_fake::{APP_TOKEN, BOT_TOKEN, FakeSlack, Kind, Written};
use tokio::process::Child;
use tokio::sync::{mpsc, watch};

use common::{BIN, ms, pct, rss_kib};
use herald::source::slack::flush::FLUSH_WINDOW as FLUSH_EVERY;

const KEY: &str = "8f2c6e1d4b7a9035c1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f1a2b3c4";
const EVENTS: &str = "slack-events://message_posted";
/// The bound on any one wait: a stuck bench fails instead of hanging.
const WAIT: Duration = Duration::from_secs(60);
/// The paced sender's rate.
const RATE: u32 = 1_000;
/// The target for post → event, p99.
const TARGET_P99: Duration = Duration::from_millis(10);
/// `/proc/PID/stat` counts CPU time in USER_HZ ticks, 100 a second on Linux.
const USER_HZ: f64 = 100.0;

// === herald slack as a process ===

struct Herald {
    child: Child,
    url: String,
}

impl Herald {
    /// `herald slack` on HTTP against `fake`, configured, with its buffer in `store`.
    async fn start(fake: &FakeSlack, store: &str) -> Herald {
        let mut cmd = tokio::process::Command::new(BIN);
        for v in [
            "SLACK_APP_TOKEN",
            "SLACK_BOT_TOKEN",
            "SLACK_EVENTS_ENCRYPTION_KEY",
            "SLACK_EVENTS_RETENTION_DAYS",
            "CREDENTIALS_DIRECTORY",
        ] {
            cmd.env_remove(v);
        }
        let mut child = cmd
            .env("SLACK_APP_TOKEN", APP_TOKEN)
            .env("SLACK_BOT_TOKEN", BOT_TOKEN)
            .env("SLACK_EVENTS_ENCRYPTION_KEY", KEY)
            .args(["--log-format", "json", "--store", store, "slack"])
            .args(["--http", "127.0.0.1:0", "--slack-api-url", &fake.api_url()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn herald slack");
        let v = common::listening(&mut child).await;
        Herald {
            child,
            url: v["http_url"].as_str().expect("an HTTP address").to_owned(),
        }
    }

    fn pid(&self) -> u32 {
        self.child.id().expect("herald runs")
    }

    async fn client(&self) -> Connection {
        within(
            "connect",
            connect(
                &Target::Http(self.url.clone()),
                &ClientTrust::default(),
                client_config(),
                16 << 20,
            ),
        )
        .await
        .expect("connect")
    }

    /// SIGTERM (herald writes its buffer a last time), and the exit.
    async fn terminate(mut self) -> std::process::ExitStatus {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status();
        within("herald's exit after SIGTERM", self.child.wait())
            .await
            .unwrap()
    }
}

/// User plus system CPU time of `pid` so far.
fn cpu(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(") ")
        .map_or(vec![], |(_, rest)| rest.split(' ').collect());
    // utime and stime: fields 14 and 15 of stat(5), 12 and 13 after the comm.
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i)?.parse::<u64>().ok())
        .sum();
    Duration::from_secs_f64(ticks as f64 / USER_HZ)
}

fn vm_hwm_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(WAIT, f)
        .await
        .unwrap_or_else(|_| panic!("the bench gave up waiting for {what}"))
}

// === the client side ===

/// A custom request (`events/poll`) and its result.
async fn request(conn: &Connection, method: &str, params: Value) -> Value {
    let sent = within(
        method,
        conn.send_request(ClientRequest::CustomRequest(CustomRequest::new(
            method.to_owned(),
            Some(params),
        ))),
    )
    .await;
    match sent {
        Ok(ServerResult::CustomResult(r)) => r.0,
        other => panic!("{method}: {other:?}"),
    }
}

/// The cursor meaning "from now".
async fn now_cursor(conn: &Connection) -> String {
    let r = request(
        conn,
        "events/poll",
        json!({"name": "message_posted", "cursor": null}),
    )
    .await;
    r["cursor"].as_str().unwrap().to_owned()
}

async fn status(conn: &Connection) -> Value {
    within(
        "slack_events_status",
        conn.call_tool(CallToolRequestParams::new("slack_events_status".to_owned())),
    )
    .await
    .expect("status")
    .structured_content
    .expect("structured status")
}

/// Asks for the status until `cond` holds. Each ask is a round trip to herald, so this paces
/// itself; the states it waits for (the first pass's `live_through`, a finished pass) change
/// nothing a notification or a poll could show.
async fn status_until(conn: &Connection, what: &str, cond: impl Fn(&Value) -> bool) -> Value {
    within(what, async {
        loop {
            let s = status(conn).await;
            if cond(&s) {
                return s;
            }
            tokio::task::yield_now().await;
        }
    })
    .await
}

/// Where and when an event reached the bench: its ts (unique in the fake) and the moment.
type Arrival = (String, Instant);

/// What a consumer saw.
#[derive(Default)]
struct Consumed {
    arrivals: Vec<Arrival>,
    /// The payloads' plain JSON, summed.
    json_bytes: usize,
    /// Polls answered, or notifications received.
    rounds: usize,
    /// Resource reads, and their text's bytes (push only).
    reads: usize,
    read_bytes: usize,
}

/// Long-polls from `cursor` until `n` events are in.
async fn poll_all(conn: &Connection, cursor: &str, n: usize) -> Consumed {
    let mut cursor = cursor.to_owned();
    let mut out = Consumed::default();
    while out.arrivals.len() < n {
        let r = request(
            conn,
            "events/poll",
            json!({"name": "message_posted", "cursor": cursor, "timeoutMs": 30_000, "maxEvents": 1000}),
        )
        .await;
        let at = Instant::now();
        out.rounds += 1;
        assert_eq!(r["truncated"], false, "nothing is evicted in a bench run");
        for e in r["events"].as_array().unwrap() {
            out.json_bytes += e["data"].to_string().len();
            out.arrivals
                .push((e["data"]["ts"].as_str().unwrap().to_owned(), at));
        }
        cursor = r["cursor"].as_str().unwrap().to_owned();
    }
    out
}

/// Reads `slack-events://message_posted` after each notification until every one of `n`
/// events has been read, or the last one posted (named on `last` once sent) has: a read
/// returns the newest 256, so a burst outruns it. Notifications already queued when one
/// arrives are taken together and answered with one read, as a watch client would.
async fn push_all(
    conn: &Connection,
    sub: &mut rmcp::service::Subscription,
    n: usize,
    mut last: watch::Receiver<Option<String>>,
) -> Consumed {
    let mut out = Consumed::default();
    let mut seen = HashSet::new();
    loop {
        let done = last.borrow().as_ref().is_some_and(|l| seen.contains(l));
        if seen.len() == n || done {
            return out;
        }
        let waiting_for_last = last.borrow().is_none();
        let notified = tokio::select! {
            biased;
            r = within("a notification", sub.next()) => r,
            _ = last.changed(), if waiting_for_last => continue,
        };
        match notified.expect("healthy").expect("open") {
            ServerNotification::ResourceUpdatedNotification(_) => out.rounds += 1,
            other => panic!("unexpected {other:?}"),
        }
        while let Some(more) = sub.next().now_or_never() {
            match more.expect("healthy").expect("open") {
                ServerNotification::ResourceUpdatedNotification(_) => out.rounds += 1,
                other => panic!("unexpected {other:?}"),
            }
        }
        let r = within(
            "a read",
            conn.read_resource(ReadResourceRequestParams::new(EVENTS.to_owned())),
        )
        .await
        .expect("read");
        let at = Instant::now();
        out.reads += 1;
        let ResourceContents::TextResourceContents { text, .. } = &r.contents[0] else {
            panic!("not text: {r:?}");
        };
        out.read_bytes += text.len();
        let log: Value = serde_json::from_str(text).expect("an event log");
        for e in log["events"].as_array().unwrap() {
            let ts = e["ts"].as_str().unwrap().to_owned();
            if seen.insert(ts.clone()) {
                out.arrivals.push((ts, at));
            }
        }
    }
}

// === the sender side ===

/// A message as people write them: about 100 characters, every tenth mentions the bot.
fn text(i: usize) -> String {
    if i.is_multiple_of(10) {
        format!(
            "<@UBOT> can you summarise what changed in the last deploy? (#{i}, asking for the on-call)"
        )
    } else {
        format!(
            "deploy {i}: build green on main, canary at 5%, p99 steady at 41 ms; rolling on in 10 min"
        )
    }
}

/// Posts `n` messages round-robin over `convs`, at `rate` a second (`None`: as fast as the
/// fake takes them); names the last one's ts on `last`.
async fn send(
    fake: FakeSlack,
    convs: Vec<&'static str>,
    n: usize,
    rate: Option<u32>,
    last: watch::Sender<Option<String>>,
) -> Duration {
    let started = Instant::now();
    let mut tick = rate.map(|r| tokio::time::interval(Duration::from_secs(1) / r));
    let mut ts = String::new();
    for i in 0..n {
        match &mut tick {
            Some(t) => {
                t.tick().await;
            }
            // Lets the consumer run on the bench's runtime while the burst is posted.
            None if i.is_multiple_of(64) => tokio::task::yield_now().await,
            None => {}
        }
        ts = fake.post(convs[i % convs.len()], &format!("U{}", i % 37), &text(i));
    }
    let _ = last.send(Some(ts));
    started.elapsed()
}

/// Takes `n` write stamps off the fake's hook.
async fn stamps(rx: &mut mpsc::UnboundedReceiver<Written>, n: usize) -> HashMap<String, Instant> {
    let mut out = HashMap::with_capacity(n);
    within("the fake's write stamps", async {
        while out.len() < n {
            let (ts, at) = rx.recv().await.expect("the hook is open");
            out.insert(ts, at);
        }
    })
    .await;
    out
}

/// CPU time of herald and of this process (the fake and the client) over a window.
struct CpuMeter {
    herald: u32,
    since: Instant,
    herald_at: Duration,
    bench_at: Duration,
}

impl CpuMeter {
    fn start(herald: u32) -> CpuMeter {
        CpuMeter {
            herald,
            since: Instant::now(),
            herald_at: cpu(herald),
            bench_at: cpu(std::process::id()),
        }
    }

    /// Herald's and the bench's CPU, as a share of one core over the window.
    fn shares(&self) -> (f64, f64) {
        let wall = self.since.elapsed().as_secs_f64();
        let share = |now: Duration, then: Duration| (now - then).as_secs_f64() / wall * 100.0;
        (
            share(cpu(self.herald), self.herald_at),
            share(cpu(std::process::id()), self.bench_at),
        )
    }
}

/// One latency run's figures.
struct Latency {
    sorted: Vec<Duration>,
    /// Events per second the fake wrote, first write to last.
    offered: f64,
    /// Events per second delivered, first write to last arrival.
    delivered: f64,
    /// Of the slowest 1% of events, the share written in the busiest 200 ms of herald's
    /// buffer-flush cycle ([`FLUSH_EVERY`]); 10% when the flush has nothing to do with them.
    flush_aligned: f64,
}

fn latency(written: &HashMap<String, Instant>, arrivals: &[Arrival]) -> Latency {
    let mut sorted: Vec<Duration> = arrivals
        .iter()
        .map(|(ts, at)| at.saturating_duration_since(written[ts]))
        .collect();
    sorted.sort();
    let first = written.values().min().unwrap();
    let last_write = written.values().max().unwrap();
    let last = arrivals.iter().map(|(_, at)| at).max().unwrap();
    // When the slowest were written, as a phase of the flush cycle, in 100 ms bins.
    let mut by_latency: Vec<(Duration, Instant)> = arrivals
        .iter()
        .map(|(ts, at)| (at.saturating_duration_since(written[ts]), written[ts]))
        .collect();
    by_latency.sort_by_key(|(l, _)| std::cmp::Reverse(*l));
    let slowest = &by_latency[..(by_latency.len() / 100).max(1)];
    const BINS: usize = 20;
    let mut bins = [0usize; BINS];
    for (_, w) in slowest {
        let phase = (*w - *first).as_secs_f64() % FLUSH_EVERY.as_secs_f64();
        bins[(phase / FLUSH_EVERY.as_secs_f64() * BINS as f64) as usize % BINS] += 1;
    }
    let busiest = (0..BINS)
        .map(|i| bins[i] + bins[(i + 1) % BINS])
        .max()
        .unwrap_or(0);
    Latency {
        offered: written.len() as f64 / (*last_write - *first).as_secs_f64().max(1e-9),
        delivered: arrivals.len() as f64 / (*last - *first).as_secs_f64(),
        flush_aligned: busiest as f64 / slowest.len() as f64 * 100.0,
        sorted,
    }
}

/// A fake Slack serving from its own thread and runtime, so that the bench's client work
/// (parsing polls and reads) does not hold up the fake's answers and writes.
async fn fake_slack() -> FakeSlack {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("fake-slack".into())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime for the fake");
            rt.block_on(async move {
                let _ = tx.send(FakeSlack::start().await);
                std::future::pending::<()>().await
            })
        })
        .expect("a thread for the fake");
    rx.await.expect("the fake started")
}

/// The conversations of parts 1, 3 and 4.
const LIVE: [&str; 5] = ["C1", "C2", "C3", "C4", "D1"];

async fn live_fake() -> FakeSlack {
    let fake = fake_slack().await;
    for (id, name) in [
        ("C1", "general"),
        ("C2", "ops"),
        ("C3", "deploys"),
        ("C4", "random"),
    ] {
        fake.add_channel(id, name, Kind::Public);
    }
    fake.add_channel("D1", "", Kind::Im("U1".into()));
    fake
}

/// A fresh `herald slack` on `fake` with its socket up (the previous one's gone).
async fn fresh(fake: &FakeSlack, store: &str) -> (Herald, Connection) {
    fake.wait_until("no socket left from before", |s| s.sockets_open() == 0)
        .await;
    let herald = Herald::start(fake, store).await;
    let conn = herald.client().await;
    fake.wait_until("herald's socket", |s| s.sockets_open() == 1)
        .await;
    (herald, conn)
}

#[derive(Clone, Copy, PartialEq)]
enum Via {
    Poll,
    Push,
}

/// Posts `n` messages at `rate` (`None`: one burst) while the client takes them `via` a long
/// poll or a listen and reads; prints a line and returns the latencies and what was consumed.
async fn run(
    fake: &FakeSlack,
    herald: &Herald,
    conn: &Connection,
    via: Via,
    rate: Option<u32>,
    n: usize,
) -> (Latency, Consumed) {
    let cursor = now_cursor(conn).await;
    let mut sub = match via {
        Via::Poll => None,
        Via::Push => Some(
            within(
                "listen",
                conn.listen(
                    SubscriptionFilter::builder()
                        .resource_subscription(EVENTS)
                        .build(),
                ),
            )
            .await
            .expect("listen"),
        ),
    };
    let mut hook = fake.on_written();
    let (last, sent_last) = watch::channel(None);
    // herald acks an envelope as it reads it, before anything else: when the fake has every
    // ack, herald's socket reader has taken the whole run.
    let acked = fake.acks().len() + n;
    let all_acked = {
        let fake = fake.clone();
        tokio::spawn(async move {
            fake.wait_until("every envelope acked", |s| s.acks().len() >= acked)
                .await;
            Instant::now()
        })
    };
    let meter = CpuMeter::start(herald.pid());
    let sender = tokio::spawn(send(fake.clone(), LIVE.to_vec(), n, rate, last));
    let got = match &mut sub {
        None => poll_all(conn, &cursor, n).await,
        Some(sub) => push_all(conn, sub, n, sent_last).await,
    };
    let (herald_cpu, bench_cpu) = meter.shares();
    let posting = sender.await.unwrap();
    let written = stamps(&mut hook, n).await;
    let all_acked = all_acked.await.expect("every envelope acked");
    let l = latency(&written, &got.arrivals);
    let name = match (via, rate) {
        (Via::Poll, Some(r)) => format!("poll, paced {r}/s"),
        (Via::Push, Some(r)) => format!("push+read, paced {r}/s"),
        (Via::Poll, None) => "poll, one burst".to_owned(),
        (Via::Push, None) => "push+read, one burst".to_owned(),
    };
    println!(
        "  {name:<23} n={:<5} p50={:>10} p99={:>10} max={:>10}  wrote {:>5.0}/s, delivered {:>5.0}/s; \
         CPU herald {herald_cpu:.0}%, bench+fake {bench_cpu:.0}% of a core",
        l.sorted.len(),
        ms(pct(&l.sorted, 0.50)),
        ms(pct(&l.sorted, 0.99)),
        ms(*l.sorted.last().unwrap()),
        l.offered,
        l.delivered,
    );
    let detail = match via {
        Via::Poll => format!("{} polls answered", got.rounds),
        Via::Push => format!(
            "{} notifications, {} reads of {:.1} MB ({:.0} bytes read per new event)",
            got.rounds,
            got.reads,
            got.read_bytes as f64 / 1e6,
            got.read_bytes as f64 / got.arrivals.len() as f64
        ),
    };
    let missed = if got.arrivals.len() < n {
        format!(
            "; {} of {n} events were never in a read (a read is the newest 256)",
            n - got.arrivals.len()
        )
    } else {
        String::new()
    };
    let first_write = *written.values().min().unwrap();
    println!(
        "  {:<23} {detail}; the fake posted for {:.0} ms; herald acked the last envelope {:.0} ms after the first was written{missed}",
        "",
        posting.as_secs_f64() * 1e3,
        (all_acked - first_write).as_secs_f64() * 1e3
    );
    if rate.is_some() {
        println!(
            "  {:<23} the slowest 1%: {:.0}% were written in one 200 ms window of herald's {} s buffer-flush cycle \
             (10% if the flush had nothing to do with them)",
            "",
            l.flush_aligned,
            FLUSH_EVERY.as_secs()
        );
    }
    (l, got)
}

// === backfill ===

/// Methods a reconnect and its backfill may call.
const METHODS: [&str; 5] = [
    "apps.connections.open",
    "auth.test",
    "conversations.list",
    "conversations.history",
    "conversations.replies",
];

/// Part 2: 10,000 messages over 50 conversations (10% of them replies, in four threads per
/// conversation) while the socket is down, then up again with `latency` on every Web API call.
async fn backfill(latency: Duration) {
    const CONVS: usize = 50;
    const MISSED: usize = 10_000;
    let fake = fake_slack().await;
    let convs: Vec<String> = (0..CONVS)
        .map(|i| {
            let (id, kind) = match i {
                0..40 => (format!("C{i:03}"), Kind::Public),
                40..45 => (format!("G{i:03}"), Kind::Private),
                _ => (format!("D{i:03}"), Kind::Im(format!("U{i}"))),
            };
            fake.add_channel(&id, &format!("chan-{i}"), kind);
            id
        })
        .collect();
    let (herald, conn) = fresh(&fake, ":memory:").await;
    // The first hello's pass marks "live from now"; the gap is measured from it.
    status_until(&conn, "the first pass", |s| {
        s["buffer"]["live_through"].is_string()
    })
    .await;
    let cursor = now_cursor(&conn).await;
    fake.set_down(true);
    fake.wait_until("herald's socket gone", |s| s.sockets_open() == 0)
        .await;
    let mut parents: Vec<Vec<String>> = vec![Vec::new(); CONVS];
    for i in 0..MISSED {
        let (c, j) = (i % CONVS, i / CONVS);
        let user = format!("U{}", i % 37);
        if j % 10 == 9 {
            let parent = parents[c][(j / 10) % 4].clone();
            fake.post_reply(&convs[c], &parent, &user, &text(i));
        } else {
            let ts = fake.post(&convs[c], &user, &text(i));
            if parents[c].len() < 4 {
                parents[c].push(ts);
            }
        }
    }
    assert!(fake.envelopes().is_empty(), "nothing reached a socket");
    let before: Vec<usize> = METHODS.iter().map(|m| fake.calls(m)).collect();
    fake.set_latency(latency);
    let up = Instant::now();
    fake.set_down(false);
    let (socket_at, meter) = within("herald's socket again", async {
        fake.wait_until("herald's socket again", |s| s.sockets_open() == 1)
            .await;
        (Instant::now(), CpuMeter::start(herald.pid()))
    })
    .await;
    let got = poll_all(&conn, &cursor, MISSED).await;
    let all_in = got.arrivals.iter().map(|(_, at)| *at).max().unwrap();
    let (herald_cpu, bench_cpu) = meter.shares();
    let s = status_until(&conn, "the backfill's report", |s| {
        s["last_backfill"]["recovered"].is_u64()
    })
    .await;
    let pass = &s["last_backfill"];
    assert_eq!(pass["recovered"], MISSED, "{s}");
    let calls: Vec<usize> = METHODS
        .iter()
        .zip(&before)
        .map(|(m, b)| fake.calls(m) - b)
        .collect();
    let herald_calls = pass["web_api_calls"].as_u64().unwrap();
    let pass_s = pass["took_ms"].as_u64().unwrap() as f64 / 1e3;
    // What the fake takes to answer the pass's two kinds of call, one at a time, from here.
    let thread = parents[0][0].clone();
    let history = answer_time(
        &fake,
        "conversations.history",
        &[
            ("channel", &convs[0]),
            ("oldest", "0"),
            ("inclusive", "true"),
            ("limit", "200"),
        ],
    )
    .await;
    let replies = answer_time(
        &fake,
        "conversations.replies",
        &[
            ("channel", &convs[0]),
            ("ts", &thread),
            ("inclusive", "true"),
            ("limit", "200"),
        ],
    )
    .await;
    let tag = if latency.is_zero() {
        "no Slack latency".to_owned()
    } else {
        format!("{} ms a call", latency.as_millis())
    };
    println!(
        "  {tag:<16} all {MISSED} polled {:.3} s after set_down(false) = herald's reconnect backoff {:.3} s \
         + socket open to all polled {:.3} s (herald's pass {pass_s:.3} s); \
         CPU herald {herald_cpu:.0}%, bench+fake {bench_cpu:.0}% of a core",
        (all_in - up).as_secs_f64(),
        (socket_at - up).as_secs_f64(),
        (all_in - socket_at).as_secs_f64(),
    );
    println!(
        "  {:<16} Web API calls by the pass {herald_calls} (the fake counted conversations.list {}, .history {}, \
         .replies {}; and apps.connections.open {}, auth.test {})",
        "", calls[2], calls[3], calls[4], calls[0], calls[1]
    );
    // herald reads 4 conversations at a time, each one call after another: its floor is the
    // fake's answer times over 4.
    let (h, r) = (calls[3] as f64, calls[4] as f64);
    let floor = (h * history.as_secs_f64() + r * replies.as_secs_f64()) / 4.0;
    let mut bound = format!(
        "the fake answers one history page in {}, one replies page in {} (asked one at a time from the bench); \
         pass / (those answers over 4 at a time) = {pass_s:.3} / {floor:.3} = {:.2}",
        ms(history),
        ms(replies),
        pass_s / floor
    );
    if !latency.is_zero() {
        let serial = herald_calls as f64 * latency.as_secs_f64();
        bound.push_str(&format!(
            "; pass / (calls x latency) = {pass_s:.3} / {serial:.3} = {:.2}",
            pass_s / serial
        ));
    }
    println!("  {:<16} {bound}", "");
    drop(conn);
    drop(herald);
}

/// The mean time the fake takes to answer `method` with `params`, asked 20 times one after
/// another by a plain client (TCP_NODELAY, as herald's).
async fn answer_time(fake: &FakeSlack, method: &str, params: &[(&str, &str)]) -> Duration {
    const TIMES: u32 = 20;
    let http = reqwest::Client::builder()
        .tcp_nodelay(true)
        .build()
        .unwrap();
    let url = format!("{}{method}", fake.api_url());
    // The values are ids, timestamps and words: nothing to percent-encode.
    let body = params
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&");
    let started = Instant::now();
    for _ in 0..TIMES {
        let r = within(
            method,
            http.post(&url)
                .bearer_auth(BOT_TOKEN)
                .header("content-type", "application/x-www-form-urlencoded")
                .body(body.clone())
                .send(),
        )
        .await
        .expect("the fake answers");
        let v: Value = r.json().await.expect("JSON");
        assert_eq!(v["ok"], true, "{method}: {v}");
    }
    started.elapsed() / TIMES
}

// === the buffer in the store and in memory ===

/// Part 3's sealed rows, read back from the file herald left: (rows, key + value bytes).
async fn sealed_rows(path: &std::path::Path) -> (usize, usize) {
    let store = herald::store::Store::open(&herald::store::Location::File(path.to_owned()))
        .expect("the store opens after herald exits");
    let rows = store
        .scan(herald::store::Table::SlackBuffer)
        .await
        .expect("scan");
    let bytes = rows.iter().map(|(k, v)| k.len() + v.len()).sum();
    (rows.len(), bytes)
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split(' ')
        .next()
        .unwrap_or("?")
        .to_owned()
}

#[tokio::main]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let n: usize = std::env::var("HERALD_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let cores = std::thread::available_parallelism().map_or(0, |c| c.get());
    let dir = std::env::temp_dir().join(format!("herald-slack-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let started = Instant::now();
    println!(
        "slack bench ({BIN}); {cores} cores, load average {} at the start",
        loadavg()
    );
    println!(
        "1. post -> event, from the fake's write of the envelope to the event at the client; \
         {n} messages over {} conversations, each run on a fresh herald",
        LIVE.len()
    );
    let fake = live_fake().await;

    // Parts 1a, 3 and 4 share the first herald, which keeps its buffer in a file.
    let store = dir.join("herald.redb");
    let (herald, conn) = fresh(&fake, store.to_str().unwrap()).await;
    let pid = herald.pid();
    let rss_before = rss_kib(pid);
    let (paced_poll, polled) = run(&fake, &herald, &conn, Via::Poll, Some(RATE), n).await;
    let (rss_full, rss_peak) = (rss_kib(pid), vm_hwm_kib(pid));
    let s = status(&conn).await;
    assert_eq!(
        s["buffer"]["events"], n,
        "the buffer holds every event: {s}"
    );
    drop(conn);
    assert!(herald.terminate().await.success(), "herald exits cleanly");
    let file_bytes = std::fs::metadata(&store).unwrap().len();
    let (rows, row_bytes) = sealed_rows(&store).await;

    let (herald, conn) = fresh(&fake, ":memory:").await;
    let (paced_push, _) = run(&fake, &herald, &conn, Via::Push, Some(RATE), n).await;
    drop((conn, herald));
    let (herald, conn) = fresh(&fake, ":memory:").await;
    run(&fake, &herald, &conn, Via::Poll, None, n).await;
    drop((conn, herald));
    let (herald, conn) = fresh(&fake, ":memory:").await;
    run(&fake, &herald, &conn, Via::Push, None, n).await;
    drop((conn, herald));

    println!("2. backfill of 10000 messages missed in 50 conversations (10% thread replies)");
    backfill(Duration::ZERO).await;
    backfill(Duration::from_millis(20)).await;

    let per = |b: f64| b / n as f64;
    println!(
        "3. store: the redb file after the final flush (SIGTERM) with {n} events is {file_bytes} bytes, \
         {:.0} bytes/event; the payloads' plain JSON {:.0} bytes/event; file / JSON {:.2}x \
         ({rows} sealed rows of {:.0} bytes each, key and value: redb's pages hold the rest)",
        per(file_bytes as f64),
        per(polled.json_bytes as f64),
        file_bytes as f64 / polled.json_bytes as f64,
        row_bytes as f64 / rows as f64,
    );
    println!(
        "4. RSS of herald slack: {} before, {} with {n} events buffered (+{:.0} bytes/event, {:.1}x the JSON); peak {}",
        mib(rss_before),
        mib(rss_full),
        per(rss_full.saturating_sub(rss_before) as f64 * 1024.0),
        rss_full.saturating_sub(rss_before) as f64 * 1024.0 / polled.json_bytes as f64,
        mib(rss_peak)
    );
    for (name, l) in [("poll", &paced_poll), ("push+read", &paced_push)] {
        let p99 = pct(&l.sorted, 0.99);
        println!(
            "target post -> {name} at {RATE}/s: p99 {} vs {} -> {}",
            ms(p99),
            ms(TARGET_P99),
            if p99 < TARGET_P99 { "met" } else { "MISSED" }
        );
    }
    println!(
        "slack bench took {:.1} s; load average {} at the end",
        started.elapsed().as_secs_f64(),
        loadavg()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
