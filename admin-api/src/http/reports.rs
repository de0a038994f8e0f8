//! `POST /api/v1/reports`: a proxy's decision statistics for one interval, the contract of
//! `sluice_core::report::Report`.
//!
//! The body is read into this module's own mirror of the core's types rather than the
//! core's: the core flattens its counts (`#[serde(flatten)]`), which hides the path of a
//! shape error (`rules[3].denied` becomes `.`), and this endpoint must name the field. A
//! test pins the mirror to the core's encoding both ways.
//!
//! Everything is checked before anything is kept: a refused report changes nothing.

use std::collections::HashMap;
use std::time::Instant;

use axum::extract::{ConnectInfo, FromRequest, Request, State};
use axum::http::StatusCode;
use serde::Deserialize;
use sluice_api::MAX_SAFE_INTEGER;
use sluice_core::report::{PROXY_ID_RULE, is_proxy_id};
use sluice_core::validation::{FieldError, ValidationErrors};
use utoipa::ToSchema;

use super::AppState;
use super::auth::{Auth, SendReports};
use super::body::{BodyInput, JsonBody};
use super::error::{ApiError, Input};
use super::openapi::{AuthErrors, WriteErrors};
use super::proxy_ids::{IdPath, IdRefusal};
use super::report_guard::{SeqRefusal, ceiling};
use crate::pipeline::{RejectReason, RequestTally, Tally, ValidReport, ValidRule};
use crate::store::{Counts, REQUEST_COUNTS, now_ms};

/// How far in the future a report may end (clock skew).
pub const MAX_FUTURE_MS: u64 = 5 * 60 * 1000;
/// Most rules in one report.
pub const MAX_RULES: usize = 1000;
/// Most clients per rule in one report.
pub const MAX_CLIENTS_PER_RULE: usize = 100;
/// Longest client key, in characters (as the document's `maxLength` counts).
pub const MAX_CLIENT_CHARS: usize = 256;
/// Longest rule id, in characters.
pub const MAX_RULE_ID_CHARS: usize = 128;
/// Largest count accepted in one report: far beyond what a proxy decides in ten minutes
/// (1.6 billion requests a second), and small enough that sums can never overflow.
pub const MAX_COUNT: u64 = 1_000_000_000_000;
/// Problems listed in one answer; a report with more is wrong throughout anyway.
const MAX_PROBLEMS: usize = 20;

/// `sluice_core::report::Report`: what a proxy sends every few seconds.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = Report)]
pub struct ReportBody {
    /// The proxy's id: 1 to 128 visible ASCII characters.
    #[schema(pattern = "^[!-~]{1,128}$")]
    pub proxy_id: String,
    /// When the interval covered began, Unix milliseconds, as the proxy's clock read it.
    /// Informational: the counts are kept at `end_ms`, so any value is taken, also one
    /// after `end_ms` (a proxy clock that stepped back) or long before it.
    #[schema(maximum = 9_007_199_254_740_991_u64)]
    #[allow(dead_code)] // Read only for its shape and bounds.
    pub start_ms: u64,
    /// When the interval ended, Unix milliseconds: at most 5 minutes in the future. The
    /// report counts in the buckets holding it.
    #[schema(maximum = 9_007_199_254_740_991_u64)]
    pub end_ms: u64,
    /// The ruleset version the proxy ran at the end of the interval.
    #[schema(maximum = 9_007_199_254_740_991_u64)]
    pub ruleset_version: u64,
    /// Per rule, at most 1,000.
    #[schema(max_items = 1000)]
    pub rules: Vec<RuleBody>,
    /// Outcomes the proxy could not attribute because it already tracked 1,000 rules.
    #[serde(default)]
    #[schema(maximum = 1_000_000_000_000_u64)]
    pub overflow: u64,
    /// Earlier reports the proxy dropped because the admin API was unreachable.
    #[serde(default)]
    #[schema(maximum = 1_000_000_000_000_u64)]
    pub dropped_reports: u64,
}

