//! The real admin API for the benchmark sections: `sluice serve` on loopback, killed on
//! drop, and killed and restarted on demand for the fault runs.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use serde_json::{Value, json};

use super::envoy::http_request;

/// The bootstrap admin token every benchmark server starts with.
pub const ADMIN_TOKEN: &str = "slc_bench_admin_token_0123456789abcdef";
const START_LIMIT: Duration = Duration::from_secs(20);

/// How to start `sluice serve`.
#[derive(Debug, Clone)]
pub struct Serve {
    pub sluice: PathBuf,
    /// `sqlite://FILE` or `postgres://…`.
    pub database: String,
    /// `--redis URL`: global buckets in Redis instead of in memory.
    pub redis: Option<String>,
    /// Further `sluice serve` flags.
    pub flags: Vec<String>,
}

/// A running `sluice serve`, killed when dropped.
#[derive(Debug)]
pub struct AdminApi {
    serve: Serve,
    child: Option<Child>,
    addr: SocketAddr,
    bearer: String,
}

impl AdminApi {
    /// Starts a server on a free loopback port.
    pub fn start(serve: &Serve) -> Result<AdminApi> {
        let (child, addr) = spawn(serve, SocketAddr::from(([127, 0, 0, 1], 0)))?;
        Ok(AdminApi {
            serve: serve.clone(),
            child: Some(child),
            addr,
            bearer: format!("Bearer {ADMIN_TOKEN}"),
        })
    }

    /// SIGKILL, like a crash.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same address and database.
    pub fn restart(&mut self) -> Result<()> {
        self.kill();
        let (child, addr) = spawn(&self.serve, self.addr)?;
        self.child = Some(child);
        self.addr = addr;
        Ok(())
    }

    /// The server's process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// One API request with the admin token: `(status, body)`.
    pub fn call(&self, method: &str, path: &str, body: &str) -> Result<(u16, String)> {
        http_request(
            self.addr,
            method,
            path,
            &[
                ("Authorization", self.bearer.as_str()),
                ("Content-Type", "application/json"),
            ],
            body,
        )
    }

    /// Creates a rule; an error unless the API answers 201.
    pub fn create_rule(&self, rule: &Value) -> Result<()> {
        match self.call("POST", "/api/v1/rules", &rule.to_string())? {
            (201, _) => Ok(()),
            (status, body) => bail!("creating rule {rule}: HTTP {status}: {body}"),
        }
    }

    /// A new proxy token's secret.
    pub fn proxy_token(&self, name: &str) -> Result<String> {
        let body = json!({"name": name, "role": "proxy"}).to_string();
        match self.call("POST", "/api/v1/tokens", &body)? {
            (201, answer) => serde_json::from_str::<Value>(&answer)?["token"]
                .as_str()
                .map(str::to_string)
                .with_context(|| format!("no token in {answer}")),
            (status, answer) => bail!("creating a proxy token: HTTP {status}: {answer}"),
        }
    }

    /// One sample of the server's own Prometheus metrics (summed over labels); 0 when absent.
    pub fn metric(&self, name: &str) -> Result<f64> {
        let (status, text) = self.call("GET", "/metrics", "")?;
        if status != 200 {
            bail!("GET /metrics answered {status}");
        }
        Ok(text
            .lines()
            .filter(|line| {
                line.strip_prefix(name)
                    .is_some_and(|rest| rest.starts_with([' ', '{']))
            })
            .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum())
    }
}

impl Drop for AdminApi {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts `sluice serve` and waits for its listening line (`sluice_core::listening`).
fn spawn(serve: &Serve, listen: SocketAddr) -> Result<(Child, SocketAddr)> {
    let mut command = Command::new(&serve.sluice);
    command
        .args(["serve", "--listen", &listen.to_string()])
        .args(["--database", &serve.database]);
    if let Some(redis) = &serve.redis {
        command.args(["--redis", redis]);
    }
    command.args(&serve.flags);
    let mut child = command
        .env("SLUICE_ADMIN_TOKEN", ADMIN_TOKEN)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting `sluice serve`")?;
    let stdout = child.stdout.take().context("no stdout")?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(listening) = sluice_core::listening::Listening::parse(&line) {
                let _ = tx.send(listening.addr);
            }
        }
    });
    match rx.recv_timeout(START_LIMIT).ok() {
        Some(addr) => Ok((child, addr)),
        None => {
            let _ = child.kill();
            let _ = child.wait();
            Err(anyhow!(
                "`sluice serve` did not report its address within {START_LIMIT:?}"
            ))
        }
    }
}

/// Waits until `check` holds, polling every 20 ms, for at most `limit`.
pub fn wait_until(
    what: &str,
    limit: Duration,
    mut check: impl FnMut() -> Result<bool>,
) -> Result<()> {
    let deadline = Instant::now() + limit;
    while !check()? {
        if Instant::now() > deadline {
            bail!("timed out after {limit:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}
