//! A proxy's view of one global bucket, and the arithmetic of spending from it.
//!
//! Workers spend from a [`LeaseEntry`] kept in shared data, exactly as they spend from a
//! local bucket: read, decide, compare-and-swap. A request is admitted from, in order:
//!
//! 1. the **lease**: tokens the coordinator granted (already taken from the fleet's
//!    bucket), while the lease has not expired;
//! 2. the **local share**, a GCRA with this proxy's share of the rate and of the burst:
//!    - for a bucket the coordinator has not answered for yet, an even share
//!      (`1 / fleet size`), so the fleet together cannot exceed `burst + rate × elapsed`
//!      before the first sync settles the bucket;
//!    - while the coordinator is out of reach (or warming up), the proxy's last known
//!      share of the fleet's demand (the *fallback*).
//!
//! Anything else is denied until the next sync brings a lease. Every attempt and every
//! token admitted without a lease is counted in the entry; the control service takes those
//! counts ([`LeaseEntry::collect`]) for its next sync, and applies the answer
//! ([`LeaseEntry::apply`]).

use std::num::NonZeroU64;

use super::coordinator::{Grant, PPM, Usage};
pub use super::view::FleetView;
use super::{MIN_SHARE_OF_EVEN, WANT_HORIZON_INTERVALS};
use crate::gcra::{Gcra, MAX_CAPACITY_NS};
use crate::time::Nanos;

/// Where an admitted request's tokens came from, or why it was denied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spend {
    /// From the lease.
    Lease,
    /// From the even local share of a bucket the coordinator has not answered for yet (or
    /// is still young), or of one whose lease is spent while the fleet's bucket was full
    /// at the last answer.
    NewBucket,
    /// From the fallback share while the coordinator is out of reach.
    Fallback,
    /// Nothing to spend: the lease is spent (the next answer brings more if the fleet's
    /// bucket has tokens), or so is the local share.
    Denied { retry_after_ns: u64 },
}

impl Spend {
    pub fn admitted(&self) -> bool {
        !matches!(self, Spend::Denied { .. })
    }
}

/// One global bucket as this proxy sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseEntry {
    /// The bucket's fleet-wide identity (the coordinator's key).
    pub bucket: u64,
    /// The limit enforced, sent with each sync so the coordinator needs no rules.
    pub interval_ns: u64,
    pub burst: u64,
    /// Whether the coordinator has answered for this bucket: from then on, tokens come
    /// from leases (or the fallback share) only.
    pub settled: bool,
    /// Leased tokens not yet spent.
    pub balance: u64,
    /// The lease is spendable while `now < expires_at` (this proxy's clock).
    pub expires_at: Nanos,
    /// This proxy's share of the fleet's demand, parts per million; `0` when unknown.
    pub share_ppm: u32,
    /// The local share's GCRA theoretical arrival time.
    pub local_tat: Nanos,
    /// Tokens attempted since the control service last collected.
    pub attempts: u64,
    /// Tokens admitted without a lease since the control service last collected.
    pub unleased: u64,
    /// When the coordinator's bucket is full again if nobody takes more: after this the
    /// entry may be forgotten without losing anything. Moved out by a collection until
    /// its answer comes (see [`Self::collect`]).
    pub full_at: Nanos,
    /// When the fleet's bucket is full again as of the last answer, never moved by a
    /// collection: how full the fleet's bucket is, for [`Self::remaining`].
    pub answered_full_at: Nanos,
    /// Since when no attempt was collected (`0`: the last collection had some): an entry
    /// idle for [`IDLE_RETURN_INTERVALS`] gives its lease back but a token (that one after
    /// [`IDLE_KEEP_ONE_INTERVALS`]).
    pub idle_since: Nanos,
    /// When this proxy first used the bucket (since it was last new to it; `Nanos::MAX`
    /// until the next use): a new bucket's attempts cover only the time since, not a whole
    /// sync interval, and the coordinator dates a new bucket from it.
    pub born_at: Nanos,
}

/// How long an entry with no attempts keeps its lease, in sync intervals (a second at the
/// default): a client pausing for less finds its lease where it left it.
pub const IDLE_RETURN_INTERVALS: f64 = super::DEMAND_TAU_INTERVALS;

/// How long an idle entry keeps one token of its lease after giving the rest back, in
/// sync intervals (4 s at the default): a sparse client (a request every second or two at
/// this proxy) finds it there, instead of a lease spent while another proxy holds the
/// fleet's bucket.
pub const IDLE_KEEP_ONE_INTERVALS: f64 = 16.0;

/// A share is smoothed over about this many answers (an exponential average whose newest
/// sample weighs `1 / SHARE_SMOOTHING`): the coordinator's demand memory is four intervals.
const SHARE_SMOOTHING: u64 = 4;

