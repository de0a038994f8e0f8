//! `cargo xtask build`: the deliverables, gathered in `target/dist/` (their OCI images, in
//! `target/dist/oci/`, are `images.rs`'s).

use std::path::PathBuf;

use anyhow::{Context, Result};
use sluice_harness::cmd::{self, step};

use crate::dashboard;
use crate::toolchain::WasmRoute;

pub const FILTER_PACKAGE: &str = "sluice-filter";
pub const FILTER_ARTEFACT: &str = "sluice_filter.wasm";
pub const SLUICE_PACKAGE: &str = "sluice-cli";
pub const SLUICE_BINARY: &str = "sluice";

/// How the host binaries (`sluice`, and the static one in the server image) are compiled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// What ships: `cargo xtask build`, the demo and the benchmarks.
    Release,
    /// What the suite tests: the `dev` profile, whose dependencies are compiled once for
    /// the unit tests and the binary alike (and optimised: `opt-level = 2` for every
    /// dependency in the workspace's `Cargo.toml`). The same code as a release build,
    /// without a second compilation of the whole dependency tree under another profile.
    Test,
}

impl Profile {
    /// The cargo flags that select the profile.
    pub fn cargo_args(self) -> &'static [&'static str] {
        match self {
            Profile::Release => &["--release"],
            Profile::Test => &[],
        }
    }

    /// The dashboard's cargo profile: the shipped bundle, or one built quickly for tests.
    pub fn dashboard_profile(self) -> &'static str {
        match self {
            Profile::Release => dashboard::PROFILE,
            Profile::Test => dashboard::TEST_PROFILE,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Profile::Release => "release",
            Profile::Test => "dev",
        }
    }
}

/// Absolute paths of the built deliverables.
#[derive(Debug, Clone)]
pub struct Dist {
    pub filter_wasm: PathBuf,
    pub sluice_bin: PathBuf,
}

pub fn dist_dir() -> PathBuf {
    cmd::project_root().join("target").join("dist")
}

/// Builds the filter (wasm32, release: what Envoy runs is always the optimised module), the
/// dashboard (wasm32, into `dashboard/dist/`, which a release binary embeds and a dev binary
/// reads at run time) and the `sluice` binary (host, in `profile`) into `target/dist/`.
/// Cargo itself makes this incremental.
pub fn build(profile: Profile) -> Result<Dist> {
    let route = WasmRoute::select()?;

    step(format!(
        "building {FILTER_PACKAGE} (release, {route} route)"
    ));
    let wasm = route
        .build_release(FILTER_PACKAGE, FILTER_ARTEFACT)
        .with_context(|| format!("building {FILTER_PACKAGE} for wasm32"))?;
    let filter_wasm = dist_dir().join(FILTER_ARTEFACT);
    cmd::copy_file(&wasm, &filter_wasm)?;

    // Before the binary: it embeds the dashboard's files.
    dashboard::build(route, profile.dashboard_profile()).context("building the dashboard")?;

    step(format!("building {SLUICE_PACKAGE} ({})", profile.name()));
    let mut build = cmd::cargo();
    crate::clippy::while_building(&mut build)
        .arg("build")
        .args(profile.cargo_args())
        .args(["--package", SLUICE_PACKAGE, "--bin", SLUICE_BINARY]);
    let binary = cmd::cargo_build_artefact(&mut build, SLUICE_BINARY)
        .with_context(|| format!("building {SLUICE_PACKAGE}"))?;
    let sluice_bin = dist_dir().join(SLUICE_BINARY);
    cmd::copy_file(&binary, &sluice_bin)?;

    Ok(Dist {
        filter_wasm,
        sluice_bin,
    })
}
