//! The coordinator of fleet-wide (global) buckets: the server side of
//! `POST /api/v1/quota/sync`.
//!
//! The arithmetic is the core's ([`sluice_core::global::coordinator::settle`]); this crate
//! checks a sync request, keeps the buckets' state, counts the fleet, and answers. State
//! lives in this process by default ([`memory::MemoryBuckets`]: one `sluice serve`
//! coordinates the whole fleet, with nothing else to run), or in Redis
//! ([`redis::RedisBuckets`], `sluice serve --redis URL`: any number of replicas share it).
//! A coordinator that starts without its buckets' state *warms up* for one lease TTL
//! (grants nothing; proxies keep to their fallback shares), because leases granted before
//! the restart may still be spent.

pub mod charge;
pub mod guard;
pub mod memory;
pub mod redis;
mod seen;

use std::collections::{HashMap, HashSet};
use std::num::NonZeroU64;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use sluice_core::gcra::{Gcra, MAX_CAPACITY_NS};
use sluice_core::global::coordinator::{Settings, Usage};
use sluice_core::global::sync::{SyncRequest, SyncResponse};
use sluice_core::global::{FLEET_MEMORY_INTERVALS, LEASE_TTL_INTERVALS};
use sluice_core::report::PROXY_ID_RULE;
use sluice_core::rule::capped_burst;
use sluice_core::time::Nanos;
use sluice_core::validation::{FieldError, ValidationErrors};

use guard::{Bounds, KnownLimits, LimitKey, Refusal, Refusals, SeqRefusal, Sequences};
use memory::MemoryBuckets;
pub use seen::{
    ANSWER_TIMES_KEPT, AnswerTimes, AnswerTimesSummary, FALLBACK_AFTER_INTERVALS,
    FALLBACK_SLACK_MS, SyncSeen,
};
use seen::{ASSUMED_NEXT_SYNC_MS, DEFAULT_INTERVAL_MS};

/// Shortest and longest sync interval a proxy may use.
pub const MIN_INTERVAL_MS: u64 = 50;
pub const MAX_INTERVAL_MS: u64 = 10_000;
pub use guard::MAX_SYNC_BUCKETS;
/// Largest sync body accepted.
pub const MAX_SYNC_BYTES: usize = 16 * 1024 * 1024;
/// Longest proxy id (visible ASCII), as for reports: the core's one rule.
pub use sluice_core::report::MAX_PROXY_ID_LEN;
/// Largest count in one bucket's usage: far beyond what a proxy admits between syncs, and
/// small enough that the coordinator's sums cannot overflow.
pub const MAX_COUNT: u64 = 1_000_000_000_000;
/// Problems listed in one answer.
const MAX_PROBLEMS: usize = 20;
/// Largest `seq`: the largest integer JSON carries exactly (2^53 − 1).
pub const MAX_SEQ: u64 = (1 << 53) - 1;

/// A sync request that passed every check.
#[derive(Debug)]
pub struct ValidSync {
    pub proxy: String,
    /// The sync's place in its proxy's sequence (0: a proxy from before sequences).
    pub seq: u64,
    pub interval_ns: u64,
    /// The interval demand is read against: the proxy's configured one, where its buckets
    /// name it (its interval in force is stretched), else `interval_ns`.
    pub demand_interval_ns: u64,
    pub covers_ns: u64,
    /// When the proxy syncs next at the latest, where later than one interval (0: one
    /// interval).
    pub next_sync_ms: u64,
    pub buckets: Vec<(u64, Gcra, Usage)>,
}

