//! What an import reports: the rules, each part of the input that was left out and why,
//! notes on what converted with a difference; and why an input could not be read at all.

use sluice_core::spec::RuleSpec;

/// What came out of an import: the rules, and everything that could not be converted.
#[derive(Debug, Default)]
pub struct Import {
    pub rules: Vec<RuleSpec>,
    /// What was left out, and why.
    pub skipped: Vec<Skipped>,
    /// What was converted with a difference worth knowing.
    pub notes: Vec<String>,
}

/// A part of the input that has no Sluice equivalent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// Where it is, e.g. `descriptor (remote_address, 50.0.0.5)`.
    pub what: String,
    pub why: String,
}

/// Why the input could not be read at all.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("not a valid envoy-ratelimit configuration: {0}")]
    Config(String),
    #[error("not a valid Envoy configuration: {0}")]
    Envoy(String),
}
