//! Rules from an envoyproxy/ratelimit configuration: `sluice rules import --from
//! envoy-ratelimit`.
//!
//! That service's configuration is a tree of descriptors, `(key, value?)` pairs with a
//! `rate_limit` where a limit applies, but the tree alone does not say which requests
//! produce which descriptor: Envoy's `rate_limits` actions do (a `request_headers` action
//! turns a header into a value, `remote_address` the client's address, `generic_key` and
//! `header_value_match` a fixed value when the route or a header condition matches). So
//! each descriptor key is *bound* to an action before it can become a Sluice rule:
//!
//! * from the Envoy configuration itself, when the user passes it: every `rate_limits`
//!   entry of every route and virtual host, with the route's match;
//! * otherwise from conventions and flags: `remote_address` is the client's address,
//!   `generic_key` a constant, and `--header KEY=NAME` binds a key to a request header.
//!
//! Each limit in the tree (a descriptor with a `rate_limit`, at any depth) then becomes one
//! rule per `rate_limits` entry producing its descriptor: the route's match plus the fixed
//! conditions become the rule's match, the value-taking actions its client key, and the
//! limit a token bucket of `requests_per_unit` per unit with a burst of the same size
//! (ratelimit's fixed window admits that many at the start of a window).
//!
//! ratelimit picks the most specific descriptor at a level: `(api_key, acme)` replaces
//! `(api_key)` for that client. Sluice says the same with a per-client override, so value
//! siblings of a value-less limit become overrides of its rule.
//!
//! What has no Sluice equivalent is not guessed at: [`Import::skipped`] says what was left
//! out and why, and the user decides.

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;
use sluice_core::rule::{MAX_REQUESTS, Rule};
use sluice_core::spec::{
    ClientIpSpec, HeaderMatchSpec, KeySpec, LimitSpec, MatchSpec, Mode, NamedPeriod, OverrideSpec,
    PeriodSpec, RuleSpec, Scope,
};

/// What came out of an import: the rules, and everything that could not be converted.
#[derive(Debug, Default)]
pub struct Import {
    pub rules: Vec<RuleSpec>,
    /// What was left out, and why.
    pub skipped: Vec<Skipped>,
    /// What was converted with a difference worth knowing.
    pub notes: Vec<String>,
}

/// A part of the input that has no Sluice equivalent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// Where it is, e.g. `descriptor (remote_address, 50.0.0.5)`.
    pub what: String,
    pub why: String,
}

/// How descriptor keys map to requests when no Envoy configuration is given.
#[derive(Debug, Clone, Default)]
pub struct Bindings {
    /// Descriptor key → request header (`--header KEY=NAME`), as a `request_headers` action.
    pub headers: BTreeMap<String, String>,
    /// `X-Forwarded-For` hops to trust for `remote_address`.
    pub trusted_hops: u32,
}

/// Why the input could not be read at all.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("not a valid envoy-ratelimit configuration: {0}")]
    Config(String),
    #[error("not a valid Envoy configuration: {0}")]
    Envoy(String),
}

/// The ratelimit service's configuration file.
#[derive(Debug, Deserialize)]
struct RatelimitConfig {
    domain: String,
    #[serde(default)]
    descriptors: Vec<Descriptor>,
}

#[derive(Debug, Deserialize)]
struct Descriptor {
    key: String,
    #[serde(default)]
    value: Option<String>,
    #[serde(default)]
    rate_limit: Option<RateLimit>,
    #[serde(default)]
    descriptors: Vec<Descriptor>,
    #[serde(default)]
    shadow_mode: bool,
    /// Only changes ratelimit's metric names; Sluice reports per client anyway.
    #[serde(default)]
    #[allow(dead_code)]
    detailed_metric: bool,
    /// Fields of newer ratelimit versions, reported rather than refused.
    #[serde(flatten)]
    unknown: BTreeMap<String, serde_json::Value>,
}

#[derive(Debug, Deserialize)]
struct RateLimit {
    #[serde(default)]
    unit: Option<String>,
    #[serde(default)]
    requests_per_unit: Option<u64>,
    #[serde(default)]
    unlimited: bool,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    replaces: Vec<serde_json::Value>,
    #[serde(flatten)]
    unknown: BTreeMap<String, serde_json::Value>,
}

