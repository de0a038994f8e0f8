//! skopeo and Debian's `docker-registry` for the image test (`tests/tests/oci.rs`): tools
//! that share no code with `sluice-oci`, so the test checks the layouts against independent
//! readers. Found on PATH or installed from Debian's packages; the test starts its own
//! registry on loopback.

use std::ffi::OsStr;
use std::path::PathBuf;

use anyhow::{Context, Result};
use sluice_harness::cmd::{self, note, step};
use sluice_harness::{DOCKER_REGISTRY_ENV, SKOPEO_ENV, apt};

const SKOPEO: &str = "skopeo";
const DOCKER_REGISTRY: &str = "docker-registry";

#[derive(Debug, Clone)]
pub struct RegistryTools {
    pub skopeo: PathBuf,
    pub registry: PathBuf,
}

impl RegistryTools {
    /// The environment that tells the tests where the tools are.
    pub fn env(&self) -> [(&'static str, &OsStr); 2] {
        [
            (SKOPEO_ENV, self.skopeo.as_os_str()),
            (DOCKER_REGISTRY_ENV, self.registry.as_os_str()),
        ]
    }
}

/// `skopeo` and `docker-registry`, installing the Debian packages of those missing.
pub fn ensure_tools() -> Result<RegistryTools> {
    step("skopeo and docker-registry for the image test");
    let missing: Vec<&str> = [SKOPEO, DOCKER_REGISTRY]
        .into_iter()
        .filter(|tool| match cmd::which(tool) {
            Some(found) => {
                note(format!("found {}", found.display()));
                false
            }
            None => {
                note(format!("{tool} is not on PATH"));
                true
            }
        })
        .collect();
    if !missing.is_empty() {
        // The packages are named after their programs.
        apt::install(&missing).context("installing the registry tools")?;
    }
    let find = |tool: &str| {
        cmd::which(tool).with_context(|| format!("{tool} was installed but is not on PATH"))
    };
    Ok(RegistryTools {
        skopeo: find(SKOPEO)?,
        registry: find(DOCKER_REGISTRY)?,
    })
}
