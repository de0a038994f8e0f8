//! Sluice as Envoy's rate limit service (issue #31): what a `ShouldRateLimit` decision
//! costs, in memory and on Redis, beside the wasm filter deciding the same traffic.
//!
//! One run, the same traffic everywhere: requests spread over [`KEYS`] API keys, each
//! under a limit far above the load (every decision is a real bucket charge, none
//! denies). Two `sluice serve --rls-listen --rls-auth token` (SQLite for the rules;
//! buckets in memory, and in a throwaway Redis; every call carries a proxy token, as
//! Envoy's do), then:
//!
//! 1. **gRPC, saturating**: a Rust client (tonic, Envoy's own protos) keeps
//!    [`IN_FLIGHT`] calls in flight over [`CHANNELS`] HTTP/2 connections for the round's
//!    duration: calls a second, p50/p99 latency, and the server's CPU per call, so calls
//!    per core-second.
//! 2. **gRPC, paced**: calls started at a stated rate (open loop, each call its own task,
//!    at most [`PACED_IN_FLIGHT`] at once): latency at that load, and the rate achieved.
//! 3. **HTTP through Envoy**: wrk against Envoy with the wasm filter (decided inside
//!    Envoy), and against Envoy with the native ratelimit filter asking each server
//!    (`sluice envoy-config --rls`), both in front of one echo upstream: requests a second
//!    and p50/p99 as the client sees them.
//!
//! A third server, with no token asked and called on a domain no rule names, gives the
//! floor: what tonic, HTTP/2 and the kernel cost a call here whatever Sluice does, so the
//! report can say how much of a call is Sluice's own decision.
//!
//! Written beside the main report as `<date>-rls.md`. Absolute figures depend on a
//! shared machine; the sections run back to back in one run, so they compare.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use serde_json::{Value, json};
use sluice_harness::RedisServer;
use sluice_harness::cmd::{note, step};
use sluice_harness::serve::{AdminApi, Serve};
use sluice_harness::upstream::EchoUpstream;
use tokio::sync::Semaphore;
use tonic::metadata::AsciiMetadataValue;
use tonic::transport::{Channel, Endpoint};

use crate::setup::Bench;
use crate::stats::quantile;
use crate::wrk::{Clients, Load, Measured};

/// Distinct API keys the traffic spreads over.
const KEYS: u64 = 1_000;
/// The descriptor domain of the bench's rule.
const DOMAIN: &str = "bench";
/// The floor server's domain: no rule names it, so a call is converted, planned over no
/// rule and answered `OK` without charging anything.
const FLOOR_DOMAIN: &str = "bench-floor";
/// HTTP/2 connections of the gRPC client.
const CHANNELS: usize = 4;
/// Calls in flight in the saturating run.
const IN_FLIGHT: usize = 32;
/// At most this many paced calls in flight (a server that falls behind is not buried).
const PACED_IN_FLIGHT: usize = 1_024;
/// Envoy's workers in the HTTP runs.
const WORKERS: u32 = 2;

/// The stated load of the paced run, calls a second.
fn paced_rate(quick: bool) -> u64 {
    if quick { 5_000 } else { 20_000 }
}

/// The rule both deciders hold: far above the load, one bucket per API key.
fn rls_rule() -> Value {
    json!({
        "name": "per-key", "key": "global",
        "limits": [{"requests": 1_000_000_000u64, "period": "second"}],
        "descriptor": {"domain": DOMAIN, "entries": [{"key": "api_key"}]}
    })
}

/// The wasm filter's rule for the same traffic.
fn filter_rules() -> Value {
    json!([{
        "name": "per-key", "key": {"header": "x-api-key"},
        "limits": [{"requests": 1_000_000_000u64, "period": "second"}]
    }])
}

/// What the gRPC client measured.
#[derive(Debug, Clone, Default)]
struct Grpc {
    calls: u64,
    errors: u64,
    over_limit: u64,
    seconds: f64,
    latencies_ms: Vec<f64>,
    /// The server's CPU milliseconds over the run.
    server_cpu_ms: f64,
}

impl Grpc {
    fn rate(&self) -> f64 {
        self.calls as f64 / self.seconds.max(1e-9)
    }

    /// Calls one core-second of the server answers.
    fn per_core(&self) -> f64 {
        self.calls as f64 / (self.server_cpu_ms / 1e3).max(1e-9)
    }
}

