//! `cargo xtask test`: the whole suite, as CI runs it, or any of its steps.
//!
//! The steps, in order (each can be chosen with `--only` or left out with `--skip`):
//!
//! * `tidy`: the repository's rules (no import circle in a crate, no product file over 900
//!   lines; documentation links, generated figures and the metrics reference, `tidy/docs.rs`).
//!   Seconds; builds nothing but xtask.
//! * `lint`: formatting, and clippy on the host and for wasm32: its own pass when the run
//!   builds only part of the workspace, otherwise inside the builds the suite makes anyway
//!   (`lint.rs`).
//! * `unit`: the unit and property tests of every host crate (`cargo test`, the
//!   workspace's default members), against a real PostgreSQL and Redis.
//! * `fuzz`: every fuzz target replays its committed corpus, then runs seeded mutations of
//!   it for a short time box, in the test build (`cargo xtask fuzz` is the long,
//!   coverage-guided libFuzzer run with AddressSanitizer).
//! * `contract`: schemathesis against a real `sluice serve`, from its own OpenAPI document,
//!   with several seeds.
//! * `e2e`: the end-to-end tests against real Envoys (`sluice-tests`), run by cargo-nextest
//!   two at a time, the load and timing tests one at a time (`.config/nextest.toml`).
//!
//! What a step needs is built or installed just before it, and only when a chosen step needs
//! it: the `dev` profile for the host binaries (the unit tests' dependency tree, compiled
//! once), release for the filter that Envoy runs.
//!
//! Any failing step fails the run. The summary lists each step's duration, and the same
//! table is written to `target/suite-times.md` (the record the README's timings come from).

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use sluice_harness::cmd::{self, note, step};
use sluice_harness::{
    CHROMEDRIVER_ENV, CHROMIUM_ENV, ENVOY_ENV, FILTER_WASM_ENV, OCI_DIR_ENV, SLUICE_BIN_ENV,
};

use crate::dist::{self, Dist, Profile};
use crate::libtest::{self, TestCounts};
use crate::{
    dashboard, envoy, fuzz, images, lint, postgres, redis, registry, schemathesis, tidy, validators,
};

const E2E_PACKAGE: &str = "sluice-tests";
/// The nextest profile of the end-to-end tests (`.config/nextest.toml`).
const E2E_PROFILE: &str = "e2e";

/// A step of the suite, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, ValueEnum)]
pub enum Step {
    Tidy,
    Lint,
    Unit,
    Fuzz,
    Contract,
    E2e,
}

impl Step {
    const ALL: [Step; 6] = [
        Step::Tidy,
        Step::Lint,
        Step::Unit,
        Step::Fuzz,
        Step::Contract,
        Step::E2e,
    ];

    fn name(self) -> &'static str {
        match self {
            Step::Tidy => "tidy",
            Step::Lint => "lint",
            Step::Unit => "unit",
            Step::Fuzz => "fuzz",
            Step::Contract => "contract",
            Step::E2e => "e2e",
        }
    }
}

#[derive(Debug, Args)]
pub struct TestArgs {
    /// Run only these steps (comma-separated): tidy, lint, unit, fuzz, contract, e2e.
    #[arg(long, value_enum, value_delimiter = ',', value_name = "STEPS")]
    pub only: Vec<Step>,

    /// Leave these steps out (comma-separated). CI runs every step.
    #[arg(long, value_enum, value_delimiter = ',', value_name = "STEPS")]
    pub skip: Vec<Step>,

    /// Same as `--skip unit,fuzz` (kept for earlier habits).
    #[arg(long, hide = true)]
    pub skip_unit: bool,

    /// Same as `--skip lint`.
    #[arg(long, hide = true)]
    pub skip_lint: bool,

    /// Same as `--skip contract`.
    #[arg(long, hide = true)]
    pub skip_contract: bool,

    /// How many end-to-end tests run at once (the load and timing tests always run alone
    /// among themselves).
    #[arg(long, default_value_t = 2, value_name = "N")]
    pub e2e_threads: usize,

