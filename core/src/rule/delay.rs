//! A rule's delay policy (`on_limit: delay`): an over-limit request whose tokens are due
//! within `max_delay_ms` waits for them instead of being refused, within two queue
//! bounds. The queue itself is the worker's (`crate::delay`); this is what a rule says.

use std::num::NonZeroU32;

use crate::hash::rule_identity;
use crate::rule::Limit;
use crate::spec::{OnLimit, RuleSpec};
use crate::time::NANOS_PER_SECOND;
use crate::validation::Problems;

/// The longest `max_delay_ms`: a minute. A request held longer than that is better
/// refused with a `Retry-After` the client can plan with.
pub const MAX_DELAY_MS: u64 = 60_000;
/// `queue_per_key` when not given.
pub const DEFAULT_QUEUE_PER_KEY: u32 = 16;
/// `queue_per_worker` when not given.
pub const DEFAULT_QUEUE_PER_WORKER: u32 = 1_024;
/// The largest `queue_per_worker`, and the most requests a worker holds in its delay
/// queue over all rules together (`crate::delay::MAX_WAITERS`).
pub const MAX_QUEUE_PER_WORKER: u32 = 10_000;

/// Why a rule with a global limit cannot delay, as operators read it.
pub const NO_GLOBAL_DELAY: &str = "a rule that delays (`on_limit: delay`) has only \
     `scope: proxy` limits: a global limit spends tokens this Envoy was leased by the \
     coordinator, and a lease holds no tokens ahead of time to reserve for a waiting \
     request; refuse over a global limit, or delay over a per-Envoy share of it";

/// A validated delay policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DelayPolicy {
    /// The longest a request is held; one whose tokens are due later is refused.
    pub max_delay_ns: u64,
    /// The most requests of one client of this rule waiting at once on one worker.
    pub per_key: NonZeroU32,
    /// The most requests of this rule waiting at once on one worker.
    pub per_worker: NonZeroU32,
    /// The rule's identity in the queue's per-rule counts ([`rule_identity`]).
    pub rule: u64,
}

