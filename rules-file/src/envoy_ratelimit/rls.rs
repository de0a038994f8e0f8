//! For Sluice's rate limit service (`--for rls`): every limit in the tree becomes one rule
//! whose `descriptor` is the limit's path, as written. No binding to Envoy's actions is
//! needed (Envoy keeps sending the descriptors it sends to envoyproxy/ratelimit), and what
//! the HTTP conversion cannot say is said: a value's own limit is a rule of its own, more
//! specific than its value-less sibling, so it wins for that value as in ratelimit, under
//! composite keys too, with its own `shadow_mode`; a wildcard value is a `value_prefix`,
//! `unlimited` and a limit of 0 are the rule's `answer`, and `replaces` names the rules
//! made from the limits of that name.

use std::collections::{BTreeMap, BTreeSet};

use sluice_core::rls::{Answer, DescriptorSpec, EntrySpec};
use sluice_core::rule::Rule;
use sluice_core::spec::{KeySpec, Mode, RuleSpec};

use super::config::{Allowance, LimitAt, describe, skipped_at};
use super::convert::{default_name, identifier, limit, unique_name};
use super::report::{Import, Skipped};

/// Converts every limit into an RLS rule of `domain` in `out`.
pub(super) fn convert_for_rls(domain: &str, limits: Vec<LimitAt>, out: &mut Import) {
    // Names first: `replaces` names a limit by its ratelimit `name`, which several limits
    // may share and which becomes a rule name only once made unique.
    let mut names = BTreeSet::new();
    let rule_names: Vec<String> = limits
        .iter()
        .map(|found| {
            let base = identifier(
                &found
                    .name
                    .clone()
                    .unwrap_or_else(|| default_name(domain, &found.path)),
            );
            unique_name(&base, &mut names)
        })
        .collect();
    let mut by_ratelimit_name: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (found, rule_name) in limits.iter().zip(&rule_names) {
        if let Some(name) = &found.name {
            by_ratelimit_name
                .entry(name.as_str())
                .or_default()
                .push(rule_name.clone());
        }
    }
    for (found, name) in limits.iter().zip(rule_names) {
        let (limits, answer) = match found.allowance {
            Allowance::Limited {
                requests,
                period_seconds,
            } => (vec![limit(requests, period_seconds)], Answer::Limit),
            Allowance::Unlimited => (Vec::new(), Answer::Unlimited),
            Allowance::Deny => (Vec::new(), Answer::Deny),
        };
        let mut replaces = Vec::new();
        for replaced in &found.replaces {
            match by_ratelimit_name.get(replaced.as_str()) {
                Some(rules) => replaces.extend(rules.iter().cloned()),
                None => out.skipped.push(Skipped {
                    what: format!("{}: `replaces: {replaced}`", describe(&found.path)),
                    why: "no limit has that name; nothing to replace".into(),
                }),
            }
        }
        let rule = RuleSpec {
            id: None,
            name,
            description: format!(
                "Imported from envoy-ratelimit domain {domain}: {}",
                describe(&found.path)
            ),
            enabled: true,
            priority: 0,
            mode: if found.shadow {
                Mode::Shadow
            } else {
                Mode::Enforce
            },
            matcher: Default::default(),
            key: KeySpec::Global,
            key_missing: Default::default(),
            enforce_percent: 100,
            limits,
            cost: Default::default(),
            overrides: Vec::new(),
            failure_mode: None,
            response: Default::default(),
            tokens: None,
            on_limit: Default::default(),
            delay: None,
            elastic: None,
            descriptor: Some(DescriptorSpec {
                domain: domain.to_string(),
                entries: found
                    .path
                    .iter()
                    .map(|e| match e.wildcard() {
                        Some(prefix) => EntrySpec {
                            key: e.key.clone(),
                            value: None,
                            value_prefix: Some(prefix.to_string()),
                        },
                        None => EntrySpec {
                            key: e.key.clone(),
                            value: e.value.clone(),
                            value_prefix: None,
                        },
                    })
                    .collect(),
                answer,
                replaces,
            }),
        };
        match Rule::try_from(rule.clone()) {
            Ok(_) => out.rules.push(rule),
            Err(errors) => out.skipped.push(skipped_at(
                &found.path,
                format!("the rule would be invalid: {errors}"),
            )),
        }
    }
}
