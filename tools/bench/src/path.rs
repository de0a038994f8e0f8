//! Request path cost: one Envoy per variant, all running at once with one worker pinned to
//! one core, measured in interleaved rounds (a b c ... a b c ...) by wrk pinned to the
//! other core.

use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::{Value, json};
use sluice_harness::cmd::{note, step};

use crate::configs::FilterChain;
use crate::machine;
use crate::setup::Bench;
use crate::stats::{self, Summary};
use crate::wrk::{Clients, Load, Measured};

/// The key every single-client variant sends.
pub const CLIENT_KEY: &str = "bench-client";
/// Distinct clients of variant (f).
pub const MANY_CLIENTS: u64 = 100_000;
/// Requests Envoy's HTTP connection manager completed (any status), as the generated
/// config names its stats.
const REQUESTS_COMPLETED: &str = "http.ingress_http.downstream_rq_completed";
/// Sluice's "never denies" limit: the largest it accepts, per second.
const HUGE: u64 = 1_000_000_000;

/// One configuration under test.
#[derive(Debug, Clone)]
pub struct Variant {
    pub id: &'static str,
    pub label: &'static str,
    pub chain: FilterChain,
    pub rules: Value,
    pub clients: VariantClients,
    /// Whether most responses should be 429.
    pub denies: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VariantClients {
    One,
    Many(u64),
}

/// The variants, in the order of every round; with `baseline`, (d), (e) and (f) again with
/// the filter built at `--baseline REV` as (db), (eb) and (fb).
pub fn variants(baseline: bool) -> Vec<Variant> {
    let today = today_variants();
    let again: Vec<Variant> = [
        ("d", "db", "as (d), the baseline filter"),
        ("e", "eb", "as (e), the baseline filter"),
        ("f", "fb", "as (f), the baseline filter"),
    ]
    .into_iter()
    .filter(|_| baseline)
    .filter_map(|(id, baseline_id, label)| {
        let v = today.iter().find(|v| v.id == id)?;
        Some(Variant {
            id: baseline_id,
            label,
            chain: FilterChain::Baseline,
            ..v.clone()
        })
    })
    .collect();
    today.into_iter().chain(again).collect()
}

fn today_variants() -> Vec<Variant> {
    let one_rule = json!([{
        "name": "per-key", "key": {"header": "x-api-key"},
        "limits": [{"requests": HUGE, "period": "second"}],
    }]);
    let two_tiers = json!([
        {"requests": HUGE, "period": "second"},
        {"requests": HUGE, "period": "minute"},
    ]);
    let three_rules = json!([
        {"name": "per-key", "key": {"header": "x-api-key"}, "limits": two_tiers},
        {"name": "per-ip", "key": {"client_ip": {"trusted_hops": 0}}, "limits": two_tiers},
        {"name": "per-path", "key": "path", "limits": two_tiers},
    ]);
    let no_headers = json!([{
        "name": "per-key", "key": {"header": "x-api-key"},
        "limits": [{"requests": HUGE, "period": "second"}],
        "response": {"rate_limit_headers": false},
    }]);
    let global = json!([{
        "name": "per-key", "key": {"header": "x-api-key"},
        "limits": [{"requests": HUGE, "period": "second", "scope": "global"}],
    }]);
    let hit = json!([{
        "name": "per-key", "key": {"header": "x-api-key"},
        "limits": [{"requests": 100, "period": "second"}],
    }]);
    let v = |id, label, chain, rules: &Value, clients, denies| Variant {
        id,
        label,
        chain,
        rules: rules.clone(),
        clients,
        denies,
    };
    use FilterChain as F;
    use VariantClients::{Many, One};
    vec![
        v("a", "no filter", F::None, &json!([]), One, false),
        v(
            "b",
            "native local_ratelimit",
            F::NativeLocalRateLimit,
            &json!([]),
            One,
            false,
        ),
        v(
            "c",
            "pass-through wasm filter",
            F::Passthrough,
            &json!([]),
            One,
            false,
        ),
        v(
            "d",
            "Sluice, 1 rule, 1 client",
            F::Sluice,
            &one_rule,
            One,
            false,
        ),
        v(
            "e",
            "Sluice, 3 rules × 2 tiers",
            F::Sluice,
            &three_rules,
            One,
            false,
        ),
        v(
            "f",
            "Sluice, 100,000 clients",
            F::Sluice,
            &one_rule,
            Many(MANY_CLIENTS),
            false,
        ),
        v(
            "g",
            "Sluice, limit hit (mostly 429)",
            F::Sluice,
            &hit,
            One,
            true,
        ),
        v(
            "d0",
            "Sluice as (d), rate-limit headers off",
            F::Sluice,
            &no_headers,
            One,
            false,
        ),
        v(
            "h",
            "Sluice as (d), scope: global (lease table, no coordinator)",
            F::Sluice,
            &global,
            One,
            false,
        ),
    ]
}

/// One variant measured in one round.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    pub measured: Measured,
    /// Requests Envoy completed during the round (its own counter).
    pub envoy_requests: u64,
    /// Envoy's utime + stime during the round, in microseconds.
    pub cpu_us: f64,
}

