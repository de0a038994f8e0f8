//! An elastic rule's inputs (the rule's `elastic` section: the ceiling's `requests`,
//! `period` and `burst`): while the rule's admitted requests in this Envoy, all clients
//! together, stay under the ceiling, a client over its own limit still passes. The section
//! is written only while the rule is elastic; its inputs keep what was typed while it is
//! not, as the delay queue's do.

use sluice_core::spec::ElasticSpec;

use super::limit::PeriodChoice;
use super::number::{Number, Numbers};

/// The elastic switch and the ceiling's inputs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElasticDraft {
    /// Whether the rule is elastic: the section is written only then.
    pub on: bool,
    /// The ceiling's requests per period, all the rule's clients together. Required while on.
    pub requests: Number<u64>,
    /// The ceiling's period: the same choice (and custom seconds) as a limit's.
    pub period: PeriodChoice,
    /// The period in seconds when `period` is [`PeriodChoice::Custom`].
    pub seconds: Number<u64>,
    /// Empty: the ceiling's burst is its `requests`. Left out of the spec when empty, so a
    /// loaded rule keeps its absence.
    pub burst: Number<u64>,
}

impl Default for ElasticDraft {
    fn default() -> ElasticDraft {
        ElasticDraft::from_spec(None)
    }
}

impl ElasticDraft {
    /// The inputs that show a rule's `elastic` section, off without one.
    pub fn from_spec(elastic: Option<&ElasticSpec>) -> ElasticDraft {
        let (period, seconds) = PeriodChoice::from_spec(elastic.map(|e| e.period));
        ElasticDraft {
            on: elastic.is_some(),
            requests: elastic.map_or_else(Number::empty, |e| Number::from(e.requests)),
            period,
            seconds,
            burst: elastic
                .and_then(|e| e.burst)
                .map_or_else(Number::empty, Number::from),
        }
    }

    /// The `elastic` section the inputs describe: none while off, whatever the inputs
    /// still hold. A missing `requests` stands in as 0 with its problem, which the core
    /// refuses anyway.
    pub(super) fn to_spec(&self, numbers: &mut Numbers) -> Option<ElasticSpec> {
        if !self.on {
            return None;
        }
        let requests = numbers
            .required(&self.requests, "elastic.requests")
            .unwrap_or(0);
        let period = self
            .period
            .to_spec(&self.seconds, numbers, "elastic.period");
        let burst = numbers.optional(&self.burst, "elastic.burst");
        Some(ElasticSpec {
            requests,
            period,
            burst,
        })
    }
}

#[cfg(test)]
mod tests {
    use sluice_core::rule::{MAX_PERIOD_SECONDS, MAX_REQUESTS};
    use sluice_core::spec::{NamedPeriod, OnLimit, PeriodSpec, Scope};

    use super::super::tests::fields_after;
    use super::super::{Draft, LimitCounts, LimitDraft, blank};
    use super::*;

    fn read(draft: &ElasticDraft) -> (Option<ElasticSpec>, Vec<String>) {
        let mut numbers = Numbers::default();
        let spec = draft.to_spec(&mut numbers);
        let problems = numbers
            .problems
            .into_iter()
            .map(|p| format!("{}: {}", p.field, p.message))
            .collect();
        (spec, problems)
    }

    #[test]
    fn every_elastic_section_survives_the_inputs() {
        for json in [
            r#"{"requests":300,"period":"second"}"#,
            r#"{"requests":1000,"period":"minute","burst":1500}"#,
            r#"{"requests":5,"period":"hour","burst":1}"#,
            r#"{"requests":86400,"period":"day"}"#,
            r#"{"requests":120,"period":90,"burst":40}"#,
            r#"{"requests":1,"period":1}"#,
        ] {
            let elastic: ElasticSpec = serde_json::from_str(json).unwrap();
            let draft = ElasticDraft::from_spec(Some(&elastic));
            assert!(draft.on);
            assert_eq!(read(&draft), (Some(elastic), vec![]), "{json}");
        }
    }

    #[test]
    fn off_writes_no_section_and_keeps_the_inputs() {
        let elastic: ElasticSpec =
            serde_json::from_str(r#"{"requests":500,"period":45,"burst":600}"#).unwrap();
        let mut draft = ElasticDraft::from_spec(Some(&elastic));
        draft.on = false;
        assert_eq!(read(&draft), (None, vec![]));
        assert_eq!(draft.requests.text(), "500", "kept for when it is on again");
        assert_eq!(draft.seconds.text(), "45");
        // Even an input that is not a number is no problem while it does not apply.
        draft.burst = Number::parse("lots");
        assert_eq!(read(&draft), (None, vec![]));
        draft.on = true;
        draft.burst = Number::parse("600");
        assert_eq!(read(&draft), (Some(elastic), vec![]));
        let blank = ElasticDraft::default();
        assert!(!blank.on);
        assert_eq!(blank.period, PeriodChoice::Named(NamedPeriod::Second));
        assert_eq!(blank.requests.text(), "");
    }

    #[test]
    fn on_needs_requests_and_names_each_input_that_is_not_a_number() {
        let mut draft = ElasticDraft {
            on: true,
            ..ElasticDraft::default()
        };
        assert_eq!(
            read(&draft),
            (
                Some(ElasticSpec {
                    requests: 0,
                    period: PeriodSpec::Named(NamedPeriod::Second),
                    burst: None,
                }),
                vec!["elastic.requests: is required".to_string()]
            ),
            "an empty burst is the default"
        );
        draft.requests = Number::parse("2,000");
        draft.period = PeriodChoice::Custom;
        draft.burst = Number::parse("1.5");
        let (spec, problems) = read(&draft);
        assert_eq!(spec.map(|e| e.requests), Some(2_000));
        assert_eq!(
            problems,
            [
                "elastic.period: is required",
                "elastic.burst: must be a whole number",
            ]
        );
    }

    /// Elastic inputs over the blank rule's request limit (10/s per API key).
    fn elastic(d: &mut Draft) {
        d.elastic = ElasticDraft {
            on: true,
            requests: Number::from(100),
            ..ElasticDraft::default()
        };
    }

    #[test]
    fn the_whole_rule_keeps_its_elastic_section_and_off_drops_it() {
        let original: sluice_core::spec::RuleSpec = serde_json::from_str(
            r#"{"name":"burst","key":{"header":"x-api-key"},
                "limits":[{"requests":10,"period":"second"},{"requests":100,"period":"minute"}],
                "overrides":[{"client":"acme","limits":[{"requests":50,"period":"second"}]}],
                "elastic":{"requests":300,"period":30,"burst":400}}"#,
        )
        .unwrap();
        let mut draft = Draft::from_spec(&original);
        assert!(draft.elastic.on);
        let (back, problems) = draft.to_spec();
        assert_eq!(back, original, "nothing lost on a save");
        assert!(super::super::validate(back, problems).is_empty());
        draft.elastic.on = false;
        let (strict, problems) = draft.to_spec();
        assert_eq!(
            strict,
            sluice_core::spec::RuleSpec {
                elastic: None,
                ..original
            },
            "only the section changed"
        );
        assert!(super::super::validate(strict, problems).is_empty());
        assert_eq!(Draft::from_spec(&blank()).elastic, ElasticDraft::default());
    }

