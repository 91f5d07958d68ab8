//! [`http_client`]: how herald builds every reqwest client (MCP upstreams, OAuth, webhooks,
//! Slack's Web API, the admin address's clients). Below `client.rs` and `oauth/`, which both
//! use it.

/// A reqwest client for herald's outgoing HTTP (MCP upstreams, webhooks, Slack's Web API):
/// `configure` applied to a fresh builder, built. Host names resolve in Rust (reqwest's
/// `hickory-dns`, see [`dns`](super::dns)); HTTPS trusts the system's CA store.
///
/// With no CA certificate on the system (a distroless container, a chroot, an empty
/// `SSL_CERT_FILE`), reqwest refuses to build a client at all, and `Client::new()` panics. So
/// the client is then built trusting no CA: plain HTTP works and HTTPS fails per request with
/// an unknown-issuer error, which names the problem where it matters.
pub fn http_client(
    configure: impl Fn(reqwest::ClientBuilder) -> reqwest::ClientBuilder,
) -> Result<reqwest::Client, reqwest::Error> {
    // reqwest takes the process-wide rustls provider: ring, also when herald is a library (a
    // second install is a harmless no-op).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let builder = || {
        reqwest::Client::builder()
            .dns_resolver(std::sync::Arc::new(crate::transport::dns::ReqwestResolver))
    };
    match configure(builder()).build() {
        Ok(client) => Ok(client),
        Err(e) => {
            tracing::debug!(error = %e, "no usable CA store: HTTPS will trust no server");
            configure(builder())
                .tls_certs_only(std::iter::empty())
                .build()
        }
    }
}
