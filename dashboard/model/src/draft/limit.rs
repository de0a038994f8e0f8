//! A limit's inputs (requests per period, burst, scope) and a per-client override's.

use sluice_core::spec::{LimitSpec, NamedPeriod, OverrideSpec, PeriodSpec, Scope, UsageMeasure};

use super::choice::Choice;
use super::number::{Number, Numbers};

/// The period picked for a limit: a named one, or a number of seconds typed beside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeriodChoice {
    Named(NamedPeriod),
    /// The seconds are in [`LimitDraft::seconds`].
    Custom,
}

impl Choice for PeriodChoice {
    const ALL: &'static [Self] = &[
        PeriodChoice::Named(NamedPeriod::Second),
        PeriodChoice::Named(NamedPeriod::Minute),
        PeriodChoice::Named(NamedPeriod::Hour),
        PeriodChoice::Named(NamedPeriod::Day),
        PeriodChoice::Custom,
    ];

    fn value(self) -> &'static str {
        match self {
            PeriodChoice::Named(NamedPeriod::Second) => "second",
            PeriodChoice::Named(NamedPeriod::Minute) => "minute",
            PeriodChoice::Named(NamedPeriod::Hour) => "hour",
            PeriodChoice::Named(NamedPeriod::Day) => "day",
            PeriodChoice::Custom => "custom",
        }
    }
}

/// One limit's inputs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitDraft {
    pub requests: Number<u64>,
    pub period: PeriodChoice,
    /// The period in seconds when `period` is [`PeriodChoice::Custom`]; kept as typed
    /// while another period is picked.
    pub seconds: Number<u64>,
    /// Empty: the burst defaults to `requests`.
    pub burst: Number<u64>,
    /// One bucket per client for the whole fleet (`Scope::Global`) or per proxy.
    pub scope: Scope,
    /// Not an input of the form yet: a token limit as loaded (`requests` then holds its
    /// tokens), kept so that saving the form does not turn it into a request limit.
    pub tokens: Option<TokenCount>,
    /// Not an input of the form yet either: an in-flight limit as loaded (`requests` then
    /// holds its `concurrent`), kept so that saving the form keeps it one.
    pub in_flight: bool,
}

/// What a loaded token limit counts (`count` as written: `None` is the default, total).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenCount {
    pub count: Option<UsageMeasure>,
}

/// A new limit: per second, its number of requests still to be typed.
impl Default for LimitDraft {
    fn default() -> LimitDraft {
        LimitDraft {
            requests: Number::empty(),
            period: PeriodChoice::Named(NamedPeriod::Second),
            seconds: Number::empty(),
            burst: Number::empty(),
            scope: Scope::Proxy,
            tokens: None,
            in_flight: false,
        }
    }
}

impl LimitDraft {
    /// The inputs that show `spec`.
    pub fn from_spec(spec: &LimitSpec) -> LimitDraft {
        let (period, seconds) = match spec.period {
            Some(PeriodSpec::Named(n)) => (PeriodChoice::Named(n), Number::empty()),
            Some(PeriodSpec::Seconds(s)) => (PeriodChoice::Custom, Number::from(s)),
            None => (PeriodChoice::Named(NamedPeriod::Second), Number::empty()),
        };
        LimitDraft {
            requests: spec
                .requests
                .or(spec.tokens)
                .or(spec.concurrent)
                .map(Number::from)
                .unwrap_or_default(),
            period,
            seconds,
            burst: spec.burst.map(Number::from).unwrap_or_default(),
            scope: spec.scope,
            tokens: spec.tokens.map(|_| TokenCount { count: spec.count }),
            in_flight: spec.concurrent.is_some(),
        }
    }

    /// The inputs of a limit added below `last`: rules usually stack a short and a longer
    /// window, so after a per-second limit comes a per-minute one, after any other an hourly
    /// one.
    pub fn after(last: Option<&LimitDraft>) -> LimitDraft {
        let period = match last.map(|l| l.period) {
            None => PeriodChoice::Named(NamedPeriod::Second),
            Some(PeriodChoice::Named(NamedPeriod::Second)) => {
                PeriodChoice::Named(NamedPeriod::Minute)
            }
            Some(_) => PeriodChoice::Named(NamedPeriod::Hour),
        };
        LimitDraft {
            period,
            ..LimitDraft::default()
        }
    }

