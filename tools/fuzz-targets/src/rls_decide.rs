use std::collections::HashMap;

use arbitrary::{Arbitrary, Result, Unstructured};
use sluice_core::rls::{Code, Plan, RlsDescriptor, RlsRequest, RlsRules, decide};
use sluice_core::ruleset::Ruleset;
use sluice_core::spec::RuleSpec;
use sluice_core::time::Nanos;

use crate::structured;

/// What the rate limit service decides (`sluice_core::rls`): a request's bounds, the
/// most specific rule per descriptor, and the charging of its buckets, over generated
/// requests (domains, keys and values from the vocabulary of [`RULES`], now and then
/// anything, sometimes past a bound) and time steps, on one store of theoretical arrival
/// times as the coordinator keeps them.
///
/// Asserts, for every request:
/// - checking, planning and deciding never panic;
/// - a request past a bound is refused before any rule is looked at, and every planned
///   request gets one status per descriptor;
/// - a charge only moves a bucket's TAT forward, and a request over the limit writes no
///   bucket of an enforced descriptor (a denied request consumes nothing);
/// - no bucket admits more than `burst + rate × elapsed`: the tokens its charges took since
///   the first fit in its capacity plus its refill since then.
pub fn rls_decide(bytes: &[u8]) {
    let Some(scenario) = structured::from_bytes::<Scenario>(bytes) else {
        return;
    };
    check(scenario);
}

/// The rules every scenario is decided by: open values, fixed values, two levels, several
/// limits, an override, shadow mode.
const RULES: &str = r#"[
  {"name": "per-key", "key": "global", "limits": [{"requests": 5, "period": "second", "burst": 3}],
   "overrides": [{"client": "acme", "limits": [{"requests": 1, "period": "minute"}]}],
   "descriptor": {"domain": "edge", "entries": [{"key": "api_key"}]}},
  {"name": "one-key", "key": "global", "limits": [{"requests": 2, "period": 1}, {"requests": 10, "period": 60}],
   "descriptor": {"domain": "edge", "entries": [{"key": "api_key", "value": "bob"}]}},
  {"name": "login", "key": "global", "limits": [{"requests": 1, "period": 2, "burst": 2}],
   "descriptor": {"domain": "edge", "entries": [{"key": "path", "value": "/login"}, {"key": "remote_address"}]}},
  {"name": "shadow", "key": "global", "mode": "shadow", "limits": [{"requests": 1, "period": 1}],
   "descriptor": {"domain": "internal", "entries": [{"key": "tenant"}]}}
]"#;

const DOMAINS: &[&str] = &["edge", "internal", "other", ""];
const KEYS: &[&str] = &["api_key", "path", "remote_address", "tenant", ""];
const VALUES: &[&str] = &["alice", "bob", "acme", "/login", "10.0.0.1", ""];

#[derive(Debug)]
struct Scenario {
    start_ns: u64,
    /// Time since the previous request, and the request.
    steps: Vec<(u64, RlsRequest)>,
}

fn word(u: &mut Unstructured<'_>, choices: &[&str]) -> Result<String> {
    if u.ratio(1, 32)? {
        return u.arbitrary();
    }
    Ok(u.choose(choices)?.to_string())
}

fn request(u: &mut Unstructured<'_>) -> Result<RlsRequest> {
    // Now and then past a bound: many descriptors or entries.
    let (most_descriptors, most_entries) = if u.ratio(1, 16)? { (70, 20) } else { (3, 3) };
    let descriptors = (0..u.int_in_range(0..=most_descriptors)?)
        .map(|_| {
            let entries = (0..u.int_in_range(0..=most_entries)?)
                .map(|_| Ok((word(u, KEYS)?, word(u, VALUES)?)))
                .collect::<Result<_>>()?;
            let hits_addend = if u.ratio(1, 4)? {
                Some(u.int_in_range(0..=3)?)
            } else {
                None
            };
            Ok(RlsDescriptor {
                entries,
                hits_addend,
            })
        })
        .collect::<Result<_>>()?;
    let hits_addend = if u.ratio(1, 32)? {
        u.arbitrary()?
    } else {
        u.int_in_range(0..=3)?
    };
    Ok(RlsRequest {
        domain: word(u, DOMAINS)?,
        descriptors,
        hits_addend,
    })
}

