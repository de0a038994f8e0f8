//! The price of each host call Sluice's request path makes, measured inside Envoy.
//!
//! The probe module (`bench/hostcall-filter`) makes one named host call `k` times per
//! request and nothing else. One Envoy per (call, k) runs beside the pass-through filter
//! (k = 0), measured in the same interleaved rounds as the request-path section; within
//! each round, the least-squares slope of Envoy CPU per request over k (through the
//! pass-through point and the probe's points) is the cost of one call. The report gives
//! the median and range of that slope over rounds.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::{Value, json};
use sluice_harness::cmd::{note, step};

use crate::configs::FilterChain;
use crate::path::{self, PathResults, Sample, Variant, VariantClients};
use crate::setup::Bench;
use crate::stats::{self, Summary};

/// The calls priced, with what they stand for on Sluice's request path.
const CALLS: [(&str, &str); 8] = [
    (
        "header",
        "`get_http_request_header` (one header; every key and match read)",
    ),
    (
        "header_map",
        "`get_http_request_headers` (the whole map, for comparison)",
    ),
    (
        "peer_address",
        "`get_property(source.address)` (a client-IP key)",
    ),
    ("clock", "`get_current_time` (once per request)"),
    (
        "shared_get",
        "`get_shared_data` (each slot probed, each lease read)",
    ),
    ("shared_cas_set", "`set_shared_data` (each bucket charged)"),
    (
        "metric_increment",
        "`increment_metric` (each counter bumped)",
    ),
    (
        "add_response_header",
        "`add_http_response_header` (each rate-limit header)",
    ),
];

/// The numbers of calls per request measured for each call (k = 0 is the pass-through).
const KS: [u32; 2] = [4, 16];

/// Variant ids, one per (call, k), in `CALLS` × `KS` order: `Variant::id` is static.
const IDS: [&str; 16] = [
    "header×4",
    "header×16",
    "header_map×4",
    "header_map×16",
    "peer_address×4",
    "peer_address×16",
    "clock×4",
    "clock×16",
    "shared_get×4",
    "shared_get×16",
    "shared_cas_set×4",
    "shared_cas_set×16",
    "metric_increment×4",
    "metric_increment×16",
    "add_response_header×4",
    "add_response_header×16",
];

/// The local reply is made once per request (there is only one response): its price is
/// its difference from the pass-through, whose request gets the route's direct response.
const LOCAL_REPLY: &str = "send_local_reply×1";

fn variants() -> Vec<Variant> {
    let base = |id, label, chain| Variant {
        id,
        label,
        chain,
        rules: json!([]),
        clients: VariantClients::One,
        denies: false,
    };
    let mut variants = vec![base(
        "c",
        "pass-through wasm filter",
        FilterChain::Passthrough,
    )];
    let mut ids = IDS.iter();
    for (call, label) in CALLS {
        for k in KS {
            if let Some(id) = ids.next() {
                variants.push(base(id, label, FilterChain::Hostcall { call, k }));
            }
        }
    }
    let mut reply = base(
        LOCAL_REPLY,
        "`send_http_response` (a 429 with a small body, instead of the route's response)",
        FilterChain::Hostcall {
            call: "send_local_reply",
            k: 1,
        },
    );
    reply.denies = true;
    variants.push(reply);
    variants
}

/// One call's price over the rounds.
#[derive(Debug, Clone)]
struct Price {
    call: &'static str,
    label: &'static str,
    /// µs of Envoy CPU per call: the slope over k, per round.
    per_call_us: Option<Summary>,
    /// CPU per request at the largest k, divided by the pass-through's.
    ratio_at_max_k: Option<Summary>,
}

/// The least-squares slope of `y` over `x`.
fn slope(points: &[(f64, f64)]) -> Option<f64> {
    let n = points.len() as f64;
    if points.len() < 2 {
        return None;
    }
    let mean_x = points.iter().map(|p| p.0).sum::<f64>() / n;
    let mean_y = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mean_x).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mean_x) * (p.1 - mean_y)).sum();
    (sxx > 0.0).then(|| sxy / sxx)
}

fn prices(results: &PathResults) -> Vec<Price> {
    let Some(base) = results.index("c") else {
        return Vec::new();
    };
    let mut prices = Vec::new();
    let mut ids = IDS.iter();
    for (call, label) in CALLS {
        let at: Vec<(u32, Option<usize>)> = KS
            .iter()
            .map(|&k| (k, ids.next().and_then(|id| results.index(id))))
            .collect();
        let per_round = results.samples.iter().filter_map(|round| {
            let mut points = vec![(0.0, round.get(base)?.cpu_per_request_us())];
            for (k, i) in &at {
                points.push((f64::from(*k), round.get((*i)?)?.cpu_per_request_us()));
            }
            slope(&points)
        });
        let per_call_us = Summary::of(per_round);
        let ratio_at_max_k = at.last().and_then(|(_, i)| {
            results.paired((*i)?, base, |x, y| {
                x.cpu_per_request_us() / y.cpu_per_request_us()
            })
        });
        prices.push(Price {
            call,
            label,
            per_call_us,
            ratio_at_max_k,
        });
    }
    if let Some(i) = results.index(LOCAL_REPLY) {
        prices.push(Price {
            call: "send_local_reply",
            label: "`send_http_response` (a 429 with a small body, instead of the route's response)",
            per_call_us: results.paired(i, base, |x, y| {
                x.cpu_per_request_us() - y.cpu_per_request_us()
            }),
            ratio_at_max_k: results.paired(i, base, |x, y| {
                x.cpu_per_request_us() / y.cpu_per_request_us()
            }),
        });
    }
    prices
}

