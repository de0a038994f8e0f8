//! A rule's `descriptor` section: which RLS descriptors the rule decides.

use super::spec::{Answer, DescriptorSpec};
use super::{MAX_DOMAIN_LEN, MAX_ENTRIES, MAX_KEY_LEN, MAX_VALUE_LEN};
use crate::rule::COMPOSITE_SEPARATOR;
use crate::spec::{CostSpec, KeySpec, MatchSpec, RuleSpec};
use crate::validation::Problems;

/// The `descriptor` section of `spec`, validated, with what a descriptor rule cannot have:
/// an HTTP `match` (it applies to RLS requests only), a `key` other than `global` (its
/// clients are its descriptors' values) or a `cost` other than 1 (Envoy's `hits_addend`
/// is the cost).
pub(crate) fn for_rule(spec: &RuleSpec, problems: &mut Problems) -> Option<DescriptorMatch> {
    let descriptor = spec.descriptor.as_ref()?;
    if spec.matcher != MatchSpec::default() {
        problems.add(
            "match",
            "a rule with a `descriptor` decides Envoy's rate limit service requests only: leave `match` out",
        );
    }
    if spec.key != KeySpec::Global {
        problems.add(
            "key",
            "a rule with a `descriptor` keys on its descriptors' values: write `key: global`",
        );
    }
    if spec.cost != CostSpec::Fixed(1) {
        problems.add(
            "cost",
            "a rule with a `descriptor` costs the request's `hits_addend`: leave `cost` out",
        );
    }
    if !descriptor.answer.is_limit() && (!spec.limits.is_empty() || !spec.overrides.is_empty()) {
        problems.add(
            "limits",
            "a rule whose `descriptor.answer` is `unlimited` or `deny` has no buckets: leave `limits` and `overrides` out",
        );
    }
    DescriptorMatch::build(descriptor, "descriptor", problems)
}

/// Whether `spec` is a descriptor rule that answers without limits (`unlimited`, `deny`),
/// so that an empty `limits` is what it must have.
pub(crate) fn answers_without_limits(spec: &RuleSpec) -> bool {
    spec.descriptor
        .as_ref()
        .is_some_and(|d| !d.answer.is_limit())
}

/// A validated [`DescriptorSpec`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescriptorMatch {
    pub domain: String,
    pub entries: Vec<(String, ValueMatch)>,
    pub answer: Answer,
    pub replaces: Vec<String>,
}

/// Which values an entry of a rule matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ValueMatch {
    /// Any value; it is (part of) the client key.
    Any,
    /// This value only.
    Exact(String),
    /// Values starting with this; the value is (part of) the client key, so each value
    /// has its own buckets, as in envoyproxy/ratelimit.
    Prefix(String),
}

impl ValueMatch {
    /// Whether the request's `value` is one this entry matches.
    pub fn admits(&self, value: &str) -> bool {
        match self {
            ValueMatch::Any => true,
            ValueMatch::Exact(v) => v == value,
            ValueMatch::Prefix(p) => value.starts_with(p.as_str()),
        }
    }
}

/// Whether `s` is 1 to `max` characters.
fn length_ok(s: &str, max: usize) -> bool {
    !s.is_empty() && s.chars().count() <= max
}

/// Most rule names in `replaces`.
pub const MAX_REPLACES: usize = 16;

impl DescriptorMatch {
    /// Checks `spec`, reporting problems under `field` (`descriptor`).
    pub(crate) fn build(spec: &DescriptorSpec, field: &str, outer: &mut Problems) -> Option<Self> {
        let mut problems = Problems::default();
        if !length_ok(&spec.domain, MAX_DOMAIN_LEN) {
            problems.add(
                format!("{field}.domain"),
                format!("must be 1 to {MAX_DOMAIN_LEN} characters"),
            );
        }
        if spec.entries.is_empty() || spec.entries.len() > MAX_ENTRIES {
            problems.add(
                format!("{field}.entries"),
                format!("must have 1 to {MAX_ENTRIES} entries"),
            );
        }
        for (i, entry) in spec.entries.iter().enumerate().take(MAX_ENTRIES) {
            if !length_ok(&entry.key, MAX_KEY_LEN) {
                problems.add(
                    format!("{field}.entries[{i}].key"),
                    format!("must be 1 to {MAX_KEY_LEN} characters"),
                );
            }
            if entry
                .value
                .as_deref()
                .is_some_and(|v| !length_ok(v, MAX_VALUE_LEN))
            {
                problems.add(
                    format!("{field}.entries[{i}].value"),
                    format!("must be 1 to {MAX_VALUE_LEN} characters"),
                );
            }
            // An empty prefix is ratelimit's `value: "*"`: any value, preferred over a
            // key alone.
            if entry
                .value_prefix
                .as_deref()
                .is_some_and(|v| v.chars().count() > MAX_VALUE_LEN)
            {
                problems.add(
                    format!("{field}.entries[{i}].value_prefix"),
                    format!("must be at most {MAX_VALUE_LEN} characters"),
                );
            }
            if entry.value.is_some() && entry.value_prefix.is_some() {
                problems.add(
                    format!("{field}.entries[{i}]"),
                    "give `value` or `value_prefix`, not both",
                );
            }
        }
        if spec.replaces.len() > MAX_REPLACES {
            problems.add(
                format!("{field}.replaces"),
                format!("at most {MAX_REPLACES} rule names"),
            );
        }
        for (i, name) in spec.replaces.iter().enumerate().take(MAX_REPLACES) {
            if !length_ok(name, 64) {
                problems.add(
                    format!("{field}.replaces[{i}]"),
                    "must be a rule name (1 to 64 characters)",
                );
            }
        }
        let ok = problems.is_empty();
        outer.nest_top(problems.into_errors());
        ok.then(|| DescriptorMatch {
            domain: spec.domain.clone(),
            entries: spec
                .entries
                .iter()
                .map(|e| {
                    let matcher = match (&e.value, &e.value_prefix) {
                        (Some(v), _) => ValueMatch::Exact(v.clone()),
                        (None, Some(p)) => ValueMatch::Prefix(p.clone()),
                        (None, None) => ValueMatch::Any,
                    };
                    (e.key.clone(), matcher)
                })
                .collect(),
            answer: spec.answer,
            replaces: spec.replaces.clone(),
        })
    }

