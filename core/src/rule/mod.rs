//! Validated rules: built once from a [`RuleSpec`] at the edge, then trusted.
//!
//! `Rule::try_from(spec)` checks every field and reports *all* problems with the field
//! path (`limits[1].requests`), so an API client or an operator editing a file sees the
//! whole list at once. A `Rule` cannot hold a zero rate, an unparsable regex or an
//! unknown period: later code never re-checks.
//!
//! A rule's parts live beside it, each with its checks and its tests: [`RequestMatcher`]
//! (which requests), [`ClientKey`] (whose bucket), [`Cost`] (how many tokens) and
//! [`Limit`] (the buckets themselves). Their types are re-exported here, so
//! `sluice_core::rule::X` is the one path to each.

mod cost;
mod key;
mod limit;
mod matcher;
mod tokens;

use std::collections::HashMap;

pub use cost::{Cost, MAX_COST};
pub use key::{COMPOSITE_SEPARATOR, ClientKey};
pub use limit::{
    Counts, Limit, MAX_LIMITS_PER_RULE, MAX_PERIOD_SECONDS, MAX_REQUESTS, capped_burst,
};
pub use matcher::RequestMatcher;
pub use tokens::{MAX_ESTIMATE, TokenBudget};

use crate::request::RequestNeeds;
use crate::spec::{FailureMode, GrpcStatus, Mode, OverrideSpec, RuleSpec};
use crate::validation::{Problems, ValidationErrors};

/// Most per-client overrides on one rule.
pub const MAX_OVERRIDES: usize = 10_000;

/// The validated form of a [`RuleSpec`].
#[derive(Debug, Clone)]
pub struct Rule {
    pub id: String,
    pub name: String,
    pub enabled: bool,
    pub priority: i32,
    pub mode: Mode,
    pub matcher: RequestMatcher,
    pub key: ClientKey,
    pub limits: Vec<Limit>,
    pub cost: Cost,
    pub overrides: HashMap<String, Vec<Limit>>,
    /// `None` follows the proxy's default failure mode.
    pub failure_mode: Option<FailureMode>,
    pub status: u16,
    pub rate_limit_headers: bool,
    /// What a denied gRPC call gets in `grpc-status`.
    pub grpc_status: GrpcStatus,
    /// Set: an RLS rule, which the filter never matches (see [`crate::rls`]).
    pub descriptor: Option<crate::rls::DescriptorMatch>,
    /// Where a rule with token limits reads usage and what it reserves; `None` when no
    /// limit counts tokens.
    pub tokens: Option<TokenBudget>,
    /// The spec this rule was built from, kept for export and diffs.
    pub spec: RuleSpec,
}

impl TryFrom<RuleSpec> for Rule {
    type Error = ValidationErrors;

    fn try_from(spec: RuleSpec) -> Result<Self, Self::Error> {
        let mut problems = Problems::default();
        check_identifier(&spec.name, "name", 64, &mut problems);
        let id = spec.id.clone().unwrap_or_else(|| spec.name.clone());
        if spec.id.is_some() {
            check_identifier(&id, "id", 128, &mut problems);
        }
        // Lengths count characters, as the schema's `maxLength` does.
        if spec.description.chars().count() > 1_024 {
            problems.add("description", "must be at most 1024 characters");
        }
        if !(400..=599).contains(&spec.response.status) {
            problems.add(
                "response.status",
                "must be an HTTP error status from 400 to 599",
            );
        }
        let matcher = RequestMatcher::build(&spec.matcher, &mut problems);
        let key = ClientKey::build(&spec.key, "key", false, &mut problems);
        let limits = if crate::rls::descriptor::answers_without_limits(&spec) {
            Vec::new()
        } else {
            Limit::build_all(&id, &spec.limits, "limits", &mut problems)
        };
        let cost = Cost::build(&spec.cost, &mut problems);
        let overrides = build_overrides(&id, &spec.overrides, &mut problems);
        let descriptor = crate::rls::descriptor::for_rule(&spec, &mut problems);
        let has_token_limits = limits
            .iter()
            .chain(overrides.values().flatten())
            .any(|l| l.counts.is_tokens());
        let tokens = TokenBudget::build(spec.tokens.as_ref(), has_token_limits, &mut problems);
        let (Some(key), Some(cost)) = (key, cost) else {
            // Building either one failed, and that recorded why.
            return Err(problems.into_errors());
        };
        problems.finish(|| Rule {
            id,
            name: spec.name.clone(),
            enabled: spec.enabled,
            priority: spec.priority,
            mode: spec.mode,
            matcher,
            key,
            limits,
            cost,
            overrides,
            failure_mode: spec.failure_mode,
            status: spec.response.status,
            rate_limit_headers: spec.response.rate_limit_headers,
            grpc_status: spec.response.grpc_status,
            descriptor,
            tokens,
            spec,
        })
    }
}

