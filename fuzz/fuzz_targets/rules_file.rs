//! Rules files, JSON and YAML: `parse_rules` in `admin-api/src/rules_file.rs`, which
//! reads `sluice rules apply` files and the admin API's `PUT /api/v1/rules` bodies.
//!
//! The module (and `strict_json.rs`, the deserializer it reads through) is compiled in
//! from its own source file rather than through the `sluice-admin` crate: that crate
//! brings axum, sqlx (with SQLite's C sources), Redis and reqwest, about ten times the
//! crates of the core, all of which the fuzz build would instrument, while these modules
//! need only serde, serde_json, serde_norway and the core. The code fuzzed is the admin
//! API's own; if the module ever needs more of its crate, this target stops compiling and
//! the suite's fuzz step says so.
//!
//! The first byte chooses the syntax (even: JSON, odd: YAML); the rest is the file.
//!
//! Asserts: parsing never panics (YAML goes through unsafe-libyaml, which is why the fuzz
//! build keeps AddressSanitizer on); and rules parsed from either syntax, written out as
//! JSON, parse back as the same rules.

#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;

#[path = "../../admin-api/src/rules_file.rs"]
#[allow(dead_code)] // Reading files from disk is not fuzzed; only `parse_rules` is.
mod rules_file;
// `rules_file` reads through the admin API's strict JSON deserializer, as
// `crate::strict_json`; compiled in the same way.
#[path = "../../admin-api/src/strict_json.rs"]
mod strict_json;

use rules_file::{RulesFormat, parse_rules};

fuzz_target!(|input: &[u8]| {
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
});
