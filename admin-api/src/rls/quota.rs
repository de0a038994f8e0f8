//! `envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas` (RLQS,
//! experimental): Envoy's `rate_limit_quota` filter streams usage reports, and each
//! report is answered with one action per bucket it names. The decisions are the core's
//! (`sluice_core::rls::quota`: bucket ids read as descriptors, usage charged to the
//! coordinator's buckets, token-bucket shares); this is the stream's glue and its bounds.
//!
//! A stream is long-lived and driven by its client, so everything it can hold is bounded:
//! streams in all (`--rlqs-max-streams`, more refused `RESOURCE_EXHAUSTED`), buckets per
//! stream (`--rlqs-max-buckets`, new ones past it get no assignment), the message size
//! (the listener's), streams per connection (the listener's HTTP/2 streams) and the time
//! between two reports (`--rlqs-idle-timeout`, then the stream ends). A bucket Envoy
//! reported no request for during `--rlqs-abandon-after` is abandoned (Envoy drops it,
//! and so does the stream).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use envoy_types::pb::envoy::r#type::v3::TokenBucket;
use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::r#type::v3::RateLimitStrategy;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    AbandonAction, BucketAction as Action, QuotaAssignmentAction,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaService;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::google::protobuf::{Duration as PbDuration, UInt32Value};
use sluice_core::hash::client_fingerprint;
use sluice_core::rls::quota::{Assignment, assign, charge_usage, request};
use sluice_core::rls::{Matched, RlsRequest};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

use super::auth::{self, RlsAuth};
use super::limits::{ASSIGNMENT_TTL, RlsLimits};
use super::rules::Current;
use super::stats::Stats;
use crate::http::{AppState, ReasonLabel};

/// The quota service: the server's state, the rules in force, and what its streams hold.
#[derive(Debug, Clone)]
pub(crate) struct Rlqs {
    pub(crate) state: AppState,
    pub(crate) rules: Current,
    /// Where each report's usage is counted for its rule, with the RLS calls' decisions.
    pub(crate) stats: Arc<Stats>,
    pub(crate) limits: RlsLimits,
    pub(crate) streams: Arc<Semaphore>,
    /// How many streams hold each client's bucket (by rule and client), which divides
    /// its rate and burst among them.
    pub(crate) holders: Arc<Mutex<HashMap<u64, u64>>>,
    /// What a stream's opening call must show.
    pub(crate) auth: RlsAuth,
}

impl Rlqs {
    pub(crate) fn new(
        state: AppState,
        rules: Current,
        stats: Arc<Stats>,
        limits: RlsLimits,
        auth: RlsAuth,
    ) -> Rlqs {
        Rlqs {
            auth,
            state,
            rules,
            stats,
            streams: Arc::new(Semaphore::new(limits.max_quota_streams)),
            limits,
            holders: Arc::default(),
        }
    }

    fn refused(&self, reason: &'static str) {
        self.state
            .rls_metrics()
            .quota_refused
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }
}

/// A bucket a stream holds: the client's bucket it is counted on, and what it was
/// assigned on what basis.
#[derive(Debug)]
struct Held {
    holder: Option<u64>,
    /// The assignment with no bucket level applied: when it changes (a rule edited,
    /// streams come or go), a new assignment is made; else the same one is sent again,
    /// so that Envoy keeps its token bucket's level.
    basis: Assignment,
    sent: Assignment,
    last_active: Instant,
}

/// One stream's buckets, by their entries in key order; gives its holds back when it ends.
struct Stream {
    service: Rlqs,
    domain: Option<String>,
    buckets: HashMap<Vec<(String, String)>, Held>,
    _permit: OwnedSemaphorePermit,
}

impl Drop for Stream {
    fn drop(&mut self) {
        for held in self.buckets.values() {
            release(&self.service.holders, held.holder);
        }
        self.service.state.rls_metrics().quota_streams.dec();
    }
}

fn take(holders: &Mutex<HashMap<u64, u64>>, holder: Option<u64>) -> u64 {
    let Some(holder) = holder else { return 1 };
    let mut map = holders
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let n = map.entry(holder).or_default();
    *n += 1;
    *n
}

fn count(holders: &Mutex<HashMap<u64, u64>>, holder: Option<u64>) -> u64 {
    let map = holders
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    holder.and_then(|h| map.get(&h).copied()).unwrap_or(1)
}

fn release(holders: &Mutex<HashMap<u64, u64>>, holder: Option<u64>) {
    let Some(holder) = holder else { return };
    let mut map = holders
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(n) = map.get_mut(&holder) {
        *n -= 1;
        if *n == 0 {
            map.remove(&holder);
        }
    }
}

