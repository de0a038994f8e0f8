//! Records of the private folders of the servers the suite starts, so a run interrupted
//! before it could clean up (Ctrl-C, a killed CI job) is cleaned up by the next one, and a
//! server's log is kept after its folder goes.
//!
//! The folders themselves are made by `sluice-testkit` (see `PostgresServer`: under the
//! system's temporary folder, mode 0700, owned by the account the server runs as). Each is
//! recorded in `target/servers/NAME.dir`; the server's log is copied to
//! `target/servers/NAME.log` when the record is dropped.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use sluice_harness::cmd::{self, note};

/// The record of one server's folder; dropping it keeps the server's log and removes the
/// record (drop it while the folder still exists).
#[derive(Debug)]
pub struct Record {
    name: &'static str,
    /// The file in the folder worth keeping after the run (the server's log).
    log: PathBuf,
}

impl Record {
    /// Records `folder` as server `name`'s, whose log is `log`.
    pub fn new(name: &'static str, folder: &Path, log: PathBuf) -> Result<Record> {
        let record = record_file(name);
        if let Some(parent) = record.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        // Our process id first: a run that finds the record while we still run leaves our
        // server alone (two suites on one machine, e.g. two checkouts).
        let mut contents = format!("{}\n", std::process::id()).into_bytes();
        contents.extend_from_slice(folder.as_os_str().as_encoded_bytes());
        std::fs::write(&record, contents)
            .with_context(|| format!("writing {}", record.display()))?;
        note(format!("{name} data and socket in {}", folder.display()));
        Ok(Record { name, log })
    }

    /// Where the log is kept after the run.
    pub fn kept_log_path(&self) -> PathBuf {
        kept_log_path(self.name)
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        let kept = self.kept_log_path();
        if std::fs::copy(&self.log, &kept).is_ok() {
            note(format!("{} log kept at {}", self.name, kept.display()));
        }
        let _ = std::fs::remove_file(record_file(self.name));
    }
}

/// The folder an earlier run of server `name` recorded and did not remove, if it still
/// exists and the run that made it has ended: the caller stops whatever may still run
/// there, then calls [`remove_stale`]. A run still going keeps its server.
pub fn left_by_earlier_run(name: &'static str) -> Option<PathBuf> {
    let recorded = String::from_utf8(std::fs::read(record_file(name)).ok()?).ok()?;
    let (pid, path) = recorded.split_once('\n')?;
    let still_running = pid.parse::<u32>().is_ok_and(|pid| {
        pid != std::process::id() && Path::new("/proc").join(pid.to_string()).exists()
    });
    if still_running {
        note(format!(
            "a {name} server recorded by process {pid} is still in use: leaving it alone"
        ));
        return None;
    }
    let path = PathBuf::from(path);
    // Only ever a folder the testkit made: never follow a record elsewhere.
    let made_here = path.parent() == Some(std::env::temp_dir().as_path())
        && path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(&format!("sluice-{name}-")));
    (made_here && path.is_dir()).then_some(path)
}

/// Removes a server folder and its record.
pub fn remove_stale(name: &'static str, path: &Path) {
    if let Err(err) = std::fs::remove_dir_all(path) {
        note(format!("could not remove {}: {err}", path.display()));
    }
    let _ = std::fs::remove_file(record_file(name));
}

fn record_file(name: &str) -> PathBuf {
    cmd::project_root()
        .join("target")
        .join("servers")
        .join(format!("{name}.dir"))
}

fn kept_log_path(name: &str) -> PathBuf {
    cmd::project_root()
        .join("target")
        .join("servers")
        .join(format!("{name}.log"))
}
