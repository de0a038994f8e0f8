//! Choosing how to compile for wasm32-unknown-unknown.
//!
//! Two routes:
//! - rustup: the default toolchain with its wasm32 target (a developer's usual machine).
//! - Debian: `rustc-web` 1.96 from Debian with the std sources, building std itself with
//!   `-Zbuild-std`. Used where `rustup target add` cannot download (machines that reach only
//!   package registries). It is a different compiler from the native crates' one, so it gets its
//!   own target directory.
//!
//! `SLUICE_WASM_ROUTE=rustup|debian` forces a route, e.g. to test the fallback on a machine
//! where rustup works.
//!
//! The static `sluice` for the server image (`images.rs`) takes the same two routes for
//! x86_64-unknown-linux-musl, through [`rustup_target_available`], [`ensure_debian_toolchain`]
//! and [`debian_cargo`].

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use sluice_harness::apt;
use sluice_harness::cmd::{self, Outcome, note, step};

pub const WASM_TARGET: &str = "wasm32-unknown-unknown";

const ROUTE_ENV: &str = "SLUICE_WASM_ROUTE";

/// `rustup target add` may hang rather than fail where the network is restricted.
const RUSTUP_ADD_LIMIT: Duration = Duration::from_secs(120);

const DEBIAN_PACKAGES: &[&str] = &["rustc-web", "cargo-web", "rust-web-src", "lld-22"];
const DEBIAN_RUSTC: &str = "/usr/bin/rustc";
const DEBIAN_CARGO: &str = "/usr/bin/cargo";
/// The wasm linker; Debian's link comes from `lld-22`, without which the link step fails.
const DEBIAN_LLD: &str = "/usr/bin/rust-lld";
/// The version verified to build the filter with `-Zbuild-std` (bookworm-security's rustc-web).
const DEBIAN_MIN_RUSTC: (u32, u32) = (1, 96);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WasmRoute {
    Rustup,
    Debian,
}

impl fmt::Display for WasmRoute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WasmRoute::Rustup => "rustup",
            WasmRoute::Debian => "debian",
        })
    }
}

impl WasmRoute {
    /// Picks the route (forced by `SLUICE_WASM_ROUTE`, else rustup if it can provide the target,
    /// else Debian) and installs what it needs.
    pub fn select() -> Result<WasmRoute> {
        step(format!("choosing a {WASM_TARGET} toolchain"));
        let route = match forced_route()? {
            Some(WasmRoute::Rustup) => {
                note(format!("{ROUTE_ENV}=rustup forces the rustup route"));
                if !rustup_target_available(WASM_TARGET)? {
                    bail!("{ROUTE_ENV}=rustup, but rustup cannot provide {WASM_TARGET}");
                }
                WasmRoute::Rustup
            }
            Some(WasmRoute::Debian) => {
                note(format!("{ROUTE_ENV}=debian forces the Debian route"));
                ensure_debian_toolchain()?;
                WasmRoute::Debian
            }
            None if rustup_target_available(WASM_TARGET)? => WasmRoute::Rustup,
            None => {
                note("falling back to Debian's rustc-web with -Zbuild-std");
                ensure_debian_toolchain()?;
                WasmRoute::Debian
            }
        };
        note(format!("wasm route: {route}"));
        Ok(route)
    }

    /// `cargo <subcommand> --target wasm32-unknown-unknown` with this route's compiler.
    pub fn cargo(self, subcommand: &str) -> Command {
        let mut command = match self {
            // Linted while building when the suite says so (the Debian route's compiler has
            // no clippy: the suite lints its crates for the host instead).
            WasmRoute::Rustup => {
                let mut cargo = cmd::cargo();
                crate::clippy::while_building(&mut cargo);
                cargo
            }
            WasmRoute::Debian => debian_cargo(),
        };
        command.args([subcommand, "--target", WASM_TARGET]);
        if self == WasmRoute::Debian {
            command
                .arg("-Zbuild-std=std,panic_abort")
                .arg("--target-dir")
                .arg(Path::new("target").join("wasm-debian"));
        }
        command
    }

    /// Builds `package` in release mode and returns the path of its `artefact`
    /// (e.g. `sluice_filter.wasm`).
    pub fn build_release(self, package: &str, artefact: &str) -> Result<PathBuf> {
        let mut command = self.cargo("build");
        command.args(["--release", "--package", package]);
        cmd::cargo_build_artefact(&mut command, artefact)
    }
}

fn forced_route() -> Result<Option<WasmRoute>> {
    match std::env::var(ROUTE_ENV) {
        Err(std::env::VarError::NotPresent) => Ok(None),
        Ok(value) => match value.trim() {
            "" => Ok(None),
            "rustup" => Ok(Some(WasmRoute::Rustup)),
            "debian" => Ok(Some(WasmRoute::Debian)),
            other => bail!("{ROUTE_ENV}={other:?}: expected `rustup` or `debian`"),
        },
        Err(err) => Err(err).with_context(|| format!("reading {ROUTE_ENV}")),
    }
}

