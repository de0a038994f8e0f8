//! In-flight limits: how many of one client's requests are in flight in this Envoy, all
//! workers together.
//!
//! Each request admitted under an in-flight limit takes a *hold*: an entry in one key of
//! the in-flight table (`sluice.inflight.N` in shared data, `N = fingerprint mod slots`),
//! written with compare-and-swap. A request is admitted only while its client has fewer
//! than the limit's holds there; the hold is let go when the stream ends, however it
//! ends (the filter's `on_log`/`on_done`).
//!
//! A hold carries an expiry, [`HOLD_TTL`] ahead, which the worker holding it pushes
//! forward every [`REFRESH_EVERY`] while the request lives ([`LiveHolds`]). So a hold
//! whose worker can no longer let it go (its VM failed and was reloaded) lapses within
//! `HOLD_TTL`, and nothing else can keep a place taken: every write drops lapsed holds.
//! An Envoy restart starts with empty shared data.
//!
//! One key per client, never probing: all of a client's holds are in one value, so one
//! compare-and-swap sees and changes the client's whole count, and no race between
//! workers can split it. Clients whose fingerprints fall on one key share its value
//! (each hold names its client, so their counts stay apart) up to [`MAX_HOLDS`] holds; a
//! key that full fails the request by the rule's failure mode, counted.

pub mod live;
mod value;

use std::num::NonZeroU32;

pub use live::{HolderIds, LiveHolds};
pub use value::{HoldEntry, HoldsDecodeError, HoldsValue, IN_FLIGHT_FORMAT_VERSION, MAX_HOLDS};

use crate::store::{
    Cas, MAX_WRITE_ATTEMPTS, SharedStore, StoreError, WriteCondition, WriteOutcome,
};
use crate::time::Nanos;

/// Keys of the in-flight table: the bound on the shared-data keys in-flight limits use
/// (each at most [`MAX_HOLDS`] × 24 bytes, and only while requests are in flight).
pub const IN_FLIGHT_SLOTS: u32 = 16_384;
/// How long a hold lasts unless its worker refreshes it: the longest a hold nobody can
/// let go (its worker's VM failed) keeps its place.
pub const HOLD_TTL: Nanos = Nanos::from_secs(30);
/// How often a worker pushes its live holds' expiries forward. Three refreshes fit in
/// one [`HOLD_TTL`], so a request outlives its hold only when its worker misses all three.
pub const REFRESH_EVERY: Nanos = Nanos::from_secs(10);

/// One request's place under one client's in-flight limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hold {
    pub slot: u32,
    pub fingerprint: u64,
    pub holder: u64,
}

/// What asking for a place answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Admitted: the request holds this place until it is let go.
    Held(Hold),
    /// The client already has `max` requests in flight.
    Full,
}

/// Why the in-flight table could not be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InFlightFailure {
    /// The client's key holds [`MAX_HOLDS`] holds of this and other clients.
    KeyFull,
    /// Every compare-and-swap attempt lost to another worker.
    Contention,
    /// The host refused a read or write.
    Store(StoreError),
}

/// What a write to the table also found, for the metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InFlightCounters {
    /// Holds dropped because they lapsed: requests whose worker neither let them go nor
    /// refreshed them (zero while every worker lives).
    pub lapsed: u32,
    /// Keys whose bytes did not decode, read as empty.
    pub corrupt: u32,
    pub cas_conflicts: u32,
}

impl InFlightCounters {
    pub fn add(&mut self, other: InFlightCounters) {
        self.lapsed += other.lapsed;
        self.corrupt += other.corrupt;
        self.cas_conflicts += other.cas_conflicts;
    }
}

/// The in-flight table: [`IN_FLIGHT_SLOTS`] keys of holds.
#[derive(Debug, Clone, Copy)]
pub struct InFlightTable {
    slots: NonZeroU32,
}

impl Default for InFlightTable {
    fn default() -> Self {
        Self::new(NonZeroU32::new(IN_FLIGHT_SLOTS).unwrap_or(NonZeroU32::MIN))
    }
}

impl InFlightTable {
    pub fn new(slots: NonZeroU32) -> Self {
        Self { slots }
    }

    /// The key `fingerprint`'s holds live in.
    pub fn slot_of(&self, fingerprint: u64) -> u32 {
        // The remainder is below `slots`, a u32.
        u32::try_from(fingerprint % u64::from(self.slots.get())).unwrap_or(0)
    }

