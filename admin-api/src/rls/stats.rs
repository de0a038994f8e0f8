//! The rate limit service's decisions in the same reports as the filter's: per rule exact
//! counts and a Space-Saving top of throttled clients (bounded whatever the traffic, as in
//! the filter: `sluice_core::report`), handed to the metrics pipeline every 2 s as a
//! report of the proxy id `rls@ADDR`, through the same checks as a proxy's report. So the
//! dashboard's charts, top clients and `GET /api/v1/metrics/*` show RLS traffic too, and
//! the rate limit service is listed among the proxies.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use sluice_core::report::{Report, RuleBatch, RuleCounts, RuleReport, TopClients};
use sluice_core::rls::{Code, Plan, Status};
use sluice_core::ruleset::NEAR_LIMIT_PERCENT;

use crate::http::{AppState, ReportBody};
use crate::store::now_ms;

/// How often the counts are handed to the pipeline, as proxies report.
pub(crate) const REPORT_EVERY: Duration = Duration::from_secs(2);

/// The decisions since the last report.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pending: Mutex<BTreeMap<String, (RuleCounts, TopClients)>>,
}

impl Stats {
    /// Counts one call's decisions.
    pub(crate) fn record(&self, plan: &Plan, statuses: &[Status]) {
        let request_denied = sluice_core::rls::verdict::overall(statuses) == Code::OverLimit;
        let mut pending = self
            .pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (status, planned) in statuses.iter().zip(&plan.descriptors) {
            let Some(matched) = &planned.rule else {
                continue;
            };
            // At most one entry per rule of the ruleset: bounded by the ruleset's size.
            let (counts, top) = pending.entry(matched.rule_id.clone()).or_default();
            match (status.failed, status.code, status.shadow_denied) {
                (true, Code::Ok, _) => counts.fail_open += 1,
                (_, Code::OverLimit, _) => {
                    counts.denied += 1;
                    top.record(&matched.client, 1, 0);
                }
                (false, Code::Ok, true) => {
                    counts.shadow_denied += 1;
                    top.record(&matched.client, 1, 0);
                }
                // Fitted, but another descriptor denied the request: nothing was charged.
                (false, Code::Ok, false) if request_denied && !matched.shadow => {}
                (false, Code::Ok, false) => {
                    counts.allowed += 1;
                    let near = status.limit.is_some_and(|l| {
                        (l.burst - status.remaining.min(l.burst)) * 100
                            >= l.burst * NEAR_LIMIT_PERCENT
                    });
                    counts.near_limit += u64::from(near);
                }
            }
        }
    }

    fn take(&self) -> RuleBatch {
        let pending = std::mem::take(
            &mut *self
                .pending
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        RuleBatch {
            rules: pending
                .into_iter()
                .map(|(rule, (counts, top))| RuleReport {
                    rule,
                    counts,
                    top_clients: top.sorted(),
                })
                .collect(),
            overflow: 0,
        }
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
