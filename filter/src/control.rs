//! The control service: a singleton root context on Envoy's main thread (bootstrap
//! extension, same `vm_id` and module as the filter) that follows the admin API.
//!
//! It long-polls `GET /api/v1/ruleset?after=VERSION`: the admin API answers at once when
//! a newer ruleset exists and otherwise holds the request until one does. Each answer is
//! validated whole before it is published to the workers; a ruleset that fails is
//! refused (the last good one stays) and reported on the next poll. When the admin API
//! is unreachable or answers garbage, the service retries with exponential backoff and
//! the workers keep enforcing what they have.
//!
//! It also drains the workers' decision statistics from the `sluice.reports` shared
//! queue, merges them, and POSTs a [`Report`] every `report_interval_seconds`. Reports
//! the admin API cannot take are kept in a bounded buffer, then dropped and counted.

use std::collections::VecDeque;
use std::time::{Duration, UNIX_EPOCH};

use proxy_wasm::hostcalls;
use proxy_wasm::types::{BufferType, MapType};
use sluice_core::config::ControlConfigSpec;
use sluice_core::report::{Aggregate, REPORTS_PATH, Report, RuleBatch};
use sluice_core::wire::{
    PROXY_ERROR_HEADER, PROXY_ID_HEADER, PROXY_RULESET_VERSION_HEADER, RULESET_PATH,
    RulesetDocument,
};

use crate::global_sync::GlobalSync;
use crate::metrics::ControlMetrics;
use crate::{report_channel, ruleset_channel};

/// How often the service checks whether a retry or a sync is due: the workers' tick, so a
/// new global bucket is synced within a couple of ticks.
pub const TICK: Duration = Duration::from_millis(100);
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
// Short enough that a restarted admin API is followed again within seconds.
const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// Extra time the HTTP call may take beyond the poll's own hold time.
const CALL_SLACK: Duration = Duration::from_secs(5);
/// Longest error text sent back to the admin API.
const MAX_ERROR_LEN: usize = 300;
/// Reports kept while the admin API cannot take them (a minute at the default interval).
const MAX_UNSENT_REPORTS: usize = 30;
const REPORT_TIMEOUT: Duration = Duration::from_secs(5);

/// The control service's state between callbacks.
#[derive(Debug)]
pub struct ControlService {
    config: ControlConfigSpec,
    proxy_id: String,
    /// The version published to the workers.
    running_version: u64,
    /// The newest version seen, including a refused one, so a bad ruleset is not
    /// fetched again in a loop: the next poll waits for a newer one.
    seen_version: u64,
    last_error: Option<String>,
    /// The outstanding poll, if any.
    poll_call: Option<u32>,
    retry_at: Duration,
    backoff: Duration,
    reports: Reports,
    global: GlobalSync,
    metrics: ControlMetrics,
}

/// Statistics on their way to the admin API.
#[derive(Debug, Default)]
struct Reports {
    queue: Option<u32>,
    /// Merged from the workers since `interval_start`.
    current: Aggregate,
    interval_start: Duration,
    /// Finished reports not yet accepted by the admin API, oldest first.
    unsent: VecDeque<Report>,
    dropped: u64,
    /// The outstanding POST, if any.
    call: Option<u32>,
}

impl ControlService {
    pub fn new(config: ControlConfigSpec) -> ControlService {
        let proxy_id = config.proxy_id.clone().unwrap_or_else(default_proxy_id);
        // After a VM reload, shared data still holds what this service published.
        let running_version = ruleset_channel::published_version()
            .ok()
            .flatten()
            .unwrap_or(0);
        log::info!(
            "control service for proxy {proxy_id}: following the admin API through cluster {} \
             from ruleset version {running_version}",
            config.admin_cluster
        );
        ControlService {
            global: GlobalSync::new(&config),
            config,
            proxy_id,
            running_version,
            seen_version: running_version,
            last_error: None,
            poll_call: None,
            retry_at: Duration::ZERO,
            backoff: FIRST_BACKOFF,
            reports: Reports {
                queue: register_queue(),
                interval_start: now(),
                ..Reports::default()
            },
            metrics: ControlMetrics::define(),
        }
    }

    /// Called on every tick: starts a poll when none is running and no backoff is due,
    /// and sends a report when one is due.
    pub fn on_tick(&mut self) {
        self.metrics.flush();
        let now = now();
        if self.reports.queue.is_some() {
            report_channel::beat(millis(now));
        }
        if self.poll_call.is_none() && now >= self.retry_at {
            self.poll();
        }
        self.global
            .on_tick(nanos(now), &self.config, &self.proxy_id, &self.metrics);
        let interval = Duration::from_secs(u64::from(self.config.report_interval_seconds));
        if now >= self.reports.interval_start + interval {
            self.finish_report(now);
            self.send_report();
        }
    }