    /// Takes a place for request `holder` of client `fingerprint`, if the client has
    /// fewer than `max` in flight.
    pub fn acquire(
        &self,
        store: &(impl SharedStore + ?Sized),
        fingerprint: u64,
        max: NonZeroU32,
        holder: u64,
        now: Nanos,
        counters: &mut InFlightCounters,
    ) -> Result<Admission, InFlightFailure> {
        let slot = self.slot_of(fingerprint);
        let hold = Hold {
            slot,
            fingerprint,
            holder,
        };
        let expires = now.saturating_add(HOLD_TTL).get();
        update(store, slot, now, counters, |value| {
            let held = value.held_by(fingerprint);
            if held >= max.get() as usize {
                return Ok(None);
            }
            if value.holds.len() >= MAX_HOLDS {
                return Err(InFlightFailure::KeyFull);
            }
            value.holds.push(HoldEntry {
                fingerprint,
                holder,
                expires,
            });
            Ok(Some(()))
        })
        .map(|taken| match taken {
            Some(()) => Admission::Held(hold),
            None => Admission::Full,
        })
    }

    /// Lets `hold` go. `Ok(false)`: it was no longer there (it lapsed).
    pub fn release(
        &self,
        store: &(impl SharedStore + ?Sized),
        hold: &Hold,
        now: Nanos,
        counters: &mut InFlightCounters,
    ) -> Result<bool, InFlightFailure> {
        update(store, hold.slot, now, counters, |value| {
            Ok(value
                .position(hold.fingerprint, hold.holder)
                .map(|at| value.holds.swap_remove(at)))
        })
        .map(|removed| removed.is_some())
    }

    /// Pushes `hold`'s expiry to `now + HOLD_TTL`. `Ok(false)`: it was no longer there.
    pub fn refresh(
        &self,
        store: &(impl SharedStore + ?Sized),
        hold: &Hold,
        now: Nanos,
        counters: &mut InFlightCounters,
    ) -> Result<bool, InFlightFailure> {
        let expires = now.saturating_add(HOLD_TTL).get();
        update(store, hold.slot, now, counters, |value| {
            let at = value.position(hold.fingerprint, hold.holder);
            if let Some(entry) = at.and_then(|at| value.holds.get_mut(at)) {
                entry.expires = expires;
            }
            Ok(at)
        })
        .map(|found| found.is_some())
    }

    /// How many requests of `fingerprint` are in flight at `now` (lapsed holds aside).
    pub fn in_flight(
        &self,
        store: &(impl SharedStore + ?Sized),
        fingerprint: u64,
        now: Nanos,
    ) -> Result<usize, StoreError> {
        let (mut value, _, _) = read(store, self.slot_of(fingerprint))?;
        value.drop_lapsed(now.get());
        Ok(value.held_by(fingerprint))
    }
}

/// Reads `slot`: its holds (empty when never written or undecodable), its CAS, and
/// whether its bytes were corrupt.
fn read(
    store: &(impl SharedStore + ?Sized),
    slot: u32,
) -> Result<(HoldsValue, Option<Cas>, bool), StoreError> {
    Ok(match store.read(slot)? {
        None => (HoldsValue::default(), None, false),
        Some((bytes, cas)) => match HoldsValue::decode(&bytes) {
            Ok(value) => (value, Some(cas), false),
            Err(_) => (HoldsValue::default(), Some(cas), true),
        },
    })
}

/// Reads `slot`, drops its lapsed holds, lets `change` decide, and writes the result by
/// compare-and-swap, again from a fresh read after a conflict. `change` answering
/// `Ok(None)` writes nothing (unless lapsed holds were dropped) and answers `None`.
fn update<T>(
    store: &(impl SharedStore + ?Sized),
    slot: u32,
    now: Nanos,
    counters: &mut InFlightCounters,
    mut change: impl FnMut(&mut HoldsValue) -> Result<Option<T>, InFlightFailure>,
) -> Result<Option<T>, InFlightFailure> {
    for _ in 0..MAX_WRITE_ATTEMPTS {
        let (mut value, cas, corrupt) = read(store, slot).map_err(InFlightFailure::Store)?;
        let lapsed = value.drop_lapsed(now.get());
        let answer = change(&mut value)?;
        if answer.is_none() && lapsed == 0 && !corrupt {
            return Ok(None);
        }
        let condition = cas.map_or(WriteCondition::Absent, WriteCondition::Unchanged);
        match store
            .write(slot, &value.encode(), condition)
            .map_err(InFlightFailure::Store)?
        {
            WriteOutcome::Written => {
                counters.lapsed += u32::try_from(lapsed).unwrap_or(u32::MAX);
                counters.corrupt += u32::from(corrupt);
                return Ok(answer);
            }
            WriteOutcome::Conflict => counters.cas_conflicts += 1,
        }
    }
    Err(InFlightFailure::Contention)
}

#[cfg(test)]
mod tests;
