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
mod delay;
mod elastic;
mod in_flight;
mod key;
mod limit;
mod matcher;
mod soft;
mod tokens;

use std::collections::HashMap;

pub use crate::gcra::capped_burst;
pub use cost::{Cost, MAX_COST};
pub use delay::{
    DEFAULT_QUEUE_PER_KEY, DEFAULT_QUEUE_PER_WORKER, DelayPolicy, MAX_DELAY_MS,
    MAX_QUEUE_PER_WORKER, NO_GLOBAL_DELAY,
};
pub use elastic::{ELASTIC_LIMITS_ONLY_PROXY_REQUESTS, ElasticPool};
pub use in_flight::{InFlightLimit, MAX_CONCURRENT, NO_GLOBAL_IN_FLIGHT};
pub use key::{COMPOSITE_SEPARATOR, ClientKey};
pub use limit::{Counts, Limit, MAX_LIMITS_PER_RULE, MAX_PERIOD_SECONDS, MAX_REQUESTS};
pub use matcher::RequestMatcher;
pub use soft::{MAX_SOFT_PERCENT, SoftMargin};
pub use tokens::{MAX_ESTIMATE, TokenBudget};

use crate::request::RequestNeeds;
use crate::spec::{FailureMode, GrpcStatus, KeyMissingSpec, Mode, OverrideSpec, RuleSpec};
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
    /// The client key of a matching request that carries none; `None` skips the rule.
    pub key_fallback: Option<String>,
    /// The share of clients, in percent, an enforce-mode rule is enforced for.
    pub enforce_percent: u8,
    pub limits: Vec<Limit>,
    pub cost: Cost,
    pub overrides: HashMap<String, Vec<Limit>>,
    /// The rule's in-flight limit (`{concurrent: N}` among its limits), if any.
    pub in_flight: Option<InFlightLimit>,
    /// The in-flight limits of overrides that have one (an override without one has none:
    /// its limits replace all of the rule's).
    pub in_flight_overrides: HashMap<String, InFlightLimit>,
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
    /// Set (`on_limit: delay`): an over-limit request waits for its tokens, within these
    /// bounds, instead of being refused.
    pub delay: Option<DelayPolicy>,
    /// Set (`elastic`): a client over its own limit still passes while this pool, the
    /// rule's admitted traffic in this Envoy, has room.
    pub elastic: Option<ElasticPool>,
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
        let key_fallback = match &spec.key_missing {
            KeyMissingSpec::Skip => None,
            KeyMissingSpec::Fallback(client) => {
                if client.is_empty() || client.chars().count() > 1_024 {
                    problems.add("key_missing.fallback", "must be 1 to 1024 characters");
                }
                Some(client.clone())
            }
        };
        if spec.enforce_percent > 100 {
            problems.add("enforce_percent", "must be from 0 to 100");
        }
        let limits = if crate::rls::descriptor::answers_without_limits(&spec) {
            Vec::new()
        } else {
            Limit::build_all(&id, &spec.limits, "limits", &mut problems)
        };
        let cost = Cost::build(&spec.cost, &mut problems);
        let overrides = build_overrides(&id, &spec.overrides, &mut problems);
        let in_flight = InFlightLimit::build_from(&spec.limits, "limits", &mut problems);
        let in_flight_overrides = in_flight_overrides(&spec.overrides, &mut problems);
        if spec.descriptor.is_some() && (in_flight.is_some() || !in_flight_overrides.is_empty()) {
            problems.add(
                "limits",
                "a rule with a `descriptor` cannot limit requests in flight (`concurrent`): \
                 Envoy's rate limit service is never told when a request ends",
            );
        }
        let descriptor = crate::rls::descriptor::for_rule(&spec, &mut problems);
        let has_soft_limits = limits
            .iter()
            .chain(overrides.values().flatten())
            .any(|l| l.soft.is_some());
        if spec.descriptor.is_some() && has_soft_limits {
            problems.add(
                "limits",
                "a rule with a `descriptor` has no soft limits (`soft_percent`): Envoy's rate \
                 limit service answers OK or OVER_LIMIT, with no warning between them",
            );
        }
        if spec.descriptor.is_some() && spec.mode == Mode::Warn {
            problems.add(
                "mode",
                "a rule with a `descriptor` cannot be in `warn` mode: Envoy's rate limit \
                 service answers OK or OVER_LIMIT, with no warning between them (use \
                 `shadow` to count without refusing)",
            );
        }
        let has_token_limits = limits
            .iter()
            .chain(overrides.values().flatten())
            .any(|l| l.counts.is_tokens());
        let tokens = TokenBudget::build(spec.tokens.as_ref(), has_token_limits, &mut problems);
        let all_limits = limits.iter().chain(overrides.values().flatten());
        let delay = DelayPolicy::build(&spec, &id, all_limits, &mut problems);
        let all_limits = limits.iter().chain(overrides.values().flatten());
        let elastic = ElasticPool::build(&spec, &id, all_limits, &mut problems);
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
            key_fallback,
            enforce_percent: spec.enforce_percent,
            limits,
            cost,
            overrides,
            in_flight,
            in_flight_overrides,
            failure_mode: spec.failure_mode,
            status: spec.response.status,
            rate_limit_headers: spec.response.rate_limit_headers,
            grpc_status: spec.response.grpc_status,
            descriptor,
            tokens,
            delay,
            elastic,
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

