//! Rule dry runs: what a rule would have throttled, replayed from recorded traffic.
//!
//! Reports carry, per rule, the clients that sent it the most requests (a Space-Saving
//! summary, [`crate::report::TopRequesters`]), and the admin API keeps them per 10 s
//! bucket. [`estimate`] replays each recorded client's requests, bucket by bucket, through
//! a rule's limits: a bucket's requests spread evenly over it, each client starting the
//! window with full buckets, a request throttled when any of its limits has no room (and
//! then charging none, as the filter does). It sums the throttled requests and the clients
//! with at least one.
//!
//! The bound it gives, and what it says it cannot see:
//! * Within a bucket the arrival order is unknown. Requests that came bunched are replayed
//!   spread out, so for a client over the limit the replay admits up to `rate × bucket`
//!   more than it really would (the refill during the part of the bucket it was silent),
//!   and for a client under the limit in a bucket it throttles nothing even if a burst
//!   inside the bucket was over the burst size. Where traffic is steady within buckets
//!   the replay is the filter's own arithmetic.
//! * Clients outside the summaries are not replayed: `untracked_requests` says how many
//!   requests that is, at most that many more could be throttled.
//! * A summary's counts are upper bounds: `uncertain_requests` says how much of what was
//!   replayed may belong to other clients.
//! * Work is bounded: at most [`MAX_CLIENTS`] clients, [`MAX_BUCKETS`] buckets each and
//!   [`MAX_REPLAYED_REQUESTS`] replayed decisions; clients beyond that (the smallest
//!   first) are counted in `skipped_clients` and `skipped_requests`, not guessed.
//! * Token limits are not replayed (the recorded traffic has no token counts), and soft
//!   margins, delays and elastic pools are not either: an over-limit request counts as
//!   throttled. A request-header cost is replayed at its default.
//! * The admin API sums a client's requests over every proxy: for a `scope: proxy` rule
//!   spread over several Envoys the replay, one bucket per client, errs towards
//!   throttling.

use crate::rule::{Cost, Limit, Rule};
use crate::time::{NANOS_PER_MILLI, Nanos};

/// Most clients replayed in one estimate.
pub const MAX_CLIENTS: usize = 1_000;
/// Most buckets replayed per client (an hour of 10 s buckets).
pub const MAX_BUCKETS: usize = 360;
/// Most requests replayed in one estimate, in all: a few tens of milliseconds of work.
pub const MAX_REPLAYED_REQUESTS: u64 = 2_000_000;

/// One client's recorded requests in one bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordedBucket {
    /// The bucket's start, Unix milliseconds.
    pub start_ms: u64,
    /// Requests, an upper bound (a Space-Saving count).
    pub requests: u64,
    /// How much of `requests` may be other clients'.
    pub error: u64,
}

/// One client's recorded requests over the window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedClient {
    pub client: String,
    pub buckets: Vec<RecordedBucket>,
}

impl RecordedClient {
    fn requests(&self) -> u64 {
        self.buckets
            .iter()
            .fold(0, |sum, b| sum.saturating_add(b.requests))
    }
}

/// A rule's recorded traffic over a window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// The length of a bucket, milliseconds.
    pub bucket_ms: u64,
    /// Requests the rule decided in the window: exact, from its counts.
    pub requests: u64,
    pub clients: Vec<RecordedClient>,
}

/// What a rule would have throttled of recorded traffic.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Estimate {
    pub throttled_requests: u64,
    /// Clients with at least one throttled request.
    pub throttled_clients: u64,
    pub replayed_requests: u64,
    pub replayed_clients: u64,
    /// How much of `replayed_requests` may belong to clients not replayed.
    pub uncertain_requests: u64,
    /// Requests of clients outside the recorded summaries: not replayed, and at most that
    /// many more throttled.
    pub untracked_requests: u64,
    /// Clients left out by the work bound, and their requests.
    pub skipped_clients: u64,
    pub skipped_requests: u64,
}

