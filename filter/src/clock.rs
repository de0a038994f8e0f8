//! The host's wall clock, read in one place.
//!
//! The core never reads a clock: every `now` is an argument. This is where the filter
//! reads the one it passes in, for the request path, the workers' ticks and the control
//! service alike.

use proxy_wasm::hostcalls;
use sluice_core::time::Nanos;

/// The host's wall clock since the Unix epoch, or `None` when the host cannot give it (a
/// host error, a time before 1970, or one past the year 2554). Never panics; what a
/// missing clock means is the caller's choice: the request path fails open, timers take
/// the epoch and simply fire.
pub fn now() -> Option<Nanos> {
    hostcalls::get_current_time()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .and_then(|d| u64::try_from(d.as_nanos()).ok())
        .map(Nanos::new)
}
