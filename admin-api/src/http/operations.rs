//! What operators' tools call outside `/api/v1`: `/healthz`, `/readyz`, `/metrics` (the
//! admin API's own Prometheus metrics, [`super::metrics`]), and the middleware that
//! counts, times and logs every request.

use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderValue, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::state::{AppState, CONNECTED_WITHIN_MS};
use crate::store::now_ms;

/// Alive: the process answers.
pub(super) async fn healthz() -> &'static str {
    "ok\n"
}

/// Ready: the database answers.
pub(super) async fn readyz(State(state): State<AppState>) -> Result<&'static str, ApiError> {
    state
        .store()
        .ping()
        .await
        .map_err(|e| ApiError::Unavailable(format!("database unreachable: {e}")))?;
    Ok("ready\n")
}

/// The method as a metric label and in the log: one of the methods the API knows, or
/// `other`. A request's method is any token its client makes up; taken as is, every new
/// one would add metric series and log bytes without bound.
pub(super) fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

/// The route as a metric label and in the log: the pattern that matched (from the fixed
/// route table, so a rule id never makes a series of its own), or `(unmatched)` for every
/// path no route takes (the dashboard's files, unknown paths).
const UNMATCHED: &str = "(unmatched)";

/// Counts, times and logs every request by its method and route pattern, both from fixed
/// sets (see [`method_label`]), and marks every answer `X-Content-Type-Options: nosniff`.
pub(super) async fn observe(
    State(state): State<AppState>,
    matched: Option<MatchedPath>,
    request: Request,
    next: Next,
) -> Response {
    let start = Instant::now();
    let method = method_label(request.method());
    let route = matched.map_or_else(|| UNMATCHED.to_string(), |m| m.as_str().to_string());
    let mut response = next.run(request).await;
    // Every answer is what its Content-Type says, never sniffed into something else.
    response
        .headers_mut()
        .entry(header::X_CONTENT_TYPE_OPTIONS)
        .or_insert(HeaderValue::from_static("nosniff"));
    let status = response.status();
    let elapsed = start.elapsed();
    state
        .inner
        .metrics
        .observe_request(method, &route, status.as_u16(), elapsed);
    let ms = elapsed.as_secs_f64() * 1e3;
    if status.is_server_error() {
        tracing::warn!(method, %route, status = status.as_u16(), ms, "request failed");
    } else if method == "GET"
        || method == "HEAD"
        // Every proxy reports every ~2 s and syncs every ~250 ms: accepted ones would
        // drown the log.
        || ((route == "/api/v1/reports" || route == "/api/v1/quota/sync") && status.is_success())
    {
        tracing::debug!(method, %route, status = status.as_u16(), ms, "request");
    } else {
        tracing::info!(method, %route, status = status.as_u16(), ms, "request");
    }
    response
}

/// `/metrics`: the admin API's own metrics, its gauges read from the database now.
pub(super) async fn render(State(state): State<AppState>) -> Result<Response, ApiError> {
    let store = state.store();
    // The stored rules, for their count and their configured limits.
    let rules = store.document().await?.rules;
    let connected = store
        .proxies_seen_since(now_ms() - CONNECTED_WITHIN_MS)
        .await?;
    let version = *state.inner.version.borrow();
    let text = state
        .inner
        .metrics
        .encode(&rules, connected, version)
        .map_err(|e| ApiError::Internal(format!("encoding metrics: {e}")))?;
    Ok((
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
        )],
        text,
    )
        .into_response())
}
