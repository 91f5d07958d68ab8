//! `herald top`: a live view of a running herald for an operator, as `vector top` is for
//! vector. It follows the admin address's `/status/stream` (reports pushed as they change,
//! never asked for in a loop) and draws, on a terminal, the status table with each watch's
//! events per second and the errors seen since it started; `q` or Ctrl-C quits. A stream that
//! ends (herald restarting) is said on the screen and followed again once herald answers.
//! Ctrl-Z gives the terminal back before it stops, and takes it again on `fg`.
//! Piped, it prints each report as one JSON line and exits 1 when the stream ends.

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::io::IsTerminal as _;
use std::pin::Pin;
use std::time::{Duration, Instant};

use anyhow::anyhow;
use clap::Args;
use tokio::sync::mpsc;

use crate::app::admin::DEFAULT_ADMIN;
use crate::app::console;
use crate::cli::Exit;
use crate::cli::status::{self, Rates};
use crate::runtime::backoff::Backoff;
use crate::runtime::status::StatusReport;

/// The most errors the view keeps.
const MAX_ERRORS: usize = 8;

/// The longest report line taken from the stream.
const MAX_LINE: usize = 4 << 20;

#[derive(Debug, Args)]
pub struct TopArgs {
    /// The admin address to follow: http://HOST:PORT, or HOST:PORT.
    #[arg(long, value_name = "URL", default_value = DEFAULT_ADMIN)]
    pub admin: String,
    /// How often herald sends what is counted (events, listens) when nothing else changed,
    /// in milliseconds (100 to 60000); a change it records (a role, an upstream, a reload) is
    /// sent at once.
    #[arg(long, value_name = "MS", default_value_t = 1000,
        value_parser = clap::value_parser!(u64).range(100..=60_000))]
    pub interval_ms: u64,
}

pub async fn run(args: TopArgs) -> Result<(), Exit> {
    let base = status::base_url(&args.admin);
    let url = format!("{base}/status/stream?interval_ms={}", args.interval_ms);
    let client = crate::transport::web::http_client(|b| b.connect_timeout(CONNECT))?;
    let first = Reports::open(&client, &url, &base).await?;
    if !std::io::stdout().is_terminal() {
        return pipe(first, &base).await;
    }
    let every = Duration::from_millis(args.interval_ms);
    screen(first, &client, &url, View::new(&base, every)).await
}

/// How long a connect may take.
const CONNECT: Duration = Duration::from_secs(5);

/// Piped: each report as one JSON line, until the stream ends (exit 1: herald went away).
async fn pipe(mut reports: Reports, base: &str) -> Result<(), Exit> {
    loop {
        match reports.next().await? {
            Some(r) => console::println(&serde_json::to_string(&r)?)?,
            None => return Err(anyhow!("{base} ended the status stream (herald stopped?)").into()),
        }
    }
}

type Opening = Pin<Box<dyn Future<Output = anyhow::Result<Reports>> + Send>>;

