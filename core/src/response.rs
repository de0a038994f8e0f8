//! What a client sees: rate-limit header fields and the problem+json denial body.
//!
//! Fields follow the IETF httpapi RateLimit header fields draft (draft-11 syntax):
//! `RateLimit-Policy: "name";q=100;w=60` lists every limit of the rule, and
//! `RateLimit: "name";r=0;t=12` describes the one closest to running out. The widely
//! used `X-RateLimit-Limit`, `-Remaining` and `-Reset` (delta seconds) carry the same
//! numbers. A rule's limits are named after the rule (`"api"`), or `"api/1"`, `"api/2"`
//! when it has several.

use std::fmt::Write as _;

use crate::gcra::ceil_seconds;
use crate::rule::Limit;
use crate::ruleset::Limited;

/// Header fields to add to a response, in order.
pub type HeaderList = Vec<(&'static str, String)>;

/// The `RateLimit*` and `X-RateLimit-*` fields describing `limited`.
pub fn rate_limit_headers(limited: &Limited<'_>, denied: bool) -> HeaderList {
    let mut headers = HeaderList::with_capacity(6);
    let name = &limited.rule.name;
    let mut policy = String::new();
    for (i, limit) in limited.limits.iter().enumerate() {
        if i > 0 {
            policy.push_str(", ");
        }
        write_policy_name(&mut policy, name, i, limited.limits.len());
        let _ = write!(policy, ";q={};w={}", limit.requests, limit.period_seconds);
    }
    headers.push(("ratelimit-policy", policy));

    let verdict = limited.verdict();
    let reset = if denied {
        retry_after_seconds(limited)
    } else {
        ceil_seconds(verdict.reset_ns)
    };
    let mut current = String::new();
    write_policy_name(&mut current, name, limited.tier.tier, limited.limits.len());
    let _ = write!(current, ";r={};t={}", verdict.remaining, reset);
    headers.push(("ratelimit", current));

    let quota = limited.limit().map_or(0, |l: &Limit| l.requests);
    headers.push(("x-ratelimit-limit", quota.to_string()));
    headers.push(("x-ratelimit-remaining", verdict.remaining.to_string()));
    headers.push(("x-ratelimit-reset", reset.to_string()));
    headers
}

/// `Retry-After` for a denial: whole seconds, rounded up, at least 1.
pub fn retry_after_seconds(limited: &Limited<'_>) -> u64 {
    ceil_seconds(limited.verdict().retry_after_ns).max(1)
}

fn write_policy_name(out: &mut String, rule: &str, tier: usize, tiers: usize) {
    // Rule names are validated to a header-safe alphabet, so no escaping is needed.
    out.push('"');
    out.push_str(rule);
    if tiers > 1 {
        let _ = write!(out, "/{}", tier + 1);
    }
    out.push('"');
}

/// The `application/problem+json` body of a denial (RFC 9457).
pub fn problem_body(limited: &Limited<'_>, status: u16) -> String {
    let retry_after = retry_after_seconds(limited);
    let limit = limited.limit();
    let (requests, period) = limit.map_or((0, 0), |l| (l.requests, l.period_seconds));
    serde_json::json!({
        "type": "urn:sluice:rate-limited",
        "title": "Too Many Requests",
        "status": status,
        "detail": format!(
            "Rate limit '{}' ({requests} requests per {period} s) is exhausted; retry in {retry_after} s.",
            limited.rule.name
        ),
        "rule": limited.rule.name,
        "retry_after": retry_after,
    })
    .to_string()
}

/// The body for a fail-closed rule that could not be evaluated.
pub fn failed_closed_body(rule: &str, status: u16) -> String {
    serde_json::json!({
        "type": "urn:sluice:unavailable",
        "title": "Rate limit unavailable",
        "status": status,
        "detail": format!("Rate limit '{rule}' could not be checked and is configured to fail closed."),
        "rule": rule,
    })
    .to_string()
}
