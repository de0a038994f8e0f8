//! The request context: reads the request, asks the core, answers or forwards.
//!
//! Nothing here blocks or performs network I/O: a decision is a handful of shared-data
//! reads and compare-and-swap writes on this worker's thread.

use std::rc::Rc;

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, GrpcStatusCode, MapType};

use sluice_core::grpc::{self, GrpcAnswer, GrpcFlavour};
use sluice_core::response::{self, RateLimitFields, RateLimitHeaders};
use sluice_core::ruleset::{Decision, DecisionContext, GlobalBuckets, Outcome};
use sluice_core::spec::GrpcStatus;

use crate::metrics::Metrics;
use crate::request::LazyRequest;
use crate::shared::Shared;
use crate::{clock, global_channel};

#[derive(Debug)]
pub struct SluiceHttp {
    shared: Rc<Shared>,
    /// Rate-limit fields to add to the upstream's response, and which of them to send.
    response_fields: Option<(RateLimitFields, RateLimitHeaders)>,
}

impl SluiceHttp {
    pub fn new(shared: Rc<Shared>) -> Self {
        Self {
            shared,
            response_fields: None,
        }
    }

    fn decide_request(&mut self, metrics: &Metrics) -> Action {
        let Some(config) = self.shared.config() else {
            // No valid configuration (yet): fail open, visibly.
            metrics.fail_open.inc();
            metrics.allowed.inc();
            return Action::Continue;
        };
        if config.ruleset.is_empty() {
            metrics.allowed.inc();
            return Action::Continue;
        }
        let Some(now) = clock::now() else {
            log::warn!("the host clock is unavailable");
            metrics.errors.inc();
            metrics.fail_open.inc();
            metrics.allowed.inc();
            return Action::Continue;
        };
        let request = LazyRequest::new(config.ruleset.needs());
        let cx = DecisionContext {
            store: &self.shared.store,
            table: &config.table,
            global: GlobalBuckets {
                table: &config.lease_table,
                store: &self.shared.leases,
                view: self.shared.view.get(),
            },
            now,
            default_failure: config.failure_mode,
        };
        let decision = config.ruleset.decide_observed(
            &request,
            &cx,
            &mut *self.shared.statistics.borrow_mut(),
        );
        record(metrics, &decision);
        if decision.global_created > 0 {
            global_channel::note_new_buckets(now);
        }
        if let Some(header) = &config.shadow_header {
            if config.ruleset.has_shadow_rules() {
                mark_shadow_denials(header, &decision);
            }
        }
        match decision.outcome {
            Outcome::Allowed => {
                metrics.allowed.inc();
                let format = config.rate_limit_headers;
                if format.sends_any() {
                    // Built without allocating; the text is formatted when the response
                    // headers arrive.
                    self.response_fields = decision
                        .tightest
                        .map(|t| (RateLimitFields::of(&t, false), format));
                }
                Action::Continue
            }
            Outcome::Denied(limited) => {
                metrics.denied.inc();
                let format = if limited.rule.rate_limit_headers {
                    config.rate_limit_headers
                } else {
                    RateLimitHeaders::None
                };
                // Only a denial pays for reading the content type: allowed requests never do.
                if let Some((flavour, content_type)) = grpc_request() {
                    return send_grpc_error(
                        metrics,
                        flavour,
                        &content_type,
                        &grpc::denial(&limited, format),
                    );
                }
                let status = limited.rule.status;
                let body = response::problem_body(&limited, status);
                response::with_denial_headers(&limited, format, |headers| {
                    send_local_response(metrics, status, headers, &body)
                })
            }
            Outcome::FailedClosed(rule) => {
                metrics.fail_closed.inc();
                if let Some((flavour, content_type)) = grpc_request() {
                    return send_grpc_error(
                        metrics,
                        flavour,
                        &content_type,
                        &grpc::failed_closed(rule),
                    );
                }
                send_local_response(
                    metrics,
                    rule.status,
                    &[("content-type", response::PROBLEM_JSON)],
                    &response::failed_closed_body(&rule.name, rule.status),
                )
            }
        }
    }
}

impl Context for SluiceHttp {}

impl HttpContext for SluiceHttp {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let shared = Rc::clone(&self.shared);
        let metrics = shared.metrics();
        metrics.requests.inc();
        self.decide_request(&metrics)
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        if let Some((fields, format)) = self.response_fields.take() {
            fields.emit(format, |name, value| {
                if hostcalls::add_map_value(MapType::HttpResponseHeaders, name, value).is_err() {
                    self.shared.metrics().errors.inc();
                }
            });
        }
        Action::Continue
    }
}