    /// Passed to the end-to-end test runner (cargo-nextest): test-name filters such as
    /// `accuracy`, or nextest flags such as `--no-capture`. Runs only the `e2e` step unless
    /// `--only` says otherwise.
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "TEST_ARGS"
    )]
    pub test_args: Vec<String>,
}

impl TestArgs {
    /// The chosen steps, in run order.
    pub fn steps(&self) -> Vec<Step> {
        let mut skipped = self.skip.clone();
        if self.skip_unit {
            skipped.extend([Step::Unit, Step::Fuzz]);
        }
        if self.skip_lint {
            skipped.push(Step::Lint);
        }
        if self.skip_contract {
            skipped.push(Step::Contract);
        }
        let chosen: Vec<Step> = if !self.only.is_empty() {
            self.only.clone()
        } else if !self.test_args.is_empty() && !self.skip_unit && self.skip.is_empty() {
            // `cargo xtask test some_test_name` means that end-to-end test.
            vec![Step::E2e]
        } else {
            Step::ALL.to_vec()
        };
        Step::ALL
            .into_iter()
            .filter(|s| chosen.contains(s) && !skipped.contains(s))
            .collect()
    }
}

pub fn test(args: &TestArgs) -> Result<()> {
    let steps = args.steps();
    if steps.is_empty() {
        bail!("no step left to run (--only and --skip exclude them all)");
    }
    step(format!(
        "steps: {}",
        steps
            .iter()
            .map(|s| s.name())
            .collect::<Vec<_>>()
            .join(", ")
    ));
    let mut run = Run::default();
    let result = run_steps(args, &steps, &mut run);
    run.report(&steps, result.is_ok());
    // One plain closing line for the whole run: cargo's last `test result:` line only covers the
    // last test binary (often an empty doc-test run).
    let TestCounts {
        passed,
        failed,
        ignored,
    } = run.counts;
    println!("\nsummary: {passed} passed, {failed} failed, {ignored} skipped");
    result?;
    step("all tests passed");
    Ok(())
}

/// What a run has measured so far: each phase's duration, and the tests counted.
#[derive(Debug, Default)]
struct Run {
    phases: Vec<(String, Duration)>,
    started: Option<Instant>,
    counts: TestCounts,
}

impl Run {
    /// Runs one phase (a step, or what it needs built or installed), recording its duration
    /// whether it passes or fails, and naming it in the error when it fails.
    fn time<T>(&mut self, name: impl Into<String>, run: impl FnOnce() -> Result<T>) -> Result<T> {
        let name = name.into();
        let started = Instant::now();
        self.started.get_or_insert(started);
        let result = run();
        self.phases.push((name.clone(), started.elapsed()));
        result.with_context(|| format!("`{name}` failed"))
    }

    /// Prints each phase's duration, and writes the same table to `target/suite-times.md`.
    fn report(&self, steps: &[Step], passed: bool) {
        let Some(started) = self.started else { return };
        step("durations");
        let total = started.elapsed();
        let mut table = String::new();
        let _ = writeln!(table, "| phase | seconds |\n| --- | ---: |");
        for (name, took) in &self.phases {
            note(format!("{:>7.1} s  {name}", took.as_secs_f64()));
            let _ = writeln!(table, "| {name} | {:.1} |", took.as_secs_f64());
        }
        note(format!("{:>7.1} s  in all", total.as_secs_f64()));
        let _ = writeln!(table, "| **in all** | **{:.1}** |", total.as_secs_f64());
        let record = format!(
            "# `cargo xtask test` durations\n\nsteps: {}; {}; {} passed, {} failed, {} skipped; \
             revision {}; load average before the run: {}\n\n{table}",
            steps
                .iter()
                .map(|s| s.name())
                .collect::<Vec<_>>()
                .join(", "),
            if passed { "passed" } else { "FAILED" },
            self.counts.passed,
            self.counts.failed,
            self.counts.ignored,
            revision(),
            LOAD_AVERAGE.get().map_or("unknown", String::as_str),
        );
        let path = cmd::project_root().join("target").join("suite-times.md");
        if let Err(err) = std::fs::write(&path, record) {
            note(format!("could not write {}: {err}", path.display()));
        }
    }
}