/// `sluice_core::report::RuleReport`: one rule's exact counts and most throttled clients.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = RuleReport)]
pub struct RuleBody {
    /// The rule id (kept as sent, also for a rule deleted since): 1 to 128 characters,
    /// without control characters.
    #[schema(
        min_length = 1,
        max_length = 128,
        pattern = r"^[^\x00-\x1F\x7F-\x9F]*$"
    )]
    pub rule: String,
    #[serde(default)]
    #[schema(maximum = 1_000_000_000_000_u64)]
    pub allowed: u64,
    #[serde(default)]
    #[schema(maximum = 1_000_000_000_000_u64)]
    pub denied: u64,
    #[serde(default)]
    #[schema(maximum = 1_000_000_000_000_u64)]
    pub shadow_denied: u64,
    /// Allowed requests that left a limit at least 80% used.
    #[serde(default)]
    #[schema(maximum = 1_000_000_000_000_u64)]
    pub near_limit: u64,
    #[serde(default)]
    #[schema(maximum = 1_000_000_000_000_u64)]
    pub fail_open: u64,
    /// Requests that matched but had no client key (not limited by the rule).
    #[serde(default)]
    #[schema(maximum = 1_000_000_000_000_u64)]
    pub key_missing: u64,
    /// LLM tokens the rule's allowed requests used, as their responses reported (rules
    /// with token limits; counted when a response ends).
    #[serde(default)]
    #[schema(maximum = 1_000_000_000_000_u64)]
    pub tokens_used: u64,
    /// LLM tokens the rule's throttled requests asked for (their estimates).
    #[serde(default)]
    #[schema(maximum = 1_000_000_000_000_u64)]
    pub tokens_throttled: u64,
    /// Requests admitted over a limit (a soft limit's margin, or a warn-mode rule): also
    /// in `allowed`.
    #[serde(default)]
    #[schema(maximum = 1_000_000_000_000_u64)]
    pub warned: u64,
    /// Requests paused until their tokens were due (`on_limit: delay`): also in `allowed`.
    #[serde(default)]
    #[schema(maximum = 1_000_000_000_000_u64)]
    pub delayed: u64,
    /// The waits computed for the `delayed` requests, in milliseconds, summed.
    #[serde(default)]
    #[schema(maximum = 1_000_000_000_000_u64)]
    pub delay_wait_ms: u64,
    /// Requests refused by an in-flight limit: also in `denied`.
    #[serde(default)]
    #[schema(maximum = 1_000_000_000_000_u64)]
    pub in_flight_refused: u64,
    /// Most throttled first, at most 100 (proxies send 20).
    #[serde(default)]
    #[schema(max_items = 100)]
    pub top_clients: Vec<ClientBody>,
    /// The clients sending the rule the most requests, whatever their outcome (for rule
    /// dry runs), most first, at most 100 (proxies send 20).
    #[serde(default)]
    #[schema(max_items = 100)]
    pub top_requesters: Vec<RequesterBody>,
}

/// `sluice_core::report::ClientRequests`: one entry of a Space-Saving summary of requests.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = ClientRequests)]
pub struct RequesterBody {
    /// The client key, at most 256 characters.
    #[schema(max_length = 256)]
    pub client: String,
    /// Requests the rule decided for the client, an upper bound.
    #[schema(maximum = 1_000_000_000_000_u64)]
    pub requests: u64,
    /// How much of `requests` may belong to clients this entry replaced; more than
    /// `requests` is kept as `requests`.
    #[serde(default)]
    #[schema(maximum = 1_000_000_000_000_u64)]
    pub error: u64,
}

/// `sluice_core::report::ClientCount`: one entry of a Space-Saving summary.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = ClientCount)]
pub struct ClientBody {
    /// The client key, at most 256 characters.
    #[schema(max_length = 256)]
    pub client: String,
    /// Throttled requests (denied or shadow-denied), an upper bound.
    #[schema(maximum = 1_000_000_000_000_u64)]
    pub throttled: u64,
    /// How much of `throttled` may belong to clients this entry replaced; more than
    /// `throttled` says no more than all of it, and is kept as `throttled`.
    #[serde(default)]
    #[schema(maximum = 1_000_000_000_000_u64)]
    pub error: u64,
    /// LLM tokens the client's throttled requests asked for, an upper bound like
    /// `throttled`.
    #[serde(default)]
    #[schema(maximum = 1_000_000_000_000_u64)]
    pub tokens: u64,
}

