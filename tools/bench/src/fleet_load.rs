//! Closed-loop HTTP load on several Envoys at once, for the fleet-wide sections: the
//! harness's load generator with each connection sending its next request as soon as the
//! last one is answered, cycling through client keys, until the run's deadline. Answers
//! are counted per Envoy, per client key and per 100 ms of the run (with the slowest
//! answer of each), so a fault run can tell what happened before, during and after the
//! fault.
//!
//! wrk cannot tell which key an answer belongs to; this can, which the per-client bar
//! needs. It shares the machine's cores with the Envoys, so the offered load is what
//! the machine gives, and the sections report it.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Result;
use sluice_harness::load::{Load, Outcome, Req, Tally};

/// Width of one bin of the run's timeline.
pub const BIN: Duration = Duration::from_millis(100);
/// An answer slower than this is counted as an error: nothing on the request path may wait.
const ANSWER_LIMIT: Duration = Duration::from_secs(5);
const HEADER: &str = "x-api-key";

/// What to send.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Each Envoy's listener and how many connections it gets (the traffic split).
    pub targets: Vec<(SocketAddr, usize)>,
    pub path: String,
    /// Requests carry `x-api-key: PREFIXn` for n in `0..clients`, in turn.
    pub key_prefix: String,
    pub clients: u64,
    pub duration: Duration,
}

/// Runs `plan` from now until its duration has passed; blocks.
pub fn run(plan: &Plan) -> Result<Outcome> {
    let clients = plan.clients.max(1);
    let (path, prefix) = (plan.path.clone(), plan.key_prefix.clone());
    Load::new(plan.targets.iter().copied())
        .for_duration(plan.duration)
        .answer_limit(ANSWER_LIMIT)
        .bins(BIN)
        .count_keys(clients as usize, move |n| (n % clients) as usize)
        .keep_latencies()
        .threads(2)
        .run(move |n| {
            Req::get(path.as_str())
                .header("host", "bench")
                .header(HEADER, format!("{prefix}{}", n % clients))
        })
}

/// Answers neither admitted (2xx) nor throttled (429).
pub fn other(counts: &Tally) -> u64 {
    counts.responses() - counts.admitted() - counts.get(429)
}

/// A duration in milliseconds, for the tables.
pub fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}
