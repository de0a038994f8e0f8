//! Which rule decides each descriptor of a request, and which buckets it charges.

use std::collections::HashMap;

use super::request::RlsRequest;
use crate::hash::{client_fingerprint, global_bucket};
use crate::rule::{Limit, Rule};
use crate::spec::{FailureMode, Mode};

use super::descriptor::DescriptorMatch;

/// The enabled rules with a `descriptor` section, by domain, compiled once per ruleset
/// version.
#[derive(Debug, Clone, Default)]
pub struct RlsRules {
    by_domain: HashMap<String, Vec<RlsRule>>,
}

#[derive(Debug, Clone)]
struct RlsRule {
    id: String,
    name: String,
    priority: i32,
    mode: Mode,
    failure_mode: Option<FailureMode>,
    descriptor: DescriptorMatch,
    limits: Vec<Limit>,
    overrides: HashMap<String, Vec<Limit>>,
}

/// What a request's descriptors are decided by, one [`Planned`] per descriptor in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub descriptors: Vec<Planned>,
}

/// One descriptor: the rule that decides it (none: it is not limited), and its cost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planned {
    pub rule: Option<Matched>,
    pub cost: u64,
}

/// The rule a descriptor matched, the client its values name, and that client's buckets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Matched {
    pub rule_id: String,
    pub rule_name: String,
    pub shadow: bool,
    pub failure_mode: Option<FailureMode>,
    pub client: String,
    /// One per limit (the client's override, or the rule's own), in the rule's order.
    pub charges: Vec<Charge>,
}

/// One bucket to charge: its id in the coordinator's store and its limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Charge {
    pub bucket: u64,
    pub limit: Limit,
}

impl RlsRules {
    /// The RLS rules among `rules` (disabled ones and HTTP rules left out).
    pub fn from_rules<'r>(rules: impl IntoIterator<Item = &'r Rule>) -> Self {
        let mut by_domain: HashMap<String, Vec<RlsRule>> = HashMap::new();
        for rule in rules.into_iter().filter(|r| r.enabled) {
            let Some(descriptor) = &rule.descriptor else {
                continue;
            };
            by_domain
                .entry(descriptor.domain.clone())
                .or_default()
                .push(RlsRule {
                    id: rule.id.clone(),
                    name: rule.name.clone(),
                    priority: rule.priority,
                    mode: rule.mode,
                    failure_mode: rule.failure_mode,
                    descriptor: descriptor.clone(),
                    limits: rule.limits.clone(),
                    overrides: rule.overrides.clone(),
                });
        }
        for rules in by_domain.values_mut() {
            // Most specific first, then higher priority, then by name: the first rule that
            // matches a descriptor decides it.
            rules.sort_by(|a, b| {
                b.descriptor
                    .specificity()
                    .cmp(&a.descriptor.specificity())
                    .then_with(|| b.priority.cmp(&a.priority))
                    .then_with(|| a.name.cmp(&b.name))
            });
        }
        RlsRules { by_domain }
    }

    /// How many RLS rules there are.
    pub fn len(&self) -> usize {
        self.by_domain.values().map(Vec::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.by_domain.is_empty()
    }

    /// The rule, client and buckets of each of `request`'s descriptors. Call
    /// [`RlsRequest::check`] first: the plan assumes its bounds.
    pub fn plan(&self, request: &RlsRequest) -> Plan {
        let rules = self
            .by_domain
            .get(&request.domain)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let descriptors = request
            .descriptors
            .iter()
            .map(|d| Planned {
                cost: d.cost(request.hits_addend),
                rule: rules
                    .iter()
                    .find(|r| r.descriptor.matches(&d.entries))
                    .map(|r| r.matched(&d.entries)),
            })
            .collect();
        Plan { descriptors }
    }
}

impl RlsRule {
    fn matched(&self, entries: &[(String, String)]) -> Matched {
        let client = self.descriptor.client(entries);
        let fingerprint = client_fingerprint(&self.id, &client);
        let limits = self.overrides.get(&client).unwrap_or(&self.limits);
        Matched {
            rule_id: self.id.clone(),
            rule_name: self.name.clone(),
            shadow: self.mode == Mode::Shadow,
            failure_mode: self.failure_mode,
            charges: limits
                .iter()
                .map(|limit| Charge {
                    bucket: global_bucket(limit.identity, fingerprint),
                    limit: *limit,
                })
                .collect(),
            client,
        }
    }
}

impl Plan {
    /// Every bucket the plan charges, each once, in the order first named.
    pub fn buckets(&self) -> Vec<u64> {
        let mut seen = Vec::new();
        for charge in self.charges() {
            if !seen.contains(&charge.bucket) {
                seen.push(charge.bucket);
            }
        }
        seen
    }

