//! Charging buckets one request at a time, for Envoy's rate limit service (`sluice serve
//! --rls-listen`): the same bucket store as the proxies' syncs (this process's memory, or
//! Redis shared by every replica), the same bucket state, and one GCRA operation per
//! bucket, which the caller's pure `decide` performs (`sluice_core::rls::decide`).

use std::time::Instant;

use sluice_core::global::DEFAULT_SYNC_INTERVAL_NS;
use sluice_core::global::coordinator::Settings;
use sluice_core::time::Nanos;

use crate::{Coordinator, State, lock};

/// Why a request's buckets could not be charged; the caller applies each rule's failure
/// mode.
#[derive(Debug, thiserror::Error)]
pub enum ChargeError {
    #[error("Redis: {0}")]
    Unavailable(#[from] ::redis::RedisError),
    #[error("the bucket store holds its most buckets (--quota-max-buckets)")]
    Full,
    #[error("other writers kept changing the request's buckets")]
    Contended,
}

impl ChargeError {
    /// The metric label for it.
    pub fn reason(&self) -> &'static str {
        match self {
            ChargeError::Unavailable(_) => "unavailable",
            ChargeError::Full => "max_buckets",
            ChargeError::Contended => "contended",
        }
    }
}

impl Coordinator {
    /// Reads the theoretical arrival times of `ids` (full when never written), calls
    /// `decide(now, tats)`, and writes the new times it returns, atomically with respect
    /// to every other charge and sync of these buckets. `now` is the memory backend's
    /// clock (monotonic, `at` on this process's clock) or Redis's, as the syncs' are.
    pub async fn charge<T>(
        &self,
        ids: &[u64],
        at: Instant,
        decide: impl Fn(Nanos, &[Nanos]) -> (T, Vec<(u64, Nanos)>),
    ) -> Result<T, ChargeError> {
        match &self.state {
            State::Memory { buckets, since, .. } => {
                let now = (1 << 40) + at.saturating_duration_since(*since).as_nanos() as u64;
                let bounds = *lock(&self.bounds);
                let settings = Settings::for_interval(Nanos::new(DEFAULT_SYNC_INTERVAL_NS));
                buckets
                    .charge(ids, now, &bounds, &settings, |tats| {
                        decide(Nanos::new(now), tats)
                    })
                    .ok_or(ChargeError::Full)
            }
            State::Redis(redis) => {
                let max_buckets = lock(&self.bounds).max_buckets;
                match redis.charge(ids, max_buckets, decide).await? {
                    crate::redis::Charged::Done(answer) => Ok(answer),
                    crate::redis::Charged::Contended => Err(ChargeError::Contended),
                    crate::redis::Charged::Full => Err(ChargeError::Full),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU64;

    use prometheus_client::registry::Registry;
    use sluice_core::gcra::Gcra;

    use super::*;
    use crate::guard::Bounds;
    use crate::{Backend, Coordinator};

    /// A charge of one token on each bucket of `ids` at 1 per second, burst 2, all or
    /// nothing: the shape of `sluice_core::rls::decide`.
    fn one_each(now: Nanos, tats: &[Nanos], ids: &[u64]) -> (bool, Vec<(u64, Nanos)>) {
        let gcra = Gcra::new(
            NonZeroU64::MIN,
            NonZeroU64::new(1_000_000_000).unwrap(),
            NonZeroU64::new(2).unwrap(),
        )
        .unwrap();
        let verdicts: Vec<_> = tats.iter().map(|t| gcra.check(*t, now, 1)).collect();
        if verdicts.iter().all(|v| v.allowed) {
            (
                true,
                ids.iter()
                    .copied()
                    .zip(verdicts.iter().map(|v| v.new_tat))
                    .collect(),
            )
        } else {
            (false, Vec::new())
        }
    }

    #[tokio::test]
    async fn charges_in_memory_admit_the_burst_all_or_nothing_within_the_bound() {
        let coordinator = Coordinator::new(Backend::Memory, &mut Registry::default());
        let at = Instant::now();
        let ids = [1, 2];
        let run = |ids: &'static [u64]| {
            let coordinator = &coordinator;
            async move {
                coordinator
                    .charge(ids, at, |now, tats| one_each(now, tats, ids))
                    .await
            }
        };
        assert!(run(&[1]).await.unwrap());
        assert!(run(&[1]).await.unwrap());
        assert!(!run(&[1]).await.unwrap(), "the burst is spent");
        assert!(!run(&[1, 2]).await.unwrap(), "one bucket denies both");
        assert!(run(&[2]).await.unwrap());
        assert!(
            run(&[2]).await.unwrap(),
            "2 was not charged by the denied pair"
        );
        let _ = ids;

        coordinator.set_bounds(Bounds {
            max_buckets: 2,
            max_buckets_per_proxy: 1,
        });
        assert!(matches!(run(&[3]).await, Err(ChargeError::Full)));
    }
}
