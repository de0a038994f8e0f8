//! Rule propagation: from the admin API answering a rule change to every root of a real
//! Envoy (two workers and the main thread's) running the new ruleset.
//!
//! The real `sluice serve` (SQLite in the run folder) and an Envoy following it with the
//! control service, both on loopback. Each change is a `PUT` of the rule with a new
//! limit; the clock stops when Envoy's `sluice_rulesets_applied_total` (one increment per
//! filter root that swapped the ruleset in) has risen by the number of roots. Written
//! beside the main report.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::json;
use sluice_harness::cmd::{note, step};
use sluice_harness::serve::{AdminApi, Serve};
use sluice_harness::wait_until;

use crate::setup::Bench;

const APPLIED: &str = "wasmcustom.sluice_rulesets_applied_total";
const WORKERS: u32 = 2;
/// Longest a single change may take before the run is abandoned.
const CHANGE_TIMEOUT: Duration = Duration::from_secs(10);
const WAIT_LIMIT: Duration = Duration::from_secs(15);

/// Measures `changes` rule changes and writes `<out_dir>/<name>-propagation.md`.
pub fn run(bench: &Bench, out_dir: &Path, name: &str, changes: usize) -> Result<PathBuf> {
    step(format!(
        "propagation: {changes} rule changes through the admin API"
    ));
    let dir = bench.run_dir.join("propagation");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let database = format!("sqlite://{}/propagation.db", dir.display());
    let sluice = &bench.generator.sluice_bin;

    let admin = AdminApi::start(&Serve::new(sluice.clone(), database))?;
    let proxy_token = admin.proxy_token("bench")?;
    let yaml = dir.join("propagation.yaml");
    bench
        .generator
        .write_following(&yaml, &admin.url(), &proxy_token, "bench", WORKERS)?;
    let envoy = bench.start_envoy(&yaml, WORKERS, None, &dir, "propagation")?;
    wait_until("the control service to poll", WAIT_LIMIT, || {
        Ok(envoy.counter("wasmcustom.sluice_control_polls_total")? > 0)
    })?;

    let rule = |requests: usize| json!({"name": "bench", "key": "global", "limits": [{"requests": requests, "period": "minute"}]});
    // The first change tells how many filter roots apply each ruleset.
    admin.create_rule(&rule(1))?;
    wait_until("the first ruleset to be applied", WAIT_LIMIT, || {
        Ok(envoy.counter(APPLIED)? > 0)
    })?;
    std::thread::sleep(Duration::from_millis(500));
    let roots = envoy.counter(APPLIED)?;

    let mut latencies_ms = Vec::with_capacity(changes);
    let mut puts_ms = Vec::with_capacity(changes);
    for i in 0..changes {
        let target = envoy.counter(APPLIED)? + roots;
        let sent = Instant::now();
        let (status, _) = admin.call("PUT", "/api/v1/rules/bench", &rule(i + 2).to_string())?;
        let saved = Instant::now();
        puts_ms.push((saved - sent).as_secs_f64() * 1e3);
        if status != 200 {
            bail!("change {i} answered HTTP {status}");
        }
        while envoy.counter(APPLIED)? < target {
            if saved.elapsed() > CHANGE_TIMEOUT {
                bail!("change {i} was not applied by every root within {CHANGE_TIMEOUT:?}");
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        latencies_ms.push(saved.elapsed().as_secs_f64() * 1e3);
    }
    drop(envoy);
    drop(admin);

    latencies_ms.sort_by(f64::total_cmp);
    puts_ms.sort_by(f64::total_cmp);
    let quantile = |v: &[f64], q: f64| {
        v.get((v.len().saturating_sub(1) as f64 * q).round() as usize)
            .copied()
            .unwrap_or(0.0)
    };
    let at = |q: f64| quantile(&latencies_ms, q);
    let put_at = |q: f64| quantile(&puts_ms, q);
    let put_total_s: f64 = puts_ms.iter().sum::<f64>() / 1e3;
    let text = format!(
        "# Sluice rule propagation\n\n\
         Produced by `cargo xtask bench`: the real admin API (`sluice serve`, SQLite) and an Envoy \
         with {WORKERS} workers following it through the control service, on loopback. Each of \
         {changes} changes is a `PUT /api/v1/rules/bench` with a new limit; the time runs from the \
         API's answer until all {roots} filter roots (workers and the main thread) report the new \
         ruleset applied (`{APPLIED}`, polled every millisecond through Envoy's admin interface).\n\n\
         | changes | p50 ms | p90 ms | p99 ms | max ms |\n|---|---|---|---|---|\n\
         | {changes} | {:.1} | {:.1} | {:.1} | {:.1} |\n\n\
         The promise is one second. Workers check for a new ruleset every 100 ms, which bounds \
         most of the spread.\n\n\
         The same `PUT`s, as rule updates through the API (one client, one at a time; each \
         validates the whole ruleset, writes the rule, a version snapshot and an audit entry in \
         one transaction): p50 {:.1} ms, p99 {:.1} ms, {:.0} updates/s.\n",
        at(0.5),
        at(0.9),
        at(0.99),
        at(1.0),
        put_at(0.5),
        put_at(0.99),
        puts_ms.len() as f64 / put_total_s.max(1e-9),
    );
    let path = out_dir.join(format!("{name}-propagation.md"));
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    note(format!(
        "propagation p50 {:.1} ms, p99 {:.1} ms: {}",
        at(0.5),
        at(0.99),
        path.display()
    ));
    Ok(path)
}