/// On a terminal: the view, drawn on each report, a key, a resize; following again after
/// the stream ends.
async fn screen(
    first: Reports,
    client: &reqwest::Client,
    url: &str,
    mut view: View,
) -> Result<(), Exit> {
    use tokio::signal::unix::{SignalKind, signal};
    // Made before the terminal changes: a signal between two draws is not missed.
    let (mut interrupt, mut terminate) = (
        signal(SignalKind::interrupt())?,
        signal(SignalKind::terminate())?,
    );
    let mut resized = signal(SignalKind::window_change())?;
    let mut suspended = signal(SignalKind::from_raw(libc::SIGTSTP))?;
    let terminal = Terminal::enter();
    let (mut keys, mut typing) = (keys(), true);
    // herald sends at least once a second (its uptime changes) or once an interval: a stream
    // silent for three of those is lost, whatever its socket says.
    let silence = 3 * view.every.max(Duration::from_secs(1));
    let mut heard = tokio::time::Instant::now();
    let mut reports = Some(first);
    let mut opening: Option<Opening> = None;
    let mut retry = Backoff::new(Duration::from_millis(500), Duration::from_secs(5));
    loop {
        draw(&view.render(Terminal::size()))?;
        tokio::select! {
            key = keys.recv(), if typing => match key {
                Some(b'q' | b'Q') => return Ok(()),
                Some(_) => {}
                // stdin ended: Ctrl-C (or SIGTERM) quits now.
                None => typing = false,
            },
            _ = interrupt.recv() => return Ok(()),
            _ = terminate.recv() => return Ok(()),
            _ = resized.recv() => {}
            _ = suspended.recv() => {
                terminal.suspend();
                // The time stopped is not silence of the stream's.
                heard = tokio::time::Instant::now();
            }
            () = tokio::time::sleep_until(heard + silence), if reports.is_some() => {
                view.lost(format!(
                    "no report for {} s: herald does not answer",
                    silence.as_secs()
                ));
                reports = None;
                opening = Some(reopen(client, url, view.base.clone(), retry.next_delay()));
            }
            next = async { reports.as_mut().expect("guarded").next().await }, if reports.is_some() => {
                heard = tokio::time::Instant::now();
                match next {
                    Ok(Some(r)) => view.update(r, Instant::now()),
                    Ok(None) => {
                        view.lost("the status stream ended (herald stopped?)".into());
                        reports = None;
                    }
                    Err(e) => {
                        view.lost(format!("{e:#}"));
                        reports = None;
                    }
                }
                if reports.is_none() {
                    opening = Some(reopen(client, url, view.base.clone(), retry.next_delay()));
                }
            }
            opened = async { opening.as_mut().expect("guarded").await }, if opening.is_some() => {
                opening = None;
                match opened {
                    Ok(r) => {
                        retry.reset();
                        heard = tokio::time::Instant::now();
                        reports = Some(r);
                    }
                    Err(e) => {
                        view.lost(format!("{e:#}"));
                        opening = Some(reopen(client, url, view.base.clone(), retry.next_delay()));
                    }
                }
            }
        }
    }
}

/// Opens the stream again after `after`.
fn reopen(client: &reqwest::Client, url: &str, base: String, after: Duration) -> Opening {
    let (client, url) = (client.clone(), url.to_owned());
    Box::pin(async move {
        tokio::time::sleep(after).await;
        Reports::open(&client, &url, &base).await
    })
}

/// The reports of one `/status/stream` response, a JSON line each.
struct Reports {
    response: reqwest::Response,
    buf: Vec<u8>,
}

impl Reports {
    async fn open(client: &reqwest::Client, url: &str, base: &str) -> anyhow::Result<Reports> {
        let response = client
            .get(url)
            .send()
            .await
            .map_err(|e| status::unreachable(base, &e))?;
        match response.status() {
            s if s.is_success() => Ok(Reports {
                response,
                buf: Vec::new(),
            }),
            reqwest::StatusCode::NOT_FOUND => Err(anyhow!(
                "{base} does not serve /status/stream (a herald older than this one, or not a herald admin address); `herald status --admin {base}` asks it once"
            )),
            s => {
                let body = response.text().await.unwrap_or_default();
                Err(anyhow!("{url} answered {s}: {}", body.trim()))
            }
        }
    }

    /// The next report, or `None` when the stream ended. Cancel-safe: what was read stays.
    async fn next(&mut self) -> anyhow::Result<Option<StatusReport>> {
        loop {
            if let Some(end) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=end).collect();
                return serde_json::from_slice(&line)
                    .map(Some)
                    .map_err(|e| anyhow!("the status stream sent what is not a report: {e}"));
            }
            if self.buf.len() > MAX_LINE {
                return Err(anyhow!(
                    "the status stream sent a line over {MAX_LINE} bytes"
                ));
            }
            match self.response.chunk().await {
                Ok(Some(chunk)) => self.buf.extend_from_slice(&chunk),
                Ok(None) => return Ok(None),
                Err(e) => {
                    return Err(anyhow!(
                        "the status stream broke ({}); herald stopped?",
                        status::root_cause(&e)
                    ));
                }
            }
        }
    }
}

