//! Rule dry runs against recorded traffic: `POST /api/v1/rules:estimate`, and the
//! estimates a dry-run apply answers with.
//!
//! The traffic replayed is the last hour of what proxies reported under the rule's match
//! and key: the rule's own (a changed rule, same id, same match and key), or another
//! stored rule's with the same match and key (a new rule). Without either, the answer
//! says no traffic was recorded and estimates nothing. The replay itself is the core's
//! pure [`sluice_core::estimate::estimate`], run off the async threads.

use axum::Json;
use axum::extract::State;
use sluice_api::RuleEstimate;
use sluice_api::schema::RuleSpecSchema;
use sluice_core::estimate::{Recorded, estimate};
use sluice_core::rule::Rule;
use sluice_core::spec::RuleSpec;

use super::AppState;
use super::auth::{Auth, Read};
use super::body::JsonBody;
use super::error::{ApiError, Input};
use super::openapi::{AuthErrors, WriteErrors};
use crate::pipeline::queries::Window;
use crate::store::{RuleFilter, canonical, now_ms, rule_id};

/// The window replayed: the last hour.
pub const WINDOW_MS: i64 = 3_600_000;
/// Most rules estimated in one dry-run apply (each reads an hour of metrics); the rest
/// of a larger file are listed without an estimate.
pub const MAX_ESTIMATES: usize = 50;

#[utoipa::path(
    post, path = "/api/v1/rules:estimate", tag = "rules",
    request_body(content = RuleSpecSchema, description = "A new or changed rule (nothing is saved)", content_type = "application/json"),
    responses(
        (status = 200, description = "What the rule would have throttled of the last hour's traffic under its match and key", body = RuleEstimate),
        WriteErrors,
        AuthErrors,
    ),
)]
/// Estimates, from the last hour of reports, how many requests and clients a rule would
/// have throttled (any role). Nothing is saved.
pub async fn estimate_rule(
    State(state): State<AppState>,
    _auth: Auth<Read>,
    JsonBody(spec): JsonBody<RuleSpec>,
) -> Result<Json<RuleEstimate>, ApiError> {
    let spec = canonical(spec);
    Rule::try_from(spec.clone()).map_err(|errors| ApiError::Invalid(Input::Rule, errors))?;
    let mut estimates = estimates(&state, vec![spec]).await?;
    estimates
        .pop()
        .map(Json)
        .ok_or_else(|| ApiError::Internal("no estimate".into()))
}

/// The estimates of `specs` (valid rules), at most [`MAX_ESTIMATES`] of them.
pub async fn estimates(
    state: &AppState,
    specs: Vec<RuleSpec>,
) -> Result<Vec<RuleEstimate>, ApiError> {
    let stored = state
        .store()
        .list_rules(&RuleFilter {
            limit: 1_000,
            ..RuleFilter::default()
        })
        .await?
        .rules;
    let now = now_ms();
    let w = Window::new(Some(now - WINDOW_MS), Some(now), Some("10s"), now)?;
    let mut out = Vec::new();
    for spec in specs.into_iter().take(MAX_ESTIMATES) {
        let id = rule_id(&spec).to_string();
        let same_traffic = |s: &RuleSpec| s.matcher == spec.matcher && s.key == spec.key;
        // The rule itself first, then any other rule matching and keying alike.
        let source = stored
            .iter()
            .filter(|r| same_traffic(&r.spec))
            .min_by_key(|r| rule_id(&r.spec) != id)
            .map(|r| rule_id(&r.spec).to_string());
        let mut answer = RuleEstimate {
            rule: id,
            traffic_of: None,
            window_seconds: u64::try_from(WINDOW_MS / 1000).unwrap_or(0),
            requests: 0,
            throttled_requests: 0,
            throttled_clients: 0,
            replayed_clients: 0,
            replayed_requests: 0,
            uncertain_requests: 0,
            untracked_requests: 0,
            skipped_clients: 0,
            skipped_requests: 0,
        };
        if let Some(source) = source {
            let (requests, clients) = state
                .pipeline()
                .recorded_traffic(state.store(), &w, &source)
                .await?;
            if requests > 0 || !clients.is_empty() {
                let recorded = Recorded {
                    bucket_ms: 10_000,
                    requests,
                    clients,
                };
                let rule = Rule::try_from(spec)
                    .map_err(|errors| ApiError::Invalid(Input::Rule, errors))?;
                // Bounded work (`sluice_core::estimate::MAX_REPLAYED_REQUESTS`), but tens of
                // milliseconds of it: off the async threads.
                let est = tokio::task::spawn_blocking(move || estimate(&rule, &recorded))
                    .await
                    .map_err(|e| ApiError::Internal(e.to_string()))?;
                answer.traffic_of = Some(source);
                answer.requests = requests;
                answer.throttled_requests = est.throttled_requests;
                answer.throttled_clients = est.throttled_clients;
                answer.replayed_clients = est.replayed_clients;
                answer.replayed_requests = est.replayed_requests;
                answer.uncertain_requests = est.uncertain_requests;
                answer.untracked_requests = est.untracked_requests;
                answer.skipped_clients = est.skipped_clients;
                answer.skipped_requests = est.skipped_requests;
            }
        }
        out.push(answer);
    }
    Ok(out)
}
