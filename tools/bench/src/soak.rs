//! Soak: a real `sluice serve` and an Envoy following it under steady load for many
//! minutes, with a rule edited every second and clients that never stop changing.
//!
//! * `sluice serve` with SQLite in the run folder; one Envoy with [`WORKERS`] workers
//!   following it through the control service.
//! * One rule keyed by `x-api-key`, `2 per second` with a burst that the editor toggles
//!   between 2 and 3 every second (a `PUT` through the API: the workers swap rulesets
//!   and the limit's buckets change identity all run long).
//! * A paced loader on loopback ([`OFFERED_PER_SECOND`] over [`CONNECTIONS`] connections,
//!   driven by the clock): request `n` carries key `c<(n / 4) mod 1,000,000>`, so each
//!   client sends four requests at once, of which the burst admits 2 or 3, and is never
//!   seen again until the loader has gone through a million keys. Active buckets refill
//!   within ~1.5 s, so the slot table keeps being reused by new clients.
//! * Every [`sample_every`]: both processes' RSS (`/proc/PID/status`), the loader's
//!   counts and the filter's failure counters, printed as a progress line.
//! * At the end the load stops, the last decisions reach Envoy's counters and the last
//!   report reaches the admin API; then Envoy's per-rule counts, the loader's answers and
//!   the API's stored series must agree exactly.
//!
//! Written to `<out_dir>/<name>-soak.md`.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use sluice_harness::cmd::{note, step};
use sluice_harness::envoy::EnvoyProcess;
use sluice_harness::load::{Live, Load, Req, Stop};
use sluice_harness::serve::{AdminApi, Serve};
use sluice_harness::wait_until;

use crate::setup::Bench;

const WORKERS: u32 = 2;
const RULE: &str = "soak";
/// Requests per second the loader offers, in total.
pub const OFFERED_PER_SECOND: u64 = 2_500;
const CONNECTIONS: u64 = 16;
/// Distinct client keys the loader draws from.
pub const CLIENT_KEYS: u64 = 1_000_000;
/// Consecutive requests that carry the same key.
const REQUESTS_PER_CLIENT: u64 = 4;
/// The burst the editor toggles between.
const BURSTS: [u64; 2] = [2, 3];
const EDIT_EVERY: Duration = Duration::from_secs(1);
const ANSWER_LIMIT: Duration = Duration::from_secs(5);
const WAIT_LIMIT: Duration = Duration::from_secs(20);
/// Longest the end of the run may wait for the last report to be counted.
const DRAIN_LIMIT: Duration = Duration::from_secs(30);
/// The control service's report interval (the `sluice envoy-config` default).
const REPORT_INTERVAL: Duration = Duration::from_secs(2);
const MIB: f64 = 1024.0 * 1024.0;
/// Memory is flat when the median RSS of the last third of the samples after warm-up is
/// at most this much above the first third's (whichever bound is larger).
const FLAT_FRACTION: f64 = 0.05;
const FLAT_BYTES: u64 = 4 * 1024 * 1024;
/// The share of the run treated as warm-up for the memory verdict.
const WARMUP_FRACTION: f64 = 0.1;

const FAILURE_COUNTERS: [&str; 8] = [
    "wasmcustom.sluice_fail_open_total",
    "wasmcustom.sluice_fail_closed_total",
    "wasmcustom.sluice_errors_total",
    "wasmcustom.sluice_config_errors_total",
    "wasmcustom.sluice_slot_corrupt_total",
    "wasmcustom.sluice_control_errors_total",
    "wasmcustom.sluice_control_reports_dropped_total",
    "wasmcustom.sluice_report_batches_dropped_total",
];
const INFO_COUNTERS: [&str; 6] = [
    "wasmcustom.sluice_slot_shared_total",
    "wasmcustom.sluice_slot_evictions_total",
    "wasmcustom.sluice_cas_contention_total",
    "wasmcustom.sluice_rulesets_applied_total",
    "wasmcustom.sluice_control_polls_total",
    "wasmcustom.sluice_control_reports_sent_total",
];

