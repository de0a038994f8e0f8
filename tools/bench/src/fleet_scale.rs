//! Fleet-wide limits at mesh scale (`cargo xtask bench --only fleet-scale`, issue #33):
//! a load generator that speaks the sync protocol for many proxies at once (not Envoys),
//! against real `sluice serve` processes: one coordinating in memory, then two replicas
//! on one PostgreSQL and one Redis, then the same two on a Redis Cluster of three masters
//! (each with a replica) on the same machine.
//!
//! Every simulated proxy sends one `POST /api/v1/quota/sync` per sync interval (the
//! default), the proxies' clocks spread over the interval, each reporting the few hot
//! buckets every proxy sees and its part of a long tail, each tail bucket seen by three
//! proxies and used at each in one interval of [`TAIL_ACTIVE_EVERY`] (a sparse client:
//! a proxy reports only buckets with something to say): [`BUCKETS`] buckets in all,
//! whatever the fleet's size. The fleet grows through
//! [`FLEETS`]; the report gives each size's answer times, the CPU per sync of the admin
//! API, of Redis and of the load generator, how many of the machine's cores the three kept
//! busy (they share it: a fleet whose answers wait for a core says so), Redis's commands
//! and bytes per second, and states the largest fleet whose answers' p99 stayed under
//! half the interval (the bar) with none refused.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use sluice_core::global::DEFAULT_SYNC_INTERVAL_NS;
use sluice_core::global::coordinator::Usage;
use sluice_core::global::sync::{BucketUsage, SYNC_PATH, SyncRequest};
use sluice_harness::cmd::{note, step};
use sluice_harness::load::{Bytes, Load, Outcome, Req};
use sluice_harness::serve::{ADMIN_TOKEN, AdminApi, Serve};
use sluice_harness::{CommandStat, CommandStats, POSTGRES_URL_ENV, RedisCluster, RedisServer};

use crate::global::global_rule;
use crate::setup::Bench;

/// The fleet sizes measured, smallest first.
const FLEETS: [usize; 4] = [100, 250, 500, 1_000];
/// Buckets the whole fleet reports.
const BUCKETS: u64 = 100_000;
/// Buckets every proxy reports (the busiest clients, reaching every proxy).
const HOT: u64 = 100;
/// How many proxies report each of the other buckets (a client reaching a few pods).
const TAIL_SEEN_BY: usize = 3;
/// A tail bucket is used at each of its proxies in one sync interval of this many.
const TAIL_ACTIVE_EVERY: u64 = 10;
/// The one global limit every bucket enforces.
const RATE: u64 = 100;
const BURST: u64 = 100;
const INTERVAL: Duration = Duration::from_nanos(DEFAULT_SYNC_INTERVAL_NS);
/// A sync not answered within this is counted as refused (the control service gives up
/// after two intervals, at least 500 ms).
const ANSWER_LIMIT: Duration = Duration::from_secs(2);
/// Connections the admin API may hold: one per simulated proxy, with room to spare
/// (`--max-connections` defaults to 768).
const MAX_CONNECTIONS: usize = 4_096;

/// What one fleet size measured.
struct Point {
    proxies: usize,
    buckets_per_sync: f64,
    body_kib: f64,
    outcome: Outcome,
    /// The admin API processes' CPU over the run, in seconds.
    cpu_s: f64,
    /// The load generator's (this process's) CPU over the run, in seconds.
    generator_cpu_s: f64,
    redis: Option<RedisRates>,
}

struct RedisRates {
    commands_per_s: f64,
    bytes_in_per_s: f64,
    bytes_out_per_s: f64,
    /// Redis's own CPU over the run (every node of a cluster), in seconds.
    cpu_s: f64,
    /// What Redis ran over the run, by command (every node of a cluster).
    commands: CommandStats,
}

impl Point {
    fn syncs(&self) -> u64 {
        self.outcome.total.responses() + self.outcome.total.errors
    }

    fn refused(&self) -> u64 {
        self.syncs() - self.outcome.total.get(200)
    }

    fn p99_ms(&self) -> f64 {
        self.outcome.percentile(0.99).as_secs_f64() * 1e3
    }

