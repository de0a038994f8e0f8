//! A rule's in-flight limit (`{concurrent: N}`): at most `N` of one client's requests in
//! flight in this Envoy at once. Counted in the in-flight table (`crate::in_flight`), not
//! in a token bucket.

use std::num::NonZeroU32;

use crate::spec::{LimitSpec, Scope};
use crate::validation::Problems;

/// Largest `concurrent`. Each request in flight holds 16 bytes in its key's shared-data
/// value, which every admission and release copies, so the value stays within 16 KiB.
pub const MAX_CONCURRENT: u32 = 1_000;

/// Why `scope: global` is refused for in-flight limits, as operators read it.
pub const NO_GLOBAL_IN_FLIGHT: &str = "an in-flight limit counts requests in this Envoy only \
     (`scope: proxy`): a fleet-wide count would need a round trip to the coordinator at the \
     end of every request; divide the fleet's limit by the number of Envoys instead";

/// A validated in-flight limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InFlightLimit {
    /// The most requests of one client in flight at once.
    pub max: NonZeroU32,
}

impl InFlightLimit {
    /// The in-flight limit among `specs` (the limits of a rule or of one override), if
    /// any; problems are reported at `field[i]`. At most one per rule or override.
    pub(super) fn build_from(
        specs: &[LimitSpec],
        field: &str,
        problems: &mut Problems,
    ) -> Option<InFlightLimit> {
        let mut found = None;
        for (i, spec) in specs.iter().enumerate() {
            let Some(concurrent) = spec.concurrent else {
                continue;
            };
            let at = format!("{field}[{i}]");
            if found.is_some() {
                problems.add(at, "duplicates an earlier in-flight limit (`concurrent`)");
                continue;
            }
            if let Some(limit) = Self::build(spec, concurrent, &at, problems) {
                found = Some(limit);
            }
        }
        found
    }

    fn build(
        spec: &LimitSpec,
        concurrent: u64,
        field: &str,
        problems: &mut Problems,
    ) -> Option<InFlightLimit> {
        let mut ok = true;
        let others = [
            ("requests", spec.requests.is_some()),
            ("tokens", spec.tokens.is_some()),
            ("period", spec.period.is_some()),
            ("burst", spec.burst.is_some()),
            ("count", spec.count.is_some()),
            ("soft_percent", spec.soft_percent.is_some()),
        ];
        for (name, given) in others {
            if given {
                problems.add(
                    format!("{field}.{name}"),
                    "an in-flight limit (`concurrent`) is given alone",
                );
                ok = false;
            }
        }
        if spec.scope == Scope::Global {
            problems.add(format!("{field}.scope"), NO_GLOBAL_IN_FLIGHT);
            ok = false;
        }
        let max = u32::try_from(concurrent)
            .ok()
            .filter(|n| *n <= MAX_CONCURRENT)
            .and_then(NonZeroU32::new);
        if max.is_none() {
            problems.add(
                format!("{field}.concurrent"),
                format!("must be between 1 and {MAX_CONCURRENT}"),
            );
        }
        ok.then_some(InFlightLimit { max: max? })
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{errors, rule};
    use super::*;

    #[test]
    fn a_concurrent_limit_stands_alone_or_beside_token_buckets() {
        let r = rule(r#"{"name":"c","key":{"header":"k"},"limits":[{"concurrent":10}]}"#);
        assert_eq!(r.in_flight.map(|l| l.max.get()), Some(10));
        assert!(r.limits.is_empty());
        let r = rule(
            r#"{"name":"c","key":{"header":"k"},"limits":[{"requests":5,"period":1},{"concurrent":2}],
                "overrides":[{"client":"big","limits":[{"concurrent":50}]},{"client":"free","limits":[{"requests":1,"period":1}]}]}"#,
        );
        assert_eq!(r.limits.len(), 1);
        assert_eq!(r.in_flight_for("anyone").map(|l| l.max.get()), Some(2));
        assert_eq!(r.in_flight_for("big").map(|l| l.max.get()), Some(50));
        // An override replaces all of the rule's limits, its in-flight limit included.
        assert_eq!(r.in_flight_for("free"), None);
    }

    #[test]
    fn bounds_mixtures_duplicates_and_global_scope_are_refused() {
        assert_eq!(
            errors(r#"{"name":"c","key":"global","limits":[{"concurrent":0}]}"#),
            ["limits[0].concurrent: must be between 1 and 1000"]
        );
        assert_eq!(
            errors(r#"{"name":"c","key":"global","limits":[{"concurrent":1001}]}"#),
            ["limits[0].concurrent: must be between 1 and 1000"]
        );
        let most = rule(r#"{"name":"c","key":"global","limits":[{"concurrent":1000}]}"#);
        assert_eq!(most.in_flight.map(|l| l.max.get()), Some(MAX_CONCURRENT));
        assert_eq!(
            errors(
                r#"{"name":"c","key":"global","limits":[{"concurrent":3,"period":1,"burst":2}]}"#
            ),
            [
                "limits[0].period: an in-flight limit (`concurrent`) is given alone",
                "limits[0].burst: an in-flight limit (`concurrent`) is given alone"
            ]
        );
        assert_eq!(
            errors(r#"{"name":"c","key":"global","limits":[{"concurrent":3},{"concurrent":4}]}"#),
            ["limits[1]: duplicates an earlier in-flight limit (`concurrent`)"]
        );
        assert_eq!(
            errors(r#"{"name":"c","key":"global","limits":[{"concurrent":3,"scope":"global"}]}"#),
            [format!("limits[0].scope: {NO_GLOBAL_IN_FLIGHT}")]
        );
        let rls = errors(
            r#"{"name":"c","key":"global","limits":[{"concurrent":3}],
                "descriptor":{"domain":"d","entries":[{"key":"k"}]}}"#,
        );
        assert!(
            rls.iter()
                .any(|e| e.starts_with("limits: a rule with a `descriptor`")),
            "{rls:?}"
        );
    }
}
