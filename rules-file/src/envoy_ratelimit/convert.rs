//! From limits and the chains of sources that produce them to Sluice rules: a limit and
//! its more specific siblings become one rule with per-client overrides (or rules of their
//! own where a fixed value tells routes apart); the route and the fixed conditions become
//! the rule's match, the value-taking actions its client key, the allowance a token
//! bucket. Each rule is checked by the core before it is kept, and named uniquely.

use std::collections::{BTreeMap, BTreeSet};

use sluice_core::rule::{MAX_REQUESTS, Rule};
use sluice_core::spec::{
    ClientIpSpec, HeaderMatchSpec, KeySpec, LimitSpec, MatchSpec, Mode, NamedPeriod, OverrideSpec,
    PeriodSpec, RuleSpec, Scope,
};

use super::bindings::{Bindings, Chain, Site, Source};
use super::config::{Allowance, Entry, LimitAt, describe, skipped_at};
use super::report::Import;

/// Converts every limit, on every chain of sources that produces its descriptor, into
/// rules in `out`; what cannot be converted goes to `out.skipped`.
pub(super) fn convert(
    domain: &str,
    limits: Vec<LimitAt>,
    sites: Option<&[Site]>,
    bindings: &Bindings,
    out: &mut Import,
) {
    let mut names = BTreeSet::new();
    let limits = limits
        .into_iter()
        .filter(|found| match found.beyond_the_filter() {
            Some(why) => {
                out.skipped.push(skipped_at(&found.path, why));
                false
            }
            None => true,
        })
        .collect();
    for group in group_overrides(limits, out) {
        let chains = chains(&group, sites, bindings, out);
        let several = chains.len() > 1;
        for (i, chain) in chains.into_iter().enumerate() {
            for group in group.on(&chain) {
                match checked_rule(domain, &group, chain.clone(), bindings.trusted_hops) {
                    Ok((mut rule, notes)) => {
                        let base = if several {
                            format!("{}-{}", rule.name, i + 1)
                        } else {
                            rule.name.clone()
                        };
                        rule.name = unique_name(&base, &mut names);
                        out.notes.extend(
                            notes
                                .into_iter()
                                .map(|note| format!("rule {}: {note}", rule.name)),
                        );
                        out.rules.push(rule);
                    }
                    Err(why) => out.skipped.push(skipped_at(&group.path, why)),
                }
            }
        }
    }
}

/// The chains of sources that produce `group`'s descriptor: the Envoy configuration's
/// `rate_limits` entries for it, or without one the chain the bindings give. None (and
/// the reason in `out.skipped`) when nothing produces it.
fn chains(
    group: &Group,
    sites: Option<&[Site]>,
    bindings: &Bindings,
    out: &mut Import,
) -> Vec<Chain> {
    match sites {
        Some(sites) => {
            let matching: Vec<&Site> = sites.iter().filter(|s| s.produces(&group.path)).collect();
            if matching.is_empty() {
                out.skipped.push(skipped_at(
                    &group.path,
                    "no `rate_limits` entry in the Envoy configuration produces this descriptor, so it never applies",
                ));
            }
            matching.into_iter().map(Site::chain).collect()
        }
        None => match bindings.chain(&group.path) {
            Ok(chain) => vec![chain],
            Err(why) => {
                out.skipped.push(skipped_at(&group.path, why));
                Vec::new()
            }
        },
    }
}

/// [`rule_for`], checked as Sluice will check it: a header name or path pattern Sluice
/// refuses is found here, with the validator's own words, rather than by `rules apply`.
fn checked_rule(
    domain: &str,
    group: &Group,
    chain: Chain,
    trusted_hops: u32,
) -> Result<(RuleSpec, Vec<String>), String> {
    let (rule, notes) = rule_for(domain, group, chain, trusted_hops)?;
    Rule::try_from(rule.clone())
        .map_err(|errors| format!("the rule would be invalid: {errors}"))?;
    Ok((rule, notes))
}

/// A limit with the limits of its more specific siblings, which become per-client
/// overrides of its rule.
#[derive(Debug, Clone)]
struct Group {
    path: Vec<Entry>,
    allowance: Allowance,
    shadow: bool,
    name: Option<String>,
    /// Client value → what that client is allowed instead.
    overrides: Vec<(String, Allowance)>,
}

impl Group {
    /// What this group is on one chain of sources. Overrides are per-client, so they stay
    /// overrides only where the last key takes the request's value (a header or the
    /// address). Where it is a fixed value (a `generic_key` or `header_value_match`), the
    /// route or condition decides instead: a chain producing a sibling's value gets that
    /// sibling's limit, any other chain the value-less one, and without the Envoy
    /// configuration to tell them apart each becomes a rule of its own.
    fn on(&self, chain: &Chain) -> Vec<Group> {
        let fixed_value = match chain.sources.last() {
            Some(Source::Fixed { value, .. }) if !self.overrides.is_empty() => value,
            _ => return vec![self.clone()],
        };
        let alone = |path: Vec<Entry>, allowance| Group {
            path,
            allowance,
            shadow: self.shadow,
            name: None,
            overrides: Vec::new(),
        };
        let with_value = |value: &str| {
            let mut path = self.path.clone();
            if let Some(last) = path.last_mut() {
                last.value = Some(value.to_string());
            }
            path
        };
        match fixed_value {
            Some(value) => match self.overrides.iter().find(|(client, _)| client == value) {
                Some((client, allowance)) => vec![alone(with_value(client), *allowance)],
                None => vec![Group {
                    overrides: Vec::new(),
                    ..self.clone()
                }],
            },
            None => std::iter::once(Group {
                overrides: Vec::new(),
                ..self.clone()
            })
            .chain(
                self.overrides
                    .iter()
                    .map(|(client, allowance)| alone(with_value(client), *allowance)),
            )
            .collect(),
        }
    }
}

