//! Which rule decides each descriptor of a request, and which buckets it charges.
//!
//! A descriptor is decided as envoyproxy/ratelimit decides it, walking its entries in
//! order: at each level the rules still in play are narrowed to those whose entry there
//! has the request's key and matches its value, preferring a fixed `value`, then a
//! `value_prefix` (the longest), then a key alone; the choice at one level is kept for
//! the levels below, so a request that enters a value's subtree never falls back to a
//! less specific sibling. The rules left whose entries are exactly as many as the
//! request's decide it (several: the higher priority, then the name); none is "no limit".
//! Then `replaces`: a descriptor decided by a rule that another descriptor's rule of the
//! same request replaces is not limited.

use std::collections::{HashMap, HashSet};

use super::request::RlsRequest;
use super::spec::Answer;
use crate::hash::{client_fingerprint, global_bucket};
use crate::rule::{Limit, Rule};
use crate::spec::{FailureMode, Mode};

use super::descriptor::{DescriptorMatch, ValueMatch};

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
    /// Limits (charges below), or a fixed answer without buckets.
    pub answer: Answer,
    pub client: String,
    /// One per limit (the client's override, or the rule's own), in the rule's order;
    /// none for a fixed answer.
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
            // Among rules with the same entries, the higher priority, then by name.
            rules.sort_by(|a, b| {
                b.priority
                    .cmp(&a.priority)
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
        let mut descriptors: Vec<Planned> = request
            .descriptors
            .iter()
            .map(|d| Planned {
                cost: d.cost(request.hits_addend),
                rule: decider(rules, &d.entries).map(|r| r.matched(&d.entries)),
            })
            .collect();
        let replaced: HashSet<&str> = descriptors
            .iter()
            .filter_map(|d| d.rule.as_ref())
            .filter_map(|m| rules.iter().find(|r| r.id == m.rule_id))
            .flat_map(|r| r.descriptor.replaces.iter().map(String::as_str))
            .collect();
        if !replaced.is_empty() {
            for d in &mut descriptors {
                if d.rule
                    .as_ref()
                    .is_some_and(|m| replaced.contains(m.rule_name.as_str()))
                {
                    d.rule = None;
                }
            }
        }
        Plan { descriptors }
    }
}

/// How well an entry of a rule matches a request's value: the walk keeps the best.
fn preference(matcher: &ValueMatch, value: &str) -> Option<(u8, usize)> {
    match matcher {
        ValueMatch::Exact(v) => (v == value).then_some((2, 0)),
        ValueMatch::Prefix(p) => value.starts_with(p.as_str()).then_some((1, p.len())),
        ValueMatch::Any => Some((0, 0)),
    }
}