/// One `sluice serve` of the comparison.
struct Server {
    store: &'static str,
    /// The floor: no token checked, no rule matched, no Envoy in front.
    floor: bool,
    api: AdminApi,
    /// The proxy token every call sends (`--rls-auth token`), as Envoy's would.
    token: String,
    saturating: Vec<Grpc>,
    paced: Vec<Grpc>,
    through_envoy: Vec<Measured>,
}

/// Measures and writes `<out_dir>/<name>-rls.md`.
pub fn run(bench: &Bench, out_dir: &Path, name: &str) -> Result<PathBuf> {
    let settings = &bench.settings;
    let rate = paced_rate(settings.quick);
    step(format!(
        "rls: {} rounds of {:?}: gRPC saturating and paced at {rate}/s, HTTP through Envoy",
        settings.rounds, settings.round
    ));
    let dir = bench.run_dir.join("rls");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let redis = RedisServer::try_start()?;
    let mut servers = Vec::new();
    let floor_store = "none (the floor: no rule, no token)";
    for (store, redis_url) in [
        ("memory", None),
        ("redis", Some(redis.url())),
        (floor_store, None),
    ] {
        let floor = store == floor_store;
        let mut serve = Serve::new(
            bench.generator.sluice_bin.clone(),
            format!("sqlite://{}/rls-{store}.db", dir.display()),
        );
        serve.redis = redis_url;
        // The server on one core and the client on the other: calls per core-second are
        // the server's, and the client does not steal its time.
        serve.cpus = bench.envoy_cpus.clone();
        serve.flags = vec![
            "--rls-listen".into(),
            "127.0.0.1:0".into(),
            "--rls-auth".into(),
            if floor { "none" } else { "token" }.into(),
        ];
        let api = AdminApi::start(&serve)?;
        api.create_rule(&rls_rule())?;
        let token = api.proxy_token("bench-rls")?;
        servers.push(Server {
            store,
            floor,
            api,
            token,
            saturating: Vec::new(),
            paced: Vec::new(),
            through_envoy: Vec::new(),
        });
    }
    // The rules reach the service within a second of being stored.
    std::thread::sleep(Duration::from_secs(2));

    // Both Envoys proxy to one upstream: the native filter skips routes that answer
    // themselves.
    let upstream = EchoUpstream::start()?;
    let mut envoys = Vec::new();
    let wasm =
        bench
            .generator
            .write_proxying("rls-wasm", &filter_rules(), WORKERS, upstream.addr())?;
    let mut commands = vec![wasm.command.clone()];
    let wasm_envoy = bench.start_envoy(
        &wasm.path,
        WORKERS,
        bench.envoy_cpus.as_deref(),
        &dir,
        "rls-wasm",
    )?;
    for server in servers.iter().filter(|s| !s.floor) {
        let rls = server.api.rls().context("started with --rls-listen")?.addr;
        let native = bench.generator.write_rls(
            &format!("rls-native-{}", server.store),
            rls,
            &server.token,
            DOMAIN,
            WORKERS,
            upstream.addr(),
        )?;
        // The report is committed: the command says where the token goes, not what it is.
        commands.push(native.command.replace(&server.token, "TOKEN"));
        envoys.push(bench.start_envoy(
            &native.path,
            WORKERS,
            bench.envoy_cpus.as_deref(),
            &dir,
            &format!("rls-native-{}", server.store),
        )?);
    }
    let mut wasm_runs = Vec::new();

    let load_cpus = bench.load_cpus.clone();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .on_thread_start(move || {
            if let Some(cpus) = &load_cpus {
                crate::machine::pin_this_thread(cpus);
            }
        })
        .enable_all()
        .build()
        .context("the client's runtime")?;
    for round in 0..settings.rounds {
        note(format!("rls: round {}", round + 1));
        for server in &mut servers {
            let addr = server.api.rls().context("started with --rls-listen")?.addr;
            let domain = if server.floor { FLOOR_DOMAIN } else { DOMAIN };
            let channels = runtime.block_on(connect(addr, &server.token, domain))?;
            let ticks = server.api.cpu_ticks()?;
            let mut saturating = runtime.block_on(saturate(&channels, settings.round))?;
            saturating.server_cpu_ms = (server.api.cpu_ticks()? - ticks) as f64 * 10.0;
            server.saturating.push(saturating);
            let ticks = server.api.cpu_ticks()?;
            let mut paced = runtime.block_on(pace(&channels, rate, settings.round))?;
            paced.server_cpu_ms = (server.api.cpu_ticks()? - ticks) as f64 * 10.0;
            server.paced.push(paced);
        }
        wasm_runs.push(http(bench, &wasm_envoy.url("/"), settings.round)?);
        for (server, envoy) in servers.iter_mut().filter(|s| !s.floor).zip(&envoys) {
            server
                .through_envoy
                .push(http(bench, &envoy.url("/"), settings.round)?);
        }
    }
    let text = markdown(&servers, &wasm_runs, &commands, bench, rate);
    let path = out_dir.join(format!("{name}-rls.md"));
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    note(format!("rls: {}", path.display()));
    Ok(path)
}

