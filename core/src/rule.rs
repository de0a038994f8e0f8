//! Validated rules: built once from a [`RuleSpec`] at the edge, then trusted.
//!
//! `Rule::try_from(spec)` checks every field and reports *all* problems with the field
//! path (`limits[1].requests`), so an API client or an operator editing a file sees the
//! whole list at once. A `Rule` cannot hold a zero rate, an unparsable regex or an
//! unknown period: later code never re-checks.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::num::NonZeroU64;

use regex::Regex;

use crate::gcra::{Gcra, GcraError, NANOS_PER_SECOND};
use crate::request::RequestAttributes;
use crate::spec::{
    CostSpec, FailureMode, GrpcStatus, HeaderMatchSpec, KeySpec, LimitSpec, MatchSpec, Mode,
    OverrideSpec, RuleSpec,
};

/// Most limits (tiers) one rule or override may have.
pub const MAX_LIMITS_PER_RULE: usize = 8;
/// Largest `requests` or `burst`.
pub const MAX_REQUESTS: u64 = 1_000_000_000;
/// Longest period: a year.
pub const MAX_PERIOD_SECONDS: u64 = 366 * 86_400;
/// Most per-client overrides on one rule.
pub const MAX_OVERRIDES: usize = 10_000;
/// Largest fixed or header-given cost.
pub const MAX_COST: u64 = 1_000_000;
/// Longest regular expression source accepted.
const MAX_REGEX_LEN: usize = 1_024;
/// Compiled size limit for one regular expression, so one rule cannot bloat every worker.
const REGEX_SIZE_LIMIT: usize = 256 * 1024;

/// One problem with one field: `limits[0].requests`, `rules[2].name`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

/// Every problem found in a rule or ruleset. Never empty.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ValidationErrors(pub Vec<FieldError>);

impl fmt::Display for ValidationErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{}: {}", e.field, e.message)?;
        }
        Ok(())
    }
}

/// Collects field errors under a path prefix while a spec is checked.
#[derive(Debug, Default)]
pub(crate) struct Problems {
    errors: Vec<FieldError>,
}

impl Problems {
    pub(crate) fn add(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.errors.push(FieldError {
            field: field.into(),
            message: message.into(),
        });
    }

    /// Adds another set of errors with their fields prefixed by `prefix`.
    pub(crate) fn nest(&mut self, prefix: &str, inner: ValidationErrors) {
        for e in inner.0 {
            self.add(format!("{prefix}.{}", e.field), e.message);
        }
    }

    /// Adds errors whose fields are already complete paths; returns them unchanged for
    /// `map_err` chains.
    pub(crate) fn nest_top(&mut self, inner: ValidationErrors) -> ValidationErrors {
        self.errors.extend(inner.0.iter().cloned());
        inner
    }

    pub(crate) fn into_errors(self) -> ValidationErrors {
        ValidationErrors(self.errors)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.errors.is_empty()
    }

    pub(crate) fn finish<T>(self, value: impl FnOnce() -> T) -> Result<T, ValidationErrors> {
        if self.errors.is_empty() {
            Ok(value())
        } else {
            Err(ValidationErrors(self.errors))
        }
    }
}

/// One validated token bucket of a rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    pub requests: u64,
    pub period_seconds: u64,
    pub burst: u64,
    pub gcra: Gcra,
    /// Identifies this bucket inside a slot: a hash of the rule id and the limit's own
    /// parameters, so editing one limit resets only that limit's buckets.
    pub identity: u64,
    /// One bucket per client for the whole fleet (kept in the lease table, not in a slot).
    pub global: bool,
}