impl BodyInput for ReportBody {
    const INPUT: Input = Input::Report;
}

struct Problems(Vec<FieldError>);

impl Problems {
    fn add(&mut self, field: impl FnOnce() -> String, message: impl Into<String>) {
        if self.0.len() < MAX_PROBLEMS {
            self.0.push(FieldError {
                field: field(),
                message: message.into(),
            });
        }
    }

    fn count(&mut self, field: impl FnOnce() -> String, value: u64) {
        if value > MAX_COUNT {
            self.add(field, format!("must be at most {MAX_COUNT}"));
        }
    }

    /// Checks a client key's length and returns the key as kept.
    fn client(&mut self, client: String, field: impl FnOnce() -> String) -> String {
        if client.chars().count() > MAX_CLIENT_CHARS {
            self.add(
                field,
                format!("must be at most {MAX_CLIENT_CHARS} characters"),
            );
        }
        // A client key is whatever a request carried, and a query parameter can carry
        // %00: refusing the report would let any client hide a proxy's statistics, so NUL
        // (which PostgreSQL cannot store) is replaced instead.
        if client.contains('\0') {
            client.replace('\0', "\u{fffd}")
        } else {
            client
        }
    }

    /// Checks a rule's `top_requesters` and merges repeated clients.
    fn requesters(&mut self, i: usize, list: Vec<RequesterBody>) -> Vec<(String, RequestTally)> {
        if list.len() > MAX_CLIENTS_PER_RULE {
            self.add(
                || format!("rules[{i}].top_requesters"),
                format!("must have at most {MAX_CLIENTS_PER_RULE} entries"),
            );
        }
        let mut out: Vec<(String, RequestTally)> = Vec::with_capacity(list.len());
        for (j, r) in list.into_iter().enumerate() {
            let at = |field: &str| format!("rules[{i}].top_requesters[{j}].{field}");
            let client = self.client(r.client, || at("client"));
            self.count(|| at("requests"), r.requests);
            self.count(|| at("error"), r.error);
            let tally = RequestTally {
                requests: r.requests,
                error: r.error.min(r.requests),
            };
            merge_into(&mut out, client, tally, RequestTally::add);
        }
        out
    }
}

/// Adds `value` to `client`'s entry in `list`, or appends it.
fn merge_into<T>(list: &mut Vec<(String, T)>, client: String, value: T, add: impl Fn(&mut T, T)) {
    match list.iter_mut().find(|(known, _)| *known == client) {
        Some((_, t)) => add(t, value),
        None => list.push((client, value)),
    }
}

