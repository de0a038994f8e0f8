//! `/api/v1/versions`: the ruleset's history, diffs between versions, and rollback.

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use sluice_core::spec::RuleSpec;
use utoipa::{IntoParams, ToSchema};

use super::AppState;
use super::auth::{Auth, Read, WriteRules};
use super::body::{Params, PathParam, Whole};
use super::error::{ApiError, Problem};
use super::openapi::{AuthErrors, RuleSpecSchema, WriteErrors};
use super::rules::ChangeSummary;
use crate::store::{Action, ChangeKind, RuleChange, VersionSummary, now_ms, rfc3339};

/// One ruleset version: who made it, when, and how.
#[derive(Debug, Serialize, ToSchema)]
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

impl From<&VersionSummary> for VersionView {
    fn from(v: &VersionSummary) -> Self {
        VersionView {
            version: v.version,
            created_at: rfc3339(v.created_at),
            actor_id: v.actor_id.clone(),
            actor_name: v.actor_name.clone(),
            action: v.action.clone(),
            summary: v.summary.clone(),
            rule_count: v.rule_count,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct VersionList {
    /// Newest first.
    pub versions: Vec<VersionView>,
}

/// A version with the whole ruleset as it was.
#[derive(Debug, Serialize, ToSchema)]
pub struct VersionDetailView {
    #[serde(flatten)]
    pub version: VersionView,
    /// In evaluation order.
    #[schema(value_type = Vec<RuleSpecSchema>)]
    pub rules: Vec<RuleSpec>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct VersionsQuery {
    /// Page size (default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
    /// Only versions older than this (the last `version` of the previous page).
    #[param(value_type = Option<u64>, minimum = 0, maximum = 9_007_199_254_740_991_u64)]
    before: Option<Whole>,
}

#[utoipa::path(
    get, path = "/api/v1/versions", tag = "versions",
    params(VersionsQuery),
    responses((status = 200, description = "Versions, newest first", body = VersionList), AuthErrors),
)]
pub async fn list_versions(
    State(state): State<AppState>,
    _auth: Auth<Read>,
    Params(query): Params<VersionsQuery>,
) -> Result<Json<VersionList>, ApiError> {
    let limit = query.limit.unwrap_or(100);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::BadRequest(
            "limit must be between 1 and 1000".to_string(),
        ));
    }
    let versions = state
        .store()
        .list_versions(limit, query.before.map(|b| b.0))
        .await?;
    Ok(Json(VersionList {
        versions: versions.iter().map(VersionView::from).collect(),
    }))
}

#[utoipa::path(
    get, path = "/api/v1/versions/{version}", tag = "versions",
    params(("version" = u64, Path, minimum = 0, maximum = 9_007_199_254_740_991_u64, description = "A ruleset version; 0 is the empty ruleset before any change")),
    responses(
        (status = 200, description = "The version and its ruleset", body = VersionDetailView),
        (status = 404, description = "No such version", body = Problem, content_type = "application/problem+json"),
        AuthErrors,
    ),
)]
pub async fn get_version(
    State(state): State<AppState>,
    _auth: Auth<Read>,
    PathParam(Whole(version)): PathParam<Whole>,
) -> Result<Json<VersionDetailView>, ApiError> {
    let detail = state.store().version(version).await?;
    Ok(Json(VersionDetailView {
        version: VersionView::from(&detail.summary),
        rules: detail.rules,
    }))
}

/// How one rule differs between two versions.
#[derive(Debug, Serialize, ToSchema)]
pub struct RuleChangeView {
    pub id: String,
    pub change: ChangeKind,
    /// Absent when the rule was added.
    #[schema(value_type = Option<RuleSpecSchema>)]
    pub before: Option<RuleSpec>,
    /// Absent when the rule was removed.
    #[schema(value_type = Option<RuleSpecSchema>)]
    pub after: Option<RuleSpec>,
}

impl From<RuleChange> for RuleChangeView {
    fn from(c: RuleChange) -> Self {
        RuleChangeView {
            id: c.id,
            change: c.change,
            before: c.before,
            after: c.after,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct DiffView {
    pub from: u64,
    pub to: u64,
    /// By rule id; rules equal in both versions are not listed.
    pub changes: Vec<RuleChangeView>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct DiffQuery {
    /// The older version.
    #[param(value_type = u64, minimum = 0, maximum = 9_007_199_254_740_991_u64)]
    from: Whole,
    /// The newer version (default: the current one).
    #[param(value_type = Option<u64>, minimum = 0, maximum = 9_007_199_254_740_991_u64)]
    to: Option<Whole>,
}

#[utoipa::path(
    get, path = "/api/v1/diff", tag = "versions",
    params(DiffQuery),
    responses(
        (status = 200, description = "Per-rule differences from `from` to `to`", body = DiffView),
        (status = 404, description = "No such version", body = Problem, content_type = "application/problem+json"),
        AuthErrors,
    ),
)]
pub async fn diff_versions(
    State(state): State<AppState>,
    _auth: Auth<Read>,
    Params(query): Params<DiffQuery>,
) -> Result<Json<DiffView>, ApiError> {
    let to = match query.to {
        Some(to) => to.0,
        None => state.store().current_version().await?,
    };
    let changes = state.store().diff(query.from.0, to).await?;
    Ok(Json(DiffView {
        from: query.from.0,
        to,
        changes: changes.into_iter().map(RuleChangeView::from).collect(),
    }))
}

#[utoipa::path(
    post, path = "/api/v1/versions/{version}/rollback", tag = "versions",
    params(("version" = u64, Path, minimum = 0, maximum = 9_007_199_254_740_991_u64, description = "The version whose ruleset to restore")),
    responses(
        (status = 200, description = "Restored as a NEW version (none if the ruleset already equals it)", body = ChangeSummary),
        (status = 404, description = "No such version", body = Problem, content_type = "application/problem+json"),
        WriteErrors,
        AuthErrors,
    ),
)]
pub async fn rollback(
    State(state): State<AppState>,
    auth: Auth<WriteRules>,
    PathParam(Whole(version)): PathParam<Whole>,
) -> Result<Json<ChangeSummary>, ApiError> {
    let snapshot = state.store().version(version).await?.rules;
    let target = format!("version {version}");
    let now = now_ms();
    let edited = state
        .store()
        .edit(&auth.actor(), Action::Rollback, Some(&target), now, |w| {
            for id in w.ids() {
                w.remove(&id);
            }
            for (i, spec) in snapshot.into_iter().enumerate() {
                w.put(spec, format!("rules[{i}]"));
            }
            Ok(())
        })
        .await?;
    state.committed(edited.version);
    Ok(Json(ChangeSummary::of(&edited, false)))
}
