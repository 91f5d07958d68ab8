//! `herald reload`: asks a running `herald up` or `herald gateway --config` (at its admin
//! address, `POST /reload`) to read its config again and apply what changed, and says what
//! it did: what changed, or why the new config was refused (the running one is kept; exit 1).

use std::time::Duration;

use anyhow::anyhow;
use clap::Args;

use crate::app::admin::{AdminError, DEFAULT_ADMIN};
use crate::app::console;
use crate::cli::Exit;
use crate::cli::status::{base_url, root_cause};
use crate::runtime::reload::ReloadOutcome;

/// How long a reload may take before `herald reload` stops waiting (a reload that builds many
/// roles may take a while; the process goes on with it either way).
const RELOAD_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, Args)]
pub struct ReloadArgs {
    /// The admin address of the herald to reload: http://HOST:PORT, or HOST:PORT [default:
    /// the --config file's [listen] admin, else 127.0.0.1:8759].
    #[arg(long, value_name = "URL")]
    pub admin: Option<String>,
    /// The herald up config of the herald to reload: its [listen] admin is where to ask (the
    /// packaged units' ExecReload= passes theirs) [default: none].
    #[arg(long, value_name = "FILE", conflicts_with = "admin")]
    pub config: Option<std::path::PathBuf>,
    /// Print the outcome as JSON (the admin address's answer).
    #[arg(long)]
    pub json: bool,
}

/// Where to ask: `--admin`, else the `--config` file's `[listen] admin` (read leniently: a
/// config the running herald will refuse still names its admin address), else the default.
fn admin_of(args: &ReloadArgs) -> Result<String, Exit> {
    if let Some(a) = &args.admin {
        return Ok(a.clone());
    }
    let Some(path) = &args.config else {
        return Ok(DEFAULT_ADMIN.into());
    };
    let text = std::fs::read_to_string(path)
        .map_err(|e| crate::cli::usage(anyhow!("reading {}: {e}", path.display())))?;
    let admin = text
        .parse::<toml::Table>()
        .ok()
        .and_then(|t| t.get("listen")?.get("admin")?.as_str().map(str::to_owned));
    match admin {
        Some(a) if a.trim().is_empty() => Err(crate::cli::usage(anyhow!(
            "{} turns the admin address off ([listen] admin = \"\"): send herald SIGHUP to reload it instead",
            path.display()
        ))),
        Some(a) => Ok(a),
        None => Ok(DEFAULT_ADMIN.into()),
    }
}

pub async fn run(args: ReloadArgs) -> Result<(), Exit> {
    let base = base_url(&admin_of(&args)?);
    let client = crate::transport::web::http_client(|b| b.timeout(RELOAD_TIMEOUT))?;
    let url = format!("{base}/reload");
    let response = client.post(&url).send().await.map_err(|e| {
        let why = if e.is_timeout() {
            format!("no answer within {} s", RELOAD_TIMEOUT.as_secs())
        } else {
            root_cause(&e)
        };
        anyhow!(
            "no herald answered at {base} ({why}); is `herald up` (or `herald gateway --config … --admin ADDR`) running? pass --admin URL"
        )
    })?;
    let status = response.status();
    let body = response.bytes().await?;
    let outcome: ReloadOutcome = match serde_json::from_slice(&body) {
        Ok(o) => o,
        Err(_) => {
            let error = serde_json::from_slice::<AdminError>(&body)
                .map(|e| e.error)
                .unwrap_or_else(|_| {
                    format!("{url} answered {status}; is {base} a herald admin address?")
                });
            return Err(anyhow!("{error}").into());
        }
    };
    if args.json {
        console::println(&serde_json::to_string(&outcome)?)?;
    }
    match (&outcome.error, args.json) {
        (Some(e), _) => Err(anyhow!("reload refused, the running config is kept: {e}").into()),
        (None, true) => Ok(()),
        (None, false) => {
            let text = if outcome.changes.is_empty() {
                format!("reloaded in {} ms: nothing changed\n", outcome.millis)
            } else {
                let mut t = format!("reloaded in {} ms:\n", outcome.millis);
                for c in &outcome.changes {
                    t.push_str(&format!("  {c}\n"));
                }
                t
            };
            console::print(&text)?;
            Ok(())
        }
    }
}
