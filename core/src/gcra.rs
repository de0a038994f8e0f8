//! Token buckets in GCRA form.
//!
//! A bucket's whole state is one instant: its *theoretical arrival time* (TAT) in
//! nanoseconds on the host clock (a [`Nanos`], stored as eight bytes). The bucket is full when `tat <= now`; every token
//! taken pushes the TAT one emission interval into the future, and a request fits when
//! the resulting backlog (`tat - now`) is at most the bucket's capacity in time.
//!
//! This is the same admission rule as a token bucket that refills one token every
//! `interval_ns` up to `burst` tokens (the property tests check that against a naive
//! bucket), but it needs no separate "last refill" timestamp, so one compare-and-swap
//! of eight bytes updates it.

use std::num::NonZeroU64;

use crate::time::{NANOS_PER_SECOND, Nanos};

/// The largest time a bucket may need to refill completely. Keeping `burst × interval`
/// below 2^62 ns (about 146 years) means TAT arithmetic on host timestamps (about 2^60
/// today) can never overflow.
pub const MAX_CAPACITY_NS: u64 = 1 << 62;

/// A validated token-bucket rate: `burst` tokens of capacity, refilled at one token per
/// `interval_ns`. Only [`Gcra::new`] builds one, so its invariants hold everywhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Gcra {
    interval_ns: u64,
    burst: u64,
    capacity_ns: u64,
}

/// Why a rate cannot be represented.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum GcraError {
    #[error("more than one request per nanosecond cannot be represented")]
    TooFast,
    #[error("burst × refill interval exceeds 146 years")]
    CapacityTooLarge,
}

impl Gcra {
    /// `requests` tokens per `period_ns`, holding at most `burst` tokens.
    ///
    /// The emission interval is rounded *up* to whole nanoseconds: rounding down would
    /// admit a hair more than the configured rate, and Sluice promises never to exceed
    /// `burst + rate × elapsed`.
    pub fn new(
        requests: NonZeroU64,
        period_ns: NonZeroU64,
        burst: NonZeroU64,
    ) -> Result<Self, GcraError> {
        let interval_ns = period_ns.get().div_ceil(requests.get());
        if requests.get() > period_ns.get() {
            return Err(GcraError::TooFast);
        }
        let capacity_ns = burst
            .get()
            .checked_mul(interval_ns)
            .filter(|c| *c <= MAX_CAPACITY_NS)
            .ok_or(GcraError::CapacityTooLarge)?;
        Ok(Self {
            interval_ns,
            burst: burst.get(),
            capacity_ns,
        })
    }

    /// `requests` tokens per second, holding at most `burst`; `None` when either is zero or
    /// the rate cannot be represented.
    pub fn per_second(requests: u64, burst: u64) -> Option<Self> {
        Self::new(
            NonZeroU64::new(requests)?,
            NonZeroU64::new(NANOS_PER_SECOND)?,
            NonZeroU64::new(burst)?,
        )
        .ok()
    }

    /// Nanoseconds between two tokens.
    pub fn interval_ns(&self) -> u64 {
        self.interval_ns
    }

    /// The bucket's capacity in tokens.
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// Time for an empty bucket to refill completely.
    pub fn capacity_ns(&self) -> u64 {
        self.capacity_ns
    }

    /// Decides whether `cost` tokens can be taken at `now` from a bucket whose TAT is
    /// `tat`. Pure: the caller stores [`Verdict::new_tat`] only if it commits.
    pub fn check(&self, tat: Nanos, now: Nanos, cost: u64) -> Verdict {
        let (tat, now) = (tat.get(), now.get());
        let start = tat.max(now);
        let backlog_before = start - now;
        // `cost × interval` may exceed the capacity (a cost larger than the burst); the
        // saturating forms keep that case a plain "never fits" denial.
        let increment = cost.saturating_mul(self.interval_ns);
        let backlog_after = backlog_before.saturating_add(increment);
        if backlog_after <= self.capacity_ns {
            Verdict {
                allowed: true,
                // Saturating: a clock within one capacity of `u64::MAX` ns (from the
                // year 2408 at the longest capacity) would otherwise wrap to a full bucket.
                new_tat: Nanos::new(now.saturating_add(backlog_after)),
                remaining: (self.capacity_ns - backlog_after) / self.interval_ns,
                reset_ns: backlog_after,
                retry_after_ns: 0,
            }
        } else {
            let retry_after_ns = if increment > self.capacity_ns {
                // It will never fit; tell the client to come back when the bucket is
                // full, which is the most it could ever get.
                backlog_before.max(1)
            } else {
                backlog_after - self.capacity_ns
            };
            Verdict {
                allowed: false,
                new_tat: Nanos::new(tat),
                remaining: (self.capacity_ns - backlog_before.min(self.capacity_ns))
                    / self.interval_ns,
                reset_ns: backlog_before,
                retry_after_ns,
            }
        }
    }

