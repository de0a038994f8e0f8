//! Throwaway PostgreSQL: a cluster of our own that can be stopped and started again, and
//! fresh databases on a server given by URL.
//!
//! The cluster lives in a private folder under the system's temporary folder, never inside
//! the checkout: a checkout may sit below folders closed to other users (`/root`, any
//! `mktemp -d`), and PostgreSQL refuses to run as root, so when we are root it runs as the
//! `postgres` account, which owns the folder (mode 0700: nobody else reads the data or uses
//! the socket). It listens on 127.0.0.1 on a free port and keeps its unix socket in that
//! folder, not in /var/run.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use anyhow::{Context, Result, bail};

/// A folder holding the server binaries (`initdb`, `pg_ctl`, `createdb`, ...); when unset,
/// the newest `/usr/lib/postgresql/VERSION/bin` (Debian's layout).
pub const POSTGRES_BIN_ENV: &str = "SLUICE_POSTGRES_BIN";
/// A server the tests may create databases on (`cargo xtask test` runs one for the suite).
pub const POSTGRES_URL_ENV: &str = "SLUICE_TEST_POSTGRES_URL";
/// Set by `cargo xtask test`: a missing PostgreSQL is then a failure, not a skip.
pub const REQUIRE_POSTGRES_ENV: &str = "SLUICE_REQUIRE_POSTGRES";

/// The unprivileged account PostgreSQL runs as when we are root.
const POSTGRES_USER: &str = "postgres";
/// How long `pg_ctl` waits for the server to start or stop, in seconds.
const PG_CTL_WAIT_SECONDS: &str = "60";

/// The folder with the server binaries: [`POSTGRES_BIN_ENV`], else the newest
/// `/usr/lib/postgresql/VERSION/bin` holding `initdb` and `pg_ctl`.
pub fn server_bin_dir() -> Option<PathBuf> {
    let has_server = |bin: &Path| bin.join("initdb").is_file() && bin.join("pg_ctl").is_file();
    if let Some(bin) = std::env::var_os(POSTGRES_BIN_ENV).map(PathBuf::from) {
        return has_server(&bin).then_some(bin);
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version: u32 = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            has_server(&bin).then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin)
}