/// Checks a sync request; every problem is named by its field path.
pub fn validate(request: SyncRequest) -> Result<ValidSync, ValidationErrors> {
    let mut problems = Vec::new();
    let mut problem = |field: String, message: String| {
        if problems.len() < MAX_PROBLEMS {
            problems.push(FieldError { field, message });
        }
    };
    let id = &request.proxy;
    if !sluice_core::report::is_proxy_id(id) {
        problem("proxy".into(), PROXY_ID_RULE.into());
    }
    if !(MIN_INTERVAL_MS..=MAX_INTERVAL_MS).contains(&request.interval_ms) {
        problem(
            "interval_ms".into(),
            format!("must be {MIN_INTERVAL_MS} to {MAX_INTERVAL_MS}"),
        );
    }
    if request.covers_ms > 60 * MAX_INTERVAL_MS {
        problem(
            "covers_ms".into(),
            format!("must be at most {}", 60 * MAX_INTERVAL_MS),
        );
    }
    if request.next_sync_ms > 60 * MAX_INTERVAL_MS {
        problem(
            "next_sync_ms".into(),
            format!("must be at most {}", 60 * MAX_INTERVAL_MS),
        );
    }
    if request.seq > MAX_SEQ {
        problem("seq".into(), format!("must be at most {MAX_SEQ}"));
    }
    if request.buckets.len() > MAX_SYNC_BUCKETS {
        problem(
            "buckets".into(),
            format!("at most {MAX_SYNC_BUCKETS} buckets per sync"),
        );
    }
    let mut buckets = Vec::with_capacity(request.buckets.len().min(MAX_SYNC_BUCKETS));
    let named = request.buckets.iter().map(|b| b.demand_interval_ms);
    let allowed = MIN_INTERVAL_MS..=request.interval_ms.min(MAX_INTERVAL_MS);
    let demand_interval_ms = guard::demand_interval_ms(allowed, named.take(MAX_SYNC_BUCKETS))
        .unwrap_or_else(|(i, message)| {
            problem(format!("buckets[{i}].demand_interval_ms"), message);
            None
        });
    for (i, b) in request.buckets.iter().enumerate().take(MAX_SYNC_BUCKETS) {
        // Each of `interval_ns` and `burst` is checked against the document's bounds; their
        // product, which JSON Schema cannot bound, is not: a burst that would take longer
        // than 2^62 ns to refill is capped as a rule's limit is (`capped_burst`), so every
        // request the document admits is settled. Proxies never send such a bucket (their
        // limits are capped the same way); the cap only errs toward granting less.
        let in_bounds = |value: u64| (1..=MAX_CAPACITY_NS).contains(&value);
        for (name, value) in [("interval_ns", b.interval_ns), ("burst", b.burst)] {
            if !in_bounds(value) {
                problem(
                    format!("buckets[{i}].{name}"),
                    format!("must be 1 to 2^62 ({MAX_CAPACITY_NS})"),
                );
            }
        }
        if !in_bounds(b.interval_ns) || !in_bounds(b.burst) {
            continue;
        }
        let limit = NonZeroU64::new(b.interval_ns)
            .zip(NonZeroU64::new(capped_burst(b.burst, b.interval_ns)))
            .and_then(|(interval, burst)| Gcra::new(NonZeroU64::MIN, interval, burst).ok());
        let Some(limit) = limit else {
            // Unreachable with the bounds above; refused rather than trusted.
            problem(format!("buckets[{i}]"), "cannot be represented".into());
            continue;
        };
        let usage = b.usage();
        let held = guard::most_held(&limit, request.covers_ms, request.interval_ms);
        for (name, value, most) in [
            ("attempts", usage.attempts, MAX_COUNT),
            ("unleased", usage.unleased, held),
            ("returned", usage.returned, held),
            ("want", usage.want, MAX_COUNT),
        ] {
            if value > MAX_COUNT {
                problem(
                    format!("buckets[{i}].{name}"),
                    format!("must be at most {MAX_COUNT}"),
                );
            } else if value > most {
                problem(
                    format!("buckets[{i}].{name}"),
                    format!(
                        "must be at most {most}: twice what the bucket holds and refills over the time the sync covers and a lease lasts"
                    ),
                );
            }
        }
        if b.first_use_ms > 60 * MAX_INTERVAL_MS {
            problem(
                format!("buckets[{i}].first_use_ms"),
                format!("must be at most {}", 60 * MAX_INTERVAL_MS),
            );
        }
        let deepest_ms = guard::deepest_level_ms(&limit);
        if b.full_in_ms > deepest_ms {
            problem(
                format!("buckets[{i}].full_in_ms"),
                format!(
                    "must be at most {deepest_ms}: twice the time the bucket takes to fill from empty"
                ),
            );
        }
        buckets.push((b.bucket, limit, usage));
    }
    if !problems.is_empty() {
        return Err(ValidationErrors(problems));
    }
    Ok(ValidSync {
        proxy: request.proxy,
        seq: request.seq,
        interval_ns: request.interval_ms * 1_000_000,
        demand_interval_ns: demand_interval_ms.unwrap_or(request.interval_ms) * 1_000_000,
        covers_ns: request.covers_ms.max(1) * 1_000_000,
        next_sync_ms: request.next_sync_ms,
        buckets,
    })
}

