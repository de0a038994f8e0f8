//! Shaping (issue #30): what in-flight limits, the delay queue, soft and elastic limits cost
//! a request none of them binds, how closely a delayed request passes at its due time, and
//! Envoy's memory under a flood of waiting requests from many keys.
//!
//! Envoys from `sluice envoy-config`, two workers each, in front of the harness's echo
//! upstream on loopback:
//!
//! 1. **Cost**: five Envoys whose one rule differs only in its shaping option (none, a soft
//!    limit, an elastic ceiling, an in-flight limit, `on_limit: delay`), none of which binds.
//!    Requests back to back from a few clients; each response's latency and Envoy's CPU per
//!    request. The variants alternate within each round.
//! 2. **Delay**: a rule that delays (50 a second per key, a burst of 1), with several
//!    clients of one key asking back to back: each delayed response's latency against the
//!    wait the filter computed for it (`x-sluice-delay-ms`), and the key's admitted
//!    requests against `burst + rate × elapsed`. Beside it, an unhurried key's latency,
//!    the path's own.
//! 3. **Flood** (once): distinct keys, each passing one request and then queueing a second,
//!    which its client abandons after 100 ms: the queue at its bounds, every waiter
//!    cancelled, and Envoy's RSS before, at its peak and after.
//!
//! Written beside the main report as `<date>-shaping.md`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use sluice_core::response::{DELAY_QUEUED_HEADER, DELAY_WAIT_HEADER, WARNING_HEADER};
use sluice_harness::cmd::{note, step};
use sluice_harness::envoy::EnvoyProcess;
use sluice_harness::upstream::EchoUpstream;
use sluice_harness::wait_until;

use crate::setup::Bench;
use crate::stats::{self, Summary, quantile};

const WORKERS: u32 = 2;
/// Clients asking back to back in the cost phase.
const CONCURRENT: usize = 4;
/// The delay phase: the rule's rate per second, and clients of the one delayed key.
const DELAY_RATE: u64 = 50;
const DELAY_CLIENTS: usize = 8;
/// The filter's delay tick (`filter/src/delay.rs`): a waiting request passes at most this
/// late on a worker that keeps up.
const TICK_MS: f64 = 10.0;
/// The flood: requests in flight at once, and how long a client waits before giving up.
const FLOOD_CONCURRENT: usize = 400;
const FLOOD_PATIENCE: Duration = Duration::from_millis(100);
const WAIT_LIMIT: Duration = Duration::from_secs(30);

/// A rule that never binds (a million requests a second per key), with `option` merged in.
fn rule(option: Value) -> Value {
    let mut rule = json!({
        "name": "shaped", "key": {"header": "x-api-key"},
        "limits": [{"requests": 1_000_000u64, "period": "second"}],
    });
    if let (Some(rule), Some(option)) = (rule.as_object_mut(), option.as_object()) {
        for (k, v) in option {
            if k == "limits" {
                rule["limits"].as_array_mut().into_iter().for_each(|l| {
                    l.extend(v.as_array().into_iter().flatten().cloned());
                });
            } else {
                rule.insert(k.clone(), v.clone());
            }
        }
    }
    json!([rule])
}

/// The cost phase's variants: the plain rule, then each shaping option on it.
fn cost_variants() -> Vec<(&'static str, Value)> {
    vec![
        ("plain", rule(json!({}))),
        (
            "soft",
            json!([{"name": "shaped", "key": {"header": "x-api-key"},
                    "limits": [{"requests": 1_000_000u64, "period": "second", "soft_percent": 50}]}]),
        ),
        (
            "elastic",
            rule(json!({"elastic": {"requests": 1_000_000u64, "period": "second"}})),
        ),
        (
            "in-flight",
            rule(json!({"limits": [{"concurrent": 1_000}]})),
        ),
        (
            "delay",
            rule(json!({"on_limit": "delay", "delay": {"max_delay_ms": 1_000}})),
        ),
    ]
}

fn delay_rules() -> Value {
    json!([{"name": "delayed", "key": {"header": "x-api-key"},
            "limits": [{"requests": DELAY_RATE, "period": "second", "burst": 1}],
            "on_limit": "delay",
            "delay": {"max_delay_ms": 2_000, "queue_per_key": 64}}])
}

/// One request a key every 4 s, the second waiting up to 5 s, one waiter per key, the
/// most a worker may hold.
fn flood_rules() -> Value {
    json!([{"name": "flooded", "key": {"header": "x-api-key"},
            "limits": [{"requests": 1, "period": 4}],
            "on_limit": "delay",
            "delay": {"max_delay_ms": 5_000, "queue_per_key": 1, "queue_per_worker": 10_000}}])
}