/// A connection to the service, the `authorization` metadata its calls carry and the
/// domain they name.
#[derive(Clone)]
struct Caller {
    channel: Channel,
    authorization: AsciiMetadataValue,
    domain: &'static str,
}

async fn connect(
    addr: std::net::SocketAddr,
    token: &str,
    domain: &'static str,
) -> Result<Vec<Caller>> {
    let authorization: AsciiMetadataValue = format!("Bearer {token}")
        .parse()
        .context("the proxy token as metadata")?;
    let mut channels = Vec::with_capacity(CHANNELS);
    for _ in 0..CHANNELS {
        let channel = Endpoint::from_shared(format!("http://{addr}"))?
            .connect()
            .await
            .with_context(|| format!("connecting to the rate limit service at {addr}"))?;
        channels.push(Caller {
            channel,
            authorization: authorization.clone(),
            domain,
        });
    }
    Ok(channels)
}

/// The call for the `n`th request in `domain`: one descriptor, its API key one of [`KEYS`].
fn request(domain: &str, n: u64) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "api_key".into(),
                value: format!("k{}", n % KEYS),
            }],
            ..RateLimitDescriptor::default()
        }],
        hits_addend: 1,
    }
}

/// One call: its latency, or `None` when it failed; and whether it was over the limit.
async fn call(caller: Caller, n: u64) -> (Option<f64>, bool) {
    let started = Instant::now();
    let mut call = tonic::Request::new(request(caller.domain, n));
    call.metadata_mut()
        .insert("authorization", caller.authorization);
    let answer = RateLimitServiceClient::new(caller.channel)
        .should_rate_limit(call)
        .await;
    match answer {
        Ok(response) => (
            Some(started.elapsed().as_secs_f64() * 1e3),
            response.into_inner().overall_code == Code::OverLimit as i32,
        ),
        Err(_) => (None, false),
    }
}

/// Tallies calls as they finish.
#[derive(Default)]
struct Tally {
    latencies: std::sync::Mutex<Vec<f64>>,
    errors: AtomicU64,
    over_limit: AtomicU64,
}

