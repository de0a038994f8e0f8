//! The fuzz targets: one plain function over bytes per decoder of untrusted bytes, and one
//! for the per-request decision. A target returns when its input is not worth checking
//! and panics when something it asserts does not hold; each function's documentation says
//! what it asserts.
//!
//! Two drivers run the same functions on the same inputs:
//!
//! * libFuzzer, through one shell per target in `tools/fuzz/fuzz_targets/` (its own
//!   workspace: an AddressSanitizer, coverage-instrumented build), by `cargo xtask fuzz`;
//! * this crate's corpus test (`tests/corpus.rs`, the suite's fuzz step): every committed
//!   corpus file in `tools/fuzz/corpus/<target>/`, then seeded mutations of them for a few
//!   seconds per target.
//!
//! Targets that need structured input take bytes all the same and build it with
//! [`structured::from_bytes`], exactly as libfuzzer-sys builds an `Arbitrary` input, so a
//! corpus file or a saved failure is the same input under both drivers.

pub mod structured;

mod bucket_state;
mod control_config;
mod control_lease;
mod decide;
mod filter_config;
mod fleet_view;
mod lease_entry;
mod metadata_struct;
mod report_json;
mod rls_decide;
mod rule_batch;
mod rules_file;
mod ruleset_document;
mod slot_value;
mod sync_request;
mod sync_response;
mod usage_reader;

pub use bucket_state::bucket_state;
pub use control_config::control_config;
pub use control_lease::control_lease;
pub use decide::decide;
pub use filter_config::filter_config;
pub use fleet_view::fleet_view;
pub use lease_entry::lease_entry;
pub use metadata_struct::metadata_struct;
pub use report_json::report_json;
pub use rls_decide::rls_decide;
pub use rule_batch::rule_batch;
pub use rules_file::rules_file;
pub use ruleset_document::ruleset_document;
pub use slot_value::slot_value;
pub use sync_request::sync_request;
pub use sync_response::sync_response;
pub use usage_reader::usage_reader;

/// A target: returns, or panics when something it asserts does not hold.
pub type Target = fn(&[u8]);

/// Every target, by its libFuzzer name: the name of its shell in `tools/fuzz/fuzz_targets/`
/// and of its corpus folder in `tools/fuzz/corpus/` (the corpus test checks all three
/// agree).
pub const TARGETS: &[(&str, Target)] = &[
    ("slot_value", slot_value),
    ("lease_entry", lease_entry),
    ("control_lease", control_lease),
    ("fleet_view", fleet_view),
    ("bucket_state", bucket_state),
    ("sync_request", sync_request),
    ("sync_response", sync_response),
    ("ruleset_document", ruleset_document),
    ("rule_batch", rule_batch),
    ("report_json", report_json),
    ("filter_config", filter_config),
    ("control_config", control_config),
    ("rules_file", rules_file),
    ("decide", decide),
    ("usage_reader", usage_reader),
    ("rls_decide", rls_decide),
    ("metadata_struct", metadata_struct),
];
