//! Building a cluster's client: the kubeconfig (or in-cluster configuration) read with
//! kube 5, its context and kcp workspace applied, what herald's client cannot serve refused
//! (a proxy URL, an auth provider other than OIDC), `--token-command` replacing the user's
//! credentials, and [`build_client`]: hyper's pooled client over rustls offering h2 then
//! http/1.1 by ALPN, with kube's base-URI, auth and header layers. Also the words for what
//! went wrong, which never quote a credential ([`kube_words`]) or a server URL's userinfo
//! ([`redacted`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper_util::client::legacy::connect::HttpConnector;
use kube::client::ConfigExt;
use tower::ServiceBuilder;

use super::{
    Api, BuildError, ClusterClient, LISTS_AT_ONCE, Lane, STREAMS_PER_CONNECTION, unavailable,
};
use crate::mcp::source::SourceError;
use crate::source::k8s::uri::Cluster;

/// What went wrong with credentials, in words that never carry a secret: kube's own text
/// for an exec plugin's failure quotes its command, environment and everything it printed.
fn auth_words(e: &kube::client::AuthError) -> String {
    use kube::client::AuthError as A;
    match e {
        A::AuthExecStart(io) => format!(
            "the exec credential plugin could not be started ({})",
            io.kind()
        ),
        A::AuthExecRun { out, .. } => format!(
            "the exec credential plugin failed ({}); run it by hand to see why",
            out.status
        ),
        A::ExecPluginFailed | A::AuthExecParse(_) | A::AuthExec(_) => {
            "the exec credential plugin printed no usable ExecCredential; run it by hand to see why"
                .to_owned()
        }
        A::MalformedTokenExpirationDate(_) => {
            "the exec credential plugin printed a bad expirationTimestamp".to_owned()
        }
        A::ReadTokenFile(io, _) => {
            format!("cannot read the kubeconfig's tokenFile ({})", io.kind())
        }
        A::MissingCommand => "the kubeconfig's exec section names no command".to_owned(),
        A::Oidc(_) => "the OIDC token could not be refreshed; log in again".to_owned(),
        A::InvalidBasicAuth(_) | A::InvalidBearerToken(_) => {
            "the kubeconfig's credentials are not valid header values".to_owned()
        }
        _ => "the kubeconfig's credentials could not be used".to_owned(),
    }
}

/// An error from kube in words: credentials never quoted, library type names never shown
/// (the innermost cause).
pub(super) fn kube_words(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    let mut innermost = e.to_string();
    while let Some(err) = cur {
        if let Some(a) = err.downcast_ref::<kube::client::AuthError>() {
            return auth_words(a);
        }
        if let Some(kube::Error::Auth(a)) = err.downcast_ref::<kube::Error>() {
            return auth_words(a);
        }
        innermost = err.to_string();
        cur = err.source();
    }
    innermost
}

impl Api {
    /// How a cluster is named in messages: the kubeconfig's name (never its path: messages
    /// reach clients), the context and the workspace.
    pub(super) fn label(&self, c: &Cluster) -> String {
        let mut s = format!(
            "kubeconfig {}",
            c.kubeconfig.as_deref().unwrap_or("(default)")
        );
        if let Some(ctx) = &c.context {
            s.push_str(&format!(", context {ctx}"));
        }
        if let Some(ws) = &c.workspace {
            s.push_str(&format!(", workspace {ws}"));
        }
        s
    }