impl LeaseEntry {
    /// A bucket this proxy sees for the first time at `now`.
    pub fn new(bucket: u64, limit: &Gcra, now: Nanos) -> Self {
        Self {
            bucket,
            interval_ns: limit.interval_ns(),
            burst: limit.burst(),
            settled: false,
            balance: 0,
            expires_at: Nanos::ZERO,
            share_ppm: 0,
            local_tat: Nanos::ZERO,
            attempts: 0,
            unleased: 0,
            full_at: Nanos::ZERO,
            answered_full_at: Nanos::ZERO,
            idle_since: Nanos::ZERO,
            born_at: now,
        }
    }

    /// Spends `cost` tokens at `now`, or says why not.
    pub fn spend(&mut self, cost: u64, now: Nanos, view: &FleetView) -> Spend {
        self.attempts = self.attempts.saturating_add(cost);
        self.born_at = self.born_at.min(now);
        if self.lease_spendable(now, view) && self.balance >= cost {
            self.balance -= cost;
            return Spend::Lease;
        }
        if self.lease_only(now, view) {
            // The next answer brings a lease if the fleet's bucket has tokens.
            return Spend::Denied {
                retry_after_ns: view.sync_interval_ns,
            };
        }
        // Otherwise: a new bucket, the coordinator out of reach, or a lease spent while
        // the fleet's bucket was full at the last answer (a client sparser than one
        // request per interval, whose idle lease went back): the local share, as for a
        // bucket new to this proxy. Its GCRA continues from the fleet's level at the last
        // answer, so this never hands out a fresh burst.
        let Some(local) = self.local_limit(view) else {
            return Spend::Denied {
                retry_after_ns: view.sync_interval_ns,
            };
        };
        if self.settled && !view.fallback && self.unleased == 0 {
            // Coordinated, and the fleet's bucket was full at the last answer, which
            // counted all this proxy spent (nothing unleased since): its local share starts
            // full, as a new entry's would. Continued from spending under an older share
            // (an even one: a token a 10 s), a client of 2.4 requests a second over three
            // of 1,000 proxies was refused after each pause, far below its limit.
            self.local_tat = Nanos::ZERO;
        }
        let verdict = local.check(self.local_tat, now, cost);
        if !verdict.allowed {
            return Spend::Denied {
                retry_after_ns: verdict.retry_after_ns,
            };
        }
        self.local_tat = verdict.new_tat;
        self.unleased = self.unleased.saturating_add(cost);
        if self.settled && view.fallback {
            Spend::Fallback
        } else {
            Spend::NewBucket
        }
    }

    /// Gives back what [`Self::spend`] took, when another limit of the same request denied
    /// it. The attempt stays counted: it was demand.
    pub fn undo(&mut self, cost: u64, spent: Spend, now: Nanos, view: &FleetView) {
        match spent {
            Spend::Lease => self.balance = self.balance.saturating_add(cost),
            Spend::NewBucket | Spend::Fallback => {
                if let Some(local) = self.local_limit(view) {
                    self.local_tat = local.refund(self.local_tat, now, cost);
                }
                self.unleased = self.unleased.saturating_sub(cost);
            }
            Spend::Denied { .. } => {}
        }
    }

    /// Whether only the lease may be spent at `now`: the coordinator answers, the bucket is
    /// settled, and the fleet's bucket was not full at the last answer. Otherwise the local
    /// share may be spent too.
    ///
    /// It reads the last answer's figure, not [`Self::full_at`], which a collection moves
    /// out until the answer comes (so the entry is not forgotten meanwhile): read here, a
    /// client back after a pause spent its local share for one sync, then was refused
    /// until the answer arrived (241 of 240,000 requests a round, at 5% of a 1,000,000/s
    /// limit, in the fleet simulation; 534 of 960,940 with real Envoys). What it spends
    /// meanwhile is paid for by the grant the answer brings ([`Self::apply`]).
    /// Whether the held lease may be spent at `now`: not expired, and, if it is the token
    /// an entry idle for [`IDLE_RETURN_INTERVALS`] keeps ([`Self::target`]), not past the
    /// moment the fleet's bucket is full again by the last answer. A grant is taken from
    /// the fleet's bucket when it is made, so once that bucket has refilled to full, a
    /// token still held is one the bucket no longer misses: spent after the pause, it
    /// comes on top of a full burst. (Spent, three Envoys admitted 106 where `burst +
    /// rate × elapsed` allowed 101 over 4 s after a Redis failover and a pause, and the
    /// simulation 105 of 100.) The local share is the way in then (see
    /// [`Self::lease_only`]), debited at the next sync from a bucket that is full;
    /// [`Self::collect`] drops the token and asks for it again, taken anew from the
    /// bucket. A whole lease is held idle for [`IDLE_RETURN_INTERVALS`] only, as before
    /// tokens were kept: applied to it, the rule dropped busy proxies' leases after every
    /// short pause (a collection read the entry as idle), and a 100,000,000/s limit's
    /// `remaining` read 84% of the fleet's bucket on one busy core.
    pub(super) fn lease_spendable(&self, now: Nanos, view: &FleetView) -> bool {
        now < self.expires_at
            && (!self.idle_for(now, view, IDLE_RETURN_INTERVALS) || now < self.answered_full_at)
    }

