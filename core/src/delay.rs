//! A worker's delay queue (`on_limit: delay`): requests whose tokens were reserved ahead
//! wait here until they are due, then pass in the order they are due (first come, first
//! served: a later arrival of the same bucket is always due later).
//!
//! Bounds, checked before a request is charged ([`DelayQueue::has_room`]), so a request
//! that finds no room is refused like any over-limit request and reserves nothing:
//! at most `per_key` requests of one client of a rule, at most `per_worker` of one rule,
//! and at most [`MAX_WAITERS`] over all rules of a worker. Memory is proportional to the
//! requests waiting, never to the keys ever seen: a key's count goes when its last
//! request leaves.
//!
//! A waiter leaves once: when it is due ([`DelayQueue::take_due`]) or when its stream
//! ends first ([`DelayQueue::cancel`]); the other then finds nothing. Pure: the caller
//! passes the time, and resumes or refunds what leaves.

use std::collections::{BTreeMap, HashMap};

use smallvec::SmallVec;

use crate::limiter::{LimiterCounters, SlotTable};
use crate::rule::{DelayPolicy, MAX_QUEUE_PER_WORKER};
use crate::store::SharedStore;
use crate::time::Nanos;
use crate::tokens::TokenChange;

/// The most requests one worker holds waiting, over every rule.
pub const MAX_WAITERS: u32 = MAX_QUEUE_PER_WORKER;

/// What a waiting request counts against: one client key of one delaying rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueKey {
    /// The rule's [`DelayPolicy::rule`].
    pub rule: u64,
    /// The client's fingerprint under that rule.
    pub client: u64,
}

/// One request waiting for its tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiter {
    /// The host's id of the request (its HTTP context).
    pub context: u32,
    /// When it was queued.
    pub queued_at: Nanos,
    /// When its tokens are due: it must not pass earlier.
    pub due: Nanos,
    /// What it counts against (one per delaying rule that made it wait).
    pub keys: SmallVec<[QueueKey; 1]>,
}

impl Waiter {
    /// The wait it was computed to have.
    pub fn wait_ns(&self) -> u64 {
        self.due.get().saturating_sub(self.queued_at.get())
    }
}

/// What an admitted request that must wait took, for the queue and for a refund.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delayed {
    /// How long it waits: it passes at the decision's `now` plus this, or later.
    pub wait_ns: u64,
    /// What it counts against in the queue: each delaying rule whose own tokens made it
    /// wait.
    pub keys: SmallVec<[QueueKey; 1]>,
    /// What its rules' request limits took in the slot table, given back when it gives up
    /// before it passes. (Token limits are given back by its token reservation, which
    /// every request that ends before its response refunds.)
    pub refunds: SmallVec<[Refund; 1]>,
}

/// The request limits one rule charged for one client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refund {
    pub fingerprint: u64,
    pub changes: SmallVec<[TokenChange; 2]>,
}

impl Delayed {
    /// Gives back what the request took: it gave up while it waited. Returns the buckets
    /// that could not be written (their charge stands, erring toward limiting).
    pub fn refund(
        &self,
        table: &SlotTable,
        store: &impl SharedStore,
        now: Nanos,
        counters: &mut LimiterCounters,
    ) -> u32 {
        let mut failures = 0;
        for refund in &self.refunds {
            if table
                .settle(store, now, refund.fingerprint, &refund.changes, counters)
                .is_err()
            {
                failures += 1;
            }
        }
        failures
    }
}

/// How long a request of `client` under `policy` (`None`: the rule refuses, or runs in
/// shadow mode for this client) may be made to wait: `None` to refuse, zero while the
/// worker's `queue` has no room for it.
pub fn allowance(
    policy: Option<DelayPolicy>,
    client: u64,
    queue: Option<&DelayQueue>,
) -> Option<u64> {
    let policy = policy?;
    let room = queue.is_some_and(|q| q.has_room(&policy, client));
    Some(if room { policy.max_delay_ns } else { 0 })
}

/// One worker's waiting requests, by due time.
#[derive(Debug, Default)]
pub struct DelayQueue {
    /// By due time, then arrival: the order they pass in.
    by_due: BTreeMap<(Nanos, u64), Waiter>,
    /// Where each request's entry is, by context id.
    by_context: HashMap<u32, (Nanos, u64)>,
    per_client: HashMap<(u64, u64), u32>,
    per_rule: HashMap<u64, u32>,
    arrivals: u64,
}

