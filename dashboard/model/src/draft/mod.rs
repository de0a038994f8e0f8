//! The rule form's inputs as typed data, and their translation to and from a rule spec.
//!
//! The form keeps one Leptos signal per input; reading them gives a [`Draft`], and a
//! [`Draft`] made from a spec fills them. Choices are enums (the core's own where the wire
//! has one: [`Mode`], [`Scope`], [`FailureMode`], [`NamedPeriod`]; the form's where it
//! has a state the wire does not, like a custom period whose seconds are still being
//! typed), and numbers are [`Number`]s: the text as typed and the number it parsed to.
//! Everything between the inputs and the spec (what is a number, which field path a
//! problem belongs to) lives here, so it is tested on the host without a browser.
//!
//! By part of the rule: [`matcher`] (which requests), [`key`] (whose bucket, and what a
//! request without a key gets), [`limit`] (limits and overrides), [`tokens`] (a token
//! budget), [`cost`], [`delay`] (what an over-limit request gets), [`elastic`] (the ceiling under
//! which clients may pass their limits); [`number`] reads numeric inputs and [`choice`]
//! names the options of the form's `<select>`s.

pub mod choice;
pub mod cost;
pub mod delay;
pub mod elastic;
pub mod key;
pub mod limit;
pub mod matcher;
pub mod number;
pub mod tokens;

use sluice_core::rule::Rule;
use sluice_core::spec::{
    CostSpec, FailureMode, GrpcStatus, KeySpec, LimitSpec, MatchSpec, Mode, NamedPeriod,
    PeriodSpec, ResponseSpec, RuleSpec, Scope,
};

pub use choice::Choice;
pub use cost::{CostDraft, CostKind};
pub use delay::DelayDraft;
pub use elastic::ElasticDraft;
pub use key::{KeyDraft, KeyKind, KeyMissing, KeyMissingDraft};
pub use limit::{LimitCounts, LimitDraft, OverrideDraft, PeriodChoice};
pub use matcher::{HeaderCondition, HeaderDraft, MatchDraft, ValueDraft, methods_field};
pub use number::{Number, NumberError, Whole};
/// One problem with one field, as the API and the core name them (`limits[0].requests`).
pub use sluice_core::validation::FieldError;
pub use tokens::{TokensDraft, UsageKind};

use matcher::nonempty;
use number::Numbers;

/// Every input of the rule form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Draft {
    pub id: String,
    pub name: String,
    pub description: String,
    /// Empty: 0.
    pub priority: Number<i32>,
    pub enabled: bool,
    pub mode: Mode,
    pub matcher: MatchDraft,
    pub key: KeyDraft,
    pub key_missing: KeyMissingDraft,
    /// The share of clients an enforce-mode rule is enforced for; empty: 100.
    pub enforce_percent: Number<u8>,
    pub limits: Vec<LimitDraft>,
    pub cost: CostDraft,
    pub overrides: Vec<OverrideDraft>,
    /// `None`: the proxy's default.
    pub failure_mode: Option<FailureMode>,
    pub status: Number<u16>,
    pub rate_limit_headers: bool,
    /// Not an input of the form: kept as loaded, so saving the form does not reset it.
    pub grpc_status: GrpcStatus,
    /// Not an input of the form either (a rule for Envoy's rate limit service): kept as
    /// loaded, so saving the form keeps it.
    pub descriptor: Option<sluice_core::rls::DescriptorSpec>,
    /// The token budget, written only while some limit counts tokens.
    pub tokens: TokensDraft,
    /// What an over-limit request gets (`on_limit`) and, when it waits, the `delay`
    /// section.
    pub delay: DelayDraft,
    /// Whether the rule is elastic and its ceiling: the `elastic` section.
    pub elastic: ElasticDraft,
}

impl Draft {
    /// The inputs that show `spec`.
    pub fn from_spec(spec: &RuleSpec) -> Draft {
        Draft {
            id: spec.id.clone().unwrap_or_default(),
            name: spec.name.clone(),
            description: spec.description.clone(),
            priority: Number::from(spec.priority),
            enabled: spec.enabled,
            mode: spec.mode,
            matcher: MatchDraft::from_spec(&spec.matcher),
            key: KeyDraft::from_spec(&spec.key),
            key_missing: KeyMissingDraft::from_spec(&spec.key_missing),
            enforce_percent: Number::from(spec.enforce_percent),
            limits: limit::from_specs(&spec.limits),
            cost: CostDraft::from_spec(&spec.cost),
            overrides: spec
                .overrides
                .iter()
                .map(OverrideDraft::from_spec)
                .collect(),
            failure_mode: spec.failure_mode,
            status: Number::from(spec.response.status),
            rate_limit_headers: spec.response.rate_limit_headers,
            grpc_status: spec.response.grpc_status,
            descriptor: spec.descriptor.clone(),
            tokens: TokensDraft::from_spec(spec.tokens.as_ref()),
            delay: DelayDraft::from_spec(spec.on_limit, spec.delay.as_ref()),
            elastic: ElasticDraft::from_spec(spec.elastic.as_ref()),
        }
    }

