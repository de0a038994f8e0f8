//! Decision statistics from the workers to the control service.
//!
//! Workers aggregate decisions in memory (bounded: exact per-rule totals plus a top-K of
//! throttled clients, see `sluice_core::report`) and, once a second, put the batch on the
//! shared queue `sluice.reports`. Envoy's shared queues are unbounded, so workers only
//! enqueue while a control service holds a fresh lease (`crate::election`: it renews it on
//! every tick and registers the queue when it takes the lease, so Envoy tells it of new
//! batches). Without one (no admin API configured, or the leader stopped and no successor
//! took over yet) batches only feed the workers' own per-rule Envoy counters.
//!
//! Envoy keys a queue by `vm_id` and name: registering it again keeps its token and its
//! waiting batches, and points its notifications at the latest registrant.

use proxy_wasm::hostcalls;
use sluice_core::report::RuleBatch;

use crate::channel::ChannelError;

/// The queue's name (resolved within the module's `vm_id`).
pub const QUEUE: &str = "sluice.reports";

/// Worker: hands a batch to the control service.
pub fn send(batch: &RuleBatch) -> Result<(), ChannelError> {
    let vm_id = hostcalls::get_property(vec!["plugin_vm_id"])
        .ok()
        .flatten()
        .and_then(|b| String::from_utf8(b).ok())
        .unwrap_or_default();
    let queue = hostcalls::resolve_shared_queue(&vm_id, QUEUE)
        .map_err(ChannelError::host("resolving the report queue"))?
        .ok_or(ChannelError::NoReportQueue)?;
    hostcalls::enqueue_shared_queue(queue, Some(&batch.encode()))
        .map_err(ChannelError::host("queueing a statistics batch"))
}
