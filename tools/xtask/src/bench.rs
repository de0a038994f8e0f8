//! `cargo xtask bench`: builds and provisions what the benchmark needs (the filter, the
//! pass-through filter, `sluice`, Envoy, and for the fleet-wide section Redis and
//! PostgreSQL), then runs the benchmark itself, `sluice-bench` (`bench/`), with the same
//! flags. The measuring lives there, so xtask stays a quick-to-build task runner.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result};
use sluice_harness::bench_args::{BenchArgs, Section};
use sluice_harness::cmd::{self, step};

use crate::toolchain::WasmRoute;
use crate::{dist, envoy, postgres, redis};

const PASSTHROUGH_PACKAGE: &str = "sluice-passthrough-filter";
const PASSTHROUGH_ARTEFACT: &str = "sluice_passthrough_filter.wasm";
const HOSTCALL_PACKAGE: &str = "sluice-hostcall-filter";
const HOSTCALL_ARTEFACT: &str = "sluice_hostcall_filter.wasm";
const BENCH_PACKAGE: &str = "sluice-bench";

pub fn bench(args: &BenchArgs) -> Result<()> {
    step(format!("benchmark: {}", args.invocation()));
    let dist = dist::build(dist::Profile::Release).context("step `build` failed")?;
    let route = WasmRoute::select()?;
    step(format!(
        "building {PASSTHROUGH_PACKAGE} (release, {route} route)"
    ));
    let built = route
        .build_release(PASSTHROUGH_PACKAGE, PASSTHROUGH_ARTEFACT)
        .with_context(|| format!("building {PASSTHROUGH_PACKAGE} for wasm32"))?;
    let passthrough_wasm = dist::dist_dir().join(PASSTHROUGH_ARTEFACT);
    cmd::copy_file(&built, &passthrough_wasm)?;
    // The host-call probe is built only for the section that uses it.
    let hostcall_wasm = if args.sections().contains(&Section::Hostcalls) {
        step(format!(
            "building {HOSTCALL_PACKAGE} (release, {route} route)"
        ));
        let built = route
            .build_release(HOSTCALL_PACKAGE, HOSTCALL_ARTEFACT)
            .with_context(|| format!("building {HOSTCALL_PACKAGE} for wasm32"))?;
        let hostcall_wasm = dist::dist_dir().join(HOSTCALL_ARTEFACT);
        cmd::copy_file(&built, &hostcall_wasm)?;
        Some(hostcall_wasm)
    } else {
        None
    };
    let baseline_wasm = match &args.baseline {
        Some(rev) => Some(baseline_filter(route, rev)?),
        None => None,
    };
    let envoy = envoy::ensure_envoy().context("step `provision Envoy` failed")?;
    // The fleet-wide sections run two admin API replicas on one PostgreSQL and one Redis,
    // provisioned as for the test suite; the PostgreSQL server lives until the run ends.
    let sections = args.sections();
    let fleet_servers =
        if sections.contains(&Section::Global) || sections.contains(&Section::FleetScale) {
            Some((redis::ensure_server()?, postgres::for_tests()?))
        } else {
            None
        };
    // The rate limit service's section keeps buckets in a throwaway Redis too.
    let rls_redis = if sections.contains(&Section::Rls) && fleet_servers.is_none() {
        Some(redis::ensure_server()?)
    } else {
        None
    };
    // Release, as the admin API it measures in-process (the ingest section) ships.
    step(format!("building {BENCH_PACKAGE} (release)"));
    let bench_bin = cmd::cargo_build_artefact(
        cmd::cargo().args([
            "build",
            "--release",
            "-p",
            BENCH_PACKAGE,
            "--bin",
            BENCH_PACKAGE,
        ]),
        BENCH_PACKAGE,
    )
    .with_context(|| format!("building {BENCH_PACKAGE}"))?;

    let mut run = Command::new(bench_bin);
    run.args(args.flags())
        .arg("--envoy")
        .arg(&envoy)
        .arg("--filter-wasm")
        .arg(&dist.filter_wasm)
        .arg("--sluice-bin")
        .arg(&dist.sluice_bin)
        .arg("--passthrough-wasm")
        .arg(&passthrough_wasm)
        .arg("--wasm-route")
        .arg(route.to_string())
        .current_dir(cmd::project_root());
    if let Some(baseline_wasm) = &baseline_wasm {
        run.arg("--baseline-wasm").arg(baseline_wasm);
    }
    if let Some(hostcall_wasm) = &hostcall_wasm {
        run.arg("--hostcall-wasm").arg(hostcall_wasm);
    }
    if let Some((redis_server, postgres)) = &fleet_servers {
        run.envs(redis::env(redis_server)).envs(postgres.env());
    }
    if let Some(redis_server) = &rls_redis {
        run.envs(redis::env(redis_server));
    }
    cmd::run(&mut run)
}

/// Builds the filter as it was at git revision `rev`, for `--baseline`: in a worktree of
/// its own under `target/bench-baseline/` with a target directory of its own (so today's
/// build is left as it is, and a second run at the same revision is incremental), and
/// copies the module to `target/dist/`. Returns its path.
fn baseline_filter(route: WasmRoute, rev: &str) -> Result<PathBuf> {
    let root = cmd::project_root();
    let git = |dir: &std::path::Path| {
        let mut git = Command::new("git");
        git.current_dir(dir);
        git
    };
    let commit = cmd::output(
        git(&root)
            .args(["rev-parse", "--verify", "--quiet"])
            .arg(format!("{rev}^{{commit}}")),
    )
    .with_context(|| format!("--baseline {rev}: not a commit of this repository"))?;
    let commit = commit.trim();
    let dir = root.join("target").join("bench-baseline");
    let src = dir.join("src");
    step(format!(
        "building {} at {rev} ({commit}) for the baseline, in {}",
        dist::FILTER_PACKAGE,
        src.display()
    ));
    // A worktree whose directory was deleted (a wiped target/) is forgotten first.
    cmd::run(git(&root).args(["worktree", "prune"]))?;
    if src.join(".git").exists() {
        cmd::run(git(&src).args(["checkout", "--quiet", "--detach", "--force", commit]))?;
    } else {
        cmd::run(
            git(&root)
                .args(["worktree", "add", "--quiet", "--detach", "--force"])
                .arg(&src)
                .arg(commit),
        )?;
    }
    let mut build = route.cargo("build");
    build
        .current_dir(&src)
        .env("CARGO_TARGET_DIR", dir.join("target"))
        .args(["--release", "--package", dist::FILTER_PACKAGE]);
    let built = cmd::cargo_build_artefact(&mut build, dist::FILTER_ARTEFACT)
        .with_context(|| format!("building {} at {rev}", dist::FILTER_PACKAGE))?;
    let short: String = commit.chars().take(12).collect();
    let module = dist::dist_dir().join(format!("sluice_filter-{short}.wasm"));
    cmd::copy_file(&built, &module)?;
    Ok(module)
}