impl ReportBody {
    /// Checks every limit and merges repeated rules and clients; every problem is named.
    pub fn validate(self, now_ms: i64) -> Result<ValidReport, ValidationErrors> {
        let mut problems = Problems(Vec::new());
        if !is_proxy_id(&self.proxy_id) {
            problems.add(|| "proxy_id".into(), PROXY_ID_RULE);
        }
        // `start_ms` is not checked against `end_ms`: JSON Schema cannot compare two
        // fields, so the document admits any pair, and nothing here reads `start_ms`. A
        // proxy whose clock stepped between its two readings still counted real requests.
        for (field, value) in [("start_ms", self.start_ms), ("end_ms", self.end_ms)] {
            if value > MAX_SAFE_INTEGER {
                problems.add(
                    || field.into(),
                    format!("must be at most {MAX_SAFE_INTEGER}"),
                );
            }
        }
        let now = u64::try_from(now_ms).unwrap_or(0);
        if self.end_ms > now.saturating_add(MAX_FUTURE_MS) {
            problems.add(
                || "end_ms".into(),
                "must not be more than 5 minutes in the future (is the proxy's clock right?)",
            );
        }
        if self.ruleset_version > MAX_SAFE_INTEGER {
            problems.add(
                || "ruleset_version".into(),
                format!("must be at most {MAX_SAFE_INTEGER}"),
            );
        }
        problems.count(|| "overflow".into(), self.overflow);
        problems.count(|| "dropped_reports".into(), self.dropped_reports);
        if self.rules.len() > MAX_RULES {
            problems.add(
                || "rules".into(),
                format!("must have at most {MAX_RULES} entries"),
            );
        }
        let mut rules: Vec<ValidRule> = Vec::with_capacity(self.rules.len().min(MAX_RULES));
        let mut index: HashMap<String, usize> = HashMap::new();
        for (i, rule) in self.rules.into_iter().enumerate().take(MAX_RULES + 1) {
            let at = |field: &str| format!("rules[{i}].{field}");
            if rule.rule.is_empty() || rule.rule.chars().count() > MAX_RULE_ID_CHARS {
                problems.add(
                    || at("rule"),
                    format!("must be 1 to {MAX_RULE_ID_CHARS} characters"),
                );
            } else if rule.rule.chars().any(char::is_control) {
                problems.add(|| at("rule"), "must not contain control characters");
            }
            let counts = Counts {
                allowed: rule.allowed,
                denied: rule.denied,
                shadow_denied: rule.shadow_denied,
                near_limit: rule.near_limit,
                fail_open: rule.fail_open,
                key_missing: rule.key_missing,
                tokens_used: rule.tokens_used,
                tokens_throttled: rule.tokens_throttled,
                warned: rule.warned,
                delayed: rule.delayed,
                delay_wait_ms: rule.delay_wait_ms,
                in_flight_refused: rule.in_flight_refused,
            };
            for (name, value) in counts.named() {
                problems.count(|| at(name), value);
            }
            if rule.top_clients.len() > MAX_CLIENTS_PER_RULE {
                problems.add(
                    || at("top_clients"),
                    format!("must have at most {MAX_CLIENTS_PER_RULE} entries"),
                );
            }
            let mut clients: Vec<(String, Tally)> = Vec::with_capacity(rule.top_clients.len());
            for (j, c) in rule.top_clients.into_iter().enumerate() {
                let at = |field: &str| format!("rules[{i}].top_clients[{j}].{field}");
                let client = problems.client(c.client, || at("client"));
                problems.count(|| at("throttled"), c.throttled);
                problems.count(|| at("error"), c.error);
                problems.count(|| at("tokens"), c.tokens);
                // An error above `throttled` says "all of it may be others'", as `throttled`
                // does: kept as that, since the document cannot compare the two fields.
                let tally = Tally {
                    throttled: c.throttled,
                    error: c.error.min(c.throttled),
                    tokens: c.tokens,
                };
                merge_into(&mut clients, client, tally, Tally::add);
            }
            let requesters = problems.requesters(i, rule.top_requesters);
            // A rule listed twice is counted once, with both entries' numbers.
            match index.get(&rule.rule) {
                Some(&k) => {
                    let known = &mut rules[k];
                    known.counts.add(&counts);
                    for (client, tally) in clients {
                        merge_into(&mut known.clients, client, tally, Tally::add);
                    }
                    for (client, tally) in requesters {
                        merge_into(&mut known.requesters, client, tally, RequestTally::add);
                    }
                }
                None => {
                    index.insert(rule.rule.clone(), rules.len());
                    rules.push(ValidRule {
                        index: i,
                        rule: rule.rule,
                        counts,
                        clients,
                        requesters,
                    });
                }
            }
        }
        if !problems.0.is_empty() {
            return Err(ValidationErrors(problems.0));
        }
        Ok(ValidReport {
            proxy_id: self.proxy_id,
            // In range: at most 2^53.
            start_ms: i64::try_from(self.start_ms).unwrap_or(i64::MAX),
            // In range: at most five minutes from now.
            end_ms: i64::try_from(self.end_ms).unwrap_or(i64::MAX),
            ruleset_version: self.ruleset_version,
            rules,
        })
    }
}

/// A refused report: the answer, and the reason it is counted under.
struct Refused {
    error: ApiError,
    reason: RejectReason,
}

impl Refused {
    /// A refusal naming one field.
    fn field(reason: RejectReason, field: String, message: String) -> Refused {
        Refused::fields(reason, vec![FieldError { field, message }])
    }

