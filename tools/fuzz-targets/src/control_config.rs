use sluice_core::config::ControlConfigSpec;

/// `ControlConfigSpec::from_json`: the control service's configuration, handed to the
/// singleton inside Envoy at start.
///
/// Asserts: parsing and checking never panic, and an accepted configuration is accepted
/// again, unchanged, after a round trip through its JSON encoding.
pub fn control_config(bytes: &[u8]) {
    let Ok(spec) = ControlConfigSpec::from_json(bytes) else {
        return;
    };
    let json = serde_json::to_vec(&spec).expect("plain data serialises");
    assert_eq!(ControlConfigSpec::from_json(&json), Ok(spec));
}