/// Replays `recorded` through `rule`'s request limits (see the module's notes).
pub fn estimate(rule: &Rule, recorded: &Recorded) -> Estimate {
    let mut out = Estimate::default();
    let mut clients: Vec<&RecordedClient> = recorded.clients.iter().collect();
    // The busiest first: the work bound leaves out the smallest clients.
    clients.sort_by(|a, b| {
        b.requests()
            .cmp(&a.requests())
            .then_with(|| a.client.cmp(&b.client))
    });
    let mut tracked_lower_bound: u64 = 0;
    for (i, client) in clients.into_iter().enumerate() {
        let requests = client.requests();
        let error = client
            .buckets
            .iter()
            .fold(0u64, |sum, b| sum.saturating_add(b.error.min(b.requests)));
        tracked_lower_bound = tracked_lower_bound.saturating_add(requests - error);
        if i >= MAX_CLIENTS
            || out.replayed_requests.saturating_add(requests) > MAX_REPLAYED_REQUESTS
        {
            out.skipped_clients += 1;
            out.skipped_requests = out.skipped_requests.saturating_add(requests);
            continue;
        }
        let throttled = replay_client(rule, recorded.bucket_ms, client);
        out.replayed_clients += 1;
        out.replayed_requests += requests;
        out.uncertain_requests = out.uncertain_requests.saturating_add(error);
        out.throttled_requests += throttled;
        if throttled > 0 {
            out.throttled_clients += 1;
        }
    }
    out.untracked_requests = recorded.requests.saturating_sub(tracked_lower_bound);
    out
}

