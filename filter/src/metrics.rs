//! Envoy counters for everything the filter decides or survives.
//!
//! Counters of the same name from every worker VM add up in Envoy. They appear in
//! `/stats` as `wasmcustom.<name>` and in `/stats/prometheus` as `<name>`.
//!
//! Every increment is a host call, so the request path only bumps a local count and
//! the worker's tick hands the totals to Envoy ([`Metrics::flush`], every 100 ms).

use std::cell::Cell;

use proxy_wasm::hostcalls;
use proxy_wasm::types::MetricType;
use sluice_core::limiter::LimiterCounters;
use sluice_core::report::RuleCounts;
use sluice_core::tokens::{Settled, Settlement};
use sluice_core::usage::UsageError;

/// One Envoy counter with a local, not yet flushed count. Defining can fail on a
/// misbehaving host; such a counter is simply not recorded rather than taking the filter
/// down.
#[derive(Debug, Default)]
pub struct Counter {
    id: Option<u32>,
    pending: Cell<u64>,
}

impl Counter {
    fn define(name: &str) -> Counter {
        let id = hostcalls::define_metric(MetricType::Counter, name)
            .map_err(|status| log::error!("cannot define metric {name}: {status:?}"))
            .ok();
        Counter {
            id,
            pending: Cell::new(0),
        }
    }

    pub fn add(&self, n: u64) {
        self.pending.set(self.pending.get().saturating_add(n));
    }

    pub fn inc(&self) {
        self.add(1);
    }