/// What the screen shows: the last report, rates from the two last, the errors seen.
struct View {
    base: String,
    every: Duration,
    report: Option<StatusReport>,
    /// Events by watch at each recent report, and when it came, the oldest first: a rate is
    /// taken over about three intervals, not from two reports a moment apart.
    samples: VecDeque<(Instant, HashMap<String, u64>)>,
    rates: Rates,
    /// `(when, what)`, the newest last.
    errors: VecDeque<(String, String)>,
    /// The errors the last report had (a lasting one is listed once).
    current: HashSet<String>,
    /// Why the stream is not followed now.
    lost: Option<String>,
}

impl View {
    fn new(base: &str, every: Duration) -> View {
        View {
            base: base.to_owned(),
            every,
            report: None,
            samples: VecDeque::new(),
            rates: Rates::new(),
            errors: VecDeque::new(),
            current: HashSet::new(),
            lost: None,
        }
    }

    fn update(&mut self, r: StatusReport, at: Instant) {
        let events: HashMap<String, u64> = r
            .watches
            .iter()
            .map(|w| (w.name.clone(), w.events))
            .collect();
        let window = 3 * self.every.max(Duration::from_secs(1));
        while self
            .samples
            .get(1)
            .is_some_and(|(t, _)| at.duration_since(*t) >= window)
        {
            self.samples.pop_front();
        }
        if let Some((then, before)) = self.samples.front() {
            let span = at.duration_since(*then);
            // Too short a span says nothing: the rates stand until it is long enough.
            if span >= self.every / 2 {
                let secs = span.as_secs_f64();
                self.rates = events
                    .iter()
                    .map(|(name, n)| {
                        let d = n.saturating_sub(before.get(name).copied().unwrap_or(*n));
                        (name.clone(), d as f64 / secs)
                    })
                    .collect();
            }
        }
        self.samples.push_back((at, events));
        let now = errors_of(&r);
        for e in &now {
            if !self.current.contains(e) {
                self.seen(e.clone());
            }
        }
        self.current = now.into_iter().collect();
        self.report = Some(r);
        self.lost = None;
    }

    fn lost(&mut self, why: String) {
        if self.lost.as_ref() != Some(&why) {
            self.seen(why.clone());
        }
        self.lost = Some(why);
        // Rates across a gap would mislead.
        self.samples.clear();
        self.rates.clear();
    }

    fn seen(&mut self, what: String) {
        if self.errors.len() == MAX_ERRORS {
            self.errors.pop_front();
        }
        self.errors.push_back((clock(), what));
    }

    /// The screen for a terminal of `(columns, rows)`: every line cut to fit.
    fn render(&self, (cols, rows): (usize, usize)) -> Vec<String> {
        let mut lines = vec![match &self.lost {
            None => format!("herald top · {}", self.base),
            Some(why) => format!("herald top · {} · LOST: {why}; trying again", self.base),
        }];
        match &self.report {
            Some(r) => lines.extend(
                status::table(r, Some(&self.rates))
                    .lines()
                    .map(String::from),
            ),
            None => lines.push("waiting for the first report…".into()),
        }
        lines.push(String::new());
        if self.errors.is_empty() {
            lines.push("no errors seen".into());
        } else {
            lines.push("RECENT ERRORS".into());
            lines.extend(self.errors.iter().rev().map(|(t, e)| format!("{t}  {e}")));
        }
        let footer = format!(
            "q quits · pushed by herald on each change, counts every {} ms",
            self.every.as_millis()
        );
        lines.truncate(rows.saturating_sub(1).max(1));
        while lines.len() < rows.saturating_sub(1) {
            lines.push(String::new());
        }
        lines.push(footer);
        lines
            .into_iter()
            .map(|l| {
                l.replace(|c: char| c.is_control(), " ")
                    .chars()
                    .take(cols)
                    .collect()
            })
            .collect()
    }
}