/// The requests of one client that `rule` throttles, its buckets replayed in time order.
fn replay_client(rule: &Rule, bucket_ms: u64, client: &RecordedClient) -> u64 {
    let limits: Vec<&Limit> = rule
        .limits_for(&client.client)
        .iter()
        .filter(|l| !l.counts.is_tokens())
        .collect();
    if limits.is_empty() {
        return 0;
    }
    let cost = match &rule.cost {
        Cost::Fixed(n) => *n,
        Cost::Header { default, .. } => *default,
    };
    let mut buckets = client.buckets.clone();
    buckets.sort_by_key(|b| b.start_ms);
    let first = buckets.len().saturating_sub(MAX_BUCKETS);
    // Full buckets at the start of the window: a TAT at or before the first arrival.
    let mut tats = vec![Nanos::ZERO; limits.len()];
    let bucket_ns = u128::from(bucket_ms) * u128::from(NANOS_PER_MILLI);
    let mut throttled = 0;
    for bucket in buckets.iter().skip(first) {
        let n = u128::from(bucket.requests);
        let start_ns = u128::from(bucket.start_ms) * u128::from(NANOS_PER_MILLI);
        for i in 0..n {
            // The middle of the i-th of n equal slices of the bucket.
            let at = start_ns + (2 * i + 1) * bucket_ns / (2 * n);
            let now = Nanos::new(u64::try_from(at).unwrap_or(u64::MAX));
            // All of the limits must have room; a throttled request charges none.
            let fits =
                (limits.iter().zip(&tats)).all(|(l, tat)| l.gcra.check(*tat, now, cost).allowed);
            if fits {
                for (limit, tat) in limits.iter().zip(tats.iter_mut()) {
                    *tat = limit.gcra.check(*tat, now, cost).new_tat;
                }
            } else {
                throttled += 1;
            }
        }
    }
    throttled
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::RuleSpec;

    const BUCKET_MS: u64 = 10_000;
    const T0: u64 = 1_800_000_000_000;

    fn rule(limits: serde_json::Value) -> Rule {
        let spec: RuleSpec = serde_json::from_value(serde_json::json!({
            "name": "api", "key": {"header": "x-api-key"}, "limits": limits,
            "overrides": [{"client": "vip", "limits": [{"requests": 1000, "period": "second"}]}]
        }))
        .unwrap();
        Rule::try_from(spec).unwrap()
    }

    fn per_second(requests: u64, burst: u64) -> Rule {
        rule(serde_json::json!([{"requests": requests, "period": "second", "burst": burst}]))
    }

    /// `client` sending `per_bucket[i]` requests in the i-th bucket from `T0`.
    fn client(name: &str, per_bucket: &[u64]) -> RecordedClient {
        RecordedClient {
            client: name.to_string(),
            buckets: per_bucket
                .iter()
                .enumerate()
                .map(|(i, &requests)| RecordedBucket {
                    start_ms: T0 + i as u64 * BUCKET_MS,
                    requests,
                    error: 0,
                })
                .collect(),
        }
    }

    fn recorded(clients: Vec<RecordedClient>) -> Recorded {
        Recorded {
            bucket_ms: BUCKET_MS,
            requests: clients.iter().map(RecordedClient::requests).sum(),
            clients,
        }
    }

    #[test]
    fn a_limit_above_the_traffic_throttles_nothing_and_one_below_it_does() {
        // 100 requests spread over 10 s: 10 a second, at most 1 in any 100 ms.
        let traffic = recorded(vec![client("a", &[100, 100, 0, 100])]);
        let above = estimate(&per_second(10, 1), &traffic);
        assert_eq!((above.throttled_requests, above.throttled_clients), (0, 0));
        assert_eq!((above.replayed_requests, above.replayed_clients), (300, 1));
        let below = estimate(&per_second(9, 1), &traffic);
        assert!(below.throttled_requests > 0, "{below:?}");
        assert_eq!(below.throttled_clients, 1);
    }

    #[test]
    fn a_steady_client_over_the_limit_is_admitted_burst_plus_rate_times_time() {
        // 100 requests in one 10 s bucket against 5/s with a burst of 10: the first
        // arrives at 50 ms with a full bucket, so 10 + 5 × 9.95 s ≈ 59 pass.
        let est = estimate(&per_second(5, 10), &recorded(vec![client("a", &[100])]));
        assert!((40..=42).contains(&est.throttled_requests), "{est:?}");
        // After a silent bucket the burst is back: the next bucket admits as many again.
        let est = estimate(
            &per_second(5, 10),
            &recorded(vec![client("a", &[100, 0, 100])]),
        );
        assert!((80..=84).contains(&est.throttled_requests), "{est:?}");
    }

    #[test]
    fn clients_are_counted_apart_and_overrides_apply() {
        let traffic = recorded(vec![
            client("heavy", &[500]),
            client("light", &[10]),
            client("vip", &[500]),
        ]);
        let est = estimate(&per_second(5, 5), &traffic);
        assert_eq!(est.throttled_clients, 1, "{est:?}");
        assert_eq!(est.replayed_clients, 3);
        assert!(
            (440..=450).contains(&est.throttled_requests),
            "only heavy: {est:?}"
        );
    }

    #[test]
    fn untracked_and_uncertain_requests_are_said_not_guessed() {
        let mut traffic = recorded(vec![client("a", &[50])]);
        traffic.clients[0].buckets[0].error = 20;
        // The rule decided 1,000 requests; the summary holds 50, 20 of which may be others'.
        traffic.requests = 1_000;
        let est = estimate(&per_second(1, 1), &traffic);
        assert_eq!(est.uncertain_requests, 20);
        assert_eq!(est.untracked_requests, 970);
    }

    #[test]
    fn work_is_bounded_and_what_is_left_out_is_counted() {
        let big = MAX_REPLAYED_REQUESTS / 2 + 1;
        let traffic = recorded(vec![
            client("a", &[big]),
            client("b", &[big]),
            client("c", &[5]),
        ]);
        let est = estimate(&per_second(1_000_000, 1_000_000), &traffic);
        assert_eq!(est.replayed_clients, 2, "{est:?}");
        assert_eq!((est.skipped_clients, est.skipped_requests), (1, big));
        assert!(est.replayed_requests <= MAX_REPLAYED_REQUESTS);
        let many = recorded(
            (0..MAX_CLIENTS + 3)
                .map(|i| client(&format!("c{i}"), &[1]))
                .collect(),
        );
        let est = estimate(&per_second(1, 1), &many);
        assert_eq!(
            (est.replayed_clients, est.skipped_clients),
            (MAX_CLIENTS as u64, 3)
        );
    }
}
