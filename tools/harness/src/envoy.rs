//! One Envoy process: started from a bootstrap file, waited for until its admin interface
//! says LIVE, observed through that interface and `/proc`, killed when dropped.
//!
//! The end-to-end tests, the benchmark and `cargo xtask demo` all start their Envoys here;
//! each writes its bootstrap its own way (the tests and the benchmark from the product's
//! generator, the demo with `sluice envoy-config`).

use std::collections::BTreeMap;
use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock, mpsc};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use serde_json::Value;

use crate::cmd;
use crate::http::{http_request, percent_encode};

/// Lines of Envoy's log quoted in error messages.
const LOG_TAIL_LINES: usize = 60;
/// How often start-up and [`EnvoyProcess::stop`] look again.
const POLL: Duration = Duration::from_millis(50);

/// How to start one Envoy.
#[derive(Debug, Clone)]
pub struct EnvoyLaunch<'a> {
    pub envoy: &'a Path,
    /// The bootstrap (YAML or JSON).
    pub config: &'a Path,
    /// `--concurrency`: worker threads; `None` leaves Envoy's default.
    pub concurrency: Option<u32>,
    /// `--log-level`.
    pub log_level: &'a str,
    /// `taskset -c` CPU list, e.g. `"0"`; `None` leaves Envoy unpinned.
    pub cpus: Option<&'a str>,
    /// Folder for the log (`NAME.envoy.log`) and the admin address file.
    pub dir: &'a Path,
    /// Short name for those files, e.g. `path-d`.
    pub name: &'a str,
    /// How long Envoy may take to load its bootstrap and start the wasm VMs.
    pub ready_timeout: Duration,
    /// The listener whose address [`EnvoyProcess::listener`] gives, by name; the first
    /// when `None`.
    pub listener: Option<&'a str>,
}

/// A running Envoy, killed when dropped.
///
/// Hot restart is disabled, so any number of these run side by side without sharing a
/// base id.
#[derive(Debug)]
pub struct EnvoyProcess {
    child: Mutex<Child>,
    pid: u32,
    admin: SocketAddr,
    listener: SocketAddr,
    log: PathBuf,
    /// The command line, for reports and messages.
    command: String,
}

impl EnvoyProcess {
    /// Starts Envoy and waits until it is ready; the error quotes the end of its log.
    pub fn start(launch: &EnvoyLaunch<'_>) -> Result<EnvoyProcess> {
        let log = launch.dir.join(format!("{}.envoy.log", launch.name));
        let admin_path = launch.dir.join(format!("{}.admin-address", launch.name));
        // A stale address file from an earlier run would point at a dead Envoy.
        let _ = std::fs::remove_file(&admin_path);
        let mut command = launcher(launch.cpus);
        command.arg(launch.envoy).arg("-c").arg(launch.config);
        if let Some(concurrency) = launch.concurrency {
            command.arg("--concurrency").arg(concurrency.to_string());
        }
        command
            // Hot restart needs a shared-memory base id per Envoy; without it, concurrent
            // Envoys (parallel tests, the demo's two) need no coordination at all.
            .arg("--disable-hot-restart")
            .arg("--log-level")
            .arg(launch.log_level)
            .arg("--admin-address-path")
            .arg(&admin_path);
        let shown = cmd::display(&command);
        let out = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone().context("sharing Envoy's log file")?;
        command
            .current_dir(launch.dir)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let child = spawn(command).with_context(|| format!("starting `{shown}`"))?;
        let unknown = SocketAddr::from(([127, 0, 0, 1], 0));
        let mut envoy = EnvoyProcess {
            pid: child.id(),
            child: Mutex::new(child),
            admin: unknown,
            listener: unknown,
            log,
            command: shown,
        };
        match envoy.wait_ready(&admin_path, launch) {
            Ok(()) => Ok(envoy),
            Err(err) => Err(err.context(format!(
                "Envoy `{}` did not start; the end of {}:\n{}",
                envoy.command,
                envoy.log.display(),
                envoy.log_tail()
            ))),
        }
    }