/// Converts an envoy-ratelimit configuration (YAML, as that service reads it). With
/// `envoy` (an Envoy configuration in YAML or JSON: a bootstrap, a listener or a route
/// configuration), descriptor keys are bound by its `rate_limits` actions; without it, by
/// `bindings`.
pub fn import(
    config: &str,
    envoy: Option<&str>,
    bindings: &Bindings,
) -> Result<Import, ImportError> {
    let config: RatelimitConfig =
        serde_norway::from_str(config).map_err(|e| ImportError::Config(e.to_string()))?;
    let mut out = Import::default();
    let sites = match envoy {
        Some(text) => {
            let document: serde_json::Value =
                serde_norway::from_str(text).map_err(|e| ImportError::Envoy(e.to_string()))?;
            let sites = envoy_sites(&document, &mut out.skipped);
            if sites.is_empty() {
                out.notes.push(
                    "the Envoy configuration has no usable `rate_limits` actions, so no limit applies to any request".into(),
                );
            }
            Some(sites)
        }
        None => None,
    };
    let mut entries = Vec::new();
    collect_limits(&config.descriptors, &[], &mut entries, &mut out.skipped);
    let mut names = BTreeSet::new();
    for group in group_overrides(entries, &mut out) {
        let chains = match &sites {
            Some(sites) => {
                let matching: Vec<&Site> =
                    sites.iter().filter(|s| s.produces(&group.path)).collect();
                if matching.is_empty() {
                    out.skipped.push(Skipped {
                        what: describe(&group.path),
                        why: "no `rate_limits` entry in the Envoy configuration produces this descriptor, so it never applies".into(),
                    });
                }
                matching.into_iter().map(Site::chain).collect()
            }
            None => match bindings.chain(&group.path) {
                Ok(chain) => vec![chain],
                Err(why) => {
                    out.skipped.push(Skipped {
                        what: describe(&group.path),
                        why,
                    });
                    continue;
                }
            },
        };
        let several = chains.len() > 1;
        for (i, chain) in chains.into_iter().enumerate() {
            for group in group.on(&chain) {
                let rule = rule_for(&config.domain, &group, chain.clone(), bindings.trusted_hops)
                    .and_then(|(rule, notes)| {
                        // A header name or path pattern Sluice refuses is found here, with
                        // the validator's own words, rather than by `rules apply`.
                        Rule::try_from(rule.clone())
                            .map(|_| (rule, notes))
                            .map_err(|errors| format!("the rule would be invalid: {errors}"))
                    });
                match rule {
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
                    Err(why) => out.skipped.push(Skipped {
                        what: describe(&group.path),
                        why,
                    }),
                }
            }
        }
    }
    Ok(out)
}

/// One `(key, value?)` pair of a descriptor.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Entry {
    key: String,
    value: Option<String>,
}

