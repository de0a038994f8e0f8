//! Nanoseconds, typed.
//!
//! Every time in the core is a whole number of nanoseconds: instants on the host's wall
//! clock (since the Unix epoch), the theoretical arrival times that are a bucket's state,
//! and lengths of time (intervals, periods, timeouts). [`Nanos`] carries such a number
//! through the public API, so a millisecond or a second cannot be passed where
//! nanoseconds are meant: a value comes in through [`Nanos::new`], [`Nanos::from_millis`]
//! or [`Nanos::from_secs`] and goes out through [`Nanos::get`] or [`Nanos::as_millis`].
//! What is stored in shared data or sent on the wire stays a bare `u64`, byte for byte.

/// Nanoseconds in one second.
pub const NANOS_PER_SECOND: u64 = 1_000_000_000;

/// Nanoseconds in one millisecond.
pub const NANOS_PER_MILLI: u64 = 1_000_000;

/// A number of nanoseconds: an instant since the Unix epoch or a length of time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Nanos(u64);

impl Nanos {
    pub const ZERO: Nanos = Nanos(0);
    pub const MAX: Nanos = Nanos(u64::MAX);

    pub const fn new(nanos: u64) -> Self {
        Nanos(nanos)
    }

    /// `millis` milliseconds, saturating at [`Nanos::MAX`].
    pub const fn from_millis(millis: u64) -> Self {
        Nanos(millis.saturating_mul(NANOS_PER_MILLI))
    }

    /// `secs` seconds, saturating at [`Nanos::MAX`].
    pub const fn from_secs(secs: u64) -> Self {
        Nanos(secs.saturating_mul(NANOS_PER_SECOND))
    }

    /// The number of nanoseconds.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// Whole milliseconds, rounded down.
    pub const fn as_millis(self) -> u64 {
        self.0 / NANOS_PER_MILLI
    }

    pub const fn saturating_add(self, other: Nanos) -> Nanos {
        Nanos(self.0.saturating_add(other.0))
    }

    pub const fn saturating_sub(self, other: Nanos) -> Nanos {
        Nanos(self.0.saturating_sub(other.0))
    }
}

impl From<Nanos> for std::time::Duration {
    fn from(nanos: Nanos) -> Self {
        std::time::Duration::from_nanos(nanos.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_convert_and_saturate() {
        assert_eq!(Nanos::from_secs(2).get(), 2 * NANOS_PER_SECOND);
        assert_eq!(Nanos::from_millis(3).get(), 3_000_000);
        assert_eq!(Nanos::new(7_999_999).as_millis(), 7);
        assert_eq!(Nanos::from_secs(u64::MAX), Nanos::MAX);
        assert_eq!(Nanos::MAX.saturating_add(Nanos::new(1)), Nanos::MAX);
        assert_eq!(Nanos::ZERO.saturating_sub(Nanos::new(1)), Nanos::ZERO);
        assert_eq!(
            std::time::Duration::from(Nanos::from_millis(250)),
            std::time::Duration::from_millis(250)
        );
    }
}
