//! A limit's inputs (what it counts, how many per period, burst, scope) and a per-client
//! override's.

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

impl PeriodChoice {
    /// The choice and the custom-seconds input that show `period` (none: per second). Used
    /// by every period input of the form (a limit's, the elastic ceiling's).
    pub fn from_spec(period: Option<PeriodSpec>) -> (PeriodChoice, Number<u64>) {
        match period {
            Some(PeriodSpec::Named(n)) => (PeriodChoice::Named(n), Number::empty()),
            Some(PeriodSpec::Seconds(s)) => (PeriodChoice::Custom, Number::from(s)),
            None => (PeriodChoice::Named(NamedPeriod::Second), Number::empty()),
        }
    }

    /// The period the choice describes; the custom seconds are read only when picked, and
    /// a missing one or one that is not a number is named at `field` (standing in as 0,
    /// which the core refuses).
    pub(super) fn to_spec(
        self,
        seconds: &Number<u64>,
        numbers: &mut Numbers,
        field: &str,
    ) -> PeriodSpec {
        match self {
            PeriodChoice::Named(n) => PeriodSpec::Named(n),
            PeriodChoice::Custom => {
                PeriodSpec::Seconds(numbers.required(seconds, field).unwrap_or(0))
            }
        }
    }
}

/// What a limit counts: requests, LLM tokens (and which usage), or requests in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitCounts {
    Requests,
    /// A token limit: `tokens` per period, counting this part of the reported usage.
    Tokens(UsageMeasure),
    /// An in-flight limit (`concurrent`): no period, burst or fleet-wide scope.
    InFlight,
}

impl LimitCounts {
    /// The wire field that holds the limit's amount, and names its problems.
    pub fn amount_field(self) -> &'static str {
        match self {
            LimitCounts::Requests => "requests",
            LimitCounts::Tokens(_) => "tokens",
            LimitCounts::InFlight => "concurrent",
        }
    }

    pub fn is_tokens(self) -> bool {
        matches!(self, LimitCounts::Tokens(_))
    }

    fn from_spec(spec: &LimitSpec) -> LimitCounts {
        if spec.concurrent.is_some() {
            LimitCounts::InFlight
        } else if spec.tokens.is_some() {
            LimitCounts::Tokens(spec.count.unwrap_or_default())
        } else {
            LimitCounts::Requests
        }
    }
}

/// The options of a limit's "counts" `<select>`. A token limit counting the total is
/// written without `count` (total is its default), as `scope: proxy` is left out.
impl Choice for LimitCounts {
    const ALL: &'static [Self] = &[
        LimitCounts::Requests,
        LimitCounts::Tokens(UsageMeasure::Total),
        LimitCounts::Tokens(UsageMeasure::Input),
        LimitCounts::Tokens(UsageMeasure::Output),
        LimitCounts::InFlight,
    ];

    fn value(self) -> &'static str {
        match self {
            LimitCounts::Requests => "requests",
            LimitCounts::Tokens(UsageMeasure::Total) => "tokens",
            LimitCounts::Tokens(UsageMeasure::Input) => "input_tokens",
            LimitCounts::Tokens(UsageMeasure::Output) => "output_tokens",
            LimitCounts::InFlight => "concurrent",
        }
    }
}

/// One limit's inputs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitDraft {
    /// What the limit counts: it decides which wire field `requests` is written to.
    pub counts: LimitCounts,
    /// The limit's amount: requests, tokens or requests in flight, as `counts` says.
    pub requests: Number<u64>,
    pub period: PeriodChoice,
    /// The period in seconds when `period` is [`PeriodChoice::Custom`]; kept as typed
    /// while another period is picked.
    pub seconds: Number<u64>,
    /// Empty: the burst defaults to `requests`.
    pub burst: Number<u64>,
    /// One bucket per client for the whole fleet (`Scope::Global`) or per proxy.
    pub scope: Scope,
    /// Empty: a hard limit. A percentage: how far over it clients are warned instead of
    /// refused (`soft_percent`).
    pub soft_percent: Number<u64>,
}

/// A new limit: per second, its number of requests still to be typed.
impl Default for LimitDraft {
    fn default() -> LimitDraft {
        LimitDraft {
            counts: LimitCounts::Requests,
            requests: Number::empty(),
            period: PeriodChoice::Named(NamedPeriod::Second),
            seconds: Number::empty(),
            burst: Number::empty(),
            scope: Scope::Proxy,
            soft_percent: Number::empty(),
        }
    }
}

impl LimitDraft {
    /// The inputs that show `spec`.
    pub fn from_spec(spec: &LimitSpec) -> LimitDraft {
        let (period, seconds) = PeriodChoice::from_spec(spec.period);
        LimitDraft {
            counts: LimitCounts::from_spec(spec),
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
            soft_percent: spec.soft_percent.map(Number::from).unwrap_or_default(),
        }
    }