    pub(super) async fn build(&self, cluster: &Cluster) -> Result<Arc<ClusterClient>, BuildError> {
        let config_err = |m: String| BuildError::Config(unavailable(m));
        let path = match cluster.kubeconfig.as_deref() {
            None => None,
            Some(n) => match self.kubeconfigs.iter().find(|(k, _)| k == n) {
                Some((_, p)) => Some(p.clone()),
                None => {
                    return Err(BuildError::Config(SourceError::InvalidParams(format!(
                        "no kubeconfig named {n}; this server has {}",
                        if self.kubeconfigs.is_empty() {
                            "only the default kubeconfig".to_owned()
                        } else {
                            self.kubeconfigs
                                .iter()
                                .map(|(k, _)| k.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        }
                    ))));
                }
            },
        };
        if cluster.workspace.is_some() && path.is_none() {
            return Err(BuildError::Config(SourceError::InvalidParams(
                "kcp workspaces need a kubeconfig; start the server with --kubeconfig PATH".into(),
            )));
        }
        let what = self.label(cluster);
        let options = kube::config::KubeConfigOptions {
            context: cluster.context.clone(),
            ..Default::default()
        };
        let mut config = match &path {
            Some(p) => {
                let kc = kube::config::Kubeconfig::read_from(p)
                    .map_err(|e| config_err(format!("cannot read {what}: {}", kube_words(&e))))?;
                if let Some(ctx) = &cluster.context
                    && !kc.contexts.iter().any(|c| &c.name == ctx)
                {
                    return Err(BuildError::Config(SourceError::InvalidParams(format!(
                        "{what} has no context {ctx}"
                    ))));
                }
                kube::Config::from_custom_kubeconfig(kc, &options)
                    .await
                    .map_err(|e| config_err(format!("{what}: {}", kube_words(&e))))?
            }
            None if cluster.context.is_some() => kube::Config::from_kubeconfig(&options)
                .await
                .map_err(|e| config_err(format!("{what}: {}", kube_words(&e))))?,
            None => kube::Config::infer().await.map_err(|e| {
                config_err(format!(
                    "no kubeconfig found and not running in a cluster ({}); pass --kubeconfig PATH",
                    kube_words(&e)
                ))
            })?,
        };
        if config.proxy_url.is_some() {
            return Err(config_err(format!(
                "{what} sets proxy-url, which herald's client does not support; start herald k8s with --watch-via kubectl"
            )));
        }
        if config
            .auth_info
            .auth_provider
            .as_ref()
            .is_some_and(|p| p.name != "oidc")
        {
            return Err(config_err(format!(
                "{what}: its user's auth-provider is not oidc, the only one herald's client supports; use an exec credential plugin, or start herald k8s with --watch-via kubectl"
            )));
        }
        if let Some(ws) = &cluster.workspace {
            let url = config.cluster_url.to_string();
            let base = match url.find("/clusters/") {
                Some(i) => &url[..i],
                None => url.trim_end_matches('/'),
            };
            config.cluster_url = format!("{base}/clusters/{ws}").parse().map_err(|e| {
                config_err(format!("{what}: no server URL for workspace {ws}: {e}"))
            })?;
        }
        if self.token_command.is_some() {
            // The minted token is the user's credential; a client certificate stays (as
            // kubectl --token keeps it).
            let a = &mut config.auth_info;
            a.token = None;
            a.token_file = None;
            a.exec = None;
            a.auth_provider = None;
            a.username = None;
            a.password = None;
        }
        if let Some(exec) = &mut config.auth_info.exec {
            // Never handed herald's stdin (an MCP stream under --stdio), never prompting.
            exec.interactive_mode = Some(kube::config::ExecInteractiveMode::Never);
        }
        let server = redacted(&config.cluster_url);
        let namespace = config.default_namespace.clone();
        // Building runs exec credential plugins (blocking std::process calls): off the
        // runtime's workers.
        let c = config.clone();
        let client = tokio::task::spawn_blocking(move || build_client(c))
            .await
            .map_err(|e| BuildError::Credentials(unavailable(format!("building the client failed: {e}"))))?
            .map_err(|e| {
                BuildError::Credentials(unavailable(format!(
                    "{what}: {e}; if kubectl itself handles this kubeconfig, start herald k8s with --watch-via kubectl"
                )))
            })?;
        Ok(Arc::new(ClusterClient {
            lanes: std::sync::Mutex::new(vec![Arc::new(Lane {
                client,
                watches: Arc::new(tokio::sync::Semaphore::new(STREAMS_PER_CONNECTION)),
            })]),
            config,
            namespace,
            server,
            token_command: self.token_command.clone(),
            discovery: tokio::sync::Mutex::new(None),
            lists: tokio::sync::Semaphore::new(LISTS_AT_ONCE),
            built: Instant::now(),
            refused: std::sync::atomic::AtomicBool::new(false),
        }))
    }
}

/// A server URL without userinfo or query, for messages (a kcp workspace's path kept).
pub(super) fn redacted(uri: &http::Uri) -> String {
    let scheme = uri.scheme_str().unwrap_or("https");
    let host = uri.host().unwrap_or("?");
    let path = uri.path().trim_end_matches('/');
    let path = if path.starts_with("/clusters/") {
        path
    } else {
        ""
    };
    match uri.port_u16() {
        Some(p) => format!("{scheme}://{host}:{p}{path}"),
        None => format!("{scheme}://{host}{path}"),
    }
}

/// kube's client, with HTTP/2 offered: hyper's pooled client over rustls (ALPN h2 then
/// http/1.1), kube's base-URI, auth and header layers on top.
pub(super) fn build_client(config: kube::Config) -> Result<kube::Client, String> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(config.connect_timeout.or(Some(Duration::from_secs(30))));
    // A dead peer is noticed within about two minutes even on an idle HTTP/1.1 watch.
    http.set_keepalive(Some(Duration::from_secs(60)));
    http.set_keepalive_interval(Some(Duration::from_secs(15)));
    http.set_keepalive_retries(Some(4));
    let tls = config.rustls_client_config().map_err(|e| kube_words(&e))?;
    let mut builder = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    if let Some(name) = &config.tls_server_name {
        let name = rustls::pki_types::ServerName::try_from(name.clone())
            .map_err(|e| format!("bad tls-server-name {name}: {e}"))?;
        builder =
            builder.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name));
    }
    let https = builder.enable_all_versions().wrap_connector(http);
    let hyper = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .timer(hyper_util::rt::TokioTimer::new())
        .pool_timer(hyper_util::rt::TokioTimer::new())
        .pool_idle_timeout(Duration::from_secs(90))
        // A dead h2 connection is noticed within a minute even while only watches are open.
        .http2_keep_alive_interval(Duration::from_secs(30))
        .http2_keep_alive_timeout(Duration::from_secs(20))
        .http2_keep_alive_while_idle(true)
        .build(https);
    let auth = config.auth_layer().map_err(|e| kube_words(&e))?;
    let headers = config.extra_headers_layer().map_err(|e| kube_words(&e))?;
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(auth)
        .layer(headers)
        .map_err(tower::BoxError::from)
        .service(hyper);
    Ok(kube::Client::new(service, config.default_namespace))
}
