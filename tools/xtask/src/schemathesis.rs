//! The API contract check of `cargo xtask test`: schemathesis, from PyPI in the project's
//! `.venv/`, fuzzes a real `sluice serve` (release build, fresh SQLite file) from its own
//! `/api/v1/openapi.json`, with every check on: responses must match the document (status
//! codes, headers, bodies, content types), requests the document allows must be accepted
//! and requests it forbids refused, and no answer may be a server error.
//!
//! The run is reproducible and bounded: a few fixed seeds run at once, each against its own
//! fresh server (so a seed's failure is reproduced by that seed alone), a fixed number of
//! examples per operation, and a time limit. The few allowances (answers to requests that
//! break a rule JSON Schema cannot state) are in `tests/schemathesis/schemathesis.toml`,
//! each with its reason.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use sluice_harness::cmd::{self, Outcome, note, step};
use sluice_harness::serve::{ADMIN_TOKEN, AdminApi, Serve};

use crate::envoy;

/// Pinned, so that a new release's new checks show up as a deliberate upgrade rather than
/// as a red suite on an unchanged tree.
const REQUIREMENT: &str = "schemathesis==4.32.5";
const VERSION: &str = "4.32.5";
/// Same examples every run, different ones per seed: one seed alone left disagreements an
/// independent fuzzer found with others. Change them to explore, and fix what a new seed
/// finds.
const SEEDS: [u64; 3] = [1, 7, 42];
/// Examples per operation and phase, for each seed (the long poll takes fewer, see the
/// config file): about 5,800 requests in all, 4,700 of them the first seed's coverage
/// phase; ~1.5 to 2 min here, as one seed at 30 examples took.
const MAX_EXAMPLES: &str = "10";
/// The phases of the first seed. The coverage phase derives its requests from the
/// document's bounds, not from the seed, so the later seeds skip it.
const ALL_PHASES: &str = "examples,coverage,fuzzing,stateful";
const SEEDED_PHASES: &str = "examples,fuzzing,stateful";
/// Far above a seed's run; a hung server must not hang the suite.
const TIME_LIMIT: Duration = Duration::from_secs(10 * 60);
/// The variable the config file reads the admin token from.
const TOKEN_ENV: &str = "SLUICE_SCHEMATHESIS_TOKEN";

/// Runs the contract check against the `sluice` binary at `sluice`, once per seed, the
/// seeds at once (each against its own server; the first seed's coverage phase is most of
/// the work, so the others finish within it); every seed runs, and the check fails if any
/// of them found a disagreement. Each seed's output goes to its own log, shown in full
/// when the seed failed and as its closing lines when it passed.
pub fn check_contract(sluice: &Path) -> Result<()> {
    let schemathesis = ensure_installed()?;
    let config = cmd::project_root()
        .join("tests")
        .join("schemathesis")
        .join("schemathesis.toml");
    step(format!(
        "API contract: schemathesis against `sluice serve` (SQLite), seeds {SEEDS:?} at once"
    ));
    let started = Instant::now();
    let runs: Vec<(u64, Result<SeedRun>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = SEEDS
            .into_iter()
            .enumerate()
            .map(|(i, seed)| {
                let phases = if i == 0 { ALL_PHASES } else { SEEDED_PHASES };
                let (schemathesis, config) = (&schemathesis, &config);
                let run = scope.spawn(move || run_seed(sluice, schemathesis, config, seed, phases));
                (seed, run)
            })
            .collect();
        handles
            .into_iter()
            .map(|(seed, run)| {
                let result = run
                    .join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("seed {seed}'s thread panicked")));
                (seed, result)
            })
            .collect()
    });
    let mut failed = Vec::new();
    for (seed, run) in runs {
        let run = run.with_context(|| format!("schemathesis, seed {seed}"))?;
        let log = std::fs::read_to_string(&run.log).unwrap_or_default();
        match run.outcome {
            Outcome::Succeeded => {
                note(format!(
                    "seed {seed}: passed in {:.0} s ({}); its last lines:",
                    run.took.as_secs_f64(),
                    run.log.display()
                ));
                let lines: Vec<&str> = log.lines().collect();
                for line in &lines[lines.len().saturating_sub(SHOWN_LINES)..] {
                    println!("      {line}");
                }
            }
            Outcome::Failed => {
                note(format!("seed {seed}: FAILED; its whole output:"));
                println!("{log}");
                failed.push(seed);
            }
            Outcome::TimedOut => {
                bail!("schemathesis (seed {seed}) did not finish within {TIME_LIMIT:?}")
            }
        }
    }
    note(format!(
        "every seed done in {:.0} s",
        started.elapsed().as_secs_f64()
    ));
    if !failed.is_empty() {
        bail!(
            "schemathesis found the server and its OpenAPI document disagreeing with seed(s) {failed:?} (above); reproduce with the printed curl or `st replay` commands, or the same command line against a fresh server"
        );
    }
    Ok(())
}

/// Lines of a passing seed's output shown in the suite's output (its summary).
const SHOWN_LINES: usize = 12;

/// How one seed's run ended, and where its output is.
struct SeedRun {
    outcome: Outcome,
    took: Duration,
    log: PathBuf,
}

/// One seed's run against its own `sluice serve` on a fresh SQLite file.
fn run_seed(
    sluice: &Path,
    schemathesis: &Path,
    config: &Path,
    seed: u64,
    phases: &str,
) -> Result<SeedRun> {
    let started = Instant::now();
    let tmp = cmd::project_root().join("target").join("tmp");
    let dir = tmp.join(format!("schemathesis-{}-{seed}", std::process::id()));
    let log = tmp.join(format!("schemathesis-seed-{seed}.log"));
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
    let server = AdminApi::start(&serve)?;
    note(format!("sluice serve at {}", server.url()));
    let mut run = Command::new(schemathesis);
    run.arg("--config-file")
        .arg(config)
        .arg("run")
        .arg(format!("{}/api/v1/openapi.json", server.url()))
        .args(["--checks", "all"])
        .args(["--seed", &seed.to_string()])
        .args(["--max-examples", MAX_EXAMPLES])
        .args(["--phases", phases])
        // No example database: each run starts from the seed alone.
        .args(["--generation-database", "none"])
        .args(["--no-color", "--output-truncate", "false"])
        .current_dir(&dir)
        .env(TOKEN_ENV, ADMIN_TOKEN);
    let output =
        std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    run.stdout(output.try_clone()?).stderr(output);
    let outcome = cmd::run_with_timeout(&mut run, TIME_LIMIT);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(SeedRun {
        outcome: outcome?,
        took: started.elapsed(),
        log,
    })
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
