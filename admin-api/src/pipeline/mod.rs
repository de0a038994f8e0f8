//! The throttle-metrics pipeline: reports in, time series out.
//!
//! Every proxy POSTs a report every ~2 s. Writing each one through to the database would
//! cost a transaction per report; instead [`Pipeline::ingest`] adds it in memory to the
//! buckets it belongs to (10 s, 1 min and 1 h, by its `end_ms`), and a flusher writes
//! everything accumulated every ~2 s in one batched transaction
//! ([`crate::store::Store::write_metrics`]). A report costs a few hash-map updates; the
//! database sees one transaction per flush interval however many proxies report.
//!
//! Reads stay live: the query endpoints add what is still in memory to what is stored.
//! That needs care at the moment a flush commits, when the same data is in memory and in
//! the database; a sequence number (odd while a commit is under way, as in a seqlock)
//! tells a reader that the database changed under it, and it reads again.
//!
//! On a clean stop the server flushes after the last request is answered, so nothing
//! accepted is lost. A crash loses at most what arrived since the last flush (~2 s).

pub(crate) mod pending;
pub(crate) mod queries;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::sync::watch;

use crate::store::{Counts, METRIC_TABLES, ProxyBeat, Resolution, Store, StoreError, now_ms};
pub(crate) use pending::{Bucket, Pending, RequestTally, Tally};

/// How the pipeline flushes and how long it keeps data.
#[derive(Debug, Clone)]
pub struct MetricsConfig {
    /// How often accumulated reports are written.
    pub flush_interval: Duration,
    /// How long buckets of each resolution are kept.
    pub retention_10s: Duration,
    pub retention_1m: Duration,
    pub retention_1h: Duration,
    /// How often old buckets are deleted.
    pub retention_interval: Duration,
    /// Count and client entries held in memory before reports are refused (503; proxies
    /// keep them and send them again), should the database stop taking writes.
    pub max_pending_entries: usize,
    /// Rows each metrics table may hold (`sluice serve --metrics-max-rows`): checked with
    /// retention, and a table over it loses its oldest buckets, counted (with retention's
    /// deletions) and logged.
    pub max_rows_per_table: u64,
}

/// Rows each metrics table may hold by default: about 1 to 2 GB a table, a year of
/// hourly buckets for 1,000 rules, or a day of 10 s buckets for 100 rules on 10 proxies.
pub const DEFAULT_MAX_ROWS_PER_TABLE: u64 = 10_000_000;

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            flush_interval: Duration::from_secs(2),
            retention_10s: Duration::from_secs(24 * 3600),
            retention_1m: Duration::from_secs(14 * 86_400),
            retention_1h: Duration::from_secs(400 * 86_400),
            retention_interval: Duration::from_secs(60),
            max_pending_entries: 2_000_000,
            max_rows_per_table: DEFAULT_MAX_ROWS_PER_TABLE,
        }
    }
}

impl MetricsConfig {
    pub(crate) fn retention(&self, resolution: Resolution) -> Duration {
        match resolution {
            Resolution::TenSeconds => self.retention_10s,
            Resolution::Minute => self.retention_1m,
            Resolution::Hour => self.retention_1h,
        }
    }

    /// Buckets of `resolution` starting before this are past retention at `now_ms`: their
    /// whole span is older than the retention.
    pub(crate) fn cutoff(&self, resolution: Resolution, now_ms: i64) -> i64 {
        let retention = i64::try_from(self.retention(resolution).as_millis()).unwrap_or(i64::MAX);
        now_ms
            .saturating_sub(retention)
            .saturating_sub(resolution.ms())
            .saturating_add(1)
    }
}

/// A report that passed validation (`api::reports`), ready to be aggregated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ValidReport {
    pub(crate) proxy_id: String,
    /// When the interval began, as the proxy's clock read it (see `report_guard`).
    pub(crate) start_ms: i64,
    /// The report belongs to the buckets holding this instant.
    pub(crate) end_ms: i64,
    pub(crate) ruleset_version: u64,
    /// Rule ids are unique.
    pub(crate) rules: Vec<ValidRule>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ValidRule {
    /// The rule's first position in the report, for error paths.
    pub(crate) index: usize,
    pub(crate) rule: String,
    pub(crate) counts: Counts,
    /// Clients are unique within a rule.
    pub(crate) clients: Vec<(String, Tally)>,
    /// The clients sending the rule the most requests; unique within a rule.
    pub(crate) requesters: Vec<(String, RequestTally)>,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum IngestError {
    #[error(
        "{entries} metric entries are waiting to be written (the database is not keeping up); send the report again later"
    )]
    Overloaded { entries: usize },
}

