//! The control service's part in global buckets: once per sync interval (sooner when a
//! worker created a new bucket), collect the usage of every lease entry, POST it to the
//! admin API in one request, and apply the answer's grants; then publish the fleet view
//! the workers spend by. The arithmetic is the core's (`sluice_core::global`); this is
//! the glue to shared data and the HTTP call.
//!
//! Usage that could not be sent (the admin API unreachable) is kept and merged into the
//! next sync, so nothing a proxy admitted goes unreported. While syncs fail, the view
//! says `fallback`, and workers keep to their last known shares.

use std::collections::HashMap;
use std::time::Duration;

use sluice_core::config::ControlConfigSpec;
use sluice_core::global::coordinator::Usage;
use sluice_core::global::lease::FleetView;
use sluice_core::global::schedule::SyncSchedule;
use sluice_core::global::sync::{BucketUsage, SYNC_PATH, SyncRequest, SyncResponse};
use sluice_core::global::table::{Collected, LeaseTable};

use crate::control::post_json;
use crate::global_channel;
use crate::host_store::HostStore;
use crate::metrics::ControlMetrics;

/// Global buckets between syncs.
#[derive(Debug)]
pub struct GlobalSync {
    schedule: SyncSchedule,
    leases: HostStore,
    /// Usage collected but not yet answered, per bucket, with where its entry is.
    pending: HashMap<u64, (Collected, Usage)>,
    call: Option<InFlight>,
    view: FleetView,
    /// The workers' last note of new buckets, to notice the next one.
    new_mark: u64,
    /// Whether the last sync failed, to log only changes.
    failing: bool,
}

#[derive(Debug)]
struct InFlight {
    token: u32,
    sent_at: u64,
    /// The buckets sent, in the request's order.
    buckets: Vec<u64>,
}

impl GlobalSync {
    pub fn new(config: &ControlConfigSpec) -> GlobalSync {
        let interval_ns = u64::from(config.sync_interval_ms) * 1_000_000;
        GlobalSync {
            schedule: SyncSchedule::new(interval_ns),
            leases: HostStore::leases(),
            pending: HashMap::new(),
            call: None,
            view: FleetView {
                sync_interval_ns: interval_ns,
                ..FleetView::ALONE
            },
            new_mark: 0,
            failing: false,
        }
    }

    /// Whether `token` is this module's sync call.
    pub fn owns(&self, token: u32) -> bool {
        self.call.as_ref().is_some_and(|c| c.token == token)
    }

    /// On every control tick: syncs when due.
    pub fn on_tick(
        &mut self,
        now: u64,
        config: &ControlConfigSpec,
        proxy_id: &str,
        metrics: &ControlMetrics,
    ) {
        if self.call.is_some() {
            return;
        }
        let mark = global_channel::new_buckets_mark();
        if !self.schedule.due(now, mark != self.new_mark) {
            return;
        }
        self.new_mark = mark;
        // No worker configured yet: nothing to collect, but the sync still tells the
        // coordinator this proxy is part of the fleet.
        if let Some(table) = global_channel::slots()
            .and_then(std::num::NonZeroU32::new)
            .map(LeaseTable::new)
        {
            let covers = self.schedule.covers(now);
            for collected in table.collect(&self.leases, now, covers, &self.view) {
                let (latest, usage) = self
                    .pending
                    .entry(collected.bucket)
                    .or_insert((collected, Usage::default()));
                *latest = collected;
                usage.merge(&collected.usage);
            }
        }
        let mut buckets = Vec::with_capacity(self.pending.len());
        let request = SyncRequest {
            proxy: proxy_id.to_string(),
            interval_ms: self.schedule.interval_ns() / 1_000_000,
            covers_ms: self.schedule.covers(now) / 1_000_000,
            buckets: self
                .pending
                .iter()
                .map(|(bucket, (c, usage))| {
                    buckets.push(*bucket);
                    BucketUsage::new(*bucket, c.interval_ns, c.burst, usage)
                })
                .collect(),
        };
        metrics.global_buckets.set(buckets.len() as u64);
        let body = request.to_json();
        // An answer later than two intervals is no use: the next sync carries the usage.
        let timeout = Duration::from_nanos(2 * self.schedule.interval_ns())
            .clamp(Duration::from_millis(500), Duration::from_secs(5));
        match post_json(config, proxy_id, SYNC_PATH, &body, timeout) {
            Ok(token) => {
                self.call = Some(InFlight {
                    token,
                    sent_at: now,
                    buckets,
                })
            }
            Err(status) => self.failed(now, format!("cannot send a sync: {status:?}"), metrics),
        }
    }

    /// Applies the answer to the sync call (`status` `None`: the call failed).
    pub fn on_response(
        &mut self,
        now: u64,
        status: Option<u16>,
        body: Option<Vec<u8>>,
        metrics: &ControlMetrics,
    ) {
        let Some(call) = self.call.take() else {
            return;
        };
        let answer = match (status, body) {
            (Some(200), Some(body)) => SyncResponse::from_json(&body)
                .map_err(|e| format!("the admin API sent an unreadable sync answer: {e}")),
            (Some(200), None) => Err("the admin API sent an empty sync answer".to_string()),
            (Some(status), _) => Err(format!("the admin API answered a sync with HTTP {status}")),
            (None, _) => Err("the admin API did not answer a sync".to_string()),
        };
        let answer = match answer {
            Ok(a) if a.grants.len() == call.buckets.len() => a,
            Ok(_) => {
                let message = "the admin API answered a sync with the wrong number of grants";
                return self.failed(call.sent_at, message.to_string(), metrics);
            }
            Err(message) => return self.failed(call.sent_at, message, metrics),
        };
        self.schedule.record(call.sent_at, true);
        self.view = FleetView {
            fleet_size: answer.fleet_size.max(1),
            fallback: answer.warming_up,
            sync_interval_ns: self.schedule.interval_ns(),
        };
        if let Some(slots) = global_channel::slots().and_then(std::num::NonZeroU32::new) {
            let table = LeaseTable::new(slots);
            for (bucket, grant) in call.buckets.iter().zip(&answer.grants) {
                if let Some((collected, _)) = self.pending.get(bucket) {
                    table.apply(&self.leases, collected, grant, now, &self.view);
                }
            }
        }
        self.pending.clear();
        metrics.syncs.inc();
        if self.failing {
            log::info!("global buckets are coordinated again");
            self.failing = false;
        }
        self.publish(metrics);
    }

    fn failed(&mut self, sent_at: u64, message: String, metrics: &ControlMetrics) {
        self.schedule.record(sent_at, false);
        self.view.fallback = true;
        metrics.sync_failures.inc();
        if !self.failing {
            log::warn!(
                "{message}; global limits use this proxy's fallback shares until a sync succeeds"
            );
            self.failing = true;
        }
        self.publish(metrics);
    }

    fn publish(&self, metrics: &ControlMetrics) {
        metrics.fleet_size.set(u64::from(self.view.fleet_size));
        metrics.global_fallback.set(u64::from(self.view.fallback));
        if let Err(e) = global_channel::publish_view(&self.view) {
            log::warn!("{e}");
            metrics.errors.inc();
        }
    }
}