    fn wait_ready(&mut self, admin_path: &Path, launch: &EnvoyLaunch<'_>) -> Result<()> {
        let deadline = Instant::now() + launch.ready_timeout;
        // The admin interface comes up first and writes its address; the workers and the
        // wasm VMs follow, and `/ready` says LIVE once everything is initialised.
        loop {
            if let Some(status) = self.exit_status() {
                bail!("Envoy exited during start-up ({status})");
            }
            if let Some(addr) = std::fs::read_to_string(admin_path)
                .ok()
                .and_then(|text| text.trim().parse::<SocketAddr>().ok())
            {
                self.admin = addr;
                if matches!(admin_request(addr, "GET", "/ready"), Ok((200, body)) if body.trim() == "LIVE")
                {
                    break;
                }
            }
            if Instant::now() >= deadline {
                bail!(
                    "Envoy was not ready within {} s",
                    launch.ready_timeout.as_secs_f32()
                );
            }
            std::thread::sleep(POLL);
        }
        self.listener = self.find_listener(launch.listener)?;
        Ok(())
    }

    fn find_listener(&self, name: Option<&str>) -> Result<SocketAddr> {
        let body = self.admin_get("/listeners?format=json")?;
        let listeners: Value =
            serde_json::from_str(&body).with_context(|| format!("/listeners: {body}"))?;
        let all = listeners["listener_statuses"].as_array();
        let entry = match name {
            Some(name) => all.and_then(|all| all.iter().find(|l| l["name"] == name)),
            None => all.and_then(|all| all.first()),
        }
        .ok_or_else(|| anyhow!("no listener {name:?} in /listeners: {body}"))?;
        let socket = &entry["local_address"]["socket_address"];
        let ip = socket["address"].as_str().context("listener address")?;
        let port = socket["port_value"].as_u64().context("listener port")?;
        format!("{ip}:{port}")
            .parse()
            .with_context(|| format!("listener address {socket}"))
    }

    /// The listener's address (a port the kernel chose, when the bootstrap says 0).
    pub fn listener(&self) -> SocketAddr {
        self.listener
    }

    /// The admin interface's address.
    pub fn admin(&self) -> SocketAddr {
        self.admin
    }

