//! docs/operating.md as an operator runs it, on this machine: the guide's own `up.toml` (its
//! paths, kubeconfig and token made real here: the roots a temporary directory, the cluster
//! the fake API server, the token made by the guide's own commands) passes `herald check` and
//! `--print-config`, runs under `herald up`, answers `herald status`, and the guide's "change
//! the config without a restart" works: `herald reload` applies an added watch and refuses a
//! broken config with the running one kept. Then every line of the guide's `sh` blocks, in
//! order: each `herald` line runs as written (the guide's host names, ports, paths and pin
//! mapped to this machine's) and succeeds; each other line is one a host with systemd and
//! root runs (named below), so a new command in the guide is either run here or named.
//! (`src/cli/readme_tests.rs` checks that every `herald` command line of the guide parses.)

use std::process::Stdio;

use crate::kube_fake::FakeApi;
use crate::support::*;

const GUIDE: &str = include_str!("../../docs/operating.md");

/// The first block fenced as `lang` after the heading that starts with `heading`.
fn block(lang: &str, heading: &str) -> String {
    let from = GUIDE.find(heading).expect("the heading is in the guide");
    let fence = format!("```{lang}\n");
    let start = from + GUIDE[from..].find(&fence).expect("a block") + fence.len();
    let end = start + GUIDE[start..].find("```").expect("the block ends");
    GUIDE[start..end].to_owned()
}