impl Tally {
    fn add(&self, (latency, over): (Option<f64>, bool)) {
        match latency {
            Some(ms) => self
                .latencies
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(ms),
            None => {
                self.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        if over {
            self.over_limit.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn into_grpc(self, seconds: f64) -> Grpc {
        let latencies_ms = self
            .latencies
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Grpc {
            calls: latencies_ms.len() as u64,
            errors: self.errors.into_inner(),
            over_limit: self.over_limit.into_inner(),
            seconds,
            latencies_ms,
            server_cpu_ms: 0.0,
        }
    }
}

/// [`IN_FLIGHT`] callers, each calling again as soon as its answer arrives, for `duration`.
async fn saturate(channels: &[Caller], duration: Duration) -> Result<Grpc> {
    let tally = Arc::new(Tally::default());
    let started = Instant::now();
    let stop = started + duration;
    let mut tasks = Vec::new();
    for caller in 0..IN_FLIGHT {
        let (channel, tally) = (channels[caller % channels.len()].clone(), tally.clone());
        tasks.push(tokio::spawn(async move {
            let mut n = caller as u64;
            while Instant::now() < stop {
                tally.add(call(channel.clone(), n).await);
                n += IN_FLIGHT as u64;
            }
        }));
    }
    for task in tasks {
        task.await?;
    }
    let seconds = started.elapsed().as_secs_f64();
    let tally = Arc::try_unwrap(tally).map_err(|_| anyhow::anyhow!("a caller outlived the run"))?;
    Ok(tally.into_grpc(seconds))
}

/// Calls started at `rate` a second (in batches every millisecond) for `duration`, each
/// its own task; a start waits while [`PACED_IN_FLIGHT`] are unanswered.
async fn pace(channels: &[Caller], rate: u64, duration: Duration) -> Result<Grpc> {
    let tally = Arc::new(Tally::default());
    let in_flight = Arc::new(Semaphore::new(PACED_IN_FLIGHT));
    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut sent = 0u64;
    let mut tasks = Vec::new();
    while started.elapsed() < duration {
        tick.tick().await;
        let due = (started.elapsed().as_secs_f64() * rate as f64) as u64;
        while sent < due {
            let permit = in_flight.clone().acquire_owned().await?;
            let (channel, tally) = (
                channels[sent as usize % channels.len()].clone(),
                tally.clone(),
            );
            let n = sent;
            tasks.push(tokio::spawn(async move {
                tally.add(call(channel, n).await);
                drop(permit);
            }));
            sent += 1;
        }
    }
    for task in tasks {
        task.await?;
    }
    let seconds = started.elapsed().as_secs_f64();
    let tally = Arc::try_unwrap(tally).map_err(|_| anyhow::anyhow!("a call outlived the run"))?;
    Ok(tally.into_grpc(seconds))
}

/// wrk against `url` for `duration`, the requests spread over [`KEYS`] API keys.
fn http(bench: &Bench, url: &str, duration: Duration) -> Result<Measured> {
    bench.wrk.run(&Load {
        url,
        threads: 2,
        connections: bench.settings.connections,
        duration,
        cpus: bench.load_cpus.as_deref(),
        clients: Clients::Cycle(KEYS, "k"),
    })
}

fn row_grpc(out: &mut String, what: &str, store: &str, runs: &[Grpc]) {
    let latencies: Vec<f64> = runs.iter().flat_map(|r| r.latencies_ms.clone()).collect();
    let calls: u64 = runs.iter().map(|r| r.calls).sum();
    let seconds: f64 = runs.iter().map(|r| r.seconds).sum();
    let cpu_ms: f64 = runs.iter().map(|r| r.server_cpu_ms).sum();
    let total = Grpc {
        calls,
        seconds,
        server_cpu_ms: cpu_ms,
        ..Grpc::default()
    };
    out.push_str(&format!(
        "| {what} | {store} | {:.0} | {:.0} | {:.3} | {:.3} | {} | {} |\n",
        total.rate(),
        total.per_core(),
        quantile(&latencies, 0.5),
        quantile(&latencies, 0.99),
        runs.iter().map(|r| r.errors).sum::<u64>(),
        runs.iter().map(|r| r.over_limit).sum::<u64>(),
    ));
}

fn row_http(out: &mut String, what: &str, runs: &[Measured]) {
    let median = |f: fn(&Measured) -> f64| {
        crate::stats::Summary::of(runs.iter().map(f)).map_or(f64::NAN, |s| s.median)
    };
    out.push_str(&format!(
        "| {what} | {:.0} | {:.3} | {:.3} | {} | {} |\n",
        median(Measured::throughput),
        median(|m| m.p50_us as f64) / 1e3,
        median(|m| m.p99_us as f64) / 1e3,
        runs.iter().map(|m| m.non_2xx).sum::<u64>(),
        runs.iter().map(|m| m.errors).sum::<u64>(),
    ));
}

/// CPU microseconds one saturating call costs `server`, over every round.
fn cpu_us_per_call(server: &Server) -> f64 {
    let calls: u64 = server.saturating.iter().map(|r| r.calls).sum();
    let cpu_ms: f64 = server.saturating.iter().map(|r| r.server_cpu_ms).sum();
    cpu_ms * 1e3 / calls.max(1) as f64
}

/// The saturating calls' CPU per call beside the floor's: what of a call is Sluice's.
fn own_cost(servers: &[Server]) -> String {
    let Some(floor) = servers.iter().find(|s| s.floor) else {
        return String::new();
    };
    let floor_us = cpu_us_per_call(floor);
    let mut out = format!(
        "\nThe floor (`--rls-auth none`, calls on a domain no rule names: converted, planned \
         over no rule, answered `OK`) is what tonic, HTTP/2 and the kernel's loopback TCP \
         cost a call on this machine whatever Sluice does: **{floor_us:.1} µs** of server CPU \
         per saturating call. On loopback the sender's `send` also runs the receiver's TCP \
         receive path, so part of it is the client's. Above the floor, per saturating call:\n\n"
    );
    for s in servers.iter().filter(|s| !s.floor) {
        let us = cpu_us_per_call(s);
        out.push_str(&format!(
            "- {}: {us:.1} µs, of which Sluice's own (token, plan, charge, answer, counts) \
             {:.1} µs, {:.0}% of the call\n",
            s.store,
            us - floor_us,
            100.0 * (us - floor_us) / us.max(1e-9)
        ));
    }
    out
}

fn markdown(
    servers: &[Server],
    wasm: &[Measured],
    commands: &[String],
    bench: &Bench,
    rate: u64,
) -> String {
    let settings = &bench.settings;
    let pinning = match (&bench.envoy_cpus, &bench.load_cpus) {
        (Some(server), Some(client)) => format!(
            "Each `sluice serve` runs on CPU {server} only, the client on CPU {client} only, \
             so a server has one core."
        ),
        _ => "The server and the client run unpinned (no taskset or one core).".to_string(),
    };
    let batch = rate / 1_000;
    let mut out = format!(
        "# Sluice as Envoy's rate limit service: what a decision costs\n\n\
         Produced by `cargo xtask bench --only rls`. The same traffic everywhere: requests \
         spread over {KEYS} API keys, each under a limit far above the load (every decision \
         charges a bucket, none denies). `sluice serve --rls-listen` on loopback with its \
         buckets in memory, another with them in Redis (one throwaway `redis-server`), and \
         a third for the floor (below). {} rounds of {:?} per run, \
         the runs back to back in each round.\n\n",
        settings.rounds, settings.round
    );
    out.push_str(&format!(
        "## ShouldRateLimit over gRPC\n\nA Rust client (tonic, Envoy's protos) on {CHANNELS} \
         HTTP/2 connections. *Saturating*: {IN_FLIGHT} calls in flight, each caller calling \
         again at its answer. *Paced*: calls started at {rate} a second (open loop, at most \
         {PACED_IN_FLIGHT} unanswered). Calls per core-second: calls divided by the \
         server's CPU time over the run (`/proc/<pid>/stat`), all of `sluice serve`'s \
         threads. {pinning} Paced calls start in batches every millisecond ({batch} at a \
         time), as a timer of a millisecond allows. Latency over every call of every \
         round.\n\n\
         | run | store | calls/s | calls per core-second | p50 ms | p99 ms | errors | over limit |\n\
         |---|---|---|---|---|---|---|---|\n"
    ));
    for s in servers {
        row_grpc(
            &mut out,
            &format!("saturating, {IN_FLIGHT} in flight"),
            s.store,
            &s.saturating,
        );
    }
    for s in servers {
        row_grpc(&mut out, &format!("paced at {rate}/s"), s.store, &s.paced);
    }
    out.push_str(&own_cost(servers));
    out.push_str(&format!(
        "\n## The same traffic through Envoy\n\nwrk, {} connections, against Envoy ({WORKERS} \
         workers, in front of one echo upstream) with the wasm filter deciding inside Envoy, and with \
         Envoy's native ratelimit filter asking each server (`sluice envoy-config --rls`, \
         one descriptor per request). Pinned as above, Envoy and the server it asks share \
         one core, as the wasm filter's Envoy has one core to itself. Medians over \
         rounds.\n\n\
         | Envoy with | requests/s | p50 ms | p99 ms | non-2xx | errors |\n|---|---|---|---|---|---|\n",
        settings.connections
    ));
    row_http(&mut out, "the wasm filter", wasm);
    for s in servers.iter().filter(|s| !s.floor) {
        row_http(
            &mut out,
            &format!("the native ratelimit filter → Sluice ({})", s.store),
            &s.through_envoy,
        );
    }
    out.push_str(&format!(
        "\nLoad average at the end: {}. Bootstraps: `{}`.\n",
        crate::machine::loadavg(),
        commands.join("`, `")
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_call_names_one_of_the_keys_under_the_rules_domain() {
        let keys: std::collections::BTreeSet<String> = (0..3 * KEYS)
            .map(|n| request(DOMAIN, n).descriptors[0].entries[0].value.clone())
            .collect();
        assert_eq!(keys.len() as u64, KEYS);
        assert_eq!(
            request(DOMAIN, 7).domain,
            rls_rule()["descriptor"]["domain"]
        );
        assert_ne!(FLOOR_DOMAIN, DOMAIN, "the floor's calls match no rule");
    }
}