/// Cumulative totals since start, for the live stream: a subscriber sends the difference
/// between two readings.
#[derive(Debug, Clone, Default)]
pub(crate) struct Live {
    pub(crate) total: Counts,
    pub(crate) rules: HashMap<String, Counts>,
}

/// Rule ids tracked for the live stream; beyond, reports count in the totals only.
const MAX_LIVE_RULES: usize = 10_000;
/// How long a reader waits for a commit in progress before reading anyway.
const COMMIT_WAIT: Duration = Duration::from_secs(5);
/// Reads attempted before a reader settles for a possibly inconsistent view.
const READ_ATTEMPTS: usize = 4;

#[derive(Debug, Default)]
struct State {
    pending: Pending,
    /// The batch being written, still visible to readers until it is committed.
    in_flight: Option<Arc<Pending>>,
    live: Live,
}

/// What one flush did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlushStats {
    pub(crate) rows: usize,
    pub(crate) duration: Duration,
}

#[derive(Debug)]
pub struct Pipeline {
    config: MetricsConfig,
    state: Mutex<State>,
    /// Even when no commit is under way; bumped (under `state`'s lock) before and after
    /// each commit.
    seq: watch::Sender<u64>,
    /// One flush at a time: the periodic one, the final one, and tests'.
    flush_lock: tokio::sync::Mutex<()>,
    instruments: Instruments,
}

impl Pipeline {
    /// A pipeline whose metrics are registered in `registry`.
    pub(crate) fn new(config: MetricsConfig, registry: &mut Registry) -> Pipeline {
        Pipeline {
            config,
            state: Mutex::new(State::default()),
            seq: watch::Sender::new(0),
            flush_lock: tokio::sync::Mutex::new(()),
            instruments: Instruments::register(registry),
        }
    }

    pub(crate) fn instruments(&self) -> &Instruments {
        &self.instruments
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is plain data updated in small steps; a panic elsewhere while holding
        // the lock cannot leave it half-updated in a way worth refusing to read.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds a validated report to the buckets holding its `end_ms` (skipping resolutions
    /// whose bucket is already past retention).
    pub(crate) fn ingest(
        &self,
        report: &ValidReport,
        token_id: Option<String>,
        address: String,
        now_ms: i64,
    ) -> Result<(), IngestError> {
        let mut state = self.lock();
        let entries = state.pending.entries;
        if entries >= self.config.max_pending_entries {
            return Err(IngestError::Overloaded { entries });
        }
        let State { pending, live, .. } = &mut *state;
        for resolution in Resolution::ALL {
            let bucket = resolution.bucket(report.end_ms);
            if bucket < self.config.cutoff(resolution, now_ms) {
                continue;
            }
            for rule in &report.rules {
                pending.add_counts(
                    resolution,
                    bucket,
                    &report.proxy_id,
                    &rule.rule,
                    &rule.counts,
                );
                for (client, tally) in &rule.clients {
                    pending.add_client(resolution, bucket, &rule.rule, client, *tally);
                }
                // Dry runs read the last hour in 10 s buckets: coarser copies would only
                // take room.
                if resolution == Resolution::TenSeconds {
                    for (client, tally) in &rule.requesters {
                        pending.add_requester(bucket, &rule.rule, client, *tally);
                    }
                }
            }
        }
        for rule in &report.rules {
            live.total.add(&rule.counts);
            if let Some(c) = live.rules.get_mut(&rule.rule) {
                c.add(&rule.counts);
            } else if live.rules.len() < MAX_LIVE_RULES {
                live.rules.insert(rule.rule.clone(), rule.counts);
            }
        }
        pending.beat(ProxyBeat {
            id: report.proxy_id.clone(),
            at_ms: now_ms,
            address,
            token_id,
            ruleset_version: report.ruleset_version,
        });
        self.instruments
            .pending_entries
            .set(to_gauge(pending.entries));
        Ok(())
    }

    /// Count and client entries waiting for the next flush.
    pub fn pending_entries(&self) -> usize {
        self.lock().pending.entries
    }

    /// The cumulative totals since start.
    pub(crate) fn live(&self) -> Live {
        self.lock().live.clone()
    }

    /// Runs a database read and folds in what is still in memory, consistently: `visit`
    /// sees every not-yet-committed pending set (folded into `M`), and `db` runs against
    /// a database that holds none of them.
    ///
    /// `db` is given what `visit` gathered, for queries that depend on it; its future
    /// must not borrow it.
    pub(crate) async fn read<M, D, F, Fut>(
        &self,
        visit: impl Fn(&mut M, &Pending),
        db: F,
    ) -> Result<(M, D), StoreError>
    where
        M: Default,
        F: Fn(&M) -> Fut,
        Fut: Future<Output = Result<D, StoreError>>,
    {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut seq = self.seq.subscribe();
            // A commit under way: wait for it rather than read twice.
            let _ = tokio::time::timeout(COMMIT_WAIT, seq.wait_for(|s| s % 2 == 0)).await;
            let (before, memory) = {
                let state = self.lock();
                let before = *self.seq.borrow();
                let mut memory = M::default();
                visit(&mut memory, &state.pending);
                if let Some(in_flight) = &state.in_flight {
                    visit(&mut memory, in_flight);
                }
                (before, memory)
            };
            let stored = db(&memory).await?;
            let after = *self.seq.borrow();
            if (before == after && before % 2 == 0) || attempt >= READ_ATTEMPTS {
                if before != after {
                    tracing::debug!("metrics read overlapped {attempt} commits");
                }
                return Ok((memory, stored));
            }
        }
    }

