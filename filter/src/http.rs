//! The request context: reads the request, asks the core, answers or forwards.
//!
//! Nothing here blocks or performs network I/O: a decision is a handful of shared-data
//! reads and compare-and-swap writes on this worker's thread.

use std::rc::Rc;

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, BufferType, GrpcStatusCode, MapType};

use sluice_core::config::FilterConfig;
use sluice_core::delay::Delayed;
use sluice_core::grpc::{self, GrpcAnswer, GrpcFlavour};
use sluice_core::limiter::LimiterCounters;
use sluice_core::request::{HttpRequest, RequestAttributes, WithBody};
use sluice_core::response::{
    self, DELAY_QUEUED_HEADER, DELAY_WAIT_HEADER, RateLimitFields, RateLimitHeaders,
};
use sluice_core::ruleset::{BodyNeed, Decision, DecisionContext, GlobalBuckets, Outcome};
use sluice_core::spec::GrpcStatus;
use sluice_core::time::Nanos;
use sluice_core::tokens::{BodyFacts, MAX_REQUEST_BODY_BYTES, with_include_usage};

use crate::metrics::Metrics;
use crate::request::LazyRequest;
use crate::shared::Shared;
use crate::tokens::TokenFlow;
use crate::{clock, global_channel};

#[derive(Debug)]
pub struct SluiceHttp {
    shared: Rc<Shared>,
    /// Envoy's id of this request's context: its places under in-flight limits are kept
    /// under it.
    context_id: u32,
    /// Whether the request holds places under in-flight limits, to let go at its end.
    holds_places: bool,
    /// Rate-limit fields to add to the upstream's response, and which of them to send.
    response_fields: Option<(RateLimitFields, RateLimitHeaders)>,
    /// The `x-sluice-warning` value for an admitted request over a soft limit or a
    /// warn-mode rule's limit.
    warning: Option<String>,
    /// A rule with token limits matched: the decision waits for the request body, with
    /// the request's attributes read at its headers.
    awaiting_body: Option<(BodyNeed, HttpRequest)>,
    /// For a request decided after its body: whether it is a gRPC call, read at its
    /// headers (Envoy hands out request headers no later).
    grpc_at_headers: Option<Option<(GrpcFlavour, String)>>,
    /// What the allowed request reserved, until its response ends.
    tokens: Option<TokenFlow>,
    /// Set while the request was admitted to wait for its tokens (`on_limit: delay`):
    /// what to give back, and where, if its stream ends before it passes.
    delayed: Option<(Rc<FilterConfig>, Delayed)>,
}

impl SluiceHttp {
    pub fn new(shared: Rc<Shared>, context_id: u32) -> Self {
        Self {
            shared,
            context_id,
            holds_places: false,
            response_fields: None,
            warning: None,
            awaiting_body: None,
            grpc_at_headers: None,
            tokens: None,
            delayed: None,
        }
    }

    /// Whether this request must wait for its body (a rule with token limits matches, and
    /// a body follows), and the request's attributes, read now for the decision then.
    fn body_need(&self, end_of_stream: bool) -> Option<(BodyNeed, HttpRequest)> {
        if end_of_stream {
            return None;
        }
        let config = self.shared.config()?;
        if !config.ruleset.has_token_rules() {
            return None;
        }
        let request = LazyRequest::new(config.ruleset.needs());
        let need = config.ruleset.body_need(&request);
        need.read.then(|| (need, request.snapshot()))
    }