    fn fields(reason: RejectReason, problems: Vec<FieldError>) -> Refused {
        Refused {
            error: ApiError::Invalid(Input::Report, ValidationErrors(problems)),
            reason,
        }
    }
}

/// Why a report was refused before its content was looked at, for
/// `sluice_admin_reports_rejected_total`.
impl From<ApiError> for Refused {
    fn from(error: ApiError) -> Refused {
        let reason = match &error {
            ApiError::Unauthenticated(_) => RejectReason::Unauthenticated,
            ApiError::Forbidden { .. } => RejectReason::Forbidden,
            ApiError::PayloadTooLarge { .. } => RejectReason::TooLarge,
            ApiError::UnsupportedMediaType(_) => RejectReason::MediaType,
            ApiError::BadRequest(_) | ApiError::Invalid(..) => RejectReason::Invalid,
            ApiError::Unavailable(_) => RejectReason::Overloaded,
            ApiError::TooManyFailures { .. } => RejectReason::Throttled,
            ApiError::TooManyReports { .. } => RejectReason::RateLimited,
            _ => RejectReason::Error,
        };
        Refused { error, reason }
    }
}

#[utoipa::path(
    post, path = "/api/v1/reports", tag = "metrics",
    request_body(content = ReportBody, content_type = "application/json",
        description = "One interval's statistics, as `sluice_core::report::Report` encodes them"),
    responses(
        (status = 204, description = "Accepted: visible in the metrics endpoints at once, stored within ~2 s"),
        (status = 503, description = "The database is not keeping up; send the report again later",
         body = sluice_api::Problem, content_type = "application/problem+json"),
        WriteErrors,
        AuthErrors,
    ),
)]
/// A proxy's report (proxy-role or admin token). Nothing is kept from a refused report.
/// Beyond its shape, a report must name a ruleset version the server issued and rules of
/// the current or the previous version, use a proxy id its token owns, end at least
/// 500 ms (of reported time) after its proxy id's last accepted report, and keep each
/// count within 1,000,000 per second of the time it covers. Each proxy id may send 120
/// reports a minute with a burst of 10 (`sluice serve --report-rate`, `--report-burst`);
/// more are answered 429 with `Retry-After`. The body is at most 1 MiB (413).
pub async fn post_report(
    State(state): State<AppState>,
    // Taken as a `Result` so refusals are counted too; still checked before the body is
    // read.
    auth: Result<Auth<SendReports>, ApiError>,
    request: Request,
) -> Result<StatusCode, ApiError> {
    let started = Instant::now();
    let result = ingest(&state, auth, request).await;
    state.pipeline().instruments().observe_report(
        result
            .as_ref()
            .map(|_| ())
            .map_err(|refused| refused.reason),
        started.elapsed(),
    );
    result
        .map(|()| StatusCode::NO_CONTENT)
        .map_err(|refused| refused.error)
}

async fn ingest(
    state: &AppState,
    auth: Result<Auth<SendReports>, ApiError>,
    request: Request,
) -> Result<(), Refused> {
    let auth = auth?;
    // The TCP peer, when the server provides it (tests driving the router do not).
    let peer = request
        .extensions()
        .get::<ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0);
    let JsonBody(body) = JsonBody::<ReportBody>::from_request(request, state).await?;
    let now = now_ms();
    let report = body
        .validate(now)
        .map_err(|errors| ApiError::Invalid(Input::Report, errors))?;
    issued_only(state, &report).await?;
    state
        .proxy_ids()
        .claim(IdPath::Report, &report.proxy_id, &auth.token)
        .map_err(|refusal: IdRefusal| {
            let message = refusal.message(&report.proxy_id);
            Refused::field(RejectReason::ProxyId, "proxy_id".into(), message)
        })?;
    // Checked and recorded under one lock, so that two copies of one report sent at once
    // cannot both pass.
    let mut seq = state.report_seq();
    seq.arrive(&report.proxy_id, Instant::now())
        .map_err(|retry_after| ApiError::TooManyReports { retry_after })?;
    let window_ms = seq
        .window_ms(&report.proxy_id, report.start_ms, report.end_ms)
        .map_err(|SeqRefusal::Replay { last_end_ms }| {
            let message = format!(
                "must be at least 500 ms after this proxy's last accepted report ({last_end_ms}): a report is counted once"
            );
            Refused::field(RejectReason::Replay, "end_ms".into(), message)
        })?;
    within_ceiling(&report, window_ms)?;
    state
        .pipeline()
        .ingest(
            &report,
            Some(auth.token.id.clone()),
            peer.map_or_else(|| "unknown".to_string(), |p| p.to_string()),
            now,
        )
        .map_err(|e| ApiError::Unavailable(e.to_string()))?;
    seq.accept(&report.proxy_id, report.end_ms);
    Ok(())
}