    /// Cores the admin API, Redis and the load generator kept busy together: near the
    /// machine's cores, answers wait for a core, whatever the coordinator's design.
    fn cores_busy(&self) -> f64 {
        let redis = self.redis.as_ref().map_or(0.0, |r| r.cpu_s);
        (self.cpu_s + self.generator_cpu_s + redis) / self.outcome.elapsed.as_secs_f64()
    }

    fn sustained(&self) -> bool {
        self.refused() == 0 && self.p99_ms() < INTERVAL.as_secs_f64() * 1e3 / 2.0
    }
}

/// Runs the section and writes `<out_dir>/<name>-fleet-scale.md`, naming the command that
/// made it (`invocation`).
pub fn run(bench: &Bench, out_dir: &Path, name: &str, invocation: &str) -> Result<PathBuf> {
    let measure = if bench.settings.quick {
        Duration::from_secs(4)
    } else {
        Duration::from_secs(10)
    };
    let mut md = String::new();
    writeln!(
        md,
        "# Sluice fleet-wide limits at mesh scale\n\n\
         Produced by `{invocation}` on a shared {}-core machine \
         ({}). A load generator speaking the sync protocol stands in for the proxies (one \
         keep-alive connection each, in the benchmark's process, sharing the cores with the \
         admin API): each sends one `POST {SYNC_PATH}` every {} ms, the proxies' clocks spread \
         over the interval, reporting the {HOT} hot buckets every proxy sees and its part of \
         a tail each bucket of which {TAIL_SEEN_BY} proxies see and use in one interval of \
         {TAIL_ACTIVE_EVERY}: {BUCKETS} buckets in all, one global limit ({RATE}/s, burst \
         {BURST}). Each fleet size runs 2 s before {} s \
         measured. Bar (issue #33): answers' p99 under half the interval, none refused. \
         The admin API's CPU is its processes' user and system time over the measured \
         seconds, per sync; Redis's is its own (`INFO cpu`, every node of a cluster), the \
         generator's this benchmark's process; *cores busy* adds the three up per second, \
         against the machine's {} cores. *Redis µs per sync by command* are Redis's \
         own figures (`INFO commandstats`), the five largest; a script's (`evalsha`) include \
         the commands it calls, which are also listed under their names. On a cluster they \
         add up every node's, replicas replaying their masters' writes included, and a \
         command's time includes any wait for a core while it ran.\n",
        bench.machine.cores,
        bench.machine.cpu_model,
        INTERVAL.as_millis(),
        measure.as_secs(),
        bench.machine.cores,
    )?;
    let mut failures = Vec::new();
    for backend in [Backend::Memory, Backend::Replicas, Backend::Cluster] {
        if let Err(err) = backend.measure(bench, measure, &mut md) {
            note(format!("fleet scale, {}: {err:#}", backend.title()));
            writeln!(md, "\n**{} failed:** {err:#}\n", backend.title())?;
            failures.push(backend.title());
        }
    }
    let path = out_dir.join(format!("{name}-fleet-scale.md"));
    std::fs::write(&path, &md).with_context(|| format!("writing {}", path.display()))?;
    note(format!(
        "fleet-wide limits at mesh scale: {}",
        path.display()
    ));
    if !failures.is_empty() {
        bail!("parts failed: {}", failures.join(", "));
    }
    Ok(path)
}

#[derive(Debug, Clone, Copy)]
enum Backend {
    /// One `sluice serve` on SQLite, buckets in memory.
    Memory,
    /// Two replicas on one PostgreSQL and one Redis, each taking half the proxies.
    Replicas,
    /// The same two replicas on a Redis Cluster (`redis+cluster://`).
    Cluster,
}

/// The Redis a point runs on.
enum BenchRedis {
    Server(RedisServer),
    Cluster(RedisCluster),
}

impl BenchRedis {
    fn url(&self) -> String {
        match self {
            BenchRedis::Server(server) => server.url(),
            BenchRedis::Cluster(cluster) => cluster.url(),
        }
    }

    /// Redis's CPU so far, user and system, in seconds (a cluster's: every live node's).
    fn cpu_s(&self) -> Result<f64> {
        let field = |field: &str| match self {
            BenchRedis::Server(server) => server.info_field::<f64>("cpu", field),
            BenchRedis::Cluster(cluster) => cluster.nodes_info_field("cpu", field),
        };
        Ok(field("used_cpu_user")? + field("used_cpu_sys")?)
    }

