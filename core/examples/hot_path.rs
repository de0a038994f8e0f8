//! The filter's per-request work in the core, natively, for timing and profiling.
//!
//! ```sh
//! cargo run --release -p sluice-core --example hot_path -- [SCENARIO|all] [ITERATIONS] [whole]
//! valgrind --tool=callgrind target/release/examples/hot_path d 200000 whole
//! ```
//!
//! Each iteration does what `filter/src/http.rs` does around the host calls: builds an
//! `HttpRequest` from header pairs shaped like the ones Envoy hands the filter, runs
//! `Ruleset::decide_observed` against a `MemoryStore` (the host's shared data, in memory),
//! counting into the worker's statistics (`report::Aggregate`, taken every second of
//! requests as the filter's root flushes it), and renders the rate-limit headers (or, for a denial, the problem body). Timing runs the
//! loop three times, each doing one stage more, and prints the stages' costs; `whole`
//! runs the whole work once, for profilers. Scenarios match
//! `cargo xtask bench`'s variants: `d` one rule and one client, `e` three rules × two
//! tiers, `f` 100,000 clients in a 65,536-slot table, `g` a limit being hit.
//! `cargo xtask bench --profile` runs this under callgrind.

// A timing harness reads the clock; the core's library code never does.
#![allow(clippy::disallowed_methods)]

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Instant;

use sluice_core::config::FilterConfig;
use sluice_core::global::lease::FleetView;
use sluice_core::report::Aggregate;
use sluice_core::request::HttpRequest;
use sluice_core::response;
use sluice_core::ruleset::{DecisionContext, GlobalBuckets, Outcome};
use sluice_core::store::MemoryStore;
use sluice_core::time::Nanos;

const HUGE: u64 = 1_000_000_000;
const MANY_CLIENTS: usize = 100_000;
/// Time between two requests: 25 µs, i.e. 40,000 requests per second.
const STEP_NS: u64 = 25_000;
/// The statistics are taken after this many requests: one second of them, as the filter's
/// root flushes its workers' statistics once a second.
const FLUSH_EVERY_REQUESTS: u64 = 1_000_000_000 / STEP_NS;

struct Scenario {
    id: &'static str,
    label: &'static str,
    config: String,
    clients: usize,
}

fn scenarios() -> Vec<Scenario> {
    let one_rule = format!(
        r#"{{"rules":[{{"name":"per-key","key":{{"header":"x-api-key"}},"limits":[{{"requests":{HUGE},"period":"second"}}]}}]}}"#
    );
    let tiers = format!(
        r#"[{{"requests":{HUGE},"period":"second"}},{{"requests":{HUGE},"period":"minute"}}]"#
    );
    let three_rules = format!(
        r#"{{"rules":[
            {{"name":"per-key","key":{{"header":"x-api-key"}},"limits":{tiers}}},
            {{"name":"per-ip","key":{{"client_ip":{{"trusted_hops":0}}}},"limits":{tiers}}},
            {{"name":"per-path","key":"path","limits":{tiers}}}]}}"#
    );
    let hit = r#"{"rules":[{"name":"per-key","key":{"header":"x-api-key"},"limits":[{"requests":100,"period":"second"}]}]}"#;
    vec![
        Scenario {
            id: "d",
            label: "1 rule, 1 client",
            config: one_rule.clone(),
            clients: 1,
        },
        Scenario {
            id: "e",
            label: "3 rules x 2 tiers",
            config: three_rules,
            clients: 1,
        },
        Scenario {
            id: "f",
            label: "100,000 clients",
            config: one_rule,
            clients: MANY_CLIENTS,
        },
        Scenario {
            id: "g",
            label: "limit hit (mostly denied)",
            config: hit.to_string(),
            clients: 1,
        },
    ]
}

/// Header pairs as Envoy hands them to a filter for a wrk request.
fn header_pairs(client: usize) -> Vec<(String, String)> {
    let key = if client == 0 {
        "bench-client".to_string()
    } else {
        format!("client-{client}")
    };
    [
        (":authority", "127.0.0.1:10000"),
        (":path", "/bench"),
        (":method", "GET"),
        (":scheme", "http"),
        ("x-api-key", key.as_str()),
        ("x-forwarded-proto", "http"),
        ("x-request-id", "0f5e6a8c-3b9d-4e21-9a7f-5c2d1e0b4a63"),
    ]
    .into_iter()
    .map(|(n, v)| (n.to_string(), v.to_string()))
    .collect()
}

/// How much of the per-request work a timing loop does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Stage {
    /// Header pairs to `HttpRequest`.
    Request,
    /// ... then `Ruleset::decide_observed`, counting into the statistics.
    Decide,
    /// ... then the response headers or the denial body.
    Respond,
}

