//! `cargo xtask fuzz`: cargo-fuzz (libFuzzer, AddressSanitizer) on every decoder of
//! untrusted bytes and on the per-request decision, for a duration per target; and the
//! suite's fuzz step, the corpus test of `sluice-fuzz-targets`.
//!
//! The targets' bodies are plain functions in `tools/fuzz-targets/` (`sluice-fuzz-targets`,
//! a main-workspace crate). libFuzzer runs them through one shell per target in
//! `tools/fuzz/` (its own workspace, so the instrumented build never touches the main
//! one), where `tools/fuzz/corpus/<target>/` holds the committed seeds. Each libFuzzer run
//! starts from the seeds plus what earlier runs on this machine found, kept in
//! `tools/fuzz/target/corpus/<target>/` (git-ignored), so the committed corpus stays small
//! and unchanged. The suite does not build the instrumented targets: it replays the seeds
//! and fuzzes each target briefly with the corpus test's own mutator (`suite_run`).
//! Fuzzing always runs for a duration, never a number of inputs: the number of inputs a
//! second differs tenfold between machines and between targets.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Args;
use sluice_harness::cmd::{self, note, step};

use crate::libtest::{self, TestCounts};

/// Seconds of mutations per target in `cargo xtask test`, after its corpus: fourteen
/// targets, two at a time, in about fifteen seconds once built.
pub const SUITE_SECONDS: u64 = 2;

/// The crate of the targets' bodies, whose corpus test is the suite's fuzz step.
const TARGETS_PACKAGE: &str = "sluice-fuzz-targets";

/// The cargo-fuzz project (the libFuzzer shells and the corpus), from the project root.
const FUZZ_DIR: &str = "tools/fuzz";

/// An input that runs this long is reported as a hang (libFuzzer's `timeout-*`
/// artifact): nothing a proxy decodes may take seconds.
const INPUT_TIMEOUT_SECONDS: u64 = 20;

#[derive(Debug, Args)]
pub struct FuzzArgs {
    /// How long to fuzz each target, in seconds.
    #[arg(long, default_value_t = 60)]
    pub seconds: u64,

    /// Targets to fuzz (all when none are given); `cargo fuzz list --fuzz-dir tools/fuzz`
    /// names them.
    #[arg(value_name = "TARGET")]
    pub targets: Vec<String>,
}

/// `cargo xtask fuzz`.
pub fn fuzz(args: &FuzzArgs) -> Result<()> {
    run(args.seconds, &args.targets)
}

/// The suite's fuzz step: `cargo test -p sluice-fuzz-targets`, whose corpus test replays
/// every committed corpus file of every target and then feeds it seeded mutations for
/// [`SUITE_SECONDS`] (`SLUICE_FUZZ_SECONDS`), with its tests added to `counts`. No
/// instrumented build: that is `cargo xtask fuzz`.
pub fn suite_run(counts: &mut TestCounts) -> Result<()> {
    step(format!(
        "fuzz targets: committed corpus, then {SUITE_SECONDS} s of mutations per target \
         (cargo test -p {TARGETS_PACKAGE})"
    ));
    libtest::run_tests(
        crate::clippy::while_building(&mut cmd::cargo())
            .args(["test", "--package", TARGETS_PACKAGE])
            .env("SLUICE_FUZZ_SECONDS", SUITE_SECONDS.to_string()),
        counts,
    )
}

/// libFuzzer on `wanted` (every target when empty) for `seconds` each.
fn run(seconds: u64, wanted: &[String]) -> Result<()> {
    if seconds == 0 {
        bail!("--seconds must be at least 1");
    }
    ensure_cargo_fuzz()?;
    let targets = select_targets(wanted)?;

    step(format!("building {} fuzz targets", targets.len()));
    let started = Instant::now();
    cmd::run(&mut cargo_fuzz("build"))?;
    note(format!("built in {:.1} s", started.elapsed().as_secs_f64()));

    let mut results = Vec::new();
    for target in &targets {
        step(format!("fuzzing {target} for {seconds} s"));
        let result = fuzz_target(target, seconds)?;
        note(result.summary());
        results.push(result);
    }

    step(format!("fuzz results ({seconds} s per target)"));
    for result in &results {
        note(format!("{:<18} {}", result.target, result.summary()));
    }
    let failed: Vec<&TargetRun> = results.iter().filter(|r| !r.passed()).collect();
    if failed.is_empty() {
        return Ok(());
    }
    for result in &failed {
        step(format!("{}: {}", result.target, result.summary()));
        for line in &result.failure_excerpt {
            note(line);
        }
        if let Some(artifact) = &result.artifact {
            note(format!(
                "reproduce: RUSTC_BOOTSTRAP=1 cargo fuzz run --fuzz-dir {FUZZ_DIR} {} {}",
                result.target,
                artifact.display()
            ));
            note(format!(
                "minimise:  RUSTC_BOOTSTRAP=1 cargo fuzz tmin --fuzz-dir {FUZZ_DIR} {} {}",
                result.target,
                artifact.display()
            ));
        }
    }
    let names: Vec<&str> = failed.iter().map(|r| r.target.as_str()).collect();
    bail!("fuzzing failed: {}", names.join(", "))
}

