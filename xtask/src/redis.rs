//! Redis for the tests: Debian's `redis-server`, installed if missing.
//!
//! The tests start their own throwaway servers (`sluice-testkit`'s `RedisServer`: a free
//! loopback port, files in a private temporary folder, nothing persisted), so fault tests
//! can kill and restart one without disturbing another. This step only makes sure the
//! binary is there and tells the tests where it is.

use std::path::PathBuf;

use anyhow::{Context, Result};

use crate::apt;
use crate::cmd::{self, note, step};

/// Where the tests find the server binary (read by `sluice-testkit`).
pub const SERVER_ENV: &str = "SLUICE_REDIS_SERVER";
/// Set for the test run: tests that need Redis fail instead of skipping when it is missing.
pub const REQUIRE_ENV: &str = "SLUICE_REQUIRE_REDIS";

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
