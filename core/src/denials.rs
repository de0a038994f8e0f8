//! Denials a worker can repeat without reading shared data.
//!
//! Only time refills a bucket; other workers can only take from it. So a bucket set that
//! denied `cost` tokens at `at`, saying the longest of its limits needs `wait` more, denies
//! any request of that cost or more until `at + wait`, whatever the other workers do
//! meanwhile. A throttled client that keeps knocking (the common shape of abuse, and
//! variant (g) of the benchmark) then costs its worker no shared-data read and no bucket
//! arithmetic until its wait is over: the read alone is about 0.9 µs of Envoy CPU
//! (`tools/bench/results/2026-11-25-hostcalls.md`).
//!
//! It errs only toward denying, and only within the wait it remembers:
//! - a refund (another rule denied a request after this bucket was charged for it) frees
//!   tokens that a remembered denial does not see until its wait ends;
//! - a clock that steps backwards (Envoy's clock is the wall clock) makes the memory
//!   unusable rather than longer: a `now` before `at` is a miss.
//!
//! The memory belongs to one compiled configuration (it lives in its slot table), so a
//! new ruleset, whose limits may differ for the same rule and client, starts with none.

use std::cell::Cell;

use crate::bucket::TierVerdict;
use crate::time::Nanos;

/// Remembered denials per worker: a direct-mapped table indexed by the bucket set's
/// fingerprint, so a lookup is one index and one comparison, and memory is fixed
/// (`REMEMBERED` × 64 bytes). A collision forgets the older denial, which only costs a
/// read.
pub const REMEMBERED: usize = 256;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Remembered {
    fingerprint: u64,
    cost: u64,
    at: Nanos,
    /// The verdict of the limit that needed the longest wait, as of `at`.
    binding: TierVerdict,
}

/// The denials one worker remembers (see the module documentation).
#[derive(Debug)]
pub struct RememberedDenials {
    entries: Box<[Cell<Option<Remembered>>]>,
}

impl Default for RememberedDenials {
    fn default() -> Self {
        Self {
            entries: (0..REMEMBERED).map(|_| Cell::new(None)).collect(),
        }
    }
}

impl Clone for RememberedDenials {
    /// A copy starts empty: what one worker remembers is its own, and forgetting is
    /// always safe.
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl RememberedDenials {
    fn entry(&self, fingerprint: u64) -> Option<&Cell<Option<Remembered>>> {
        // The modulus is below `REMEMBERED`, so the cast cannot truncate.
        self.entries.get((fingerprint % REMEMBERED as u64) as usize)
    }

    /// The denial that still stands at `now` for `cost` tokens of bucket set
    /// `fingerprint`, as a verdict of that moment (waits shortened by the time passed).
    pub fn standing(&self, fingerprint: u64, cost: u64, now: Nanos) -> Option<TierVerdict> {
        let known = self.entry(fingerprint)?.get()?;
        if known.fingerprint != fingerprint || cost < known.cost || now < known.at {
            return None;
        }
        let elapsed = now.get() - known.at.get();
        let verdict = known.binding.verdict;
        if elapsed >= verdict.retry_after_ns {
            return None;
        }
        let mut binding = known.binding;
        binding.verdict.retry_after_ns = verdict.retry_after_ns - elapsed;
        binding.verdict.reset_ns = verdict.reset_ns.saturating_sub(elapsed);
        Some(binding)
    }

    /// Remembers that bucket set `fingerprint` denied `cost` tokens at `now`.
    pub fn remember(&self, fingerprint: u64, cost: u64, now: Nanos, binding: TierVerdict) {
        if let Some(entry) = self.entry(fingerprint) {
            entry.set(Some(Remembered {
                fingerprint,
                cost,
                at: now,
                binding,
            }));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gcra::Verdict;

    fn denial(retry_after_ns: u64) -> TierVerdict {
        TierVerdict {
            tier: 1,
            verdict: Verdict {
                allowed: false,
                new_tat: Nanos::new(0),
                remaining: 0,
                reset_ns: retry_after_ns * 3,
                retry_after_ns,
            },
        }
    }

    #[test]
    fn a_denial_stands_for_its_wait_and_at_least_its_cost() {
        let memory = RememberedDenials::default();
        let at = Nanos::new(1_000);
        memory.remember(42, 2, at, denial(500));
        let later = memory.standing(42, 2, Nanos::new(1_200)).expect("stands");
        assert_eq!(later.verdict.retry_after_ns, 300);
        assert_eq!(later.verdict.reset_ns, 1_300);
        assert_eq!(later.tier, 1);
        assert!(
            memory.standing(42, 3, Nanos::new(1_200)).is_some(),
            "a dearer request"
        );
        assert!(
            memory.standing(42, 1, Nanos::new(1_200)).is_none(),
            "a cheaper one may fit"
        );
        assert!(
            memory.standing(42, 2, Nanos::new(1_500)).is_none(),
            "the wait is over"
        );
        assert!(
            memory.standing(43, 2, Nanos::new(1_200)).is_none(),
            "another bucket"
        );
    }

    #[test]
    fn a_clock_that_steps_back_is_a_miss() {
        let memory = RememberedDenials::default();
        memory.remember(7, 1, Nanos::new(1_000), denial(500));
        assert!(memory.standing(7, 1, Nanos::new(999)).is_none());
    }

    #[test]
    fn a_colliding_bucket_replaces_the_older_denial() {
        let memory = RememberedDenials::default();
        let (a, b) = (5, 5 + REMEMBERED as u64);
        memory.remember(a, 1, Nanos::new(0), denial(100));
        memory.remember(b, 1, Nanos::new(0), denial(100));
        assert!(memory.standing(a, 1, Nanos::new(1)).is_none());
        assert!(memory.standing(b, 1, Nanos::new(1)).is_some());
    }
}
