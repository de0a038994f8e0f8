//! A token limit's commit on a global bucket: the lease entry moves from the reservation
//! to the usage reported (see `crate::tokens`).

use super::lease::{FleetView, LeaseEntry, Spend};
use crate::time::Nanos;
use crate::tokens::TokenChange;

impl LeaseEntry {
    /// Settles one token reservation spent as `spent`: unused tokens go back where they
    /// came from ([`LeaseEntry::undo`]: the lease, or the local share); extra usage comes
    /// from the live lease first, and the rest is unleased spending, which the
    /// coordinator debits from the fleet's bucket at the next sync (into a debt of at most
    /// one burst and a token per proxy there). While this proxy spends its local share, the extra also goes
    /// into the share's bucket, as debt of at most one burst. Returns the tokens forgiven
    /// at that bound.
    pub fn settle_tokens(
        &mut self,
        change: &TokenChange,
        spent: Spend,
        now: Nanos,
        view: &FleetView,
    ) -> u64 {
        if change.used < change.reserved {
            self.undo(change.reserved - change.used, spent, now, view);
            return 0;
        }
        let extra = change.used - change.reserved;
        self.attempts = self.attempts.saturating_add(extra);
        let from_lease = if self.lease_spendable(now, view) {
            self.balance.min(extra)
        } else {
            0
        };
        self.balance -= from_lease;
        let rest = extra - from_lease;
        if rest == 0 {
            return 0;
        }
        // The coordinator refuses a whole sync whose unleased spending for a bucket is
        // more than twice its burst and the refill (`guard::most_held`), and takes at
        // most one burst of debt (and a token per proxy) anyway: an upstream reporting absurd usage must not
        // cost the proxy its syncs. Beyond two bursts a settlement window is forgiven.
        let room = self.burst.saturating_mul(2).saturating_sub(self.unleased);
        let charged = rest.min(room);
        let beyond = rest - charged;
        self.unleased += charged;
        if self.lease_only(now, view) {
            return beyond;
        }
        match self.local_limit(view) {
            Some(local) => {
                let (tat, forgiven) = local.charge_debt(self.local_tat, now, charged);
                self.local_tat = tat;
                forgiven.saturating_add(beyond)
            }
            None => beyond,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU64;

    use super::*;
    use crate::gcra::Gcra;
    use crate::rule::{Counts, Limit};
    use crate::spec::UsageMeasure;
    use crate::time::NANOS_PER_SECOND;

    fn change(reserved: u64, used: u64) -> TokenChange {
        let gcra = Gcra::new(
            NonZeroU64::new(100).unwrap(),
            NonZeroU64::new(NANOS_PER_SECOND).unwrap(),
            NonZeroU64::new(100).unwrap(),
        )
        .unwrap();
        TokenChange {
            limit: Limit {
                requests: 100,
                period_seconds: 1,
                burst: 100,
                gcra,
                identity: 1,
                global: true,
                counts: Counts::Tokens(UsageMeasure::Total),
                soft: None,
            },
            reserved,
            used,
        }
    }

    #[test]
    fn refunds_go_back_to_the_lease_and_extra_comes_from_it_then_is_unleased() {
        let now = Nanos::new(1_000 * NANOS_PER_SECOND);
        let view = FleetView::ALONE;
        let mut entry = LeaseEntry::new(7, &change(0, 0).limit.gcra, now);
        entry.settled = true;
        entry.balance = 50;
        entry.expires_at = Nanos::new(now.get() + NANOS_PER_SECOND);
        // A reservation of 30 from the lease, 10 used: 20 back.
        assert_eq!(
            entry.settle_tokens(&change(30, 10), Spend::Lease, now, &view),
            0
        );
        assert_eq!(entry.balance, 70);
        // 90 used of 10 reserved: 70 from the lease, 10 unleased.
        entry.settle_tokens(&change(10, 90), Spend::Lease, now, &view);
        assert_eq!((entry.balance, entry.unleased), (0, 10));
    }

    /// An absurd usage (10^12 tokens) leaves at most two bursts unleased, what the
    /// coordinator accepts in a sync; the rest is forgiven and said so.
    #[test]
    fn absurd_usage_never_makes_a_sync_the_coordinator_refuses() {
        let now = Nanos::new(1_000 * NANOS_PER_SECOND);
        let view = FleetView::ALONE;
        let mut entry = LeaseEntry::new(7, &change(0, 0).limit.gcra, now);
        entry.settled = true;
        let forgiven =
            entry.settle_tokens(&change(10, 1_000_000_000_000), Spend::Lease, now, &view);
        assert_eq!(entry.unleased, 200, "two bursts of 100");
        assert!(forgiven >= 1_000_000_000_000 - 10 - 200, "{forgiven}");
        let again = entry.settle_tokens(&change(10, 500), Spend::Lease, now, &view);
        assert_eq!(entry.unleased, 200);
        assert!(again >= 490, "{again}");
    }
}