    /// What Redis ran so far, by command (a cluster's: every live node's).
    fn command_stats(&self) -> Result<CommandStats> {
        match self {
            BenchRedis::Server(server) => server.command_stats(),
            BenchRedis::Cluster(cluster) => cluster.nodes_command_stats(),
        }
    }

    /// Redis's network bytes in and out so far (a cluster's: its masters', summed).
    fn counters(&self) -> Result<(u64, u64)> {
        let field = |field: &str| match self {
            BenchRedis::Server(server) => server.info_field("stats", field),
            BenchRedis::Cluster(cluster) => cluster.masters_info_field("stats", field),
        };
        Ok((
            field("total_net_input_bytes")?,
            field("total_net_output_bytes")?,
        ))
    }
}

impl Backend {
    fn title(self) -> &'static str {
        match self {
            Backend::Memory => "One admin API, buckets in memory",
            Backend::Replicas => "Two admin API replicas on one Redis",
            Backend::Cluster => "Two admin API replicas on a Redis Cluster of three masters",
        }
    }

    /// A name for the backend in rule names.
    fn slug(self) -> &'static str {
        match self {
            Backend::Memory => "memory",
            Backend::Replicas => "redis",
            Backend::Cluster => "cluster",
        }
    }

    fn measure(self, bench: &Bench, measure: Duration, md: &mut String) -> Result<()> {
        writeln!(
            md,
            "\n## {}\n\n\
             | proxies | buckets per sync | body KiB | syncs | refused | p50 ms | p99 ms | max ms | syncs/s | admin CPU ms per sync | Redis CPU ms per sync | generator CPU ms per sync | cores busy | Redis commands/s | Redis MB/s in / out | Redis µs per sync by command | |\n\
             |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
            self.title()
        )?;
        let mut largest = None;
        for proxies in FLEETS {
            step(format!("fleet scale: {}, {proxies} proxies", self.title()));
            let point = self.point(bench, proxies, measure)?;
            let row = row(&point);
            note(format!(
                "{}: {proxies} proxies, p99 {:.1} ms, {} refused of {}",
                self.title(),
                point.p99_ms(),
                point.refused(),
                point.syncs()
            ));
            writeln!(md, "{row}")?;
            if !point.sustained() {
                break;
            }
            largest = Some(proxies);
        }
        match largest {
            Some(proxies) => writeln!(
                md,
                "\nThe largest fleet measured that meets the bar here: **{proxies} proxies** \
                 at the default interval ({} ms).",
                INTERVAL.as_millis()
            )?,
            None => writeln!(
                md,
                "\nNo fleet measured meets the bar here: even {} proxies' answers took \
                 longer than half the interval at p99.",
                FLEETS[0]
            )?,
        }
        Ok(())
    }

    /// Starts this backend afresh, runs `proxies` simulated proxies, and stops it.
    fn point(self, bench: &Bench, proxies: usize, measure: Duration) -> Result<Point> {
        let redis = match self {
            Backend::Memory => None,
            Backend::Replicas => Some(BenchRedis::Server(RedisServer::try_start()?)),
            Backend::Cluster => Some(BenchRedis::Cluster(RedisCluster::try_start()?)),
        };
        let mut serve = match self {
            Backend::Memory => Serve::new(
                bench.generator.sluice_bin.clone(),
                format!(
                    "sqlite://{}/fleet-scale-{proxies}.db",
                    bench.run_dir.display()
                ),
            ),
            Backend::Replicas | Backend::Cluster => Serve::new(
                bench.generator.sluice_bin.clone(),
                std::env::var(POSTGRES_URL_ENV).with_context(|| {
                    format!(
                        "{POSTGRES_URL_ENV} is unset: run the benchmark with `cargo xtask bench`"
                    )
                })?,
            ),
        };
        serve.redis = redis.as_ref().map(BenchRedis::url);
        serve.flags = vec!["--max-connections".into(), MAX_CONNECTIONS.to_string()];
        let replicas: Vec<AdminApi> = match self {
            Backend::Memory => vec![AdminApi::start(&serve)?],
            Backend::Replicas | Backend::Cluster => {
                vec![AdminApi::start(&serve)?, AdminApi::start(&serve)?]
            }
        };
        // The coordinator takes only limits a global rule produces. PostgreSQL's database
        // outlives one point, so each point's rule has its own name (the same limit).
        let rule = global_rule(
            &format!("fleet-scale-{proxies}-{}", self.slug()),
            RATE,
            BURST,
            "global",
        );
        replicas[0].create_rule(&rule)?;

        let bodies = bodies(proxies);
        let buckets_per_sync = HOT as f64
            + (BUCKETS - HOT) as f64 * TAIL_SEEN_BY as f64
                / proxies as f64
                / TAIL_ACTIVE_EVERY as f64;
        let body_kib =
            bodies.iter().map(Bytes::len).sum::<usize>() as f64 / bodies.len() as f64 / 1024.0;
        let targets: Vec<_> = split(proxies, replicas.len())
            .into_iter()
            .zip(&replicas)
            .map(|(connections, admin)| (admin.addr(), connections))
            .collect();

        // Warm up (the coordinator grants nothing for its first lease TTL, and the first
        // syncs create every bucket), then measure.
        drive(&targets, &bodies, proxies, Duration::from_secs(2))?;
        let cpu_before = cpu_ticks(&replicas)?;
        let generator_before = generator_cpu_ticks()?;
        let redis_before = redis
            .as_ref()
            .map(|r| Ok::<_, anyhow::Error>((r.counters()?, r.cpu_s()?, r.command_stats()?)))
            .transpose()?;
        let commands_before = redis_commands(&replicas)?;
        let outcome = drive(&targets, &bodies, proxies, measure)?;
        let cpu_s = cpu_ticks(&replicas)?.saturating_sub(cpu_before) as f64 / 100.0;
        let generator_cpu_s =
            generator_cpu_ticks()?.saturating_sub(generator_before) as f64 / 100.0;
        let seconds = outcome.elapsed.as_secs_f64();
        let redis = match (&redis, redis_before) {
            (Some(server), Some((bytes_before, cpu_before, commands_before_run))) => {
                let after = server.counters()?;
                Some(RedisRates {
                    commands_per_s: (redis_commands(&replicas)? - commands_before) / seconds,
                    bytes_in_per_s: after.0.saturating_sub(bytes_before.0) as f64 / seconds,
                    bytes_out_per_s: after.1.saturating_sub(bytes_before.1) as f64 / seconds,
                    cpu_s: server.cpu_s()? - cpu_before,
                    commands: server.command_stats()?.since(&commands_before_run),
                })
            }
            _ => None,
        };
        Ok(Point {
            proxies,
            buckets_per_sync,
            body_kib,
            outcome,
            cpu_s,
            generator_cpu_s,
            redis,
        })
    }
}