static LOAD_AVERAGE: std::sync::OnceLock<String> = std::sync::OnceLock::new();

fn revision() -> String {
    cmd::probe(std::process::Command::new("git").args(["rev-parse", "--short", "HEAD"]))
        .map_or_else(|| "unknown".to_owned(), |r| r.trim().to_owned())
}

/// What the e2e and contract steps share: the built deliverables, once.
#[derive(Debug, Default)]
struct Built {
    dist: Option<Dist>,
}

impl Built {
    fn dist(&mut self, run: &mut Run) -> Result<Dist> {
        if let Some(dist) = &self.dist {
            return Ok(dist.clone());
        }
        let dist = run.time("build (filter release, dashboard, sluice dev)", || {
            dist::build(Profile::Test)
        })?;
        self.dist = Some(dist.clone());
        Ok(dist)
    }
}

fn run_steps(args: &TestArgs, steps: &[Step], run: &mut Run) -> Result<()> {
    let _ = LOAD_AVERAGE.set(
        std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|l| l.split_whitespace().next().map(str::to_owned))
            .unwrap_or_else(|| "unknown".to_owned()),
    );
    let wants = |s: Step| steps.contains(&s);
    // The servers the unit and end-to-end tests need; they live until the run ends.
    let databases = if wants(Step::Unit) || wants(Step::E2e) {
        let postgres = run.time("provision PostgreSQL", postgres::for_tests)?;
        let redis_server = run.time("provision Redis", redis::ensure_server)?;
        Some((postgres, redis_server))
    } else {
        None
    };
    let mut built = Built::default();

    for &chosen in steps {
        match chosen {
            Step::Tidy => run.time("tidy", tidy::tidy)?,
            Step::Lint if lints_while_building(steps) => {
                run.time("lint", lint::lint_while_building)?;
            }
            Step::Lint => run.time("lint", lint::lint)?,
            Step::Unit => {
                let (postgres, redis_server) =
                    databases.as_ref().context("the unit step's servers")?;
                step("unit and property tests (cargo test, default members)");
                // Plain `cargo test` runs the workspace's default members: every host crate
                // (the dashboard's logic included, in `sluice-dashboard-model`), but neither
                // the wasm-only filter nor the Envoy-driven end-to-end tests.
                let counts = &mut run.counts;
                let mut unit = cmd::cargo();
                crate::clippy::while_building(&mut unit)
                    .arg("test")
                    .envs(postgres.env())
                    .envs(redis::env(redis_server));
                let started = Instant::now();
                let result = libtest::run_tests(&mut unit, counts);
                run.phases.push(("unit".to_owned(), started.elapsed()));
                result.context("`unit` failed")?;
            }
            Step::Fuzz => {
                let started = Instant::now();
                let result = fuzz::suite_run(&mut run.counts);
                run.phases.push(("fuzz".to_owned(), started.elapsed()));
                result.context("`fuzz` failed")?;
            }
            Step::Contract => {
                let dist = built.dist(run)?;
                let contract = run.time("contract", || {
                    schemathesis::check_contract(&dist.sluice_bin)
                });
                // Counted as one test: schemathesis prints its own summary above.
                match contract {
                    Ok(()) => run.counts.passed += 1,
                    Err(err) => {
                        run.counts.failed += 1;
                        return Err(err);
                    }
                }
            }
            Step::E2e => {
                let (postgres, redis_server) =
                    databases.as_ref().context("the e2e step's servers")?;
                let dist = built.dist(run)?;
                run.time("build OCI images (static sluice, dev)", || {
                    images::build(&dist, Profile::Test).map(|images| images.print())
                })?;
                let tools = provision_e2e(run)?;
                step(format!(
                    "end-to-end tests against Envoy ({E2E_PACKAGE}, {} at a time)",
                    args.e2e_threads
                ));
                let mut e2e = cmd::cargo();
                crate::clippy::while_building(&mut e2e)
                    .args(["nextest", "run", "--package", E2E_PACKAGE])
                    .args(["--profile", E2E_PROFILE])
                    .arg(format!("--test-threads={}", args.e2e_threads))
                    .args(&args.test_args)
                    .env(FILTER_WASM_ENV, &dist.filter_wasm)
                    .env(SLUICE_BIN_ENV, &dist.sluice_bin)
                    .env(ENVOY_ENV, &tools.envoy)
                    .env(CHROMIUM_ENV, &tools.chromium)
                    .env(CHROMEDRIVER_ENV, &tools.chromedriver)
                    .env(OCI_DIR_ENV, images::oci_dir())
                    .envs(tools.registry.env())
                    .envs(postgres.env())
                    .envs(redis::env(redis_server))
                    .envs(tools.validators.iter().map(|(k, v)| (*k, v)));
                let counts = &mut run.counts;
                let started = Instant::now();
                let result = libtest::run_tests(&mut e2e, counts);
                run.phases.push(("e2e".to_owned(), started.elapsed()));
                result.context("`e2e` failed")?;
            }
        }
    }
    Ok(())
}

