//! What `cargo xtask`, the benchmark (`sluice-bench`) and the end-to-end tests
//! (`sluice-tests`) share, defined once.
//!
//! * [`cmd`] and [`apt`]: running commands with their command line shown, installing
//!   Debian packages.
//! * [`http`]: one blocking HTTP/1.1 exchange on loopback.
//! * [`load`]: the load generator of the tests, the benchmark and the demo.
//! * [`background`]: a runtime on a thread of its own, for servers and clients started
//!   from blocking code.
//! * [`envoy`]: an Envoy process started from a bootstrap, its admin interface and stats.
//! * [`upstream`]: the echo server behind Envoy; [`llm`]: a fake LLM API (OpenAI and
//!   Anthropic shapes, JSON and event streams, seeded usage, faults) for token budgets.
//! * [`serve`]: `sluice serve` as a child process.
//! * [`bench_args`]: the benchmark's command line.
//! * [`RedisServer`] and [`PostgresServer`]: throwaway servers for tests (Debian's
//!   `redis-server` on a free loopback port; a PostgreSQL cluster of our own in a private
//!   temporary folder), stopped when dropped, restartable on the same port for fault tests;
//!   [`RedisCluster`]: three masters and their replicas of that `redis-server` in cluster
//!   mode, with a master's failover and a slot's migration for fault tests;
//!   [`PostgresDatabase`]: a fresh database on a server given by URL, such as the suite's.
//!   `cargo xtask test` installs the servers if missing and names them in
//!   `SLUICE_REDIS_SERVER` and `SLUICE_POSTGRES_BIN`; without those variables the tests look
//!   on `PATH` and in `/usr/lib/postgresql/VERSION/bin`.
//!
//! Its dependencies stay light (no `sluice-admin`): xtask is compiled before anything else
//! on a fresh machine, and it depends on this crate.

pub mod apt;
pub mod background;
pub mod bench_args;
pub mod cmd;
pub mod envoy;
pub mod http;
pub mod llm;
pub mod load;
mod postgres;
mod redis;
mod redis_cluster;
pub mod serve;
pub mod upstream;

pub use postgres::{
    POSTGRES_BIN_ENV, POSTGRES_URL_ENV, PostgresDatabase, PostgresServer, REQUIRE_POSTGRES_ENV,
    postgres_available, server_bin_dir, stop_left_behind, with_database,
};
pub use redis::{
    CommandStat, CommandStats, REDIS_SERVER_ENV, REQUIRE_REDIS_ENV, RedisServer, redis_available,
};
pub use redis_cluster::RedisCluster;

use std::time::{Duration, Instant};

use anyhow::{Result, bail};

/// Set by `cargo xtask test` and `bench` to the built filter.
pub const FILTER_WASM_ENV: &str = "SLUICE_FILTER_WASM";
/// Set by `cargo xtask test` and `bench` to the built `sluice` binary.
pub const SLUICE_BIN_ENV: &str = "SLUICE_BIN";
/// The Envoy binary: chosen by the user, or set by `cargo xtask` to the one it provisioned.
pub const ENVOY_ENV: &str = "SLUICE_ENVOY";
/// Set by `cargo xtask test` to `target/dist/oci/`, the image layouts `cargo xtask build` wrote.
pub const OCI_DIR_ENV: &str = "SLUICE_OCI_DIR";
/// Set by `cargo xtask test` to skopeo (it installs Debian's `skopeo` if missing).
pub const SKOPEO_ENV: &str = "SLUICE_SKOPEO";
/// Set by `cargo xtask test` to Debian's `docker-registry` (installed if missing).
pub const DOCKER_REGISTRY_ENV: &str = "SLUICE_DOCKER_REGISTRY";
/// Set by `cargo xtask test` to Chromium (it installs Debian's `chromium` if missing).
pub const CHROMIUM_ENV: &str = "SLUICE_CHROMIUM";
/// Set by `cargo xtask test` to chromedriver (Debian's `chromium-driver`).
pub const CHROMEDRIVER_ENV: &str = "SLUICE_CHROMEDRIVER";
/// Set by `cargo xtask test` to `kubernetes-validate` (PyPI, in the project's `.venv/`).
pub const KUBERNETES_VALIDATE_ENV: &str = "SLUICE_KUBERNETES_VALIDATE";
/// Set by `cargo xtask test` to `check-jsonschema` (PyPI, in the project's `.venv/`).
pub const CHECK_JSONSCHEMA_ENV: &str = "SLUICE_CHECK_JSONSCHEMA";

/// Polls `check` every 20 ms until it holds, for at most `limit`; an error naming `what`
/// after that, or as soon as `check` fails.
pub fn wait_until(
    what: &str,
    limit: Duration,
    mut check: impl FnMut() -> Result<bool>,
) -> Result<()> {
    let deadline = Instant::now() + limit;
    while !check()? {
        if Instant::now() > deadline {
            bail!(
                "timed out after {} s waiting for {what}",
                limit.as_secs_f32()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}
