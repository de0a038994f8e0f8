//! `cargo xtask lint`: formatting and clippy, on the host and for wasm32 (on the Debian
//! toolchain route, which has no wasm32 clippy, the wasm crates are linted for the host).
//!
//! `cargo xtask test` lints in one of two ways, with the same lints and `-D warnings`:
//! - alone (`--only lint`, or a run that builds only part of the workspace): [`lint`],
//!   clippy's own pass over the workspace;
//! - with every build step (the whole suite): [`lint_while_building`], which checks the
//!   formatting and has every later build of a workspace crate compiled by clippy-driver
//!   ([`clippy::while_building`]). The suite compiles every workspace crate anyway (the
//!   unit, fuzz and end-to-end tests, the filter, the dashboard and `sluice`), so clippy's
//!   separate pass, which checked the whole dependency tree a second time, is not needed:
//!   on a fresh clone on two cores it took 566 s of a 2,157 s run.

use anyhow::{Result, bail};
use sluice_harness::cmd::{self, note, step};

use crate::clippy::{self, DENY_WARNINGS};
use crate::toolchain::WasmRoute;

const FILTER_PACKAGE: &str = "sluice-filter";
const DASHBOARD_PACKAGE: &str = "sluice-dashboard";
/// The benchmark's probe filters: wasm crates no suite step builds.
const PROBE_FILTERS: [&str; 2] = ["sluice-passthrough-filter", "sluice-hostcall-filter"];
/// Runs every check, even after a failure, so one run shows all problems.
pub fn lint() -> Result<()> {
    let mut checks = Checks::default();
    checks.formatting();

    // Every crate except the wasm-only filter and dashboard: the default members plus the
    // integration tests.
    step("clippy on the host crates");
    checks.record(
        "clippy (host)",
        cmd::run(
            cmd::cargo()
                .args(["clippy", "--workspace", "--all-targets"])
                .args(["--exclude", FILTER_PACKAGE, "--exclude", DASHBOARD_PACKAGE])
                .arg("--")
                .args(DENY_WARNINGS),
        ),
    );

    step(format!(
        "clippy on {FILTER_PACKAGE} and {DASHBOARD_PACKAGE} for wasm32"
    ));
    match WasmRoute::select() {
        Ok(WasmRoute::Rustup) => {
            let mut clippy = WasmRoute::Rustup.cargo("clippy");
            clippy
                .args(["--package", FILTER_PACKAGE, "--package", DASHBOARD_PACKAGE])
                .arg("--")
                .args(DENY_WARNINGS);
            checks.record("clippy (wasm32)", cmd::run(&mut clippy));
        }
        Ok(WasmRoute::Debian) => checks.wasm_crates_for_the_host(),
        Err(err) => checks.record("clippy (wasm32): no toolchain", Err(err)),
    }
    checks.finish()
}

/// The whole suite's lint: the formatting now, and clippy in every later build of a
/// workspace crate ([`clippy::while_building`]), which then fails on any warning with
/// clippy's own message. What no suite step builds is linted now: the benchmark's probe
/// filters, and on the Debian route (no clippy for its wasm compiler) the wasm crates for
/// the host.
pub fn lint_while_building() -> Result<()> {
    let mut checks = Checks::default();
    checks.formatting();
    step("clippy on the benchmark's probe filters");
    let mut probes = cmd::cargo();
    probes.arg("clippy");
    for package in PROBE_FILTERS {
        probes.args(["--package", package]);
    }
    checks.record(
        "clippy (probe filters)",
        cmd::run(probes.arg("--").args(DENY_WARNINGS)),
    );
    if WasmRoute::select()? == WasmRoute::Debian {
        checks.wasm_crates_for_the_host();
    }
    clippy::lint_while_building();
    note("clippy (-D warnings) compiles every workspace crate the suite builds from here on");
    checks.finish()
}

/// The checks of one lint run: each is recorded, and the run fails at the end with the
/// names of those that failed.
#[derive(Default)]
struct Checks {
    failed: Vec<&'static str>,
}

impl Checks {
    fn record(&mut self, check: &'static str, result: Result<()>) {
        if let Err(err) = result {
            note(format!("{err:#}"));
            self.failed.push(check);
        }
    }

    fn formatting(&mut self) {
        step("checking formatting (cargo fmt --check)");
        let result = cmd::run(cmd::cargo().args(["fmt", "--all", "--check"]));
        self.record("cargo fmt", result);
    }

    /// Debian ships no clippy for its rustc-web compiler, and rustup cannot provide the
    /// wasm32 standard library on such a machine. The crates' code is the same for both
    /// targets (the filter's host calls are extern declarations that a check never
    /// links), so clippy checks them for the host instead of not at all.
    fn wasm_crates_for_the_host(&mut self) {
        note("Debian ships no clippy for rustc-web: checking the wasm crates for the host target");
        let result = cmd::run(
            cmd::cargo()
                .args(["clippy", "--package", FILTER_PACKAGE])
                .args(["--package", DASHBOARD_PACKAGE, "--"])
                .args(DENY_WARNINGS),
        );
        self.record("clippy (wasm crates, host target)", result);
    }

    fn finish(self) -> Result<()> {
        if self.failed.is_empty() {
            step("lint passed");
            Ok(())
        } else {
            bail!("lint failed: {}", self.failed.join(", "))
        }
    }
}
