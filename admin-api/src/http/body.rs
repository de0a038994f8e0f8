//! Reading requests: JSON bodies with field paths in their errors, query and path
//! parameters whose errors are problem documents, `If-Match`, and JSON merge patch.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use std::net::{IpAddr, SocketAddr};

use axum::extract::{ConnectInfo, FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use sluice_core::validation::{FieldError, ValidationErrors};
use utoipa::IntoParams;

use super::error::{ApiError, Input};
use crate::rules_file;
use crate::rules_file::strict_json::Strict;
use crate::store::IfMatch;

/// Largest request body accepted (413 beyond it). A full ruleset of 1,000 rules fits.
pub(crate) const MAX_BODY_BYTES: usize = 1024 * 1024;

/// A JSON request body. Shape errors (unknown keys, wrong types, missing fields) name
/// their path, e.g. `limits[0].brust`, like validation errors do.
#[derive(Debug)]
pub(crate) struct JsonBody<T>(pub(crate) T);

/// What a request body is, so that its 422 says so ("Invalid report", not "Invalid
/// rules").
pub(crate) trait BodyInput {
    const INPUT: Input;
}

impl BodyInput for sluice_core::spec::RuleSpec {
    const INPUT: Input = Input::Rule;
}

/// A JSON merge patch of a rule.
impl BodyInput for Value {
    const INPUT: Input = Input::Rule;
}

impl<S: Send + Sync, T: DeserializeOwned + BodyInput> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        require_json(request.headers())?;
        let bytes = read_body(request, state).await?;
        parse_json(&bytes).map(JsonBody)
    }
}

/// The raw body, with the size limit's rejection turned into a 413 problem.
pub(crate) async fn read_body<S: Send + Sync>(
    request: Request,
    state: &S,
) -> Result<Bytes, ApiError> {
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

/// The items of a list-valued header (`Cookie`'s split on `;`, `Accept-Encoding`'s on
/// `,`), over every line of it, untrimmed; values that are not text are skipped.
pub(crate) fn header_items(
    headers: &HeaderMap,
    name: header::HeaderName,
    separator: char,
) -> impl Iterator<Item = &str> {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(move |v| v.split(separator))
}

/// The media type of a request, lowercased, without parameters.
pub(crate) fn media_type(headers: &HeaderMap) -> Option<String> {
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
///
/// Numbers written with a fraction of zero (`5.0`) count as the integers they equal: JSON
/// Schema, and so the OpenAPI document, calls `5.0` an integer, and clients generated
/// from it (or JavaScript's `JSON.stringify` of a computed number) may send one.
pub(crate) fn parse_json<T: DeserializeOwned + BodyInput>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut value: Value = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::BadRequest(format!("the body is not valid JSON: {e}")))?;
    rules_file::integral_floats_to_integers(&mut value);
    from_value(value).map_err(|errors| ApiError::Invalid(T::INPUT, errors))
}

