//! `/api/v1/rules`: list, get, create, replace, merge-patch, delete, enable, disable,
//! bulk apply and export.

use std::collections::HashMap;
use std::path::Path;

use axum::Json;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::Value;
use sluice_api::schema::{RuleSpecSchema, RulesFileSchema};
use sluice_api::{
    ApplyQuery, ChangeKind, ChangeSummary, ListQuery, Problem, RuleList, RuleView, etag,
};
use sluice_core::spec::RuleSpec;
use sluice_core::wire::PROXY_RULESET_VERSION_HEADER;
use utoipa::IntoParams;

use super::AppState;
use super::auth::{Auth, Read, WriteRules};
use super::body::{
    self, IfMatchHeader, JsonBody, Params, PathParam, if_match, merge_patch, page_limit,
};
use super::error::{ApiError, Input};
use super::openapi::{AuthErrors, WriteErrors};
use crate::rules_file::{self, RulesFileError, RulesFormat};
use crate::store::{
    Action, Edited, RuleFilter, RuleRecord, StoreError, Working, canonical, now_ms, rfc3339,
    rule_id,
};

/// A stored rule as the API shows it.
pub fn rule_view(record: &RuleRecord) -> RuleView {
    RuleView {
        id: record.id.clone(),
        revision: record.revision,
        created_at: rfc3339(record.created_at),
        updated_at: rfc3339(record.updated_at),
        spec: record.spec.clone(),
    }
}

/// What an edit (or, for a dry run, a preview) did.
pub fn change_summary(edited: &Edited, dry_run: bool) -> ChangeSummary {
    let ids = |kind| {
        edited
            .changes
            .iter()
            .filter(|c| c.change == kind)
            .map(|c| c.id.clone())
            .collect()
    };
    ChangeSummary {
        changed: !edited.changes.is_empty(),
        dry_run,
        version: edited.version,
        added: ids(ChangeKind::Added),
        updated: ids(ChangeKind::Changed),
        removed: ids(ChangeKind::Removed),
        estimates: Vec::new(),
    }
}

/// `x-sluice-ruleset-version`: the ruleset version a response reflects.
pub fn version_header(version: u64) -> (HeaderName, HeaderValue) {
    (
        HeaderName::from_static(PROXY_RULESET_VERSION_HEADER),
        HeaderValue::from(version),
    )
}

fn rule_response(status: StatusCode, record: &RuleRecord, version: u64) -> Response {
    let mut response = (status, Json(rule_view(record))).into_response();
    let headers = response.headers_mut();
    if let Ok(tag) = HeaderValue::from_str(&etag(record.revision)) {
        headers.insert(header::ETAG, tag);
    }
    let (name, value) = version_header(version);
    headers.insert(name, value);
    if status == StatusCode::CREATED {
        // Ids are validated to a URL-safe alphabet before anything is stored.
        if let Ok(location) = HeaderValue::from_str(&format!("/api/v1/rules/{}", record.id)) {
            headers.insert(header::LOCATION, location);
        }
    }
    response
}

/// The rule `id` as an edit left it, answered with `status` (a 500 if it is missing: the
/// edit itself put it there).
fn edited_rule(status: StatusCode, edited: &Edited, id: &str) -> Result<Response, ApiError> {
    let record = edited
        .rules
        .get(id)
        .ok_or_else(|| ApiError::Internal(format!("rule `{id}` missing after the edit")))?;
    Ok(rule_response(status, record, edited.version))
}

/// One edit of the rule `id` by the caller, made by `change` on the working ruleset, then
/// the long-polls woken. A 422 is about `input`: the rule sent, or the whole ruleset.
async fn edit_rule(
    state: &AppState,
    auth: &Auth<WriteRules>,
    action: Action,
    id: &str,
    input: Input,
    change: impl FnOnce(&mut Working) -> Result<(), StoreError>,
) -> Result<Edited, ApiError> {
    let edited = state
        .store()
        .edit(&auth.actor(), action, Some(id), now_ms(), change)
        .await
        .map_err(|e| ApiError::from(e).about(input))?;
    state.committed(edited.version);
    Ok(edited)
}