    /// Writes everything accumulated so far in one transaction. On failure the data goes
    /// back to memory for the next attempt.
    pub async fn flush(&self, store: &Store) -> Result<FlushStats, StoreError> {
        let _one_at_a_time = self.flush_lock.lock().await;
        let taken = {
            let mut state = self.lock();
            if state.pending.is_empty() {
                return Ok(FlushStats::default());
            }
            let taken = Arc::new(std::mem::take(&mut state.pending));
            state.in_flight = Some(taken.clone());
            self.instruments.pending_entries.set(0);
            taken
        };
        let started = Instant::now();
        let batch = taken.to_batch();
        let result = store
            .write_metrics(&batch, || {
                let _state = self.lock();
                self.seq.send_modify(|s| *s += 1);
            })
            .await;
        let duration = started.elapsed();
        {
            let mut state = self.lock();
            state.in_flight = None;
            if result.is_err() {
                state.pending.merge(&taken);
                self.instruments
                    .pending_entries
                    .set(to_gauge(state.pending.entries));
            }
            if *self.seq.borrow() % 2 == 1 {
                self.seq.send_modify(|s| *s += 1);
            }
        }
        self.instruments
            .flush_duration
            .observe(duration.as_secs_f64());
        match result {
            Ok(()) => {
                for (table, rows) in [
                    ("metric_rule_buckets", batch.rules.len()),
                    ("metric_proxy_buckets", batch.proxies.len()),
                    ("metric_clients", batch.clients.len()),
                    ("metric_requesters", batch.requesters.len()),
                    ("proxies", batch.beats.len()),
                ] {
                    self.instruments
                        .rows_written
                        .get_or_create(&TableLabels {
                            table: table.to_string(),
                        })
                        .inc_by(rows as u64);
                }
                Ok(FlushStats {
                    rows: batch.rows(),
                    duration,
                })
            }
            Err(err) => {
                self.instruments.flush_failures.inc();
                Err(err)
            }
        }
    }

    /// Deletes buckets past retention at `now_ms` (a bounded amount per call; a backlog
    /// goes over several runs). Returns the rows deleted.
    pub async fn run_retention(&self, store: &Store, now_ms: i64) -> Result<u64, StoreError> {
        let mut deleted = 0;
        for resolution in Resolution::ALL {
            deleted += store
                .delete_metrics_before(resolution, self.config.cutoff(resolution, now_ms), 50)
                .await?;
        }
        self.instruments.rows_deleted.inc_by(deleted);
        Ok(deleted)
    }