    /// Whether a limit of the rule or of an override counts tokens: the token budget's
    /// inputs apply (and show) only then.
    pub fn counts_tokens(&self) -> bool {
        self.limits
            .iter()
            .chain(self.overrides.iter().flat_map(|o| &o.limits))
            .any(|l| l.counts.is_tokens())
    }

    /// Adds an override for `client` that starts from the rule's own limits (the rules page
    /// links here to raise one client's limits), unless the client already has one: then
    /// nothing changes and this returns `false`.
    pub fn add_override_for(&mut self, client: &str) -> bool {
        if self.overrides.iter().any(|o| o.client == client) {
            return false;
        }
        self.overrides.push(OverrideDraft {
            client: client.to_string(),
            limits: self.limits.clone(),
        });
        true
    }

    /// The spec the inputs describe, and the inputs that are missing or not even numbers
    /// (with the field paths the core uses, so the form shows both kinds of problem the
    /// same way). An input with a problem stands in the spec as 0 (1 for a header cost's
    /// default), which the core would refuse anyway where 0 is wrong.
    pub fn to_spec(&self) -> (RuleSpec, Vec<FieldError>) {
        let mut numbers = Numbers::default();
        let limits = limit::to_specs(&self.limits, &mut numbers, "limits");
        let overrides = self
            .overrides
            .iter()
            .enumerate()
            .map(|(i, o)| o.to_spec(&mut numbers, i))
            .collect();
        let key = self.key.to_spec(&mut numbers);
        let cost = self.cost.to_spec(&mut numbers);
        let status = numbers
            .required(&self.status, "response.status")
            .unwrap_or(0);
        let priority = numbers.optional(&self.priority, "priority").unwrap_or(0);
        let enforce_percent = numbers
            .optional(&self.enforce_percent, "enforce_percent")
            .unwrap_or(100);
        let tokens = self.tokens.to_spec(self.counts_tokens(), &mut numbers);
        let (on_limit, delay) = self.delay.to_spec(&mut numbers);
        let elastic = self.elastic.to_spec(&mut numbers);
        let spec = RuleSpec {
            id: nonempty(&self.id),
            name: self.name.trim().to_string(),
            description: self.description.trim().to_string(),
            enabled: self.enabled,
            priority,
            mode: self.mode,
            matcher: self.matcher.to_spec(&mut numbers),
            key,
            key_missing: self.key_missing.to_spec(),
            enforce_percent,
            limits,
            cost,
            overrides,
            failure_mode: self.failure_mode,
            response: ResponseSpec {
                status,
                rate_limit_headers: self.rate_limit_headers,
                grpc_status: self.grpc_status,
            },
            descriptor: self.descriptor.clone(),
            tokens,
            on_limit,
            delay,
            elastic,
        };
        (spec, numbers.problems)
    }
}

/// Whether the form can show `spec` whole: its key and every value condition's source
/// read back exactly. A rule it cannot show is edited as JSON.
pub fn form_shows(spec: &RuleSpec) -> bool {
    key::form_shows(&spec.key) && MatchDraft::form_shows(&spec.matcher)
}

/// Every problem with a spec: the form's own (not a number) first, then the core's, without
/// repeating a field already flagged.
pub fn validate(spec: RuleSpec, mut problems: Vec<FieldError>) -> Vec<FieldError> {
    if let Err(errors) = Rule::try_from(spec) {
        for e in errors.0 {
            if !problems.iter().any(|p| p.field == e.field) {
                problems.push(FieldError {
                    field: e.field,
                    message: e.message,
                });
            }
        }
    }
    problems
}

/// A new rule's starting point: 10 requests a second per API key.
pub fn blank() -> RuleSpec {
    RuleSpec {
        id: None,
        name: String::new(),
        description: String::new(),
        enabled: true,
        priority: 0,
        mode: Mode::Enforce,
        matcher: MatchSpec::default(),
        key: KeySpec::Header("x-api-key".to_string()),
        key_missing: Default::default(),
        enforce_percent: 100,
        limits: vec![LimitSpec {
            requests: Some(10),
            period: Some(PeriodSpec::Named(NamedPeriod::Second)),
            burst: None,
            scope: Scope::Proxy,
            tokens: None,
            count: None,
            concurrent: None,
            soft_percent: None,
        }],
        cost: CostSpec::default(),
        overrides: Vec::new(),
        failure_mode: None,
        descriptor: None,
        response: ResponseSpec::default(),
        tokens: None,
        on_limit: Default::default(),
        delay: None,
        elastic: None,
    }
}

#[cfg(test)]
mod tests;