    fn charges(&self) -> impl Iterator<Item = &Charge> {
        self.descriptors
            .iter()
            .filter_map(|d| d.rule.as_ref())
            .flat_map(|m| &m.charges)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::rls::request::RlsDescriptor;
    use crate::ruleset::Ruleset;
    use crate::spec::RuleSpec;

    pub(crate) fn rules(json: &[&str]) -> RlsRules {
        let specs: Vec<RuleSpec> = json
            .iter()
            .map(|j| serde_json::from_str(j).unwrap())
            .collect();
        let ruleset = Ruleset::from_specs(specs).unwrap();
        RlsRules::from_rules(ruleset.rules())
    }

    pub(crate) fn request(domain: &str, descriptors: &[&[(&str, &str)]]) -> RlsRequest {
        RlsRequest {
            domain: domain.into(),
            descriptors: descriptors
                .iter()
                .map(|entries| RlsDescriptor {
                    entries: entries
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                    hits_addend: None,
                })
                .collect(),
            hits_addend: 0,
        }
    }

    fn decided_by(plan: &Plan) -> Vec<Option<(String, String)>> {
        plan.descriptors
            .iter()
            .map(|d| {
                d.rule
                    .as_ref()
                    .map(|m| (m.rule_name.clone(), m.client.clone()))
            })
            .collect()
    }

    const PER_ADDRESS: &str = r#"{"name":"per-address","key":"global","limits":[{"requests":10,"period":"second"}],"descriptor":{"domain":"edge","entries":[{"key":"remote_address"}]},"overrides":[{"client":"10.0.0.1","limits":[{"requests":1,"period":"minute"}]}]}"#;
    const ONE_ADDRESS: &str = r#"{"name":"one-address","key":"global","limits":[{"requests":5,"period":"second"}],"descriptor":{"domain":"edge","entries":[{"key":"remote_address","value":"10.0.0.9"}]}}"#;
    const LOGIN: &str = r#"{"name":"login","key":"global","priority":-5,"limits":[{"requests":1,"period":"second"},{"requests":20,"period":"hour"}],"descriptor":{"domain":"edge","entries":[{"key":"path","value":"/login"},{"key":"remote_address"}]}}"#;
    const HTTP: &str =
        r#"{"name":"http","key":"global","limits":[{"requests":1,"period":"second"}]}"#;

    #[test]
    fn the_most_specific_rule_decides_and_open_values_are_the_client() {
        let rules = rules(&[PER_ADDRESS, ONE_ADDRESS, LOGIN, HTTP]);
        assert_eq!(rules.len(), 3, "the HTTP rule is not an RLS rule");
        let plan = rules.plan(&request(
            "edge",
            &[
                &[("remote_address", "10.0.0.2")],
                &[("remote_address", "10.0.0.9")],
                &[("path", "/login"), ("remote_address", "10.0.0.2")],
                &[("path", "/other"), ("remote_address", "10.0.0.2")],
                &[("unknown", "x")],
            ],
        ));
        let some = |r: &str, c: &str| Some((r.to_string(), c.to_string()));
        assert_eq!(
            decided_by(&plan),
            [
                some("per-address", "10.0.0.2"),
                some("one-address", ""),
                some("login", "10.0.0.2"),
                None,
                None
            ]
        );
        let login = plan.descriptors[2].rule.as_ref().unwrap();
        assert_eq!(login.charges.len(), 2, "several limits per descriptor");
        assert!(
            rules
                .plan(&request("other", &[&[("remote_address", "1")]]))
                .descriptors[0]
                .rule
                .is_none()
        );
    }

    #[test]
    fn an_override_names_the_clients_limits_and_buckets_are_per_client() {
        let rules = rules(&[PER_ADDRESS]);
        let plan = rules.plan(&request(
            "edge",
            &[
                &[("remote_address", "10.0.0.1")],
                &[("remote_address", "10.0.0.2")],
                &[("remote_address", "10.0.0.2")],
            ],
        ));
        let charges: Vec<&Charge> = plan
            .descriptors
            .iter()
            .map(|d| &d.rule.as_ref().unwrap().charges[0])
            .collect();
        assert_eq!(charges[0].limit.requests, 1);
        assert_eq!(charges[0].limit.period_seconds, 60);
        assert_eq!(charges[1].limit.requests, 10);
        assert_ne!(charges[0].bucket, charges[1].bucket);
        assert_eq!(charges[1].bucket, charges[2].bucket);
        assert_eq!(plan.buckets().len(), 2);
    }

    #[test]
    fn a_descriptor_rule_refuses_an_http_match_a_key_and_a_cost() {
        let spec: RuleSpec = serde_json::from_str(
            r#"{"name":"x","match":{"path_prefix":"/"},"key":{"header":"a"},"cost":{"fixed":2},"limits":[{"requests":1,"period":1}],"descriptor":{"domain":"d","entries":[{"key":"k"}]}}"#,
        )
        .unwrap();
        let errors = Rule::try_from(spec).unwrap_err();
        let fields: Vec<&str> = errors.0.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, ["match", "key", "cost"]);
    }
}
