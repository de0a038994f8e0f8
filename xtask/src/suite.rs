//! `cargo xtask test`: the whole suite, as CI runs it.

use anyhow::{Context, Result};
use clap::Args;

use crate::cmd::{self, step};
use crate::libtest::{self, TestCounts};
use crate::{dashboard, dist, envoy, postgres};

const INTEGRATION_PACKAGE: &str = "sluice-tests";

#[derive(Debug, Args)]
pub struct TestArgs {
    /// Skip the unit and property tests of the host crates.
    #[arg(long)]
    pub skip_unit: bool,

    /// Passed to the integration test binary after `--`: a test-name filter such as
    /// `accuracy`, or libtest flags such as `--nocapture`.
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "TEST_ARGS"
    )]
    pub test_args: Vec<String>,
}

pub fn test(args: &TestArgs) -> Result<()> {
    let mut counts = TestCounts::default();
    let result = run_suite(args, &mut counts);
    // One plain closing line for the whole run: cargo's last `test result:` line only covers the
    // last test binary (often an empty doc-test run).
    let TestCounts {
        passed,
        failed,
        ignored,
    } = counts;
    println!("\nsummary: {passed} passed, {failed} failed, {ignored} skipped");
    result?;
    step("all tests passed");
    Ok(())
}

fn run_suite(args: &TestArgs, counts: &mut TestCounts) -> Result<()> {
    let dist = dist::build().context("step `build` failed")?;
    let envoy = envoy::ensure_envoy().context("step `provision Envoy` failed")?;
    let (chromium, chromedriver) =
        dashboard::ensure_browser().context("step `provision Chromium` failed")?;
    // Lives until the suite ends, passed or failed: dropping it stops the server.
    let postgres = postgres::for_tests().context("step `provision PostgreSQL` failed")?;

    if args.skip_unit {
        step("unit and property tests: skipped (--skip-unit)");
    } else {
        // Plain `cargo test` runs the workspace's default members: every host crate, but neither
        // the wasm-only filter nor the Envoy-driven integration tests.
        step("unit and property tests (cargo test, default members)");
        libtest::run_tests(cmd::cargo().arg("test").envs(postgres.env()), counts)
            .context("step `unit and property tests` failed")?;
    }

    step(format!(
        "integration tests against Envoy ({INTEGRATION_PACKAGE})"
    ));
    let mut integration = cmd::cargo();
    integration
        .args([
            "test",
            "--package",
            INTEGRATION_PACKAGE,
            "--",
            "--test-threads=1",
        ])
        .args(&args.test_args)
        .env("SLUICE_FILTER_WASM", &dist.filter_wasm)
        .env("SLUICE_BIN", &dist.sluice_bin)
        .env(envoy::ENVOY_ENV, &envoy)
        .env(dashboard::CHROMIUM_ENV, &chromium)
        .env(dashboard::CHROMEDRIVER_ENV, &chromedriver)
        .envs(postgres.env());
    libtest::run_tests(&mut integration, counts).context("step `integration tests` failed")
}
