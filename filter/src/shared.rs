//! What a worker's root context and its request contexts share (one VM, one thread):
//! the configuration in force, the metrics, the stores and the statistics.
//!
//! It has a module of its own so that both sides depend on it and neither on the other:
//! [`crate::root`] fills it in, [`crate::http`] reads it on every request.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use sluice_core::config::FilterConfig;
use sluice_core::global::lease::FleetView;
use sluice_core::report::Aggregate;

use crate::delay::DelayedRequests;
use crate::host_store::HostStore;
use crate::in_flight::InFlight;
use crate::metrics::Metrics;

/// State shared by a worker's root context and its request contexts (one VM, one
/// thread).
#[derive(Debug)]
pub struct Shared {
    /// The configuration in force; `None` until a valid one arrives. Replaced whole, so
    /// a request keeps the `Rc` it started with.
    config: RefCell<Option<Rc<FilterConfig>>>,
    pub metrics: RefCell<Metrics>,
    pub store: HostStore,
    /// The lease table's entries (global buckets).
    pub leases: HostStore,
    /// What the control service last said about the fleet (read on every tick).
    pub view: Cell<FleetView>,
    /// Decision statistics since the last flush: per-rule counts and throttled clients.
    pub statistics: RefCell<Aggregate>,
    /// This worker's requests' places under in-flight limits.
    pub in_flight: InFlight,
    /// This worker's requests waiting for their tokens (`on_limit: delay`).
    pub delay: DelayedRequests,
    /// Set when the worker's filter root is torn down (its configuration was replaced)
    /// while requests it admitted still run: no tick is left to flush their metrics, so
    /// each flushes them as it ends.
    pub orphaned: Cell<bool>,
}

impl Default for Shared {
    fn default() -> Self {
        Self {
            config: RefCell::default(),
            metrics: RefCell::default(),
            store: HostStore::slots(),
            leases: HostStore::leases(),
            view: Cell::new(FleetView::ALONE),
            statistics: RefCell::default(),
            // The clock at start-up tells this worker's holder ids from other workers'.
            in_flight: InFlight::new(crate::clock::now().map_or(0, |t| t.get())),
            delay: DelayedRequests::default(),
            orphaned: Cell::new(false),
        }
    }
}

impl Shared {
    /// Puts `config` in force for every request that starts from now on.
    pub fn install(&self, config: FilterConfig) {
        *self.config.borrow_mut() = Some(Rc::new(config));
    }

    pub fn config(&self) -> Option<Rc<FilterConfig>> {
        self.config.borrow().clone()
    }

    pub fn metrics(&self) -> std::cell::Ref<'_, Metrics> {
        self.metrics.borrow()
    }
}
