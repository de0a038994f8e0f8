//! `cargo xtask lint`: formatting and clippy, on the host and for wasm32 (on the Debian
//! toolchain route, which has no wasm32 clippy, the wasm crates are linted for the host).
//! `cargo xtask test` runs it first: a lint failure fails the suite.

use anyhow::{Result, bail};
use sluice_harness::cmd::{self, note, step};

use crate::toolchain::WasmRoute;

const FILTER_PACKAGE: &str = "sluice-filter";
const DASHBOARD_PACKAGE: &str = "sluice-dashboard";

/// Runs every check, even after a failure, so one run shows all problems.
pub fn lint() -> Result<()> {
    let mut failed = Vec::new();
    let mut record = |check: &'static str, result: Result<()>| {
        if let Err(err) = result {
            note(format!("{err:#}"));
            failed.push(check);
        }
    };

    step("checking formatting (cargo fmt --check)");
    record(
        "cargo fmt",
        cmd::run(cmd::cargo().args(["fmt", "--all", "--check"])),
    );

    // Every crate except the wasm-only filter and dashboard: the default members plus the
    // integration tests.
    step("clippy on the host crates");
    record(
        "clippy (host)",
        cmd::run(
            cmd::cargo()
                .args([
                    "clippy",
                    "--workspace",
                    "--exclude",
                    FILTER_PACKAGE,
                    "--exclude",
                    DASHBOARD_PACKAGE,
                    "--all-targets",
                ])
                .args(["--", "-D", "warnings"]),
        ),
    );

    step(format!(
        "clippy on {FILTER_PACKAGE} and {DASHBOARD_PACKAGE} for wasm32"
    ));
    match WasmRoute::select() {
        Ok(WasmRoute::Rustup) => {
            let mut clippy = WasmRoute::Rustup.cargo("clippy");
            clippy.args([
                "--package",
                FILTER_PACKAGE,
                "--package",
                DASHBOARD_PACKAGE,
                "--",
                "-D",
                "warnings",
            ]);
            record("clippy (wasm32)", cmd::run(&mut clippy));
        }
        Ok(WasmRoute::Debian) => {
            // Debian ships no clippy for its rustc-web compiler, and rustup cannot provide the
            // wasm32 standard library on such a machine. The crates' code is the same for both
            // targets (the filter's host calls are extern declarations that a check never
            // links), so clippy checks them for the host instead of not at all.
            note("Debian ships no clippy for rustc-web: checking these crates for the host target");
            record(
                "clippy (wasm crates, host target)",
                cmd::run(
                    cmd::cargo()
                        .args([
                            "clippy",
                            "--package",
                            FILTER_PACKAGE,
                            "--package",
                            DASHBOARD_PACKAGE,
                        ])
                        .args(["--", "-D", "warnings"]),
                ),
            );
        }
        Err(err) => record("clippy (wasm32): no toolchain", Err(err)),
    }

    if failed.is_empty() {
        step("lint passed");
        Ok(())
    } else {
        bail!("lint failed: {}", failed.join(", "))
    }
}
