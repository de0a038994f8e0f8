//! The load generator: `wrk` (Debian's package), driven by small Lua scripts that print
//! one JSON line of results and, where needed, vary the client key per request.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::Value;
use sluice_harness::apt;
use sluice_harness::cmd::{self, note, step};

/// Printed by every script's `done`: one JSON object on the last line of wrk's output.
const REPORT_LUA: &str = r#"
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{"requests":%d,"duration_us":%d,"status_errors":%d,"connect_errors":%d,' ..
    '"read_errors":%d,"write_errors":%d,"timeouts":%d,"p50_us":%d,"p99_us":%d}\n',
    summary.requests, summary.duration, e.status, e.connect, e.read, e.write, e.timeout,
    latency:percentile(50), latency:percentile(99)))
end
"#;

/// Sets `x-api-key` per request. Arguments after `--`: the number of distinct clients to
/// cycle through (0: never repeat, every request is a new client) and a key prefix.
const CLIENTS_LUA: &str = r#"
local clients = 0
local prefix = "client-"
local counter = 0

function init(args)
  clients = tonumber(args[1]) or 0
  if args[2] then prefix = args[2] end
end

function request()
  counter = counter + 1
  if clients > 0 and counter > clients then counter = 1 end
  wrk.headers["x-api-key"] = prefix .. counter
  return wrk.format()
end
"#;

/// The installed wrk and its scripts.
#[derive(Debug, Clone)]
pub struct Wrk {
    pub program: PathBuf,
    pub version: String,
    /// Where the note about installing it goes in the report, if it was installed now.
    pub installed_now: bool,
    report_script: PathBuf,
    clients_script: PathBuf,
}

/// One wrk run.
#[derive(Debug, Clone)]
pub struct Load<'a> {
    pub url: &'a str,
    pub threads: u32,
    pub connections: u32,
    pub duration: Duration,
    /// `taskset -c` CPU list for wrk; `None` leaves it unpinned.
    pub cpus: Option<&'a str>,
    pub clients: Clients<'a>,
}