/// One table row.
fn row(point: &Point) -> String {
    let syncs = point.syncs().max(1);
    let seconds = point.outcome.elapsed.as_secs_f64();
    let per_sync_ms = |cpu_s: f64| cpu_s * 1e3 / syncs as f64;
    let (redis_cpu, commands, bytes, by_command) = match &point.redis {
        Some(r) => (
            format!("{:.2}", per_sync_ms(r.cpu_s)),
            format!("{:.0}", r.commands_per_s),
            format!(
                "{:.1} / {:.1}",
                r.bytes_in_per_s / 1e6,
                r.bytes_out_per_s / 1e6
            ),
            by_command(&r.commands, syncs),
        ),
        None => ("–".into(), "–".into(), "–".into(), "–".into()),
    };
    format!(
        "| {} | {:.0} | {:.1} | {} | {} | {:.1} | {:.1} | {:.1} | {:.0} | {:.2} | {redis_cpu} | {:.2} | {:.2} | {commands} | {bytes} | {by_command} | {} |",
        point.proxies,
        point.buckets_per_sync,
        point.body_kib,
        point.syncs(),
        point.refused(),
        point.outcome.percentile(0.5).as_secs_f64() * 1e3,
        point.p99_ms(),
        point.outcome.total.slowest.as_secs_f64() * 1e3,
        point.syncs() as f64 / seconds,
        per_sync_ms(point.cpu_s),
        per_sync_ms(point.generator_cpu_s),
        point.cores_busy(),
        if point.sustained() {
            "meets the bar"
        } else {
            "misses the bar"
        },
    )
}

