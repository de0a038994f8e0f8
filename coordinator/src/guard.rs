//! What one proxy token may put into the coordinator.
//!
//! A proxy token is a shared secret that sits in every Envoy's configuration, so it leaks
//! more easily than an operator's. Whoever holds one may sync, and a sync names buckets
//! and their limits: unchecked, one token could fill the coordinator with made-up buckets
//! of made-up limits. Two bounds stop that before the settlement arithmetic sees anything:
//!
//! - **Known limits.** A bucket's limit `(interval_ns, burst)` must be one that a limit of
//!   the current ruleset (a rule's own or an override's, `scope: global`) produces, or of
//!   the version before it (proxies switch within a second of a change, and a sync in
//!   flight may still carry the old limit): the server passes both versions' limits.
//! - **Bounded state** (memory backend). At most [`Bounds::max_buckets`] buckets in all,
//!   and at most [`Bounds::max_buckets_per_proxy`] created by one proxy id; a bucket past
//!   either is granted nothing and not kept (the proxy keeps to its even share), and
//!   counted. Idle full buckets are swept as before, which frees room.

use std::collections::HashSet;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use sluice_core::gcra::Gcra;
use sluice_core::rule::Rule;

/// Most buckets in one sync: 50,000 active global buckets per proxy (about 7 MB of JSON).
pub const MAX_SYNC_BUCKETS: usize = 50_000;
/// Buckets held in all by default: about 40 MB of state (a bucket costs ~200 bytes with
/// its owner and map overhead), four proxies' worth of full syncs.
pub const DEFAULT_MAX_BUCKETS: usize = 200_000;
/// Buckets one proxy id may create by default: one full sync.
pub const DEFAULT_MAX_BUCKETS_PER_PROXY: usize = MAX_SYNC_BUCKETS;

/// How much bucket state the coordinator keeps (memory backend; Redis expires its keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    pub max_buckets: usize,
    pub max_buckets_per_proxy: usize,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds {
            max_buckets: DEFAULT_MAX_BUCKETS,
            max_buckets_per_proxy: DEFAULT_MAX_BUCKETS_PER_PROXY,
        }
    }
}

/// The most tokens a proxy can have admitted without a lease, or give back, for one bucket
/// in a sync covering `covers_ms` at `interval_ms`: twice what the bucket holds (`burst`)
/// and refills over the time covered and a lease's life (its fallback share is at most the
/// whole rate, its lease at most what was granted). Twice, so that no honest proxy is
/// near it; a made-up count (10^12) would otherwise drain a fleet's bucket in one sync.
pub fn most_held(limit: &Gcra, covers_ms: u64, interval_ms: u64) -> u64 {
    let lease_ms = interval_ms.saturating_mul(sluice_core::global::LEASE_TTL_INTERVALS);
    let span_ns = covers_ms
        .max(1)
        .saturating_add(lease_ms)
        .saturating_mul(1_000_000);
    let refill = span_ns / limit.interval_ns() + 1;
    limit.burst().saturating_add(refill).saturating_mul(2)
}

/// A limit as a sync carries it.
pub type LimitKey = (u64, u64);

/// Every global limit `rules` can produce: the rules' own and their overrides'.
pub fn global_limits(rules: &[Rule]) -> HashSet<LimitKey> {
    rules
        .iter()
        .flat_map(|rule| rule.limits.iter().chain(rule.overrides.values().flatten()))
        .filter(|limit| limit.global)
        .map(|limit| (limit.gcra.interval_ns(), limit.gcra.burst()))
        .collect()
}

/// The limits a sync may carry, as of a ruleset version.
#[derive(Debug, Default)]
pub(crate) struct KnownLimits {
    pub(crate) version: u64,
    limits: HashSet<LimitKey>,
}

impl KnownLimits {
    pub(crate) fn new(version: u64, limits: HashSet<LimitKey>) -> Self {
        KnownLimits { version, limits }
    }

    pub(crate) fn contains(&self, limit: &LimitKey) -> bool {
        self.limits.contains(limit)
    }
}

/// Why the coordinator refused a sync or a bucket, for `sluice_quota_refused_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// A sync that is not valid (shape, bounds, proxy id).
    Invalid,
    /// A sync naming a limit no current rule produces (the whole sync is refused).
    UnknownLimit,
    /// A new bucket past `--quota-max-buckets` (granted nothing, not kept).
    MaxBuckets,
    /// A new bucket past `--quota-max-buckets-per-proxy` for its proxy id.
    MaxBucketsPerProxy,
}

impl Refusal {
    /// The label value, as dashboards and alerts select it.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::Invalid => "invalid",
            Refusal::UnknownLimit => "unknown_limit",
            Refusal::MaxBuckets => "max_buckets",
            Refusal::MaxBucketsPerProxy => "max_buckets_per_proxy",
        }
    }
}

impl EncodeLabelValue for Refusal {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        EncodeLabelValue::encode(&self.as_str(), encoder)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct RefusalLabels {
    pub(crate) reason: Refusal,
}

pub(crate) type Refusals = Family<RefusalLabels, Counter>;

/// Counts `n` refusals for `reason`.
pub(crate) fn count(refusals: &Refusals, reason: Refusal, n: u64) {
    if n > 0 {
        refusals.get_or_create(&RefusalLabels { reason }).inc_by(n);
    }
}
