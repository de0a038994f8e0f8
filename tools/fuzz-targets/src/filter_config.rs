use sluice_core::config::{FilterConfig, FilterConfigSpec};

/// `FilterConfig::from_json`: the plugin configuration Envoy hands every worker at start.
///
/// Asserts: parsing and validating never panic; whatever parses as the configuration's
/// shape (`FilterConfigSpec`) is accepted or refused by `from_json` alike after a round
/// trip through its own JSON encoding (nothing is lost or changed by serialising it).
pub fn filter_config(bytes: &[u8]) {
    let verdict = FilterConfig::from_json(bytes);
    let Ok(spec) = serde_json::from_slice::<FilterConfigSpec>(bytes) else {
        return;
    };
    let json = serde_json::to_vec(&spec).expect("plain data serialises");
    assert_eq!(
        serde_json::from_slice::<FilterConfigSpec>(&json).ok(),
        Some(spec)
    );
    let again = FilterConfig::from_json(&json);
    assert_eq!(
        again.is_ok(),
        verdict.is_ok(),
        "the same configuration, re-encoded, got another verdict: {:?} vs {:?}",
        again.err(),
        verdict.err()
    );
}