    /// Called when workers put batches on the report queue.
    pub fn on_queue_ready(&mut self, queue: u32) {
        if self.reports.queue != Some(queue) {
            return;
        }
        while let Ok(Some(bytes)) = hostcalls::dequeue_shared_queue(queue) {
            match RuleBatch::decode(&bytes) {
                Some(batch) => self.reports.current.merge(&batch),
                None => self.metrics.errors.inc(),
            }
        }
    }

    /// Closes the current interval into a report, if anything happened in it.
    fn finish_report(&mut self, now: Duration) {
        let start = std::mem::replace(&mut self.reports.interval_start, now);
        if self.reports.current.is_empty() {
            return;
        }
        if self.reports.unsent.len() >= MAX_UNSENT_REPORTS {
            self.reports.unsent.pop_front();
            self.reports.dropped += 1;
            self.metrics.reports_dropped.inc();
        }
        self.reports.unsent.push_back(Report {
            proxy_id: self.proxy_id.clone(),
            start_ms: millis(start),
            end_ms: millis(now),
            ruleset_version: self.running_version,
            batch: self.reports.current.take(),
            dropped_reports: self.reports.dropped,
        });
    }

    /// Sends the oldest unsent report, one at a time.
    fn send_report(&mut self) {
        if self.reports.call.is_some() {
            return;
        }
        let Some(report) = self.reports.unsent.front() else {
            return;
        };
        let body = report.to_json();
        match post_json(
            &self.config,
            &self.proxy_id,
            REPORTS_PATH,
            &body,
            REPORT_TIMEOUT,
        ) {
            Ok(token) => self.reports.call = Some(token),
            Err(status) => log::warn!("cannot send a report: {status:?}"),
        }
    }

    fn on_report_response(&mut self) {
        self.reports.call = None;
        match response_status() {
            Some(200..=299) => {
                self.reports.unsent.pop_front();
                self.metrics.reports_sent.inc();
                // Catch up on a backlog left by an outage, one report per answer.
                self.send_report();
            }
            // The admin API will never take this report (a revoked token, a format it
            // refuses): drop it rather than retry forever.
            Some(status @ 400..=499) => {
                log::warn!("the admin API refused a report (HTTP {status}); dropping it");
                self.reports.unsent.pop_front();
                self.reports.dropped += 1;
                self.metrics.reports_dropped.inc();
            }
            // Unreachable or failing: keep it for the next interval.
            _ => self.metrics.errors.inc(),
        }
    }

    fn poll(&mut self) {
        let path = format!(
            "{RULESET_PATH}?after={}&wait={}",
            self.seen_version, self.config.poll_timeout_seconds
        );
        let authorization = format!("Bearer {}", self.config.token);
        let version = self.running_version.to_string();
        let mut headers = vec![
            (":method", "GET"),
            (":path", path.as_str()),
            (":authority", self.config.admin_authority.as_str()),
            ("authorization", authorization.as_str()),
            (PROXY_ID_HEADER, self.proxy_id.as_str()),
            (PROXY_RULESET_VERSION_HEADER, version.as_str()),
        ];
        if let Some(error) = &self.last_error {
            headers.push((PROXY_ERROR_HEADER, error.as_str()));
        }
        let timeout = Duration::from_secs(u64::from(self.config.poll_timeout_seconds)) + CALL_SLACK;
        self.metrics.polls.inc();
        match hostcalls::dispatch_http_call(
            &self.config.admin_cluster,
            headers,
            None,
            vec![],
            timeout,
        ) {
            Ok(token) => self.poll_call = Some(token),
            Err(status) => self.fail(format!(
                "cannot call cluster {}: {status:?}",
                self.config.admin_cluster
            )),
        }
    }

    /// Called with the answer to an HTTP call (or its failure: no headers at all).
    pub fn on_response(&mut self, token: u32, body_size: usize) {
        if self.reports.call == Some(token) {
            return self.on_report_response();
        }
        if self.global.owns(token) {
            let body = hostcalls::get_buffer(BufferType::HttpCallResponseBody, 0, body_size)
                .ok()
                .flatten();
            let status = response_status();
            return self
                .global
                .on_response(nanos(now()), status, body, &self.metrics);
        }
        if self.poll_call != Some(token) {
            return;
        }
        self.poll_call = None;
        let status = response_status();
        match status {
            Some(200) => {
                let body = hostcalls::get_buffer(BufferType::HttpCallResponseBody, 0, body_size)
                    .ok()
                    .flatten();
                self.apply(body.as_deref().unwrap_or_default());
            }
            // Nothing changed while the poll was held: ask again at once.
            Some(304) => self.succeed(),
            Some(401 | 403) => self.fail(format!(
                "the admin API refused the proxy token (HTTP {})",
                status.unwrap_or(0)
            )),
            Some(other) => self.fail(format!("the admin API answered HTTP {other}")),
            None => self
                .fail("the admin API did not answer (connection failed or timed out)".to_string()),
        }
        if self.poll_call.is_none() && now() >= self.retry_at {
            self.poll();
        }
    }

