//! What one proxy id's reports may claim: they move forward in time, at most one per
//! [`MIN_SPACING_MS`] of reported time, and their counts fit the time they cover.
//!
//! A report's counts go straight into the dashboard's totals, so a leaked proxy token
//! could otherwise make up any traffic (10^12 a count) or send one report many times.
//! Each proxy id's last accepted `end_ms` is kept: a report must end at least
//! [`MIN_SPACING_MS`] later (a resent report, a replay, is refused), and every count must
//! be at most [`MAX_DECISIONS_PER_SECOND`] × the time the report covers: since the last
//! accepted report, and at most its own `end_ms − start_ms` (1 s to 5 min). Reports can
//! then add at most that ceiling per rule and per second of reported time, which itself
//! runs at most 5 minutes ahead of the server's clock. Kept in this process: another
//! replica keeps its own sequence.
//!
//! Reported time is the sender's to choose, so reports are also limited as they arrive,
//! in real time: each proxy id may send [`ReportRate::per_minute`] reports a minute, with
//! a burst of [`ReportRate::burst`] (`sluice serve --report-rate`, `--report-burst`); more
//! are answered 429 with `Retry-After` before anything else of them is looked at.

use std::collections::HashMap;
use std::num::NonZeroU64;
use std::time::{Duration, Instant};

use sluice_core::gcra::Gcra;
use sluice_core::time::Nanos;

/// The most decisions one proxy reports for one rule per second (a count's ceiling is this
/// × the report's window): far above what one Envoy decides (~100,000/s per core).
pub const MAX_DECISIONS_PER_SECOND: u64 = 1_000_000;
/// The least reported time between two reports of one proxy id (proxies report every 1
/// to 300 s; half the shortest leaves room for timer jitter).
pub const MIN_SPACING_MS: i64 = 500;
/// A report's own window counts as at least this long (its `start_ms` is the proxy's
/// clock, which may step)...
pub const MIN_WINDOW_MS: i64 = 1_000;
/// ...and at most this long: the longest report interval a proxy may use.
pub const MAX_WINDOW_MS: i64 = 300_000;

/// Why a report's timing was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SeqRefusal {
    /// It ends no later than [`MIN_SPACING_MS`] after this proxy id's last accepted report.
    Replay { last_end_ms: i64 },
}

/// Reports one proxy id may send a minute, by default: twice what the fastest proxy
/// sends (`report_interval_seconds` is 1 to 300, 2 by default: 30 a minute).
pub const DEFAULT_REPORTS_PER_MINUTE: u64 = 120;
/// Reports one proxy id may send at once, by default: room for a proxy whose reports
/// were held up on the way, not for a flood.
pub const DEFAULT_REPORT_BURST: u64 = 10;

/// How many reports one proxy id may send as they arrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReportRate {
    pub per_minute: u64,
    pub burst: u64,
}

impl Default for ReportRate {
    fn default() -> Self {
        ReportRate {
            per_minute: DEFAULT_REPORTS_PER_MINUTE,
            burst: DEFAULT_REPORT_BURST,
        }
    }
}

impl ReportRate {
    /// The rate as a token bucket; `None` when it cannot be one (0 a minute or at once,
    /// or more than a billion a second).
    pub fn gcra(self) -> Option<Gcra> {
        let interval = NonZeroU64::new(60_000_000_000u64.checked_div(self.per_minute)?)?;
        Gcra::new(NonZeroU64::MIN, interval, NonZeroU64::new(self.burst)?).ok()
    }
}

/// Each proxy id's last accepted report's `end_ms`, and when its reports arrived (as a
/// token bucket's theoretical arrival time); one entry per id a token may claim (see
/// `proxy_ids`), so bounded by tokens × ids per token.
#[derive(Debug)]
pub(crate) struct ReportSeq {
    last_end: HashMap<String, i64>,
    rate: Gcra,
    arrivals: HashMap<String, u64>,
    epoch: Instant,
}

impl Default for ReportSeq {
    fn default() -> Self {
        let Some(rate) = ReportRate::default().gcra() else {
            unreachable!("the default report rate is a valid bucket")
        };
        ReportSeq {
            last_end: HashMap::new(),
            rate,
            arrivals: HashMap::new(),
            epoch: Instant::now(),
        }
    }
}

impl ReportSeq {
    /// Limits each proxy id's reports to `rate` (ignored when it is not a valid bucket:
    /// `sluice serve` checks its flags with [`ReportRate::gcra`] first).
    pub(crate) fn set_rate(&mut self, rate: ReportRate) {
        if let Some(rate) = rate.gcra() {
            self.rate = rate;
        }
    }

