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
mod tls;
mod upstream;

use std::time::{Duration, Instant};

pub use admin::{ADMIN_TOKEN, AdminServer};
pub use artifacts::{Artifacts, ENVOY_ENV, FILTER_WASM_ENV, SLUICE_BIN_ENV, workspace_root};
pub use client::{Client, Req, Resp, StatusCounts};
pub use envoy::{Envoy, EnvoyOptions, Target, UpstreamProtocol, admin_request, parse_stats};
pub use hyper::Method;
pub use sluice_core::spec::FailureMode;
pub use tls::{SERVER_NAMES, TestPki};
pub use upstream::Upstream;

/// Polls `check` every 50 ms until it holds; panics naming `what` after `timeout`.
pub fn wait_for(what: &str, timeout: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    loop {
        if check() {
            return;
        }
        if Instant::now() >= deadline {
            panic!(
                "timed out after {} s waiting for {what}",
                timeout.as_secs_f32()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
