//! Decision statistics from the workers to the control service.
//!
//! Workers aggregate decisions in memory (bounded: exact per-rule totals plus a top-K of
//! throttled clients, see `sluice_core::report`) and, once a second, put the batch on the
//! shared queue `sluice.reports`. Envoy's shared queues are unbounded, so workers only
//! enqueue while the control service proves it is draining: it writes the current time
//! to `sluice.control.heartbeat` on every tick. Without a fresh heartbeat (no admin API
//! configured, or the control VM failed) batches only feed the workers' own per-rule
//! Envoy counters.

use proxy_wasm::hostcalls;
use sluice_core::report::RuleBatch;

use crate::channel::ChannelError;

/// The queue's name (resolved within the module's `vm_id`).
pub const QUEUE: &str = "sluice.reports";
const HEARTBEAT_KEY: &str = "sluice.control.heartbeat";
/// A heartbeat older than this means nobody drains the queue.
const HEARTBEAT_FRESH_MS: u64 = 5_000;

/// Control service: "I am draining the queue", at `now_ms`.
pub fn beat(now_ms: u64) {
    let _ = hostcalls::set_shared_data(HEARTBEAT_KEY, Some(&now_ms.to_le_bytes()), None);
}

/// Worker: whether the control service drained the queue recently.
pub fn control_alive(now_ms: u64) -> bool {
    let Ok((Some(bytes), _)) = hostcalls::get_shared_data(HEARTBEAT_KEY) else {
        return false;
    };
    <[u8; 8]>::try_from(bytes.as_slice())
        .map(u64::from_le_bytes)
        .is_ok_and(|beat| now_ms.saturating_sub(beat) <= HEARTBEAT_FRESH_MS)
}

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