impl<'a> Arbitrary<'a> for Scenario {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        let start_ns = u.int_in_range(1u64 << 40..=1u64 << 61)?;
        let steps = (0..u.int_in_range(1..=40)?)
            .map(|_| {
                let elapsed = *u.choose(&[0, 1_000_000, 50_000_000, 400_000_000, 3_000_000_000])?;
                Ok((elapsed, request(u)?))
            })
            .collect::<Result<_>>()?;
        Ok(Scenario { start_ns, steps })
    }
}

/// One bucket's charges since its first.
struct Charged {
    first: u64,
    tokens: u64,
}

fn check(scenario: Scenario) {
    let specs: Vec<RuleSpec> = serde_json::from_str(RULES).expect("the fixed rules parse");
    let ruleset = Ruleset::from_specs(specs).expect("the fixed rules are valid");
    let rules = RlsRules::from_rules(ruleset.rules());
    let mut store: HashMap<u64, Nanos> = HashMap::new();
    let mut charged: HashMap<u64, Charged> = HashMap::new();
    let mut now = scenario.start_ns;
    for (elapsed, request) in &scenario.steps {
        now = now.saturating_add(*elapsed);
        if request.check().is_err() {
            continue;
        }
        let plan = rules.plan(request);
        assert_eq!(plan.descriptors.len(), request.descriptors.len());
        let buckets = plan.buckets();
        let tats: Vec<Nanos> = buckets
            .iter()
            .map(|b| store.get(b).copied().unwrap_or(Nanos::ZERO))
            .collect();
        let decided = decide(&plan, &tats, Nanos::new(now));
        assert_eq!(decided.statuses.len(), plan.descriptors.len());
        let denied = decided.overall() == Code::OverLimit;
        for (bucket, tat) in &decided.writes {
            let before = store.get(bucket).copied().unwrap_or(Nanos::ZERO);
            assert!(*tat >= before, "a charge moved bucket {bucket} back");
            if denied {
                assert!(
                    only_shadow_charges(&plan, *bucket),
                    "a denied request charged an enforced bucket: {plan:?}"
                );
            }
        }
        store.extend(decided.writes.iter().copied());
        count(&plan, &decided.statuses, denied, now, &mut charged);
    }
}

fn only_shadow_charges(plan: &Plan, bucket: u64) -> bool {
    plan.descriptors
        .iter()
        .filter_map(|d| d.rule.as_ref())
        .filter(|m| m.charges.iter().any(|c| c.bucket == bucket))
        .all(|m| m.shadow)
}

/// Adds this request's charges and checks each charged bucket's bound.
fn count(
    plan: &Plan,
    statuses: &[sluice_core::rls::Status],
    denied: bool,
    now: u64,
    charged: &mut HashMap<u64, Charged>,
) {
    for (planned, status) in plan.descriptors.iter().zip(statuses) {
        let Some(matched) = &planned.rule else {
            continue;
        };
        let took = if matched.shadow {
            !status.shadow_denied
        } else {
            !denied
        };
        if !took {
            continue;
        }
        for charge in &matched.charges {
            let entry = charged.entry(charge.bucket).or_insert(Charged {
                first: now,
                tokens: 0,
            });
            entry.tokens += planned.cost;
            let gcra = charge.limit.gcra;
            let refilled = (now - entry.first) / gcra.interval_ns();
            assert!(
                entry.tokens <= gcra.burst() + refilled,
                "bucket {} admitted {} tokens, at most {} + {refilled}",
                charge.bucket,
                entry.tokens,
                gcra.burst()
            );
        }
    }
}
