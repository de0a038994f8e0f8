use std::path::Path;

use sluice_rules_file::{RulesFormat, parse_rules};

/// Rules files, JSON and YAML: `parse_rules` of the `sluice-rules-file` crate, which
/// reads `sluice rules apply` and `sluice envoy-config --rules` files and the admin API's
/// `PUT /api/v1/rules` bodies.
///
/// The first byte chooses the syntax (even: JSON, odd: YAML); the rest is the file.
///
/// Asserts: parsing never panics (YAML goes through unsafe-libyaml, which is why the fuzz
/// build keeps AddressSanitizer on); and rules parsed from either syntax, written out as
/// JSON, parse back as the same rules.
pub fn rules_file(input: &[u8]) {
    let Some((&selector, text)) = input.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(text) else {
        return;
    };
    let format = if selector % 2 == 0 {
        RulesFormat::Json
    } else {
        RulesFormat::Yaml
    };
    let origin = Path::new("rules");
    let Ok(rules) = parse_rules(text, format, origin) else {
        return;
    };
    let json = serde_json::to_string(&rules).expect("plain data serialises");
    let again = parse_rules(&json, RulesFormat::Json, origin)
        .unwrap_or_else(|e| panic!("rules written as JSON do not parse again: {e}\n{json}"));
    assert_eq!(again, rules);
}
