//! The reader's bounds: how much of a body, a line, an event or a nesting it holds, and
//! the largest count it believes.

/// The most bytes of a JSON (not streamed) body held for parsing. Usage sits beside the
/// whole answer in these bodies, so the cap is the answer's size; 1 MiB is several
/// hundred thousand tokens of text.
pub const MAX_JSON_BODY_BYTES: usize = 1 << 20;

/// The longest server-sent-events line held. A longer line is skipped and counted, and
/// the event it belongs to is dropped.
pub const MAX_SSE_LINE_BYTES: usize = 256 << 10;

/// The most data one server-sent event may carry (its `data:` lines joined). A longer
/// event is dropped and counted.
pub const MAX_SSE_EVENT_BYTES: usize = 256 << 10;

/// The deepest JSON nesting (objects and arrays) parsed. Provider bodies nest well under
/// ten levels; 64 keeps parsing cost linear and stays below serde_json's own recursion
/// limit of 128, which would otherwise report a deep document as a syntax error.
pub const MAX_JSON_DEPTH: u32 = 64;

/// The largest token count believed (2^40, about 1.1 × 10^12). No response comes near it
/// (context windows hold millions of tokens); a bigger figure is a broken upstream, and
/// refusing it keeps `input + output` and the budget arithmetic after it far from
/// overflow.
pub const MAX_TOKENS: u64 = 1 << 40;

/// Event names held in full; longer names cannot be ones the reader looks for.
pub const MAX_EVENT_NAME_BYTES: usize = 64;

/// The most buffer an event-stream reader holds at any moment: one line, one event's
/// data and one event name ([`super::UsageReader::retained_capacity`]).
pub const MAX_SSE_RETAINED_BYTES: usize =
    MAX_SSE_LINE_BYTES + MAX_SSE_EVENT_BYTES + MAX_EVENT_NAME_BYTES;

/// Appends `bytes` to `buffer`, whose length the caller has kept within `cap`: grows it as
/// `Vec` would (doubling), but never to a capacity past `cap`, so a bound on length is a
/// bound on memory.
pub(super) fn extend_capped(buffer: &mut Vec<u8>, bytes: &[u8], cap: usize) {
    let needed = buffer.len().saturating_add(bytes.len());
    if needed > buffer.capacity() {
        let grown = buffer.capacity().saturating_mul(2).min(cap).max(needed);
        buffer.reserve_exact(grown - buffer.len());
    }
    buffer.extend_from_slice(bytes);
}
