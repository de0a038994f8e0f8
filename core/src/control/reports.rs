//! The workers' decision statistics on their way to the admin API.
//!
//! The control service merges what the workers queue, closes a [`Report`] every report
//! interval (when anything happened in it), and sends the reports one at a time, oldest
//! first. Reports the admin API cannot take now are kept, up to [`MAX_UNSENT`]; beyond
//! that the oldest is dropped and counted, and the count travels with the next report so
//! the admin API knows its figures have a gap.

use std::collections::VecDeque;

use crate::report::{Aggregate, Report, RuleBatch};
use crate::time::Nanos;

/// Reports kept while the admin API cannot take them (a minute at the default interval).
pub const MAX_UNSENT: usize = 30;

#[derive(Debug)]
pub struct ReportSender {
    proxy_id: String,
    interval: Nanos,
    /// Merged from the workers since `interval_start`.
    current: Aggregate,
    interval_start: Nanos,
    /// Finished reports not yet accepted, oldest first.
    unsent: VecDeque<Report>,
    dropped: u64,
    sending: bool,
}

/// What became of a sent report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReportOutcome {
    /// Taken: the next one may go at once (catching up after an outage).
    Accepted,
    /// The admin API will never take it (a revoked token, a format it refuses): dropped
    /// rather than retried forever.
    Refused(u16),
    /// Unreachable or failing: kept for the next interval.
    Kept,
}

impl ReportSender {
    pub fn new(proxy_id: String, interval: Nanos, now: Nanos) -> Self {
        ReportSender {
            proxy_id,
            interval,
            current: Aggregate::default(),
            interval_start: now,
            unsent: VecDeque::new(),
            dropped: 0,
            sending: false,
        }
    }

    /// Folds in a batch a worker queued.
    pub fn merge(&mut self, batch: &RuleBatch) {
        self.current.merge(batch);
    }

    /// Reports dropped so far because they could not be sent.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Reports waiting to be sent.
    pub fn unsent(&self) -> usize {
        self.unsent.len()
    }

    /// At `now`, closes the interval into a report when it is over and anything happened
    /// in it, the workers running `ruleset_version`. Returns whether the oldest unsent
    /// report was dropped to make room.
    pub fn tick(&mut self, now: Nanos, ruleset_version: u64) -> bool {
        if now < self.interval_start.saturating_add(self.interval) {
            return false;
        }
        let start = std::mem::replace(&mut self.interval_start, now);
        if self.current.is_empty() {
            return false;
        }
        let mut dropped = false;
        if self.unsent.len() >= MAX_UNSENT {
            self.unsent.pop_front();
            self.dropped += 1;
            dropped = true;
        }
        self.unsent.push_back(Report {
            proxy_id: self.proxy_id.clone(),
            start_ms: start.as_millis(),
            end_ms: now.as_millis(),
            ruleset_version,
            batch: self.current.take(),
            dropped_reports: self.dropped,
        });
        dropped
    }

    /// The body of the next report to send, unless one is on its way already; it then
    /// counts as on its way until [`answered`](Self::answered) or
    /// [`not_sent`](Self::not_sent).
    pub fn next_to_send(&mut self) -> Option<Vec<u8>> {
        if self.sending {
            return None;
        }
        let report = self.unsent.front()?;
        self.sending = true;
        Some(report.to_json())
    }

    /// The host would not send it: it stays first in line.
    pub fn not_sent(&mut self) {
        self.sending = false;
    }

