//! The subcommands of `sluice`, one module each, and the failure they all return.
//!
//! * [`serve`]: `sluice serve`, the admin API server ([`sluice_admin::server`]).
//! * [`database`]: the `--database` flag every subcommand on the database shares, and
//!   `sluice migrate`.
//! * [`token`]: `sluice token create|list|revoke`, directly in the database.
//! * [`rules`]: `sluice rules apply|export`, through a running server's API.
//! * [`envoy_config`]: `sluice envoy-config` ([`sluice_envoy_config`]); needs no server.
//! * [`render`]: `sluice render istio|envoy-gateway|envoy|kubernetes|ratelimit`
//!   ([`sluice_envoy_config::render`]); needs no server.
//! * [`rls_args`]: the `--rls`/`--rlqs` flags `envoy-config` and `render ratelimit` share.
//!
//! `envoy-config` and `render` both write the filter's plugin configuration: its flags'
//! values become one with [`filter_spec`].

use std::io::Write as _;
use std::path::Path;

use anyhow::Context as _;
use sluice_core::config::FilterConfigSpec;
use sluice_core::spec::FailureMode;

pub mod database;
pub mod envoy_config;
pub mod render;
pub mod rls_args;
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

/// Writes what a subcommand produced to `--output FILE` (saying so on standard error) or,
/// without one, to standard output.
pub fn write_output(output: Option<&Path>, text: &str) -> Result<(), Failure> {
    match output {
        Some(path) => {
            std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
            eprintln!("wrote {}", path.display());
        }
        None => {
            let mut stdout = std::io::stdout().lock();
            stdout
                .write_all(text.as_bytes())
                .and_then(|()| stdout.flush())
                .context("writing to standard output")?;
        }
    }
    Ok(())
}

/// `--failure-mode`: what rules without their own failure mode do when they cannot be
/// evaluated.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum FailureModeArg {
    Open,
    Closed,
}

impl From<FailureModeArg> for FailureMode {
    fn from(mode: FailureModeArg) -> Self {
        match mode {
            FailureModeArg::Open => FailureMode::Open,
            FailureModeArg::Closed => FailureMode::Closed,
        }
    }
}

/// The filter's plugin configuration from `--rules FILE`, `--slots` and
/// `--failure-mode`.
pub fn filter_spec(
    rules_file: Option<&Path>,
    slots: u32,
    failure_mode: FailureModeArg,
) -> Result<FilterConfigSpec, Failure> {
    let read = match rules_file {
        // Even an unreadable file is for the user to fix (a typo'd path, permissions).
        Some(path) => sluice_rules_file::read_rules_file(path)
            .map_err(|err| Failure::BadInput(format!("{:#}", anyhow::Error::from(err))))?,
        None => Vec::new(),
    };
    // `rules: read`, not the shorthand: here `rules` also names the subcommand's module,
    // and `cargo xtask tidy` would read the shorthand as a use of it.
    Ok(FilterConfigSpec {
        rules: read,
        failure_mode: failure_mode.into(),
        slots,
        ..FilterConfigSpec::default()
    })
}