impl DelayQueue {
    /// Requests waiting.
    pub fn len(&self) -> usize {
        self.by_due.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_due.is_empty()
    }

    /// Whether one more request of `client` under `policy` may wait.
    pub fn has_room(&self, policy: &DelayPolicy, client: u64) -> bool {
        let waiting = |n: Option<&u32>| n.copied().unwrap_or(0);
        self.by_due.len() < MAX_WAITERS as usize
            && waiting(self.per_rule.get(&policy.rule)) < policy.per_worker.get()
            && waiting(self.per_client.get(&(policy.rule, client))) < policy.per_key.get()
    }

    /// Queues request `context`, due at `due`. The caller checked [`Self::has_room`] for
    /// each of its keys before charging it; a context already queued is replaced (it
    /// cannot be: each request is decided once).
    pub fn push(&mut self, context: u32, queued_at: Nanos, due: Nanos, keys: &[QueueKey]) {
        self.cancel(context);
        self.arrivals += 1;
        let at = (due, self.arrivals);
        for key in keys {
            *self.per_rule.entry(key.rule).or_default() += 1;
            *self.per_client.entry((key.rule, key.client)).or_default() += 1;
        }
        self.by_context.insert(context, at);
        self.by_due.insert(
            at,
            Waiter {
                context,
                queued_at,
                due,
                keys: keys.iter().copied().collect(),
            },
        );
    }

    /// Removes request `context` (its stream ended while it waited): `None` when it is
    /// not waiting (it already passed, or never waited).
    pub fn cancel(&mut self, context: u32) -> Option<Waiter> {
        let at = self.by_context.remove(&context)?;
        let waiter = self.by_due.remove(&at)?;
        self.uncount(&waiter);
        Some(waiter)
    }

    /// Removes and returns every request due by `now`, in the order they are due.
    pub fn take_due(&mut self, now: Nanos) -> Vec<Waiter> {
        let mut due = Vec::new();
        while let Some(entry) = self.by_due.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let waiter = entry.remove();
            self.by_context.remove(&waiter.context);
            self.uncount(&waiter);
            due.push(waiter);
        }
        due
    }

    /// When the first waiter is due.
    pub fn next_due(&self) -> Option<Nanos> {
        self.by_due.keys().next().map(|(due, _)| *due)
    }

    fn uncount(&mut self, waiter: &Waiter) {
        for key in &waiter.keys {
            decrement(&mut self.per_rule, key.rule);
            decrement(&mut self.per_client, (key.rule, key.client));
        }
    }
}