    /// Whether no attempt was collected for at least `intervals` sync intervals.
    fn idle_for(&self, now: Nanos, view: &FleetView, intervals: f64) -> bool {
        let idle_ns = now.saturating_sub(self.idle_since).get();
        self.idle_since != Nanos::ZERO && idle_ns as f64 >= view.sync_interval_ns as f64 * intervals
    }

    pub(super) fn lease_only(&self, now: Nanos, view: &FleetView) -> bool {
        self.settled && !view.fallback && now < self.answered_full_at
    }

    /// Whole tokens this proxy could admit now without asking anyone: its live lease,
    /// and its local share where that applies (a new bucket, or on fallback).
    pub fn spendable(&self, now: Nanos, view: &FleetView) -> u64 {
        let leased = if self.lease_spendable(now, view) {
            self.balance
        } else {
            0
        };
        let local = if self.lease_only(now, view) {
            0
        } else {
            self.local_limit(view)
                .map_or(0, |l| l.check(self.local_tat, now, 0).remaining)
        };
        leased.saturating_add(local)
    }

    /// An estimate of the tokens the whole fleet could still admit now, at most the
    /// burst: what the response's `remaining` and "near limit" read, since the client is
    /// limited fleet-wide, not by this proxy's lease.
    ///
    /// Two parts: what this proxy holds ([`Self::spendable`]) scaled up by its share of
    /// the demand, since every proxy holds about its share of what the fleet has leased
    /// (leases are sized by shares, [`Self::collect`]); and, while coordinated, what the
    /// fleet's bucket itself held at the last answer plus its refill since. It errs high
    /// when another proxy spent its lease since this proxy's last answer, which a proxy
    /// cannot see: the bound on admissions is the leases', never this figure.
    pub fn remaining(&self, now: Nanos, view: &FleetView) -> u64 {
        let held = self.spendable(now, view) as f64 / self.share(view);
        let in_the_fleets_bucket = if self.settled && !view.fallback {
            let refill_left_ns = self.answered_full_at.saturating_sub(now).get();
            self.burst
                .saturating_sub(refill_left_ns.div_ceil(self.interval_ns.max(1)))
        } else {
            0
        };
        // `as` saturates: a share near zero makes `held` huge, and the burst caps it.
        (held as u64)
            .saturating_add(in_the_fleets_bucket)
            .min(self.burst)
    }

    /// This proxy's share of the fleet's demand for this bucket: the last known one, or an
    /// even split before it has one, never below [`MIN_SHARE_OF_EVEN`] of an even split.
    fn share(&self, view: &FleetView) -> f64 {
        let even = view.even_share();
        let known = f64::from(self.share_ppm) / f64::from(PPM);
        if self.share_ppm == 0 { even } else { known }
            .max(even * MIN_SHARE_OF_EVEN)
            .min(1.0)
    }

    /// This proxy's local share of the limit: its known share of the fleet's demand, or an
    /// even split before it has one, never below [`MIN_SHARE_OF_EVEN`] of an even split.
    /// The share applies to the rate and to the burst (at least one token), so the local
    /// GCRA has the fleet bucket's capacity in time. `None` only for an entry whose bytes
    /// describe no valid limit.
    pub fn local_limit(&self, view: &FleetView) -> Option<Gcra> {
        let share = self.share(view);
        // Clamped so that `burst × interval` stays representable: a share so small that
        // it cannot be represented still gets one token now and then.
        let interval = ((self.interval_ns as f64 / share).ceil() as u64).clamp(1, MAX_CAPACITY_NS);
        let burst =
            ((self.burst as f64 * share).floor() as u64).clamp(1, MAX_CAPACITY_NS / interval);
        Gcra::new(
            NonZeroU64::MIN,
            NonZeroU64::new(interval)?,
            NonZeroU64::new(burst)?,
        )
        .ok()
    }

    /// Whether this proxy spent its whole lease since the last collection while clients
    /// still asked: the limit binds here, and the refill waiting at the coordinator is
    /// worth fetching sooner ([`crate::global::schedule::SyncSchedule::due`]). A lease
    /// sized for a limit that does not bind is deep (several intervals of the proxy's
    /// demand, [`Self::target`]), so this stays false far below the limit. Read before
    /// [`Self::collect`], which zeroes the attempts.
    pub fn spent_out(&self, now: Nanos) -> bool {
        self.settled && self.attempts > 0 && (self.balance == 0 || now >= self.expires_at)
    }

