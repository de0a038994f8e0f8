//! The `sluice` binary's library: the admin API server and its database, the command
//! line's HTTP client, and Envoy configuration generation.
//!
//! * [`store`]: rules, versions, audit log, tokens and proxies in SQLite or PostgreSQL.
//! * [`api`]: the HTTP API, `api::app(state) -> Router`.
//! * [`server`]: binding, bootstrap token, graceful shutdown; [`tls`]: serving over TLS.
//! * [`pipeline`]: proxies' reports aggregated in memory, flushed to time series.
//! * [`ui`]: the dashboard's embedded files, served at `/`.
//! * [`client`]: what `sluice rules apply|export` use to talk to a running server.
//! * [`envoy_config`] and [`rules_file`]: `sluice envoy-config` and rules files.

pub mod api;
pub mod client;
pub mod envoy_config;
pub mod pipeline;
pub mod quota;
pub mod rules_file;
pub mod server;
pub mod store;
pub mod strict_json;
pub mod tls;
pub mod ui;
