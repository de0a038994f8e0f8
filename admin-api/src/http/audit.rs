//! `/api/v1/audit`: who changed what, newest first.

use axum::Json;
use axum::extract::State;
use sluice_api::{AuditEntryView, AuditList, AuditQuery};

use super::AppState;
use super::auth::{Auth, Read};
use super::body::{Params, page_limit};
use super::error::ApiError;
use super::openapi::AuthErrors;
use crate::store::{AuditEntry, rfc3339};

fn audit_entry_view(e: AuditEntry) -> AuditEntryView {
    AuditEntryView {
        id: e.id,
        at: rfc3339(e.at),
        actor_id: e.actor_id,
        actor_name: e.actor_name,
        action: e.action,
        target: e.target,
        version: e.version,
        before: e.before,
        after: e.after,
    }
}

#[utoipa::path(
    get, path = "/api/v1/audit", tag = "audit",
    params(AuditQuery),
    responses((status = 200, description = "Audit entries, newest first", body = AuditList), AuthErrors),
)]
pub(crate) async fn list_audit(
    State(state): State<AppState>,
    _auth: Auth<Read>,
    Params(query): Params<AuditQuery>,
) -> Result<Json<AuditList>, ApiError> {
    let limit = page_limit(query.limit)?;
    let entries = state
        .store()
        .list_audit(limit, query.before.map(|b| b.0))
        .await?;
    Ok(Json(AuditList {
        entries: entries.into_iter().map(audit_entry_view).collect(),
    }))
}