/// The commands that took most of Redis's time, in µs per sync. A script's own entry
/// (`evalsha`) includes the commands it calls, which are listed under their own names too.
fn by_command(stats: &CommandStats, syncs: u64) -> String {
    let mut commands: Vec<(&String, &CommandStat)> = stats.0.iter().collect();
    commands.sort_by_key(|(_, stat)| std::cmp::Reverse(stat.usec));
    commands
        .iter()
        .take(5)
        .map(|(name, stat)| format!("{name} {:.0}", stat.usec as f64 / syncs as f64))
        .collect::<Vec<_>>()
        .join(" · ")
}

/// `proxies` connections split as evenly as possible over `replicas` admin APIs.
fn split(proxies: usize, replicas: usize) -> Vec<usize> {
    (0..replicas)
        .map(|r| proxies / replicas + usize::from(r < proxies % replicas))
        .collect()
}

/// Every simulated proxy's sync, paced one per interval per connection: request `n` is
/// proxy `n mod proxies`' sync (which connection sends it does not matter to the
/// coordinator, which knows a proxy by the id in the body), its rounds of usage in turn.
fn drive(
    targets: &[(std::net::SocketAddr, usize)],
    bodies: &[Bytes],
    proxies: usize,
    duration: Duration,
) -> Result<Outcome> {
    let bodies = bodies.to_vec();
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    Load::new(targets.iter().copied())
        .paced(INTERVAL, 1)
        .for_duration(duration)
        .answer_limit(ANSWER_LIMIT)
        .keep_latencies()
        .threads(2)
        .run(move |n| {
            let proxy = n as usize % proxies;
            let round = (n as usize / proxies) % TAIL_ACTIVE_EVERY as usize;
            Req::post(SYNC_PATH, bodies[round * proxies + proxy].clone())
                .header("authorization", bearer.clone())
                .header("content-type", "application/json")
        })
}

/// [`TAIL_ACTIVE_EVERY`] rounds of every proxy's sync body (round-major), built before
/// anything is timed.
fn bodies(proxies: usize) -> Vec<Bytes> {
    (0..TAIL_ACTIVE_EVERY)
        .flat_map(|round| (0..proxies).map(move |p| Bytes::from(sync(p, proxies, round).to_json())))
        .collect()
}

/// What simulated proxy `proxy` of `proxies` reports in `round`: the hot buckets with
/// many attempts, and the tail buckets it sees (bucket `t` is seen by proxies `t mod
/// proxies` and the next [`TAIL_SEEN_BY`] − 1) that are used in this round, with a few.
fn sync(proxy: usize, proxies: usize, round: u64) -> SyncRequest {
    let interval_ns = 1_000_000_000 / RATE;
    let usage = |attempts: u64| Usage {
        attempts,
        unleased: 0,
        returned: 0,
        want: attempts,
        first_use_ns: 0,
        known_full_in_ns: 0,
    };
    // Spread ids over the whole range, as hashes are.
    let id = |b: u64| (b + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let hot = (0..HOT).map(|b| BucketUsage::new(id(b), interval_ns, BURST, &usage(20 + round)));
    let tail = (HOT..BUCKETS)
        .filter(|t| {
            let first = (*t as usize) % proxies;
            (proxy + proxies - first) % proxies < TAIL_SEEN_BY
                && (t / proxies as u64 + round) % TAIL_ACTIVE_EVERY == 0
        })
        .map(|t| BucketUsage::new(id(t), interval_ns, BURST, &usage(1 + (t + round) % 3)));
    SyncRequest {
        proxy: format!("mesh-{proxy:04}"),
        interval_ms: INTERVAL.as_millis() as u64,
        covers_ms: INTERVAL.as_millis() as u64,
        // No sequence, as a proxy from before sequences: every point reuses the ids, and
        // the replicas' PostgreSQL outlives a point.
        seq: 0,
        next_sync_ms: 0,
        buckets: hot.chain(tail).collect(),
    }
}

fn cpu_ticks(replicas: &[AdminApi]) -> Result<u64> {
    replicas.iter().map(AdminApi::cpu_ticks).sum()
}

/// This process's CPU ticks: the load generator's threads, and nothing else of note while
/// it drives.
fn generator_cpu_ticks() -> Result<u64> {
    sluice_harness::envoy::cpu_ticks(std::process::id())
}

/// Redis commands the replicas sent, by their own count.
fn redis_commands(replicas: &[AdminApi]) -> Result<f64> {
    replicas
        .iter()
        .map(|a| a.metric("sluice_quota_redis_commands_total"))
        .sum()
}