impl Limit {
    fn build(
        rule_id: &str,
        spec: &LimitSpec,
        field: &str,
        problems: &mut Problems,
    ) -> Option<Limit> {
        let requests = spec.requests;
        let period_seconds = spec.period.seconds();
        let burst = spec.burst.unwrap_or(requests);
        let mut ok = true;
        if requests == 0 || requests > MAX_REQUESTS {
            problems.add(
                format!("{field}.requests"),
                format!("must be between 1 and {MAX_REQUESTS}"),
            );
            ok = false;
        }
        if period_seconds == 0 || period_seconds > MAX_PERIOD_SECONDS {
            problems.add(
                format!("{field}.period"),
                format!(
                    "must be second, minute, hour, day or a number of seconds from 1 to {MAX_PERIOD_SECONDS}"
                ),
            );
            ok = false;
        }
        if spec.burst.is_some() && (burst == 0 || burst > MAX_REQUESTS) {
            problems.add(
                format!("{field}.burst"),
                format!("must be between 1 and {MAX_REQUESTS}"),
            );
            ok = false;
        }
        if !ok {
            return None;
        }
        let gcra = match Gcra::new(
            NonZeroU64::new(requests)?,
            NonZeroU64::new(period_seconds * NANOS_PER_SECOND)?,
            NonZeroU64::new(burst)?,
        ) {
            Ok(g) => g,
            Err(e @ (GcraError::TooFast | GcraError::CapacityTooLarge)) => {
                problems.add(field.to_string(), e.to_string());
                return None;
            }
        };
        let identity = crate::hash::limit_identity(rule_id, requests, period_seconds, burst);
        Some(Limit {
            requests,
            period_seconds,
            burst,
            gcra,
            identity,
            global: spec.scope == crate::spec::Scope::Global,
        })
    }

    fn build_all(
        rule_id: &str,
        specs: &[LimitSpec],
        field: &str,
        problems: &mut Problems,
    ) -> Vec<Limit> {
        if specs.is_empty() {
            problems.add(field, "at least one limit is required");
        }
        if specs.len() > MAX_LIMITS_PER_RULE {
            problems.add(
                field,
                format!("at most {MAX_LIMITS_PER_RULE} limits are allowed"),
            );
        }
        let limits: Vec<Limit> = specs
            .iter()
            .enumerate()
            .filter_map(|(i, s)| Limit::build(rule_id, s, &format!("{field}[{i}]"), problems))
            .collect();
        for (i, a) in limits.iter().enumerate() {
            if limits.iter().take(i).any(|b| b.identity == a.identity) {
                problems.add(format!("{field}[{i}]"), "duplicates an earlier limit");
            }
        }
        limits
    }
}

/// Which requests a rule applies to, compiled for the request path.
#[derive(Debug, Clone)]
pub struct RequestMatcher {
    host: Option<HostPattern>,
    path_exact: Option<String>,
    path_prefix: Option<String>,
    path_regex: Option<Regex>,
    methods: Vec<String>,
    headers: Vec<HeaderCondition>,
}

#[derive(Debug, Clone)]
enum HostPattern {
    Exact(String),
    /// `*.example.com` stored as `.example.com`.
    Suffix(String),
}

#[derive(Debug, Clone)]
enum HeaderCondition {
    Present(String),
    Absent(String),
    Equals(String, String),
}

