//! Reading requests: JSON bodies with field paths in their errors, query and path
//! parameters whose errors are problem documents, `If-Match`, and JSON merge patch.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use serde::de::DeserializeOwned;
use serde_json::Value;
use sluice_core::rule::{FieldError, ValidationErrors};

use super::{ApiError, MAX_BODY_BYTES};
use crate::rules_file;
use crate::store::IfMatch;

/// A JSON request body. Shape errors (unknown keys, wrong types, missing fields) name
/// their path, e.g. `limits[0].brust`, like validation errors do.
#[derive(Debug)]
pub struct JsonBody<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        require_json(request.headers())?;
        let bytes = read_body(request, state).await?;
        parse_json(&bytes).map(JsonBody)
    }
}

/// The raw body, with the size limit's rejection turned into a 413 problem.
pub async fn read_body<S: Send + Sync>(request: Request, state: &S) -> Result<Bytes, ApiError> {
    Bytes::from_request(request, state)
        .await
        .map_err(|rejection: BytesRejection| {
            if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::PayloadTooLarge {
                    limit: MAX_BODY_BYTES,
                }
            } else {
                ApiError::BadRequest(rejection.body_text())
            }
        })
}

/// The media type of a request, lowercased, without parameters.
pub fn media_type(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(header::CONTENT_TYPE)?.to_str().ok()?;
    let essence = value.split(';').next()?.trim().to_ascii_lowercase();
    Some(essence)
}

fn is_json(media_type: &str) -> bool {
    media_type == "application/json" || media_type.ends_with("+json")
}

pub(super) fn require_json(headers: &HeaderMap) -> Result<(), ApiError> {
    match media_type(headers) {
        Some(t) if is_json(&t) => Ok(()),
        Some(t) => Err(ApiError::UnsupportedMediaType(format!(
            "expected an application/json body, got {t}"
        ))),
        None => Err(ApiError::UnsupportedMediaType(
            "expected an application/json body (set Content-Type)".to_string(),
        )),
    }
}

/// Deserialises JSON, naming the path of a shape error.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        if e.inner().is_data() {
            shape_error(e.path().to_string(), e.inner().to_string())
        } else {
            ApiError::BadRequest(format!("the body is not valid JSON: {}", e.inner()))
        }
    })?;
    de.end()
        .map_err(|e| ApiError::BadRequest(format!("the body is not valid JSON: {e}")))?;
    Ok(value)
}

/// Deserialises an already parsed value (a merge-patched rule), naming the path of a
/// shape error.
pub fn from_value<T: DeserializeOwned>(value: Value) -> Result<T, ValidationErrors> {
    serde_path_to_error::deserialize(value)
        .map_err(|e| shape_errors(e.path().to_string(), e.inner().to_string()))
}

fn shape_errors(path: String, message: String) -> ValidationErrors {
    // serde reports a missing field at the object that lacks it; name the field itself,
    // as validation errors do (`limits[0].period`, not `limits[0]`).
    let missing = message
        .strip_prefix("missing field `")
        .and_then(|rest| rest.split_once('`'))
        .map(|(name, _)| name);
    let field = match (path.as_str(), missing) {
        (".", Some(name)) => name.to_string(),
        (".", None) => "(body)".to_string(),
        (_, Some(name)) => format!("{path}.{name}"),
        (_, None) => path,
    };
    ValidationErrors(vec![FieldError {
        field,
        message: rules_file::explain(message),
    }])
}

fn shape_error(path: String, message: String) -> ApiError {
    ApiError::Invalid(shape_errors(path, message))
}

/// Query parameters whose errors are problem documents.
#[derive(Debug)]
pub struct Params<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for Params<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(v)| Params(v))
            .map_err(|e| ApiError::BadRequest(e.body_text()))
    }
}

/// Path parameters whose errors are problem documents.
#[derive(Debug)]
pub struct PathParam<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for PathParam<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        Path::<T>::from_request_parts(parts, state)
            .await
            .map(|Path(v)| PathParam(v))
            .map_err(|e| ApiError::BadRequest(e.body_text()))
    }
}

/// The ETag of a rule at a revision: strong, quoted.
pub fn etag(revision: u64) -> String {
    format!("\"{revision}\"")
}

