//! The API contract check of `cargo xtask test`: schemathesis, from PyPI in the project's
//! `.venv/`, fuzzes a real `sluice serve` (release build, fresh SQLite file) from its own
//! `/api/v1/openapi.json`, with every check on: responses must match the document (status
//! codes, headers, bodies, content types), requests the document allows must be accepted
//! and requests it forbids refused, and no answer may be a server error.
//!
//! The run is reproducible and bounded: a fixed seed, a fixed number of examples per
//! operation, and a time limit. The few allowances (answers to requests that break a rule
//! JSON Schema cannot state) are in `tests/schemathesis/schemathesis.toml`, each with its
//! reason.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use sluice_harness::cmd::{self, Outcome, note, step};
use sluice_harness::serve::{ADMIN_TOKEN, AdminApi, Serve};

use crate::envoy;

/// Pinned, so that a new release's new checks show up as a deliberate upgrade rather than
/// as a red suite on an unchanged tree.
const REQUIREMENT: &str = "schemathesis==4.32.5";
const VERSION: &str = "4.32.5";
/// Same examples every run; change it to explore, and fix what a new seed finds.
const SEED: &str = "1";
/// Examples per operation and phase. About 3,000 requests in all, ~1.5 min here.
const MAX_EXAMPLES: &str = "30";
/// Far above a run's length; a hung server must not hang the suite.
const TIME_LIMIT: Duration = Duration::from_secs(15 * 60);
/// The variable the config file reads the admin token from.
const TOKEN_ENV: &str = "SLUICE_SCHEMATHESIS_TOKEN";

/// Runs the contract check against the `sluice` binary at `sluice`.
pub fn check_contract(sluice: &Path) -> Result<()> {
    let schemathesis = ensure_installed()?;
    let config = cmd::project_root()
        .join("tests")
        .join("schemathesis")
        .join("schemathesis.toml");
    let dir = cmd::project_root()
        .join("target")
        .join("tmp")
        .join(format!("schemathesis-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut serve = Serve::new(
        sluice.to_path_buf(),
        format!("sqlite://{}", dir.join("sluice.db").display()),
    );
    // schemathesis sends wrong tokens on purpose (its authentication checks): a limit of 10
    // would answer the rest of the run 429 (the limit itself is tested in
    // admin-api/tests/api.rs).
    serve.flags = vec!["--auth-failures".into(), "1000000".into()];
    step("API contract: schemathesis against `sluice serve` (SQLite)");
    let server = AdminApi::start(&serve)?;
    note(format!("sluice serve at {}", server.url()));
    let mut run = Command::new(&schemathesis);
    run.arg("--config-file")
        .arg(&config)
        .arg("run")
        .arg(format!("{}/api/v1/openapi.json", server.url()))
        .args(["--checks", "all"])
        .args(["--seed", SEED])
        .args(["--max-examples", MAX_EXAMPLES])
        // No example database: each run starts from the seed alone.
        .args(["--generation-database", "none"])
        .args(["--no-color", "--output-truncate", "false"])
        .current_dir(&dir)
        .env(TOKEN_ENV, ADMIN_TOKEN);
    let outcome = cmd::run_with_timeout(&mut run, TIME_LIMIT)?;
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
    match outcome {
        Outcome::Succeeded => Ok(()),
        Outcome::Failed => bail!(
            "schemathesis found the server and its OpenAPI document disagreeing (above); reproduce with the printed curl or `st replay` commands"
        ),
        Outcome::TimedOut => bail!("schemathesis did not finish within {TIME_LIMIT:?}"),
    }
}

/// The `schemathesis` command in `.venv/`, installed at [`VERSION`] if it is not.
fn ensure_installed() -> Result<PathBuf> {
    let python = envoy::project_python()?;
    let command = python.with_file_name("schemathesis");
    let installed = cmd::probe(Command::new(&command).arg("--version"));
    if installed.as_deref().is_some_and(|v| v.contains(VERSION)) {
        note(format!("{REQUIREMENT} already installed in .venv"));
        return Ok(command);
    }
    envoy::pip_install(&python, REQUIREMENT)?;
    if !cmd::is_executable(&command) {
        bail!(
            "{REQUIREMENT} installed, but {} is missing",
            command.display()
        );
    }
    Ok(command)
}
