//! Accuracy: admitted requests against `burst + rate × elapsed`, with several Envoy
//! workers racing on one bucket through many concurrent connections.
//!
//! Envoy and wrk are left unpinned here: the point is workers truly running in parallel,
//! so that their compare-and-swap writes collide.

use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::{Value, json};
use sluice_envoy_config::LISTENER_NAME;
use sluice_harness::cmd::{note, step};

use crate::configs::FilterChain;
use crate::setup::Bench;
use crate::wrk::{Clients, Load, Measured};

/// `(requests per second, burst)` of each bucket under test.
pub const RATES: [(u64, u64); 3] = [(50, 100), (500, 500), (5_000, 2_500)];
/// Envoy worker counts.
pub const WORKERS: [u32; 2] = [2, 4];

#[derive(Debug, Clone)]
pub struct Case {
    pub workers: u32,
    pub rate: u64,
    pub burst: u64,
    pub measured: Measured,
    /// Requests Envoy's filter admitted over the run (`sluice_allowed_total`), including
    /// responses still in flight when wrk stopped: a cross-check of [`Case::admitted`].
    pub admitted_by_envoy: u64,
    /// Compare-and-swap conflicts between workers during the run.
    pub cas_conflicts: u64,
    /// Connections each worker accepted during the run.
    pub per_worker_connections: Vec<u64>,
    pub fail_open: u64,
}

impl Case {
    pub fn elapsed(&self) -> f64 {
        self.measured.duration.as_secs_f64()
    }

    /// `burst + rate × elapsed`.
    pub fn allowed(&self) -> f64 {
        self.burst as f64 + self.rate as f64 * self.elapsed()
    }

    /// Admitted requests the client saw complete within the elapsed time it measured: 2xx
    /// responses. Every one of them was decided inside wrk's window, so with an exact
    /// limiter this never exceeds [`Case::allowed`].
    pub fn admitted(&self) -> u64 {
        self.measured.requests.saturating_sub(self.measured.non_2xx)
    }

    /// Admitted beyond the allowance, in percent of it (0 when within).
    pub fn over_percent(&self) -> f64 {
        ((self.admitted() as f64 - self.allowed()).max(0.0)) / self.allowed() * 100.0
    }

    /// Admitted short of the allowance, in percent of it (0 when at or over).
    pub fn under_percent(&self) -> f64 {
        ((self.allowed() - self.admitted() as f64).max(0.0)) / self.allowed() * 100.0
    }

    /// Offered load in requests per second.
    pub fn offered(&self) -> f64 {
        self.measured.throughput()
    }

    pub fn to_json(&self) -> Value {
        json!({
            "workers": self.workers,
            "rate_per_s": self.rate,
            "burst": self.burst,
            "elapsed_s": self.elapsed(),
            "allowed": self.allowed(),
            "admitted": self.admitted(),
            "admitted_by_envoy_including_in_flight": self.admitted_by_envoy,
            "responses": self.measured.requests,
            "offered_rps": self.offered(),
            "over_admission_percent": self.over_percent(),
            "under_admission_percent": self.under_percent(),
            "cas_conflicts": self.cas_conflicts,
            "connections_per_worker": self.per_worker_connections,
            "fail_open": self.fail_open,
            "load_errors": self.measured.errors,
        })
    }
}

#[derive(Debug, Clone)]
pub struct AccuracyResults {
    pub cases: Vec<Case>,
    pub connections: u32,
    pub duration: Duration,
    pub commands: Vec<String>,
}

impl AccuracyResults {
    pub fn to_json(&self) -> Value {
        json!({
            "connections": self.connections,
            "duration_s": self.duration.as_secs_f64(),
            "cases": self.cases.iter().map(Case::to_json).collect::<Vec<_>>(),
        })
    }
}

fn rules() -> Value {
    Value::Array(
        RATES
            .iter()
            .map(|(rate, burst)| {
                json!({
                    "name": format!("r{rate}"),
                    "match": {"path_prefix": format!("/r{rate}/")},
                    "key": "global",
                    "limits": [{"requests": rate, "period": "second", "burst": burst}],
                })
            })
            .collect(),
    )
}

pub fn run(bench: &Bench) -> Result<AccuracyResults> {
    let settings = &bench.settings;
    step(format!(
        "accuracy: {} rates × {:?} workers, {} connections, {} s each (Envoy and wrk unpinned)",
        RATES.len(),
        WORKERS,
        settings.accuracy_connections,
        settings.accuracy.as_secs()
    ));
    let mut cases = Vec::new();
    let mut commands = Vec::new();
    for workers in WORKERS {
        let name = format!("accuracy-{workers}w");
        let bootstrap = bench.generator.write(
            &name,
            &rules(),
            settings.slots,
            workers,
            FilterChain::Sluice,
        )?;
        let envoy = bench.start_envoy(&bootstrap.path, workers, None, &bench.run_dir, &name)?;
        commands.push(bootstrap.command.clone());
        commands.push(envoy.command().to_string());
        for (rate, burst) in RATES {
            let url = envoy.url(&format!("/r{rate}/"));
            let load = Load {
                url: &url,
                threads: 2,
                connections: settings.accuracy_connections,
                duration: settings.accuracy,
                cpus: None,
                clients: Clients::One("accuracy"),
            };
            if rate == RATES[0].0 {
                commands.push(sluice_harness::cmd::display(&bench.wrk.command(&load)));
            }
            let allowed_before = envoy.counter("wasmcustom.sluice_allowed_total")?;
            let cas_before = envoy.counter("wasmcustom.sluice_cas_contention_total")?;
            let fail_open_before = envoy.counter("wasmcustom.sluice_fail_open_total")?;
            let workers_before = envoy
                .worker_downstream_connections(LISTENER_NAME)
                .context("reading per-worker connection counts")?;
            let measured = bench.wrk.run(&load)?;
            // Let in-flight responses finish before reading Envoy's counters.
            std::thread::sleep(Duration::from_millis(300));
            envoy.check_running()?;
            let workers_after = envoy
                .worker_downstream_connections(LISTENER_NAME)
                .context("reading per-worker connection counts")?;
            let case = Case {
                workers,
                rate,
                burst,
                measured,
                admitted_by_envoy: envoy
                    .counter("wasmcustom.sluice_allowed_total")?
                    .saturating_sub(allowed_before),
                cas_conflicts: envoy
                    .counter("wasmcustom.sluice_cas_contention_total")?
                    .saturating_sub(cas_before),
                per_worker_connections: workers_after
                    .iter()
                    .enumerate()
                    .map(|(i, n)| n.saturating_sub(workers_before.get(i).copied().unwrap_or(0)))
                    .collect(),
                fail_open: envoy
                    .counter("wasmcustom.sluice_fail_open_total")?
                    .saturating_sub(fail_open_before),
            };
            note(format!(
                "{workers} workers, {rate}/s burst {burst}: admitted {} ({} by Envoy's count) of {:.1} \
                 allowed in {:.3} s (over {:.3}%, under {:.3}%), offered {:.0}/s, {} CAS conflicts, \
                 connections per worker {:?}",
                case.admitted(),
                case.admitted_by_envoy,
                case.allowed(),
                case.elapsed(),
                case.over_percent(),
                case.under_percent(),
                case.offered(),
                case.cas_conflicts,
                case.per_worker_connections,
            ));
            cases.push(case);
        }
    }
    Ok(AccuracyResults {
        cases,
        connections: settings.accuracy_connections,
        duration: settings.accuracy,
        commands,
    })
}
