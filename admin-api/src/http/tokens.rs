//! `/api/v1/tokens`: create, list and revoke API tokens (admin only). A token's secret
//! is in the creation response and nowhere else, ever.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use sluice_api::{CreateToken, CreatedToken, Problem, TokenList, TokenView};

use super::AppState;
use super::auth::{Auth, ManageTokens};
use super::body::{BodyInput, JsonBody, PathParam};
use super::error::{ApiError, Input};
use super::openapi::{AuthErrors, WriteErrors};
use crate::store::{TokenInfo, now_ms, rfc3339};

impl BodyInput for CreateToken {
    const INPUT: Input = Input::Token;
}

fn token_view(t: &TokenInfo) -> TokenView {
    TokenView {
        id: t.id.clone(),
        name: t.name.clone(),
        role: t.role,
        created_at: rfc3339(t.created_at),
        created_by: t.created_by.clone(),
        last_used_at: t.last_used_at.map(rfc3339),
        revoked_at: t.revoked_at.map(rfc3339),
    }
}

#[utoipa::path(
    get, path = "/api/v1/tokens", tag = "tokens",
    responses((status = 200, description = "Every token, revoked ones included; never a secret", body = TokenList), AuthErrors),
)]
pub(crate) async fn list_tokens(
    State(state): State<AppState>,
    _auth: Auth<ManageTokens>,
) -> Result<Json<TokenList>, ApiError> {
    let tokens = state.store().list_tokens().await?;
    Ok(Json(TokenList {
        tokens: tokens.iter().map(token_view).collect(),
    }))
}

#[utoipa::path(
    post, path = "/api/v1/tokens", tag = "tokens",
    request_body = CreateToken,
    responses(
        (status = 201, description = "Created; the secret is in `token`, shown only now", body = CreatedToken),
        WriteErrors,
        AuthErrors,
    ),
)]
pub(crate) async fn create_token(
    State(state): State<AppState>,
    auth: Auth<ManageTokens>,
    JsonBody(request): JsonBody<CreateToken>,
) -> Result<(StatusCode, Json<CreatedToken>), ApiError> {
    let created = state
        .store()
        .create_token(&auth.actor(), &request.name, request.role, now_ms())
        .await
        .map_err(|e| ApiError::from(e).about(Input::Token))?;
    Ok((
        StatusCode::CREATED,
        Json(CreatedToken {
            token: created.secret,
            info: token_view(&created.info),
        }),
    ))
}

#[utoipa::path(
    delete, path = "/api/v1/tokens/{id}", tag = "tokens",
    params(("id" = String, Path, description = "The token's id (`tok_...`), not its secret")),
    responses(
        (status = 200, description = "Revoked (revoking twice is harmless)", body = TokenView),
        (status = 404, description = "No such token", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The token sending the request: revoke it with another admin token, so no one locks themselves out", body = Problem, content_type = "application/problem+json"),
        AuthErrors,
    ),
)]
pub(crate) async fn revoke_token(
    State(state): State<AppState>,
    auth: Auth<ManageTokens>,
    PathParam(id): PathParam<String>,
) -> Result<Json<TokenView>, ApiError> {
    if id == auth.token.id {
        return Err(ApiError::Conflict(format!(
            "token `{id}` is the one sending this request: revoke it with another admin token"
        )));
    }
    let info = state
        .store()
        .revoke_token(&auth.actor(), &id, now_ms())
        .await?;
    state.token_cache().forget_id(&id);
    Ok(Json(token_view(&info)))
}