    /// Hands the local count to Envoy.
    pub fn flush(&self) {
        let n = self.pending.replace(0);
        if let (Some(id), true) = (self.id, n > 0) {
            // Nothing useful can be done if the host refuses an increment.
            let _ = hostcalls::increment_metric(id, i64::try_from(n).unwrap_or(i64::MAX));
        }
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
#[derive(Debug, Default)]
pub struct RuleCounters {
    /// The rule id as it appears in the names.
    id: String,
    pub allowed: Counter,
    pub denied: Counter,
    pub shadow_denied: Counter,
    pub near_limit: Counter,
    pub fail_open: Counter,
    /// `tokens_used_total` and `tokens_throttled_total`, defined when the rule first
    /// reports tokens: a rule without token limits adds nothing to Envoy's `/stats`.
    tokens: Option<[Counter; 2]>,
    /// The shaping outcomes, each defined when the rule first reports one, for the same
    /// reason: `warned_total` (a soft limit or warn mode), `delayed_total` and
    /// `delay_wait_ms_total` (`on_limit: delay`), `in_flight_refused_total`.
    warned: Option<Counter>,
    delayed: Option<Counter>,
    delay_wait_ms: Option<Counter>,
    in_flight_refused: Option<Counter>,
}

impl RuleCounters {
    pub fn define(rule_id: &str) -> RuleCounters {
        let id = rule_id.replace('.', "_");
        let counter = |outcome: &str| counter_of(&id, outcome);
        RuleCounters {
            allowed: counter("allowed"),
            denied: counter("denied"),
            shadow_denied: counter("shadow_denied"),
            near_limit: counter("near_limit"),
            fail_open: counter("fail_open"),
            tokens: None,
            warned: None,
            delayed: None,
            delay_wait_ms: None,
            in_flight_refused: None,
            id,
        }
    }

    /// Adds one flush interval's counts and hands them to Envoy.
    pub fn add(&mut self, counts: &RuleCounts) {
        for (counter, n) in [
            (&self.allowed, counts.allowed),
            (&self.denied, counts.denied),
            (&self.shadow_denied, counts.shadow_denied),
            (&self.near_limit, counts.near_limit),
            (&self.fail_open, counts.fail_open),
        ] {
            counter.add(n);
            counter.flush();
        }
        let id = &self.id;
        let counter = |outcome: &str| counter_of(id, outcome);
        add_defined_once(&mut self.warned, counts.warned, || counter("warned"));
        add_defined_once(&mut self.delayed, counts.delayed, || counter("delayed"));
        add_defined_once(&mut self.delay_wait_ms, counts.delay_wait_ms, || {
            counter("delay_wait_ms")
        });
        add_defined_once(
            &mut self.in_flight_refused,
            counts.in_flight_refused,
            || counter("in_flight_refused"),
        );
        if counts.tokens_used == 0 && counts.tokens_throttled == 0 && self.tokens.is_none() {
            return;
        }
        let id = &self.id;
        let counter = |outcome: &str| counter_of(id, outcome);
        let tokens = self
            .tokens
            .get_or_insert_with(|| [counter("tokens_used"), counter("tokens_throttled")]);
        for (counter, n) in tokens
            .iter()
            .zip([counts.tokens_used, counts.tokens_throttled])
        {
            counter.add(n);
            counter.flush();
        }
    }
}

/// Adds `n` to a counter defined by `define` when it is first non-zero, so a rule that
/// never reports it adds nothing to Envoy's `/stats`.
fn add_defined_once(slot: &mut Option<Counter>, n: u64, define: impl FnOnce() -> Counter) {
    if n == 0 && slot.is_none() {
        return;
    }
    let counter = slot.get_or_insert_with(define);
    counter.add(n);
    counter.flush();
}

fn counter_of(id: &str, outcome: &str) -> Counter {
    Counter::define(&format!("sluice_rule.{id}.{outcome}_total"))
}

/// The control service's metrics (one instance, on the main thread).
#[derive(Debug, Default)]
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
    /// Syncs of global buckets answered by the admin API.
    pub syncs: Counter,
    /// Syncs that failed (unreachable, refused, or a bad answer): the proxy then keeps
    /// to its fallback shares.
    pub sync_failures: Counter,
    /// Global buckets in the last sync.
    pub global_buckets: Gauge,
    /// Proxies in the fleet, from the last answered sync.
    pub fleet_size: Gauge,
    /// 1 while global limits run on this proxy's fallback shares (syncs failing, or the
    /// coordinator warming up), else 0.
    pub global_fallback: Gauge,
    /// The sync interval in force, in milliseconds: the configured one, stretched up to
    /// four times while the coordinator's answers are slow.
    pub sync_interval_ms: Gauge,
    /// Calls Envoy refused because it has no cluster named `admin_cluster` (a missing
    /// `ServiceEntry` under Istio, a typo): nothing reaches the admin API meanwhile.
    pub admin_cluster_missing: Counter,
}

impl ControlMetrics {
    /// Hands every local count to Envoy.
    pub fn flush(&self) {
        for counter in [
            &self.polls,
            &self.errors,
            &self.updates,
            &self.refused,
            &self.reports_sent,
            &self.reports_dropped,
            &self.syncs,
            &self.sync_failures,
            &self.admin_cluster_missing,
        ] {
            counter.flush();
        }
    }

    pub fn define() -> ControlMetrics {
        ControlMetrics {
            polls: Counter::define("sluice_control_polls_total"),
            errors: Counter::define("sluice_control_errors_total"),
            updates: Counter::define("sluice_control_ruleset_updates_total"),
            refused: Counter::define("sluice_control_ruleset_refused_total"),
            version: Gauge::define("sluice_control_ruleset_version"),
            reports_sent: Counter::define("sluice_control_reports_sent_total"),
            reports_dropped: Counter::define("sluice_control_reports_dropped_total"),
            syncs: Counter::define("sluice_control_syncs_total"),
            sync_failures: Counter::define("sluice_control_sync_failures_total"),
            global_buckets: Gauge::define("sluice_control_global_buckets"),
            fleet_size: Gauge::define("sluice_control_fleet_size"),
            global_fallback: Gauge::define("sluice_control_global_fallback"),
            sync_interval_ms: Gauge::define("sluice_control_sync_interval_ms"),
            admin_cluster_missing: Counter::define("sluice_control_admin_cluster_missing_total"),
        }
    }
}

/// The election of the root that runs the control service (`crate::election`), counted
/// in every candidate: summed over workers, takeovers say how often leadership moved.
#[derive(Debug, Default)]
pub struct ElectionMetrics {
    /// Times a root took the lease and started the control service.
    pub takeovers: Counter,
    /// Times a leading root stopped because another took the lease.
    pub step_downs: Counter,
    /// The host refused a read or write of the lease.
    pub errors: Counter,
}

impl ElectionMetrics {
    pub fn define() -> ElectionMetrics {
        ElectionMetrics {
            takeovers: Counter::define("sluice_control_takeovers_total"),
            step_downs: Counter::define("sluice_control_step_downs_total"),
            errors: Counter::define("sluice_control_lease_errors_total"),
        }
    }