impl DelayPolicy {
    /// The policy of a rule with `on_limit: delay`, or `None` (with the problems recorded
    /// when the spec is wrong). `limits` are every limit of the rule and its overrides.
    pub(super) fn build<'a>(
        spec: &RuleSpec,
        id: &str,
        limits: impl Iterator<Item = &'a Limit>,
        problems: &mut Problems,
    ) -> Option<DelayPolicy> {
        let delay = match (spec.on_limit, &spec.delay) {
            (OnLimit::Refuse, None) => return None,
            (OnLimit::Refuse, Some(_)) => {
                problems.add("delay", "only with `on_limit: delay`");
                return None;
            }
            (OnLimit::Delay, None) => {
                problems.add(
                    "delay",
                    "required with `on_limit: delay`: give at least `max_delay_ms`",
                );
                return None;
            }
            (OnLimit::Delay, Some(delay)) => delay,
        };
        let mut ok = true;
        let mut has_bucket = false;
        let mut has_soft = false;
        for limit in limits {
            has_bucket = true;
            if limit.global {
                ok = false;
            }
            has_soft |= limit.soft.is_some();
        }
        if !ok {
            problems.add("on_limit", NO_GLOBAL_DELAY);
        }
        if has_soft {
            problems.add(
                "on_limit",
                "a rule that delays (`on_limit: delay`) has no soft limits \
                 (`soft_percent`): over its limit a request either waits or is warned, not both",
            );
            ok = false;
        }
        if !has_bucket {
            problems.add(
                "on_limit",
                "`on_limit: delay` needs a `requests` or `tokens` limit to wait for: an \
                 in-flight limit (`concurrent`) refuses at once",
            );
            ok = false;
        }
        if spec.descriptor.is_some() {
            problems.add(
                "on_limit",
                "a rule with a `descriptor` cannot delay: Envoy's rate limit service \
                 answers each request at once",
            );
            ok = false;
        }
        if !(1..=MAX_DELAY_MS).contains(&delay.max_delay_ms) {
            problems.add(
                "delay.max_delay_ms",
                format!("must be between 1 and {MAX_DELAY_MS}"),
            );
            ok = false;
        }
        let per_worker_given = delay.queue_per_worker.unwrap_or(DEFAULT_QUEUE_PER_WORKER);
        let per_worker =
            NonZeroU32::new(per_worker_given).filter(|n| n.get() <= MAX_QUEUE_PER_WORKER);
        if per_worker.is_none() {
            problems.add(
                "delay.queue_per_worker",
                format!("must be between 1 and {MAX_QUEUE_PER_WORKER}"),
            );
        }
        let per_key = match delay.queue_per_key {
            // The default follows a smaller worker bound down.
            None => NonZeroU32::new(DEFAULT_QUEUE_PER_KEY.min(per_worker_given.max(1))),
            // A given one is never silently lowered.
            Some(given) => {
                let bound = per_worker.map_or(MAX_QUEUE_PER_WORKER, NonZeroU32::get);
                let per_key = NonZeroU32::new(given).filter(|n| n.get() <= bound);
                if per_key.is_none() {
                    problems.add(
                        "delay.queue_per_key",
                        format!("must be between 1 and `queue_per_worker` ({bound})"),
                    );
                }
                per_key
            }
        };
        Some(DelayPolicy {
            max_delay_ns: delay.max_delay_ms.saturating_mul(NANOS_PER_SECOND / 1_000),
            per_key: per_key?,
            per_worker: per_worker?,
            rule: rule_identity(id),
        })
        .filter(|_| ok)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{errors, rule};
    use super::*;

    const RATE: &str = r#"[{"requests":5,"period":1}]"#;

    fn with(extra: &str) -> String {
        format!(r#"{{"name":"d","key":{{"header":"k"}},"limits":{RATE}{extra}}}"#)
    }

    #[test]
    fn a_delaying_rule_gets_its_bounds_or_the_defaults() {
        let r = rule(&with(r#","on_limit":"delay","delay":{"max_delay_ms":250}"#));
        let policy = r.delay.unwrap();
        assert_eq!(policy.max_delay_ns, 250_000_000);
        assert_eq!(policy.per_key.get(), DEFAULT_QUEUE_PER_KEY);
        assert_eq!(policy.per_worker.get(), DEFAULT_QUEUE_PER_WORKER);
        assert_eq!(policy.rule, rule_identity("d"));
        let r = rule(&with(
            r#","on_limit":"delay","delay":{"max_delay_ms":60000,"queue_per_key":10000,"queue_per_worker":10000}"#,
        ));
        let policy = r.delay.unwrap();
        assert_eq!(policy.max_delay_ns, 60 * NANOS_PER_SECOND);
        assert_eq!(
            (policy.per_key.get(), policy.per_worker.get()),
            (10_000, 10_000)
        );
        // A smaller worker bound lowers the default key bound with it.
        let r = rule(&with(
            r#","on_limit":"delay","delay":{"max_delay_ms":1,"queue_per_worker":4}"#,
        ));
        assert_eq!(r.delay.unwrap().per_key.get(), 4);
        assert_eq!(rule(&with("")).delay, None);
    }

    #[test]
    fn each_bound_is_refused_just_past_it_with_the_field_named() {
        let e = |delay: &str| errors(&with(&format!(r#","on_limit":"delay","delay":{delay}"#)));
        assert_eq!(
            e(r#"{"max_delay_ms":0}"#),
            ["delay.max_delay_ms: must be between 1 and 60000"]
        );
        assert_eq!(
            e(r#"{"max_delay_ms":60001}"#),
            ["delay.max_delay_ms: must be between 1 and 60000"]
        );
        assert_eq!(
            e(r#"{"max_delay_ms":5,"queue_per_worker":10001}"#),
            ["delay.queue_per_worker: must be between 1 and 10000"]
        );
        assert_eq!(
            e(r#"{"max_delay_ms":5,"queue_per_worker":0}"#),
            ["delay.queue_per_worker: must be between 1 and 10000"]
        );
        assert_eq!(
            e(r#"{"max_delay_ms":5,"queue_per_key":0}"#),
            ["delay.queue_per_key: must be between 1 and `queue_per_worker` (1024)"]
        );
        assert_eq!(
            e(r#"{"max_delay_ms":5,"queue_per_key":9,"queue_per_worker":8}"#),
            ["delay.queue_per_key: must be between 1 and `queue_per_worker` (8)"]
        );
    }

    #[test]
    fn delay_needs_its_section_local_buckets_and_no_descriptor() {
        assert_eq!(
            errors(&with(r#","on_limit":"delay""#)),
            ["delay: required with `on_limit: delay`: give at least `max_delay_ms`"]
        );
        assert_eq!(
            errors(&with(r#","delay":{"max_delay_ms":5}"#)),
            ["delay: only with `on_limit: delay`"]
        );
        let global = errors(
            r#"{"name":"d","key":"global","limits":[{"requests":5,"period":1,"scope":"global"}],
                "on_limit":"delay","delay":{"max_delay_ms":5}}"#,
        );
        assert_eq!(global, [format!("on_limit: {NO_GLOBAL_DELAY}")]);
        // An override's global limit counts too.
        let global_override = errors(&with(
            r#","on_limit":"delay","delay":{"max_delay_ms":5},
               "overrides":[{"client":"c","limits":[{"requests":5,"period":1,"scope":"global"}]}]"#,
        ));
        assert_eq!(global_override, [format!("on_limit: {NO_GLOBAL_DELAY}")]);
        let in_flight_only = errors(
            r#"{"name":"d","key":"global","limits":[{"concurrent":5}],
                "on_limit":"delay","delay":{"max_delay_ms":5}}"#,
        );
        assert_eq!(in_flight_only.len(), 1);
        assert!(
            in_flight_only[0]
                .starts_with("on_limit: `on_limit: delay` needs a `requests` or `tokens` limit")
        );
    }
}
