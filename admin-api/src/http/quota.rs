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
use crate::store;
use sluice_coordinator::{MAX_SYNC_BYTES, validate};

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
/// the fleet's buckets at once; a refused request changes nothing.
pub(crate) async fn sync_quota(
    State(state): State<AppState>,
    _auth: Auth<SyncQuota>,
    request: Request,
) -> Result<Json<SyncResponse>, ApiError> {
    require_json(request.headers())?;
    // Larger than the API's usual body limit: a proxy with many active buckets sends
    // them all at once.
    let bytes = axum::body::to_bytes(request.into_body(), MAX_SYNC_BYTES)
        .await
        .map_err(|_| ApiError::PayloadTooLarge {
            limit: MAX_SYNC_BYTES,
        })?;
    let body: SyncRequest = parse_json(&bytes)?;
    let sync = validate(body).map_err(|errors| ApiError::Invalid(Input::QuotaSync, errors))?;
    let answer = state
        .coordinator()
        .sync(&sync, Instant::now(), store::now_ms())
        .await
        .map_err(|e| ApiError::Unavailable(e.to_string()))?;
    Ok(Json(answer))
}
