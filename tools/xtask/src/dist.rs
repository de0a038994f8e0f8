//! `cargo xtask build`: the deliverables, gathered in `target/dist/` (their OCI images, in
//! `target/dist/oci/`, are `images.rs`'s).

use std::path::PathBuf;

use anyhow::{Context, Result};
use sluice_harness::cmd::{self, step};

use crate::dashboard;
use crate::toolchain::WasmRoute;

const FILTER_PACKAGE: &str = "sluice-filter";
const FILTER_ARTEFACT: &str = "sluice_filter.wasm";
pub const SLUICE_PACKAGE: &str = "sluice-cli";
pub const ADMIN_BINARY: &str = "sluice";

/// Absolute paths of the built deliverables.
#[derive(Debug, Clone)]
pub struct Dist {
    pub filter_wasm: PathBuf,
    pub sluice_bin: PathBuf,
}

pub fn dist_dir() -> PathBuf {
    cmd::project_root().join("target").join("dist")
}

/// Builds the filter (wasm32, release), the dashboard (wasm32, into `dashboard/dist/`, which
/// the binary embeds) and the `sluice` binary (host, release) into `target/dist/`. Cargo
/// itself makes this incremental.
pub fn build() -> Result<Dist> {
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
    dashboard::build(route).context("building the dashboard")?;

    step(format!("building {SLUICE_PACKAGE} (release)"));
    let mut build = cmd::cargo();
    build.args([
        "build",
        "--release",
        "--package",
        SLUICE_PACKAGE,
        "--bin",
        ADMIN_BINARY,
    ]);
    let binary = cmd::cargo_build_artefact(&mut build, ADMIN_BINARY)
        .with_context(|| format!("building {SLUICE_PACKAGE}"))?;
    let sluice_bin = dist_dir().join(ADMIN_BINARY);
    cmd::copy_file(&binary, &sluice_bin)?;

    Ok(Dist {
        filter_wasm,
        sluice_bin,
    })
}
