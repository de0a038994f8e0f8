//! Certificates for TLS tests, made in the test: a throwaway CA, a server certificate it
//! signed for `127.0.0.1`, `::1` and `localhost`, and a client certificate, as PEM files in
//! a private temporary folder deleted on drop.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use base64::Engine as _;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, PublicKeyData as _,
};
use rustls::pki_types::CertificateDer;
use sha2::{Digest as _, Sha256};
use tempfile::TempDir;

/// The names the server certificate is valid for.
pub const SERVER_NAMES: [&str; 3] = ["127.0.0.1", "::1", "localhost"];

/// A CA and the certificates it signed, on disk.
#[derive(Debug)]
pub struct TestPki {
    dir: TempDir,
    ca_der: CertificateDer<'static>,
    /// base64(SHA-256(the server key's SubjectPublicKeyInfo)): what Chromium's
    /// `--ignore-certificate-errors-spki-list` takes.
    server_spki_sha256: String,
}

impl TestPki {
    /// Makes the CA and the certificates (ECDSA P-256); panics if it cannot.
    pub fn new() -> TestPki {
        let dir = tempfile::Builder::new()
            .prefix("sluice-pki-")
            .tempdir()
            .expect("a folder for the certificates");
        let write = |name: &str, pem: String| {
            std::fs::write(dir.path().join(name), pem).unwrap_or_else(|e| panic!("{name}: {e}"))
        };

        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "Sluice test CA");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().expect("CA key"))
            .expect("the CA certificate");
        write("ca.pem", ca.pem());

        let names: Vec<String> = SERVER_NAMES.iter().map(|s| s.to_string()).collect();
        let mut server = CertificateParams::new(names).expect("server params");
        server
            .distinguished_name
            .push(DnType::CommonName, "sluice serve");
        server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let server_key = KeyPair::generate().expect("server key");
        let server_cert = server.signed_by(&server_key, &ca).expect("server cert");
        write("server.pem", server_cert.pem());
        write("server.key", server_key.serialize_pem());

        let mut client = CertificateParams::new(Vec::<String>::new()).expect("client params");
        client.distinguished_name.push(DnType::CommonName, "envoy");
        client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let client_key = KeyPair::generate().expect("client key");
        let client_cert = client.signed_by(&client_key, &ca).expect("client cert");
        write("client.pem", client_cert.pem());
        write("client.key", client_key.serialize_pem());

        // A key that belongs to none of the certificates.
        write(
            "other.key",
            KeyPair::generate().expect("key").serialize_pem(),
        );

        let spki = Sha256::digest(server_key.subject_public_key_info());
        TestPki {
            ca_der: ca.der().clone(),
            server_spki_sha256: base64::engine::general_purpose::STANDARD.encode(spki),
            dir,
        }
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The CA certificate (PEM).
    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// The server certificate (PEM), for `sluice serve --tls-cert`.
    pub fn server_cert(&self) -> PathBuf {
        self.dir.path().join("server.pem")
    }

    /// Its private key (PEM, PKCS#8), for `--tls-key`.
    pub fn server_key(&self) -> PathBuf {
        self.dir.path().join("server.key")
    }

    /// A client certificate the CA signed, and its key.
    pub fn client_cert(&self) -> (PathBuf, PathBuf) {
        (
            self.dir.path().join("client.pem"),
            self.dir.path().join("client.key"),
        )
    }

    /// A private key that matches no certificate here.
    pub fn other_key(&self) -> PathBuf {
        self.dir.path().join("other.key")
    }

    /// What Chromium's `--ignore-certificate-errors-spki-list` takes to trust the server
    /// certificate (and nothing else).
    pub fn server_spki_sha256(&self) -> &str {
        &self.server_spki_sha256
    }

    /// A client configuration that trusts this CA alone.
    pub fn client_config(&self) -> Arc<rustls::ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(self.ca_der.clone())
            .expect("the CA certificate is a trust anchor");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        Arc::new(config)
    }
}

impl Default for TestPki {
    fn default() -> Self {
        TestPki::new()
    }
}