    /// Counts a report of `proxy` arriving at `at`, or says how long until one may.
    pub(crate) fn arrive(&mut self, proxy: &str, at: Instant) -> Result<(), Duration> {
        let now = u64::try_from(at.saturating_duration_since(self.epoch).as_nanos())
            .unwrap_or(u64::MAX)
            // Far enough from zero that a new id's bucket reads as full.
            .saturating_add(self.rate.capacity_ns());
        let tat = self.arrivals.get(proxy).copied().unwrap_or(0);
        let verdict = self.rate.check(Nanos::new(tat), Nanos::new(now), 1);
        if !verdict.allowed {
            return Err(Duration::from_nanos(verdict.retry_after_ns));
        }
        self.arrivals
            .insert(proxy.to_string(), verdict.new_tat.get());
        Ok(())
    }

    /// The window (ms) whose ceiling the report's counts must fit in, or why it is refused.
    pub(crate) fn window_ms(
        &self,
        proxy: &str,
        start_ms: i64,
        end_ms: i64,
    ) -> Result<i64, SeqRefusal> {
        let own = end_ms
            .saturating_sub(start_ms)
            .clamp(MIN_WINDOW_MS, MAX_WINDOW_MS);
        match self.last_end.get(proxy) {
            None => Ok(own),
            Some(&last) if end_ms < last.saturating_add(MIN_SPACING_MS) => {
                Err(SeqRefusal::Replay { last_end_ms: last })
            }
            Some(&last) => Ok(own.min(end_ms - last)),
        }
    }

    /// Records an accepted report.
    pub(crate) fn accept(&mut self, proxy: &str, end_ms: i64) {
        self.last_end.insert(proxy.to_string(), end_ms);
    }
}

/// The most any count of a report covering `window_ms` may be.
pub(crate) fn ceiling(window_ms: i64) -> u64 {
    let ms = u64::try_from(window_ms.max(0)).unwrap_or(0);
    (MAX_DECISIONS_PER_SECOND * ms).div_ceil(1_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_move_forward_and_their_window_is_bounded() {
        let mut seq = ReportSeq::default();
        assert_eq!(
            seq.window_ms("p", 0, 1_000_000),
            Ok(MAX_WINDOW_MS),
            "start 0"
        );
        assert_eq!(seq.window_ms("p", 9_000, 10_000), Ok(MIN_WINDOW_MS));
        assert_eq!(
            seq.window_ms("p", 20_000, 10_000),
            Ok(MIN_WINDOW_MS),
            "clock stepped"
        );
        seq.accept("p", 10_000);
        let replay = Err(SeqRefusal::Replay {
            last_end_ms: 10_000,
        });
        assert_eq!(
            seq.window_ms("p", 8_000, 10_000),
            replay,
            "the same report again"
        );
        assert_eq!(
            seq.window_ms("p", 8_000, 10_499),
            replay,
            "just under the spacing"
        );
        assert_eq!(seq.window_ms("p", 8_000, 10_500), Ok(500), "at the spacing");
        assert_eq!(
            seq.window_ms("p", 0, 12_000),
            Ok(2_000),
            "since the last report, whatever the start says"
        );
        assert_eq!(seq.window_ms("q", 8_000, 10_000), Ok(2_000), "another id");
        assert_eq!(ceiling(2_000), 2_000_000);
        assert_eq!(ceiling(MAX_WINDOW_MS), 300_000_000);
    }

    #[test]
    fn each_proxy_ids_reports_are_limited_as_they_arrive() {
        let mut seq = ReportSeq::default();
        seq.set_rate(ReportRate {
            per_minute: 120,
            burst: 3,
        });
        let start = seq.epoch;
        for _ in 0..3 {
            assert_eq!(seq.arrive("p", start), Ok(()), "the burst");
        }
        assert_eq!(
            seq.arrive("p", start),
            Err(Duration::from_millis(500)),
            "one over the burst waits one interval"
        );
        assert_eq!(seq.arrive("q", start), Ok(()), "another id has its own");
        let later = start + Duration::from_millis(500);
        assert_eq!(seq.arrive("p", later), Ok(()), "one more per 500 ms");
        assert!(seq.arrive("p", later).is_err());
        assert_eq!(
            ReportRate {
                per_minute: 0,
                burst: 1
            }
            .gcra(),
            None
        );
        assert_eq!(
            ReportRate {
                per_minute: 1,
                burst: 0
            }
            .gcra(),
            None
        );
    }
}