    /// The limit the inputs describe; `field` is its path (`limits[0]`).
    fn to_spec(&self, numbers: &mut Numbers, field: &str) -> LimitSpec {
        if self.in_flight {
            return LimitSpec {
                concurrent: Some(
                    numbers
                        .required(&self.requests, &format!("{field}.concurrent"))
                        .unwrap_or(0),
                ),
                requests: None,
                period: None,
                burst: None,
                scope: self.scope,
                tokens: None,
                count: None,
            };
        }
        let requests = numbers
            .required(&self.requests, &format!("{field}.requests"))
            .unwrap_or(0);
        let period = match self.period {
            PeriodChoice::Named(n) => PeriodSpec::Named(n),
            PeriodChoice::Custom => PeriodSpec::Seconds(
                numbers
                    .required(&self.seconds, &format!("{field}.period"))
                    .unwrap_or(0),
            ),
        };
        let burst = numbers.optional(&self.burst, &format!("{field}.burst"));
        let (requests, tokens, count) = match self.tokens {
            None => (Some(requests), None, None),
            Some(t) => (None, Some(requests), t.count),
        };
        LimitSpec {
            requests,
            period: Some(period),
            burst,
            scope: self.scope,
            tokens,
            count,
            concurrent: None,
        }
    }
}

/// The inputs of a list of limits.
pub(super) fn from_specs(specs: &[LimitSpec]) -> Vec<LimitDraft> {
    specs.iter().map(LimitDraft::from_spec).collect()
}

/// The limits the rows at `prefix` (`limits`, `overrides[0].limits`) describe.
pub(super) fn to_specs(rows: &[LimitDraft], numbers: &mut Numbers, prefix: &str) -> Vec<LimitSpec> {
    rows.iter()
        .enumerate()
        .map(|(i, r)| r.to_spec(numbers, &format!("{prefix}[{i}]")))
        .collect()
}

/// One per-client override's inputs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverrideDraft {
    pub client: String,
    pub limits: Vec<LimitDraft>,
}

impl OverrideDraft {
    /// A new override: no client yet, one new limit.
    pub fn new() -> OverrideDraft {
        OverrideDraft {
            client: String::new(),
            limits: vec![LimitDraft::default()],
        }
    }

    pub(super) fn from_spec(spec: &OverrideSpec) -> OverrideDraft {
        OverrideDraft {
            client: spec.client.clone(),
            limits: from_specs(&spec.limits),
        }
    }

    /// The override the inputs describe; it is the `index`th.
    pub(super) fn to_spec(&self, numbers: &mut Numbers, index: usize) -> OverrideSpec {
        OverrideSpec {
            client: self.client.clone(),
            limits: to_specs(&self.limits, numbers, &format!("overrides[{index}].limits")),
        }
    }
}

impl Default for OverrideDraft {
    fn default() -> OverrideDraft {
        OverrideDraft::new()
    }
}

#[cfg(test)]
mod tests {
    use super::super::choice::tests::options_round_trip;
    use super::*;

    fn period(p: PeriodChoice) -> LimitDraft {
        LimitDraft {
            period: p,
            ..LimitDraft::default()
        }
    }

    #[test]
    fn a_new_limit_follows_the_last_one() {
        let minute = PeriodChoice::Named(NamedPeriod::Minute);
        let hour = PeriodChoice::Named(NamedPeriod::Hour);
        assert_eq!(LimitDraft::after(None), LimitDraft::default());
        assert_eq!(
            LimitDraft::after(None).period,
            PeriodChoice::Named(NamedPeriod::Second)
        );
        let after = |p| LimitDraft::after(Some(&period(p))).period;
        assert_eq!(after(PeriodChoice::Named(NamedPeriod::Second)), minute);
        assert_eq!(after(minute), hour);
        assert_eq!(after(PeriodChoice::Custom), hour);
        let next = LimitDraft::after(Some(&period(PeriodChoice::Named(NamedPeriod::Second))));
        assert_eq!(next.requests.text(), "");
        assert_eq!(next.scope, Scope::Proxy);
    }

    #[test]
    fn period_options_are_the_wire_names_and_custom() {
        options_round_trip::<PeriodChoice>();
        for choice in PeriodChoice::ALL {
            match choice {
                PeriodChoice::Named(n) => {
                    assert_eq!(serde_json::to_value(n).unwrap(), choice.value())
                }
                PeriodChoice::Custom => assert_eq!(choice.value(), "custom"),
            }
        }
    }

    #[test]
    fn a_custom_period_keeps_its_seconds_and_a_named_one_ignores_them() {
        let spec: LimitSpec =
            serde_json::from_str(r#"{"requests":3,"period":90,"burst":4,"scope":"global"}"#)
                .unwrap();
        let mut draft = LimitDraft::from_spec(&spec);
        assert_eq!(draft.period, PeriodChoice::Custom);
        assert_eq!(draft.seconds.text(), "90");
        let mut numbers = Numbers::default();
        assert_eq!(draft.to_spec(&mut numbers, "limits[0]"), spec);
        draft.period = PeriodChoice::Named(NamedPeriod::Hour);
        draft.seconds = Number::parse("not read");
        let hourly = draft.to_spec(&mut numbers, "limits[0]");
        assert_eq!(hourly.period, Some(PeriodSpec::Named(NamedPeriod::Hour)));
        assert!(numbers.problems.is_empty(), "{:?}", numbers.problems);
    }
}