struct Variant {
    name: &'static str,
    envoy: EnvoyProcess,
    url: String,
    latency_ms: Vec<f64>,
    p99_by_round: Vec<f64>,
    cpu_us_per_request: Vec<f64>,
}

#[derive(Debug, Default)]
struct DelayResults {
    /// Delayed responses: their latency minus the wait the filter computed, and the wait.
    excess_ms: Vec<f64>,
    wait_ms: Vec<f64>,
    /// Delayed responses: how long after its tokens were due each passed, by the worker's
    /// clock (`x-sluice-queued-ms` − `x-sluice-delay-ms`): the tick's part of the excess.
    late_ms: Vec<f64>,
    /// The unhurried key's latency: the path's own.
    baseline_ms: Vec<f64>,
    /// The delayed key's admitted requests and their bound, summed over rounds.
    admitted: u64,
    bound: f64,
    refused: u64,
    warned: u64,
}

#[derive(Debug, Default)]
struct Flood {
    keys: u64,
    passed_first: u64,
    abandoned: u64,
    refused: u64,
    other: u64,
    seconds: f64,
    rss_before: u64,
    rss_peak: u64,
    rss_after: u64,
    queued: u64,
    cancelled: u64,
    resumed: u64,
    failures: u64,
}

/// Measures and writes `<out_dir>/<name>-shaping.md`.
pub fn run(bench: &Bench, out_dir: &Path, name: &str) -> Result<PathBuf> {
    let settings = &bench.settings;
    let flood_keys: u64 = if settings.quick { 10_000 } else { 100_000 };
    step(format!(
        "shaping: {} rounds of {:?} per phase and variant, then a flood from {flood_keys} keys",
        settings.rounds, settings.round
    ));
    let dir = bench.run_dir.join("shaping");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let upstream = EchoUpstream::start()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("the client's runtime")?;
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(FLOOD_CONCURRENT)
        .timeout(Duration::from_secs(30))
        .build()?;
    let mut commands = Vec::new();
    let mut start = |variant: &str, rules: &Value| -> Result<(EnvoyProcess, String)> {
        let name = format!("shaping-{variant}");
        let bootstrap = bench
            .generator
            .write_proxying(&name, rules, WORKERS, upstream.addr())?;
        commands.push(bootstrap.command.clone());
        let envoy = bench.start_envoy(
            &bootstrap.path,
            WORKERS,
            bench.envoy_cpus.as_deref(),
            &dir,
            &name,
        )?;
        let url = format!("http://{}/work", envoy.listener());
        Ok((envoy, url))
    };
    let mut variants = Vec::new();
    for (variant, rules) in cost_variants() {
        let (envoy, url) = start(variant, &rules)?;
        variants.push(Variant {
            name: variant,
            envoy,
            url,
            latency_ms: Vec::new(),
            p99_by_round: Vec::new(),
            cpu_us_per_request: Vec::new(),
        });
    }
    let (delaying, delay_url) = start("delay-accuracy", &delay_rules())?;
    let (flooded, flood_url) = start("flood", &flood_rules())?;

    let mut delay = DelayResults::default();
    for round in 0..settings.rounds {
        for v in &mut variants {
            note(format!("round {}: cost, {}", round + 1, v.name));
            let ticks = v.envoy.cpu_ticks()?;
            let latencies = runtime.block_on(back_to_back(&client, &v.url, settings.round))?;
            let cpu_ms = (v.envoy.cpu_ticks()? - ticks) as f64 * 10.0;
            v.cpu_us_per_request
                .push(cpu_ms * 1e3 / latencies.len().max(1) as f64);
            v.p99_by_round.push(quantile(&latencies, 0.99));
            v.latency_ms.extend(latencies);
        }
        note(format!("round {}: delay", round + 1));
        runtime.block_on(delayed_round(
            &client,
            &delay_url,
            settings.round,
            &mut delay,
        ))?;
        // The delayed key's bucket refills before the next round starts.
        std::thread::sleep(Duration::from_millis(200));
    }
    note(format!("flood: {flood_keys} keys"));
    let flood = flood_phase(&runtime, &client, &flooded, &flood_url, flood_keys)
        .map_err(|e| format!("{e:#}"));
    drop(delaying);
    let text = markdown(&variants, &delay, &flood, &commands, settings);
    let path = out_dir.join(format!("{name}-shaping.md"));
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    note(format!("shaping: {}", path.display()));
    Ok(path)
}

async fn get(client: &reqwest::Client, url: &str, key: &str) -> Result<reqwest::Response> {
    Ok(client.get(url).header("x-api-key", key).send().await?)
}

