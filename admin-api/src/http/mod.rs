//! The admin API's HTTP surface: `fn app(state) -> Router`, driven by tests with
//! `tower::ServiceExt::oneshot` and served by [`crate::server`].
//!
//! Every `/api/v1` handler is declared with `#[utoipa::path]` and registered through
//! `utoipa_axum::routes!`, so the route table and the OpenAPI document come from the same
//! attribute and cannot drift apart.

// utoipa's `params(...)` expansion qualifies the types it is given, which trips the
// workspace's `unused_qualifications` lint on our own spans in the handler modules.
#[allow(unused_qualifications)]
mod audit;
pub mod auth;
mod body;
pub mod error;
pub mod failed_auth;
mod metrics;
#[allow(unused_qualifications)]
mod metrics_api;
pub mod openapi;
#[allow(unused_qualifications)]
mod proxies;
#[allow(unused_qualifications)]
mod quota;
#[allow(unused_qualifications)]
mod reports;
#[allow(unused_qualifications)]
mod rules;
#[allow(unused_qualifications)]
mod ruleset;
#[allow(unused_qualifications)]
mod session;
#[allow(unused_qualifications)]
mod tokens;
#[allow(unused_qualifications)]
mod versions;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{HeaderValue, header};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::get;
use tokio::sync::watch;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::pipeline::{MetricsConfig, Pipeline};
use crate::store::{Store, StoreError, VersionNotices};
pub use error::ApiError;
use failed_auth::{FailedAuths, FailureLimit};
use metrics::Metrics;
use sluice_coordinator::{Backend, Coordinator};

/// Largest request body accepted (413 beyond it). A full ruleset of 1,000 rules fits.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;
/// A proxy counts as connected when it polled this recently (or is polling now).
pub const CONNECTED_WITHIN_MS: i64 = 60_000;

/// Everything the handlers share. Cheap to clone.
#[derive(Clone, Debug)]
pub struct AppState {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    store: Store,
    /// The newest committed ruleset version; long-polls wait on it.
    version: watch::Sender<u64>,
    /// Set once on shutdown, so held long-polls answer at once.
    shutdown: watch::Sender<bool>,
    metrics: Metrics,
    /// Proxies with a long-poll in flight, by id (a proxy may hold several).
    polling: Mutex<HashMap<String, usize>>,
    /// The serialised document of the newest version, shared by every proxy's poll.
    document: Mutex<Option<(u64, Bytes)>>,
    /// Proxies' reports, aggregated in memory until flushed (see [`crate::pipeline`]).
    pipeline: Arc<Pipeline>,
    /// Fleet-wide buckets (see [`sluice_coordinator`]).
    coordinator: Coordinator,
    /// Failed authentications by client address (see [`failed_auth`]).
    failed_auths: FailedAuths,
}

impl AppState {
    /// State over a migrated store; reads the current version from it.
    pub async fn new(store: Store) -> Result<AppState, StoreError> {
        AppState::with_metrics_config(store, MetricsConfig::default()).await
    }

    /// [`AppState::new`] with the metrics pipeline's flush interval and retention.
    pub async fn with_metrics_config(
        store: Store,
        config: MetricsConfig,
    ) -> Result<AppState, StoreError> {
        AppState::with_options(store, config, Backend::Memory, FailureLimit::default()).await
    }

    /// [`AppState::with_metrics_config`], with global buckets kept in `quota` and failed
    /// authentications limited to `auth_failures` per client address.
    pub async fn with_options(
        store: Store,
        config: MetricsConfig,
        quota: Backend,
        auth_failures: FailureLimit,
    ) -> Result<AppState, StoreError> {
        let version = store.current_version().await?;
        let mut metrics = Metrics::new();
        let pipeline = Arc::new(Pipeline::new(config, metrics.registry_mut()));
        let coordinator = Coordinator::new(quota, metrics.registry_mut());
        let failed_auths = FailedAuths::new(auth_failures, metrics.registry_mut());
        Ok(AppState {
            inner: Arc::new(Inner {
                store,
                version: watch::Sender::new(version),
                shutdown: watch::Sender::new(false),
                metrics,
                polling: Mutex::new(HashMap::new()),
                document: Mutex::new(None),
                pipeline,
                coordinator,
                failed_auths,
            }),
        })
    }

    /// The metrics pipeline: reports in, time series out.
    pub fn pipeline(&self) -> &Arc<Pipeline> {
        &self.inner.pipeline
    }

    /// The coordinator of global buckets.
    pub fn coordinator(&self) -> &Coordinator {
        &self.inner.coordinator
    }

    /// Failed authentications by client address.
    pub fn failed_auths(&self) -> &FailedAuths {
        &self.inner.failed_auths
    }

    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    /// Ends held long-polls and tells the server to stop taking requests.
    pub fn shutdown(&self) {
        self.inner.shutdown.send_replace(true);
    }

    /// Resolves once [`AppState::shutdown`] has been called.
    pub async fn shutting_down(&self) {
        let mut rx = self.inner.shutdown.subscribe();
        // The sender lives in `self`, so this cannot fail while we wait.
        let _ = rx.wait_for(|down| *down).await;
    }

    /// Wakes the long-polls after a committed change (here, or through another replica
    /// sharing the database: see [`AppState::follow_versions`]).
    fn committed(&self, version: u64) {
        self.inner.version.send_if_modified(|current| {
            if version > *current {
                *current = version;
                true
            } else {
                false
            }
        });
    }

