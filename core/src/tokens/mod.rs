//! Token budgets for LLM traffic: reserve an estimate when a request arrives, commit the
//! real usage when its response ends (issue #29).
//!
//! * **Reserve.** A token limit charges its estimate like any other cost, in the same
//!   all-or-nothing decision as the rule's request limits ([`TokenEstimate`]: the
//!   request's `max_tokens` or the rule's `default_estimate` for output, optionally the
//!   body's size for input; at least 1 and at most the limit's burst, so an empty bucket
//!   refuses and a request that asks for more than a bucket holds still fits a full one).
//!   What an allowed request took is kept as a [`Reservation`].
//! * **Commit.** When the response ends, [`Reservation::settle`] moves each bucket from
//!   the estimate to what the response reported: an unused part goes back, extra usage is
//!   charged whether it fits or not, so the bucket may go into debt and the next requests
//!   wait. The debt is bounded: a bucket's TAT never goes more than two capacities ahead
//!   of `now` (at most one burst of debt, [`crate::gcra::Gcra::charge_debt`]); what lies
//!   beyond is forgiven and counted. A failed upstream call (5xx, reset, aborted stream)
//!   refunds the whole reservation; a response whose usage cannot be read keeps the
//!   reservation as its charge.
//!
//! Bound (proxy scope; `core/tests/tokens.rs` checks it): while every reservation covers
//! its usage, the usage committed never exceeds `burst + rate × elapsed`, because a
//! commit only gives back. When usage exceeds estimates, the overshoot over that bound is
//! at most the in-flight requests' `Σ (usage − estimate)`, each capped at one burst by
//! the debt bound, and it is paid back by later refill before anything more is admitted.
//!
//! Global scope: refunds go back where the tokens came from (the lease, or the local
//! share); extra usage comes from the live lease first, the rest counted as unleased
//! spending, which the coordinator debits from the fleet's bucket at the next sync.
//!
//! Pure: no I/O, no clock; the filter passes `now` and the shared data.

mod body;
mod estimate;

use smallvec::SmallVec;

pub use body::{BYTES_PER_INPUT_TOKEN, BodyFacts, MAX_REQUEST_BODY_BYTES, with_include_usage};
pub use estimate::{TokenChange, TokenEstimate, cost_of};

use crate::global::lease::{FleetView, Spend};
use crate::global::table::LeaseTable;
use crate::limiter::{LimiterCounters, SlotTable};
use crate::rule::Limit;
use crate::store::SharedStore;
use crate::time::Nanos;
use crate::usage::{Usage, UsageFormat, UsageMeasure};

/// One token limit's part of a reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reserved {
    pub limit: Limit,
    pub measure: UsageMeasure,
    /// The tokens taken at admission.
    pub tokens: u64,
    /// For a global limit: its fleet bucket and where the tokens came from.
    pub global: Option<(u64, Spend)>,
}

/// The tokens one rule reserved for one allowed request, until its response ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    /// The rule's id (for statistics).
    pub rule_id: String,
    /// The client's bucket set in the slot table.
    pub fingerprint: u64,
    /// Where the response reports its usage.
    pub format: UsageFormat,
    pub limits: SmallVec<[Reserved; 2]>,
    /// A shadow-mode rule's reservation (never denies, settled all the same).
    pub shadow: bool,
    /// The request's estimate (what its statistics count when its usage is unknown).
    pub estimate: TokenEstimate,
}

/// How a request ended, for its reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settlement {
    /// The response reported this usage; a figure it did not report keeps the
    /// reservation for the limits that count it.
    Used(Usage),
    /// The usage is unknown (unreadable, missing): the reservation is the charge.
    Unknown,
    /// The upstream call failed (5xx, reset, aborted): everything goes back.
    Refund,
}

/// What settling did, for metrics and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Settled {
    /// Tokens charged in the end, over every limit (for `count: total` limits alone, in
    /// tests, this is the usage).
    pub charged: u64,
    /// Tokens given back.
    pub refunded: u64,
    /// Extra tokens charged beyond the reservation.
    pub extra: u64,
    /// Extra tokens forgiven because the bucket's debt reached its bound.
    pub forgiven: u64,
    /// Limits whose figure the response did not report (they kept the reservation).
    pub unreported: u32,
    /// Buckets that could not be written (contention, a host error): their reservation
    /// stands as the charge.
    pub failures: u32,
    /// Global buckets whose lease entry this settlement created (extra usage after the
    /// entry was reclaimed): the host notes them so the control service syncs early.
    pub global_created: u32,
    pub counters: LimiterCounters,
}

/// Where a settlement writes: the slot table and its shared data, the lease table and its
/// shared data, the fleet view, and the time.
#[derive(Debug)]
pub struct SettleContext<'a, S, L> {
    pub store: &'a S,
    pub table: &'a SlotTable,
    pub lease_table: &'a LeaseTable,
    pub leases: &'a L,
    pub view: FleetView,
    pub now: Nanos,
}

impl Reservation {
    /// The tokens the request used, for statistics: its reported total (input + output
    /// when the total is not reported), its estimate when the usage is unknown, none when
    /// refunded.
    pub fn tokens_used(&self, settlement: Settlement) -> u64 {
        match settlement {
            Settlement::Refund => 0,
            Settlement::Unknown => self.estimate.total(),
            Settlement::Used(usage) => usage
                .count(UsageMeasure::Total)
                .unwrap_or_else(|| self.estimate.total()),
        }
    }

    /// Commits `settlement`: each bucket goes from its reservation to the usage (proxy
    /// limits in one compare-and-swap of the client's slot, global ones in the lease
    /// table).
    pub fn settle(
        &self,
        settlement: Settlement,
        cx: &SettleContext<'_, impl SharedStore, impl SharedStore>,
    ) -> Settled {
        let mut settled = Settled::default();
        let mut local: SmallVec<[TokenChange; 2]> = SmallVec::new();
        for reserved in &self.limits {
            let used = match settlement {
                Settlement::Refund => 0,
                Settlement::Unknown => reserved.tokens,
                Settlement::Used(usage) => usage.count(reserved.measure).unwrap_or_else(|| {
                    settled.unreported += 1;
                    reserved.tokens
                }),
            };
            settled.charged = settled.charged.saturating_add(used);
            if used < reserved.tokens {
                settled.refunded += reserved.tokens - used;
            } else {
                settled.extra += used - reserved.tokens;
            }
            if used == reserved.tokens {
                continue;
            }
            let change = TokenChange {
                limit: reserved.limit,
                reserved: reserved.tokens,
                used,
            };
            match reserved.global {
                Some((bucket, spend)) => {
                    match cx
                        .lease_table
                        .settle(cx.leases, bucket, &change, spend, cx.now, &cx.view)
                    {
                        Some(entry) => {
                            settled.forgiven += entry.forgiven;
                            settled.global_created += u32::from(entry.created);
                        }
                        None => settled.failures += 1,
                    }
                }
                None => local.push(change),
            }
        }
        if !local.is_empty() {
            match cx.table.settle(
                cx.store,
                cx.now,
                self.fingerprint,
                &local,
                &mut settled.counters,
            ) {
                Ok(forgiven) => settled.forgiven += forgiven,
                Err(_) => settled.failures += 1,
            }
        }
        settled
    }
}