/// Runs the section and writes `<name>-hostcalls.md` and `.json` into `out_dir`.
pub fn run(bench: &Bench, out_dir: &Path, name: &str) -> Result<PathBuf> {
    let results = path::run_variants(bench, "host calls", "hostcall", variants())?;
    let prices = prices(&results);
    let s = &bench.settings;
    let mut md = String::new();
    writeln!(
        md,
        "# Sluice benchmark: the price of each host call\n\n\
         Produced by `cargo xtask bench --only hostcalls{}` ({} rounds of {} s per variant, \
         {} s warm-up) on a shared {}-core machine ({}); load average {} at start, {} at \
         end. Envoy 1.40 (V8), `--concurrency 1`, pinned as in the request-path section, \
         wrk `-t1 -c{}` on the other core, every request carrying `x-api-key`.\n\n\
         The probe module `bench/hostcall-filter` makes one host call k times per request \
         (k = {KS:?}) and nothing else; the pass-through filter is k = 0. Within each round \
         the least-squares slope of Envoy CPU per request over k is the price of one call; \
         the table gives its median (min–max) over rounds. The local reply is made once, so \
         its row is its difference from the pass-through (which gets the route's \
         `direct_response`).\n",
        if s.quick { " --quick" } else { "" },
        s.rounds,
        s.round.as_secs(),
        s.warmup.as_secs(),
        bench.machine.cores,
        bench.machine.cpu_model,
        bench.machine.loadavg_start,
        results.loadavg_end,
        s.connections,
    )?;
    let base = results.summary(results.index("c").unwrap_or(0), Sample::cpu_per_request_us);
    writeln!(
        md,
        "Pass-through filter: {} µs of Envoy CPU per request.\n",
        stats::show(base, 2)
    )?;
    writeln!(
        md,
        "| host call | what it stands for | µs per call | CPU ÷ pass-through at k = {} |\n|---|---|---|---|",
        KS[KS.len() - 1]
    )?;
    for p in &prices {
        writeln!(
            md,
            "| `{}` | {} | {} | {} |",
            p.call,
            p.label,
            stats::show(p.per_call_us, 2),
            stats::show(p.ratio_at_max_k, 2)
        )?;
    }
    writeln!(
        md,
        "\nEvery variant, CPU per request (µs, median (min–max)):\n"
    )?;
    writeln!(
        md,
        "| variant | Envoy CPU µs/request | throughput req/s |\n|---|---|---|"
    )?;
    for (i, v) in results.variants.iter().enumerate() {
        writeln!(
            md,
            "| {} | {} | {} |",
            v.id,
            stats::show(results.summary(i, Sample::cpu_per_request_us), 2),
            stats::show(results.summary(i, Sample::throughput), 0),
        )?;
    }
    let json: Value = json!({
        "prices": prices.iter().map(|p| json!({
            "call": p.call,
            "us_per_call": stats::to_json(p.per_call_us),
            "cpu_ratio_to_passthrough_at_max_k": stats::to_json(p.ratio_at_max_k),
        })).collect::<Vec<_>>(),
        "path": results.to_json(),
        "machine": bench.machine.to_json(),
    });
    let md_path = out_dir.join(format!("{name}-hostcalls.md"));
    std::fs::write(&md_path, &md).with_context(|| format!("writing {}", md_path.display()))?;
    let json_path = out_dir.join(format!("{name}-hostcalls.json"));
    std::fs::write(&json_path, serde_json::to_string_pretty(&json)? + "\n")
        .with_context(|| format!("writing {}", json_path.display()))?;
    step("host-call prices written");
    note(md_path.display());
    print!("\n{md}");
    Ok(md_path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slope_of_a_line_is_its_gradient() {
        let points = [(0.0, 17.0), (4.0, 19.0), (16.0, 25.0)];
        assert!((slope(&points).unwrap() - 0.5).abs() < 1e-12);
        assert_eq!(slope(&[(1.0, 2.0)]), None);
        assert_eq!(slope(&[(1.0, 2.0), (1.0, 3.0)]), None);
    }

    #[test]
    fn every_call_and_k_has_its_own_variant_id() {
        let v = variants();
        assert_eq!(v.len(), 1 + CALLS.len() * KS.len() + 1);
        for (id, variant) in IDS.iter().zip(v.iter().skip(1)) {
            let FilterChain::Hostcall { call, k } = variant.chain else {
                panic!("{id} is not a probe")
            };
            assert_eq!(*id, format!("{call}×{k}"));
        }
    }
}
