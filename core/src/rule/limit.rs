//! A rule's limits: each one token bucket, validated and given a stable identity.

use std::num::NonZeroU64;

use crate::gcra::{Gcra, GcraError};
use crate::spec::{LimitSpec, Scope};
use crate::time::NANOS_PER_SECOND;
use crate::validation::Problems;

/// Most limits (tiers) one rule or override may have.
pub const MAX_LIMITS_PER_RULE: usize = 8;
/// Largest `requests` or `burst`.
pub const MAX_REQUESTS: u64 = 1_000_000_000;
/// Longest period: a year.
pub const MAX_PERIOD_SECONDS: u64 = 366 * 86_400;

/// One validated token bucket of a rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    pub requests: u64,
    pub period_seconds: u64,
    pub burst: u64,
    pub gcra: Gcra,
    /// Identifies this bucket inside a slot: a hash of the rule id and the limit's own
    /// parameters, so editing one limit resets only that limit's buckets.
    pub identity: u64,
    /// One bucket per client for the whole fleet (kept in the lease table, not in a slot).
    pub global: bool,
}

impl Limit {
    pub(super) fn build(
        rule_id: &str,
        spec: &LimitSpec,
        field: &str,
        problems: &mut Problems,
    ) -> Option<Limit> {
        let requests = spec.requests;
        let period_seconds = spec.period.seconds();
        let burst = spec.burst.unwrap_or(requests);
        let mut ok = true;
        if requests == 0 || requests > MAX_REQUESTS {
            problems.add(
                format!("{field}.requests"),
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
        let gcra = match Gcra::new(
            NonZeroU64::new(requests)?,
            NonZeroU64::new(period_seconds * NANOS_PER_SECOND)?,
            NonZeroU64::new(burst)?,
        ) {
            Ok(g) => g,
            Err(e @ (GcraError::TooFast | GcraError::CapacityTooLarge)) => {
                problems.add(field.to_string(), e.to_string());
                return None;
            }
        };
        let identity = crate::hash::limit_identity(rule_id, requests, period_seconds, burst);
        Some(Limit {
            requests,
            period_seconds,
            burst,
            gcra,
            identity,
            global: spec.scope == Scope::Global,
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
        let limits: Vec<Limit> = specs
            .iter()
            .enumerate()
            .filter_map(|(i, s)| Limit::build(rule_id, s, &format!("{field}[{i}]"), problems))
            .collect();
        for (i, a) in limits.iter().enumerate() {
            if limits.iter().take(i).any(|b| b.identity == a.identity) {
                problems.add(format!("{field}[{i}]"), "duplicates an earlier limit");
            }
        }
        limits
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{errors, rule};

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
