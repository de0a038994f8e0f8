//! What every section of a run shares: the artefacts `cargo xtask bench` hands over, the
//! run's durations and sizes, the machine, and the Envoy launcher ([`Bench`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use sluice_envoy_config::LISTENER_NAME;
use sluice_harness::bench_args::BenchArgs;
use sluice_harness::cmd::{self, note};
use sluice_harness::envoy::{EnvoyLaunch, EnvoyProcess};

use crate::{configs, machine, wrk};

/// How long an Envoy may take to load its config and start the wasm VMs.
const ENVOY_READY_LIMIT: Duration = Duration::from_secs(60);

/// What `cargo xtask bench` built and provisioned.
#[derive(Debug, Args)]
pub struct Artefacts {
    #[arg(long, required = true, value_name = "PATH")]
    pub envoy: Option<PathBuf>,
    #[arg(long, required = true, value_name = "PATH")]
    pub filter_wasm: Option<PathBuf>,
    #[arg(long, required = true, value_name = "PATH")]
    pub sluice_bin: Option<PathBuf>,
    #[arg(long, required = true, value_name = "PATH")]
    pub passthrough_wasm: Option<PathBuf>,
    /// The host-call probe (`bench/hostcall-filter`), for the host-call section.
    #[arg(long, value_name = "PATH")]
    pub hostcall_wasm: Option<PathBuf>,
    /// The filter built at `--baseline REV`, for the request-path section.
    #[arg(long, value_name = "PATH")]
    pub baseline_wasm: Option<PathBuf>,
    /// How the wasm32 filters were compiled, for the report.
    #[arg(long, required = true, value_name = "ROUTE")]
    pub wasm_route: Option<String>,
}

/// Durations and sizes of one run.
#[derive(Debug, Clone)]
pub struct Settings {
    pub quick: bool,
    /// `--baseline REV`: the revision whose filter the request-path section measures too.
    pub baseline: Option<String>,
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
    pub fn new(args: &BenchArgs) -> Settings {
        let quick = args.quick;
        let pick = |q: u64, f: u64| if quick { q } else { f };
        Settings {
            quick,
            baseline: args.baseline.clone(),
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
    /// Copies the artefacts into this run's folder under `target/bench/` (named after
    /// `stamp`), finds wrk and looks at the machine. The host-call probe is needed only
    /// for the `hostcalls` section.
    pub fn prepare(
        settings: Settings,
        artefacts: &Artefacts,
        hostcalls: bool,
        stamp: &str,
    ) -> Result<Bench> {
        let given = |path: &Option<PathBuf>, flag: &str| {
            path.clone().with_context(|| {
                format!("--{flag} is missing: run the benchmark with `cargo xtask bench`")
            })
        };
        let envoy = given(&artefacts.envoy, "envoy")?;
        let route = artefacts.wasm_route.clone().unwrap_or_default();
        let run_dir = cmd::project_root()
            .join("target")
            .join("bench")
            .join(stamp.replace([' ', ':'], "-").trim_end_matches("-UTC"));
        std::fs::create_dir_all(&run_dir)
            .with_context(|| format!("creating {}", run_dir.display()))?;
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
        let hostcall_wasm = if hostcalls {
            Some(keep(&given(&artefacts.hostcall_wasm, "hostcall-wasm")?)?)
        } else {
            None
        };
        let baseline_wasm = match &settings.baseline {
            Some(_) => Some(keep(&given(&artefacts.baseline_wasm, "baseline-wasm")?)?),
            None => None,
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
        Ok(Bench {
            settings,
            envoy,
            generator: configs::Generator {
                sluice_bin,
                filter_wasm,
                passthrough_wasm,
                hostcall_wasm,
                baseline_wasm,
                dir: run_dir.clone(),
            },
            wrk,
            machine,
            run_dir,
            envoy_cpus,
            load_cpus,
        })
    }

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
