//! The API's one error type: every failure a handler can have, its status, and its
//! `application/problem+json` body (RFC 9457).

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use sluice_api::Problem;
use sluice_core::validation::{FieldError, ValidationErrors};

use crate::store::{Role, StoreError};

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ApiError {
    /// No token, a malformed `Authorization` header, or an unknown or revoked token.
    #[error("{0}")]
    Unauthenticated(&'static str),
    #[error("a token with role `{role}` may not {action}")]
    Forbidden { role: Role, action: &'static str },
    #[error("{0}")]
    NotFound(String),
    /// A create whose id exists.
    #[error("{0}")]
    Conflict(String),
    /// `If-Match` named a revision that is no longer current: nothing was changed.
    #[error(
        "rule `{id}` has changed since revision(s) given in If-Match; it is now at revision {current}"
    )]
    StaleRevision { id: String, current: u64 },
    /// Unparsable JSON or YAML, or bad query parameters.
    #[error("{0}")]
    BadRequest(String),
    /// Well-formed input that is not valid (a rule, a report...): every problem, with its
    /// field. The problem's title names what was invalid.
    #[error("{1}")]
    Invalid(Input, ValidationErrors),
    #[error("the request body is larger than {limit} bytes")]
    PayloadTooLarge { limit: usize },
    #[error("{0}")]
    UnsupportedMediaType(String),
    #[error("{0}")]
    Unavailable(String),
    /// The client's address failed to authenticate too often (see
    /// [`super::failed_auth`]); nothing was looked at.
    #[error(
        "too many failed authentications from this address: try again in {} s",
        retry_after_seconds(*retry_after)
    )]
    TooManyFailures { retry_after: std::time::Duration },
    /// A proxy id sent reports faster than `--report-rate` (see
    /// [`super::report_guard`]); nothing was kept.
    #[error(
        "this proxy id sends reports too often: try again in {} s",
        retry_after_seconds(*retry_after)
    )]
    TooManyReports { retry_after: std::time::Duration },
    /// Details are logged, not sent.
    #[error("internal error")]
    Internal(String),
}

/// What a request's invalid input was: the title of its 422 names it, so a bad report is
/// not called "Invalid rules".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Input {
    /// One rule: a created, replaced or patched rule.
    Rule,
    /// A whole ruleset: a bulk apply, a rollback, or a change that breaks another rule.
    Ruleset,
    Report,
    QuotaSync,
    Token,
    SignIn,
}

impl Input {
    pub(crate) fn title(self) -> &'static str {
        match self {
            Input::Rule => "Invalid rule",
            Input::Ruleset => "Invalid ruleset",
            Input::Report => "Invalid report",
            Input::QuotaSync => "Invalid quota sync",
            Input::Token => "Invalid token request",
            Input::SignIn => "Invalid sign-in request",
        }
    }
}

impl ApiError {
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            ApiError::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden { .. } => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Conflict(_) | ApiError::StaleRevision { .. } => StatusCode::CONFLICT,
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::Invalid(..) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::TooManyFailures { .. } | ApiError::TooManyReports { .. } => {
                StatusCode::TOO_MANY_REQUESTS
            }
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn kind_and_title(&self) -> (&'static str, &'static str) {
        match self {
            ApiError::Unauthenticated(_) => ("urn:sluice:unauthenticated", "Unauthorized"),
            ApiError::Forbidden { .. } => ("urn:sluice:forbidden", "Forbidden"),
            ApiError::NotFound(_) => ("urn:sluice:not-found", "Not Found"),
            ApiError::Conflict(_) => ("urn:sluice:conflict", "Conflict"),
            ApiError::StaleRevision { .. } => ("urn:sluice:stale-revision", "Conflict"),
            ApiError::BadRequest(_) => ("urn:sluice:bad-request", "Bad Request"),
            ApiError::Invalid(input, _) => ("urn:sluice:invalid", input.title()),
            ApiError::PayloadTooLarge { .. } => ("urn:sluice:too-large", "Payload Too Large"),
            ApiError::UnsupportedMediaType(_) => (
                "urn:sluice:unsupported-media-type",
                "Unsupported Media Type",
            ),
            ApiError::Unavailable(_) => ("urn:sluice:unavailable", "Service Unavailable"),
            ApiError::TooManyFailures { .. } => (
                "urn:sluice:too-many-failed-authentications",
                "Too Many Failed Authentications",
            ),
            ApiError::TooManyReports { .. } => ("urn:sluice:too-many-reports", "Too Many Reports"),
            ApiError::Internal(_) => ("urn:sluice:internal", "Internal Server Error"),
        }
    }

