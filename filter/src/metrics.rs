//! Envoy counters for everything the filter decides or survives.
//!
//! Counters of the same name from every worker VM add up in Envoy. They appear in
//! `/stats` as `wasmcustom.<name>` and in `/stats/prometheus` as `<name>`.

use proxy_wasm::hostcalls;
use proxy_wasm::types::MetricType;
use sluice_core::limiter::LimiterCounters;
use sluice_core::report::RuleCounts;

/// One Envoy counter. Defining can fail on a misbehaving host; such a counter is simply
/// not recorded rather than taking the filter down.
#[derive(Debug, Clone, Copy, Default)]
pub struct Counter(Option<u32>);

impl Counter {
    fn define(name: &str) -> Counter {
        match hostcalls::define_metric(MetricType::Counter, name) {
            Ok(id) => Counter(Some(id)),
            Err(status) => {
                log::error!("cannot define metric {name}: {status:?}");
                Counter(None)
            }
        }
    }

    pub fn add(self, n: u64) {
        if n == 0 {
            return;
        }
        if let Some(id) = self.0 {
            // Nothing useful can be done if the host refuses an increment.
            let _ = hostcalls::increment_metric(id, i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    pub fn inc(self) {
        self.add(1);
    }
}

/// One Envoy gauge.
#[derive(Debug, Clone, Copy, Default)]
pub struct Gauge(Option<u32>);

impl Gauge {
    fn define(name: &str) -> Gauge {
        match hostcalls::define_metric(MetricType::Gauge, name) {
            Ok(id) => Gauge(Some(id)),
            Err(status) => {
                log::error!("cannot define metric {name}: {status:?}");
                Gauge(None)
            }
        }
    }

    pub fn set(self, value: u64) {
        if let Some(id) = self.0 {
            let _ = hostcalls::record_metric(id, value);
        }
    }
}

/// Per-rule counters, named `sluice_rule.<rule id>.<outcome>_total`. The Envoy config that
/// `sluice envoy-config` writes turns the rule id into a `sluice_rule` tag, so Prometheus
/// sees `sluice_rule_denied_total{sluice_rule="api-per-key"}`. Dots in a rule id become
/// `_` (Envoy's tag extraction splits names on dots).
#[derive(Debug, Clone, Copy, Default)]
pub struct RuleCounters {
    pub allowed: Counter,
    pub denied: Counter,
    pub shadow_denied: Counter,
    pub near_limit: Counter,
    pub fail_open: Counter,
}

impl RuleCounters {
    pub fn define(rule_id: &str) -> RuleCounters {
        let id = rule_id.replace('.', "_");
        let counter = |outcome: &str| Counter::define(&format!("sluice_rule.{id}.{outcome}_total"));
        RuleCounters {
            allowed: counter("allowed"),
            denied: counter("denied"),
            shadow_denied: counter("shadow_denied"),
            near_limit: counter("near_limit"),
            fail_open: counter("fail_open"),
        }
    }

    pub fn add(&self, counts: &RuleCounts) {
        self.allowed.add(counts.allowed);
        self.denied.add(counts.denied);
        self.shadow_denied.add(counts.shadow_denied);
        self.near_limit.add(counts.near_limit);
        self.fail_open.add(counts.fail_open);
    }
}

/// The control service's metrics (one instance, on the main thread).
#[derive(Debug, Clone, Copy, Default)]
pub struct ControlMetrics {
    /// Polls sent to the admin API.
    pub polls: Counter,
    /// Failed polls (unreachable, refused token, bad answers).
    pub errors: Counter,
    /// Rulesets published to the workers.
    pub updates: Counter,
    /// Rulesets refused because they did not validate.
    pub refused: Counter,
    /// The version published to the workers.
    pub version: Gauge,
    /// Reports accepted by the admin API.
    pub reports_sent: Counter,
    /// Reports dropped: the unsent buffer was full, or the admin API refused them.
    pub reports_dropped: Counter,
}

impl ControlMetrics {
    pub fn define() -> ControlMetrics {
        ControlMetrics {
            polls: Counter::define("sluice_control_polls_total"),
            errors: Counter::define("sluice_control_errors_total"),
            updates: Counter::define("sluice_control_ruleset_updates_total"),
            refused: Counter::define("sluice_control_ruleset_refused_total"),
            version: Gauge::define("sluice_control_ruleset_version"),
            reports_sent: Counter::define("sluice_control_reports_sent_total"),
            reports_dropped: Counter::define("sluice_control_reports_dropped_total"),
        }
    }
}

/// Every counter the filter keeps.
#[derive(Debug, Clone, Copy, Default)]
pub struct Metrics {
    /// Requests the filter saw.
    pub requests: Counter,
    /// Requests let through (including fail-open).
    pub allowed: Counter,
    /// Requests answered with the rule's denial.
    pub denied: Counter,
    /// Requests a shadow-mode rule would have denied.
    pub shadow_denied: Counter,
    /// Allowed requests that left a limit at least 80% used.
    pub near_limit: Counter,
    /// Requests or buckets let through because something failed (fail-open events).
    pub fail_open: Counter,
    /// Requests denied because a fail-closed rule could not be evaluated.
    pub fail_closed: Counter,
    /// Host or configuration errors.
    pub errors: Counter,
    /// Compare-and-swap conflicts with other workers (retried).
    pub cas_contention: Counter,
    /// Clients that shared a busy slot because every probed slot was in use.
    pub slot_shared: Counter,
    /// Buckets evicted from a full slot while still holding state.
    pub slot_evictions: Counter,
    /// Slot values that did not decode and were reused.
    pub slot_corrupt: Counter,
    /// Matching rules skipped because the request carried no client key.
    pub key_missing: Counter,
    /// Configurations refused (the filter then passes all traffic).
    pub config_errors: Counter,
    /// Pushed rulesets a worker swapped in (summed over workers).
    pub rulesets_applied: Counter,
    /// Statistics batches a worker could not hand to a running control service.
    pub batches_dropped: Counter,
}

impl Metrics {
    pub fn define() -> Metrics {
        Metrics {
            requests: Counter::define("sluice_requests_total"),
            allowed: Counter::define("sluice_allowed_total"),
            denied: Counter::define("sluice_denied_total"),
            shadow_denied: Counter::define("sluice_shadow_denied_total"),
            near_limit: Counter::define("sluice_near_limit_total"),
            fail_open: Counter::define("sluice_fail_open_total"),
            fail_closed: Counter::define("sluice_fail_closed_total"),
            errors: Counter::define("sluice_errors_total"),
            cas_contention: Counter::define("sluice_cas_contention_total"),
            slot_shared: Counter::define("sluice_slot_shared_total"),
            slot_evictions: Counter::define("sluice_slot_evictions_total"),
            slot_corrupt: Counter::define("sluice_slot_corrupt_total"),
            key_missing: Counter::define("sluice_key_missing_total"),
            config_errors: Counter::define("sluice_config_errors_total"),
            rulesets_applied: Counter::define("sluice_rulesets_applied_total"),
            batches_dropped: Counter::define("sluice_report_batches_dropped_total"),
        }
    }

    pub fn record_limiter(&self, c: &LimiterCounters) {
        self.cas_contention.add(u64::from(c.cas_conflicts));
        self.slot_shared.add(u64::from(c.shared_slots));
        self.slot_evictions.add(u64::from(c.evictions));
        self.slot_corrupt.add(u64::from(c.corrupt_slots));
        self.errors.add(u64::from(c.refund_failures));
    }
}