fn record(metrics: &Metrics, decision: &Decision<'_>) {
    metrics.record_limiter(&decision.counters);
    metrics.fail_open.add(u64::from(decision.failed_open));
    metrics.key_missing.add(u64::from(decision.keys_missing));
    metrics
        .shadow_denied
        .add(u64::from(!decision.shadow_denied.is_empty()));
    metrics.near_limit.add(u64::from(decision.near_limit));
    metrics
        .global_fallback
        .add(u64::from(decision.global_fallback));
    metrics
        .global_failures
        .add(u64::from(decision.global_failures));
    metrics
        .global_table_full
        .add(u64::from(decision.global_table_full));
}

/// Tells the upstream which shadow rules would have denied this request. The header is
/// always set or removed, so a client cannot forge it.
fn mark_shadow_denials(header: &str, decision: &Decision<'_>) {
    if decision.shadow_denied.is_empty() {
        let _ = hostcalls::set_map_value(MapType::HttpRequestHeaders, header, None);
    } else {
        let names: Vec<&str> = decision
            .shadow_denied
            .iter()
            .map(|r| r.name.as_str())
            .collect();
        let _ =
            hostcalls::set_map_value(MapType::HttpRequestHeaders, header, Some(&names.join(",")));
    }
}

/// The request's gRPC flavour and content type, if it is a gRPC or gRPC-Web call.
fn grpc_request() -> Option<(GrpcFlavour, String)> {
    let bytes =
        hostcalls::get_map_value_bytes(MapType::HttpRequestHeaders, "content-type").ok()??;
    let flavour = GrpcFlavour::of(&bytes)?;
    // `of` accepted it, so it starts with ASCII; anything odd after that is replaced.
    Some((flavour, String::from_utf8_lossy(&bytes).into_owned()))
}

/// Answers a gRPC call with an error status instead of an HTTP error, which a gRPC client
/// would read as UNAVAILABLE (retry at once). Plain gRPC goes through Envoy's gRPC local
/// reply (trailers-only, `grpc-status` as given); gRPC-Web gets the same as headers.
fn send_grpc_error(
    metrics: &Metrics,
    flavour: GrpcFlavour,
    content_type: &str,
    answer: &GrpcAnswer,
) -> Action {
    let sent = match flavour {
        GrpcFlavour::Grpc => {
            let metadata: Vec<(&str, &[u8])> = answer
                .metadata
                .iter()
                .map(|(n, v)| (*n, v.as_bytes()))
                .collect();
            hostcalls::send_grpc_response(
                grpc_status_code(answer.status),
                Some(&answer.message),
                metadata,
            )
        }
        GrpcFlavour::GrpcWeb => {
            let headers = answer.grpc_web_headers(content_type);
            let pairs: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
            hostcalls::send_http_response(200, pairs, None)
        }
    };
    match sent {
        Ok(()) => Action::Pause,
        Err(status) => {
            log::error!("cannot send the gRPC error ({status:?}); letting the request through");
            metrics.errors.inc();
            metrics.fail_open.inc();
            Action::Continue
        }
    }
}

/// The SDK's name for a status code.
fn grpc_status_code(status: GrpcStatus) -> GrpcStatusCode {
    match status {
        GrpcStatus::Cancelled => GrpcStatusCode::Cancelled,
        GrpcStatus::Unknown => GrpcStatusCode::Unknown,
        GrpcStatus::InvalidArgument => GrpcStatusCode::InvalidArgument,
        GrpcStatus::DeadlineExceeded => GrpcStatusCode::DeadlineExceeded,
        GrpcStatus::NotFound => GrpcStatusCode::NotFound,
        GrpcStatus::AlreadyExists => GrpcStatusCode::AlreadyExists,
        GrpcStatus::PermissionDenied => GrpcStatusCode::PermissionDenied,
        GrpcStatus::ResourceExhausted => GrpcStatusCode::ResourceExhausted,
        GrpcStatus::FailedPrecondition => GrpcStatusCode::FailedPrecondition,
        GrpcStatus::Aborted => GrpcStatusCode::Aborted,
        GrpcStatus::OutOfRange => GrpcStatusCode::OutOfRange,
        GrpcStatus::Unimplemented => GrpcStatusCode::Unimplemented,
        GrpcStatus::Internal => GrpcStatusCode::Internal,
        GrpcStatus::Unavailable => GrpcStatusCode::Unavailable,
        GrpcStatus::DataLoss => GrpcStatusCode::DataLoss,
        GrpcStatus::Unauthenticated => GrpcStatusCode::Unauthenticated,
    }
}

fn send_local_response(
    metrics: &Metrics,
    status: u16,
    headers: &[(&str, &str)],
    body: &str,
) -> Action {
    match hostcalls::send_http_response(u32::from(status), headers.to_vec(), Some(body.as_bytes()))
    {
        Ok(()) => Action::Pause,
        Err(status) => {
            log::error!("cannot send the local response ({status:?}); letting the request through");
            metrics.errors.inc();
            metrics.fail_open.inc();
            Action::Continue
        }
    }
}