/// Runs `iterations` requests up to `stage` with a fresh store; returns ns per request,
/// the share allowed and the slots used.
fn time(
    scenario: &Scenario,
    config: &FilterConfig,
    iterations: u64,
    stage: Stage,
) -> (f64, f64, usize) {
    let store = MemoryStore::new();
    let leases = MemoryStore::new();
    let peer = Some(IpAddr::V4(Ipv4Addr::LOCALHOST));
    let pairs: Vec<Vec<(String, String)>> = (0..scenario.clients).map(header_pairs).collect();
    let mut now: u64 = 1_800_000_000_000_000_000;
    let mut allowed = 0u64;
    let mut sink = 0usize;
    let mut statistics = Aggregate::default();
    let started = Instant::now();
    for i in 0..iterations {
        now += STEP_NS;
        let client = (i as usize) % pairs.len().max(1);
        let Some(pairs) = pairs.get(client) else {
            continue;
        };
        // The filter gets fresh owned pairs from the host on every request.
        let request = HttpRequest::from_header_pairs(black_box(pairs.clone()), peer);
        if stage == Stage::Request {
            sink += black_box(&request).headers.len();
            continue;
        }
        // As the filter does: the context of one request.
        let cx = DecisionContext {
            store: &store,
            table: &config.table,
            global: GlobalBuckets {
                table: &config.lease_table,
                store: &leases,
                view: FleetView::ALONE,
            },
            now: Nanos::new(now),
            default_failure: config.failure_mode,
            queue: None,
        };
        let decision = config
            .ruleset
            .decide_observed(&request, &cx, &mut statistics);
        if (i + 1) % FLUSH_EVERY_REQUESTS == 0 {
            sink += black_box(statistics.take()).rules.len();
        }
        if decision.is_allowed() {
            allowed += 1;
        }
        if stage == Stage::Decide {
            sink += usize::from(black_box(decision.is_allowed()));
            continue;
        }
        match decision.outcome {
            Outcome::Allowed => {
                if let Some(tightest) = decision.tightest {
                    let headers = response::rate_limit_headers(&tightest, false);
                    sink += headers
                        .iter()
                        .map(|(n, v)| n.len() + v.len())
                        .sum::<usize>();
                }
            }
            Outcome::Denied(limited) => {
                let headers = response::rate_limit_headers(&limited, true);
                let body = response::problem_body(&limited, limited.rule.status);
                sink += headers.iter().map(|(_, v)| v.len()).sum::<usize>() + body.len();
            }
            Outcome::FailedClosed(_) | Outcome::InFlightFull(_) => {}
        }
    }
    let elapsed = started.elapsed();
    black_box(sink);
    let per = elapsed.as_nanos() as f64 / iterations.max(1) as f64;
    (
        per,
        allowed as f64 * 100.0 / iterations.max(1) as f64,
        store.slots_used(),
    )
}

fn run(scenario: &Scenario, iterations: u64, staged: bool) {
    let config = match FilterConfig::from_json(scenario.config.as_bytes()) {
        Ok(config) => config,
        Err(err) => {
            eprintln!("scenario {}: bad configuration: {err}", scenario.id);
            std::process::exit(2);
        }
    };
    if !staged {
        // One loop of the whole work, for profilers.
        let (full, allowed, slots) = time(scenario, &config, iterations, Stage::Respond);
        println!(
            "{}: {:<26} {full:>5.0} ns/request ({allowed:.1}% allowed, {slots} slots used)",
            scenario.id, scenario.label
        );
        return;
    }
    // Separate loops, each doing one stage more: their differences are the stages' costs,
    // without a clock read inside the loop.
    let (request, _, _) = time(scenario, &config, iterations, Stage::Request);
    let (decide, _, _) = time(scenario, &config, iterations, Stage::Decide);
    let (full, allowed, slots) = time(scenario, &config, iterations, Stage::Respond);
    println!(
        "{}: {:<26} {:>5.0} ns/request = request {:>4.0} + decide {:>5.0} + response {:>4.0}  \
         ({:.1}% allowed, {} slots used)",
        scenario.id,
        scenario.label,
        full,
        request,
        decide - request,
        full - decide,
        allowed,
        slots,
    );
}

fn main() {
    let mut args = std::env::args().skip(1);
    let which = args.next().unwrap_or_else(|| "all".to_string());
    let iterations = args
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1_000_000u64);
    let all = scenarios();
    let chosen: Vec<&Scenario> = all
        .iter()
        .filter(|s| which == "all" || s.id == which)
        .collect();
    if chosen.is_empty() {
        eprintln!("unknown scenario {which:?}: expected all, d, e, f or g");
        std::process::exit(2);
    }
    // `whole`: one loop of the whole work (for profilers) instead of the staged timing.
    let staged = args.next().as_deref() != Some("whole");
    for scenario in chosen {
        run(scenario, iterations, staged);
    }
}