    /// `http://ADDRESS{path}` on the listener.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.listener)
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The command line Envoy was started with.
    pub fn command(&self) -> &str {
        &self.command
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// `method path` on the admin interface; an error unless it answers 200.
    pub fn admin_call(&self, method: &str, path: &str) -> Result<String> {
        match admin_request(self.admin, method, path)? {
            (200, body) => Ok(body),
            (status, body) => bail!("{method} {path} on Envoy's admin answered {status}: {body}"),
        }
    }

    /// GET on the admin interface; an error unless it answers 200.
    pub fn admin_get(&self, path: &str) -> Result<String> {
        self.admin_call("GET", path)
    }

    /// Counters and gauges whose names match `regex` (Envoy's `/stats?filter=`).
    pub fn stats_matching(&self, regex: &str) -> Result<BTreeMap<String, u64>> {
        let body = self.admin_get(&format!("/stats?filter={}", percent_encode(regex)))?;
        Ok(parse_stats(&body))
    }

    /// One counter or gauge by exact name, `None` if Envoy does not have it.
    pub fn stat(&self, name: &str) -> Result<Option<u64>> {
        let exact = format!("^{}$", regex_escape(name));
        Ok(self.stats_matching(&exact)?.remove(name))
    }

    /// A counter by exact name, 0 while Envoy has not made it (Envoy makes a counter when
    /// it is first incremented).
    pub fn counter(&self, name: &str) -> Result<u64> {
        Ok(self.stat(name)?.unwrap_or(0))
    }

    /// User plus system CPU time of the whole process (every thread), in clock ticks.
    pub fn cpu_ticks(&self) -> Result<u64> {
        cpu_ticks(self.pid)
    }

    /// Resident memory (VmRSS) in bytes.
    pub fn rss_bytes(&self) -> Result<u64> {
        rss_bytes(self.pid)
    }

    /// Connections each worker accepted on `listener` (its
    /// `listener.NAME.worker_N.downstream_cx_total`), indexed by worker.
    pub fn worker_downstream_connections(&self, listener: &str) -> Result<Vec<u64>> {
        let prefix = format!("listener.{listener}.worker_");
        let stats = self.stats_matching(&format!(
            "^{}[0-9]+\\.downstream_cx_total$",
            regex_escape(&prefix)
        ))?;
        let mut per_worker: Vec<(usize, u64)> = stats
            .iter()
            .filter_map(|(name, value)| {
                let worker = name
                    .strip_prefix(&prefix)?
                    .split('.')
                    .next()?
                    .parse()
                    .ok()?;
                Some((worker, *value))
            })
            .collect();
        per_worker.sort_unstable();
        Ok(per_worker.into_iter().map(|(_, value)| value).collect())
    }

    /// How Envoy ended, `None` while it runs.
    pub fn exit_status(&self) -> Option<ExitStatus> {
        self.child().try_wait().ok().flatten()
    }

    /// Fails if Envoy has exited (crashed) since it started.
    pub fn check_running(&self) -> Result<()> {
        match self.exit_status() {
            None => Ok(()),
            Some(status) => bail!(
                "Envoy exited ({status}); the end of {}:\n{}",
                self.log.display(),
                self.log_tail()
            ),
        }
    }

    /// Asks Envoy to exit (`/quitquitquit`), and kills it if it has not within `limit`.
    pub fn stop(&mut self, limit: Duration) -> Result<ExitStatus> {
        // Envoy may already be on its way out (Ctrl-C in a terminal reaches it too).
        let _ = admin_request(self.admin, "POST", "/quitquitquit");
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Some(status) = self.exit_status() {
                return Ok(status);
            }
            std::thread::sleep(POLL);
        }
        let mut child = self.child();
        child.kill().context("killing Envoy")?;
        child.wait().context("waiting for Envoy")
    }

    /// The whole log.
    pub fn log(&self) -> String {
        std::fs::read(&self.log)
            .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
            .unwrap_or_else(|err| format!("(cannot read {}: {err})", self.log.display()))
    }

