//! Sluice's proxy-wasm HTTP filter: thin host glue over `sluice-core`.
//!
//! * [`root`]: root contexts: one per worker VM (configuration, compiled ruleset, and a
//!   candidacy for the control service when configured), or the singleton on the main
//!   thread.
//! * [`election`]: which root runs the control service (the singleton, or one elected
//!   worker where no bootstrap extension is allowed): a lease in shared data.
//! * [`control`]: the control service, glue over the core's state machines
//!   (`sluice_core::control`): long-polls the admin API and publishes rulesets through
//!   [`ruleset_channel`] (shared data) to every worker, reports statistics, and syncs
//!   global buckets.
//! * [`http`]: one per request; asks the core for a decision and answers or forwards.
//! * [`tokens`]: a request's token reservations until its response ends: the response
//!   body read as it passes, the usage committed, or a refund.
//! * [`in_flight`]: a worker's requests' places under in-flight limits: kept while
//!   they live, let go when their streams end, refreshed from the tick.
//! * [`delay`]: a worker's requests waiting for their tokens (`on_limit: delay`):
//!   queued by their own context, resumed from the root's tick when due, refunded when
//!   their stream ends first.
//! * [`shared`]: what a worker's root and its requests share (configuration, stores,
//!   metrics, statistics).
//! * [`clock`]: the host's wall clock, read in one place.
//! * [`host_store`]: the core's `SharedStore` over proxy-wasm shared data (bucket slots
//!   and lease entries).
//! * [`global_channel`]: the fleet view and the lease table's size, between the control
//!   service and the workers; [`report_channel`]: statistics from the workers to the
//!   control service; [`channel`]: `ChannelError`, how any of these channels fails.
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

pub mod channel;
pub mod clock;
pub mod control;
pub mod delay;
pub mod election;
pub mod global_channel;
pub mod host_store;
pub mod http;
pub mod identity;
pub mod in_flight;
pub mod metrics;
pub mod report_channel;
pub mod request;
pub mod root;
pub mod ruleset_channel;
pub mod shared;
pub mod tokens;

use proxy_wasm::types::LogLevel;

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|context_id| Box::new(root::SluiceRoot::new(context_id)));
}}
