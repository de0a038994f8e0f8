//! The control service: follows the admin API for one Envoy. It runs in the root context
//! that holds the control lease ([`crate::election`]): the singleton on Envoy's main
//! thread (bootstrap extension, same `vm_id` and module as the filter) where one is
//! configured, otherwise one elected worker's root.
//!
//! Its decisions are the core's (`sluice_core::control`): when to poll for a newer
//! ruleset and what to make of the answer ([`RulesetFollower`]), when to send the
//! workers' statistics and what to keep when the admin API cannot take them
//! ([`ReportSender`]), and the sync of global buckets ([`GlobalSyncer`]). This module is
//! the glue: it reads the clock, dispatches the HTTP calls those machines ask for, hands
//! them the answers, publishes rulesets and the fleet view to shared data, drains the
//! workers' report queue, and logs and counts what the machines say happened.

use std::cell::Cell;
use std::time::Duration;

use proxy_wasm::hostcalls;
use proxy_wasm::types::{BufferType, MapType, Status};
use sluice_core::config::ControlConfigSpec;
use sluice_core::control::follow::{PollOutcome, RulesetFollower};
use sluice_core::control::global::{GlobalSyncer, Leases, SyncFailure};
use sluice_core::control::reports::{ReportOutcome, ReportSender};
use sluice_core::control::{
    AdminClusterWatch, Answer, ClusterChange, header_safe, missing_cluster_message,
};
use sluice_core::global::schedule::CONTROL_TICK;
use sluice_core::global::sync::SYNC_PATH;
use sluice_core::global::table::LeaseTable;
use sluice_core::report::{REPORTS_PATH, RuleBatch};
use sluice_core::time::Nanos;
use sluice_core::wire::{PROXY_ERROR_HEADER, PROXY_ID_HEADER, PROXY_RULESET_VERSION_HEADER};

use crate::clock;
use crate::host_store::{CREATE_CAS, HostStore};
use crate::metrics::ControlMetrics;
use crate::{global_channel, report_channel, ruleset_channel};

/// How often the service checks whether a poll retry, a report or a sync is due.
pub const TICK: Duration = Duration::from_nanos(CONTROL_TICK.get());
/// Extra time the HTTP call may take beyond the poll's own hold time.
const CALL_SLACK: Duration = Duration::from_secs(5);
const REPORT_TIMEOUT: Duration = Duration::from_secs(5);

