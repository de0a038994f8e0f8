//! What every handler shares: the store, the ruleset version long-polls wait on, the
//! metrics pipeline, the coordinator of global buckets, the failed-authentication limit,
//! and the proxies polling now. [`AppState`] is built once per server (or test) and cloned
//! into every request.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use tokio::sync::{Semaphore, watch};

use super::failed_auth::{FailedAuths, FailureLimit};
use super::issued::Issued;
use super::metrics::{ConnectionMetrics, Metrics};
use super::proxy_ids::ProxyIds;
use super::report_guard::ReportSeq;
use super::streams::Streams;
use super::token_cache::TokenCache;
use crate::pipeline::{MetricsConfig, Pipeline};
use crate::store::{Store, StoreError, VersionNotices, rule_id};
use sluice_coordinator::guard::{Bounds, global_limits};
use sluice_coordinator::{Backend, Coordinator};
use sluice_core::rule::Rule;

/// A proxy counts as connected when it polled this recently (or is polling now).
pub(crate) const CONNECTED_WITHIN_MS: i64 = 60_000;

/// Rules bodies parsed at once at most (see `rules::parse_rules_body`): one per core of
/// a small machine, so hostile bodies cannot take every blocking thread.
pub(crate) const PARSE_SLOTS: usize = 2;
/// How long parsing a rules body may take, waiting for a turn included. A body within the
/// size limit and the nesting limit parses in milliseconds; the bound is for what the
/// nesting pre-scan cannot see. ([`AppState::set_parse_time_limit`] changes it, for tests.)
pub(crate) const PARSE_TIME_LIMIT: Duration = Duration::from_secs(2);

/// Everything the handlers share. Cheap to clone.
#[derive(Clone, Debug)]
pub struct AppState {
    pub(super) inner: Arc<Inner>,
}

