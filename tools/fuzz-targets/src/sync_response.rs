use sluice_core::global::sync::SyncResponse;

/// `SyncResponse::from_json`: the coordinator's answer, as the control service inside
/// Envoy reads it (whatever the admin API's address answers).
///
/// Asserts: parsing never panics, and a parsed answer survives a round trip through its
/// JSON encoding unchanged.
pub fn sync_response(bytes: &[u8]) {
    let Ok(response) = SyncResponse::from_json(bytes) else {
        return;
    };
    let json = serde_json::to_vec(&response).expect("plain data serialises");
    assert_eq!(SyncResponse::from_json(&json), Ok(response));
}