/// Requests back to back from [`CONCURRENT`] clients (a key each) for `duration`: each
/// one's latency in milliseconds. Every answer must be a 200: no variant binds.
async fn back_to_back(client: &reqwest::Client, url: &str, duration: Duration) -> Result<Vec<f64>> {
    let stop = Instant::now() + duration;
    let mut tasks = Vec::new();
    for worker in 0..CONCURRENT {
        let (client, url) = (client.clone(), url.to_string());
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            while Instant::now() < stop {
                let sent = Instant::now();
                let response = get(&client, &url, &format!("client-{worker}")).await?;
                let status = response.status();
                response.bytes().await?;
                if status != 200 {
                    bail!("a request no limit binds was answered {status}");
                }
                latencies.push(sent.elapsed().as_secs_f64() * 1e3);
            }
            anyhow::Ok(latencies)
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await??);
    }
    Ok(all)
}

/// One round of the delay phase: [`DELAY_CLIENTS`] clients of one key back to back, and an
/// unhurried key beside them, for `duration`.
async fn delayed_round(
    client: &reqwest::Client,
    url: &str,
    duration: Duration,
    results: &mut DelayResults,
) -> Result<()> {
    let started = Instant::now();
    let stop = started + duration;
    let mut tasks = Vec::new();
    for _ in 0..DELAY_CLIENTS {
        let (client, url) = (client.clone(), url.to_string());
        tasks.push(tokio::spawn(async move {
            // (latency − computed wait, wait, queued − wait) of each delayed answer;
            // admitted, refused, warned.
            let (mut delayed, mut counts) = (Vec::new(), [0u64; 3]);
            while Instant::now() < stop {
                let sent = Instant::now();
                let response = get(&client, &url, "paced").await?;
                let latency = sent.elapsed().as_secs_f64() * 1e3;
                let header = |name: &str| {
                    let value = response.headers().get(name)?.to_str().ok()?;
                    value.parse::<f64>().ok()
                };
                let wait = header(DELAY_WAIT_HEADER).zip(header(DELAY_QUEUED_HEADER));
                counts[2] += u64::from(response.headers().contains_key(WARNING_HEADER));
                match response.status().as_u16() {
                    200 => counts[0] += 1,
                    429 => counts[1] += 1,
                    other => bail!("the delayed key was answered {other}"),
                }
                response.bytes().await?;
                if let Some((wait, queued)) = wait {
                    delayed.push((latency - wait, wait, queued - wait));
                }
            }
            anyhow::Ok((delayed, counts))
        }));
    }
    let baseline = {
        let (client, url) = (client.clone(), url.to_string());
        tokio::spawn(async move {
            let mut latencies = Vec::new();
            while Instant::now() < stop {
                let sent = Instant::now();
                let response = get(&client, &url, "unhurried").await?;
                response.bytes().await?;
                latencies.push(sent.elapsed().as_secs_f64() * 1e3);
                // Well within its key's 50 a second: never delayed.
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            anyhow::Ok(latencies)
        })
    };
    for task in tasks {
        let (delayed, counts) = task.await??;
        for (excess, wait, late) in delayed {
            results.excess_ms.push(excess);
            results.wait_ms.push(wait);
            results.late_ms.push(late);
        }
        results.admitted += counts[0];
        results.refused += counts[1];
        results.warned += counts[2];
    }
    results.baseline_ms.extend(baseline.await??);
    results.bound += 1.0 + DELAY_RATE as f64 * started.elapsed().as_secs_f64();
    Ok(())
}

/// The flood: `keys` distinct keys, [`FLOOD_CONCURRENT`] at a time, each passing one
/// request and queueing a second that its client abandons after [`FLOOD_PATIENCE`].
fn flood_phase(
    runtime: &tokio::runtime::Runtime,
    client: &reqwest::Client,
    envoy: &EnvoyProcess,
    url: &str,
    keys: u64,
) -> Result<Flood> {
    let stat = |name: &str| -> Result<u64> {
        Ok(envoy
            .stat(&format!("wasmcustom.sluice_{name}_total"))?
            .unwrap_or(0))
    };
    let rss_before = envoy.rss_bytes()?;
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (done, pid) = (Arc::clone(&done), envoy.pid());
        std::thread::spawn(move || {
            let mut peak = 0;
            while !done.load(Ordering::Relaxed) {
                peak = peak.max(sluice_harness::envoy::rss_bytes(pid).unwrap_or(0));
                std::thread::sleep(Duration::from_millis(100));
            }
            peak
        })
    };
    let started = Instant::now();
    let next = Arc::new(AtomicU64::new(0));
    let outcome = runtime.block_on(async {
        let mut tasks = Vec::new();
        for _ in 0..FLOOD_CONCURRENT {
            let (client, url, next) = (client.clone(), url.to_string(), Arc::clone(&next));
            tasks.push(tokio::spawn(async move {
                // Passed first, abandoned, refused, anything else.
                let mut counts = [0u64; 4];
                loop {
                    let key = next.fetch_add(1, Ordering::Relaxed);
                    if key >= keys {
                        break;
                    }
                    let key = format!("flood-{key}");
                    let first = get(&client, &url, &key).await?;
                    counts[0] += u64::from(first.status() == 200);
                    first.bytes().await?;
                    let second = client
                        .get(&url)
                        .header("x-api-key", &key)
                        .timeout(FLOOD_PATIENCE)
                        .send()
                        .await;
                    match second {
                        Err(e) if e.is_timeout() => counts[1] += 1,
                        Ok(r) if r.status() == 429 => counts[2] += 1,
                        _ => counts[3] += 1,
                    }
                }
                anyhow::Ok(counts)
            }));
        }
        let mut total = [0u64; 4];
        for task in tasks {
            for (t, c) in total.iter_mut().zip(task.await??) {
                *t += c;
            }
        }
        anyhow::Ok(total)
    });
    let seconds = started.elapsed().as_secs_f64();
    // Every waiter leaves the queue: resumed, or cancelled as its client gave up.
    let settled = wait_until("the flood's queue to empty", WAIT_LIMIT, || {
        Ok(stat("delayed")?
            == stat("delay_passed")? + stat("delay_cancelled")? + stat("delay_failures")?)
    });
    done.store(true, Ordering::Relaxed);
    let rss_peak = sampler.join().unwrap_or(0);
    let [passed_first, abandoned, refused, other] = outcome?;
    settled?;
    Ok(Flood {
        keys,
        passed_first,
        abandoned,
        refused,
        other,
        seconds,
        rss_before,
        rss_peak: rss_peak.max(rss_before),
        rss_after: envoy.rss_bytes()?,
        queued: stat("delayed")?,
        cancelled: stat("delay_cancelled")?,
        resumed: stat("delay_passed")?,
        failures: stat("delay_failures")?,
    })
}