    /// Hands every local count to Envoy.
    pub fn flush(&self) {
        for counter in [&self.takeovers, &self.step_downs, &self.errors] {
            counter.flush();
        }
    }
}

/// Every counter the filter keeps.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Requests the filter saw.
    pub requests: Counter,
    /// Requests let through (including fail-open).
    pub allowed: Counter,
    /// Requests answered with the rule's denial.
    pub denied: Counter,
    /// Requests a shadow-mode rule would have denied.
    pub shadow_denied: Counter,
    /// Allowed requests told they are over a limit (`x-sluice-warning`): within a soft
    /// limit's margin, or over a warn-mode rule's limit. Also in `allowed`.
    pub warned: Counter,
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
    /// Denials repeated from this worker's memory of a wait still running, without
    /// reading the bucket (`sluice_core::denials`).
    pub denials_remembered: Counter,
    /// Matching rules skipped because the request carried no client key.
    pub key_missing: Counter,
    /// Matching rules whose client key was missing and that used their fallback key.
    pub key_fallback: Counter,
    /// Enforce-mode rules run in shadow mode for a client outside their rollout
    /// (`enforce_percent`).
    pub rollout_shadow: Counter,
    /// Configurations refused (the filter then passes all traffic).
    pub config_errors: Counter,
    /// Pushed rulesets a worker swapped in (summed over workers).
    pub rulesets_applied: Counter,
    /// Statistics batches a worker could not hand to a running control service.
    pub batches_dropped: Counter,
    /// Global limits admitted from the proxy's fallback share (coordinator out of reach or
    /// warming up).
    pub global_fallback: Counter,
    /// Global limits that could not be evaluated (the rule's failure mode decided).
    pub global_failures: Counter,
    /// Of those, because every probed lease-table entry belonged to another active bucket.
    pub global_table_full: Counter,
    /// Token budgets: reservations and how they were settled.
    pub tokens: TokenMetrics,
    pub in_flight: InFlightMetrics,
    pub delay: DelayMetrics,
}

/// The delay queue's counters (`on_limit: delay`, `sluice_core::delay`).
#[derive(Debug, Default)]
pub struct DelayMetrics {
    /// Requests over a limit that were queued to wait for their tokens (also counted in
    /// `allowed`: they were admitted, ahead).
    pub delayed: Counter,
    /// Queued requests resumed when their tokens were due.
    pub passed: Counter,
    /// Milliseconds the passed requests spent queued, summed (divide by `passed` for the
    /// mean).
    pub queued_ms: Counter,
    /// Milliseconds past their due time the passed requests were resumed, summed: the
    /// tick's part of their added latency.
    pub late_ms: Counter,
    /// Queued requests whose stream ended before they were due: taken out of the queue
    /// and their tokens given back.
    pub cancelled: Counter,
    /// A queued request could not be resumed, or a cancelled one's tokens could not be
    /// given back (their charge stands).
    pub failures: Counter,
}

impl DelayMetrics {
    fn define() -> DelayMetrics {
        DelayMetrics {
            delayed: Counter::define("sluice_delayed_total"),
            passed: Counter::define("sluice_delay_passed_total"),
            queued_ms: Counter::define("sluice_delay_queued_ms_total"),
            late_ms: Counter::define("sluice_delay_late_ms_total"),
            cancelled: Counter::define("sluice_delay_cancelled_total"),
            failures: Counter::define("sluice_delay_failures_total"),
        }
    }

    fn counters(&self) -> impl Iterator<Item = &Counter> {
        [
            &self.delayed,
            &self.passed,
            &self.queued_ms,
            &self.late_ms,
            &self.cancelled,
            &self.failures,
        ]
        .into_iter()
    }
}