/// `cargo fuzz SUBCOMMAND --fuzz-dir tools/fuzz`, run from the project root.
///
/// cargo-fuzz builds with `-Zsanitizer=address`: AddressSanitizer is still unstable in
/// rustc, and the project builds with the stable toolchain alone (a CI machine may have no
/// other). `RUSTC_BOOTSTRAP=1` lets stable rustc accept the flag. It is worth having: the
/// YAML parser the rules file target reaches is unsafe-libyaml, a C library translated to
/// unsafe Rust. The variable only affects this build, which has its own workspace and
/// target directory (`tools/fuzz/target/`), never the product's: a target directory set
/// for the main workspace (`CARGO_TARGET_DIR`, shared between checkouts) is not passed on,
/// or the instrumented build would land there.
fn cargo_fuzz(subcommand: &str) -> Command {
    let mut cmd = cmd::cargo();
    cmd.args(["fuzz", subcommand, "--fuzz-dir", FUZZ_DIR])
        .env("RUSTC_BOOTSTRAP", "1")
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_BUILD_TARGET_DIR");
    cmd
}

/// Installs cargo-fuzz from crates.io unless it is already there.
fn ensure_cargo_fuzz() -> Result<()> {
    step("cargo-fuzz");
    if let Some(version) = cmd::probe(cmd::cargo().args(["fuzz", "--version"])) {
        note(format!("already installed: {}", version.trim()));
        return Ok(());
    }
    note("not installed: installing it from crates.io (cargo install cargo-fuzz --locked)");
    cmd::run(cmd::cargo().args(["install", "cargo-fuzz", "--locked"]))
}

/// The targets to run: those asked for, checked against what `tools/fuzz/` defines, or all.
fn select_targets(wanted: &[String]) -> Result<Vec<String>> {
    let listed = cmd::output(&mut cargo_fuzz("list"))?;
    let known: Vec<String> = listed
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect();
    if known.is_empty() {
        bail!("`cargo fuzz list` found no fuzz targets");
    }
    if wanted.is_empty() {
        return Ok(known);
    }
    let unknown: Vec<&str> = wanted
        .iter()
        .filter(|w| !known.contains(w))
        .map(String::as_str)
        .collect();
    if !unknown.is_empty() {
        bail!(
            "unknown fuzz target(s): {} (known: {})",
            unknown.join(", "),
            known.join(", ")
        );
    }
    Ok(wanted.to_vec())
}

/// What one target's run did.
#[derive(Debug, Clone, PartialEq)]
struct TargetRun {
    target: String,
    /// Inputs executed, as libFuzzer's final statistics count them.
    runs: Option<u64>,
    seconds: f64,
    /// Whether libFuzzer exited successfully (no crash, hang, leak or out-of-memory).
    succeeded: bool,
    /// The input that failed, as libFuzzer saved it.
    artifact: Option<PathBuf>,
    /// The lines that say what went wrong, for the summary.
    failure_excerpt: Vec<String>,
}

impl TargetRun {
    fn passed(&self) -> bool {
        self.succeeded && self.artifact.is_none()
    }

    fn summary(&self) -> String {
        let runs = match self.runs {
            Some(runs) => format!(
                "{runs:>11} runs ({:.0}/s)",
                runs as f64 / self.seconds.max(0.001)
            ),
            None => format!("{:>11} runs", "?"),
        };
        let verdict = match (&self.artifact, self.succeeded) {
            (Some(artifact), _) => format!("CRASH, input saved as {}", artifact.display()),
            (None, true) => "no crash".to_string(),
            (None, false) => "FAILED without saving an input (see the log above)".to_string(),
        };
        format!("{runs}  {verdict}")
    }
}

fn fuzz_target(target: &str, seconds: u64) -> Result<TargetRun> {
    let root = cmd::project_root();
    // libFuzzer adds what it finds to the first folder and only reads the others.
    let fuzz_dir = root.join(FUZZ_DIR);
    let grown = fuzz_dir.join("target/corpus").join(target);
    let seeds = fuzz_dir.join("corpus").join(target);
    std::fs::create_dir_all(&grown).with_context(|| format!("creating {}", grown.display()))?;
    let mut cmd = cargo_fuzz("run");
    cmd.arg(target)
        .arg(&grown)
        .arg(&seeds)
        .arg("--")
        .arg(format!("-max_total_time={seconds}"))
        .arg(format!("-timeout={INPUT_TIMEOUT_SECONDS}"))
        .arg("-print_final_stats=1");
    note(format!("$ {}", cmd::display(&cmd)));
    let started = Instant::now();
    let out = cmd
        .output()
        .with_context(|| format!("could not start cargo fuzz run {target}"))?;
    let seconds = started.elapsed().as_secs_f64();
    // libFuzzer reports on stderr; stdout carries only what the target prints.
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(parse_run(
        target,
        &log,
        out.status.success(),
        seconds,
        &root,
    ))
}

