//! Root contexts. The one module plays two parts, told apart by the root id Envoy
//! configured:
//!
//! * `sluice_control`: the singleton on the main thread, a candidate for running the
//!   control service ([`crate::election`], [`crate::control`]) that always wins;
//! * anything else: the HTTP filter, one root per worker VM, owning what every request
//!   of that worker shares: the configuration in force, the metrics and the store. When
//!   its plugin configuration has a `control` section it is a candidate too: the workers
//!   elect one of themselves to run the control service, unless the singleton does.

use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{BufferType, ContextType};
use sluice_core::config::{ControlConfigSpec, FilterConfig, FilterConfigSpec};
use sluice_core::control::election::Role;

use crate::clock;
use crate::control;
use crate::delay::DELAY_TICK;
use crate::election::{self, ControlSeat};
use crate::http::SluiceHttp;
use crate::metrics::{Metrics, RuleCounters};
use crate::shared::Shared;
use crate::{global_channel, report_channel, ruleset_channel};

/// The root id of the control service in the generated Envoy configuration.
pub const CONTROL_ROOT_ID: &str = "sluice_control";
/// How often a worker checks for a newly pushed ruleset: one 8-byte shared-data read.
/// Short enough that a saved rule is enforced everywhere well within a second.
const WORKER_TICK: Duration = Duration::from_millis(100);
/// How often a worker hands its statistics to Envoy's counters and the control service.
const FLUSH_EVERY: Duration = Duration::from_secs(1);

#[derive(Debug)]
pub struct SluiceRoot {
    /// Envoy's id of this root context: the effective context again after the tick
    /// resumed a waiting request.
    id: u32,
    part: Part,
}

#[derive(Debug, Default)]
enum Part {
    #[default]
    Unconfigured,
    /// Boxed: a worker's root holds its whole configuration, several times the size of
    /// the other variants.
    Filter(Box<FilterRoot>),
    /// The singleton; `None` when its configuration is invalid.
    Control(Option<ControlSeat>),
}

impl SluiceRoot {
    pub fn new(id: u32) -> Self {
        Self {
            id,
            part: Part::Unconfigured,
        }
    }

    /// This root's candidacy for running the control service, if it has one.
    fn seat(&mut self) -> Option<&mut ControlSeat> {
        match &mut self.part {
            Part::Filter(filter) => filter.seat.as_mut(),
            Part::Control(seat) => seat.as_mut(),
            Part::Unconfigured => None,
        }
    }
}

impl Context for SluiceRoot {
    fn on_http_call_response(
        &mut self,
        token: u32,
        _headers: usize,
        body_size: usize,
        _trailers: usize,
    ) {
        if let Some(seat) = self.seat() {
            seat.on_response(token, body_size);
        }
    }

    /// Envoy tears this root down (its listener or filter configuration was replaced, or
    /// Envoy is stopping): a leader hands the lease over now rather than letting it expire.
    fn on_done(&mut self) -> bool {
        if let Some(seat) = self.seat() {
            seat.release();
        }
        if let Part::Filter(filter) = &self.part {
            filter.shared.orphaned.set(true);
            filter.shared.metrics().flush();
        }
        true
    }
}

impl RootContext for SluiceRoot {
    fn on_configure(&mut self, plugin_configuration_size: usize) -> bool {
        let bytes = hostcalls::get_buffer(
            BufferType::PluginConfiguration,
            0,
            plugin_configuration_size,
        );
        let root_id = hostcalls::get_property(vec!["plugin_root_id"])
            .ok()
            .flatten()
            .unwrap_or_default();
        if root_id == CONTROL_ROOT_ID.as_bytes() {
            let config = configure_control(bytes.ok().flatten().unwrap_or_default());
            self.part = Part::Control(config.map(|c| ControlSeat::new(Role::Singleton, c)));
            let _ = hostcalls::set_tick_period(control::TICK);
            return true;
        }
        if !matches!(self.part, Part::Filter(_)) {
            self.part = Part::Filter(Box::new(FilterRoot {
                root_id: self.id,
                period: WORKER_TICK,
                ..FilterRoot::default()
            }));
            let _ = hostcalls::set_tick_period(WORKER_TICK);
        }
        if let Part::Filter(filter) = &mut self.part {
            filter.configure(bytes);
        }
        // Returning false would make Envoy reject the configuration or fail the VM; Sluice
        // reports problems in the log and metrics and keeps traffic flowing instead.
        true
    }

    fn on_queue_ready(&mut self, queue_id: u32) {
        if let Some(seat) = self.seat() {
            seat.on_queue_ready(queue_id);
        }
    }

