//! Property tests: the GCRA limiter against a naive token bucket, and the accuracy
//! promise `admitted ≤ burst + rate × elapsed` over every window.

use std::num::{NonZeroU32, NonZeroU64};

use proptest::prelude::*;
use sluice_core::gcra::Gcra;
use sluice_core::limiter::{BucketRequest, BucketResult, SlotTable};
use sluice_core::rule::Limit;
use sluice_core::spec::FailureMode;
use sluice_core::store::MemoryStore;
use sluice_core::time::{NANOS_PER_SECOND, Nanos};

const T0: u64 = 1_700_000_000 * NANOS_PER_SECOND;

/// A token bucket written the obvious way, in "nanoseconds of credit": it holds up to
/// `burst × interval` credit, gains one per nanosecond, and a token costs `interval`.
struct NaiveBucket {
    credit: u64,
    capacity: u64,
    interval: u64,
    last: u64,
}

impl NaiveBucket {
    fn new(g: &Gcra, now: u64) -> Self {
        Self {
            credit: g.capacity_ns(),
            capacity: g.capacity_ns(),
            interval: g.interval_ns(),
            last: now,
        }
    }

    fn refill(&mut self, now: u64) {
        self.credit = (self.credit + (now - self.last)).min(self.capacity);
        self.last = now;
    }

    fn fits(&self, cost: u64) -> bool {
        self.credit >= cost * self.interval
    }

    fn take(&mut self, cost: u64) {
        self.credit -= cost * self.interval;
    }
}

fn gcra_strategy() -> impl Strategy<Value = Gcra> {
    (
        1u64..=50,
        prop_oneof![Just(1u64), Just(60), 1u64..=10],
        1u64..=60,
    )
        .prop_map(|(requests, period, burst)| {
            Gcra::new(
                NonZeroU64::new(requests).unwrap(),
                NonZeroU64::new(period * NANOS_PER_SECOND).unwrap(),
                NonZeroU64::new(burst).unwrap(),
            )
            .unwrap()
        })
}

/// Gaps between requests (ns) and their costs.
fn arrivals() -> impl Strategy<Value = Vec<(u64, u64)>> {
    prop::collection::vec((0u64..300_000_000, 1u64..=4), 1..200)
}

fn limit_of(g: Gcra, identity: u64) -> Limit {
    Limit {
        global: false,
        requests: 1,
        period_seconds: 1,
        burst: g.burst(),
        gcra: g,
        identity,
        counts: Default::default(),
        soft: None,
    }
}

proptest! {
    #[test]
    fn gcra_decides_exactly_like_a_naive_token_bucket(g in gcra_strategy(), arrivals in arrivals()) {
        let mut tat = Nanos::ZERO;
        let mut now = T0;
        let mut naive = NaiveBucket::new(&g, now);
        for (gap, cost) in arrivals {
            now += gap;
            naive.refill(now);
            let verdict = g.check(tat, Nanos::new(now), cost);
            prop_assert_eq!(verdict.allowed, naive.fits(cost));
            if verdict.allowed {
                naive.take(cost);
                tat = verdict.new_tat;
                prop_assert_eq!(verdict.remaining, naive.credit / naive.interval);
            } else {
                // The reported wait is exact: one nanosecond earlier would not fit.
                let at = now + verdict.retry_after_ns;
                if cost <= g.burst() {
                    prop_assert!(g.check(tat, Nanos::new(at), cost).allowed);
                    prop_assert!(!g.check(tat, Nanos::new(at - 1), cost).allowed);
                }
            }
        }
    }

    #[test]
    fn no_window_admits_more_than_burst_plus_rate_times_elapsed(g in gcra_strategy(), arrivals in arrivals()) {
        let table = SlotTable::new(NonZeroU32::new(64).unwrap());
        let store = MemoryStore::new();
        let limits = [limit_of(g, 1)];
        let mut now = T0;
        let mut admitted: Vec<(u64, u64)> = Vec::new();
        for (gap, cost) in arrivals {
            now += gap;
            let request = BucketRequest { fingerprint: 42, limits: &limits, cost, on_failure: FailureMode::Open, tokens: Default::default(), max_delay_ns: None, elastic_open: false };
            if table.acquire(&store, Nanos::new(now), &[request]).allowed {
                admitted.push((now, cost));
            }
        }
        for (i, &(start, _)) in admitted.iter().enumerate() {
            let mut tokens = 0;
            for &(at, cost) in &admitted[i..] {
                tokens += cost;
                // Everything admitted within [start, at] must fit in burst + elapsed/interval.
                let allowance = g.burst() as u128 + (at - start) as u128 / g.interval_ns() as u128;
                let elapsed = at - start;
                prop_assert!(u128::from(tokens) <= allowance, "{} tokens in {} ns", tokens, elapsed);
            }
        }
    }

    #[test]
    fn multi_tier_charging_is_all_or_nothing(
        a in gcra_strategy(), b in gcra_strategy(), arrivals in arrivals()
    ) {
        prop_assume!(a.interval_ns() != b.interval_ns() || a.burst() != b.burst());
        let table = SlotTable::new(NonZeroU32::new(64).unwrap());
        let store = MemoryStore::new();
        let limits = [limit_of(a, 1), limit_of(b, 2)];
        let mut now = T0;
        let mut naive = [NaiveBucket::new(&a, now), NaiveBucket::new(&b, now)];
        for (gap, cost) in arrivals {
            now += gap;
            naive.iter_mut().for_each(|n| n.refill(now));
            let expected = naive.iter().all(|n| n.fits(cost));
            let request = BucketRequest { fingerprint: 7, limits: &limits, cost, on_failure: FailureMode::Open, tokens: Default::default(), max_delay_ns: None, elastic_open: false };
            let outcome = table.acquire(&store, Nanos::new(now), &[request]);
            prop_assert_eq!(outcome.allowed, expected);
            let evaluated = matches!(outcome.buckets[0], BucketResult::Allowed { .. } | BucketResult::Denied { .. });
            prop_assert!(evaluated, "{:?}", outcome);
            if expected {
                naive.iter_mut().for_each(|n| n.take(cost));
            }
        }
    }
}