/// The control service's state between callbacks.
#[derive(Debug)]
pub struct ControlService {
    config: ControlConfigSpec,
    proxy_id: String,
    follower: RulesetFollower,
    reports: ReportSender,
    global: GlobalSyncer,
    leases: HostStore,
    /// The outstanding calls, by the host's tokens.
    poll_call: Option<u32>,
    report_call: Option<u32>,
    sync_call: Option<u32>,
    queue: Option<u32>,
    /// Whether Envoy knows the admin API's cluster (a `Cell`: calls are made through `&self`).
    cluster: Cell<AdminClusterWatch>,
    metrics: ControlMetrics,
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
        let report_interval = Nanos::from_secs(u64::from(config.report_interval_seconds));
        let now = clock::now().unwrap_or_default();
        let mut service = ControlService {
            follower: RulesetFollower::new(running_version),
            reports: ReportSender::new(proxy_id.clone(), report_interval, now),
            global: GlobalSyncer::new(Nanos::from_millis(u64::from(config.sync_interval_ms))),
            leases: HostStore::leases(),
            config,
            proxy_id,
            poll_call: None,
            report_call: None,
            sync_call: None,
            queue: register_queue(),
            cluster: Cell::default(),
            metrics: ControlMetrics::define(),
        };
        // Batches queued while no service ran (or before this root registered the queue
        // and so became the one Envoy tells) are waiting: take them now.
        if let Some(queue) = service.queue {
            service.on_queue_ready(queue);
        }
        service
    }

    /// Called on every tick: polls, syncs and reports when due.
    pub fn on_tick(&mut self) {
        self.metrics.flush();
        let now = clock::now().unwrap_or_default();
        self.poll(now);
        self.sync(now);
        if self.reports.tick(now, self.follower.running_version()) {
            self.metrics.reports_dropped.inc();
        }
        self.send_report();
    }

    /// Called when workers put batches on the report queue.
    pub fn on_queue_ready(&mut self, queue: u32) {
        if self.queue != Some(queue) {
            return;
        }
        while let Ok(Some(bytes)) = hostcalls::dequeue_shared_queue(queue) {
            match RuleBatch::decode(&bytes) {
                Some(batch) => self.reports.merge(&batch),
                None => self.metrics.errors.inc(),
            }
        }
    }

    /// Called with the answer to an HTTP call (or its failure: no headers at all).
    pub fn on_response(&mut self, token: u32, body_size: usize) {
        let status = response_status();
        let now = clock::now().unwrap_or_default();
        if self.report_call == Some(token) {
            self.report_call = None;
            match self.reports.answered(status) {
                ReportOutcome::Accepted => {
                    self.metrics.reports_sent.inc();
                    // Catch up on a backlog left by an outage, one report per answer.
                    self.send_report();
                }
                ReportOutcome::Refused(status) => {
                    log::warn!("the admin API refused a report (HTTP {status}); dropping it");
                    self.metrics.reports_dropped.inc();
                }
                ReportOutcome::Kept => self.metrics.errors.inc(),
            }
        } else if self.sync_call == Some(token) {
            self.sync_call = None;
            let body = response_body(body_size);
            let leases = lease_table(&self.leases);
            match self
                .global
                .answered(now, Answer::new(status, body.as_deref()), leases)
            {
                Ok(synced) => {
                    self.metrics.syncs.inc();
                    if synced.recovered {
                        log::info!("global buckets are coordinated again");
                    }
                }
                Err(failure) => self.sync_failed(&failure),
            }
            self.publish_view();
        } else if self.poll_call == Some(token) {
            self.poll_call = None;
            let body = response_body(body_size);
            let outcome = self
                .follower
                .answered(now, Answer::new(status, body.as_deref()));
            self.follow(now, outcome);
            self.poll(now);
        }
    }

    fn poll(&mut self, now: Nanos) {
        let Some(poll) = self.follower.poll(now, self.config.poll_timeout_seconds) else {
            return;
        };
        let authorization = format!("Bearer {}", self.config.token);
        let version = poll.running_version.to_string();
        let mut headers = vec![
            (":method", "GET"),
            (":path", poll.path.as_str()),
            (":authority", self.config.admin_authority.as_str()),
            ("authorization", authorization.as_str()),
            (PROXY_ID_HEADER, self.proxy_id.as_str()),
            (PROXY_RULESET_VERSION_HEADER, version.as_str()),
        ];
        if let Some(error) = &poll.last_error {
            headers.push((PROXY_ERROR_HEADER, error.as_str()));
        }
        let timeout = Duration::from_secs(u64::from(self.config.poll_timeout_seconds)) + CALL_SLACK;
        self.metrics.polls.inc();
        match self.dispatch(headers, None, timeout) {
            Ok(token) => self.poll_call = Some(token),
            Err(status) => {
                let why = format!(
                    "cannot call cluster {}: {status:?}",
                    self.config.admin_cluster
                );
                let outcome = self.follower.not_sent(now, &why);
                self.follow(now, outcome);
            }
        }
    }

    /// Carries out what the follower made of a poll's answer.
    fn follow(&mut self, now: Nanos, outcome: PollOutcome) {
        match outcome {
            PollOutcome::Publish(doc, ruleset) => {
                let result = ruleset_channel::publish(&doc);
                if result.is_ok() {
                    log::info!(
                        "applied ruleset version {} ({} rules)",
                        doc.version,
                        ruleset.rules().len()
                    );
                    self.metrics.updates.inc();
                    self.metrics.version.set(doc.version);
                    self.global.set_global_limits(ruleset.has_global_limits());
                }
                // The follower reports the failure's text to the admin API on its next poll.
                let outcome =
                    self.follower
                        .published(now, doc.version, result.map_err(|e| e.to_string()));
                self.follow(now, outcome);
            }
            PollOutcome::Unchanged => {}
            PollOutcome::Refused { message, .. } => {
                self.metrics.refused.inc();
                log::error!("{message}");
            }
            PollOutcome::Failed {
                message,
                retry_in_ns,
            } => {
                self.metrics.errors.inc();
                log::warn!(
                    "{message}; retrying in {} s",
                    Duration::from_nanos(retry_in_ns).as_secs()
                );
            }
        }
    }

    fn sync(&mut self, now: Nanos) {
        let mark = global_channel::new_buckets_mark();
        let leases = lease_table(&self.leases);
        let Some(request) = self.global.start(now, mark, leases, &self.proxy_id) else {
            return;
        };
        self.metrics
            .global_buckets
            .set(request.buckets.len() as u64);
        let timeout = Duration::from(self.global.timeout());
        match self.post_json(SYNC_PATH, &request.to_json(), timeout) {
            Ok(token) => self.sync_call = Some(token),
            Err(status) => {
                let failure = self.global.not_sent(&format!("{status:?}"));
                self.sync_failed(&failure);
                self.publish_view();
            }
        }
    }

    fn sync_failed(&self, failure: &SyncFailure) {
        self.metrics.sync_failures.inc();
        if failure.started_failing {
            log::warn!(
                "{}; global limits use this proxy's fallback shares until a sync succeeds",
                failure.message
            );
        }
    }

    fn publish_view(&self) {
        let view = self.global.view();
        self.metrics.fleet_size.set(u64::from(view.fleet_size));
        self.metrics.global_fallback.set(u64::from(view.fallback));
        self.metrics
            .sync_interval_ms
            .set(view.sync_interval_ns / 1_000_000);
        if let Err(e) = global_channel::publish_view(&view) {
            log::warn!("{e}");
            self.metrics.errors.inc();
        }
    }

    /// Sends the oldest unsent report, one at a time.
    fn send_report(&mut self) {
        let Some(body) = self.reports.next_to_send() else {
            return;
        };
        match self.post_json(REPORTS_PATH, &body, REPORT_TIMEOUT) {
            Ok(token) => self.report_call = Some(token),
            Err(status) => {
                self.reports.not_sent();
                log::warn!("cannot send a report: {status:?}");
            }
        }
    }

    /// POSTs a JSON `body` to the admin API at `path` as this proxy; returns the call's
    /// token.
    fn post_json(&self, path: &str, body: &[u8], timeout: Duration) -> Result<u32, Status> {
        let authorization = format!("Bearer {}", self.config.token);
        let headers = vec![
            (":method", "POST"),
            (":path", path),
            (":authority", self.config.admin_authority.as_str()),
            ("authorization", authorization.as_str()),
            ("content-type", "application/json"),
            (PROXY_ID_HEADER, self.proxy_id.as_str()),
        ];
        self.dispatch(headers, Some(body), timeout)
    }

    /// Sends one call to the admin API's cluster. A refusal for a cluster Envoy does not
    /// have is counted on every call and logged once per change.
    fn dispatch(
        &self,
        headers: Vec<(&str, &str)>,
        body: Option<&[u8]>,
        timeout: Duration,
    ) -> Result<u32, Status> {
        let result = hostcalls::dispatch_http_call(
            &self.config.admin_cluster,
            headers,
            body,
            vec![],
            timeout,
        );
        // Envoy answers BadArgument before sending anything when the cluster is unknown
        // (its other BadArgument cases are headers this service always sets).
        let missing = matches!(result, Err(Status::BadArgument));
        if missing {
            self.metrics.admin_cluster_missing.inc();
        }
        let mut watch = self.cluster.get();
        let change = watch.called(missing);
        self.cluster.set(watch);
        match change {
            Some(ClusterChange::Missing) => {
                log::error!("{}", missing_cluster_message(&self.config.admin_cluster));
            }
            Some(ClusterChange::Found) => log::info!(
                "the admin API's cluster `{}` exists now; following the admin API",
                self.config.admin_cluster
            ),
            None => {}
        }
        result
    }
}

