//! When a proxy's control service syncs its global buckets.

use crate::time::Nanos;

/// The control service syncs every interval ([`Pace::Interval`]), rarely while the
/// ruleset has no global limit ([`Pace::Idle`]: every [`IDLE_SYNC_INTERVALS`] intervals,
/// only to stay counted in the fleet), and sooner (but at most once per [`EARLY_SYNC`])
/// while it is in a hurry ([`Pace::Hurry`]):
/// - a bucket new to this proxy waits for its first answer: until then the bucket is held
///   to an even local share, and the fleet's refill beyond what those shares spend is lost;
/// - a lease ran out since the last sync (the limit binds): the refill since then waits at
///   the coordinator until this proxy asks, so the fleet admits what it allows about half
///   a sync gap plus an answer's trip late (in the fleet simulation at 5,000/s over 20 s,
///   0.9926 of `burst + rate × elapsed` at 250 ms gaps, 0.9965 at 100 ms). Limits that do
///   not bind keep the interval: their leases are sized to last several intervals;
/// - a ruleset with global limits replaced one without: the fleet counts this proxy again
///   before any of its buckets needs an even share.
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

/// The gap between the syncs of a proxy whose ruleset has no global limit, in sync
/// intervals (4 s at the default): it has nothing to report, and syncs only so that the
/// fleet still counts it ([`super::FLEET_MEMORY_INTERVALS`] is longer) and the admin API
/// still lists it. A thousand idle proxies then send 250 small requests a second instead
/// of 4,000.
pub const IDLE_SYNC_INTERVALS: u64 = 16;

/// How soon the next sync may go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pace {
    /// [`EARLY_SYNC`] after the last one.
    Hurry,
    /// One sync interval after the last one.
    Interval,
    /// [`IDLE_SYNC_INTERVALS`] intervals after the last one.
    Idle,
}

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

    /// Whether to sync at `now` at `pace`.
    pub fn due(&self, now: Nanos, pace: Pace) -> bool {
        let Some(last) = self.last_attempt else {
            return true;
        };
        let gap = match pace {
            Pace::Hurry => EARLY_SYNC.min(self.interval),
            Pace::Interval => self.interval,
            Pace::Idle => Nanos::new(self.interval.get().saturating_mul(IDLE_SYNC_INTERVALS)),
        };
        now.saturating_sub(last) >= gap
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
    fn syncs_every_interval_early_in_a_hurry_and_rarely_when_idle() {
        let mut schedule = SyncSchedule::new(at(T));
        assert!(schedule.due(at(0), Pace::Idle), "the first sync is at once");
        schedule.record(at(0), true);
        assert!(!schedule.due(at(T - 1), Pace::Interval));
        assert!(schedule.due(at(T), Pace::Interval));
        assert!(!schedule.due(at(EARLY_SYNC_NS - 1), Pace::Hurry));
        assert!(schedule.due(at(EARLY_SYNC_NS), Pace::Hurry));
        let idle = T * IDLE_SYNC_INTERVALS;
        assert!(!schedule.due(at(idle - 1), Pace::Idle));
        assert!(schedule.due(at(idle), Pace::Idle));
    }

    #[test]
    fn a_hurry_is_never_slower_than_the_interval() {
        let mut schedule = SyncSchedule::new(at(EARLY_SYNC_NS / 2));
        schedule.record(at(0), true);
        assert!(schedule.due(at(EARLY_SYNC_NS / 2), Pace::Hurry));
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
