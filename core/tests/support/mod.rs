//! What the whole-request decision tests share: one worker's view of a filter (its
//! configuration and the shared data its decisions read and write) and the context a
//! decision runs in, time passed in. Each test file adds what its subject needs around it.

#![allow(dead_code)] // Each test binary uses its own part.

use sluice_core::config::FilterConfig;
use sluice_core::delay::DelayQueue;
use sluice_core::global::lease::FleetView;
use sluice_core::ruleset::{DecisionContext, GlobalBuckets};
use sluice_core::store::MemoryStore;
use sluice_core::time::Nanos;

/// A filter configured with `rules`, its slot table's store and its lease table's store.
pub struct TestFilter {
    pub config: FilterConfig,
    pub store: MemoryStore,
    pub leases: MemoryStore,
    /// What this worker knows of the fleet (alone unless a test says otherwise).
    pub view: FleetView,
}

impl TestFilter {
    /// `rules`: the JSON array of a plugin configuration's `rules`.
    pub fn new(rules: &str) -> TestFilter {
        TestFilter {
            config: FilterConfig::from_json(format!(r#"{{"rules":{rules}}}"#).as_bytes()).unwrap(),
            store: MemoryStore::new(),
            leases: MemoryStore::new(),
            view: FleetView::ALONE,
        }
    }

    /// The context of a decision at `now` (nanoseconds), with the worker's delay queue
    /// when the test has one.
    pub fn context<'a>(
        &'a self,
        now: u64,
        queue: Option<&'a DelayQueue>,
    ) -> DecisionContext<'a, MemoryStore, MemoryStore> {
        DecisionContext {
            store: &self.store,
            table: &self.config.table,
            global: GlobalBuckets {
                table: &self.config.lease_table,
                store: &self.leases,
                view: self.view,
            },
            now: Nanos::new(now),
            default_failure: self.config.failure_mode,
            queue,
        }
    }
}
