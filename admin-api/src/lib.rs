//! The admin API server. The `sluice` command line that runs it is the `sluice-cli` crate
//! (`cli/`); the coordinator of fleet-wide buckets is `sluice-coordinator`
//! (`coordinator/`); Envoy configuration generation is `sluice-envoy-config`, rules files
//! `sluice-rules-file` and the command line's HTTP client `sluice-client`, so that none of
//! them drags the server along.
//!
//! The server's parts; each uses only parts listed above it:
//!
//! * [`store`]: rules, versions, audit log, tokens, proxies and metric series in SQLite or
//!   PostgreSQL, the only writer of the database.
//! * [`pipeline`]: proxies' reports aggregated in memory, flushed to time series.
//! * [`tls`]: serving over TLS (`--tls-cert`/`--tls-key`).
//! * [`http`]: the HTTP API, `http::app(state) -> Router` (the sync endpoint hands
//!   fleet-wide buckets to [`sluice_coordinator`]).
//! * [`ui`]: the dashboard's embedded files, beside the API.
//! * [`conn`]: the accept loop of every listener, within a connection budget (cap,
//!   handshake, head and idle timeouts).
//! * [`rls`]: Envoy's rate limit service over gRPC (`--rls-listen`), beside the API.
//! * [`server`]: the site (the API, and the dashboard at every path the API does not
//!   route), binding, bootstrap token, graceful shutdown.

pub mod conn;
pub mod http;
pub mod pipeline;
pub mod rls;
/// Rules files and strict JSON: the `sluice-rules-file` crate, through which the API and
/// the command line's client read rules.
pub(crate) use sluice_rules_file as rules_file;
pub mod server;
pub mod store;
#[cfg(feature = "test-support")]
pub mod testing;
pub mod tls;
pub(crate) mod ui;