/// The rule that decides a descriptor with `entries` (see the module's description).
fn decider<'r>(rules: &'r [RlsRule], entries: &[(String, String)]) -> Option<&'r RlsRule> {
    let mut in_play: Vec<&RlsRule> = rules.iter().collect();
    for (level, (key, value)) in entries.iter().enumerate() {
        let fits = |r: &RlsRule| {
            r.descriptor
                .entries
                .get(level)
                .filter(|(k, _)| k == key)
                .and_then(|(_, m)| preference(m, value).map(|p| (p, m.clone())))
        };
        let best = in_play
            .iter()
            .filter_map(|r| fits(r))
            .max_by_key(|(p, _)| *p)?;
        in_play.retain(|r| {
            r.descriptor
                .entries
                .get(level)
                .is_some_and(|(k, m)| k == key && *m == best.1)
        });
    }
    in_play
        .into_iter()
        .find(|r| r.descriptor.entries.len() == entries.len())
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
            answer: self.descriptor.answer,
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

    /// envoyproxy/ratelimit's README examples 4, 7 and 9, and its tree walk.
    const NESTED: &str = r#"{"name":"nested","key":"global","limits":[{"requests":3,"period":"second"}],"descriptor":{"domain":"w","entries":[{"key":"k","value":"v"},{"key":"sub"}]}}"#;
    const TOP: &str = r#"{"name":"top","key":"global","limits":[{"requests":9,"period":"second"}],"descriptor":{"domain":"w","entries":[{"key":"k"},{"key":"sub"}]}}"#;
    const WILD: &str = r#"{"name":"wild","key":"global","limits":[{"requests":20,"period":"minute"}],"descriptor":{"domain":"w","entries":[{"key":"path","value_prefix":"/api/"}]}}"#;
    const WILDER: &str = r#"{"name":"wilder","key":"global","limits":[{"requests":2,"period":"minute"}],"descriptor":{"domain":"w","entries":[{"key":"path","value_prefix":"/api/admin"}]}}"#;
    const ANY_PATH: &str = r#"{"name":"any-path","key":"global","limits":[{"requests":100,"period":"minute"}],"descriptor":{"domain":"w","entries":[{"key":"path"}]}}"#;
    const EXACT_PATH: &str = r#"{"name":"exact-path","key":"global","limits":[],"descriptor":{"answer":"deny","domain":"w","entries":[{"key":"path","value":"/api/banned"}]}}"#;
    const SPECIFIC: &str = r#"{"name":"specific_limit","key":"global","limits":[{"requests":5,"period":"second"}],"descriptor":{"domain":"w","entries":[{"key":"key_1","value":"value_1"},{"key":"user","value":"bkthomps"}]}}"#;
    const REPLACING: &str = r#"{"name":"replacing","key":"global","limits":[{"requests":10,"period":"second"}],"descriptor":{"domain":"w","replaces":["specific_limit"],"entries":[{"key":"key_2","value":"value_2"},{"key":"user","value":"bkthomps"}]}}"#;

    #[test]
    fn the_walk_keeps_the_value_it_chose_at_each_level() {
        let rules = rules(&[NESTED, TOP]);
        let plan = rules.plan(&request(
            "w",
            &[
                &[("k", "v"), ("sub", "x")],
                &[("k", "other"), ("sub", "x")],
                &[("k", "v"), ("other", "x")],
                &[("k", "v")],
            ],
        ));
        let some = |r: &str, c: &str| Some((r.to_string(), c.to_string()));
        assert_eq!(
            decided_by(&plan),
            [
                some("nested", "x"),
                some("top", "other|x"),
                // Inside (k, v)'s subtree ratelimit never falls back to (k): no limit.
                None,
                // Fewer entries than any rule: no limit.
                None,
            ]
        );
    }

    #[test]
    fn a_value_beats_the_longest_prefix_which_beats_a_key_alone() {
        let rules = rules(&[WILD, WILDER, ANY_PATH, EXACT_PATH]);
        let plan = rules.plan(&request(
            "w",
            &[
                &[("path", "/api/banned")],
                &[("path", "/api/admin/users")],
                &[("path", "/api/items")],
                &[("path", "/api/items")],
                &[("path", "/static")],
            ],
        ));
        let some = |r: &str, c: &str| Some((r.to_string(), c.to_string()));
        assert_eq!(
            decided_by(&plan),
            [
                some("exact-path", ""),
                some("wilder", "/api/admin/users"),
                some("wild", "/api/items"),
                some("wild", "/api/items"),
                some("any-path", "/static"),
            ]
        );
        assert_eq!(
            plan.descriptors[2].rule.as_ref().unwrap().charges[0].bucket,
            plan.descriptors[3].rule.as_ref().unwrap().charges[0].bucket,
            "one value, one bucket"
        );
        assert!(
            plan.descriptors[0]
                .rule
                .as_ref()
                .unwrap()
                .charges
                .is_empty()
        );
    }

    #[test]
    fn a_replaced_rule_limits_nothing_where_its_replacement_matched() {
        let rules = rules(&[SPECIFIC, REPLACING]);
        let both = rules.plan(&request(
            "w",
            &[
                &[("key_1", "value_1"), ("user", "bkthomps")],
                &[("key_2", "value_2"), ("user", "bkthomps")],
            ],
        ));
        let some = |r: &str, c: &str| Some((r.to_string(), c.to_string()));
        assert_eq!(decided_by(&both), [None, some("replacing", "")]);
        let alone = rules.plan(&request(
            "w",
            &[&[("key_1", "value_1"), ("user", "bkthomps")]],
        ));
        assert_eq!(decided_by(&alone), [some("specific_limit", "")]);
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

    #[test]
    fn a_fixed_answer_has_no_limits_and_a_limited_rule_needs_one() {
        let fields = |json: &str| -> Vec<String> {
            let spec: RuleSpec = serde_json::from_str(json).unwrap();
            Rule::try_from(spec).map_or_else(
                |errors| errors.0.into_iter().map(|e| e.field).collect(),
                |_| Vec::new(),
            )
        };
        let deny_with_limits = r#"{"name":"x","key":"global","limits":[{"requests":1,"period":1}],"descriptor":{"domain":"d","answer":"deny","entries":[{"key":"k"}]}}"#;
        assert_eq!(fields(deny_with_limits), ["limits"]);
        let unlimited = r#"{"name":"x","key":"global","limits":[],"descriptor":{"domain":"d","answer":"unlimited","entries":[{"key":"k"}]}}"#;
        assert!(fields(unlimited).is_empty());
        let limited_without = r#"{"name":"x","key":"global","limits":[],"descriptor":{"domain":"d","entries":[{"key":"k"}]}}"#;
        assert_eq!(fields(limited_without), ["limits"]);
    }
}
