//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`: the call converted to
//! the core's [`RlsRequest`], checked against its bounds, planned over the RLS rules in
//! force, charged through the coordinator's bucket store with the core's pure
//! [`sluice_core::rls::decide`], and answered with one status per descriptor.

use std::sync::Arc;
use std::time::Instant;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code as PbCode, DescriptorStatus, RateLimit, rate_limit::Unit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{
    Duration as PbDuration, ListValue, Struct as PbStruct, Value as PbValue,
};
use sluice_core::gcra::ceil_seconds;
use sluice_core::rls::outcome::outcomes;
use sluice_core::rls::{Code, Plan, RlsDescriptor, RlsRequest, Status, decide, failed};
use sluice_core::rule::Limit;
use sluice_core::ruleset::RuleOutcome;
use sluice_core::spec::FailureMode;

use super::auth::{self, RlsAuth};
use super::rules::Current;
use super::stats::Stats;
use crate::http::{AppState, CodeLabel, OutcomeLabel, ReasonLabel};

/// The service: the server's state (its coordinator and metrics) and the rules in force.
#[derive(Debug, Clone)]
pub(crate) struct Rls {
    pub(crate) state: AppState,
    pub(crate) rules: Current,
    pub(crate) stats: Arc<Stats>,
    pub(crate) auth: RlsAuth,
}

/// The core's request from the wire's, refusing what the core cannot represent.
fn request(pb: RateLimitRequest) -> Result<RlsRequest, tonic::Status> {
    let descriptors = pb
        .descriptors
        .into_iter()
        .enumerate()
        .map(|(i, d)| descriptor(i, d))
        .collect::<Result<_, _>>()?;
    Ok(RlsRequest {
        domain: pb.domain,
        descriptors,
        hits_addend: u64::from(pb.hits_addend),
    })
}

fn descriptor(i: usize, d: RateLimitDescriptor) -> Result<RlsDescriptor, tonic::Status> {
    if d.is_negative_hits {
        return Err(tonic::Status::invalid_argument(format!(
            "descriptors[{i}].is_negative_hits: giving tokens back is not supported"
        )));
    }
    Ok(RlsDescriptor {
        entries: d.entries.into_iter().map(|e| (e.key, e.value)).collect(),
        hits_addend: d.hits_addend.map(|h| h.value),
    })
}

/// A limit as `RateLimit` says it: requests per unit, in the shortest unit at least as
/// long as the period that holds a whole number of requests (10 per second as is, 10 per
/// 30 s as 20 per minute), else per second rounded up.
fn rate_limit(limit: &Limit, name: &str) -> RateLimit {
    let units: [(u128, Unit); 5] = [
        (1, Unit::Second),
        (60, Unit::Minute),
        (3_600, Unit::Hour),
        (86_400, Unit::Day),
        (7 * 86_400, Unit::Week),
    ];
    let (per, unit) = units
        .iter()
        .filter(|(seconds, _)| *seconds >= u128::from(limit.period_seconds))
        .find_map(|(seconds, unit)| {
            let scaled = u128::from(limit.requests) * seconds;
            let period = u128::from(limit.period_seconds);
            (scaled % period == 0).then(|| (scaled / period, *unit))
        })
        .unwrap_or_else(|| {
            (
                u128::from(limit.requests.div_ceil(limit.period_seconds)),
                Unit::Second,
            )
        });
    RateLimit {
        name: name.to_string(),
        requests_per_unit: u32::try_from(per).unwrap_or(u32::MAX),
        unit: unit as i32,
    }
}

fn code(code: Code) -> i32 {
    match code {
        Code::Ok => PbCode::Ok as i32,
        Code::OverLimit => PbCode::OverLimit as i32,
    }
}

/// Whole seconds, rounded up as `Retry-After` is: Envoy writes `X-RateLimit-Reset` from
/// the seconds alone, and a wait of 20 ms must not read as 0.
fn duration(ns: u64) -> PbDuration {
    PbDuration {
        seconds: i64::try_from(ceil_seconds(ns)).unwrap_or(i64::MAX),
        nanos: 0,
    }
}

