//! What a client sees: rate-limit header fields and the problem+json denial body.
//!
//! Fields follow the IETF httpapi RateLimit header fields draft (draft-11 syntax):
//! `RateLimit-Policy: "name";q=10;w=2` lists every limit of the rule, and
//! `RateLimit: "name";r=0;t=12` describes the one closest to running out. The widely
//! used `X-RateLimit-Limit`, `-Remaining` and `-Reset` (delta seconds) carry the same
//! numbers. A rule's limits are named after the rule (`"api"`), or `"api/1"`, `"api/2"`
//! when it has several. Which of the two families a proxy sends is its
//! [`RateLimitHeaders`] setting.
//!
//! **What "limit" means for a token bucket.** Remaining tokens count down from the
//! bucket's capacity (`burst`), not from `requests`: a 5/s rule with burst 10 starts with
//! 10 tokens. So the limit every field reads against is the capacity: the policy's quota
//! is `q = burst`, its window `w` is the time an empty bucket takes to refill
//! (`burst × period / requests`, rounded up to whole seconds, so `q / w` is the rate or
//! a hair under it), and `X-RateLimit-Limit` is `burst`. `remaining` therefore never
//! exceeds the limit it is read against. When `burst` equals `requests` (the default)
//! this is simply `q = requests; w = period`.
//!
//! Everything about a limit set that does not change per request (names, quotas,
//! windows, the whole policy field) is rendered once, when the ruleset is built
//! ([`RenderedRule`], one [`RenderedLimits`] per limit set); a request only formats its
//! two numbers, into a stack buffer.
//!
//! This module reads the rule model; the model knows nothing of it.

use std::collections::HashMap;
use std::fmt::{self, Write as _};
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::bucket::TierVerdict;
use crate::gcra::{Verdict, ceil_seconds};
use crate::rule::{Limit, Rule};

/// Header fields to add to a response, in order.
pub type HeaderList = Vec<(&'static str, String)>;

/// Which rate-limit header fields a proxy sends.
///
/// Written in the plugin configuration as `"ietf"`, `"x"`, `"both"` or `"none"`; the
/// earlier `true` and `false` still mean what they meant (`both` and `none`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RateLimitHeaders {
    /// `RateLimit-Policy` and `RateLimit` (draft-11). Two fields carry everything the
    /// `X-RateLimit-*` trio does (and every limit of the rule), under the names the IETF
    /// is standardising, without the deprecated `X-` prefix (RFC 6648): the cheapest
    /// choice for clients that read them.
    Ietf,
    /// `X-RateLimit-Limit`, `-Remaining` and `-Reset`, for clients written against them.
    XRateLimit,
    /// Both families, five fields: the default, because it is what every earlier version
    /// sent and clients in the field read either family; dropping one is the operator's
    /// informed choice, never an upgrade's side effect.
    #[default]
    Both,
    /// No rate-limit fields (denials still carry `Retry-After`).
    None,
}

impl RateLimitHeaders {
    /// The configuration word for this setting.
    pub fn as_str(self) -> &'static str {
        match self {
            RateLimitHeaders::Ietf => "ietf",
            RateLimitHeaders::XRateLimit => "x",
            RateLimitHeaders::Both => "both",
            RateLimitHeaders::None => "none",
        }
    }

    pub fn sends_ietf(self) -> bool {
        matches!(self, RateLimitHeaders::Ietf | RateLimitHeaders::Both)
    }

    pub fn sends_x(self) -> bool {
        matches!(self, RateLimitHeaders::XRateLimit | RateLimitHeaders::Both)
    }

    pub fn sends_any(self) -> bool {
        self != RateLimitHeaders::None
    }
}

impl Serialize for RateLimitHeaders {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for RateLimitHeaders {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = RateLimitHeaders;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(r#""ietf", "x", "both", "none", true (both) or false (none)"#)
            }

            fn visit_bool<E: serde::de::Error>(self, on: bool) -> Result<Self::Value, E> {
                Ok(if on {
                    RateLimitHeaders::Both
                } else {
                    RateLimitHeaders::None
                })
            }

