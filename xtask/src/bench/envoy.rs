//! One Envoy process for a benchmark: started from a bootstrap file, optionally pinned to
//! CPUs with `taskset`, observed through its admin interface and `/proc`, killed on drop.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::cmd;

/// How long Envoy may take to load its config and start the wasm VMs.
const READY_LIMIT: Duration = Duration::from_secs(60);
/// How long one admin request may take.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(10);

/// How to start one Envoy.
#[derive(Debug, Clone)]
pub struct EnvoySpec<'a> {
    pub envoy: &'a Path,
    pub config: &'a Path,
    pub concurrency: u32,
    /// `taskset -c` CPU list, e.g. `"0"`; `None` leaves Envoy unpinned.
    pub cpus: Option<&'a str>,
    /// Folder for the log and the admin address file.
    pub dir: &'a Path,
    /// Short name for file names, e.g. `path-d`.
    pub name: &'a str,
}

/// A running Envoy, killed when dropped.
#[derive(Debug)]
pub struct Envoy {
    child: Child,
    pid: u32,
    admin: SocketAddr,
    listener: SocketAddr,
    log: PathBuf,
    /// The command line, for the report.
    pub command: String,
}

impl Envoy {
    pub fn start(spec: &EnvoySpec<'_>) -> Result<Envoy> {
        let log = spec.dir.join(format!("{}.envoy.log", spec.name));
        let admin_path = spec.dir.join(format!("{}.admin-address", spec.name));
        // A stale address file from an earlier run would point at a dead Envoy.
        let _ = std::fs::remove_file(&admin_path);
        let mut command = launcher(spec.cpus);
        command
            .arg(spec.envoy)
            .arg("-c")
            .arg(spec.config)
            .arg("--concurrency")
            .arg(spec.concurrency.to_string())
            .arg("--disable-hot-restart")
            .arg("--log-level")
            .arg("warn")
            .arg("--admin-address-path")
            .arg(&admin_path);
        let shown = cmd::display(&command);
        let out = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone().context("sharing Envoy's log file")?;
        command.stdin(Stdio::null()).stdout(out).stderr(err);
        let child = command
            .spawn()
            .with_context(|| format!("starting `{shown}`"))?;
        let mut envoy = Envoy {
            pid: child.id(),
            child,
            admin: SocketAddr::from(([127, 0, 0, 1], 0)),
            listener: SocketAddr::from(([127, 0, 0, 1], 0)),
            log,
            command: shown,
        };
        envoy
            .wait_ready(&admin_path)
            .with_context(|| format!("Envoy `{}` did not start", envoy.command))?;
        Ok(envoy)
    }