    /// The client key a matching descriptor names: the values of the entries the rule
    /// does not fix (any value, or a prefix), joined with `|`; empty when the rule fixes
    /// every value (one bucket).
    pub fn client(&self, entries: &[(String, String)]) -> String {
        let mut client = String::new();
        let open = self
            .entries
            .iter()
            .zip(entries)
            .filter(|((_, value), _)| !matches!(value, ValueMatch::Exact(_)));
        for (i, (_, (_, value))) in open.enumerate() {
            if i > 0 {
                client.push(COMPOSITE_SEPARATOR);
            }
            client.push_str(value);
        }
        client
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn built(json: &str) -> Result<DescriptorMatch, Vec<String>> {
        let spec: DescriptorSpec = serde_json::from_str(json).unwrap();
        let mut problems = Problems::default();
        let built = DescriptorMatch::build(&spec, "descriptor", &mut problems);
        built.ok_or_else(|| {
            problems
                .into_errors()
                .0
                .into_iter()
                .map(|e| e.field)
                .collect()
        })
    }

    fn entries(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn open_entries_make_the_client_key_and_fixed_ones_one_bucket() {
        let two = built(r#"{"domain":"d","entries":[{"key":"a"},{"key":"b"}]}"#).unwrap();
        assert_eq!(two.client(&entries(&[("a", "x"), ("b", "y")])), "x|y");
        let fixed = built(r#"{"domain":"d","entries":[{"key":"a","value":"x"}]}"#).unwrap();
        assert_eq!(fixed.client(&entries(&[("a", "x")])), "");
    }

    #[test]
    fn a_prefix_entrys_value_is_part_of_the_client_key() {
        let m = built(
            r#"{"domain":"d","entries":[{"key":"a","value_prefix":"v"},{"key":"b","value":"y"}]}"#,
        )
        .unwrap();
        assert_eq!(m.client(&entries(&[("a", "v1"), ("b", "y")])), "v1");
        assert!(m.entries[0].1.admits("v2") && !m.entries[0].1.admits("w"));
        assert_eq!(
            built(r#"{"domain":"d","entries":[{"key":"a","value":"x","value_prefix":"x"}]}"#)
                .unwrap_err(),
            ["descriptor.entries[0]"]
        );
    }

    #[test]
    fn every_bound_is_checked_with_its_field() {
        let long = "k".repeat(MAX_KEY_LEN + 1);
        let value = "v".repeat(MAX_VALUE_LEN + 1);
        let domain = "d".repeat(MAX_DOMAIN_LEN + 1);
        let json = format!(
            r#"{{"domain":"{domain}","entries":[{{"key":"{long}"}},{{"key":"b","value":"{value}"}},{{"key":""}}]}}"#
        );
        assert_eq!(
            built(&json).unwrap_err(),
            [
                "descriptor.domain",
                "descriptor.entries[0].key",
                "descriptor.entries[1].value",
                "descriptor.entries[2].key"
            ]
        );
        let many: Vec<String> = (0..=MAX_ENTRIES)
            .map(|i| format!(r#"{{"key":"k{i}"}}"#))
            .collect();
        let json = format!(r#"{{"domain":"d","entries":[{}]}}"#, many.join(","));
        assert_eq!(built(&json).unwrap_err(), ["descriptor.entries"]);
        assert_eq!(
            built(r#"{"domain":"d","entries":[]}"#).unwrap_err(),
            ["descriptor.entries"]
        );
    }
}