            fn visit_str<E: serde::de::Error>(self, word: &str) -> Result<Self::Value, E> {
                match word {
                    "ietf" => Ok(RateLimitHeaders::Ietf),
                    "x" => Ok(RateLimitHeaders::XRateLimit),
                    "both" => Ok(RateLimitHeaders::Both),
                    "none" => Ok(RateLimitHeaders::None),
                    other => Err(E::invalid_value(serde::de::Unexpected::Str(other), &self)),
                }
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// The response field that tells a client it was admitted over a limit: within a soft
/// limit's margin (`soft_percent`), or over a warn-mode rule's limit.
pub const WARNING_HEADER: &str = "x-sluice-warning";

/// The value of [`WARNING_HEADER`] for the limits a request is over, by their names in
/// the rate-limit fields: `over limit api/1, over limit search`.
pub fn warning_value(limits: &[&str]) -> String {
    let mut value = String::new();
    for (i, limit) in limits.iter().enumerate() {
        if i > 0 {
            value.push_str(", ");
        }
        value.push_str("over limit ");
        value.push_str(limit);
    }
    value
}

/// The fixed text of one limit set's header fields, rendered once per ruleset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderedLimits {
    /// The whole `RateLimit-Policy` value.
    policy: Box<str>,
    tiers: Vec<RenderedTier>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct RenderedTier {
    /// The limit's name as a structured-field string: `"api/1"`.
    name: Box<str>,
    /// The same name bare, for [`LIMIT_HEADER`]: `api/1`.
    bare_name: Box<str>,
    /// `X-RateLimit-Limit`: the capacity.
    limit: Box<str>,
    /// The capacity as a number, to bound `remaining`.
    burst: u64,
    /// The denial body around its numbers: `,"detail":"Rate limit … retry in `, then the
    /// wait, then this: ` s.","rule":"…","limit":"…","retry_after":`, then the wait again.
    body_detail: Box<str>,
    body_rule: Box<str>,
}

impl RenderedLimits {
    /// Renders the fixed parts of `limits`, the limits of rule `rule`.
    pub fn new(rule: &str, limits: &[Limit]) -> Self {
        let mut policy = String::new();
        let mut tiers = Vec::with_capacity(limits.len());
        for (i, limit) in limits.iter().enumerate() {
            let mut name = String::with_capacity(rule.len() + 4);
            // Rule names are validated to a header-safe alphabet, so no escaping is needed.
            name.push('"');
            name.push_str(rule);
            if limits.len() > 1 {
                let _ = write!(name, "/{}", i + 1);
            }
            name.push('"');
            if i > 0 {
                policy.push_str(", ");
            }
            let _ = write!(
                policy,
                "{name};q={};w={}",
                limit.burst,
                window_seconds(limit)
            );
            let unit = if limit.counts.is_tokens() {
                "tokens"
            } else {
                "requests"
            };
            let detail = json_string(&format!(
                "Rate limit '{rule}' ({} {unit} per {} s) is exhausted; retry in ",
                limit.requests, limit.period_seconds
            ));
            let bare_name = name.trim_matches('"').to_string();
            let body_rule = format!(
                " s.\",\"rule\":{},\"limit\":{},\"retry_after\":",
                json_string(rule),
                json_string(&bare_name)
            );
            tiers.push(RenderedTier {
                name: name.into(),
                bare_name: bare_name.into(),
                limit: limit.burst.to_string().into(),
                burst: limit.burst,
                // The detail string stays open: the wait and ` s."` follow.
                body_detail: format!(
                    ",\"detail\":{}",
                    detail.strip_suffix('"').unwrap_or(&detail)
                )
                .into(),
                body_rule: body_rule.into(),
            });
        }
        Self {
            policy: policy.into(),
            tiers,
        }
    }

    /// The `RateLimit-Policy` value.
    pub fn policy(&self) -> &str {
        &self.policy
    }

    /// The name of limit `tier` as the rate-limit fields give it, bare: `api/2` (the
    /// rule's name alone when it has one limit). Empty for a tier it does not have.
    pub fn limit_name(&self, tier: usize) -> &str {
        self.tiers.get(tier).map_or("", |t| &t.bare_name)
    }
}

/// The fixed text of every limit set of one rule: its own limits' and each override's,
/// rendered once, when the ruleset is built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderedRule {
    limits: Arc<RenderedLimits>,
    overrides: HashMap<String, Arc<RenderedLimits>>,
}

impl RenderedRule {
    pub fn new(rule: &Rule) -> Self {
        let render = |limits: &[Limit]| Arc::new(RenderedLimits::new(&rule.name, limits));
        Self {
            limits: render(&rule.limits),
            overrides: rule
                .overrides
                .iter()
                .map(|(client, limits)| (client.clone(), render(limits)))
                .collect(),
        }
    }