/// In-flight limits' counters (`sluice_core::in_flight`).
#[derive(Debug, Default)]
pub struct InFlightMetrics {
    /// Requests denied because their client had its limit in flight (also in `denied`).
    pub denied: Counter,
    /// Places taken by admitted requests.
    pub held: Counter,
    /// Places let go when their request's stream ended.
    pub released: Counter,
    /// Places dropped because they lapsed: held by a request whose worker neither let
    /// them go nor refreshed them (a failed VM). Zero while every worker lives.
    pub lapsed: Counter,
    /// The in-flight table could not be used (contention, a full key, a host error):
    /// taking a place (the rule's failure mode decided), letting go or refreshing one.
    pub failures: Counter,
}

impl InFlightMetrics {
    fn define() -> InFlightMetrics {
        InFlightMetrics {
            denied: Counter::define("sluice_in_flight_denied_total"),
            held: Counter::define("sluice_in_flight_held_total"),
            released: Counter::define("sluice_in_flight_released_total"),
            lapsed: Counter::define("sluice_in_flight_lapsed_total"),
            failures: Counter::define("sluice_in_flight_failures_total"),
        }
    }

    fn counters(&self) -> impl Iterator<Item = &Counter> {
        [
            &self.denied,
            &self.held,
            &self.released,
            &self.lapsed,
            &self.failures,
        ]
        .into_iter()
    }
}

/// Token budgets' counters (`sluice_core::tokens`).
#[derive(Debug, Default)]
pub struct TokenMetrics {
    /// Allowed requests that reserved tokens.
    pub reservations: Counter,
    /// Reservations settled with the usage the response reported.
    pub settled: Counter,
    /// Reservations refunded: the upstream answered 5xx, or the request ended before its
    /// response did (client reset, upstream abort).
    pub refunded: Counter,
    /// Tokens charged when settling (the usage, or the reservation where it was unknown).
    pub charged: Counter,
    /// Extra tokens forgiven because a bucket's debt reached one burst.
    pub forgiven: Counter,
    /// Bucket writes that failed when settling (the reservation stood as the charge).
    pub settle_failures: Counter,
    /// Request bodies not read for `max_tokens` (over the cap, or not JSON): the rule's
    /// default estimate was reserved.
    pub body_unread: Counter,
    /// Responses whose usage was unknown, by reason (`UsageError`): the reservation stood
    /// as the charge.
    pub unknown_missing: Counter,
    pub unknown_malformed: Counter,
    pub unknown_out_of_range: Counter,
    pub unknown_too_large: Counter,
    pub unknown_incomplete: Counter,
}

impl TokenMetrics {
    fn define() -> TokenMetrics {
        TokenMetrics {
            reservations: Counter::define("sluice_token_reservations_total"),
            settled: Counter::define("sluice_token_settled_total"),
            refunded: Counter::define("sluice_token_refunded_total"),
            charged: Counter::define("sluice_tokens_charged_total"),
            forgiven: Counter::define("sluice_token_debt_forgiven_total"),
            settle_failures: Counter::define("sluice_token_settle_failures_total"),
            body_unread: Counter::define("sluice_token_body_unread_total"),
            unknown_missing: Counter::define("sluice_token_usage_unknown_missing_total"),
            unknown_malformed: Counter::define("sluice_token_usage_unknown_malformed_total"),
            unknown_out_of_range: Counter::define("sluice_token_usage_unknown_out_of_range_total"),
            unknown_too_large: Counter::define("sluice_token_usage_unknown_too_large_total"),
            unknown_incomplete: Counter::define("sluice_token_usage_unknown_incomplete_total"),
        }
    }

    fn counters(&self) -> impl Iterator<Item = &Counter> {
        [
            &self.reservations,
            &self.settled,
            &self.refunded,
            &self.charged,
            &self.forgiven,
            &self.settle_failures,
            &self.body_unread,
            &self.unknown_missing,
            &self.unknown_malformed,
            &self.unknown_out_of_range,
            &self.unknown_too_large,
            &self.unknown_incomplete,
        ]
        .into_iter()
    }

