//! A throwaway Redis server.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// The `redis-server` binary to run; `redis-server` on `PATH` when unset.
pub const REDIS_SERVER_ENV: &str = "SLUICE_REDIS_SERVER";

/// How long a fresh server may take to answer `PING`.
const START_LIMIT: Duration = Duration::from_secs(20);

/// A `redis-server` on 127.0.0.1 with its files in a private temporary folder. Nothing is
/// persisted, so a restart starts empty (as a Redis without persistence does after a crash).
/// Stopped on drop.
#[derive(Debug)]
pub struct RedisServer {
    binary: PathBuf,
    addr: SocketAddr,
    dir: tempfile::TempDir,
    /// Arguments beyond the throwaway defaults (cluster mode, see `RedisCluster`).
    extra: Vec<String>,
    child: Option<Child>,
}

impl RedisServer {
    /// Starts a server on a free loopback port; panics with its log if it does not come up.
    pub fn start() -> RedisServer {
        RedisServer::try_start().unwrap_or_else(|err| panic!("{err:#}"))
    }

    pub fn try_start() -> Result<RedisServer> {
        RedisServer::try_start_with(&[])
    }

    /// [`RedisServer::try_start`] with more arguments for `redis-server`.
    pub fn try_start_with(extra: &[&str]) -> Result<RedisServer> {
        let binary = server_binary();
        let dir = tempfile::Builder::new()
            .prefix("sluice-redis-")
            .tempdir()
            .context("creating a folder for Redis")?;
        // The port is free when we look; Redis binds it a moment later. A clash fails
        // loudly at start-up rather than silently.
        let addr = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .context("finding a free port for Redis")?;
        let mut server = RedisServer {
            binary,
            addr,
            dir,
            extra: extra.iter().map(|a| a.to_string()).collect(),
            child: None,
        };
        server.try_restart()?;
        Ok(server)
    }

    /// `redis://127.0.0.1:PORT`, the form `sluice serve --redis` takes.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// One numeric field of `INFO SECTION` (`used_memory` of `memory`,
    /// `total_net_input_bytes` of `stats`, `used_cpu_user` of `cpu`, in seconds), asked
    /// with `redis-cli` (Debian's `redis-tools`, installed with the server).
    pub fn info_field<T: std::str::FromStr>(&self, section: &str, field: &str) -> Result<T> {
        let out = self.cli(&["INFO", section])?;
        let prefix = format!("{field}:");
        out.lines()
            .find_map(|line| line.trim().strip_prefix(prefix.as_str())?.parse().ok())
            .with_context(|| format!("redis-cli INFO {section} gave no {field}"))
    }

    /// Every command this server ran since it started, with its calls and the
    /// microseconds it spent in them (`INFO commandstats`), by command name in lower case.
    pub fn command_stats(&self) -> Result<CommandStats> {
        Ok(CommandStats::parse(&self.cli(&["INFO", "commandstats"])?))
    }

    /// What `redis-cli` prints for one command sent to this server (raw: one reply
    /// element per line); an error when it cannot run, or prints an error.
    pub fn cli(&self, args: &[&str]) -> Result<String> {
        let out = Command::new(cli_binary())
            .args(["-h", &self.addr.ip().to_string()])
            .args(["-p", &self.addr.port().to_string()])
            .args(args)
            .output()
            .context("running redis-cli")?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() || text.starts_with("ERR") || text.starts_with("(error)") {
            bail!(
                "redis-cli {} on {}: {text}{}",
                args.join(" "),
                self.addr,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(text)
    }

    /// Whether the server was started and not killed since (without asking the process).
    pub fn is_started(&self) -> bool {
        self.child.is_some()
    }

    /// Whether the server process is running.
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|child| matches!(child.try_wait(), Ok(None)))
    }

    /// Kills the server at once (SIGKILL), as a crash would; its data is gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port, empty.
    pub fn restart(&mut self) {
        self.try_restart().unwrap_or_else(|err| panic!("{err:#}"));
    }

