//! A real Envoy process running the filter, configured by `sluice envoy-config`'s generator.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use serde_json::{Value, json};
use sluice_core::config::FilterConfigSpec;
use sluice_core::spec::FailureMode;
use sluice_envoy_config::{
    self as envoy_config, AdminConnection, EnvoyConfigOptions, LISTENER_NAME, PluginConfig,
    WASM_FILTER,
};

use crate::artifacts::Artifacts;

/// Where allowed requests go: `Target::Cluster(addr)` (see [`crate::Upstream::target`]) or
/// `Target::Direct` for Envoy to answer 200 "ok" itself.
pub use sluice_envoy_config::Upstream as Target;
pub use sluice_envoy_config::UpstreamProtocol;

/// How long one admin request may take.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(10);
/// Lines of Envoy's log quoted in failure messages.
const LOG_TAIL_LINES: usize = 60;

/// How to configure and run Envoy. Start from `..Default::default()`.
#[derive(Debug, Clone)]
pub struct EnvoyOptions {
    /// The static rules: a JSON list of rules as in a rules file.
    pub rules: Value,
    /// Envoy worker threads (`--concurrency`).
    pub concurrency: usize,
    /// Bucket slots; the filter's default when `None`.
    pub slots: Option<u32>,
    pub failure_mode: FailureMode,
    pub upstream: Target,
    /// What Envoy speaks to a `Target::Cluster` upstream (HTTP/2 for a gRPC server).
    pub upstream_protocol: UpstreamProtocol,
    /// Other plugin configuration fields, merged over the ones above, e.g.
    /// `json!({"rate_limit_headers": false, "shadow_header": null})`.
    pub plugin_settings: Value,
    /// Handed to the filter verbatim instead of the configuration built from the fields
    /// above, unvalidated: to test how the filter copes with a bad configuration.
    pub raw_plugin_config: Option<String>,
    /// `false` leaves the wasm filter out: Envoy with only the router, as a baseline.
    pub wasm_filter: bool,
    /// Envoy's `--log-level`.
    pub log_level: String,
    /// How long Envoy may take to become ready.
    pub ready_timeout: Duration,
    /// Follow an admin API: adds the control service and its cluster.
    pub admin: Option<AdminConnection>,
}

impl Default for EnvoyOptions {
    fn default() -> Self {
        EnvoyOptions {
            rules: json!([]),
            concurrency: 2,
            slots: None,
            failure_mode: FailureMode::Open,
            upstream: Target::Direct,
            upstream_protocol: UpstreamProtocol::Http1,
            plugin_settings: json!({}),
            raw_plugin_config: None,
            wasm_filter: true,
            log_level: "info".to_string(),
            ready_timeout: Duration::from_secs(20),
            admin: None,
        }
    }
}

impl EnvoyOptions {
    /// The filter's plugin configuration these options describe.
    pub fn plugin_config(&self) -> Result<PluginConfig> {
        if let Some(raw) = &self.raw_plugin_config {
            return Ok(PluginConfig::Raw(raw.clone()));
        }
        let mut config = json!({
            "rules": self.rules,
            "failure_mode": self.failure_mode,
        });
        if let Some(slots) = self.slots {
            config["slots"] = json!(slots);
        }
        match &self.plugin_settings {
            Value::Object(settings) => {
                for (key, value) in settings {
                    config[key] = value.clone();
                }
            }
            Value::Null => {}
            other => bail!("plugin_settings must be a JSON object, not {other}"),
        }
        let spec: FilterConfigSpec = serde_json::from_value(config.clone()).with_context(|| {
            format!("the test's plugin configuration {config} has the wrong shape")
        })?;
        Ok(PluginConfig::Spec(spec))
    }
}

/// A running Envoy, killed when dropped.
///
/// The listener and the admin interface bind 127.0.0.1 on ports the kernel chooses, and hot
/// restart is disabled, so any number of these run side by side. Files (bootstrap, log)
/// live in a temporary directory, kept when a test panics so the log can be read.
#[derive(Debug)]
pub struct Envoy {
    process: Mutex<Child>,
    pid: u32,
    admin: SocketAddr,
    listener: SocketAddr,
    dir: Option<tempfile::TempDir>,
    keep_dir: bool,
    config_path: PathBuf,
    log_path: PathBuf,
    /// Worker threads.
    concurrency: usize,
}

impl Envoy {
    /// Starts Envoy with the artifacts from the environment and waits until it is ready.
    /// Panics with the tail of Envoy's log if it does not come up.
    pub fn start(options: EnvoyOptions) -> Envoy {
        Envoy::start_with(Artifacts::from_env(), options)
    }

    pub fn start_with(artifacts: &Artifacts, options: EnvoyOptions) -> Envoy {
        Envoy::try_start_with(artifacts, options).unwrap_or_else(|err| panic!("{err:#}"))
    }

