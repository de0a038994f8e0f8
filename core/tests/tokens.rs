//! Token budgets: reserve at the decision, commit the usage when the response ends, over
//! the real decision path with the in-memory stores and a fake clock.

use proptest::prelude::*;
use sluice_core::global::lease::FleetView;
use sluice_core::request::{HttpRequest, WithBody};
use sluice_core::ruleset::{Decision, Outcome};
use sluice_core::store::MemoryStore;
use sluice_core::time::{NANOS_PER_SECOND, Nanos};
use sluice_core::tokens::{BodyFacts, Reservation, SettleContext, Settled, Settlement};
use sluice_core::usage::{Usage, UsageFormat};

const T0: u64 = 1_700_000_000 * NANOS_PER_SECOND;

mod support;

use support::TestFilter as Harness;

/// A rule of one token limit per API key: `tokens` per second, burst `burst`, reserving
/// `default` output tokens unless the body names a maximum.
fn rule(tokens: u64, burst: u64, default: u64, scope: &str) -> String {
    format!(
        r#"[{{"name":"llm","key":{{"header":"x-api-key"}},
             "limits":[{{"tokens":{tokens},"period":"second","burst":{burst},"scope":"{scope}"}}],
             "tokens":{{"usage":"openai","default_estimate":{default}}}}}]"#
    )
}

impl Harness {
    fn decide(&self, max_tokens: Option<u64>, now: u64) -> Decision<'_> {
        let request = WithBody {
            request: HttpRequest::get("/v1/chat/completions").with_header("x-api-key", "k"),
            facts: BodyFacts {
                max_output: max_tokens,
                bytes: 100,
                read: max_tokens.is_some(),
            },
        };
        let cx = self.context(now, None);
        self.config.ruleset.decide(&request, &cx)
    }

    fn settle(&self, reservation: &Reservation, settlement: Settlement, now: u64) -> Settled {
        reservation.settle(
            settlement,
            &SettleContext {
                store: &self.store,
                table: &self.config.table,
                lease_table: &self.config.lease_table,
                leases: &self.leases,
                view: FleetView::ALONE,
                now: Nanos::new(now),
            },
        )
    }

    /// Tokens left in the bucket at `now`, as an allowed request of `1` sees them (plus
    /// that one).
    fn remaining(&self, now: u64) -> u64 {
        let d = self.decide(Some(1), now);
        let left = d
            .tightest
            .map(|t| t.tier.verdict.remaining + 1)
            .unwrap_or(0);
        for r in &d.reservations {
            self.settle(r, Settlement::Refund, now);
        }
        left
    }
}

fn total(n: u64) -> Settlement {
    Settlement::Used(Usage {
        input: None,
        output: None,
        total: Some(n),
    })
}

#[test]
fn a_reservation_is_the_estimate_and_the_commit_is_the_usage() {
    for scope in ["proxy", "global"] {
        // 1 token per second refill: nothing refills within the test's nanoseconds.
        let h = Harness::new(&rule(1, 1_000, 300, scope));
        let d = h.decide(Some(200), T0);
        assert!(d.is_allowed());
        let [reservation] = d.reservations.as_slice() else {
            panic!("{scope}: one reservation, got {:?}", d.reservations);
        };
        assert_eq!(reservation.format, UsageFormat::OpenAiChat);
        assert_eq!(
            reservation.limits[0].tokens, 200,
            "{scope}: max_tokens reserved"
        );
        assert_eq!(h.remaining(T0), 800, "{scope}");
        let settled = h.settle(reservation, total(50), T0);
        assert_eq!((settled.charged, settled.refunded), (50, 150), "{scope}");
        assert_eq!(h.remaining(T0), 950, "{scope}: the unused 150 went back");
        // Without max_tokens the default is reserved; more usage is charged on top.
        let d = h.decide(None, T0);
        assert_eq!(d.reservations[0].limits[0].tokens, 300);
        let settled = h.settle(&d.reservations[0], total(500), T0);
        assert_eq!((settled.extra, settled.forgiven), (200, 0));
        assert_eq!(h.remaining(T0), 450, "{scope}: 50 + 500 charged");
    }
}

