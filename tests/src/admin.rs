//! The real admin API for end-to-end tests: `sluice serve` on loopback with a SQLite file
//! in a temporary directory (or a database given by URL), stopped on drop. The process is
//! the harness's [`AdminApi`]; this adds the tests' client, TLS and panics.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use hyper::Method;
use serde_json::{Value, json};
use sluice_core::listening::Scheme;
use sluice_envoy_config::{AdminConnection, AdminTls, AdminUrl, RlsCredentials};
use sluice_harness::load::Req;
use sluice_harness::serve::{ADMIN_TOKEN, AdminApi, Serve};
use tempfile::TempDir;

use crate::artifacts::Artifacts;
use crate::client::Client;
use crate::tls::TestPki;

/// A running `sluice serve`.
#[derive(Debug)]
pub struct AdminServer {
    /// Before `dir`: the server stops before its database's folder goes.
    api: AdminApi,
    /// `--tls-cert/--tls-key`: the API over TLS.
    tls: Option<ServeTls>,
    /// With `--rls-auth token`: a proxy token for the rate limit service's callers.
    rls_token: Option<String>,
    dir: TempDir,
}

/// How the rate limit service (`--rls-listen 127.0.0.1:0`) is started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RlsMode {
    Off,
    /// `--rls-auth token`, and a proxy token made for its callers.
    Token,
    /// `--rls-auth none --rls-client-ca`: client certificates alone (needs TLS).
    ClientCertificates,
}

/// What a server over TLS needs, and what its clients trust.
#[derive(Debug, Clone)]
struct ServeTls {
    cert: PathBuf,
    key: PathBuf,
    ca: PathBuf,
    client: Arc<rustls::ClientConfig>,
}

impl AdminServer {
    /// Starts a server with a fresh SQLite database on a free loopback port.
    pub fn start() -> AdminServer {
        AdminServer::start_with(None, None, None)
    }

    /// Starts a server over TLS with `pki`'s server certificate; its calls, and Envoys
    /// following it ([`AdminServer::connection`]), trust `pki`'s CA.
    pub fn start_tls(pki: &TestPki) -> AdminServer {
        AdminServer::start_with(
            None,
            None,
            Some(ServeTls {
                cert: pki.server_cert(),
                key: pki.server_key(),
                ca: pki.ca(),
                client: pki.client_config(),
            }),
        )
    }

    /// Starts a server that keeps global buckets in the Redis at `url`.
    pub fn start_with_redis(url: &str) -> AdminServer {
        AdminServer::start_with(None, Some(url.to_string()), None)
    }

    /// Starts a server that also serves Envoy's rate limit service on a free loopback
    /// port (`--rls-listen 127.0.0.1:0`), its buckets in the Redis at `redis` if given,
    /// its callers needing a proxy token ([`AdminServer::rls_credentials`] has one).
    pub fn start_rls(redis: Option<&str>) -> AdminServer {
        AdminServer::start_full(None, redis.map(str::to_string), None, RlsMode::Token)
    }

    /// Starts a server over TLS with `pki`'s server certificate whose rate limit service
    /// requires a client certificate signed by `pki`'s CA (`--rls-client-ca`), and no
    /// token (`--rls-auth none`).
    pub fn start_rls_mtls(pki: &TestPki) -> AdminServer {
        AdminServer::start_full(
            None,
            None,
            Some(ServeTls {
                cert: pki.server_cert(),
                key: pki.server_key(),
                ca: pki.ca(),
                client: pki.client_config(),
            }),
            RlsMode::ClientCertificates,
        )
    }

    /// What an Envoy needs to call the rate limit service: the proxy token made for it
    /// (with `--rls-auth token`), and over TLS, the test CA to check the server with.
    pub fn rls_credentials(&self) -> RlsCredentials {
        RlsCredentials {
            token: self.rls_token.clone(),
            tls: self.tls.as_ref().map(|tls| AdminTls::new(&tls.ca)),
            insecure: false,
        }
    }

    /// Where it serves the rate limit service (see [`AdminServer::start_rls`]).
    pub fn rls_addr(&self) -> SocketAddr {
        self.api.rls().expect("started with --rls-listen").addr
    }

    /// Starts a server on the database at `url` (`postgres://…`, or `sqlite://…`) rather
    /// than a fresh SQLite file; [`AdminServer::restart`] comes back on the same one.
    pub fn start_on_database(url: &str) -> AdminServer {
        AdminServer::start_with(Some(url.to_string()), None, None)
    }

    fn start_with(
        database: Option<String>,
        redis: Option<String>,
        tls: Option<ServeTls>,
    ) -> AdminServer {
        AdminServer::start_full(database, redis, tls, RlsMode::Off)
    }