/// Checks a whole report before anything is charged: its domain, the number of buckets
/// and each bucket id as the descriptor it stands for. Returns the requests in order.
fn check(
    reports: &RateLimitQuotaUsageReports,
    limits: &RlsLimits,
) -> Result<Vec<RlsRequest>, tonic::Status> {
    if reports.bucket_quota_usages.len() > limits.max_stream_buckets {
        return Err(tonic::Status::invalid_argument(format!(
            "bucket_quota_usages: at most {} per report",
            limits.max_stream_buckets
        )));
    }
    reports
        .bucket_quota_usages
        .iter()
        .enumerate()
        .map(|(i, usage)| {
            let bucket = usage
                .bucket_id
                .as_ref()
                .map(|b| &b.bucket)
                .filter(|b| !b.is_empty());
            let Some(bucket) = bucket else {
                return Err(tonic::Status::invalid_argument(format!(
                    "bucket_quota_usages[{i}].bucket_id: must name at least one entry"
                )));
            };
            let request = request(&reports.domain, bucket);
            request.check().map_err(|e| {
                let field = e.field.replace(
                    "descriptors[0].entries",
                    &format!("bucket_quota_usages[{i}].bucket_id"),
                );
                tonic::Status::invalid_argument(format!("{field}: {}", e.message))
            })?;
            Ok(request)
        })
        .collect()
}

fn strategy(assignment: Assignment) -> RateLimitStrategy {
    let strategy = match assignment {
        Assignment::AllowAll => Strategy::BlanketRule(BlanketRule::AllowAll as i32),
        Assignment::DenyAll => Strategy::BlanketRule(BlanketRule::DenyAll as i32),
        Assignment::TokenBucket {
            max_tokens,
            tokens_per_fill,
            fill_interval_seconds,
        } => Strategy::TokenBucket(TokenBucket {
            max_tokens,
            tokens_per_fill: Some(UInt32Value {
                value: tokens_per_fill,
            }),
            fill_interval: Some(PbDuration {
                seconds: i64::try_from(fill_interval_seconds).unwrap_or(i64::MAX),
                nanos: 0,
            }),
        }),
    };
    RateLimitStrategy {
        strategy: Some(strategy),
    }
}

fn assignment_action(bucket_id: BucketId, assignment: Assignment) -> BucketAction {
    BucketAction {
        bucket_id: Some(bucket_id),
        bucket_action: Some(Action::QuotaAssignmentAction(QuotaAssignmentAction {
            assignment_time_to_live: Some(PbDuration {
                seconds: i64::try_from(ASSIGNMENT_TTL.as_secs()).unwrap_or(i64::MAX),
                nanos: 0,
            }),
            rate_limit_strategy: Some(strategy(assignment)),
        })),
    }
}

impl Stream {
    /// Charges a checked report's usage and answers each of its buckets.
    async fn answer(
        &mut self,
        reports: RateLimitQuotaUsageReports,
        requests: Vec<RlsRequest>,
    ) -> RateLimitQuotaResponse {
        let service = self.service.clone();
        let now = Instant::now();
        let rules = service.rules.get();
        let mut actions = Vec::with_capacity(requests.len());
        for (usage, request) in reports.bucket_quota_usages.into_iter().zip(requests) {
            let entries = request.descriptors[0].entries.clone();
            let bucket_id = usage.bucket_id.unwrap_or_default();
            let active = usage.num_requests_allowed > 0 || usage.num_requests_denied > 0;
            if let Some(held) = self.buckets.get(&entries)
                && !active
                && now.duration_since(held.last_active) >= service.limits.abandon_after
            {
                release(&service.holders, held.holder);
                self.buckets.remove(&entries);
                actions.push(BucketAction {
                    bucket_id: Some(bucket_id),
                    bucket_action: Some(Action::AbandonAction(AbandonAction {})),
                });
                continue;
            }
            let fresh = !self.buckets.contains_key(&entries);
            if fresh && self.buckets.len() >= service.limits.max_stream_buckets {
                // No assignment: Envoy applies its no-assignment behaviour to it.
                service.refused("max_stream_buckets");
                continue;
            }
            let matched: Option<Matched> = rules.plan(&request).descriptors.remove(0).rule;
            let holder = matched
                .as_ref()
                .filter(|m| !m.charges.is_empty())
                .map(|m| client_fingerprint(&m.rule_id, &m.client));
            let held = self.buckets.entry(entries).or_insert_with(|| Held {
                holder: None,
                basis: Assignment::AllowAll,
                sent: Assignment::AllowAll,
                last_active: now,
            });
            if held.holder != holder {
                release(&service.holders, held.holder);
                take(&service.holders, holder);
                held.holder = holder;
            }
            let charged = match &matched {
                Some(m) if !m.charges.is_empty() => {
                    let ids: Vec<u64> = m.charges.iter().map(|c| c.bucket).collect();
                    let allowed = usage.num_requests_allowed;
                    let charged = service
                        .state
                        .coordinator()
                        .charge(&ids, now, |at, tats| {
                            let charge = charge_usage(m, tats, at, allowed);
                            ((charge.left, charge.shadow_denied), charge.writes)
                        })
                        .await;
                    match charged {
                        Ok(charged) => Some(charged),
                        Err(err) => {
                            tracing::debug!(%err, "quota service: usage not charged");
                            service
                                .state
                                .rls_metrics()
                                .failures
                                .get_or_create(&ReasonLabel {
                                    reason: err.reason(),
                                })
                                .inc();
                            None
                        }
                    }
                }
                _ => None,
            };
            if active {
                held.last_active = now;
                if let Some(m) = &matched {
                    // Unknown when the buckets could not be charged: all count as allowed.
                    let shadow_denied = charged.map_or(0, |(_, shadow_denied)| shadow_denied);
                    service.stats.record_quota(
                        m,
                        usage.num_requests_allowed,
                        usage.num_requests_denied,
                        shadow_denied,
                    );
                }
            }
            let left = charged.map(|(left, _)| left);
            let holders = count(&service.holders, held.holder);
            let basis = assign(matched.as_ref(), holders, None);
            if fresh || basis != held.basis {
                held.basis = basis;
                held.sent = assign(matched.as_ref(), holders, left);
            }
            actions.push(assignment_action(bucket_id, held.sent));
        }
        RateLimitQuotaResponse {
            bucket_action: actions,
        }
    }

