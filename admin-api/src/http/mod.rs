//! The admin API's HTTP surface: `fn app(state) -> Router`, driven by tests with
//! `tower::ServiceExt::oneshot` and served by [`crate::server`].
//!
//! Every `/api/v1` handler is declared with `#[utoipa::path]` and registered through
//! `utoipa_axum::routes!`, so the route table and the OpenAPI document come from the same
//! attribute and cannot drift apart.
//!
//! This file is the router and its re-exports only: the handlers' shared state is
//! [`state`], request bodies and their limit [`body`], the endpoints outside `/api/v1`
//! [`operations`]. Its children never use it, so the files depend on each other one way.

// utoipa's `params(...)` expansion qualifies the types it is given, which trips the
// workspace's `unused_qualifications` lint on our own spans in the handler modules.
#[allow(unused_qualifications)]
mod audit;
pub(crate) mod auth;
mod body;
pub(crate) mod error;
mod estimate;
pub mod failed_auth;
mod issued;
mod metrics;
#[allow(unused_qualifications)]
mod metrics_api;
pub(crate) mod openapi;
mod operations;
#[allow(unused_qualifications)]
mod proxies;
mod proxy_ids;
#[allow(unused_qualifications)]
mod quota;
pub mod report_guard;
#[allow(unused_qualifications)]
mod reports;
#[allow(unused_qualifications)]
mod rules;
#[allow(unused_qualifications)]
mod ruleset;
#[allow(unused_qualifications)]
mod session;
mod state;
pub mod streams;
#[allow(unused_qualifications)]
pub mod token_cache;
mod tokens;
#[allow(unused_qualifications)]
mod versions;

use axum::Router;
use axum::body::Bytes;
use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderValue, header};
use axum::middleware;
use axum::routing::get;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub(crate) use body::{MAX_BODY_BYTES, Peer, header_items};
pub(crate) use error::ApiError;
pub(crate) use metrics::ConnectionMetrics;
pub(crate) use metrics::{CodeLabel, OutcomeLabel, ReasonLabel, RlsMetrics};
use operations::{healthz, observe, readyz};
pub(crate) use reports::ReportBody;
pub use state::{AppState, VERSION_FOLLOW_INTERVAL};

/// The `/api/v1` routes, with their OpenAPI description.
fn api_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(openapi::base())
        .routes(routes!(rules::list_rules, rules::create_rule))
        .routes(routes!(
            rules::get_rule,
            rules::replace_rule,
            rules::patch_rule,
            rules::delete_rule
        ))
        .routes(routes!(rules::enable_rule))
        .routes(routes!(rules::disable_rule))
        .routes(routes!(rules::apply_rules))
        .routes(routes!(estimate::estimate_rule))
        .routes(routes!(rules::export_rules))
        .routes(routes!(versions::list_versions))
        .routes(routes!(versions::get_version))
        .routes(routes!(versions::rollback))
        .routes(routes!(versions::diff_versions))
        .routes(routes!(ruleset::get_ruleset))
        .routes(routes!(proxies::list_proxies))
        .routes(routes!(reports::post_report))
        .routes(routes!(quota::sync_quota))
        .routes(routes!(metrics_api::metrics_series))
        .routes(routes!(metrics_api::metrics_rules))
        .routes(routes!(metrics_api::metrics_clients))
        .routes(routes!(metrics_api::metrics_client))
        .routes(routes!(metrics_api::metrics_overview))
        .routes(routes!(metrics_api::metrics_stream))
        .routes(routes!(audit::list_audit))
        .routes(routes!(tokens::list_tokens, tokens::create_token))
        .routes(routes!(tokens::revoke_token))
        .routes(routes!(
            session::create_session,
            session::get_session,
            session::delete_session
        ))
}

/// The API alone, as tests drive it: a path it does not route is a JSON 404.
pub fn app(state: AppState) -> Router {
    app_beside(
        state,
        Router::new().fallback(|| async { no_such_endpoint() }),
        true,
    )
}

/// `/metrics` alone, for its own listener (`sluice serve --metrics-listen`).
pub(crate) fn metrics_only(state: AppState) -> Router {
    Router::new()
        .route("/metrics", get(operations::render))
        .fallback(|| async { no_such_endpoint() })
        .with_state(state)
}

/// The API, with `site` answering every path the API does not route (`sluice serve`
/// mounts the dashboard there: `crate::server::app`). Whichever answers, the request is
/// counted, timed and logged, and its body bounded. `/metrics` is served only
/// `with_metrics` (not when it has a listener of its own).
pub(crate) fn app_beside(state: AppState, site: Router, with_metrics: bool) -> Router {
    let (api, mut doc) = api_routes().split_for_parts();
    openapi::complete(&mut doc);
    let doc = Bytes::from(doc.to_pretty_json().unwrap_or_else(|_| "{}".to_string()));
    // With a listener of its own, `/metrics` here is a plain 404, not the dashboard's page.
    let api = if with_metrics {
        api.route("/metrics", get(operations::render))
    } else {
        api.route("/metrics", get(|| async { no_such_endpoint() }))
    };
    Router::new()
        .merge(api)
        .route(
            "/api/v1/openapi.json",
            get(move || async move {
                (
                    [(
                        header::CONTENT_TYPE,
                        HeaderValue::from_static("application/json"),
                    )],
                    doc.clone(),
                )
            }),
        )
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .fallback_service(site)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(middleware::from_fn_with_state(state.clone(), observe))
        .with_state(state)
}

/// The answer to a path no route takes, in the API's problem format.
pub(crate) fn no_such_endpoint() -> ApiError {
    ApiError::NotFound("no such endpoint".to_string())
}
