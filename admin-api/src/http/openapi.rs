//! The OpenAPI document's fixed parts: metadata, the bearer scheme and the shared error
//! responses. The schemas are the wire types' own (`sluice-api` with its `openapi`
//! feature, where the hand-written ones, such as a rule's, live too).

use std::collections::BTreeMap;

use sluice_api::{FieldError, Problem};
use utoipa::openapi::response::{Response, ResponseBuilder};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{ContentBuilder, Ref, RefOr};
use utoipa::{Modify, OpenApi};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Sluice admin API",
        description = "Rules for Sluice, token-bucket rate limiting for Envoy: stored, validated, versioned, audited, and long-polled by every proxy.\n\nEvery `/api/v1` endpoint but this document needs `Authorization: Bearer TOKEN`. Errors are `application/problem+json` (RFC 9457); validation errors list every problem with its field path.",
        license(name = "Apache-2.0"),
    ),
    components(schemas(Problem, FieldError)),
    modifiers(&BearerAuth),
    tags(
        (name = "rules", description = "Rules: CRUD, enable/disable, bulk apply, export"),
        (name = "versions", description = "Ruleset history, diffs, rollback"),
        (name = "ruleset", description = "The proxies' long-poll"),
        (name = "proxies", description = "Connected Envoys"),
        (name = "metrics", description = "Proxies' reports in; throttle metrics out: series, rules, clients, overview, live stream"),
        (name = "quota", description = "Fleet-wide buckets: each proxy's sync of its leases, once per interval"),
        (name = "audit", description = "Who changed what"),
        (name = "tokens", description = "API tokens (admin)"),
    ),
)]
struct ApiDoc;

/// Declares bearer authentication and requires it everywhere.
struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "A token (`slc_...`) from `sluice token create` or POST /api/v1/tokens",
                    ))
                    .build(),
            ),
        );
        openapi.security = Some(vec![SecurityRequirement::new(
            "bearer",
            Vec::<String>::new(),
        )]);
    }
}

/// The document before the routes add their paths.
pub fn base() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}

fn problem(description: &str) -> RefOr<Response> {
    ResponseBuilder::new()
        .description(description)
        .content(
            "application/problem+json",
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("Problem")))
                .build(),
        )
        .build()
        .into()
}

/// 401 and 403, which every `/api/v1` endpoint can answer.
#[derive(Debug)]
pub struct AuthErrors;

impl utoipa::IntoResponses for AuthErrors {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        BTreeMap::from([
            (
                "401".to_string(),
                problem("Missing, unknown or revoked token (with `WWW-Authenticate: Bearer`)"),
            ),
            (
                "403".to_string(),
                problem("The token's role may not do this"),
            ),
        ])
    }
}

/// What a request with a body can be refused for; nothing is written in any of these.
#[derive(Debug)]
pub struct WriteErrors;

impl utoipa::IntoResponses for WriteErrors {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        BTreeMap::from([
            (
                "400".to_string(),
                problem("The body is not valid JSON/YAML, or a parameter is malformed"),
            ),
            ("413".to_string(), problem("The body is larger than 1 MiB")),
            ("415".to_string(), problem("Unsupported Content-Type")),
            (
                "422".to_string(),
                problem(
                    "Unknown keys, wrong types, or an invalid rule or ruleset: `errors` lists every problem with its field path",
                ),
            ),
        ])
    }
}

/// Adds the answers that the shared extractors give, to every operation they guard, so
/// that no status a client can get goes undocumented:
/// - 400 wherever a parameter or a body is read (a malformed or unknown query parameter,
///   a path segment of the wrong type, a malformed header);
/// - 429 and 503 wherever a token is checked ([`super::auth`]: too many failed
///   authentications from the address; the database holding tokens unreachable).
pub fn complete(doc: &mut utoipa::openapi::OpenApi) {
    for item in doc.paths.paths.values_mut() {
        let operations = [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.patch,
        ];
        for operation in operations.into_iter().flatten() {
            let reads_input = operation.parameters.as_ref().is_some_and(|p| !p.is_empty())
                || operation.request_body.is_some();
            let authenticated = operation.responses.responses.contains_key("401");
            let answers = &mut operation.responses.responses;
            if reads_input {
                answers.entry("400".to_string()).or_insert_with(|| {
                    problem("A parameter or header is malformed, or a query parameter is unknown")
                });
            }
            if authenticated {
                answers.entry("429".to_string()).or_insert_with(|| {
                    problem(
                        "Too many failed authentications from this address: wait `Retry-After` seconds",
                    )
                });
                answers
                    .entry("503".to_string())
                    .or_insert_with(|| problem("The database is unreachable; nothing was changed"));
            }
        }
    }
}