    /// One field error, for checks made in the handlers themselves.
    pub(crate) fn invalid(
        input: Input,
        field: impl Into<String>,
        message: impl Into<String>,
    ) -> ApiError {
        ApiError::Invalid(
            input,
            ValidationErrors(vec![FieldError {
                field: field.into(),
                message: message.into(),
            }]),
        )
    }

    /// Names what was invalid, for errors from a layer that does not know (the store
    /// validates whole rulesets, also when one rule was sent).
    pub(crate) fn about(self, input: Input) -> ApiError {
        match self {
            ApiError::Invalid(_, errors) => ApiError::Invalid(input, errors),
            other => other,
        }
    }
}

/// Whole seconds to wait, rounded up and at least 1 (`Retry-After` has no fractions).
fn retry_after_seconds(wait: std::time::Duration) -> u64 {
    let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    seconds.max(1)
}

impl From<StoreError> for ApiError {
    fn from(err: StoreError) -> Self {
        match err {
            StoreError::RuleNotFound(_)
            | StoreError::VersionNotFound(_)
            | StoreError::TokenNotFound(_) => ApiError::NotFound(err.to_string()),
            StoreError::RuleExists(_) | StoreError::NameTaken { .. } => {
                ApiError::Conflict(err.to_string())
            }
            StoreError::StaleRevision { id, current } => ApiError::StaleRevision { id, current },
            StoreError::Invalid(errors) => ApiError::Invalid(Input::Ruleset, errors),
            StoreError::Database(sqlx::Error::Database(db))
                if db.is_unique_violation() || db.is_foreign_key_violation() =>
            {
                // Validation catches duplicates first; this is a concurrent writer that
                // got there in between (e.g. another admin API on the same PostgreSQL).
                ApiError::Conflict(format!("conflicting change: {db}"))
            }
            // Down, restarting, unreachable or saturated: nothing was written, and trying
            // again later may succeed; the detail is logged, not sent.
            err if err.is_unavailable() => {
                tracing::warn!(detail = %err, "database unavailable");
                ApiError::Unavailable(
                    "the database is unavailable (down, restarting or busy); nothing was changed: try again later"
                        .to_string(),
                )
            }
            other => ApiError::Internal(other.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let (kind, title) = self.kind_and_title();
        if let ApiError::Internal(detail) = &self {
            tracing::error!(%detail, "internal error");
        }
        let retry_after = match &self {
            ApiError::TooManyFailures { retry_after }
            | ApiError::TooManyReports { retry_after } => Some(retry_after_seconds(*retry_after)),
            _ => None,
        };
        let (detail, errors) = match self {
            ApiError::Invalid(_, errors) => {
                let detail = match errors.0.len() {
                    1 => "1 problem found; nothing was changed".to_string(),
                    n => format!("{n} problems found; nothing was changed"),
                };
                (detail, errors.0)
            }
            other => (other.to_string(), Vec::new()),
        };
        let problem = Problem {
            kind: kind.to_string(),
            title: title.to_string(),
            status: status.as_u16(),
            detail,
            errors,
        };
        let body = serde_json::to_vec(&problem).unwrap_or_default();
        let mut response = (status, body).into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(seconds) = retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        if status == StatusCode::UNAUTHORIZED {
            headers.insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"sluice\""),
            );
        }
        response
    }
}
