//! `herald status`: asks a running herald's admin address (`/status`) what it is doing and
//! prints it as a table for a person, or as JSON with `--json`.

use std::time::Duration;

use anyhow::anyhow;
use clap::Args;

use crate::app::admin::DEFAULT_ADMIN;
use crate::app::console;
use crate::cli::Exit;
use crate::runtime::status::{RoleState, StatusReport};

/// How long the admin address has to answer.
const ASK_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The admin address to ask: http://HOST:PORT, or HOST:PORT.
    #[arg(long, value_name = "URL", default_value = DEFAULT_ADMIN)]
    pub admin: String,
    /// Print the report as JSON (the admin address's /status body).
    #[arg(long)]
    pub json: bool,
}

/// `HOST:PORT` or a URL, as the base URL to ask.
pub(crate) fn base_url(admin: &str) -> String {
    let admin = admin.trim_end_matches('/');
    if admin.contains("://") {
        admin.to_owned()
    } else {
        format!("http://{admin}")
    }
}

pub async fn run(args: StatusArgs) -> Result<(), Exit> {
    let base = base_url(&args.admin);
    let report = ask(&base).await?;
    if args.json {
        console::println(&serde_json::to_string_pretty(&report)?)?;
    } else {
        console::print(&table(&report, None))?;
    }
    Ok(())
}

async fn ask(base: &str) -> anyhow::Result<StatusReport> {
    let client = crate::transport::web::http_client(|b| b.timeout(ASK_TIMEOUT))?;
    let url = format!("{base}/status");
    let response = client
        .get(&url)
        .send()
        .await
        .map_err(|e| unreachable(base, &e))?;
    if !response.status().is_success() {
        return Err(anyhow!(
            "{url} answered {}; is {base} a herald admin address? pass --admin URL",
            response.status()
        ));
    }
    let body = response.bytes().await?;
    serde_json::from_slice(&body).map_err(|e| {
        anyhow!(
            "{url} did not answer with a herald status ({e}); is {base} a herald admin address?"
        )
    })
}

/// Nothing (that speaks HTTP) answered at the admin address `base`.
pub(crate) fn unreachable(base: &str, e: &reqwest::Error) -> anyhow::Error {
    let why = if e.is_timeout() {
        "no answer within 5 s".to_owned()
    } else {
        root_cause(e)
    };
    anyhow!(
        "no herald answered at {base} ({why}); is `herald up` running? pass --admin URL (a server role serves one with --admin ADDR)"
    )
}

/// The innermost error's message (reqwest's outer one is only "error sending request").
pub(crate) fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

/// Events per second by watch name (`herald top` has them; one report alone does not).
pub type Rates = std::collections::HashMap<String, f64>;

