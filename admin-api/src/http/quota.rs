//! `POST /api/v1/quota/sync`: a proxy settles its global buckets, once per sync interval.
//! The exchange is `sluice_core::global::sync`; the coordinator is [`crate::quota`].

use std::time::Instant;

use axum::Json;
use axum::extract::{Request, State};
use sluice_core::global::sync::{SyncRequest, SyncResponse};

use super::AppState;
use super::auth::{Auth, SyncQuota};
use super::body::{BodyInput, parse_json, require_json};
use super::error::{ApiError, Input};
use super::openapi::{AuthErrors, WriteErrors};
use super::proxy_ids::IdPath;
use crate::store;
use sluice_coordinator::MAX_SYNC_BYTES;
use sluice_core::validation::{FieldError, ValidationErrors};

impl BodyInput for SyncRequest {
    const INPUT: Input = Input::QuotaSync;
}

#[utoipa::path(
    post, path = "/api/v1/quota/sync", tag = "quota",
    request_body(content = SyncRequest, content_type = "application/json",
        description = "Every active global bucket of one proxy: its usage since the last \
                       answered sync and the limit it enforces (at most 50,000 buckets, 16 MiB)"),
    responses(
        (status = 200, description = "One grant per bucket, in the request's order", body = SyncResponse),
        (status = 503, description = "The coordinator's Redis is unreachable: keep to the fallback shares and sync again next interval",
         body = sluice_api::Problem, content_type = "application/problem+json"),
        WriteErrors,
        AuthErrors,
    ),
)]
/// A proxy's sync of its global buckets (proxy-role or admin token). Grants are taken from
/// the fleet's buckets at once; a refused request changes nothing. Each bucket's limit
/// (`interval_ns`, `burst`) must be one a global limit of the current or the previous
/// ruleset version produces; a new bucket past the coordinator's bounds is granted
/// nothing (`young`, so the proxy keeps to its even share). Each sync's `seq` must be
/// larger than its proxy id's last: a sync sent again is refused, not settled twice.
pub(crate) async fn sync_quota(
    State(state): State<AppState>,
    auth: Auth<SyncQuota>,
    request: Request,
) -> Result<Json<SyncResponse>, ApiError> {
    let arrived = Instant::now();
    require_json(request.headers())?;
    // Larger than the API's usual body limit: a proxy with many active buckets sends
    // them all at once.
    let bytes = axum::body::to_bytes(request.into_body(), MAX_SYNC_BYTES)
        .await
        .map_err(|_| ApiError::PayloadTooLarge {
            limit: MAX_SYNC_BYTES,
        })?;
    let body: SyncRequest = parse_json(&bytes)?;
    let invalid = |errors| ApiError::Invalid(Input::QuotaSync, errors);
    let coordinator = state.coordinator();
    let sync = coordinator.checked(body).map_err(invalid)?;
    state.refresh_issued().await?;
    if !coordinator.knows_limits(&sync) {
        // This replica may not have heard of a newer ruleset version yet: ask the store
        // once before refusing.
        state.committed(state.store().current_version().await?);
        state.refresh_issued().await?;
    }
    let sync = coordinator.known_limits_only(sync).map_err(invalid)?;
    state
        .proxy_ids()
        .claim(IdPath::Sync, &sync.proxy, &auth.token)
        .map_err(|refusal| {
            let problem = FieldError {
                field: "proxy".into(),
                message: refusal.message(&sync.proxy),
            };
            ApiError::Invalid(Input::QuotaSync, ValidationErrors(vec![problem]))
        })?;
    // Last, so a sync refused for anything else does not use up its `seq`.
    coordinator
        .in_sequence(&sync, store::now_ms())
        .map_err(invalid)?;
    let answer = coordinator
        .sync(&sync, Instant::now(), store::now_ms())
        .await
        .map_err(|e| ApiError::Unavailable(e.to_string()))?;
    let answered = Instant::now();
    coordinator.record_answer_time(answered, answered - arrived);
    Ok(Json(answer))
}
