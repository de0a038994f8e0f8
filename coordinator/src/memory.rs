//! Global buckets in this process's memory.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use sluice_core::gcra::Gcra;
use sluice_core::global::coordinator::{BucketState, Grant, Settings, Usage, settle};
use sluice_core::time::Nanos;

use crate::guard::Bounds;

/// Buckets kept no longer than needed: a full bucket without recent demand is the same as
/// no bucket, so it is dropped (swept at most every [`SWEEP_EVERY_NS`]).
const SWEEP_EVERY_NS: u64 = 10_000_000_000;

#[derive(Debug, Default)]
pub struct MemoryBuckets {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    buckets: HashMap<u64, Held>,
    /// Buckets held per proxy id that created them, for [`Bounds::max_buckets_per_proxy`].
    created: HashMap<Arc<str>, usize>,
    last_sweep: u64,
}

#[derive(Debug)]
struct Held {
    state: BucketState,
    /// The proxy whose sync created the bucket: it counts against that proxy's bound
    /// until it is swept, whoever else settles it.
    creator: Arc<str>,
}

/// Who the buckets that Envoy's rate limit service creates count against: no proxy's
/// bound (a proxy id is visible ASCII without spaces, so none can be this).
const RLS_CREATOR: &str = "rate limit service";

/// New buckets of one sync that were not kept, by the bound they met.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct NotKept {
    pub max_buckets: u64,
    pub max_buckets_per_proxy: u64,
}

/// The answer for a bucket that could not be kept: nothing granted, and `young`, so the
/// proxy keeps to its even share of the limit as for any bucket new to the fleet.
pub(crate) const NOT_KEPT: Grant = Grant {
    granted: 0,
    share_ppm: 0,
    full_in_ns: 0,
    young: true,
};

impl MemoryBuckets {
    pub fn new() -> Self {
        Self::default()
    }

    /// Settles every bucket of `proxy`'s sync under one lock, in order. A bucket not held
    /// yet is created only within `bounds`; past them it is answered [`NOT_KEPT`].
    pub fn settle_all(
        &self,
        proxy: &str,
        buckets: &[(u64, Gcra, Usage)],
        covers_ns: u64,
        now: u64,
        settings: &Settings,
        bounds: &Bounds,
    ) -> (Vec<Grant>, NotKept) {
        let mut inner = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let Inner {
            buckets: held,
            created,
            ..
        } = &mut *inner;
        let creator: Arc<str> = Arc::from(proxy);
        let mut not_kept = NotKept::default();
        let grants = buckets
            .iter()
            .map(|(id, limit, usage)| {
                if !held.contains_key(id) {
                    let mine = created.get(&creator).copied().unwrap_or(0);
                    if held.len() >= bounds.max_buckets {
                        not_kept.max_buckets += 1;
                        return NOT_KEPT;
                    }
                    if mine >= bounds.max_buckets_per_proxy {
                        not_kept.max_buckets_per_proxy += 1;
                        return NOT_KEPT;
                    }
                    *created.entry(creator.clone()).or_default() += 1;
                }
                let entry = held.entry(*id).or_insert_with(|| Held {
                    state: BucketState::default(),
                    creator: creator.clone(),
                });
                settle(
                    &mut entry.state,
                    limit,
                    usage,
                    Nanos::new(covers_ns),
                    Nanos::new(now),
                    settings,
                )
            })
            .collect();
        if now.saturating_sub(inner.last_sweep) >= SWEEP_EVERY_NS {
            inner.last_sweep = now;
            inner.sweep(now, settings);
        }
        (grants, not_kept)
    }

    /// Reads the theoretical arrival times of `ids` (a bucket not held is full), lets
    /// `decide` choose the new ones, and writes them, all under one lock: one request of
    /// Envoy's rate limit service. A bucket not held yet is kept only while fewer than
    /// `bounds.max_buckets` are; past it nothing is written and `None` is returned.
    pub fn charge<T>(
        &self,
        ids: &[u64],
        now: u64,
        bounds: &Bounds,
        settings: &Settings,
        decide: impl FnOnce(&[Nanos]) -> (T, Vec<(u64, Nanos)>),
    ) -> Option<T> {
        let mut inner = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if now.saturating_sub(inner.last_sweep) >= SWEEP_EVERY_NS {
            inner.last_sweep = now;
            inner.sweep(now, settings);
        }
        let tats: Vec<Nanos> = ids
            .iter()
            .map(|id| Nanos::new(inner.buckets.get(id).map_or(0, |h| h.state.tat)))
            .collect();
        let (answer, writes) = decide(&tats);
        let new = writes
            .iter()
            .filter(|(id, _)| !inner.buckets.contains_key(id))
            .count();
        if new > 0 && inner.buckets.len() + new > bounds.max_buckets {
            return None;
        }
        let creator: Arc<str> = Arc::from(RLS_CREATOR);
        for (id, tat) in writes {
            inner
                .buckets
                .entry(id)
                .or_insert_with(|| Held {
                    state: BucketState::default(),
                    creator: creator.clone(),
                })
                .state
                .tat = tat.get();
        }
        Some(answer)
    }

    /// Buckets held by `proxy`'s bound.
    pub fn created_by(&self, proxy: &str) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .created
            .get(proxy)
            .copied()
            .unwrap_or(0)
    }

    /// Buckets held.
    pub fn count(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .buckets
            .len()
    }
}

impl Inner {
    /// Drops the buckets that carry no information: full, and without recent demand.
    fn sweep(&mut self, now: u64, settings: &Settings) {
        let tau = settings.demand_tau_ns.max(1) as f64;
        let created = &mut self.created;
        self.buckets.retain(|_, held| {
            let b = &held.state;
            let decayed = b.demand * (-(now.saturating_sub(b.demand_at) as f64) / tau).exp();
            let keep = b.tat > now || decayed >= 0.5;
            if !keep {
                if let Some(n) = created.get_mut(&held.creator) {
                    *n = n.saturating_sub(1);
                }
            }
            keep
        });
        created.retain(|_, n| *n > 0);
    }
}
