//! docs/operating.md as an operator runs it, on this machine: the guide's own `up.toml` (its
//! paths, kubeconfig and token made real here: the roots a temporary directory, the cluster
//! the fake API server, the token made by the guide's own commands) passes `herald check` and
//! `--print-config`, runs under `herald up`, answers `herald status`, and the guide's "change
//! the config without a restart" works: `herald reload` applies an added watch and refuses a
//! broken config with the running one kept. (`src/cli/readme_tests.rs` checks that every
//! `herald` command line of the guide parses.)

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

#[tokio::test]
async fn the_guides_config_checks_runs_and_reloads_as_written() {
    init();
    let dir = TempDir::new("guide");
    let reports = dir.path().join("reports");
    std::fs::create_dir_all(&reports).unwrap();
    let api = FakeApi::start().await;
    let kubeconfig = api.kubeconfig(dir.path());

    // The token, made by the guide's own two lines.
    let token_block = block("sh", "The token: make one");
    let hash = sh(&format!("{token_block}\nprintf %s \"$TOKEN\" | wc -c >&2"));
    assert_eq!(hash.len(), 64, "{hash}");

    let config = block("toml", "## 2. Write the config")
        .replace("0.0.0.0:8750", "127.0.0.1:0")
        .replace("0.0.0.0:8751", "127.0.0.1:0")
        .replace("127.0.0.1:8759", "127.0.0.1:0")
        .replace("/srv/reports", reports.to_str().unwrap())
        .replace("/etc/herald/kube/prod", kubeconfig.to_str().unwrap())
        .replace("REPLACE: printf %s \\\"$TOKEN\\\" | sha256sum", &hash);
    assert!(!config.contains("REPLACE"), "{config}");
    let cfg = dir.path().join("up.toml");
    std::fs::write(&cfg, &config).unwrap();

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