/// A body for `/rules/{id}` keeps the rule's identity: with no `id` of its own it takes
/// the one in the URL (so renaming a rule keeps its buckets), and a different one is
/// refused (an id is changed by creating a new rule and deleting the old one).
fn keep_identity(mut spec: RuleSpec, id: &str) -> Result<RuleSpec, ApiError> {
    if spec.id.is_none() && spec.name != id {
        spec.id = Some(id.to_string());
    }
    if rule_id(&spec) != id {
        return Err(ApiError::invalid(
            Input::Rule,
            "id",
            format!(
                "must be the rule's id in the URL, `{id}`: to change an id, create a new rule and delete this one"
            ),
        ));
    }
    Ok(spec)
}

#[utoipa::path(
    get, path = "/api/v1/rules", tag = "rules",
    params(ListQuery),
    responses(
        (status = 200, description = "A page of rules", body = RuleList),
        (status = 400, description = "Bad query parameters", body = Problem, content_type = "application/problem+json"),
        AuthErrors,
    ),
)]
pub async fn list_rules(
    State(state): State<AppState>,
    _auth: Auth<Read>,
    Params(query): Params<ListQuery>,
) -> Result<Json<RuleList>, ApiError> {
    let limit = page_limit(query.limit)?;
    let filter = RuleFilter {
        name: query.name,
        enabled: query.enabled,
        mode: query.mode,
        limit,
        offset: query.offset.map_or(0, |o| o.0),
    };
    let page = state.store().list_rules(&filter).await?;
    Ok(Json(RuleList {
        rules: page.rules.iter().map(rule_view).collect(),
        total: page.total,
        limit,
        offset: filter.offset,
    }))
}

#[utoipa::path(
    get, path = "/api/v1/rules/{id}", tag = "rules",
    params(("id" = String, Path, description = "The rule's id")),
    responses(
        (status = 200, description = "The rule; `ETag` is its revision", body = RuleView,
         headers(("ETag" = String, description = "The rule's revision, quoted"))),
        (status = 404, description = "No such rule", body = Problem, content_type = "application/problem+json"),
        AuthErrors,
    ),
)]
pub async fn get_rule(
    State(state): State<AppState>,
    _auth: Auth<Read>,
    PathParam(id): PathParam<String>,
) -> Result<Response, ApiError> {
    let record = state
        .store()
        .get_rule(&id)
        .await?
        .ok_or(StoreError::RuleNotFound(id))?;
    let version = state.store().current_version().await?;
    Ok(rule_response(StatusCode::OK, &record, version))
}

#[utoipa::path(
    post, path = "/api/v1/rules", tag = "rules",
    request_body(content = RuleSpecSchema, description = "The rule", content_type = "application/json"),
    responses(
        (status = 201, description = "Created; a new ruleset version", body = RuleView,
         headers(("ETag" = String), ("Location" = String), ("x-sluice-ruleset-version" = u64))),
        (status = 409, description = "A rule with this id exists, or another rule has this name", body = Problem, content_type = "application/problem+json"),
        WriteErrors,
        AuthErrors,
    ),
)]
pub async fn create_rule(
    State(state): State<AppState>,
    auth: Auth<WriteRules>,
    JsonBody(spec): JsonBody<RuleSpec>,
) -> Result<Response, ApiError> {
    let spec = canonical(spec);
    let id = rule_id(&spec).to_string();
    let edited = edit_rule(&state, &auth, Action::RuleCreate, &id, Input::Rule, |w| {
        if w.get(&id).is_some() {
            return Err(StoreError::RuleExists(id.clone()));
        }
        w.put_one(spec)?;
        Ok(())
    })
    .await?;
    edited_rule(StatusCode::CREATED, &edited, &id)
}

#[utoipa::path(
    put, path = "/api/v1/rules/{id}", tag = "rules",
    params(
        ("id" = String, Path, description = "The rule's id"),
        IfMatchHeader,
    ),
    request_body(content = RuleSpecSchema, description = "The whole rule", content_type = "application/json"),
    responses(
        (status = 200, description = "Replaced (a new ruleset version unless nothing changed)", body = RuleView,
         headers(("ETag" = String), ("x-sluice-ruleset-version" = u64))),
        (status = 404, description = "No such rule", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Stale If-Match, or another rule has this name: nothing changed", body = Problem, content_type = "application/problem+json"),
        WriteErrors,
        AuthErrors,
    ),
)]
pub async fn replace_rule(
    State(state): State<AppState>,
    auth: Auth<WriteRules>,
    PathParam(id): PathParam<String>,
    headers: HeaderMap,
    JsonBody(spec): JsonBody<RuleSpec>,
) -> Result<Response, ApiError> {
    let precondition = if_match(&headers);
    let spec = keep_identity(spec, &id)?;
    let edited = edit_rule(&state, &auth, Action::RuleReplace, &id, Input::Rule, |w| {
        w.require(&id, precondition.as_ref())?;
        w.put_one(spec)?;
        Ok(())
    })
    .await?;
    edited_rule(StatusCode::OK, &edited, &id)
}

