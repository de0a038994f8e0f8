//! Why a value could not be passed between the control service and the workers.
//!
//! The channels (`ruleset_channel`, `global_channel`, `report_channel`) are shared-data
//! keys and one shared queue. Each failure is one of a few kinds, so callers can count and
//! log them alike; the text is only made when a message is written.

use std::fmt;

use proxy_wasm::types::Status;
use sluice_core::wire::WireError;

/// A failed write or read of a channel between the control service and the workers.
#[derive(Debug)]
pub enum ChannelError {
    /// The host refused a shared-data or shared-queue call on `what`.
    Host { what: &'static str, status: Status },
    /// The report queue is not registered: no control service runs in this `vm_id`.
    NoReportQueue,
    /// The published ruleset document does not decode (a module of another version wrote
    /// it, or the bytes are damaged).
    Undecodable(WireError),
}

impl ChannelError {
    /// A host refusal on `what`, for `map_err`.
    pub fn host(what: &'static str) -> impl FnOnce(Status) -> ChannelError {
        move |status| ChannelError::Host { what, status }
    }
}

impl fmt::Display for ChannelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChannelError::Host { what, status } => write!(f, "{what}: host error {status:?}"),
            ChannelError::NoReportQueue => {
                f.write_str("the control service's report queue does not exist")
            }
            ChannelError::Undecodable(error) => {
                write!(f, "the published ruleset does not decode: {error}")
            }
        }
    }
}
