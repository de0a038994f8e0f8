//! Envoy bootstraps for the benchmark, all from `sluice envoy-config`, so every variant
//! shares the product's listener, route and settings and differs only in its HTTP filter.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};
use serde_json::{Value, json};
use sluice_harness::cmd;

const WASM_FILTER: &str = "envoy.filters.http.wasm";
const HTTP_FILTERS: &str =
    "/static_resources/listeners/0/filter_chains/0/filters/0/typed_config/http_filters";
/// The generated config's one route's action.
const ROUTE: &str = "/static_resources/listeners/0/filter_chains/0/filters/0/typed_config/route_config/virtual_hosts/0/routes/0/route";

/// What sits in the HTTP filter chain before the router.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FilterChain {
    /// The generated config as it is: the Sluice filter.
    Sluice,
    /// Only the router.
    None,
    /// Envoy's native `local_ratelimit` with a limit that is never reached.
    NativeLocalRateLimit,
    /// The pass-through wasm filter (same runtime and settings as Sluice's).
    Passthrough,
    /// The Sluice filter as built at `--baseline REV`, with today's configuration.
    Baseline,
    /// The host-call probe (`bench/hostcall-filter`) making `call` `k` times per request.
    Hostcall { call: &'static str, k: u32 },
}

/// Inputs shared by every bootstrap of a run.
#[derive(Debug, Clone)]
pub struct Generator {
    pub sluice_bin: PathBuf,
    pub filter_wasm: PathBuf,
    pub passthrough_wasm: PathBuf,
    /// The host-call probe, when this run prices host calls.
    pub hostcall_wasm: Option<PathBuf>,
    /// The filter built at `--baseline REV`, when this run compares against one.
    pub baseline_wasm: Option<PathBuf>,
    /// Where rules files and bootstraps are written.
    pub dir: PathBuf,
}

/// A bootstrap written to disk and how it was made.
#[derive(Debug, Clone)]
pub struct Bootstrap {
    pub path: PathBuf,
    /// The `sluice envoy-config` command line that produced its base.
    pub command: String,
}

impl Generator {
    /// Writes `<name>.rules.json` and `<name>.yaml` (the generator's output, untouched),
    /// and for other filter chains `<name>.json` derived from it.
    pub fn write(
        &self,
        name: &str,
        rules: &Value,
        slots: u32,
        concurrency: u32,
        chain: FilterChain,
    ) -> Result<Bootstrap> {
        let rules_path = self.dir.join(format!("{name}.rules.json"));
        write_file(&rules_path, &serde_json::to_string_pretty(rules)?)?;
        let yaml_path = self.dir.join(format!("{name}.yaml"));
        let mut generate = self.generator(concurrency, &yaml_path, "direct");
        generate
            .arg("--rules")
            .arg(&rules_path)
            .args(["--slots", &slots.to_string()]);
        let command = run_generator(&mut generate)?;
        if chain == FilterChain::Sluice {
            return Ok(Bootstrap {
                path: yaml_path,
                command,
            });
        }
        let yaml = std::fs::read_to_string(&yaml_path)
            .with_context(|| format!("reading {}", yaml_path.display()))?;
        let mut config: Value = serde_norway::from_str(&yaml)
            .with_context(|| format!("parsing {}", yaml_path.display()))?;
        self.replace_filter(&mut config, chain)?;
        let json_path = self.dir.join(format!("{name}.json"));
        write_file(&json_path, &serde_json::to_string_pretty(&config)?)?;
        Ok(Bootstrap {
            path: json_path,
            command,
        })
    }