    /// Decides the request waiting for its body, now that `size` bytes of it are buffered
    /// (`end`: all of it). A body over the cap is decided unread, on the default estimate.
    fn decide_after_body(
        &mut self,
        (need, request): (BodyNeed, HttpRequest),
        size: usize,
        end: bool,
    ) -> Action {
        let shared = Rc::clone(&self.shared);
        let metrics = shared.metrics();
        let body = if end && size <= MAX_REQUEST_BODY_BYTES {
            hostcalls::get_buffer(BufferType::HttpRequestBody, 0, size)
                .ok()
                .flatten()
        } else {
            None
        };
        let facts = match &body {
            Some(bytes) => BodyFacts::read(bytes),
            None => BodyFacts::unread(u64::try_from(size).unwrap_or(u64::MAX)),
        };
        if !facts.read {
            metrics.tokens.body_unread.inc();
        }
        let action = self.decide_request(&metrics, Some(WithBody { request, facts }));
        if need.include_usage && self.tokens.is_some() {
            if let Some(changed) = body.as_deref().and_then(with_include_usage) {
                if hostcalls::set_buffer(BufferType::HttpRequestBody, 0, size, &changed).is_err() {
                    metrics.errors.inc();
                }
            }
        }
        action
    }

    /// Decides the request: at its headers, read from Envoy as the rules ask (`body`
    /// `None`), or at the end of its body, from the attributes read at its headers (then
    /// its headers have gone on and cannot be changed).
    fn decide_request(&mut self, metrics: &Metrics, body: Option<WithBody<HttpRequest>>) -> Action {
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
        match body {
            None => {
                let request = LazyRequest::new(config.ruleset.needs());
                self.decide_now(metrics, &config, now, &request, true)
            }
            Some(request) => self.decide_now(metrics, &config, now, &request, false),
        }
    }

