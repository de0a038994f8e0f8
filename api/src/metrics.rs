//! `/api/v1/metrics/*`: throttle metrics for the dashboard and for scripts. Ranges are
//! Unix milliseconds, `from` inclusive and `to` exclusive.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::query::Whole;

/// The bucket widths a `step` parameter names (`Resolution`'s labels), for the document;
/// the parameter itself is read as a string. Defined here, beside the queries that use
/// it, so that this module needs nothing from `schema.rs` (which describes this module's
/// `StreamEvent`).
#[cfg(feature = "openapi")]
#[derive(Debug, utoipa::ToSchema)]
#[allow(dead_code)] // Only its schema is used.
pub enum StepName {
    #[schema(rename = "10s")]
    TenSeconds,
    #[schema(rename = "1m")]
    Minute,
    #[schema(rename = "1h")]
    Hour,
}

/// `GET /api/v1/metrics/series`'s range, step and filter.
#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query))]
#[serde(deny_unknown_fields)]
pub struct SeriesQuery {
    /// Start of the range, Unix milliseconds (default: `to` minus 15 minutes, at least 0).
    /// Any value is answered: one at or after `to` gives an empty range, and a range of
    /// more than 20,000 buckets of its step is cut to its last 20,000; the answer's `from`
    /// says where what it shows starts.
    #[cfg_attr(feature = "openapi", param(value_type = Option<u64>, minimum = 0, maximum = 9_007_199_254_740_991_u64))]
    pub from: Option<Whole>,
    /// End of the range (exclusive), Unix milliseconds (default: now).
    #[cfg_attr(feature = "openapi", param(value_type = Option<u64>, minimum = 0, maximum = 9_007_199_254_740_991_u64))]
    pub to: Option<Whole>,
    /// Bucket width: `10s`, `1m` or `1h` (default: 10s up to an hour, 1m up to two days,
    /// else 1h).
    #[cfg_attr(feature = "openapi", param(inline, value_type = Option<StepName>))]
    pub step: Option<String>,
    /// Only this rule (by id).
    pub rule: Option<String>,
    /// Only this proxy (by id).
    pub proxy: Option<String>,
}

/// One bucket of a series.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SeriesPoint {
    /// The bucket's start, Unix milliseconds.
    pub t: i64,
    pub allowed: u64,
    pub denied: u64,
    pub shadow_denied: u64,
    pub near_limit: u64,
    pub fail_open: u64,
    pub key_missing: u64,
    /// LLM tokens the allowed requests used, as their responses reported (rules with
    /// token limits).
    #[serde(default)]
    pub tokens_used: u64,
    /// LLM tokens the throttled requests asked for (their estimates).
    #[serde(default)]
    pub tokens_throttled: u64,
    /// Requests admitted over a limit (a soft limit's margin, or a warn-mode rule): also
    /// in `allowed`.
    #[serde(default)]
    pub warned: u64,
    /// Requests paused until their tokens were due (`on_limit: delay`): also in `allowed`.
    #[serde(default)]
    pub delayed: u64,
    /// The waits computed for the `delayed` requests, in milliseconds, summed: over
    /// `delayed`, the mean wait.
    #[serde(default)]
    pub delay_wait_ms: u64,
    /// Requests refused by an in-flight limit: also in `denied`.
    #[serde(default)]
    pub in_flight_refused: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Series {
    /// The bucket width: 10, 60 or 3600.
    pub step_seconds: i64,
    /// The range shown: as asked, but starting later when it was cut to 20,000 buckets,
    /// and `from` = `to` (no points) when `from` was not before `to`.
    pub from: i64,
    pub to: i64,
    /// Every bucket overlapping the range, oldest first; buckets without reports are 0.
    pub points: Vec<SeriesPoint>,
}