    /// Takes the counts for the next sync, `covers` after the previous collection:
    /// attempts and unleased spending are zeroed, and the lease is sized for the time
    /// until the next answer ([`Self::target`]): the wish asks for what is missing, and a
    /// balance beyond the target goes back to the fleet. A lease that expired is dropped
    /// without being returned: after a coordinator restart its tokens may already be
    /// counted as refilled.
    pub fn collect(&mut self, now: Nanos, covers: Nanos, view: &FleetView) -> Usage {
        let attempts = std::mem::take(&mut self.attempts);
        let unleased = std::mem::take(&mut self.unleased);
        // Expired, or the token kept over a pause once the fleet's bucket refilled to
        // full: dropped ([`Self::lease_spendable`]). Read before this collection's
        // attempts mark the entry busy, which would make a stale token spendable again.
        let held = self.balance;
        let leased = self.lease_spendable(now, view);
        if !leased {
            self.balance = 0;
        }
        if attempts > 0 || unleased > 0 {
            // Until the answer says how full the fleet's bucket is, assume what was just
            // reported may have drained it: the entry is not forgettable before a full
            // refill. Otherwise another bucket could reclaim its key while the sync is in
            // flight, and this bucket would start afresh with a new even share, admitting
            // its burst again. The answer replaces this with the fleet's own figure.
            let refill_ns = self.burst.saturating_mul(self.interval_ns);
            self.full_at = self.full_at.max(now.saturating_add(Nanos::new(refill_ns)));
        }
        if attempts > 0 {
            self.idle_since = Nanos::ZERO;
        } else if self.idle_since == Nanos::ZERO {
            self.idle_since = now;
        }
        let target = self.target(attempts, held, now, covers, view);
        let returned = if leased {
            let excess = self.balance.saturating_sub(target);
            self.balance -= excess;
            excess
        } else {
            0
        };
        if attempts == 0
            && self.balance == 0
            && self.settled
            && now >= self.full_at
            && !view.fallback
        {
            // Idle, nothing held, and the fleet's bucket is full again: the next request
            // is treated as the first (an even local share until the next answer) instead
            // of being denied while the fleet has tokens to spare. This is the "new to this
            // proxy" case of the bound, once per time the bucket is full. Its first use is
            // the next request's time ([`Self::spend`]), for the coordinator's dating.
            // Not on fallback shares: nothing is denied for want of a lease then, and the
            // known share (with its local level) is the better guess than an even one; a
            // pause during an outage left a client on a fresh even share, uncounted as
            // fallback (the real-Envoy test of a Redis outage saw it when the pause
            // between its loads outlasted the bucket's refill).
            // Its local share starts full, as a new entry's would (see `spend`).
            self.settled = false;
            self.born_at = Nanos::MAX;
            self.local_tat = Nanos::ZERO;
        }
        // A bucket first used within this window: its spending began then.
        let first_use_ns = if attempts > 0 {
            let window_start = now.saturating_sub(covers);
            self.born_at.saturating_sub(window_start).min(covers).get()
        } else {
            0
        };
        // On fallback shares the coordinator may have lost its state (it restarted, or its
        // Redis did): the fleet's level as this proxy last heard it lets it rebuild the
        // bucket instead of starting it full. Coordinated, it is left out (a smaller sync).
        // At most the deepest level a report may carry (`guard::deepest_level_ms`, one
        // burst of debt): a fleet of many proxies new to the bucket may have left it deeper
        // (one token a proxy), and a rebuilt bucket forgives that part.
        let known_full_in_ns = if view.fallback {
            let deepest_ns = self
                .burst
                .saturating_mul(self.interval_ns)
                .saturating_mul(2);
            self.answered_full_at
                .saturating_sub(now)
                .get()
                .min(deepest_ns)
        } else {
            0
        };
        Usage {
            attempts,
            unleased,
            returned,
            want: target.saturating_sub(self.balance),
            first_use_ns,
            known_full_in_ns,
        }
    }

