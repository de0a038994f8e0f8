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
//! - **Bounded state.** At most [`Bounds::max_buckets`] buckets in all, and at most
//!   [`Bounds::max_buckets_per_proxy`] created by one proxy id; a bucket past either is
//!   granted nothing and not kept (the proxy keeps to its even share), and counted. Idle
//!   full buckets are swept (in memory) or expire (in Redis), which frees room.
//! - **Each sync once.** A sync's `seq` must be larger than its proxy id's last (see
//!   [`Sequences`]), so a sync sent again cannot debit its buckets again.

use std::collections::HashSet;
use std::ops::RangeInclusive;

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

/// How much bucket state the coordinator keeps, in memory or in Redis.
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

/// The longest a proxy may report its bucket's fleet level as taking to fill
/// (`full_in_ms`, whole milliseconds rounded up): the deepest debt a coordinator keeps,
/// twice the bucket's capacity. Beyond it a report is refused: it could only be made up,
/// and would starve the bucket it names while a coordinator warms up.
pub fn deepest_level_ms(limit: &Gcra) -> u64 {
    limit.capacity_ns().saturating_mul(2).div_ceil(1_000_000)
}

/// The interval a sync's demand is read against, which a stretched proxy names in each
/// bucket (`demand_interval_ms`, 0 where not named): within `allowed` (50 ms to the
/// sync's interval in force), and the same in every bucket that names it; `None` where
/// none does. Otherwise the first offending bucket's index and why. Out of bounds it could
/// only be made up: a short one makes a proxy's share read high.
pub fn demand_interval_ms(
    allowed: RangeInclusive<u64>,
    named: impl IntoIterator<Item = u64>,
) -> Result<Option<u64>, (usize, String)> {
    let mut found = None;
    for (i, ms) in named.into_iter().enumerate().filter(|(_, ms)| *ms != 0) {
        if !allowed.contains(&ms) {
            let (least, most) = allowed.clone().into_inner();
            return Err((i, format!("must be 0 or {least} to {most} (`interval_ms`)")));
        }
        if *found.get_or_insert(ms) != ms {
            return Err((i, "must be the same in every bucket that names it".into()));
        }
    }
    Ok(found)
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
    /// A sync whose `seq` is not larger than its proxy id's last (a sync sent again).
    Replay,
}

impl Refusal {
    /// The label value, as dashboards and alerts select it.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::Invalid => "invalid",
            Refusal::UnknownLimit => "unknown_limit",
            Refusal::MaxBuckets => "max_buckets",
            Refusal::MaxBucketsPerProxy => "max_buckets_per_proxy",
            Refusal::Replay => "replay",
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

/// How far ahead of the coordinator's clock a sync's `seq` (the proxy's clock, in Unix
/// milliseconds) may be: the same clock skew a report's `end_ms` may have.
pub const MAX_SEQ_AHEAD_MS: u64 = 5 * 60 * 1000;

/// Why a sync's `seq` was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeqRefusal {
    /// Not larger than the proxy id's last `seq` (0 after a proxy id sent one).
    Replay { last: u64 },
    /// More than [`MAX_SEQ_AHEAD_MS`] ahead of the coordinator's clock.
    Ahead { most: u64 },
}

/// Each proxy id's last accepted sync `seq`, so that each sync is settled once. One entry
/// per proxy id that synced (ids are bounded per token by the server), kept in this
/// process: with Redis, each replica keeps its own, so a sync replayed to every replica
/// is settled at most once by each.
#[derive(Debug, Default)]
pub(crate) struct Sequences {
    last: std::collections::HashMap<String, u64>,
}

impl Sequences {
    /// Accepts `seq` from `proxy` at `now_ms` (Unix milliseconds) and records it, or says
    /// why not. 0 is a proxy from before sequences: accepted until its id sends one.
    pub(crate) fn accept(&mut self, proxy: &str, seq: u64, now_ms: u64) -> Result<(), SeqRefusal> {
        let most = now_ms.saturating_add(MAX_SEQ_AHEAD_MS);
        if seq > most {
            return Err(SeqRefusal::Ahead { most });
        }
        match self.last.get_mut(proxy) {
            Some(last) if seq <= *last && !(seq == 0 && *last == 0) => {
                Err(SeqRefusal::Replay { last: *last })
            }
            Some(last) => {
                *last = seq;
                Ok(())
            }
            None => {
                self.last.insert(proxy.to_string(), seq);
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_configured_interval_is_within_bounds_and_the_same_in_every_bucket() {
        let named = |ms: &[u64]| demand_interval_ms(50..=500, ms.iter().copied());
        assert_eq!(named(&[]), Ok(None));
        assert_eq!(named(&[0, 0]), Ok(None));
        assert_eq!(named(&[0, 250, 250]), Ok(Some(250)));
        assert_eq!(named(&[50]), Ok(Some(50)));
        assert_eq!(named(&[500]), Ok(Some(500)));
        for (ms, at) in [(&[49][..], 0), (&[250, 501], 1), (&[250, 0, 100], 2)] {
            assert_eq!(named(ms).map_err(|(i, _)| i), Err(at), "{ms:?}");
        }
    }

    #[test]
    fn each_sync_is_accepted_once_and_in_order() {
        let now = 1_700_000_000_000;
        let mut seqs = Sequences::default();
        assert_eq!(seqs.accept("p", now, now), Ok(()));
        assert_eq!(
            seqs.accept("p", now, now),
            Err(SeqRefusal::Replay { last: now }),
            "the same sync again"
        );
        assert_eq!(
            seqs.accept("p", now - 1, now),
            Err(SeqRefusal::Replay { last: now })
        );
        assert_eq!(seqs.accept("p", now + 1, now), Ok(()));
        assert_eq!(
            seqs.accept("p", 0, now),
            Err(SeqRefusal::Replay { last: now + 1 }),
            "dropping the sequence is a replay too"
        );
        assert_eq!(seqs.accept("q", now - 5, now), Ok(()), "another id");
        let most = now + MAX_SEQ_AHEAD_MS;
        assert_eq!(
            seqs.accept("r", most + 1, now),
            Err(SeqRefusal::Ahead { most })
        );
        assert_eq!(seqs.accept("r", most, now), Ok(()), "at the bound");
        // Proxies from before sequences send none: every sync of theirs is taken.
        assert_eq!(seqs.accept("old", 0, now), Ok(()));
        assert_eq!(seqs.accept("old", 0, now), Ok(()));
    }
}
