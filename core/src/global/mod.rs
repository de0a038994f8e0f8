//! Fleet-wide ("global") buckets: one limit across every Envoy that follows one admin API,
//! with every request still decided locally.
//!
//! The shape is *pre-debited leases with a demand-weighted fallback*
//! (`docs/global-limits.md` has the whole design and its bounds):
//!
//! * [`coordinator`]: the coordinator's arithmetic for one bucket (a GCRA plus a decayed
//!   demand sum). A grant is taken from the bucket the moment it is made, so every token is
//!   spent once fleet-wide, however many proxies hold leases.
//! * [`lease`]: a proxy's view of one global bucket (lease balance and expiry, the
//!   new-bucket allowance, the fallback share and its local GCRA, and the deltas still to
//!   report), and the arithmetic of spending from it.
//! * [`schedule`]: when a proxy syncs (every interval, sooner for new buckets).
//! * [`table`]: the lease entries in shared data (placement, compare-and-swap).
//! * [`sync`]: the one batched request a proxy sends per sync interval, and its answer.
//!
//! Like the rest of the core, nothing here performs I/O or reads a clock; `now` is always
//! an argument in nanoseconds. Proxies and coordinator never compare clocks: every
//! duration crosses the wire as a length of time, never as an instant.

pub mod coordinator;
pub mod lease;
pub mod schedule;
#[cfg(test)]
mod sparse_client_tests;
mod state;
pub mod sync;
pub mod table;
mod token_debt;
pub mod view;

use crate::time::NANOS_PER_SECOND;

/// How often each proxy's control service syncs its global buckets, by default.
///
/// The refill a proxy is owed waits at the coordinator until its next sync, so a fleet
/// under load runs about half an interval behind `burst + rate × elapsed` (the bound in
/// `docs/global-limits.md`). At 500 ms the fleet simulation, with the control service's
/// tick, admitted 0.969 of the bound at 5,000/s over 20 s; at 250 ms, 0.990. The cost is
/// one more small request per proxy per half second, whatever the request rate.
pub const DEFAULT_SYNC_INTERVAL_NS: u64 = NANOS_PER_SECOND / 4;

/// How long a lease stays spendable after the answer that refreshed it, in sync intervals:
/// one missed sync does not expire it, two do.
pub const LEASE_TTL_INTERVALS: u64 = 3;

/// How far ahead a proxy asks for tokens, in sync intervals: enough to last until the next
/// answer arrives even when that sync is late by half an interval.
pub const WANT_HORIZON_INTERVALS: f64 = 1.5;

/// A proxy's share of a bucket never counts as less than this fraction of an even split:
/// its fallback share, so a proxy whose traffic for a bucket was zero still admits a
/// little during an outage (it bounds the fleet's fallback admission at `(1 +
/// MIN_SHARE_OF_EVEN) × rate`), and, below the limit, its part of the refill a grant may
/// take.
pub const MIN_SHARE_OF_EVEN: f64 = 0.1;

/// The coordinator's demand memory, in sync intervals: long enough to smooth one proxy's
/// jitter, short enough to follow a shift of traffic within a couple of seconds.
pub const DEMAND_TAU_INTERVALS: f64 = 4.0;

/// Proxies count toward the fleet while their last sync is younger than this many
/// intervals (6 s at the default). Too short a memory is the dangerous side: a proxy whose
/// syncs stall for a moment (a busy main thread), or that syncs only every
/// [`schedule::IDLE_SYNC_INTERVALS`] because its ruleset has no global limit, would drop
/// out of the count, every other proxy would be told the fleet is smaller, and a new
/// bucket's even shares would add up to more than its burst. Too long only makes new
/// buckets' even shares (their first 100 ms or so, until leases follow demand) and the
/// floor of fallback shares smaller for a while after a proxy leaves. (Three intervals were
/// enough at 500 ms; at 250 ms they are 750 ms, within reach of a stall under load; eight
/// were kept until idle proxies synced every sixteen.)
pub const FLEET_MEMORY_INTERVALS: u64 = 24;

/// Writes `words` little-endian into `body`, eight bytes each: the fixed layouts of what
/// this module keeps in shared data and in Redis.
fn put_words(body: &mut [u8], words: &[u64]) {
    for (chunk, word) in body.chunks_exact_mut(8).zip(words) {
        chunk.copy_from_slice(&word.to_le_bytes());
    }
}

/// The little-endian words of `body`, in order ([`put_words`]'s inverse); callers check
/// lengths first, and a short body simply ends the words early.
fn words(body: &[u8]) -> impl Iterator<Item = u64> + '_ {
    body.chunks_exact(8)
        .map_while(|c| c.try_into().ok().map(u64::from_le_bytes))
}

/// What the global module's unit tests share.
#[cfg(test)]
mod test_support {
    use super::coordinator::Grant;
    use super::lease::FleetView;
    use crate::gcra::Gcra;
    use crate::time::NANOS_PER_SECOND;

    /// The sync interval of every test.
    pub const T: u64 = NANOS_PER_SECOND / 2;

    pub fn limit(per_second: u64, burst: u64) -> Gcra {
        Gcra::per_second(per_second, burst).unwrap()
    }

    /// A coordinator's answer for a bucket that is not young.
    pub fn grant(granted: u64, share_ppm: u32, full_in_ns: u64) -> Grant {
        Grant {
            granted,
            share_ppm,
            full_in_ns,
            young: false,
        }
    }

    /// A fleet of `fleet_size` proxies whose coordinator answers.
    pub fn leasing(fleet_size: u32) -> FleetView {
        FleetView {
            fleet_size,
            fallback: false,
            sync_interval_ns: T,
        }
    }
}
