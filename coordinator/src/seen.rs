//! What a coordinator saw of each proxy's syncs, and what `GET /api/v1/proxies` and the
//! overview make of it: whether the proxy is on its fallback shares.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use sluice_core::global::schedule::IDLE_SYNC_INTERVALS;

/// One proxy's syncs as a coordinator saw them (times in Unix milliseconds).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SyncSeen {
    /// Its last sync that was answered; with Redis, by any replica.
    pub answered_at_ms: Option<i64>,
    /// Its last sync this coordinator could not answer (Redis unreachable).
    pub failed_at_ms: Option<i64>,
    /// The last answer said the coordinator is warming up (no grants: the proxy keeps to
    /// its fallback shares).
    pub warming_up: bool,
    /// The sync interval it last declared.
    pub interval_ms: u64,
    /// When it said it would sync next at the latest, where later than one interval (an
    /// idle proxy: its ruleset has no global limit); 0: one interval.
    pub next_sync_ms: u64,
}

/// A proxy whose syncs went unanswered this many intervals (plus [`FALLBACK_SLACK_MS`])
/// is taken to be on its fallback shares: it switches after one failed sync.
pub const FALLBACK_AFTER_INTERVALS: i64 = 2;
pub const FALLBACK_SLACK_MS: i64 = 250;
/// The interval assumed for a proxy only another replica has heard from.
pub(crate) const DEFAULT_INTERVAL_MS: u64 =
    sluice_core::global::DEFAULT_SYNC_INTERVAL_NS / 1_000_000;
/// The gap assumed before the next sync of a proxy only another replica has heard from:
/// it may be idle, so it is taken to be on fallback only after an idle proxy would be.
pub(crate) const ASSUMED_NEXT_SYNC_MS: u64 = DEFAULT_INTERVAL_MS * IDLE_SYNC_INTERVALS;

impl SyncSeen {
    /// Whether the proxy is enforcing global limits with its fallback shares at `now_ms`:
    /// its last sync failed or was answered by a coordinator warming up, or none was
    /// answered for a while: [`FALLBACK_AFTER_INTERVALS`] intervals, or one interval past
    /// the next sync it announced, and [`FALLBACK_SLACK_MS`].
    pub fn on_fallback(&self, now_ms: i64) -> bool {
        if self.warming_up {
            return true;
        }
        match (self.answered_at_ms, self.failed_at_ms) {
            (_, Some(failed)) if self.answered_at_ms.is_none_or(|ok| failed > ok) => true,
            (Some(ok), _) => {
                let interval = i64::try_from(self.interval_ms).unwrap_or(i64::MAX);
                let next = i64::try_from(self.next_sync_ms).unwrap_or(i64::MAX);
                let silence = interval
                    .saturating_mul(FALLBACK_AFTER_INTERVALS)
                    .max(next.saturating_add(interval));
                now_ms - ok > silence.saturating_add(FALLBACK_SLACK_MS)
            }
            (None, _) => false,
        }
    }
}

/// How many of the latest answer times a coordinator keeps: bounded whatever the fleet.
pub const ANSWER_TIMES_KEPT: usize = 1_024;

/// How long this coordinator took to answer its latest syncs, each from its handler's
/// start (after authentication) to its answer: reading, checking and settling it, with
/// Redis's part. The overview shows them; `/metrics` has every request's duration by
/// route. Only answered syncs count.
#[derive(Debug, Default)]
pub struct AnswerTimes {
    latest: VecDeque<(Instant, Duration)>,
}

/// What the answer times within a window say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AnswerTimesSummary {
    pub samples: usize,
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
}

impl AnswerTimes {
    /// Records a sync answered at `at` that took `took`.
    pub fn record(&mut self, at: Instant, took: Duration) {
        if self.latest.len() == ANSWER_TIMES_KEPT {
            self.latest.pop_front();
        }
        self.latest.push_back((at, took));
    }

    /// The answer times of the kept syncs answered within `within` before `now`; `None`
    /// when there are none.
    pub fn summary(&self, now: Instant, within: Duration) -> Option<AnswerTimesSummary> {
        let mut times: Vec<Duration> = self
            .latest
            .iter()
            .filter(|(at, _)| now.saturating_duration_since(*at) <= within)
            .map(|(_, took)| *took)
            .collect();
        times.sort_unstable();
        let at = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
        (!times.is_empty()).then(|| AnswerTimesSummary {
            samples: times.len(),
            p50: at(0.5),
            p99: at(0.99),
            max: at(1.0),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proxy_is_on_fallback_after_a_failed_or_long_unanswered_sync() {
        let seen = |answered, failed| SyncSeen {
            answered_at_ms: answered,
            failed_at_ms: failed,
            warming_up: false,
            interval_ms: 500,
            next_sync_ms: 0,
        };
        assert!(!seen(None, None).on_fallback(10_000), "never synced");
        assert!(!seen(Some(10_000), None).on_fallback(11_250));
        assert!(
            seen(Some(10_000), None).on_fallback(11_251),
            "two intervals and the slack without an answer"
        );
        assert!(seen(Some(10_000), Some(10_400)).on_fallback(10_400));
        assert!(seen(None, Some(10_400)).on_fallback(10_400));
        assert!(
            !seen(Some(10_500), Some(10_400)).on_fallback(10_600),
            "answered again since"
        );
        let warming = SyncSeen {
            warming_up: true,
            ..seen(Some(10_500), None)
        };
        assert!(warming.on_fallback(10_600), "no grants while warming up");
        let idle = SyncSeen {
            next_sync_ms: 8_000,
            ..seen(Some(10_000), None)
        };
        assert!(
            !idle.on_fallback(18_750),
            "an idle proxy: its announced sync, an interval and the slack"
        );
        assert!(idle.on_fallback(18_751));
    }

    #[test]
    fn answer_times_keep_the_latest_and_summarise_a_window() {
        let start = Instant::now();
        let mut times = AnswerTimes::default();
        assert_eq!(times.summary(start, Duration::from_secs(60)), None);
        for i in 0..(ANSWER_TIMES_KEPT as u64 + 100) {
            times.record(
                start + Duration::from_millis(i),
                Duration::from_millis(i % 100),
            );
        }
        assert_eq!(times.latest.len(), ANSWER_TIMES_KEPT, "bounded");
        let now = start + Duration::from_millis(ANSWER_TIMES_KEPT as u64 + 100);
        let all = times.summary(now, Duration::from_secs(60)).unwrap();
        assert_eq!(all.samples, ANSWER_TIMES_KEPT);
        assert_eq!(all.max, Duration::from_millis(99));
        assert_eq!(
            all.p50,
            Duration::from_millis(48),
            "0 to 23 appear once more"
        );
        assert_eq!(all.p99, Duration::from_millis(98));
        let recent = times.summary(now, Duration::from_millis(10)).unwrap();
        assert_eq!(recent.samples, 10, "only the window's");
    }
}
