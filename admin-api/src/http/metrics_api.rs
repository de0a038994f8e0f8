//! `/api/v1/metrics/*`: throttle metrics for the dashboard and for scripts (viewer role and
//! up). Ranges are Unix milliseconds, `from` inclusive and `to` exclusive (default: the
//! last 15 minutes); a series covers every bucket that overlaps the range, zero-filled.
//! Reads add what proxies reported but the pipeline has not yet written, so the view is
//! live: the queries are the pipeline's ([`crate::pipeline::queries`]); a handler parses
//! the request, calls one, and shapes the answer.

use std::convert::Infallible;
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::stream::{self, Stream};
use sluice_api::schema::StreamFrame;
use sluice_api::{
    ClientHistory, ClientMetrics, ClientMetricsList, ClientPoint, ClientRule, ClientsQuery,
    Overview, OverviewQuery, Problem, ProxySummary, RangeQuery, RuleMetrics, RuleMetricsList,
    Series, SeriesPoint, SeriesQuery, StreamEvent, StreamRule, SyncAnswerTimes, Whole,
};

use super::AppState;
use super::auth::{Auth, Read};
use super::body::{Params, PathParam};
use super::error::ApiError;
use super::openapi::AuthErrors;
use crate::pipeline::queries::{LiveDelta, MAX_CLIENTS, RangeError, Window};
use crate::store::{Counts, now_ms};

/// Clients listed when no `limit` is given.
const DEFAULT_CLIENTS: u32 = 20;
/// The overview's default window and the longest it may ask for (the 1 h retention's
/// default).
const DEFAULT_WINDOW_SECONDS: i64 = 300;
const MAX_WINDOW_SECONDS: i64 = 400 * 86_400;
/// How often the stream sends an event.
pub const STREAM_INTERVAL: Duration = Duration::from_secs(2);
/// Keep-alive comments on an otherwise quiet stream (events already come every 2 s; this
/// covers proxies and browsers that time out idle reads).
const STREAM_KEEP_ALIVE: Duration = Duration::from_secs(15);

impl From<RangeError> for ApiError {
    fn from(err: RangeError) -> Self {
        ApiError::BadRequest(err.to_string())
    }
}

/// The window a request's `from`, `to` and `step` parameters ask for.
fn requested(
    from: Option<Whole>,
    to: Option<Whole>,
    step: Option<&str>,
    now: i64,
) -> Result<Window, ApiError> {
    Ok(Window::new(
        from.map(Whole::signed),
        to.map(Whole::signed),
        step,
        now,
    )?)
}

/// A filter parameter: absent or empty means no filter.
fn filter(value: Option<&str>) -> Option<&str> {
    value.filter(|v| !v.is_empty())
}

/// `$wire { fields }` with a rule's twelve counts from `$counts` (a `&Counts`): the
/// wire types carry them as fields of their own, so this is the one place that lists them.
macro_rules! with_counts {
    ($wire:ident { $($field:ident $(: $value:expr)?),* $(,)? }, $counts:expr) => {{
        let counts: &Counts = $counts;
        $wire {
            allowed: counts.allowed,
            denied: counts.denied,
            shadow_denied: counts.shadow_denied,
            near_limit: counts.near_limit,
            fail_open: counts.fail_open,
            key_missing: counts.key_missing,
            tokens_used: counts.tokens_used,
            tokens_throttled: counts.tokens_throttled,
            warned: counts.warned,
            delayed: counts.delayed,
            delay_wait_ms: counts.delay_wait_ms,
            in_flight_refused: counts.in_flight_refused,
            $($field $(: $value)?),*
        }
    }};
}

fn series_point(t: i64, c: &Counts) -> SeriesPoint {
    with_counts!(SeriesPoint { t }, c)
}

#[utoipa::path(
    get, path = "/api/v1/metrics/series", tag = "metrics",
    params(SeriesQuery),
    responses(
        (status = 200, description = "Counts per bucket, summed over rules and proxies (or for one rule or proxy)", body = Series),
        (status = 400, description = "A malformed range or step", body = Problem, content_type = "application/problem+json"),
        AuthErrors,
    ),
)]
/// Outcomes over time.
pub async fn metrics_series(
    State(state): State<AppState>,
    _auth: Auth<Read>,
    Params(q): Params<SeriesQuery>,
) -> Result<Json<Series>, ApiError> {
    let w = requested(q.from, q.to, q.step.as_deref(), now_ms())?;
    let buckets = state
        .pipeline()
        .series(
            state.store(),
            &w,
            filter(q.rule.as_deref()),
            filter(q.proxy.as_deref()),
        )
        .await?;
    Ok(Json(Series {
        step_seconds: w.resolution.seconds(),
        from: w.from,
        to: w.to,
        points: buckets.iter().map(|(t, c)| series_point(*t, c)).collect(),
    }))
}