    fn start_full(
        database: Option<String>,
        redis: Option<String>,
        tls: Option<ServeTls>,
        rls: RlsMode,
    ) -> AdminServer {
        let dir = tempfile::Builder::new()
            .prefix("sluice-admin-")
            .tempdir()
            .expect("temp dir");
        let database =
            database.unwrap_or_else(|| format!("sqlite://{}/sluice.db", dir.path().display()));
        let mut serve = Serve::new(Artifacts::from_env().sluice_bin().to_path_buf(), database);
        serve.redis = redis;
        serve.show_log = true;
        if let Some(tls) = &tls {
            serve.flags = vec![
                "--tls-cert".into(),
                tls.cert.display().to_string(),
                "--tls-key".into(),
                tls.key.display().to_string(),
            ];
        }
        match rls {
            RlsMode::Off => {}
            RlsMode::Token => serve.flags.extend([
                "--rls-listen".into(),
                "127.0.0.1:0".into(),
                "--rls-auth".into(),
                "token".into(),
            ]),
            RlsMode::ClientCertificates => serve.flags.extend([
                "--rls-listen".into(),
                "127.0.0.1:0".into(),
                "--rls-auth".into(),
                "none".into(),
                "--rls-client-ca".into(),
                tls.as_ref()
                    .expect("client certificates need TLS")
                    .ca
                    .display()
                    .to_string(),
            ]),
        }
        let api = AdminApi::start(&serve).unwrap_or_else(|err| panic!("{err:#}"));
        let mut server = AdminServer {
            api,
            tls,
            rls_token: None,
            dir,
        };
        server.check_scheme();
        if rls == RlsMode::Token {
            server.rls_token = Some(server.create_token("proxy", "rls-caller"));
        }
        server
    }

    /// Over TLS exactly when started with a certificate.
    fn check_scheme(&self) {
        let expected = match self.tls {
            Some(_) => Scheme::Https,
            None => Scheme::Http,
        };
        let listening = self.api.listening();
        assert_eq!(
            listening.scheme, expected,
            "`sluice serve` said {listening}"
        );
    }

    /// Stops the server (SIGKILL: like a crash, or an unreachable admin API).
    pub fn stop(&mut self) {
        self.api.kill();
    }

    /// Starts it again on the same address and database.
    pub fn restart(&mut self) {
        self.api.restart().unwrap_or_else(|err| panic!("{err:#}"));
        self.check_scheme();
    }

    pub fn addr(&self) -> SocketAddr {
        self.api.addr()
    }

    pub fn url(&self) -> String {
        self.api.url()
    }

    /// The CA file a client needs to trust this server (over TLS only).
    pub fn ca(&self) -> Option<PathBuf> {
        self.tls.as_ref().map(|tls| tls.ca.clone())
    }

    /// A client of this server with `connections` connections (TLS when it serves TLS).
    pub fn client(&self, connections: usize) -> Client {
        match &self.tls {
            Some(tls) => Client::connect_tls(self.addr(), connections, Arc::clone(&tls.client)),
            None => Client::connect(self.addr(), connections),
        }
    }

    /// Where the server keeps its database.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// Sends one API request with the admin token; returns the status and the JSON body
    /// (`Value::Null` when empty).
    pub fn call(&self, method: Method, path: &str, body: Option<Value>) -> (u16, Value) {
        self.call_as(ADMIN_TOKEN, method, path, body)
    }

    pub fn call_as(
        &self,
        token: &str,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let client = self.client(1);
        let mut req = Req::new(method, path).header("authorization", format!("Bearer {token}"));
        if let Some(body) = body {
            req = req.header("content-type", "application/json");
            req.body = body.to_string().into();
        }
        let resp = client.send(req);
        let value = if resp.body.trim().is_empty() {
            Value::Null
        } else {
            resp.json()
        };
        (resp.status, value)
    }

    /// The server's own Prometheus metrics (`/metrics`, no token needed).
    pub fn metrics_text(&self) -> String {
        let resp = self.client(1).send(Req::get("/metrics"));
        assert_eq!(resp.status, 200, "{}", resp.body);
        resp.body
    }

    /// Creates a token with `role` and returns its secret.
    pub fn create_token(&self, role: &str, name: &str) -> String {
        let (status, body) = self.call(
            Method::POST,
            "/api/v1/tokens",
            Some(json!({"name": name, "role": role})),
        );
        assert_eq!(status, 201, "creating a {role} token: {body}");
        body["token"].as_str().expect("token secret").to_string()
    }

    /// What an Envoy needs to follow this server with `proxy_token` (over TLS, checking
    /// the certificate against the test CA, when the server serves TLS).
    pub fn connection(&self, proxy_token: &str, proxy_id: &str) -> AdminConnection {
        let url: AdminUrl = self.url().parse().expect("admin URL");
        let mut connection = AdminConnection::new(url, proxy_token);
        connection.tls = self.tls.as_ref().map(|tls| AdminTls::new(&tls.ca));
        connection.proxy_id = Some(proxy_id.to_string());
        connection.poll_timeout_seconds = 10;
        connection
    }
}
