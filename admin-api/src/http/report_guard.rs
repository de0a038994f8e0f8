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

use std::collections::HashMap;

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

/// Each proxy id's last accepted report's `end_ms`; one entry per id a token may claim
/// (see `proxy_ids`), so bounded by tokens × ids per token.
#[derive(Debug, Default)]
pub(crate) struct ReportSeq {
    last_end: HashMap<String, i64>,
}

impl ReportSeq {
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
}
