//! The core's [`SharedStore`] over proxy-wasm shared data.
//!
//! Slot `n` of the bucket table is the shared-data key `sluice.slot.<n>`; entry `n` of the
//! lease table (global buckets) is `sluice.lease.<n>`; key `n` of the in-flight table is
//! `sluice.inflight.<n>`. Keys can never be deleted, so the
//! tables' sizes (configuration values) bound how many keys Envoy ever holds.
//!
//! The first-write race: a key that was never set has no CAS, and CAS 0 means an
//! unconditional write, so two workers creating one key at once could lose an update.
//! Envoy's shared data accepts *any* CAS when it creates a key, but compares a non-zero
//! CAS when the key exists. A "create only if absent" write therefore passes
//! [`CREATE_CAS`]: it creates a missing key, and if another worker created the key first
//! it fails with a mismatch instead of overwriting. CAS values are handed out from a
//! counter starting at 1, so `u32::MAX` is only reached after four billion writes, and
//! even then only matters in a creation race on that very key.

use std::cell::RefCell;
use std::fmt::Write as _;

use proxy_wasm::hostcalls;
use proxy_wasm::types::Status;
use sluice_core::store::{Cas, SharedStore, StoreError, WriteCondition, WriteOutcome, WriteResult};

/// The CAS passed to create a key only if nobody else has.
pub const CREATE_CAS: u32 = u32::MAX;

/// Numbered shared-data keys under one prefix.
#[derive(Debug)]
pub struct HostStore {
    prefix: &'static str,
    /// Reused key buffer, so building a key does not allocate per request.
    key: RefCell<String>,
}

impl HostStore {
    /// The bucket table's slots.
    pub fn slots() -> Self {
        Self::with_prefix("sluice.slot.")
    }

    /// The lease table's entries.
    pub fn leases() -> Self {
        Self::with_prefix("sluice.lease.")
    }

    /// The in-flight table's keys (places of requests in flight).
    pub fn in_flight() -> Self {
        Self::with_prefix("sluice.inflight.")
    }

    fn with_prefix(prefix: &'static str) -> Self {
        Self {
            prefix,
            key: RefCell::new(String::with_capacity(prefix.len() + 10)),
        }
    }

    fn with_key<T>(&self, slot: u32, f: impl FnOnce(&str) -> T) -> T {
        let mut key = self.key.borrow_mut();
        key.clear();
        let _ = write!(key, "{}{slot}", self.prefix);
        f(&key)
    }
}

impl SharedStore for HostStore {
    fn read(&self, slot: u32) -> Result<Option<(Vec<u8>, Cas)>, StoreError> {
        match self.with_key(slot, hostcalls::get_shared_data) {
            Ok((_, None)) => Ok(None),
            Ok((bytes, Some(cas))) => Ok(Some((bytes.unwrap_or_default(), cas))),
            Err(status) => Err(StoreError {
                operation: "get",
                detail: format!("{status:?}"),
            }),
        }
    }

    fn write(&self, slot: u32, value: &[u8], condition: WriteCondition) -> WriteResult {
        let cas = match condition {
            WriteCondition::Unchanged(cas) => cas,
            WriteCondition::Absent => CREATE_CAS,
        };
        match self.with_key(slot, |key| {
            hostcalls::set_shared_data(key, Some(value), Some(cas))
        }) {
            Ok(()) => Ok(WriteOutcome::Written),
            Err(Status::CasMismatch) => Ok(WriteOutcome::Conflict),
            Err(status) => Err(StoreError {
                operation: "set",
                detail: format!("{status:?}"),
            }),
        }
    }
}
