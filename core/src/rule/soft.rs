//! A soft limit (`soft_percent: P`): once the limit is spent, a request is still admitted,
//! with a warning, while the client stays within P% over the limit's rate and burst.
//!
//! The margin is a second bucket beside the limit's own, in the same slot: a GCRA with
//! the limit's rate × (1 + P/100) and burst × (1 + P/100). It is charged for every
//! request the limit admits, warned or not, and decides admission; the limit's own bucket
//! is charged only when it has room, and a request it has none for is *warned*. So the
//! admitted requests never exceed `⌊burst × (100+P)/100⌋ + rate × (100+P)/100 × elapsed`
//! (the margin's own bound, rounded toward admitting less), and none is denied while the
//! client stays within it.

use std::num::NonZeroU64;

use crate::gcra::{Gcra, capped_burst};
use crate::validation::Problems;

/// Largest `soft_percent`: a soft limit admits at most twice its rate. A client allowed
/// more than that is better given a higher limit.
pub const MAX_SOFT_PERCENT: u64 = 100;

/// A soft limit's margin: the bucket that decides admission over the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SoftMargin {
    pub percent: u8,
    /// Rate and burst × (100 + percent) / 100.
    pub gcra: Gcra,
    /// The margin bucket's identity inside the client's slot: derived from the limit's
    /// and the percentage, so changing the percentage starts a fresh margin while the
    /// limit's own bucket keeps its state.
    pub identity: u64,
}