/// Extra usage for a global bucket whose lease entry was reclaimed while the request ran
/// creates the entry again and says so, so the filter notes a new bucket and the control
/// service syncs it early instead of finding it at its next full scan. With the entry in
/// place nothing is created.
#[test]
fn extra_usage_after_the_global_entry_was_reclaimed_recreates_it_and_says_so() {
    let mut h = Harness::new(&rule(1, 1_000, 300, "global"));
    let mut kept = h.decide(Some(100), T0);
    let kept = std::mem::take(&mut kept.reservations);
    let settled = h.settle(&kept[0], total(500), T0);
    assert_eq!((settled.extra, settled.global_created), (400, 0));

    let mut reclaimed = h.decide(Some(100), T0);
    let reclaimed = std::mem::take(&mut reclaimed.reservations);
    h.leases = MemoryStore::new();
    let settled = h.settle(&reclaimed[0], total(500), T0);
    assert_eq!((settled.extra, settled.global_created), (400, 1));
    // Usage within the reservation has nothing to book on a missing entry.
    let mut within = h.decide(Some(100), T0);
    let within = std::mem::take(&mut within.reservations);
    h.leases = MemoryStore::new();
    let settled = h.settle(&within[0], total(50), T0);
    assert_eq!(settled.global_created, 0);
}

#[test]
fn refunds_give_everything_back_and_unknown_usage_keeps_the_reservation() {
    for scope in ["proxy", "global"] {
        let h = Harness::new(&rule(1, 1_000, 300, scope));
        let a = h.decide(Some(400), T0);
        let b = h.decide(Some(100), T0);
        assert_eq!(h.remaining(T0), 500, "{scope}");
        h.settle(&a.reservations[0], Settlement::Refund, T0);
        assert_eq!(h.remaining(T0), 900, "{scope}");
        h.settle(&b.reservations[0], Settlement::Unknown, T0);
        assert_eq!(
            h.remaining(T0),
            900,
            "{scope}: the reservation stood as the charge"
        );
        // A usage that does not report the limit's count keeps the reservation too.
        let c = h.decide(Some(100), T0);
        let only_input = Settlement::Used(Usage {
            input: Some(5),
            output: None,
            total: None,
        });
        assert_eq!(h.settle(&c.reservations[0], only_input, T0).unreported, 1);
        assert_eq!(h.remaining(T0), 800, "{scope}");
    }
}

#[test]
fn a_reservation_that_does_not_fit_is_denied_and_a_large_one_waits_for_a_full_bucket() {
    let h = Harness::new(&rule(10, 100, 30, "proxy"));
    let first = h.decide(Some(80), T0);
    assert!(first.is_allowed());
    let denied = h.decide(Some(30), T0);
    assert!(matches!(denied.outcome, Outcome::Denied(_)));
    assert!(denied.reservations.is_empty(), "a denial reserves nothing");
    // Asking for more than the burst reserves the burst: it fits a full bucket.
    let h = Harness::new(&rule(10, 100, 30, "proxy"));
    let big = h.decide(Some(5_000), T0);
    assert!(big.is_allowed());
    assert_eq!(big.reservations[0].limits[0].tokens, 100);
}

#[test]
fn extra_usage_goes_into_debt_of_at_most_one_burst_and_the_next_requests_wait() {
    let h = Harness::new(&rule(10, 100, 10, "proxy"));
    let d = h.decide(Some(10), T0);
    let settled = h.settle(&d.reservations[0], total(1_000), T0);
    // 10 reserved, 990 extra: 190 fit (the bucket's 90 and one burst of debt).
    assert_eq!((settled.extra, settled.forgiven), (990, 800));
    assert!(!h.decide(Some(1), T0).is_allowed());
    // The debt (100) and one token are paid back by 10.1 s of refill.
    assert!(!h.decide(Some(1), T0 + 10 * NANOS_PER_SECOND).is_allowed());
    assert!(
        h.decide(Some(1), T0 + 10_100 * NANOS_PER_SECOND / 1_000)
            .is_allowed()
    );
}

#[test]
fn a_rule_with_request_and_token_limits_charges_each_its_own_cost() {
    let h = Harness::new(
        r#"[{"name":"llm","key":{"header":"x-api-key"},
             "limits":[{"requests":2,"period":"minute"},{"tokens":1000,"period":"minute","count":"output"}],
             "tokens":{"usage":"anthropic","default_estimate":100}}]"#,
    );
    let a = h.decide(Some(600), T0);
    assert_eq!(a.reservations[0].format, UsageFormat::AnthropicMessages);
    assert_eq!(
        a.reservations[0].limits.len(),
        1,
        "only the token limit is settled"
    );
    // 400 tokens left: 500 does not fit, although one request does.
    assert!(!h.decide(Some(500), T0).is_allowed());
    assert!(h.decide(Some(400), T0).is_allowed());
    // The request limit (2 a minute) binds now, whatever the tokens.
    h.settle(&a.reservations[0], Settlement::Refund, T0);
    assert!(!h.decide(Some(1), T0).is_allowed());
}