    /// [`Gcra::check`], but a request that does not fit now and whose tokens are due
    /// within `max_delay_ns` is admitted *ahead*: its tokens are reserved now, the bucket
    /// going up to `max_delay_ns` beyond its capacity, and the returned wait is the time
    /// until they are due (the request must not pass before `now + wait`). Zero for a
    /// request that fits now. Passing each admitted request at `now + wait` or later keeps
    /// the passes within `burst + rate × elapsed`: at that instant the backlog is back
    /// within the capacity, as if the request had arrived then. A cost that can never fit
    /// is refused as by `check`, and so is one due later than `max_delay_ns`.
    pub fn check_ahead(
        &self,
        tat: Nanos,
        now: Nanos,
        cost: u64,
        max_delay_ns: u64,
    ) -> (Verdict, u64) {
        let verdict = self.check(tat, now, cost);
        let never_fits = cost.saturating_mul(self.interval_ns) > self.capacity_ns;
        if verdict.allowed || never_fits || verdict.retry_after_ns > max_delay_ns {
            return (verdict, 0);
        }
        let wait = verdict.retry_after_ns;
        let due = self.check(tat, now.saturating_add(Nanos::new(wait)), cost);
        (due, if due.allowed { wait } else { 0 })
    }

    /// The TAT after giving back `cost` tokens that were taken (used to undo a charge
    /// when another bucket of the same request denies it). Never moves the TAT below
    /// `now`, which would credit the bucket beyond full.
    pub fn refund(&self, tat: Nanos, now: Nanos, cost: u64) -> Nanos {
        tat.saturating_sub(Nanos::new(cost.saturating_mul(self.interval_ns)))
            .max(now.min(tat))
    }

    /// The TAT after charging `extra` tokens used beyond what was reserved (a token
    /// limit's commit): taken whether or not they fit, so the bucket may go into debt, but
    /// never more than one burst of it: the TAT stays at most two capacities ahead of
    /// `now`. Returns the new TAT and the tokens forgiven above that bound.
    pub fn charge_debt(&self, tat: Nanos, now: Nanos, extra: u64) -> (Nanos, u64) {
        let start = tat.get().max(now.get());
        let ceiling = now.get().saturating_add(self.capacity_ns.saturating_mul(2));
        let room = ceiling.saturating_sub(start) / self.interval_ns;
        let charged = extra.min(room);
        let new_tat = start.saturating_add(charged.saturating_mul(self.interval_ns));
        (Nanos::new(new_tat), extra - charged)
    }
}

/// `burst`, capped at what one refill of at most [`MAX_CAPACITY_NS`] (about 146 years)
/// holds at one token per `interval_ns`.
///
/// Every limit the rule's schema admits is accepted, and JSON Schema cannot bound a
/// product (`burst × period / requests`), so rather than refusing a limit whose bucket
/// would take longer than that to refill (its TAT arithmetic must stay within a `u64`),
/// its burst is capped. Only limits slower than one token per 4.6 s with bursts near the
/// largest are affected (one a day holds at most 53,375 tokens, one a year 145), and the
/// cap errs toward admitting less, never more, than `burst + rate × elapsed`. The capped
/// value is the limit's `burst` (what the rate-limit header fields and the near-limit
/// count read), so every reading agrees with the bucket. Tightening the fields' maxima
/// instead would have cost every limit: a burst of 10^9 at one token a year fits only if
/// bursts stop at 145.
pub fn capped_burst(burst: u64, interval_ns: u64) -> u64 {
    burst.min(MAX_CAPACITY_NS / interval_ns.max(1))
}