/// The lease table the workers configured (none before the first configuration).
fn lease_table(store: &HostStore) -> Leases<'_, HostStore> {
    Leases {
        table: global_channel::slots()
            .and_then(std::num::NonZeroU32::new)
            .map(LeaseTable::new),
        store,
    }
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

fn response_body(size: usize) -> Option<Vec<u8>> {
    hostcalls::get_buffer(BufferType::HttpCallResponseBody, 0, size)
        .ok()
        .flatten()
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

/// Envoy's node id when it has one, else an id made once per Envoy.
fn default_proxy_id() -> String {
    hostcalls::get_property(vec!["node", "id"])
        .ok()
        .flatten()
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .filter(|id| !id.is_empty())
        .map(|id| header_safe(&id))
        .unwrap_or_else(generated_proxy_id)
}

/// An id made from the time the first control service started, kept in shared data so
/// that every root running the service (an elected worker after a failover, a reloaded
/// VM) names this Envoy alike, and the admin API sees one proxy, not one per takeover.
fn generated_proxy_id() -> String {
    const KEY: &str = "sluice.control.proxy_id";
    let fresh = format!("envoy-{:x}", clock::now().unwrap_or_default().get());
    // Create only if absent: of two roots racing here, both read back the winner's id.
    let _ = hostcalls::set_shared_data(KEY, Some(fresh.as_bytes()), Some(CREATE_CAS));
    hostcalls::get_shared_data(KEY)
        .ok()
        .and_then(|(bytes, _)| bytes)
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .map(|id| header_safe(&id))
        .unwrap_or(fresh)
}
