//! Charging buckets in the shared slot table: compare-and-swap, all-or-nothing.
//!
//! A client's bucket goes in a slot of a fixed table of numbered shared-data keys: the
//! one it owns, else the first vacant or idle one, else the most drained one, shared
//! (`placement.rs`).
//!
//! A request's buckets are charged all-or-nothing: every bucket is read and checked
//! first, so a denial writes nothing; then each is written with compare-and-swap. If a
//! race makes a later bucket deny after earlier ones were charged, those charges are
//! refunded. Retries are bounded; running out is a typed failure that the rule's
//! failure mode turns into an allow or a deny.
//!
//! A denial is remembered for the wait it reported ([`RememberedDenials`]), so a client
//! that keeps knocking is denied again without a shared-data read until then.

mod elastic;
mod placement;

use std::num::NonZeroU32;

use smallvec::SmallVec;

use crate::bucket::INLINE_BUCKETS;
use crate::denials::RememberedDenials;
use crate::gcra::Verdict;
use crate::slot::SlotValue;
use crate::spec::FailureMode;
use crate::store::{MAX_WRITE_ATTEMPTS, SharedStore, WriteCondition, WriteOutcome};
use crate::time::Nanos;
use crate::tokens::TokenChange;
use placement::{Placement, ProbeSequence};

// The words of charging are the `bucket` module's; they keep their paths here too.
pub use crate::bucket::{
    BucketRequest, BucketResult, LimiterCounters, LimiterFailure, TierVerdict,
};
pub use placement::MAX_PROBES;

/// The fixed-size table of bucket slots, as one worker uses it: with the denials it
/// remembers.
#[derive(Debug, Clone)]
pub struct SlotTable {
    probes: ProbeSequence,
    denials: RememberedDenials,
}

/// One result per bucket set of a request.
pub type Buckets = SmallVec<[BucketResult; INLINE_BUCKETS]>;

/// The result of [`SlotTable::acquire`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acquisition {
    /// Whether every bucket set allowed the request (or failed open).
    pub allowed: bool,
    /// One result per request, in order.
    pub buckets: Buckets,
    pub counters: LimiterCounters,
    /// For an allowed request whose tokens were reserved ahead: how long it must wait
    /// before it passes. Zero otherwise.
    pub wait_ns: u64,
}

/// Phase 1's results: one per set so far, the plans to write, and each set's own wait.
#[derive(Default)]
struct Checked {
    buckets: Buckets,
    plans: SmallVec<[Option<Plan>; INLINE_BUCKETS]>,
    waits: SmallVec<[u64; INLINE_BUCKETS]>,
}

impl Acquisition {
    /// A denial decided before anything was written; buckets not looked at are `Skipped`.
    fn denied(mut buckets: Buckets, len: usize, counters: LimiterCounters) -> Self {
        buckets.resize(len, BucketResult::Skipped);
        Acquisition {
            allowed: false,
            buckets,
            counters,
            wait_ns: 0,
        }
    }
}

/// A bucket set read and checked, ready to be written.
#[derive(Debug, Clone, Copy)]
struct Plan {
    slot: u32,
    condition: WriteCondition,
    next: SlotValue,
    result: PlanResult,
}

#[derive(Debug, Clone, Copy)]
enum PlanResult {
    /// The tightest limit, how long the request must wait (zero: not at all), and the
    /// soft limits it was admitted over (a bit per tier: [`BucketResult::Allowed`]).
    Allowed(TierVerdict, u64, u8),
    Denied(TierVerdict),
}

impl SlotTable {
    pub fn new(slots: NonZeroU32) -> Self {
        Self {
            probes: ProbeSequence::new(slots),
            denials: RememberedDenials::default(),
        }
    }

    pub fn slots(&self) -> u32 {
        self.probes.slots()
    }

