//! A rule's `descriptor` section: which RLS descriptors the rule decides.

use super::spec::DescriptorSpec;
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
    DescriptorMatch::build(descriptor, "descriptor", problems)
}

/// A validated [`DescriptorSpec`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescriptorMatch {
    pub domain: String,
    pub entries: Vec<(String, Option<String>)>,
}

/// Whether `s` is 1 to `max` characters.
fn length_ok(s: &str, max: usize) -> bool {
    !s.is_empty() && s.chars().count() <= max
}

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
        }
        let ok = problems.is_empty();
        outer.nest_top(problems.into_errors());
        ok.then(|| DescriptorMatch {
            domain: spec.domain.clone(),
            entries: spec
                .entries
                .iter()
                .map(|e| (e.key.clone(), e.value.clone()))
                .collect(),
        })
    }

    /// Whether a request's descriptor (its entries in order) is one this rule decides: the
    /// same keys in the same order, with the values the rule fixes.
    pub fn matches(&self, entries: &[(String, String)]) -> bool {
        self.entries.len() == entries.len()
            && self
                .entries
                .iter()
                .zip(entries)
                .all(|((key, value), (k, v))| key == k && value.as_ref().is_none_or(|x| x == v))
    }

    /// How specific the rule is, for choosing among rules that match one descriptor: at
    /// the first level where two rules differ, the one fixing a value is greater (as
    /// envoyproxy/ratelimit prefers `key_value` over `key` at each level).
    pub fn specificity(&self) -> u32 {
        self.entries
            .iter()
            .enumerate()
            .filter(|(_, (_, value))| value.is_some())
            .fold(0, |bits, (i, _)| {
                bits | 1u32 << (MAX_ENTRIES as u32 - 1).saturating_sub(i as u32)
            })
    }

    /// The client key a matching descriptor names: the values of the entries the rule
    /// leaves open, joined with `|`; empty when the rule fixes every value (one bucket).
    pub fn client(&self, entries: &[(String, String)]) -> String {
        let mut client = String::new();
        let open = self
            .entries
            .iter()
            .zip(entries)
            .filter(|((_, value), _)| value.is_none());
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
    fn a_descriptor_matches_the_same_keys_in_order_with_the_fixed_values() {
        let m = built(r#"{"domain":"edge","entries":[{"key":"path","value":"/login"},{"key":"remote_address"}]}"#).unwrap();
        assert!(m.matches(&entries(&[
            ("path", "/login"),
            ("remote_address", "1.2.3.4")
        ])));
        assert!(!m.matches(&entries(&[
            ("path", "/other"),
            ("remote_address", "1.2.3.4")
        ])));
        assert!(!m.matches(&entries(&[
            ("remote_address", "1.2.3.4"),
            ("path", "/login")
        ])));
        assert!(!m.matches(&entries(&[("path", "/login")])), "shorter");
        assert!(
            !m.matches(&entries(&[
                ("path", "/login"),
                ("remote_address", "a"),
                ("x", "y")
            ])),
            "longer"
        );
        assert_eq!(
            m.client(&entries(&[
                ("path", "/login"),
                ("remote_address", "1.2.3.4")
            ])),
            "1.2.3.4"
        );
    }

    #[test]
    fn open_entries_make_the_client_key_and_fixed_ones_one_bucket() {
        let two = built(r#"{"domain":"d","entries":[{"key":"a"},{"key":"b"}]}"#).unwrap();
        assert_eq!(two.client(&entries(&[("a", "x"), ("b", "y")])), "x|y");
        let fixed = built(r#"{"domain":"d","entries":[{"key":"a","value":"x"}]}"#).unwrap();
        assert_eq!(fixed.client(&entries(&[("a", "x")])), "");
    }

    #[test]
    fn a_value_at_an_earlier_level_is_more_specific() {
        let s = |json| built(json).unwrap().specificity();
        let open = s(r#"{"domain":"d","entries":[{"key":"a"},{"key":"b"}]}"#);
        let last = s(r#"{"domain":"d","entries":[{"key":"a"},{"key":"b","value":"y"}]}"#);
        let first = s(r#"{"domain":"d","entries":[{"key":"a","value":"x"},{"key":"b"}]}"#);
        let both =
            s(r#"{"domain":"d","entries":[{"key":"a","value":"x"},{"key":"b","value":"y"}]}"#);
        assert!(open < last && last < first && first < both);
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