/// The interval between samples: about 30 s, more often in short trials so they still
/// have enough samples to judge memory on.
pub fn sample_every(duration: Duration) -> Duration {
    if duration >= Duration::from_secs(600) {
        Duration::from_secs(30)
    } else {
        Duration::from_secs(10)
    }
}

fn rule(burst: u64) -> Value {
    json!({
        "name": RULE,
        "key": {"header": "x-api-key"},
        "limits": [{"requests": 2, "period": "second", "burst": burst}],
    })
}

/// The key of the loader's `n`th request.
fn client_key(n: u64) -> String {
    format!("c{}", (n / REQUESTS_PER_CLIENT) % CLIENT_KEYS)
}

/// The loader's counts at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct LoadSnapshot {
    /// Requests started: answered, failed (`transport_errors`) or on their way.
    sent: u64,
    allowed: u64,
    denied: u64,
    server_errors: u64,
    other: u64,
    transport_errors: u64,
}

impl LoadSnapshot {
    fn of(live: &Live) -> LoadSnapshot {
        let tally = live.tally();
        let (allowed, denied) = (tally.admitted(), tally.get(429));
        let server_errors = tally.by_status.range(500..600).map(|(_, n)| n).sum();
        LoadSnapshot {
            sent: live.sent(),
            allowed,
            denied,
            server_errors,
            other: tally.responses() - allowed - denied - server_errors,
            transport_errors: tally.errors,
        }
    }
}

/// The editor's running counts.
#[derive(Debug, Default)]
struct EditCounts {
    ok: AtomicU64,
    failed: AtomicU64,
}

#[derive(Debug, Clone, Copy, Default)]
struct Sample {
    seconds: f64,
    envoy_rss: u64,
    serve_rss: u64,
    load: LoadSnapshot,
    edits_ok: u64,
    edits_failed: u64,
    fail_open: u64,
    control_errors: u64,
    other_failures: u64,
}