/// The handlers' shared parts; the ones without an accessor on [`AppState`] are the HTTP
/// layer's alone (the long-poll's, `/metrics`').
#[derive(Debug)]
pub(super) struct Inner {
    store: Store,
    /// The newest committed ruleset version; long-polls wait on it.
    pub(super) version: watch::Sender<u64>,
    /// Set once on shutdown, so held long-polls answer at once.
    pub(super) shutdown: watch::Sender<bool>,
    pub(super) metrics: Metrics,
    /// Proxies with a long-poll in flight, by id (a proxy may hold several).
    pub(super) polling: Mutex<HashMap<String, usize>>,
    /// The serialised document of the newest version, shared by every proxy's poll.
    pub(super) document: Mutex<Option<(u64, Bytes)>>,
    /// Proxies' reports, aggregated in memory until flushed (see [`crate::pipeline`]).
    pipeline: Arc<Pipeline>,
    /// Fleet-wide buckets (see [`sluice_coordinator`]).
    coordinator: Coordinator,
    /// Failed authentications by client address (see [`super::failed_auth`]).
    failed_auths: FailedAuths,
    /// Proxy tokens remembered between requests (see [`super::token_cache`]).
    token_cache: TokenCache,
    /// Proxy ids and the tokens that own them (see [`super::proxy_ids`]).
    proxy_ids: ProxyIds,
    /// What proxies may name (see [`super::issued`]).
    issued: Mutex<Issued>,
    /// Each proxy id's last accepted report (see [`super::report_guard`]).
    report_seq: Mutex<ReportSeq>,
    /// Turns to parse a rules body off the executor ([`PARSE_SLOTS`]).
    parse_slots: Arc<Semaphore>,
    /// How long parsing a rules body may take ([`PARSE_TIME_LIMIT`]).
    parse_time_limit: Mutex<Duration>,
    /// The live metrics streams open now (see [`super::streams`]).
    streams: Arc<Streams>,
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
        let proxy_ids = ProxyIds::new(metrics.registry_mut());
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
                token_cache: TokenCache::default(),
                proxy_ids,
                issued: Mutex::new(Issued::default()),
                report_seq: Mutex::new(ReportSeq::default()),
                parse_slots: Arc::new(Semaphore::new(PARSE_SLOTS)),
                parse_time_limit: Mutex::new(PARSE_TIME_LIMIT),
                streams: Arc::default(),
            }),
        })
    }

    /// The metrics pipeline: reports in, time series out.
    pub fn pipeline(&self) -> &Arc<Pipeline> {
        &self.inner.pipeline
    }

    /// The coordinator of global buckets, whose store Envoy's rate limit service charges too.
    pub(crate) fn coordinator(&self) -> &Coordinator {
        &self.inner.coordinator
    }

    /// Sets how many reports each proxy id may send (`--report-rate`, `--report-burst`).
    pub fn set_report_rate(&self, rate: super::report_guard::ReportRate) {
        self.report_seq().set_rate(rate);
    }

    /// Sets how many global buckets the coordinator keeps in memory
    /// (`--quota-max-buckets`, `--quota-max-buckets-per-proxy`).
    pub fn set_quota_bounds(&self, bounds: Bounds) {
        self.inner.coordinator.set_bounds(bounds);
    }

    /// Brings what was issued ([`Issued`]) and the coordinator's known limits up to the
    /// current ruleset version: the rules of it and of the version before it (proxies
    /// switch within a second of a change, so a sync or a report in flight may still name
    /// the old rules). Read from the store once per version, so every replica agrees.
    pub(super) async fn refresh_issued(&self) -> Result<(), StoreError> {
        let current = *self.inner.version.borrow();
        if self.issued().version().is_some_and(|v| v >= current) {
            return Ok(());
        }
        let document = self.store().document().await?;
        let mut specs = document.rules;
        // A version before the current one that cannot be read (pruned, or a store
        // error) leaves only the current rules: stricter for a second, never looser.
        if let Some(before) = document.version.checked_sub(1) {
            match self.store().version(before).await {
                Ok(detail) => specs.extend(detail.rules),
                Err(err) => {
                    tracing::warn!(%err, before, "could not read the previous ruleset version")
                }
            }
        }
        let ids = specs.iter().map(|spec| rule_id(spec).to_string()).collect();
        // Each stored rule was validated when it was written; one that no longer compiles
        // (an older server's) issues no limit rather than costing every sync.
        let rules: Vec<Rule> = specs
            .into_iter()
            .filter_map(|spec| Rule::try_from(spec).ok())
            .collect();
        self.inner
            .coordinator
            .know_limits(document.version, global_limits(&rules));
        self.issued().advance(document.version, ids);
        Ok(())
    }

    /// What proxies may name: call [`AppState::refresh_issued`] first.
    pub(super) fn issued(&self) -> std::sync::MutexGuard<'_, Issued> {
        self.inner
            .issued
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Each proxy id's last accepted report.
    pub(super) fn report_seq(&self) -> std::sync::MutexGuard<'_, ReportSeq> {
        self.inner
            .report_seq
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Proxy ids and their tokens.
    pub(crate) fn proxy_ids(&self) -> &ProxyIds {
        &self.inner.proxy_ids
    }

    /// Proxy tokens remembered between requests.
    pub(crate) fn token_cache(&self) -> &TokenCache {
        &self.inner.token_cache
    }

    /// Failed authentications by client address.
    pub(crate) fn failed_auths(&self) -> &FailedAuths {
        &self.inner.failed_auths
    }

    /// Turns to parse a rules body off the executor.
    /// How long parsing a rules body may take, waiting for a turn included.
    pub(crate) fn parse_time_limit(&self) -> Duration {
        *self
            .inner
            .parse_time_limit
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Sets how long parsing a rules body may take (2 s by default): for tests, which
    /// need a bound that a body certainly overruns whatever the machine's speed.
    pub fn set_parse_time_limit(&self, limit: Duration) {
        *self
            .inner
            .parse_time_limit
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = limit;
    }

    pub(crate) fn parse_slots(&self) -> Arc<Semaphore> {
        self.inner.parse_slots.clone()
    }

    /// The accept loop's gauge of open connections and counter of refused ones.
    pub(crate) fn connection_metrics(&self) -> ConnectionMetrics {
        self.inner.metrics.connections.clone()
    }

    /// What Envoy's rate limit service counts.
    pub(crate) fn rls_metrics(&self) -> &super::RlsMetrics {
        &self.inner.metrics.rls
    }

    /// The newest committed ruleset version, followed.
    pub(crate) fn versions(&self) -> watch::Receiver<u64> {
        self.inner.version.subscribe()
    }

    /// The live metrics streams open now.
    pub(crate) fn streams(&self) -> &Arc<Streams> {
        &self.inner.streams
    }

    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    /// Ends held long-polls and tells the server to stop taking requests.
    pub fn shutdown(&self) {
        self.inner.shutdown.send_replace(true);
    }

    /// Resolves once [`AppState::shutdown`] has been called.
    pub(crate) async fn shutting_down(&self) {
        let mut rx = self.inner.shutdown.subscribe();
        // The sender lives in `self`, so this cannot fail while we wait.
        let _ = rx.wait_for(|down| *down).await;
    }

    /// Wakes the long-polls after a committed change (here, or through another replica
    /// sharing the database: see [`AppState::follow_versions`]).
    pub(super) fn committed(&self, version: u64) {
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
    pub(crate) async fn follow_versions(&self) {
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

    /// Whether a proxy last seen at `last_seen` (Unix ms) counts as connected at `now`:
    /// polling now, or seen within [`CONNECTED_WITHIN_MS`].
    pub(super) fn connected(&self, proxy: &str, last_seen: i64, now: i64) -> bool {
        self.polling_now(proxy) || now - last_seen <= CONNECTED_WITHIN_MS
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
