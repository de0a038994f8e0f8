//! What one worker knows of its own requests in flight: which holds each request took,
//! so they are let go exactly once when it ends and refreshed while it lives.

use std::collections::HashMap;

use smallvec::SmallVec;

use super::{Hold, REFRESH_EVERY};
use crate::time::Nanos;

/// The holds of one request (one per matching rule with an in-flight limit).
pub type RequestHolds = SmallVec<[Hold; 2]>;

/// A worker's requests that hold places, by the request's context id (unique within
/// the worker while the request lives).
#[derive(Debug, Default)]
pub struct LiveHolds {
    by_request: HashMap<u32, RequestHolds>,
    last_refresh: Option<Nanos>,
}

impl LiveHolds {
    /// Notes that request `context` holds `holds` (nothing when empty).
    pub fn insert(&mut self, context: u32, holds: RequestHolds) {
        if !holds.is_empty() {
            self.by_request.insert(context, holds);
        }
    }

    /// The holds of request `context`, forgotten here: the caller lets them go. A second
    /// call for the same request finds nothing, so a request lets go at most once.
    pub fn take(&mut self, context: u32) -> RequestHolds {
        self.by_request.remove(&context).unwrap_or_default()
    }

    /// How many requests hold places.
    pub fn requests(&self) -> usize {
        self.by_request.len()
    }

    /// Every live hold, when [`REFRESH_EVERY`] has passed since the last refresh (the
    /// first call only starts the clock); nothing otherwise.
    pub fn due_for_refresh(&mut self, now: Nanos) -> Vec<Hold> {
        let Some(last) = self.last_refresh else {
            self.last_refresh = Some(now);
            return Vec::new();
        };
        if now.saturating_sub(last) < REFRESH_EVERY {
            return Vec::new();
        }
        self.last_refresh = Some(now);
        self.by_request.values().flatten().copied().collect()
    }
}

/// Hands out holder ids: distinct within a worker (a counter), and across workers with
/// overwhelming probability (each worker's counter is mixed with its own seed: the host
/// clock and root context id when it started). Two holds sharing an id would only matter
/// on the same key for the same client, where letting go of either frees one place, as
/// it should.
#[derive(Debug, Clone)]
pub struct HolderIds {
    seed: u64,
    next: u64,
}

impl HolderIds {
    pub fn new(seed: u64) -> Self {
        Self { seed, next: 0 }
    }

    pub fn next_id(&mut self) -> u64 {
        self.next = self.next.wrapping_add(1);
        xxhash_rust::xxh3::xxh3_64_with_seed(&self.next.to_le_bytes(), self.seed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hold(holder: u64) -> Hold {
        Hold {
            slot: 1,
            fingerprint: 7,
            holder,
        }
    }

    #[test]
    fn a_request_lets_go_once() {
        let mut live = LiveHolds::default();
        live.insert(3, [hold(1), hold(2)].into_iter().collect());
        live.insert(4, RequestHolds::new());
        assert_eq!(live.requests(), 1);
        assert_eq!(live.take(3).len(), 2);
        assert!(live.take(3).is_empty());
        assert_eq!(live.requests(), 0);
    }

    #[test]
    fn refreshes_come_every_interval_and_not_between() {
        let mut live = LiveHolds::default();
        live.insert(3, [hold(1)].into_iter().collect());
        let t0 = Nanos::from_secs(100);
        assert!(live.due_for_refresh(t0).is_empty());
        let just_before = t0
            .saturating_add(REFRESH_EVERY)
            .saturating_sub(Nanos::new(1));
        assert!(live.due_for_refresh(just_before).is_empty());
        let due = t0.saturating_add(REFRESH_EVERY);
        assert_eq!(live.due_for_refresh(due), [hold(1)]);
        assert!(live.due_for_refresh(due).is_empty());
    }

    #[test]
    fn holder_ids_differ_within_and_across_workers() {
        let mut a = HolderIds::new(1);
        let mut b = HolderIds::new(2);
        let ids: std::collections::HashSet<u64> = (0..1_000)
            .flat_map(|_| [a.next_id(), b.next_id()])
            .collect();
        assert_eq!(ids.len(), 2_000);
    }
}