/// A range and step (`GET /api/v1/metrics/rules`, `GET /api/v1/metrics/clients/{client}`).
#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query))]
#[serde(deny_unknown_fields)]
pub struct RangeQuery {
    /// Start of the range, Unix milliseconds (default: `to` minus 15 minutes, at least 0).
    /// Any value is answered: one at or after `to` gives an empty range, and a range of
    /// more than 20,000 buckets of its step is cut to its last 20,000; the answer's `from`
    /// says where what it shows starts.
    #[cfg_attr(feature = "openapi", param(value_type = Option<u64>, minimum = 0, maximum = 9_007_199_254_740_991_u64))]
    pub from: Option<Whole>,
    /// End of the range (exclusive), Unix milliseconds (default: now).
    #[cfg_attr(feature = "openapi", param(value_type = Option<u64>, minimum = 0, maximum = 9_007_199_254_740_991_u64))]
    pub to: Option<Whole>,
    /// Bucket width: `10s`, `1m` or `1h` (default: chosen from the range).
    #[cfg_attr(feature = "openapi", param(inline, value_type = Option<StepName>))]
    pub step: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RuleMetrics {
    /// The rule id.
    pub rule: String,
    /// The rule's current name; null for a rule that no longer exists.
    pub name: Option<String>,
    pub allowed: u64,
    pub denied: u64,
    pub shadow_denied: u64,
    pub near_limit: u64,
    pub fail_open: u64,
    pub key_missing: u64,
    /// LLM tokens the allowed requests used, as their responses reported (rules with
    /// token limits).
    #[serde(default)]
    pub tokens_used: u64,
    /// LLM tokens the throttled requests asked for (their estimates).
    #[serde(default)]
    pub tokens_throttled: u64,
    /// Requests admitted over a limit (a soft limit's margin, or a warn-mode rule): also
    /// in `allowed`.
    #[serde(default)]
    pub warned: u64,
    /// Requests paused until their tokens were due (`on_limit: delay`): also in `allowed`.
    #[serde(default)]
    pub delayed: u64,
    /// The waits computed for the `delayed` requests, in milliseconds, summed: over
    /// `delayed`, the mean wait.
    #[serde(default)]
    pub delay_wait_ms: u64,
    /// Requests refused by an in-flight limit: also in `denied`.
    #[serde(default)]
    pub in_flight_refused: u64,
    /// (denied + shadow_denied) / (allowed + denied + shadow_denied + fail_open); 0
    /// without traffic.
    pub throttle_ratio: f64,
    /// denied + shadow_denied over the range in up to 30 equal slices, oldest first.
    pub sparkline: Vec<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RuleMetricsList {
    pub step_seconds: i64,
    /// The range shown, as in `Series`.
    pub from: i64,
    pub to: i64,
    /// Every rule with traffic in the range or defined now: most throttled first, then
    /// busiest, then by id.
    pub rules: Vec<RuleMetrics>,
}

/// `GET /api/v1/metrics/clients`'s range, step, filter and length.
#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query))]
#[serde(deny_unknown_fields)]
pub struct ClientsQuery {
    /// Start of the range, Unix milliseconds (default: `to` minus 15 minutes, at least 0).
    /// Any value is answered: one at or after `to` gives an empty range, and a range of
    /// more than 20,000 buckets of its step is cut to its last 20,000; the answer's `from`
    /// says where what it shows starts.
    #[cfg_attr(feature = "openapi", param(value_type = Option<u64>, minimum = 0, maximum = 9_007_199_254_740_991_u64))]
    pub from: Option<Whole>,
    /// End of the range (exclusive), Unix milliseconds (default: now).
    #[cfg_attr(feature = "openapi", param(value_type = Option<u64>, minimum = 0, maximum = 9_007_199_254_740_991_u64))]
    pub to: Option<Whole>,
    /// Read only buckets of this width: `10s`, `1m` or `1h`. By default the range is
    /// read in whole hours, then whole minutes at its edges, then 10 s buckets: exact to
    /// 10 s at either end, and quick over long ranges.
    #[cfg_attr(feature = "openapi", param(inline, value_type = Option<StepName>))]
    pub step: Option<String>,
    /// Only this rule (by id).
    pub rule: Option<String>,
    /// How many (default 20).
    #[cfg_attr(feature = "openapi", param(minimum = 1, maximum = 1000))]
    pub limit: Option<u32>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ClientMetrics {
    pub client: String,
    /// The rule that throttled it (a client throttled by two rules is listed twice).
    pub rule: String,
    /// Throttled requests (denied or shadow-denied): an upper bound, exact when `error`
    /// is 0.
    pub throttled: u64,
    /// How much of `throttled` may belong to other clients (Space-Saving summaries).
    pub error: u64,
    /// LLM tokens its throttled requests asked for, an upper bound like `throttled`.
    #[serde(default)]
    pub tokens: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ClientMetricsList {
    /// The range shown, as in `Series`.
    pub from: i64,
    pub to: i64,
    /// Most throttled first.
    pub clients: Vec<ClientMetrics>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ClientPoint {
    /// The bucket's start, Unix milliseconds.
    pub t: i64,
    pub throttled: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ClientRule {
    pub rule: String,
    /// Over the range.
    pub throttled: u64,
    /// Every bucket of the range, zero-filled (0 also where the client was not among
    /// the bucket's 50 most throttled).
    pub points: Vec<ClientPoint>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ClientHistory {
    pub client: String,
    pub step_seconds: i64,
    /// The range shown, as in `Series`.
    pub from: i64,
    pub to: i64,
    /// The rules that throttled the client in the range, most first.
    pub rules: Vec<ClientRule>,
}

/// `GET /api/v1/metrics/overview`'s window.
#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query))]
#[serde(deny_unknown_fields)]
pub struct OverviewQuery {
    /// The window, in seconds up to now (default 300; at most 400 days).
    #[cfg_attr(feature = "openapi", param(minimum = 1, maximum = 34_560_000))]
    pub window: Option<i64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ProxySummary {
    /// Polling now, or polled or reported within the last 60 seconds.
    pub connected: u64,
    /// Every proxy ever seen.
    pub total: u64,
    /// How many connected proxies run each ruleset version.
    pub versions: BTreeMap<String, u64>,
    /// Connected proxies enforcing global limits with their fallback shares (their syncs
    /// with the coordinator fail); see `GET /api/v1/proxies`.
    pub on_fallback: u64,
    /// How long this admin API took to answer the proxies' syncs within the window (its
    /// latest 1,024 at most); `null` when it answered none.
    pub sync_answers: Option<SyncAnswerTimes>,
}

/// Answer times of the coordinator's syncs, each from its handler's start (after
/// authentication) to its answer.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SyncAnswerTimes {
    /// Syncs answered.
    pub samples: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Overview {
    pub window_seconds: i64,
    /// Sums over rules (a request matched by two rules counts in both).
    pub allowed: u64,
    pub denied: u64,
    pub shadow_denied: u64,
    pub near_limit: u64,
    pub fail_open: u64,
    pub key_missing: u64,
    /// LLM tokens the allowed requests used, as their responses reported (rules with
    /// token limits).
    #[serde(default)]
    pub tokens_used: u64,
    /// LLM tokens the throttled requests asked for (their estimates).
    #[serde(default)]
    pub tokens_throttled: u64,
    /// Requests admitted over a limit (a soft limit's margin, or a warn-mode rule): also
    /// in `allowed`.
    #[serde(default)]
    pub warned: u64,
    /// Requests paused until their tokens were due (`on_limit: delay`): also in `allowed`.
    #[serde(default)]
    pub delayed: u64,
    /// The waits computed for the `delayed` requests, in milliseconds, summed: over
    /// `delayed`, the mean wait.
    #[serde(default)]
    pub delay_wait_ms: u64,
    /// Requests refused by an in-flight limit: also in `denied`.
    #[serde(default)]
    pub in_flight_refused: u64,
    pub throttle_ratio: f64,
    /// Decided requests (allowed, denied, shadow-denied, failed open) per second.
    pub requests_per_second: f64,
    /// Denied and shadow-denied requests per second.
    pub throttled_per_second: f64,
    /// The current ruleset version.
    pub ruleset_version: u64,
    pub proxies: ProxySummary,
    /// Proxies reporting an error (e.g. a ruleset they refused).
    pub errors: u64,
}

/// One rule in a stream event.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StreamRule {
    pub allowed: u64,
    pub denied: u64,
    pub shadow_denied: u64,
    /// LLM tokens the allowed requests used, as their responses reported; left out when 0
    /// (rules without token limits).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub tokens_used: u64,
    /// LLM tokens the throttled requests asked for (their estimates); left out when 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub tokens_throttled: u64,
    /// Requests admitted over a limit (also in `allowed`); left out when 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub warned: u64,
    /// Requests paused until their tokens were due (also in `allowed`); left out when 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub delayed: u64,
    /// The `delayed` requests' computed waits in milliseconds, summed; left out when 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub delay_wait_ms: u64,
    /// Requests refused by an in-flight limit (also in `denied`); left out when 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub in_flight_refused: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The data of an `event: metrics`: what reports brought in the last 2 s.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StreamEvent {
    /// When the event was made, Unix milliseconds.
    pub t: i64,
    pub allowed: u64,
    pub denied: u64,
    pub shadow_denied: u64,
    pub near_limit: u64,
    pub fail_open: u64,
    pub key_missing: u64,
    /// LLM tokens the allowed requests used, as their responses reported (rules with
    /// token limits).
    #[serde(default)]
    pub tokens_used: u64,
    /// LLM tokens the throttled requests asked for (their estimates).
    #[serde(default)]
    pub tokens_throttled: u64,
    /// Requests admitted over a limit (a soft limit's margin, or a warn-mode rule): also
    /// in `allowed`.
    #[serde(default)]
    pub warned: u64,
    /// Requests paused until their tokens were due (`on_limit: delay`): also in `allowed`.
    #[serde(default)]
    pub delayed: u64,
    /// The waits computed for the `delayed` requests, in milliseconds, summed: over
    /// `delayed`, the mean wait.
    #[serde(default)]
    pub delay_wait_ms: u64,
    /// Requests refused by an in-flight limit: also in `denied`.
    #[serde(default)]
    pub in_flight_refused: u64,
    /// The rules with reported traffic in the last 2 s, by id.
    pub rules: BTreeMap<String, StreamRule>,
}
