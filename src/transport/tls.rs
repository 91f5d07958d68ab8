//! TLS for QUIC: the server identity (from files, or self-signed and kept in the store) and the
//! client's trust (a CA file, or a pinned SHA-256 fingerprint of the server certificate).
//!
//! All of it is rustls on the ring provider, passed explicitly, so nothing depends on which
//! process-wide default provider was installed.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use sha2::{Digest, Sha256};

use crate::store::{Store, Table};

/// ALPN protocol id for MCP over QUIC.
pub const ALPN: &[u8] = b"mcp";

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {message}")]
    Read { path: PathBuf, message: String },
    #[error("--tls-cert and --tls-key go together; pass both or neither")]
    HalfPair,
    #[error("cannot make a self-signed certificate: {0}")]
    Generate(String),
    #[error("the stored QUIC identity cannot be used: {0}")]
    Stored(String),
    #[error("bad TLS configuration: {0}")]
    Config(String),
    #[error(
        "--tls-pin must be a SHA-256 fingerprint: 64 hex digits, colons allowed (the server prints it at start)"
    )]
    BadPin,
    #[error(
        "no way to trust the server: pass --tls-ca FILE, or --tls-pin SHA256 with the fingerprint the server printed at start"
    )]
    NoTrust,
}

/// A certificate chain and its key.
#[derive(Debug)]
pub struct Identity {
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
}

impl Identity {
    /// SHA-256 of the leaf certificate, lowercase hex.
    pub fn fingerprint(&self) -> String {
        fingerprint(&self.chain[0])
    }
}

/// SHA-256 of a DER certificate, lowercase hex.
pub fn fingerprint(der: &[u8]) -> String {
    hex::encode(Sha256::digest(der))
}

pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The server identity: from `--tls-cert/--tls-key` when given, else the self-signed one in the
/// store, made on first start.
pub async fn load_identity(
    store: &Store,
    cert: Option<&Path>,
    key: Option<&Path>,
) -> Result<Identity, TlsError> {
    match (cert, key) {
        (Some(c), Some(k)) => {
            let chain = CertificateDer::pem_file_iter(c)
                .and_then(|it| it.collect::<Result<Vec<_>, _>>())
                .map_err(|e| TlsError::Read {
                    path: c.to_owned(),
                    message: e.to_string(),
                })?;
            if chain.is_empty() {
                return Err(TlsError::Read {
                    path: c.to_owned(),
                    message: "no PEM certificate in it".into(),
                });
            }
            let key = PrivateKeyDer::from_pem_file(k).map_err(|e| TlsError::Read {
                path: k.to_owned(),
                message: e.to_string(),
            })?;
            Ok(Identity { chain, key })
        }
        (None, None) => self_signed(store).await,
        _ => Err(TlsError::HalfPair),
    }
}

/// Store key of the self-signed identity: cert and key in one value, so they are written in
/// one transaction and can never disagree.
const IDENTITY_KEY: &str = "quic.identity";

#[derive(serde::Serialize, serde::Deserialize)]
struct StoredIdentity {
    cert_der_hex: String,
    key_der_hex: String,
}

async fn self_signed(store: &Store) -> Result<Identity, TlsError> {
    let stored = |e: crate::store::StoreError| TlsError::Stored(e.to_string());
    let bad = |e: String| {
        TlsError::Stored(format!(
            "{e}; delete the {IDENTITY_KEY} entry or use another --store"
        ))
    };
    if let Some(bytes) = store
        .get(Table::Identity, IDENTITY_KEY)
        .await
        .map_err(stored)?
    {
        let s: StoredIdentity = serde_json::from_slice(&bytes).map_err(|e| bad(e.to_string()))?;
        let cert = hex::decode(&s.cert_der_hex).map_err(|e| bad(e.to_string()))?;
        let key = hex::decode(&s.key_der_hex).map_err(|e| bad(e.to_string()))?;
        let key = PrivateKeyDer::try_from(key).map_err(|e| bad(e.to_string()))?;
        return Ok(Identity {
            chain: vec![CertificateDer::from(cert)],
            key,
        });
    }
    let names = vec!["localhost".to_string(), "127.0.0.1".into(), "::1".into()];
    let made =
        rcgen::generate_simple_self_signed(names).map_err(|e| TlsError::Generate(e.to_string()))?;
    let cert = made.cert.der().to_vec();
    let key = made.signing_key.serialize_der();
    let value = serde_json::to_vec(&StoredIdentity {
        cert_der_hex: hex::encode(&cert),
        key_der_hex: hex::encode(&key),
    })
    .map_err(|e| TlsError::Generate(e.to_string()))?;
    store
        .put(Table::Identity, IDENTITY_KEY, value)
        .await
        .map_err(stored)?;
    let key = PrivateKeyDer::try_from(key).map_err(|e| TlsError::Stored(e.to_string()))?;
    Ok(Identity {
        chain: vec![CertificateDer::from(cert)],
        key,
    })
}

