//! Where slots live: proxy-wasm shared data in Envoy, a map in tests.
//!
//! The limiter only needs compare-and-swap on numbered slots. The filter implements
//! [`SharedStore`] over the host calls; [`MemoryStore`] implements the same semantics in
//! memory (including conflicts injected on demand) so the limiter's behaviour under
//! races is tested natively.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// A version stamp of a stored value; changes on every write.
pub type Cas = u32;

/// Compare-and-swap attempts per key before an update gives up as contention (the slot
/// table's buckets, the lease table's entries). Every conflict means another worker's
/// write succeeded, so running out takes this many lost races in a row: rare with Envoy's
/// handful of workers, and then the rule's failure mode decides.
pub const MAX_WRITE_ATTEMPTS: u32 = 32;

/// The condition under which a write happens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteCondition {
    /// Only if the value still carries this CAS.
    Unchanged(Cas),
    /// Only if the slot was never written.
    Absent,
}

/// Whether a conditional write happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteOutcome {
    Written,
    /// Someone else wrote first; read again.
    Conflict,
}

/// The host refused an operation for a reason other than a conflict.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("shared data {operation} failed: {detail}")]
pub struct StoreError {
    pub operation: &'static str,
    pub detail: String,
}

/// What a conditional write answers: written or not, or the host's failure.
pub type WriteResult = Result<WriteOutcome, StoreError>;

/// Compare-and-swap storage of slot values, shared by every worker.
pub trait SharedStore {
    /// The slot's bytes and CAS, or `None` when it was never written.
    fn read(&self, slot: u32) -> Result<Option<(Vec<u8>, Cas)>, StoreError>;
    /// Writes `value` if `condition` holds.
    fn write(&self, slot: u32, value: &[u8], condition: WriteCondition) -> WriteResult;
}

/// An in-memory [`SharedStore`] with the host's semantics. Thread-safe, so tests can run
/// several "workers" against one store.
#[derive(Debug, Default)]
pub struct MemoryStore {
    slots: Mutex<HashMap<u32, (Vec<u8>, Cas)>>,
    next_cas: AtomicU32,
    /// Writes still to be refused as if another worker had written first.
    injected_conflicts: AtomicU32,
    /// Reads still to fail with a host error.
    injected_failures: AtomicU32,
    /// Reads made so far: each is a host call in Envoy.
    reads: AtomicU64,
}

impl MemoryStore {
    pub fn new() -> Self {
        Self {
            next_cas: AtomicU32::new(1),
            ..Self::default()
        }
    }

    /// Makes the next `n` writes report a conflict (and bump the slot's CAS, as a
    /// competing writer would).
    pub fn inject_conflicts(&self, n: u32) {
        self.injected_conflicts.store(n, Ordering::SeqCst);
    }

    /// Makes the next `n` reads fail.
    pub fn inject_failures(&self, n: u32) {
        self.injected_failures.store(n, Ordering::SeqCst);
    }

    /// How many reads were made so far.
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::SeqCst)
    }

    /// How many slots were ever written: the memory the table really uses.
    pub fn slots_used(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u32, (Vec<u8>, Cas)>> {
        // A test thread that panicked while holding the lock has already failed its
        // test; the map itself is still consistent.
        self.slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn take_one(counter: &AtomicU32) -> bool {
        counter
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }
}

impl SharedStore for MemoryStore {
    fn read(&self, slot: u32) -> Result<Option<(Vec<u8>, Cas)>, StoreError> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        if Self::take_one(&self.injected_failures) {
            return Err(StoreError {
                operation: "get",
                detail: "injected failure".into(),
            });
        }
        Ok(self.lock().get(&slot).cloned())
    }

    fn write(&self, slot: u32, value: &[u8], condition: WriteCondition) -> WriteResult {
        let mut slots = self.lock();
        let cas = self.next_cas.fetch_add(1, Ordering::SeqCst);
        if Self::take_one(&self.injected_conflicts) {
            if let Some(entry) = slots.get_mut(&slot) {
                entry.1 = cas;
            }
            return Ok(WriteOutcome::Conflict);
        }
        let current = slots.get(&slot).map(|(_, c)| *c);
        let allowed = match (condition, current) {
            (WriteCondition::Absent, None) => true,
            (WriteCondition::Unchanged(expected), Some(actual)) => expected == actual,
            _ => false,
        };
        if !allowed {
            return Ok(WriteOutcome::Conflict);
        }
        slots.insert(slot, (value.to_vec(), cas));
        Ok(WriteOutcome::Written)
    }
}
