//! `/api/v1/versions`: the ruleset's history, diffs between versions, and rollback.

use axum::Json;
use axum::extract::State;
use sluice_api::{
    ChangeSummary, DiffQuery, DiffView, Problem, RuleChangeView, VersionDetailView, VersionList,
    VersionView, VersionsQuery, Whole,
};

use super::AppState;
use super::auth::{Auth, Read, WriteRules};
use super::body::{Params, PathParam, page_limit};
use super::error::ApiError;
use super::openapi::{AuthErrors, WriteErrors};
use super::rules::change_summary;
use crate::store::{Action, RuleChange, VersionSummary, now_ms, rfc3339};

fn version_view(v: &VersionSummary) -> VersionView {
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

#[utoipa::path(
    get, path = "/api/v1/versions", tag = "versions",
    params(VersionsQuery),
    responses((status = 200, description = "Versions, newest first", body = VersionList), AuthErrors),
)]
pub(crate) async fn list_versions(
    State(state): State<AppState>,
    _auth: Auth<Read>,
    Params(query): Params<VersionsQuery>,
) -> Result<Json<VersionList>, ApiError> {
    let limit = page_limit(query.limit)?;
    let versions = state
        .store()
        .list_versions(limit, query.before.map(|b| b.0))
        .await?;
    Ok(Json(VersionList {
        versions: versions.iter().map(version_view).collect(),
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
pub(crate) async fn get_version(
    State(state): State<AppState>,
    _auth: Auth<Read>,
    PathParam(Whole(version)): PathParam<Whole>,
) -> Result<Json<VersionDetailView>, ApiError> {
    let detail = state.store().version(version).await?;
    Ok(Json(VersionDetailView {
        version: version_view(&detail.summary),
        rules: detail.rules,
    }))
}

fn rule_change_view(c: RuleChange) -> RuleChangeView {
    RuleChangeView {
        id: c.id,
        change: c.change,
        before: c.before,
        after: c.after,
    }
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
pub(crate) async fn diff_versions(
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
        changes: changes.into_iter().map(rule_change_view).collect(),
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
pub(crate) async fn rollback(
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
    Ok(Json(change_summary(&edited, false)))
}
