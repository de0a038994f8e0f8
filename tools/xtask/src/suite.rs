//! `cargo xtask test`: the whole suite, as CI runs it.
//!
//! Order: the lint checks first (formatting and clippy on the host and for wasm32: what
//! ARCHITECTURE.md says is enforced), then the build (the OCI images included), the servers
//! and tools the tests need, the unit and property tests of the host crates, and the
//! integration tests against real Envoys.
//! Any failing step fails the run; the summary ends with each step's duration, so a slow
//! step shows in a CI log.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Args;
use sluice_harness::cmd::{self, note, step};
use sluice_harness::{
    CHROMEDRIVER_ENV, CHROMIUM_ENV, ENVOY_ENV, FILTER_WASM_ENV, OCI_DIR_ENV, SLUICE_BIN_ENV,
};

use crate::libtest::{self, TestCounts};
use crate::{
    dashboard, dist, envoy, images, lint, postgres, redis, registry, schemathesis, validators,
};

const INTEGRATION_PACKAGE: &str = "sluice-tests";

#[derive(Debug, Args)]
pub struct TestArgs {
    /// Skip the unit and property tests of the host crates, and the short fuzz run.
    #[arg(long)]
    pub skip_unit: bool,

    /// Skip the formatting and clippy checks (for a quick local rerun; CI never skips them).
    #[arg(long)]
    pub skip_lint: bool,

    /// Skip the API contract check (schemathesis against `sluice serve`; CI never skips it).
    #[arg(long)]
    pub skip_contract: bool,

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
    let mut timings = Timings::default();
    let result = run_suite(args, &mut counts, &mut timings);
    timings.print();
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

/// How long each step of the run took, in order.
#[derive(Debug, Default)]
struct Timings {
    steps: Vec<(&'static str, Duration)>,
    started: Option<Instant>,
}

impl Timings {
    /// Runs one step, recording its duration whether it passes or fails, and naming it in
    /// the error when it fails.
    fn time<T>(&mut self, name: &'static str, run: impl FnOnce() -> Result<T>) -> Result<T> {
        let started = Instant::now();
        self.started.get_or_insert(started);
        let result = run();
        self.steps.push((name, started.elapsed()));
        result.with_context(|| format!("step `{name}` failed"))
    }

    fn print(&self) {
        let Some(started) = self.started else { return };
        step("step durations");
        for (name, took) in &self.steps {
            note(format!("{:>7.1} s  {name}", took.as_secs_f64()));
        }
        note(format!(
            "{:>7.1} s  in all",
            started.elapsed().as_secs_f64()
        ));
    }
}

fn run_suite(args: &TestArgs, counts: &mut TestCounts, timings: &mut Timings) -> Result<()> {
    if args.skip_lint {
        step("lint: skipped (--skip-lint)");
    } else {
        timings.time("lint", lint::lint)?;
    }
    let dist = timings.time("build", dist::build)?;
    // Its own step, so the summary shows what the static `sluice` build adds.
    timings
        .time("build OCI images", || images::build(&dist))?
        .print();
    let envoy = timings.time("provision Envoy", envoy::ensure_envoy)?;
    let (chromium, chromedriver) = timings.time("provision Chromium", dashboard::ensure_browser)?;
    // Lives until the suite ends, passed or failed: dropping it stops the server.
    let postgres = timings.time("provision PostgreSQL", postgres::for_tests)?;
    let redis_server = timings.time("provision Redis", redis::ensure_server)?;
    let redis_env = redis::env(&redis_server);
    let validators = timings.time("provision schema validators", validators::ensure_installed)?;
    let registry_tools = timings.time(
        "provision skopeo and docker-registry",
        registry::ensure_tools,
    )?;

    if args.skip_unit {
        step("unit and property tests, short fuzz run: skipped (--skip-unit)");
    } else {
        // Plain `cargo test` runs the workspace's default members: every host crate (the
        // dashboard's logic included, in `sluice-dashboard-model`), but neither the wasm-only
        // filter nor the Envoy-driven integration tests.
        step("unit and property tests (cargo test, default members)");
        timings.time("unit and property tests", || {
            libtest::run_tests(
                cmd::cargo()
                    .arg("test")
                    .envs(postgres.env())
                    .envs(redis_env),
                counts,
            )
        })?;
        // libFuzzer on every decoder of untrusted bytes, a few seconds per target.
        timings.time("fuzz (short)", crate::fuzz::short_run)?;
    }

    if args.skip_contract {
        step("API contract: skipped (--skip-contract)");
    } else {
        // Counted as one test: schemathesis prints its own summary above.
        let contract = timings.time("API contract (schemathesis)", || {
            schemathesis::check_contract(&dist.sluice_bin)
        });
        match contract {
            Ok(()) => counts.passed += 1,
            Err(err) => {
                counts.failed += 1;
                return Err(err);
            }
        }
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
        .env(FILTER_WASM_ENV, &dist.filter_wasm)
        .env(SLUICE_BIN_ENV, &dist.sluice_bin)
        .env(ENVOY_ENV, &envoy)
        .env(CHROMIUM_ENV, &chromium)
        .env(CHROMEDRIVER_ENV, &chromedriver)
        .env(OCI_DIR_ENV, images::oci_dir())
        .envs(registry_tools.env())
        .envs(postgres.env())
        .envs(redis_env)
        .envs(validators);
    timings.time("integration tests", || {
        libtest::run_tests(&mut integration, counts)
    })
}
