//! The `sluice` binary's library: Envoy configuration generation now; the admin API and the
//! dashboard server will join it.

pub mod envoy_config;
pub mod rules_file;