/// One request of the simulation: its gap after the previous one, its estimate, its
/// usage, and how many later requests arrive before its response ends.
fn requests(max_usage: u64) -> impl Strategy<Value = Vec<(u64, u64, u64, usize)>> {
    prop::collection::vec(
        (0u64..50_000_000, 1u64..=300, 0u64..=max_usage, 0usize..8),
        1..300,
    )
}

/// Runs `requests` through a 1,000-tokens-a-second budget with a burst of 2,000 and
/// returns, at each step, the usage committed plus the reservations in flight, the
/// allowance `burst + rate × elapsed`, and the extra usage committed so far.
fn simulate(scope: &str, requests: &[(u64, u64, u64, usize)], cap_usage_at_estimate: bool) {
    let h = Harness::new(&rule(1_000, 2_000, 100, scope));
    let (burst, rate_per_ns) = (2_000u128, 1_000u128);
    let mut now = T0;
    // (ends after this many more arrivals, reservation, usage)
    let mut in_flight: Vec<(usize, Reservation, u64)> = Vec::new();
    let (mut committed, mut extra, mut forgiven) = (0u128, 0u128, 0u128);
    for &(gap, estimate, usage, lasts) in requests {
        now += gap;
        let usage = if cap_usage_at_estimate {
            usage.min(estimate)
        } else {
            usage
        };
        let d = h.decide(Some(estimate), now);
        if let Some(r) = d.reservations.into_iter().next() {
            in_flight.push((lasts, r, usage));
        }
        let mut still = Vec::new();
        for (left, r, usage) in in_flight.drain(..) {
            if left == 0 {
                let settled = h.settle(&r, total(usage), now);
                committed += u128::from(settled.charged);
                extra += u128::from(settled.extra);
                forgiven += u128::from(settled.forgiven);
            } else {
                still.push((left - 1, r, usage));
            }
        }
        in_flight = still;
        let reserved: u128 = in_flight
            .iter()
            .map(|(_, r, _)| u128::from(r.limits[0].tokens))
            .sum();
        let allowance = burst + rate_per_ns * u128::from(now - T0) / u128::from(NANOS_PER_SECOND);
        // Usage committed beyond reservations is debt: at most one burst of it stands.
        let debt = (extra - forgiven).min(burst);
        assert!(
            committed - forgiven + reserved <= allowance + debt,
            "{scope}: committed {committed} (forgiven {forgiven}) + reserved {reserved} > {allowance} + {debt}"
        );
        if cap_usage_at_estimate {
            assert_eq!(extra, 0);
            assert!(committed + reserved <= allowance);
        }
    }
}

proptest! {
    #[test]
    fn usage_within_the_estimates_never_exceeds_burst_plus_rate_times_elapsed(reqs in requests(300)) {
        simulate("proxy", &reqs, true);
    }

    #[test]
    fn usage_beyond_the_estimates_overshoots_by_at_most_one_burst_of_debt(reqs in requests(3_000)) {
        simulate("proxy", &reqs, false);
    }

    #[test]
    fn a_global_budget_alone_keeps_the_same_bound(reqs in requests(300)) {
        simulate("global", &reqs, true);
    }
}

#[test]
fn input_is_estimated_from_the_body_only_where_the_rule_opts_in() {
    let rules = |opt_in: bool| {
        format!(
            r#"[{{"name":"llm","key":{{"header":"x-api-key"}},
                 "limits":[{{"tokens":1000,"period":"minute","count":"input"}},{{"tokens":1000,"period":"minute","count":"total"}}],
                 "tokens":{{"usage":{{"json_pointer":{{"input":"/u/in","output":"/u/out"}}}},"default_estimate":7,"estimate_input_from_body":{opt_in}}}}}]"#
        )
    };
    // The harness's request has a 100-byte body and names max_tokens 20.
    let h = Harness::new(&rules(true));
    let d = h.decide(Some(20), T0);
    let r = &d.reservations[0];
    assert!(matches!(r.format, UsageFormat::JsonPointer(_)));
    let reserved: Vec<u64> = r.limits.iter().map(|l| l.tokens).collect();
    assert_eq!(reserved, [25, 45], "input 100 / 4, total 25 + 20");
    let h = Harness::new(&rules(false));
    let d = h.decide(None, T0);
    let reserved: Vec<u64> = d.reservations[0].limits.iter().map(|l| l.tokens).collect();
    assert_eq!(
        reserved,
        [1, 7],
        "no input estimate: the 1-token floor; total is the default"
    );
}