    /// Deletes the oldest buckets of each metrics table over
    /// [`MetricsConfig::max_rows_per_table`]; counts the rows in
    /// `sluice_admin_metrics_rows_deleted_total` (with retention's) and logs a warning per
    /// table naming the rows and the newest bucket deleted, so nothing goes unnoticed.
    /// Returns the rows deleted per table.
    pub async fn enforce_row_cap(&self, store: &Store) -> Result<[u64; 4], StoreError> {
        let max = self.config.max_rows_per_table;
        let pruned = store.prune_metrics_over(max).await?;
        let mut rows = [0; 4];
        for ((table, (deleted, upto)), slot) in METRIC_TABLES.into_iter().zip(pruned).zip(&mut rows)
        {
            *slot = deleted;
            if deleted == 0 {
                continue;
            }
            self.instruments.rows_deleted.inc_by(deleted);
            tracing::warn!(
                table,
                rows = deleted,
                max_rows = max,
                through_bucket_ms = upto,
                "a metrics table was over --metrics-max-rows: deleted its oldest buckets"
            );
        }
        Ok(rows)
    }

    /// The background task: flushes every `flush_interval` and applies retention every
    /// `retention_interval` (first at start), until `stop` resolves. It does not flush on
    /// the way out: the server does, after the last request is answered.
    pub(crate) async fn run(&self, store: &Store, stop: impl Future<Output = ()>) {
        let mut flush = tokio::time::interval_at(
            tokio::time::Instant::now() + self.config.flush_interval,
            self.config.flush_interval,
        );
        flush.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut retention = tokio::time::interval(self.config.retention_interval);
        retention.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(stop);
        loop {
            tokio::select! {
                () = &mut stop => break,
                _ = flush.tick() => match self.flush(store).await {
                    Ok(stats) if stats.rows > 0 => tracing::debug!(
                        rows = stats.rows,
                        ms = stats.duration.as_secs_f64() * 1e3,
                        "metrics flushed"
                    ),
                    Ok(_) => {}
                    Err(err) => tracing::warn!(%err, "writing metrics failed; retrying at the next flush"),
                },
                _ = retention.tick() => {
                    match self.run_retention(store, now_ms()).await {
                        Ok(0) => {}
                        Ok(rows) => tracing::info!(rows, "deleted metrics past retention"),
                        Err(err) => tracing::warn!(%err, "deleting old metrics failed"),
                    }
                    if let Err(err) = self.enforce_row_cap(store).await {
                        tracing::warn!(%err, "keeping metrics tables under --metrics-max-rows failed");
                    }
                }
            }
        }
    }

    /// The last flush, on a clean stop: a few attempts, so a brief database hiccup does
    /// not lose the last interval.
    pub(crate) async fn final_flush(&self, store: &Store) -> Result<FlushStats, StoreError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.flush(store).await {
                Ok(stats) => return Ok(stats),
                Err(err) if attempt >= 3 => return Err(err),
                Err(err) => {
                    tracing::warn!(%err, "the final metrics flush failed; trying again");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
    }
}

fn to_gauge(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Why a report was refused: the `reason` label of
/// `sluice_admin_reports_rejected_total`.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
pub(crate) enum RejectReason {
    /// No token, or an unknown or revoked one.
    Unauthenticated,
    /// A token whose role may not send reports.
    Forbidden,
    /// A body over the size limit.
    TooLarge,
    /// A body that is not JSON.
    MediaType,
    /// A body that does not parse, or a report that is not valid.
    Invalid,
    /// Too many entries waiting for the database.
    Overloaded,
    /// Too many failed authentications from the sender's address.
    Throttled,
    /// A ruleset version newer than any the server issued.
    UnknownVersion,
    /// A rule of neither the current nor the previous ruleset version.
    UnknownRule,
    /// A proxy id in use with another token, or one too many for the token.
    ProxyId,
    /// A report ending too soon after its proxy id's last one (the same report resent).
    Replay,
    /// A count above what the report's window makes possible.
    OverCeiling,
    /// More reports of one proxy id than `--report-rate` and `--report-burst` allow.
    RateLimited,
    /// Anything else (the server's fault).
    Error,
}

impl RejectReason {
    /// The label value, as dashboards and alerts select it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            RejectReason::Unauthenticated => "unauthenticated",
            RejectReason::Forbidden => "forbidden",
            RejectReason::TooLarge => "too_large",
            RejectReason::MediaType => "media_type",
            RejectReason::Invalid => "invalid",
            RejectReason::Overloaded => "overloaded",
            RejectReason::Throttled => "throttled",
            RejectReason::UnknownVersion => "unknown_version",
            RejectReason::UnknownRule => "unknown_rule",
            RejectReason::ProxyId => "proxy_id",
            RejectReason::Replay => "replay",
            RejectReason::OverCeiling => "over_ceiling",
            RejectReason::RateLimited => "rate_limited",
            RejectReason::Error => "error",
        }
    }
}

