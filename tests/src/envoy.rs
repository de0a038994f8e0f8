//! A real Envoy process running the filter, configured by `sluice envoy-config`'s generator.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use sluice_core::config::FilterConfigSpec;
use sluice_core::spec::FailureMode;
use sluice_envoy_config::{
    self as envoy_config, AdminConnection, ControlMode, EnvoyConfigOptions, LISTENER_NAME,
    PluginConfig, RlqsService, RlsCredentials, RlsService, WASM_FILTER,
};
use sluice_harness::envoy::{EnvoyLaunch, EnvoyProcess, parse_stats};

use crate::artifacts::Artifacts;

/// Where allowed requests go: `Target::Cluster(addr)` (see [`crate::Upstream::target`]) or
/// `Target::Direct` for Envoy to answer 200 "ok" itself.
pub use sluice_envoy_config::Upstream as Target;
pub use sluice_envoy_config::UpstreamProtocol;

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
    /// Where the control service runs: a singleton bootstrap extension, or one elected
    /// worker (no bootstrap extension; the `control` section in the plugin configuration).
    pub control_mode: ControlMode,
    /// Hand Envoy the wasm filter's configuration through file-based extension config
    /// discovery (ECDS, as Istio delivers a `WasmPlugin`) instead of inline, so a test can
    /// replace it while Envoy runs ([`Envoy::replace_filter`]).
    pub filter_discovery: bool,
    /// Envoy's native rate limit filter asking Sluice's rate limit service instead of the
    /// wasm filter (set `wasm_filter: false` too).
    pub rls: Option<RlsService>,
    /// Envoy's quota filter (RLQS) asking Sluice's quota service instead of the wasm
    /// filter (set `wasm_filter: false` too).
    pub rlqs: Option<RlqsService>,
    /// What `rls` and `rlqs` show Sluice's listener (a proxy token, TLS, a client
    /// certificate): [`crate::AdminServer::rls_credentials`].
    pub rls_credentials: RlsCredentials,
    /// HTTP filters placed ahead of every other (as Envoy configuration, JSON), e.g.
    /// `jwt_authn` verifying tokens before Sluice reads their claims.
    pub filters_before: Vec<Value>,
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
            control_mode: ControlMode::Singleton,
            filter_discovery: false,
            rls: None,
            rlqs: None,
            rls_credentials: RlsCredentials::default(),
            filters_before: Vec::new(),
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
    /// Before `dir`: the process is killed before its folder goes.
    process: EnvoyProcess,
    dir: Option<tempfile::TempDir>,
    config_path: PathBuf,
    /// Worker threads.
    concurrency: usize,
    /// With [`EnvoyOptions::filter_discovery`]: the file Envoy reads the wasm filter's
    /// configuration from, and that configuration (the `Wasm` typed config).
    discovered_filter: Option<(PathBuf, Value)>,
}