/// The report as aligned text; with `rates`, the watches have an `EVENTS/S` column.
pub fn table(r: &StatusReport, rates: Option<&Rates>) -> String {
    let mut out = String::new();
    let state = if r.draining {
        "draining"
    } else if r.ready {
        "ready"
    } else {
        "not ready"
    };
    out.push_str(&format!(
        "herald {} (pid {}), up {}, {state}\n",
        r.version,
        r.pid,
        human_duration(r.uptime_secs)
    ));
    let store = match (&r.store.path, r.store.bytes) {
        (Some(p), Some(b)) => format!("{} ({})", p.display(), human_bytes(b)),
        (Some(p), None) => format!("{} (size unknown)", p.display()),
        (None, _) => "in memory".into(),
    };
    out.push_str(&format!("store: {store}\n"));
    out.push_str(&format!("listen streams open: {}\n", r.listens));
    if let Some(last) = &r.reloads.last {
        let how = match &last.error {
            None => format!("applied ({} changes)", last.changes.len()),
            Some(e) => format!("refused: {e}"),
        };
        out.push_str(&format!(
            "reloads: {} applied, {} refused; the last {how}\n",
            r.reloads.applied, r.reloads.refused
        ));
    }

    out.push('\n');
    let rows: Vec<Vec<String>> = r
        .roles
        .iter()
        .map(|role| {
            vec![
                role.name.clone(),
                match role.state {
                    RoleState::Starting => "starting",
                    RoleState::Serving => "serving",
                    RoleState::Draining => "draining",
                }
                .into(),
                role.listens.to_string(),
                if role.endpoints.is_empty() {
                    "in-process".into()
                } else {
                    role.endpoints.join(" ")
                },
            ]
        })
        .collect();
    columns(&mut out, &["ROLE", "STATE", "LISTENS", "ENDPOINTS"], &rows);

    out.push('\n');
    if r.upstreams.is_empty() {
        out.push_str("no upstream servers\n");
    } else {
        let rows: Vec<Vec<String>> = r
            .upstreams
            .iter()
            .map(|u| {
                vec![
                    u.name.clone(),
                    match (u.connected, u.ever_connected) {
                        (true, _) => "yes",
                        (false, true) => "no (was)",
                        (false, false) => "never",
                    }
                    .into(),
                    u.target.clone(),
                    u.last_error.clone().unwrap_or_else(|| "-".into()),
                ]
            })
            .collect();
        columns(
            &mut out,
            &["UPSTREAM", "CONNECTED", "TARGET", "LAST ERROR"],
            &rows,
        );
    }

    if !r.backends.is_empty() {
        out.push('\n');
        let rows: Vec<Vec<String>> = r
            .backends
            .iter()
            .map(|b| {
                vec![
                    b.name.clone(),
                    if b.connected { "yes" } else { "no" }.into(),
                    b.target.clone(),
                ]
            })
            .collect();
        columns(&mut out, &["BACKEND", "CONNECTED", "SERVERS"], &rows);
    }

    if !r.issuers.is_empty() {
        out.push('\n');
        let rows: Vec<Vec<String>> = r
            .issuers
            .iter()
            .map(|i| {
                vec![
                    i.url.clone(),
                    i.keys.to_string(),
                    match (i.source.as_str(), i.fetched_secs_ago) {
                        ("file", _) => "file".into(),
                        (_, Some(s)) => format!("{} ago", human_duration(s)),
                        (_, None) => "not yet".into(),
                    },
                    i.error.clone().unwrap_or_else(|| "-".into()),
                ]
            })
            .collect();
        columns(
            &mut out,
            &["ISSUER", "KEYS", "FETCHED", "LAST ERROR"],
            &rows,
        );
    }

    out.push('\n');
    if r.watches.is_empty() {
        out.push_str("no watches\n");
    } else {
        let rows: Vec<Vec<String>> = r
            .watches
            .iter()
            .map(|w| {
                let mut row = vec![
                    w.name.clone(),
                    w.state.as_str().into(),
                    w.events.to_string(),
                    w.notices.to_string(),
                    w.uri.clone(),
                    w.error.clone().unwrap_or_else(|| "-".into()),
                ];
                if let Some(rates) = rates {
                    // `-` until there are two reports to tell a rate from.
                    let rate = rates.get(&w.name).map_or("-".into(), |r| format!("{r:.1}"));
                    row.insert(3, rate);
                }
                row
            })
            .collect();
        let head: &[&str] = if rates.is_some() {
            &[
                "WATCH",
                "STATE",
                "EVENTS",
                "EVENTS/S",
                "NOTICES",
                "URI",
                "LAST ERROR",
            ]
        } else {
            &["WATCH", "STATE", "EVENTS", "NOTICES", "URI", "LAST ERROR"]
        };
        columns(&mut out, head, &rows);
    }
    out
}