impl RequestMatcher {
    fn build(spec: &MatchSpec, problems: &mut Problems) -> RequestMatcher {
        let host = spec.host.as_ref().and_then(|h| {
            let h = h.to_ascii_lowercase();
            let bare = h.strip_prefix("*.").unwrap_or(&h);
            if bare.is_empty() || bare.contains('*') || bare.contains('/') || bare.contains(' ') {
                problems.add(
                    "match.host",
                    "must be a host name like api.example.com or *.example.com",
                );
                return None;
            }
            Some(match h.strip_prefix('*') {
                Some(suffix) => HostPattern::Suffix(suffix.to_string()),
                None => HostPattern::Exact(h),
            })
        });
        for (field, value) in [
            ("match.path_exact", &spec.path_exact),
            ("match.path_prefix", &spec.path_prefix),
        ] {
            if value.as_ref().is_some_and(|p| !p.starts_with('/')) {
                problems.add(field, "must start with /");
            }
        }
        let path_regex = spec.path_regex.as_ref().and_then(|source| {
            if source.len() > MAX_REGEX_LEN {
                problems.add(
                    "match.path_regex",
                    format!("is longer than {MAX_REGEX_LEN} characters"),
                );
                return None;
            }
            // Anchored: the expression must match the whole path, as Envoy's safe_regex does.
            regex::RegexBuilder::new(&format!("^(?:{source})$"))
                .size_limit(REGEX_SIZE_LIMIT)
                .build()
                .map_err(|e| {
                    problems.add(
                        "match.path_regex",
                        format!("is not a valid regular expression: {e}"),
                    )
                })
                .ok()
        });
        let mut methods = Vec::new();
        for (i, m) in spec.methods.iter().enumerate() {
            if m.is_empty() || !m.bytes().all(|b| b.is_ascii_alphabetic()) {
                problems.add(
                    format!("match.methods[{i}]"),
                    "must be an HTTP method such as GET",
                );
            } else {
                methods.push(m.to_ascii_uppercase());
            }
        }
        let mut headers = Vec::new();
        for (i, h) in spec.headers.iter().enumerate() {
            let field = format!("match.headers[{i}]");
            if let Some(condition) = HeaderCondition::build(h, &field, problems) {
                headers.push(condition);
            }
        }
        RequestMatcher {
            host,
            path_exact: spec.path_exact.clone(),
            path_prefix: spec.path_prefix.clone(),
            path_regex,
            methods,
            headers,
        }
    }

    pub(crate) fn add_needs(&self, needs: &mut crate::ruleset::RequestNeeds) {
        needs.authority |= self.host.is_some();
        needs.path |=
            self.path_exact.is_some() || self.path_prefix.is_some() || self.path_regex.is_some();
        needs.method |= !self.methods.is_empty();
        for condition in &self.headers {
            match condition {
                HeaderCondition::Present(n)
                | HeaderCondition::Absent(n)
                | HeaderCondition::Equals(n, _) => needs.header(n),
            }
        }
    }

    /// Whether every condition holds for `request`.
    pub fn matches(&self, request: &impl RequestAttributes) -> bool {
        if let Some(host) = &self.host {
            let actual = request.host();
            let ok = match host {
                HostPattern::Exact(h) => actual.eq_ignore_ascii_case(h),
                HostPattern::Suffix(s) => {
                    // Compared as bytes: a client-sent host may hold multi-byte
                    // characters, and slicing a str inside one would panic.
                    let tail = actual.len().checked_sub(s.len()).filter(|&start| start > 0);
                    tail.and_then(|start| actual.as_bytes().get(start..))
                        .is_some_and(|t| t.eq_ignore_ascii_case(s.as_bytes()))
                }
            };
            if !ok {
                return false;
            }
        }
        let path = request.path_only();
        if self.path_exact.as_deref().is_some_and(|p| p != path)
            || self
                .path_prefix
                .as_deref()
                .is_some_and(|p| !path.starts_with(p))
            || self.path_regex.as_ref().is_some_and(|r| !r.is_match(path))
        {
            return false;
        }
        if !self.methods.is_empty() && !self.methods.iter().any(|m| m == request.method()) {
            return false;
        }
        self.headers.iter().all(|c| match c {
            HeaderCondition::Present(n) => request.header(n).is_some(),
            HeaderCondition::Absent(n) => request.header(n).is_none(),
            HeaderCondition::Equals(n, v) => request.header(n) == Some(v.as_str()),
        })
    }
}

impl HeaderCondition {
    fn build(
        spec: &HeaderMatchSpec,
        field: &str,
        problems: &mut Problems,
    ) -> Option<HeaderCondition> {
        let name = spec.name.to_ascii_lowercase();
        if !is_header_name(&name) {
            problems.add(format!("{field}.name"), "must be a header name");
            return None;
        }
        match (spec.present, &spec.equals) {
            (None, Some(v)) | (Some(true), Some(v)) => {
                Some(HeaderCondition::Equals(name, v.clone()))
            }
            (Some(true), None) => Some(HeaderCondition::Present(name)),
            (Some(false), None) => Some(HeaderCondition::Absent(name)),
            (None, None) => {
                problems.add(field, "needs `present` or `equals`");
                None
            }
            (Some(false), Some(_)) => {
                problems.add(field, "`present: false` cannot be combined with `equals`");
                None
            }
        }
    }
}