/// Runs `script` with `sh`, as the guide's reader would: its stdout, trimmed.
fn sh(script: &str) -> String {
    let out = std::process::Command::new("sh")
        .args(["-ec", script])
        .output()
        .expect("sh");
    assert!(out.status.success(), "{script}: {out:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// The guide's config made real in `dir` (its roots, kubeconfig and token hash), written as
/// `dir/up.toml`: its text, its path, and the token the guide's own lines made.
struct Guide {
    config: String,
    cfg: std::path::PathBuf,
    reports: std::path::PathBuf,
    token: String,
    _api: FakeApi,
}

async fn guide(dir: &TempDir) -> Guide {
    let reports = dir.path().join("reports");
    std::fs::create_dir_all(&reports).unwrap();
    let api = FakeApi::start().await;
    let kubeconfig = api.kubeconfig(dir.path());

    // The token, made by the guide's own two lines.
    let token_block = block("sh", "The token: make one");
    let made = sh(&format!("{token_block}\necho \"$TOKEN\""));
    let (hash, token) = made.split_once('\n').expect("the hash, then the token");
    assert_eq!(hash.len(), 64, "{hash}");

    let config = block("toml", "## 2. Write the config")
        .replace("0.0.0.0:8750", "127.0.0.1:0")
        .replace("0.0.0.0:8751", "127.0.0.1:0")
        .replace("127.0.0.1:8759", "127.0.0.1:0")
        .replace("/srv/reports", reports.to_str().unwrap())
        .replace("/etc/herald/kube/prod", kubeconfig.to_str().unwrap())
        .replace("REPLACE: printf %s \\\"$TOKEN\\\" | sha256sum", hash);
    assert!(!config.contains("REPLACE"), "{config}");
    let cfg = dir.path().join("up.toml");
    std::fs::write(&cfg, &config).unwrap();
    Guide {
        config,
        cfg,
        reports,
        token: token.to_owned(),
        _api: api,
    }
}

#[tokio::test]
async fn the_guides_config_checks_runs_and_reloads_as_written() {
    init();
    let dir = TempDir::new("guide");
    let Guide {
        config,
        cfg,
        reports,
        _api,
        ..
    } = guide(&dir).await;

    // `sudo herald check /etc/herald/up.toml` and `--print-config`.
    let check = herald(["check", cfg.to_str().unwrap()]).await;
    assert!(check.status.success(), "{check:?}");
    let printed = herald(["up", "--config", cfg.to_str().unwrap(), "--print-config"]).await;
    assert!(printed.status.success(), "{printed:?}");
    assert!(String::from_utf8_lossy(&printed.stdout).contains("[memo]"));

    // It runs, and `herald status` answers.
    let up = crate::up::up(&cfg, &[]).await;
    let status = herald(["status", "--admin", &up.admin]).await;
    assert!(status.status.success(), "{status:?}");
    // (The watches are listed once the watch client has started, which a reload waits for:
    // they are looked for at the end.)
    assert!(
        String::from_utf8_lossy(&status.stdout).contains("gateway"),
        "{status:?}"
    );

    // "Change the config without a restart": an added watch is applied...
    let added = format!(
        "{config}\n[[watch]]\nname = \"reports\"\nuri = \"file-events://watch{}\"\n",
        reports.display()
    );
    std::fs::write(&cfg, &added).unwrap();
    let reload = herald(["reload", "--admin", &up.admin]).await;
    let said = String::from_utf8_lossy(&reload.stdout);
    assert!(reload.status.success(), "{reload:?}");
    assert!(said.contains("watch reports added"), "{said}");
    // ...and a broken config refused, the running one kept.
    std::fs::write(&cfg, format!("{added}\n[memo]\n")).unwrap();
    let reload = herald(["reload", "--admin", &up.admin]).await;
    assert_eq!(reload.status.code(), Some(1), "{reload:?}");
    let err = String::from_utf8_lossy(&reload.stderr);
    assert!(err.contains("the running config is kept"), "{err}");
    let status = herald(["status", "--admin", &up.admin]).await;
    let table = String::from_utf8_lossy(&status.stdout);
    for watch in ["notes", "memo-events", "deploys", "reports"] {
        assert!(table.contains(watch), "{table}");
    }
    assert!(table.contains("1 applied, 1 refused"), "{table}");
}

/// The lines of the guide's `sh` blocks, in order: a `\`-continued line joined, blank and
/// comment lines left out.
fn sh_lines() -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = GUIDE;
    while let Some(at) = rest.find("```sh\n") {
        let body = &rest[at + 6..];
        let end = body.find("```").expect("the block ends");
        let mut joined = String::new();
        for line in body[..end].lines() {
            if let Some(head) = line.strip_suffix('\\') {
                joined.push_str(head);
                continue;
            }
            joined.push_str(line);
            let line = std::mem::take(&mut joined);
            let line = line.trim();
            if !line.is_empty() && !line.starts_with('#') {
                out.push(line.to_owned());
            }
        }
        rest = &body[end + 3..];
    }
    out
}

/// What the guide's lines run that needs a host with systemd and root (or the package build),
/// by how they start (after `sudo `).
const HOST_ONLY: &[&str] = &[
    "cargo install ",     // the packaging tools, once
    "packaging/build",    // .ci/dist.sh builds and checks the packages
    "apt ",               // installing the package: .ci/dist.sh installs the .deb in a root
    "systemctl ",         // the units: tests/it/systemd.rs runs them under systemd-analyze
    "journalctl ",        // the journal
    "install ",           // files into /etc and /var/lib, as root
    "sh -c 'umask 077; ", // a credential file under /etc
    "TOKEN=",             // the token block, run above by `guide`
    "printf ",            // the token block's hash
];

#[tokio::test]
async fn every_command_line_of_the_guide_runs_as_written() {
    init();
    let dir = TempDir::new("guide-lines");
    let Guide {
        cfg, token, _api, ..
    } = guide(&dir).await;
    let state = dir.path().join("var-lib-herald");
    std::fs::create_dir_all(&state).unwrap();
    let store = state.join("herald.redb");
    let mut up = crate::up::up_on(store.to_str().unwrap(), &cfg, &[]).await;
    let quic = up.listening["quic"].as_str().unwrap().to_owned();
    let pin = up.listening["quic_fingerprint"]
        .as_str()
        .unwrap()
        .to_owned();
    let bin_dir = std::path::Path::new(bin()).parent().unwrap().to_owned();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let root = dir.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    // The guide's host, ports, paths and pin, as they are here.
    let here = |line: &str| {
        line.replace("/etc/herald/up.toml", cfg.to_str().unwrap())
            .replace("http://edge-1:8750/mcp", &up.url)
            .replace("edge-1:8751", &quic)
            .replace("--tls-pin PIN", &format!("--tls-pin {pin}"))
            .replace("/var/lib/herald/herald.redb", store.to_str().unwrap())
            .replace("/root/", &format!("{}/", root.display()))
            // The guide's admin address is the default (127.0.0.1:8759); here it is the one
            // this herald up bound.
            .replace(
                "herald status",
                &format!("herald status --admin {}", up.admin),
            )
            .replace("herald top", &format!("herald top --admin {}", up.admin))
            .replace(
                "store backup",
                &format!("store backup --admin {}", up.admin),
            )
    };
    let command = |line: &str| {
        let mut c = tokio::process::Command::new("sh");
        c.args(["-ec", line])
            .env("PATH", &path)
            .env("XDG_STATE_HOME", dir.path().join("client-state"))
            .env_remove("STATE_DIRECTORY")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        c
    };
    let mut token_set = false;
    let mut ran = Vec::new();
    for line in sh_lines() {
        let line = line.strip_prefix("sudo ").unwrap_or(&line).to_owned();
        if let Some(value) = line.strip_prefix("export HERALD_TOKEN=") {
            assert!(
                value.starts_with('…'),
                "the guide's token is a placeholder: {line}"
            );
            token_set = true;
            continue;
        }
        if line.starts_with("systemctl stop herald-up") {
            // Stopped as systemd stops it: SIGTERM, then the store is free. (The restore
            // block stops it again: it is stopped already.)
            let Some(pid) = up.child.id() else { continue };
            // SAFETY: kill(2) on the pid of a child this test started and still holds.
            assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGTERM) }, 0);
            let status = tokio::time::timeout(WAIT, up.child.wait())
                .await
                .expect("herald up stops in time")
                .unwrap();
            assert!(status.success(), "{status:?}");
            continue;
        }
        if !line.starts_with("herald ") {
            assert!(
                HOST_ONLY.iter().any(|p| line.starts_with(p)),
                "a command in docs/operating.md this test neither runs nor names: {line}"
            );
            continue;
        }
        let run = here(&line);
        let long_running = line.starts_with("herald watch") || line.starts_with("herald top");
        // One that runs until stopped is the shell's own process, so stopping it stops it.
        let mut cmd = command(&if long_running {
            format!("exec {run}")
        } else {
            run.clone()
        });
        if token_set {
            cmd.env("HERALD_TOKEN", &token);
        }
        if long_running {
            // They run until stopped: each shows it works by what it prints.
            follow(cmd, &line, &up.url, &token).await;
        } else {
            let out = tokio::time::timeout(WAIT, cmd.output())
                .await
                .expect("in time")
                .unwrap();
            assert!(
                out.status.success(),
                "docs/operating.md: `{line}` (run as `{run}`) failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        ran.push(line);
    }
    // The guide's lines that must have run (by how they start), and the backups they wrote.
    for must in [
        "herald --version",
        "herald check",
        "herald up --config",
        "herald status",
        "herald top",
        "herald ls",
        "herald call",
        "herald read",
        "herald watch",
        "herald --store",
    ] {
        assert!(
            ran.iter().any(|l| l.starts_with(must)),
            "no `{must}` line ran: {ran:#?}"
        );
    }
    // The two backups, the one a running herald wrote and the one of the stopped store.
    let backups = std::fs::read_dir(&root).unwrap().count();
    assert_eq!(backups, 2, "the backups are in {}", root.display());
}

