use std::collections::{HashMap, HashSet};

use sluice_core::global::table::LeaseTable;
use sluice_core::limiter::SlotTable;
use sluice_core::request::RequestAttributes;
use sluice_core::rule::Rule;
use sluice_core::ruleset::{
    DecisionContext, DecisionSink, GlobalBuckets, Outcome, RuleOutcome, Ruleset,
};
use sluice_core::store::MemoryStore;
use sluice_core::time::Nanos;
use sluice_core::tokens::{TokenEstimate, cost_of};

use crate::structured::{self, LATEST_CLOCK_NS, Scenario};

/// `Ruleset::decide`, the whole per-request decision, over generated rulesets, requests
/// and clocks ([`Scenario`]: rules and requests share one vocabulary, so matching, keys,
/// costs, overrides, shadow rules and global limits are all reached; tables are small, so
/// clients share slots and the lease table fills up).
///
/// Asserts, for every request:
/// - deciding never panics, whatever the rules, request attributes and time steps;
/// - the outcome agrees with what each rule reported: an allowed request has no rule that
///   denied it or failed closed, and a denial names a rule that reported exactly that;
/// - no bucket ever admits more than `burst + rate × elapsed` (the promise in
///   ARCHITECTURE.md "Exactness"): for every (rule, client, limit), the tokens charged by
///   requests its rule allowed, since the first of them, fit in the bucket's capacity plus
///   its refill since then. The check stops at the first eviction (a slot so crowded that
///   a bucket still holding state was dropped, which the limiter counts as the one way it
///   can admit more) and ignores requests in which some rule failed open (admitted without
///   being charged, by design). It holds for host clocks up to `LATEST_CLOCK_NS` (the year
///   2408), the domain `gcra.rs` states; later clocks are still decided, without
///   panicking, but a bucket's TAT can no longer hold its whole backlog there.
///
/// The bytes become a [`Scenario`] as libfuzzer-sys makes a target's `Arbitrary` input
/// ([`structured::from_bytes`]), so a corpus file is the same scenario under libFuzzer and
/// under the corpus test.
pub fn decide(bytes: &[u8]) {
    let Some(scenario) = structured::from_bytes::<Scenario>(bytes) else {
        return;
    };
    check(scenario);
}

fn check(scenario: Scenario) {
    let Ok(ruleset) = Ruleset::from_specs(scenario.rules) else {
        return;
    };
    let store = MemoryStore::new();
    let table = SlotTable::new(scenario.slots);
    let lease_store = MemoryStore::new();
    let lease_table = LeaseTable::new(scenario.lease_slots);
    let mut charged: HashMap<BucketKey, Charged> = HashMap::new();
    let mut evicted = false;
    let mut now = scenario.start_ns;
    for (elapsed_ns, request) in &scenario.steps {
        // A host clock only moves forward; the bound is about elapsed time.
        now = now.saturating_add(*elapsed_ns);
        let mut outcomes = Outcomes::default();
        let cx = DecisionContext {
            store: &store,
            table: &table,
            global: GlobalBuckets {
                table: &lease_table,
                store: &lease_store,
                view: scenario.view,
            },
            now: Nanos::new(now),
            default_failure: scenario.failure_mode,
            queue: None,
        };
        let decision = ruleset.decide_observed(request, &cx, &mut outcomes);

        let reported = |id: &str, wanted: RuleOutcome| {
            outcomes
                .0
                .iter()
                .any(|(rule, outcome, _)| rule == id && *outcome == wanted)
        };
        match decision.outcome {
            Outcome::Allowed => assert!(
                !outcomes
                    .0
                    .iter()
                    .any(|(_, o, _)| matches!(o, RuleOutcome::Denied | RuleOutcome::FailedClosed)),
                "allowed, yet a rule denied: {:?}",
                outcomes.0
            ),
            Outcome::Denied(limited) => assert!(
                reported(&limited.rule.id, RuleOutcome::Denied),
                "denied by `{}`, which did not report a denial: {:?}",
                limited.rule.id,
                outcomes.0
            ),
            Outcome::FailedClosed(rule) => assert!(
                reported(&rule.id, RuleOutcome::FailedClosed),
                "failed closed by `{}`, which did not report it: {:?}",
                rule.id,
                outcomes.0
            ),
            // `decide` counts no requests in flight: only `decide_in_flight` answers this.
            Outcome::InFlightFull(denial) => panic!("in flight without a table: {denial:?}"),
        }

        evicted |= decision.counters.evictions > 0;
        if evicted || decision.failed_open > 0 || now > LATEST_CLOCK_NS {
            continue;
        }
        for (id, outcome, client) in &outcomes.0 {
            if !matches!(outcome, RuleOutcome::Allowed { .. }) {
                continue;
            }
            let Some(rule) = ruleset.rules().iter().find(|r| &r.id == id) else {
                panic!("an outcome for `{id}`, which is not in the ruleset");
            };
            let requests = rule.cost.of(request);
            // Token limits charge their reservation (never settled here).
            let estimate = rule
                .tokens
                .as_ref()
                .map_or_else(TokenEstimate::default, |b| {
                    TokenEstimate::of(b, &request.body_facts().unwrap_or_default())
                });
            // Two limits with the same parameters are one bucket: count it once.
            let mut seen = HashSet::new();
            for limit in rule.limits_for(client).iter() {
                if !seen.insert((limit.identity, limit.global)) {
                    continue;
                }
                let key = BucketKey {
                    rule: id.clone(),
                    client: client.clone(),
                    identity: limit.identity,
                    global: limit.global,
                };
                let bucket = charged.entry(key).or_insert(Charged {
                    since_ns: now,
                    tokens: 0,
                });
                bucket.tokens += u128::from(cost_of(limit, requests, &estimate));
                let interval = u128::from(limit.gcra.interval_ns());
                let allowance =
                    u128::from(limit.gcra.capacity_ns()) + u128::from(now - bucket.since_ns);
                assert!(
                    bucket.tokens * interval <= allowance,
                    "rule `{id}`, client `{client}`: {} tokens admitted in {} ns by a bucket of \
                     {} tokens refilling one per {} ns ({limit:?})",
                    bucket.tokens,
                    now - bucket.since_ns,
                    limit.gcra.burst(),
                    interval,
                );
            }
        }
    }
}

/// One bucket: a limit of a rule for one client (proxy and global limits kept apart).
#[derive(Debug, PartialEq, Eq, Hash)]
struct BucketKey {
    rule: String,
    client: String,
    identity: u64,
    global: bool,
}

/// Tokens a bucket admitted since its first admission.
#[derive(Debug)]
struct Charged {
    since_ns: u64,
    tokens: u128,
}

/// What each matching rule reported for one request: rule id, outcome, client key.
#[derive(Debug, Default)]
struct Outcomes(Vec<(String, RuleOutcome, String)>);

impl DecisionSink for Outcomes {
    fn record(&mut self, rule: &Rule, outcome: RuleOutcome, client: &str, _tokens: u64) {
        self.0.push((rule.id.clone(), outcome, client.to_string()));
    }
}