fn is_header_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 256
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.!#$%&'*+^`|~".contains(&b))
}

/// How a rule finds whose bucket a request draws from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientKey {
    Header(String),
    ClientIp { trusted_hops: u32 },
    Query(String),
    Path,
    Global,
    Composite(Vec<ClientKey>),
}

/// Separates the parts of a composite key. Override `client` values use it too.
pub const COMPOSITE_SEPARATOR: char = '|';

impl ClientKey {
    fn build(
        spec: &KeySpec,
        field: &str,
        nested: bool,
        problems: &mut Problems,
    ) -> Option<ClientKey> {
        match spec {
            KeySpec::Header(name) => {
                let name = name.to_ascii_lowercase();
                if is_header_name(&name) {
                    Some(ClientKey::Header(name))
                } else {
                    problems.add(format!("{field}.header"), "must be a header name");
                    None
                }
            }
            KeySpec::ClientIp(ip) => {
                if ip.trusted_hops > 16 {
                    problems.add(
                        format!("{field}.client_ip.trusted_hops"),
                        "must be at most 16",
                    );
                    return None;
                }
                Some(ClientKey::ClientIp {
                    trusted_hops: ip.trusted_hops,
                })
            }
            KeySpec::Query(name) => {
                if name.is_empty() || name.len() > 256 {
                    problems.add(format!("{field}.query"), "must be a query parameter name");
                    return None;
                }
                Some(ClientKey::Query(name.clone()))
            }
            KeySpec::Path => Some(ClientKey::Path),
            KeySpec::Global => {
                if nested {
                    problems.add(field, "`global` cannot be part of a composite key");
                    return None;
                }
                Some(ClientKey::Global)
            }
            KeySpec::Composite(parts) => {
                if nested {
                    problems.add(field, "composite keys cannot be nested");
                    return None;
                }
                if !(2..=4).contains(&parts.len()) {
                    problems.add(format!("{field}.composite"), "must have 2 to 4 parts");
                    return None;
                }
                let built: Vec<ClientKey> = parts
                    .iter()
                    .enumerate()
                    .filter_map(|(i, p)| {
                        ClientKey::build(p, &format!("{field}.composite[{i}]"), true, problems)
                    })
                    .collect();
                (built.len() == parts.len()).then_some(ClientKey::Composite(built))
            }
        }
    }

    pub(crate) fn add_needs(&self, needs: &mut crate::ruleset::RequestNeeds) {
        match self {
            ClientKey::Header(name) => needs.header(name),
            ClientKey::ClientIp { trusted_hops } => {
                needs.peer_ip = true;
                if *trusted_hops > 0 {
                    needs.header("x-forwarded-for");
                }
            }
            ClientKey::Query(_) | ClientKey::Path => needs.path = true,
            ClientKey::Global => {}
            ClientKey::Composite(parts) => parts.iter().for_each(|p| p.add_needs(needs)),
        }
    }

    /// The client's key for this request, or `None` when the request does not carry one
    /// (the rule then does not apply to it).
    pub fn extract<'r>(&self, request: &'r impl RequestAttributes) -> Option<Cow<'r, str>> {
        match self {
            ClientKey::Header(name) => request.header(name).map(Cow::Borrowed),
            ClientKey::ClientIp { trusted_hops } => client_ip(request, *trusted_hops),
            ClientKey::Query(name) => form_urlencoded::parse(request.query().as_bytes())
                .find(|(k, _)| k == name)
                .map(|(_, v)| Cow::Owned(v.into_owned())),
            ClientKey::Path => Some(Cow::Borrowed(request.path_only())),
            ClientKey::Global => Some(Cow::Borrowed("")),
            ClientKey::Composite(parts) => {
                let mut key = String::new();
                for (i, part) in parts.iter().enumerate() {
                    if i > 0 {
                        key.push(COMPOSITE_SEPARATOR);
                    }
                    key.push_str(&part.extract(request)?);
                }
                Some(Cow::Owned(key))
            }
        }
    }
}

