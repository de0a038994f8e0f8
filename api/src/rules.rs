//! `/api/v1/rules`: rules as stored, pages of them, and what a bulk change did.

use serde::{Deserialize, Serialize};
use sluice_core::spec::{Mode, RuleSpec};

use crate::query::Whole;
#[cfg(feature = "openapi")]
use crate::schema::{ModeName, RuleSpecSchema};

/// A stored rule: its spec and the metadata the server keeps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RuleView {
    /// The rule's id (its `id`, or its name when it has none): its URL is
    /// `/api/v1/rules/{id}`.
    pub id: String,
    /// The ruleset version that last changed this rule; the rule's `ETag` is this number
    /// in quotes.
    pub revision: u64,
    pub created_at: String,
    pub updated_at: String,
    /// The rule as written, the body `PUT` takes.
    #[cfg_attr(feature = "openapi", schema(value_type = RuleSpecSchema))]
    pub spec: RuleSpec,
}

impl RuleView {
    /// The rule's `ETag`: its revision, quoted (strong).
    pub fn etag(&self) -> String {
        etag(self.revision)
    }
}

/// The `ETag` of a rule at a revision, or of the ruleset at a version: strong, quoted.
pub fn etag(revision: u64) -> String {
    format!("\"{revision}\"")
}

/// One page of rules, in evaluation order (highest priority first, then by name).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RuleList {
    pub rules: Vec<RuleView>,
    /// Rules matching the filter on all pages.
    pub total: u64,
    pub limit: u32,
    pub offset: u64,
}

/// `GET /api/v1/rules`'s filter and page.
#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query))]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// Only rules whose name contains this (case-insensitive).
    pub name: Option<String>,
    /// Only enabled (`true`) or disabled (`false`) rules.
    pub enabled: Option<bool>,
    /// Only rules in this mode.
    #[cfg_attr(feature = "openapi", param(inline, value_type = Option<ModeName>))]
    pub mode: Option<Mode>,
    /// Page size (default 100).
    #[cfg_attr(feature = "openapi", param(minimum = 1, maximum = 1000))]
    pub limit: Option<u32>,
    /// Rules to skip (default 0).
    #[cfg_attr(feature = "openapi", param(value_type = Option<u64>, minimum = 0, maximum = 9_007_199_254_740_991_u64))]
    pub offset: Option<Whole>,
}

/// What a bulk change did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ChangeSummary {
    /// Whether a new ruleset version was made (or, for a dry run, would be).
    pub changed: bool,
    pub dry_run: bool,
    /// The ruleset version now current.
    pub version: u64,
    pub added: Vec<String>,
    pub updated: Vec<String>,
    pub removed: Vec<String>,
}

/// `POST /api/v1/rules:apply`'s options.
#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query))]
#[serde(deny_unknown_fields)]
pub struct ApplyQuery {
    /// Delete rules that are not in the file.
    #[serde(default)]
    pub prune: bool,
    /// Validate and report what would change, without changing anything.
    #[serde(default)]
    pub dry_run: bool,
}
