//! Fleet-wide limits (`scope: global`), measured against issue #9's bars with real parts:
//! three Envoys with two workers each following the real admin API, closed-loop load
//! split 70/20/10 between them, faults made by killing real processes.
//!
//! Two fleets run one after the other:
//! 1. one `sluice serve` coordinating in memory (SQLite for the rules): accuracy for one
//!    bucket at three rates and for 1,000 clients, a new client's burst sent to all three
//!    Envoys at once, Envoy CPU per request of a global rule against the same rule with
//!    `scope: proxy` (interleaved rounds), and the admin API killed for 10 s under load;
//! 2. two `sluice serve` replicas on one PostgreSQL and one Redis, the Envoys' syncs spread
//!    over both: accuracy as with one, then Redis killed for 10 s under load.
//!
//! Then the coordinator alone: 20 simulated proxies, each sending one sync per interval
//! with the same 10,000 active buckets, against the in-memory and the Redis coordinator.
//!
//! Written to `tools/bench/results/<name>-global.md` beside the main report.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use sluice_core::global::coordinator::Usage;
use sluice_core::global::sync::{BucketUsage, SYNC_PATH, SyncRequest};
use sluice_harness::cmd::{note, step};
use sluice_harness::envoy::EnvoyProcess;
use sluice_harness::serve::{ADMIN_TOKEN, AdminApi, Serve};
use sluice_harness::wait_until;
use sluice_harness::{POSTGRES_URL_ENV, RedisServer};

use sluice_harness::load::{Outcome, Tally};

use crate::fleet_load::{self, Plan, ms, other};
use crate::setup::Bench;

const ENVOYS: usize = 3;
const WORKERS: u32 = 2;
/// Connections per Envoy: the 70/20/10 traffic split.
const SPLIT: [usize; ENVOYS] = [14, 4, 2];
/// Global rules under test: `(requests per second, burst)`.
const RATES: [(u64, u64); 3] = [(50, 100), (500, 500), (5_000, 2_500)];
const CLIENTS: u64 = 1_000;
/// The rate and burst of the fault runs' rule.
const FAULT_RATE: (u64, u64) = (500, 500);
/// A limit the cost comparison never reaches.
const UNREACHED: u64 = 1_000_000;
const NEW_CLIENT: (u64, u64) = (10, 100);
const SIM_PROXIES: usize = 20;
const SIM_BUCKETS: u64 = 10_000;
/// The control service's default sync interval.
const SYNC_INTERVAL: Duration = Duration::from_nanos(sluice_core::global::DEFAULT_SYNC_INTERVAL_NS);
const PATIENCE: Duration = Duration::from_secs(60);

const FLEET_SIZE: &str = "wasmcustom.sluice_control_fleet_size";
const ON_FALLBACK: &str = "wasmcustom.sluice_control_global_fallback";
const FALLBACK_TOTAL: &str = "wasmcustom.sluice_global_fallback_total";
const APPLIED: &str = "wasmcustom.sluice_rulesets_applied_total";
const SYNCS: &str = "wasmcustom.sluice_control_syncs_total";
const REDIS_COMMANDS: &str = "sluice_quota_redis_commands_total";

/// The Envoys' counters of what went wrong or around the leases: each should stay at 0
/// through an accuracy run.
const HEALTH_COUNTERS: [&str; 5] = [
    FALLBACK_TOTAL,
    "wasmcustom.sluice_global_failures_total",
    "wasmcustom.sluice_global_table_full_total",
    "wasmcustom.sluice_fail_open_total",
    "wasmcustom.sluice_control_sync_failures_total",
];

/// The coordinator's: buckets given up on after lost races between replicas.
const COORDINATOR_HEALTH_COUNTERS: [&str; 1] = ["sluice_quota_contended_buckets"];

/// Durations of one run.
struct Timing {
    accuracy: Duration,
    fault_before: Duration,
    fault: Duration,
    fault_after: Duration,
    cost_round: Duration,
    cost_rounds: u32,
    coordinator: Duration,
}

impl Timing {
    fn new(quick: bool) -> Timing {
        let s = |q: u64, f: u64| Duration::from_secs(if quick { q } else { f });
        Timing {
            accuracy: s(5, 20),
            fault_before: s(4, 5),
            fault: Duration::from_secs(10),
            fault_after: s(6, 10),
            cost_round: s(3, 5),
            cost_rounds: if quick { 2 } else { 4 },
            coordinator: s(5, 15),
        }
    }
}

/// The three Envoys and whoever coordinates them.
struct Fleet {
    envoys: Vec<EnvoyProcess>,
    admins: Vec<AdminApi>,
    redis: Option<RedisServer>,
}

