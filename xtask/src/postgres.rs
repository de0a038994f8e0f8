//! A throwaway PostgreSQL server for the test suite, so the admin API's behaviour suite runs
//! against a real PostgreSQL as well as SQLite on every machine, CI included.
//!
//! With `DATABASE_URL` (or `SLUICE_TEST_POSTGRES_URL`) set to a `postgres://` URL, that server
//! is used as it is. Otherwise: Debian's `postgresql` is installed if no server binaries are
//! found, a cluster is created with `initdb` in a private folder under the system's temporary
//! folder (see [`crate::server_dir`]: PostgreSQL runs as its own account when we are root, and
//! must reach its data whatever the permissions of the checkout's parents), started on
//! 127.0.0.1 with a free port (and its unix socket in that folder, not in /var/run), given a
//! `sluice_test` database, and stopped and removed again when the suite ends, whether it
//! passed or not. Tests create one database per test on that server.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

use crate::apt;
use crate::cmd::{self, note, step};
use crate::server_dir::{self, ServerDir};

/// Where the tests find the server: a URL of a database they may create databases from.
pub const URL_ENV: &str = "SLUICE_TEST_POSTGRES_URL";
/// Set for the test run: the PostgreSQL half of the behaviour suite fails instead of
/// skipping when the URL is missing.
pub const REQUIRE_ENV: &str = "SLUICE_REQUIRE_POSTGRES";
/// The database created in the throwaway cluster.
const DATABASE: &str = "sluice_test";
/// The unprivileged account PostgreSQL runs as when we are root (it refuses to run as root).
const POSTGRES_USER: &str = "postgres";
/// The name of the cluster's folder in [`server_dir`].
const SERVER_NAME: &str = "postgres";

/// A PostgreSQL server for one test run; a cluster we started is stopped on drop.
#[derive(Debug)]
pub struct TestPostgres {
    url: String,
    /// Held only to be dropped: that stops the server.
    _cluster: Option<Cluster>,
}

impl TestPostgres {
    /// `postgres://…` of the server.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The environment the test commands need.
    pub fn env(&self) -> [(&'static str, &str); 2] {
        [(URL_ENV, self.url.as_str()), (REQUIRE_ENV, "1")]
    }
}

#[derive(Debug)]
struct Cluster {
    bin: PathBuf,
    data: PathBuf,
    /// Run the server's tools through `runuser -u postgres --` (we are root).
    as_postgres: bool,
    /// Holds the data, the socket and the log; removed (log kept) after the server stops,
    /// since fields drop after [`Cluster`]'s own `drop`.
    _dir: ServerDir,
}

impl Cluster {
    /// A command for one of the server's tools, as the right user.
    fn tool(&self, name: &str) -> Command {
        tool(&self.bin, name, self.as_postgres)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        step("stopping the test PostgreSQL server");
        let mut stop = self.tool("pg_ctl");
        stop.arg("-D")
            .arg(&self.data)
            .args(["-m", "fast", "-w", "stop"])
            .stdout(Stdio::null());
        if let Err(err) = cmd::run(&mut stop) {
            note(format!("could not stop it: {err:#}"));
        }
    }
}

fn tool(bin: &Path, name: &str, as_postgres: bool) -> Command {
    if as_postgres {
        let mut command = Command::new("runuser");
        command
            .args(["-u", POSTGRES_USER, "--"])
            .arg(bin.join(name));
        command
    } else {
        Command::new(bin.join(name))
    }
}

/// A PostgreSQL server for the tests: the one in `DATABASE_URL`/`SLUICE_TEST_POSTGRES_URL`,
/// or a new throwaway cluster.
pub fn for_tests() -> Result<TestPostgres> {
    for var in [URL_ENV, "DATABASE_URL"] {
        if let Ok(url) = std::env::var(var) {
            if url.starts_with("postgres://") || url.starts_with("postgresql://") {
                step(format!("PostgreSQL for the tests: the server in {var}"));
                return Ok(TestPostgres {
                    url,
                    _cluster: None,
                });
            }
        }
    }
    step("PostgreSQL for the tests: a throwaway cluster");
    let bin = match server_bin_dir() {
        Some(bin) => {
            note(format!("server binaries in {}", bin.display()));
            bin
        }
        None => {
            note("no PostgreSQL server binaries in /usr/lib/postgresql/*/bin");
            apt::install(&["postgresql"]).context("installing PostgreSQL")?;
            server_bin_dir().context("PostgreSQL was installed but its binaries were not found")?
        }
    };
    start_cluster(bin)
}

/// The newest `/usr/lib/postgresql/VERSION/bin` with a server in it.
fn server_bin_dir() -> Option<PathBuf> {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version: u32 = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            (cmd::is_executable(&bin.join("initdb")) && cmd::is_executable(&bin.join("pg_ctl")))
                .then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin)
}