/// Runs a command that runs until stopped and checks what it prints: `herald top` a report
/// as JSON, `herald watch` a notice once a note changes.
async fn follow(mut cmd: tokio::process::Command, line: &str, url: &str, token: &str) {
    use tokio::io::AsyncBufReadExt as _;
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    if line.starts_with("herald watch") {
        let mut err = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
        tokio::time::timeout(WAIT, async {
            while let Some(l) = err.next_line().await.unwrap() {
                if l.contains("watching") {
                    return;
                }
            }
            panic!("`{line}` ended before watching");
        })
        .await
        .expect("watching in time");
        tokio::spawn(async move { while let Ok(Some(_)) = err.next_line().await {} });
        let set = tokio::process::Command::new(bin())
            .args(["call", "memo__memo_set", "key=guide", "value=\"ran\""])
            .args(["--mcp-http", url])
            .env("HERALD_TOKEN", token)
            .stdin(Stdio::null())
            .output()
            .await
            .unwrap();
        assert!(set.status.success(), "{set:?}");
    }
    let first = tokio::time::timeout(WAIT, out.next_line())
        .await
        .unwrap_or_else(|_| panic!("`{line}` printed nothing in time"))
        .unwrap()
        .unwrap_or_else(|| panic!("`{line}` ended"));
    let v: serde_json::Value = serde_json::from_str(&first).expect("a JSON line");
    if line.starts_with("herald top") {
        assert!(v["roles"].is_array(), "{v}");
    } else {
        assert!(
            v.to_string().contains("guide"),
            "the notice of the change: {v}"
        );
    }
    child.start_kill().unwrap();
    let _ = tokio::time::timeout(WAIT, child.wait()).await;
}