proptest! {
    /// Shared data can hold anything (another module version, a corrupted write): the
    /// decoder must refuse it, never panic.
    #[test]
    fn arbitrary_slot_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        let _ = sluice_core::slot::SlotValue::decode(&bytes);
    }

    /// The plugin configuration comes from an operator's file: any bytes get an error,
    /// never a panic.
    #[test]
    fn arbitrary_configuration_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        let _ = sluice_core::config::FilterConfig::from_json(&bytes);
    }

    /// Requests are attacker-controlled: any method, authority, path and header values
    /// are matched and keyed without panicking.
    #[test]
    fn arbitrary_requests_never_panic(
        method in ".{0,8}", authority in ".{0,40}", path in ".{0,60}",
        values in prop::collection::vec(".{0,40}", 4),
    ) {
        let config = sluice_core::config::FilterConfig::from_json(br#"{"rules":[
            {"name":"a","match":{"host":"*.example.com","path_regex":"/v[0-9]+/.*"},"key":{"composite":[{"header":"x-api-key"},{"client_ip":{"trusted_hops":2}}]},"limits":[{"requests":5,"period":1}],"cost":{"header":{"name":"x-cost","max":3}}},
            {"name":"b","key":{"query":"k"},"limits":[{"requests":5,"period":1}]},
            {"name":"c","key":"path","limits":[{"requests":5,"period":1}]}]}"#).unwrap();
        let request = sluice_core::request::HttpRequest {
            method, authority, path,
            headers: vec![
                ("x-api-key".into(), values[0].clone()),
                ("x-forwarded-for".into(), values[1].clone()),
                ("x-cost".into(), values[2].clone()),
                ("host".into(), values[3].clone()),
            ],
            peer_ip: None,
            identity: Default::default(),
        };
        let store = MemoryStore::new();
        let leases = MemoryStore::new();
        let global = sluice_core::ruleset::GlobalBuckets {
            table: &config.lease_table,
            store: &leases,
            view: sluice_core::global::lease::FleetView::ALONE,
        };
        let cx = sluice_core::ruleset::DecisionContext {
            store: &store,
            table: &config.table,
            global,
            now: Nanos::new(T0),
            default_failure: config.failure_mode,
            queue: None,
        };
        let _ = config.ruleset.decide(&request, &cx);
    }
}

proptest! {
    /// Whatever a bucket has been through, the rate-limit fields never tell a client it
    /// has more left than the limit they read it against, and the advertised policy never
    /// promises more than the rate.
    #[test]
    fn rate_limit_fields_never_claim_more_than_the_limit(
        requests in 1u64..=1_000,
        period in prop_oneof![Just(1u64), Just(60), Just(3_600), 1u64..=100],
        burst in 1u64..=2_000,
        arrivals in arrivals(),
    ) {
        use sluice_core::response::{RateLimitFields, RateLimitHeaders, RenderedRule, window_seconds};
        use sluice_core::rule::Rule;
        use sluice_core::ruleset::Limited;
        use sluice_core::limiter::TierVerdict;
        let spec: sluice_core::spec::RuleSpec = serde_json::from_value(serde_json::json!({
            "name": "p", "key": "global",
            "limits": [{"requests": requests, "period": period, "burst": burst}],
        })).unwrap();
        let Ok(rule) = Rule::try_from(spec) else { return Ok(()) };
        let limit = rule.limits[0];
        let text = RenderedRule::new(&rule);
        // q / w never exceeds requests / period.
        let w = window_seconds(&limit);
        prop_assert!(u128::from(limit.burst) * u128::from(period) <= u128::from(w) * u128::from(requests));
        let mut tat = Nanos::new(T0);
        let mut now = T0;
        for (gap, cost) in arrivals {
            now += gap;
            let verdict = limit.gcra.check(tat, Nanos::new(now), cost);
            if verdict.allowed {
                tat = verdict.new_tat;
            }
            let limited = Limited { rule: &rule, limits: &rule.limits, rendered: text.for_client(""), tier: TierVerdict { tier: 0, verdict } };
            let fields = RateLimitFields::of(&limited, !verdict.allowed).to_list(RateLimitHeaders::Both);
            let value = |name: &str| fields.iter().find(|(n, _)| *n == name).map(|(_, v)| v.clone()).unwrap();
            let x_limit: u64 = value("x-ratelimit-limit").parse().unwrap();
            let x_remaining: u64 = value("x-ratelimit-remaining").parse().unwrap();
            prop_assert!(x_remaining <= x_limit, "{x_remaining} > {x_limit}");
            let q: u64 = value("ratelimit-policy").split(";q=").nth(1).unwrap().split(';').next().unwrap().parse().unwrap();
            let r: u64 = value("ratelimit").split(";r=").nth(1).unwrap().split(';').next().unwrap().parse().unwrap();
            prop_assert!(r <= q, "r={r} > q={q}");
            prop_assert_eq!(q, x_limit);
        }
    }
}
