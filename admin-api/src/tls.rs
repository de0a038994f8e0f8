//! `sluice serve --tls-cert FILE --tls-key FILE`: the admin API over TLS (rustls, ring).
//!
//! Proxy tokens, API tokens and dashboard sessions cross the network in every request, so
//! an admin API reached from other hosts should speak TLS itself (or sit behind a proxy
//! that does). [`server_config`] reads the PEM files and refuses them with a message that
//! names the flag and the file. Handshakes run in [`crate::conn`]'s accept loop, each in
//! its connection's task and within `--tls-handshake-timeout`, so the plain and the TLS
//! server share one serving path and one connection budget, graceful shutdown included.
//! [`client_auth_config`] is the same with client certificates required (the rate limit
//! service's `--rls-client-ca`).

use std::io;
use std::path::Path;
use std::sync::Arc;

use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::danger::ClientCertVerifier;
use rustls::server::{NoClientAuth, WebPkiClientVerifier};

/// A request extension: the request came over the server's own TLS (see
/// [`crate::server::start_tls`]), so what it sets in the browser may be `Secure`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OverTls;

/// Why the certificate or key cannot be used. Each message names the flag and the file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("--{flag} {path}: cannot read it: {source}")]
    Unreadable {
        flag: &'static str,
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("--tls-cert {path}: no PEM certificate in it ({detail})")]
    NoCertificate { path: String, detail: String },
    #[error("--rls-client-ca {path}: no usable PEM CA certificate in it ({detail})")]
    NoClientCa { path: String, detail: String },
    #[error(
        "--tls-key {path}: no PEM private key in it (PKCS#8 `PRIVATE KEY`, PKCS#1 \
         `RSA PRIVATE KEY` or SEC1 `EC PRIVATE KEY`) ({detail})"
    )]
    NoKey { path: String, detail: String },
    #[error("--tls-key {key} does not belong to the certificate in --tls-cert {cert}")]
    Mismatch { cert: String, key: String },
    #[error("--tls-cert {cert} / --tls-key {key}: {detail}")]
    Refused {
        cert: String,
        key: String,
        detail: String,
    },
}

fn read(flag: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Unreadable {
        flag,
        path: path.display().to_string(),
        source,
    })
}

/// The server's TLS configuration from a PEM certificate chain (leaf first, then any
/// intermediates) and its PEM private key. Speaks HTTP/1.1 only, as the server does.
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<ServerConfig>, TlsError> {
    configured(cert, key, Arc::new(NoClientAuth))
}

/// [`server_config`] that also requires every client to present a certificate chaining to
/// one of the PEM CA certificates in `client_ca` (`sluice serve --rls-client-ca`): a
/// client without one, or with another, fails the handshake.
pub fn client_auth_config(
    cert: &Path,
    key: &Path,
    client_ca: &Path,
) -> Result<Arc<ServerConfig>, TlsError> {
    let ca_name = client_ca.display().to_string();
    let no_ca = |detail: String| TlsError::NoClientCa {
        path: ca_name.clone(),
        detail,
    };
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(&read("rls-client-ca", client_ca)?) {
        roots
            .add(ca.map_err(|e| no_ca(e.to_string()))?)
            .map_err(|e| no_ca(e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(no_ca("the file holds no CERTIFICATE block".to_string()));
    }
    let verifier =
        WebPkiClientVerifier::builder_with_provider(Arc::new(roots), Arc::new(provider()))
            .build()
            .map_err(|e| no_ca(e.to_string()))?;
    configured(cert, key, verifier)
}

/// One provider named here, rather than rustls' process-wide default, which depends on
/// which crypto features the whole dependency tree happens to enable.
fn provider() -> rustls::crypto::CryptoProvider {
    rustls::crypto::ring::default_provider()
}

fn configured(
    cert: &Path,
    key: &Path,
    clients: Arc<dyn ClientCertVerifier>,
) -> Result<Arc<ServerConfig>, TlsError> {
    let cert_name = cert.display().to_string();
    let key_name = key.display().to_string();
    let chain = CertificateDer::pem_slice_iter(&read("tls-cert", cert)?)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::NoCertificate {
            path: cert_name.clone(),
            detail: e.to_string(),
        })?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate {
            path: cert_name,
            detail: "the file holds no CERTIFICATE block".to_string(),
        });
    }
    let private_key =
        PrivateKeyDer::from_pem_slice(&read("tls-key", key)?).map_err(|e| TlsError::NoKey {
            path: key_name.clone(),
            detail: e.to_string(),
        })?;
    let mut config = ServerConfig::builder_with_provider(Arc::new(provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Refused {
            cert: cert_name.clone(),
            key: key_name.clone(),
            detail: e.to_string(),
        })?
        .with_client_cert_verifier(clients)
        .with_single_cert(chain, private_key)
        .map_err(|e| match e {
            rustls::Error::InconsistentKeys(_) => TlsError::Mismatch {
                cert: cert_name.clone(),
                key: key_name.clone(),
            },
            other => TlsError::Refused {
                cert: cert_name.clone(),
                key: key_name.clone(),
                detail: other.to_string(),
            },
        })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
