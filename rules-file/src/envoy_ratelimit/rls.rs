//! For Sluice's rate limit service (`--for rls`): every limit in the tree becomes one rule
//! whose `descriptor` is the limit's path, as written. No binding to Envoy's actions is
//! needed (Envoy keeps sending the descriptors it sends to envoyproxy/ratelimit), and what
//! the HTTP conversion cannot say is said: a value's own limit is a rule of its own, more
//! specific than its value-less sibling, so it wins for that value as in ratelimit, under
//! composite keys too, with its own `shadow_mode`.

use std::collections::BTreeSet;

use sluice_core::rls::{DescriptorSpec, EntrySpec};
use sluice_core::rule::{MAX_REQUESTS, Rule};
use sluice_core::spec::{KeySpec, Mode, RuleSpec};

use super::config::{Allowance, LimitAt, describe, skipped_at};
use super::convert::{default_name, identifier, limit, unique_name};
use super::report::Import;

/// Converts every limit into an RLS rule of `domain` in `out`.
pub(super) fn convert_for_rls(domain: &str, limits: Vec<LimitAt>, out: &mut Import) {
    let mut names = BTreeSet::new();
    for found in limits {
        let (requests, period_seconds) = match found.allowance {
            Allowance::Limited {
                requests,
                period_seconds,
            } => (requests, period_seconds),
            Allowance::Unlimited => {
                out.notes.push(format!(
                    "{}: unlimited in envoy-ratelimit; it became the most Sluice allows ({MAX_REQUESTS} a second), which wins over less specific limits as `unlimited` does",
                    describe(&found.path)
                ));
                (MAX_REQUESTS, 1)
            }
        };
        let base = identifier(
            &found
                .name
                .clone()
                .unwrap_or_else(|| default_name(domain, &found.path)),
        );
        let rule = RuleSpec {
            id: None,
            name: unique_name(&base, &mut names),
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
            limits: vec![limit(requests, period_seconds)],
            cost: Default::default(),
            overrides: Vec::new(),
            failure_mode: None,
            response: Default::default(),
            tokens: None,
            descriptor: Some(DescriptorSpec {
                domain: domain.to_string(),
                entries: found
                    .path
                    .iter()
                    .map(|e| EntrySpec {
                        key: e.key.clone(),
                        value: e.value.clone(),
                    })
                    .collect(),
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
