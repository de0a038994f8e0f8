//! The bytes of one slot of the bucket table, as stored in proxy-wasm shared data.
//!
//! Layout, version 1 (all integers little-endian):
//!
//! ```text
//! [0]       format version (1)
//! [1..9]    owner: the client fingerprint that holds the slot (0 = never used)
//! [9]       entry count n (at most MAX_ENTRIES) in bits 0–6; bit 7 set when a client
//!           whose probe sequence starts at this slot was placed further along
//!           ("displaced", see the limiter)
//! [10..]    n × { limit identity: u64, theoretical arrival time in ns: u64 }
//! ```
//!
//! The displaced bit was added within version 1: a slot without it is byte for byte what
//! earlier modules wrote, and one with it reads to an earlier module as a slot of the
//! wrong length, which it reuses like an idle one (never trusts).
//!
//! Every worker VM and every reloaded VM read these bytes, and a module upgrade may meet
//! bytes an older module wrote, so the version byte comes first and the tests pin the
//! exact encoding. Bytes that do not decode are treated as an empty slot, never trusted.

/// The current encoding.
pub const SLOT_FORMAT_VERSION: u8 = 1;
/// Most buckets one slot holds. One client of one rule needs one entry per limit; more
/// only when clients share a slot because every probed slot was busy.
pub const MAX_ENTRIES: usize = 8;
const HEADER_LEN: usize = 10;
/// The bit of the count byte that marks a displaced slot.
const DISPLACED_BIT: u8 = 0x80;
const ENTRY_LEN: usize = 16;
/// The longest encoding, for sizing buffers.
pub const MAX_ENCODED_LEN: usize = HEADER_LEN + MAX_ENTRIES * ENTRY_LEN;

/// One bucket inside a slot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Entry {
    pub identity: u64,
    pub tat: u64,
}

/// A decoded slot. Fixed capacity, so reading and updating it never allocates.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SlotValue {
    /// The fingerprint of the client that holds the slot; 0 when never used.
    pub owner: u64,
    entries: [Entry; MAX_ENTRIES],
    len: u8,
    /// Whether a client whose probe sequence starts here was ever placed further along.
    /// While it is clear, a client that does not own this slot owns no other slot either,
    /// so its search can stop here. Never cleared: it only makes searches longer.
    pub displaced: bool,
}

/// Why bytes are not a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("unknown slot format version {0}")]
    UnknownVersion(u8),
    #[error("slot bytes have the wrong length")]
    BadLength,
}

impl SlotValue {
    /// An empty slot held by `owner`.
    pub fn owned_by(owner: u64) -> Self {
        Self {
            owner,
            ..Self::default()
        }
    }

    pub fn entries(&self) -> &[Entry] {
        self.entries.get(..self.len as usize).unwrap_or(&[])
    }

    fn entries_mut(&mut self) -> &mut [Entry] {
        self.entries.get_mut(..self.len as usize).unwrap_or(&mut [])
    }

    /// The stored TAT of the bucket `identity`, if this slot holds it.
    pub fn tat_of(&self, identity: u64) -> Option<u64> {
        self.entries()
            .iter()
            .find(|e| e.identity == identity)
            .map(|e| e.tat)
    }

    /// Whether every bucket here is full at `now`: such a slot carries no information
    /// and another client may take it over without anyone losing state.
    pub fn is_idle(&self, now: u64) -> bool {
        self.entries().iter().all(|e| e.tat <= now)
    }

    /// The longest backlog of any bucket here: how drained the slot is.
    pub fn backlog(&self, now: u64) -> u64 {
        self.entries()
            .iter()
            .map(|e| e.tat.saturating_sub(now))
            .max()
            .unwrap_or(0)
    }

    /// Stores `tat` for `identity`. Full buckets (`tat <= now`) are dropped first to make
    /// room; if the slot is still full, the entry nearest to full is evicted. Returns
    /// whether an entry that still held state had to be evicted.
    pub fn set(&mut self, identity: u64, tat: u64, now: u64) -> bool {
        if let Some(e) = self
            .entries_mut()
            .iter_mut()
            .find(|e| e.identity == identity)
        {
            e.tat = tat;
            return false;
        }
        if self.len as usize == MAX_ENTRIES {
            self.drop_full(now);
        }
        if let Some(free) = self.entries.get_mut(self.len as usize) {
            *free = Entry { identity, tat };
            self.len += 1;
            return false;
        }
        // Every entry still holds state: evict the one closest to full, which loses the
        // least (its client may get up to that much extra, and the event is counted).
        if let Some(victim) = self.entries.iter_mut().min_by_key(|e| e.tat) {
            *victim = Entry { identity, tat };
        }
        true
    }

    /// Removes buckets that are full at `now`.
    pub fn drop_full(&mut self, now: u64) {
        let mut kept = [Entry::default(); MAX_ENTRIES];
        let mut len = 0;
        for (slot, entry) in kept
            .iter_mut()
            .zip(self.entries().iter().filter(|e| e.tat > now))
        {
            *slot = *entry;
            len += 1;
        }
        self.entries = kept;
        self.len = len;
    }

    /// The encoding in a fixed buffer, and its length: no allocation on the request path.
    pub fn to_bytes(&self) -> ([u8; MAX_ENCODED_LEN], usize) {
        let mut buf = [0u8; MAX_ENCODED_LEN];
        let mut len = 0;
        let mut put = |bytes: &[u8]| {
            if let Some(dst) = buf.get_mut(len..len + bytes.len()) {
                dst.copy_from_slice(bytes);
                len += bytes.len();
            }
        };
        put(&[SLOT_FORMAT_VERSION]);
        put(&self.owner.to_le_bytes());
        put(&[self.count_byte()]);
        for e in self.entries() {
            put(&e.identity.to_le_bytes());
            put(&e.tat.to_le_bytes());
        }
        (buf, len)
    }