impl Sample {
    pub fn throughput(&self) -> f64 {
        self.measured.throughput()
    }

    pub fn cpu_per_request_us(&self) -> f64 {
        self.cpu_us / self.envoy_requests.max(1) as f64
    }

    /// Envoy's CPU use during the round, in cores (1.0 = one core fully busy).
    pub fn cores_used(&self) -> f64 {
        self.cpu_us / 1e6 / self.measured.duration.as_secs_f64().max(1e-9)
    }

    pub fn denied_share(&self) -> f64 {
        self.measured.non_2xx as f64 / self.measured.requests.max(1) as f64
    }
}

/// Everything the request-path section measured.
#[derive(Debug, Clone)]
pub struct PathResults {
    pub variants: Vec<Variant>,
    /// `samples[round][variant]`.
    pub samples: Vec<Vec<Sample>>,
    /// Sluice's own counters at the end, per variant (empty for non-Sluice variants).
    pub counters: Vec<Vec<(String, u64)>>,
    pub envoy_commands: Vec<String>,
    pub config_commands: Vec<String>,
    pub wrk_commands: Vec<String>,
    pub loadavg_end: String,
}

impl PathResults {
    pub fn index(&self, id: &str) -> Option<usize> {
        self.variants.iter().position(|v| v.id == id)
    }

    /// One measure of variant `i` over the rounds.
    pub fn summary(&self, i: usize, f: impl Fn(&Sample) -> f64) -> Option<Summary> {
        Summary::of(self.samples.iter().filter_map(|round| round.get(i).map(&f)))
    }

    /// A per-round comparison of variants `i` and `j`, e.g. a ratio or a difference.
    pub fn paired(
        &self,
        i: usize,
        j: usize,
        f: impl Fn(&Sample, &Sample) -> f64,
    ) -> Option<Summary> {
        Summary::of(
            self.samples
                .iter()
                .filter_map(|round| Some(f(round.get(i)?, round.get(j)?))),
        )
    }

    pub fn to_json(&self) -> Value {
        let a = self.index("a");
        let c = self.index("c");
        let variants: Vec<Value> = self
            .variants
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let ratio = |base: Option<usize>, f: fn(&Sample) -> f64| {
                    stats::to_json(base.and_then(|b| self.paired(i, b, |x, y| f(x) / f(y))))
                };
                json!({
                    "id": v.id,
                    "label": v.label,
                    "rules": v.rules,
                    "throughput_rps": stats::to_json(self.summary(i, Sample::throughput)),
                    "throughput_ratio_to_a": ratio(a, Sample::throughput),
                    "throughput_ratio_to_c": ratio(c, Sample::throughput),
                    "cpu_us_per_request": stats::to_json(self.summary(i, Sample::cpu_per_request_us)),
                    "cpu_ratio_to_a": ratio(a, Sample::cpu_per_request_us),
                    "cpu_ratio_to_c": ratio(c, Sample::cpu_per_request_us),
                    "envoy_cores_used": stats::to_json(self.summary(i, Sample::cores_used)),
                    "p50_us": stats::to_json(self.summary(i, |s| s.measured.p50_us as f64)),
                    "p99_us": stats::to_json(self.summary(i, |s| s.measured.p99_us as f64)),
                    "non_2xx_share": stats::to_json(self.summary(i, Sample::denied_share)),
                    "errors": self.samples.iter().filter_map(|r| r.get(i)).map(|s| s.measured.errors).sum::<u64>(),
                    "rounds": self.samples.iter().filter_map(|r| r.get(i)).map(|s| json!({
                        "requests": s.measured.requests,
                        "envoy_requests": s.envoy_requests,
                        "duration_s": s.measured.duration.as_secs_f64(),
                        "cpu_us": s.cpu_us,
                        "non_2xx": s.measured.non_2xx,
                        "errors": s.measured.errors,
                        "p50_us": s.measured.p50_us,
                        "p99_us": s.measured.p99_us,
                    })).collect::<Vec<_>>(),
                    "sluice_counters": self.counters.get(i).map(|c| c.iter().map(|(k, v)| (k.clone(), json!(v))).collect::<serde_json::Map<_, _>>()),
                })
            })
            .collect();
        json!({ "variants": variants, "loadavg_end": self.loadavg_end })
    }
}

/// wrk's load on one variant's Envoy at `url` for `duration`: one thread, the run's
/// connections, the variant's clients, on the load's CPU.
fn wrk_load<'a>(bench: &'a Bench, v: &Variant, url: &'a str, duration: Duration) -> Load<'a> {
    Load {
        url,
        threads: 1,
        connections: bench.settings.connections,
        duration,
        cpus: bench.load_cpus.as_deref(),
        clients: match v.clients {
            VariantClients::One => Clients::One(CLIENT_KEY),
            VariantClients::Many(n) => Clients::Cycle(n, "client-"),
        },
    }
}

