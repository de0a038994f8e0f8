//! Memory: Envoy's RSS while very many distinct clients pass, and what one tracked client
//! costs in the slot table.
//!
//! Two Envoys, both with the same slot table:
//! * **fill**: a limit of 10 per hour, so every client stays "active" (below full capacity)
//!   for the whole phase and no slot is reclaimed. Sending F distinct clients (F = half the
//!   table, so that almost none has to share) creates about F slot keys; the RSS growth
//!   divided by that count is the cost of one tracked client. This table is larger than the
//!   churn's ([`FILL_SLOTS`]) so that the growth stands well above RSS noise.
//! * **churn**: a limit of 10 per second and a stream of clients that never repeat, in
//!   segments with RSS checkpoints, up to 1,000,000 clients (fewer in quick mode).

use std::time::{Duration, Instant};

use anyhow::Result;
use serde_json::{Value, json};
use sluice_harness::cmd::{note, step};
use sluice_harness::envoy::EnvoyProcess;

use crate::configs::FilterChain;
use crate::setup::Bench;
use crate::wrk::{Clients, Load, Measured};

const MIB: f64 = 1024.0 * 1024.0;
/// Envoy workers in the memory runs.
const WORKERS: u32 = 2;
/// Load-generator threads and connections in the memory runs.
const THREADS: u32 = 1;
const CONNECTIONS: u32 = 32;
/// Slots of the fill run's table; it is filled to half.
pub const FILL_SLOTS: u32 = 262_144;

#[derive(Debug, Clone)]
pub struct Fill {
    pub clients: u64,
    pub requests: u64,
    pub shared: u64,
    pub rss_before: u64,
    pub rss_after: u64,
}

impl Fill {
    /// Slot keys the fill created: every client that did not have to share made one. A
    /// client that shared did so on each of its passes, so shares are scaled to clients.
    pub fn slots_used(&self) -> f64 {
        let passes = self.requests as f64 / self.clients.max(1) as f64;
        (self.clients as f64 - self.shared as f64 / passes.max(1.0)).max(1.0)
    }

    pub fn bytes_per_client(&self) -> f64 {
        (self.rss_after as f64 - self.rss_before as f64) / self.slots_used()
    }
}

#[derive(Debug, Clone, Copy)]
pub struct Checkpoint {
    pub clients: u64,
    pub rss: u64,
    pub seconds: f64,
}

#[derive(Debug, Clone)]
pub struct MemoryResults {
    pub slots: u32,
    pub fill_slots: u32,
    pub fill: Fill,
    pub target_clients: u64,
    pub checkpoints: Vec<Checkpoint>,
    pub counters: Vec<(String, u64)>,
    pub commands: Vec<String>,
}

impl MemoryResults {
    pub fn clients(&self) -> u64 {
        self.checkpoints.last().map_or(0, |c| c.clients)
    }

    pub fn rss_start(&self) -> u64 {
        self.checkpoints.first().map_or(0, |c| c.rss)
    }

    pub fn rss_end(&self) -> u64 {
        self.checkpoints.last().map_or(0, |c| c.rss)
    }

    /// RSS growth over the second half of the clients: what "flat" is judged on once the
    /// table has filled.
    pub fn second_half_growth(&self) -> i64 {
        let half = self.clients() / 2;
        let mid = self
            .checkpoints
            .iter()
            .find(|c| c.clients >= half)
            .map_or(0, |c| c.rss);
        self.rss_end() as i64 - mid as i64
    }

    pub fn to_json(&self) -> Value {
        json!({
            "slots": self.slots,
            "fill": {
                "slots": self.fill_slots,
                "clients": self.fill.clients,
                "requests": self.fill.requests,
                "slot_shared": self.fill.shared,
                "slots_used_estimate": self.fill.slots_used(),
                "rss_before_bytes": self.fill.rss_before,
                "rss_after_bytes": self.fill.rss_after,
                "bytes_per_tracked_client": self.fill.bytes_per_client(),
            },
            "churn": {
                "target_clients": self.target_clients,
                "clients": self.clients(),
                "rss_start_bytes": self.rss_start(),
                "rss_end_bytes": self.rss_end(),
                "second_half_growth_bytes": self.second_half_growth(),
                "checkpoints": self.checkpoints.iter().map(|c| json!({
                    "clients": c.clients, "rss_bytes": c.rss, "seconds": c.seconds
                })).collect::<Vec<_>>(),
                "counters": self.counters.iter().map(|(k, v)| (k.clone(), json!(v))).collect::<serde_json::Map<_, _>>(),
            },
        })
    }
}

fn run_wrk(bench: &Bench, url: &str, duration: Duration, clients: Clients<'_>) -> Result<Measured> {
    bench.wrk.run(&Load {
        url,
        threads: THREADS,
        connections: CONNECTIONS,
        duration,
        cpus: None,
        clients,
    })
}

fn rule(name: &str, requests: u64, period: &str) -> Value {
    json!([{
        "name": name, "key": {"header": "x-api-key"},
        "limits": [{"requests": requests, "period": period}],
    }])
}

/// RSS after a moment's rest, so freed buffers are returned and counted consistently.
fn settled_rss(envoy: &EnvoyProcess) -> Result<u64> {
    std::thread::sleep(Duration::from_secs(1));
    envoy.rss_bytes()
}