/// Refuses a report naming a ruleset version or a rule the server never issued.
async fn issued_only(state: &AppState, report: &ValidReport) -> Result<(), Refused> {
    state.refresh_issued().await.map_err(ApiError::from)?;
    if issued_check(state, report).is_err() {
        // This replica may not have heard of a newer version yet: ask the store once.
        let newest = state
            .store()
            .current_version()
            .await
            .map_err(ApiError::from)?;
        state.committed(newest);
        state.refresh_issued().await.map_err(ApiError::from)?;
    }
    issued_check(state, report)
}

fn issued_check(state: &AppState, report: &ValidReport) -> Result<(), Refused> {
    let current = *state.inner.version.borrow();
    if report.ruleset_version > current {
        return Err(Refused::field(
            RejectReason::UnknownVersion,
            "ruleset_version".into(),
            format!("no ruleset version after {current} was issued"),
        ));
    }
    let issued = state.issued();
    let unknown: Vec<FieldError> = report
        .rules
        .iter()
        .filter(|r| !issued.has_rule(&r.rule))
        .take(MAX_PROBLEMS)
        .map(|r| FieldError {
            field: format!("rules[{}].rule", r.index),
            message: "is not a rule of the current or the previous ruleset version".into(),
        })
        .collect();
    if unknown.is_empty() {
        Ok(())
    } else {
        Err(Refused::fields(RejectReason::UnknownRule, unknown))
    }
}

