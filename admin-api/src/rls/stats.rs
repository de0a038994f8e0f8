//! The rate limit service's and the quota service's decisions in the same reports as the
//! filter's: counted by the filter's own `sluice_core::report::Aggregate` (per rule exact
//! counts and a Space-Saving top of throttled clients, bounded whatever the traffic), handed to the metrics pipeline every 2 s as a
//! report of the proxy id `rls@ADDR`, through the same checks as a proxy's report. So the
//! dashboard's charts, top clients and `GET /api/v1/metrics/*` show RLS traffic too, and
//! the rate limit service is listed among the proxies. The same batch is added to the
//! per-rule counters at `/metrics`, named as the filter's are in Envoy.

use std::sync::Mutex;
use std::time::Duration;

use sluice_core::report::{Aggregate, Report, RuleBatch};
use sluice_core::rls::outcome::{outcomes, quota_outcomes};
use sluice_core::rls::{Matched, Plan, Status};

use crate::http::{AppState, ReportBody};
use crate::store::now_ms;

/// How often the counts are handed to the pipeline, as proxies report.
pub(crate) const REPORT_EVERY: Duration = Duration::from_secs(2);

/// The decisions since the last report, in the filter's own aggregate.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pending: Mutex<Aggregate>,
}

impl Stats {
    fn pending(&self) -> std::sync::MutexGuard<'_, Aggregate> {
        self.pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Counts one `ShouldRateLimit` call's decisions: each descriptor a rule decided, for
    /// that rule and the client its values name.
    pub(crate) fn record(&self, plan: &Plan, statuses: &[Status]) {
        let mut pending = self.pending();
        for (planned, outcome) in outcomes(plan, statuses) {
            if let Some(matched) = &planned.rule {
                pending.record_outcomes(&matched.rule_id, outcome, &matched.client, 1, 0);
            }
        }
    }

    /// Counts one bucket's usage in a quota report: the requests Envoy's quota filter
    /// allowed (of which a shadow rule would have denied `shadow_denied`) and denied since
    /// its last report.
    pub(crate) fn record_quota(
        &self,
        matched: &Matched,
        allowed: u64,
        denied: u64,
        shadow_denied: u64,
    ) {
        let mut pending = self.pending();
        for (outcome, requests) in quota_outcomes(allowed, denied, shadow_denied) {
            if requests > 0 {
                pending.record_outcomes(&matched.rule_id, outcome, &matched.client, requests, 0);
            }
        }
    }

    fn take(&self) -> RuleBatch {
        self.pending().take()
    }

    /// Hands the counts to the pipeline every [`REPORT_EVERY`] until shutdown, then once
    /// more.
    pub(crate) async fn run(&self, state: AppState, proxy_id: String) {
        let mut tick = tokio::time::interval(REPORT_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let stopping = state.shutting_down();
        tokio::pin!(stopping);
        let mut start_ms = now_ms();
        loop {
            let last = tokio::select! {
                _ = tick.tick() => false,
                () = &mut stopping => true,
            };
            start_ms = self.report(&state, &proxy_id, start_ms);
            if last {
                return;
            }
        }
    }

    /// Reports what was counted since `start_ms`; returns when this report ended.
    fn report(&self, state: &AppState, proxy_id: &str, start_ms: i64) -> i64 {
        let batch = self.take();
        let end_ms = now_ms();
        if batch.rules.is_empty() {
            return end_ms;
        }
        state.rls_metrics().per_rule.add(&batch);
        let report = Report {
            proxy_id: proxy_id.to_string(),
            start_ms: u64::try_from(start_ms).unwrap_or(0),
            end_ms: u64::try_from(end_ms).unwrap_or(0),
            ruleset_version: *state.versions().borrow(),
            batch,
            dropped_reports: 0,
        };
        // The same checks as a proxy's report; what fails them is logged and dropped.
        let checked = serde_json::to_value(&report)
            .ok()
            .and_then(|json| serde_json::from_value::<ReportBody>(json).ok())
            .map(|body| body.validate(end_ms));
        match checked {
            Some(Ok(valid)) => {
                if let Err(err) =
                    state
                        .pipeline()
                        .ingest(&valid, None, "rate limit service".into(), end_ms)
                {
                    tracing::warn!(%err, "rate limit service: its decisions' counts were dropped");
                }
            }
            Some(Err(errors)) => {
                tracing::warn!(%errors, "rate limit service: its report was refused");
            }
            None => tracing::warn!("rate limit service: its report could not be written"),
        }
        end_ms
    }
}