#[utoipa::path(
    patch, path = "/api/v1/rules/{id}", tag = "rules",
    params(
        ("id" = String, Path, description = "The rule's id"),
        IfMatchHeader,
    ),
    request_body(content = Object, description = "A JSON merge patch (RFC 7396) of the rule: `{\"enabled\": false}`, `{\"match\": {\"host\": null}}` removes a field",
        content_type = "application/merge-patch+json"),
    responses(
        (status = 200, description = "Patched", body = RuleView,
         headers(("ETag" = String), ("x-sluice-ruleset-version" = u64))),
        (status = 404, description = "No such rule", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Stale If-Match, or another rule has this name: nothing changed", body = Problem, content_type = "application/problem+json"),
        WriteErrors,
        AuthErrors,
    ),
)]
pub async fn patch_rule(
    State(state): State<AppState>,
    auth: Auth<WriteRules>,
    PathParam(id): PathParam<String>,
    headers: HeaderMap,
    JsonBody(patch): JsonBody<Value>,
) -> Result<Response, ApiError> {
    let precondition = if_match(&headers);
    // The patch applies to the rule as it is inside the transaction, so two patches of
    // different fields never undo each other.
    let edited = edit_rule(&state, &auth, Action::RulePatch, &id, Input::Rule, |w| {
        let current = w.require(&id, precondition.as_ref())?;
        let mut value =
            serde_json::to_value(current).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        merge_patch(&mut value, &patch);
        let patched: RuleSpec = body::from_value(value).map_err(StoreError::Invalid)?;
        let patched = keep_identity(patched, &id).map_err(|e| match e {
            ApiError::Invalid(_, errors) => StoreError::Invalid(errors),
            other => StoreError::Corrupt(other.to_string()),
        })?;
        w.put_one(patched)?;
        Ok(())
    })
    .await?;
    edited_rule(StatusCode::OK, &edited, &id)
}

#[utoipa::path(
    delete, path = "/api/v1/rules/{id}", tag = "rules",
    params(
        ("id" = String, Path, description = "The rule's id"),
        IfMatchHeader,
    ),
    responses(
        (status = 204, description = "Deleted; a new ruleset version", headers(("x-sluice-ruleset-version" = u64))),
        (status = 404, description = "No such rule", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Stale If-Match: nothing changed", body = Problem, content_type = "application/problem+json"),
        AuthErrors,
    ),
)]
pub async fn delete_rule(
    State(state): State<AppState>,
    auth: Auth<WriteRules>,
    PathParam(id): PathParam<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let precondition = if_match(&headers);
    let edited = edit_rule(
        &state,
        &auth,
        Action::RuleDelete,
        &id,
        Input::Ruleset,
        |w| {
            w.require(&id, precondition.as_ref())?;
            w.remove(&id);
            Ok(())
        },
    )
    .await?;
    Ok((StatusCode::NO_CONTENT, [version_header(edited.version)]).into_response())
}

/// Sets a rule's `enabled`: the one body of [`enable_rule`] and [`disable_rule`].
async fn set_enabled(
    state: &AppState,
    auth: &Auth<WriteRules>,
    id: &str,
    headers: &HeaderMap,
    enabled: bool,
) -> Result<Response, ApiError> {
    let precondition = if_match(headers);
    let action = if enabled {
        Action::RuleEnable
    } else {
        Action::RuleDisable
    };
    let edited = edit_rule(state, auth, action, id, Input::Ruleset, |w| {
        let mut spec = w.require(id, precondition.as_ref())?.clone();
        spec.enabled = enabled;
        w.put(spec, "");
        Ok(())
    })
    .await?;
    edited_rule(StatusCode::OK, &edited, id)
}

