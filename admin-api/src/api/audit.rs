//! `/api/v1/audit`: who changed what, newest first.

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use super::AppState;
use super::auth::{Auth, Read};
use super::body::{Params, Whole};
use super::error::ApiError;
use super::openapi::AuthErrors;
use crate::store::{AuditEntry, rfc3339};

#[derive(Debug, Serialize, ToSchema)]
pub struct AuditEntryView {
    pub id: u64,
    pub at: String,
    /// The token that acted (absent for the command line or the system).
    pub actor_id: Option<String>,
    pub actor_name: String,
    /// e.g. `rule.create`, `rules.apply`, `ruleset.rollback`, `token.create`,
    /// `token.revoke`.
    pub action: String,
    /// The rule id, token id or version acted on.
    pub target: Option<String>,
    /// The ruleset version the change made, for ruleset changes.
    pub version: Option<u64>,
    /// The rule before (single-rule actions), or a map of changed rules by id (bulk).
    pub before: Option<Value>,
    pub after: Option<Value>,
}

impl From<AuditEntry> for AuditEntryView {
    fn from(e: AuditEntry) -> Self {
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
}

#[derive(Debug, Serialize, ToSchema)]
pub struct AuditList {
    pub entries: Vec<AuditEntryView>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct AuditQuery {
    /// Page size (default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
    /// Only entries older than this id (the last `id` of the previous page).
    #[param(value_type = Option<u64>, minimum = 0, maximum = 9_007_199_254_740_991_u64)]
    before: Option<Whole>,
}

#[utoipa::path(
    get, path = "/api/v1/audit", tag = "audit",
    params(AuditQuery),
    responses((status = 200, description = "Audit entries, newest first", body = AuditList), AuthErrors),
)]
pub async fn list_audit(
    State(state): State<AppState>,
    _auth: Auth<Read>,
    Params(query): Params<AuditQuery>,
) -> Result<Json<AuditList>, ApiError> {
    let limit = query.limit.unwrap_or(100);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::BadRequest(
            "limit must be between 1 and 1000".to_string(),
        ));
    }
    let entries = state
        .store()
        .list_audit(limit, query.before.map(|b| b.0))
        .await?;
    Ok(Json(AuditList {
        entries: entries.into_iter().map(AuditEntryView::from).collect(),
    }))
}