    /// Writes `<name>.rules.json`, `<name>.yaml` (the generator's output) and `<name>.json`:
    /// Sluice with `rules` in front of the upstream at `upstream`, the route's timeout
    /// lifted (Envoy's default of 15 s would cut a long stream).
    pub fn write_proxying(
        &self,
        name: &str,
        rules: &Value,
        concurrency: u32,
        upstream: SocketAddr,
    ) -> Result<Bootstrap> {
        let rules_path = self.dir.join(format!("{name}.rules.json"));
        write_file(&rules_path, &serde_json::to_string_pretty(rules)?)?;
        let yaml_path = self.dir.join(format!("{name}.yaml"));
        let mut generate = self.generator(concurrency, &yaml_path, &upstream.to_string());
        generate.arg("--rules").arg(&rules_path);
        let command = run_generator(&mut generate)?;
        let yaml = std::fs::read_to_string(&yaml_path)
            .with_context(|| format!("reading {}", yaml_path.display()))?;
        let mut config: Value = serde_norway::from_str(&yaml)
            .with_context(|| format!("parsing {}", yaml_path.display()))?;
        let route = config
            .pointer_mut(ROUTE)
            .and_then(Value::as_object_mut)
            .context("the generated config has no route to its upstream")?;
        route.insert("timeout".into(), json!("0s"));
        let path = self.dir.join(format!("{name}.json"));
        write_file(&path, &serde_json::to_string_pretty(&config)?)?;
        Ok(Bootstrap { path, command })
    }

    /// Writes a bootstrap at `path` for an Envoy that follows the admin API at `admin_url`
    /// (rules, reports and global syncs) as `proxy_id`, answering requests itself.
    pub fn write_following(
        &self,
        path: &Path,
        admin_url: &str,
        proxy_token: &str,
        proxy_id: &str,
        concurrency: u32,
    ) -> Result<String> {
        let mut generate = self.generator(concurrency, path, "direct");
        generate
            .args(["--admin-url", admin_url, "--proxy-token", proxy_token])
            .args(["--proxy-id", proxy_id]);
        run_generator(&mut generate)
    }

    /// Writes `<name>.yaml`: Envoy in front of `upstream` behind its native ratelimit
    /// filter, which asks the rate limit service at `rls` for one descriptor per request
    /// (`api_key` from `x-api-key`, domain `domain`), sending the proxy `token`, waiting
    /// at most 1 s. (Not `direct`: the filter skips routes that answer themselves.)
    pub fn write_rls(
        &self,
        name: &str,
        rls: SocketAddr,
        token: &str,
        domain: &str,
        concurrency: u32,
        upstream: SocketAddr,
    ) -> Result<Bootstrap> {
        let path = self.dir.join(format!("{name}.yaml"));
        let mut generate = Command::new(&self.sluice_bin);
        generate
            .arg("envoy-config")
            .args([
                "--listen",
                "127.0.0.1:0",
                "--upstream",
                &upstream.to_string(),
            ])
            .args(["--rls", &rls.to_string(), "--rls-domain", domain])
            .args(["--rls-action", "header:x-api-key=api_key"])
            .args(["--rls-timeout-ms", "1000"])
            .args(["--rls-token", token])
            .args(["--concurrency", &concurrency.to_string()])
            .args(["--envoy-admin", "127.0.0.1:0"])
            .arg("--output")
            .arg(&path);
        let command = run_generator(&mut generate)?;
        Ok(Bootstrap { path, command })
    }

    /// `sluice envoy-config` for a loopback listener in front of `upstream` (`direct`: Envoy
    /// answers requests itself), the filter, `concurrency` workers and an admin interface
    /// on a free port, written to `output`.
    fn generator(&self, concurrency: u32, output: &Path, upstream: &str) -> Command {
        let mut generate = Command::new(&self.sluice_bin);
        generate
            .arg("envoy-config")
            .args(["--listen", "127.0.0.1:0", "--upstream", upstream])
            .arg("--filter")
            .arg(&self.filter_wasm)
            .args(["--concurrency", &concurrency.to_string()])
            .args(["--envoy-admin", "127.0.0.1:0"])
            .arg("--output")
            .arg(output);
        generate
    }