/// Runs the request-path comparison.
pub fn run(bench: &Bench) -> Result<PathResults> {
    let baseline = bench.settings.baseline.is_some();
    run_variants(bench, "request path", "path", variants(baseline))
}

/// Measures `variants` in interleaved rounds: one Envoy each (its files named
/// `<prefix>-<id>`), all started up front, then every round loads each in turn.
pub fn run_variants(
    bench: &Bench,
    title: &str,
    prefix: &str,
    variants: Vec<Variant>,
) -> Result<PathResults> {
    let settings = &bench.settings;
    step(format!(
        "{title}: {} variants × {} rounds × {} s (warm-up {} s each), {} connections",
        variants.len(),
        settings.rounds,
        settings.round.as_secs(),
        settings.warmup.as_secs(),
        settings.connections
    ));
    let mut envoys = Vec::new();
    let mut envoy_commands = Vec::new();
    let mut config_commands = Vec::new();
    for v in &variants {
        let name = format!("{prefix}-{}", v.id);
        let bootstrap = bench
            .generator
            .write(&name, &v.rules, settings.slots, 1, v.chain)
            .with_context(|| format!("writing the config of variant ({})", v.id))?;
        let envoy = bench
            .start_envoy(
                &bootstrap.path,
                1,
                bench.envoy_cpus.as_deref(),
                &bench.run_dir,
                &name,
            )
            .with_context(|| format!("starting Envoy for variant ({}) {}", v.id, v.label))?;
        note(format!("({}) {}: Envoy pid {}", v.id, v.label, envoy.pid()));
        envoy_commands.push(format!("({}) {}", v.id, envoy.command()));
        config_commands.push(format!("({}) {}", v.id, bootstrap.command));
        envoys.push(envoy);
    }

    let urls: Vec<String> = envoys.iter().map(|e| e.url("/bench")).collect();
    let mut wrk_commands = Vec::new();

    step("warming up every variant");
    for (v, url) in variants.iter().zip(&urls) {
        let load = wrk_load(bench, v, url, settings.warmup);
        let warm = bench.wrk.run(&load)?;
        note(format!(
            "({}) {:.0} requests/s during warm-up",
            v.id,
            warm.throughput()
        ));
        let shown = bench.wrk.command(&Load {
            duration: settings.round,
            ..load
        });
        wrk_commands.push(format!(
            "({}) {}",
            v.id,
            sluice_harness::cmd::display(&shown)
        ));
    }

    let mut samples = Vec::new();
    for round in 0..settings.rounds {
        step(format!("round {}/{}", round + 1, settings.rounds));
        let mut this_round = Vec::new();
        for ((v, envoy), url) in variants.iter().zip(envoys.iter_mut()).zip(&urls) {
            let load = wrk_load(bench, v, url, settings.round);
            let requests_before = envoy.counter(REQUESTS_COMPLETED)?;
            let ticks_before = envoy.cpu_ticks()?;
            let measured = bench.wrk.run(&load)?;
            let ticks_after = envoy.cpu_ticks()?;
            let requests_after = envoy.counter(REQUESTS_COMPLETED)?;
            envoy
                .check_running()
                .with_context(|| format!("variant ({})", v.id))?;
            let sample = Sample {
                measured,
                envoy_requests: requests_after.saturating_sub(requests_before),
                cpu_us: ticks_after.saturating_sub(ticks_before) as f64 * 1e6
                    / bench.machine.clk_tck as f64,
            };
            note(format!(
                "({:>2}) {:>8.0} req/s  {:>6.2} µs CPU/req  {:>4.0}% of a core  p50 {:>5} µs  p99 {:>6} µs{}{}",
                v.id,
                sample.throughput(),
                sample.cpu_per_request_us(),
                sample.cores_used() * 100.0,
                measured.p50_us,
                measured.p99_us,
                if measured.non_2xx > 0 {
                    format!("  {:.1}% non-2xx", sample.denied_share() * 100.0)
                } else {
                    String::new()
                },
                if measured.errors > 0 {
                    format!("  {} errors", measured.errors)
                } else {
                    String::new()
                },
            ));
            this_round.push(sample);
        }
        samples.push(this_round);
    }

    let mut counters = Vec::new();
    for (v, envoy) in variants.iter().zip(&envoys) {
        if v.chain == FilterChain::Sluice {
            let stats = envoy.stats_matching("^wasmcustom\\.sluice_")?;
            counters.push(
                stats
                    .into_iter()
                    .map(|(k, v)| (k.trim_start_matches("wasmcustom.").to_string(), v))
                    .collect(),
            );
        } else {
            counters.push(Vec::new());
        }
    }
    drop(envoys);
    Ok(PathResults {
        variants,
        samples,
        counters,
        envoy_commands,
        config_commands,
        wrk_commands,
        loadavg_end: machine::loadavg(),
    })
}