/// The in-flight limits of the overrides that have one.
fn in_flight_overrides(
    specs: &[OverrideSpec],
    problems: &mut Problems,
) -> HashMap<String, InFlightLimit> {
    specs
        .iter()
        .enumerate()
        .filter_map(|(i, o)| {
            let field = format!("overrides[{i}].limits");
            InFlightLimit::build_from(&o.limits, &field, problems).map(|l| (o.client.clone(), l))
        })
        .collect()
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

    /// The mode this rule has for `client`: an enforce-mode rule rolled out to fewer than
    /// 100% of clients is in shadow mode for the others (see
    /// [`crate::hash::rollout_point`]).
    pub fn mode_for(&self, client: &str) -> Mode {
        if self.mode == Mode::Enforce && self.enforce_percent < 100 {
            let point = crate::hash::rollout_point(&self.id, client);
            if point >= u32::from(self.enforce_percent) * 100 {
                return Mode::Shadow;
            }
        }
        self.mode
    }

    /// The in-flight limit that applies to `client`: its override's, or the rule's own.
    pub fn in_flight_for(&self, client: &str) -> Option<InFlightLimit> {
        if self.overrides.contains_key(client) {
            self.in_flight_overrides.get(client).copied()
        } else {
            self.in_flight
        }
    }

    /// Whether the rule or one of its overrides limits requests in flight.
    pub fn has_in_flight_limits(&self) -> bool {
        self.in_flight.is_some() || !self.in_flight_overrides.is_empty()
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
    fn a_rollout_enforces_its_share_of_clients_and_each_always_on_the_same_side() {
        let at = |percent: u8| {
            rule(&format!(
                r#"{{"name":"r","key":{{"header":"k"}},"limits":[{{"requests":1,"period":1}}],"enforce_percent":{percent}}}"#
            ))
        };
        let clients: Vec<String> = (0..10_000).map(|i| format!("client-{i}")).collect();
        let enforced = |r: &Rule| {
            clients
                .iter()
                .filter(|c| r.mode_for(c) == Mode::Enforce)
                .count()
        };
        for percent in [0u8, 1, 10, 25, 50, 90, 99, 100] {
            let share = enforced(&at(percent)) as f64 / 100.0;
            assert!(
                (share - f64::from(percent)).abs() <= 1.0,
                "{percent}%: {share}% enforced"
            );
        }
        assert_eq!(enforced(&at(0)), 0);
        assert_eq!(enforced(&at(100)), clients.len());
        // Raising the percentage only adds clients; the same key is always on one side.
        let (ten, twenty) = (at(10), at(20));
        for c in &clients {
            assert_eq!(ten.mode_for(c), ten.mode_for(c));
            if ten.mode_for(c) == Mode::Enforce {
                assert_eq!(twenty.mode_for(c), Mode::Enforce, "{c}");
            }
        }
        // A shadow-mode rule stays in shadow mode whatever its percentage.
        let shadow = rule(
            r#"{"name":"s","mode":"shadow","key":{"header":"k"},"limits":[{"requests":1,"period":1}],"enforce_percent":100}"#,
        );
        assert_eq!(shadow.mode_for("client-1"), Mode::Shadow);
        assert_eq!(
            errors(
                r#"{"name":"r","key":{"header":"k"},"limits":[{"requests":1,"period":1}],"enforce_percent":101}"#
            ),
            ["enforce_percent: must be from 0 to 100"]
        );
        assert_eq!(
            errors(
                r#"{"name":"r","key":{"header":"k"},"limits":[{"requests":1,"period":1}],"key_missing":{"fallback":""}}"#
            ),
            ["key_missing.fallback: must be 1 to 1024 characters"]
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