/// rustls server config for QUIC (TLS 1.3, ALPN `mcp`).
pub fn server_config(identity: Identity) -> Result<rustls::ServerConfig, TlsError> {
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(identity.chain, identity.key)
        .map_err(|e| TlsError::Config(e.to_string()))?;
    cfg.alpn_protocols = vec![ALPN.to_vec()];
    Ok(cfg)
}

/// How a client trusts a server, and proves itself to it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClientTrust {
    /// PEM file of CA certificates.
    pub ca: Option<PathBuf>,
    /// SHA-256 fingerprint of the server's certificate.
    pub pin: Option<String>,
    /// A bearer token for the server (a gateway): the `Authorization` header on HTTP,
    /// `_meta["io.herald/token"]` on every request over QUIC.
    pub token: Option<Secret>,
    /// OAuth for an HTTP server that takes it: the session that gets and keeps its tokens
    /// (over `token`, which it replaces once it has one).
    pub oauth: Option<std::sync::Arc<crate::transport::oauth::OAuth>>,
}

/// A secret string: its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

impl Secret {
    /// `HERALD_TOKEN` from the environment, if set and not empty.
    pub fn from_env() -> Option<Secret> {
        std::env::var("HERALD_TOKEN")
            .ok()
            .filter(|t| !t.trim().is_empty())
            .map(|t| Secret(t.trim().to_owned()))
    }
}

/// Normalises a fingerprint: lowercase hex without separators.
pub fn parse_pin(pin: &str) -> Result<String, TlsError> {
    let hexed: String = pin
        .trim()
        .trim_start_matches("sha256:")
        .chars()
        .filter(|c| *c != ':')
        .collect::<String>()
        .to_ascii_lowercase();
    if hexed.len() == 64 && hexed.chars().all(|c| c.is_ascii_hexdigit()) {
        Ok(hexed)
    } else {
        Err(TlsError::BadPin)
    }
}

/// rustls client config for QUIC.
pub fn client_config(trust: &ClientTrust) -> Result<rustls::ClientConfig, TlsError> {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let mut cfg = if let Some(pin) = &trust.pin {
        let pin = parse_pin(pin)?;
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(PinVerifier {
                pin,
                provider: provider(),
            }))
            .with_no_client_auth()
    } else if let Some(ca) = &trust.ca {
        let mut roots = rustls::RootCertStore::empty();
        let certs = CertificateDer::pem_file_iter(ca)
            .and_then(|it| it.collect::<Result<Vec<_>, _>>())
            .map_err(|e| TlsError::Read {
                path: ca.clone(),
                message: e.to_string(),
            })?;
        for c in certs {
            roots.add(c).map_err(|e| TlsError::Read {
                path: ca.clone(),
                message: e.to_string(),
            })?;
        }
        builder.with_root_certificates(roots).with_no_client_auth()
    } else {
        return Err(TlsError::NoTrust);
    };
    cfg.alpn_protocols = vec![ALPN.to_vec()];
    Ok(cfg)
}

/// Accepts exactly the server certificate whose SHA-256 is the pin; handshake signatures are
/// still verified, so the server must hold the matching key.
#[derive(Debug)]
struct PinVerifier {
    pin: String,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for PinVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if fingerprint(end_entity) == self.pin {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::General(
                "server certificate does not match --tls-pin".into(),
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_are_normalised_and_checked() {
        let hexd = "AB".repeat(32);
        assert_eq!(parse_pin(&hexd).unwrap(), "ab".repeat(32));
        let colons = vec!["ab"; 32].join(":");
        assert_eq!(
            parse_pin(&format!("sha256:{colons}")).unwrap(),
            "ab".repeat(32)
        );
        assert!(parse_pin("abc").is_err());
        assert!(parse_pin(&"zz".repeat(32)).is_err());
    }

    #[tokio::test]
    async fn self_signed_identity_is_made_once_and_kept() {
        let store = Store::memory();
        let a = load_identity(&store, None, None).await.unwrap();
        let b = load_identity(&store, None, None).await.unwrap();
        assert_eq!(a.fingerprint(), b.fingerprint());
        assert_eq!(a.fingerprint().len(), 64);
        server_config(a).unwrap();
    }

    #[test]
    fn client_needs_some_trust() {
        assert!(matches!(
            client_config(&ClientTrust::default()),
            Err(TlsError::NoTrust)
        ));
    }
}