/// Reads libFuzzer's output: the inputs executed, the saved input of a failure, and the
/// lines that explain it.
fn parse_run(target: &str, log: &str, succeeded: bool, seconds: f64, root: &Path) -> TargetRun {
    let runs = log
        .lines()
        .filter_map(|l| l.trim().strip_prefix("stat::number_of_executed_units:"))
        .filter_map(|n| n.trim().parse().ok())
        .next_back();
    // `cargo fuzz` passes a relative artifact prefix; the saved input is relative to the
    // project root, where it runs.
    let artifact = log
        .lines()
        .filter_map(|l| l.split_once("Test unit written to ").map(|(_, p)| p.trim()))
        .next_back()
        .map(|p| root.join(p));
    let failure_excerpt = if succeeded && artifact.is_none() {
        Vec::new()
    } else {
        excerpt(log)
    };
    TargetRun {
        target: target.to_string(),
        runs,
        seconds,
        succeeded,
        artifact,
        failure_excerpt,
    }
}

/// The first lines of what went wrong: a Rust panic's message, or libFuzzer's or a
/// sanitizer's error, or else the end of the log (a build error, say).
fn excerpt(log: &str) -> Vec<String> {
    const LINES: usize = 12;
    let lines: Vec<&str> = log.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.contains("panicked at") || l.starts_with("=="))
        .unwrap_or_else(|| lines.len().saturating_sub(LINES));
    lines
        .iter()
        .skip(start)
        .take(LINES)
        .map(|l| l.to_string())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLEAN: &str = "\
INFO: Seed: 1234
#2\tINITED cov: 228 ft: 627 corp: 51/10877b exec/s: 0 rss: 43Mb
#1464458\tDONE   cov: 300 ft: 900 corp: 80/12kb lim: 342 exec/s: 133132 rss: 60Mb
Done 1464458 runs in 11 second(s)
stat::number_of_executed_units: 1464458
stat::average_exec_per_sec:     133132
stat::new_units_added:          12
";

    const CRASH: &str = "\
#829\tREDUCE cov: 228 ft: 628 corp: 52/11047b lim: 342 exec/s: 0 rss: 43Mb L: 257/337
thread '<unnamed>' (22916) panicked at /work/main/core/src/gcra.rs:106:26:
attempt to add with overflow
stack backtrace:
==22916== ERROR: libFuzzer: deadly signal
MS: 2 ChangeBit-CopyPart-; base unit: 0000000000000000000000000000000000000000
artifact_prefix='/work/main/tools/fuzz/artifacts/lease_entry/'; Test unit written to tools/fuzz/artifacts/lease_entry/crash-cbc9d4002296ca54f67eec3d35233ef690242b0c
Base64: AQAAAAA=
stat::number_of_executed_units: 837
";

    #[test]
    fn cargo_fuzz_runs_on_tools_fuzz_with_its_own_target_directory() {
        let cmd = cargo_fuzz("list");
        let args: Vec<_> = cmd.get_args().collect();
        assert_eq!(args, ["fuzz", "list", "--fuzz-dir", "tools/fuzz"]);
        let envs: Vec<_> = cmd.get_envs().collect();
        assert!(envs.contains(&("RUSTC_BOOTSTRAP".as_ref(), Some("1".as_ref()))));
        assert!(envs.contains(&("CARGO_TARGET_DIR".as_ref(), None)));
    }

    #[test]
    fn a_clean_run_reports_its_inputs_and_passes() {
        let run = parse_run("slot_value", CLEAN, true, 11.0, Path::new("/repo"));
        assert_eq!(run.runs, Some(1_464_458));
        assert_eq!(run.artifact, None);
        assert!(run.passed());
        assert!(run.failure_excerpt.is_empty());
        assert!(run.summary().contains("1464458 runs (133133/s)  no crash"));
    }

    #[test]
    fn a_crash_names_the_saved_input_and_the_panic() {
        let run = parse_run("lease_entry", CRASH, false, 1.5, Path::new("/repo"));
        assert_eq!(run.runs, Some(837));
        assert_eq!(
            run.artifact,
            Some(PathBuf::from(
                "/repo/tools/fuzz/artifacts/lease_entry/crash-cbc9d4002296ca54f67eec3d35233ef690242b0c"
            ))
        );
        assert!(!run.passed());
        assert!(run.failure_excerpt[0].contains("panicked at /work/main/core/src/gcra.rs"));
        assert_eq!(run.failure_excerpt[1], "attempt to add with overflow");
        assert!(
            run.summary()
                .contains("CRASH, input saved as /repo/tools/fuzz/artifacts/")
        );
    }

    #[test]
    fn a_failure_without_an_input_is_still_a_failure() {
        let log = "error[E0425]: cannot find value `x` in this scope\nerror: could not compile";
        let run = parse_run("decide", log, false, 0.2, Path::new("/repo"));
        assert_eq!((run.runs, run.artifact.as_ref()), (None, None));
        assert!(!run.passed());
        assert_eq!(run.failure_excerpt.len(), 2);
        assert!(run.summary().contains("FAILED without saving an input"));
    }
}