    fn apply(&mut self, body: &[u8]) {
        let doc = match RulesetDocument::from_json(body) {
            Ok(doc) => doc,
            Err(e) => return self.fail(format!("the admin API sent an unreadable ruleset: {e}")),
        };
        if doc.version <= self.running_version {
            // An answer to an older question; nothing to do.
            return self.succeed();
        }
        match doc.compile() {
            Ok(ruleset) => match ruleset_channel::publish(&doc) {
                Ok(()) => {
                    log::info!(
                        "applied ruleset version {} ({} rules)",
                        doc.version,
                        ruleset.rules().len()
                    );
                    self.running_version = doc.version;
                    self.seen_version = doc.version;
                    self.last_error = None;
                    self.metrics.updates.inc();
                    self.metrics.version.set(doc.version);
                    self.succeed();
                }
                Err(e) => self.fail(e),
            },
            Err(errors) => {
                // Keep the last good ruleset; tell the admin API why on the next poll and
                // wait for a newer version instead of fetching this one again.
                self.metrics.refused.inc();
                self.seen_version = doc.version;
                let message = format!("refused ruleset version {}: {errors}", doc.version);
                log::error!("{message}");
                self.last_error = Some(header_safe(&message));
                self.backoff = FIRST_BACKOFF;
                self.retry_at = Duration::ZERO;
            }
        }
    }

    fn succeed(&mut self) {
        self.backoff = FIRST_BACKOFF;
        self.retry_at = Duration::ZERO;
    }

    fn fail(&mut self, message: String) {
        self.metrics.errors.inc();
        log::warn!("{message}; retrying in {} s", self.backoff.as_secs());
        self.last_error = Some(header_safe(&message));
        self.retry_at = now() + self.backoff;
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
    }
}

/// POSTs a JSON `body` to the admin API at `path` as this proxy; returns the call's token.
pub fn post_json(
    config: &ControlConfigSpec,
    proxy_id: &str,
    path: &str,
    body: &[u8],
    timeout: Duration,
) -> Result<u32, proxy_wasm::types::Status> {
    let authorization = format!("Bearer {}", config.token);
    let headers = vec![
        (":method", "POST"),
        (":path", path),
        (":authority", config.admin_authority.as_str()),
        ("authorization", authorization.as_str()),
        ("content-type", "application/json"),
        (PROXY_ID_HEADER, proxy_id),
    ];
    hostcalls::dispatch_http_call(&config.admin_cluster, headers, Some(body), vec![], timeout)
}

/// The `:status` of the HTTP call being answered; `None` when the call failed.
fn response_status() -> Option<u16> {
    hostcalls::get_map_bytes(MapType::HttpCallResponseHeaders)
        .ok()
        .and_then(|headers| headers.into_iter().find(|(name, _)| name == ":status"))
        .and_then(|(_, value)| {
            std::str::from_utf8(&value)
                .ok()
                .and_then(|s| s.parse::<u16>().ok())
        })
}

fn register_queue() -> Option<u32> {
    hostcalls::register_shared_queue(report_channel::QUEUE)
        .map_err(|status| {
            log::error!(
                "cannot create the report queue ({status:?}); no statistics will be reported"
            )
        })
        .ok()
}

fn millis(t: Duration) -> u64 {
    u64::try_from(t.as_millis()).unwrap_or(u64::MAX)
}

fn nanos(t: Duration) -> u64 {
    u64::try_from(t.as_nanos()).unwrap_or(u64::MAX)
}

/// Envoy's node id when it has one, else an id made from the start time.
fn default_proxy_id() -> String {
    hostcalls::get_property(vec!["node", "id"])
        .ok()
        .flatten()
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .filter(|id| !id.is_empty())
        .map(|id| header_safe(&id))
        .unwrap_or_else(|| format!("envoy-{:x}", now().as_nanos()))
}

fn now() -> Duration {
    hostcalls::get_current_time()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .unwrap_or_default()
}

/// Header values must be visible ASCII: anything else becomes `?`, and long messages
/// are cut.
fn header_safe(text: &str) -> String {
    text.chars()
        .take(MAX_ERROR_LEN)
        .map(|c| {
            if c == ' ' || c.is_ascii_graphic() {
                c
            } else {
                '?'
            }
        })
        .collect()
}
