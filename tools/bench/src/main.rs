//! `sluice-bench`, run by `cargo xtask bench`: what Sluice costs Envoy, how exactly it
//! limits, and what memory it holds, measured on loopback and written to
//! `tools/bench/results/<date>.md` and `.json`.
//!
//! xtask builds the artefacts and provisions Envoy (and Redis and PostgreSQL for the
//! fleet-wide section), then runs this binary with the user's flags and the artefacts' paths.
//! `sluice-bench ingest` runs the ingest benchmark alone, with every knob.
//!
//! Sections (each bounded in time and count):
//! 1. request path cost ([`path`]): Envoy with no filter, native `local_ratelimit`, a
//!    pass-through wasm filter and Sluice in several shapes, interleaved in rounds, Envoy
//!    on one core and wrk on the other;
//! 2. accuracy ([`accuracy`]): admitted against `burst + rate × elapsed` with 2 and 4
//!    workers;
//! 3. memory ([`memory`]): RSS while up to 1,000,000 distinct clients pass, and bytes per
//!    tracked client;
//! 4. profile ([`profile`]): the core's hot path natively and under callgrind;
//! 5. soak ([`soak`], only when named): a real `sluice serve` and Envoy under churning
//!    load and a rule edit every second for `--soak-minutes`, memory and reports checked;
//! 6. tokens ([`tokens`], only when named): LLM token budgets' cost to streams;
//! 7. rls ([`rls`], only when named): `ShouldRateLimit` throughput and latency of Sluice
//!    as Envoy's rate limit service, in memory and on Redis, beside the wasm filter;
//! 8. shaping ([`shaping`], only when named): what shaping options cost a request they do
//!    not bind, how on time a delayed request passes, memory under a queue flood.
//!
//! The machine is shared and noisy: the report gives ratios and differences from one
//! interleaved run, medians with min–max over rounds, never absolute claims.

mod accuracy;
mod configs;
mod fleet_load;
mod fleet_scale;
mod global;
mod hostcalls;
mod ingest;
mod machine;
mod memory;
mod path;
mod profile;
mod propagation;
mod report;
mod rls;
mod setup;
mod shaping;
mod soak;
mod stats;
mod tokens;
mod wrk;

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use sluice_harness::bench_args::{BenchArgs, Section};
use sluice_harness::cmd::{self, note, step};

use crate::setup::{Artefacts, Bench, Settings};

#[derive(Debug, Parser)]
#[command(
    name = "sluice-bench",
    about = "Benchmark Sluice against Envoy (run it with `cargo xtask bench`)",
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
struct Cli {
    #[command(subcommand)]
    alone: Option<Alone>,
    #[command(flatten)]
    args: BenchArgs,
    #[command(flatten)]
    artefacts: Artefacts,
}