    /// Takes the admin API's answer (`None`: no answer) to the report on its way.
    pub fn answered(&mut self, status: Option<u16>) -> ReportOutcome {
        self.sending = false;
        match status {
            Some(200..=299) => {
                self.unsent.pop_front();
                ReportOutcome::Accepted
            }
            Some(status @ 400..=499) => {
                self.unsent.pop_front();
                self.dropped += 1;
                ReportOutcome::Refused(status)
            }
            _ => ReportOutcome::Kept,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{RuleCounts, RuleReport};

    const S: u64 = 1_000_000_000;
    const START: u64 = 1_700_000_000 * S;

    fn batch(allowed: u64) -> RuleBatch {
        RuleBatch {
            rules: vec![RuleReport {
                rule: "api".to_string(),
                counts: RuleCounts {
                    allowed,
                    ..RuleCounts::default()
                },
                top_clients: Vec::new(),
                top_requesters: Vec::new(),
            }],
            overflow: 0,
        }
    }

    fn sender() -> ReportSender {
        ReportSender::new("edge-1".into(), Nanos::new(10 * S), Nanos::new(START))
    }

    fn sent(body: &[u8]) -> serde_json::Value {
        serde_json::from_slice(body).unwrap()
    }

    #[test]
    fn an_interval_with_traffic_becomes_one_report_sent_once() {
        let mut reports = sender();
        reports.merge(&batch(3));
        reports.merge(&batch(4));
        reports.tick(Nanos::new(START + 9 * S), 7);
        assert!(reports.next_to_send().is_none(), "the interval is not over");
        reports.tick(Nanos::new(START + 10 * S), 7);
        let body = sent(&reports.next_to_send().unwrap());
        assert_eq!(body["proxy_id"], "edge-1");
        assert_eq!(body["ruleset_version"], 7);
        assert_eq!(body["start_ms"], START / 1_000_000);
        assert_eq!(body["end_ms"], (START + 10 * S) / 1_000_000);
        assert!(body.to_string().contains("\"allowed\":7"), "{body}");
        assert!(reports.next_to_send().is_none(), "one on its way at a time");
        assert_eq!(reports.answered(Some(204)), ReportOutcome::Accepted);
        assert!(reports.next_to_send().is_none(), "sent once");
    }

    #[test]
    fn a_quiet_interval_sends_nothing() {
        let mut reports = sender();
        reports.tick(Nanos::new(START + 10 * S), 1);
        assert!(reports.next_to_send().is_none());
    }

    #[test]
    fn reports_wait_out_an_outage_in_order_and_the_oldest_make_room() {
        let mut reports = sender();
        let mut now = START;
        for i in 0..(MAX_UNSENT as u64 + 2) {
            reports.merge(&batch(i + 1));
            now += 10 * S;
            let dropped = reports.tick(Nanos::new(now), 1);
            assert_eq!(dropped, i >= MAX_UNSENT as u64, "interval {i}");
            if reports.next_to_send().is_some() {
                assert_eq!(reports.answered(None), ReportOutcome::Kept);
            }
        }
        assert_eq!((reports.unsent(), reports.dropped()), (MAX_UNSENT, 2));
        let first = sent(&reports.next_to_send().unwrap());
        assert!(
            first.to_string().contains("\"allowed\":3"),
            "the third is now the oldest"
        );
        assert_eq!(reports.answered(Some(200)), ReportOutcome::Accepted);
        // The backlog goes on at once, one answer after another; the reports made after
        // the drops say so.
        let mut last = first;
        while let Some(body) = reports.next_to_send() {
            last = sent(&body);
            assert_eq!(reports.answered(Some(200)), ReportOutcome::Accepted);
        }
        assert_eq!(last["dropped_reports"], 2);
        assert_eq!(reports.unsent(), 0);
    }

    #[test]
    fn a_refused_report_is_dropped_and_counted_and_an_unsent_one_stays() {
        let mut reports = sender();
        reports.merge(&batch(1));
        reports.tick(Nanos::new(START + 10 * S), 1);
        reports.next_to_send().unwrap();
        reports.not_sent();
        reports.next_to_send().expect("still first in line");
        assert_eq!(reports.answered(Some(403)), ReportOutcome::Refused(403));
        assert_eq!((reports.unsent(), reports.dropped()), (0, 1));
    }
}
