//! `herald login --mcp-http URL`: a person authorizes herald with a server that takes OAuth.
//! herald prints the authorization server's address, a browser approves, the answer comes
//! back to a listener on 127.0.0.1, and the tokens are kept sealed in the store, where every
//! later command (`ls`, `call`, `watch`, …) and a gateway's `[slug.oauth]` with the same
//! `--store` take them, and refresh them. `--logout` forgets them.

use std::sync::Arc;

use anyhow::anyhow;
use clap::Args;

use crate::app::console;
use crate::cli::client::ConnectTimeout;
use crate::cli::{Exit, Globals, usage};
use crate::mcp::limits::DEFAULT_MAX_MESSAGE_BYTES;
use crate::store::Table;
use crate::transport::client::{client_config, connect_within};
use crate::transport::oauth::consent::{Consent as _, Print};
use crate::transport::oauth::keep::StoreKeep;
use crate::transport::oauth::{OAuth, OAuthSettings};
use crate::transport::target::Target;
use crate::transport::tls::ClientTrust;

#[derive(Debug, Args)]
pub struct LoginArgs {
    /// The server's Streamable HTTP endpoint, e.g. https://mcp.example.com/mcp.
    #[arg(long, value_name = "URL")]
    pub mcp_http: String,
    /// A client registered with the authorization server beforehand [default: herald
    /// registers itself, or is known by --oauth-client-metadata-url where the server takes
    /// that].
    #[arg(long, value_name = "ID")]
    pub oauth_client_id: Option<String>,
    /// The environment variable holding that client's secret [default: none, a public
    /// client]; it needs --oauth-issuer.
    #[arg(long, value_name = "VAR", requires_all = ["oauth_client_id", "oauth_issuer"])]
    pub oauth_client_secret_env: Option<String>,
    /// The authorization server (issuer) to log in with; herald refuses another the server
    /// names [default: the one the server names].
    #[arg(long, value_name = "URL")]
    pub oauth_issuer: Option<String>,
    /// The https URL of a Client ID Metadata Document naming herald's client [default: none].
    #[arg(long, value_name = "URL")]
    pub oauth_client_metadata_url: Option<String>,
    /// Scopes to ask for beside those the server names, space separated [default: the
    /// server's].
    #[arg(long, value_name = "SCOPES")]
    pub oauth_scope: Option<String>,
    /// Forget the tokens kept for the server instead.
    #[arg(long)]
    pub logout: bool,
    #[command(flatten)]
    pub timeout: ConnectTimeout,
}

pub async fn run(args: LoginArgs, globals: &Globals) -> Result<(), Exit> {
    let url = args.mcp_http.clone();
    crate::transport::explain::check_http_url(&url)
        .map_err(|e| usage(anyhow!("--mcp-http {e}")))?;
    let store = globals.open_store().await?;
    if args.logout {
        let gone = store.delete(Table::OAuth, &url).await?;
        console::println(&if gone {
            format!("Forgot the tokens kept for {url}.")
        } else {
            format!("No tokens were kept for {url}.")
        })?;
        return Ok(());
    }
    let client_secret = match &args.oauth_client_secret_env {
        Some(var) => {
            crate::runtime::secrets::register(var);
            Some(std::env::var(var).map_err(|_| {
                usage(anyhow!(
                    "--oauth-client-secret-env names {var}, which is not set"
                ))
            })?)
        }
        None => None,
    };
    let settings = OAuthSettings {
        client_id: args.oauth_client_id.clone(),
        client_secret,
        issuer: args.oauth_issuer.clone(),
        client_metadata_url: args.oauth_client_metadata_url.clone(),
        client_credentials: false,
        scope: args.oauth_scope.clone(),
    };
    let consent = Arc::new(Print);
    // The connect waits for the person too.
    let within = args.timeout.duration() + consent.patience();
    let oauth = OAuth::new(&url, settings, Some(consent)).map_err(|e| anyhow!(e))?;
    oauth.keep_in(Arc::new(
        StoreKeep::new(store.clone()).map_err(|e| anyhow!(e))?,
    ));
    let trust = ClientTrust {
        oauth: Some(oauth.clone()),
        ..Default::default()
    };
    let target = Target::Http(url.clone());
    let conn = connect_within(
        &target,
        &trust,
        client_config(),
        DEFAULT_MAX_MESSAGE_BYTES,
        within,
    )
    .await?;
    drop(conn);
    let now = oauth.held().await;
    match &now {
        None => console::println(&format!(
            "{url} asked for no authorization: nothing to log in to."
        ))?,
        Some(b) if oauth.authorizations() == 0 => {
            console::println(&format!(
                "Already logged in to {url}: {} (--logout first to log in again).",
                held(b)
            ))?;
        }
        Some(b) => console::println(&format!("Logged in to {url}: {}.", held(b)))?,
    }
    store.close().await;
    Ok(())
}

/// `issuer X, scope S, expires in N min, refreshable`.
fn held((issuer, scope, expires, refresh): &(String, Option<String>, Option<u64>, bool)) -> String {
    let mut s = format!("issuer {issuer}");
    if let Some(sc) = scope {
        s.push_str(&format!(", scope \"{sc}\""));
    }
    if let Some(e) = expires {
        let left = e.saturating_sub(crate::transport::oauth::flow::now_unix());
        s.push_str(&format!(
            ", the access token expires in {} min",
            left.div_ceil(60)
        ));
    }
    if *refresh {
        s.push_str(", refreshed as needed");
    }
    s
}