    #[test]
    fn the_ceilings_inputs_get_the_cores_problems_on_both_sides_of_each_bound() {
        assert!(fields_after(elastic).is_empty());
        let with = |edit: fn(&mut ElasticDraft)| {
            fields_after(move |d| {
                elastic(d);
                edit(&mut d.elastic);
            })
        };
        assert_eq!(with(|e| e.requests = Number::empty()), ["elastic.requests"]);
        assert_eq!(
            with(|e| e.requests = Number::parse("0")),
            ["elastic.requests"]
        );
        assert!(with(|e| e.requests = Number::parse("1")).is_empty());
        assert!(with(|e| e.requests = Number::from(MAX_REQUESTS)).is_empty());
        assert_eq!(
            with(|e| e.requests = Number::from(MAX_REQUESTS + 1)),
            ["elastic.requests"]
        );
        let seconds = |s: u64| {
            move |e: &mut ElasticDraft| {
                e.period = PeriodChoice::Custom;
                e.seconds = Number::from(s);
            }
        };
        assert_eq!(
            fields_after(|d| {
                elastic(d);
                seconds(0)(&mut d.elastic);
            }),
            ["elastic.period"]
        );
        assert!(
            fields_after(|d| {
                elastic(d);
                seconds(1)(&mut d.elastic);
            })
            .is_empty()
        );
        assert!(
            fields_after(|d| {
                elastic(d);
                seconds(MAX_PERIOD_SECONDS)(&mut d.elastic);
            })
            .is_empty()
        );
        assert_eq!(
            fields_after(|d| {
                elastic(d);
                seconds(MAX_PERIOD_SECONDS + 1)(&mut d.elastic);
            }),
            ["elastic.period"]
        );
        assert_eq!(with(|e| e.burst = Number::parse("0")), ["elastic.burst"]);
        assert!(with(|e| e.burst = Number::parse("1")).is_empty());
        assert!(with(|e| e.burst = Number::from(MAX_REQUESTS)).is_empty());
        assert_eq!(
            with(|e| e.burst = Number::from(MAX_REQUESTS + 1)),
            ["elastic.burst"]
        );
    }

    #[test]
    fn the_combinations_the_core_refuses_land_on_elastic() {
        let refused = |edit: fn(&mut Draft)| {
            fields_after(move |d| {
                elastic(d);
                edit(d);
            })
        };
        assert_eq!(
            refused(|d| d.limits[0].scope = Scope::Global),
            ["elastic"],
            "a fleet-wide limit"
        );
        assert_eq!(
            refused(|d| {
                d.limits[0].counts = LimitCounts::Tokens(Default::default());
                d.tokens.usage = Some(super::super::UsageKind::OpenAi);
                d.tokens.default_estimate = Number::from(100);
            }),
            ["elastic"],
            "a token limit"
        );
        assert_eq!(
            refused(|d| d.limits[0].soft_percent = Number::from(20)),
            ["elastic"],
            "a soft limit"
        );
        assert_eq!(
            refused(|d| d.mode = sluice_core::spec::Mode::Warn),
            ["elastic"],
            "warn mode"
        );
        assert_eq!(
            refused(|d| {
                d.delay.on_limit = OnLimit::Delay;
                d.delay.max_delay_ms = Number::from(500);
            }),
            ["elastic"],
            "a delay"
        );
        assert_eq!(
            refused(|d| {
                d.overrides.push(super::super::OverrideDraft {
                    client: "acme".into(),
                    limits: vec![LimitDraft {
                        requests: Number::from(50),
                        scope: Scope::Global,
                        ..LimitDraft::default()
                    }],
                })
            }),
            ["elastic"],
            "an override's limits count too"
        );
        // The other side of each: the same rule, not elastic, is fine.
        assert!(fields_after(|d| d.limits[0].soft_percent = Number::from(20)).is_empty());
        assert!(fields_after(|d| d.limits[0].scope = Scope::Global).is_empty());
        assert!(fields_after(|d| d.mode = sluice_core::spec::Mode::Warn).is_empty());
    }
}