    /// Serves the stream until its client ends it, breaks a bound or goes quiet.
    async fn run(
        mut self,
        mut inbound: Streaming<RateLimitQuotaUsageReports>,
        outbound: mpsc::Sender<Result<RateLimitQuotaResponse, tonic::Status>>,
    ) {
        let idle = self.service.limits.quota_idle_timeout;
        loop {
            let next = tokio::select! {
                next = tokio::time::timeout(idle, inbound.message()) => next,
                () = outbound.closed() => return,
                // Ends the stream (OK) so that a graceful stop is not held up by it.
                () = self.service.state.shutting_down() => return,
            };
            let reports = match next {
                Ok(Ok(Some(reports))) => reports,
                // The client half-closed: the stream is over.
                Ok(Ok(None)) => return,
                // Undecodable or over the message size: say so and end.
                Ok(Err(status)) => {
                    self.service.refused("invalid");
                    let _ = outbound.send(Err(status)).await;
                    return;
                }
                Err(_) => {
                    self.service.refused("idle");
                    let _ = outbound
                        .send(Err(tonic::Status::deadline_exceeded(format!(
                            "no usage report for {}",
                            humantime::format_duration(idle)
                        ))))
                        .await;
                    return;
                }
            };
            if self.domain.get_or_insert_with(|| reports.domain.clone()) != &reports.domain {
                self.service.refused("invalid");
                let _ = outbound
                    .send(Err(tonic::Status::invalid_argument(
                        "domain: a stream keeps the domain of its first report",
                    )))
                    .await;
                return;
            }
            let requests = match check(&reports, &self.service.limits) {
                Ok(requests) => requests,
                Err(status) => {
                    self.service.refused("invalid");
                    let _ = outbound.send(Err(status)).await;
                    return;
                }
            };
            self.service.state.rls_metrics().quota_reports.inc();
            let response = self.answer(reports, requests).await;
            if response.bucket_action.is_empty() {
                continue;
            }
            // A client that reads no answers is left behind after one idle timeout.
            let sent = tokio::time::timeout(idle, outbound.send(Ok(response))).await;
            if !matches!(sent, Ok(Ok(()))) {
                return;
            }
        }
    }
}

#[tonic::async_trait]
impl RateLimitQuotaService for Rlqs {
    type StreamRateLimitQuotasStream =
        ReceiverStream<Result<RateLimitQuotaResponse, tonic::Status>>;

    async fn stream_rate_limit_quotas(
        &self,
        call: tonic::Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<tonic::Response<Self::StreamRateLimitQuotasStream>, tonic::Status> {
        auth::check(&self.state, self.auth, &call).await?;
        let Ok(permit) = self.streams.clone().try_acquire_owned() else {
            self.refused("max_streams");
            return Err(tonic::Status::resource_exhausted(format!(
                "at most {} quota streams are open at once",
                self.limits.max_quota_streams
            )));
        };
        self.state.rls_metrics().quota_streams.inc();
        let stream = Stream {
            service: self.clone(),
            domain: None,
            buckets: HashMap::new(),
            _permit: permit,
        };
        let (send, receive) = mpsc::channel(4);
        tokio::spawn(stream.run(call.into_inner(), send));
        Ok(tonic::Response::new(ReceiverStream::new(receive)))
    }
}
