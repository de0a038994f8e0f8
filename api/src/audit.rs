//! `/api/v1/audit`: who changed what.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::query::Whole;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AuditList {
    pub entries: Vec<AuditEntryView>,
}

/// `GET /api/v1/audit`'s page.
#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query))]
#[serde(deny_unknown_fields)]
pub struct AuditQuery {
    /// Page size (default 100).
    #[cfg_attr(feature = "openapi", param(minimum = 1, maximum = 1000))]
    pub limit: Option<u32>,
    /// Only entries older than this id (the last `id` of the previous page).
    #[cfg_attr(feature = "openapi", param(value_type = Option<u64>, minimum = 0, maximum = 9_007_199_254_740_991_u64))]
    pub before: Option<Whole>,
}