    /// The lease this proxy aims to hold after a sync, in tokens: enough that it is not
    /// spent before the next answer, which is what keeps a fleet far below its limit from
    /// ever being refused. The larger of
    /// - its own demand over [`WANT_HORIZON_INTERVALS`] sync intervals (the attempts of
    ///   the usage being collected, over the time they cover), and
    /// - its part of the most the fleet's bucket can hold at once (its burst, or one
    ///   horizon of the limit's refill if that is more): its share of the demand, and at
    ///   least an even split.
    ///
    /// The second term is what makes the lease deep when the fleet has room: sized from
    /// the limit rather than from the last interval's traffic, it covers a client whose
    /// next interval is busier than its last, a ramp, the end of a pause, and a client
    /// sparser than one request per interval (whose every interval's sample of demand is
    /// zero or a spike). Asking too much costs nothing lasting: leases are taken from the
    /// fleet's bucket (grants never exceed what it holds, and where the limit binds, a
    /// proxy's grants stay near its share of the refill whatever it asks), and what a
    /// proxy no longer needs goes back at its next collection. An entry idle for
    /// [`IDLE_RETURN_INTERVALS`] keeps a token at most, and after
    /// [`IDLE_KEEP_ONE_INTERVALS`] nothing, so it can be forgotten.
    fn target(&self, attempts: u64, held: u64, now: Nanos, covers: Nanos, view: &FleetView) -> u64 {
        if self.idle_for(now, view, IDLE_RETURN_INTERVALS) {
            let keeps_one = !self.idle_for(now, view, IDLE_KEEP_ONE_INTERVALS);
            // The token it held, asked for again if it was dropped as stale
            // ([`Self::lease_spendable`]): taken anew from the fleet's bucket, it is
            // missing from it again.
            return if keeps_one { held.min(1) } else { 0 };
        }
        let horizon_ns = view.sync_interval_ns as f64 * WANT_HORIZON_INTERVALS;
        // A new bucket's rate is judged over its life so far (at least a millisecond): a
        // hot new bucket must ask for enough at once, or the fleet's bucket sits full and
        // its refill is lost until the proxy's wish catches up.
        let covers = covers
            .min(now.saturating_sub(self.born_at))
            .max(Nanos::from_millis(1).min(covers))
            .max(Nanos::new(1))
            .get();
        let own = (attempts as f64 * horizon_ns / covers as f64).ceil() as u64;
        let part = self.share(view).max(view.even_share());
        let horizon_refill = (horizon_ns / self.interval_ns.max(1) as f64) as u64;
        let fleets_part = self.burst.max(horizon_refill) as f64 * part;
        // A proxy never told its share (a client too sparse here for an answer to
        // carry one) asks for at least a token: its even part of a burst smaller than
        // the fleet rounds down to none, and once another proxy leased the fleet's
        // bucket its next request had nothing to spend (a client of 2.4 requests a second
        // over three of 1,000 proxies was refused 2,199 of 38,000 requests).
        let unknown_share = u64::from(self.share_ppm == 0);
        own.max(fleets_part as u64).max(unknown_share)
    }

    /// Applies the coordinator's answer for this bucket, received at `now`.
    pub fn apply(&mut self, grant: &Grant, now: Nanos, view: &FleetView) {
        // A young bucket's proxies keep to their even shares until every one of them has
        // reported (the coordinator grants nothing meanwhile).
        self.settled = !grant.young;
        // Tokens admitted without a lease since the usage was collected (a new bucket's
        // even share, or the fallback share) are paid for by this grant, which the
        // coordinator already took from the fleet's bucket. Otherwise they would be taken
        // twice (again as unleased at the next sync), and a new bucket's first grant (the
        // rest of its even share as the coordinator saw it) would hand out what the
        // workers spent while the answer was on its way a second time: a new client
        // bursting at three real Envoys got up to 1.23 of its burst.
        let covered = self.unleased.min(grant.granted);
        self.unleased -= covered;
        self.balance = self.balance.saturating_add(grant.granted - covered);
        self.expires_at = now.saturating_add(Nanos::new(view.lease_ttl_ns()));
        // No share (0): the coordinator does not know the fleet's demand yet (it is
        // warming up); the last known share stays. Otherwise the share is smoothed over
        // the last few answers: each is one interval's sample of this proxy's traffic, and
        // the fallback rests on the last one. Taken alone, the three Envoys' last samples
        // added up to as much as 1.12 of the limit during a real outage.
        if grant.share_ppm > 0 {
            self.share_ppm = if self.share_ppm == 0 {
                grant.share_ppm
            } else {
                smoothed(self.share_ppm, grant.share_ppm)
            };
        }
        // A warming coordinator's answer (on fallback shares) may come from a bucket it
        // has not rebuilt yet, fuller than the fleet's: this proxy keeps the emptier level
        // it knew, to report it with its next sync (`collect`).
        let full_at = now.saturating_add(Nanos::new(grant.full_in_ns));
        if view.fallback {
            self.full_at = self.full_at.max(full_at);
            self.answered_full_at = self.answered_full_at.max(full_at);
        } else {
            self.full_at = full_at;
            self.answered_full_at = full_at;
        }
        // The local GCRA has the fleet bucket's capacity in time, so making it at most as
        // full as the fleet's bucket is now continues the fleet's limit where it stands if
        // the coordinator is lost, instead of handing every proxy a fresh burst. Never
        // fuller than it is: while on fallback shares, the coordinator has not yet heard
        // of this proxy's latest spending.
        self.local_tat = self
            .local_tat
            .max(now.saturating_add(Nanos::new(grant.full_in_ns)));
    }

    /// Whether the entry can be dropped without losing anything: nothing left to report,
    /// no lease to spend, and the fleet's bucket is full again.
    pub fn forgettable(&self, now: Nanos) -> bool {
        self.attempts == 0
            && self.unleased == 0
            && (self.balance == 0 || now >= self.expires_at)
            && now >= self.full_at
    }
}

/// A share smoothed with one more sample, weighing `1 / SHARE_SMOOTHING`.
fn smoothed(share_ppm: u32, sample_ppm: u32) -> u32 {
    ((u64::from(share_ppm) * (SHARE_SMOOTHING - 1) + u64::from(sample_ppm)) / SHARE_SMOOTHING)
        as u32
}

/// The first byte of an encoded [`LeaseEntry`]; bumped whenever the layout changes, so a
/// reloaded VM never misreads an older layout (it starts the entry afresh instead).
pub const ENTRY_FORMAT: u8 = 2;