/// Pairs each value-less limit with the siblings that differ only in having a value at the
/// last level, which ratelimit prefers for those values.
fn group_overrides(entries: Vec<LimitAt>, out: &mut Import) -> Vec<Group> {
    let generic: BTreeSet<Vec<Entry>> = entries
        .iter()
        .filter(|e| e.path.last().is_some_and(|last| last.value.is_none()))
        .map(|e| e.path.clone())
        .collect();
    let mut specific: BTreeMap<Vec<Entry>, Vec<LimitAt>> = BTreeMap::new();
    let mut groups = Vec::new();
    for entry in entries {
        let parent = generic_sibling(&entry.path);
        match parent {
            Some(parent) if generic.contains(&parent) => {
                specific.entry(parent).or_default().push(entry)
            }
            _ => groups.push(Group {
                path: entry.path,
                allowance: entry.allowance,
                shadow: entry.shadow,
                name: entry.name,
                overrides: Vec::new(),
            }),
        }
    }
    for group in &mut groups {
        for sibling in specific.remove(&group.path).unwrap_or_default() {
            let client = sibling
                .path
                .last()
                .and_then(|e| e.value.clone())
                .unwrap_or_default();
            if sibling.shadow != group.shadow {
                out.skipped.push(skipped_at(
                    &sibling.path,
                    format!(
                        "its shadow_mode differs from {}'s, and a per-client override cannot change a rule's mode",
                        describe(&group.path)
                    ),
                ));
                continue;
            }
            group.overrides.push((client, sibling.allowance));
        }
    }
    groups
}

/// The same path with the last value removed, if it had one.
fn generic_sibling(path: &[Entry]) -> Option<Vec<Entry>> {
    let (last, init) = path.split_last()?;
    last.value.as_ref()?;
    let mut parent = init.to_vec();
    parent.push(Entry {
        key: last.key.clone(),
        value: None,
    });
    Some(parent)
}

/// Builds the rule for one group on one chain of sources; returns it with notes.
fn rule_for(
    domain: &str,
    group: &Group,
    chain: Chain,
    trusted_hops: u32,
) -> Result<(RuleSpec, Vec<String>), String> {
    let mut notes = Vec::new();
    let mut matcher = chain.route;
    let mut key_parts = Vec::new();
    for (entry, source) in group.path.iter().zip(chain.sources) {
        match (source, &entry.value) {
            (Source::Fixed { value, conditions }, _) => {
                if value.is_none() && chain.place.is_none() {
                    notes.push(format!(
                        "`{}` tells Envoy routes apart, which only the Envoy configuration shows (--envoy FILE): the rule applies to every request; add a match",
                        entry.key
                    ));
                }
                merge(&mut matcher, conditions)?;
            }
            (Source::Header(name), Some(value)) => matcher.headers.push(HeaderMatchSpec {
                name,
                present: None,
                equals: Some(value.clone()),
            }),
            (Source::Header(name), None) => key_parts.push(KeySpec::Header(name)),
            (Source::RemoteAddress, Some(address)) => {
                return Err(format!(
                    "a limit for the one address {address} with no limit for other addresses: Sluice cannot match an address, only key on it"
                ));
            }
            (Source::RemoteAddress, None) => {
                key_parts.push(KeySpec::ClientIp(ClientIpSpec { trusted_hops }))
            }
        }
    }
    let composite = key_parts.len() > 1;
    let key = match key_parts.len() {
        0 => KeySpec::Global,
        1 => key_parts.remove(0),
        2..=4 => KeySpec::Composite(key_parts),
        n => {
            return Err(format!(
                "{n} per-value keys; a Sluice key has at most 4 parts"
            ));
        }
    };
    if composite && !group.overrides.is_empty() {
        return Err("per-value limits for one part of a composite key cannot be overrides (an override names the whole key)".into());
    }
    let deny =
        "a limit of 0 denies every request, which a filter rule cannot; import with `--for rls`";
    let limits = match group.allowance {
        Allowance::Limited {
            requests,
            period_seconds,
        } => vec![limit(requests, period_seconds)],
        Allowance::Deny => return Err(deny.into()),
        Allowance::Unlimited if group.overrides.is_empty() => {
            return Err("`unlimited: true`: nothing to enforce, so no rule is needed".into());
        }
        Allowance::Unlimited => {
            notes.push("the limit for other clients is unlimited in envoy-ratelimit; it became the most Sluice allows".into());
            vec![limit(MAX_REQUESTS, 1)]
        }
    };
    if group.overrides.iter().any(|(_, a)| *a == Allowance::Deny) {
        return Err(deny.into());
    }
    let overrides = group
        .overrides
        .iter()
        .map(|(client, allowance)| OverrideSpec {
            client: client.clone(),
            limits: vec![match *allowance {
                Allowance::Limited {
                    requests,
                    period_seconds,
                } => limit(requests, period_seconds),
                // A deny was refused above.
                Allowance::Unlimited | Allowance::Deny => {
                    notes.push(format!(
                        "client {client} is unlimited in envoy-ratelimit; its override is the most Sluice allows"
                    ));
                    limit(MAX_REQUESTS, 1)
                }
            }],
        })
        .collect();
    let name = group
        .name
        .clone()
        .unwrap_or_else(|| default_name(domain, &group.path));
    let mut description = format!(
        "Imported from envoy-ratelimit domain {domain}: {}",
        describe(&group.path)
    );
    if let Some(place) = &chain.place {
        description.push_str(&format!(" on {place}"));
    }
    let rule = RuleSpec {
        id: None,
        name: identifier(&name),
        description,
        enabled: true,
        priority: 0,
        mode: if group.shadow {
            Mode::Shadow
        } else {
            Mode::Enforce
        },
        matcher,
        key,
        key_missing: Default::default(),
        enforce_percent: 100,
        limits,
        cost: Default::default(),
        overrides,
        failure_mode: None,
        response: Default::default(),
        descriptor: None,
        tokens: None,
        on_limit: Default::default(),
        delay: None,
        elastic: None,
    };
    Ok((rule, notes))
}