/// Where the buckets' state lives.
#[derive(Debug)]
pub enum Backend {
    Memory,
    Redis(redis::RedisBuckets),
}

/// The coordinator: bucket state, the fleet's members, and its metrics.
#[derive(Debug)]
pub struct Coordinator {
    state: State,
    metrics: QuotaMetrics,
    /// What this process saw of each proxy's syncs, for `GET /api/v1/proxies`.
    seen: Mutex<HashMap<String, SyncSeen>>,
    answer_times: Mutex<AnswerTimes>,
    /// The limits syncs may carry; `None` until the server tells (see [`guard`]).
    known: Mutex<Option<KnownLimits>>,
    bounds: Mutex<Bounds>,
    /// Each proxy id's last sync `seq`, so a replayed sync is refused.
    sequences: Mutex<Sequences>,
}

#[derive(Debug)]
enum State {
    Memory {
        buckets: MemoryBuckets,
        /// When each proxy last synced.
        fleet: Mutex<HashMap<String, Instant>>,
        /// When the buckets' state began: this process's start.
        since: Instant,
    },
    Redis(redis::RedisBuckets),
}

/// The coordinator could not answer (its Redis is unreachable): proxies keep to their
/// fallback shares until it answers again.
#[derive(Debug, thiserror::Error)]
#[error("global buckets are unavailable: Redis: {0}")]
pub struct Unavailable(#[from] ::redis::RedisError);

#[derive(Debug, Default)]
struct QuotaMetrics {
    syncs: Counter,
    buckets_settled: Counter,
    granted: Counter,
    unleased: Counter,
    active_buckets: Gauge,
    fleet: Gauge,
    redis_commands: Counter,
    contended: Counter,
    refused: Refusals,
}

impl Coordinator {
    /// A coordinator over `backend`, its metrics registered in `registry`.
    pub fn new(backend: Backend, registry: &mut Registry) -> Self {
        let metrics = QuotaMetrics::default();
        let counters = [
            (
                "sluice_quota_syncs",
                "Sync requests answered (one per proxy per sync interval)",
                &metrics.syncs,
            ),
            (
                "sluice_quota_bucket_settlements",
                "Buckets settled in sync requests",
                &metrics.buckets_settled,
            ),
            (
                "sluice_quota_granted_tokens",
                "Tokens granted to proxies' leases",
                &metrics.granted,
            ),
            (
                "sluice_quota_unleased_tokens",
                "Tokens proxies admitted without a lease (new buckets, fallback), debited later",
                &metrics.unleased,
            ),
            (
                "sluice_quota_redis_commands",
                "Redis commands sent for syncs (about two per bucket per batch of syncs, never per request)",
                &metrics.redis_commands,
            ),
            (
                "sluice_quota_contended_buckets",
                "Buckets granted nothing because other replicas kept changing them during a sync",
                &metrics.contended,
            ),
        ];
        for (name, help, counter) in counters {
            registry.register(name, help, counter.clone());
        }
        registry.register(
            "sluice_quota_refused",
            "Syncs refused (invalid, unknown_limit, replay) and new buckets not kept (max_buckets, max_buckets_per_proxy)",
            metrics.refused.clone(),
        );
        registry.register(
            "sluice_quota_active_buckets",
            "Global buckets held in memory, or in Redis (counted after each batch of syncs that wrote any)",
            metrics.active_buckets.clone(),
        );
        registry.register(
            "sluice_quota_fleet_size",
            "Proxies that synced within the last eight sync intervals",
            metrics.fleet.clone(),
        );
        let state = match backend {
            Backend::Memory => State::Memory {
                buckets: MemoryBuckets::new(),
                fleet: Mutex::new(HashMap::new()),
                since: Instant::now(),
            },
            Backend::Redis(redis) => State::Redis(redis),
        };
        Self {
            state,
            metrics,
            seen: Mutex::new(HashMap::new()),
            answer_times: Mutex::default(),
            known: Mutex::new(None),
            bounds: Mutex::new(Bounds::default()),
            sequences: Mutex::new(Sequences::default()),
        }
    }

    /// Sets how much bucket state the coordinator keeps (in memory or in Redis).
    pub fn set_bounds(&self, bounds: Bounds) {
        *lock(&self.bounds) = bounds;
    }

    /// The ruleset version whose limits syncs are checked against, if any yet.
    pub fn limits_version(&self) -> Option<u64> {
        lock(&self.known).as_ref().map(|k| k.version)
    }

    /// From now on, syncs may carry only `limits`: those of ruleset `version` and of the
    /// version before it ([`guard::global_limits`] of both). An older version than the one
    /// known is ignored.
    pub fn know_limits(&self, version: u64, limits: HashSet<LimitKey>) {
        let mut known = lock(&self.known);
        if known.as_ref().is_none_or(|k| k.version < version) {
            *known = Some(KnownLimits::new(version, limits));
        }
    }

    /// Checks a sync ([`validate`]), and that each bucket's limit is one the rules
    /// produce (once [`Coordinator::know_limits`] was told them); counts a refusal.
    pub fn admit(&self, request: SyncRequest) -> Result<ValidSync, ValidationErrors> {
        let sync = self.checked(request)?;
        self.known_limits_only(sync)
    }

    /// [`validate`], counting a refusal.
    pub fn checked(&self, request: SyncRequest) -> Result<ValidSync, ValidationErrors> {
        validate(request).inspect_err(|_| {
            guard::count(&self.metrics.refused, Refusal::Invalid, 1);
        })
    }

    /// Whether every bucket's limit is one the coordinator was told (true before it was
    /// told any). Counts nothing: a server whose rules may be behind asks its store first.
    pub fn knows_limits(&self, sync: &ValidSync) -> bool {
        self.unknown_limits(sync).is_empty()
    }

    /// `sync`, if each bucket's limit is one the coordinator was told; counts a refusal.
    pub fn known_limits_only(&self, sync: ValidSync) -> Result<ValidSync, ValidationErrors> {
        let problems = self.unknown_limits(&sync);
        if problems.is_empty() {
            Ok(sync)
        } else {
            guard::count(&self.metrics.refused, Refusal::UnknownLimit, 1);
            Err(ValidationErrors(problems))
        }
    }

    fn unknown_limits(&self, sync: &ValidSync) -> Vec<FieldError> {
        let known = lock(&self.known);
        let Some(known) = known.as_ref() else {
            return Vec::new();
        };
        sync.buckets
            .iter()
            .enumerate()
            .filter(|(_, (_, limit, _))| !known.contains(&(limit.interval_ns(), limit.burst())))
            .take(MAX_PROBLEMS)
            .map(|(i, (_, limit, _))| FieldError {
                field: format!("buckets[{i}]"),
                message: format!(
                    "no global limit of the current rules is one token per {} ns with a burst of {}",
                    limit.interval_ns(),
                    limit.burst()
                ),
            })
            .collect()
    }

    /// Takes `sync`'s `seq` as its proxy id's newest at `now_ms` (Unix milliseconds), or
    /// refuses it (counted): a sync is settled once, however often it is sent. Call it
    /// after the proxy id was found to be the sender's, just before [`Coordinator::sync`].
    pub fn in_sequence(&self, sync: &ValidSync, now_ms: i64) -> Result<(), ValidationErrors> {
        let now_ms = u64::try_from(now_ms).unwrap_or(0);
        let refusal = match lock(&self.sequences).accept(&sync.proxy, sync.seq, now_ms) {
            Ok(()) => return Ok(()),
            Err(refusal) => refusal,
        };
        let (reason, message) = match refusal {
            SeqRefusal::Replay { last } => (
                Refusal::Replay,
                format!(
                    "must be larger than this proxy's last sync's ({last}): a sync is settled once"
                ),
            ),
            SeqRefusal::Ahead { most } => (
                Refusal::Invalid,
                format!(
                    "must be at most {most}: 5 minutes past the coordinator's clock (is the proxy's clock right?)"
                ),
            ),
        };
        guard::count(&self.metrics.refused, reason, 1);
        Err(ValidationErrors(vec![FieldError {
            field: "seq".into(),
            message,
        }]))
    }

    /// Records a sync answered at `at`, `took` after its request arrived.
    pub fn record_answer_time(&self, at: Instant, took: Duration) {
        lock(&self.answer_times).record(at, took);
    }

    /// This process's answer times of the syncs answered within `within` before `now`.
    pub fn answer_times(&self, now: Instant, within: Duration) -> Option<AnswerTimesSummary> {
        lock(&self.answer_times).summary(now, within)
    }

    /// Every proxy's syncs: this process's record, with Redis completed by the fleet's
    /// sorted set (syncs any replica answered).
    pub async fn syncs_seen(&self) -> HashMap<String, SyncSeen> {
        let mut seen = self
            .seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        if let State::Redis(redis) = &self.state {
            // Best effort: without Redis the local record is all there is.
            if let Ok(fleet) = redis.fleet().await {
                for (proxy, at_ms) in fleet {
                    let entry = seen.entry(proxy).or_insert(SyncSeen {
                        interval_ms: DEFAULT_INTERVAL_MS,
                        next_sync_ms: ASSUMED_NEXT_SYNC_MS,
                        ..SyncSeen::default()
                    });
                    entry.answered_at_ms = entry.answered_at_ms.max(Some(at_ms));
                }
            }
        }
        seen
    }

    fn record(&self, sync: &ValidSync, answer: Option<&SyncResponse>, now_ms: i64) {
        let mut seen = self
            .seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let entry = seen.entry(sync.proxy.clone()).or_default();
        entry.interval_ms = sync.interval_ns / 1_000_000;
        entry.next_sync_ms = sync.next_sync_ms;
        match answer {
            Some(answer) => {
                entry.answered_at_ms = Some(now_ms);
                entry.warming_up = answer.warming_up;
            }
            None => entry.failed_at_ms = Some(now_ms),
        }
    }

    /// Settles one proxy's sync and answers it. `now` is this process's clock (the memory
    /// backend's); with Redis, Redis's clock is used so replicas agree. `now_ms` (Unix
    /// milliseconds) is when the proxy was last seen, as the API shows it.
    pub async fn sync(
        &self,
        sync: &ValidSync,
        now: Instant,
        now_ms: i64,
    ) -> Result<SyncResponse, Unavailable> {
        let answer = self.settle(sync, now).await;
        self.record(sync, answer.as_ref().ok(), now_ms);
        answer
    }

    async fn settle(&self, sync: &ValidSync, now: Instant) -> Result<SyncResponse, Unavailable> {
        let lease_ttl_ns = sync.interval_ns * LEASE_TTL_INTERVALS;
        let fleet_memory_ns = sync.interval_ns * FLEET_MEMORY_INTERVALS;
        let settings = Settings::for_intervals(
            Nanos::new(sync.interval_ns),
            Nanos::new(sync.demand_interval_ns),
        );
        let answer = match &self.state {
            State::Memory {
                buckets,
                fleet,
                since,
            } => {
                let fleet_size = count_fleet(
                    fleet,
                    &sync.proxy,
                    now,
                    Duration::from_nanos(fleet_memory_ns),
                );
                let settings = Settings {
                    warming_up: now.saturating_duration_since(*since)
                        < Duration::from_nanos(lease_ttl_ns),
                    fleet_size,
                    ..settings
                };
                // Monotonic, and far enough from zero that a bucket's zero state reads as
                // full.
                let clock = (1 << 40) + now.saturating_duration_since(*since).as_nanos() as u64;
                let bounds = *lock(&self.bounds);
                let (grants, not_kept) = buckets.settle_all(
                    &sync.proxy,
                    &sync.buckets,
                    sync.covers_ns,
                    clock,
                    &settings,
                    &bounds,
                );
                let refused = &self.metrics.refused;
                guard::count(refused, Refusal::MaxBuckets, not_kept.max_buckets);
                guard::count(
                    refused,
                    Refusal::MaxBucketsPerProxy,
                    not_kept.max_buckets_per_proxy,
                );
                self.metrics.active_buckets.set(buckets.count() as i64);
                SyncResponse {
                    fleet_size,
                    warming_up: settings.warming_up,
                    grants,
                }
            }
            State::Redis(redis) => {
                let bounds = *lock(&self.bounds);
                let settled = redis
                    .settle(redis::SyncJob {
                        proxy: sync.proxy.clone(),
                        buckets: sync.buckets.clone(),
                        covers_ns: sync.covers_ns,
                        settings,
                        lease_ttl_ns,
                        fleet_memory_ns,
                        bounds,
                    })
                    .await?;
                self.metrics.redis_commands.inc_by(settled.commands);
                self.metrics.contended.inc_by(settled.contended);
                let refused = &self.metrics.refused;
                let not_kept = settled.not_kept;
                guard::count(refused, Refusal::MaxBuckets, not_kept.max_buckets);
                guard::count(
                    refused,
                    Refusal::MaxBucketsPerProxy,
                    not_kept.max_buckets_per_proxy,
                );
                let held = settled.held.unwrap_or(settled.grants.len() as u64);
                self.metrics.active_buckets.set(held as i64);
                SyncResponse {
                    fleet_size: settled.fleet_size,
                    warming_up: settled.warming_up,
                    grants: settled.grants,
                }
            }
        };
        self.metrics.syncs.inc();
        self.metrics.fleet.set(i64::from(answer.fleet_size));
        self.metrics
            .buckets_settled
            .inc_by(answer.grants.len() as u64);
        self.metrics
            .granted
            .inc_by(answer.grants.iter().map(|g| g.granted).sum());
        self.metrics
            .unleased
            .inc_by(sync.buckets.iter().map(|(_, _, u)| u.unleased).sum());
        Ok(answer)
    }
}

/// Locks `mutex`, also one a panicking thread held (the data stays consistent: every
/// update under these locks is one assignment).
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Records `proxy`'s sync and counts the proxies seen within `memory`.
fn count_fleet(
    fleet: &Mutex<HashMap<String, Instant>>,
    proxy: &str,
    now: Instant,
    memory: Duration,
) -> u32 {
    let mut fleet = fleet
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    fleet.insert(proxy.to_string(), now);
    // Forget proxies gone for much longer than any interval, so the map stays small.
    fleet.retain(|_, seen| now.saturating_duration_since(*seen) < Duration::from_secs(600));
    let size = fleet
        .values()
        .filter(|seen| now.saturating_duration_since(**seen) <= memory)
        .count();
    u32::try_from(size).unwrap_or(u32::MAX).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::global::sync::BucketUsage;

    fn request(proxy: &str, buckets: Vec<BucketUsage>) -> SyncRequest {
        SyncRequest {
            proxy: proxy.into(),
            interval_ms: 500,
            covers_ms: 500,
            buckets,
            seq: 0,
            next_sync_ms: 0,
        }
    }

    /// A bucket of 10/s with a burst of 100, asking for `want` tokens.
    fn usage(bucket: u64, want: u64) -> BucketUsage {
        BucketUsage::new(
            bucket,
            100_000_000,
            100,
            &Usage {
                want,
                ..Usage::default()
            },
        )
    }

    #[test]
    fn bad_requests_name_every_problem() {
        let mut bad = request("", vec![usage(1, 1), BucketUsage::default()]);
        bad.interval_ms = 5;
        bad.buckets[0].want = MAX_COUNT + 1;
        bad.buckets[0].first_use_ms = 600_001;
        bad.next_sync_ms = 600_001;
        let problems = validate(bad).unwrap_err().0;
        let fields: Vec<&str> = problems.iter().map(|p| p.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "proxy",
                "interval_ms",
                "next_sync_ms",
                "buckets[0].want",
                "buckets[0].first_use_ms",
                "buckets[1].interval_ns",
                "buckets[1].burst"
            ]
        );
    }

    /// A fleet level reported by a proxy on fallback shares: up to twice the bucket's
    /// capacity (20 s for 10/s with a burst of 100) is taken, a millisecond more refused.
    #[test]
    fn a_known_level_is_at_most_twice_the_buckets_capacity() {
        let mut sync = request("a", vec![usage(1, 1)]);
        sync.buckets[0].full_in_ms = 20_000;
        let valid = validate(sync.clone()).unwrap();
        assert_eq!(valid.buckets[0].2.known_full_in_ns, 20_000_000_000);
        sync.buckets[0].full_in_ms = 20_001;
        let problems = validate(sync).unwrap_err().0;
        assert_eq!(problems[0].field, "buckets[0].full_in_ms");
        assert!(
            problems[0].message.contains("at most 20000"),
            "{problems:?}"
        );
    }

    /// A stretched proxy's configured interval (`guard::demand_interval_ms`): read from
    /// its buckets, refused by field out of bounds; absent, the interval in force.
    #[test]
    fn a_configured_interval_is_read_and_refused_by_field() {
        let mut sync = request("a", vec![usage(1, 1), usage(2, 1)]);
        assert_eq!(
            validate(sync.clone()).unwrap().demand_interval_ns,
            500_000_000
        );
        sync.buckets[1].demand_interval_ms = 250;
        assert_eq!(
            validate(sync.clone()).unwrap().demand_interval_ns,
            250_000_000
        );
        sync.buckets[1].demand_interval_ms = 501;
        let problems = validate(sync).unwrap_err().0;
        assert_eq!(problems[0].field, "buckets[1].demand_interval_ms");
    }

    #[tokio::test]
    async fn a_coordinator_warms_up_then_grants_and_counts_the_fleet() {
        let mut registry = Registry::default();
        let coordinator = Coordinator::new(Backend::Memory, &mut registry);
        let State::Memory { since: start, .. } = coordinator.state else {
            unreachable!()
        };
        let sync = validate(request("a", vec![usage(7, 30)])).unwrap();
        let answer = coordinator.sync(&sync, start, 0).await.unwrap();
        assert!(answer.warming_up);
        assert_eq!(answer.grants[0].granted, 0);
        assert_eq!(answer.fleet_size, 1);

        let later = start + Duration::from_millis(1_500);
        let answer = coordinator.sync(&sync, later, 0).await.unwrap();
        assert!(!answer.warming_up, "one lease TTL (3 × 500 ms) later");
        let young_ns = Settings::for_interval(Nanos::new(500_000_000)).young_ns();
        assert_eq!(young_ns, 800_000_000, "300 ms and one interval");
        let young = Duration::from_nanos(young_ns);
        assert!(
            answer.grants[0].young && answer.grants[0].granted == 0,
            "new to the fleet: the proxies keep to their even shares for a while"
        );
        let grown = later + young;
        let answer = coordinator.sync(&sync, grown, 0).await.unwrap();
        assert_eq!(answer.grants[0].granted, 30);
        // The second proxy gets what the first left, plus the refill since: never a
        // second burst; one interval's refill (5) stays for the proxies' demand shares,
        // and b reported no demand: below the limit it is entitled to a tenth of an even
        // split of that refill all the same, rounded up to a token.
        let other = validate(request("b", vec![usage(7, 100)])).unwrap();
        let answer = coordinator.sync(&other, grown + young, 0).await.unwrap();
        assert_eq!(answer.fleet_size, 2);
        assert_eq!(
            answer.grants[0].granted,
            70 + 8 - 5 + 1,
            "pre-debited: 100 − 30, + 0.8 s at 10/s, less one interval's refill but a token"
        );

        // a's last sync was at `grown`: it counts for 24 intervals (12 s at 500 ms), longer
        // than an idle proxy's 16.
        let still_there = grown + Duration::from_millis(11_900);
        let answer = coordinator.sync(&other, still_there, 0).await.unwrap();
        assert_eq!(
            answer.fleet_size, 2,
            "a stalled for a moment, or idle, not gone"
        );
        let gone = grown + Duration::from_millis(12_100);
        let answer = coordinator.sync(&other, gone, 0).await.unwrap();
        assert_eq!(answer.fleet_size, 1, "a left the fleet");
    }

    fn refused(registry: &Registry, reason: &str) -> u64 {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
        let key = format!("sluice_quota_refused_total{{reason=\"{reason}\"}} ");
        text.lines()
            .find_map(|line| line.strip_prefix(&key))
            .map_or(0, |n| n.parse().unwrap())
    }

    /// The probe's attack: a made-up limit (one token per 4 × 10^18 ns) in a sync. Only
    /// the limits the coordinator was told are taken, from the newest version it was told.
    #[test]
    fn syncs_carry_only_limits_the_rules_produce() {
        let mut registry = Registry::default();
        let coordinator = Coordinator::new(Backend::Memory, &mut registry);
        let absurd = BucketUsage {
            interval_ns: 4_000_000_000_000_000_000,
            ..usage(2, 1)
        };
        assert!(
            coordinator.admit(request("a", vec![absurd])).is_ok(),
            "before the server tells its rules, the document's bounds are all there is"
        );
        coordinator.know_limits(1, HashSet::from([(100_000_000, 100)]));
        assert!(coordinator.admit(request("a", vec![usage(1, 1)])).is_ok());
        let problems = coordinator
            .admit(request("a", vec![usage(1, 1), absurd]))
            .unwrap_err()
            .0;
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].field, "buckets[1]");
        let off_by_one = BucketUsage {
            burst: 101,
            ..usage(3, 1)
        };
        assert!(coordinator.admit(request("a", vec![off_by_one])).is_err());
        assert_eq!(refused(&registry, "unknown_limit"), 2);

        coordinator.know_limits(2, HashSet::from([(50_000_000, 10), (100_000_000, 100)]));
        assert!(coordinator.admit(request("a", vec![usage(1, 1)])).is_ok());
        coordinator.know_limits(1, HashSet::new());
        assert_eq!(coordinator.limits_version(), Some(2), "never goes back");
        coordinator.know_limits(3, HashSet::from([(50_000_000, 10)]));
        assert!(coordinator.admit(request("a", vec![usage(1, 1)])).is_err());
        assert_eq!(refused(&registry, "unknown_limit"), 3);
        assert!(coordinator.admit(request("", vec![])).is_err());
        assert_eq!(refused(&registry, "invalid"), 1);
    }

    /// The probe's other attack: syncs of ever new bucket ids. The memory backend keeps at
    /// most its bounds (in all, per proxy id), answers the rest with nothing granted, and
    /// frees room when idle buckets are swept.
    /// Tokens admitted without a lease, or given back, are bounded by what the bucket can
    /// have held: a made-up `unleased` of 10^12 would drain a fleet's bucket at once.
    #[test]
    fn unleased_and_returned_tokens_are_bounded_by_what_the_bucket_held() {
        // 10/s, burst 100; 500 ms covered, lease of 3 × 500 ms: 2 × (100 + 20 + 1).
        let most = 242;
        for name in ["unleased", "returned"] {
            let with = |n: u64| {
                let mut b = usage(1, 0);
                match name {
                    "unleased" => b.unleased = n,
                    _ => b.returned = n,
                }
                request("a", vec![b])
            };
            assert!(validate(with(most)).is_ok(), "{name} at the bound");
            let problems = validate(with(most + 1)).unwrap_err().0;
            assert_eq!(problems[0].field, format!("buckets[0].{name}"));
        }
    }

    #[tokio::test]
    async fn bucket_state_is_bounded_in_all_and_per_proxy_and_idle_buckets_are_evicted() {
        let mut registry = Registry::default();
        let coordinator = Coordinator::new(Backend::Memory, &mut registry);
        coordinator.set_bounds(Bounds {
            max_buckets: 5,
            max_buckets_per_proxy: 3,
        });
        let State::Memory {
            since,
            buckets: held,
            ..
        } = &coordinator.state
        else {
            unreachable!()
        };
        let start = *since;
        // Attempted, so that they are not idle when the first sync sweeps.
        let ids = |from: u64, n: u64| -> Vec<BucketUsage> {
            (from..from + n)
                .map(|id| BucketUsage {
                    attempts: 1,
                    ..usage(id, 1)
                })
                .collect()
        };
        let a = validate(request("a", ids(1, 4))).unwrap();
        let answer = coordinator.sync(&a, start, 0).await.unwrap();
        assert_eq!(held.count(), 3, "at the per-proxy bound, not over");
        assert_eq!(held.created_by("a"), 3);
        assert_eq!(answer.grants.len(), 4, "every bucket is answered");
        assert!(answer.grants[3].young && answer.grants[3].granted == 0);
        assert_eq!(refused(&registry, "max_buckets_per_proxy"), 1);

        let b = validate(request(
            "b",
            ids(1, 1).into_iter().chain(ids(10, 3)).collect(),
        ))
        .unwrap();
        coordinator.sync(&b, start, 0).await.unwrap();
        assert_eq!(
            held.count(),
            5,
            "a's bucket 1 is shared, two new ones fit in all"
        );
        assert_eq!(held.created_by("b"), 2);
        assert_eq!(refused(&registry, "max_buckets"), 1);

        // A minute later nobody wants them: the sweep drops them and frees each proxy's
        // room.
        let idle = validate(request("c", vec![])).unwrap();
        coordinator
            .sync(&idle, start + Duration::from_secs(60), 0)
            .await
            .unwrap();
        assert_eq!(held.count(), 0);
        assert_eq!((held.created_by("a"), held.created_by("b")), (0, 0));
        let again = validate(request("a", ids(100, 3))).unwrap();
        coordinator
            .sync(&again, start + Duration::from_secs(61), 0)
            .await
            .unwrap();
        assert_eq!(held.count(), 3);
    }
}
