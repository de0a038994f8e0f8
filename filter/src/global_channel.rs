//! What workers and the control service tell each other about global buckets, through
//! shared data (the lease entries themselves are the lease table's keys,
//! `sluice.lease.<n>`, see [`crate::host_store`]):
//!
//! * `sluice.global.view`: the [`FleetView`] the control service published after its last
//!   sync attempt (fleet size, whether to use fallback shares, the sync interval). Workers
//!   read it on their tick; until it exists they enforce global limits alone.
//! * `sluice.global.slots`: the lease table's size, written by workers from their
//!   configuration, so the control service scans exactly the table they use.
//! * `sluice.global.new`: bumped by a worker that created a lease entry, so the control
//!   service syncs early instead of leaving a new bucket on its even share for an interval.

use proxy_wasm::hostcalls;
use sluice_core::global::lease::FleetView;
use sluice_core::time::Nanos;

use crate::channel::ChannelError;

const VIEW_KEY: &str = "sluice.global.view";
const SLOTS_KEY: &str = "sluice.global.slots";
const NEW_KEY: &str = "sluice.global.new";

/// Publishes the fleet view. Only the control service calls this.
pub fn publish_view(view: &FleetView) -> Result<(), ChannelError> {
    hostcalls::set_shared_data(VIEW_KEY, Some(&view.encode()), None)
        .map_err(ChannelError::host("publishing the fleet view"))
}

/// The published fleet view; [`FleetView::ALONE`] when there is none (no control service,
/// or it never synced).
pub fn view() -> Result<FleetView, ChannelError> {
    let (bytes, _) = hostcalls::get_shared_data(VIEW_KEY)
        .map_err(ChannelError::host("reading the fleet view"))?;
    Ok(bytes
        .and_then(|b| FleetView::decode(&b))
        .unwrap_or(FleetView::ALONE))
}

/// Records the lease table's size. Workers call this when configured.
pub fn publish_slots(slots: u32) -> Result<(), ChannelError> {
    hostcalls::set_shared_data(SLOTS_KEY, Some(&slots.to_le_bytes()), None)
        .map_err(ChannelError::host("publishing the lease table size"))
}

/// The lease table's size as the workers configured it; `None` before any worker did.
pub fn slots() -> Option<u32> {
    let (bytes, _) = hostcalls::get_shared_data(SLOTS_KEY).ok()?;
    bytes
        .and_then(|b| <[u8; 4]>::try_from(b.as_slice()).ok())
        .map(u32::from_le_bytes)
}

/// Notes that a worker created lease entries. Best effort: a lost note only delays the
/// first sync of a new bucket to the next regular one.
pub fn note_new_buckets(now: Nanos) {
    let _ = hostcalls::set_shared_data(NEW_KEY, Some(&now.get().to_le_bytes()), None);
}

/// The last note of new buckets (an opaque value that changes with each note).
pub fn new_buckets_mark() -> u64 {
    hostcalls::get_shared_data(NEW_KEY)
        .ok()
        .and_then(|(bytes, _)| bytes)
        .and_then(|b| <[u8; 8]>::try_from(b.as_slice()).ok())
        .map_or(0, u64::from_le_bytes)
}
