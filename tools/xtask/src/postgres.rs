//! PostgreSQL for the test suite, so the admin API's behaviour suite runs against a real
//! PostgreSQL as well as SQLite on every machine, CI included, and the outage tests can run
//! servers of their own.
//!
//! The server binaries are found in `/usr/lib/postgresql/*/bin`, or Debian's `postgresql`
//! is installed; their folder is passed to the tests (`SLUICE_POSTGRES_BIN`), which start
//! their own clusters with `sluice-harness`'s `PostgresServer`. With `DATABASE_URL` (or
//! `SLUICE_TEST_POSTGRES_URL`) set to a `postgres://` URL, that server is the suite's as it
//! is. Otherwise the suite's server is a harness cluster too (its private folder under the
//! system's temporary folder, owned by PostgreSQL's account when we are root, 127.0.0.1 on
//! a free port), given a `sluice_test` database, and stopped and removed again when the
//! suite ends, whether it passed or not. Tests create one database per test on that server.

use std::path::PathBuf;

use anyhow::{Context, Result};
use sluice_harness::apt;
use sluice_harness::cmd::{note, step};
use sluice_harness::{
    POSTGRES_BIN_ENV, POSTGRES_URL_ENV, PostgresServer, REQUIRE_POSTGRES_ENV, server_bin_dir,
    stop_left_behind,
};

use crate::server_dir::{self, Record};

/// The database created in the throwaway cluster.
const DATABASE: &str = "sluice_test";
/// The name of the cluster's record in [`server_dir`].
const SERVER_NAME: &str = "postgres";

/// PostgreSQL for one test run; a cluster we started is stopped on drop.
#[derive(Debug)]
pub struct TestPostgres {
    url: String,
    /// The folder of the server binaries, as a string for the environment.
    bin: String,
    cluster: Option<Cluster>,
}

#[derive(Debug)]
struct Cluster {
    /// First, so that if the cluster is dropped on an error it keeps the log before the
    /// server's folder goes.
    record: Record,
    server: PostgresServer,
}

impl TestPostgres {
    /// The environment the test commands need.
    pub fn env(&self) -> [(&'static str, &str); 3] {
        [
            (POSTGRES_URL_ENV, self.url.as_str()),
            (POSTGRES_BIN_ENV, self.bin.as_str()),
            (REQUIRE_POSTGRES_ENV, "1"),
        ]
    }
}

impl Drop for TestPostgres {
    fn drop(&mut self) {
        if let Some(Cluster { record, mut server }) = self.cluster.take() {
            step("stopping the test PostgreSQL server");
            server.stop();
            // The record keeps the log, so it goes while the folder is still there.
            drop(record);
        }
    }
}

/// PostgreSQL for the tests: its binaries (installed if missing), and the server in
/// `DATABASE_URL`/`SLUICE_TEST_POSTGRES_URL` or a new throwaway cluster.
pub fn for_tests() -> Result<TestPostgres> {
    let bin = match server_bin_dir() {
        Some(bin) => {
            note(format!("PostgreSQL server binaries in {}", bin.display()));
            bin
        }
        None => {
            note("no PostgreSQL server binaries in /usr/lib/postgresql/*/bin");
            apt::install(&["postgresql"]).context("installing PostgreSQL")?;
            server_bin_dir().context("PostgreSQL was installed but its binaries were not found")?
        }
    };
    let bin_env = bin.to_string_lossy().into_owned();
    for var in [POSTGRES_URL_ENV, "DATABASE_URL"] {
        if let Ok(url) = std::env::var(var) {
            if url.starts_with("postgres://") || url.starts_with("postgresql://") {
                step(format!("PostgreSQL for the tests: the server in {var}"));
                return Ok(TestPostgres {
                    url,
                    bin: bin_env,
                    cluster: None,
                });
            }
        }
    }
    step("PostgreSQL for the tests: a throwaway cluster");
    start_cluster(bin, bin_env)
}

fn start_cluster(bin: PathBuf, bin_env: String) -> Result<TestPostgres> {
    // A cluster left by an interrupted run may still be running: stop it, start afresh.
    if let Some(stale) = server_dir::left_by_earlier_run(SERVER_NAME) {
        note(format!(
            "stopping a cluster left by an earlier run in {}",
            stale.display()
        ));
        stop_left_behind(&bin, &stale);
        server_dir::remove_stale(SERVER_NAME, &stale);
    }
    let server = PostgresServer::start_with(&bin).context(
        "starting PostgreSQL (or set DATABASE_URL to a PostgreSQL server to use instead)",
    )?;
    let record = Record::new(SERVER_NAME, server.folder(), server.log_path())?;
    // From here on the cluster is stopped (and its log kept) on any error.
    let cluster = Cluster { record, server };
    let url = cluster
        .server
        .create_database(DATABASE)
        .context("creating the test database")?;
    note(format!("{POSTGRES_URL_ENV}={url}"));
    Ok(TestPostgres {
        url,
        bin: bin_env,
        cluster: Some(cluster),
    })
}