/// The errors a report carries, each a line: upstreams not connected, backends down, watches
/// that do not run, a refused reload.
fn errors_of(r: &StatusReport) -> Vec<String> {
    let mut out = Vec::new();
    for u in r.upstreams.iter().filter(|u| !u.connected) {
        let why = u.last_error.as_deref().unwrap_or("not connected");
        out.push(format!("upstream {}: {why}", u.name));
    }
    for b in r.backends.iter().filter(|b| !b.connected) {
        out.push(format!("backend {}: not connected ({})", b.name, b.target));
    }
    for w in &r.watches {
        if let Some(e) = &w.error {
            out.push(format!("watch {} ({}): {e}", w.name, w.state.as_str()));
        }
    }
    if let Some(e) = r.reloads.last.as_ref().and_then(|l| l.error.as_ref()) {
        out.push(format!("reload refused: {e}"));
    }
    out
}

/// The time of day, UTC, as `HH:MM:SSZ`.
fn clock() -> String {
    let now = crate::mcp::ring::now_ms() as i64 * 1_000_000;
    // 2026-01-02T03:04:05.000Z
    format!("{}Z", &crate::mcp::events::rfc3339(now)[11..19])
}

/// Draws `lines` from the top left, each ending with the rest of its row cleared.
fn draw(lines: &[String]) -> Result<(), console::StdoutError> {
    let mut frame = String::from("\x1b[H");
    for (i, l) in lines.iter().enumerate() {
        frame.push_str(l);
        frame.push_str("\x1b[K");
        if i + 1 < lines.len() {
            frame.push_str("\r\n");
        }
    }
    frame.push_str("\x1b[J");
    console::print(&frame)
}

/// The keys pressed, read on a thread (stdin blocks); closed when stdin ends.
fn keys() -> mpsc::Receiver<u8> {
    let (tx, rx) = mpsc::channel(16);
    std::thread::spawn(move || {
        use std::io::Read as _;
        let mut byte = [0u8; 1];
        while let Ok(1) = std::io::stdin().lock().read(&mut byte) {
            if tx.blocking_send(byte[0]).is_err() {
                return;
            }
        }
    });
    rx
}

/// The terminal while the view is up: the alternate screen, no cursor, keys read one at a
/// time without echo (Ctrl-C still signals). Put back as it was when dropped.
struct Terminal {
    saved: Option<libc::termios>,
}

impl Terminal {
    fn enter() -> Terminal {
        let saved = std::io::stdin().is_terminal().then(|| {
            // SAFETY: termios is plain data, for which all zeroes is a valid value.
            let mut t: libc::termios = unsafe { std::mem::zeroed() };
            // SAFETY: tcgetattr fills the termios it is given; fd 0 is a terminal.
            let got = unsafe { libc::tcgetattr(0, &mut t) };
            (got == 0).then_some(t)
        });
        let t = Terminal {
            saved: saved.flatten(),
        };
        t.take();
        t
    }

    /// Raw keys, the alternate screen, no cursor.
    fn take(&self) {
        if let Some(t) = self.saved {
            let mut raw = t;
            raw.c_lflag &= !(libc::ICANON | libc::ECHO);
            raw.c_cc[libc::VMIN] = 1;
            raw.c_cc[libc::VTIME] = 0;
            // SAFETY: a termios made from the one tcgetattr returned, for fd 0.
            unsafe { libc::tcsetattr(0, libc::TCSANOW, &raw) };
        }
        let _ = console::print("\x1b[?1049h\x1b[?25l");
    }

    /// The terminal as it was.
    fn give_back(&self) {
        let _ = console::print("\x1b[?25h\x1b[?1049l");
        if let Some(t) = self.saved {
            // SAFETY: the termios tcgetattr returned for fd 0.
            unsafe { libc::tcsetattr(0, libc::TCSANOW, &t) };
        }
    }