/// A limit in the tree: the descriptor that selects it and what it allows.
#[derive(Debug)]
struct LimitAt {
    path: Vec<Entry>,
    allowance: Allowance,
    shadow: bool,
    name: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Allowance {
    Limited { requests: u64, period_seconds: u64 },
    Unlimited,
}

/// Walks the tree and lists every descriptor with a `rate_limit`, skipping (with a reason)
/// what cannot be a Sluice limit.
fn collect_limits(
    level: &[Descriptor],
    prefix: &[Entry],
    out: &mut Vec<LimitAt>,
    skipped: &mut Vec<Skipped>,
) {
    for d in level {
        let mut path = prefix.to_vec();
        path.push(Entry {
            key: d.key.clone(),
            value: d.value.clone().filter(|v| !v.is_empty()),
        });
        for field in d.unknown.keys() {
            skipped.push(Skipped {
                what: format!("{}: `{field}`", describe(&path)),
                why: "not a field this importer knows; ignored".into(),
            });
        }
        if let Some(value) = d.value.as_deref().filter(|v| v.ends_with('*')) {
            skipped.push(Skipped {
                what: describe(&path),
                why: format!(
                    "the wildcard value `{value}` matches by prefix; Sluice matches values exactly"
                ),
            });
            continue;
        }
        if let Some(limit) = &d.rate_limit {
            match allowance(limit) {
                Ok(allowance) => {
                    if !limit.replaces.is_empty() {
                        skipped.push(Skipped {
                            what: format!("{}: `replaces`", describe(&path)),
                            why: "Sluice applies every matching rule; the limit was converted without replacing the other".into(),
                        });
                    }
                    for field in limit.unknown.keys() {
                        skipped.push(Skipped {
                            what: format!("{}: `rate_limit.{field}`", describe(&path)),
                            why: "not a field this importer knows; ignored".into(),
                        });
                    }
                    out.push(LimitAt {
                        path: path.clone(),
                        allowance,
                        shadow: d.shadow_mode,
                        name: limit.name.clone(),
                    });
                }
                Err(why) => skipped.push(Skipped {
                    what: describe(&path),
                    why,
                }),
            }
        }
        collect_limits(&d.descriptors, &path, out, skipped);
    }
}

fn allowance(limit: &RateLimit) -> Result<Allowance, String> {
    if limit.unlimited {
        return Ok(Allowance::Unlimited);
    }
    let unit = limit
        .unit
        .as_deref()
        .ok_or("the rate_limit has no `unit`")?;
    let period_seconds = match unit.to_ascii_lowercase().as_str() {
        "second" => 1,
        "minute" => 60,
        "hour" => 3_600,
        "day" => 86_400,
        "week" => 7 * 86_400,
        "month" | "year" => {
            return Err(format!(
                "a `{unit}` has no fixed length; write the limit in days"
            ));
        }
        _ => return Err(format!("`{unit}` is not a unit")),
    };
    match limit.requests_per_unit {
        None => Err("the rate_limit has no `requests_per_unit`".into()),
        Some(0) => {
            Err("a limit of 0 denies every request; Sluice limits always admit their burst".into())
        }
        Some(requests) if requests > MAX_REQUESTS => Err(format!(
            "{requests} requests per unit is over Sluice's {MAX_REQUESTS}"
        )),
        Some(requests) => Ok(Allowance::Limited {
            requests,
            period_seconds,
        }),
    }
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
                out.skipped.push(Skipped {
                    what: describe(&sibling.path),
                    why: format!(
                        "its shadow_mode differs from {}'s, and a per-client override cannot change a rule's mode",
                        describe(&group.path)
                    ),
                });
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

/// Where a descriptor key's value comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Source {
    /// A fixed value when the conditions hold (`generic_key`, `header_value_match`);
    /// `value: None` when any value is taken (no Envoy configuration to say which).
    Fixed {
        value: Option<String>,
        conditions: MatchSpec,
    },
    /// A request header's value (`request_headers`).
    Header(String),
    /// The client's address (`remote_address`).
    RemoteAddress,
}

/// The sources of a whole descriptor, in order, with the match of the route they are on.
#[derive(Debug, Clone)]
struct Chain {
    route: MatchSpec,
    /// Where the route is, for descriptions (`virtual host api, route /slow`).
    place: Option<String>,
    sources: Vec<Source>,
}

impl Bindings {
    fn chain(&self, path: &[Entry]) -> Result<Chain, String> {
        let sources = path
            .iter()
            .map(|entry| {
                if let Some(header) = self.headers.get(&entry.key) {
                    Ok(Source::Header(header.clone()))
                } else if entry.key == "remote_address" {
                    Ok(Source::RemoteAddress)
                } else if entry.key == "generic_key" {
                    Ok(Source::Fixed {
                        value: None,
                        conditions: MatchSpec::default(),
                    })
                } else {
                    Err(format!(
                        "the descriptor key `{}` is produced by an Envoy action this importer cannot see: pass the Envoy configuration (--envoy FILE) or bind the key to a header (--header {}=HEADER-NAME)",
                        entry.key, entry.key
                    ))
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Chain {
            route: MatchSpec::default(),
            place: None,
            sources,
        })
    }
}

/// A `rate_limits` entry of the Envoy configuration: the descriptor it produces, on which
/// route.
#[derive(Debug, Clone)]
struct Site {
    route: MatchSpec,
    place: String,
    actions: Vec<(String, Source)>,
}

impl Site {
    /// Whether this entry produces descriptors of `path`'s keys, with the fixed values
    /// `path` names.
    fn produces(&self, path: &[Entry]) -> bool {
        self.actions.len() == path.len()
            && self.actions.iter().zip(path).all(|((key, source), entry)| {
                key == &entry.key
                    && match (source, &entry.value) {
                        (Source::Fixed { value, .. }, Some(wanted)) => {
                            value.as_ref() == Some(wanted)
                        }
                        _ => true,
                    }
            })
    }

    fn chain(&self) -> Chain {
        Chain {
            route: self.route.clone(),
            place: Some(self.place.clone()),
            sources: self.actions.iter().map(|(_, s)| s.clone()).collect(),
        }
    }
}

/// Finds every `rate_limits` entry in an Envoy configuration: on virtual hosts (all their
/// routes) and on routes (`route.rate_limits`, with the route's match).
fn envoy_sites(document: &serde_json::Value, skipped: &mut Vec<Skipped>) -> Vec<Site> {
    let mut hosts = Vec::new();
    find_virtual_hosts(document, &mut hosts);
    let mut sites = Vec::new();
    for vhost in hosts {
        let name = vhost["name"].as_str().unwrap_or("(unnamed)");
        let place = format!("virtual host {name}");
        let host = match host_of(vhost) {
            Ok(host) => host,
            Err(why) => {
                skipped.push(Skipped { what: place, why });
                continue;
            }
        };
        let base = MatchSpec {
            host,
            ..MatchSpec::default()
        };
        site_entries(&vhost["rate_limits"], &base, &place, &mut sites, skipped);
        for route in vhost["routes"].as_array().into_iter().flatten() {
            let label = route["name"]
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| route["match"].to_string());
            let place = format!("{place}, route {label}");
            if route["route"]["rate_limits"].is_null() {
                continue;
            }
            match route_match(&route["match"], &base) {
                Ok(matcher) => site_entries(
                    &route["route"]["rate_limits"],
                    &matcher,
                    &place,
                    &mut sites,
                    skipped,
                ),
                Err(why) => skipped.push(Skipped { what: place, why }),
            }
        }
    }
    sites
}

fn find_virtual_hosts<'a>(value: &'a serde_json::Value, out: &mut Vec<&'a serde_json::Value>) {
    match value {
        serde_json::Value::Object(fields) => {
            for (key, inner) in fields {
                match (key.as_str(), inner) {
                    ("virtual_hosts", serde_json::Value::Array(hosts)) => out.extend(hosts),
                    _ => find_virtual_hosts(inner, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|i| find_virtual_hosts(i, out)),
        _ => {}
    }
}

/// A virtual host's domains as one Sluice host condition.
fn host_of(vhost: &serde_json::Value) -> Result<Option<String>, String> {
    let mut hosts = BTreeSet::new();
    for domain in vhost["domains"].as_array().into_iter().flatten() {
        let domain = domain.as_str().unwrap_or_default();
        if domain == "*" {
            return Ok(None);
        }
        // `api.example.com:443` and `api.example.com` are one host to Sluice, which
        // compares hosts without the port.
        let without_port = match domain.rsplit_once(':') {
            Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
            _ => domain,
        };
        hosts.insert(without_port.to_ascii_lowercase());
    }
    match hosts.len() {
        0 => Ok(None),
        1 => Ok(hosts.pop_first()),
        _ => Err(format!(
            "its domains ({}) are several hosts; a Sluice rule matches one",
            hosts.into_iter().collect::<Vec<_>>().join(", ")
        )),
    }
}

/// A route's `match` on top of its virtual host's conditions.
fn route_match(m: &serde_json::Value, base: &MatchSpec) -> Result<MatchSpec, String> {
    let mut out = base.clone();
    for (field, value) in m.as_object().into_iter().flatten() {
        match field.as_str() {
            "prefix" if value.as_str() == Some("/") => {}
            "prefix" => out.path_prefix = value.as_str().map(str::to_string),
            "path" => out.path_exact = value.as_str().map(str::to_string),
            "safe_regex" => out.path_regex = value["regex"].as_str().map(str::to_string),
            "headers" => {
                for header in value.as_array().into_iter().flatten() {
                    header_condition(header, &mut out)?;
                }
            }
            other => {
                return Err(format!(
                    "its route match uses `{other}`, which Sluice cannot match"
                ));
            }
        }
    }
    Ok(out)
}

/// Adds an Envoy `HeaderMatcher` to `out`: exact values and presence convert; `:method`,
/// `:path` and `:authority` become the method, path and host conditions.
fn header_condition(header: &serde_json::Value, out: &mut MatchSpec) -> Result<(), String> {
    let name = header["name"]
        .as_str()
        .unwrap_or_default()
        .to_ascii_lowercase();
    if header["invert_match"].as_bool() == Some(true) {
        return Err(format!("the header condition on `{name}` is inverted"));
    }
    let exact = header["exact_match"]
        .as_str()
        .or_else(|| header["string_match"]["exact"].as_str())
        .map(str::to_string);
    let prefix = header["prefix_match"]
        .as_str()
        .or_else(|| header["string_match"]["prefix"].as_str())
        .map(str::to_string);
    let present = header["present_match"].as_bool();
    match (name.as_str(), exact, prefix, present) {
        (":method", Some(method), None, None) => out.methods.push(method.to_ascii_uppercase()),
        (":path", Some(path), None, None) => out.path_exact = Some(path),
        (":path", None, Some(prefix), None) => out.path_prefix = Some(prefix),
        (":authority" | "host", Some(host), None, None) => out.host = Some(host),
        (n, Some(equals), None, None) if !n.starts_with(':') => out.headers.push(HeaderMatchSpec {
            name: name.clone(),
            present: None,
            equals: Some(equals),
        }),
        (n, None, None, Some(present)) if !n.starts_with(':') => {
            out.headers.push(HeaderMatchSpec {
                name: name.clone(),
                present: Some(present),
                equals: None,
            })
        }
        _ => {
            return Err(format!(
                "the header condition on `{name}` is neither an exact value nor presence"
            ));
        }
    }
    Ok(())
}

/// Turns one `rate_limits` list into sites, skipping entries with actions Sluice cannot
/// take.
fn site_entries(
    list: &serde_json::Value,
    route: &MatchSpec,
    place: &str,
    sites: &mut Vec<Site>,
    skipped: &mut Vec<Skipped>,
) {
    for (i, entry) in list.as_array().into_iter().flatten().enumerate() {
        let place = format!("{place}, rate_limits[{i}]");
        let actions: Result<Vec<_>, String> = entry["actions"]
            .as_array()
            .into_iter()
            .flatten()
            .map(action)
            .collect();
        match actions {
            Ok(actions) if !actions.is_empty() => sites.push(Site {
                route: route.clone(),
                place,
                actions,
            }),
            Ok(_) => {}
            Err(why) => skipped.push(Skipped { what: place, why }),
        }
    }
}

/// One Envoy rate-limit action: the descriptor key it produces and where its value comes
/// from.
fn action(action: &serde_json::Value) -> Result<(String, Source), String> {
    let key_or = |inner: &serde_json::Value, default: &str| {
        inner["descriptor_key"]
            .as_str()
            .filter(|k| !k.is_empty())
            .unwrap_or(default)
            .to_string()
    };
    if let Some(inner) = action.get("generic_key") {
        let value = inner["descriptor_value"].as_str().map(str::to_string);
        return Ok((
            key_or(inner, "generic_key"),
            Source::Fixed {
                value,
                conditions: MatchSpec::default(),
            },
        ));
    }
    if let Some(inner) = action.get("request_headers") {
        if inner["skip_if_absent"].as_bool() == Some(true) {
            return Err("a `request_headers` action with `skip_if_absent` changes the descriptor's shape per request".into());
        }
        let header = inner["header_name"]
            .as_str()
            .ok_or("a `request_headers` action has no `header_name`")?;
        let key = inner["descriptor_key"]
            .as_str()
            .ok_or("a `request_headers` action has no `descriptor_key`")?;
        return Ok((key.to_string(), Source::Header(header.to_ascii_lowercase())));
    }
    if action.get("remote_address").is_some() {
        return Ok(("remote_address".into(), Source::RemoteAddress));
    }
    if let Some(inner) = action.get("header_value_match") {
        if inner["expect_match"].as_bool() == Some(false) {
            return Err(
                "a `header_value_match` action with `expect_match: false` needs a negated condition".into(),
            );
        }
        let mut conditions = MatchSpec::default();
        for header in inner["headers"].as_array().into_iter().flatten() {
            header_condition(header, &mut conditions)?;
        }
        let value = inner["descriptor_value"].as_str().map(str::to_string);
        return Ok((
            key_or(inner, "header_match"),
            Source::Fixed { value, conditions },
        ));
    }
    let kind = action
        .as_object()
        .and_then(|fields| fields.keys().next().cloned())
        .unwrap_or_else(|| action.to_string());
    Err(format!("the `{kind}` action has no Sluice equivalent"))
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
    let limits = match group.allowance {
        Allowance::Limited {
            requests,
            period_seconds,
        } => vec![limit(requests, period_seconds)],
        Allowance::Unlimited if group.overrides.is_empty() => {
            return Err("`unlimited: true`: nothing to enforce, so no rule is needed".into());
        }
        Allowance::Unlimited => {
            notes.push("the limit for other clients is unlimited in envoy-ratelimit; it became the most Sluice allows".into());
            vec![limit(MAX_REQUESTS, 1)]
        }
    };
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
                Allowance::Unlimited => {
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
        limits,
        cost: Default::default(),
        overrides,
        failure_mode: None,
        response: Default::default(),
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
    Ok(())
}

/// A token bucket as close as it gets to a fixed window of `requests` per period: the
/// same number admitted at once, refilled at the same average rate.
fn limit(requests: u64, period_seconds: u64) -> LimitSpec {
    let period = match period_seconds {
        1 => PeriodSpec::Named(NamedPeriod::Second),
        60 => PeriodSpec::Named(NamedPeriod::Minute),
        3_600 => PeriodSpec::Named(NamedPeriod::Hour),
        86_400 => PeriodSpec::Named(NamedPeriod::Day),
        seconds => PeriodSpec::Seconds(seconds),
    };
    LimitSpec {
        requests,
        period,
        burst: None,
        scope: Scope::Proxy,
    }
}

/// `(key, value), (key)` as ratelimit's documentation writes descriptors.
fn describe(path: &[Entry]) -> String {
    let entries: Vec<String> = path
        .iter()
        .map(|e| match &e.value {
            Some(v) => format!("({}, {v})", e.key),
            None => format!("({})", e.key),
        })
        .collect();
    format!("descriptor {}", entries.join(", "))
}

fn default_name(domain: &str, path: &[Entry]) -> String {
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
fn identifier(raw: &str) -> String {
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

fn unique_name(base: &str, taken: &mut BTreeSet<String>) -> String {
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
    use sluice_core::ruleset::Ruleset;

    fn imported(config: &str, envoy: Option<&str>, bindings: &Bindings) -> Import {
        let import = import(config, envoy, bindings).unwrap();
        // Whatever is converted must be rules Sluice accepts.
        Ruleset::from_specs(import.rules.clone()).unwrap();
        import
    }

    fn json(rule: &RuleSpec) -> serde_json::Value {
        serde_json::to_value(rule).unwrap()
    }

    fn headers(pairs: &[(&str, &str)]) -> Bindings {
        Bindings {
            headers: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            trusted_hops: 0,
        }
    }

    #[test]
    fn per_address_limits_with_a_more_specific_address_become_an_override_or_a_skip() {
        let import = imported(
            "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 10}\n  - key: remote_address\n    value: 50.0.0.5\n    rate_limit: {unit: minute, requests_per_unit: 3}\n  - key: remote_address\n    value: 50.0.0.6\n    rate_limit: {unit: second, requests_per_unit: 0}\n",
            None,
            &Bindings::default(),
        );
        assert_eq!(import.rules.len(), 1);
        let rule = json(&import.rules[0]);
        assert_eq!(rule["name"], "edge-remote_address");
        assert_eq!(
            rule["key"],
            serde_json::json!({"client_ip": {"trusted_hops": 0}})
        );
        assert_eq!(
            rule["limits"],
            serde_json::json!([{"requests": 10, "period": "second"}])
        );
        assert_eq!(
            rule["overrides"],
            serde_json::json!([{"client": "50.0.0.5", "limits": [{"requests": 3, "period": "minute"}]}])
        );
        assert_eq!(
            import.skipped,
            vec![Skipped {
                what: "descriptor (remote_address, 50.0.0.6)".into(),
                why: "a limit of 0 denies every request; Sluice limits always admit their burst"
                    .into()
            }]
        );
    }

    #[test]
    fn nested_descriptors_become_matches_and_composite_keys() {
        let config = "domain: messaging\ndescriptors:\n  - key: message_type\n    value: marketing\n    descriptors:\n      - key: to_number\n        rate_limit: {unit: day, requests_per_unit: 5}\n  - key: to_number\n    rate_limit: {unit: day, requests_per_unit: 100}\n  - key: tenant\n    descriptors:\n      - key: to_number\n        shadow_mode: true\n        rate_limit: {unit: hour, requests_per_unit: 50}\n";
        let import = imported(
            config,
            None,
            &headers(&[
                ("message_type", "x-message-type"),
                ("to_number", "x-to"),
                ("tenant", "x-tenant"),
            ]),
        );
        let rules: Vec<_> = import.rules.iter().map(json).collect();
        assert_eq!(rules.len(), 3, "{rules:#?}");
        assert_eq!(
            rules[0]["match"],
            serde_json::json!({"headers": [{"name": "x-message-type", "equals": "marketing"}]})
        );
        assert_eq!(rules[0]["key"], serde_json::json!({"header": "x-to"}));
        assert_eq!(rules[1]["key"], serde_json::json!({"header": "x-to"}));
        assert_eq!(rules[1]["match"], serde_json::json!({}));
        assert_eq!(
            rules[2]["key"],
            serde_json::json!({"composite": [{"header": "x-tenant"}, {"header": "x-to"}]})
        );
        assert_eq!(rules[2]["mode"], "shadow");
        assert!(import.skipped.is_empty(), "{:?}", import.skipped);
    }

    #[test]
    fn keys_nothing_binds_are_skipped_with_the_flag_that_would_bind_them() {
        let import = import(
            "domain: d\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
            None,
            &Bindings::default(),
        )
        .unwrap();
        assert!(import.rules.is_empty());
        assert!(
            import.skipped[0]
                .why
                .contains("--header api_key=HEADER-NAME"),
            "{:?}",
            import.skipped
        );
    }

    #[test]
    fn unlimited_values_and_unconvertible_units_say_why() {
        let import = imported(
            "domain: internal\ndescriptors:\n  - key: ldap\n    rate_limit: {unlimited: true}\n  - key: azure\n    rate_limit: {unit: minute, requests_per_unit: 100}\n  - key: azure\n    value: batch\n    rate_limit: {unlimited: true}\n  - key: monthly\n    rate_limit: {unit: month, requests_per_unit: 100}\n  - key: pre\n    value: abc*\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
            None,
            &headers(&[
                ("ldap", "x-ldap"),
                ("azure", "x-azure"),
                ("monthly", "x-m"),
                ("pre", "x-p"),
            ]),
        );
        assert_eq!(import.rules.len(), 1);
        let rule = json(&import.rules[0]);
        assert_eq!(rule["overrides"][0]["client"], "batch");
        assert_eq!(rule["overrides"][0]["limits"][0]["requests"], MAX_REQUESTS);
        let why: Vec<&str> = import.skipped.iter().map(|s| s.why.as_str()).collect();
        assert!(why.iter().any(|w| w.contains("wildcard")), "{why:?}");
        assert!(
            why.iter().any(|w| w.contains("no rule is needed")),
            "{why:?}"
        );
        assert!(why.iter().any(|w| w.contains("no fixed length")), "{why:?}");
    }

    const ENVOY: &str = r#"
static_resources:
  listeners:
  - name: main
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          route_config:
            virtual_hosts:
            - name: api
              domains: ["api.example.com", "api.example.com:443"]
              rate_limits:
              - actions:
                - remote_address: {}
              routes:
              - match: {prefix: /slow}
                route:
                  cluster: backend
                  rate_limits:
                  - actions:
                    - generic_key: {descriptor_value: slowpath}
                    - request_headers: {header_name: X-Api-Key, descriptor_key: api_key}
              - match:
                  prefix: /
                  headers:
                  - name: ":method"
                    string_match: {exact: POST}
                route:
                  cluster: backend
                  rate_limits:
                  - actions:
                    - header_value_match:
                        descriptor_value: beta
                        headers:
                        - name: x-beta
                          present_match: true
                  - actions:
                    - destination_cluster: {}
"#;

    #[test]
    fn the_envoy_configuration_binds_keys_and_gives_routes_and_conditions() {
        let config = "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 20}\n  - key: generic_key\n    value: slowpath\n    descriptors:\n      - key: api_key\n        rate_limit: {unit: minute, requests_per_unit: 60}\n      - key: api_key\n        value: acme\n        rate_limit: {unit: minute, requests_per_unit: 600}\n  - key: header_match\n    value: beta\n    rate_limit: {unit: second, requests_per_unit: 5}\n  - key: header_match\n    value: gamma\n    rate_limit: {unit: second, requests_per_unit: 5}\n";
        let import = imported(config, Some(ENVOY), &Bindings::default());
        let rules: Vec<_> = import.rules.iter().map(json).collect();
        assert_eq!(rules.len(), 3, "{rules:#?}");
        assert_eq!(
            rules[0]["match"],
            serde_json::json!({"host": "api.example.com"})
        );
        assert_eq!(
            rules[0]["key"],
            serde_json::json!({"client_ip": {"trusted_hops": 0}})
        );
        assert_eq!(
            rules[1]["match"],
            serde_json::json!({"host": "api.example.com", "path_prefix": "/slow"})
        );
        assert_eq!(rules[1]["key"], serde_json::json!({"header": "x-api-key"}));
        assert_eq!(rules[1]["overrides"][0]["client"], "acme");
        assert_eq!(
            rules[2]["match"],
            serde_json::json!({"host": "api.example.com", "methods": ["POST"],
                               "headers": [{"name": "x-beta", "present": true}]})
        );
        assert_eq!(rules[2]["key"], "global");
        let skipped: Vec<String> = import
            .skipped
            .iter()
            .map(|s| format!("{}: {}", s.what, s.why))
            .collect();
        assert_eq!(skipped.len(), 2, "{skipped:#?}");
        assert!(
            skipped[0].contains("`destination_cluster` action"),
            "{skipped:#?}"
        );
        assert!(
            skipped[1].starts_with("descriptor (header_match, gamma): no `rate_limits` entry"),
            "{skipped:#?}"
        );
    }

    #[test]
    fn fixed_value_siblings_follow_their_routes_not_overrides() {
        let envoy = "virtual_hosts:\n- name: v\n  domains: [\"*\"]\n  routes:\n  - match: {prefix: /a}\n    route: {rate_limits: [{actions: [{generic_key: {descriptor_value: a}}]}]}\n  - match: {prefix: /b}\n    route: {rate_limits: [{actions: [{generic_key: {descriptor_value: b}}]}]}\n";
        let config = "domain: d\ndescriptors:\n  - key: generic_key\n    rate_limit: {unit: second, requests_per_unit: 10}\n  - key: generic_key\n    value: b\n    rate_limit: {unit: second, requests_per_unit: 99}\n";
        let rules: Vec<_> = imported(config, Some(envoy), &Bindings::default())
            .rules
            .iter()
            .map(json)
            .collect();
        assert_eq!(rules.len(), 2, "{rules:#?}");
        assert_eq!(rules[0]["match"], serde_json::json!({"path_prefix": "/a"}));
        assert_eq!(rules[0]["limits"][0]["requests"], 10);
        assert_eq!(rules[1]["match"], serde_json::json!({"path_prefix": "/b"}));
        assert_eq!(rules[1]["limits"][0]["requests"], 99);
        assert!(
            rules
                .iter()
                .all(|r| r["key"] == "global" && r.get("overrides").is_none())
        );

        // Without the routes, both limits apply to every request, each as its own rule.
        let import = imported(config, None, &Bindings::default());
        assert_eq!(import.rules.len(), 2);
        assert!(
            import
                .notes
                .iter()
                .all(|n| n.contains("applies to every request")),
            "{:?}",
            import.notes
        );
    }

    #[test]
    fn rules_sluice_would_refuse_are_skipped_with_the_validators_words() {
        let import = import(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
            None,
            &headers(&[("k", "not a header")]),
        )
        .unwrap();
        assert!(import.rules.is_empty());
        assert!(
            import.skipped[0]
                .why
                .starts_with("the rule would be invalid: key.header:"),
            "{:?}",
            import.skipped
        );
    }

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

    #[test]
    fn unreadable_input_is_an_error_naming_the_file_kind() {
        let err = import("domain: [", None, &Bindings::default()).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("not a valid envoy-ratelimit configuration")
        );
        let err = import("domain: d", Some("{"), &Bindings::default()).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("not a valid Envoy configuration")
        );
    }
}
