//! The real admin API as a child process: `sluice serve` on loopback, killed on drop, and
//! killed and started again on demand for fault runs. The end-to-end tests, the benchmark
//! and `cargo xtask test`'s contract check start theirs here.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use serde_json::{Value, json};
use sluice_core::listening::{Listening, RlsListening};

use crate::cmd;
use crate::http::http_request;

/// The bootstrap admin token every server started here begins with.
pub const ADMIN_TOKEN: &str = "slc_test_admin_token_0123456789abcdef";
/// How long `sluice serve` may take to migrate its database and listen.
const START_LIMIT: Duration = Duration::from_secs(20);

/// How to start `sluice serve`.
#[derive(Debug, Clone)]
pub struct Serve {
    pub sluice: PathBuf,
    /// `sqlite://FILE` or `postgres://…`.
    pub database: String,
    /// `--redis URL`: global buckets in Redis instead of in memory.
    pub redis: Option<String>,
    /// Further `sluice serve` flags (e.g. `--tls-cert`, `--tls-key`).
    pub flags: Vec<String>,
    /// The server's log (its stderr) on ours, for a test's output; discarded otherwise.
    pub show_log: bool,
    /// `taskset -c` CPU list, e.g. `"0"`: the server's threads run only there (and its
    /// runtime sizes itself to them); `None` leaves it unpinned.
    pub cpus: Option<String>,
}

impl Serve {
    /// `sluice serve` on `database` with no further flags, its log discarded.
    pub fn new(sluice: PathBuf, database: String) -> Serve {
        Serve {
            sluice,
            database,
            redis: None,
            flags: Vec::new(),
            show_log: false,
            cpus: None,
        }
    }
}

/// A running `sluice serve`, killed when dropped.
#[derive(Debug)]
pub struct AdminApi {
    serve: Serve,
    child: Option<Child>,
    listening: Listening,
    /// What it said of `--rls-listen`, if given.
    rls: Option<RlsListening>,
    bearer: String,
}

impl AdminApi {
    /// Starts a server on a free loopback port.
    pub fn start(serve: &Serve) -> Result<AdminApi> {
        let (child, listening, rls) = spawn(serve, SocketAddr::from(([127, 0, 0, 1], 0)))?;
        Ok(AdminApi {
            serve: serve.clone(),
            child: Some(child),
            listening,
            rls,
            bearer: format!("Bearer {ADMIN_TOKEN}"),
        })
    }

    /// SIGKILL, like a crash or an unreachable admin API.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same address and database.
    pub fn restart(&mut self) -> Result<()> {
        self.kill();
        let (child, listening, rls) = spawn(&self.serve, self.listening.addr)?;
        self.child = Some(child);
        self.listening = listening;
        self.rls = rls;
        Ok(())
    }

    /// The server's process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The server's user plus system CPU time so far, in clock ticks.
    pub fn cpu_ticks(&self) -> Result<u64> {
        let pid = self.pid().context("the admin API is not running")?;
        crate::envoy::cpu_ticks(pid)
    }

    /// What the server said it listens on.
    pub fn listening(&self) -> Listening {
        self.listening
    }

    pub fn addr(&self) -> SocketAddr {
        self.listening.addr
    }

    /// Where it serves Envoy's rate limit service (`--rls-listen`), if it does.
    pub fn rls(&self) -> Option<RlsListening> {
        self.rls
    }

    /// `http://ADDRESS` (or `https://` over TLS).
    pub fn url(&self) -> String {
        self.listening.url()
    }

    /// One API request over plain HTTP with the admin token: `(status, body)`.
    pub fn call(&self, method: &str, path: &str, body: &str) -> Result<(u16, String)> {
        http_request(
            self.listening.addr,
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

/// `sluice token create --role ROLE --name NAME` on `database`, offline, as an operator
/// bootstraps one: the secret it prints.
pub fn create_token(sluice: &Path, database: &str, role: &str, name: &str) -> Result<String> {
    let printed = cmd::output(Command::new(sluice).args([
        "token",
        "create",
        "--role",
        role,
        "--name",
        name,
        "--database",
        database,
    ]))
    .with_context(|| format!("creating the {role} token {name}"))?;
    let secret = printed.trim();
    if !secret.starts_with("slc_") {
        bail!("`sluice token create` printed {secret:?}");
    }
    Ok(secret.to_string())
}

impl Drop for AdminApi {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts `sluice serve` and waits for its listening line (`sluice_core::listening`).
fn spawn(serve: &Serve, listen: SocketAddr) -> Result<(Child, Listening, Option<RlsListening>)> {
    // taskset execs the server, so the child's pid is the server's own.
    let mut command = match &serve.cpus {
        Some(cpus) => {
            let mut taskset = Command::new("taskset");
            taskset.args(["-c", cpus]).arg(&serve.sluice);
            taskset
        }
        None => Command::new(&serve.sluice),
    };
    command
        .args(["serve", "--listen", &listen.to_string()])
        .args(["--database", &serve.database]);
    if let Some(redis) = &serve.redis {
        command.args(["--redis", redis]);
    }
    command.args(&serve.flags);
    let stderr = if serve.show_log {
        Stdio::inherit()
    } else {
        Stdio::null()
    };
    let mut child = command
        .env("SLUICE_ADMIN_TOKEN", ADMIN_TOKEN)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .with_context(|| format!("starting `{} serve`", serve.sluice.display()))?;
    let stdout = child.stdout.take().context("no stdout")?;
    let (tx, rx) = mpsc::channel();
    // Reads to the end, so the server never blocks on a full pipe.
    // The rate limit service's line, if any, comes first.
    std::thread::spawn(move || {
        let mut rls = None;
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(found) = RlsListening::parse(&line) {
                rls = Some(found);
            }
            if let Some(listening) = Listening::parse(&line) {
                let _ = tx.send((listening, rls));
            }
        }
    });
    match rx.recv_timeout(START_LIMIT) {
        Ok((listening, rls)) => Ok((child, listening, rls)),
        Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            Err(anyhow!(
                "`sluice serve` did not report its address within {START_LIMIT:?}"
            ))
        }
    }
}
