//! `sluice serve --tls-cert FILE --tls-key FILE`: the admin API over TLS (rustls, ring).
//!
//! Proxy tokens, API tokens and dashboard sessions cross the network in every request, so
//! an admin API reached from other hosts should speak TLS itself (or sit behind a proxy
//! that does). [`server_config`] reads the PEM files and refuses them with a message that
//! names the flag and the file; [`TlsListener`] is the listener `axum::serve` takes, so
//! the plain and the TLS server share one serving path, graceful shutdown included.

use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// A request extension: the request came over the server's own TLS (see
/// [`crate::server::start_tls`]), so what it sets in the browser may be `Secure`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OverTls;

/// How long a client may take to finish its TLS handshake. Handshakes run in their own
/// tasks, so a slow one delays only itself; the limit frees the task of one that never ends.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Finished handshakes waiting for the server to take them.
const READY_QUEUE: usize = 64;

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
    // One provider named here, rather than rustls' process-wide default, which depends
    // on which crypto features the whole dependency tree happens to enable.
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Refused {
            cert: cert_name.clone(),
            key: key_name.clone(),
            detail: e.to_string(),
        })?
        .with_no_client_auth()
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

/// A listener whose connections have completed their TLS handshake.
///
/// A task accepts TCP connections and runs each handshake in a task of its own, so one
/// slow or silent client cannot hold up the others; finished connections queue for
/// `axum::serve`. Dropping the listener (as a graceful shutdown does) stops accepting.
#[derive(Debug)]
pub(crate) struct TlsListener {
    local: SocketAddr,
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    acceptor: JoinHandle<()>,
}

impl TlsListener {
    pub(crate) fn new(listener: TcpListener, config: Arc<ServerConfig>) -> io::Result<TlsListener> {
        let local = listener.local_addr()?;
        let (tx, ready) = mpsc::channel(READY_QUEUE);
        let acceptor = tokio::spawn(accept_loop(listener, TlsAcceptor::from(config), tx));
        Ok(TlsListener {
            local,
            ready,
            acceptor,
        })
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.acceptor.abort();
    }
}

async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    ready: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
) {
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(err) => {
                // As axum's own TCP listener does: errors of one connection are skipped;
                // others (out of file descriptors) are logged and waited out.
                if !matches!(
                    err.kind(),
                    io::ErrorKind::ConnectionRefused
                        | io::ErrorKind::ConnectionAborted
                        | io::ErrorKind::ConnectionReset
                ) {
                    tracing::error!("accepting a connection: {err}");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                continue;
            }
        };
        let acceptor = acceptor.clone();
        let ready = ready.clone();
        tokio::spawn(async move {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => {
                    // Fails only when the server has stopped; the connection is dropped.
                    let _ = ready.send((stream, peer)).await;
                }
                // A client that does not speak TLS (plain HTTP to an https port), or does
                // not trust the certificate: its problem, worth a debug line only.
                Ok(Err(err)) => tracing::debug!(%peer, "TLS handshake failed: {err}"),
                Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
            }
        });
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(connection) => connection,
            // The accept loop ends only when aborted, which happens only on drop.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }
}
