//! The ratelimit service's configuration as that service reads it, and every limit in
//! its descriptor tree as the path of `(key, value?)` entries that selects it.

use std::collections::BTreeMap;

use serde::Deserialize;
use sluice_core::rule::MAX_REQUESTS;

use super::report::{ImportError, Skipped};

/// The ratelimit service's configuration file.
#[derive(Debug, Deserialize)]
pub(super) struct RatelimitConfig {
    pub(super) domain: String,
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
    /// Over the limit still answers `OK`, and says so in dynamic metadata: Sluice's
    /// shadow mode.
    #[serde(default)]
    quota_mode: bool,
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
    replaces: Vec<Replaces>,
    #[serde(flatten)]
    unknown: BTreeMap<String, serde_json::Value>,
}

/// One entry of `replaces`.
#[derive(Debug, Deserialize)]
struct Replaces {
    name: String,
}

/// Reads the configuration (YAML, as that service reads it).
pub(super) fn parse(text: &str) -> Result<RatelimitConfig, ImportError> {
    serde_norway::from_str(text).map_err(|e| ImportError::Config(e.to_string()))
}

/// One `(key, value?)` pair of a descriptor.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Entry {
    pub(super) key: String,
    pub(super) value: Option<String>,
}

/// A limit in the tree: the descriptor that selects it and what it allows.
#[derive(Debug)]
pub(super) struct LimitAt {
    pub(super) path: Vec<Entry>,
    pub(super) allowance: Allowance,
    /// `shadow_mode` or `quota_mode`: over the limit still answers `OK`.
    pub(super) shadow: bool,
    pub(super) name: Option<String>,
    /// The `name`s of the limits this one replaces.
    pub(super) replaces: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Allowance {
    Limited {
        requests: u64,
        period_seconds: u64,
    },
    Unlimited,
    /// `requests_per_unit: 0`: every request is over the limit.
    Deny,
}

impl Entry {
    /// The prefix of a wildcard value (`abc*` matches values starting with `abc`).
    pub(super) fn wildcard(&self) -> Option<&str> {
        self.value.as_deref().and_then(|v| v.strip_suffix('*'))
    }
}

impl LimitAt {
    /// Why the wasm filter's conversion cannot carry this limit (the rate limit service's
    /// can): a wildcard value, a limit of 0, `replaces`.
    pub(super) fn beyond_the_filter(&self) -> Option<String> {
        if let Some(e) = self.path.iter().find(|e| e.wildcard().is_some()) {
            return Some(format!(
                "the wildcard value `{}` matches by prefix, which a filter rule's client key cannot; import with `--for rls`",
                e.value.as_deref().unwrap_or_default()
            ));
        }
        if self.allowance == Allowance::Deny {
            return Some(
                "a limit of 0 denies every request, which a filter rule cannot; import with `--for rls`"
                    .into(),
            );
        }
        if !self.replaces.is_empty() {
            return Some(
                "`replaces` drops another limit within one request's descriptors, which the filter has not; import with `--for rls`"
                    .into(),
            );
        }
        None
    }
}

/// Every descriptor in the configuration with a `rate_limit`, in the order of the file,
/// skipping (with a reason) what cannot be a Sluice limit.
pub(super) fn limits(config: &RatelimitConfig, skipped: &mut Vec<Skipped>) -> Vec<LimitAt> {
    let mut out = Vec::new();
    collect_limits(&config.descriptors, &[], &mut out, skipped);
    out
}

/// Walks one level of the tree, then the levels below it.
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
        unknown_fields(&path, "", &d.unknown, skipped);
        if let Some(limit) = &d.rate_limit {
            match allowance(limit) {
                Ok(allowance) => {
                    unknown_fields(&path, "rate_limit.", &limit.unknown, skipped);
                    out.push(LimitAt {
                        path: path.clone(),
                        allowance,
                        shadow: d.shadow_mode || d.quota_mode,
                        name: limit.name.clone().filter(|n| !n.is_empty()),
                        replaces: limit.replaces.iter().map(|r| r.name.clone()).collect(),
                    });
                }
                Err(why) => skipped.push(skipped_at(&path, why)),
            }
        }
        collect_limits(&d.descriptors, &path, out, skipped);
    }
}

/// Fields of newer ratelimit versions (or typos), each reported as ignored.
fn unknown_fields(
    path: &[Entry],
    prefix: &str,
    fields: &BTreeMap<String, serde_json::Value>,
    skipped: &mut Vec<Skipped>,
) {
    for field in fields.keys() {
        skipped.push(Skipped {
            what: format!("{}: `{prefix}{field}`", describe(path)),
            why: "not a field this importer knows; ignored".into(),
        });
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
        Some(0) => Ok(Allowance::Deny),
        Some(requests) if requests > MAX_REQUESTS => Err(format!(
            "{requests} requests per unit is over Sluice's {MAX_REQUESTS}"
        )),
        Some(requests) => Ok(Allowance::Limited {
            requests,
            period_seconds,
        }),
    }
}

/// `(key, value), (key)` as ratelimit's documentation writes descriptors.
pub(super) fn describe(path: &[Entry]) -> String {
    let entries: Vec<String> = path
        .iter()
        .map(|e| match &e.value {
            Some(v) => format!("({}, {v})", e.key),
            None => format!("({})", e.key),
        })
        .collect();
    format!("descriptor {}", entries.join(", "))
}

/// The descriptor at `path` was left out, and why.
pub(super) fn skipped_at(path: &[Entry], why: impl Into<String>) -> Skipped {
    Skipped {
        what: describe(path),
        why: why.into(),
    }
}
