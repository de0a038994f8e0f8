//! `cargo xtask`: Sluice's build, test and demo automation, in Rust so it runs wherever cargo
//! does. Each step says what it does and skips what is already done.

mod bench;
mod clippy;
mod dashboard;
mod demo;
mod demo_load;
mod dist;
mod envoy;
mod fuzz;
mod images;
mod libtest;
mod lint;
mod postgres;
mod redis;
mod registry;
mod schemathesis;
mod server_dir;
mod suite;
mod tidy;
mod toolchain;
mod validators;

use std::process::ExitCode;

use anyhow::Result;
use clap::{Parser, Subcommand};
use sluice_harness::bench_args::BenchArgs;
use sluice_harness::cmd;

#[derive(Debug, Parser)]
#[command(
    name = "cargo xtask",
    bin_name = "cargo xtask",
    about = "Build, test, demo and benchmark Sluice",
    after_help = "Environment:\n  \
        SLUICE_WASM_ROUTE=rustup|debian    force how the wasm32 filter is compiled\n  \
        SLUICE_STATIC_ROUTE=rustup|debian  force how the static (musl) `sluice` is compiled\n  \
        SOURCE_DATE_EPOCH=SECONDS          the images' time (default: the commit's)\n  \
        SLUICE_ENVOY=PATH                  use this Envoy binary"
)]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Debug, Subcommand)]
enum Task {
    /// Build the filter and the dashboard (wasm32) and the `sluice` binary into target/dist/,
    /// and their OCI images (the filter in two formats, a static `sluice`) into target/dist/oci/.
    Build,
    /// Build only the dashboard bundle into dashboard/dist/ (a debug `sluice serve` reads it
    /// from there at run time: rebuild, then reload the page).
    Dashboard,
    /// Run the whole suite: build, unit and property tests, integration tests against Envoy.
    Test(suite::TestArgs),
    /// cargo fmt --check and clippy (host crates, and the filter for wasm32 where possible).
    Lint,
    /// The repository's rules: no import circle inside a crate, no product source file
    /// over 900 lines; documentation links resolve, generated sections match their result
    /// files, every exported metric is documented in docs/metrics.md (and only those).
    Tidy,
    /// Rewrite the documentation's generated sections (`<!-- generated from ... -->`) from
    /// the committed result files they name.
    Docs,
    /// Run the admin API with the dashboard, and Envoy following it with demo traffic, until Ctrl-C.
    Demo(demo::DemoArgs),
    /// Find or install Envoy and print its path.
    Envoy,
    /// Benchmark request cost, accuracy and memory against Envoy; writes tools/bench/results/.
    Bench(BenchArgs),
    /// Fuzz every decoder of untrusted bytes (cargo-fuzz, libFuzzer) for --seconds per target.
    Fuzz(fuzz::FuzzArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli.task) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // `{:#}` prints the whole chain on one line: which step, then why.
            eprintln!("\nxtask: FAILED: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(task: &Task) -> Result<()> {
    match task {
        Task::Build => {
            let dist = dist::build(dist::Profile::Release)?;
            let images = images::build(&dist, dist::Profile::Release)?;
            cmd::step("built");
            cmd::note(dist.filter_wasm.display());
            cmd::note(dist.sluice_bin.display());
            images.print();
            Ok(())
        }
        Task::Dashboard => {
            let bundle = dashboard::build(toolchain::WasmRoute::select()?, dashboard::PROFILE)?;
            cmd::step("built");
            cmd::note(bundle.dir.display());
            Ok(())
        }
        Task::Test(args) => suite::test(args),
        Task::Lint => lint::lint(),
        Task::Tidy => tidy::tidy(),
        Task::Docs => tidy::fix_docs(),
        Task::Demo(args) => demo::demo(args),
        Task::Envoy => {
            let envoy = envoy::ensure_envoy()?;
            println!("{}", envoy.display());
            Ok(())
        }
        Task::Bench(args) => bench::bench(args),
        Task::Fuzz(args) => fuzz::fuzz(args),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn test_passes_trailing_args_through() {
        let cli = Cli::try_parse_from(["xtask", "test", "--skip-unit", "accuracy", "--nocapture"])
            .expect("valid command line");
        let Task::Test(args) = cli.task else {
            panic!("expected the test task");
        };
        assert!(args.skip_unit);
        assert_eq!(args.test_args, ["accuracy", "--nocapture"]);
    }
}