fn is_root() -> bool {
    cmd::probe(Command::new("id").arg("-u")).is_some_and(|uid| uid.trim() == "0")
}

fn free_port() -> Result<u16> {
    // The port is free when we look; PostgreSQL binds it a moment later. Good enough on a
    // test machine, and a clash fails loudly at start-up rather than silently.
    let listener = TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(listener.local_addr()?.port())
}

fn start_cluster(bin: PathBuf) -> Result<TestPostgres> {
    let as_postgres = is_root();

    // A cluster left by an interrupted run may still be running: stop it, start afresh.
    if let Some(stale) = ServerDir::left_by_earlier_run(SERVER_NAME) {
        note(format!(
            "stopping a cluster left by an earlier run in {}",
            stale.display()
        ));
        let _ = tool(&bin, "pg_ctl", as_postgres)
            .arg("-D")
            .arg(stale.join("data"))
            .args(["-m", "immediate", "-w", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        server_dir::remove_stale(SERVER_NAME, &stale);
    }
    let owner = as_postgres.then_some(POSTGRES_USER);
    if as_postgres {
        note(format!(
            "running as root: the server runs as the `{POSTGRES_USER}` user, which owns its folder"
        ));
    }
    let mut dir = ServerDir::create(SERVER_NAME, owner)?;
    let base = dir.path().to_path_buf();
    let log = dir.keep_log("postgres.log");
    let data = base.join("data");
    if as_postgres {
        let writable = Command::new("runuser")
            .args(["-u", POSTGRES_USER, "--", "test", "-w"])
            .arg(&base)
            .status()
            .is_ok_and(|s| s.success());
        if !writable {
            bail!(
                "the `{POSTGRES_USER}` user cannot write {} (is TMPDIR closed to other users?); \
                 point TMPDIR at a folder it can reach, or set DATABASE_URL to a PostgreSQL \
                 server instead",
                base.display()
            );
        }
    }

    let mut initdb = tool(&bin, "initdb", as_postgres);
    initdb
        .arg("-D")
        .arg(&data)
        .args(["-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"])
        .stdout(Stdio::null());
    cmd::run(&mut initdb).context("initdb")?;

    let port = free_port()?;
    let options = format!(
        "-c listen_addresses=127.0.0.1 -p {port} -k {} -c max_connections=200 \
         -c fsync=off -c synchronous_commit=off -c full_page_writes=off",
        base.display()
    );
    let cluster = Cluster {
        bin,
        data,
        as_postgres,
        _dir: dir,
    };
    let mut start = cluster.tool("pg_ctl");
    start
        .arg("-D")
        .arg(&cluster.data)
        .arg("-l")
        .arg(&log)
        .args(["-w", "-t", "60", "-o", &options, "start"])
        .stdout(Stdio::null());
    // From here on `cluster` is dropped (and the server stopped) on any error.
    cmd::run(&mut start).with_context(|| {
        format!(
            "starting PostgreSQL (its log is kept at {})",
            cluster._dir.kept_log_path().display()
        )
    })?;

    let mut createdb = cluster.tool("createdb");
    createdb.args([
        "-h",
        "127.0.0.1",
        "-p",
        &port.to_string(),
        "-U",
        "postgres",
        DATABASE,
    ]);
    cmd::run(&mut createdb).context("creating the test database")?;

    let url = format!("postgres://postgres@127.0.0.1:{port}/{DATABASE}");
    note(format!("{URL_ENV}={url}"));
    Ok(TestPostgres {
        url,
        _cluster: Some(cluster),
    })
}
