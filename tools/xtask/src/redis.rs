//! Redis for the tests: Debian's `redis-server`, installed if missing.
//!
//! The tests start their own throwaway servers (`sluice-harness`'s `RedisServer`: a free
//! loopback port, files in a private temporary folder, nothing persisted), so fault tests
//! can kill and restart one without disturbing another. This step only makes sure the
//! binary is there and tells the tests where it is.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use sluice_harness::apt;
use sluice_harness::cmd::{self, note, step};
use sluice_harness::{REDIS_SERVER_ENV, REQUIRE_REDIS_ENV};

/// The `redis-server` binary: on `PATH`, or installed from Debian's packages.
pub fn ensure_server() -> Result<PathBuf> {
    step("Redis for the tests: redis-server");
    if let Some(found) = cmd::which("redis-server") {
        note(format!("found {}", found.display()));
        return Ok(found);
    }
    note("redis-server is not on PATH");
    apt::install(&["redis-server"]).context("installing Redis")?;
    cmd::which("redis-server")
        .or_else(|| {
            let debian = PathBuf::from("/usr/bin/redis-server");
            cmd::is_executable(&debian).then_some(debian)
        })
        .context("redis-server was installed but is not on PATH")
}

/// The environment that tells the tests (and the benchmark) where `server` is, and makes
/// the tests that need Redis fail instead of skipping when it is missing.
pub fn env(server: &Path) -> [(&'static str, &OsStr); 2] {
    [
        (REDIS_SERVER_ENV, server.as_os_str()),
        (REQUIRE_REDIS_ENV, OsStr::new("1")),
    ]
}