const WORDS: usize = 12;

/// Bytes of an encoded [`LeaseEntry`]: the format byte, the `settled` byte, twelve `u64`
/// and one `u32`.
pub const ENTRY_LEN: usize = 2 + WORDS * 8 + 4;

impl LeaseEntry {
    /// The entry's bytes in shared data (little-endian, fixed layout).
    pub fn encode(&self) -> [u8; ENTRY_LEN] {
        let mut out = [0u8; ENTRY_LEN];
        let words: [u64; WORDS] = [
            self.bucket,
            self.interval_ns,
            self.burst,
            self.balance,
            self.expires_at.get(),
            self.local_tat.get(),
            self.attempts,
            self.unleased,
            self.full_at.get(),
            self.answered_full_at.get(),
            self.idle_since.get(),
            self.born_at.get(),
        ];
        let (head, rest) = out.split_at_mut(2);
        head.copy_from_slice(&[ENTRY_FORMAT, u8::from(self.settled)]);
        let (body, share) = rest.split_at_mut(WORDS * 8);
        super::put_words(body, &words);
        share.copy_from_slice(&self.share_ppm.to_le_bytes());
        out
    }

    /// Reads an entry's bytes; `None` for any other length or format (a corrupt or older
    /// entry, which the caller replaces).
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != ENTRY_LEN {
            return None;
        }
        let (head, rest) = bytes.split_at_checked(2)?;
        let settled = match head {
            [ENTRY_FORMAT, 0] => false,
            [ENTRY_FORMAT, 1] => true,
            _ => return None,
        };
        let (body, share) = rest.split_at_checked(WORDS * 8)?;
        let mut words = super::words(body);
        let mut next = || words.next();
        let entry = Self {
            bucket: next()?,
            interval_ns: next()?,
            burst: next()?,
            settled,
            balance: next()?,
            expires_at: Nanos::new(next()?),
            local_tat: Nanos::new(next()?),
            attempts: next()?,
            unleased: next()?,
            full_at: Nanos::new(next()?),
            answered_full_at: Nanos::new(next()?),
            idle_since: Nanos::new(next()?),
            born_at: Nanos::new(next()?),
            share_ppm: u32::from_le_bytes(share.try_into().ok()?),
        };
        (entry.interval_ns > 0 && entry.burst > 0).then_some(entry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::global::test_support::{T, grant, leasing, limit};
    use crate::time::NANOS_PER_SECOND as S;

    #[test]
    fn a_new_bucket_spends_an_even_share_then_waits_for_a_lease() {
        let view = leasing(3);
        let mut entry = LeaseEntry::new(7, &limit(10, 10), Nanos::new(0));
        let now = 100 * S;
        for _ in 0..3 {
            assert_eq!(entry.spend(1, Nanos::new(now), &view), Spend::NewBucket);
        }
        assert!(
            !entry.spend(1, Nanos::new(now), &view).admitted(),
            "10 / 3 proxies, rounded down"
        );
        // The even share refills at a third of the rate: one token per 300 ms.
        assert_eq!(
            entry.spend(1, Nanos::new(now + 300_000_000), &view),
            Spend::NewBucket
        );
        let usage = entry.collect(Nanos::new(now), Nanos::new(T), &view);
        assert_eq!(usage.attempts, 5);
        assert_eq!(usage.unleased, 4);
        assert_eq!(usage.want, 8, "1.5 intervals of this interval's attempts");
        entry.apply(&grant(6, 500_000, S), Nanos::new(now), &view);
        assert!(entry.settled);
        assert_eq!(entry.spend(2, Nanos::new(now), &view), Spend::Lease);
        assert_eq!(entry.spendable(Nanos::new(now), &view), 4);
        assert_eq!(
            entry.spendable(Nanos::new(now + S - 1), &view),
            4,
            "the lease alone while the fleet's bucket is not full"
        );
        assert_eq!(
            entry.spendable(Nanos::new(now + 3 * T), &view),
            5,
            "the lease expired, and the fleet's bucket was full again: the local share"
        );
        for _ in 0..4 {
            assert_eq!(entry.spend(1, Nanos::new(now), &view), Spend::Lease);
        }
        assert_eq!(
            entry.spend(1, Nanos::new(now), &view),
            Spend::Denied { retry_after_ns: T },
            "settled: only leases while the coordinator answers"
        );
    }

    #[test]
    fn a_lease_is_sized_from_the_limit_not_only_from_the_last_interval() {
        // Far below the limit: 10 requests in the last interval of a 1,000/s limit.
        let view = leasing(1);
        let mut entry = LeaseEntry::new(1, &limit(1_000, 1_000), Nanos::new(0));
        entry.apply(&grant(0, PPM, 0), Nanos::new(0), &view);
        for _ in 0..10 {
            entry.spend(1, Nanos::new(1), &view);
        }
        let usage = entry.collect(Nanos::new(T), Nanos::new(T), &view);
        assert_eq!(
            usage.want, 1_000,
            "the whole bucket (this proxy's share of it), not 1.5 intervals of 10"
        );
        // Ten proxies, this one with a fifth of the demand: a fifth of the bucket (an even
        // split is the least), or its own demand over the horizon if that is more.
        let view = leasing(10);
        let mut entry = LeaseEntry::new(1, &limit(1_000, 1_000), Nanos::new(0));
        entry.apply(&grant(0, PPM / 5, 0), Nanos::new(0), &view);
        entry.attempts = 10;
        assert_eq!(entry.collect(Nanos::new(T), Nanos::new(T), &view).want, 200);
        entry.attempts = 400;
        assert_eq!(
            entry.collect(Nanos::new(2 * T), Nanos::new(T), &view).want,
            600,
            "1.5 intervals of 400"
        );
        // What a shrinking share no longer covers goes back.
        entry.apply(&grant(600, PPM / 10, 0), Nanos::new(2 * T), &view);
        entry.attempts = 10;
        let usage = entry.collect(Nanos::new(3 * T), Nanos::new(T), &view);
        let target = 1_000 * u64::from(entry.share_ppm) / u64::from(PPM);
        assert_eq!((usage.returned, entry.balance), (600 - target, target));
    }

    #[test]
    fn remaining_reads_the_fleets_bucket_not_the_lease() {
        let view = leasing(3);
        let mut entry = LeaseEntry::new(1, &limit(100, 100), Nanos::new(0));
        // A third of the demand, a third of the bucket leased, the rest still in the
        // fleet's bucket (it is full again in 0.4 s: 40 tokens are out).
        entry.apply(&grant(33, PPM / 3, 400_000_000), Nanos::new(0), &view);
        assert_eq!(entry.spendable(Nanos::new(0), &view), 33);
        assert_eq!(
            entry.remaining(Nanos::new(0), &view),
            100,
            "33 held here, about as much at each of the others, 60 in the fleet's bucket"
        );
        for _ in 0..30 {
            entry.spend(1, Nanos::new(0), &view);
        }
        assert_eq!(entry.remaining(Nanos::new(0), &view), 69, "3 × 3 + 60");
        assert_eq!(
            entry.remaining(Nanos::new(200_000_000), &view),
            89,
            "the fleet's bucket refilled 20 since the answer"
        );
        // On fallback the fleet's bucket is out of sight: what this proxy may admit, scaled.
        let fallback = FleetView {
            fallback: true,
            ..view
        };
        let alone = entry.spendable(Nanos::new(0), &fallback);
        assert_eq!(
            entry.remaining(Nanos::new(0), &fallback),
            (alone as f64 * 3.0) as u64
        );
    }

    #[test]
    fn the_fallback_spends_the_lease_then_this_proxys_share() {
        let mut view = leasing(4);
        let l = limit(100, 100);
        let mut entry = LeaseEntry::new(1, &l, Nanos::new(0));
        entry.apply(&grant(2, 700_000, 0), Nanos::new(0), &view);
        view.fallback = true;
        assert_eq!(entry.spend(1, Nanos::new(1), &view), Spend::Lease);
        assert_eq!(entry.spend(1, Nanos::new(1), &view), Spend::Lease);
        let admitted = (0..1_000)
            .filter(|_| entry.spend(1, Nanos::new(1), &view) == Spend::Fallback)
            .count();
        assert_eq!(admitted, 70, "70% of the burst of 100");
        // One second later 70% of 100/s has refilled (the interval rounds up: 69 whole).
        let refilled = (0..1_000)
            .filter(|_| entry.spend(1, Nanos::new(1 + S), &view).admitted())
            .count();
        assert_eq!(refilled, 69);
        assert_eq!(
            entry
                .collect(Nanos::new(1 + S), Nanos::new(T), &view)
                .unleased,
            70 + 69
        );
    }

    #[test]
    fn the_local_share_starts_as_full_as_the_fleets_bucket() {
        let view = leasing(2);
        let mut entry = LeaseEntry::new(1, &limit(100, 100), Nanos::new(0));
        // The fleet's bucket needs 0.8 s to refill: 20 of 100 tokens left.
        entry.apply(&grant(0, 500_000, 800_000_000), Nanos::new(0), &view);
        let fallback = FleetView {
            fallback: true,
            ..view
        };
        let admitted = (0..1_000)
            .filter(|_| entry.spend(1, Nanos::new(0), &fallback).admitted())
            .count();
        assert_eq!(admitted, 10, "half of the 20 the fleet has left");
    }

    #[test]
    fn a_proxy_without_a_known_share_splits_evenly_with_a_floor() {
        let view = leasing(4);
        let entry = LeaseEntry::new(1, &limit(100, 100), Nanos::new(0));
        assert_eq!(entry.local_limit(&view).unwrap().burst(), 25);
        let mut quiet = entry;
        quiet.share_ppm = 1;
        assert_eq!(
            quiet.local_limit(&view).unwrap().burst(),
            2,
            "a tenth of an even split"
        );
        let alone = LeaseEntry::new(1, &limit(100, 100), Nanos::new(0));
        assert_eq!(
            alone.local_limit(&leasing(0)).unwrap().burst(),
            100,
            "before the first answer a proxy enforces the whole limit"
        );
    }

    #[test]
    fn undo_gives_back_exactly_what_was_taken() {
        let view = leasing(1);
        let mut entry = LeaseEntry::new(1, &limit(10, 10), Nanos::new(0));
        let before = entry.remaining(Nanos::new(0), &view);
        let spent = entry.spend(3, Nanos::new(0), &view);
        assert_eq!(spent, Spend::NewBucket);
        entry.undo(3, spent, Nanos::new(0), &view);
        assert_eq!(entry.remaining(Nanos::new(0), &view), before);
        assert_eq!(entry.unleased, 0);
        assert_eq!(entry.attempts, 3, "the attempt stays counted as demand");

        entry.apply(&grant(5, PPM, 0), Nanos::new(0), &view);
        let spent = entry.spend(2, Nanos::new(0), &view);
        entry.undo(2, spent, Nanos::new(0), &view);
        assert_eq!(entry.balance, 5);
    }

    #[test]
    fn entries_round_trip_through_their_bytes_and_reject_others() {
        let view = leasing(3);
        let mut entry = LeaseEntry::new(0xfeed, &limit(10, 20), Nanos::new(0));
        entry.spend(2, Nanos::new(5), &view);
        entry.apply(&grant(4, 123_456, 99), Nanos::new(5), &view);
        let bytes = entry.encode();
        assert_eq!(LeaseEntry::decode(&bytes), Some(entry));
        assert_eq!(LeaseEntry::decode(&bytes[..ENTRY_LEN - 1]), None);
        let mut other = bytes;
        other[0] = ENTRY_FORMAT + 1;
        assert_eq!(LeaseEntry::decode(&other), None);
        let mut other = bytes;
        other[1] = 2;
        assert_eq!(LeaseEntry::decode(&other), None);
        assert_eq!(LeaseEntry::decode(&[]), None);
    }

    #[test]
    fn an_idle_bucket_starts_afresh_once_the_fleets_bucket_is_full() {
        let view = leasing(2);
        let mut entry = LeaseEntry::new(1, &limit(10, 10), Nanos::new(0));
        assert_eq!(entry.spend(1, Nanos::new(0), &view), Spend::NewBucket);
        entry.collect(Nanos::new(0), Nanos::new(T), &view);
        entry.apply(&grant(1, PPM, S), Nanos::new(0), &view);
        assert_eq!(entry.spend(1, Nanos::new(1), &view), Spend::Lease);
        entry.collect(Nanos::new(T), Nanos::new(T), &view);
        entry.apply(&grant(0, PPM, S - T), Nanos::new(T), &view);
        assert!(entry.settled, "the fleet's bucket is not full yet");
        let mut on_fallback = entry;
        entry.collect(Nanos::new(S), Nanos::new(T), &view);
        assert!(!entry.settled, "idle and full: a slow client is not denied");
        assert_eq!(entry.spend(1, Nanos::new(2 * S), &view), Spend::NewBucket);

        // On fallback shares the entry keeps its share: its spending is fallback.
        let fallback = FleetView {
            fallback: true,
            ..view
        };
        on_fallback.collect(Nanos::new(S), Nanos::new(T), &fallback);
        assert!(on_fallback.settled);
        assert_eq!(
            on_fallback.spend(1, Nanos::new(2 * S), &fallback),
            Spend::Fallback
        );
    }

    #[test]
    fn an_entry_awaiting_its_answer_is_not_forgettable() {
        let view = leasing(3);
        let mut entry = LeaseEntry::new(1, &limit(10, 10), Nanos::new(0));
        entry.spend(1, Nanos::new(0), &view);
        entry.collect(Nanos::new(T), Nanos::new(T), &view);
        // Nothing left to report, but the sync is in flight: reclaiming the key now would
        // let this bucket start afresh with a new even share.
        assert!(!entry.forgettable(Nanos::new(2 * T)));
        // Unanswered, it may go once a full refill (10 tokens at 10/s) has passed.
        assert!(entry.forgettable(Nanos::new(T + S)));
    }

    #[test]
    fn a_forgotten_entry_loses_nothing() {
        let view = leasing(2);
        let mut entry = LeaseEntry::new(1, &limit(10, 10), Nanos::new(0));
        entry.spend(1, Nanos::new(0), &view);
        assert!(
            !entry.forgettable(Nanos::new(0)),
            "an attempt is still to be reported"
        );
        entry.collect(Nanos::new(0), Nanos::new(T), &view);
        entry.apply(&grant(0, PPM, S), Nanos::new(0), &view);
        assert!(
            !entry.forgettable(Nanos::new(S / 2)),
            "the fleet's bucket is not full yet"
        );
        assert!(entry.forgettable(Nanos::new(S)));
    }
}
