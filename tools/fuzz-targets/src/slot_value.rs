use sluice_core::slot::{MAX_ENCODED_LEN, MAX_ENTRIES, SlotValue};

/// `SlotValue::decode`: the bytes of a bucket slot in proxy-wasm shared data, which any
/// worker, an older module or a corrupted write may have left there.
///
/// Asserts: decoding never panics; the layout is strict, so bytes that decode are exactly
/// the encoding of what they decode to (both encoders agree); a decoded slot holds at most
/// `MAX_ENTRIES` buckets; and what the limiter does next with a decoded slot (set a
/// bucket, drop full ones) leaves a slot that still encodes and decodes to itself.
pub fn slot_value(bytes: &[u8]) {
    let Ok(slot) = SlotValue::decode(bytes) else {
        return;
    };
    assert!(slot.entries().len() <= MAX_ENTRIES);
    assert_eq!(
        encoded(&slot),
        bytes,
        "a decoded slot re-encodes to other bytes"
    );

    // The limiter's next steps on a slot read from shared data, at instants taken from
    // the slot itself so that both full and drained buckets are met.
    let mut next = slot;
    let now = slot.entries().first().map_or(slot.owner, |e| e.tat);
    let _ = next.is_idle(now);
    let _ = next.backlog(now);
    next.set(slot.owner ^ 1, now.saturating_add(1), now);
    assert!(
        next.tat_of(slot.owner ^ 1).is_some(),
        "a set bucket is held"
    );
    next.drop_full(now);
    assert!(next.entries().iter().all(|e| e.tat > now));
    let bytes = encoded(&next);
    assert_eq!(
        SlotValue::decode(&bytes),
        Ok(next),
        "a written slot must read back"
    );
}

/// The slot's encoding, checking that the allocation-free encoder agrees with `encode`.
fn encoded(slot: &SlotValue) -> Vec<u8> {
    let mut out = Vec::new();
    slot.encode(&mut out);
    let (fixed, len) = slot.to_bytes();
    assert!(len <= MAX_ENCODED_LEN);
    assert_eq!(
        fixed.get(..len),
        Some(out.as_slice()),
        "to_bytes and encode disagree"
    );
    out
}
