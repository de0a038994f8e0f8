//! The state the coordinator keeps per global bucket, and its bytes in Redis.

/// The state the coordinator keeps per global bucket (in memory, or in Redis as the bytes
/// of [`BucketState::encode`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct BucketState {
    /// GCRA theoretical arrival time, ns on the coordinator's clock. `0` is a full bucket.
    pub tat: u64,
    /// Tokens attempted fleet-wide, decayed with time constant `demand_tau_ns`.
    pub demand: f64,
    /// When `demand` was last decayed.
    pub demand_at: u64,
    /// When the bucket's recorded demand begins (its first usage's start): a young
    /// bucket's decayed sum has not yet reached its steady level, and the shares correct
    /// for that.
    pub born_at: u64,
    /// When the coordinator first settled the bucket.
    pub first_seen: u64,
}

/// The first byte of an encoded [`BucketState`]; bumped whenever the layout changes, so a
/// coordinator never misreads another layout (it treats the bucket as full and quiet).
pub const STATE_FORMAT: u8 = 1;

/// Bytes of an encoded [`BucketState`]: the format byte and five little-endian words
/// (`tat`, the bits of `demand`, `demand_at`, `born_at`, `first_seen`).
pub const STATE_LEN: usize = 1 + 5 * 8;

impl BucketState {
    /// The state's bytes as the Redis coordinator stores them: a third of its JSON, and no
    /// text to parse for each of a batch's thousands of buckets.
    pub fn encode(&self) -> [u8; STATE_LEN] {
        let mut out = [0u8; STATE_LEN];
        let words = [
            self.tat,
            self.demand.to_bits(),
            self.demand_at,
            self.born_at,
            self.first_seen,
        ];
        let (format, body) = out.split_at_mut(1);
        format.fill(STATE_FORMAT);
        super::put_words(body, &words);
        out
    }

    /// Reads a state's bytes; `None` for any other length or format, or a demand that is
    /// not a finite, non-negative number.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let (&format, body) = bytes.split_first()?;
        if format != STATE_FORMAT || bytes.len() != STATE_LEN {
            return None;
        }
        let mut words = super::words(body);
        let mut next = || words.next();
        let state = Self {
            tat: next()?,
            demand: f64::from_bits(next()?),
            demand_at: next()?,
            born_at: next()?,
            first_seen: next()?,
        };
        (state.demand.is_finite() && state.demand >= 0.0).then_some(state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_states_bytes_are_pinned_and_round_trip() {
        let state = BucketState {
            tat: 0x0102_0304_0506_0708,
            demand: 1.5,
            demand_at: 9,
            born_at: 10,
            first_seen: 11,
        };
        let bytes = state.encode();
        let mut expected = vec![STATE_FORMAT, 8, 7, 6, 5, 4, 3, 2, 1];
        expected.extend(1.5f64.to_bits().to_le_bytes());
        for word in [9u64, 10, 11] {
            expected.extend(word.to_le_bytes());
        }
        assert_eq!(bytes.as_slice(), expected.as_slice());
        assert_eq!(BucketState::decode(&bytes), Some(state));

        assert_eq!(BucketState::decode(&bytes[..STATE_LEN - 1]), None, "short");
        assert_eq!(BucketState::decode(&[]), None);
        let mut other_format = bytes;
        other_format[0] = STATE_FORMAT + 1;
        assert_eq!(BucketState::decode(&other_format), None);
        let nan = BucketState {
            demand: f64::NAN,
            ..state
        };
        assert_eq!(BucketState::decode(&nan.encode()), None);
        assert_eq!(
            BucketState::decode(br#"{"tat":0,"demand":0.0,"demand_at":0}"#),
            None,
            "the JSON an older coordinator wrote"
        );
    }
}