/// Adds a fixed action's conditions to the route's.
fn merge(into: &mut MatchSpec, conditions: MatchSpec) -> Result<(), String> {
    let MatchSpec {
        host,
        path_exact,
        path_prefix,
        path_regex,
        methods,
        headers,
        values,
    } = conditions;
    for (mine, theirs, what) in [
        (&mut into.host, host, "host"),
        (&mut into.path_exact, path_exact, "path"),
        (&mut into.path_prefix, path_prefix, "path prefix"),
        (&mut into.path_regex, path_regex, "path pattern"),
    ] {
        match (mine.as_ref(), theirs) {
            (Some(a), Some(b)) if *a != b => {
                return Err(format!("two different {what} conditions ({a} and {b})"));
            }
            (_, Some(b)) => *mine = Some(b),
            (_, None) => {}
        }
    }
    if !methods.is_empty() && !into.methods.is_empty() {
        into.methods.retain(|m| methods.contains(m));
        if into.methods.is_empty() {
            return Err("method conditions that no request meets together".into());
        }
    } else if !methods.is_empty() {
        into.methods = methods;
    }
    into.headers.extend(headers);
    into.values.extend(values);
    Ok(())
}

/// A token bucket as close as it gets to a fixed window of `requests` per period: the
/// same number admitted at once, refilled at the same average rate.
pub(super) fn limit(requests: u64, period_seconds: u64) -> LimitSpec {
    let period = match period_seconds {
        1 => PeriodSpec::Named(NamedPeriod::Second),
        60 => PeriodSpec::Named(NamedPeriod::Minute),
        3_600 => PeriodSpec::Named(NamedPeriod::Hour),
        86_400 => PeriodSpec::Named(NamedPeriod::Day),
        seconds => PeriodSpec::Seconds(seconds),
    };
    LimitSpec {
        requests: Some(requests),
        period: Some(period),
        burst: None,
        scope: Scope::Proxy,
        tokens: None,
        count: None,
        concurrent: None,
        soft_percent: None,
    }
}

pub(super) fn default_name(domain: &str, path: &[Entry]) -> String {
    let mut parts = vec![domain.to_string()];
    for e in path {
        parts.push(e.key.clone());
        if let Some(v) = &e.value {
            parts.push(v.clone());
        }
    }
    parts.join("-")
}

/// A rule name Sluice accepts: letters, digits, `-`, `_` and `.`, starting with a letter
/// or digit, at most 64 characters.
pub(super) fn identifier(raw: &str) -> String {
    let mut name: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '-'
            }
        })
        .skip_while(|c| !c.is_ascii_alphanumeric())
        .collect();
    if name.is_empty() {
        name.push_str("imported");
    }
    name.truncate(60);
    name
}

pub(super) fn unique_name(base: &str, taken: &mut BTreeSet<String>) -> String {
    let mut name = base.to_string();
    let mut n = 2;
    while !taken.insert(name.clone()) {
        name = format!("{base}-{n}");
        n += 1;
    }
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_made_valid_and_unique() {
        let mut taken = BTreeSet::new();
        assert_eq!(
            unique_name(&identifier("_my limit/1"), &mut taken),
            "my-limit-1"
        );
        assert_eq!(
            unique_name(&identifier("my limit/1"), &mut taken),
            "my-limit-1-2"
        );
        assert_eq!(identifier("***"), "imported");
    }
}
