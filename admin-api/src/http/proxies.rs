//! `/api/v1/proxies`: the Envoys that poll for rules.

use axum::Json;
use axum::extract::State;
use sluice_api::{GlobalSyncView, ProxyList, ProxyView};

use super::AppState;
use super::auth::{Auth, Read};
use super::error::ApiError;
use super::openapi::AuthErrors;
use crate::store::{now_ms, rfc3339};
use sluice_coordinator::SyncSeen;

/// How a proxy's syncs of global buckets stand at `now_ms`.
fn global_sync_view(seen: &SyncSeen, now_ms: i64) -> GlobalSyncView {
    GlobalSyncView {
        last_answered: seen.answered_at_ms.map(rfc3339),
        interval_ms: seen.interval_ms,
        next_sync_ms: (seen.next_sync_ms > 0).then_some(seen.next_sync_ms),
        on_fallback: seen.on_fallback(now_ms),
    }
}

#[utoipa::path(
    get, path = "/api/v1/proxies", tag = "proxies",
    responses((status = 200, description = "Every proxy seen", body = ProxyList), AuthErrors),
)]
pub(crate) async fn list_proxies(
    State(state): State<AppState>,
    _auth: Auth<Read>,
) -> Result<Json<ProxyList>, ApiError> {
    let now = now_ms();
    let proxies = state.store().list_proxies().await?;
    let syncs = state.coordinator().syncs_seen().await;
    Ok(Json(ProxyList {
        proxies: proxies
            .into_iter()
            .map(|p| ProxyView {
                connected: state.connected(&p.id, p.last_seen, now),
                global_sync: syncs.get(&p.id).map(|seen| global_sync_view(seen, now)),
                id: p.id,
                address: p.address,
                token_id: p.token_id,
                first_seen: rfc3339(p.first_seen),
                last_seen: rfc3339(p.last_seen),
                ruleset_version: p.ruleset_version,
                last_error: p.last_error,
            })
            .collect(),
    }))
}
