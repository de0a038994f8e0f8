//! The end-to-end test harness: a real Envoy running the built filter, an echo upstream
//! and a load driver.
//!
//! ```no_run
//! use serde_json::json;
//! use sluice_tests::{Client, Envoy, EnvoyOptions, Req, Upstream};
//!
//! let upstream = Upstream::start();
//! let envoy = Envoy::start(EnvoyOptions {
//!     rules: json!([{"name": "per-key", "key": {"header": "x-api-key"},
//!                    "limits": [{"requests": 5, "period": "second"}]}]),
//!     upstream: upstream.target(),
//!     ..Default::default()
//! });
//! let client = Client::connect(envoy.listener_addr(), 4);
//! let responses = client.run((0..10).map(|_| Req::get("/").header("x-api-key", "alice")));
//! assert_eq!(responses.iter().filter(|r| r.status == 429).count(), 5);
//! assert_eq!(envoy.counter("wasmcustom.sluice_denied_total"), 5);
//! ```
//!
//! Artifacts come from `cargo xtask test` (see [`Artifacts::from_env`]). Everything binds
//! 127.0.0.1 on ports the kernel chooses, so tests may run in parallel; every process and
//! thread the harness starts stops when its handle is dropped.

mod admin;
mod artifacts;
pub mod browser;
mod client;
mod envoy;
pub mod h2;
pub mod page;
pub mod registry;
mod tls;
mod upstream;

use std::time::Duration;

pub use admin::AdminServer;
pub use artifacts::{Artifacts, ENVOY_ENV, FILTER_WASM_ENV, SLUICE_BIN_ENV, workspace_root};
pub use client::Client;
pub use envoy::{Envoy, EnvoyOptions, Target, UpstreamProtocol};
pub use hyper::Method;
pub use sluice_core::spec::FailureMode;
pub use sluice_envoy_config::ControlMode;
pub use sluice_harness::load::{Outcome, Req, Resp, Tally};
pub use sluice_harness::serve::ADMIN_TOKEN;
pub use tls::{SERVER_NAMES, TestPki};
pub use upstream::Upstream;

/// A rule `name` giving every client on `/PREFIX/` one bucket of `burst`, refilled one
/// token a minute (nothing over a test's seconds): exactly `burst` requests pass, however
/// they are spread over connections and workers.
pub fn burst_rule(name: &str, prefix: &str, burst: u64) -> serde_json::Value {
    serde_json::json!({
        "name": name, "match": {"path_prefix": format!("/{prefix}/")}, "key": "global",
        "limits": [{"requests": 1, "period": "minute", "burst": burst}]
    })
}

/// Polls `check` until it holds; panics naming `what` after `timeout`.
pub fn wait_for(what: &str, timeout: Duration, mut check: impl FnMut() -> bool) {
    sluice_harness::wait_until(what, timeout, || Ok(check()))
        .unwrap_or_else(|err| panic!("{err:#}"));
}
