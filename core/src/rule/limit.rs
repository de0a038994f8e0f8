//! A rule's limits: each one token bucket, validated and given a stable identity.

use std::num::NonZeroU64;

use super::soft::SoftMargin;
use crate::gcra::{Gcra, GcraError, capped_burst};
use crate::slot::MAX_ENTRIES as MAX_SLOT_ENTRIES;
use crate::spec::{LimitSpec, PeriodSpec, Scope, UsageMeasure};
use crate::time::NANOS_PER_SECOND;
use crate::validation::Problems;

/// Most limits (tiers) one rule or override may have.
pub const MAX_LIMITS_PER_RULE: usize = 8;
/// Largest `requests` or `burst`.
pub const MAX_REQUESTS: u64 = 1_000_000_000;
/// Longest period: a year.
pub const MAX_PERIOD_SECONDS: u64 = 366 * 86_400;

/// What a limit's bucket counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Counts {
    /// Requests (each costs the rule's `cost`).
    #[default]
    Requests,
    /// LLM tokens of this kind, reserved when the request arrives and settled with the
    /// response's reported usage (`crate::tokens`).
    Tokens(UsageMeasure),
}

impl Counts {
    pub fn is_tokens(self) -> bool {
        matches!(self, Counts::Tokens(_))
    }
}

/// One validated token bucket of a rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    /// How many units (requests, or tokens for a token limit) the bucket refills per
    /// period.
    pub requests: u64,
    pub period_seconds: u64,
    /// The bucket's capacity: the burst as written (or `requests`), capped by
    /// [`capped_burst`].
    pub burst: u64,
    pub gcra: Gcra,
    /// Identifies this bucket inside a slot: a hash of the rule id and the limit's own
    /// parameters, so editing one limit resets only that limit's buckets.
    pub identity: u64,
    /// One bucket per client for the whole fleet (kept in the lease table, not in a slot).
    pub global: bool,
    /// Requests or tokens.
    pub counts: Counts,
    /// Set for a soft limit (`soft_percent`): the margin over the limit within which an
    /// over-limit request is still admitted, warned (`crate::rule::SoftMargin`).
    pub soft: Option<SoftMargin>,
}

impl Limit {
    pub(super) fn build(
        rule_id: &str,
        spec: &LimitSpec,
        field: &str,
        problems: &mut Problems,
    ) -> Option<Limit> {
        let (requests, counts, amount_field) = match (spec.requests, spec.tokens) {
            (Some(r), None) => (r, Counts::Requests, "requests"),
            (None, Some(t)) => (t, Counts::Tokens(spec.count.unwrap_or_default()), "tokens"),
            (Some(_), Some(_)) => {
                problems.add(
                    field.to_string(),
                    "give either requests or tokens, not both",
                );
                return None;
            }
            (None, None) => {
                problems.add(
                    format!("{field}.requests"),
                    "is required (or `tokens`, for a token limit)",
                );
                return None;
            }
        };
        let period_seconds = spec.period.map_or(0, PeriodSpec::seconds);
        let burst = spec.burst.unwrap_or(requests);
        let mut ok = true;
        if spec.period.is_none() {
            problems.add(format!("{field}.period"), "is required");
            return None;
        }
        if spec.count.is_some() && counts == Counts::Requests {
            problems.add(
                format!("{field}.count"),
                "only a token limit (`tokens`) counts input, output or total",
            );
            ok = false;
        }
        if requests == 0 || requests > MAX_REQUESTS {
            problems.add(
                format!("{field}.{amount_field}"),
                format!("must be between 1 and {MAX_REQUESTS}"),
            );
            ok = false;
        }
        if period_seconds == 0 || period_seconds > MAX_PERIOD_SECONDS {
            problems.add(
                format!("{field}.period"),
                format!(
                    "must be second, minute, hour, day or a number of seconds from 1 to {MAX_PERIOD_SECONDS}"
                ),
            );
            ok = false;
        }
        if spec.burst.is_some() && (burst == 0 || burst > MAX_REQUESTS) {
            problems.add(
                format!("{field}.burst"),
                format!("must be between 1 and {MAX_REQUESTS}"),
            );
            ok = false;
        }
        if !ok {
            return None;
        }
        let period_ns = period_seconds * NANOS_PER_SECOND;
        let capped = capped_burst(burst, period_ns.div_ceil(requests));
        let gcra = match Gcra::new(
            NonZeroU64::new(requests)?,
            NonZeroU64::new(period_ns)?,
            NonZeroU64::new(capped)?,
        ) {
            Ok(g) => g,
            Err(e @ (GcraError::TooFast | GcraError::CapacityTooLarge)) => {
                problems.add(field.to_string(), e.to_string());
                return None;
            }
        };
        // The identity keeps the burst as written: two limits that differ only above the
        // cap are still two limits, not a duplicate.
        let identity = match counts {
            Counts::Requests => {
                crate::hash::limit_identity(rule_id, requests, period_seconds, burst)
            }
            Counts::Tokens(measure) => {
                crate::hash::token_limit_identity(rule_id, measure, requests, period_seconds, burst)
            }
        };
        let soft = match spec.soft_percent {
            None => None,
            Some(_) if counts.is_tokens() => {
                problems.add(
                    format!("{field}.soft_percent"),
                    "only a `requests` limit can be soft: a token limit's usage is settled \
                     after its response",
                );
                // Kept without a margin: the rule's other checks still see the limit.
                None
            }
            Some(_) if spec.scope == Scope::Global => {
                problems.add(
                    format!("{field}.soft_percent"),
                    "only a `scope: proxy` limit can be soft: a global limit spends leased \
                     tokens, which hold no margin",
                );
                None
            }
            Some(percent) => Some(SoftMargin::build(
                percent,
                (requests, period_ns, capped),
                identity,
                field,
                problems,
            )?),
        };
        Some(Limit {
            requests,
            period_seconds,
            burst: capped,
            gcra,
            identity,
            global: spec.scope == Scope::Global,
            counts,
            soft,
        })
    }