/// The request header naming the shadow rules that would have denied the request (the
/// rule names, comma-separated), added to the request Envoy forwards.
pub(crate) const SHADOW_DENIED_HEADER: &str = "x-sluice-shadow-denied";

/// What Envoy learns of shadow rules that would have denied: [`SHADOW_DENIED_HEADER`] on
/// the forwarded request, and envoyproxy/ratelimit's quota-mode dynamic metadata
/// (`quotaModeEnabled`, `quotaModeViolations`: the descriptors' indices) for the filters
/// after the rate limit filter. Nothing when none would have.
fn shadow_denials(plan: &Plan, statuses: &[Status]) -> (Vec<HeaderValue>, Option<PbStruct>) {
    let denied: Vec<(usize, &str)> = statuses
        .iter()
        .zip(&plan.descriptors)
        .enumerate()
        .filter(|(_, (s, _))| s.shadow_denied)
        .filter_map(|(i, (_, p))| p.rule.as_ref().map(|m| (i, m.rule_name.as_str())))
        .collect();
    if denied.is_empty() {
        return (Vec::new(), None);
    }
    let mut names: Vec<&str> = denied.iter().map(|(_, name)| *name).collect();
    names.dedup();
    let header = HeaderValue {
        key: SHADOW_DENIED_HEADER.into(),
        value: names.join(","),
        ..HeaderValue::default()
    };
    let number = |n: f64| PbValue {
        kind: Some(Kind::NumberValue(n)),
    };
    let violations = denied.iter().map(|(i, _)| number(*i as f64)).collect();
    let metadata = PbStruct {
        fields: [
            (
                "quotaModeEnabled".to_string(),
                PbValue {
                    kind: Some(Kind::BoolValue(true)),
                },
            ),
            (
                "quotaModeViolations".to_string(),
                PbValue {
                    kind: Some(Kind::ListValue(ListValue { values: violations })),
                },
            ),
        ]
        .into_iter()
        .collect(),
    };
    (vec![header], Some(metadata))
}

fn response(plan: &Plan, statuses: &[Status]) -> RateLimitResponse {
    let statuses_pb = statuses
        .iter()
        .zip(&plan.descriptors)
        .map(|(s, planned)| DescriptorStatus {
            code: code(s.code),
            current_limit: {
                let name = planned.rule.as_ref().map_or("", |m| m.rule_name.as_str());
                match (s.limit.as_ref(), s.deny_listed) {
                    (Some(limit), _) => Some(rate_limit(limit, name)),
                    // A deny list reads as ratelimit's limit of 0.
                    (None, true) => Some(RateLimit {
                        name: name.to_string(),
                        requests_per_unit: 0,
                        unit: Unit::Second as i32,
                    }),
                    (None, false) => None,
                }
            },
            limit_remaining: u32::try_from(s.remaining).unwrap_or(u32::MAX),
            duration_until_reset: s.limit.map(|_| duration(s.reset_ns)),
            ..DescriptorStatus::default()
        })
        .collect();
    let (request_headers_to_add, dynamic_metadata) = shadow_denials(plan, statuses);
    RateLimitResponse {
        overall_code: code(sluice_core::rls::verdict::overall(statuses)),
        statuses: statuses_pb,
        request_headers_to_add,
        dynamic_metadata,
        ..RateLimitResponse::default()
    }
}

impl Rls {
    /// Decides a checked request: charges its buckets, or applies the failure modes.
    async fn decide(&self, request: &RlsRequest) -> (Plan, Vec<Status>) {
        let plan = self.rules.get().plan(request);
        let buckets = plan.buckets();
        if buckets.is_empty() {
            let statuses = decide(&plan, &[], sluice_core::time::Nanos::ZERO).statuses;
            return (plan, statuses);
        }
        let charged = self
            .state
            .coordinator()
            .charge(&buckets, Instant::now(), |now, tats| {
                let decided = decide(&plan, tats, now);
                let writes = decided.writes.clone();
                (decided, writes)
            })
            .await;
        match charged {
            Ok(decided) => (plan, decided.statuses),
            Err(err) => {
                tracing::debug!(%err, "rate limit service: buckets not charged");
                self.state
                    .rls_metrics()
                    .failures
                    .get_or_create(&ReasonLabel {
                        reason: err.reason(),
                    })
                    .inc();
                let statuses = failed(&plan, FailureMode::Open);
                (plan, statuses)
            }
        }
    }

