//! The fleet view: what every worker knows about the fleet, and its bytes in shared data
//! (`sluice.global.view`).

use super::LEASE_TTL_INTERVALS;

/// What every worker knows about the fleet, published by the control service after each
/// sync attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FleetView {
    /// Proxies that synced recently, from the last answer; `0` before the first answer (a
    /// proxy that never heard from the coordinator enforces the whole limit alone).
    pub fleet_size: u32,
    /// Whether proxies must rely on their fallback shares: the last sync failed, or the
    /// coordinator is warming up.
    pub fallback: bool,
    pub sync_interval_ns: u64,
}

impl FleetView {
    /// A proxy that has not heard from a coordinator (or has none): every global limit is
    /// enforced by this proxy alone, like a proxy-scoped one.
    pub const ALONE: FleetView = FleetView {
        fleet_size: 0,
        fallback: true,
        sync_interval_ns: super::DEFAULT_SYNC_INTERVAL_NS,
    };

    /// One proxy's part of an even split of the fleet (all of it before the first answer).
    pub fn even_share(&self) -> f64 {
        1.0 / f64::from(self.fleet_size.max(1))
    }

    /// How long a lease lasts after the answer that refreshed it.
    pub fn lease_ttl_ns(&self) -> u64 {
        self.sync_interval_ns.saturating_mul(LEASE_TTL_INTERVALS)
    }

    /// The view's bytes in shared data: fleet size (`u32`), fallback (`u8`), sync interval
    /// (`u64`), little-endian.
    pub fn encode(&self) -> [u8; 13] {
        let mut out = [0u8; 13];
        let (size, rest) = out.split_at_mut(4);
        size.copy_from_slice(&self.fleet_size.to_le_bytes());
        let (fallback, interval) = rest.split_at_mut(1);
        fallback.fill(u8::from(self.fallback));
        interval.copy_from_slice(&self.sync_interval_ns.to_le_bytes());
        out
    }

    /// Reads a view's bytes; `None` for anything else.
    pub fn decode(bytes: &[u8]) -> Option<FleetView> {
        let bytes: &[u8; 13] = bytes.try_into().ok()?;
        let (size, rest) = bytes.split_at(4);
        let (fallback, interval) = rest.split_at(1);
        Some(FleetView {
            fleet_size: u32::from_le_bytes(size.try_into().ok()?),
            fallback: *fallback.first()? != 0,
            sync_interval_ns: u64::from_le_bytes(interval.try_into().ok()?).max(1),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::global::test_support::T;

    #[test]
    fn fleet_views_round_trip_through_their_bytes() {
        let view = FleetView {
            fleet_size: 3,
            fallback: true,
            sync_interval_ns: T,
        };
        assert_eq!(FleetView::decode(&view.encode()), Some(view));
        assert_eq!(FleetView::decode(&[1, 2]), None);
    }
}