    /// Appends the encoding to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.reserve(HEADER_LEN + self.len as usize * ENTRY_LEN);
        out.push(SLOT_FORMAT_VERSION);
        out.extend_from_slice(&self.owner.to_le_bytes());
        out.push(self.count_byte());
        for e in self.entries() {
            out.extend_from_slice(&e.identity.to_le_bytes());
            out.extend_from_slice(&e.tat.to_le_bytes());
        }
    }

    fn count_byte(&self) -> u8 {
        if self.displaced {
            self.len | DISPLACED_BIT
        } else {
            self.len
        }
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let (&version, rest) = bytes.split_first().ok_or(DecodeError::BadLength)?;
        if version != SLOT_FORMAT_VERSION {
            return Err(DecodeError::UnknownVersion(version));
        }
        let (owner, rest) = rest
            .split_first_chunk::<8>()
            .ok_or(DecodeError::BadLength)?;
        let (&count, body) = rest.split_first().ok_or(DecodeError::BadLength)?;
        let displaced = count & DISPLACED_BIT != 0;
        let len = (count & !DISPLACED_BIT) as usize;
        if len > MAX_ENTRIES || body.len() != len * ENTRY_LEN {
            return Err(DecodeError::BadLength);
        }
        let mut value = SlotValue::owned_by(u64::from_le_bytes(*owner));
        for (entry, chunk) in value.entries.iter_mut().zip(body.chunks_exact(ENTRY_LEN)) {
            let (identity, tat) = chunk.split_at(8);
            *entry = Entry {
                identity: read_u64(identity),
                tat: read_u64(tat),
            };
        }
        value.len = len as u8;
        value.displaced = displaced;
        Ok(value)
    }
}

fn read_u64(bytes: &[u8]) -> u64 {
    <[u8; 8]>::try_from(bytes).map_or(0, u64::from_le_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_encoding_is_pinned_byte_for_byte() {
        let mut v = SlotValue::owned_by(0x0102_0304_0506_0708);
        v.set(0xAA, 0x1000, 0);
        let mut bytes = Vec::new();
        v.encode(&mut bytes);
        assert_eq!(
            bytes,
            [
                1, // version
                8, 7, 6, 5, 4, 3, 2, 1, // owner
                1, // one entry
                0xAA, 0, 0, 0, 0, 0, 0, 0, // identity
                0x00, 0x10, 0, 0, 0, 0, 0, 0, // tat
            ]
        );
        assert_eq!(SlotValue::decode(&bytes), Ok(v));
        let (buf, len) = v.to_bytes();
        assert_eq!(&buf[..len], &bytes[..], "both encoders agree");
    }

    #[test]
    fn the_displaced_bit_is_the_top_bit_of_the_count() {
        let mut v = SlotValue::owned_by(1);
        v.set(0xAA, 0x1000, 0);
        v.displaced = true;
        let (buf, len) = v.to_bytes();
        assert_eq!(buf[9], 0x81, "one entry, displaced");
        assert_eq!(SlotValue::decode(&buf[..len]), Ok(v));
        let mut bytes = Vec::new();
        v.encode(&mut bytes);
        assert_eq!(&bytes[..], &buf[..len]);
        // Without the bit, the bytes are exactly what earlier modules wrote.
        v.displaced = false;
        assert_eq!(v.to_bytes().0[9], 1);
    }

    #[test]
    fn an_unused_slot_is_ten_bytes() {
        let mut bytes = Vec::new();
        SlotValue::default().encode(&mut bytes);
        assert_eq!(bytes, [1, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn foreign_or_truncated_bytes_are_rejected() {
        assert_eq!(SlotValue::decode(&[]), Err(DecodeError::BadLength));
        assert_eq!(
            SlotValue::decode(&[2, 0, 0]),
            Err(DecodeError::UnknownVersion(2))
        );
        assert_eq!(
            SlotValue::decode(&[1, 0, 0, 0, 0, 0, 0, 0, 0, 1]),
            Err(DecodeError::BadLength)
        );
        assert_eq!(
            SlotValue::decode(&[1, 0, 0, 0, 0, 0, 0, 0, 0, 9]),
            Err(DecodeError::BadLength)
        );
    }

    #[test]
    fn full_buckets_make_room_before_anything_is_evicted() {
        let mut v = SlotValue::owned_by(1);
        for i in 0..MAX_ENTRIES as u64 {
            assert!(!v.set(i, if i == 3 { 50 } else { 500 + i }, 100));
        }
        assert!(!v.set(99, 1_000, 100), "entry 3 was full and made room");
        assert_eq!(v.tat_of(3), None);
        assert!(v.set(100, 1_000, 100), "now every entry holds state");
        assert_eq!(v.tat_of(0), None, "the entry closest to full was evicted");
        assert_eq!(v.entries().len(), MAX_ENTRIES);
    }

    #[test]
    fn idleness_and_backlog_follow_the_clock() {
        let mut v = SlotValue::owned_by(1);
        v.set(1, 150, 0);
        v.set(2, 120, 0);
        assert!(!v.is_idle(100));
        assert_eq!(v.backlog(100), 50);
        assert!(v.is_idle(150));
        assert_eq!(v.backlog(200), 0);
    }
}