/// Implements `EncodeLabelValue` for types whose label value is their `as_str()`: every
/// label value is one of a fixed set, never a string a request carried.
macro_rules! fixed_label_value {
    ($($label:ty),+) => {$(
        impl prometheus_client::encoding::EncodeLabelValue for $label {
            fn encode(
                &self,
                encoder: &mut prometheus_client::encoding::LabelValueEncoder<'_>,
            ) -> Result<(), std::fmt::Error> {
                prometheus_client::encoding::EncodeLabelValue::encode(&self.as_str(), encoder)
            }
        }
    )+};
}
pub(crate) use fixed_label_value;

fixed_label_value!(RejectReason);

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: RejectReason,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TableLabels {
    table: String,
}

/// The pipeline's own Prometheus metrics, in the admin API's registry.
#[derive(Debug)]
pub(crate) struct Instruments {
    reports_ingested: Counter,
    reports_rejected: Family<ReasonLabels, Counter>,
    ingest_duration: Histogram,
    flush_duration: Histogram,
    rows_written: Family<TableLabels, Counter>,
    rows_deleted: Counter,
    flush_failures: Counter,
    pending_entries: Gauge,
}

impl Instruments {
    fn register(registry: &mut Registry) -> Instruments {
        let instruments = Instruments {
            reports_ingested: Counter::default(),
            reports_rejected: Family::default(),
            // 50 µs to about 1.6 s.
            ingest_duration: Histogram::new(exponential_buckets(0.000_05, 2.0, 16)),
            // 1 ms to about 16 s.
            flush_duration: Histogram::new(exponential_buckets(0.001, 2.0, 15)),
            rows_written: Family::default(),
            rows_deleted: Counter::default(),
            flush_failures: Counter::default(),
            pending_entries: Gauge::default(),
        };
        registry.register(
            "sluice_admin_reports_ingested",
            "Proxy reports accepted",
            instruments.reports_ingested.clone(),
        );
        registry.register(
            "sluice_admin_reports_rejected",
            "Proxy reports refused, by reason (unauthenticated, forbidden, invalid, too_large, media_type, overloaded, throttled, unknown_version, unknown_rule, proxy_id, replay, over_ceiling, rate_limited, error)",
            instruments.reports_rejected.clone(),
        );
        registry.register(
            "sluice_admin_report_ingest_duration_seconds",
            "Time to read, validate and aggregate a report (POST /api/v1/reports, without the database)",
            instruments.ingest_duration.clone(),
        );
        registry.register(
            "sluice_admin_metrics_flush_duration_seconds",
            "Time to write one flush of aggregated metrics (one transaction)",
            instruments.flush_duration.clone(),
        );
        registry.register(
            "sluice_admin_metrics_rows_written",
            "Rows upserted by metric flushes, by table",
            instruments.rows_written.clone(),
        );
        registry.register(
            "sluice_admin_metrics_rows_deleted",
            "Metric rows deleted by retention, and oldest first from a table over --metrics-max-rows (logged as a warning)",
            instruments.rows_deleted.clone(),
        );
        registry.register(
            "sluice_admin_metrics_flush_failures",
            "Metric flushes that failed (their data is kept for the next one)",
            instruments.flush_failures.clone(),
        );
        registry.register(
            "sluice_admin_metrics_pending_entries",
            "Metric entries in memory waiting for the next flush",
            instruments.pending_entries.clone(),
        );
        instruments
    }

    /// Counts a report's outcome: `Ok`, or the reason it was refused.
    pub(crate) fn observe_report(&self, outcome: Result<(), RejectReason>, took: Duration) {
        match outcome {
            Ok(()) => {
                self.reports_ingested.inc();
                self.ingest_duration.observe(took.as_secs_f64());
            }
            Err(reason) => {
                self.reports_rejected
                    .get_or_create(&ReasonLabels { reason })
                    .inc();
            }
        }
    }
}
