//! Which requests a rule applies to: host, path, method and header conditions, compiled
//! once for the request path.

use regex::Regex;

use super::ClientKey;
use crate::request::{RequestAttributes, RequestNeeds};
use crate::spec::{HeaderMatchSpec, MatchSpec, ValueMatchSpec};
use crate::validation::{Problems, is_header_name};

/// Longest regular expression source accepted.
const MAX_REGEX_LEN: usize = 1_024;
/// Compiled size limit for one regular expression, so one rule cannot bloat every worker.
const REGEX_SIZE_LIMIT: usize = 256 * 1024;

/// Which requests a rule applies to, compiled for the request path.
#[derive(Debug, Clone)]
pub struct RequestMatcher {
    host: Option<HostPattern>,
    path_exact: Option<String>,
    path_prefix: Option<String>,
    path_regex: Option<Regex>,
    methods: Vec<String>,
    headers: Vec<HeaderCondition>,
    /// Conditions on values read as keys are (claims, cookies, certificate fields).
    values: Vec<ValueCondition>,
}

#[derive(Debug, Clone)]
struct ValueCondition {
    value: ClientKey,
    test: ValueTest,
}

#[derive(Debug, Clone)]
enum ValueTest {
    Present,
    Absent,
    Equals(String),
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
    pub(super) fn build(spec: &MatchSpec, problems: &mut Problems) -> RequestMatcher {
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
            // Characters, as the schema's `maxLength` counts.
            if source.chars().count() > MAX_REGEX_LEN {
                problems.add(
                    "match.path_regex",
                    format!("is longer than {MAX_REGEX_LEN} characters"),
                );
                return None;
            }
            if has_unicode_property_class(source) {
                // The filter's regex engine carries no Unicode property tables (they
                // would weigh on every worker VM), so no build accepts what it lacks.
                problems.add(
                    "match.path_regex",
                    "Unicode property classes (\\p{..}, \\P{..}) are not supported in paths",
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
        let values = spec
            .values
            .iter()
            .enumerate()
            .filter_map(|(i, v)| ValueCondition::build(v, &format!("match.values[{i}]"), problems))
            .collect();
        RequestMatcher {
            host,
            path_exact: spec.path_exact.clone(),
            path_prefix: spec.path_prefix.clone(),
            path_regex,
            methods,
            headers,
            values,
        }
    }

    pub(crate) fn add_needs(&self, needs: &mut RequestNeeds) {
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
        for condition in &self.values {
            condition.value.add_needs(needs);
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
        let headers_hold = self.headers.iter().all(|c| match c {
            HeaderCondition::Present(n) => request.header(n).is_some(),
            HeaderCondition::Absent(n) => request.header(n).is_none(),
            HeaderCondition::Equals(n, v) => request.header(n) == Some(v.as_str()),
        });
        // Last: these may be host calls (metadata, certificates) that cheaper conditions
        // above can spare.
        headers_hold
            && self.values.iter().all(|c| match &c.test {
                ValueTest::Present => c.value.extract(request).is_some(),
                ValueTest::Absent => c.value.extract(request).is_none(),
                ValueTest::Equals(v) => c.value.value_equals(request, v),
            })
    }
}

impl ValueCondition {
    fn build(spec: &ValueMatchSpec, field: &str, problems: &mut Problems) -> Option<Self> {
        let value = ClientKey::build(&spec.value, &format!("{field}.value"), false, problems);
        let test = match (spec.present, &spec.equals) {
            (None, Some(v)) | (Some(true), Some(v)) => ValueTest::Equals(v.clone()),
            (Some(true), None) => ValueTest::Present,
            (Some(false), None) => ValueTest::Absent,
            (None, None) => {
                problems.add(field, "needs `present` or `equals`");
                return None;
            }
            (Some(false), Some(_)) => {
                problems.add(field, "`present: false` cannot be combined with `equals`");
                return None;
            }
        };
        if value == Some(ClientKey::Global) {
            problems.add(format!("{field}.value"), "`global` is always present");
            return None;
        }
        Some(ValueCondition {
            value: value?,
            test,
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

/// Whether `source` uses `\p{..}` or `\P{..}` (an escaped backslash does not count).
fn has_unicode_property_class(source: &str) -> bool {
    let mut escaped = false;
    for c in source.chars() {
        if escaped && (c == 'p' || c == 'P') {
            return true;
        }
        escaped = !escaped && c == '\\';
    }
    false
}

#[cfg(test)]
mod tests {
    use super::super::test_support::rule;
    use crate::request::HttpRequest;

    #[test]
    fn path_regexes_keep_perl_classes_and_case_folding_but_not_property_classes() {
        let matches = |regex: &str, path: &str| {
            rule(&format!(
                r#"{{"name":"m","key":"global","limits":[{{"requests":1,"period":1}}],"match":{{"path_regex":{}}}}}"#,
                serde_json::to_string(regex).unwrap()
            ))
            .matcher
            .matches(&HttpRequest::get(path))
        };
        assert!(matches(r"/v\d+/\w+", "/v2/items"));
        assert!(matches(r"(?i)/API/.*", "/api/x"));
        assert!(
            matches(r"/a\\p", "/a\\p"),
            "an escaped backslash then p is literal"
        );
        for regex in [r"/\p{Greek}+", r"/\PL"] {
            let errors = super::super::test_support::errors(&format!(
                r#"{{"name":"m","key":"global","limits":[{{"requests":1,"period":1}}],"match":{{"path_regex":{}}}}}"#,
                serde_json::to_string(regex).unwrap()
            ));
            assert_eq!(
                errors,
                [
                    "match.path_regex: Unicode property classes (\\p{..}, \\P{..}) are not supported in paths"
                ],
                "{regex}"
            );
        }
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
            identity: Default::default(),
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
}
