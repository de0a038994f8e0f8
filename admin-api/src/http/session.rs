//! `/api/v1/session`: the dashboard's sign-in. A token (viewer, editor or admin; proxy
//! tokens are refused) is exchanged for a server-side session held in an HttpOnly,
//! SameSite=Strict cookie, so the token itself never sits in the browser's storage.

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use sluice_api::{Problem, SessionView, SignIn};

use super::AppState;
use super::auth::{self, Auth, Read, SESSION_COOKIE, guarded};
use super::body::{BodyInput, JsonBody, Peer};
use super::error::{ApiError, Input};
use super::failed_auth::Credential;
use super::openapi::{AuthErrors, WriteErrors};
use crate::store::{Role, TokenInfo, now_ms, rfc3339};
use crate::tls::OverTls;

impl BodyInput for SignIn {
    const INPUT: Input = Input::SignIn;
}

fn session_view(token: &TokenInfo, expires_at: Option<i64>) -> SessionView {
    SessionView {
        role: token.role,
        token_name: token.name.clone(),
        token_id: token.id.clone(),
        expires_at: expires_at.map(rfc3339),
    }
}

/// `Secure` only when the browser reached us over HTTPS: a Secure cookie set over plain
/// HTTP would not come back.
fn cookie(value: &str, https: bool, clear: bool) -> Option<HeaderValue> {
    // No Max-Age on the live cookie: it lasts for the browser session, and the server
    // enforces the sliding expiry.
    let mut text = format!("{SESSION_COOKIE}={value}; Path=/; HttpOnly; SameSite=Strict");
    if clear {
        text.push_str("; Max-Age=0");
    }
    if https {
        text.push_str("; Secure");
    }
    HeaderValue::from_str(&text).ok()
}

#[utoipa::path(
    post, path = "/api/v1/session", tag = "session",
    request_body = SignIn,
    responses(
        (status = 201, description = "Signed in; the session cookie is set", body = SessionView,
         headers(("Set-Cookie" = String, description = "sluice_session=...; HttpOnly; SameSite=Strict"))),
        (status = 401, description = "Unknown or revoked token", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "A proxy token: it cannot sign in", body = Problem, content_type = "application/problem+json"),
        WriteErrors,
    ),
    security(()),
)]
pub(crate) async fn create_session(
    State(state): State<AppState>,
    tls: Option<Extension<OverTls>>,
    headers: HeaderMap,
    peer: Peer,
    JsonBody(request): JsonBody<SignIn>,
) -> Result<Response, ApiError> {
    let token = guarded(&state, peer, Credential::SignIn, async {
        state
            .store()
            .authenticate(request.token.trim(), now_ms())
            .await
    })
    .await?
    .ok_or(ApiError::Unauthenticated("unknown or revoked token"))?;
    if token.role == Role::Proxy {
        return Err(ApiError::Forbidden {
            role: token.role,
            action: "sign in to the dashboard",
        });
    }
    let session = state.store().create_session(&token, now_ms()).await?;
    let cookie = cookie(
        &session.secret,
        auth::over_https(&headers, tls.is_some()),
        false,
    )
    .ok_or_else(|| ApiError::Internal("session id is not a header value".to_string()))?;
    let mut response = (
        StatusCode::CREATED,
        Json(session_view(&token, Some(session.expires_at))),
    )
        .into_response();
    response.headers_mut().insert(header::SET_COOKIE, cookie);
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(response)
}

#[utoipa::path(
    get, path = "/api/v1/session", tag = "session",
    responses((status = 200, description = "The signed-in token's role and name (also answers for a bearer token)", body = SessionView), AuthErrors),
)]
pub(crate) async fn get_session(auth: Auth<Read>) -> Json<SessionView> {
    Json(session_view(&auth.token, None))
}

#[utoipa::path(
    delete, path = "/api/v1/session", tag = "session",
    responses((status = 204, description = "Signed out; the cookie is cleared (also when there was no session)")),
    security(()),
)]
pub(crate) async fn delete_session(
    State(state): State<AppState>,
    tls: Option<Extension<OverTls>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    if let Some(secret) = auth::session_cookie(&headers) {
        state.store().delete_session(secret).await?;
    }
    let mut response = StatusCode::NO_CONTENT.into_response();
    if let Some(cookie) = cookie("", auth::over_https(&headers, tls.is_some()), true) {
        response.headers_mut().insert(header::SET_COOKIE, cookie);
    }
    Ok(response)
}