    /// The text of the limits that apply to `client`, the set [`Rule::limits_for`] picks.
    pub fn for_client(&self, client: &str) -> &Arc<RenderedLimits> {
        self.overrides.get(client).unwrap_or(&self.limits)
    }
}

/// A limit of a rule and its verdict: what the rate-limit fields and a denial's body
/// describe.
#[derive(Debug, Clone, Copy)]
pub struct Limited<'r> {
    pub rule: &'r Rule,
    /// The limits in force for the client: the rule's own, or the client's override.
    pub limits: &'r [Limit],
    /// Their fixed text ([`RenderedRule::for_client`]).
    pub rendered: &'r Arc<RenderedLimits>,
    pub tier: TierVerdict,
}

impl Limited<'_> {
    pub fn limit(&self) -> Option<&Limit> {
        self.limits.get(self.tier.tier)
    }

    pub fn verdict(&self) -> &Verdict {
        &self.tier.verdict
    }
}

/// `text` as a JSON string literal, quotes included.
fn json_string(text: &str) -> String {
    serde_json::Value::from(text).to_string()
}

/// The policy window of `limit`: the whole seconds an empty bucket takes to refill,
/// rounded up (so the advertised rate `q / w` never exceeds the real one), at least 1.
pub fn window_seconds(limit: &Limit) -> u64 {
    let exact = u128::from(limit.burst) * u128::from(limit.period_seconds);
    let requests = u128::from(limit.requests.max(1));
    u64::try_from(exact.div_ceil(requests))
        .unwrap_or(u64::MAX)
        .max(1)
}

/// One response's rate-limit fields: the limit set's fixed text and this request's two
/// numbers. Owned and built without allocating, so a request can keep it until the
/// response headers arrive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimitFields {
    rendered: Arc<RenderedLimits>,
    tier: usize,
    remaining: u64,
    reset_seconds: u64,
}

impl RateLimitFields {
    /// The fields describing `limited`; `denied` makes the reset the wait before a retry.
    pub fn of(limited: &Limited<'_>, denied: bool) -> Self {
        let verdict = limited.verdict();
        let reset_seconds = if denied {
            retry_after_seconds(limited)
        } else {
            ceil_seconds(verdict.reset_ns)
        };
        let rendered = Arc::clone(limited.rendered);
        let burst = rendered.tiers.get(limited.tier.tier).map_or(0, |t| t.burst);
        Self {
            rendered,
            tier: limited.tier.tier,
            // Never more than the capacity the limit is read against.
            remaining: verdict.remaining.min(burst),
            reset_seconds,
        }
    }

    /// Tokens left, as sent.
    pub fn remaining(&self) -> u64 {
        self.remaining
    }

    /// Seconds until the reset, as sent.
    pub fn reset_seconds(&self) -> u64 {
        self.reset_seconds
    }