    fn replace_filter(&self, config: &mut Value, chain: FilterChain) -> Result<()> {
        let filters = config
            .pointer_mut(HTTP_FILTERS)
            .and_then(Value::as_array_mut)
            .context("the generated config has no HTTP filter chain")?;
        let at = filters
            .iter()
            .position(|f| f["name"] == WASM_FILTER)
            .context("the generated config has no wasm filter")?;
        match chain {
            FilterChain::Sluice => {}
            FilterChain::None => {
                filters.remove(at);
            }
            FilterChain::NativeLocalRateLimit => filters[at] = native_local_ratelimit(),
            FilterChain::Passthrough => {
                // No plugin configuration, its own VM, same runtime and failure policy.
                replace_module(
                    &mut filters[at],
                    "passthrough",
                    &self.passthrough_wasm,
                    None,
                )?;
            }
            FilterChain::Baseline => {
                let module = self
                    .baseline_wasm
                    .as_deref()
                    .context("this run has no baseline filter (`--baseline REV`)")?;
                // The same plugin configuration, in a VM of its own.
                load_module(
                    &mut filters[at]["typed_config"]["config"],
                    "baseline",
                    module,
                );
            }
            FilterChain::Hostcall { call, k } => {
                let module = self
                    .hostcall_wasm
                    .as_deref()
                    .context("this run has no host-call probe module")?;
                replace_module(
                    &mut filters[at],
                    "hostcall",
                    module,
                    Some(&format!("{call} {k}")),
                )?;
            }
        }
        Ok(())
    }
}

/// Points the wasm filter `filter` at another module in a VM of its own, keeping the
/// runtime and failure policy, with `configuration` as its plugin configuration (a plain
/// string) or none.
fn replace_module(
    filter: &mut Value,
    name: &str,
    module: &Path,
    configuration: Option<&str>,
) -> Result<()> {
    let wasm = &mut filter["typed_config"]["config"];
    let map = wasm
        .as_object_mut()
        .context("the wasm filter has no config")?;
    match configuration {
        Some(text) => {
            map.insert(
                "configuration".into(),
                json!({
                    "@type": "type.googleapis.com/google.protobuf.StringValue",
                    "value": text,
                }),
            );
        }
        None => {
            map.remove("configuration");
        }
    }
    map.insert("name".into(), json!(name));
    map.insert("root_id".into(), json!(name));
    load_module(wasm, name, module);
    Ok(())
}

/// Has the wasm filter's `config` load `module` in a VM named `vm_id` (a VM per module:
/// Envoy shares a VM between filters that name the same one).
fn load_module(config: &mut Value, vm_id: &str, module: &Path) {
    let vm = &mut config["vm_config"];
    vm["vm_id"] = json!(vm_id);
    vm["code"] = json!({ "local": { "filename": module.to_string_lossy() } });
}

/// Envoy's own token bucket, as close to Sluice's "one rule, never denies" as it gets: one
/// bucket shared by every connection, enabled and enforced for 100% of requests, with a
/// limit far above anything a loopback benchmark reaches.
pub fn native_local_ratelimit() -> Value {
    json!({
        "name": "envoy.filters.http.local_ratelimit",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit",
            "stat_prefix": "bench_local_rate_limit",
            "token_bucket": {
                "max_tokens": 1_000_000_000u32,
                "tokens_per_fill": 1_000_000_000u32,
                "fill_interval": "1s",
            },
            "filter_enabled": {
                "runtime_key": "bench_local_rate_limit_enabled",
                "default_value": { "numerator": 100, "denominator": "HUNDRED" },
            },
            "filter_enforced": {
                "runtime_key": "bench_local_rate_limit_enforced",
                "default_value": { "numerator": 100, "denominator": "HUNDRED" },
            },
            "local_rate_limit_per_downstream_connection": false,
        },
    })
}

/// Runs `sluice envoy-config …`; returns its command line for the report.
fn run_generator(generate: &mut Command) -> Result<String> {
    let command = cmd::display(generate);
    // The generator says "wrote FILE" on stderr; keep the bench's log quiet.
    let out = generate
        .output()
        .with_context(|| format!("running `{command}`"))?;
    if !out.status.success() {
        anyhow::bail!(
            "`{command}` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(command)
}

fn write_file(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}