    /// The last lines of the log, for error messages.
    pub fn log_tail(&self) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
    }

    fn child(&self) -> MutexGuard<'_, Child> {
        self.child
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Drop for EnvoyProcess {
    fn drop(&mut self) {
        let mut child = self.child();
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// `setpriv --pdeathsig KILL --` where it works (Envoy dies with the process that started
/// it, even one killed outright by a CI timeout or Ctrl-C) and `taskset -c CPUS` when
/// asked. Both exec the next program, so the child's pid is Envoy's own.
fn launcher(cpus: Option<&str>) -> Command {
    static SETPRIV: OnceLock<Option<PathBuf>> = OnceLock::new();
    let setpriv = SETPRIV.get_or_init(|| {
        cmd::which("setpriv").filter(|setpriv| {
            Command::new(setpriv)
                .args(["--pdeathsig", "KILL", "true"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
    });
    let mut parts: Vec<String> = Vec::new();
    if let Some(setpriv) = setpriv {
        parts.push(setpriv.to_string_lossy().into_owned());
        parts.extend(["--pdeathsig", "KILL", "--"].map(String::from));
    }
    if let Some(cpus) = cpus {
        parts.extend(["taskset", "-c", cpus].map(String::from));
    }
    let mut parts = parts.into_iter();
    match parts.next() {
        Some(program) => {
            let mut command = Command::new(program);
            command.args(parts);
            command
        }
        // Nothing to wrap with: the caller's first `arg` becomes the program.
        None => Command::new("env"),
    }
}

type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

/// Spawns from one thread that lives as long as the process. The parent-death signal fires
/// when the spawning *thread* ends, and test threads end with each test, which may still
/// hand its Envoy on (e.g. through a shared fixture).
fn spawn(command: Command) -> std::io::Result<Child> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    let gone = || std::io::Error::other("the Envoy spawner thread is gone");
    let spawner = match SPAWNER.get() {
        Some(spawner) => spawner,
        None => {
            let (requests, incoming) = mpsc::channel::<SpawnRequest>();
            std::thread::Builder::new()
                .name("envoy-spawner".to_string())
                .spawn(move || {
                    for (mut command, reply) in incoming {
                        let _ = reply.send(command.spawn());
                    }
                })?;
            // Two first callers at once each start a thread; the loser's ends at once,
            // its channel dropped.
            SPAWNER.get_or_init(|| Mutex::new(requests))
        }
    };
    let (reply, result) = mpsc::channel();
    spawner
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .send((command, reply))
        .map_err(|_| gone())?;
    result.recv().map_err(|_| gone())?
}

/// Resident memory (VmRSS) of process `pid` in bytes.
pub fn rss_bytes(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().strip_suffix("kB"))
        .and_then(|kb| kb.trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .with_context(|| format!("no VmRSS in /proc/{pid}/status (has it exited?)"))
}

/// One request to an Envoy admin interface: `(status, body)`.
pub fn admin_request(admin: SocketAddr, method: &str, path: &str) -> Result<(u16, String)> {
    http_request(admin, method, path, &[], "")
        .with_context(|| format!("Envoy's admin interface at {admin}"))
}

/// Parses Envoy's text `/stats` (`name: value` lines), keeping numeric values: counters
/// and gauges. Histograms and text readouts are skipped.
pub fn parse_stats(text: &str) -> BTreeMap<String, u64> {
    text.lines()
        .filter_map(|line| {
            let (name, value) = line.rsplit_once(": ")?;
            Some((name.to_string(), value.trim().parse().ok()?))
        })
        .collect()
}

/// `text` matched literally in one of Envoy's stats filters (RE2 syntax).
pub fn regex_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// User plus system CPU time of process `pid` (every thread), in clock ticks (10 ms on
/// Linux here): Envoy's, or the admin API's.
pub fn cpu_ticks(pid: u32) -> Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    parse_cpu_ticks(&stat).with_context(|| format!("parsing /proc/{pid}/stat"))
}

/// utime + stime: fields 14 and 15 of `/proc/PID/stat`, counted after the `(comm)` field,
/// which may itself contain spaces and parentheses.
fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    let after_comm = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after_comm.split_whitespace().collect();
    // After the comm, field 3 (state) is index 0, so field N is index N - 3.
    let utime: u64 = fields.get(14 - 3)?.parse().ok()?;
    let stime: u64 = fields.get(15 - 3)?.parse().ok()?;
    Some(utime + stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_keep_numbers_only() {
        let stats = parse_stats(
            "wasmcustom.sluice_requests_total: 20\nserver.version: 123\n\
             cluster.x.upstream_rq_time: P0(nan,1) P25(nan,2)\nserver.hot_restart_epoch: 0\n",
        );
        assert_eq!(stats.get("wasmcustom.sluice_requests_total"), Some(&20));
        assert_eq!(stats.len(), 3);
    }

    #[test]
    fn regexes_are_escaped() {
        assert_eq!(regex_escape("wasmcustom.a_b"), "wasmcustom\\.a_b");
    }

    #[test]
    fn cpu_ticks_are_utime_plus_stime() {
        let stat = "4242 (envoy (main)) S 1 4242 4242 0 -1 4194560 3000 0 0 0 1234 567 0 0 20 0 9 0 100 0 0";
        assert_eq!(parse_cpu_ticks(stat), Some(1234 + 567));
        assert_eq!(parse_cpu_ticks("garbage"), None);
    }
}