    fn wait_ready(&mut self, admin_path: &Path) -> Result<()> {
        let deadline = Instant::now() + READY_LIMIT;
        loop {
            if let Some(status) = self.child.try_wait().context("waiting for Envoy")? {
                bail!(
                    "Envoy exited during start-up ({status}); the end of {}:\n{}",
                    self.log.display(),
                    self.log_tail()
                );
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
                    "not ready within {} s; the end of {}:\n{}",
                    READY_LIMIT.as_secs(),
                    self.log.display(),
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.listener = self.discover_listener()?;
        Ok(())
    }

    fn discover_listener(&self) -> Result<SocketAddr> {
        let body = self.admin_get("/listeners?format=json")?;
        let listeners: serde_json::Value =
            serde_json::from_str(&body).with_context(|| format!("/listeners: {body}"))?;
        let socket = &listeners["listener_statuses"][0]["local_address"]["socket_address"];
        let ip = socket["address"].as_str().context("listener address")?;
        let port = socket["port_value"].as_u64().context("listener port")?;
        format!("{ip}:{port}")
            .parse()
            .with_context(|| format!("listener address {socket}"))
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.listener)
    }

    pub fn listener(&self) -> SocketAddr {
        self.listener
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// GET on the admin interface; an error unless it answers 200.
    pub fn admin_get(&self, path: &str) -> Result<String> {
        match admin_request(self.admin, "GET", path)? {
            (200, body) => Ok(body),
            (status, body) => bail!("GET {path} on Envoy's admin answered {status}: {body}"),
        }
    }

    /// Counters and gauges whose names match `regex` (Envoy's `/stats?filter=`).
    pub fn stats(&self, regex: &str) -> Result<BTreeMap<String, u64>> {
        let body = self.admin_get(&format!("/stats?filter={}", percent_encode(regex)))?;
        Ok(body
            .lines()
            .filter_map(|line| {
                let (name, value) = line.rsplit_once(": ")?;
                Some((name.to_string(), value.trim().parse().ok()?))
            })
            .collect())
    }

    /// One counter or gauge by exact name; 0 when absent (e.g. never incremented).
    pub fn stat(&self, name: &str) -> Result<u64> {
        let regex = format!("^{}$", name.replace('.', "\\."));
        Ok(self.stats(&regex)?.get(name).copied().unwrap_or(0))
    }

    /// Requests Envoy's HTTP connection manager completed (any status).
    pub fn requests_completed(&self) -> Result<u64> {
        self.stat("http.ingress_http.downstream_rq_completed")
    }

    /// User plus system CPU time of the whole process (every thread), in clock ticks.
    pub fn cpu_ticks(&self) -> Result<u64> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid))
            .with_context(|| format!("reading /proc/{}/stat", self.pid))?;
        parse_cpu_ticks(&stat).with_context(|| format!("parsing /proc/{}/stat", self.pid))
    }

    /// Resident memory (VmRSS) in bytes.
    pub fn rss_bytes(&self) -> Result<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid))
            .with_context(|| format!("reading /proc/{}/status", self.pid))?;
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|rest| rest.trim().strip_suffix("kB"))
            .and_then(|kb| kb.trim().parse::<u64>().ok())
            .map(|kb| kb * 1024)
            .context("no VmRSS in /proc/PID/status")
    }

    /// Fails if Envoy has exited (crashed) since it started.
    pub fn check_running(&mut self) -> Result<()> {
        match self.child.try_wait().context("checking on Envoy")? {
            None => Ok(()),
            Some(status) => bail!(
                "Envoy exited ({status}); the end of {}:\n{}",
                self.log.display(),
                self.log_tail()
            ),
        }
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `setpriv --pdeathsig KILL --` (Envoy dies with xtask, even on Ctrl-C) and `taskset -c
/// CPUS` where available. Both exec the next program, so the child's pid is Envoy's own.
fn launcher(cpus: Option<&str>) -> Command {
    let mut parts: Vec<String> = Vec::new();
    if let Some(setpriv) = cmd::which("setpriv") {
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

/// One request to Envoy's admin interface, blocking: `(status, body)`.
pub fn admin_request(admin: SocketAddr, method: &str, path: &str) -> Result<(u16, String)> {
    http_request(admin, method, path, &[], "")
        .with_context(|| format!("Envoy's admin interface at {admin}"))
}

/// One blocking HTTP/1.1 request on loopback with `Connection: close` (Envoy answers
/// HTTP/1.0 with 426 Upgrade Required): `(status, body)`, chunked bodies decoded.
pub fn http_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Result<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, ADMIN_TIMEOUT)
        .with_context(|| format!("connecting to {addr}"))?;
    stream.set_read_timeout(Some(ADMIN_TIMEOUT))?;
    stream.set_write_timeout(Some(ADMIN_TIMEOUT))?;
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream
        .write_all(head.as_bytes())
        .and_then(|()| stream.write_all(body.as_bytes()))
        .with_context(|| format!("sending {method} {path}"))?;
    let mut response = Vec::new();
    stream
        .read_to_end(&mut response)
        .with_context(|| format!("reading the answer to {method} {path}"))?;
    parse_http_response(&response).with_context(|| format!("{method} {path}"))
}

fn parse_http_response(response: &[u8]) -> Result<(u16, String)> {
    let split = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .context("no end of headers in the response")?;
    let head = String::from_utf8_lossy(&response[..split]);
    let body = &response[split + 4..];
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|code| code.parse().ok())
        .with_context(|| format!("no status line in {head:?}"))?;
    let chunked = lines.any(|line| {
        line.split_once(':').is_some_and(|(name, value)| {
            name.trim().eq_ignore_ascii_case("transfer-encoding")
                && value.trim().eq_ignore_ascii_case("chunked")
        })
    });
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_vec()
    };
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

fn dechunk(mut body: &[u8]) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(body.len());
    loop {
        let line_end = body
            .windows(2)
            .position(|w| w == b"\r\n")
            .context("truncated chunked body")?;
        let size_text = String::from_utf8_lossy(&body[..line_end]);
        let size_text = size_text.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_text, 16)
            .with_context(|| format!("bad chunk size {size_text:?}"))?;
        body = &body[line_end + 2..];
        if size == 0 {
            return Ok(out);
        }
        let chunk = body.get(..size).context("truncated chunk")?;
        out.extend_from_slice(chunk);
        body = body.get(size + 2..).context("truncated chunk")?;
    }
}

fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 3);
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_ticks_are_utime_plus_stime() {
        let stat = "4242 (envoy (main)) S 1 4242 4242 0 -1 4194560 3000 0 0 0 1234 567 0 0 20 0 9 0 100 0 0";
        assert_eq!(parse_cpu_ticks(stat), Some(1234 + 567));
        assert_eq!(parse_cpu_ticks("garbage"), None);
    }

    #[test]
    fn chunked_and_plain_responses_parse() {
        let plain = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nLIVE\n";
        assert_eq!(
            parse_http_response(plain).unwrap(),
            (200, "LIVE\n".to_string())
        );
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
        assert_eq!(
            parse_http_response(chunked).unwrap(),
            (200, "abcde".to_string())
        );
    }

    #[test]
    fn stats_filters_are_percent_encoded() {
        assert_eq!(percent_encode("^a\\.b$"), "%5Ea%5C.b%24");
    }
}
