//! The `sluice` binary's library: the admin API server. The command line itself is the
//! binary (`main.rs` and `cli/`, one module per subcommand); Envoy configuration
//! generation is the `sluice-envoy-config` crate, rules files the `sluice-rules-file`
//! crate and the command line's HTTP client the `sluice-client` crate, so that none of
//! them drags the server along.
//!
//! The server's parts; each uses only parts listed above it:
//!
//! * [`store`]: rules, versions, audit log, tokens, proxies and metric series in SQLite or
//!   PostgreSQL, the only writer of the database.
//! * [`pipeline`]: proxies' reports aggregated in memory, flushed to time series.
//! * [`quota`]: the coordinator of fleet-wide (`scope: global`) buckets, in memory or Redis.
//! * [`tls`]: serving over TLS (`--tls-cert`/`--tls-key`).
//! * [`api`]: the HTTP API, `api::app(state) -> Router`.
//! * [`ui`]: the dashboard's embedded files, beside the API.
//! * [`server`]: the site (the API, and the dashboard at every path the API does not
//!   route), binding, bootstrap token, graceful shutdown.

pub mod api;
pub mod pipeline;
pub mod quota;
/// Rules files and strict JSON: the `sluice-rules-file` crate, through which the API and
/// the command line's client read rules.
pub use sluice_rules_file as rules_file;
pub mod server;
pub mod store;
pub mod tls;
pub mod ui;
