//! `/api/v1/versions` and `/api/v1/diff`: the ruleset's history and its differences.

use serde::{Deserialize, Serialize};
use sluice_core::spec::RuleSpec;

use crate::query::Whole;
#[cfg(feature = "openapi")]
use crate::schema::RuleSpecSchema;

/// One ruleset version: who made it, when, and how.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct VersionView {
    pub version: u64,
    pub created_at: String,
    /// The token that made the change (absent for the command line or the system).
    pub actor_id: Option<String>,
    pub actor_name: String,
    /// `rule.create`, `rule.update`, `rule.patch`, `rule.delete`, `rule.enable`,
    /// `rule.disable`, `rules.apply` or `ruleset.rollback`.
    pub action: String,
    pub summary: String,
    pub rule_count: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct VersionList {
    /// Newest first.
    pub versions: Vec<VersionView>,
}

/// A version with the whole ruleset as it was.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct VersionDetailView {
    #[serde(flatten)]
    pub version: VersionView,
    /// In evaluation order.
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<RuleSpecSchema>))]
    pub rules: Vec<RuleSpec>,
}

/// `GET /api/v1/versions`'s page.
#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query))]
#[serde(deny_unknown_fields)]
pub struct VersionsQuery {
    /// Page size (default 100).
    #[cfg_attr(feature = "openapi", param(minimum = 1, maximum = 1000))]
    pub limit: Option<u32>,
    /// Only versions older than this (the last `version` of the previous page).
    #[cfg_attr(feature = "openapi", param(value_type = Option<u64>, minimum = 0, maximum = 9_007_199_254_740_991_u64))]
    pub before: Option<Whole>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    Added,
    Removed,
    Changed,
}

impl ChangeKind {
    /// As the API spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeKind::Added => "added",
            ChangeKind::Removed => "removed",
            ChangeKind::Changed => "changed",
        }
    }
}

/// How one rule differs between two versions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RuleChangeView {
    pub id: String,
    pub change: ChangeKind,
    /// Absent when the rule was added.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<RuleSpecSchema>))]
    pub before: Option<RuleSpec>,
    /// Absent when the rule was removed.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<RuleSpecSchema>))]
    pub after: Option<RuleSpec>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DiffView {
    pub from: u64,
    pub to: u64,
    /// By rule id; rules equal in both versions are not listed.
    pub changes: Vec<RuleChangeView>,
}

/// `GET /api/v1/diff`'s versions.
#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query))]
#[serde(deny_unknown_fields)]
pub struct DiffQuery {
    /// The older version.
    #[cfg_attr(feature = "openapi", param(value_type = u64, minimum = 0, maximum = 9_007_199_254_740_991_u64))]
    pub from: Whole,
    /// The newer version (default: the current one).
    #[cfg_attr(feature = "openapi", param(value_type = Option<u64>, minimum = 0, maximum = 9_007_199_254_740_991_u64))]
    pub to: Option<Whole>,
}