/// The client address after `trusted_hops` proxies that each appended to
/// `X-Forwarded-For`: the Nth entry from the right, or the leftmost when the header is
/// shorter (the request passed fewer proxies), or the TCP peer when there is none.
fn client_ip<'r>(request: &'r impl RequestAttributes, trusted_hops: u32) -> Option<Cow<'r, str>> {
    if trusted_hops > 0 {
        if let Some(xff) = request.header("x-forwarded-for") {
            let hops = trusted_hops as usize;
            let entry = xff
                .rsplit(',')
                .map(str::trim)
                .filter(|e| !e.is_empty())
                .take(hops)
                .last();
            if let Some(entry) = entry {
                return Some(Cow::Borrowed(entry));
            }
        }
    }
    request.peer_ip().map(|ip| Cow::Owned(ip.to_string()))
}

/// How many tokens a request takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cost {
    Fixed(u64),
    Header {
        name: String,
        max: u64,
        default: u64,
    },
}

impl Cost {
    fn build(spec: &CostSpec, problems: &mut Problems) -> Option<Cost> {
        match spec {
            CostSpec::Fixed(n) if (1..=MAX_COST).contains(n) => Some(Cost::Fixed(*n)),
            CostSpec::Fixed(_) => {
                problems.add("cost.fixed", format!("must be between 1 and {MAX_COST}"));
                None
            }
            CostSpec::Header(h) => {
                let name = h.name.to_ascii_lowercase();
                let mut ok = true;
                if !is_header_name(&name) {
                    problems.add("cost.header.name", "must be a header name");
                    ok = false;
                }
                if !(1..=MAX_COST).contains(&h.max) {
                    problems.add(
                        "cost.header.max",
                        format!("must be between 1 and {MAX_COST}"),
                    );
                    ok = false;
                }
                if h.default > h.max {
                    problems.add("cost.header.default", "must not exceed max");
                    ok = false;
                }
                ok.then_some(Cost::Header {
                    name,
                    max: h.max,
                    default: h.default,
                })
            }
        }
    }

    pub(crate) fn add_needs(&self, needs: &mut crate::ruleset::RequestNeeds) {
        if let Cost::Header { name, .. } = self {
            needs.header(name);
        }
    }

    /// The cost of this request. A header value that is not a whole number costs the
    /// default; one above `max` costs `max`.
    pub fn of(&self, request: &impl RequestAttributes) -> u64 {
        match self {
            Cost::Fixed(n) => *n,
            Cost::Header { name, max, default } => request
                .header(name)
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map_or(*default, |c| c.min(*max)),
        }
    }
}

/// The validated form of a [`RuleSpec`].
#[derive(Debug, Clone)]
pub struct Rule {
    pub id: String,
    pub name: String,
    pub enabled: bool,
    pub priority: i32,
    pub mode: Mode,
    pub matcher: RequestMatcher,
    pub key: ClientKey,
    pub limits: Vec<Limit>,
    pub cost: Cost,
    pub overrides: HashMap<String, Vec<Limit>>,
    /// `None` follows the proxy's default failure mode.
    pub failure_mode: Option<FailureMode>,
    pub status: u16,
    pub rate_limit_headers: bool,
    /// What a denied gRPC call gets in `grpc-status`.
    pub grpc_status: GrpcStatus,
    /// The spec this rule was built from, kept for export and diffs.
    pub spec: RuleSpec,
}

impl TryFrom<RuleSpec> for Rule {
    type Error = ValidationErrors;