/// Whether a PostgreSQL server can be started here. Tests that need one skip (with a
/// notice) when it cannot, unless [`REQUIRE_POSTGRES_ENV`] is set, as under
/// `cargo xtask test`: then this panics.
pub fn postgres_available() -> bool {
    let found = server_bin_dir().is_some();
    assert!(
        found || std::env::var_os(REQUIRE_POSTGRES_ENV).is_none(),
        "{REQUIRE_POSTGRES_ENV} is set but no PostgreSQL server binaries were found \
         (set {POSTGRES_BIN_ENV})"
    );
    if !found {
        eprintln!(
            "skipped: no PostgreSQL server binaries (cargo xtask test installs them, or set \
             {POSTGRES_BIN_ENV})"
        );
    }
    found
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// One of the server's tools, run as `postgres` when we are root.
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

/// Runs a command to completion; an error names it and carries its output.
fn run(command: &mut Command) -> Result<Output> {
    let output = command
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {command:?}"))?;
    if !output.status.success() {
        bail!(
            "{command:?} failed ({}): {}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(output)
}

/// A PostgreSQL cluster of our own on 127.0.0.1, initialised in a private temporary folder,
/// that can be stopped and started again on the same port with the same data (for outage
/// tests). Stopped, and its folder removed, on drop.
#[derive(Debug)]
pub struct PostgresServer {
    bin: PathBuf,
    /// Run the server's tools through `runuser -u postgres --` (we are root).
    as_postgres: bool,
    port: u16,
    running: bool,
    /// `data/`, the unix socket and `postgres.log`. Removed after `drop` stops the server
    /// (fields drop after [`PostgresServer`]'s own `drop`).
    dir: tempfile::TempDir,
}

impl PostgresServer {
    /// Starts a cluster with the binaries of [`server_bin_dir`]; panics with the reason
    /// (and the server's log) if it does not come up.
    pub fn start() -> PostgresServer {
        let bin = server_bin_dir().unwrap_or_else(|| {
            panic!(
                "no PostgreSQL server binaries: install Debian's postgresql or set \
                 {POSTGRES_BIN_ENV} (`cargo xtask test` does both)"
            )
        });
        PostgresServer::start_with(&bin).unwrap_or_else(|err| panic!("{err:#}"))
    }

    /// Creates a cluster (`initdb`) with the binaries in `bin` and starts it on a free
    /// loopback port. `initdb --no-sync`, `fsync=off`, `synchronous_commit=off` and
    /// `full_page_writes=off`: fast, and safe for everything but an operating-system
    /// crash or [`PostgresServer::stop`]'s immediate mode, neither of which the tests use
    /// where they count committed rows.
    pub fn start_with(bin: &Path) -> Result<PostgresServer> {
        let as_postgres = is_root();
        let dir = tempfile::Builder::new()
            .prefix("sluice-postgres-")
            .tempdir()
            .context("creating a folder for PostgreSQL")?;
        if as_postgres {
            run(Command::new("chown")
                .arg(format!("{POSTGRES_USER}:"))
                .arg(dir.path()))
            .with_context(|| format!("handing {} to `{POSTGRES_USER}`", dir.path().display()))?;
            let writable = Command::new("runuser")
                .args(["-u", POSTGRES_USER, "--", "test", "-w"])
                .arg(dir.path())
                .status()
                .is_ok_and(|s| s.success());
            if !writable {
                bail!(
                    "the `{POSTGRES_USER}` user cannot write {} (is TMPDIR closed to other \
                     users?); point TMPDIR at a folder it can reach",
                    dir.path().display()
                );
            }
        }
        // The port is free when we look; PostgreSQL binds it a moment later. A clash fails
        // loudly at start-up rather than silently.
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .context("finding a free port for PostgreSQL")?
            .port();
        let mut server = PostgresServer {
            bin: bin.to_path_buf(),
            as_postgres,
            port,
            running: false,
            dir,
        };
        run(server.tool("initdb").arg("-D").arg(server.data()).args([
            "-U",
            POSTGRES_USER,
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--no-sync",
        ]))
        .context("initdb")?;
        server.try_restart()?;
        Ok(server)
    }

    fn tool(&self, name: &str) -> Command {
        tool(&self.bin, name, self.as_postgres)
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// The server's private folder (data, socket, log).
    pub fn folder(&self) -> &Path {
        self.dir.path()
    }

    /// The server's log, kept across restarts.
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("postgres.log")
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The folder of the binaries this server runs.
    pub fn bin(&self) -> &Path {
        &self.bin
    }

    /// `postgres://postgres@127.0.0.1:PORT/DATABASE`.
    pub fn url(&self, database: &str) -> String {
        format!(
            "postgres://{POSTGRES_USER}@127.0.0.1:{}/{database}",
            self.port
        )
    }

    /// Whether the server was started and not stopped since.
    pub fn is_running(&self) -> bool {
        self.running
    }

    /// Creates database `name` (letters, digits, `_`) and returns its URL.
    pub fn create_database(&self, name: &str) -> Result<String> {
        run(self.tool("createdb").args([
            "-h",
            "127.0.0.1",
            "-p",
            &self.port.to_string(),
            "-U",
            POSTGRES_USER,
            name,
        ]))
        .with_context(|| format!("creating database {name}"))?;
        Ok(self.url(name))
    }

    /// Stops the server (`pg_ctl stop -m fast`: sessions are ended, open transactions roll
    /// back, committed ones are on disk); its data stays for [`PostgresServer::restart`].
    pub fn stop(&mut self) {
        self.try_stop().unwrap_or_else(|err| panic!("{err:#}"));
    }

    fn try_stop(&mut self) -> Result<()> {
        if !self.running {
            return Ok(());
        }
        run(self.tool("pg_ctl").arg("-D").arg(self.data()).args([
            "-m",
            "fast",
            "-w",
            "-t",
            PG_CTL_WAIT_SECONDS,
            "stop",
        ]))
        .context("stopping PostgreSQL")?;
        self.running = false;
        Ok(())
    }

    /// Starts the server again on the same port with the same data (stopping it first if
    /// it runs); panics with its log if it does not come up.
    pub fn restart(&mut self) {
        self.try_restart().unwrap_or_else(|err| panic!("{err:#}"));
    }

    fn try_restart(&mut self) -> Result<()> {
        self.try_stop()?;
        let options = format!(
            "-c listen_addresses=127.0.0.1 -p {} -k {} -c max_connections=200 \
             -c fsync=off -c synchronous_commit=off -c full_page_writes=off",
            self.port,
            self.dir.path().display()
        );
        let started = run(self
            .tool("pg_ctl")
            .arg("-D")
            .arg(self.data())
            .arg("-l")
            .arg(self.log_path())
            .args(["-w", "-t", PG_CTL_WAIT_SECONDS, "-o", &options, "start"]));
        match started {
            Ok(_) => {
                self.running = true;
                Ok(())
            }
            Err(err) => {
                // pg_ctl may have given up on a server that still comes up later.
                self.running = true;
                let _ = self.try_stop();
                self.running = false;
                Err(err.context(format!(
                    "PostgreSQL did not start on port {}; its log:\n{}",
                    self.port,
                    log_tail(&self.log_path())
                )))
            }
        }
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        if let Err(err) = self.try_stop() {
            eprintln!("note: {err:#}");
        }
    }
}

/// Stops a cluster a process that ended without cleaning up left in `folder` (made by
/// [`PostgresServer::start_with`]), at once; the caller removes the folder.
pub fn stop_left_behind(bin: &Path, folder: &Path) {
    let _ = tool(bin, "pg_ctl", is_root())
        .arg("-D")
        .arg(folder.join("data"))
        .args(["-m", "immediate", "-w", "stop"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// A fresh database on the server at a URL (such as the suite's, in
/// [`POSTGRES_URL_ENV`]), dropped (forcibly, whatever is connected) on drop. Made with the
/// client tools `createdb` and `dropdb`, from [`server_bin_dir`] or `PATH`.
#[derive(Debug)]
pub struct PostgresDatabase {
    server_url: String,
    name: String,
    url: String,
}

impl PostgresDatabase {
    /// A database named `{prefix}_{unique}` on the server at `server_url`
    /// (`postgres://USER@HOST:PORT/DB`: the database it names is only connected to, to
    /// create the new one).
    pub fn create(server_url: &str, prefix: &str) -> Result<PostgresDatabase> {
        let unique = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        let name = format!("{prefix}_{}_{unique:x}", std::process::id());
        run(client_tool("createdb")
            .arg(format!("--maintenance-db={server_url}"))
            .arg(&name))
        .with_context(|| format!("creating database {name}"))?;
        Ok(PostgresDatabase {
            server_url: server_url.to_string(),
            url: with_database(server_url, &name),
            name,
        })
    }

    /// A fresh database on the suite's server ([`POSTGRES_URL_ENV`]), for a test that
    /// needs PostgreSQL; `None` (with a notice) when the suite gave none, which fails the
    /// test instead when [`REQUIRE_POSTGRES_ENV`] is set, as under `cargo xtask test`.
    pub fn on_the_suites_server(prefix: &str) -> Option<PostgresDatabase> {
        let Ok(server_url) = std::env::var(POSTGRES_URL_ENV) else {
            assert!(
                std::env::var_os(REQUIRE_POSTGRES_ENV).is_none(),
                "{REQUIRE_POSTGRES_ENV} is set but {POSTGRES_URL_ENV} is not"
            );
            eprintln!("skipped: {POSTGRES_URL_ENV} is not set (cargo xtask test sets it)");
            return None;
        };
        Some(
            PostgresDatabase::create(&server_url, prefix)
                .expect("a database on the suite's PostgreSQL"),
        )
    }

    /// The URL of the new database.
    pub fn url(&self) -> &str {
        &self.url
    }
}

impl Drop for PostgresDatabase {
    fn drop(&mut self) {
        let dropped = run(client_tool("dropdb")
            .arg(format!("--maintenance-db={}", self.server_url))
            .args(["--force", "--if-exists"])
            .arg(&self.name));
        if let Err(err) = dropped {
            eprintln!("note: could not drop test database {}: {err:#}", self.name);
        }
    }
}

fn client_tool(name: &str) -> Command {
    match server_bin_dir() {
        Some(bin) if bin.join(name).is_file() => Command::new(bin.join(name)),
        _ => Command::new(name),
    }
}

/// `postgres://user@host:port/db?x` with another database name.
pub fn with_database(url: &str, name: &str) -> String {
    let (base, query) = url
        .split_once('?')
        .map_or((url, None), |(b, q)| (b, Some(q)));
    let authority = base.find("://").map_or(0, |i| i + 3);
    let end = base
        .get(authority..)
        .and_then(|rest| rest.find('/'))
        .map_or(base.len(), |j| authority + j);
    let mut out = format!("{}/{name}", base.get(..end).unwrap_or(base));
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    out
}

#[cfg(test)]
mod tests {
    use std::net::{SocketAddr, TcpStream};
    use std::time::Duration;

    use super::*;

    fn accepts(port: u16) -> bool {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_ok()
    }

    #[test]
    fn with_database_swaps_only_the_database() {
        assert_eq!(
            with_database("postgres://u@h:5/a?sslmode=disable", "b"),
            "postgres://u@h:5/b?sslmode=disable"
        );
        assert_eq!(with_database("postgres://u@h:5", "b"), "postgres://u@h:5/b");
    }

    #[test]
    fn a_cluster_stops_and_starts_again_on_its_port_with_its_data() {
        if !postgres_available() {
            return;
        }
        let mut server = PostgresServer::start();
        let port = server.port();
        assert!(accepts(port));
        let url = server.create_database("kept").expect("createdb");
        assert_eq!(url, format!("postgres://postgres@127.0.0.1:{port}/kept"));
        server.stop();
        assert!(!server.is_running());
        assert!(!accepts(port), "a stopped server accepts nothing");
        server.restart();
        assert_eq!(server.port(), port, "the same port after a restart");
        assert!(accepts(port));
        // The database made before the stop is still there: creating it again fails.
        assert!(server.create_database("kept").is_err());
        // And a database on the server by URL comes and goes.
        let db = PostgresDatabase::create(&server.url("postgres"), "t").expect("createdb by URL");
        assert!(
            db.url()
                .starts_with(&format!("postgres://postgres@127.0.0.1:{port}/t_"))
        );
        let name = db.url().rsplit('/').next().unwrap_or_default().to_string();
        drop(db);
        assert!(
            server.create_database(&name).is_ok(),
            "a dropped database's name is free again"
        );
        let folder = server.folder().to_path_buf();
        drop(server);
        assert!(!accepts(port), "dropped: stopped");
        assert!(!folder.exists(), "dropped: its folder is gone");
    }
}
