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
///
/// The interval adapts to the coordinator ([`SyncSchedule::adapt`]): while its answers
/// are slow the proxy syncs less often instead of piling syncs onto it, up to
/// [`MAX_STRETCH`] times the configured interval (a hurry's gap stretches alike; idle
/// syncs keep the configured pace), and comes back step by step as answers speed up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyncSchedule {
    /// The interval the configuration asks for.
    configured: Nanos,
    /// The interval in force: `configured`, stretched while answers are slow.
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

/// The interval stretches to at most this many times the configured one.
pub const MAX_STRETCH: u64 = 4;

/// The longest interval whatever the stretch: the longest a coordinator accepts in a sync
/// (and a configuration may ask for).
pub const MAX_SYNC_INTERVAL: Nanos = Nanos::from_secs(10);

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
            configured: interval,
            interval,
            last_attempt: None,
            last_success: None,
        }
    }

    /// The interval in force: the configured one, or longer while answers are slow.
    pub fn interval(&self) -> Nanos {
        self.interval
    }

    /// The interval the configuration asks for.
    pub fn configured(&self) -> Nanos {
        self.configured
    }

    /// Adapts the interval to how long a sync waited for its answer (`took`; for a sync
    /// given up on, until then): an answer slower than half the interval in force doubles
    /// it, up to [`MAX_STRETCH`] times the configured one (and [`MAX_SYNC_INTERVAL`]);
    /// any other brings it back by a quarter of the configured one, never below it. A
    /// coordinator that is struggling gets fewer syncs from each proxy, each covering
    /// more time; one that recovered gets the configured pace back within
    /// `4 × (MAX_STRETCH − 1)` fast answers.
    pub fn adapt(&mut self, took: Nanos) {
        let longest = Nanos::new(self.configured.get().saturating_mul(MAX_STRETCH))
            .min(MAX_SYNC_INTERVAL)
            .max(self.configured);
        self.interval = if took.get() > self.interval.get() / 2 {
            Nanos::new(self.interval.get().saturating_mul(2)).min(longest)
        } else {
            self.interval
                .saturating_sub(Nanos::new(self.configured.get() / 4))
                .max(self.configured)
        };
    }

    /// Whether to sync at `now` at `pace`.
    pub fn due(&self, now: Nanos, pace: Pace) -> bool {
        let Some(last) = self.last_attempt else {
            return true;
        };
        let gap = match pace {
            Pace::Hurry => self.early_gap(),
            Pace::Interval => self.interval,
            // The configured interval: an idle sync is small, and the fleet's memory of a
            // proxy is counted in configured intervals.
            Pace::Idle => Nanos::new(self.configured.get().saturating_mul(IDLE_SYNC_INTERVALS)),
        };
        now.saturating_sub(last) >= gap
    }

    /// The gap of a sync in a hurry: [`EARLY_SYNC`], stretched as the interval is (a proxy
    /// whose limit binds would otherwise send one sync after another to a coordinator
    /// that is already slow), and never longer than the interval.
    fn early_gap(&self) -> Nanos {
        let stretched = u128::from(EARLY_SYNC.get()) * u128::from(self.interval.get())
            / u128::from(self.configured.get().max(1));
        Nanos::new(u64::try_from(stretched).unwrap_or(u64::MAX)).min(self.interval)
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
    fn slow_answers_stretch_the_interval_up_to_four_times_and_fast_ones_bring_it_back() {
        let mut schedule = SyncSchedule::new(at(T));
        schedule.adapt(at(T / 2));
        assert_eq!(schedule.interval(), at(T), "half the interval is not slow");
        schedule.adapt(at(T / 2 + 1));
        assert_eq!(schedule.interval(), at(2 * T), "one ns slower doubles it");
        schedule.adapt(at(T + 1));
        assert_eq!(schedule.interval(), at(4 * T));
        schedule.adapt(at(10 * T));
        assert_eq!(schedule.interval(), at(4 * T), "at most four times");
        schedule.record(at(0), true);
        assert!(
            !schedule.due(at(4 * T - 1), Pace::Interval),
            "syncs at the stretched pace"
        );
        assert!(schedule.due(at(4 * T), Pace::Interval));
        assert!(
            schedule.due(at(T * IDLE_SYNC_INTERVALS), Pace::Idle),
            "idle syncs keep the configured pace"
        );
        assert!(
            !schedule.due(at(4 * EARLY_SYNC_NS - 1), Pace::Hurry),
            "a hurry stretches too"
        );
        assert!(schedule.due(at(4 * EARLY_SYNC_NS), Pace::Hurry));

        schedule.adapt(at(2 * T));
        assert_eq!(
            schedule.interval(),
            at(4 * T - T / 4),
            "at half: fast, a quarter back"
        );
        for _ in 0..20 {
            schedule.adapt(at(1));
        }
        assert_eq!(
            schedule.interval(),
            at(T),
            "never below the configured interval"
        );
        assert_eq!(schedule.configured(), at(T));
    }

    #[test]
    fn a_stretched_interval_stays_within_what_a_coordinator_accepts() {
        let long = MAX_SYNC_INTERVAL.get() / 2;
        let mut schedule = SyncSchedule::new(at(long));
        schedule.adapt(at(long));
        schedule.adapt(at(long * 2));
        assert_eq!(schedule.interval(), MAX_SYNC_INTERVAL);
        let mut longest = SyncSchedule::new(MAX_SYNC_INTERVAL);
        longest.adapt(MAX_SYNC_INTERVAL);
        assert_eq!(longest.interval(), MAX_SYNC_INTERVAL, "already the longest");
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
