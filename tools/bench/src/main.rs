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
//!    load and a rule edit every second for `--soak-minutes`, memory and reports checked.
//!
//! The machine is shared and noisy: the report gives ratios and differences from one
//! interleaved run, medians with min–max over rounds, never absolute claims.

mod accuracy;
mod configs;
mod fleet_load;
mod global;
mod hostcalls;
mod ingest;
mod machine;
mod memory;
mod path;
mod profile;
mod propagation;
mod report;
mod soak;
mod stats;
mod wrk;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use sluice_envoy_config::LISTENER_NAME;
use sluice_harness::bench_args::{BenchArgs, Section};
use sluice_harness::cmd::{self, note, step};
use sluice_harness::envoy::{EnvoyLaunch, EnvoyProcess};

/// How long an Envoy may take to load its config and start the wasm VMs.
const ENVOY_READY_LIMIT: Duration = Duration::from_secs(60);

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

/// What `cargo xtask bench` built and provisioned.
#[derive(Debug, Args)]
struct Artefacts {
    #[arg(long, required = true, value_name = "PATH")]
    envoy: Option<PathBuf>,
    #[arg(long, required = true, value_name = "PATH")]
    filter_wasm: Option<PathBuf>,
    #[arg(long, required = true, value_name = "PATH")]
    sluice_bin: Option<PathBuf>,
    #[arg(long, required = true, value_name = "PATH")]
    passthrough_wasm: Option<PathBuf>,
    /// The host-call probe (`bench/hostcall-filter`), for the host-call section.
    #[arg(long, value_name = "PATH")]
    hostcall_wasm: Option<PathBuf>,
    /// How the wasm32 filters were compiled, for the report.
    #[arg(long, required = true, value_name = "ROUTE")]
    wasm_route: Option<String>,
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

/// Durations and sizes of one run.
#[derive(Debug, Clone)]
pub struct Settings {
    pub quick: bool,
    pub rounds: u32,
    pub round: Duration,
    pub warmup: Duration,
    pub connections: u32,
    pub accuracy: Duration,
    pub accuracy_connections: u32,
    pub slots: u32,
    pub memory_clients: u64,
    pub memory_segment: Duration,
    pub memory_max_segments: u32,
    pub memory_time_limit: Duration,
}

impl Settings {
    fn new(args: &BenchArgs) -> Settings {
        let quick = args.quick;
        let pick = |q: u64, f: u64| if quick { q } else { f };
        Settings {
            quick,
            rounds: args.rounds.unwrap_or(if quick { 3 } else { 5 }),
            round: Duration::from_secs(args.duration.unwrap_or(pick(5, 15))),
            warmup: Duration::from_secs(pick(2, 5)),
            connections: 32,
            accuracy: Duration::from_secs(pick(4, 10)),
            accuracy_connections: 64,
            slots: 65_536,
            memory_clients: pick(200_000, 1_000_000),
            memory_segment: Duration::from_secs(pick(2, 4)),
            memory_max_segments: if quick { 30 } else { 120 },
            memory_time_limit: Duration::from_secs(pick(60, 360)),
        }
    }
}

/// Everything the sections share.
#[derive(Debug)]
pub struct Bench {
    pub settings: Settings,
    pub envoy: PathBuf,
    pub generator: configs::Generator,
    pub wrk: wrk::Wrk,
    pub machine: machine::Machine,
    /// Configs, logs and scripts of this run.
    pub run_dir: PathBuf,
    /// `taskset` CPU lists for the request-path comparison, when pinning is possible.
    pub envoy_cpus: Option<String>,
    pub load_cpus: Option<String>,
}

impl Bench {
    /// Starts an Envoy of this run from `config` (made by [`configs::Generator`]), logging
    /// warnings into `dir`, pinned to `cpus` when given.
    pub fn start_envoy(
        &self,
        config: &Path,
        concurrency: u32,
        cpus: Option<&str>,
        dir: &Path,
        name: &str,
    ) -> Result<EnvoyProcess> {
        EnvoyProcess::start(&EnvoyLaunch {
            envoy: &self.envoy,
            config,
            concurrency: Some(concurrency),
            log_level: "warn",
            cpus,
            dir,
            name,
            ready_timeout: ENVOY_READY_LIMIT,
            listener: Some(LISTENER_NAME),
        })
    }
}

/// What the sections produced; a failed section keeps its error.
#[derive(Debug, Default)]
pub struct Results {
    pub path: Option<Result<path::PathResults>>,
    pub accuracy: Option<Result<accuracy::AccuracyResults>>,
    pub memory: Option<Result<memory::MemoryResults>>,
    pub profile: Option<Result<profile::ProfileResults>>,
}

fn bench(args: &BenchArgs, artefacts: &Artefacts) -> Result<()> {
    let started = Instant::now();
    let settings = Settings::new(args);
    let sections = args.sections();
    let invocation = args.invocation();
    step(format!("measuring: {invocation}"));
    let given = |path: &Option<PathBuf>, flag: &str| {
        path.clone().with_context(|| {
            format!("--{flag} is missing: run the benchmark with `cargo xtask bench`")
        })
    };
    let envoy = given(&artefacts.envoy, "envoy")?;
    let route = artefacts.wasm_route.clone().unwrap_or_default();

    let (date, stamp) = machine::utc_now();
    let run_dir = cmd::project_root()
        .join("target")
        .join("bench")
        .join(stamp.replace([' ', ':'], "-").trim_end_matches("-UTC"));
    std::fs::create_dir_all(&run_dir).with_context(|| format!("creating {}", run_dir.display()))?;
    // The run keeps its own copies: another build replacing target/dist/ mid-run (the
    // filter is rebuilt by `cargo xtask test` and `demo` too) cannot mix versions.
    let keep = |from: &Path| -> Result<PathBuf> {
        let to = run_dir.join(from.file_name().context("artefact without a file name")?);
        std::fs::copy(from, &to)
            .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
        Ok(to)
    };
    let filter_wasm = keep(&given(&artefacts.filter_wasm, "filter-wasm")?)?;
    let sluice_bin = keep(&given(&artefacts.sluice_bin, "sluice-bin")?)?;
    let passthrough_wasm = keep(&given(&artefacts.passthrough_wasm, "passthrough-wasm")?)?;
    let hostcall_wasm = if sections.contains(&Section::Hostcalls) {
        Some(keep(&given(&artefacts.hostcall_wasm, "hostcall-wasm")?)?)
    } else {
        None
    };
    let wrk = wrk::Wrk::ensure(&run_dir)?;
    let machine = machine::Machine::inspect(&envoy, &route, &wrk.version);
    let (envoy_cpus, load_cpus) = if machine.taskset && machine.cores >= 2 {
        (Some("0".to_string()), Some("1".to_string()))
    } else {
        note("taskset or a second core is missing: Envoy and wrk run unpinned");
        (None, None)
    };
    note(format!(
        "{} ({} cores), {}, load average {}",
        machine.cpu_model, machine.cores, machine.kernel, machine.loadavg_start
    ));
    let bench = Bench {
        settings,
        envoy,
        generator: configs::Generator {
            sluice_bin,
            filter_wasm,
            passthrough_wasm,
            hostcall_wasm,
            dir: run_dir.clone(),
        },
        wrk,
        machine,
        run_dir,
        envoy_cpus,
        load_cpus,
    };

    let mut results = Results::default();
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
            | Section::Soak
            | Section::Hostcalls => None,
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
        if let Err(err) = global::run(&bench, &out_dir, &name) {
            note(format!("section Global failed: {err:#}"));
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
    ]
    .into_iter()
    .filter_map(|(name, failed)| failed.then_some(name))
    .collect();
    if !failed.is_empty() {
        bail!("benchmark sections failed: {}", failed.join(", "));
    }
    if complete && !args.no_readme {
        let readme = cmd::project_root().join("README.md");
        report::update_readme(&readme, &report.readme_section())?;
        step(format!(
            "updated the Benchmarks section of {}",
            readme.display()
        ));
    }
    step(format!(
        "benchmark finished in {:.1} min",
        started.elapsed().as_secs_f64() / 60.0
    ));
    Ok(())
}
