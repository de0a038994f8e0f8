//! An elastic rule's pool in the slot table (`crate::rule::ElasticPool`): read before a
//! request's buckets are charged, to say whether a client over its limit may pass, and
//! charged after, for every request the rule admitted.

use super::SlotTable;
use super::placement::Placement;
use crate::bucket::{LimiterCounters, LimiterFailure};
use crate::rule::ElasticPool;
use crate::store::SharedStore;
use crate::time::Nanos;
use crate::tokens::TokenChange;

impl SlotTable {
    /// Whether `pool` has room for `cost` at `now`, so that a client over its limit may
    /// pass; writes nothing to the pool. A pool that cannot be read is taken as closed
    /// (the strict limit) and counted.
    pub fn pool_open(
        &self,
        store: &impl SharedStore,
        now: Nanos,
        pool: &ElasticPool,
        cost: u64,
        counters: &mut LimiterCounters,
    ) -> bool {
        let read = self.pool_has_room(store, now, pool, cost, counters);
        counters.pool_failures += u32::from(read.is_err());
        read.unwrap_or(false)
    }

    fn pool_has_room(
        &self,
        store: &impl SharedStore,
        now: Nanos,
        pool: &ElasticPool,
        cost: u64,
        counters: &mut LimiterCounters,
    ) -> Result<bool, LimiterFailure> {
        let located = self.probes.locate(store, now, pool.fingerprint, counters)?;
        let tat = match located.placement {
            Placement::Owned | Placement::Shared => located.value.tat_of(pool.limit.identity),
            // No slot holds the pool: it was never charged, or was full and reclaimed.
            Placement::Claimed => None,
        };
        let tat = Nanos::new(tat.unwrap_or(0));
        Ok(pool.limit.gcra.check(tat, now, cost).allowed)
    }

    /// Charges `cost` to `pool` for a request the rule admitted: into a debt of at most
    /// one burst when it has no room (`crate::gcra::Gcra::charge_debt`), so the pool
    /// measures the rule's admitted traffic, within its limits or over them. A charge
    /// that fails is counted; the pool then errs toward lending more.
    pub fn charge_pool(
        &self,
        store: &impl SharedStore,
        now: Nanos,
        pool: &ElasticPool,
        cost: u64,
        counters: &mut LimiterCounters,
    ) {
        let change = TokenChange {
            limit: pool.limit,
            reserved: 0,
            used: cost,
        };
        let charged = self.settle(store, now, pool.fingerprint, &[change], counters);
        counters.pool_failures += u32::from(charged.is_err());
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::*;
    use crate::bucket::{BucketRequest, BucketResult};
    use crate::store::MemoryStore;
    use crate::time::NANOS_PER_SECOND;

    fn pool(requests: u64, burst: u64) -> ElasticPool {
        ElasticPool {
            limit: limit(77, requests, 1, burst),
            fingerprint: 9_999,
        }
    }

    #[test]
    fn a_pool_never_charged_has_room_and_reading_it_writes_nothing() {
        let (t, store) = (table(64), MemoryStore::new());
        let mut counters = LimiterCounters::default();
        let now = Nanos::new(T0);
        for _ in 0..100 {
            assert!(t.pool_open(&store, now, &pool(10, 5), 1, &mut counters));
        }
        assert!(!t.pool_open(&store, now, &pool(10, 5), 6, &mut counters));
    }

    #[test]
    fn charges_close_the_pool_at_its_burst_and_time_reopens_it() {
        let (t, store) = (table(64), MemoryStore::new());
        let mut counters = LimiterCounters::default();
        let (p, now) = (pool(10, 5), Nanos::new(T0));
        for charged in 0..5 {
            assert!(t.pool_open(&store, now, &p, 1, &mut counters), "{charged}");
            t.charge_pool(&store, now, &p, 1, &mut counters);
        }
        assert!(!t.pool_open(&store, now, &p, 1, &mut counters));
        // One request's worth refills in a tenth of a second, not before.
        let almost = Nanos::new(T0 + NANOS_PER_SECOND / 10 - 1);
        assert!(!t.pool_open(&store, almost, &p, 1, &mut counters));
        let then = Nanos::new(T0 + NANOS_PER_SECOND / 10);
        assert!(t.pool_open(&store, then, &p, 1, &mut counters));
    }

    #[test]
    fn charges_beyond_the_burst_are_a_debt_of_at_most_one_burst() {
        let (t, store) = (table(64), MemoryStore::new());
        let mut counters = LimiterCounters::default();
        let (p, now) = (pool(10, 5), Nanos::new(T0));
        // Within-limit traffic far above the ceiling: 100 charges into a 5-request pool.
        for _ in 0..100 {
            t.charge_pool(&store, now, &p, 1, &mut counters);
        }
        // Full debt: one burst (5) to pay back, then the burst itself (5) to spend, at
        // 10 a second: room for one again after 0.6 s, not after 0.5 s.
        let shut = Nanos::new(T0 + NANOS_PER_SECOND / 2);
        assert!(!t.pool_open(&store, shut, &p, 1, &mut counters));
        let open = Nanos::new(T0 + 6 * NANOS_PER_SECOND / 10);
        assert!(t.pool_open(&store, open, &p, 1, &mut counters));
    }

    #[test]
    fn a_pool_that_cannot_be_read_is_closed_and_a_failed_charge_is_counted() {
        let (t, store) = (table(64), MemoryStore::new());
        let mut counters = LimiterCounters::default();
        let (p, now) = (pool(10, 5), Nanos::new(T0));
        store.inject_failures(1);
        assert!(!t.pool_open(&store, now, &p, 1, &mut counters));
        assert_eq!(counters.pool_failures, 1);
        store.inject_failures(1);
        t.charge_pool(&store, now, &p, 1, &mut counters);
        assert_eq!(counters.pool_failures, 2);
        // Nothing was charged: the pool still holds its five.
        let open = (0..5).filter(|_| {
            let open = t.pool_open(&store, now, &p, 1, &mut counters);
            t.charge_pool(&store, now, &p, 1, &mut counters);
            open
        });
        assert_eq!(open.count(), 5);
        assert!(!t.pool_open(&store, now, &p, 1, &mut counters));
        assert_eq!(counters.pool_failures, 2);
    }

    #[test]
    fn an_open_pool_lets_a_client_over_its_limit_pass_warned_and_leaves_its_bucket_alone() {
        let (t, store) = (table(64), MemoryStore::new());
        let limits = [limit(1, 2, 1, 2)];
        let now = Nanos::new(T0);
        assert_eq!(admitted(&t, &store, T0, &[bucket(5, &limits)], 10), 2);
        let open = BucketRequest {
            elastic_open: true,
            ..bucket(5, &limits)
        };
        for _ in 0..10 {
            let outcome = t.acquire(&store, now, &[open]);
            assert!(outcome.allowed);
            assert!(matches!(
                outcome.buckets[0],
                BucketResult::Allowed { warned: 1, .. }
            ));
        }
        // The client's own bucket was not charged by the passes over it: it refills as if
        // they never happened (one token after half a second).
        let later = T0 + NANOS_PER_SECOND / 2;
        assert_eq!(admitted(&t, &store, later, &[bucket(5, &limits)], 10), 1);
    }
}