#[utoipa::path(
    get, path = "/api/v1/metrics/rules", tag = "metrics",
    params(RangeQuery),
    responses(
        (status = 200, description = "Per-rule totals and sparklines", body = RuleMetricsList),
        (status = 400, description = "A malformed range or step", body = Problem, content_type = "application/problem+json"),
        AuthErrors,
    ),
)]
/// Totals per rule, with a sparkline of throttled requests.
pub async fn metrics_rules(
    State(state): State<AppState>,
    _auth: Auth<Read>,
    Params(q): Params<RangeQuery>,
) -> Result<Json<RuleMetricsList>, ApiError> {
    let w = requested(q.from, q.to, q.step.as_deref(), now_ms())?;
    let totals = state.pipeline().rule_totals(state.store(), &w).await?;
    Ok(Json(RuleMetricsList {
        step_seconds: w.resolution.seconds(),
        from: w.from,
        to: w.to,
        rules: totals
            .into_iter()
            .map(|r| {
                with_counts!(
                    RuleMetrics {
                        rule: r.rule,
                        name: r.name,
                        throttle_ratio: r.counts.throttle_ratio(),
                        sparkline: r.sparkline,
                    },
                    &r.counts
                )
            })
            .collect(),
    }))
}

#[utoipa::path(
    get, path = "/api/v1/metrics/clients", tag = "metrics",
    params(ClientsQuery),
    responses(
        (status = 200, description = "The most throttled clients", body = ClientMetricsList),
        (status = 400, description = "A malformed range, step or limit", body = Problem, content_type = "application/problem+json"),
        AuthErrors,
    ),
)]
/// The most throttled clients, per rule. Each bucket keeps its 50 most throttled clients
/// per rule, merged over proxies.
pub async fn metrics_clients(
    State(state): State<AppState>,
    _auth: Auth<Read>,
    Params(q): Params<ClientsQuery>,
) -> Result<Json<ClientMetricsList>, ApiError> {
    let now = now_ms();
    let step = filter(q.step.as_deref());
    let w = requested(q.from, q.to, q.step.as_deref(), now)?;
    let limit = q.limit.unwrap_or(DEFAULT_CLIENTS);
    if !(1..=MAX_CLIENTS).contains(&limit) {
        return Err(ApiError::BadRequest(format!(
            "`limit` must be between 1 and {MAX_CLIENTS}"
        )));
    }
    let clients = state
        .pipeline()
        .top_clients(
            state.store(),
            &w,
            step.map(|_| w.resolution),
            filter(q.rule.as_deref()),
            limit,
            now,
        )
        .await?;
    Ok(Json(ClientMetricsList {
        from: w.from,
        to: w.to,
        clients: clients
            .into_iter()
            .map(|c| ClientMetrics {
                client: c.client,
                rule: c.rule,
                throttled: c.throttled,
                error: c.error,
                tokens: c.tokens,
            })
            .collect(),
    }))
}

#[utoipa::path(
    get, path = "/api/v1/metrics/clients/{client}", tag = "metrics",
    params(("client" = String, Path, description = "The client key, percent-encoded"), RangeQuery),
    responses(
        (status = 200, description = "One client's throttled requests per rule over time", body = ClientHistory),
        (status = 400, description = "A malformed range or step", body = Problem, content_type = "application/problem+json"),
        AuthErrors,
    ),
)]
/// One client's history.
pub async fn metrics_client(
    State(state): State<AppState>,
    _auth: Auth<Read>,
    PathParam(client): PathParam<String>,
    Params(q): Params<RangeQuery>,
) -> Result<Json<ClientHistory>, ApiError> {
    let w = requested(q.from, q.to, q.step.as_deref(), now_ms())?;
    let history = state
        .pipeline()
        .client_history(state.store(), &w, &client)
        .await?;
    Ok(Json(ClientHistory {
        client,
        step_seconds: w.resolution.seconds(),
        from: w.from,
        to: w.to,
        rules: history
            .into_iter()
            .map(|r| ClientRule {
                rule: r.rule,
                throttled: r.throttled,
                points: r
                    .points
                    .into_iter()
                    .map(|(t, throttled)| ClientPoint { t, throttled })
                    .collect(),
            })
            .collect(),
    }))
}