    /// Like [`Envoy::start`], returning start-up failures (e.g. a configuration Envoy
    /// refuses) as errors.
    pub fn try_start(options: EnvoyOptions) -> Result<Envoy> {
        Envoy::try_start_with(Artifacts::from_env(), options)
    }

    pub fn try_start_with(artifacts: &Artifacts, options: EnvoyOptions) -> Result<Envoy> {
        let dir = tempfile::Builder::new()
            .prefix("sluice-envoy-")
            .tempdir()
            .context("creating a temporary directory for Envoy")?;
        let config_path = dir.path().join("envoy.yaml");
        let log_path = dir.path().join("envoy.log");
        let admin_path = dir.path().join("admin-address");

        let loopback_any_port = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
        // A filter path is needed even without the filter; only then must the file exist.
        let filter_wasm = if options.wasm_filter {
            artifacts.filter_wasm().to_path_buf()
        } else {
            dir.path().join("unused.wasm")
        };
        let mut config = EnvoyConfigOptions::new(loopback_any_port, options.upstream, filter_wasm);
        config.plugin = options.plugin_config()?;
        config.envoy_admin = loopback_any_port;
        config.concurrency = u32::try_from(options.concurrency)
            .ok()
            .and_then(NonZeroU32::new);
        config.config_path = Some(config_path.clone());
        config.admin = options.admin.clone();
        config.upstream_protocol = options.upstream_protocol;
        let mut bootstrap = envoy_config::build(&config).context("generating the Envoy config")?;
        if !options.wasm_filter {
            bootstrap
                .http_filters_mut()
                .context("the generated config has no HTTP filter chain")?
                .retain(|filter| filter["name"] != WASM_FILTER);
        }
        let yaml = bootstrap
            .to_yaml()
            .context("writing the Envoy config as YAML")?;
        std::fs::write(&config_path, yaml)
            .with_context(|| format!("writing {}", config_path.display()))?;

        let log =
            File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;
        let log_err = log.try_clone().context("sharing Envoy's log file")?;
        let mut command = envoy_command(artifacts.envoy());
        command
            .arg("-c")
            .arg(&config_path)
            .arg("--concurrency")
            .arg(options.concurrency.to_string())
            .arg("--admin-address-path")
            .arg(&admin_path)
            .arg("--log-level")
            .arg(&options.log_level)
            // Hot restart needs a shared-memory base id per Envoy; without it, concurrent
            // Envoys (parallel tests) need no coordination at all.
            .arg("--disable-hot-restart")
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err);
        let child =
            spawn(command).with_context(|| format!("starting {}", artifacts.envoy().display()))?;