    /// The inputs of a limit added below `last`: rules usually stack a short and a longer
    /// window, so after a per-second limit comes a per-minute one, after any other an hourly
    /// one. It counts what the last one counts (an in-flight limit aside: a rule has at
    /// most one).
    pub fn after(last: Option<&LimitDraft>) -> LimitDraft {
        let period = match last.map(|l| l.period) {
            None => PeriodChoice::Named(NamedPeriod::Second),
            Some(PeriodChoice::Named(NamedPeriod::Second)) => {
                PeriodChoice::Named(NamedPeriod::Minute)
            }
            Some(_) => PeriodChoice::Named(NamedPeriod::Hour),
        };
        let counts = match last.map(|l| l.counts) {
            Some(LimitCounts::InFlight) | None => LimitCounts::Requests,
            Some(counts) => counts,
        };
        LimitDraft {
            counts,
            period,
            ..LimitDraft::default()
        }
    }

    /// The limit the inputs describe; `field` is its path (`limits[0]`).
    fn to_spec(&self, numbers: &mut Numbers, field: &str) -> LimitSpec {
        let amount = numbers
            .required(
                &self.requests,
                &format!("{field}.{}", self.counts.amount_field()),
            )
            .unwrap_or(0);
        if self.counts == LimitCounts::InFlight {
            return LimitSpec {
                concurrent: Some(amount),
                soft_percent: None,
                requests: None,
                period: None,
                burst: None,
                scope: self.scope,
                tokens: None,
                count: None,
            };
        }
        let period = self
            .period
            .to_spec(&self.seconds, numbers, &format!("{field}.period"));
        let burst = numbers.optional(&self.burst, &format!("{field}.burst"));
        let soft_percent = numbers.optional(&self.soft_percent, &format!("{field}.soft_percent"));
        let (requests, tokens, count) = match self.counts {
            LimitCounts::Tokens(UsageMeasure::Total) => (None, Some(amount), None),
            LimitCounts::Tokens(measure) => (None, Some(amount), Some(measure)),
            LimitCounts::Requests | LimitCounts::InFlight => (Some(amount), None, None),
        };
        LimitSpec {
            requests,
            period: Some(period),
            burst,
            scope: self.scope,
            tokens,
            count,
            concurrent: None,
            soft_percent,
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
    fn each_kind_of_limit_writes_its_amount_to_its_own_field() {
        options_round_trip::<LimitCounts>();
        let written = |counts: LimitCounts| {
            let draft = LimitDraft {
                counts,
                requests: Number::parse("7"),
                burst: Number::parse("9"),
                ..LimitDraft::default()
            };
            let mut numbers = Numbers::default();
            let spec = draft.to_spec(&mut numbers, "limits[0]");
            assert!(numbers.problems.is_empty(), "{:?}", numbers.problems);
            serde_json::to_string(&spec).unwrap()
        };
        assert_eq!(
            written(LimitCounts::Requests),
            r#"{"requests":7,"period":"second","burst":9}"#
        );
        assert_eq!(
            written(LimitCounts::Tokens(UsageMeasure::Total)),
            r#"{"period":"second","burst":9,"tokens":7}"#,
            "total is the default count, left out"
        );
        assert_eq!(
            written(LimitCounts::Tokens(UsageMeasure::Output)),
            r#"{"period":"second","burst":9,"tokens":7,"count":"output"}"#
        );
        assert_eq!(
            written(LimitCounts::InFlight),
            r#"{"concurrent":7}"#,
            "period and burst do not apply"
        );
        for &counts in LimitCounts::ALL {
            let draft = LimitDraft {
                counts,
                ..LimitDraft::default()
            };
            let mut numbers = Numbers::default();
            draft.to_spec(&mut numbers, "limits[2]");
            assert_eq!(
                numbers.problems[0].field,
                format!("limits[2].{}", counts.amount_field()),
                "a missing amount is named by the field the API names"
            );
        }
        let explicit_total: LimitSpec =
            serde_json::from_str(r#"{"tokens":5,"period":1,"count":"total"}"#).unwrap();
        assert_eq!(
            LimitDraft::from_spec(&explicit_total).counts,
            LimitCounts::Tokens(UsageMeasure::Total)
        );
    }

    #[test]
    fn a_soft_limit_keeps_its_percentage_through_the_form() {
        let soft: LimitSpec =
            serde_json::from_str(r#"{"requests":8,"period":"second","soft_percent":25}"#).unwrap();
        let mut draft = LimitDraft::from_spec(&soft);
        assert_eq!(draft.soft_percent.text(), "25");
        let mut numbers = Numbers::default();
        assert_eq!(
            draft.to_spec(&mut numbers, "limits[0]"),
            soft,
            "nothing lost on a save"
        );
        // Emptied, the limit is hard again.
        draft.soft_percent = Number::empty();
        assert_eq!(draft.to_spec(&mut numbers, "limits[0]").soft_percent, None);
        // Not a number: named at its input.
        draft.soft_percent = Number::parse("a quarter");
        draft.to_spec(&mut numbers, "limits[0]");
        assert_eq!(numbers.problems[0].field, "limits[0].soft_percent");
    }

    #[test]
    fn a_new_limit_counts_what_the_last_one_counted_but_in_flight() {
        let last = |counts| LimitDraft {
            counts,
            ..LimitDraft::default()
        };
        let output = LimitCounts::Tokens(UsageMeasure::Output);
        assert_eq!(LimitDraft::after(Some(&last(output))).counts, output);
        assert_eq!(
            LimitDraft::after(Some(&last(LimitCounts::InFlight))).counts,
            LimitCounts::Requests
        );
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
