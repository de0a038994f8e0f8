//! The report-ingest benchmark (see `sluice_admin::ingest_bench`): the real server on
//! 127.0.0.1 with SQLite (and PostgreSQL with `--postgres URL`), simulated proxies each
//! POSTing a report a second, and the dashboard's queries over a week of history.
//!
//! ```sh
//! cargo run --release -p sluice-admin --example ingest_bench -- --proxies 100 --seconds 30
//! cargo run --release -p sluice-admin --example ingest_bench -- --postgres postgres://postgres@127.0.0.1:5432/postgres
//! ```
//!
//! Prints Markdown tables on stdout.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use sluice_admin::ingest_bench::{self, BenchOptions};

#[derive(Debug, Parser)]
#[command(about = "Benchmark report ingestion and metric queries of the Sluice admin API")]
struct Args {
    /// Simulated proxies, one report a second each.
    #[arg(long, default_value_t = 100)]
    proxies: usize,
    /// How long they send.
    #[arg(long, default_value_t = 30)]
    seconds: u64,
    /// Rules per report.
    #[arg(long, default_value_t = 10)]
    rules: usize,
    /// Top clients per rule per report.
    #[arg(long, default_value_t = 20)]
    clients: usize,
    /// Days of history to pre-fill.
    #[arg(long, default_value_t = 7)]
    history_days: u32,
    /// Also pre-fill per-proxy 1-minute history (millions of rows).
    #[arg(long)]
    proxy_minutes: bool,
    /// A PostgreSQL server to run on as well (a database is created and dropped).
    #[arg(long, env = "SLUICE_BENCH_POSTGRES_URL", value_name = "URL")]
    postgres: Option<String>,
    /// Skip SQLite.
    #[arg(long)]
    no_sqlite: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let options = BenchOptions {
        proxies: args.proxies,
        duration: Duration::from_secs(args.seconds),
        rules: args.rules,
        clients: args.clients,
        history_days: args.history_days,
        proxy_minutes: args.proxy_minutes,
        sqlite: !args.no_sqlite,
        postgres_url: args.postgres,
        ..BenchOptions::default()
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: starting the runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(ingest_bench::run(&options)) {
        Ok(results) => {
            print!("{}", ingest_bench::markdown(&options, &results));
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}