    pub(super) fn build_all(
        rule_id: &str,
        specs: &[LimitSpec],
        field: &str,
        problems: &mut Problems,
    ) -> Vec<Limit> {
        if specs.is_empty() {
            problems.add(field, "at least one limit is required");
        }
        if specs.len() > MAX_LIMITS_PER_RULE {
            problems.add(
                field,
                format!("at most {MAX_LIMITS_PER_RULE} limits are allowed"),
            );
        }
        // In-flight limits (`concurrent`) are no token buckets: `InFlightLimit` builds them.
        let limits: Vec<Limit> = specs
            .iter()
            .enumerate()
            .filter(|(_, s)| s.concurrent.is_none())
            .filter_map(|(i, s)| Limit::build(rule_id, s, &format!("{field}[{i}]"), problems))
            .collect();
        for (i, a) in limits.iter().enumerate() {
            if limits.iter().take(i).any(|b| b.identity == a.identity) {
                problems.add(format!("{field}[{i}]"), "duplicates an earlier limit");
            }
        }
        // All of one client's buckets live in one slot.
        let buckets: usize = limits
            .iter()
            .map(|l| 1 + usize::from(l.soft.is_some()))
            .sum();
        if buckets > MAX_SLOT_ENTRIES && specs.len() <= MAX_LIMITS_PER_RULE {
            problems.add(
                field,
                format!(
                    "at most {MAX_SLOT_ENTRIES} buckets per rule: each limit is one and a soft \
                     limit two (here {buckets})"
                ),
            );
        }
        limits
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{errors, rule};
    use super::*;
    use crate::gcra::MAX_CAPACITY_NS;

    /// The rule's schema admits every requests, period and burst within their own bounds;
    /// each combination is a limit, its burst capped where 146 years of refill hold less.
    #[test]
    fn every_limit_within_the_fields_bounds_is_accepted() {
        let year = MAX_PERIOD_SECONDS;
        for (requests, period, burst, capped) in [
            (1, year, MAX_REQUESTS, 145),
            (1, 86_400, MAX_REQUESTS, 53_375),
            (1, 5, MAX_REQUESTS, 922_337_203),
            // One token per 4 s or faster: never capped.
            (1, 4, MAX_REQUESTS, MAX_REQUESTS),
            (MAX_REQUESTS, 1, MAX_REQUESTS, MAX_REQUESTS),
            (MAX_REQUESTS, year, MAX_REQUESTS, MAX_REQUESTS),
            (1, year, 1, 1),
        ] {
            let r = rule(&format!(
                r#"{{"name":"r","key":"global","limits":[{{"requests":{requests},"period":{period},"burst":{burst}}}]}}"#
            ));
            let limit = &r.limits[0];
            assert_eq!(limit.burst, capped, "{requests}/{period}s burst {burst}");
            assert_eq!(limit.gcra.burst(), capped);
            assert!(limit.gcra.capacity_ns() <= MAX_CAPACITY_NS);
        }
        // Two limits that differ only above the cap are still two limits.
        let r = rule(
            r#"{"name":"r","key":"global","limits":[{"requests":1,"period":"day","burst":1000000000},{"requests":1,"period":"day","burst":999999999}]}"#,
        );
        assert_eq!(r.limits.len(), 2);
        assert_ne!(r.limits[0].identity, r.limits[1].identity);
    }

    #[test]
    fn empty_and_duplicate_limits_are_rejected() {
        assert_eq!(
            errors(r#"{"name":"a","key":"global","limits":[]}"#),
            ["limits: at least one limit is required"]
        );
        assert_eq!(
            errors(
                r#"{"name":"a","key":"global","limits":[{"requests":1,"period":60},{"requests":1,"period":"minute"}]}"#
            ),
            ["limits[1]: duplicates an earlier limit"]
        );
    }

    #[test]
    fn editing_one_limit_changes_only_that_limits_identity() {
        let a = rule(
            r#"{"name":"r","key":"global","limits":[{"requests":10,"period":1},{"requests":100,"period":60}]}"#,
        );
        let b = rule(
            r#"{"name":"r","key":"global","limits":[{"requests":10,"period":1},{"requests":200,"period":60}]}"#,
        );
        assert_eq!(a.limits[0].identity, b.limits[0].identity);
        assert_ne!(a.limits[1].identity, b.limits[1].identity);
    }
}
