//! What the rate limit service's decisions mean for their rules' statistics, in the
//! filter's words ([`RuleOutcome`]): so RLS and RLQS decisions are counted by the same
//! [`crate::report::Aggregate`] as the filter's, and reach the same reports, dashboard
//! series and per-rule counters.

use super::select::{Plan, Planned};
use super::verdict::{Code, Status, overall};
use crate::ruleset::{RuleOutcome, is_near};

/// Each descriptor of a decided request with its outcome for the rule that decided it
/// (`Allowed` for a descriptor no rule decides), in order.
pub fn outcomes<'p>(
    plan: &'p Plan,
    statuses: &'p [Status],
) -> impl Iterator<Item = (&'p Planned, RuleOutcome)> + 'p {
    let request_denied = overall(statuses) == Code::OverLimit;
    plan.descriptors
        .iter()
        .zip(statuses)
        .map(move |(planned, status)| (planned, outcome(planned, status, request_denied)))
}

fn outcome(planned: &Planned, status: &Status, request_denied: bool) -> RuleOutcome {
    let shadow = planned.rule.as_ref().is_some_and(|m| m.shadow);
    match (status.failed, status.code, status.shadow_denied) {
        (true, Code::Ok, _) => RuleOutcome::FailedOpen,
        (true, Code::OverLimit, _) => RuleOutcome::FailedClosed,
        (false, Code::OverLimit, _) => RuleOutcome::Denied,
        (false, Code::Ok, true) => RuleOutcome::ShadowDenied,
        // It fitted, but another descriptor denied the request: nothing was taken.
        (false, Code::Ok, false) if request_denied && !shadow => RuleOutcome::NotCharged,
        (false, Code::Ok, false) => RuleOutcome::Allowed {
            near_limit: status
                .limit
                .is_some_and(|limit| is_near(&limit, status.remaining)),
        },
    }
}

/// What a quota report's usage of one bucket says for its rule: the requests Envoy's
/// quota filter allowed (of which `shadow_denied` a shadow rule would have denied, from
/// [`super::quota::charge_usage`]) and those it denied, each with how many. Nearness to
/// the limit is not known from a report, so none is counted as near.
pub fn quota_outcomes(allowed: u64, denied: u64, shadow_denied: u64) -> [(RuleOutcome, u64); 3] {
    let shadow_denied = shadow_denied.min(allowed);
    [
        (
            RuleOutcome::Allowed { near_limit: false },
            allowed - shadow_denied,
        ),
        (RuleOutcome::Denied, denied),
        (RuleOutcome::ShadowDenied, shadow_denied),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Aggregate;
    use crate::rls::select::tests::{request, rules};
    use crate::rls::verdict::tests::{Buckets, T0};
    use crate::spec::FailureMode;

    const PER_KEY: &str = r#"{"name":"per-key","key":"global","limits":[{"requests":5,"period":"second"}],"descriptor":{"domain":"edge","entries":[{"key":"api_key"}]}}"#;
    const SHADOW: &str = r#"{"name":"shadow","key":"global","mode":"shadow","limits":[{"requests":1,"period":"second"}],"descriptor":{"domain":"edge","entries":[{"key":"path"}]}}"#;

    fn counted(plan: &Plan, statuses: &[Status]) -> Vec<RuleOutcome> {
        outcomes(plan, statuses).map(|(_, o)| o).collect()
    }

    #[test]
    fn each_descriptor_counts_as_its_status_says() {
        let rules = rules(&[PER_KEY, SHADOW]);
        let plan = rules.plan(&request(
            "edge",
            &[&[("api_key", "alice")], &[("path", "/")], &[("user", "x")]],
        ));
        let mut buckets = Buckets::default();
        let first = buckets.run(&plan, T0);
        assert_eq!(
            counted(&plan, &first.statuses),
            [
                // 4 of 5 left; the shadow bucket's only token taken; no rule.
                RuleOutcome::Allowed { near_limit: false },
                RuleOutcome::Allowed { near_limit: true },
                RuleOutcome::Allowed { near_limit: false },
            ]
        );
        let fourth = (0..3).map(|_| buckets.run(&plan, T0)).last().unwrap();
        assert_eq!(
            counted(&plan, &fourth.statuses)[..2],
            // 1 of 5 left: 80% used, near.
            [
                RuleOutcome::Allowed { near_limit: true },
                RuleOutcome::ShadowDenied
            ]
        );
        buckets.run(&plan, T0);
        let over = buckets.run(&plan, T0);
        assert_eq!(
            counted(&plan, &over.statuses)[..2],
            [RuleOutcome::Denied, RuleOutcome::ShadowDenied]
        );
    }

    #[test]
    fn a_descriptor_that_fitted_in_a_denied_request_was_not_charged() {
        let rules = rules(&[PER_KEY]);
        let alice = rules.plan(&request("edge", &[&[("api_key", "alice")]]));
        let mut buckets = Buckets::default();
        for _ in 0..5 {
            buckets.run(&alice, T0);
        }
        let both = rules.plan(&request(
            "edge",
            &[&[("api_key", "dave")], &[("api_key", "alice")]],
        ));
        let decided = buckets.run(&both, T0);
        assert_eq!(
            counted(&both, &decided.statuses),
            [RuleOutcome::NotCharged, RuleOutcome::Denied]
        );
    }

    #[test]
    fn failures_count_as_the_failure_mode_answered() {
        let rules = rules(&[PER_KEY]);
        let plan = rules.plan(&request("edge", &[&[("api_key", "a")]]));
        let open = crate::rls::failed(&plan, FailureMode::Open);
        let closed = crate::rls::failed(&plan, FailureMode::Closed);
        assert_eq!(counted(&plan, &open), [RuleOutcome::FailedOpen]);
        assert_eq!(counted(&plan, &closed), [RuleOutcome::FailedClosed]);
    }

    #[test]
    fn a_quota_report_counts_its_allowed_and_denied_requests_for_the_client() {
        let rules = rules(&[PER_KEY]);
        let plan = rules.plan(&request("edge", &[&[("api_key", "acme")]]));
        let matched = plan.descriptors[0].rule.as_ref().unwrap();
        let mut aggregate = Aggregate::default();
        for (outcome, n) in quota_outcomes(40, 7, 0) {
            aggregate.record_outcomes(&matched.rule_id, outcome, &matched.client, n, 0);
        }
        let batch = aggregate.take();
        let counts = &batch.rules[0].counts;
        assert_eq!(
            (counts.allowed, counts.denied, counts.shadow_denied),
            (40, 7, 0)
        );
        assert_eq!(batch.rules[0].top_clients[0].client, "acme");
        assert_eq!(batch.rules[0].top_clients[0].throttled, 7);
    }

    #[test]
    fn a_quota_report_counts_a_shadow_rules_would_be_denials_as_shadow_denied() {
        let rules = rules(&[SHADOW]);
        let plan = rules.plan(&request("edge", &[&[("path", "/")]]));
        let matched = plan.descriptors[0].rule.as_ref().unwrap();
        let mut aggregate = Aggregate::default();
        for (outcome, n) in quota_outcomes(10, 0, 9) {
            aggregate.record_outcomes(&matched.rule_id, outcome, &matched.client, n, 0);
        }
        let batch = aggregate.take();
        let counts = &batch.rules[0].counts;
        assert_eq!(
            (counts.allowed, counts.denied, counts.shadow_denied),
            (1, 0, 9)
        );
    }
}