impl Fleet {
    /// Starts `admins` (rules created through the first), then the Envoys, Envoy `i`
    /// following admin `follow[i]`, and waits until every one is coordinated.
    fn start(
        bench: &Bench,
        name: &str,
        admins: Vec<AdminApi>,
        redis: Option<RedisServer>,
        follow: [usize; ENVOYS],
        rules: &[Value],
    ) -> Result<Fleet> {
        for rule in rules {
            admins[0].create_rule(rule)?;
        }
        let dir = bench.run_dir.join(name);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut envoys = Vec::new();
        for (i, &admin) in follow.iter().enumerate() {
            let token = admins[admin].proxy_token(&format!("{name}-{i}"))?;
            let yaml = dir.join(format!("edge-{i}.yaml"));
            bench.generator.write_following(
                &yaml,
                &admins[admin].url(),
                &token,
                &format!("{name}-edge-{i}"),
                WORKERS,
            )?;
            envoys.push(bench.start_envoy(&yaml, WORKERS, None, &dir, &format!("edge-{i}"))?);
        }
        let fleet = Fleet {
            envoys,
            admins,
            redis,
        };
        fleet.wait_until_coordinated(rules.len())?;
        Ok(fleet)
    }

    /// Every worker runs the rules and every Envoy spends leases for the whole fleet.
    fn wait_until_coordinated(&self, rules: usize) -> Result<()> {
        for envoy in &self.envoys {
            if rules > 0 {
                wait_until("every worker to run the rules", PATIENCE, || {
                    Ok(envoy.counter(APPLIED)? >= u64::from(WORKERS))
                })?;
            }
            wait_until("the fleet to be coordinated", PATIENCE, || {
                Ok(envoy.counter(FLEET_SIZE)? == ENVOYS as u64 && envoy.counter(ON_FALLBACK)? == 0)
            })?;
        }
        Ok(())
    }

    /// Adds a rule and waits until every worker of every Envoy runs it.
    fn add_rule(&self, rule: &Value) -> Result<()> {
        let before: Vec<u64> = self
            .envoys
            .iter()
            .map(|e| e.counter(APPLIED))
            .collect::<Result<_>>()?;
        self.admins[0].create_rule(rule)?;
        for (envoy, before) in self.envoys.iter().zip(before) {
            wait_until("every worker to run the new rule", PATIENCE, || {
                Ok(envoy.counter(APPLIED)? >= before + u64::from(WORKERS))
            })?;
        }
        Ok(())
    }

    fn plan(&self, path: &str, key_prefix: &str, clients: u64, duration: Duration) -> Plan {
        self.plan_split(SPLIT, path, key_prefix, clients, duration)
    }

    fn plan_split(
        &self,
        split: [usize; ENVOYS],
        path: &str,
        key_prefix: &str,
        clients: u64,
        duration: Duration,
    ) -> Plan {
        Plan {
            targets: self
                .envoys
                .iter()
                .zip(split)
                .map(|(envoy, connections)| (envoy.listener(), connections))
                .collect(),
            path: path.to_string(),
            key_prefix: key_prefix.to_string(),
            clients,
            duration,
        }
    }

    fn sum_stat(&self, name: &str) -> Result<u64> {
        self.envoys.iter().map(|e| e.counter(name)).sum()
    }

    /// The counters that say whether a run went as designed, summed over the Envoys (and
    /// over the admin APIs for the coordinator's), to compare before and after it.
    fn health(&self) -> Result<Vec<u64>> {
        let mut values: Vec<u64> = HEALTH_COUNTERS
            .iter()
            .map(|name| self.sum_stat(name))
            .collect::<Result<_>>()?;
        for name in COORDINATOR_HEALTH_COUNTERS {
            let mut sum = 0.0;
            for admin in &self.admins {
                sum += admin.metric(name)?;
            }
            values.push(sum as u64);
        }
        Ok(values)
    }