/// Parses `If-Match`: `*`, or a list of our ETags (`"12"`, also accepted weak, `W/"12"`).
/// A tag that is not one of ours can never match, which is what a stale tag means too.
pub fn if_match(headers: &HeaderMap) -> Result<Option<IfMatch>, ApiError> {
    let Some(value) = headers.get(header::IF_MATCH) else {
        return Ok(None);
    };
    let value = value
        .to_str()
        .map_err(|_| ApiError::BadRequest("If-Match is not valid ASCII".to_string()))?
        .trim();
    if value == "*" {
        return Ok(Some(IfMatch::Any));
    }
    let mut revisions = Vec::new();
    for tag in value.split(',') {
        let tag = tag.trim();
        let tag = tag.strip_prefix("W/").unwrap_or(tag);
        let inner = tag
            .strip_prefix('"')
            .and_then(|t| t.strip_suffix('"'))
            .ok_or_else(|| {
                ApiError::BadRequest(format!(
                    "If-Match must be `*` or quoted entity tags such as \"12\", not {tag}"
                ))
            })?;
        if let Ok(revision) = inner.parse() {
            revisions.push(revision);
        }
    }
    Ok(Some(IfMatch::Revisions(revisions)))
}

/// JSON merge patch (RFC 7396): objects merge key by key, `null` removes a key, anything
/// else replaces.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(serde_json::Map::new());
    }
    if let Value::Object(target) = target {
        for (key, value) in patch {
            if value.is_null() {
                target.remove(key);
            } else {
                merge_patch(target.entry(key.clone()).or_insert(Value::Null), value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_follows_rfc_7396() {
        // The example of RFC 7396, section 3.
        let mut target = json!({
            "title": "Goodbye!",
            "author": {"givenName": "John", "familyName": "Doe"},
            "tags": ["example", "sample"],
            "content": "This will be unchanged"
        });
        let patch = json!({
            "title": "Hello!",
            "phoneNumber": "+01-123-456-7890",
            "author": {"familyName": null},
            "tags": ["example"]
        });
        merge_patch(&mut target, &patch);
        assert_eq!(
            target,
            json!({
                "title": "Hello!",
                "author": {"givenName": "John"},
                "tags": ["example"],
                "content": "This will be unchanged",
                "phoneNumber": "+01-123-456-7890"
            })
        );
    }

    #[test]
    fn if_match_accepts_star_lists_and_weak_tags() {
        let mut headers = HeaderMap::new();
        assert_eq!(if_match(&headers).unwrap(), None);
        headers.insert(header::IF_MATCH, "*".parse().unwrap());
        assert_eq!(if_match(&headers).unwrap(), Some(IfMatch::Any));
        headers.insert(header::IF_MATCH, r#""3", W/"5", "x""#.parse().unwrap());
        assert_eq!(
            if_match(&headers).unwrap(),
            Some(IfMatch::Revisions(vec![3, 5]))
        );
        headers.insert(header::IF_MATCH, "3".parse().unwrap());
        assert!(if_match(&headers).is_err());
    }

    #[test]
    fn shape_errors_name_the_path() {
        let err = parse_json::<sluice_core::spec::RuleSpec>(
            br#"{"name":"a","key":"global","limits":[{"requests":1,"period":"second","brust":2}]}"#,
        )
        .unwrap_err();
        let ApiError::Invalid(errors) = err else {
            panic!("{err:?}")
        };
        assert_eq!(errors.0[0].field, "limits[0].brust");
        let missing = |body: &[u8]| {
            let Err(ApiError::Invalid(errors)) = parse_json::<sluice_core::spec::RuleSpec>(body)
            else {
                panic!("accepted")
            };
            errors.0[0].field.clone()
        };
        assert_eq!(missing(br#"{"name":"a","limits":[]}"#), "key");
        assert_eq!(
            missing(br#"{"name":"a","key":"global","limits":[{"requests":1}]}"#),
            "limits[0].period"
        );
        assert!(matches!(
            parse_json::<Value>(b"{\"a\":"),
            Err(ApiError::BadRequest(_))
        ));
        assert!(matches!(
            parse_json::<Value>(b"{} {}"),
            Err(ApiError::BadRequest(_))
        ));
    }
}
