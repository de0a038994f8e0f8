//! Where a client's bucket goes in the slot table.
//!
//! Shared-data keys can never be deleted, so buckets live in a fixed table of `slots`
//! numbered keys. A client's bucket goes in the first usable slot of a short probe
//! sequence starting at `fingerprint mod slots`:
//!
//! * a slot the client already **owns** is used as is;
//! * otherwise the first slot that is **vacant** (never used) or **idle** (all its
//!   buckets full at `now`, so it carries no information) is claimed;
//! * a vacant slot ends the search, since nothing was ever placed past it;
//! * when every probed slot is busy with other clients, the client **shares** the most
//!   drained one, keeping the owner's buckets beside its own. Sharing errs toward
//!   limiting (two clients of one rule then draw from one bucket) and is counted.

use std::num::NonZeroU32;

use crate::bucket::{LimiterCounters, LimiterFailure};
use crate::slot::SlotValue;
use crate::store::{Cas, MAX_WRITE_ATTEMPTS, SharedStore, WriteCondition, WriteOutcome};
use crate::time::Nanos;

/// Slots probed for one client before it shares a busy one.
pub const MAX_PROBES: u32 = 4;

/// The probe sequences of a table of `slots` slots.
#[derive(Debug, Clone, Copy)]
pub(super) struct ProbeSequence {
    slots: u32,
    probes: u32,
}

/// How a client holds the slot its bucket goes in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Placement {
    Owned,
    Claimed,
    Shared,
}

/// A slot as read, and how the client holds it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Located {
    pub(super) slot: u32,
    pub(super) cas: Option<Cas>,
    pub(super) value: SlotValue,
    pub(super) placement: Placement,
}

impl ProbeSequence {
    pub(super) fn new(slots: NonZeroU32) -> Self {
        Self {
            slots: slots.get(),
            probes: MAX_PROBES.min(slots.get()),
        }
    }

    pub(super) fn slots(&self) -> u32 {
        self.slots
    }

    /// Finds the slot for `fingerprint`: owned, else first vacant or idle, else shared.
    ///
    /// A client placed past its home slot (the first of its probe sequence) marks the
    /// home slot displaced first. So when the home slot is idle, not the client's, and
    /// not displaced, the client owns no slot further along and takes the home slot after
    /// one read: with many clients and idle buckets (the common case of a large table)
    /// that saves up to [`MAX_PROBES`]` - 1` shared-data reads per request.
    pub(super) fn locate(
        &self,
        store: &impl SharedStore,
        now: Nanos,
        fingerprint: u64,
        counters: &mut LimiterCounters,
    ) -> Result<Located, LimiterFailure> {
        for _ in 0..MAX_WRITE_ATTEMPTS {
            let (located, home) = self.search(store, now, fingerprint, counters)?;
            let Some(home) = home.filter(|h| !h.value.displaced && h.slot != located.slot) else {
                return Ok(located);
            };
            if located.placement != Placement::Claimed {
                return Ok(located);
            }
            // Claiming past an unmarked home slot: mark it first, so that no search for
            // this client stops there while it owns a slot further along.
            let mut marked = home.value;
            marked.displaced = true;
            let (buf, len) = marked.to_bytes();
            let condition = home
                .cas
                .map_or(WriteCondition::Absent, WriteCondition::Unchanged);
            match store.write(home.slot, buf.get(..len).unwrap_or_default(), condition) {
                Ok(WriteOutcome::Written) => return Ok(located),
                Ok(WriteOutcome::Conflict) => counters.cas_conflicts += 1,
                Err(e) => return Err(LimiterFailure::Store(e)),
            }
        }
        Err(LimiterFailure::Contention)
    }