    /// Calls `add(name, value)` for each field `format` asks for, in order. Values are
    /// formatted into a stack buffer: nothing is allocated.
    pub fn emit(&self, format: RateLimitHeaders, mut add: impl FnMut(&'static str, &str)) {
        self.with_fields(format, |fields| {
            for (name, value) in fields {
                add(name, value);
            }
        });
    }

    /// Calls `use_fields` with the fields `format` asks for, formatted on the stack:
    /// the request path's way to hand them to the host in one call without allocating.
    pub fn with_fields<R>(
        &self,
        format: RateLimitHeaders,
        use_fields: impl FnOnce(&[(&'static str, &str)]) -> R,
    ) -> R {
        let Some(tier) = self.rendered.tiers.get(self.tier) else {
            return use_fields(&[]);
        };
        let (mut current, mut remaining, mut reset) =
            (StackText::new(), StackText::new(), StackText::new());
        // Only what `format` sends is formatted (this runs on every allowed response).
        if format.sends_ietf() {
            let _ = write!(
                current,
                "{};r={};t={}",
                tier.name, self.remaining, self.reset_seconds
            );
        }
        if format.sends_x() {
            let _ = write!(remaining, "{}", self.remaining);
            let _ = write!(reset, "{}", self.reset_seconds);
        }
        let ietf = [
            ("ratelimit-policy", self.rendered.policy.as_ref()),
            ("ratelimit", current.as_str()),
        ];
        let x = [
            ("x-ratelimit-limit", tier.limit.as_ref()),
            ("x-ratelimit-remaining", remaining.as_str()),
            ("x-ratelimit-reset", reset.as_str()),
        ];
        let both = [ietf[0], ietf[1], x[0], x[1], x[2]];
        match format {
            RateLimitHeaders::Both => use_fields(&both),
            RateLimitHeaders::Ietf => use_fields(&ietf),
            RateLimitHeaders::XRateLimit => use_fields(&x),
            RateLimitHeaders::None => use_fields(&[]),
        }
    }

    /// The fields as an owned list (tests, gRPC metadata).
    pub fn to_list(&self, format: RateLimitHeaders) -> HeaderList {
        let mut headers = HeaderList::with_capacity(5);
        self.emit(format, |name, value| {
            headers.push((name, value.to_string()))
        });
        headers
    }
}

/// The longest field value built per request: a quoted rule name of at most 64
/// characters, a tier suffix, and two 20-digit numbers.
const STACK_TEXT_LEN: usize = 128;

/// Text formatted on the stack.
struct StackText {
    buf: [u8; STACK_TEXT_LEN],
    len: usize,
}

impl StackText {
    fn new() -> Self {
        Self {
            buf: [0; STACK_TEXT_LEN],
            len: 0,
        }
    }

    fn as_str(&self) -> &str {
        // Only whole `&str`s are ever copied in, so this is valid UTF-8.
        self.buf
            .get(..self.len)
            .and_then(|b| std::str::from_utf8(b).ok())
            .unwrap_or_default()
    }
}

impl fmt::Write for StackText {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let end = self.len + s.len();
        let dst = self.buf.get_mut(self.len..end).ok_or(fmt::Error)?;
        dst.copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

/// Both families of fields describing `limited`, as an owned list.
pub fn rate_limit_headers(limited: &Limited<'_>, denied: bool) -> HeaderList {
    RateLimitFields::of(limited, denied).to_list(RateLimitHeaders::Both)
}

/// `Retry-After` for a denial: whole seconds, rounded up, at least 1.
pub fn retry_after_seconds(limited: &Limited<'_>) -> u64 {
    ceil_seconds(limited.verdict().retry_after_ns).max(1)
}

/// The content type of every local reply's body (RFC 9457).
pub const PROBLEM_JSON: &str = "application/problem+json";

/// The header of a denial that names the rule that decided it, for clients and access
/// logs (`%RESP(x-sluice-rule)%`).
pub const RULE_HEADER: &str = "x-sluice-rule";
/// The header of a denial that names the limit that decided it, as `RateLimit-Policy`
/// names it: the rule's name, and `/N` for its Nth limit when it has several.
pub const LIMIT_HEADER: &str = "x-sluice-limit";

/// On the response to a request that waited for its tokens (`on_limit: delay`): the wait
/// computed when it was queued, in milliseconds (`200.000`).
pub const DELAY_WAIT_HEADER: &str = "x-sluice-delay-ms";

/// Beside [`DELAY_WAIT_HEADER`]: the time the request spent queued, in milliseconds, as the
/// worker's clock measured it (the wait plus up to one tick).
pub const DELAY_QUEUED_HEADER: &str = "x-sluice-queued-ms";

/// Calls `send` with a denial's header fields (`Retry-After`, the body's content type, the
/// rule and limit that decided, then the rate-limit fields `format` asks for), formatted
/// on the stack.
pub fn with_denial_headers<R>(
    limited: &Limited<'_>,
    format: RateLimitHeaders,
    send: impl FnOnce(&[(&'static str, &str)]) -> R,
) -> R {
    let mut retry_after = StackText::new();
    let _ = write!(retry_after, "{}", retry_after_seconds(limited));
    RateLimitFields::of(limited, true).with_fields(format, |fields| {
        let mut headers: [(&'static str, &str); 9] = [("", ""); 9];
        let mut len = 0;
        let limit = limited
            .rendered
            .tiers
            .get(limited.tier.tier)
            .map_or(limited.rule.name.as_str(), |t| &t.bare_name);
        for field in [
            ("retry-after", retry_after.as_str()),
            ("content-type", PROBLEM_JSON),
            (RULE_HEADER, limited.rule.name.as_str()),
            (LIMIT_HEADER, limit),
        ]
        .iter()
        .chain(fields)
        {
            if let Some(slot) = headers.get_mut(len) {
                *slot = *field;
                len += 1;
            }
        }
        send(headers.get(..len).unwrap_or_default())
    })
}

/// The `application/problem+json` body of a denial (RFC 9457): the limit set's rendered
/// text around three numbers, one allocation.
pub fn problem_body(limited: &Limited<'_>, status: u16) -> String {
    let retry_after = retry_after_seconds(limited);
    let Some(tier) = limited.rendered.tiers.get(limited.tier.tier) else {
        let name = &limited.rule.name;
        return problem_body_of(name, name, None, status, retry_after);
    };
    let mut body = String::with_capacity(
        PROBLEM_HEAD.len() + tier.body_detail.len() + tier.body_rule.len() + 32,
    );
    let _ = write!(
        body,
        "{PROBLEM_HEAD}{status}{}{retry_after}{}{retry_after}}}",
        tier.body_detail, tier.body_rule
    );
    body
}

/// The denial body's fixed start, up to the status.
const PROBLEM_HEAD: &str =
    r#"{"type":"urn:sluice:rate-limited","title":"Too Many Requests","status":"#;

/// The denial body built field by field: the definition [`problem_body`] renders ahead.
fn problem_body_of(
    rule: &str,
    limit_name: &str,
    limit: Option<&Limit>,
    status: u16,
    retry_after: u64,
) -> String {
    let (requests, period) = limit.map_or((0, 0), |l| (l.requests, l.period_seconds));
    let unit = if limit.is_some_and(|l| l.counts.is_tokens()) {
        "tokens"
    } else {
        "requests"
    };
    serde_json::json!({
        "type": "urn:sluice:rate-limited",
        "title": "Too Many Requests",
        "status": status,
        "detail": format!(
            "Rate limit '{rule}' ({requests} {unit} per {period} s) is exhausted; retry in {retry_after} s."
        ),
        "rule": rule,
        "limit": limit_name,
        "retry_after": retry_after,
    })
    .to_string()
}

/// The `Retry-After` of an in-flight denial, in seconds: a hint, not a prediction. A
/// place frees when one of the client's requests ends, which nothing here can foresee;
/// one second keeps a client from retrying in a tight loop while costing a client whose
/// requests are short at most that second.
pub const IN_FLIGHT_RETRY_AFTER_SECONDS: u64 = 1;

/// The `application/problem+json` body of a request denied by an in-flight limit of
/// `max` requests.
pub fn in_flight_body(rule: &str, max: u32, status: u16) -> String {
    serde_json::json!({
        "type": "urn:sluice:too-many-in-flight",
        "title": "Too Many Requests",
        "status": status,
        "detail": format!(
            "Rate limit '{rule}' allows {max} requests in flight at once; retry when one of yours has ended."
        ),
        "rule": rule,
        "in_flight_limit": max,
        "retry_after": IN_FLIGHT_RETRY_AFTER_SECONDS,
    })
    .to_string()
}

/// The header fields of an in-flight denial: `Retry-After` (a hint,
/// [`IN_FLIGHT_RETRY_AFTER_SECONDS`]) and the body's content type. No rate-limit fields:
/// they describe token buckets, and an in-flight limit has no window or reset.
pub const IN_FLIGHT_HEADERS: [(&str, &str); 2] =
    [("retry-after", "1"), ("content-type", PROBLEM_JSON)];

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::RuleSpec;
    use crate::time::{NANOS_PER_SECOND, Nanos};

    fn rule(limits: &str) -> Rule {
        let spec: RuleSpec = serde_json::from_str(&format!(
            r#"{{"name":"api","key":"global","limits":{limits}}}"#
        ))
        .unwrap();
        Rule::try_from(spec).unwrap()
    }

    /// A rule with its text rendered, as a ruleset holds it.
    struct Rendered {
        rule: Rule,
        text: RenderedRule,
    }

    impl Rendered {
        fn new(rule: Rule) -> Self {
            let text = RenderedRule::new(&rule);
            Self { rule, text }
        }

        fn allowed(&self, tier: usize, remaining: u64) -> Limited<'_> {
            allowed(&self.rule, self.text.for_client(""), tier, remaining)
        }
    }

    fn allowed<'r>(
        rule: &'r Rule,
        rendered: &'r Arc<RenderedLimits>,
        tier: usize,
        remaining: u64,
    ) -> Limited<'r> {
        Limited {
            rule,
            limits: &rule.limits,
            rendered,
            tier: TierVerdict {
                tier,
                verdict: Verdict {
                    allowed: true,
                    new_tat: Nanos::ZERO,
                    remaining,
                    reset_ns: NANOS_PER_SECOND / 2,
                    retry_after_ns: 0,
                },
            },
        }
    }

    #[test]
    fn the_setting_reads_words_and_the_old_booleans() {
        let parse = |json: &str| serde_json::from_str::<RateLimitHeaders>(json);
        assert_eq!(parse(r#""ietf""#).unwrap(), RateLimitHeaders::Ietf);
        assert_eq!(parse(r#""x""#).unwrap(), RateLimitHeaders::XRateLimit);
        assert_eq!(parse(r#""both""#).unwrap(), RateLimitHeaders::Both);
        assert_eq!(parse(r#""none""#).unwrap(), RateLimitHeaders::None);
        assert_eq!(parse("true").unwrap(), RateLimitHeaders::Both, "as before");
        assert_eq!(parse("false").unwrap(), RateLimitHeaders::None, "as before");
        let err = parse(r#""draft""#).unwrap_err().to_string();
        assert!(err.contains(r#""ietf", "x", "both", "none""#), "{err}");
        assert!(parse("1").is_err());
        assert_eq!(RateLimitHeaders::default(), RateLimitHeaders::Both);
        for setting in [
            RateLimitHeaders::Ietf,
            RateLimitHeaders::XRateLimit,
            RateLimitHeaders::Both,
            RateLimitHeaders::None,
        ] {
            let json = serde_json::to_string(&setting).unwrap();
            assert_eq!(parse(&json).unwrap(), setting, "{json} round-trips");
        }
    }

    #[test]
    fn the_window_is_the_time_an_empty_bucket_takes_to_refill() {
        let windows =
            |limits: &str| -> Vec<u64> { rule(limits).limits.iter().map(window_seconds).collect() };
        assert_eq!(windows(r#"[{"requests":5,"period":1,"burst":10}]"#), [2]);
        assert_eq!(windows(r#"[{"requests":100,"period":60}]"#), [60]);
        // 5 tokens at 3 per second take 1.67 s: rounded up, so q / w stays under the rate.
        assert_eq!(windows(r#"[{"requests":3,"period":1,"burst":5}]"#), [2]);
        assert_eq!(windows(r#"[{"requests":10,"period":1,"burst":1}]"#), [1]);
    }

    #[test]
    fn each_setting_sends_its_own_fields_in_order() {
        let r = Rendered::new(rule(
            r#"[{"requests":5,"period":1,"burst":10},{"requests":100,"period":60}]"#,
        ));
        let fields = RateLimitFields::of(&r.allowed(0, 9), false);
        let names =
            |format| -> Vec<&str> { fields.to_list(format).into_iter().map(|(n, _)| n).collect() };
        assert_eq!(
            names(RateLimitHeaders::Ietf),
            ["ratelimit-policy", "ratelimit"]
        );
        assert_eq!(
            names(RateLimitHeaders::XRateLimit),
            [
                "x-ratelimit-limit",
                "x-ratelimit-remaining",
                "x-ratelimit-reset"
            ]
        );
        assert_eq!(names(RateLimitHeaders::Both).len(), 5);
        assert!(names(RateLimitHeaders::None).is_empty());
        assert_eq!(
            fields.to_list(RateLimitHeaders::Both),
            [
                (
                    "ratelimit-policy",
                    r#""api/1";q=10;w=2, "api/2";q=100;w=60"#.to_string()
                ),
                ("ratelimit", r#""api/1";r=9;t=1"#.to_string()),
                ("x-ratelimit-limit", "10".to_string()),
                ("x-ratelimit-remaining", "9".to_string()),
                ("x-ratelimit-reset", "1".to_string()),
            ]
        );
    }

    #[test]
    fn a_denial_sends_retry_after_its_content_type_then_the_fields() {
        let r = Rendered::new(rule(r#"[{"requests":5,"period":"second","burst":10}]"#));
        let mut limited = r.allowed(0, 0);
        limited.tier.verdict.allowed = false;
        limited.tier.verdict.retry_after_ns = 1_500_000_000;
        for format in [
            RateLimitHeaders::Both,
            RateLimitHeaders::Ietf,
            RateLimitHeaders::XRateLimit,
            RateLimitHeaders::None,
        ] {
            let sent = with_denial_headers(&limited, format, |headers| {
                headers
                    .iter()
                    .map(|(n, v)| (*n, v.to_string()))
                    .collect::<Vec<_>>()
            });
            let mut expected = vec![
                ("retry-after", "2".to_string()),
                ("content-type", PROBLEM_JSON.to_string()),
                ("x-sluice-rule", "api".to_string()),
                ("x-sluice-limit", "api".to_string()),
            ];
            expected.extend(RateLimitFields::of(&limited, true).to_list(format));
            assert_eq!(sent, expected, "{format:?}");
        }
    }

    #[test]
    fn remaining_never_exceeds_the_limit_it_is_read_against() {
        // A verdict from elsewhere (a global lease share) may claim more than the
        // capacity; the fields never say so.
        let r = Rendered::new(rule(r#"[{"requests":5,"period":1}]"#));
        let fields = RateLimitFields::of(&r.allowed(0, 50), false);
        assert_eq!(fields.remaining(), 5);
        let list = fields.to_list(RateLimitHeaders::Both);
        assert_eq!(list[1].1, r#""api";r=5;t=1"#);
    }

    #[test]
    fn the_fixed_text_is_rendered_once_per_rule_and_override() {
        let spec: RuleSpec = serde_json::from_str(
            r#"{"name":"api","key":{"header":"k"},"limits":[{"requests":5,"period":1}],
                "overrides":[{"client":"acme","limits":[{"requests":50,"period":1}]}]}"#,
        )
        .unwrap();
        let r = Rendered::new(Rule::try_from(spec).unwrap());
        assert_eq!(r.text.for_client("anyone").policy(), r#""api";q=5;w=1"#);
        assert_eq!(r.text.for_client("acme").policy(), r#""api";q=50;w=1"#);
        let a = RateLimitFields::of(&r.allowed(0, 1), false);
        let b = RateLimitFields::of(&r.allowed(0, 2), false);
        assert!(Arc::ptr_eq(&a.rendered, &b.rendered), "shared, not copied");
    }

    #[test]
    fn the_rendered_denial_body_is_the_json_built_field_by_field() {
        let r = Rendered::new(rule(
            r#"[{"requests":5,"period":1,"burst":10},{"requests":100,"period":60}]"#,
        ));
        for (tier, retry_ns, status) in [(0, 1, 429), (1, 59 * NANOS_PER_SECOND + 1, 503)] {
            let mut limited = r.allowed(tier, 0);
            limited.tier.verdict.retry_after_ns = retry_ns;
            let body = problem_body(&limited, status);
            let parsed: serde_json::Value = serde_json::from_str(&body).unwrap();
            let expected: serde_json::Value = serde_json::from_str(&problem_body_of(
                "api",
                &format!("api/{}", tier + 1),
                r.rule.limits.get(tier),
                status,
                retry_after_seconds(&limited),
            ))
            .unwrap();
            assert_eq!(parsed, expected, "{body}");
        }
        assert_eq!(
            problem_body(&r.allowed(0, 0), 429),
            r#"{"type":"urn:sluice:rate-limited","title":"Too Many Requests","status":429,"detail":"Rate limit 'api' (5 requests per 1 s) is exhausted; retry in 1 s.","rule":"api","limit":"api/1","retry_after":1}"#
        );
    }

    #[test]
    fn a_denial_names_the_rule_and_the_limit_that_decided() {
        let r = Rendered::new(rule(
            r#"[{"requests":5,"period":1,"burst":10},{"requests":100,"period":60}]"#,
        ));
        for tier in [0, 1] {
            let mut limited = r.allowed(tier, 0);
            limited.tier.verdict.allowed = false;
            let sent = with_denial_headers(&limited, RateLimitHeaders::None, |headers| {
                headers
                    .iter()
                    .map(|(n, v)| (*n, v.to_string()))
                    .collect::<Vec<_>>()
            });
            let limit = format!("api/{}", tier + 1);
            assert!(sent.contains(&(RULE_HEADER, "api".to_string())), "{sent:?}");
            assert!(sent.contains(&(LIMIT_HEADER, limit.clone())), "{sent:?}");
            let body: serde_json::Value =
                serde_json::from_str(&problem_body(&limited, 429)).unwrap();
            assert_eq!(
                (body["rule"].as_str(), body["limit"].as_str()),
                (Some("api"), Some(limit.as_str()))
            );
        }
    }

    #[test]
    fn the_longest_name_and_numbers_fit_the_stack_buffer() {
        let name = "n".repeat(64);
        let spec: RuleSpec = serde_json::from_str(&format!(
            r#"{{"name":"{name}","key":"global","limits":[{{"requests":1,"period":1}},{{"requests":2,"period":2}}]}}"#
        ))
        .unwrap();
        let r = Rendered::new(Rule::try_from(spec).unwrap());
        let mut limited = r.allowed(1, u64::MAX);
        limited.tier.verdict.reset_ns = u64::MAX;
        let list = RateLimitFields::of(&limited, false).to_list(RateLimitHeaders::Ietf);
        assert_eq!(list[1].1, format!(r#""{name}/2";r=2;t=18446744074"#));
    }

    #[test]
    fn an_in_flight_denial_names_its_limit_and_hints_one_second() {
        let body: serde_json::Value =
            serde_json::from_str(&in_flight_body("llm", 10, 429)).unwrap();
        assert_eq!(body["type"], "urn:sluice:too-many-in-flight");
        assert_eq!(body["in_flight_limit"], 10);
        assert_eq!(body["retry_after"], IN_FLIGHT_RETRY_AFTER_SECONDS);
        assert_eq!(
            IN_FLIGHT_HEADERS[0],
            (
                "retry-after",
                IN_FLIGHT_RETRY_AFTER_SECONDS.to_string().as_str()
            )
        );
    }
}
