//! Global buckets in this process's memory.

use std::collections::HashMap;
use std::sync::Mutex;

use sluice_core::gcra::Gcra;
use sluice_core::global::coordinator::{BucketState, Grant, Settings, Usage, settle};
use sluice_core::time::Nanos;

/// Buckets kept no longer than needed: a full bucket without recent demand is the same as
/// no bucket, so it is dropped (swept at most every [`SWEEP_EVERY_NS`]).
const SWEEP_EVERY_NS: u64 = 10_000_000_000;

#[derive(Debug, Default)]
pub struct MemoryBuckets {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    buckets: HashMap<u64, BucketState>,
    last_sweep: u64,
}

impl MemoryBuckets {
    pub fn new() -> Self {
        Self::default()
    }

    /// Settles every bucket of one sync under one lock, in order.
    pub fn settle_all(
        &self,
        buckets: &[(u64, Gcra, Usage)],
        covers_ns: u64,
        now: u64,
        settings: &Settings,
    ) -> Vec<Grant> {
        let mut inner = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let grants = buckets
            .iter()
            .map(|(id, limit, usage)| {
                let state = inner.buckets.entry(*id).or_default();
                settle(
                    state,
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
            let tau = settings.demand_tau_ns.max(1) as f64;
            inner.buckets.retain(|_, b| {
                let decayed = b.demand * (-(now.saturating_sub(b.demand_at) as f64) / tau).exp();
                b.tat > now || decayed >= 0.5
            });
        }
        grants
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
