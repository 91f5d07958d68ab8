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
    /// The admin address of the herald to reload: http://HOST:PORT, or HOST:PORT.
    #[arg(long, value_name = "URL", default_value = DEFAULT_ADMIN)]
    pub admin: String,
    /// Print the outcome as JSON (the admin address's answer).
    #[arg(long)]
    pub json: bool,
}

pub async fn run(args: ReloadArgs) -> Result<(), Exit> {
    let base = base_url(&args.admin);
    let client = crate::transport::client::http_client(|b| b.timeout(RELOAD_TIMEOUT))?;
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