fn markdown(
    variants: &[Variant],
    delay: &DelayResults,
    flood: &Result<Flood, String>,
    commands: &[String],
    settings: &crate::setup::Settings,
) -> String {
    let (rounds, round) = (settings.rounds, settings.round);
    let mut out = format!(
        "# Sluice shaping: what it costs, how on time a delay is, memory under a flood\n\n\
         Produced by `cargo xtask bench --only shaping`. Envoys ({WORKERS} workers each) in \
         front of the harness's echo upstream on loopback. {rounds} rounds of {round:?} per \
         phase and variant, the variants alternating within each round.\n\n\
         ## Cost of a rule that does not bind\n\n\
         Five Envoys whose rule (a million requests a second per key) differs only in one \
         shaping option: none (`plain`), `soft_percent: 50`, an `elastic` ceiling, an \
         in-flight limit of 1,000, `on_limit: delay`. {CONCURRENT} clients back to back.\n\n\
         | variant | requests | p50 ms | p99 ms | p99 − plain's, by round (median, min–max) ms | Envoy CPU µs per request |\n\
         |---|---|---|---|---|---|\n"
    );
    let plain = variants.first();
    for v in variants {
        let by_round = plain.map_or_else(String::new, |p| {
            let differences = v
                .p99_by_round
                .iter()
                .zip(&p.p99_by_round)
                .map(|(a, b)| a - b);
            stats::show(Summary::of(differences), 2)
        });
        out.push_str(&format!(
            "| {} | {} | {:.2} | {:.2} | {} | {} |\n",
            v.name,
            v.latency_ms.len(),
            quantile(&v.latency_ms, 0.5),
            quantile(&v.latency_ms, 0.99),
            by_round,
            stats::show(Summary::of(v.cpu_us_per_request.iter().copied()), 0),
        ));
    }
    let excess_p99 = quantile(&delay.excess_ms, 0.99);
    let baseline_p99 = quantile(&delay.baseline_ms, 0.99);
    out.push_str(&format!(
        "\n## Delayed requests\n\n\
         One key limited to {DELAY_RATE} a second (a burst of 1) with `on_limit: delay`, asked \
         back to back by {DELAY_CLIENTS} clients; beside it, a key asking every 50 ms, never \
         delayed: the path's own latency. A delayed response's excess is its latency minus the \
         wait the filter computed for it (`{DELAY_WAIT_HEADER}`); the bar is the path's latency \
         plus one tick ({TICK_MS} ms).\n\n\
         | | n | p50 ms | p99 ms |\n|---|---|---|---|\n\
         | computed wait | {} | {:.2} | {:.2} |\n\
         | excess over the wait | {} | {:.2} | {:.2} |\n\
         | passed after its due time (worker's clock) | {} | {:.2} | {:.2} |\n\
         | undelayed key's latency | {} | {:.2} | {:.2} |\n\n\
         The excess is the path's latency (at this load) plus how late the worker passed the \
         request. By the worker's own clock (`x-sluice-queued-ms` minus `{DELAY_WAIT_HEADER}`, \
         whole milliseconds) a request passed at most {:.0} ms after its due time at the p99 \
         (the bar: one tick, {TICK_MS} ms). Excess p99 minus the undelayed key's p99: {:+.2} \
         ms. The delayed key: {} admitted of a bound of {:.0} (`burst + rate × elapsed`, \
         summed over rounds: {:.3} of it), {} refused, {} warned.\n",
        delay.wait_ms.len(),
        quantile(&delay.wait_ms, 0.5),
        quantile(&delay.wait_ms, 0.99),
        delay.excess_ms.len(),
        quantile(&delay.excess_ms, 0.5),
        excess_p99,
        delay.late_ms.len(),
        quantile(&delay.late_ms, 0.5),
        quantile(&delay.late_ms, 0.99),
        delay.baseline_ms.len(),
        quantile(&delay.baseline_ms, 0.5),
        baseline_p99,
        quantile(&delay.late_ms, 0.99),
        excess_p99 - baseline_p99,
        delay.admitted,
        delay.bound,
        delay.admitted as f64 / delay.bound.max(1.0),
        delay.refused,
        delay.warned,
    ));
    out.push_str(&format!(
        "\n## A flood of waiting requests\n\n\
         One request a key every 4 s, the second waiting up to 5 s, one waiter per key and \
         10,000 per worker (the most a worker holds). Each key passes one request, then \
         queues a second that its client abandons after {} ms; {FLOOD_CONCURRENT} keys at a \
         time.\n\n",
        FLOOD_PATIENCE.as_millis()
    ));
    match flood {
        Err(e) => out.push_str(&format!("Failed: {e}\n")),
        Ok(f) => {
            let mb = |b: u64| b as f64 / 1e6;
            out.push_str(&format!(
                "| keys | seconds | first passed | second abandoned | second refused | other | queued | cancelled | resumed | failures | left queued | RSS before MB | peak MB | after MB |\n\
                 |---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n\
                 | {} | {:.1} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1} | {:.1} | {:.1} |\n",
                f.keys,
                f.seconds,
                f.passed_first,
                f.abandoned,
                f.refused,
                f.other,
                f.queued,
                f.cancelled,
                f.resumed,
                f.failures,
                f.queued.saturating_sub(f.cancelled + f.resumed + f.failures),
                mb(f.rss_before),
                mb(f.rss_peak),
                mb(f.rss_after),
            ));
        }
    }
    // The bootstraps differ only in their name and rules file.
    if let Some(first) = commands.first() {
        out.push_str(&format!(
            "\nBootstraps: `{first}`, and likewise for each variant with its own rules.\n"
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cost_variants_differ_from_the_plain_rule_in_one_option_only() {
        let variants = cost_variants();
        let plain = &variants[0].1[0];
        for (name, rules) in &variants[1..] {
            let rule = rules[0].as_object().unwrap();
            let changed: Vec<&String> = rule
                .iter()
                .filter(|(k, v)| plain.get(k.as_str()) != Some(v))
                .map(|(k, _)| k)
                .chain(
                    plain
                        .as_object()
                        .unwrap()
                        .keys()
                        .filter(|k| !rule.contains_key(*k)),
                )
                .collect();
            assert!(
                !changed.is_empty() && changed.len() <= 2,
                "{name}: {changed:?}"
            );
            if *name != "delay" {
                assert_eq!(changed.len(), 1, "{name}: {changed:?}");
            }
        }
        // Every variant is a valid rule.
        for (name, rules) in variants
            .iter()
            .chain([("delay-accuracy", delay_rules()), ("flood", flood_rules())].iter())
        {
            let spec: sluice_core::spec::RuleSpec =
                serde_json::from_value(rules[0].clone()).unwrap();
            assert!(sluice_core::rule::Rule::try_from(spec).is_ok(), "{name}");
        }
    }
}