#[utoipa::path(
    get, path = "/api/v1/metrics/overview", tag = "metrics",
    params(OverviewQuery),
    responses(
        (status = 200, description = "Totals over the last `window` seconds, and the fleet", body = Overview),
        (status = 400, description = "A malformed window", body = Problem, content_type = "application/problem+json"),
        AuthErrors,
    ),
)]
/// The numbers at the top of the dashboard.
pub async fn metrics_overview(
    State(state): State<AppState>,
    _auth: Auth<Read>,
    Params(q): Params<OverviewQuery>,
) -> Result<Json<Overview>, ApiError> {
    let window = q.window.unwrap_or(DEFAULT_WINDOW_SECONDS);
    if !(1..=MAX_WINDOW_SECONDS).contains(&window) {
        return Err(ApiError::BadRequest(format!(
            "`window` must be between 1 and {MAX_WINDOW_SECONDS} seconds"
        )));
    }
    let now = now_ms();
    let w = Window::new(Some(now - window * 1000), Some(now), None, now)?;
    let syncs = state.coordinator().syncs_seen().await;
    let totals = state
        .pipeline()
        .totals(
            state.store(),
            &w,
            |id, last_seen| state.connected(id, last_seen, now),
            |id| syncs.get(id).is_some_and(|s| s.on_fallback(now)),
        )
        .await?;
    let (c, fleet) = (&totals.counts, totals.fleet);
    let overview = with_counts!(
        Overview {
            window_seconds: window,
            throttle_ratio: c.throttle_ratio(),
            requests_per_second: c.decided() as f64 / totals.seconds,
            throttled_per_second: c.throttled() as f64 / totals.seconds,
            ruleset_version: *state.inner.version.borrow(),
            proxies: ProxySummary {
                connected: fleet.connected,
                total: fleet.total,
                versions: fleet
                    .versions
                    .into_iter()
                    .map(|(version, n)| (version.to_string(), n))
                    .collect(),
                on_fallback: fleet.on_fallback,
                sync_answers: state
                    .coordinator()
                    .answer_times(Instant::now(), Duration::from_secs(window.unsigned_abs()))
                    .map(|t| SyncAnswerTimes {
                        samples: t.samples as u64,
                        p50_ms: t.p50.as_secs_f64() * 1e3,
                        p99_ms: t.p99.as_secs_f64() * 1e3,
                        max_ms: t.max.as_secs_f64() * 1e3,
                    }),
            },
            errors: fleet.errors,
        },
        c
    );
    Ok(Json(overview))
}

/// An `event: metrics`'s data: what arrived between two readings.
fn stream_event(t: i64, delta: LiveDelta) -> StreamEvent {
    let rules = delta
        .rules
        .into_iter()
        .map(|(id, d)| {
            let rule = StreamRule {
                allowed: d.allowed,
                denied: d.denied,
                shadow_denied: d.shadow_denied,
                tokens_used: d.tokens_used,
                tokens_throttled: d.tokens_throttled,
                warned: d.warned,
                delayed: d.delayed,
                delay_wait_ms: d.delay_wait_ms,
                in_flight_refused: d.in_flight_refused,
            };
            (id, rule)
        })
        .collect();
    with_counts!(StreamEvent { t, rules }, &delta.total)
}

#[utoipa::path(
    get, path = "/api/v1/metrics/stream", tag = "metrics",
    responses(
        (status = 200, description = "Server-sent events: `event: metrics` every 2 s with what reports brought since the last one (data: this schema), and keep-alive comments. Ends when the server shuts down.",
         body = StreamFrame, content_type = "text/event-stream"),
        (status = 503, description = "Too many streams open (in all, or for this token)", body = Problem, content_type = "application/problem+json"),
        AuthErrors,
    ),
)]
/// Live counts, every 2 seconds.
pub async fn metrics_stream(
    State(state): State<AppState>,
    auth: Auth<Read>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    // Held by the stream: its place is freed when the client goes away.
    let slot = state.streams().open(&auth.token.id)?;
    let start = state.pipeline().live();
    let ticks = tokio::time::interval_at(
        tokio::time::Instant::now() + STREAM_INTERVAL,
        STREAM_INTERVAL,
    );
    let events = stream::unfold(
        (state, start, ticks, slot),
        |(state, before, mut ticks, slot)| async move {
            tokio::select! {
                _ = ticks.tick() => {}
                () = state.shutting_down() => return None,
            }
            let now = state.pipeline().live();
            let data = stream_event(now_ms(), now.since(&before));
            let event = Event::default()
                .event("metrics")
                .json_data(&data)
                .unwrap_or_else(|_| Event::default().comment("unserialisable event"));
            Some((Ok(event), (state, now, ticks, slot)))
        },
    );
    Ok(Sse::new(events).keep_alive(KeepAlive::new().interval(STREAM_KEEP_ALIVE)))
}
