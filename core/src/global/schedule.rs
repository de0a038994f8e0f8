//! When a proxy's control service syncs its global buckets.

use crate::time::Nanos;

/// The control service syncs every interval, and sooner (but at most once per
/// [`EARLY_SYNC`]) while it is in a hurry:
/// - a bucket new to this proxy waits for its first answer: until then the bucket is held
///   to an even local share, and the fleet's refill beyond what those shares spend is lost;
/// - a lease ran out since the last sync (the limit binds): the refill since then waits at
///   the coordinator until this proxy asks, so the fleet admits what it allows about half
///   a sync gap plus an answer's trip late (in the fleet simulation at 5,000/s over 20 s,
///   0.9926 of `burst + rate × elapsed` at 250 ms gaps, 0.9965 at 100 ms). Limits that do
///   not bind keep the interval: their leases are sized to last several intervals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyncSchedule {
    interval: Nanos,
    /// When the last sync was sent, answered or not.
    last_attempt: Option<Nanos>,
    /// When the last answered sync was sent: the usage collected since then is what the
    /// next sync covers.
    last_success: Option<Nanos>,
}

/// How often the control service checks whether a sync is due. A sync goes out on the
/// first tick after it is due, so the tick is a fifth of the default interval: at the
/// workers' 100 ms, 250 ms syncs would go out every 300 ms, and the refill each proxy is
/// owed waits at the coordinator that much longer. A tick with nothing due costs a couple
/// of shared-data calls on Envoy's main thread.
pub const CONTROL_TICK: Nanos = Nanos::from_millis(50);

/// The shortest gap between two syncs: the workers' tick, so a new bucket is settled within
/// a couple of ticks of its first request.
pub const EARLY_SYNC: Nanos = Nanos::from_millis(100);

impl SyncSchedule {
    pub fn new(interval: Nanos) -> Self {
        Self {
            interval,
            last_attempt: None,
            last_success: None,
        }
    }

    pub fn interval(&self) -> Nanos {
        self.interval
    }

    /// Whether to sync at `now`; `hurry` says whether a bucket waits for its first answer
    /// or a lease ran out since the last sync.
    pub fn due(&self, now: Nanos, hurry: bool) -> bool {
        let Some(last) = self.last_attempt else {
            return true;
        };
        let since = now.saturating_sub(last);
        since >= self.interval || (hurry && since >= EARLY_SYNC)
    }

    /// How long the usage collected at `now` covers: the time since the last answered sync
    /// (one interval before the first).
    pub fn covers(&self, now: Nanos) -> Nanos {
        self.last_success
            .map_or(self.interval, |last| now.saturating_sub(last))
            .max(Nanos::new(1))
    }

    /// Records a sync sent at `now` and whether it was answered.
    pub fn record(&mut self, now: Nanos, answered: bool) {
        self.last_attempt = Some(now);
        if answered {
            self.last_success = Some(now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: u64 = 500_000_000;
    const EARLY_SYNC_NS: u64 = EARLY_SYNC.get();

    fn at(ns: u64) -> Nanos {
        Nanos::new(ns)
    }

    #[test]
    fn syncs_every_interval_and_early_for_new_buckets() {
        let mut schedule = SyncSchedule::new(at(T));
        assert!(schedule.due(at(0), false), "the first sync is at once");
        schedule.record(at(0), true);
        assert!(!schedule.due(at(T - 1), false));
        assert!(schedule.due(at(T), false));
        assert!(!schedule.due(at(EARLY_SYNC_NS - 1), true));
        assert!(schedule.due(at(EARLY_SYNC_NS), true));
    }

    #[test]
    fn usage_covers_the_time_since_the_last_answer() {
        let mut schedule = SyncSchedule::new(at(T));
        assert_eq!(schedule.covers(at(7)).get(), T);
        schedule.record(at(10), true);
        schedule.record(at(10 + T), false);
        assert_eq!(
            schedule.covers(at(10 + 2 * T)).get(),
            2 * T,
            "a failed sync does not count"
        );
    }
}