    /// One pass over the probe sequence: where the client goes, and the home slot as read
    /// when the search went past it.
    fn search(
        &self,
        store: &impl SharedStore,
        now: Nanos,
        fingerprint: u64,
        counters: &mut LimiterCounters,
    ) -> Result<(Located, Option<Located>), LimiterFailure> {
        let start = (fingerprint % u64::from(self.slots)) as u32;
        let mut free: Option<Located> = None;
        let mut most_drained: Option<(u64, Located)> = None;
        let mut home: Option<Located> = None;
        for probe in 0..self.probes {
            let slot = ((u64::from(start) + u64::from(probe)) % u64::from(self.slots)) as u32;
            let Some((bytes, cas)) = store.read(slot).map_err(LimiterFailure::Store)? else {
                let vacant = Located {
                    slot,
                    cas: None,
                    value: SlotValue::default(),
                    placement: Placement::Claimed,
                };
                return Ok((free.unwrap_or(vacant), home));
            };
            let value = match SlotValue::decode(&bytes) {
                Ok(v) => v,
                Err(_) => {
                    // Not ours to trust: reuse it like an idle slot (unmarked, like
                    // anything that does not decode).
                    counters.corrupt_slots += 1;
                    free.get_or_insert(Located {
                        slot,
                        cas: Some(cas),
                        value: SlotValue::default(),
                        placement: Placement::Claimed,
                    });
                    continue;
                }
            };
            let located = Located {
                slot,
                cas: Some(cas),
                value,
                placement: Placement::Owned,
            };
            if value.owner == fingerprint {
                return Ok((located, home));
            }
            if value.owner == 0 {
                let claimed = Located {
                    placement: Placement::Claimed,
                    ..located
                };
                return Ok((free.unwrap_or(claimed), home));
            }
            if probe == 0 {
                home = Some(located);
            }
            if value.is_idle(now.get()) {
                let claimed = Located {
                    placement: Placement::Claimed,
                    ..located
                };
                if probe == 0 && !value.displaced {
                    // Nobody whose search starts here was placed further along: this
                    // client owns nothing past it.
                    return Ok((claimed, home));
                }
                free.get_or_insert(claimed);
            } else {
                let backlog = value.backlog(now.get());
                if most_drained.is_none_or(|(b, _)| backlog > b) {
                    most_drained = Some((
                        backlog,
                        Located {
                            placement: Placement::Shared,
                            ..located
                        },
                    ));
                }
            }
        }
        let located = match (free, most_drained) {
            (Some(f), _) => f,
            (None, Some((_, shared))) => shared,
            // Unreachable with at least one probe, but never panic.
            (None, None) => Located {
                slot: start,
                cas: None,
                value: SlotValue::default(),
                placement: Placement::Claimed,
            },
        };
        Ok((located, home))
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{T0, admitted, bucket, limit, table};
    use super::*;
    use crate::store::MemoryStore;
    use crate::time::NANOS_PER_SECOND;

    #[test]
    fn idle_slots_are_reclaimed_so_memory_is_bounded_by_the_table() {
        let (t, store) = (table(16), MemoryStore::new());
        let limits = [limit(1, 1, 1, 1)];
        for round in 0..100u64 {
            let now = T0 + round * NANOS_PER_SECOND;
            for client in 0..16u64 {
                let fp = round * 1_000 + client + 1;
                assert!(
                    t.acquire(&store, Nanos::new(now), &[bucket(fp, &limits)])
                        .allowed
                );
            }
        }
        assert_eq!(store.slots_used(), 16);
    }

    #[test]
    fn a_client_finds_its_own_slot_past_one_that_went_idle() {
        let (t, store) = (table(64), MemoryStore::new());
        let short = [limit(1, 1, 1, 1)];
        let long = [limit(2, 1, 3_600, 1)];
        // Both fingerprints start probing at slot 0; the first holds it briefly.
        assert!(
            t.acquire(&store, Nanos::new(T0), &[bucket(64, &short)])
                .allowed
        );
        assert!(
            t.acquire(&store, Nanos::new(T0), &[bucket(128, &long)])
                .allowed,
            "placed in slot 1"
        );
        let later = T0 + 2 * NANOS_PER_SECOND;
        assert!(
            !t.acquire(&store, Nanos::new(later), &[bucket(128, &long)])
                .allowed,
            "slot 0 is idle now, but the client's drained bucket is still in slot 1"
        );
    }

    #[test]
    fn when_every_probed_slot_is_busy_clients_share_and_err_toward_limiting() {
        let (t, store) = (table(16), MemoryStore::new());
        let limits = [limit(1, 1, 60, 2)];
        for fp in (0..MAX_PROBES as u64).map(|i| 16 * (i + 1) + i) {
            assert!(
                t.acquire(&store, Nanos::new(T0), &[bucket(fp, &limits)])
                    .allowed
            );
        }
        // A new client whose probe sequence covers only busy slots shares one.
        let outcome = t.acquire(&store, Nanos::new(T0), &[bucket(16 * 99, &limits)]);
        assert_eq!(outcome.counters.shared_slots, 1);
        assert!(outcome.allowed, "the shared bucket still had a token");
        assert!(
            !t.acquire(&store, Nanos::new(T0), &[bucket(16 * 99, &limits)])
                .allowed
        );
    }

    #[test]
    fn a_new_client_takes_an_idle_unmarked_home_slot_after_one_read() {
        let (t, store) = (table(16), MemoryStore::new());
        let limits = [limit(1, 1_000, 1, 1)];
        // Client 5 fills slot 5; a millisecond later its bucket is full again (idle).
        assert!(
            t.acquire(&store, Nanos::new(T0), &[bucket(5, &limits)])
                .allowed
        );
        let later = Nanos::new(T0 + NANOS_PER_SECOND);
        let before = store.reads();
        // Client 21 has the same home slot: one read, and it takes the slot over.
        assert!(t.acquire(&store, later, &[bucket(21, &limits)]).allowed);
        assert_eq!(store.reads() - before, 1, "no further probes");
        let (bytes, _) = store.read(5).unwrap().unwrap();
        assert_eq!(SlotValue::decode(&bytes).unwrap().owner, 21);
    }

    #[test]
    fn a_client_placed_past_its_home_is_found_after_the_home_goes_idle() {
        let (t, store) = (table(16), MemoryStore::new());
        let fast = [limit(1, 1_000, 1, 1)];
        let slow = [limit(2, 1, 3_600, 2)];
        // Client 5 keeps slot 5 busy for a millisecond; client 21 (same home) goes to
        // slot 6 and marks slot 5, then spends its whole burst.
        assert!(
            t.acquire(&store, Nanos::new(T0), &[bucket(5, &fast)])
                .allowed
        );
        assert_eq!(admitted(&t, &store, T0, &[bucket(21, &slow)], 5), 2);
        let (home, _) = store.read(5).unwrap().unwrap();
        let home = SlotValue::decode(&home).unwrap();
        assert!(home.displaced && home.owner == 5, "{home:?}");
        // A second later slot 5 is idle, but client 21 must still find its drained bucket
        // in slot 6 rather than start afresh in slot 5.
        let later = T0 + NANOS_PER_SECOND;
        assert_eq!(admitted(&t, &store, later, &[bucket(21, &slow)], 5), 0);
        // A client taking slot 5 over keeps the mark.
        assert!(
            t.acquire(&store, Nanos::new(later), &[bucket(37, &fast)])
                .allowed
        );
        let (home, _) = store.read(5).unwrap().unwrap();
        let home = SlotValue::decode(&home).unwrap();
        assert!(home.displaced && home.owner == 37, "{home:?}");
    }
}