/// Writes `head` and `rows` as left-aligned columns two spaces apart (the last column is not
/// padded). Control characters in cells become spaces: a server's error text cannot break
/// the table.
fn columns(out: &mut String, head: &[&str], rows: &[Vec<String>]) {
    let clean = |s: &str| s.replace(|c: char| c.is_control(), " ");
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| r.iter().map(|c| clean(c)).collect())
        .collect();
    let mut width: Vec<usize> = head.iter().map(|h| h.chars().count()).collect();
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            width[i] = width[i].max(c.chars().count());
        }
    }
    let mut line = |cells: Vec<&str>| {
        let last = cells.len() - 1;
        let mut l = String::new();
        for (i, c) in cells.into_iter().enumerate() {
            l.push_str(c);
            if i < last {
                l.push_str(&" ".repeat(width[i] - c.chars().count() + 2));
            }
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(head.to_vec());
    for r in &rows {
        line(r.iter().map(String::as_str).collect());
    }
}

fn human_duration(secs: u64) -> String {
    match secs {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m{}s", s / 60, s % 60),
        s if s < 86_400 => format!("{}h{}m", s / 3600, s % 3600 / 60),
        s => format!("{}d{}h", s / 86_400, s % 86_400 / 3600),
    }
}

fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if b < 1024 {
        return format!("{b} B");
    }
    let mut v = b as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::status::{
        BackendReport, RoleReport, StoreReport, UpstreamReport, WatchReport, WatchState,
    };

    #[test]
    fn the_admin_address_may_be_a_url_or_host_port() {
        assert_eq!(base_url("127.0.0.1:8759"), "http://127.0.0.1:8759");
        assert_eq!(base_url("http://h:1/"), "http://h:1");
    }

    #[test]
    fn the_table_names_roles_upstreams_watches_and_the_store() {
        let r = StatusReport {
            version: "0.1.0".into(),
            pid: 42,
            uptime_secs: 3725,
            ready: false,
            draining: false,
            roles: vec![RoleReport {
                name: "memo".into(),
                state: RoleState::Serving,
                endpoints: vec![
                    "http://127.0.0.1:8750/mcp".into(),
                    "quic://127.0.0.1:8751".into(),
                ],
                listens: 2,
            }],
            upstreams: vec![UpstreamReport {
                name: "prod".into(),
                target: "http://10.0.0.1/mcp".into(),
                connected: false,
                ever_connected: false,
                last_error: Some("connection refused\nsecond line".into()),
            }],
            backends: vec![BackendReport {
                name: "memo nats".into(),
                target: "nats://10.0.0.2:4222".into(),
                connected: true,
            }],
            issuers: vec![],
            listens: 2,
            watches: vec![
                WatchReport {
                    name: "notes".into(),
                    uri: "memo://notes".into(),
                    events: 3,
                    notices: 1,
                    state: WatchState::Running,
                    failed: false,
                    error: None,
                },
                WatchReport {
                    name: "pods".into(),
                    uri: "k8s://default/pods".into(),
                    events: 0,
                    notices: 0,
                    state: WatchState::Starting,
                    failed: false,
                    error: Some("k8s: the API server is not reachable".into()),
                },
            ],
            store: StoreReport {
                path: Some("/var/lib/herald/herald.redb".into()),
                bytes: Some(1_572_864),
            },
            reloads: Default::default(),
        };
        let t = table(&r, None);
        let expected = "\
herald 0.1.0 (pid 42), up 1h2m, not ready
store: /var/lib/herald/herald.redb (1.5 MiB)
listen streams open: 2

ROLE  STATE    LISTENS  ENDPOINTS
memo  serving  2        http://127.0.0.1:8750/mcp quic://127.0.0.1:8751

UPSTREAM  CONNECTED  TARGET               LAST ERROR
prod      never      http://10.0.0.1/mcp  connection refused second line

BACKEND    CONNECTED  SERVERS
memo nats  yes        nats://10.0.0.2:4222

WATCH  STATE     EVENTS  NOTICES  URI                 LAST ERROR
notes  running   3       1        memo://notes        -
pods   starting  0       0        k8s://default/pods  k8s: the API server is not reachable
";
        assert_eq!(t, expected, "\n{t}");
    }

    #[test]
    fn sizes_and_durations_read_like_a_person_would_write_them() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(2048), "2.0 KiB");
        assert_eq!(human_duration(59), "59s");
        assert_eq!(human_duration(90_000), "1d1h");
    }
}