    /// Charges `cost` to every bucket set of `requests`, or to none of them.
    ///
    /// A set that may delay ([`BucketRequest::max_delay_ns`]) and whose tokens are due
    /// within its delay makes the request wait ([`Acquisition::wait_ns`]); then every
    /// set is checked and charged as of the instant the request will pass, so no limit
    /// of the request sees it earlier than its upstream does.
    pub fn acquire(
        &self,
        store: &impl SharedStore,
        now: Nanos,
        requests: &[BucketRequest<'_>],
    ) -> Acquisition {
        let mut counters = LimiterCounters::default();
        // Phase 1: read and check everything. The common denial ends here, unwritten;
        // a denial still standing ends it before any read.
        let mut first = Checked::default();
        if !self.check_all(store, (now, now), requests, &mut counters, &mut first) {
            return Acquisition::denied(first.buckets, requests.len(), counters);
        }
        let waits = first.waits.clone();
        let wait_ns = waits.iter().copied().max().unwrap_or(0);
        let (
            Checked {
                mut buckets, plans, ..
            },
            at,
        ) = if wait_ns == 0 {
            (first, now)
        } else {
            // Checked again as of the pass, with no further delay: a race that pushed
            // a bucket later in between is refused rather than passed early.
            let at = now.saturating_add(Nanos::new(wait_ns));
            let mut again = Checked::default();
            if !self.check_all(store, (now, at), requests, &mut counters, &mut again) {
                return Acquisition::denied(again.buckets, requests.len(), counters);
            }
            (again, at)
        };
        // Phase 2: write each plan with compare-and-swap, re-planning on conflicts.
        let mut committed: SmallVec<[(&BucketRequest<'_>, u32, u8); INLINE_BUCKETS]> =
            SmallVec::new();
        let mut allowed = true;
        let planned = requests.iter().zip(plans).zip(waits);
        for (((request, plan), own_wait), result) in planned.zip(buckets.iter_mut()) {
            let Some(plan) = plan else { continue };
            let (outcome, slot) = self.commit(store, now, at, request, plan, &mut counters);
            *result = match outcome {
                Ok(PlanResult::Allowed(tightest, _, warned)) => {
                    committed.push((request, slot, warned));
                    BucketResult::Allowed {
                        tightest,
                        wait_ns: own_wait,
                        warned,
                    }
                }
                Ok(PlanResult::Denied(binding)) => {
                    allowed = false;
                    self.remember(request, now, binding);
                    BucketResult::Denied { binding }
                }
                Err(failure) => {
                    allowed &= request.on_failure == FailureMode::Open;
                    fail(request.on_failure, failure)
                }
            };
            if !allowed {
                break;
            }
        }
        if !allowed {
            for (request, slot, warned) in committed {
                self.refund(store, now, slot, (request, warned), &mut counters);
            }
        }
        Acquisition {
            allowed,
            buckets,
            counters,
            wait_ns: if allowed { wait_ns } else { 0 },
        }
    }

    /// Phase 1: reads and checks every set as of `at` (`now`, or the instant a waiting
    /// request will pass: then no set may delay it further) into `checked`. `false`: a
    /// set decided a denial, and `checked` holds the results up to it.
    fn check_all(
        &self,
        store: &impl SharedStore,
        (now, at): (Nanos, Nanos),
        requests: &[BucketRequest<'_>],
        counters: &mut LimiterCounters,
        checked: &mut Checked,
    ) -> bool {
        let first_pass = at == now;
        for request in requests {
            let standing = request
                .uniform_cost()
                .filter(|_| first_pass)
                .and_then(|cost| self.denials.standing(request.fingerprint, cost, now));
            if let Some(binding) = standing {
                counters.remembered_denials += 1;
                checked.buckets.push(BucketResult::Denied { binding });
                return false;
            }
            match self.plan(store, now, at, request, counters) {
                Ok(Plan {
                    result: PlanResult::Denied(binding),
                    ..
                }) => {
                    if first_pass {
                        self.remember(request, now, binding);
                    }
                    checked.buckets.push(BucketResult::Denied { binding });
                    return false;
                }
                Ok(plan) => {
                    // Stays `Skipped` until phase 2 writes it.
                    checked.buckets.push(BucketResult::Skipped);
                    checked.waits.push(match plan.result {
                        PlanResult::Allowed(_, wait, _) => wait,
                        PlanResult::Denied(_) => 0,
                    });
                    checked.plans.push(Some(plan));
                }
                Err(failure) => {
                    checked.buckets.push(fail(request.on_failure, failure));
                    if request.on_failure == FailureMode::Closed {
                        return false;
                    }
                    checked.waits.push(0);
                    checked.plans.push(None);
                }
            }
        }
        true
    }

    /// Remembers a denial of a bucket set whose limits all charge one cost.
    fn remember(&self, request: &BucketRequest<'_>, now: Nanos, binding: TierVerdict) {
        if let Some(cost) = request.uniform_cost() {
            self.denials
                .remember(request.fingerprint, cost, now, binding);
        }
    }

    /// Writes `plan`, re-reading and re-checking after each lost race. Returns the final
    /// result and the slot it was written to.
    fn commit(
        &self,
        store: &impl SharedStore,
        now: Nanos,
        at: Nanos,
        request: &BucketRequest<'_>,
        mut plan: Plan,
        counters: &mut LimiterCounters,
    ) -> (Result<PlanResult, LimiterFailure>, u32) {
        for _ in 0..MAX_WRITE_ATTEMPTS {
            let (buf, len) = plan.next.to_bytes();
            let bytes = buf.get(..len).unwrap_or_default();
            match store.write(plan.slot, bytes, plan.condition) {
                Ok(WriteOutcome::Written) => return (Ok(plan.result), plan.slot),
                Ok(WriteOutcome::Conflict) => counters.cas_conflicts += 1,
                Err(e) => return (Err(LimiterFailure::Store(e)), plan.slot),
            }
            match self.plan(store, now, at, request, counters) {
                Ok(p) if matches!(p.result, PlanResult::Denied(_)) => {
                    return (Ok(p.result), p.slot);
                }
                // The race moved this bucket's tokens later than the request's other
                // sets were planned for: refused rather than passed early.
                Ok(Plan {
                    result: PlanResult::Allowed(tier, wait @ 1.., _),
                    slot,
                    ..
                }) => {
                    let verdict = Verdict {
                        allowed: false,
                        retry_after_ns: wait,
                        ..tier.verdict
                    };
                    return (
                        Ok(PlanResult::Denied(TierVerdict { verdict, ..tier })),
                        slot,
                    );
                }
                Ok(p) => plan = p,
                Err(e) => return (Err(e), plan.slot),
            }
        }
        (Err(LimiterFailure::Contention), plan.slot)
    }

    /// Reads the client's slot and checks every limit against it as of `at`: `now`, when
    /// a set that delays may reserve ahead, or the instant a waiting request will pass,
    /// when none may delay it further.
    fn plan(
        &self,
        store: &impl SharedStore,
        now: Nanos,
        at: Nanos,
        request: &BucketRequest<'_>,
        counters: &mut LimiterCounters,
    ) -> Result<Plan, LimiterFailure> {
        let located = self
            .probes
            .locate(store, now, request.fingerprint, counters)?;
        let mut next = match located.placement {
            Placement::Owned | Placement::Shared => located.value,
            // The slot's mark is about the clients whose search starts here: it stays.
            Placement::Claimed => {
                let mut claimed = SlotValue::owned_by(request.fingerprint);
                claimed.displaced = located.value.displaced;
                claimed
            }
        };
        if located.placement == Placement::Shared {
            counters.shared_slots += 1;
        }
        let mut tightest: Option<TierVerdict> = None;
        let mut binding: Option<TierVerdict> = None;
        // Per tier, the TATs to store: the limit's own bucket's and a soft limit's margin's.
        let mut new_tats = [(None, None); crate::rule::MAX_LIMITS_PER_RULE];
        let mut warned = 0u8;
        let mut wait_ns = 0;
        for (tier, limit) in request.limits.iter().enumerate() {
            if limit.global {
                // Charged in the lease table by the caller, not in a slot.
                continue;
            }
            let tat = Nanos::new(next.tat_of(limit.identity).unwrap_or(0));
            let max_delay = if at == now {
                request.max_delay_ns.unwrap_or(0)
            } else {
                0
            };
            let cost = request.cost_of(limit);
            let (own, wait) = limit.gcra.check_ahead(tat, at, cost, max_delay);
            wait_ns = wait_ns.max(wait);
            let (verdict, tats) = match limit.soft {
                // Over its own limit while the rule's elastic pool has room: passes,
                // warned, its own bucket uncharged (`crate::rule::ElasticPool`).
                None if !own.allowed && request.elastic_open && !limit.counts.is_tokens() => {
                    warned |= 1 << tier;
                    (admitted_over(own, own.new_tat), (None, None))
                }
                None => (own, (Some(own.new_tat), None)),
                Some(margin) => {
                    let margin_tat = Nanos::new(next.tat_of(margin.identity).unwrap_or(0));
                    let checked = check_soft(own, margin.gcra.check(margin_tat, at, cost));
                    if checked.warned {
                        warned |= 1 << tier;
                    }
                    (checked.verdict, checked.tats)
                }
            };
            let tv = TierVerdict { tier, verdict };
            if verdict.allowed {
                if tightest.is_none_or(|t| tighter(&tv, &t)) {
                    tightest = Some(tv);
                }
            } else if binding.is_none_or(|b| verdict.retry_after_ns > b.verdict.retry_after_ns) {
                binding = Some(tv);
            }
            if let Some(t) = new_tats.get_mut(tier) {
                *t = tats;
            }
        }
        let condition = located
            .cas
            .map_or(WriteCondition::Absent, WriteCondition::Unchanged);
        let result = match (binding, tightest) {
            (Some(b), _) => PlanResult::Denied(b),
            (None, Some(t)) => {
                next.drop_full(now.get());
                for (limit, (own, margin)) in request.limits.iter().zip(new_tats) {
                    let margin = limit.soft.zip(margin).map(|(m, tat)| (m.identity, tat));
                    let own = own.map(|tat| (limit.identity, tat));
                    for (identity, tat) in own.into_iter().chain(margin) {
                        if next.set(identity, tat.get(), now.get()) {
                            counters.evictions += 1;
                        }
                    }
                }
                PlanResult::Allowed(t, wait_ns, warned)
            }
            // Validation guarantees at least one limit, but an empty set must not
            // panic: it admits everything.
            (None, None) => PlanResult::Allowed(
                TierVerdict {
                    tier: 0,
                    verdict: Verdict {
                        allowed: true,
                        new_tat: now,
                        remaining: u64::MAX,
                        reset_ns: 0,
                        retry_after_ns: 0,
                    },
                },
                0,
                0,
            ),
        };
        Ok(Plan {
            slot: located.slot,
            condition,
            next,
            result,
        })
    }

    /// Gives back what `request` took from `slot`, with bounded retries: every limit's
    /// own bucket but those of the soft limits it was `warned` over (never charged), and
    /// every soft limit's margin. A failed refund errs toward limiting and is counted.
    fn refund(
        &self,
        store: &impl SharedStore,
        now: Nanos,
        slot: u32,
        (request, warned): (&BucketRequest<'_>, u8),
        counters: &mut LimiterCounters,
    ) {
        for _ in 0..MAX_WRITE_ATTEMPTS {
            let Ok(Some((bytes, cas))) = store.read(slot) else {
                break;
            };
            let Ok(mut value) = SlotValue::decode(&bytes) else {
                break;
            };
            for (tier, limit) in request.limits.iter().enumerate() {
                let cost = request.cost_of(limit);
                let own = (warned & (1 << tier) == 0).then_some((limit.identity, limit.gcra));
                let margin = limit.soft.map(|m| (m.identity, m.gcra));
                for (identity, gcra) in own.into_iter().chain(margin) {
                    if let Some(tat) = value.tat_of(identity) {
                        let refunded = gcra.refund(Nanos::new(tat), now, cost);
                        value.set(identity, refunded.get(), now.get());
                    }
                }
            }
            let (buf, len) = value.to_bytes();
            match store.write(
                slot,
                buf.get(..len).unwrap_or_default(),
                WriteCondition::Unchanged(cas),
            ) {
                Ok(WriteOutcome::Written) => return,
                Ok(WriteOutcome::Conflict) => counters.cas_conflicts += 1,
                Err(_) => break,
            }
        }
        counters.refund_failures += 1;
    }
}

impl SlotTable {
    /// Moves token buckets of `fingerprint` from their reservation to the usage reported
    /// (a token limit's commit): unused tokens go back (never beyond full), extra ones are
    /// charged into debt of at most one burst ([`crate::gcra::Gcra::charge_debt`]). The
    /// client's slot is looked up again: it may have moved since the reservation, when a
    /// long response outlived the bucket's refill. Returns the tokens forgiven at the debt
    /// bound.
    pub fn settle(
        &self,
        store: &impl SharedStore,
        now: Nanos,
        fingerprint: u64,
        changes: &[TokenChange],
        counters: &mut LimiterCounters,
    ) -> Result<u64, LimiterFailure> {
        for _ in 0..MAX_WRITE_ATTEMPTS {
            let located = self.probes.locate(store, now, fingerprint, counters)?;
            let mut next = match located.placement {
                Placement::Owned | Placement::Shared => located.value,
                // Whatever this client held there was full and has been reclaimed: a
                // refund has nothing to give back to, extra usage starts a new bucket.
                Placement::Claimed => {
                    if changes.iter().all(|c| c.used <= c.reserved) {
                        return Ok(0);
                    }
                    let mut claimed = SlotValue::owned_by(fingerprint);
                    claimed.displaced = located.value.displaced;
                    claimed
                }
            };
            next.drop_full(now.get());
            let mut forgiven = 0;
            for change in changes {
                let tat = Nanos::new(next.tat_of(change.limit.identity).unwrap_or(0));
                let gcra = &change.limit.gcra;
                let new_tat = if change.used < change.reserved {
                    gcra.refund(tat, now, change.reserved - change.used)
                } else {
                    let (tat, lost) = gcra.charge_debt(tat, now, change.used - change.reserved);
                    forgiven += lost;
                    tat
                };
                if next.set(change.limit.identity, new_tat.get(), now.get()) {
                    counters.evictions += 1;
                }
            }
            let condition = located
                .cas
                .map_or(WriteCondition::Absent, WriteCondition::Unchanged);
            let (buf, len) = next.to_bytes();
            match store.write(located.slot, buf.get(..len).unwrap_or_default(), condition) {
                Ok(WriteOutcome::Written) => return Ok(forgiven),
                Ok(WriteOutcome::Conflict) => counters.cas_conflicts += 1,
                Err(e) => return Err(LimiterFailure::Store(e)),
            }
        }
        Err(LimiterFailure::Contention)
    }
}

/// A soft limit's tier, checked: its verdict, the TATs to store (its own bucket's, its
/// margin's) and whether the request is admitted over the limit.
struct SoftChecked {
    verdict: Verdict,
    tats: (Option<Nanos>, Option<Nanos>),
    warned: bool,
}

/// Decides a soft limit's tier from its own bucket's verdict and its margin's
/// (`crate::rule::SoftMargin`): the margin decides admission and is charged for every
/// admitted request; the limit's own bucket is charged only when it has room, and a
/// request it has none for is admitted warned, with nothing left (`remaining` 0).
fn check_soft(own: Verdict, margin: Verdict) -> SoftChecked {
    if !margin.allowed {
        // Denied as beyond the margin: the wait is until the margin has room again.
        return SoftChecked {
            verdict: margin,
            tats: (None, None),
            warned: false,
        };
    }
    if own.allowed {
        return SoftChecked {
            verdict: own,
            tats: (Some(own.new_tat), Some(margin.new_tat)),
            warned: false,
        };
    }
    SoftChecked {
        verdict: admitted_over(own, margin.new_tat),
        tats: (None, Some(margin.new_tat)),
        warned: true,
    }
}

/// The verdict of a request admitted over a limit whose own bucket (`own`) had no room:
/// nothing left, and the limit's own refill time.
fn admitted_over(own: Verdict, new_tat: Nanos) -> Verdict {
    Verdict {
        allowed: true,
        new_tat,
        remaining: 0,
        reset_ns: own.reset_ns,
        retry_after_ns: 0,
    }
}

fn fail(mode: FailureMode, failure: LimiterFailure) -> BucketResult {
    match mode {
        FailureMode::Open => BucketResult::FailedOpen(failure),
        FailureMode::Closed => BucketResult::FailedClosed(failure),
    }
}

/// Fewer tokens left is tighter; on a tie, the one that takes longer to refill.
fn tighter(a: &TierVerdict, b: &TierVerdict) -> bool {
    (a.verdict.remaining, std::cmp::Reverse(a.verdict.reset_ns))
        < (b.verdict.remaining, std::cmp::Reverse(b.verdict.reset_ns))
}

/// What the slot table's unit tests share.
#[cfg(test)]
mod test_support {
    use std::num::NonZeroU64;

    use super::*;
    use crate::gcra::Gcra;
    use crate::rule::Limit;
    use crate::store::MemoryStore;
    use crate::time::NANOS_PER_SECOND;

    pub(super) const T0: u64 = 1_000 * NANOS_PER_SECOND;

    pub(super) fn limit(identity: u64, requests: u64, period_s: u64, burst: u64) -> Limit {
        let nz = |v| NonZeroU64::new(v).unwrap();
        Limit {
            global: false,
            requests,
            period_seconds: period_s,
            burst,
            gcra: Gcra::new(nz(requests), nz(period_s * NANOS_PER_SECOND), nz(burst)).unwrap(),
            identity,
            counts: Default::default(),
            soft: None,
        }
    }

    pub(super) fn table(slots: u32) -> SlotTable {
        SlotTable::new(NonZeroU32::new(slots).unwrap())
    }

    pub(super) fn bucket(fingerprint: u64, limits: &[Limit]) -> BucketRequest<'_> {
        BucketRequest {
            fingerprint,
            limits,
            cost: 1,
            on_failure: FailureMode::Open,
            tokens: Default::default(),
            max_delay_ns: None,
            elastic_open: false,
        }
    }

    /// Requests admitted by the buckets themselves (not by failing open).
    pub(super) fn admitted(
        table: &SlotTable,
        store: &MemoryStore,
        now: u64,
        requests: &[BucketRequest<'_>],
        n: usize,
    ) -> usize {
        (0..n)
            .filter(|_| {
                let outcome = table.acquire(store, Nanos::new(now), requests);
                outcome.allowed
                    && outcome
                        .buckets
                        .iter()
                        .all(|b| matches!(b, BucketResult::Allowed { .. }))
            })
            .count()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::test_support::{T0, admitted, bucket, limit, table};
    use super::*;
    use crate::store::{Cas, MemoryStore, StoreError, WriteResult};
    use crate::time::NANOS_PER_SECOND;

    #[test]
    fn one_bucket_admits_its_burst_and_a_denial_writes_nothing() {
        let (t, store) = (table(64), MemoryStore::new());
        let limits = [limit(1, 5, 1, 10)];
        assert_eq!(admitted(&t, &store, T0, &[bucket(7, &limits)], 10), 10);
        let before = store.read(7).unwrap();
        let outcome = t.acquire(&store, Nanos::new(T0), &[bucket(7, &limits)]);
        assert!(!outcome.allowed);
        assert_eq!(store.read(7).unwrap(), before, "a denial must not write");
        let BucketResult::Denied { binding } = outcome.buckets[0] else {
            panic!()
        };
        assert_eq!(binding.verdict.retry_after_ns, 200_000_000);
    }

    #[test]
    fn a_throttled_client_is_denied_from_memory_until_its_wait_ends() {
        let (t, store) = (table(64), MemoryStore::new());
        let limits = [limit(1, 5, 1, 10)];
        assert_eq!(admitted(&t, &store, T0, &[bucket(7, &limits)], 10), 10);
        let first = t.acquire(&store, Nanos::new(T0), &[bucket(7, &limits)]);
        assert!(!first.allowed);
        assert_eq!(
            first.counters.remembered_denials, 0,
            "the first denial reads"
        );

        // Within the 200 ms wait: denied again without a read, the wait shortened.
        let reads = store.reads();
        let again = t.acquire(&store, Nanos::new(T0 + 50_000_000), &[bucket(7, &limits)]);
        assert!(!again.allowed);
        assert_eq!(again.counters.remembered_denials, 1);
        assert_eq!(store.reads(), reads, "no shared-data read");
        let BucketResult::Denied { binding } = again.buckets[0] else {
            panic!("{again:?}")
        };
        assert_eq!(binding.verdict.retry_after_ns, 150_000_000);

        // Once the wait is over the bucket is read again and the token it refilled is
        // admitted: remembering never denies past the wait it was told.
        let later = t.acquire(&store, Nanos::new(T0 + 200_000_000), &[bucket(7, &limits)]);
        assert!(later.allowed, "{later:?}");
        assert!(store.reads() > reads);
    }

    #[test]
    fn every_tier_must_allow_and_the_longest_wait_is_reported() {
        let (t, store) = (table(64), MemoryStore::new());
        let limits = [limit(1, 10, 1, 20), limit(2, 30, 60, 30)];
        assert_eq!(admitted(&t, &store, T0, &[bucket(3, &limits)], 25), 20);
        // After a second the per-second tier has 10 more, but the minute tier only 10.
        assert_eq!(
            admitted(&t, &store, T0 + NANOS_PER_SECOND, &[bucket(3, &limits)], 25),
            10
        );
        let outcome = t.acquire(
            &store,
            Nanos::new(T0 + 1_100_000_000),
            &[bucket(3, &limits)],
        );
        let BucketResult::Denied { binding } = outcome.buckets[0] else {
            panic!("{outcome:?}")
        };
        assert_eq!(binding.tier, 1, "the minute tier binds");
    }

    #[test]
    fn a_denial_by_one_rule_charges_no_other_rule() {
        let (t, store) = (table(64), MemoryStore::new());
        let roomy = [limit(1, 100, 1, 100)];
        let tight = [limit(2, 1, 60, 1)];
        let both = [bucket(10, &roomy), bucket(20, &tight)];
        assert_eq!(admitted(&t, &store, T0, &both, 50), 1);
        let outcome = t.acquire(&store, Nanos::new(T0), &[bucket(10, &roomy)]);
        let BucketResult::Allowed { tightest, .. } = outcome.buckets[0] else {
            panic!()
        };
        assert_eq!(
            tightest.verdict.remaining, 98,
            "only the one admitted request was charged"
        );
    }

    /// A store that lets another "worker" drain one slot just before our first write to it.
    struct RacingStore {
        inner: MemoryStore,
        victim_slot: u32,
        drained: std::sync::atomic::AtomicBool,
        drain_to: SlotValue,
    }

    impl SharedStore for RacingStore {
        fn read(&self, slot: u32) -> Result<Option<(Vec<u8>, Cas)>, StoreError> {
            self.inner.read(slot)
        }

        fn write(&self, slot: u32, value: &[u8], condition: WriteCondition) -> WriteResult {
            if slot == self.victim_slot
                && !self.drained.swap(true, std::sync::atomic::Ordering::SeqCst)
            {
                let mut bytes = Vec::new();
                self.drain_to.encode(&mut bytes);
                let current = self.inner.read(slot)?.map(|(_, cas)| cas);
                let cond = current.map_or(WriteCondition::Absent, WriteCondition::Unchanged);
                assert_eq!(self.inner.write(slot, &bytes, cond)?, WriteOutcome::Written);
            }
            self.inner.write(slot, value, condition)
        }
    }

    #[test]
    fn a_race_that_flips_a_later_bucket_to_deny_refunds_the_earlier_ones() {
        let t = table(64);
        let first = [limit(1, 10, 1, 10)];
        let second = [limit(2, 1, 60, 1)];
        let mut drained = SlotValue::owned_by(20);
        drained.set(2, T0 + 60 * NANOS_PER_SECOND, T0);
        let store = RacingStore {
            inner: MemoryStore::new(),
            victim_slot: 20,
            drained: false.into(),
            drain_to: drained,
        };
        let outcome = t.acquire(
            &store,
            Nanos::new(T0),
            &[bucket(10, &first), bucket(20, &second)],
        );
        assert!(!outcome.allowed);
        assert!(matches!(outcome.buckets[1], BucketResult::Denied { .. }));
        assert!(outcome.counters.cas_conflicts >= 1);
        let (bytes, _) = store.inner.read(10).unwrap().unwrap();
        let value = SlotValue::decode(&bytes).unwrap();
        assert!(
            value.tat_of(1).is_none_or(|tat| tat <= T0),
            "the first bucket was refunded: {value:?}"
        );
    }

    #[test]
    fn conflicts_are_retried_and_endless_contention_fails_by_the_rules_mode() {
        let (t, store) = (table(64), MemoryStore::new());
        let limits = [limit(1, 10, 1, 10)];
        store.inject_conflicts(3);
        let outcome = t.acquire(&store, Nanos::new(T0), &[bucket(5, &limits)]);
        assert!(outcome.allowed);
        assert_eq!(outcome.counters.cas_conflicts, 3);

        store.inject_conflicts(MAX_WRITE_ATTEMPTS);
        let outcome = t.acquire(&store, Nanos::new(T0), &[bucket(5, &limits)]);
        assert!(outcome.allowed);
        assert_eq!(
            outcome.buckets[0],
            BucketResult::FailedOpen(LimiterFailure::Contention)
        );

        store.inject_conflicts(MAX_WRITE_ATTEMPTS);
        let closed = BucketRequest {
            on_failure: FailureMode::Closed,
            ..bucket(5, &limits)
        };
        let outcome = t.acquire(&store, Nanos::new(T0), &[closed]);
        assert!(!outcome.allowed);
        assert_eq!(
            outcome.buckets[0],
            BucketResult::FailedClosed(LimiterFailure::Contention)
        );
    }

    #[test]
    fn host_errors_fail_open_or_closed() {
        let (t, store) = (table(64), MemoryStore::new());
        let limits = [limit(1, 10, 1, 10)];
        store.inject_failures(1);
        assert!(matches!(
            t.acquire(&store, Nanos::new(T0), &[bucket(5, &limits)])
                .buckets[0],
            BucketResult::FailedOpen(_)
        ));
        store.inject_failures(1);
        let closed = BucketRequest {
            on_failure: FailureMode::Closed,
            ..bucket(5, &limits)
        };
        assert!(!t.acquire(&store, Nanos::new(T0), &[closed]).allowed);
    }

    #[test]
    fn concurrent_workers_never_admit_more_than_the_burst() {
        let t = table(64);
        let store = Arc::new(MemoryStore::new());
        let limits = Arc::new([limit(1, 1, 3_600, 100)]);
        let workers: Vec<_> = (0..4)
            .map(|_| {
                // Each worker its own table (and memory of denials), one store.
                let (store, limits, t) = (Arc::clone(&store), Arc::clone(&limits), t.clone());
                std::thread::spawn(move || {
                    let mut counts = (0, 0, 0);
                    for _ in 0..100 {
                        match t
                            .acquire(&*store, Nanos::new(T0), &[bucket(9, &limits[..])])
                            .buckets[0]
                        {
                            BucketResult::Allowed { .. } => counts.0 += 1,
                            BucketResult::Denied { .. } => counts.1 += 1,
                            _ => counts.2 += 1,
                        }
                    }
                    counts
                })
            })
            .collect();
        let (mut allowed, mut denied, mut failed) = (0, 0, 0);
        for w in workers {
            let (a, d, f) = w.join().unwrap();
            (allowed, denied, failed) = (allowed + a, denied + d, failed + f);
        }
        // The buckets admit exactly their burst. Under this much contention (four threads
        // in a tight loop on one key) a request may lose every CAS race and fail open;
        // that is counted, never charged, and never makes the bucket over-admit.
        assert_eq!(allowed, 100);
        assert_eq!(allowed + denied + failed, 400);
    }
}