/// The outcome of one [`Gcra::check`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// Whether the tokens fit.
    pub allowed: bool,
    /// The TAT to store if the caller commits an allowed request (the old TAT when denied).
    pub new_tat: Nanos,
    /// Whole tokens left after this request (before it, when denied).
    pub remaining: u64,
    /// Time until the bucket is full again.
    pub reset_ns: u64,
    /// When denied: time until this request would fit. Zero when allowed.
    pub retry_after_ns: u64,
}

/// Whole seconds, rounded up, as `Retry-After` and the RateLimit fields want them.
pub fn ceil_seconds(ns: u64) -> u64 {
    ns.div_ceil(NANOS_PER_SECOND)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gcra(requests: u64, period_s: u64, burst: u64) -> Gcra {
        Gcra::new(
            NonZeroU64::new(requests).unwrap(),
            NonZeroU64::new(period_s * NANOS_PER_SECOND).unwrap(),
            NonZeroU64::new(burst).unwrap(),
        )
        .unwrap()
    }

    #[test]
    fn a_full_bucket_admits_exactly_burst_then_denies() {
        let g = gcra(5, 1, 10);
        let now = Nanos::from_secs(1_000);
        let mut tat = Nanos::ZERO;
        for i in 0..10 {
            let v = g.check(tat, now, 1);
            assert!(v.allowed, "request {i}");
            assert_eq!(v.remaining, 9 - i);
            tat = v.new_tat;
        }
        let v = g.check(tat, now, 1);
        assert!(!v.allowed);
        assert_eq!(v.remaining, 0);
        assert_eq!(v.retry_after_ns, 200_000_000);
        assert_eq!(v.reset_ns, 2 * NANOS_PER_SECOND);
        assert_eq!(ceil_seconds(v.retry_after_ns), 1);
    }

    #[test]
    fn tokens_refill_at_the_configured_rate() {
        let g = gcra(5, 1, 10);
        let now = Nanos::from_secs(50);
        let drained = now.saturating_add(Nanos::new(g.capacity_ns()));
        assert!(!g.check(drained, now, 1).allowed);
        let later = |ns| now.saturating_add(Nanos::new(ns));
        assert!(!g.check(drained, later(199_999_999), 1).allowed);
        let v = g.check(drained, later(200_000_000), 1);
        assert!(v.allowed);
        assert_eq!(v.remaining, 0);
    }

    #[test]
    fn extra_usage_goes_into_debt_of_at_most_one_burst() {
        const T0: u64 = 1_000 * NANOS_PER_SECOND;
        let g = Gcra::per_second(10, 10).unwrap();
        let now = Nanos::new(T0);
        // Full bucket: 25 extra tokens fit (one burst empties it, one more of debt), 5
        // are forgiven.
        let (tat, forgiven) = g.charge_debt(Nanos::ZERO, now, 25);
        assert_eq!(forgiven, 5);
        assert_eq!(tat.get(), T0 + 2 * g.capacity_ns());
        // In debt, nothing fits: refused until the debt and a token are paid back.
        assert!(!g.check(tat, now, 1).allowed);
        let later = Nanos::new(T0 + g.capacity_ns() + g.interval_ns());
        assert!(g.check(tat, later, 1).allowed);
        // Within the bound, everything is charged.
        assert_eq!(
            g.charge_debt(Nanos::ZERO, now, 3),
            (Nanos::new(T0 + 3 * g.interval_ns()), 0)
        );
    }

    #[test]
    fn weighted_cost_takes_several_tokens_or_none() {
        let g = gcra(10, 1, 10);
        let now = Nanos::from_secs(1);
        let v = g.check(Nanos::ZERO, now, 7);
        assert!(v.allowed);
        assert_eq!(v.remaining, 3);
        let denied = g.check(v.new_tat, now, 4);
        assert!(!denied.allowed);
        assert_eq!(
            denied.new_tat, v.new_tat,
            "a denial leaves the bucket untouched"
        );
        assert_eq!(denied.remaining, 3);
        assert_eq!(denied.retry_after_ns, 100_000_000);
    }

    #[test]
    fn a_cost_above_the_burst_never_fits() {
        let g = gcra(10, 1, 10);
        let v = g.check(Nanos::ZERO, Nanos::from_secs(1), 11);
        assert!(!v.allowed);
        assert!(v.retry_after_ns > 0);
    }

    #[test]
    fn uneven_rates_round_the_interval_up() {
        let g = gcra(3, 1, 3);
        assert_eq!(g.interval_ns(), 333_333_334);
    }

    #[test]
    fn unrepresentable_rates_are_refused() {
        let one = NonZeroU64::new(1).unwrap();
        let err = Gcra::new(NonZeroU64::new(2).unwrap(), one, one).unwrap_err();
        assert_eq!(err, GcraError::TooFast);
        let huge = NonZeroU64::new(u64::MAX / 2).unwrap();
        let err = Gcra::new(one, NonZeroU64::new(NANOS_PER_SECOND).unwrap(), huge).unwrap_err();
        assert_eq!(err, GcraError::CapacityTooLarge);
    }

    #[test]
    fn a_charge_at_the_end_of_time_saturates_instead_of_wrapping() {
        // Found by the `lease_entry` fuzz target: `now + backlog` overflowed.
        let g = gcra(10, 1, 10);
        let end = Nanos::new(u64::MAX - 1);
        let verdict = g.check(Nanos::ZERO, end, 3);
        assert!(verdict.allowed);
        assert_eq!(verdict.new_tat.get(), u64::MAX);
        assert!(!g.check(verdict.new_tat, end, 10).allowed);
    }

    #[test]
    fn a_request_due_within_the_delay_is_reserved_ahead_and_waits_exactly_its_due_time() {
        let g = gcra(5, 1, 2); // a token every 200 ms, two at most
        let now = Nanos::from_secs(10);
        let mut tat = Nanos::ZERO;
        for _ in 0..2 {
            let (v, wait) = g.check_ahead(tat, now, 1, 500_000_000);
            assert!(v.allowed);
            assert_eq!(wait, 0, "fits now: no wait");
            tat = v.new_tat;
        }
        // Due in 200 ms, then 400 ms: both within 500 ms, reserved in turn.
        let mut waits = Vec::new();
        for _ in 0..2 {
            let (v, wait) = g.check_ahead(tat, now, 1, 500_000_000);
            assert!(v.allowed);
            waits.push(wait);
            tat = v.new_tat;
        }
        assert_eq!(waits, [200_000_000, 400_000_000]);
        // The next is due in 600 ms: past the delay, refused and nothing reserved.
        let (v, wait) = g.check_ahead(tat, now, 1, 500_000_000);
        assert!(!v.allowed);
        assert_eq!((wait, v.new_tat), (0, tat));
        assert_eq!(v.retry_after_ns, 600_000_000);
        // Exactly at the bound it is admitted: `max_delay` is inclusive.
        let (v, wait) = g.check_ahead(tat, now, 1, 600_000_000);
        assert!(v.allowed && wait == 600_000_000);
        // Every reserved request passes its own due time within the plain check: at
        // `now + wait` the bucket holds it, as if it had arrived then.
        let (v, _) = g.check_ahead(Nanos::ZERO, now, 2, 0);
        let (_, wait) = g.check_ahead(v.new_tat, now, 1, 1_000_000_000);
        assert!(
            g.check(v.new_tat, now.saturating_add(Nanos::new(wait)), 1)
                .allowed
        );
        assert!(
            !g.check(v.new_tat, now.saturating_add(Nanos::new(wait - 1)), 1)
                .allowed
        );
    }

    #[test]
    fn a_cost_that_never_fits_is_not_delayed() {
        let g = gcra(10, 1, 10);
        let (v, wait) = g.check_ahead(Nanos::ZERO, Nanos::from_secs(1), 11, u64::MAX);
        assert!(!v.allowed);
        assert_eq!(wait, 0);
    }

    #[test]
    fn refund_undoes_a_charge_but_never_overfills() {
        let g = gcra(10, 1, 10);
        let now = Nanos::from_secs(1);
        let charged = g.check(Nanos::ZERO, now, 3).new_tat;
        assert_eq!(g.refund(charged, now, 3), now);
        assert_eq!(g.refund(charged, now, 100), now);
    }
}