    /// What [`Self::health`]'s counters did since `before`, as a sentence's list.
    fn health_since(&self, before: &[u64]) -> String {
        let now = self.health().unwrap_or_else(|_| before.to_vec());
        HEALTH_COUNTERS
            .iter()
            .chain(COORDINATOR_HEALTH_COUNTERS.iter())
            .zip(now.iter().zip(before))
            .map(|(name, (now, before))| {
                let name = name.trim_start_matches("wasmcustom.");
                format!("`{name}` +{}", now.saturating_sub(*before))
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn cpu_ticks(&self) -> Result<u64> {
        self.envoys.iter().map(EnvoyProcess::cpu_ticks).sum()
    }

    fn check_running(&mut self) -> Result<()> {
        self.envoys.iter().try_for_each(EnvoyProcess::check_running)
    }
}

pub(crate) fn global_rule(name: &str, rate: u64, burst: u64, scope: &str) -> Value {
    json!({
        "name": name,
        "match": {"path_prefix": format!("/{name}/")},
        "key": {"header": "x-api-key"},
        "limits": [{"requests": rate, "period": "second", "burst": burst, "scope": scope}],
    })
}

/// `admitted / (burst + rate × elapsed)`.
fn ratio(admitted: u64, rate: u64, burst: u64, elapsed: Duration) -> f64 {
    admitted as f64 / (burst as f64 + rate as f64 * elapsed.as_secs_f64())
}

/// Each Envoy's part of the admitted requests, and (in brackets) of the requests answered:
/// the closed loop's split of the demand is what the machine gives, not exactly the
/// connections' 70/20/10, and shares follow the demand.
fn shares(outcome: &Outcome) -> String {
    let split = |count: fn(&Tally) -> u64| {
        let total = outcome.per_target.iter().map(count).sum::<u64>().max(1) as f64;
        outcome
            .per_target
            .iter()
            .map(|c| format!("{:.0}%", count(c) as f64 / total * 100.0))
            .collect::<Vec<_>>()
            .join("/")
    };
    format!("{} ({})", split(Tally::admitted), split(Tally::responses))
}

/// One bucket's run against the bar (0.97 to 1.01 of `burst + rate × elapsed`, no
/// errors): the ratio, and the table cells admitted | allowed | ratio | each Envoy's part
/// | verdict.
fn one_bucket(outcome: &Outcome, rate: u64, burst: u64) -> (f64, String) {
    let admitted = outcome.total.admitted();
    let r = ratio(admitted, rate, burst, outcome.elapsed);
    let cells = format!(
        "{admitted} | {:.0} | {r:.4} | {} | {}",
        burst as f64 + rate as f64 * outcome.elapsed.as_secs_f64(),
        shares(outcome),
        verdict((0.97..=1.01).contains(&r) && outcome.total.errors == 0),
    );
    (r, cells)
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "meets the bar"
    } else {
        "**misses the bar**"
    }
}

/// Runs the section and writes `<out_dir>/<name>-global.md`, naming the command that
/// made it (`invocation`).
pub fn run(bench: &Bench, out_dir: &Path, name: &str, invocation: &str) -> Result<PathBuf> {
    let timing = Timing::new(bench.settings.quick);
    let mut md = String::new();
    let started = Instant::now();
    writeln!(
        md,
        "# Sluice fleet-wide limits\n\n\
         Produced by `{invocation}` on a shared {}-core machine ({}). \
         Three Envoys with {WORKERS} workers each follow the real admin API on loopback; the \
         load generator (closed loop, one request at a time per connection) splits its \
         connections {SPLIT:?} between them (70/20/10) and shares the cores with everything \
         else, so offered load is what the machine gives and is shown. Admission is compared \
         with `burst + rate × elapsed`, elapsed from the first request sent to the last \
         answer. The control service syncs every {} ms.\n",
        bench.machine.cores,
        bench.machine.cpu_model,
        SYNC_INTERVAL.as_millis(),
    )?;

    type Part = fn(&Bench, &Timing, &mut String) -> Result<()>;
    let parts: [(&str, Part); 3] = [
        ("one admin API in memory", memory_fleet),
        ("two replicas on PostgreSQL and Redis", replicated_fleet),
        ("the coordinator alone", coordinator),
    ];
    let mut failures = Vec::new();
    for (title, part) in parts {
        // A failed part is reported where its results would be; the others still run.
        if let Err(err) = part(bench, &timing, &mut md) {
            note(format!("global, {title}: {err:#}"));
            writeln!(md, "\n**{title} failed:** {err:#}\n")?;
            failures.push(title);
        }
    }

    writeln!(
        md,
        "\nThe whole section took {:.1} min.",
        started.elapsed().as_secs_f64() / 60.0
    )?;
    let path = out_dir.join(format!("{name}-global.md"));
    std::fs::write(&path, &md).with_context(|| format!("writing {}", path.display()))?;
    note(format!("fleet-wide limits: {}", path.display()));
    if !failures.is_empty() {
        bail!("parts failed: {}", failures.join(", "));
    }
    Ok(path)
}

fn sqlite(bench: &Bench, name: &str) -> Serve {
    Serve::new(
        bench.generator.sluice_bin.clone(),
        format!("sqlite://{}/{name}.db", bench.run_dir.display()),
    )
}

/// Fleet 1: one admin API coordinating in memory.
fn memory_fleet(bench: &Bench, timing: &Timing, md: &mut String) -> Result<()> {
    step("global: three Envoys, one admin API coordinating in memory");
    let mut rules: Vec<Value> = RATES
        .iter()
        .map(|&(rate, burst)| global_rule(&format!("g{rate}"), rate, burst, "global"))
        .collect();
    rules.push(global_rule("nb", NEW_CLIENT.0, NEW_CLIENT.1, "global"));
    rules.push(global_rule("cp", UNREACHED, UNREACHED, "proxy"));
    rules.push(global_rule("cg", UNREACHED, UNREACHED, "global"));
    rules.push(global_rule("gf", FAULT_RATE.0, FAULT_RATE.1, "global"));
    let admin = AdminApi::start(&sqlite(bench, "global-memory"))?;
    let mut fleet = Fleet::start(bench, "global-memory", vec![admin], None, [0, 0, 0], &rules)?;

    writeln!(
        md,
        "## One bucket, one admin API (in memory)\n\n\
         Bar: fleet-wide admitted between 0.97 and 1.01 of `burst + rate × elapsed`.\n\n\
         | rate/s | burst | elapsed s | offered/s | admitted | allowed | ratio | admitted per Envoy (offered) | |\n\
         |---|---|---|---|---|---|---|---|---|"
    )?;
    let mut offered = 0.0f64;
    for (rate, burst) in RATES {
        let outcome =
            fleet_load::run(&fleet.plan(&format!("/g{rate}/x"), "single-", 1, timing.accuracy))?;
        fleet.check_running()?;
        let (r, cells) = one_bucket(&outcome, rate, burst);
        offered = offered.max(outcome.rate());
        note(format!(
            "global {rate}/s: admitted {} in {:.2} s, ratio {r:.4}, offered {:.0}/s",
            outcome.total.admitted(),
            outcome.elapsed.as_secs_f64(),
            outcome.rate()
        ));
        writeln!(
            md,
            "| {rate} | {burst} | {:.2} | {:.0} | {cells} |",
            outcome.elapsed.as_secs_f64(),
            outcome.rate(),
        )?;
    }

    many_clients(&fleet, timing, offered, md)?;
    new_client_burst(&fleet, md)?;
    cost(&mut fleet, timing, md)?;
    let admin_fault = Fault {
        title: "Admin API killed for 10 s",
        what: "the admin API (SIGKILL, then started again on the same address and database)",
    };
    admin_fault.run(
        &mut fleet,
        timing,
        |f| {
            f.admins[0].kill();
            Ok(())
        },
        |f| f.admins[0].restart(),
        md,
    )?;
    Ok(())
}

/// 1,000 clients, each offered at least twice its limit: the per-client rate is set from
/// the load the machine gave the single-bucket runs.
fn many_clients(fleet: &Fleet, timing: &Timing, offered: f64, md: &mut String) -> Result<()> {
    let rate = ((offered / (CLIENTS as f64 * 2.5)).floor() as u64).clamp(1, 50);
    let burst = rate;
    step(format!(
        "global: {CLIENTS} clients at {rate}/s each (offered about {:.1}× each)",
        offered / CLIENTS as f64 / rate as f64
    ));
    fleet.add_rule(&global_rule("gm", rate, burst, "global"))?;
    let before = fleet.health()?;
    let outcome = fleet_load::run(&fleet.plan("/gm/x", "client-", CLIENTS, timing.accuracy))?;
    let health = fleet.health_since(&before);
    note(health.clone());
    let total = &outcome.total;
    let per_client_allowed = burst as f64 + rate as f64 * outcome.elapsed.as_secs_f64();
    let fleet_ratio = total.admitted() as f64 / (CLIENTS as f64 * per_client_allowed);
    let ratios: Vec<f64> = outcome
        .per_key
        .iter()
        .map(|row| row.iter().map(Tally::admitted).sum::<u64>() as f64 / per_client_allowed)
        .collect();
    let mut ranked: Vec<usize> = (0..ratios.len()).collect();
    ranked.sort_by(|&a, &b| ratios[b].total_cmp(&ratios[a]));
    for &i in ranked.iter().take(5) {
        note(format!(
            "client-{i}: {:.3} of its limit, admitted per Envoy {:?}",
            ratios[i],
            outcome.per_key[i]
                .iter()
                .map(Tally::admitted)
                .collect::<Vec<_>>()
        ));
    }
    let max = ratios.iter().copied().fold(0.0, f64::max);
    let min = ratios.iter().copied().fold(f64::INFINITY, f64::min);
    let offered_each =
        outcome.total.responses() as f64 / CLIENTS as f64 / outcome.elapsed.as_secs_f64().max(1e-9);
    note(format!(
        "{CLIENTS} clients: fleet ratio {fleet_ratio:.4}, per client {min:.3}..{max:.3}"
    ));
    writeln!(
        md,
        "\n## 1,000 clients\n\n\
         Each client's limit is {rate}/s with a burst of {burst} (set from the load the machine \
         gave the runs above, so that every client is offered at least twice its limit); \
         offered {offered_each:.1}/s per client ({:.1}× its limit), {:.2} s. Bars: fleet-wide \
         0.97 to 1.01 of the allowance, no client above 1.05 of its own.\n\n\
         | admitted | allowed | fleet-wide ratio | lowest client | highest client | |\n\
         |---|---|---|---|---|---|\n\
         | {} | {:.0} | {fleet_ratio:.4} | {min:.3} | {max:.3} | {} |\n\n\
         Across the Envoys during the run: {}.",
        offered_each / rate as f64,
        outcome.elapsed.as_secs_f64(),
        total.admitted(),
        CLIENTS as f64 * per_client_allowed,
        verdict((0.97..=1.01).contains(&fleet_ratio) && max <= 1.05),
        health,
    )?;
    Ok(())
}

/// A client never seen before sends its burst to all three Envoys at once.
fn new_client_burst(fleet: &Fleet, md: &mut String) -> Result<()> {
    let (rate, burst) = NEW_CLIENT;
    const TRIES: usize = 5;
    step(format!(
        "global: {TRIES} new clients each sending far more than a burst of {burst} to all three Envoys at once"
    ));
    let mut rows = Vec::new();
    for i in 0..TRIES {
        let outcome = fleet_load::run(&fleet.plan_split(
            [8, 8, 8],
            "/nb/x",
            &format!("newcomer-{i}-"),
            1,
            Duration::from_millis(400),
        ))?;
        let allowed = burst as f64 + rate as f64 * outcome.elapsed.as_secs_f64();
        let per_envoy: Vec<u64> = outcome.per_target.iter().map(Tally::admitted).collect();
        let total = outcome.total;
        let admitted = total.admitted() as f64 / burst as f64;
        rows.push((total, per_envoy, admitted, allowed));
    }
    let worst = rows.iter().map(|r| r.2).fold(0.0, f64::max);
    writeln!(
        md,
        "\n## A new client's burst on all three Envoys at once\n\n\
         A rule of {rate}/s with a burst of {burst}; each try is a client the fleet has never \
         seen, sent from 8 connections to each Envoy at once for 0.4 s. Bar: at most 1.1 × \
         burst.\n\n\
         | try | requests | admitted | per Envoy | admitted / burst | burst + rate × elapsed |\n\
         |---|---|---|---|---|---|"
    )?;
    for (i, (total, per_envoy, r, allowed)) in rows.iter().enumerate() {
        writeln!(
            md,
            "| {} | {} | {} | {per_envoy:?} | {r:.3} | {allowed:.1} |",
            i + 1,
            total.responses(),
            total.admitted()
        )?;
    }
    writeln!(
        md,
        "\nWorst: {worst:.3} × burst, {}.",
        verdict(worst <= 1.1)
    )?;
    note(format!("new client's burst: worst {worst:.3} × burst"));
    Ok(())
}

/// Envoy CPU per request: a global rule against the same rule with `scope: proxy`, in
/// interleaved rounds on the same three Envoys.
fn cost(fleet: &mut Fleet, timing: &Timing, md: &mut String) -> Result<()> {
    step(format!(
        "global: Envoy CPU per request, scope global against scope proxy, {} interleaved rounds",
        timing.cost_rounds
    ));
    let mut per_request = [Vec::new(), Vec::new()];
    // Requests refused and answered under each scope: the limit is never reached, so a
    // refusal is the issue #26 failure (a global limit refusing traffic far below it).
    let mut refused = [(0u64, 0u64); 2];
    for round in 0..timing.cost_rounds {
        for (i, rule) in ["cp", "cg"].iter().enumerate() {
            let before = fleet.cpu_ticks()?;
            let outcome =
                fleet_load::run(&fleet.plan(&format!("/{rule}/x"), "cost-", 1, timing.cost_round))?;
            let ticks = fleet.cpu_ticks()?.saturating_sub(before);
            refused[i].0 += outcome.total.get(429);
            refused[i].1 += outcome.total.responses();
            let answered = outcome.total.responses().max(1);
            // Clock ticks are 10 ms: microseconds of CPU per request.
            per_request[i].push(ticks as f64 * 10_000.0 / answered as f64);
            note(format!(
                "round {}: {rule} {:.1} µs CPU per request over {answered} requests",
                round + 1,
                per_request[i].last().copied().unwrap_or(0.0)
            ));
        }
    }
    fleet.check_running()?;
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let [mut proxy, mut global] = per_request;
    let (p, g) = (median(&mut proxy), median(&mut global));
    let difference = (g / p - 1.0) * 100.0;
    writeln!(
        md,
        "\n## Envoy CPU per request: `scope: global` against `scope: proxy`\n\n\
         The same never-reached limit ({UNREACHED}/s) with either scope, one client, \
         {} interleaved rounds of {} s on the same three Envoys; CPU is user + system time \
         of all three processes (every thread, the control service's syncs included) over \
         the requests answered. Bar: within 10%.\n\n\
         | scope | µs CPU per request (median) | rounds | refused of answered |\n|---|---|---|---|\n\
         | proxy | {p:.1} | {} | {} of {} |\n| global | {g:.1} | {} | {} of {} |\n\n\
         Global costs {difference:+.1}% per request, {}. Refused far below the limit \
         (issue #26's bar: at most 0.01%, as with `scope: proxy`): {}.",
        timing.cost_rounds,
        timing.cost_round.as_secs(),
        fmt_list(&proxy),
        refused[0].0,
        refused[0].1,
        fmt_list(&global),
        refused[1].0,
        refused[1].1,
        verdict(difference.abs() <= 10.0 || g <= p),
        verdict(refused[1].0 * 10_000 <= refused[1].1),
    )?;
    Ok(())
}

fn fmt_list(values: &[f64]) -> String {
    values
        .iter()
        .map(|v| format!("{v:.1}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A coordinator outage under the skewed load.
struct Fault {
    title: &'static str,
    what: &'static str,
}

impl Fault {
    fn run(
        &self,
        fleet: &mut Fleet,
        timing: &Timing,
        break_it: impl FnOnce(&mut Fleet) -> Result<()>,
        mend_it: impl FnOnce(&mut Fleet) -> Result<()>,
        md: &mut String,
    ) -> Result<()> {
        let (rate, burst) = FAULT_RATE;
        step(format!("global: {}", self.title));
        let fallback_before = fleet.sum_stat(FALLBACK_TOTAL)?;
        let plan = fleet.plan(
            "/gf/x",
            &format!("fault-{}-", fleet.sum_stat(SYNCS)?),
            1,
            timing.fault_before + timing.fault + timing.fault_after,
        );
        let load_started = Instant::now();
        let load = std::thread::spawn(move || fleet_load::run(&plan));
        std::thread::sleep(timing.fault_before);
        let broken_at = load_started.elapsed();
        break_it(fleet)?;
        std::thread::sleep(
            timing
                .fault
                .saturating_sub(load_started.elapsed() - broken_at),
        );
        mend_it(fleet)?;
        let mended_at = load_started.elapsed();
        let outcome = load
            .join()
            .map_err(|_| anyhow::anyhow!("the load thread panicked"))??;
        fleet.check_running()?;
        let fallback = fleet.sum_stat(FALLBACK_TOTAL)? - fallback_before;

        let before = outcome.between(Duration::ZERO, broken_at);
        let during = outcome.between(broken_at, mended_at);
        let after = outcome.between(mended_at, outcome.elapsed);
        let outage = mended_at - broken_at;
        let during_ratio = during.admitted() as f64 / (rate as f64 * outage.as_secs_f64());
        let total = &outcome.total;
        // One-second windows after the coordinator is back.
        let mut windows = Vec::new();
        let mut from = mended_at;
        while from + Duration::from_secs(1) <= outcome.elapsed {
            let c = outcome.between(from, from + Duration::from_secs(1));
            windows.push(c.admitted() as f64 / rate as f64);
            from += Duration::from_secs(1);
        }
        // Accuracy from two seconds after recovery to the end, as for the steady runs:
        // the refill over that time (the bucket is drained, so no burst is due).
        let settled_from = mended_at + Duration::from_secs(2);
        let settled = outcome.between(settled_from, outcome.elapsed);
        let settled_ratio = settled.admitted() as f64
            / (rate as f64 * outcome.elapsed.saturating_sub(settled_from).as_secs_f64()).max(1.0);
        let no_failures = total.errors == 0 && other(total) == 0;
        let waited = during.slowest.max(before.slowest);
        writeln!(
            md,
            "\n## {}\n\n\
             A global rule of {rate}/s (burst {burst}) under the 70/20/10 load; after {:.1} s, \
             {} for {:.1} s. Bars: no request fails or waits, admitted during the outage 0.8 to \
             1.1 of `rate × outage`, fallback counted, accurate again within 2 s of recovery.\n\n\
             | | before | outage | after |\n|---|---|---|---|\n\
             | seconds | {:.1} | {:.1} | {:.1} |\n\
             | admitted | {} | {} | {} |\n\
             | admitted / allowance | {:.3} | {during_ratio:.3} | {:.3} |\n\
             | slowest answer ms | {:.1} | {:.1} | {:.1} |\n\
             | errors / other statuses | {} / {} | {} / {} | {} / {} |\n\n\
             Answer latency over the whole run: p50 {:.2} ms, p99 {:.2} ms. \
             `sluice_global_fallback_total` rose by {fallback} across the Envoys. \
             Admitted per second after recovery, as a share of the rate: {} (one-second \
             windows move with the leases); from 2 s after recovery to the end, \
             {settled_ratio:.3} of the rate.\n\n\
             Outage admission {during_ratio:.3}: {}. No request failed or waited \
             (slowest {:.1} ms): {}. Fallback counted: {}. Accurate (0.95 to 1.05) from 2 s \
             after recovery: {}.",
            self.title,
            broken_at.as_secs_f64(),
            self.what,
            outage.as_secs_f64(),
            broken_at.as_secs_f64(),
            outage.as_secs_f64(),
            (outcome.elapsed - mended_at).as_secs_f64(),
            before.admitted(),
            during.admitted(),
            after.admitted(),
            // The bucket starts full: the first seconds hold the burst too.
            ratio(before.admitted(), rate, burst, broken_at),
            after.admitted() as f64 / (rate as f64 * (outcome.elapsed - mended_at).as_secs_f64()),
            ms(before.slowest),
            ms(during.slowest),
            ms(after.slowest),
            before.errors,
            other(&before),
            during.errors,
            other(&during),
            after.errors,
            other(&after),
            ms(outcome.percentile(0.5)),
            ms(outcome.percentile(0.99)),
            fmt_list(&windows),
            verdict((0.8..=1.1).contains(&during_ratio)),
            ms(waited),
            verdict(no_failures && waited < Duration::from_secs(1)),
            verdict(fallback > 0),
            verdict((0.95..=1.05).contains(&settled_ratio)),
        )?;
        note(format!(
            "{}: outage ratio {during_ratio:.3}, {fallback} fallback decisions, after: {} \
             ({settled_ratio:.3} from 2 s after recovery)",
            self.title,
            fmt_list(&windows)
        ));
        Ok(())
    }
}

/// Fleet 2: two replicas sharing one PostgreSQL and one Redis.
fn replicated_fleet(bench: &Bench, timing: &Timing, md: &mut String) -> Result<()> {
    step("global: three Envoys, two admin API replicas on one PostgreSQL and one Redis");
    // `cargo xtask bench` provisions the PostgreSQL server (and names Redis's binary).
    let postgres = std::env::var(POSTGRES_URL_ENV).with_context(|| {
        format!("{POSTGRES_URL_ENV} is unset: run the benchmark with `cargo xtask bench`")
    })?;
    let redis = RedisServer::try_start()?;
    let mut serve = Serve::new(bench.generator.sluice_bin.clone(), postgres);
    serve.redis = Some(redis.url());
    let first = AdminApi::start(&serve)?;
    let second = AdminApi::start(&serve)?;
    let (rate, burst) = FAULT_RATE;
    let rules = [global_rule("gf", rate, burst, "global")];
    // Envoys 0 and 2 (70% and 10% of the traffic) sync with one replica, Envoy 1 with the
    // other.
    let mut fleet = Fleet::start(
        bench,
        "global-replicas",
        vec![first, second],
        Some(redis),
        [0, 1, 0],
        &rules,
    )?;
    let before = fleet.health()?;
    let outcome = fleet_load::run(&fleet.plan("/gf/x", "replicas-", 1, timing.accuracy))?;
    let health = fleet.health_since(&before);
    let (r, cells) = one_bucket(&outcome, rate, burst);
    note(format!("two replicas: ratio {r:.4}; {health}"));
    writeln!(
        md,
        "\n## Two admin API replicas (one PostgreSQL, one Redis)\n\n\
         Two `sluice serve --database postgres://… --redis redis://…` replicas; Envoys 1 and \
         3 sync with the first, Envoy 2 with the second. A global rule of {rate}/s (burst \
         {burst}) for {:.2} s, offered {:.0}/s. Bar: the fleet shares the limit exactly as \
         with one admin API (0.97 to 1.01).\n\n\
         | admitted | allowed | ratio | admitted per Envoy (offered) | |\n|---|---|---|---|---|\n\
         | {cells} |\n\n\
         During the run: {health}.",
        outcome.elapsed.as_secs_f64(),
        outcome.rate(),
    )?;
    let redis_fault = Fault {
        title: "Redis killed for 10 s (two replicas)",
        what: "Redis (SIGKILL, then started again empty on the same port)",
    };
    redis_fault.run(
        &mut fleet,
        timing,
        |f| {
            if let Some(redis) = f.redis.as_mut() {
                redis.kill();
            }
            Ok(())
        },
        |f| {
            if let Some(redis) = f.redis.as_mut() {
                redis.restart();
            }
            Ok(())
        },
        md,
    )?;
    Ok(())
}

/// The coordinator alone: [`SIM_PROXIES`] simulated proxies, each sending one sync per
/// interval for the same [`SIM_BUCKETS`] buckets, against memory and Redis.
fn coordinator(bench: &Bench, timing: &Timing, md: &mut String) -> Result<()> {
    writeln!(
        md,
        "\n## The coordinator: {SIM_PROXIES} proxies × {SIM_BUCKETS} active buckets\n\n\
         {SIM_PROXIES} simulated proxies (one thread each, in the benchmark's process), each \
         sending one `POST {SYNC_PATH}` per sync interval, started evenly over the interval, \
         every sync reporting the same {SIM_BUCKETS} buckets (100/s, burst 100, a few \
         attempts each; 1.3 MB of JSON) for {} s, at the default interval ({} ms) and at \
         twice it. Bar: answers p99 below half the interval, at the default; Redis commands \
         per second reported. Each replica settles the syncs that arrive together as one \
         batch: each hash-tag group of buckets read with one `MGET` and written with one \
         compare-and-set script call (`2 × groups touched + syncs + 5` commands, at most \
         256 groups), so commands per sync fall as syncs overlap.\n\n\
         | coordinator | interval ms | syncs | non-200 | p50 ms | p99 ms | max ms | syncs/s | Redis commands/s | Redis commands per sync | |\n\
         |---|---|---|---|---|---|---|---|---|---|---|",
        timing.coordinator.as_secs(),
        SYNC_INTERVAL.as_millis(),
    )?;
    let runs = [SYNC_INTERVAL, SYNC_INTERVAL * 2]
        .into_iter()
        .flat_map(|interval| [(interval, false), (interval, true)]);
    let mut redis_bytes = None;
    for (interval, with_redis) in runs {
        let label = if with_redis { "Redis" } else { "in memory" };
        step(format!(
            "global: coordinator {label}, {SIM_PROXIES} proxies × {SIM_BUCKETS} buckets"
        ));
        let redis = if with_redis {
            Some(RedisServer::try_start()?)
        } else {
            None
        };
        // A database per run: each run creates its rule afresh.
        let mut serve = sqlite(
            bench,
            &format!(
                "coordinator-{}ms-{}",
                interval.as_millis(),
                if with_redis { "redis" } else { "memory" }
            ),
        );
        serve.redis = redis.as_ref().map(RedisServer::url);
        let memory_before = redis
            .as_ref()
            .map(|r| r.info_field("memory", "used_memory"))
            .transpose()?;
        let admin = AdminApi::start(&serve)?;
        // The coordinator takes only limits a global rule produces: the simulated
        // buckets' 100/s with a burst of 100.
        admin.create_rule(&global_rule("sim", 100, 100, "global"))?;
        let commands_before = admin.metric(REDIS_COMMANDS)?;
        let run = simulate_proxies(&admin, timing.coordinator, interval)?;
        let commands = admin.metric(REDIS_COMMANDS)? - commands_before;
        let seconds = run.elapsed.as_secs_f64();
        let half = interval.as_secs_f64() * 1e3 / 2.0;
        writeln!(
            md,
            "| {label} | {} | {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {} | {} | {} |",
            interval.as_millis(),
            run.latencies_ms.len(),
            run.failures,
            run.quantile(0.5),
            run.quantile(0.99),
            run.quantile(1.0),
            run.latencies_ms.len() as f64 / seconds,
            if with_redis {
                format!("{:.0}", commands / seconds)
            } else {
                "–".into()
            },
            if with_redis {
                format!("{:.0}", commands / run.latencies_ms.len().max(1) as f64)
            } else {
                "–".into()
            },
            if interval == SYNC_INTERVAL {
                verdict(run.quantile(0.99) < half && run.failures == 0)
            } else if run.quantile(0.99) < half && run.failures == 0 {
                "below half its interval"
            } else {
                "above half its interval"
            },
        )?;
        note(format!(
            "coordinator {label}, every {} ms: p99 {:.1} ms over {} syncs",
            interval.as_millis(),
            run.quantile(0.99),
            run.latencies_ms.len()
        ));
        if let (Some(redis), Some(before)) = (&redis, memory_before) {
            redis_bytes = Some(
                redis
                    .info_field::<u64>("memory", "used_memory")?
                    .saturating_sub(before)
                    / SIM_BUCKETS,
            );
        }
        drop(admin);
        drop(redis);
    }
    if let Some(bytes) = redis_bytes {
        writeln!(
            md,
            "\nRedis memory: {bytes} bytes per active bucket (`used_memory` after the last Redis \
             run less before it, over its {SIM_BUCKETS} buckets)."
        )?;
        note(format!("Redis: {bytes} bytes per active bucket"));
    }
    Ok(())
}

struct SimRun {
    latencies_ms: Vec<f64>,
    failures: u64,
    elapsed: Duration,
}

impl SimRun {
    fn quantile(&self, q: f64) -> f64 {
        self.latencies_ms
            .get(((self.latencies_ms.len().saturating_sub(1)) as f64 * q).round() as usize)
            .copied()
            .unwrap_or(0.0)
    }
}

/// Each simulated proxy is a thread with its own connection per sync, sending on its own
/// schedule (a late answer delays only that proxy's next sync, as in the control service).
fn simulate_proxies(admin: &AdminApi, duration: Duration, interval: Duration) -> Result<SimRun> {
    let addr: SocketAddr = admin
        .url()
        .trim_start_matches("http://")
        .parse()
        .context("admin address")?;
    let started = Instant::now();
    let results = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..SIM_PROXIES)
            .map(|p| {
                scope.spawn(move || -> Result<(Vec<f64>, u64)> {
                    // Built before the clock starts: the generator shares the cores with
                    // the server, and building 1.3 MB of JSON per sync would be measured.
                    let bodies = [
                        String::from_utf8(sync_request(p, 0, interval).to_json())?,
                        String::from_utf8(sync_request(p, 1, interval).to_json())?,
                    ];
                    let offset = interval * p as u32 / SIM_PROXIES as u32;
                    std::thread::sleep(offset);
                    let mut latencies = Vec::new();
                    let mut failures = 0;
                    let mut round = 0u64;
                    let bearer = format!("Bearer {ADMIN_TOKEN}");
                    while started.elapsed() < duration {
                        let due = started + offset + interval * round as u32;
                        if let Some(wait) = due.checked_duration_since(Instant::now()) {
                            std::thread::sleep(wait);
                        }
                        round += 1;
                        let body = &bodies[(round % 2) as usize];
                        let sent = Instant::now();
                        let status = sluice_harness::http::http_request(
                            addr,
                            "POST",
                            SYNC_PATH,
                            &[
                                ("Authorization", bearer.as_str()),
                                ("Content-Type", "application/json"),
                            ],
                            body,
                        )
                        .map(|(status, _)| status);
                        latencies.push(sent.elapsed().as_secs_f64() * 1e3);
                        if !matches!(status, Ok(200)) {
                            failures += 1;
                        }
                    }
                    Ok((latencies, failures))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| anyhow::anyhow!("a simulated proxy panicked"))?
            })
            .collect::<Result<Vec<_>>>()
    })?;
    let elapsed = started.elapsed();
    let mut latencies_ms = Vec::new();
    let mut failures = 0;
    for (l, f) in results {
        latencies_ms.extend(l);
        failures += f;
    }
    if latencies_ms.is_empty() {
        bail!("the simulated proxies sent nothing");
    }
    latencies_ms.sort_by(f64::total_cmp);
    Ok(SimRun {
        latencies_ms,
        failures,
        elapsed,
    })
}

/// What simulated proxy `proxy` reports in its `round`th sync: every bucket, a few
/// attempts each, varying so the coordinator has real settling to do.
fn sync_request(proxy: usize, round: u64, sync_interval: Duration) -> SyncRequest {
    let interval_ns = 10_000_000; // 100/s
    SyncRequest {
        proxy: format!("sim-{proxy:02}"),
        interval_ms: sync_interval.as_millis() as u64,
        covers_ms: sync_interval.as_millis() as u64,
        // No sequence, as a proxy from before sequences: runs against one server reuse
        // the simulated proxies' ids, and a sequence restarting at 1 would be refused.
        seq: 0,
        next_sync_ms: 0,
        buckets: (0..SIM_BUCKETS)
            .map(|b| {
                let attempts = (b + round + proxy as u64) % 5;
                let usage = Usage {
                    attempts,
                    unleased: 0,
                    returned: 0,
                    want: attempts,
                    first_use_ns: 0,
                    known_full_in_ns: 0,
                };
                // Spread ids over the whole range, as hashes are.
                let bucket = (b + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                BucketUsage::new(bucket, interval_ns, 100, &usage)
            })
            .collect(),
    }
}
