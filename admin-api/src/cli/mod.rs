//! The subcommands of `sluice`, one module each, and the failure they all return.
//!
//! * [`serve`]: `sluice serve`, the admin API server ([`sluice_admin::server`]).
//! * [`database`]: the `--database` flag every subcommand on the database shares, and
//!   `sluice migrate`.
//! * [`token`]: `sluice token create|list|revoke`, directly in the database.
//! * [`rules`]: `sluice rules apply|export`, through a running server's API.
//! * [`envoy_config`]: `sluice envoy-config` ([`sluice_envoy_config`]); needs no server.

pub mod database;
pub mod envoy_config;
pub mod rules;
pub mod serve;
pub mod token;

/// A failure with its exit status.
#[derive(Debug)]
pub enum Failure {
    /// The user's input is wrong; the message says what to change.
    BadInput(String),
    Other(anyhow::Error),
}

impl From<anyhow::Error> for Failure {
    fn from(err: anyhow::Error) -> Self {
        Failure::Other(err)
    }
}
