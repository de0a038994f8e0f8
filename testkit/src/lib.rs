//! Throwaway servers for Sluice's tests, one definition for every test crate.
//!
//! * [`RedisServer`]: Debian's `redis-server` on a free loopback port, with its files in a
//!   private temporary folder, no persistence, stopped when dropped; it can be killed and
//!   started again on the same port, for fault tests.
//!
//! `cargo xtask test` installs `redis-server` if it is missing and names it in
//! `SLUICE_REDIS_SERVER`; without that variable the tests look for `redis-server` on `PATH`.

mod redis;

pub use redis::{REDIS_SERVER_ENV, REQUIRE_REDIS_ENV, RedisServer, redis_available};