    /// The decision itself, and the answer it gives.
    fn decide_now(
        &mut self,
        metrics: &Metrics,
        config: &Rc<FilterConfig>,
        now: Nanos,
        request: &impl RequestAttributes,
        at_headers: bool,
    ) -> Action {
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
            queue: None,
        };
        // Only a ruleset that delays looks at the queue.
        let queue = config
            .ruleset
            .has_delay_rules()
            .then(|| self.shared.delay.queue());
        let cx = DecisionContext {
            queue: queue.as_deref(),
            ..cx
        };
        let mut statistics = self.shared.statistics.borrow_mut();
        let mut decision = if config.ruleset.has_in_flight_rules() {
            let in_flight = self.shared.in_flight.context();
            config
                .ruleset
                .decide_in_flight(request, &cx, &in_flight, &mut *statistics)
        } else {
            config
                .ruleset
                .decide_observed(request, &cx, &mut *statistics)
        };
        drop(statistics);
        drop(queue);
        record(metrics, &decision);
        self.keep_places(metrics, &mut decision);
        let reservations = std::mem::take(&mut decision.reservations);
        metrics
            .tokens
            .reservations
            .add(u64::try_from(reservations.len()).unwrap_or(u64::MAX));
        self.tokens = TokenFlow::new(Rc::clone(config), reservations);
        if decision.global_created > 0 {
            global_channel::note_new_buckets(now);
        }
        if let Some(header) = config.shadow_header.as_ref().filter(|_| at_headers) {
            if config.ruleset.has_shadow_rules() {
                mark_shadow_denials(header, &decision);
            }
        }
        match decision.outcome {
            Outcome::Allowed => {
                metrics.allowed.inc();
                if !decision.warnings.is_empty() {
                    metrics.warned.inc();
                    self.warning = Some(response::warning_value(&decision.warnings));
                }
                let format = config.rate_limit_headers;
                if format.sends_any() {
                    // Built without allocating; the text is formatted when the response
                    // headers arrive.
                    self.response_fields = decision
                        .tightest
                        .map(|t| (RateLimitFields::of(&t, false), format));
                }
                match decision.delayed.take() {
                    // Its tokens are reserved ahead: it waits for them here, and the
                    // worker's tick resumes it when they are due.
                    Some(delayed) => {
                        metrics.delay.delayed.inc();
                        self.shared.delay.hold(self.context_id, now, &delayed);
                        self.delayed = Some((Rc::clone(config), delayed));
                        Action::Pause
                    }
                    None => Action::Continue,
                }
            }
            Outcome::Denied(limited) => {
                metrics.denied.inc();
                let format = if limited.rule.rate_limit_headers {
                    config.rate_limit_headers
                } else {
                    RateLimitHeaders::None
                };
                // Only a denial pays for reading the content type: allowed requests never do.
                if let Some((flavour, content_type)) = self.grpc_request() {
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
            Outcome::InFlightFull(denial) => {
                metrics.denied.inc();
                metrics.in_flight.denied.inc();
                if let Some((flavour, content_type)) = self.grpc_request() {
                    return send_grpc_error(
                        metrics,
                        flavour,
                        &content_type,
                        &grpc::in_flight_full(denial.rule, denial.max),
                    );
                }
                let status = denial.rule.status;
                send_local_response(
                    metrics,
                    status,
                    &response::IN_FLIGHT_HEADERS,
                    &response::in_flight_body(&denial.rule.name, denial.max, status),
                )
            }
            Outcome::FailedClosed(rule) => {
                metrics.fail_closed.inc();
                if let Some((flavour, content_type)) = self.grpc_request() {
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

impl Context for SluiceHttp {
    fn on_done(&mut self) -> bool {
        self.end_stream();
        true
    }
}

impl SluiceHttp {
    /// Keeps the places an allowed request took under in-flight limits until its stream
    /// ends (a denied one took none), and counts what the table's writes found.
    fn keep_places(&mut self, metrics: &Metrics, decision: &mut Decision<'_>) {
        let counts = &metrics.in_flight;
        counts.lapsed.add(u64::from(decision.in_flight.lapsed));
        counts.failures.add(u64::from(
            decision.in_flight_failures + decision.in_flight.corrupt,
        ));
        metrics
            .cas_contention
            .add(u64::from(decision.in_flight.cas_conflicts));
        let holds = std::mem::take(&mut decision.holds);
        self.holds_places |= self.shared.in_flight.keep(self.context_id, holds, counts);
    }

    /// Lets go of the request's places: its stream ended, however it ended (`on_log`
    /// comes first, `on_done` also for a context torn down without a log). Once only.
    /// The stream ended (however it ended; called from `on_log` and `on_done`, and acting
    /// once): what it still holds goes back. After its root was torn down, it flushes the
    /// worker's metrics itself (`Shared::orphaned`).
    fn end_stream(&mut self) {
        self.stop_waiting();
        self.abandon_tokens();
        self.let_go_of_places();
        if self.shared.orphaned.get() {
            self.shared.metrics().flush();
        }
    }

    fn let_go_of_places(&mut self) {
        if std::mem::take(&mut self.holds_places) {
            let now = clock::now().unwrap_or_default();
            let metrics = self.shared.metrics();
            self.shared
                .in_flight
                .let_go(self.context_id, now, &metrics.in_flight);
        }
    }

    /// The request's gRPC flavour and content type: read at its headers when it was
    /// decided after its body, else read now.
    fn grpc_request(&mut self) -> Option<(GrpcFlavour, String)> {
        self.grpc_at_headers.take().unwrap_or_else(grpc_request)
    }

    /// The request's stream ended: if it was still waiting for its tokens, it leaves the
    /// queue and its request limits get back what it reserved (its token limits get
    /// theirs from its token reservation). Once only.
    fn stop_waiting(&mut self) {
        let Some((config, delayed)) = self.delayed.take() else {
            return;
        };
        if !self.shared.delay.give_up(self.context_id) {
            return;
        }
        let metrics = self.shared.metrics();
        metrics.delay.cancelled.inc();
        let Some(now) = clock::now() else {
            metrics.delay.failures.inc();
            return;
        };
        let mut counters = LimiterCounters::default();
        let failures = delayed.refund(&config.table, &self.shared.store, now, &mut counters);
        metrics.record_limiter(&counters);
        metrics.delay.failures.add(u64::from(failures));
    }

    /// Tells the client how long its request waited for its tokens, if it did: the wait
    /// computed when it was queued and the time it spent queued (at most one tick more).
    fn tell_delay(&self) {
        let Some((wait, queued)) = self
            .delayed
            .as_ref()
            .and_then(|_| self.shared.delay.take_passed(self.context_id))
        else {
            return;
        };
        for (name, ns) in [(DELAY_WAIT_HEADER, wait), (DELAY_QUEUED_HEADER, queued)] {
            let millis = format!("{}.{:03}", ns / 1_000_000, ns / 1_000 % 1_000);
            if hostcalls::add_map_value(MapType::HttpResponseHeaders, name, &millis).is_err() {
                self.shared.metrics().errors.inc();
            }
        }
    }

    /// Refunds what is still reserved: the request ended before its response did.
    fn abandon_tokens(&mut self) {
        if let Some(flow) = self.tokens.take() {
            flow.abandon(&self.shared);
        }
    }

    /// Commits what was reserved: the response ended.
    fn finish_tokens(&mut self) {
        if let Some(flow) = self.tokens.take() {
            flow.finish(&self.shared);
        }
    }
}

impl HttpContext for SluiceHttp {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        let shared = Rc::clone(&self.shared);
        let metrics = shared.metrics();
        metrics.requests.inc();
        if let Some(awaiting) = self.body_need(end_of_stream) {
            if awaiting.0.include_usage {
                // The body may change length; Envoy frames what it forwards.
                let _ =
                    hostcalls::set_map_value(MapType::HttpRequestHeaders, "content-length", None);
            }
            self.awaiting_body = Some(awaiting);
            self.grpc_at_headers = Some(grpc_request());
            // Headers go on (a paused header callback would stop the body callbacks too:
            // proxy-wasm turns it into Envoy's StopAllIteration); the body is held until
            // it is whole and the request decided there. A denial is still a local reply,
            // and Envoy resets the upstream request it had started.
            return Action::Continue;
        }
        self.decide_request(&metrics, None)
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if self.awaiting_body.is_none() {
            return Action::Continue;
        }
        if !end_of_stream && body_size <= MAX_REQUEST_BODY_BYTES {
            // Buffered by Envoy until the whole body is here.
            return Action::Pause;
        }
        match self.awaiting_body.take() {
            Some(awaiting) => self.decide_after_body(awaiting, body_size, end_of_stream),
            None => Action::Continue,
        }
    }

    fn on_http_request_trailers(&mut self, _num_trailers: usize) -> Action {
        match self.awaiting_body.take() {
            // The body ended before its trailers; it is all buffered.
            Some(awaiting) => {
                let size = hostcalls::get_buffer(
                    BufferType::HttpRequestBody,
                    0,
                    MAX_REQUEST_BODY_BYTES + 1,
                )
                .ok()
                .flatten()
                .map_or(0, |b| b.len());
                self.decide_after_body(awaiting, size, true)
            }
            None => Action::Continue,
        }
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        self.tell_delay();
        if let Some((fields, format)) = self.response_fields.take() {
            fields.emit(format, |name, value| {
                if hostcalls::add_map_value(MapType::HttpResponseHeaders, name, value).is_err() {
                    self.shared.metrics().errors.inc();
                }
            });
        }
        if let Some(warning) = self.warning.take() {
            let added = hostcalls::add_map_value(
                MapType::HttpResponseHeaders,
                response::WARNING_HEADER,
                &warning,
            );
            if added.is_err() {
                self.shared.metrics().errors.inc();
            }
        }
        if let Some(flow) = &mut self.tokens {
            flow.on_response_headers();
            if end_of_stream {
                self.finish_tokens();
            }
        }
        Action::Continue
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if let Some(flow) = &mut self.tokens {
            flow.on_response_body(body_size);
            if end_of_stream {
                self.finish_tokens();
            }
        }
        Action::Continue
    }

    fn on_log(&mut self) {
        self.end_stream();
    }
}

fn record(metrics: &Metrics, decision: &Decision<'_>) {
    metrics.record_limiter(&decision.counters);
    metrics.fail_open.add(u64::from(decision.failed_open));
    metrics.key_missing.add(u64::from(decision.keys_missing));
    metrics.key_fallback.add(u64::from(decision.keys_fallback));
    metrics
        .rollout_shadow
        .add(u64::from(decision.rollout_shadowed));
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