        let mut envoy = Envoy {
            pid: child.id(),
            process: Mutex::new(child),
            admin: loopback_any_port,
            listener: loopback_any_port,
            dir: Some(dir),
            keep_dir: false,
            config_path,
            log_path,
            concurrency: options.concurrency,
        };
        match envoy.wait_ready(&admin_path, options.ready_timeout) {
            Ok(()) => Ok(envoy),
            Err(err) => {
                envoy.keep_dir = true;
                let dir = envoy.dir.as_ref().map(|d| d.path().display().to_string());
                Err(err.context(format!(
                    "Envoy did not start (files kept in {}); the end of its log:\n{}",
                    dir.unwrap_or_default(),
                    envoy.log_tail()
                )))
            }
        }
    }

    fn wait_ready(&mut self, admin_path: &Path, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let poll = Duration::from_millis(50);
        // The admin interface comes up first and writes its address; the workers and the
        // wasm VMs follow, and `/ready` says LIVE once everything is initialised.
        loop {
            if let Some(status) = self.exit_status() {
                bail!("Envoy exited during start-up ({status})");
            }
            if let Ok(text) = std::fs::read_to_string(admin_path) {
                if let Ok(addr) = text.trim().parse::<SocketAddr>() {
                    self.admin = addr;
                    if let Ok((200, body)) = admin_request(addr, "GET", "/ready") {
                        if body.trim() == "LIVE" {
                            break;
                        }
                    }
                }
            }
            if Instant::now() >= deadline {
                bail!("Envoy was not ready within {} s", timeout.as_secs_f32());
            }
            std::thread::sleep(poll);
        }
        self.listener = self.discover_listener()?;
        Ok(())
    }

    fn discover_listener(&self) -> Result<SocketAddr> {
        let (status, body) = admin_request(self.admin, "GET", "/listeners?format=json")?;
        if status != 200 {
            bail!("/listeners answered {status}: {body}");
        }
        let listeners: Value =
            serde_json::from_str(&body).with_context(|| format!("/listeners: {body}"))?;
        let entry = listeners["listener_statuses"]
            .as_array()
            .and_then(|all| all.iter().find(|l| l["name"] == LISTENER_NAME))
            .ok_or_else(|| anyhow!("no listener {LISTENER_NAME} in /listeners: {body}"))?;
        let socket = &entry["local_address"]["socket_address"];
        let ip = socket["address"].as_str().context("listener address")?;
        let port = socket["port_value"].as_u64().context("listener port")?;
        format!("{ip}:{port}")
            .parse()
            .with_context(|| format!("listener address {socket}"))
    }

    /// The listener's address (the kernel chose the port).
    pub fn listener_addr(&self) -> SocketAddr {
        self.listener
    }

    pub fn admin_addr(&self) -> SocketAddr {
        self.admin
    }

    /// `http://127.0.0.1:PORT{path}` on the listener.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.listener)
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    pub fn config_path(&self) -> &Path {
        &self.config_path
    }

    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// GET on the admin interface; panics unless it answers 200.
    pub fn admin_get(&self, path: &str) -> String {
        self.admin_call("GET", path)
    }

    /// POST on the admin interface (e.g. `/runtime_modify?...`); panics unless it answers 200.
    pub fn admin_post(&self, path: &str) -> String {
        self.admin_call("POST", path)
    }

    fn admin_call(&self, method: &str, path: &str) -> String {
        match admin_request(self.admin, method, path) {
            Ok((200, body)) => body,
            Ok((status, body)) => {
                panic!("{method} {path} on Envoy's admin answered {status}: {body}")
            }
            Err(err) => panic!(
                "{method} {path} on Envoy's admin failed: {err:#}\nthe end of Envoy's log:\n{}",
                self.log_tail()
            ),
        }
    }

    /// Every counter and gauge, by full name (`wasmcustom.sluice_requests_total`,
    /// `http.ingress_http.downstream_rq_2xx`, ...).
    pub fn stats(&self) -> BTreeMap<String, u64> {
        parse_stats(&self.admin_get("/stats"))
    }

    /// Stats whose names match a regular expression (Envoy's own `filter`).
    pub fn stats_matching(&self, regex: &str) -> BTreeMap<String, u64> {
        parse_stats(&self.admin_get(&format!("/stats?filter={}", percent_encode(regex))))
    }

    /// One counter or gauge, `None` if Envoy does not have it.
    pub fn stat(&self, name: &str) -> Option<u64> {
        let exact = format!("^{}$", regex_escape(name));
        self.stats_matching(&exact).remove(name)
    }

    /// Envoy's worker threads (`--concurrency`).
    pub fn concurrency(&self) -> usize {
        self.concurrency
    }

    /// A counter that must exist. The filter's counters are `wasmcustom.NAME`, summed over
    /// the workers by Envoy. The filter hands its counts to Envoy on a timer (every 100 ms
    /// in the workers, 250 ms in the control service), so for those this reads until the
    /// value has stood still for longer than that.
    pub fn counter(&self, name: &str) -> u64 {
        let read = || {
            self.stat(name).unwrap_or_else(|| {
                let wasm: Vec<String> = self.stats_matching("^wasmcustom\\.").into_keys().collect();
                panic!("Envoy has no stat {name}; the filter's stats are: {wasm:?}")
            })
        };
        if !name.starts_with("wasmcustom.") {
            return read();
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut value = read();
        loop {
            std::thread::sleep(Duration::from_millis(300));
            let next = read();
            if next == value || Instant::now() > deadline {
                return next;
            }
            value = next;
        }
    }

    /// Connections accepted by each worker (`listener.sluice_ingress.worker_N.downstream_cx_total`),
    /// indexed by worker.
    pub fn worker_downstream_connections(&self) -> Vec<u64> {
        let prefix = format!("listener.{LISTENER_NAME}.worker_");
        let stats = self.stats_matching(&format!(
            "^listener\\.{}\\.worker_[0-9]+\\.downstream_cx_total$",
            regex_escape(LISTENER_NAME)
        ));
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
        per_worker.into_iter().map(|(_, value)| value).collect()
    }

    /// Envoy's resident memory (VmRSS).
    pub fn rss_bytes(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid))
            .unwrap_or_else(|err| panic!("reading /proc/{}/status: {err}", self.pid));
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|rest| rest.trim().strip_suffix("kB"))
            .and_then(|kb| kb.trim().parse::<u64>().ok())
            .map(|kb| kb * 1024)
            .unwrap_or_else(|| panic!("no VmRSS in /proc/{}/status", self.pid))
    }

    /// Whether the process is still running (it has not crashed or exited).
    pub fn is_running(&self) -> bool {
        self.exit_status().is_none()
    }

    fn exit_status(&self) -> Option<std::process::ExitStatus> {
        let mut process = self
            .process
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        process.try_wait().ok().flatten()
    }

    /// The whole log.
    pub fn log(&self) -> String {
        std::fs::read(&self.log_path)
            .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
            .unwrap_or_else(|err| format!("(cannot read {}: {err})", self.log_path.display()))
    }

    /// The last lines of the log, for failure messages.
    pub fn log_tail(&self) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let process = self
            .process
            .get_mut()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let _ = process.kill();
        let _ = process.wait();
        if self.keep_dir || std::thread::panicking() {
            if let Some(dir) = self.dir.take() {
                let kept = dir.keep();
                eprintln!("Envoy's files are kept in {}", kept.display());
            }
        }
    }
}