    fn count(&self, plan: &Plan, statuses: &[Status]) {
        let metrics = self.state.rls_metrics();
        for (planned, outcome) in outcomes(plan, statuses) {
            let unlimited = planned
                .rule
                .as_ref()
                .is_none_or(|m| m.answer == sluice_core::rls::Answer::Unlimited);
            let outcome = match outcome {
                _ if unlimited => "unlimited",
                // A descriptor's values are its key: it is never missing one.
                RuleOutcome::Allowed { .. } | RuleOutcome::KeyMissing => "allowed",
                RuleOutcome::Denied => "denied",
                RuleOutcome::ShadowDenied => "shadow_denied",
                RuleOutcome::NotCharged => "not_charged",
                RuleOutcome::FailedOpen => "failed_open",
                RuleOutcome::FailedClosed => "failed_closed",
                // A descriptor rule delays nothing, holds no in-flight places and is
                // never in warn mode or soft (its validation refuses them): the service
                // never answers these.
                RuleOutcome::Delayed { .. } | RuleOutcome::Warned => "allowed",
                RuleOutcome::InFlightRefused => "denied",
            };
            metrics
                .descriptors
                .get_or_create(&OutcomeLabel { outcome })
                .inc();
        }
        let code = match sluice_core::rls::verdict::overall(statuses) {
            Code::Ok => "ok",
            Code::OverLimit => "over_limit",
        };
        metrics.requests.get_or_create(&CodeLabel { code }).inc();
    }
}

#[tonic::async_trait]
impl RateLimitService for Rls {
    async fn should_rate_limit(
        &self,
        call: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        auth::check(&self.state, self.auth, &call).await?;
        let checked = request(call.into_inner()).and_then(|r| {
            r.check()
                .map(|()| r)
                .map_err(|e| tonic::Status::invalid_argument(e.to_string()))
        });
        let request = match checked {
            Ok(request) => request,
            Err(status) => {
                self.state
                    .rls_metrics()
                    .requests
                    .get_or_create(&CodeLabel { code: "invalid" })
                    .inc();
                return Err(status);
            }
        };
        let (plan, statuses) = self.decide(&request).await;
        self.count(&plan, &statuses);
        self.stats.record(&plan, &statuses);
        Ok(tonic::Response::new(response(&plan, &statuses)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::spec::LimitSpec;

    fn limit(requests: u64, period: u64) -> Limit {
        let spec: LimitSpec =
            serde_json::from_value(serde_json::json!({"requests": requests, "period": period}))
                .unwrap();
        let rule: sluice_core::spec::RuleSpec = serde_json::from_value(serde_json::json!({
            "name": "r", "key": "global", "limits": [spec]
        }))
        .unwrap();
        sluice_core::rule::Rule::try_from(rule).unwrap().limits[0]
    }

    #[test]
    fn limits_are_said_in_the_largest_whole_unit() {
        let said = |r, p| {
            let l = rate_limit(&limit(r, p), "n");
            (l.requests_per_unit, Unit::try_from(l.unit).unwrap())
        };
        assert_eq!(said(10, 1), (10, Unit::Second));
        assert_eq!(said(7, 3), (140, Unit::Minute));
        assert_eq!(said(10, 30), (20, Unit::Minute));
        assert_eq!(said(100, 86_400), (100, Unit::Day));
        assert_eq!(said(3, 7 * 86_400), (3, Unit::Week));
        assert_eq!(
            said(1, 30 * 86_400),
            (1, Unit::Second),
            "longer than a week: rounded up"
        );
    }
}