/// Which `x-api-key` values the requests carry.
#[derive(Debug, Clone, Copy)]
pub enum Clients<'a> {
    /// Every request the same key.
    One(&'a str),
    /// Cycle through this many distinct keys `PREFIXn`.
    Cycle(u64, &'a str),
    /// Every request a new key `PREFIXn`.
    Unique(&'a str),
}

/// What wrk measured.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Measured {
    /// Responses received.
    pub requests: u64,
    /// wrk's own clock around the run (from before connecting to after the last thread).
    pub duration: Duration,
    /// Responses with a status other than 2xx or 3xx (429s here).
    pub non_2xx: u64,
    /// Connect, read, write errors and timeouts.
    pub errors: u64,
    pub p50_us: u64,
    pub p99_us: u64,
}

impl Measured {
    pub fn throughput(&self) -> f64 {
        self.requests as f64 / self.duration.as_secs_f64().max(1e-9)
    }
}

impl Wrk {
    /// Finds wrk, installing Debian's package if it is missing, and writes the scripts.
    pub fn ensure(dir: &Path) -> Result<Wrk> {
        step("provisioning the load generator (wrk)");
        let mut installed_now = false;
        let program = match cmd::which("wrk") {
            Some(path) => {
                note(format!("using {}", path.display()));
                path
            }
            None => {
                note("wrk is not installed: installing Debian's wrk package");
                apt::install(&["wrk"]).context("installing wrk")?;
                installed_now = true;
                cmd::which("wrk").context("wrk was installed but is not on PATH")?
            }
        };
        let version = version(&program);
        note(format!("wrk: {version}"));
        let report_script = dir.join("report.lua");
        let clients_script = dir.join("clients.lua");
        std::fs::write(&report_script, REPORT_LUA)
            .with_context(|| format!("writing {}", report_script.display()))?;
        std::fs::write(&clients_script, format!("{CLIENTS_LUA}{REPORT_LUA}"))
            .with_context(|| format!("writing {}", clients_script.display()))?;
        Ok(Wrk {
            program,
            version,
            installed_now,
            report_script,
            clients_script,
        })
    }

    /// The command line for `load`.
    pub fn command(&self, load: &Load<'_>) -> Command {
        let mut command = match load.cpus {
            Some(cpus) => {
                let mut taskset = Command::new("taskset");
                taskset.args(["-c", cpus]).arg(&self.program);
                taskset
            }
            None => Command::new(&self.program),
        };
        let seconds = load.duration.as_secs().max(1);
        command
            .arg(format!("-t{}", load.threads))
            .arg(format!("-c{}", load.connections))
            .arg(format!("-d{seconds}s"))
            .args(["--timeout", "10s"]);
        match load.clients {
            Clients::One(key) => {
                command
                    .args(["-H", &format!("x-api-key: {key}")])
                    .arg("-s")
                    .arg(&self.report_script)
                    .arg(load.url);
            }
            Clients::Cycle(n, prefix) => {
                command
                    .arg("-s")
                    .arg(&self.clients_script)
                    .arg(load.url)
                    .args(["--", &n.to_string(), prefix]);
            }
            Clients::Unique(prefix) => {
                command
                    .arg("-s")
                    .arg(&self.clients_script)
                    .arg(load.url)
                    .args(["--", "0", prefix]);
            }
        }
        command
    }

    /// Runs wrk and parses its report. Bounded: wrk stops itself after the duration, and
    /// is killed if it overruns by more than a generous margin.
    pub fn run(&self, load: &Load<'_>) -> Result<Measured> {
        let mut command = self.command(load);
        let shown = cmd::display(&command);
        let limit = load.duration + Duration::from_secs(30);
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting `{shown}`"))?;
        let deadline = Instant::now() + limit;
        loop {
            if child.try_wait()?.is_some() {
                break;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                bail!("`{shown}` did not finish within {} s", limit.as_secs());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let out = child.wait_with_output()?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            bail!(
                "`{shown}` failed ({}): {}{}",
                out.status,
                stdout,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        parse_report(&stdout).with_context(|| format!("`{shown}` printed no report: {stdout}"))
    }
}

fn version(program: &Path) -> String {
    // `wrk -v` prints its banner and exits non-zero.
    Command::new(program)
        .arg("-v")
        .output()
        .ok()
        .map(|out| {
            let text = String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr);
            text.lines()
                .next()
                .unwrap_or("")
                .split(" Copyright")
                .next()
                .unwrap_or("")
                .trim()
                .to_string()
        })
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "unknown version".to_string())
}

fn parse_report(stdout: &str) -> Option<Measured> {
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))?;
    let v: Value = serde_json::from_str(line.trim()).ok()?;
    let n = |key: &str| v[key].as_u64();
    Some(Measured {
        requests: n("requests")?,
        duration: Duration::from_micros(n("duration_us")?),
        non_2xx: n("status_errors")?,
        errors: n("connect_errors")? + n("read_errors")? + n("write_errors")? + n("timeouts")?,
        p50_us: n("p50_us")?,
        p99_us: n("p99_us")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_line_is_found_after_wrks_own_output() {
        let out = "Running 5s test @ http://127.0.0.1:1/\n  1 threads and 32 connections\n\
            {\"requests\":100,\"duration_us\":5000000,\"status_errors\":90,\"connect_errors\":0,\
            \"read_errors\":1,\"write_errors\":0,\"timeouts\":2,\"p50_us\":800,\"p99_us\":9000}\n";
        let m = parse_report(out).unwrap();
        assert_eq!(m.requests, 100);
        assert_eq!(m.non_2xx, 90);
        assert_eq!(m.errors, 3);
        assert_eq!(m.duration, Duration::from_secs(5));
        assert!((m.throughput() - 20.0).abs() < 1e-9);
        assert_eq!(parse_report("no report"), None);
    }
}