    /// Ctrl-Z: the terminal given back, the process stopped as the shell expects; taken again
    /// when the shell continues it.
    fn suspend(&self) {
        self.give_back();
        // SAFETY: raise(2) with a standard signal; SIGSTOP cannot be caught, so this returns
        // once the process is continued.
        unsafe { libc::raise(libc::SIGSTOP) };
        self.take();
    }

    /// `(columns, rows)` of the terminal on stdout (80×24 when it does not say).
    fn size() -> (usize, usize) {
        console::terminal_size(1).unwrap_or((80, 24))
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        self.give_back();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::status::{StoreReport, UpstreamReport, WatchReport, WatchState};

    fn report(events: u64, upstream_up: bool) -> StatusReport {
        StatusReport {
            version: "0.1.0".into(),
            pid: 7,
            uptime_secs: 61,
            ready: true,
            draining: false,
            roles: vec![],
            upstreams: vec![UpstreamReport {
                name: "prod".into(),
                target: "http://prod/mcp".into(),
                connected: upstream_up,
                ever_connected: true,
                last_error: (!upstream_up).then(|| "connection refused".into()),
            }],
            backends: vec![],
            issuers: vec![],
            listens: 3,
            watches: vec![WatchReport {
                name: "notes".into(),
                uri: "memo://notes".into(),
                events,
                notices: 1,
                state: WatchState::Running,
                failed: false,
                error: None,
            }],
            store: StoreReport::default(),
            reloads: Default::default(),
        }
    }

    #[test]
    fn rates_come_from_two_reports_and_errors_are_listed_once_each() {
        let mut v = View::new("http://127.0.0.1:8759", Duration::from_secs(1));
        let t0 = Instant::now();
        v.update(report(10, true), t0);
        v.update(report(30, false), t0 + Duration::from_secs(2));
        v.update(report(30, false), t0 + Duration::from_secs(3));
        // Over the window (three intervals), not the last two reports.
        assert_eq!(v.rates["notes"], 20.0 / 3.0);
        let screen = v.render((200, 30));
        assert_eq!(screen.len(), 30, "the screen is filled");
        assert!(screen[0].starts_with("herald top · http://127.0.0.1:8759"));
        assert!(
            screen
                .iter()
                .any(|l| l.starts_with("WATCH") && l.contains("EVENTS/S"))
        );
        let refused: Vec<_> = screen
            .iter()
            .filter(|l| l.ends_with("upstream prod: connection refused"))
            .collect();
        assert_eq!(
            refused.len(),
            1,
            "a lasting error is listed once: {screen:#?}"
        );
        assert!(screen[29].starts_with("q quits"));

        let mut v = View::new("b", Duration::from_secs(1));
        v.update(report(10, true), t0);
        // A report a moment after another tells no rate.
        v.update(report(11, true), t0 + Duration::from_millis(20));
        assert!(v.rates.is_empty());
        let row = v
            .render((200, 30))
            .into_iter()
            .find(|l| l.starts_with("notes"));
        assert!(row.unwrap().contains(" - "), "no rate yet");
        v.update(report(30, true), t0 + Duration::from_secs(2));
        assert_eq!(v.rates["notes"], 10.0);
        let row = v
            .render((200, 30))
            .into_iter()
            .find(|l| l.starts_with("notes"));
        assert!(row.unwrap().contains(" 10.0 "), "events per second shown");
    }

    #[test]
    fn a_lost_stream_is_said_on_top_and_the_lines_fit_the_terminal() {
        let mut v = View::new("http://h:1", Duration::from_millis(500));
        v.update(report(1, true), Instant::now());
        v.lost("the status stream ended (herald stopped?)".into());
        let screen = v.render((40, 10));
        assert_eq!(screen.len(), 10);
        assert!(screen[0].contains("LOST"), "{screen:?}");
        assert!(screen.iter().all(|l| l.chars().count() <= 40));
        assert!(v.rates.is_empty(), "no rate across a gap");
    }
}
