//! Which root context runs the control service: the core's election
//! (`sluice_core::control::election`) over the shared-data key `sluice.control.lease`.
//!
//! A [`ControlSeat`] is one candidate: the singleton's root (bootstrap extension) or a
//! worker's root whose plugin configuration has a `control` section. On every tick it
//! reads the lease, lets the core decide, and writes the lease by compare-and-swap; while
//! it leads it runs a [`ControlService`], created when it takes the lease and dropped when
//! it loses it. Being torn down (`on_done`) it releases the lease, so a successor takes
//! over on its next tick instead of after the lease expires.
//!
//! The lease is also the workers' sign that a control service drains the report queue
//! ([`control_running`]): it replaced the singleton's separate heartbeat.

use proxy_wasm::hostcalls;
use proxy_wasm::types::Status;
use sluice_core::config::ControlConfigSpec;
use sluice_core::control::election::{self, Decision, Election, Lease, Role, Transition};
use sluice_core::time::Nanos;

use crate::channel::ChannelError;
use crate::clock;
use crate::control::ControlService;
use crate::host_store::CREATE_CAS;
use crate::metrics::{ControlMetrics, ElectionMetrics};

/// The lease's shared-data key.
const LEASE_KEY: &str = "sluice.control.lease";

/// Whether some control service holds a fresh lease at `now` (so it drains the report
/// queue). Workers enqueue statistics only then.
pub fn control_running(now: Nanos) -> bool {
    match hostcalls::get_shared_data(LEASE_KEY) {
        Ok((bytes, _)) => election::control_running(bytes.as_deref(), now),
        Err(_) => false,
    }
}

/// One candidate for running the control service, and the service while it leads.
#[derive(Debug)]
pub struct ControlSeat {
    election: Election,
    config: ControlConfigSpec,
    service: Option<Box<ControlService>>,
    metrics: ElectionMetrics,
}

impl ControlSeat {
    pub fn new(role: Role, config: ControlConfigSpec) -> ControlSeat {
        // The control service's metrics exist (at zero) from the start, before any root
        // takes the lease: Envoy keeps one metric per name, so defining them again when a
        // service starts changes nothing.
        let _ = ControlMetrics::define();
        ControlSeat {
            election: Election::new(role),
            config,
            service: None,
            metrics: ElectionMetrics::define(),
        }
    }

    /// Whether this candidate runs the control service.
    pub fn leads(&self) -> bool {
        self.service.is_some()
    }

    /// A new configuration from the plugin configuration. A changed one restarts the
    /// service (it holds the cluster, token and intervals) but keeps the lease.
    pub fn reconfigure(&mut self, config: ControlConfigSpec) {
        if config != self.config {
            self.config = config;
            if self.service.is_some() {
                self.service = Some(Box::new(ControlService::new(self.config.clone())));
            }
        }
    }

    /// Called on every tick: takes, keeps or gives up the lease, then runs the service
    /// while leading.
    pub fn on_tick(&mut self) {
        self.metrics.flush();
        let now = clock::now().unwrap_or_default();
        let (stored, cas) = match hostcalls::get_shared_data(LEASE_KEY) {
            Ok(read) => read,
            Err(status) => {
                // Without the lease nobody can know who leads: a leader stops acting (a
                // host that refuses reads refuses the renewal too, and the lease lapses).
                log::warn!(
                    "{}",
                    ChannelError::host("reading the control service's lease")(status)
                );
                self.metrics.errors.inc();
                self.election.stood_by();
                self.step_down("the lease cannot be read");
                return;
            }
        };
        match self.election.decide(stored.as_deref(), now) {
            Decision::Take(lease) | Decision::Renew(lease) => {
                let written = self.write(lease, cas);
                match self.election.wrote(lease, written) {
                    Transition::Took => self.take(lease),
                    Transition::Kept => {}
                    Transition::Lost => self.step_down("another root took the lease"),
                    Transition::Beaten => {}
                }
            }
            Decision::StandBy => self.election.stood_by(),
            Decision::StepDown => {
                self.election.stood_by();
                self.step_down("another root holds the lease");
            }
        }
        if let Some(service) = &mut self.service {
            service.on_tick();
        }
    }

    /// Called with the answer to an HTTP call. An answer that arrives after another root
    /// took the lease (between two ticks) is not acted upon.
    pub fn on_response(&mut self, token: u32, body_size: usize) {
        if self.service.is_none() {
            return;
        }
        let now = clock::now().unwrap_or_default();
        let stored = hostcalls::get_shared_data(LEASE_KEY)
            .ok()
            .and_then(|(bytes, _)| bytes);
        if !self.election.still_leads(stored.as_deref(), now) {
            return;
        }
        if let Some(service) = &mut self.service {
            service.on_response(token, body_size);
        }
    }

    pub fn on_queue_ready(&mut self, queue: u32) {
        if let Some(service) = &mut self.service {
            service.on_queue_ready(queue);
        }
    }

    /// The root is being torn down: hands the lease over at once.
    pub fn release(&mut self) {
        let Ok((stored, cas)) = hostcalls::get_shared_data(LEASE_KEY) else {
            self.service = None;
            return;
        };
        if let (Some(released), Some(cas)) = (self.election.release(stored.as_deref()), cas) {
            match hostcalls::set_shared_data(LEASE_KEY, Some(&released.encode()), Some(cas)) {
                Ok(()) => log::info!(
                    "released the control service's lease (term {}): another root takes over \
                     on its next tick",
                    released.term
                ),
                // Someone else wrote since: nothing of ours to release.
                Err(Status::CasMismatch) => {}
                Err(status) => log::warn!("cannot release the control service's lease: {status:?}"),
            }
        }
        self.service = None;
    }

    /// Writes `lease` over what was read: by its CAS, or "create only if absent" when the
    /// key was never written (a CAS of 0 would overwrite whatever a racing root created).
    fn write(&self, lease: Lease, cas: Option<u32>) -> bool {
        let cas = cas.unwrap_or(CREATE_CAS);
        match hostcalls::set_shared_data(LEASE_KEY, Some(&lease.encode()), Some(cas)) {
            Ok(()) => true,
            Err(Status::CasMismatch) => false,
            Err(status) => {
                log::warn!(
                    "{}",
                    ChannelError::host("writing the control service's lease")(status)
                );
                self.metrics.errors.inc();
                false
            }
        }
    }

    fn take(&mut self, lease: Lease) {
        self.metrics.takeovers.inc();
        log::info!(
            "this {} runs the control service (lease term {}, renewed every tick, {} s \
             without renewal frees it)",
            match self.election.role() {
                Role::Worker => "worker",
                Role::Singleton => "singleton",
            },
            lease.term,
            election::LEASE_DURATION.get() / 1_000_000_000,
        );
        self.service = Some(Box::new(ControlService::new(self.config.clone())));
    }

    fn step_down(&mut self, why: &str) {
        if self.service.take().is_some() {
            self.metrics.step_downs.inc();
            log::info!("this root stopped running the control service: {why}");
        }
    }
}
