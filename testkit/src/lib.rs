//! Throwaway servers for Sluice's tests, one definition for every test crate.
//!
//! * [`RedisServer`]: Debian's `redis-server` on a free loopback port, with its files in a
//!   private temporary folder, no persistence, stopped when dropped; it can be killed and
//!   started again on the same port, for fault tests.
//! * [`PostgresServer`]: a PostgreSQL cluster of our own (`initdb` in a private temporary
//!   folder, 127.0.0.1 on a free port), stopped and started again on the same port with
//!   the same data, for outage tests; [`PostgresDatabase`]: a fresh database on a server
//!   given by URL, such as the suite's.
//!
//! `cargo xtask test` installs `redis-server` if it is missing and names it in
//! `SLUICE_REDIS_SERVER`; without that variable the tests look for `redis-server` on `PATH`.
//! Likewise it installs PostgreSQL and names its binaries' folder in `SLUICE_POSTGRES_BIN`;
//! without it the tests look in `/usr/lib/postgresql/VERSION/bin`.

mod postgres;
mod redis;

pub use postgres::{
    POSTGRES_BIN_ENV, POSTGRES_URL_ENV, PostgresDatabase, PostgresServer, REQUIRE_POSTGRES_ENV,
    postgres_available, server_bin_dir, stop_left_behind, with_database,
};
pub use redis::{REDIS_SERVER_ENV, REQUIRE_REDIS_ENV, RedisServer, redis_available};