/// Whether this run's lint goes inside its builds: only when they compile every workspace
/// crate clippy would check (the unit, fuzz and end-to-end tests, and the deliverables
/// the end-to-end tests need).
fn lints_while_building(steps: &[Step]) -> bool {
    [Step::Lint, Step::Unit, Step::Fuzz, Step::E2e]
        .iter()
        .all(|s| steps.contains(s))
}

/// The programs only the end-to-end tests use.
struct E2eTools {
    envoy: PathBuf,
    chromium: PathBuf,
    chromedriver: PathBuf,
    validators: Vec<(&'static str, PathBuf)>,
    registry: registry::RegistryTools,
}

fn provision_e2e(run: &mut Run) -> Result<E2eTools> {
    let envoy = run.time("provision Envoy", envoy::ensure_envoy)?;
    let (chromium, chromedriver) = run.time("provision Chromium", dashboard::ensure_browser)?;
    let validators = run.time("provision schema validators", validators::ensure_installed)?;
    let registry = run.time(
        "provision skopeo and docker-registry",
        registry::ensure_tools,
    )?;
    run.time("provision cargo-nextest", ensure_nextest)?;
    Ok(E2eTools {
        envoy,
        chromium,
        chromedriver,
        validators,
        registry,
    })
}

/// cargo-nextest runs the end-to-end tests: one process per test, several at once, with the
/// load tests in a group of their own. Installed from crates.io where missing.
fn ensure_nextest() -> Result<()> {
    if let Some(version) = cmd::probe(cmd::cargo().args(["nextest", "--version"])) {
        note(format!(
            "found {}",
            version.lines().next().unwrap_or_default().trim()
        ));
        return Ok(());
    }
    note(
        "cargo-nextest is not installed: installing it from crates.io (takes a few minutes, once)",
    );
    cmd::run(cmd::cargo().args(["install", "cargo-nextest", "--locked"]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: TestArgs,
    }

    fn steps(line: &[&str]) -> Vec<Step> {
        let cli = Cli::try_parse_from(std::iter::once("test").chain(line.iter().copied()))
            .expect("a valid command line");
        cli.args.steps()
    }

    #[test]
    fn every_step_runs_by_default_and_each_can_be_chosen_or_left_out() {
        assert_eq!(steps(&[]), Step::ALL);
        assert_eq!(steps(&["--only", "unit,tidy"]), [Step::Tidy, Step::Unit]);
        assert_eq!(
            steps(&["--skip", "lint", "--skip", "e2e"]),
            [Step::Tidy, Step::Unit, Step::Fuzz, Step::Contract]
        );
        assert_eq!(
            steps(&["--skip-unit", "--skip-lint"]),
            [Step::Tidy, Step::Contract, Step::E2e]
        );
        assert_eq!(steps(&["--only", "fuzz", "--skip", "fuzz"]), []);
    }

    #[test]
    fn a_test_filter_alone_means_the_end_to_end_step() {
        assert_eq!(steps(&["accuracy"]), [Step::E2e]);
        assert_eq!(
            steps(&["--only", "unit,e2e", "accuracy"]),
            [Step::Unit, Step::E2e]
        );
    }
}
