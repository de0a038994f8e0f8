//! What the whole-request decision tests share: one worker's view of a filter (its
//! configuration and the shared data its decisions read and write) and the context a
//! decision runs in, time passed in. Each test file adds what its subject needs around it.

#![allow(dead_code)] // Each test binary uses its own part.

use sluice_core::config::FilterConfig;
use sluice_core::delay::DelayQueue;
use sluice_core::global::lease::FleetView;
use sluice_core::request::HttpRequest;
use sluice_core::ruleset::{Decision, DecisionContext, GlobalBuckets, Outcome};
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

/// A token bucket in integers, the reference a decision is checked against: `level` in
/// tokens × 10^9, refilled by `rate` tokens a second (`rate` units a nanosecond), holding
/// `burst` tokens, and going at most `debt` tokens below empty when charged regardless
/// (`charge_with_debt`).
pub struct Reference {
    level: i128,
    rate: i128,
    burst: i128,
    debt: i128,
    at: u64,
}

const UNIT: i128 = 1_000_000_000;

impl Reference {
    pub fn full(rate: u128, burst: u128, at: u64) -> Self {
        Self::with_debt(rate, burst, 0, at)
    }

    /// A full bucket that [`Reference::charge_with_debt`] may take `debt` tokens below empty.
    pub fn with_debt(rate: u128, burst: u128, debt: u128, at: u64) -> Self {
        let (rate, burst, debt) = (rate as i128, burst as i128, debt as i128);
        Self {
            level: burst * UNIT,
            rate,
            burst,
            debt,
            at,
        }
    }

    pub fn refill(&mut self, now: u64) {
        let elapsed = i128::from(now - self.at);
        self.level = (self.level + elapsed * self.rate).min(self.burst * UNIT);
        self.at = now;
    }

    pub fn has_one(&self) -> bool {
        self.level >= UNIT
    }

    pub fn take_one(&mut self) {
        assert!(self.has_one(), "the reference took a token it did not have");
        self.level -= UNIT;
    }

    /// Takes one token whether or not there is one; one that would go beyond the debt is
    /// forgiven whole, as `Gcra::charge_debt` forgives it.
    pub fn charge_with_debt(&mut self) {
        if self.level - UNIT >= -self.debt * UNIT {
            self.level -= UNIT;
        }
    }
}

/// What a request got from a rule that may pass it over its limit (a soft or elastic
/// limit, warn mode): passed, passed with a warning, or refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    Allowed,
    Warned,
    Denied,
}

pub fn seen(decision: &Decision<'_>) -> Seen {
    match decision.outcome {
        Outcome::Allowed if decision.warnings.is_empty() => Seen::Allowed,
        Outcome::Allowed => Seen::Warned,
        _ => Seen::Denied,
    }
}

/// A request to `/work` from client `k` (its `x-api-key`).
pub fn key(k: &str) -> HttpRequest {
    HttpRequest::get("/work").with_header("x-api-key", k)
}
