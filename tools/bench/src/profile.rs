//! Where the core's per-request time goes: `core/examples/hot_path.rs` timed natively and
//! run under `valgrind --tool=callgrind`.
//!
//! Built with symbols and without LTO (in its own target directory, so the release build
//! of the deliverables is untouched): inlining then still hides small functions inside
//! their callers, but the crate boundaries and the big costs stay visible.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::{Value, json};
use sluice_harness::cmd::{self, Outcome, note, step};

const EXAMPLE: &str = "hot_path";
/// Native timing iterations per scenario.
const TIMING_ITERATIONS: &str = "1000000";
/// Iterations under callgrind (about 50 times slower than native).
const CALLGRIND_ITERATIONS: &str = "200000";
const CALLGRIND_LIMIT: Duration = Duration::from_secs(300);
/// Functions listed per scenario.
const TOP: usize = 15;

#[derive(Debug, Clone)]
pub struct ProfileResults {
    /// `hot_path all` output: native ns per request for each scenario, by stage.
    pub timing: Vec<String>,
    pub callgrind: Vec<ScenarioProfile>,
    pub commands: Vec<String>,
    /// Why callgrind was skipped, if it was.
    pub skipped: Option<String>,
}

/// Callgrind's view of one scenario.
#[derive(Debug, Clone)]
pub struct ScenarioProfile {
    pub scenario: String,
    /// The top functions by exclusive instructions (where the instructions execute).
    pub exclusive: Vec<String>,
    /// The project's own functions (and the few library ones that matter) by inclusive
    /// instructions: which part of the request's work the time belongs to.
    pub inclusive: Vec<String>,
}

impl ProfileResults {
    pub fn to_json(&self) -> Value {
        json!({
            "native_timing": self.timing,
            "callgrind": self.callgrind.iter().map(|p| json!({
                "scenario": p.scenario,
                "top_exclusive": p.exclusive,
                "inclusive": p.inclusive,
            })).collect::<Vec<_>>(),
            "commands": self.commands,
            "skipped": self.skipped,
        })
    }
}