/// One fewer; the entry goes at zero, so the maps hold only keys with waiters.
fn decrement<K: std::hash::Hash + Eq>(counts: &mut HashMap<K, u32>, key: K) {
    if let Some(n) = counts.get_mut(&key) {
        *n -= 1;
        if *n == 0 {
            counts.remove(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;

    use super::*;

    fn policy(rule: u64, per_key: u32, per_worker: u32) -> DelayPolicy {
        DelayPolicy {
            max_delay_ns: 1_000_000_000,
            per_key: NonZeroU32::new(per_key).unwrap(),
            per_worker: NonZeroU32::new(per_worker).unwrap(),
            rule,
        }
    }

    fn key(rule: u64, client: u64) -> QueueKey {
        QueueKey { rule, client }
    }

    fn ms(n: u64) -> Nanos {
        Nanos::new(n * 1_000_000)
    }

    /// Queues `context` if there is room for all its keys, as the decision does.
    fn admit(q: &mut DelayQueue, p: &DelayPolicy, context: u32, client: u64, due: u64) -> bool {
        let room = q.has_room(p, client);
        if room {
            q.push(context, ms(0), ms(due), &[key(p.rule, client)]);
        }
        room
    }

    #[test]
    fn waiters_pass_in_due_order_once_each_and_never_early() {
        let mut q = DelayQueue::default();
        let p = policy(1, 10, 10);
        for (context, due) in [(2, 30), (3, 10), (4, 20), (5, 20)] {
            assert!(admit(&mut q, &p, context, 7, due));
        }
        assert!(q.take_due(ms(9)).is_empty(), "none is due before 10 ms");
        assert_eq!(q.next_due(), Some(ms(10)));
        let passed: Vec<u32> = q.take_due(ms(20)).iter().map(|w| w.context).collect();
        // Equal due times pass in arrival order.
        assert_eq!(passed, [3, 4, 5]);
        assert!(q.take_due(ms(20)).is_empty(), "nothing passes twice");
        let last = q.take_due(ms(1_000));
        assert_eq!(last.len(), 1);
        assert_eq!((last[0].context, last[0].wait_ns()), (2, 30_000_000));
        assert!(q.is_empty());
    }

    #[test]
    fn the_key_bound_holds_and_frees_as_waiters_leave() {
        let mut q = DelayQueue::default();
        let p = policy(1, 2, 100);
        assert!(admit(&mut q, &p, 2, 7, 10));
        assert!(admit(&mut q, &p, 3, 7, 20));
        assert!(!admit(&mut q, &p, 4, 7, 30), "a third of key 7 is over");
        assert!(admit(&mut q, &p, 4, 8, 30), "another key has its own room");
        q.take_due(ms(10));
        assert!(admit(&mut q, &p, 5, 7, 40), "room again once one passed");
        assert!(!admit(&mut q, &p, 6, 7, 40));
        q.cancel(3);
        assert!(admit(&mut q, &p, 6, 7, 40), "room again once one gave up");
    }

    #[test]
    fn the_rule_bound_holds_across_keys_and_other_rules_keep_theirs() {
        let mut q = DelayQueue::default();
        let p = policy(1, 10, 3);
        for (context, client) in [(2, 1), (3, 2), (4, 3)] {
            assert!(admit(&mut q, &p, context, client, 10));
        }
        assert!(!admit(&mut q, &p, 5, 4, 10), "a fourth of the rule is over");
        let other = policy(2, 10, 3);
        assert!(admit(&mut q, &other, 5, 4, 10));
        assert_eq!(q.len(), 4);
    }

    #[test]
    fn the_worker_bound_holds_over_every_rule() {
        let mut q = DelayQueue::default();
        let cap = MAX_QUEUE_PER_WORKER;
        for i in 0..MAX_WAITERS {
            // Rules of their own, so only the worker's bound is in play.
            let p = policy(u64::from(i % 2), cap, cap);
            assert!(admit(&mut q, &p, i, u64::from(i), 10), "waiter {i}");
        }
        let fresh = policy(99, 1, 1);
        assert!(!q.has_room(&fresh, 1), "the worker is full");
        q.cancel(0);
        assert!(q.has_room(&fresh, 1));
    }

    #[test]
    fn a_cancelled_waiter_leaves_no_count_and_never_passes() {
        let mut q = DelayQueue::default();
        let p = policy(1, 1, 1);
        assert!(admit(&mut q, &p, 2, 7, 10));
        let gone = q.cancel(2).unwrap();
        assert_eq!(gone.keys.as_slice(), [key(1, 7)]);
        assert_eq!(q.cancel(2), None, "cancelled once");
        assert!(q.take_due(ms(1_000)).is_empty());
        assert!(q.per_client.is_empty() && q.per_rule.is_empty() && q.by_context.is_empty());
        // A waiter that passed cannot be cancelled afterwards (its stream's end).
        assert!(admit(&mut q, &p, 3, 7, 10));
        assert_eq!(q.take_due(ms(10)).len(), 1);
        assert_eq!(q.cancel(3), None);
    }

    #[test]
    fn a_flood_of_keys_leaves_nothing_behind_once_they_pass() {
        let mut q = DelayQueue::default();
        let p = policy(1, 1, MAX_QUEUE_PER_WORKER);
        let mut admitted = 0;
        for i in 0..100_000u32 {
            admitted += u32::from(admit(&mut q, &p, i, u64::from(i), u64::from(i % 50)));
        }
        assert_eq!(admitted, MAX_QUEUE_PER_WORKER, "bounded, whatever the keys");
        assert_eq!(q.take_due(ms(50)).len(), MAX_QUEUE_PER_WORKER as usize);
        assert!(q.per_client.is_empty() && q.per_rule.is_empty() && q.by_context.is_empty());
    }
}