#[derive(Debug, Subcommand)]
enum Alone {
    /// The report-ingest benchmark alone (every knob), its tables on stdout.
    Ingest(ingest::IngestArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let outcome = match &cli.alone {
        Some(Alone::Ingest(args)) => {
            ingest::tables(&args.options()).map(|tables| print!("{tables}"))
        }
        None => bench(&cli.args, &cli.artefacts),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // `{:#}` prints the whole chain on one line: which step, then why.
            eprintln!("\nsluice-bench: FAILED: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn bench(args: &BenchArgs, artefacts: &Artefacts) -> Result<()> {
    let started = Instant::now();
    let settings = Settings::new(args);
    let sections = args.sections();
    let invocation = args.invocation();
    step(format!("measuring: {invocation}"));
    let (date, stamp) = machine::utc_now();
    let hostcalls = sections.contains(&Section::Hostcalls);
    let bench = Bench::prepare(settings, artefacts, hostcalls, &stamp)?;

    let mut results = report::Results::default();
    for section in &sections {
        let outcome = match section {
            Section::Path => {
                results.path = Some(path::run(&bench));
                results.path.as_ref().map(|r| r.as_ref().err())
            }
            Section::Accuracy => {
                results.accuracy = Some(accuracy::run(&bench));
                results.accuracy.as_ref().map(|r| r.as_ref().err())
            }
            Section::Memory => {
                results.memory = Some(memory::run(&bench));
                results.memory.as_ref().map(|r| r.as_ref().err())
            }
            Section::Profile => {
                results.profile = Some(profile::run(&bench.run_dir));
                results.profile.as_ref().map(|r| r.as_ref().err())
            }
            // These run after the main report is written, into files beside it.
            Section::Ingest
            | Section::Propagation
            | Section::Global
            | Section::FleetScale
            | Section::Soak
            | Section::Hostcalls
            | Section::Shaping
            | Section::Tokens
            | Section::Rls => None,
        };
        if let Some(Some(err)) = outcome {
            note(format!("section {section:?} failed: {err:#}"));
        }
    }

    let complete = [
        Section::Path,
        Section::Accuracy,
        Section::Memory,
        Section::Profile,
    ]
    .iter()
    .all(|s| sections.contains(s))
        && !bench.settings.quick;
    // Sections written beside the report alone (e.g. `--only global`) are named after
    // the date: `<date>-global.md`.
    let side_sections_only = !sections.iter().any(|s| {
        matches!(
            s,
            Section::Path | Section::Accuracy | Section::Memory | Section::Profile
        )
    });
    let name = if bench.settings.quick {
        format!("{date}-quick")
    } else if complete || side_sections_only {
        date.clone()
    } else {
        format!("{date}-partial")
    };
    let out_dir = cmd::project_root()
        .join("tools")
        .join("bench")
        .join("results");
    std::fs::create_dir_all(&out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let report = report::Report {
        bench: &bench,
        results: &results,
        invocation: &invocation,
        stamp: &stamp,
        elapsed: started.elapsed(),
        file_name: &name,
    };
    let md_path = out_dir.join(format!("{name}.md"));
    let json_path = out_dir.join(format!("{name}.json"));
    // The sections written beside the report alone do not make a report.
    let main_report = !side_sections_only;
    if main_report {
        std::fs::write(&md_path, report.markdown())
            .with_context(|| format!("writing {}", md_path.display()))?;
        std::fs::write(
            &json_path,
            serde_json::to_string_pretty(&report.json())? + "\n",
        )
        .with_context(|| format!("writing {}", json_path.display()))?;
        step("report written");
    }
    if sections.contains(&Section::Propagation) {
        let changes = if bench.settings.quick { 30 } else { 100 };
        if let Err(err) = propagation::run(&bench, &out_dir, &name, changes) {
            note(format!("section Propagation failed: {err:#}"));
        }
    }
    if sections.contains(&Section::Global) {
        if let Err(err) = global::run(&bench, &out_dir, &name, &invocation) {
            note(format!("section Global failed: {err:#}"));
        }
    }
    if sections.contains(&Section::FleetScale) {
        if let Err(err) = fleet_scale::run(&bench, &out_dir, &name, &invocation) {
            note(format!("section FleetScale failed: {err:#}"));
        }
    }
    let mut tokens_failed = false;
    if sections.contains(&Section::Tokens) {
        if let Err(err) = tokens::run(&bench, &out_dir, &name) {
            note(format!("section Tokens failed: {err:#}"));
            tokens_failed = true;
        }
    }
    let mut rls_failed = false;
    if sections.contains(&Section::Rls) {
        if let Err(err) = rls::run(&bench, &out_dir, &name) {
            note(format!("section Rls failed: {err:#}"));
            rls_failed = true;
        }
    }
    let mut shaping_failed = false;
    if sections.contains(&Section::Shaping) {
        if let Err(err) = shaping::run(&bench, &out_dir, &name) {
            note(format!("section Shaping failed: {err:#}"));
            shaping_failed = true;
        }
    }
    let mut hostcalls_failed = false;
    if sections.contains(&Section::Hostcalls) {
        if let Err(err) = hostcalls::run(&bench, &out_dir, &name) {
            note(format!("section Hostcalls failed: {err:#}"));
            hostcalls_failed = true;
        }
    }
    if sections.contains(&Section::Ingest) {
        let seconds = if bench.settings.quick { 10 } else { 30 };
        if let Err(err) = ingest::section(&out_dir, &name, 100, seconds) {
            note(format!("section Ingest failed: {err:#}"));
        }
    }
    let mut soak_failed = false;
    if sections.contains(&Section::Soak) {
        let minutes = Duration::from_secs(args.soak_minutes * 60);
        match soak::run(&bench, &out_dir, &name, minutes, &invocation) {
            Ok((_, passed)) => soak_failed = !passed,
            Err(err) => {
                note(format!("section Soak failed: {err:#}"));
                soak_failed = true;
            }
        }
    }
    if main_report {
        note(md_path.display());
        note(json_path.display());
        println!("\n{}", report.readme_section());
    }

    let failed: Vec<&str> = [
        ("path", results.path.as_ref().is_some_and(Result::is_err)),
        (
            "accuracy",
            results.accuracy.as_ref().is_some_and(Result::is_err),
        ),
        (
            "memory",
            results.memory.as_ref().is_some_and(Result::is_err),
        ),
        (
            "profile",
            results.profile.as_ref().is_some_and(Result::is_err),
        ),
        ("soak", soak_failed),
        ("hostcalls", hostcalls_failed),
        ("tokens", tokens_failed),
        ("rls", rls_failed),
        ("shaping", shaping_failed),
    ]
    .into_iter()
    .filter_map(|(name, failed)| failed.then_some(name))
    .collect();
    if !failed.is_empty() {
        bail!("benchmark sections failed: {}", failed.join(", "));
    }
    if complete && !args.no_readme {
        let readme = cmd::project_root().join("README.md");
        if report::update_readme(&readme, &name)? {
            step(format!(
                "pointed {}'s benchmark headline at {name}.md: run `cargo xtask docs` to copy it",
                readme.display()
            ));
        } else {
            note(format!(
                "{} has no generated headline section to point at {name}.md",
                readme.display()
            ));
        }
    }
    step(format!(
        "benchmark finished in {:.1} min",
        started.elapsed().as_secs_f64() / 60.0
    ));
    Ok(())
}