    fn try_from(spec: RuleSpec) -> Result<Self, Self::Error> {
        let mut problems = Problems::default();
        check_identifier(&spec.name, "name", 64, &mut problems);
        let id = spec.id.clone().unwrap_or_else(|| spec.name.clone());
        if spec.id.is_some() {
            check_identifier(&id, "id", 128, &mut problems);
        }
        if spec.description.len() > 1_024 {
            problems.add("description", "must be at most 1024 characters");
        }
        if !(400..=599).contains(&spec.response.status) {
            problems.add(
                "response.status",
                "must be an HTTP error status from 400 to 599",
            );
        }
        let matcher = RequestMatcher::build(&spec.matcher, &mut problems);
        let key = ClientKey::build(&spec.key, "key", false, &mut problems);
        let limits = Limit::build_all(&id, &spec.limits, "limits", &mut problems);
        let cost = Cost::build(&spec.cost, &mut problems);
        let overrides = build_overrides(&id, &spec.overrides, &mut problems);
        let (Some(key), Some(cost)) = (key, cost) else {
            // Building either one failed, and that recorded why.
            return Err(problems.into_errors());
        };
        problems.finish(|| Rule {
            id,
            name: spec.name.clone(),
            enabled: spec.enabled,
            priority: spec.priority,
            mode: spec.mode,
            matcher,
            key,
            limits,
            cost,
            overrides,
            failure_mode: spec.failure_mode,
            status: spec.response.status,
            rate_limit_headers: spec.response.rate_limit_headers,
            grpc_status: spec.response.grpc_status,
            spec,
        })
    }
}

fn build_overrides(
    rule_id: &str,
    specs: &[OverrideSpec],
    problems: &mut Problems,
) -> HashMap<String, Vec<Limit>> {
    if specs.len() > MAX_OVERRIDES {
        problems.add(
            "overrides",
            format!("at most {MAX_OVERRIDES} overrides are allowed"),
        );
    }
    let mut overrides = HashMap::with_capacity(specs.len());
    for (i, o) in specs.iter().enumerate() {
        let field = format!("overrides[{i}]");
        if o.client.is_empty() || o.client.len() > 1_024 {
            problems.add(format!("{field}.client"), "must be 1 to 1024 characters");
        }
        let limits = Limit::build_all(rule_id, &o.limits, &format!("{field}.limits"), problems);
        if overrides.insert(o.client.clone(), limits).is_some() {
            problems.add(
                format!("{field}.client"),
                format!("`{}` already has an override", o.client),
            );
        }
    }
    overrides
}

/// Names and ids appear in response headers as structured-field strings and in URLs, so
/// they are restricted to a safe alphabet.
fn check_identifier(value: &str, field: &str, max_len: usize, problems: &mut Problems) {
    let valid_start = value
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_alphanumeric());
    let valid_chars = value
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    if !valid_start || !valid_chars || value.len() > max_len {
        problems.add(
            field,
            format!(
                "must be 1 to {max_len} characters of letters, digits, '-', '_' or '.', starting with a letter or digit"
            ),
        );
    }
}

impl Rule {
    /// The limits that apply to `client`: its override, or the rule's own.
    pub fn limits_for(&self, client: &str) -> &[Limit] {
        self.overrides
            .get(client)
            .map_or(&self.limits, Vec::as_slice)
    }

