//! Private folders for the throwaway servers the suite starts (PostgreSQL, Redis).
//!
//! A server's data and its unix socket live in a fresh folder under the system's temporary
//! folder, never inside the checkout: a checkout may sit below folders closed to other users
//! (`/root`, any `mktemp -d`), and PostgreSQL refuses to run as root, so its own account must
//! reach its data. The folder is created with mode 0700 and, where a server runs as another
//! account, handed to that account, so nobody else can read the data or use the socket.
//!
//! Each server's folder is recorded in `target/servers/NAME.dir`, so a run interrupted
//! before it could clean up (Ctrl-C, a killed CI job) is cleaned up by the next one.

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};

use crate::cmd::{self, note};

/// A private folder for one server, removed on drop (after copying its log, if any, to
/// `target/servers/NAME.log` for a look after a failed run).
#[derive(Debug)]
pub struct ServerDir {
    name: &'static str,
    path: PathBuf,
    /// The file inside the folder worth keeping after the run.
    log: Option<PathBuf>,
}

impl ServerDir {
    /// Creates a new folder for the server `name`, owned by `owner` (an account name) when
    /// given. Call [`ServerDir::left_by_earlier_run`] first to clean up after an interrupted run.
    pub fn create(name: &'static str, owner: Option<&str>) -> Result<ServerDir> {
        let unique = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        let path =
            std::env::temp_dir().join(format!("sluice-{name}-{}-{unique:08x}", std::process::id()));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .with_context(|| format!("creating {}", path.display()))?;
        let dir = ServerDir {
            name,
            path,
            log: None,
        };
        if let Some(owner) = owner {
            cmd::run(
                Command::new("chown")
                    .arg(format!("{owner}:"))
                    .arg(&dir.path),
            )
            .with_context(|| format!("handing {} to `{owner}`", dir.path.display()))?;
        }
        let record = record_file(name);
        if let Some(parent) = record.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        std::fs::write(&record, dir.path.as_os_str().as_encoded_bytes())
            .with_context(|| format!("writing {}", record.display()))?;
        note(format!("{name} data and socket in {}", dir.path.display()));
        Ok(dir)
    }

    /// The folder an earlier run of server `name` recorded and did not remove, if it still
    /// exists: the caller stops whatever may still run there, then calls
    /// [`remove_stale`].
    pub fn left_by_earlier_run(name: &'static str) -> Option<PathBuf> {
        let recorded = std::fs::read(record_file(name)).ok()?;
        let path = PathBuf::from(String::from_utf8(recorded).ok()?);
        // Only ever a folder this module made: never follow a record elsewhere.
        let made_here = path.parent() == Some(std::env::temp_dir().as_path())
            && path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("sluice-{name}-")));
        (made_here && path.is_dir()).then_some(path)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Names the file to keep after the run (e.g. the server's log).
    pub fn keep_log(&mut self, file_name: &str) -> PathBuf {
        let log = self.path.join(file_name);
        self.log = Some(log.clone());
        log
    }

    /// Where the kept log is copied when the folder goes.
    pub fn kept_log_path(&self) -> PathBuf {
        cmd::project_root()
            .join("target")
            .join("servers")
            .join(format!("{}.log", self.name))
    }
}

impl Drop for ServerDir {
    fn drop(&mut self) {
        if let Some(log) = &self.log {
            let kept = self.kept_log_path();
            if std::fs::copy(log, &kept).is_ok() {
                note(format!("{} log kept at {}", self.name, kept.display()));
            }
        }
        remove_stale(self.name, &self.path);
    }
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