/// Refuses a report with a count above what `window_ms` makes possible.
fn within_ceiling(report: &ValidReport, window_ms: i64) -> Result<(), Refused> {
    let most = ceiling(window_ms);
    let mut over = Vec::new();
    for rule in &report.rules {
        // Requests only: a request can use thousands of tokens, and token counts are held
        // to the absolute bound every count has.
        let counts = rule.counts.named().into_iter().take(REQUEST_COUNTS);
        let clients = rule
            .clients
            .iter()
            .map(|(_, t)| ("top_clients", t.throttled));
        let requesters = (rule.requesters.iter()).map(|(_, t)| ("top_requesters", t.requests));
        for (name, value) in counts.chain(clients).chain(requesters) {
            if value > most && over.len() < MAX_PROBLEMS {
                over.push(FieldError {
                    field: format!("rules[{}].{name}", rule.index),
                    message: format!(
                        "must be at most {most}: 1,000,000 a second over the {window_ms} ms this report covers"
                    ),
                });
            }
        }
    }
    if over.is_empty() {
        Ok(())
    } else {
        Err(Refused::fields(RejectReason::OverCeiling, over))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::body::parse_json;
    use serde_json::json;
    use sluice_core::report::{
        ClientCount, ClientRequests, Report, RuleBatch, RuleCounts, RuleReport,
    };

    const NOW: i64 = 1_800_000_000_000;

    fn core_report() -> Report {
        Report {
            proxy_id: "envoy-1".into(),
            start_ms: 1_799_999_998_000,
            end_ms: 1_800_000_000_000,
            ruleset_version: 7,
            batch: RuleBatch {
                rules: vec![RuleReport {
                    rule: "api".into(),
                    counts: RuleCounts {
                        allowed: 1,
                        denied: 2,
                        shadow_denied: 3,
                        near_limit: 4,
                        fail_open: 5,
                        key_missing: 6,
                        tokens_used: 7,
                        tokens_throttled: 8,
                        warned: 10,
                        delayed: 11,
                        delay_wait_ms: 12,
                        in_flight_refused: 13,
                    },
                    top_clients: vec![ClientCount {
                        client: "acme".into(),
                        throttled: 5,
                        error: 1,
                        tokens: 9,
                    }],
                    top_requesters: vec![ClientRequests {
                        client: "acme".into(),
                        requests: 40,
                        error: 2,
                    }],
                }],
                overflow: 8,
            },
            dropped_reports: 9,
        }
    }

    /// The mirror reads exactly what the core writes, and refuses what the core refuses.
    #[test]
    fn the_mirror_matches_the_core_encoding() {
        let bytes = core_report().to_json();
        let body: ReportBody = parse_json(&bytes).unwrap();
        let valid = body.validate(NOW).unwrap();
        assert_eq!(valid.proxy_id, "envoy-1");
        assert_eq!(valid.end_ms, NOW);
        assert_eq!(valid.ruleset_version, 7);
        let r = &valid.rules[0];
        assert_eq!(
            (
                r.counts.allowed,
                r.counts.denied,
                r.counts.shadow_denied,
                r.counts.near_limit,
                r.counts.fail_open,
                r.counts.key_missing,
                r.counts.tokens_used,
                r.counts.tokens_throttled,
                r.counts.warned,
                r.counts.delayed,
                r.counts.delay_wait_ms,
                r.counts.in_flight_refused,
            ),
            (1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 12, 13)
        );
        assert_eq!(
            r.clients,
            vec![(
                "acme".to_string(),
                Tally {
                    throttled: 5,
                    error: 1,
                    tokens: 9,
                }
            )]
        );
        // Every key the core writes is one the mirror knows, at every level.
        let full: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        let keys =
            |v: &serde_json::Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
        assert_eq!(
            keys(&full).len(),
            7,
            "the core's Report changed: update ReportBody"
        );
        assert_eq!(keys(&full["rules"][0]).len(), 15, "RuleReport changed");
        assert_eq!(keys(&full["rules"][0]["top_requesters"][0]).len(), 3);
        assert_eq!(
            r.requesters,
            vec![(
                "acme".to_string(),
                RequestTally {
                    requests: 40,
                    error: 2
                }
            )]
        );
        assert_eq!(keys(&full["rules"][0]["top_clients"][0]).len(), 4);
        // The smallest report the core accepts, the mirror accepts too; and vice versa
        // for what it refuses.
        for (body, core_ok) in [
            (
                json!({"proxy_id":"p","start_ms":1,"end_ms":2,"ruleset_version":0,"rules":[]}),
                true,
            ),
            (
                json!({"proxy_id":"p","start_ms":1,"end_ms":2,"ruleset_version":0}),
                false,
            ),
            (
                json!({"proxy_id":"p","start_ms":1,"end_ms":2,"ruleset_version":0,"rules":[{"rule":"a"}]}),
                true,
            ),
            (
                json!({"proxy_id":"p","start_ms":1,"end_ms":2,"ruleset_version":0,"rules":[{"rule":"a","x":1}]}),
                false,
            ),
            (
                json!({"proxy_id":"p","start_ms":1,"end_ms":2,"ruleset_version":0,"rules":[{"rule":"a","top_clients":[{"client":"c"}]}]}),
                false,
            ),
        ] {
            let bytes = serde_json::to_vec(&body).unwrap();
            assert_eq!(
                serde_json::from_slice::<Report>(&bytes).is_ok(),
                core_ok,
                "{body}"
            );
            assert_eq!(parse_json::<ReportBody>(&bytes).is_ok(), core_ok, "{body}");
        }
    }

    fn problems(body: serde_json::Value) -> Vec<String> {
        match parse_json::<ReportBody>(&serde_json::to_vec(&body).unwrap()) {
            Err(ApiError::Invalid(_, e)) => e.0.into_iter().map(|f| f.field).collect(),
            Err(other) => panic!("{other:?}"),
            Ok(body) => body
                .validate(NOW)
                .err()
                .map(|e| e.0.into_iter().map(|f| f.field).collect())
                .unwrap_or_default(),
        }
    }

    #[test]
    fn every_problem_is_named() {
        let base = |patch: serde_json::Value| {
            let mut v = json!({"proxy_id":"p","start_ms":NOW - 1000,"end_ms":NOW,"ruleset_version":1,
                "rules":[{"rule":"a","allowed":1,"top_clients":[{"client":"c","throttled":1}]}]});
            crate::http::body::merge_patch(&mut v, &patch);
            v
        };
        assert!(problems(base(json!({}))).is_empty());
        assert_eq!(problems(base(json!({"proxy_id": ""}))), ["proxy_id"]);
        assert_eq!(problems(base(json!({"proxy_id": "a b"}))), ["proxy_id"]);
        assert_eq!(
            problems(base(json!({"proxy_id": "x".repeat(129)}))),
            ["proxy_id"]
        );
        // Any start is taken, within the document's bound.
        assert!(problems(base(json!({"start_ms": NOW + 1}))).is_empty());
        assert!(problems(base(json!({"start_ms": 0}))).is_empty());
        assert_eq!(
            problems(base(json!({"start_ms": MAX_SAFE_INTEGER + 1}))),
            ["start_ms"]
        );
        assert_eq!(
            problems(base(json!({"start_ms": NOW, "end_ms": NOW + 300_001}))),
            ["end_ms"]
        );
        assert_eq!(problems(base(json!({"surprise": 1}))), ["surprise"]);
        assert_eq!(problems(base(json!({"end_ms": -5}))), ["end_ms"]);
        assert_eq!(
            problems(base(json!({"rules": [{"rule": "a", "denied": "many"}]}))),
            ["rules[0].denied"]
        );
        assert_eq!(
            problems(base(json!({"rules": [{"rule": "a", "deny": 1}]}))),
            ["rules[0].deny"]
        );
        assert_eq!(
            problems(base(
                json!({"rules": [{"rule": ""}, {"rule": "x\ny"}, {"rule": "b", "allowed": MAX_COUNT + 1}]})
            )),
            ["rules[0].rule", "rules[1].rule", "rules[2].allowed"]
        );
        assert_eq!(
            problems(base(
                json!({"rules": [{"rule": "a", "top_clients": [{"client": "c", "throttled": 1, "who": 2}]}]})
            )),
            ["rules[0].top_clients[0].who"]
        );
        assert_eq!(
            problems(base(
                json!({"rules": [{"rule": "a", "top_clients": [{"client": "c".repeat(257), "throttled": 2, "error": 3}]}]})
            )),
            ["rules[0].top_clients[0].client"]
        );
        let many: Vec<_> = (0..101)
            .map(|i| json!({"client": format!("c{i}"), "throttled": 1}))
            .collect();
        assert_eq!(
            problems(base(json!({"rules": [{"rule": "a", "top_clients": many}]}))),
            ["rules[0].top_clients"]
        );
        let rules: Vec<_> = (0..1001)
            .map(|i| json!({"rule": format!("r{i}")}))
            .collect();
        assert_eq!(problems(base(json!({"rules": rules}))), ["rules"]);
    }

    #[test]
    fn repeated_rules_and_clients_are_merged_and_nul_is_replaced() {
        let body: ReportBody = parse_json(
            &serde_json::to_vec(&json!({"proxy_id":"p","start_ms":NOW,"end_ms":NOW,"ruleset_version":1,
                "rules":[{"rule":"a","denied":1,"top_clients":[{"client":"c","throttled":1},{"client":"c","throttled":2}]},
                         {"rule":"a","denied":2,"top_clients":[{"client":"c","throttled":4},{"client":"x\u{0}y","throttled":1}]}]}))
            .unwrap(),
        )
        .unwrap();
        let valid = body.validate(NOW).unwrap();
        assert_eq!(valid.rules.len(), 1);
        assert_eq!(valid.rules[0].counts.denied, 3);
        assert_eq!(valid.rules[0].clients[0].1.throttled, 7);
        assert_eq!(valid.rules[0].clients[1].0, "x\u{fffd}y");
    }
}