/// `POST /api/v1/rules/{id}/enable` and `/disable`: one handler, declared once for each
/// path with what it answers.
macro_rules! set_enabled_handler {
    ($name:ident, $path:tt, $done:tt, $enabled:tt) => {
        #[utoipa::path(
            post, path = $path, tag = "rules",
            params(
                ("id" = String, Path, description = "The rule's id"),
                IfMatchHeader,
            ),
            responses(
                (status = 200, description = $done, body = RuleView),
                (status = 404, description = "No such rule", body = Problem, content_type = "application/problem+json"),
                (status = 409, description = "Stale If-Match", body = Problem, content_type = "application/problem+json"),
                AuthErrors,
            ),
        )]
        pub async fn $name(
            State(state): State<AppState>,
            auth: Auth<WriteRules>,
            PathParam(id): PathParam<String>,
            headers: HeaderMap,
        ) -> Result<Response, ApiError> {
            set_enabled(&state, &auth, &id, &headers, $enabled).await
        }
    };
}

set_enabled_handler!(
    enable_rule,
    "/api/v1/rules/{id}/enable",
    "Enabled (a no-op if it already was)",
    true
);
set_enabled_handler!(
    disable_rule,
    "/api/v1/rules/{id}/disable",
    "Disabled (a no-op if it already was)",
    false
);

/// The syntax of a rules file sent as a request body, by its `Content-Type`.
fn body_format(headers: &HeaderMap) -> Result<RulesFormat, ApiError> {
    match body::media_type(headers).as_deref() {
        Some("application/json") => Ok(RulesFormat::Json),
        Some("application/yaml" | "application/x-yaml" | "text/yaml" | "text/x-yaml") => {
            Ok(RulesFormat::Yaml)
        }
        other => Err(ApiError::UnsupportedMediaType(format!(
            "a rules file must be sent as application/json or application/yaml{}",
            other.map(|t| format!(", not {t}")).unwrap_or_default()
        ))),
    }
}

/// Parses a rules body off the async executor (a parse of a large or hostile body would
/// stall every request on its worker thread), refusing a body that nests deeper than
/// [`rules_file::MAX_NESTING`] before parsing it, within
/// [`super::state::PARSE_TIME_LIMIT`] (or the state's own limit) and one of
/// [`super::state::PARSE_SLOTS`] turns: a parse that overruns is answered at once, and the
/// slot it holds until it ends keeps such parses from piling up.
async fn parse_rules_body(
    state: &AppState,
    text: String,
    format: RulesFormat,
) -> Result<Vec<RuleSpec>, ApiError> {
    let limit = state.parse_time_limit();
    let deadline = tokio::time::Instant::now() + limit;
    let busy = || {
        ApiError::Unavailable(
            "the server is busy parsing other rules files: retry in a few seconds".to_string(),
        )
    };
    let slot = tokio::time::timeout_at(deadline, state.parse_slots().acquire_owned())
        .await
        .map_err(|_| busy())?
        .map_err(|_| busy())?;
    let parse = tokio::task::spawn_blocking(move || {
        let _slot = slot;
        rules_file::parse_rules(&text, format, Path::new("body"))
    });
    let parsed = tokio::time::timeout_at(deadline, parse)
        .await
        .map_err(|_| {
            ApiError::BadRequest(format!(
                "the rules file took longer than {} to parse (the limit): send a smaller or \
                 simpler file",
                humantime::format_duration(limit)
            ))
        })?
        .map_err(|e| ApiError::Internal(format!("parsing a rules body: {e}")))?;
    parsed.map_err(|e| match e {
        RulesFileError::Shape { field, message, .. } => {
            ApiError::invalid(Input::Ruleset, field, message)
        }
        RulesFileError::Syntax {
            format, message, ..
        } => ApiError::BadRequest(format!("the body is not valid {format}: {message}")),
        RulesFileError::TooDeep { depth, limit, .. } => ApiError::BadRequest(format!(
            "the body nests {depth} levels deep; a rules file may nest at most {limit} \
             (the nesting limit)"
        )),
        other => ApiError::BadRequest(other.to_string()),
    })
}

/// Refuses a file that has two rules with one id: the second would silently win.
fn check_unique_ids(specs: &[RuleSpec]) -> Result<(), ApiError> {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    let mut problems = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        let id = rule_id(spec);
        if let Some(first) = seen.insert(id, i) {
            let field = if spec.id.is_some() { "id" } else { "name" };
            problems.push(sluice_core::validation::FieldError {
                field: format!("rules[{i}].{field}"),
                message: format!("rule id `{id}` is also used by rules[{first}]"),
            });
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(ApiError::Invalid(
            Input::Ruleset,
            sluice_core::validation::ValidationErrors(problems),
        ))
    }
}