fn build_overrides(
    rule_id: &str,
    specs: &[OverrideSpec],
    problems: &mut Problems,
) -> HashMap<String, Vec<Limit>> {
    if specs.len() > MAX_OVERRIDES {
        problems.add(
            "overrides",
            format!("at most {MAX_OVERRIDES} overrides are allowed"),
        );
    }
    let mut overrides = HashMap::with_capacity(specs.len());
    for (i, o) in specs.iter().enumerate() {
        let field = format!("overrides[{i}]");
        if o.client.is_empty() || o.client.chars().count() > 1_024 {
            problems.add(format!("{field}.client"), "must be 1 to 1024 characters");
        }
        let limits = Limit::build_all(rule_id, &o.limits, &format!("{field}.limits"), problems);
        if overrides.insert(o.client.clone(), limits).is_some() {
            problems.add(
                format!("{field}.client"),
                format!("`{}` already has an override", o.client),
            );
        }
    }
    overrides
}

/// Names and ids appear in response headers as structured-field strings and in URLs, so
/// they are restricted to a safe alphabet.
fn check_identifier(value: &str, field: &str, max_len: usize, problems: &mut Problems) {
    let valid_start = value
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_alphanumeric());
    let valid_chars = value
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    if !valid_start || !valid_chars || value.len() > max_len {
        problems.add(
            field,
            format!(
                "must be 1 to {max_len} characters of letters, digits, '-', '_' or '.', starting with a letter or digit"
            ),
        );
    }
}

impl Rule {
    /// Adds what this rule reads from a request to `needs`.
    pub(crate) fn add_needs(&self, needs: &mut RequestNeeds) {
        self.matcher.add_needs(needs);
        self.key.add_needs(needs);
        self.cost.add_needs(needs);
    }

    /// Whether any of the rule's limits (its own or an override's) counts tokens.
    pub fn has_token_limits(&self) -> bool {
        self.tokens.is_some()
    }

    /// The limits that apply to `client`: its override, or the rule's own.
    pub fn limits_for(&self, client: &str) -> &[Limit] {
        self.overrides.get(client).unwrap_or(&self.limits)
    }

    /// The failure mode in force, given the proxy's default.
    pub fn failure_mode_or(&self, default: FailureMode) -> FailureMode {
        self.failure_mode.unwrap_or(default)
    }
}

#[cfg(test)]
pub(crate) mod test_support {
    use super::*;

    pub(crate) fn rule(json: &str) -> Rule {
        let spec: RuleSpec = serde_json::from_str(json).unwrap();
        Rule::try_from(spec).unwrap()
    }

    pub(crate) fn errors(json: &str) -> Vec<String> {
        let spec: RuleSpec = serde_json::from_str(json).unwrap();
        Rule::try_from(spec)
            .unwrap_err()
            .0
            .into_iter()
            .map(|e| format!("{}: {}", e.field, e.message))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::{errors, rule};
    use super::*;
    use crate::request::HttpRequest;

    const EXAMPLE: &str = r#"{"name":"api-per-key","match":{"path_prefix":"/api/"},"key":{"header":"x-api-key"},"limits":[{"requests":5,"period":"second","burst":10},{"requests":100,"period":"minute"}],"mode":"enforce"}"#;

    #[test]
    fn the_documented_example_is_valid() {
        let r = rule(EXAMPLE);
        assert_eq!(r.id, "api-per-key");
        assert_eq!(r.limits.len(), 2);
        assert_eq!(
            (
                r.limits[0].requests,
                r.limits[0].period_seconds,
                r.limits[0].burst
            ),
            (5, 1, 10)
        );
        assert_eq!(
            (
                r.limits[1].requests,
                r.limits[1].period_seconds,
                r.limits[1].burst
            ),
            (100, 60, 100)
        );
        assert_eq!(r.key, ClientKey::Header("x-api-key".into()));
        assert!(r.matcher.matches(&HttpRequest::get("/api/x")));
        assert!(!r.matcher.matches(&HttpRequest::get("/other")));
    }

    #[test]
    fn every_problem_is_reported_with_its_field() {
        let errs = errors(
            r#"{"name":"bad name!","key":{"header":""},"limits":[{"requests":0,"period":0},{"requests":1,"period":"second","burst":0}],
                "match":{"path_regex":"(unclosed","path_prefix":"api"},"response":{"status":200}}"#,
        );
        let fields: Vec<&str> = errs.iter().map(|e| e.split(':').next().unwrap()).collect();
        assert_eq!(
            fields,
            [
                "name",
                "response.status",
                "match.path_prefix",
                "match.path_regex",
                "key.header",
                "limits[0].requests",
                "limits[0].period",
                "limits[1].burst"
            ],
            "{errs:#?}"
        );
    }

    #[test]
    fn unknown_fields_and_periods_are_rejected_by_the_shape() {
        assert!(
            serde_json::from_str::<RuleSpec>(
                r#"{"name":"a","key":"global","limits":[],"colour":1}"#
            )
            .is_err()
        );
        assert!(
            serde_json::from_str::<RuleSpec>(
                r#"{"name":"a","key":"global","limits":[{"requests":1,"period":"fortnight"}]}"#
            )
            .is_err()
        );
    }

    #[test]
    fn overrides_replace_the_limits_for_one_client() {
        let r = rule(
            r#"{"name":"o","key":{"header":"x-api-key"},"limits":[{"requests":10,"period":1}],
                "overrides":[{"client":"acme","limits":[{"requests":500,"period":"second"}]}]}"#,
        );
        assert_eq!(r.limits_for("acme")[0].requests, 500);
        assert_eq!(r.limits_for("other")[0].requests, 10);
    }
}
