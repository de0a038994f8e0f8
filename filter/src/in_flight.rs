//! Requests' places under in-flight limits, on one worker: handed to the decision, kept
//! while the request lives, let go when its stream ends (`on_log`, or `on_done` for a
//! context Envoy tears down without a log), at most once, and refreshed from the
//! worker's tick so a long request keeps its place. The rules are the core's
//! (`sluice_core::in_flight`); this is the host side.

use std::cell::RefCell;

use sluice_core::in_flight::live::RequestHolds;
use sluice_core::in_flight::{HolderIds, InFlightCounters, InFlightTable, LiveHolds};
use sluice_core::ruleset::InFlightContext;
use sluice_core::time::Nanos;

use crate::host_store::HostStore;
use crate::metrics::InFlightMetrics;

/// One worker's side of the in-flight table.
#[derive(Debug)]
pub struct InFlight {
    table: InFlightTable,
    store: HostStore,
    live: RefCell<LiveHolds>,
    ids: RefCell<HolderIds>,
}

impl InFlight {
    /// `seed` makes this worker's holder ids its own (the host clock at start-up).
    pub fn new(seed: u64) -> Self {
        Self {
            table: InFlightTable::default(),
            store: HostStore::in_flight(),
            live: RefCell::default(),
            ids: RefCell::new(HolderIds::new(seed)),
        }
    }

    /// What one request's decision takes places with, under a fresh holder id.
    pub fn context(&self) -> InFlightContext<'_> {
        InFlightContext {
            table: &self.table,
            store: &self.store,
            holder: self.ids.borrow_mut().next_id(),
        }
    }

    /// Keeps the places request `context` was admitted with. Answers whether it holds
    /// any (only then does its end need [`InFlight::let_go`]).
    pub fn keep(&self, context: u32, holds: RequestHolds, metrics: &InFlightMetrics) -> bool {
        if holds.is_empty() {
            return false;
        }
        metrics
            .held
            .add(u64::try_from(holds.len()).unwrap_or(u64::MAX));
        self.live.borrow_mut().insert(context, holds);
        true
    }

    /// Lets go of request `context`'s places: its stream ended. A second call finds
    /// nothing. A place that cannot be let go now lapses within `HOLD_TTL`, since
    /// nobody refreshes it any more.
    pub fn let_go(&self, context: u32, now: Nanos, metrics: &InFlightMetrics) {
        let holds = self.live.borrow_mut().take(context);
        let mut counters = InFlightCounters::default();
        for hold in &holds {
            match self.table.release(&self.store, hold, now, &mut counters) {
                Ok(true) => metrics.released.inc(),
                // It had lapsed: counted as lapsed by whoever dropped it.
                Ok(false) => {}
                Err(failure) => {
                    log::warn!("cannot let an in-flight place go ({failure:?}); it lapses");
                    metrics.failures.inc();
                }
            }
        }
        metrics.lapsed.add(u64::from(counters.lapsed));
    }

    /// Pushes the expiries of this worker's live places forward, every `REFRESH_EVERY`.
    pub fn refresh(&self, now: Nanos, metrics: &InFlightMetrics) {
        let due = self.live.borrow_mut().due_for_refresh(now);
        let mut counters = InFlightCounters::default();
        for hold in &due {
            if let Err(failure) = self.table.refresh(&self.store, hold, now, &mut counters) {
                log::warn!("cannot refresh an in-flight place ({failure:?})");
                metrics.failures.inc();
            }
        }
        metrics.lapsed.add(u64::from(counters.lapsed));
    }
}