    fn on_tick(&mut self) {
        match &mut self.part {
            Part::Filter(filter) => filter.on_tick(),
            Part::Control(Some(seat)) => seat.on_tick(),
            Part::Control(None) | Part::Unconfigured => {}
        }
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        match &self.part {
            Part::Filter(filter) => Some(Box::new(SluiceHttp::new(
                Rc::clone(&filter.shared),
                context_id,
            ))),
            // Only reachable if Envoy were misconfigured to run the control root as an
            // HTTP filter: pass traffic rather than fail.
            _ => None,
        }
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

fn configure_control(bytes: Vec<u8>) -> Option<ControlConfigSpec> {
    match ControlConfigSpec::from_json(&bytes) {
        Ok(config) => Some(config),
        Err(e) => {
            log::error!(
                "the control service configuration is invalid ({e}); not following the admin API"
            );
            None
        }
    }
}

/// A worker's root: its static configuration, and the pushed ruleset it follows.
#[derive(Debug, Default)]
struct FilterRoot {
    shared: Rc<Shared>,
    metrics_defined: bool,
    /// The settings from the plugin configuration; pushed rulesets replace only its rules.
    base: Option<FilterConfig>,
    /// The pushed ruleset version in force (or refused), to notice new ones cheaply.
    pushed_version: Option<u64>,
    /// Time since the last statistics flush, counted in routine periods.
    since_flush: Duration,
    /// A candidate for running the control service (the plugin configuration has a
    /// `control` section).
    seat: Option<ControlSeat>,
    /// Ticking at the control service's pace (50 ms) because this root leads.
    fast_ticks: bool,
    /// Envoy's id of this root context (see [`SluiceRoot::id`]).
    root_id: u32,
    /// The tick period in force.
    period: Duration,
    /// Time since the routine work last ran (it runs every [`Self::routine_period`],
    /// whatever the tick).
    since_routine: Duration,
    /// Envoy counters per rule id, defined when a rule first sees traffic.
    rule_counters: HashMap<String, RuleCounters>,
}

impl FilterRoot {
    /// Resumes the requests whose tokens are due, then, at its own pace, the routine
    /// work.
    fn on_tick(&mut self) {
        if let Some(now) = clock::now() {
            let metrics = self.shared.metrics();
            self.shared
                .delay
                .resume_due(self.root_id, now, &metrics.delay);
        }
        self.since_routine += self.period;
        if self.since_routine >= self.routine_period() {
            self.since_routine = Duration::ZERO;
            self.routine();
        }
        self.follow_tick_period();
    }

    /// Follows the ruleset, the fleet view and the control service; flushes statistics
    /// and metrics; refreshes in-flight places.
    fn routine(&mut self) {
        self.since_flush += self.routine_period();
        self.follow_pushed_ruleset();
        self.follow_fleet_view();
        self.flush_statistics();
        if let Some(now) = clock::now() {
            self.shared
                .in_flight
                .refresh(now, &self.shared.metrics().in_flight);
        }
        self.shared.metrics().flush();
        if let Some(seat) = &mut self.seat {
            seat.on_tick();
        }
        // The leader works at the control service's pace, so polls, syncs and reports
        // go out as promptly as from the singleton; the other workers stay at 100 ms.
        self.fast_ticks = self.seat.as_ref().is_some_and(ControlSeat::leads);
    }

    /// How often the routine work runs.
    fn routine_period(&self) -> Duration {
        if self.fast_ticks {
            control::TICK
        } else {
            WORKER_TICK
        }
    }

    /// Ticks at most [`DELAY_TICK`] apart while the rules may delay requests or any still
    /// waits, aimed at the first waiter's due time, so each passes at most one such tick
    /// after it is due and most far sooner; at the routine's pace otherwise.
    fn follow_tick_period(&mut self) {
        let delays = self
            .shared
            .config()
            .is_some_and(|c| c.ruleset.has_delay_rules())
            || !self.shared.delay.is_empty();
        let period = match clock::now() {
            Some(now) if delays => self.shared.delay.next_tick(now),
            _ if delays => DELAY_TICK,
            _ => self.routine_period(),
        };
        if period != self.period {
            self.period = period;
            let _ = hostcalls::set_tick_period(period);
        }
    }

    /// Follows the plugin configuration's `control` section: a candidate while there is
    /// one (with its latest settings), none (and the lease handed over) once it is gone.
    fn follow_control(&mut self, control: Option<ControlConfigSpec>) {
        match (control, &mut self.seat) {
            (Some(config), Some(seat)) => seat.reconfigure(config),
            (Some(config), None) => {
                log::info!(
                    "the plugin configuration names the admin API (cluster {}): this worker \
                     is a candidate for running the control service",
                    config.admin_cluster
                );
                self.seat = Some(ControlSeat::new(Role::Worker, config));
            }
            (None, Some(seat)) => {
                seat.release();
                self.seat = None;
            }
            (None, None) => {}
        }
    }

    fn configure(&mut self, bytes: Result<Option<Vec<u8>>, proxy_wasm::types::Status>) {
        if !self.metrics_defined {
            *self.shared.metrics.borrow_mut() = Metrics::define();
            self.metrics_defined = true;
        }
        let shared = Rc::clone(&self.shared);
        let metrics = shared.metrics();
        let bytes = match bytes {
            Ok(bytes) => bytes.unwrap_or_default(),
            Err(status) => {
                log::error!(
                    "cannot read the plugin configuration ({status:?}); passing all traffic"
                );
                metrics.config_errors.inc();
                return;
            }
        };
        match FilterConfig::from_json(&bytes) {
            Ok(config) => {
                log::info!(
                    "configured with {} static rule(s), {} bucket slots",
                    config.ruleset.rules().len(),
                    config.table.slots()
                );
                if let Err(e) = global_channel::publish_slots(config.lease_table.slots()) {
                    log::warn!("{e}");
                    metrics.errors.inc();
                }
                self.follow_control(config.control.clone());
                self.shared.install(config.clone());
                self.base = Some(config);
            }
            Err(error) => {
                // A bad configuration must never take traffic down: keep the last good
                // one if there is one, otherwise pass everything, and say so loudly.
                let kept = if self.shared.config().is_some() {
                    "keeping the previous configuration"
                } else {
                    "passing all traffic"
                };
                log::error!("{error}; {kept}");
                metrics.config_errors.inc();
            }
        }
        // A worker (re)starting after the control service published must not wait for a
        // tick, nor fall back to static rules in between.
        self.pushed_version = None;
        self.follow_pushed_ruleset();
        self.follow_fleet_view();
        self.follow_tick_period();
    }

    /// Once a second: adds the statistics gathered since the last flush to the per-rule
    /// Envoy counters and, while a control service collects them, hands them over too.
    /// Keeping this off the request path leaves each request one in-memory update.
    fn flush_statistics(&mut self) {
        if self.since_flush < FLUSH_EVERY {
            return;
        }
        self.since_flush = Duration::ZERO;
        let batch = self.shared.statistics.borrow_mut().take();
        if batch.rules.is_empty() && batch.overflow == 0 {
            return;
        }
        for rule in &batch.rules {
            self.rule_counters
                .entry(rule.rule.clone())
                .or_insert_with(|| RuleCounters::define(&rule.rule))
                .add(&rule.counts);
        }
        if !election::control_running(clock::now().unwrap_or_default()) {
            // No control service (static rules only) or it is not draining: Envoy's own
            // counters above are all there is.
            return;
        }
        if let Err(e) = report_channel::send(&batch) {
            log::warn!("cannot hand statistics to the control service: {e}");
            self.shared.metrics().batches_dropped.inc();
        }
    }

    /// Takes the fleet view the control service last published (one small read).
    fn follow_fleet_view(&mut self) {
        match global_channel::view() {
            Ok(view) => self.shared.view.set(view),
            Err(e) => {
                log::warn!("cannot read the fleet view: {e}");
                self.shared.metrics().errors.inc();
            }
        }
    }

    /// Swaps in the ruleset the control service published, if it is new.
    fn follow_pushed_ruleset(&mut self) {
        let version = match ruleset_channel::published_version() {
            Ok(Some(version)) if Some(version) != self.pushed_version => version,
            Ok(_) => return,
            Err(e) => {
                log::warn!("cannot read the pushed ruleset version: {e}");
                self.shared.metrics().errors.inc();
                return;
            }
        };
        self.pushed_version = Some(version);
        let metrics = self.shared.metrics();
        let doc = match ruleset_channel::published_document() {
            Ok(Some(doc)) => doc,
            Ok(None) => return,
            Err(e) => {
                log::error!(
                    "cannot read pushed ruleset version {version}: {e}; keeping the current rules"
                );
                metrics.errors.inc();
                return;
            }
        };
        let ruleset = match doc.compile() {
            Ok(ruleset) => ruleset,
            Err(errors) => {
                // The control service validated it, so this means a module mismatch.
                log::error!(
                    "pushed ruleset version {} is invalid here: {errors}; keeping the current rules",
                    doc.version
                );
                metrics.errors.inc();
                return;
            }
        };
        let base = self
            .base
            .clone()
            .or_else(|| FilterConfig::try_from(FilterConfigSpec::default()).ok());
        if let Some(base) = base {
            self.shared.install(FilterConfig { ruleset, ..base });
            metrics.rulesets_applied.inc();
            log::info!("now enforcing pushed ruleset version {}", doc.version);
        }
    }
}