#[utoipa::path(
    post, path = "/api/v1/rules:apply", tag = "rules",
    params(ApplyQuery),
    request_body(content(
        (RulesFileSchema = "application/json"),
        (RulesFileSchema = "application/yaml"),
    ), description = "A rules file: a list of rules, or `{rules: [...]}`, as JSON or YAML. Rules are matched to stored ones by id; applying the same file twice changes nothing."),
    responses(
        (status = 200, description = "Applied (or, with `dry_run`, checked, with an estimate per added or changed rule of what it would have throttled of the last hour's traffic)", body = ChangeSummary),
        WriteErrors,
        AuthErrors,
    ),
)]
pub async fn apply_rules(
    State(state): State<AppState>,
    auth: Auth<WriteRules>,
    Params(query): Params<ApplyQuery>,
    request: Request,
) -> Result<Json<ChangeSummary>, ApiError> {
    let format = body_format(request.headers())?;
    let bytes = body::read_body(request, &state).await?;
    let text = String::from_utf8(bytes.to_vec())
        .map_err(|_| ApiError::BadRequest("the body is not UTF-8 text".to_string()))?;
    let specs = parse_rules_body(&state, text, format).await?;
    check_unique_ids(&specs)?;
    let estimated = query.dry_run.then(|| specs.clone());
    let file_ids: Vec<String> = specs
        .iter()
        .map(|s| rule_id(&canonical(s.clone())).to_string())
        .collect();
    let edit = |w: &mut Working| {
        if query.prune {
            for id in w.ids() {
                if !file_ids.contains(&id) {
                    w.remove(&id);
                }
            }
        }
        for (i, spec) in specs.into_iter().enumerate() {
            w.put(spec, format!("rules[{i}]"));
        }
        Ok(())
    };
    let actor = auth.actor();
    let edited = if query.dry_run {
        state.store().preview(edit).await?
    } else {
        state
            .store()
            .edit(&actor, Action::Apply, None, now_ms(), edit)
            .await?
    };
    if edited.created {
        state.committed(edited.version);
    }
    let mut summary = change_summary(&edited, query.dry_run);
    if let Some(specs) = estimated {
        // What the added and changed rules would have throttled of the last hour.
        let changed: Vec<RuleSpec> = specs
            .into_iter()
            .map(canonical)
            .filter(|s| {
                let id = rule_id(s);
                summary
                    .added
                    .iter()
                    .chain(&summary.updated)
                    .any(|c| c == id)
            })
            .collect();
        summary.estimates = super::estimate::estimates(&state, changed).await?;
    }
    Ok(Json(summary))
}

/// How an export asks for YAML.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Header)]
#[allow(dead_code)] // Read from the header map; the struct documents it.
pub struct ExportHeaders {
    /// `application/yaml` (any value naming yaml) for YAML; JSON otherwise.
    #[param(rename = "Accept", value_type = String, required = false)]
    accept: Option<String>,
}

#[utoipa::path(
    get, path = "/api/v1/export", tag = "rules",
    params(ExportHeaders),
    responses(
        (status = 200, description = "The current rules as a rules file `{rules: [...]}` that `rules:apply` takes back",
         content(("application/json"), ("application/yaml")),
         headers(("x-sluice-ruleset-version" = u64))),
        AuthErrors,
    ),
)]
pub async fn export_rules(
    State(state): State<AppState>,
    _auth: Auth<Read>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let doc = state.store().document().await?;
    let wants_yaml = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("yaml"));
    let (content_type, body) = if wants_yaml {
        let yaml = rules_file::render_rules(&doc.rules, RulesFormat::Yaml)
            .map_err(|e| ApiError::Internal(format!("exporting YAML: {e}")))?;
        (
            "application/yaml",
            format!(
                "# Sluice rules at ruleset version {}.\n# Apply with: sluice rules apply -f FILE\n{yaml}",
                doc.version
            ),
        )
    } else {
        let json = rules_file::render_rules(&doc.rules, RulesFormat::Json)
            .map_err(|e| ApiError::Internal(format!("exporting JSON: {e}")))?;
        ("application/json", json)
    };
    Ok((
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
            version_header(doc.version),
        ],
        body,
    )
        .into_response())
}