/// Deserialises an already parsed value (a merge-patched rule), naming the path of a
/// shape error.
pub(crate) fn from_value<T: DeserializeOwned>(value: Value) -> Result<T, ValidationErrors> {
    serde_path_to_error::deserialize(Strict(value))
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

/// Defines an extractor over one of axum's (`Query`, `Path`) whose rejection is a 400
/// problem document.
macro_rules! problem_extractor {
    ($(#[$doc:meta])* $name:ident, $axum:ident) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub(crate) struct $name<T>(pub(crate) T);

        impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for $name<T> {
            type Rejection = ApiError;

            async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
                $axum::<T>::from_request_parts(parts, state)
                    .await
                    .map(|$axum(v)| $name(v))
                    .map_err(|e| ApiError::BadRequest(e.body_text()))
            }
        }
    };
}

problem_extractor!(
    /// Query parameters whose errors are problem documents.
    Params,
    Query
);
problem_extractor!(
    /// Path parameters whose errors are problem documents.
    PathParam,
    Path
);

/// Entries in a page when a list asks for none (its `limit`), and the most it may ask for.
const DEFAULT_PAGE: u32 = 100;
const MAX_PAGE: u32 = 1000;

/// The page size a list's `limit` parameter asks for: [`DEFAULT_PAGE`] when absent, a 400
/// beyond 1 to [`MAX_PAGE`].
pub(crate) fn page_limit(limit: Option<u32>) -> Result<u32, ApiError> {
    let limit = limit.unwrap_or(DEFAULT_PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(ApiError::BadRequest(format!(
            "limit must be between 1 and {MAX_PAGE}"
        )));
    }
    Ok(limit)
}

/// The TCP peer, when the server provides it (tests driving the router directly do not).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Peer(pub(crate) Option<SocketAddr>);

impl Peer {
    pub(crate) fn of(parts: &Parts) -> Peer {
        Peer(
            parts
                .extensions
                .get::<ConnectInfo<SocketAddr>>()
                .map(|c| c.0),
        )
    }

    pub(crate) fn ip(self) -> Option<IpAddr> {
        self.0.map(|a| a.ip())
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Peer {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(Peer::of(parts))
    }
}

/// The `If-Match` header of the operations that change one rule, for the document
/// ([`if_match`] reads it).
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Header)]
#[allow(dead_code)]
pub(crate) struct IfMatchHeader {
    /// `*` (the rule must exist) or the rule's ETags the change is based on (`"12"`, also
    /// weak, `W/"12"`, comma-separated); 409 if none is the rule's current revision. A
    /// value that is no ETag matches nothing.
    #[param(rename = "If-Match", value_type = String, required = false)]
    pub(crate) if_match: Option<String>,
}

/// Parses `If-Match`: `*`, or a list of ETags (`"12"`, weak `W/"12"`). A tag that is not
/// one of ours, or no tag at all, can never match, which is what a stale tag means too:
/// the change is refused as stale (409) with the rule's current revision, which tells the
/// sender what to send.
pub(crate) fn if_match(headers: &HeaderMap) -> Option<IfMatch> {
    let value = headers.get(header::IF_MATCH)?;
    let Ok(list) = value.to_str() else {
        return Some(IfMatch::Revisions(Vec::new()));
    };
    let list = list.trim();
    if list == "*" {
        return Some(IfMatch::Any);
    }
    let revisions = list
        .split(',')
        .filter_map(|tag| {
            let tag = tag.trim();
            let opaque = tag.strip_prefix("W/").unwrap_or(tag);
            opaque.strip_prefix('"')?.strip_suffix('"')?.parse().ok()
        })
        .collect();
    Some(IfMatch::Revisions(revisions))
}

/// JSON merge patch (RFC 7396): objects merge key by key, `null` removes a key, anything
/// else replaces.
pub(crate) fn merge_patch(target: &mut Value, patch: &Value) {
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
        assert_eq!(if_match(&headers), None);
        headers.insert(header::IF_MATCH, "*".parse().unwrap());
        assert_eq!(if_match(&headers), Some(IfMatch::Any));
        headers.insert(header::IF_MATCH, r#""3", W/"5", "x""#.parse().unwrap());
        assert_eq!(if_match(&headers), Some(IfMatch::Revisions(vec![3, 5])));
        // Not an ETag: matches no revision, so the change is refused as stale.
        for odd in ["3", "null", "\"3", "W/3", ""] {
            headers.insert(header::IF_MATCH, odd.parse().unwrap());
            assert_eq!(
                if_match(&headers),
                Some(IfMatch::Revisions(Vec::new())),
                "{odd}"
            );
        }
    }

    #[test]
    fn shape_errors_name_the_path() {
        let err = parse_json::<sluice_core::spec::RuleSpec>(
            br#"{"name":"a","key":"global","limits":[{"requests":1,"period":"second","brust":2}]}"#,
        )
        .unwrap_err();
        let ApiError::Invalid(_, errors) = err else {
            panic!("{err:?}")
        };
        assert_eq!(errors.0[0].field, "limits[0].brust");
        let missing = |body: &[u8]| {
            let Err(ApiError::Invalid(_, errors)) = parse_json::<sluice_core::spec::RuleSpec>(body)
            else {
                panic!("accepted")
            };
            errors.0[0].field.clone()
        };
        assert_eq!(missing(br#"{"name":"a","limits":[]}"#), "key");
        assert_eq!(
            missing(br#"{"name":"a","key":"global","limits":[{"requests":"1"}]}"#),
            "limits[0].requests"
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
