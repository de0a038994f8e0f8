use sluice_core::global::sync::SyncRequest;

/// The sync request's JSON (`SyncRequest`), which the admin API reads from any proxy at
/// `POST /api/v1/quota/sync`; its bucket ids go through the core's own hex codec.
///
/// Asserts: parsing never panics, and a parsed request survives a round trip through the
/// proxy's encoder (`to_json`) unchanged.
pub fn sync_request(bytes: &[u8]) {
    let Ok(request) = serde_json::from_slice::<SyncRequest>(bytes) else {
        return;
    };
    let again: SyncRequest =
        serde_json::from_slice(&request.to_json()).expect("an encoded sync request parses");
    assert_eq!(again, request);
}
