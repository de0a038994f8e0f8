//! `/api/v1/proxies`: the Envoys that poll for rules.

use axum::Json;
use axum::extract::State;
use serde::Serialize;
use utoipa::ToSchema;

use super::auth::{Auth, Read};
use super::error::ApiError;
use super::openapi::AuthErrors;
use super::{AppState, CONNECTED_WITHIN_MS};
use crate::quota::SyncSeen;
use crate::store::{now_ms, rfc3339};

#[derive(Debug, Serialize, ToSchema)]
pub struct ProxyView {
    /// As the proxy names itself in `x-sluice-proxy-id`.
    pub id: String,
    /// The address its last poll came from.
    pub address: String,
    /// The token it polls with.
    pub token_id: Option<String>,
    pub first_seen: String,
    pub last_seen: String,
    /// The ruleset version it runs, as it reports.
    pub ruleset_version: u64,
    /// The last error it reported (e.g. a ruleset it refused); absent when none.
    pub last_error: Option<String>,
    /// Polling now, or polled within the last 60 seconds.
    pub connected: bool,
    /// Its syncs of global (fleet-wide) buckets; `null` when it never synced with this
    /// admin API (or its replicas sharing one Redis).
    pub global_sync: Option<GlobalSyncView>,
}

/// How a proxy's syncs of global buckets stand.
#[derive(Debug, Serialize, ToSchema)]
pub struct GlobalSyncView {
    /// When its last sync was answered; `null` when none was.
    pub last_answered: Option<String>,
    /// The sync interval it declares.
    pub interval_ms: u64,
    /// Its last sync could not be answered, or none was answered for more than two
    /// intervals: it enforces global limits with its fallback shares (and counts them
    /// in `sluice_global_fallback_total`).
    pub on_fallback: bool,
}

impl GlobalSyncView {
    pub fn new(seen: &SyncSeen, now_ms: i64) -> Self {
        GlobalSyncView {
            last_answered: seen.answered_at_ms.map(rfc3339),
            interval_ms: seen.interval_ms,
            on_fallback: seen.on_fallback(now_ms),
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ProxyList {
    /// Most recently seen first.
    pub proxies: Vec<ProxyView>,
}

#[utoipa::path(
    get, path = "/api/v1/proxies", tag = "proxies",
    responses((status = 200, description = "Every proxy seen", body = ProxyList), AuthErrors),
)]
pub async fn list_proxies(
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
                connected: state.polling_now(&p.id) || now - p.last_seen <= CONNECTED_WITHIN_MS,
                global_sync: syncs.get(&p.id).map(|seen| GlobalSyncView::new(seen, now)),
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
