//! Which requests produce which descriptor. From the Envoy configuration: every
//! `rate_limits` entry of its virtual hosts and routes, with the route's match, is a
//! [`Site`] whose actions say where each descriptor key's value comes from. Without it:
//! [`Bindings`], the conventions (`remote_address`, `generic_key`) and `--header` flags.

use std::collections::{BTreeMap, BTreeSet};

use sluice_core::spec::{HeaderMatchSpec, MatchSpec};

use super::config::Entry;
use super::report::{Import, ImportError, Skipped};

/// How descriptor keys map to requests when no Envoy configuration is given.
#[derive(Debug, Clone, Default)]
pub struct Bindings {
    /// Descriptor key → request header (`--header KEY=NAME`), as a `request_headers` action.
    pub headers: BTreeMap<String, String>,
    /// `X-Forwarded-For` hops to trust for `remote_address`.
    pub trusted_hops: u32,
}

/// Where a descriptor key's value comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Source {
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
pub(super) struct Chain {
    pub(super) route: MatchSpec,
    /// Where the route is, for descriptions (`virtual host api, route /slow`).
    pub(super) place: Option<String>,
    pub(super) sources: Vec<Source>,
}

impl Bindings {
    /// The sources of `path`'s keys by convention and `--header` flags, or why a key has
    /// none.
    pub(super) fn chain(&self, path: &[Entry]) -> Result<Chain, String> {
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
pub(super) struct Site {
    route: MatchSpec,
    place: String,
    actions: Vec<(String, Source)>,
}

impl Site {
    /// Whether this entry produces descriptors of `path`'s keys, with the fixed values
    /// `path` names.
    pub(super) fn produces(&self, path: &[Entry]) -> bool {
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

    pub(super) fn chain(&self) -> Chain {
        Chain {
            route: self.route.clone(),
            place: Some(self.place.clone()),
            sources: self.actions.iter().map(|(_, s)| s.clone()).collect(),
        }
    }
}

/// Reads an Envoy configuration (YAML or JSON: a bootstrap, a listener or a route
/// configuration) and finds its `rate_limits` entries, noting when there is none.
pub(super) fn envoy_sites(text: &str, out: &mut Import) -> Result<Vec<Site>, ImportError> {
    let document: serde_json::Value =
        serde_norway::from_str(text).map_err(|e| ImportError::Envoy(e.to_string()))?;
    let sites = sites_in(&document, &mut out.skipped);
    if sites.is_empty() {
        out.notes.push(
            "the Envoy configuration has no usable `rate_limits` actions, so no limit applies to any request".into(),
        );
    }
    Ok(sites)
}

/// Finds every `rate_limits` entry in an Envoy configuration: on virtual hosts (all their
/// routes) and on routes (`route.rate_limits`, with the route's match).
fn sites_in(document: &serde_json::Value, skipped: &mut Vec<Skipped>) -> Vec<Site> {
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