/// `rustup` for the toolchain cargo would use here (rust-toolchain files, RUSTUP_TOOLCHAIN).
fn rustup() -> Command {
    let mut command = Command::new("rustup");
    command.current_dir(cmd::project_root());
    command
}

/// True if the active rustup toolchain has `target`, adding it if needed.
pub fn rustup_target_available(target: &str) -> Result<bool> {
    let Some(installed) = cmd::probe(rustup().args(["target", "list", "--installed"])) else {
        note("rustup not found (or not working)");
        return Ok(false);
    };
    if installed.lines().any(|line| line.trim() == target) {
        note(format!("rustup: {target} already installed"));
        return Ok(true);
    }
    step(format!("adding {target} with rustup"));
    match cmd::run_with_timeout(rustup().args(["target", "add", target]), RUSTUP_ADD_LIMIT)? {
        Outcome::Succeeded => Ok(true),
        Outcome::Failed => {
            note("rustup target add failed");
            Ok(false)
        }
        Outcome::TimedOut => {
            note(format!(
                "rustup target add gave no answer within {} s; stopped it",
                RUSTUP_ADD_LIMIT.as_secs()
            ));
            Ok(false)
        }
    }
}

/// Debian's `rustc-web` with the std sources (and lld for wasm32), installed if missing.
pub fn ensure_debian_toolchain() -> Result<()> {
    step("checking Debian's Rust toolchain (rustc-web, rust-web-src, lld)");
    match debian_toolchain_gap() {
        None => {
            note(format!(
                "already installed: {}",
                debian_rustc_version().unwrap_or_default()
            ));
            return Ok(());
        }
        Some(gap) => note(gap),
    }
    apt::install(DEBIAN_PACKAGES)?;
    if let Some(gap) = debian_toolchain_gap() {
        bail!("Debian's Rust toolchain is still unusable after installing it: {gap}");
    }
    note(format!(
        "installed: {}",
        debian_rustc_version().unwrap_or_default()
    ));
    Ok(())
}

/// What is missing from the Debian toolchain, if anything.
fn debian_toolchain_gap() -> Option<String> {
    for tool in [DEBIAN_RUSTC, DEBIAN_CARGO, DEBIAN_LLD] {
        if !cmd::is_executable(Path::new(tool)) {
            return Some(format!("{tool} is missing"));
        }
    }
    let version = debian_rustc_version();
    match version.as_deref().and_then(parse_rustc_version) {
        Some(found) if found >= DEBIAN_MIN_RUSTC => {}
        _ => {
            let (major, minor) = DEBIAN_MIN_RUSTC;
            return Some(format!(
                "{DEBIAN_RUSTC} is {}, need {major}.{minor} or newer",
                version.unwrap_or_else(|| "not runnable".to_owned())
            ));
        }
    }
    // -Zbuild-std compiles std from here; rust-web-src provides it.
    let sysroot = cmd::probe(Command::new(DEBIAN_RUSTC).args(["--print", "sysroot"]))?;
    let library = Path::new(sysroot.trim()).join("lib/rustlib/src/rust/library");
    if !library.join("std").is_dir() {
        return Some(format!("std sources missing at {}", library.display()));
    }
    None
}

fn debian_rustc_version() -> Option<String> {
    cmd::probe(Command::new(DEBIAN_RUSTC).arg("--version")).map(|v| v.trim().to_owned())
}

/// `rustc 1.96.0 (...)` -> `(1, 96)`.
fn parse_rustc_version(version: &str) -> Option<(u32, u32)> {
    let number = version.split_whitespace().nth(1)?;
    let mut parts = number.split(['.', '-']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// Debian's cargo, made immune to rustup: rustup's `cargo`/`rustc` proxies come first on PATH
/// and honour RUSTUP_TOOLCHAIN and rust-toolchain files, so every tool is named by full path.
pub fn debian_cargo() -> Command {
    let mut command = Command::new(DEBIAN_CARGO);
    let path = std::env::var("PATH").unwrap_or_default();
    command
        .current_dir(cmd::project_root())
        .env("PATH", format!("/usr/bin:{path}"))
        .env("RUSTC", DEBIAN_RUSTC)
        .env("RUSTDOC", "/usr/bin/rustdoc")
        // -Zbuild-std is unstable; Debian ships a stable compiler.
        .env("RUSTC_BOOTSTRAP", "1")
        // Set by rustup's proxy around `cargo xtask`; it would steer any nested proxy call.
        .env_remove("RUSTUP_TOOLCHAIN")
        // Set by the outer cargo to itself (rustup's cargo 1.9x).
        .env_remove("CARGO");
    command
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_rustc_versions() {
        assert_eq!(
            parse_rustc_version("rustc 1.96.0 (abc 2026-05-01)"),
            Some((1, 96))
        );
        assert_eq!(
            parse_rustc_version("rustc 1.97.0-nightly (x)"),
            Some((1, 97))
        );
        assert_eq!(parse_rustc_version("garbage"), None);
    }
}