/// Envoy, under `setpriv --pdeathsig KILL` where available: a test process killed outright
/// (a CI timeout, Ctrl-C) then takes its Envoys with it instead of leaving them running.
fn envoy_command(envoy: &Path) -> Command {
    static SETPRIV: OnceLock<Option<PathBuf>> = OnceLock::new();
    let setpriv = SETPRIV.get_or_init(|| {
        ["/usr/bin/setpriv", "/bin/setpriv"]
            .iter()
            .map(PathBuf::from)
            .find(|p| p.is_file())
            .filter(|p| {
                Command::new(p)
                    .args(["--pdeathsig", "KILL", "true"])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success())
            })
    });
    match setpriv {
        Some(setpriv) => {
            // setpriv execs Envoy: the child's pid stays Envoy's own.
            let mut command = Command::new(setpriv);
            command.args(["--pdeathsig", "KILL", "--"]).arg(envoy);
            command
        }
        None => Command::new(envoy),
    }
}

type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

/// Spawns from one thread that lives as long as the test process. The parent-death signal
/// fires when the spawning *thread* ends, and test threads end with each test, which may
/// still hand its Envoy on (e.g. through a shared fixture).
fn spawn(command: Command) -> std::io::Result<Child> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (requests, incoming) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("envoy-spawner".to_string())
            .spawn(move || {
                for (mut command, reply) in incoming {
                    let _ = reply.send(command.spawn());
                }
            })
            .map(|_| ())
            .unwrap_or_else(|err| panic!("starting the Envoy spawner thread: {err}"));
        Mutex::new(requests)
    });
    let (reply, result) = mpsc::channel();
    spawner
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .send((command, reply))
        .map_err(|_| std::io::Error::other("the Envoy spawner thread is gone"))?;
    result
        .recv()
        .map_err(|_| std::io::Error::other("the Envoy spawner thread is gone"))?
}

/// One request to Envoy's admin interface, blocking: `(status, body)`.
///
/// Plain blocking I/O so it works from any test, async or not. HTTP/1.1 with
/// `Connection: close`, because Envoy answers HTTP/1.0 with 426 Upgrade Required.
pub fn admin_request(admin: SocketAddr, method: &str, path: &str) -> Result<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&admin, ADMIN_TIMEOUT)
        .with_context(|| format!("connecting to Envoy's admin at {admin}"))?;
    stream.set_read_timeout(Some(ADMIN_TIMEOUT))?;
    stream.set_write_timeout(Some(ADMIN_TIMEOUT))?;
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {admin}\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
    );
    stream
        .write_all(request.as_bytes())
        .context("sending the admin request")?;
    let mut response = Vec::new();
    stream
        .read_to_end(&mut response)
        .context("reading the admin response")?;
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
        if body.len() < size {
            bail!("truncated chunk");
        }
        out.extend_from_slice(&body[..size]);
        body = body.get(size + 2..).context("truncated chunk")?;
    }
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

fn regex_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
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
    fn chunked_and_plain_responses_parse() {
        let plain = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nLIVE\n";
        assert_eq!(
            parse_http_response(plain).unwrap(),
            (200, "LIVE\n".to_string())
        );
        let chunked =
            b"HTTP/1.1 503 Service Unavailable\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n";
        assert_eq!(
            parse_http_response(chunked).unwrap(),
            (503, "abcde".to_string())
        );
    }

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
    fn regexes_and_queries_are_escaped() {
        assert_eq!(regex_escape("wasmcustom.a_b"), "wasmcustom\\.a_b");
        assert_eq!(percent_encode("^a\\.b$"), "%5Ea%5C.b%24");
    }

    #[test]
    fn plugin_settings_merge_over_the_fields() {
        let options = EnvoyOptions {
            slots: Some(1024),
            plugin_settings: json!({"rate_limit_headers": false, "shadow_header": null}),
            ..EnvoyOptions::default()
        };
        let PluginConfig::Spec(spec) = options.plugin_config().unwrap() else {
            panic!()
        };
        assert_eq!(spec.slots, 1024);
        assert!(!spec.rate_limit_headers);
        assert_eq!(spec.shadow_header, None);
    }
}