impl Sample {
    /// The samples table's columns: each heading with this sample's value. The progress
    /// lines say the same.
    fn columns(&self) -> [(&'static str, String); 13] {
        let load = &self.load;
        [
            ("s", format!("{:.0}", self.seconds)),
            (
                "Envoy RSS MiB",
                format!("{:.1}", self.envoy_rss as f64 / MIB),
            ),
            (
                "`sluice serve` RSS MiB",
                format!("{:.1}", self.serve_rss as f64 / MIB),
            ),
            ("sent", load.sent.to_string()),
            ("allowed", load.allowed.to_string()),
            ("denied", load.denied.to_string()),
            ("5xx", load.server_errors.to_string()),
            ("transport errors", load.transport_errors.to_string()),
            ("edits ok", self.edits_ok.to_string()),
            ("edits failed", self.edits_failed.to_string()),
            ("fail-open", self.fail_open.to_string()),
            ("control errors", self.control_errors.to_string()),
            ("other failure counters", self.other_failures.to_string()),
        ]
    }
}

/// Whether memory stayed flat: `(first third median, last third median, flat)` over the
/// samples after warm-up.
fn flat(samples: &[(f64, u64)], duration: Duration) -> (u64, u64, bool) {
    let warm = duration.as_secs_f64() * WARMUP_FRACTION;
    let kept: Vec<u64> = samples
        .iter()
        .filter(|(t, _)| *t >= warm)
        .map(|&(_, rss)| rss)
        .collect();
    let third = (kept.len() / 3).max(1);
    let median = |part: &[u64]| {
        let mut v = part.to_vec();
        v.sort_unstable();
        v.get(v.len() / 2).copied().unwrap_or(0)
    };
    if kept.len() < 3 {
        return (0, 0, false);
    }
    let first = median(&kept[..third]);
    let last = median(&kept[kept.len() - third..]);
    let allowance = ((first as f64 * FLAT_FRACTION) as u64).max(FLAT_BYTES);
    (first, last, last <= first + allowance)
}

fn unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Allowed and denied as Envoy's per-rule counters hold them: what the workers handed to
/// the report queue, flushed once a second.
fn envoy_rule_counts(envoy: &EnvoyProcess) -> Result<(u64, u64)> {
    let stats = envoy.stats_matching("^wasmcustom\\.sluice_rule\\.")?;
    let sum = |suffix: &str| {
        stats
            .iter()
            .filter(|(name, _)| name.ends_with(suffix))
            .map(|(_, v)| *v)
            .sum::<u64>()
    };
    Ok((sum(".allowed_total"), sum(".denied_total")))
}

/// Allowed, denied and fail-open as the admin API holds them over `[from, to)`.
fn api_counts(admin: &AdminApi, from: i64, to: i64) -> Result<(u64, u64, u64)> {
    let path = format!("/api/v1/metrics/series?from={from}&to={to}&step=1m");
    let (status, body) = admin.call("GET", &path, "")?;
    if status != 200 {
        bail!("GET {path} answered {status}: {body}");
    }
    let series: Value = serde_json::from_str(&body).with_context(|| format!("{path}: {body}"))?;
    let points = series["points"]
        .as_array()
        .with_context(|| format!("no points in {body}"))?;
    let sum = |field: &str| points.iter().filter_map(|p| p[field].as_u64()).sum::<u64>();
    Ok((sum("allowed"), sum("denied"), sum("fail_open")))
}

/// The paced, time-driven loader: [`CONNECTIONS`] keep-alive connections, each sending at
/// its share of [`OFFERED_PER_SECOND`] for `duration` or until `stop`.
fn loader(addr: SocketAddr, duration: Duration, stop: &Stop) -> Load {
    let period = Duration::from_secs_f64(CONNECTIONS as f64 / OFFERED_PER_SECOND as f64);
    Load::new([(addr, CONNECTIONS as usize)])
        .paced(period, 1)
        .for_duration(duration)
        .until_stopped(stop)
        .answer_limit(ANSWER_LIMIT)
}

/// What the end of the run found once the last report was in.
#[derive(Debug, Clone, Copy, Default)]
struct Drain {
    /// Envoy's per-rule counts, allowed and denied.
    envoy: (u64, u64),
    /// Envoy's request-path counters `sluice_allowed_total`, `sluice_denied_total`.
    envoy_path: (u64, u64),
    /// The admin API's series totals: allowed, denied, fail-open.
    api: (u64, u64, u64),
    /// From the end of the load until Envoy's counters held every answer.
    counters_settled: Duration,
    /// From then until the API's totals matched (or the limit ran out).
    report_lag: Duration,
    /// The API's totals were the same again after two more report intervals.
    stable: bool,
}

/// Runs the soak for `duration` and writes `<out_dir>/<name>-soak.md`; returns the file
/// and whether every verdict held.
pub fn run(
    bench: &Bench,
    out_dir: &Path,
    name: &str,
    duration: Duration,
    invocation: &str,
) -> Result<(PathBuf, bool)> {
    let every = sample_every(duration);
    step(format!(
        "soak: {:.0} min of {OFFERED_PER_SECOND} requests/s over {CLIENT_KEYS} client keys, \
         a rule edit every second, a sample every {} s",
        duration.as_secs_f64() / 60.0,
        every.as_secs()
    ));
    let dir = bench.run_dir.join("soak");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let database = format!("sqlite://{}/soak.db", dir.display());
    let from_ms = unix_ms() - 60_000;
    let mut admin = AdminApi::start(&Serve::new(bench.generator.sluice_bin.clone(), database))?;
    let serve_pid = admin.pid().context("`sluice serve` has no process id")?;
    let proxy_token = admin.proxy_token("soak")?;
    admin.create_rule(&rule(BURSTS[0]))?;
    let yaml = dir.join("soak.yaml");
    let generate = bench
        .generator
        .write_following(&yaml, &admin.url(), &proxy_token, "soak", WORKERS)?
        .replace(&proxy_token, "<proxy token>");
    let envoy = bench.start_envoy(&yaml, WORKERS, None, &dir, "soak")?;
    let envoy_command = envoy.command().to_string();
    // Every filter root (each worker's and the main thread's) must run the rule before
    // the load starts: a worker still on the empty start-up ruleset admits requests that
    // no rule counts, and the end's comparison would rightly find them missing.
    wait_until("every filter root to apply the rule", WAIT_LIMIT, || {
        Ok(envoy.counter("wasmcustom.sluice_rulesets_applied_total")? > u64::from(WORKERS))
    })?;

    let edits = EditCounts::default();
    let stop = Stop::new();
    let began = Instant::now();
    let deadline = began + duration;
    let load = loader(envoy.listener(), duration, &stop);
    let live = load.live();
    let mut samples: Vec<Sample> = Vec::new();
    let mut failure: Option<anyhow::Error> = None;
    let take = |envoy: &EnvoyProcess, seconds: f64| -> Result<Sample> {
        let failures = envoy.stats_matching("^wasmcustom\\.sluice_")?;
        let get = |n: &str| failures.get(n).copied().unwrap_or(0);
        Ok(Sample {
            seconds,
            envoy_rss: envoy.rss_bytes()?,
            serve_rss: sluice_harness::envoy::rss_bytes(serve_pid)?,
            load: LoadSnapshot::of(&live),
            edits_ok: edits.ok.load(Ordering::Relaxed),
            edits_failed: edits.failed.load(Ordering::Relaxed),
            fail_open: get(FAILURE_COUNTERS[0]),
            control_errors: get("wasmcustom.sluice_control_errors_total"),
            other_failures: FAILURE_COUNTERS
                .iter()
                .filter(|n| {
                    **n != FAILURE_COUNTERS[0] && **n != "wasmcustom.sluice_control_errors_total"
                })
                .map(|n| get(n))
                .sum(),
        })
    };
    samples.push(take(&envoy, 0.0)?);
    let loader_result = std::thread::scope(|scope| {
        let loader = scope.spawn(move || {
            load.run(|n| {
                Req::get("/")
                    .header("host", "soak")
                    .header("x-api-key", client_key(n))
            })
        });
        let (admin, edits, stop) = (&admin, &edits, &stop);
        scope.spawn(move || {
            let mut i = 0usize;
            let mut next = Instant::now() + EDIT_EVERY;
            while next < deadline && !stop.is_stopped() {
                std::thread::sleep(next.saturating_duration_since(Instant::now()));
                i += 1;
                let body = rule(BURSTS[i % BURSTS.len()]).to_string();
                match admin.call("PUT", &format!("/api/v1/rules/{RULE}"), &body) {
                    Ok((200..=299, _)) => edits.ok.fetch_add(1, Ordering::Relaxed),
                    _ => edits.failed.fetch_add(1, Ordering::Relaxed),
                };
                next += EDIT_EVERY;
            }
        });
        let mut next = began + every;
        while next <= deadline + Duration::from_millis(1) {
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
            let sample = envoy
                .check_running()
                .and_then(|()| take(&envoy, began.elapsed().as_secs_f64()));
            match sample {
                Ok(s) => {
                    let line: Vec<String> = s
                        .columns()
                        .iter()
                        .map(|(h, v)| format!("{h} {v}"))
                        .collect();
                    note(format!("soak: {}", line.join(", ")));
                    samples.push(s);
                }
                Err(err) => {
                    failure = Some(err);
                    stop.stop();
                    break;
                }
            }
            next += every;
        }
        loader.join()
    });
    if let Some(err) = failure {
        return Err(err.context("the soak stopped early"));
    }
    match loader_result {
        Ok(result) => drop(result?),
        Err(_) => bail!("the soak's loader panicked"),
    }
    let load_ended = Instant::now();
    let loaded = LoadSnapshot::of(&live);

    // The end: the workers hand their last decisions to Envoy's counters (and the report
    // queue) within a second, the control service posts them within one report interval.
    step("soak: load stopped; waiting for the last report");
    let mut drain = Drain::default();
    wait_until("Envoy's counters to hold every answer", DRAIN_LIMIT, || {
        let (allowed, denied) = envoy_rule_counts(&envoy)?;
        Ok(allowed >= loaded.allowed && denied >= loaded.denied)
    })
    .unwrap_or_else(|err| note(format!("warning: {err:#}")));
    // Anything decided but not answered in time would still be on its way: a moment more.
    std::thread::sleep(Duration::from_millis(1_500));
    drain.envoy = envoy_rule_counts(&envoy)?;
    drain.envoy_path = (
        envoy.counter("wasmcustom.sluice_allowed_total")?,
        envoy.counter("wasmcustom.sluice_denied_total")?,
    );
    drain.counters_settled = load_ended.elapsed();
    let settled = Instant::now();
    let matched = wait_until("the admin API to hold the last report", DRAIN_LIMIT, || {
        let (allowed, denied, _) = api_counts(&admin, from_ms, unix_ms() + 60_000)?;
        Ok((allowed, denied) == drain.envoy)
    });
    drain.report_lag = settled.elapsed();
    if let Err(err) = &matched {
        note(format!("warning: {err:#}"));
    }
    // No report may arrive late and count twice: the totals hold for two more intervals.
    std::thread::sleep(REPORT_INTERVAL * 2);
    drain.api = api_counts(&admin, from_ms, unix_ms() + 60_000)?;
    drain.stable = matched.is_ok() && (drain.api.0, drain.api.1) == drain.envoy;
    let last = envoy.stats_matching("^wasmcustom\\.sluice_")?;
    let counter = |n: &str| last.get(n).copied().unwrap_or(0);
    drop(envoy);
    admin.kill();

    let envoy_rss: Vec<(f64, u64)> = samples.iter().map(|s| (s.seconds, s.envoy_rss)).collect();
    let serve_rss: Vec<(f64, u64)> = samples.iter().map(|s| (s.seconds, s.serve_rss)).collect();
    let (envoy_first, envoy_last, envoy_flat) = flat(&envoy_rss, duration);
    let (serve_first, serve_last, serve_flat) = flat(&serve_rss, duration);
    let edits_ok = edits.ok.load(Ordering::Relaxed);
    let edits_failed = edits.failed.load(Ordering::Relaxed);
    let fail_open = counter(FAILURE_COUNTERS[0]) + drain.api.2;
    let dropped = counter("wasmcustom.sluice_control_reports_dropped_total")
        + counter("wasmcustom.sluice_report_batches_dropped_total");
    let answered_match = drain.envoy == (loaded.allowed, loaded.denied);
    let verdicts: Vec<(String, bool)> = vec![
        (
            format!(
                "Envoy memory flat: median RSS of the last third {:.1} MiB vs the first third {:.1} MiB \
                 (after the first {:.0}% of the run; allowed: +{:.0}% or +{} MiB)",
                envoy_last as f64 / MIB,
                envoy_first as f64 / MIB,
                WARMUP_FRACTION * 100.0,
                FLAT_FRACTION * 100.0,
                FLAT_BYTES / 1024 / 1024
            ),
            envoy_flat,
        ),
        (
            format!(
                "`sluice serve` memory flat: {:.1} MiB vs {:.1} MiB (same rule)",
                serve_last as f64 / MIB,
                serve_first as f64 / MIB
            ),
            serve_flat,
        ),
        (
            format!(
                "zero 5xx and transport errors: {} 5xx, {} other non-2xx/429, {} transport errors",
                loaded.server_errors, loaded.other, loaded.transport_errors
            ),
            loaded.server_errors == 0 && loaded.other == 0 && loaded.transport_errors == 0,
        ),
        (
            format!("zero failed rule edits: {edits_ok} answered 2xx, {edits_failed} did not"),
            edits_failed == 0 && edits_ok > 0,
        ),
        (
            format!(
                "zero fail-open: `sluice_fail_open_total` {}, the API's fail_open {}",
                counter(FAILURE_COUNTERS[0]),
                drain.api.2
            ),
            fail_open == 0,
        ),
        (
            format!(
                "both paths ran: {} allowed, {} denied ({:.1}% allowed)",
                loaded.allowed,
                loaded.denied,
                100.0 * loaded.allowed as f64 / (loaded.allowed + loaded.denied).max(1) as f64
            ),
            loaded.allowed > 0 && loaded.denied > 0,
        ),
        (
            format!(
                "Envoy counted every answer: per-rule counters {} allowed + {} denied, the loader \
                 received {} + {}",
                drain.envoy.0, drain.envoy.1, loaded.allowed, loaded.denied
            ),
            answered_match,
        ),
        (
            format!(
                "reports complete: the API stored {} allowed + {} denied, Envoy counted {} + {}; \
                 {} reports or batches dropped",
                drain.api.0, drain.api.1, drain.envoy.0, drain.envoy.1, dropped
            ),
            drain.stable && dropped == 0,
        ),
    ];
    let passed = verdicts.iter().all(|(_, ok)| *ok);

    let mut md = String::new();
    let _ = writeln!(md, "# Sluice soak\n");
    let _ = writeln!(
        md,
        "Produced by `{invocation}` ({:.0} min of load, a sample every {} s){}.\n",
        duration.as_secs_f64() / 60.0,
        every.as_secs(),
        if duration < Duration::from_secs(600) {
            ": **a short trial run, not the 30-minute soak**"
        } else {
            ""
        }
    );
    let _ = writeln!(
        md,
        "The real admin API (`sluice serve`, SQLite in the run folder) and one Envoy with \
         {WORKERS} workers following it through the control service, on loopback. One rule, \
         `{RULE}`, keyed by `x-api-key`: 2 requests per second with a burst of 2, edited every \
         {} s through the API (`PUT /api/v1/rules/{RULE}` toggling the burst between {} and {}, \
         so the workers swap rulesets and the limit's buckets change identity all run long). \
         A paced loader ({OFFERED_PER_SECOND} requests/s over {CONNECTIONS} keep-alive \
         connections, for a fixed time) sends request n with key `c<(n / {REQUESTS_PER_CLIENT}) \
         mod {CLIENT_KEYS}>`: each client sends {REQUESTS_PER_CLIENT} requests at once, the \
         burst admits 2 or 3 of them, and the client is not seen again until the loader has \
         gone through all {CLIENT_KEYS} keys, so new clients arrive all the time and the \
         default 65,536-slot table is reused by them. The load starts once every filter root \
         (both workers and the main thread) runs the rule: before that a worker admits \
         requests that no rule counts, which the comparison below would report as missing.\n",
        EDIT_EVERY.as_secs(),
        BURSTS[0],
        BURSTS[1]
    );
    let _ = writeln!(md, "## Verdicts\n\n| verdict | holds |\n|---|---|");
    for (text, ok) in &verdicts {
        let _ = writeln!(md, "| {text} | {} |", if *ok { "yes" } else { "**NO**" });
    }
    let _ = writeln!(
        md,
        "\n**{}**\n",
        if passed {
            "Every verdict holds."
        } else {
            "At least one verdict failed."
        }
    );
    let _ = writeln!(
        md,
        "## Reports\n\nWorkers hand their counts to Envoy's per-rule counters and to the report \
         queue together, once a second; the control service posts a report every {} s. So at \
         any moment the API lags Envoy by up to about one report interval plus a tick. The \
         comparison removes the lag instead of allowing for it: the load stops, Envoy's \
         counters are read once they hold every answer the loader received ({:.1} s after the \
         load ended), then the API's `GET /api/v1/metrics/series` totals over the whole run \
         must equal them exactly (they did {:.1} s later{}) and still equal them two report \
         intervals later (no late or duplicated report).\n",
        REPORT_INTERVAL.as_secs(),
        drain.counters_settled.as_secs_f64(),
        drain.report_lag.as_secs_f64(),
        if matched.is_ok() {
            ""
        } else {
            ": **they did not within the limit**"
        }
    );
    let _ = writeln!(
        md,
        "| | allowed | denied |\n|---|---|---|\n\
         | loader (2xx / 429 received) | {} | {} |\n\
         | Envoy, per-rule counters | {} | {} |\n\
         | Envoy, `sluice_allowed_total` / `sluice_denied_total` | {} | {} |\n\
         | admin API, stored series | {} | {} |\n",
        loaded.allowed,
        loaded.denied,
        drain.envoy.0,
        drain.envoy.1,
        drain.envoy_path.0,
        drain.envoy_path.1,
        drain.api.0,
        drain.api.1
    );
    let headings = Sample::default().columns().map(|(heading, _)| heading);
    let _ = writeln!(
        md,
        "## Samples\n\n| {} |\n|{}",
        headings.join(" | "),
        "---|".repeat(headings.len())
    );
    for s in &samples {
        let values = s.columns().map(|(_, value)| value);
        let _ = writeln!(md, "| {} |", values.join(" | "));
    }
    let _ = writeln!(
        md,
        "\n\"Other failure counters\" adds up {}.\n",
        FAILURE_COUNTERS[1..]
            .iter()
            .filter(|n| !n.ends_with("control_errors_total"))
            .map(|n| format!("`{}`", n.trim_start_matches("wasmcustom.")))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let _ = writeln!(md, "## Envoy's counters at the end\n");
    for n in FAILURE_COUNTERS.iter().chain(INFO_COUNTERS.iter()) {
        let _ = writeln!(
            md,
            "- `{}`: {}",
            n.trim_start_matches("wasmcustom."),
            counter(n)
        );
    }
    let _ = writeln!(
        md,
        "\n## Commands\n\n```\n{}\n{}\n```\n\nOffered {:.0} requests/s on average \
         ({} sent in {:.0} s). Machine: {} ({} cores, shared), {}.",
        generate,
        envoy_command,
        loaded.sent as f64 / duration.as_secs_f64(),
        loaded.sent,
        duration.as_secs_f64(),
        bench.machine.cpu_model,
        bench.machine.cores,
        bench.machine.kernel
    );
    let path = out_dir.join(format!("{name}-soak.md"));
    std::fs::write(&path, md).with_context(|| format!("writing {}", path.display()))?;
    note(format!(
        "soak {}: {}",
        if passed { "passed" } else { "FAILED" },
        path.display()
    ));
    for (text, ok) in &verdicts {
        note(format!("  [{}] {text}", if *ok { "ok" } else { "FAILED" }));
    }
    Ok((path, passed))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: u64 = 1024 * 1024;

    #[test]
    fn clients_send_their_requests_together_and_keys_wrap_at_a_million() {
        assert_eq!(client_key(0), "c0");
        assert_eq!(client_key(REQUESTS_PER_CLIENT - 1), "c0");
        assert_eq!(client_key(REQUESTS_PER_CLIENT), "c1");
        assert_eq!(client_key(REQUESTS_PER_CLIENT * CLIENT_KEYS), "c0");
    }

    #[test]
    fn memory_is_flat_within_the_larger_allowance_after_warm_up() {
        let run = Duration::from_secs(100);
        // A warm-up climb (before 10 s) is ignored; +3 MiB on 100 MiB is within 4 MiB.
        let steady: Vec<(f64, u64)> = (0..=10)
            .map(|i| {
                (
                    f64::from(i) * 10.0,
                    if i == 0 {
                        20 * MB
                    } else {
                        100 * MB + (i as u64) * MB / 3
                    },
                )
            })
            .collect();
        let (first, last, ok) = flat(&steady, run);
        assert!(ok, "{first} {last}");
        // Growing 2 MiB every sample is not flat.
        let growing: Vec<(f64, u64)> = (0..=10)
            .map(|i| (f64::from(i) * 10.0, 100 * MB + (i as u64) * 2 * MB))
            .collect();
        assert!(!flat(&growing, run).2);
        // Too few samples to judge is not a pass.
        assert!(!flat(&[(50.0, MB), (60.0, MB)], run).2);
    }

    #[test]
    fn short_runs_sample_more_often() {
        assert_eq!(
            sample_every(Duration::from_secs(30 * 60)),
            Duration::from_secs(30)
        );
        assert_eq!(
            sample_every(Duration::from_secs(120)),
            Duration::from_secs(10)
        );
    }
}
