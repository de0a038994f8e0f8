//! Sluice's proxy-wasm HTTP filter: thin host glue over `sluice-core`.
//!
//! * [`root`]: one per worker VM; reads the plugin configuration and owns the compiled
//!   ruleset.
//! * [`http`]: one per request; asks the core for a decision and answers or forwards.
//! * [`host_store`]: the core's `SharedStore` over proxy-wasm shared data.
//! * [`metrics`]: Envoy counters.
//!
//! Architecture invariant: this crate holds no rate-limiting logic. It reads the host
//! (headers, clock, shared data), calls the core, and writes the host. It never panics:
//! host results are matched, not unwrapped, and the SDK's `String` accessors (which
//! panic on non-UTF-8 bytes) are avoided in favour of their byte forms.

#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]
#![deny(clippy::indexing_slicing)]

pub mod host_store;
pub mod http;
pub mod metrics;
pub mod root;

use proxy_wasm::types::LogLevel;

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_context_id| Box::new(root::SluiceRoot::default()));
}}