pub fn run(bench: &Bench) -> Result<MemoryResults> {
    let settings = &bench.settings;
    let slots = settings.slots;
    let mut commands = Vec::new();
    // An Envoy with `rules` and `slots`, warmed up by one client for 2 s.
    let start = |name: &str, rules: &Value, slots: u32, commands: &mut Vec<String>| {
        let bootstrap = bench
            .generator
            .write(name, rules, slots, WORKERS, FilterChain::Sluice)?;
        let envoy = bench.start_envoy(&bootstrap.path, WORKERS, None, &bench.run_dir, name)?;
        commands.push(bootstrap.command);
        commands.push(envoy.command().to_string());
        run_wrk(
            bench,
            &envoy.url("/"),
            Duration::from_secs(2),
            Clients::One("warm-up"),
        )?;
        Ok::<EnvoyProcess, anyhow::Error>(envoy)
    };
    // Phase 1: bytes per tracked client.
    let fill_clients = u64::from(FILL_SLOTS / 2);
    step(format!(
        "memory, slot fill: {fill_clients} distinct active clients into a {FILL_SLOTS}-slot table"
    ));
    let envoy = start(
        "memory-fill",
        &rule("fill", 10, "hour"),
        FILL_SLOTS,
        &mut commands,
    )?;
    let rss_before = settled_rss(&envoy)?;
    let shared_before = envoy.counter("wasmcustom.sluice_slot_shared_total")?;
    let requests_before = envoy.counter("wasmcustom.sluice_requests_total")?;
    // Long enough to send every client at least once at a modest 10,000 requests/s, and
    // short enough that none sends more than its 10 requests at this machine's ~50,000.
    let duration = Duration::from_secs(fill_clients / 10_000 + 1);
    let fill_run = run_wrk(
        bench,
        &envoy.url("/"),
        duration,
        Clients::Cycle(fill_clients, "fill-"),
    )?;
    envoy.check_running()?;
    let rss_after = settled_rss(&envoy)?;
    let requests = envoy
        .counter("wasmcustom.sluice_requests_total")?
        .saturating_sub(requests_before);
    if requests < fill_clients {
        note(format!(
            "warning: only {requests} requests in {:.1} s; not every fill client was sent",
            fill_run.duration.as_secs_f64()
        ));
    }
    let fill = Fill {
        clients: fill_clients.min(requests),
        requests,
        shared: envoy
            .counter("wasmcustom.sluice_slot_shared_total")?
            .saturating_sub(shared_before),
        rss_before,
        rss_after,
    };
    note(format!(
        "RSS {:.1} MiB -> {:.1} MiB over ~{:.0} slots: {:.0} bytes per tracked client",
        fill.rss_before as f64 / MIB,
        fill.rss_after as f64 / MIB,
        fill.slots_used(),
        fill.bytes_per_client()
    ));
    drop(envoy);

    // Phase 2: RSS while a stream of new clients passes.
    let target = settings.memory_clients;
    step(format!(
        "memory, churn: {target} distinct clients through a {slots}-slot table, RSS every {} s",
        settings.memory_segment.as_secs()
    ));
    let envoy = start(
        "memory-churn",
        &rule("churn", 10, "second"),
        slots,
        &mut commands,
    )?;
    let base = envoy.counter("wasmcustom.sluice_requests_total")?;
    let began = Instant::now();
    let mut checkpoints = vec![Checkpoint {
        clients: 0,
        rss: settled_rss(&envoy)?,
        seconds: 0.0,
    }];
    for segment in 0..settings.memory_max_segments {
        let done = envoy
            .counter("wasmcustom.sluice_requests_total")?
            .saturating_sub(base);
        if done >= target || began.elapsed() >= settings.memory_time_limit {
            break;
        }
        let prefix = format!("m{segment}-");
        run_wrk(
            bench,
            &envoy.url("/"),
            settings.memory_segment,
            Clients::Unique(&prefix),
        )?;
        envoy.check_running()?;
        let clients = envoy
            .counter("wasmcustom.sluice_requests_total")?
            .saturating_sub(base);
        let rss = envoy.rss_bytes()?;
        note(format!(
            "{clients:>9} clients: RSS {:.1} MiB",
            rss as f64 / MIB
        ));
        checkpoints.push(Checkpoint {
            clients,
            rss,
            seconds: began.elapsed().as_secs_f64(),
        });
    }
    if let Some(last) = checkpoints.last_mut() {
        last.rss = settled_rss(&envoy)?;
    }
    let counters = envoy
        .stats_matching("^wasmcustom\\.sluice_")?
        .into_iter()
        .map(|(k, v)| (k.trim_start_matches("wasmcustom.").to_string(), v))
        .collect();
    commands.push(sluice_harness::cmd::display(&bench.wrk.command(&Load {
        url: &envoy.url("/"),
        threads: THREADS,
        connections: CONNECTIONS,
        duration: settings.memory_segment,
        cpus: None,
        clients: Clients::Unique("m0-"),
    })));
    Ok(MemoryResults {
        slots,
        fill_slots: FILL_SLOTS,
        fill,
        target_clients: target,
        checkpoints,
        counters,
        commands,
    })
}
