//! The bytes of one key of the in-flight table, as stored in proxy-wasm shared data.
//!
//! Layout, version 1 (all integers little-endian):
//!
//! ```text
//! [0]       format version (1)
//! [1..3]    hold count n (at most MAX_HOLDS)
//! [3..]     n × { client fingerprint: u64, holder: u64, expires at (ns since the epoch): u64 }
//! ```
//!
//! Each hold names its client, so clients whose fingerprints fall on one key share it
//! without mixing their counts. Bytes that do not decode are read as an empty key (every
//! request that key held is let go: errs toward admitting, counted by the caller).

/// The current encoding.
pub const IN_FLIGHT_FORMAT_VERSION: u8 = 1;
/// Most holds one key keeps, whichever clients they belong to: at least one client's
/// largest limit ([`crate::rule::MAX_CONCURRENT`]), with room for a few neighbours.
pub const MAX_HOLDS: usize = 1_024;
const HEADER_LEN: usize = 3;
const HOLD_LEN: usize = 24;

/// One request in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HoldEntry {
    /// Whose request it is: `hash::client_fingerprint(rule id, client key)`.
    pub fingerprint: u64,
    /// Which request: unique among the requests in flight (see `HolderIds`).
    pub holder: u64,
    /// When the hold lapses unless its worker refreshes it first (ns since the epoch).
    pub expires: u64,
}

/// The holds of one key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HoldsValue {
    pub holds: Vec<HoldEntry>,
}

/// Why bytes are not holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HoldsDecodeError {
    #[error("unknown in-flight format version {0}")]
    UnknownVersion(u8),
    #[error("in-flight bytes have the wrong length")]
    BadLength,
}

impl HoldsValue {
    /// How many holds of `fingerprint` there are.
    pub fn held_by(&self, fingerprint: u64) -> usize {
        self.holds
            .iter()
            .filter(|h| h.fingerprint == fingerprint)
            .count()
    }

    /// Drops the holds that lapsed at or before `now`, returning how many.
    pub fn drop_lapsed(&mut self, now: u64) -> usize {
        let before = self.holds.len();
        self.holds.retain(|h| h.expires > now);
        before - self.holds.len()
    }

    /// The place of `holder`'s hold of `fingerprint`, if it is still there.
    pub fn position(&self, fingerprint: u64, holder: u64) -> Option<usize> {
        self.holds
            .iter()
            .position(|h| h.fingerprint == fingerprint && h.holder == holder)
    }

    pub fn encode(&self) -> Vec<u8> {
        let n = self.holds.len().min(MAX_HOLDS);
        let mut out = Vec::with_capacity(HEADER_LEN + n * HOLD_LEN);
        out.push(IN_FLIGHT_FORMAT_VERSION);
        // `n` is at most MAX_HOLDS, which fits in a u16.
        out.extend_from_slice(&u16::try_from(n).unwrap_or(u16::MAX).to_le_bytes());
        for h in self.holds.iter().take(n) {
            out.extend_from_slice(&h.fingerprint.to_le_bytes());
            out.extend_from_slice(&h.holder.to_le_bytes());
            out.extend_from_slice(&h.expires.to_le_bytes());
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, HoldsDecodeError> {
        let (&version, rest) = bytes.split_first().ok_or(HoldsDecodeError::BadLength)?;
        if version != IN_FLIGHT_FORMAT_VERSION {
            return Err(HoldsDecodeError::UnknownVersion(version));
        }
        let (count, body) = rest
            .split_first_chunk::<2>()
            .ok_or(HoldsDecodeError::BadLength)?;
        let n = usize::from(u16::from_le_bytes(*count));
        if n > MAX_HOLDS || body.len() != n * HOLD_LEN {
            return Err(HoldsDecodeError::BadLength);
        }
        let word = |chunk: &[u8], at: usize| {
            chunk
                .get(at..at + 8)
                .and_then(|b| <[u8; 8]>::try_from(b).ok())
                .map_or(0, u64::from_le_bytes)
        };
        let holds = body
            .chunks_exact(HOLD_LEN)
            .map(|c| HoldEntry {
                fingerprint: word(c, 0),
                holder: word(c, 8),
                expires: word(c, 16),
            })
            .collect();
        Ok(Self { holds })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_encoding_is_pinned() {
        let value = HoldsValue {
            holds: vec![HoldEntry {
                fingerprint: 0x0102_0304_0506_0708,
                holder: 9,
                expires: 0x10,
            }],
        };
        let bytes = value.encode();
        assert_eq!(
            bytes,
            [
                1, 1, 0, // version, one hold
                8, 7, 6, 5, 4, 3, 2, 1, // fingerprint
                9, 0, 0, 0, 0, 0, 0, 0, // holder
                0x10, 0, 0, 0, 0, 0, 0, 0, // expires
            ]
        );
        assert_eq!(HoldsValue::decode(&bytes), Ok(value));
        assert_eq!(HoldsValue::decode(&[1, 0, 0]), Ok(HoldsValue::default()));
    }

    #[test]
    fn bytes_that_are_not_holds_are_refused() {
        assert_eq!(HoldsValue::decode(&[]), Err(HoldsDecodeError::BadLength));
        assert_eq!(
            HoldsValue::decode(&[2, 0, 0]),
            Err(HoldsDecodeError::UnknownVersion(2))
        );
        assert_eq!(
            HoldsValue::decode(&[1, 1, 0, 1, 2]),
            Err(HoldsDecodeError::BadLength)
        );
        // A count beyond the bound is refused even when the bytes are there.
        let mut long = vec![1];
        long.extend_from_slice(&u16::try_from(MAX_HOLDS + 1).unwrap().to_le_bytes());
        long.resize(HEADER_LEN + (MAX_HOLDS + 1) * HOLD_LEN, 0);
        assert_eq!(HoldsValue::decode(&long), Err(HoldsDecodeError::BadLength));
    }

    #[test]
    fn lapsed_holds_are_dropped_and_each_client_counted_apart() {
        let hold = |fingerprint, holder, expires| HoldEntry {
            fingerprint,
            holder,
            expires,
        };
        let mut value = HoldsValue {
            holds: vec![hold(1, 1, 10), hold(1, 2, 20), hold(2, 3, 30)],
        };
        assert_eq!(value.held_by(1), 2);
        assert_eq!(value.drop_lapsed(10), 1);
        assert_eq!(value.held_by(1), 1);
        assert_eq!(value.held_by(2), 1);
        assert_eq!(value.position(1, 2), Some(0));
        assert_eq!(value.position(1, 1), None);
    }
}
