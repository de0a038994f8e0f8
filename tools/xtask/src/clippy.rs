//! Clippy inside the suite's own builds: every workspace crate compiled by clippy-driver,
//! which lints it and then compiles it as rustc would (see `lint.rs`).

use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};

/// What every lint run denies.
pub const DENY_WARNINGS: [&str; 2] = ["-D", "warnings"];
/// How clippy-driver takes its arguments from cargo's environment (as `cargo clippy`
/// passes them): each one followed by this separator.
const ARGS_SEPARATOR: &str = "__CLIPPY_HACKERY__";

/// Whether this run's builds are compiled by clippy-driver.
static WHILE_BUILDING: AtomicBool = AtomicBool::new(false);

/// From now on, [`while_building`] adds clippy to the cargo commands it is given.
pub fn lint_while_building() {
    WHILE_BUILDING.store(true, Ordering::SeqCst);
}

/// Has `cargo` compile the workspace's crates with clippy-driver (deny warnings), when
/// this run lints while building; dependencies are compiled by rustc as always. Cargo
/// keeps these artefacts apart from plain ones, so builds with and without it never
/// undo each other.
pub fn while_building(cargo: &mut Command) -> &mut Command {
    if WHILE_BUILDING.load(Ordering::SeqCst) {
        let args: String = DENY_WARNINGS
            .iter()
            .map(|arg| format!("{arg}{ARGS_SEPARATOR}"))
            .collect();
        cargo
            .env("RUSTC_WORKSPACE_WRAPPER", "clippy-driver")
            .env("CLIPPY_ARGS", args);
    }
    cargo
}
