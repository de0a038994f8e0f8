//! The real admin API for end-to-end tests: `sluice serve` on loopback with a SQLite file
//! in a temporary directory (or a database given by URL), stopped on drop.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, mpsc};
use std::time::Duration;

use hyper::Method;
use serde_json::{Value, json};
use sluice_core::listening::{Listening, Scheme};
use sluice_envoy_config::{AdminConnection, AdminTls, AdminUrl};
use tempfile::TempDir;

use crate::artifacts::Artifacts;
use crate::client::{Client, Req};
use crate::tls::TestPki;

/// The bootstrap admin token every test server starts with.
pub const ADMIN_TOKEN: &str = "slc_test_admin_token_0123456789abcdef";
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// A running `sluice serve`.
#[derive(Debug)]
pub struct AdminServer {
    child: Option<Child>,
    addr: SocketAddr,
    database: String,
    /// `--redis URL`: global buckets in Redis.
    redis: Option<String>,
    /// `--tls-cert/--tls-key`: the API over TLS.
    tls: Option<ServeTls>,
    dir: TempDir,
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
        let dir = tempfile::Builder::new()
            .prefix("sluice-admin-")
            .tempdir()
            .expect("temp dir");
        let database =
            database.unwrap_or_else(|| format!("sqlite://{}/sluice.db", dir.path().display()));
        let (child, addr) = spawn(
            &database,
            redis.as_deref(),
            tls.as_ref(),
            "127.0.0.1:0".parse().expect("address"),
        );
        AdminServer {
            child: Some(child),
            addr,
            database,
            redis,
            tls,
            dir,
        }
    }

    /// Stops the server (SIGKILL: like a crash, or an unreachable admin API).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same address and database.
    pub fn restart(&mut self) {
        self.stop();
        let (child, addr) = spawn(
            &self.database,
            self.redis.as_deref(),
            self.tls.as_ref(),
            self.addr,
        );
        self.child = Some(child);
        self.addr = addr;
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn url(&self) -> String {
        self.listening().url()
    }

    fn listening(&self) -> Listening {
        Listening {
            scheme: scheme(self.tls.as_ref()),
            addr: self.addr,
        }
    }

    /// The CA file a client needs to trust this server (over TLS only).
    pub fn ca(&self) -> Option<PathBuf> {
        self.tls.as_ref().map(|tls| tls.ca.clone())
    }

    /// A client of this server with `connections` connections (TLS when it serves TLS).
    pub fn client(&self, connections: usize) -> Client {
        match &self.tls {
            Some(tls) => Client::connect_tls(self.addr, connections, Arc::clone(&tls.client)),
            None => Client::connect(self.addr, connections),
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

impl Drop for AdminServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn scheme(tls: Option<&ServeTls>) -> Scheme {
    match tls {
        Some(_) => Scheme::Https,
        None => Scheme::Http,
    }
}

/// Starts `sluice serve` and waits for its listening line.
fn spawn(
    database: &str,
    redis: Option<&str>,
    tls: Option<&ServeTls>,
    listen: SocketAddr,
) -> (Child, SocketAddr) {
    let artifacts = Artifacts::from_env();
    let mut command = Command::new(artifacts.sluice_bin());
    command.args([
        "serve",
        "--listen",
        &listen.to_string(),
        "--database",
        database,
    ]);
    if let Some(url) = redis {
        command.args(["--redis", url]);
    }
    if let Some(tls) = tls {
        command
            .arg("--tls-cert")
            .arg(&tls.cert)
            .arg("--tls-key")
            .arg(&tls.key);
    }
    let mut child = command
        .env("SLUICE_ADMIN_TOKEN", ADMIN_TOKEN)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("starting `sluice serve`");
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(listening) = Listening::parse(&line) {
                let _ = tx.send(listening);
            }
        }
    });
    match rx.recv_timeout(START_TIMEOUT) {
        Ok(listening) => {
            assert_eq!(
                listening.scheme,
                scheme(tls),
                "`sluice serve` said {listening}"
            );
            (child, listening.addr)
        }
        Err(_) => {
            let _ = child.kill();
            panic!("`sluice serve` did not report its address within {START_TIMEOUT:?}");
        }
    }
}
