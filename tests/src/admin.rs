//! The real admin API for end-to-end tests: `sluice serve` on loopback with a SQLite file
//! in a temporary directory (or a database given by URL), stopped on drop.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use hyper::Method;
use serde_json::{Value, json};
use sluice_admin::envoy_config::{AdminConnection, AdminUrl};
use tempfile::TempDir;

use crate::artifacts::Artifacts;
use crate::client::{Client, Req};

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
    dir: TempDir,
}

impl AdminServer {
    /// Starts a server with a fresh SQLite database on a free loopback port.
    pub fn start() -> AdminServer {
        AdminServer::start_with(None, None)
    }

    /// Starts a server that keeps global buckets in the Redis at `url`.
    pub fn start_with_redis(url: &str) -> AdminServer {
        AdminServer::start_with(None, Some(url.to_string()))
    }

    /// Starts a server on the database at `url` (`postgres://…`, or `sqlite://…`) rather
    /// than a fresh SQLite file; [`AdminServer::restart`] comes back on the same one.
    pub fn start_on_database(url: &str) -> AdminServer {
        AdminServer::start_with(Some(url.to_string()), None)
    }

    fn start_with(database: Option<String>, redis: Option<String>) -> AdminServer {
        let dir = tempfile::Builder::new()
            .prefix("sluice-admin-")
            .tempdir()
            .expect("temp dir");
        let database =
            database.unwrap_or_else(|| format!("sqlite://{}/sluice.db", dir.path().display()));
        let (child, addr) = spawn(
            &database,
            redis.as_deref(),
            "127.0.0.1:0".parse().expect("address"),
        );
        AdminServer {
            child: Some(child),
            addr,
            database,
            redis,
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
        let (child, addr) = spawn(&self.database, self.redis.as_deref(), self.addr);
        self.child = Some(child);
        self.addr = addr;
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
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
        let client = Client::connect(self.addr, 1);
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
        let resp = Client::connect(self.addr, 1).send(Req::get("/metrics"));
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

    /// What an Envoy needs to follow this server with `proxy_token`.
    pub fn connection(&self, proxy_token: &str, proxy_id: &str) -> AdminConnection {
        let url: AdminUrl = self.url().parse().expect("admin URL");
        let mut connection = AdminConnection::new(url, proxy_token);
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

/// Starts `sluice serve` and waits for its "listening on http://ADDR" line.
fn spawn(database: &str, redis: Option<&str>, listen: SocketAddr) -> (Child, SocketAddr) {
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
            if let Some(addr) = line.strip_prefix("listening on http://") {
                let _ = tx.send(addr.trim().to_string());
            }
        }
    });
    match rx.recv_timeout(START_TIMEOUT) {
        Ok(addr) => (
            child,
            addr.parse().expect("a socket address after `listening on`"),
        ),
        Err(_) => {
            let _ = child.kill();
            panic!("`sluice serve` did not report its address within {START_TIMEOUT:?}");
        }
    }
}