/// Extension config discovery's `type_urls` for the wasm filter.
const WASM_TYPE_URL: &str = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm";

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
        config.control_mode = options.control_mode;
        config.rls = options.rls.clone();
        config.rlqs = options.rlqs.clone();
        config.rls_credentials = options.rls_credentials.clone();
        let mut bootstrap = envoy_config::build(&config).context("generating the Envoy config")?;
        let discovered_filter = if options.filter_discovery {
            let path = dir.path().join("sluice-filter.json");
            let typed_config = discover_filter(&mut bootstrap.config, &path)?;
            write_discovered_filter(&path, &typed_config)?;
            Some((path, typed_config))
        } else {
            None
        };
        if !options.filters_before.is_empty() {
            let filters = bootstrap
                .http_filters_mut()
                .context("the generated config has no HTTP filter chain")?;
            filters.splice(0..0, options.filters_before.iter().cloned());
        }
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

        let launch = EnvoyLaunch {
            envoy: artifacts.envoy(),
            config: &config_path,
            concurrency: u32::try_from(options.concurrency).ok(),
            log_level: &options.log_level,
            cpus: None,
            dir: dir.path(),
            name: "envoy",
            ready_timeout: options.ready_timeout,
            listener: Some(LISTENER_NAME),
        };
        match EnvoyProcess::start(&launch) {
            Ok(process) => Ok(Envoy {
                process,
                dir: Some(dir),
                config_path,
                concurrency: options.concurrency,
                discovered_filter,
            }),
            Err(err) => {
                let kept = dir.keep();
                Err(err.context(format!("files kept in {}", kept.display())))
            }
        }
    }

    /// Replaces the wasm filter's configuration while Envoy runs (needs
    /// [`EnvoyOptions::filter_discovery`]): `edit` changes the `Wasm` typed config, which
    /// is written to the discovery file in one rename, as a control plane pushes a new
    /// version. Envoy builds the new filter (new root contexts; new VMs when the VM
    /// configuration changed) and tears the old one down.
    pub fn replace_filter(&mut self, edit: impl FnOnce(&mut Value)) {
        let Some((path, typed_config)) = &mut self.discovered_filter else {
            panic!("replace_filter needs EnvoyOptions::filter_discovery");
        };
        edit(typed_config);
        write_discovered_filter(path, typed_config).unwrap_or_else(|err| panic!("{err:#}"));
    }

    /// How many filter configurations Envoy has taken from the discovery file, the first
    /// load included ([`Envoy::replace_filter`]).
    pub fn ecds_reloads(&self) -> u64 {
        self.stats_matching("^extension_config_discovery\\..*config_reload$")
            .values()
            .sum()
    }

    /// The listener's address (the kernel chose the port).
    pub fn listener_addr(&self) -> SocketAddr {
        self.process.listener()
    }

    pub fn admin_addr(&self) -> SocketAddr {
        self.process.admin()
    }

    /// `http://127.0.0.1:PORT{path}` on the listener.
    pub fn url(&self, path: &str) -> String {
        self.process.url(path)
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    pub fn config_path(&self) -> &Path {
        &self.config_path
    }

    pub fn log_path(&self) -> &Path {
        self.process.log_path()
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
        self.process
            .admin_call(method, path)
            .unwrap_or_else(|err| panic!("{err:#}\nthe end of Envoy's log:\n{}", self.log_tail()))
    }

    /// Every counter and gauge, by full name (`wasmcustom.sluice_requests_total`,
    /// `http.ingress_http.downstream_rq_2xx`, ...).
    pub fn stats(&self) -> BTreeMap<String, u64> {
        parse_stats(&self.admin_get("/stats"))
    }

    /// Stats whose names match a regular expression (Envoy's own `filter`).
    pub fn stats_matching(&self, regex: &str) -> BTreeMap<String, u64> {
        self.process
            .stats_matching(regex)
            .unwrap_or_else(|err| panic!("{err:#}"))
    }

    /// One counter or gauge, `None` if Envoy does not have it.
    pub fn stat(&self, name: &str) -> Option<u64> {
        self.process
            .stat(name)
            .unwrap_or_else(|err| panic!("{err:#}"))
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
        self.process
            .worker_downstream_connections(LISTENER_NAME)
            .unwrap_or_else(|err| panic!("{err:#}"))
    }

    /// Envoy's resident memory (VmRSS).
    pub fn rss_bytes(&self) -> u64 {
        self.process
            .rss_bytes()
            .unwrap_or_else(|err| panic!("{err:#}"))
    }

    /// Whether the process is still running (it has not crashed or exited).
    pub fn is_running(&self) -> bool {
        self.process.exit_status().is_none()
    }

    /// The whole log.
    pub fn log(&self) -> String {
        self.process.log()
    }

    /// The last lines of the log, for failure messages.
    pub fn log_tail(&self) -> String {
        self.process.log_tail()
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        if std::thread::panicking() {
            if let Some(dir) = self.dir.take() {
                let kept = dir.keep();
                eprintln!("Envoy's files are kept in {}", kept.display());
            }
        }
    }
}

/// Moves the wasm filter of `bootstrap`'s HTTP filter chain to extension config
/// discovery from the file at `path`; returns its `Wasm` typed config.
fn discover_filter(bootstrap: &mut Value, path: &Path) -> Result<Value> {
    // Discovery needs the node to have an id and a cluster (as a control plane's
    // bootstrap always gives it).
    bootstrap["node"] = json!({ "id": "sluice-test", "cluster": "sluice-test" });
    let filters = bootstrap
        .pointer_mut(
            "/static_resources/listeners/0/filter_chains/0/filters/0/typed_config/http_filters",
        )
        .and_then(Value::as_array_mut)
        .context("the generated config has no HTTP filter chain")?;
    let entry = filters
        .iter_mut()
        .find(|filter| filter["name"] == WASM_FILTER)
        .context("the generated config has no wasm filter")?;
    let typed_config = entry["typed_config"].take();
    *entry = json!({
        "name": WASM_FILTER,
        "config_discovery": {
            "config_source": { "path_config_source": { "path": path.to_string_lossy() } },
            "type_urls": [WASM_TYPE_URL],
        },
    });
    Ok(typed_config)
}

/// Writes the discovery response holding the wasm filter's configuration: to a
/// temporary file first, then renamed over `path`, which is what Envoy watches for.
fn write_discovered_filter(path: &Path, typed_config: &Value) -> Result<()> {
    let response = json!({
        "resources": [{
            "@type": "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig",
            "name": WASM_FILTER,
            "typed_config": typed_config,
        }],
    });
    let temporary = path.with_extension("json.new");
    std::fs::write(&temporary, response.to_string())
        .with_context(|| format!("writing {}", temporary.display()))?;
    std::fs::rename(&temporary, path).with_context(|| format!("renaming to {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(
            spec.rate_limit_headers,
            sluice_core::response::RateLimitHeaders::None
        );
        assert_eq!(spec.shadow_header, None);
    }
}