    /// The failure mode in force, given the proxy's default.
    pub fn failure_mode_or(&self, default: FailureMode) -> FailureMode {
        self.failure_mode.unwrap_or(default)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::HttpRequest;

    pub(crate) fn rule(json: &str) -> Rule {
        let spec: RuleSpec = serde_json::from_str(json).unwrap();
        Rule::try_from(spec).unwrap()
    }

    fn errors(json: &str) -> Vec<String> {
        let spec: RuleSpec = serde_json::from_str(json).unwrap();
        Rule::try_from(spec)
            .unwrap_err()
            .0
            .into_iter()
            .map(|e| format!("{}: {}", e.field, e.message))
            .collect()
    }

    const EXAMPLE: &str = r#"{"name":"api-per-key","match":{"path_prefix":"/api/"},"key":{"header":"x-api-key"},"limits":[{"requests":5,"period":"second","burst":10},{"requests":100,"period":"minute"}],"mode":"enforce"}"#;

    #[test]
    fn the_documented_example_is_valid() {
        let r = rule(EXAMPLE);
        assert_eq!(r.id, "api-per-key");
        assert_eq!(r.limits.len(), 2);
        assert_eq!(
            (
                r.limits[0].requests,
                r.limits[0].period_seconds,
                r.limits[0].burst
            ),
            (5, 1, 10)
        );
        assert_eq!(
            (
                r.limits[1].requests,
                r.limits[1].period_seconds,
                r.limits[1].burst
            ),
            (100, 60, 100)
        );
        assert_eq!(r.key, ClientKey::Header("x-api-key".into()));
        assert!(r.matcher.matches(&HttpRequest::get("/api/x")));
        assert!(!r.matcher.matches(&HttpRequest::get("/other")));
    }

    #[test]
    fn every_problem_is_reported_with_its_field() {
        let errs = errors(
            r#"{"name":"bad name!","key":{"header":""},"limits":[{"requests":0,"period":0},{"requests":1,"period":"second","burst":0}],
                "match":{"path_regex":"(unclosed","path_prefix":"api"},"response":{"status":200}}"#,
        );
        let fields: Vec<&str> = errs.iter().map(|e| e.split(':').next().unwrap()).collect();
        assert_eq!(
            fields,
            [
                "name",
                "response.status",
                "match.path_prefix",
                "match.path_regex",
                "key.header",
                "limits[0].requests",
                "limits[0].period",
                "limits[1].burst"
            ],
            "{errs:#?}"
        );
    }

    #[test]
    fn unknown_fields_and_periods_are_rejected_by_the_shape() {
        assert!(
            serde_json::from_str::<RuleSpec>(
                r#"{"name":"a","key":"global","limits":[],"colour":1}"#
            )
            .is_err()
        );
        assert!(
            serde_json::from_str::<RuleSpec>(
                r#"{"name":"a","key":"global","limits":[{"requests":1,"period":"fortnight"}]}"#
            )
            .is_err()
        );
    }

    #[test]
    fn empty_and_duplicate_limits_are_rejected() {
        assert_eq!(
            errors(r#"{"name":"a","key":"global","limits":[]}"#),
            ["limits: at least one limit is required"]
        );
        assert_eq!(
            errors(
                r#"{"name":"a","key":"global","limits":[{"requests":1,"period":60},{"requests":1,"period":"minute"}]}"#
            ),
            ["limits[1]: duplicates an earlier limit"]
        );
    }

    #[test]
    fn matchers_combine_host_path_method_and_headers() {
        let r = rule(
            r#"{"name":"m","key":"global","limits":[{"requests":1,"period":1}],
                "match":{"host":"*.example.com","path_regex":"/v[0-9]+/items","methods":["post"],
                         "headers":[{"name":"X-Tier","equals":"free"},{"name":"x-internal","present":false}]}}"#,
        );
        let base = HttpRequest {
            method: "POST".into(),
            authority: "api.Example.com:443".into(),
            path: "/v2/items?page=3".into(),
            headers: vec![("x-tier".into(), "free".into())],
            peer_ip: None,
        };
        assert!(r.matcher.matches(&base));
        let mut other_host = base.clone();
        other_host.authority = "example.com".into();
        assert!(
            !r.matcher.matches(&other_host),
            "the bare domain is not a subdomain"
        );
        let mut longer_path = base.clone();
        longer_path.path = "/v2/items/7".into();
        assert!(
            !r.matcher.matches(&longer_path),
            "regexes match the whole path"
        );
        let mut get = base.clone();
        get.method = "GET".into();
        assert!(!r.matcher.matches(&get));
        assert!(
            !r.matcher
                .matches(&base.clone().with_header("x-internal", "1"))
        );
        let mut paid = base.clone();
        paid.headers[0].1 = "paid".into();
        assert!(!r.matcher.matches(&paid));
    }