    /// Counts a response whose usage is unknown.
    pub fn unknown(&self, error: UsageError) {
        match error {
            UsageError::Missing => &self.unknown_missing,
            UsageError::Malformed => &self.unknown_malformed,
            UsageError::OutOfRange => &self.unknown_out_of_range,
            UsageError::TooLarge => &self.unknown_too_large,
            UsageError::Incomplete => &self.unknown_incomplete,
        }
        .inc();
    }

    /// Counts one settled reservation.
    pub fn record(&self, settlement: Settlement, settled: &Settled) {
        match settlement {
            Settlement::Used(_) => self.settled.inc(),
            Settlement::Refund => self.refunded.inc(),
            Settlement::Unknown => {}
        }
        for _ in 0..settled.unreported {
            self.unknown(UsageError::Missing);
        }
        self.charged.add(settled.charged);
        self.forgiven.add(settled.forgiven);
        self.settle_failures.add(u64::from(settled.failures));
    }
}

impl Metrics {
    pub fn define() -> Metrics {
        Metrics {
            requests: Counter::define("sluice_requests_total"),
            allowed: Counter::define("sluice_allowed_total"),
            denied: Counter::define("sluice_denied_total"),
            shadow_denied: Counter::define("sluice_shadow_denied_total"),
            warned: Counter::define("sluice_warned_total"),
            near_limit: Counter::define("sluice_near_limit_total"),
            fail_open: Counter::define("sluice_fail_open_total"),
            fail_closed: Counter::define("sluice_fail_closed_total"),
            errors: Counter::define("sluice_errors_total"),
            cas_contention: Counter::define("sluice_cas_contention_total"),
            slot_shared: Counter::define("sluice_slot_shared_total"),
            slot_evictions: Counter::define("sluice_slot_evictions_total"),
            slot_corrupt: Counter::define("sluice_slot_corrupt_total"),
            denials_remembered: Counter::define("sluice_denials_remembered_total"),
            key_missing: Counter::define("sluice_key_missing_total"),
            key_fallback: Counter::define("sluice_key_fallback_total"),
            rollout_shadow: Counter::define("sluice_rollout_shadow_total"),
            config_errors: Counter::define("sluice_config_errors_total"),
            rulesets_applied: Counter::define("sluice_rulesets_applied_total"),
            batches_dropped: Counter::define("sluice_report_batches_dropped_total"),
            global_fallback: Counter::define("sluice_global_fallback_total"),
            global_failures: Counter::define("sluice_global_failures_total"),
            global_table_full: Counter::define("sluice_global_table_full_total"),
            tokens: TokenMetrics::define(),
            in_flight: InFlightMetrics::define(),
            delay: DelayMetrics::define(),
        }
    }

    /// Hands every local count to Envoy.
    pub fn flush(&self) {
        for counter in [
            &self.requests,
            &self.allowed,
            &self.denied,
            &self.shadow_denied,
            &self.warned,
            &self.near_limit,
            &self.fail_open,
            &self.fail_closed,
            &self.errors,
            &self.cas_contention,
            &self.slot_shared,
            &self.slot_evictions,
            &self.slot_corrupt,
            &self.denials_remembered,
            &self.key_missing,
            &self.key_fallback,
            &self.rollout_shadow,
            &self.config_errors,
            &self.rulesets_applied,
            &self.batches_dropped,
            &self.global_fallback,
            &self.global_failures,
            &self.global_table_full,
        ]
        .into_iter()
        .chain(self.tokens.counters())
        .chain(self.in_flight.counters())
        .chain(self.delay.counters())
        {
            counter.flush();
        }
    }

    pub fn record_limiter(&self, c: &LimiterCounters) {
        self.cas_contention.add(u64::from(c.cas_conflicts));
        self.slot_shared.add(u64::from(c.shared_slots));
        self.slot_evictions.add(u64::from(c.evictions));
        self.slot_corrupt.add(u64::from(c.corrupt_slots));
        self.denials_remembered.add(u64::from(c.remembered_denials));
        self.errors.add(u64::from(c.refund_failures));
        self.errors.add(u64::from(c.pool_failures));
    }
}