    /// Follows the database's ruleset version until shutdown, so that a change committed
    /// through another replica sharing the database wakes this replica's long-polls: at
    /// once on PostgreSQL (its notices, see [`crate::store::VersionNotices`]), and within
    /// [`VERSION_FOLLOW_INTERVAL`] in any case (one indexed single-row read per interval,
    /// which also covers a notice lost while the listening connection was down).
    pub async fn follow_versions(&self) {
        let notices = match self.store().version_notices().await {
            Ok(notices) => notices,
            Err(err) => {
                tracing::warn!(%err, "cannot listen for other replicas' changes; polling only");
                None
            }
        };
        self.follow(notices, VERSION_FOLLOW_INTERVAL).await;
    }

    /// [`AppState::follow_versions`] with a listener already listening (or none), and
    /// the version re-read every `interval`.
    pub async fn follow(&self, mut notices: Option<VersionNotices>, interval: Duration) {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let stopping = self.shutting_down();
        tokio::pin!(stopping);
        loop {
            let notice = async {
                match notices.as_mut() {
                    Some(notices) => notices.next().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = tick.tick() => {}
                noticed = notice => match noticed {
                    Ok(version) => {
                        self.committed(version);
                        continue;
                    }
                    // The listener reconnects on its next call, tried once per tick.
                    Err(err) => {
                        tracing::debug!(%err, "lost the version notices' connection");
                        tick.tick().await;
                    }
                },
                () = &mut stopping => return,
            }
            match self.store().current_version().await {
                Ok(version) => self.committed(version),
                Err(err) => tracing::debug!(%err, "could not read the ruleset version"),
            }
        }
    }

    fn polling_now(&self, proxy: &str) -> bool {
        self.inner
            .polling
            .lock()
            .map(|p| p.get(proxy).is_some_and(|n| *n > 0))
            .unwrap_or(false)
    }
}

/// How often a server re-reads the database's ruleset version (see
/// [`AppState::follow_versions`]).
pub const VERSION_FOLLOW_INTERVAL: Duration = Duration::from_secs(1);

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

/// The OpenAPI document of the API, as served at `/api/v1/openapi.json`.
pub fn openapi() -> utoipa::openapi::OpenApi {
    let mut doc = api_routes().into_openapi();
    openapi::complete(&mut doc);
    doc
}

/// The API alone, as tests drive it: a path it does not route is a JSON 404.
pub fn app(state: AppState) -> Router {
    app_beside(
        state,
        Router::new().fallback(|| async { no_such_endpoint() }),
    )
}

/// The API, with `site` answering every path the API does not route (`sluice serve`
/// mounts the dashboard there: `crate::server::app`). Whichever answers, the request is
/// counted, timed and logged, and its body bounded.
pub fn app_beside(state: AppState, site: Router) -> Router {
    let (api, mut doc) = api_routes().split_for_parts();
    openapi::complete(&mut doc);
    let doc = Bytes::from(doc.to_pretty_json().unwrap_or_else(|_| "{}".to_string()));
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
        .route("/metrics", get(metrics::render))
        .fallback_service(site)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(middleware::from_fn_with_state(state.clone(), observe))
        .with_state(state)
}

/// The answer to a path no route takes, in the API's problem format.
pub fn no_such_endpoint() -> ApiError {
    ApiError::NotFound("no such endpoint".to_string())
}

/// Alive: the process answers.
async fn healthz() -> &'static str {
    "ok\n"
}

/// Ready: the database answers.
async fn readyz(State(state): State<AppState>) -> Result<&'static str, ApiError> {
    state
        .store()
        .ping()
        .await
        .map_err(|e| ApiError::Unavailable(format!("database unreachable: {e}")))?;
    Ok("ready\n")
}

/// Counts, times and logs every request by its route pattern (and marks every answer
/// `X-Content-Type-Options: nosniff`) (not its path, which would
/// give every rule id its own metric series).
async fn observe(
    State(state): State<AppState>,
    matched: Option<MatchedPath>,
    request: Request,
    next: Next,
) -> Response {
    let start = Instant::now();
    let method = request.method().clone();
    let route = matched.map_or_else(|| "(unmatched)".to_string(), |m| m.as_str().to_string());
    let mut response = next.run(request).await;
    // Every answer is what its Content-Type says, never sniffed into something else.
    response
        .headers_mut()
        .entry(header::X_CONTENT_TYPE_OPTIONS)
        .or_insert(HeaderValue::from_static("nosniff"));
    let status = response.status();
    let elapsed = start.elapsed();
    state
        .inner
        .metrics
        .observe_request(method.as_str(), &route, status.as_u16(), elapsed);
    let ms = elapsed.as_secs_f64() * 1e3;
    if status.is_server_error() {
        tracing::warn!(%method, %route, status = status.as_u16(), ms, "request failed");
    } else if method == axum::http::Method::GET
        || method == axum::http::Method::HEAD
        // Every proxy reports every ~2 s and syncs every ~250 ms: accepted ones would
        // drown the log.
        || ((route == "/api/v1/reports" || route == "/api/v1/quota/sync") && status.is_success())
    {
        tracing::debug!(%method, %route, status = status.as_u16(), ms, "request");
    } else {
        tracing::info!(%method, %route, status = status.as_u16(), ms, "request");
    }
    response
}