pub fn run(dir: &std::path::Path) -> Result<ProfileResults> {
    step("profiling the core's hot path (native harness, callgrind)");
    let mut build = cmd::cargo();
    build
        .args([
            "build",
            "--release",
            "--package",
            "sluice-core",
            "--example",
            EXAMPLE,
        ])
        .arg("--target-dir")
        .arg(cmd::project_root().join("target").join("bench-profile"))
        .env("CARGO_PROFILE_RELEASE_DEBUG", "line-tables-only")
        .env("CARGO_PROFILE_RELEASE_STRIP", "none")
        .env("CARGO_PROFILE_RELEASE_LTO", "off")
        .env("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "16");
    let mut commands = vec![cmd::display(&build)];
    let binary: PathBuf =
        cmd::cargo_build_artefact(&mut build, EXAMPLE).context("building the hot-path harness")?;

    let mut timing_cmd = Command::new(&binary);
    timing_cmd.args(["all", TIMING_ITERATIONS]);
    commands.push(cmd::display(&timing_cmd));
    let timing: Vec<String> = cmd::output(&mut timing_cmd)?
        .lines()
        .map(str::to_string)
        .collect();
    for line in &timing {
        note(line);
    }

    let Some(valgrind) = cmd::which("valgrind") else {
        return Ok(ProfileResults {
            timing,
            callgrind: Vec::new(),
            commands,
            skipped: Some("valgrind is not installed (apt-get install valgrind)".into()),
        });
    };
    let mut callgrind = Vec::new();
    for scenario in ["d", "f", "g"] {
        let out = dir.join(format!("callgrind.{scenario}.out"));
        let mut run = Command::new(&valgrind);
        run.arg("--tool=callgrind")
            .arg(format!("--callgrind-out-file={}", out.display()))
            .arg(&binary)
            .args([scenario, CALLGRIND_ITERATIONS, "whole"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        commands.push(cmd::display(&run));
        if cmd::run_with_timeout(&mut run, CALLGRIND_LIMIT)? != Outcome::Succeeded {
            note(format!(
                "callgrind on scenario {scenario} did not finish; skipped"
            ));
            continue;
        }
        let mut exclusive = Command::new("callgrind_annotate");
        exclusive.arg("--inclusive=no").arg(&out);
        let exclusive = top_functions(&cmd::probe(&mut exclusive).unwrap_or_default(), TOP);
        let mut inclusive = Command::new("callgrind_annotate");
        inclusive.arg("--inclusive=yes").arg(&out);
        let inclusive = parts(&cmd::probe(&mut inclusive).unwrap_or_default(), TOP);
        for line in &inclusive {
            note(format!("({scenario}) {line}"));
        }
        callgrind.push(ScenarioProfile {
            scenario: scenario.to_string(),
            exclusive,
            inclusive,
        });
    }
    Ok(ProfileResults {
        timing,
        callgrind,
        commands,
        skipped: None,
    })
}

/// The first `n` function lines of `callgrind_annotate` (`  1,234 (12.3%)  file:function`),
/// shortened to `12.3%  function`.
fn top_functions(annotate: &str, n: usize) -> Vec<String> {
    annotate
        .lines()
        .filter_map(|line| {
            let line = line.trim();
            let open = line.find('(')?;
            let close = line.find("%)")?;
            let percent = line.get(open + 1..close)?.trim();
            percent.parse::<f64>().ok()?;
            let rest = line.get(close + 2..)?.trim();
            // `file:function [binary]`: keep the function.
            let function = rest
                .split_once(':')
                .map_or(rest, |(_, f)| f)
                .trim_end_matches(|c: char| c != ']' && c != ')' && !c.is_alphanumeric())
                .trim();
            let function = function
                .rsplit_once(" [")
                .map_or(function, |(f, _)| f)
                .trim();
            if function.is_empty() || rest.starts_with("PROGRAM TOTALS") {
                return None;
            }
            Some(format!("{percent:>5}%  {}", shorten(function)))
        })
        .take(n)
        .collect()
}

/// From `callgrind_annotate --inclusive=yes`: the whole-function lines (those naming the
/// binary) of the project's code and the library functions that show up in its hot path,
/// each once, highest first.
fn parts(annotate: &str, n: usize) -> Vec<String> {
    const INTERESTING: [&str; 5] = [
        "sluice_core::",
        "hot_path::main",
        "Clone>::clone",
        "serde_json::value::Value as core::fmt::Display",
        "alloc::fmt::format",
    ];
    let mut seen = std::collections::HashSet::new();
    top_functions(
        &annotate
            .lines()
            .filter(|l| l.trim_end().ends_with(']'))
            .filter(|l| INTERESTING.iter().any(|i| l.contains(i)))
            .collect::<Vec<_>>()
            .join("\n"),
        usize::MAX,
    )
    .into_iter()
    .filter(|line| seen.insert(line.split_once('%').map_or("", |(_, f)| f).to_string()))
    .take(n)
    .collect()
}

/// Drops hash suffixes and long generic paths: `<a::B as c::D>::e::h1234` -> `<B as D>::e`.
fn shorten(function: &str) -> String {
    let without_hash = match function.rsplit_once("::h") {
        Some((head, hash)) if hash.len() == 16 && hash.chars().all(|c| c.is_ascii_hexdigit()) => {
            head
        }
        _ => function,
    };
    let mut out = without_hash.to_string();
    if out.len() > 110 {
        out.truncate(107);
        out.push_str("...");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn callgrind_annotate_lines_become_short_function_lines() {
        let text = "\
--------------------------------------------------------------------------------
Ir
--------------------------------------------------------------------------------
1,000,000 (100.0%)  PROGRAM TOTALS

--------------------------------------------------------------------------------
Ir                  file:function
--------------------------------------------------------------------------------
250,000 (25.00%)  ./malloc/malloc.c:_int_malloc [/usr/lib/x86_64-linux-gnu/libc.so.6]
120,000 (12.00%)  core/src/limiter.rs:sluice_core::limiter::SlotTable::acquire::h0123456789abcdef [/x/hot_path]
";
        let top = top_functions(text, 5);
        assert_eq!(
            top,
            [
                "25.00%  _int_malloc",
                "12.00%  sluice_core::limiter::SlotTable::acquire"
            ]
        );
    }
}