    fn try_restart(&mut self) -> Result<()> {
        self.kill();
        let log = self.dir.path().join("redis.log");
        let mut command = Command::new(&self.binary);
        command
            .args(["--bind", "127.0.0.1", "--port"])
            .arg(self.addr.port().to_string())
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(&log)
            // A throwaway server: nothing written to disk, nothing kept across a restart.
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = command.spawn().with_context(|| {
            format!(
                "starting {} (install Debian's redis-server, or set {REDIS_SERVER_ENV}; \
                 `cargo xtask test` does both)",
                self.binary.display()
            )
        })?;
        self.child = Some(child);
        let deadline = Instant::now() + START_LIMIT;
        loop {
            if ping(self.addr) {
                return Ok(());
            }
            if !self.is_running() || Instant::now() >= deadline {
                let tail = log_tail(&log);
                self.kill();
                bail!("Redis did not start on {}; its log:\n{tail}", self.addr);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The folder holding the server's log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

fn server_binary() -> PathBuf {
    std::env::var_os(REDIS_SERVER_ENV).map_or_else(|| PathBuf::from("redis-server"), PathBuf::from)
}

/// `redis-cli`, installed with the server: beside it, else on `PATH`.
fn cli_binary() -> PathBuf {
    let beside = server_binary().with_file_name("redis-cli");
    if beside
        .parent()
        .is_some_and(|dir| !dir.as_os_str().is_empty())
        && beside.exists()
    {
        beside
    } else {
        PathBuf::from("redis-cli")
    }
}

/// Whether a Redis answers `PING` on `addr`. Written out rather than through a client
/// crate: this is the one command the launcher needs, and the product's code uses a real
/// client.
fn ping(addr: SocketAddr) -> bool {
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut reply = [0u8; 7];
    stream.read_exact(&mut reply).is_ok() && &reply == b"+PONG\r\n"
}

fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// Set by `cargo xtask test`: a missing Redis is then a failure, not a skip.
pub const REQUIRE_REDIS_ENV: &str = "SLUICE_REQUIRE_REDIS";

/// Whether `redis-server` runs here. Tests that need Redis skip (with a notice) when it
/// does not, unless [`REQUIRE_REDIS_ENV`] is set, as under `cargo xtask test`: then this
/// panics.
pub fn redis_available() -> bool {
    let binary = server_binary();
    let found = Command::new(&binary)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        found || std::env::var_os(REQUIRE_REDIS_ENV).is_none(),
        "{REQUIRE_REDIS_ENV} is set but {} does not run",
        binary.display()
    );
    if !found {
        eprintln!(
            "skipped: {} does not run (cargo xtask test installs it, or set {REDIS_SERVER_ENV})",
            binary.display()
        );
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_answers_dies_and_comes_back_on_its_port() {
        if !redis_available() {
            return;
        }
        let mut server = RedisServer::start();
        assert!(ping(server.addr()));
        assert!(server.url().starts_with("redis://127.0.0.1:"));
        let addr = server.addr();
        server.kill();
        assert!(!server.is_running());
        assert!(!ping(addr), "a killed server answers nothing");
        server.restart();
        assert_eq!(server.addr(), addr, "the same port after a restart");
        assert!(ping(addr));
    }
}

/// Calls and microseconds of CPU per Redis command (`INFO commandstats`); sums over a
/// cluster's nodes and differences over a run with [`CommandStats::plus`] and
/// [`CommandStats::since`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CommandStats(pub std::collections::BTreeMap<String, CommandStat>);

#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CommandStat {
    pub calls: u64,
    pub usec: u64,
}

impl CommandStats {
    /// Reads lines such as `cmdstat_evalsha:calls=12,usec=340,usec_per_call=28.33,...`;
    /// other lines are skipped.
    fn parse(info: &str) -> CommandStats {
        let mut stats = CommandStats::default();
        for line in info.lines() {
            let Some((name, fields)) = line
                .trim()
                .strip_prefix("cmdstat_")
                .and_then(|l| l.split_once(':'))
            else {
                continue;
            };
            let field = |key: &str| {
                fields
                    .split(',')
                    .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
                    .unwrap_or(0)
            };
            stats.0.insert(
                name.to_string(),
                CommandStat {
                    calls: field("calls"),
                    usec: field("usec"),
                },
            );
        }
        stats
    }

    /// These and `other`'s, command by command.
    pub fn plus(mut self, other: &CommandStats) -> CommandStats {
        for (name, stat) in &other.0 {
            let sum = self.0.entry(name.clone()).or_default();
            sum.calls += stat.calls;
            sum.usec += stat.usec;
        }
        self
    }

    /// What was run after `before` was read.
    pub fn since(&self, before: &CommandStats) -> CommandStats {
        let mut diff = CommandStats::default();
        for (name, stat) in &self.0 {
            let was = before.0.get(name).copied().unwrap_or_default();
            let stat = CommandStat {
                calls: stat.calls.saturating_sub(was.calls),
                usec: stat.usec.saturating_sub(was.usec),
            };
            if stat.calls > 0 {
                diff.0.insert(name.clone(), stat);
            }
        }
        diff
    }
}

#[cfg(test)]
mod command_stats_tests {
    use super::*;

    #[test]
    fn command_stats_are_read_summed_and_differenced() {
        let before = CommandStats::parse(
            "# Commandstats\r\ncmdstat_mget:calls=10,usec=50,usec_per_call=5.00,rejected_calls=0,failed_calls=0\r\n",
        );
        let after = CommandStats::parse(
            "# Commandstats\r\ncmdstat_mget:calls=30,usec=150,usec_per_call=5.00\r\ncmdstat_evalsha:calls=4,usec=400,usec_per_call=100.00\r\n",
        );
        let run = after.since(&before);
        assert_eq!(
            run.0["mget"],
            CommandStat {
                calls: 20,
                usec: 100
            }
        );
        assert_eq!(
            run.0["evalsha"],
            CommandStat {
                calls: 4,
                usec: 400
            }
        );
        let both = run.clone().plus(&run);
        assert_eq!(
            both.0["mget"],
            CommandStat {
                calls: 40,
                usec: 200
            }
        );
        assert!(after.since(&after).0.is_empty());
    }
}