impl SoftMargin {
    /// The margin of a limit of `requests` per `period_ns` holding `burst`, whose own
    /// bucket is `limit_identity`. `None` (with the problem recorded at `field`) when
    /// `percent` is out of bounds or the raised rate cannot be represented.
    pub(super) fn build(
        percent: u64,
        (requests, period_ns, burst): (u64, u64, u64),
        limit_identity: u64,
        field: &str,
        problems: &mut Problems,
    ) -> Option<SoftMargin> {
        let Some(percent) = u8::try_from(percent)
            .ok()
            .filter(|p| (1..=MAX_SOFT_PERCENT).contains(&u64::from(*p)))
        else {
            problems.add(
                format!("{field}.soft_percent"),
                format!("must be between 1 and {MAX_SOFT_PERCENT}"),
            );
            return None;
        };
        let scale = 100 + u64::from(percent);
        // requests × scale per period × 100: the emission interval rounds up, toward
        // admitting less, as every limit's does. Both products fit a u64 within the
        // fields' bounds (10^9 × 200 and 3.2 × 10^16 × 100).
        let raised_requests = requests.saturating_mul(scale);
        let scaled_period = period_ns.saturating_mul(100);
        let interval_ns = scaled_period.div_ceil(raised_requests.max(1));
        let raised_burst = capped_burst(burst.saturating_mul(scale) / 100, interval_ns);
        let gcra = Gcra::new(
            NonZeroU64::new(raised_requests)?,
            NonZeroU64::new(scaled_period)?,
            NonZeroU64::new(raised_burst)?,
        );
        match gcra {
            Ok(gcra) => Some(SoftMargin {
                percent,
                gcra,
                identity: crate::hash::soft_margin_identity(limit_identity, percent),
            }),
            Err(e) => {
                problems.add(format!("{field}.soft_percent"), e.to_string());
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{errors, rule};
    use crate::rule::Rule;
    use crate::spec::RuleSpec;

    /// The rule's problems; none when it is valid.
    fn problems(json: &str) -> Vec<String> {
        let spec: RuleSpec = serde_json::from_str(json).unwrap();
        match Rule::try_from(spec) {
            Ok(_) => Vec::new(),
            Err(e) => {
                e.0.into_iter()
                    .map(|e| format!("{}: {}", e.field, e.message))
                    .collect()
            }
        }
    }

    fn limit(extra: &str) -> String {
        format!(
            r#"{{"name":"s","key":{{"header":"k"}},"limits":[{{"requests":10,"period":1{extra}}}]}}"#
        )
    }

    #[test]
    fn the_margin_raises_rate_and_burst_by_the_percentage() {
        let r = rule(&limit(r#","burst":20,"soft_percent":50"#));
        let soft = r.limits[0].soft.unwrap();
        assert_eq!(soft.percent, 50);
        assert_eq!(soft.gcra.burst(), 30);
        // 15 a second: one every 66,666,667 ns (rounded up).
        assert_eq!(soft.gcra.interval_ns(), 66_666_667);
        assert_ne!(soft.identity, r.limits[0].identity);
        // A burst that does not scale to a whole request more keeps its own size.
        let r = rule(&limit(r#","burst":1,"soft_percent":1"#));
        assert_eq!(r.limits[0].soft.unwrap().gcra.burst(), 1);
        assert_eq!(rule(&limit("")).limits[0].soft, None);
    }

    #[test]
    fn the_percentage_is_bounded_on_both_sides() {
        let at = |p: u64| problems(&limit(&format!(r#","soft_percent":{p}"#)));
        assert!(at(1).is_empty());
        assert!(at(100).is_empty());
        for p in [0, 101, 256] {
            assert_eq!(
                at(p),
                ["limits[0].soft_percent: must be between 1 and 100"],
                "{p}"
            );
        }
    }

    #[test]
    fn changing_the_percentage_keeps_the_limits_own_bucket() {
        let a = rule(&limit(r#","soft_percent":10"#));
        let b = rule(&limit(r#","soft_percent":20"#));
        assert_eq!(a.limits[0].identity, b.limits[0].identity);
        assert_ne!(
            a.limits[0].soft.unwrap().identity,
            b.limits[0].soft.unwrap().identity
        );
    }

    #[test]
    fn only_a_proxy_request_limit_outside_a_delaying_rule_is_soft() {
        assert_eq!(
            errors(
                r#"{"name":"s","key":"global","tokens":{"usage":"openai","default_estimate":10},"limits":[{"tokens":100,"period":60,"soft_percent":10}]}"#
            ),
            [
                "limits[0].soft_percent: only a `requests` limit can be soft: a token limit's usage is settled after its response"
            ]
        );
        assert_eq!(
            errors(&limit(r#","scope":"global","soft_percent":10"#)),
            [
                "limits[0].soft_percent: only a `scope: proxy` limit can be soft: a global limit spends leased tokens, which hold no margin"
            ]
        );
        assert_eq!(
            errors(
                r#"{"name":"s","key":"global","limits":[{"requests":5,"period":1,"soft_percent":10}],"on_limit":"delay","delay":{"max_delay_ms":5}}"#
            ),
            [
                "on_limit: a rule that delays (`on_limit: delay`) has no soft limits (`soft_percent`): over its limit a request either waits or is warned, not both"
            ]
        );
        assert_eq!(
            errors(r#"{"name":"s","key":"global","limits":[{"concurrent":5,"soft_percent":10}]}"#),
            ["limits[0].soft_percent: an in-flight limit (`concurrent`) is given alone"]
        );
    }

    #[test]
    fn a_descriptor_rule_is_neither_soft_nor_in_warn_mode() {
        let descriptor = r#""descriptor":{"domain":"edge","entries":[{"key":"path"}]}"#;
        assert_eq!(
            errors(&format!(
                r#"{{"name":"s","key":"global","limits":[{{"requests":5,"period":1,"soft_percent":10}}],{descriptor}}}"#
            )),
            [
                "limits: a rule with a `descriptor` has no soft limits (`soft_percent`): Envoy's rate limit service answers OK or OVER_LIMIT, with no warning between them"
            ]
        );
        assert_eq!(
            errors(&format!(
                r#"{{"name":"s","key":"global","mode":"warn","limits":[{{"requests":5,"period":1}}],{descriptor}}}"#
            )),
            [
                "mode: a rule with a `descriptor` cannot be in `warn` mode: Envoy's rate limit service answers OK or OVER_LIMIT, with no warning between them (use `shadow` to count without refusing)"
            ]
        );
        // The other side: the same rules in shadow mode, and without their descriptor.
        assert!(
            problems(&format!(
                r#"{{"name":"s","key":"global","mode":"shadow","limits":[{{"requests":5,"period":1}}],{descriptor}}}"#
            ))
            .is_empty()
        );
        assert!(
            problems(r#"{"name":"s","key":"global","mode":"warn","limits":[{"requests":5,"period":1,"soft_percent":10}]}"#)
                .is_empty()
        );
    }

    #[test]
    fn soft_limits_count_twice_toward_the_slots_buckets() {
        let limits = |n: usize, soft: usize| {
            let all: Vec<String> = (0..n)
                .map(|i| {
                    let extra = if i < soft {
                        r#","soft_percent":10"#
                    } else {
                        ""
                    };
                    format!(r#"{{"requests":{},"period":1{extra}}}"#, i + 1)
                })
                .collect();
            problems(&format!(
                r#"{{"name":"s","key":"global","limits":[{}]}}"#,
                all.join(",")
            ))
        };
        assert!(limits(4, 4).is_empty());
        assert!(limits(7, 1).is_empty());
        assert_eq!(
            limits(5, 4),
            ["limits: at most 8 buckets per rule: each limit is one and a soft limit two (here 9)"]
        );
    }
}