    #[test]
    fn client_keys_come_from_headers_ips_queries_paths_and_composites() {
        let request = HttpRequest {
            path: "/p/q?api_key=k%201&x=2".into(),
            headers: vec![
                ("x-api-key".into(), "alice".into()),
                (
                    "x-forwarded-for".into(),
                    "203.0.113.9, 10.0.0.2 , 10.0.0.1".into(),
                ),
            ],
            peer_ip: Some("192.0.2.1".parse().unwrap()),
            ..HttpRequest::get("/")
        };
        let key = |k: ClientKey| k.extract(&request).map(Cow::into_owned);
        assert_eq!(
            key(ClientKey::Header("x-api-key".into())).as_deref(),
            Some("alice")
        );
        assert_eq!(key(ClientKey::Header("x-missing".into())), None);
        assert_eq!(
            key(ClientKey::ClientIp { trusted_hops: 0 }).as_deref(),
            Some("192.0.2.1")
        );
        assert_eq!(
            key(ClientKey::ClientIp { trusted_hops: 1 }).as_deref(),
            Some("10.0.0.1")
        );
        assert_eq!(
            key(ClientKey::ClientIp { trusted_hops: 3 }).as_deref(),
            Some("203.0.113.9")
        );
        assert_eq!(
            key(ClientKey::ClientIp { trusted_hops: 9 }).as_deref(),
            Some("203.0.113.9")
        );
        assert_eq!(
            key(ClientKey::Query("api_key".into())).as_deref(),
            Some("k 1")
        );
        assert_eq!(key(ClientKey::Path).as_deref(), Some("/p/q"));
        assert_eq!(key(ClientKey::Global).as_deref(), Some(""));
        let composite =
            ClientKey::Composite(vec![ClientKey::Header("x-api-key".into()), ClientKey::Path]);
        assert_eq!(key(composite).as_deref(), Some("alice|/p/q"));
        let broken = ClientKey::Composite(vec![
            ClientKey::Header("x-api-key".into()),
            ClientKey::Query("nope".into()),
        ]);
        assert_eq!(key(broken), None);
    }

    #[test]
    fn header_costs_are_capped_and_default_when_unreadable() {
        let r = rule(
            r#"{"name":"c","key":"global","limits":[{"requests":10,"period":1}],"cost":{"header":{"name":"x-cost","max":5}}}"#,
        );
        assert_eq!(r.cost.of(&HttpRequest::get("/")), 1);
        assert_eq!(
            r.cost.of(&HttpRequest::get("/").with_header("x-cost", "3")),
            3
        );
        assert_eq!(
            r.cost
                .of(&HttpRequest::get("/").with_header("x-cost", "300")),
            5
        );
        assert_eq!(
            r.cost
                .of(&HttpRequest::get("/").with_header("x-cost", "-2")),
            1
        );
    }

    #[test]
    fn overrides_replace_the_limits_for_one_client() {
        let r = rule(
            r#"{"name":"o","key":{"header":"x-api-key"},"limits":[{"requests":10,"period":1}],
                "overrides":[{"client":"acme","limits":[{"requests":500,"period":"second"}]}]}"#,
        );
        assert_eq!(r.limits_for("acme")[0].requests, 500);
        assert_eq!(r.limits_for("other")[0].requests, 10);
    }

    #[test]
    fn editing_one_limit_changes_only_that_limits_identity() {
        let a = rule(
            r#"{"name":"r","key":"global","limits":[{"requests":10,"period":1},{"requests":100,"period":60}]}"#,
        );
        let b = rule(
            r#"{"name":"r","key":"global","limits":[{"requests":10,"period":1},{"requests":200,"period":60}]}"#,
        );
        assert_eq!(a.limits[0].identity, b.limits[0].identity);
        assert_ne!(a.limits[1].identity, b.limits[1].identity);
    }
}
