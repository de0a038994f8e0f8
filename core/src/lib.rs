//! Sluice's pure core: everything about rate limiting that does not touch a host.
//!
//! * [`spec`]: the rule model as users write it (JSON/YAML), shared with the admin API.
//! * [`rule`] and [`ruleset`]: validation at the edge, compiled matchers, client keys,
//!   and the per-request [`ruleset::Ruleset::decide`].
//! * [`identity`]: who the caller is, as other filters verified it (dynamic metadata such
//!   as JWT claims, the TLS peer's certificate), read for keys and match conditions.
//! * [`validation`]: the field errors every check at the edge reports.
//! * [`time`]: [`time::Nanos`], the one type of every `now`, bucket state and duration.
//! * [`gcra`]: token buckets as one theoretical-arrival-time per bucket.
//! * [`slot`], [`store`] and [`limiter`]: the fixed-size bucket table in shared data,
//!   compare-and-swap updates and all-or-nothing charging; [`denials`]: the waits a
//!   worker remembers, so a throttled client is denied again without a read; [`bucket`]:
//!   the bucket set to charge and what charging it gives back, the words they share.
//! * [`response`]: the headers and body clients see; [`grpc`]: the same for gRPC calls.
//! * [`in_flight`]: in-flight limits: places held in shared data while requests are in
//!   flight, let go when their streams end, lapsing if nobody can let them go.
//! * [`delay`]: a worker's queue of requests that wait for their tokens (`on_limit:
//!   delay`) instead of being refused, with its bounds.
//! * [`global`]: fleet-wide buckets: leases granted by a coordinator, spent locally.
//! * [`config`]: the filter's plugin configuration.
//! * [`listening`]: the line `sluice serve` announces its address with.
//! * [`rls`]: Envoy's rate limit service (`envoy.service.ratelimit.v3`) decided by rules
//!   with a `descriptor` section, over the coordinator's buckets.
//! * [`estimate`]: rule dry runs: what a rule would have throttled of recorded traffic.
//! * [`usage`]: LLM token usage read from response bodies (JSON or event streams) as they
//!   pass, for token budgets.
//!
//! Architecture invariant: nothing here performs I/O or reads a clock. Every `now` is an
//! argument in [`time::Nanos`], and storage is the [`store::SharedStore`] trait, so the same
//! code runs in Envoy (wasm32) and in native tests.

// Requests, configurations and shared-data bytes are untrusted: library code indexes
// only through checked accessors, so no input can make it panic.
#![cfg_attr(
    not(test),
    deny(
        clippy::indexing_slicing,
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic
    )
)]

pub mod bucket;
pub mod config;
pub mod control;
pub mod delay;
pub mod denials;
pub mod estimate;
pub mod gcra;
pub mod global;
pub mod grpc;
pub mod hash;
pub mod identity;
pub mod in_flight;
pub mod limiter;
pub mod listening;
pub mod report;
pub mod request;
pub mod response;
pub mod rls;
pub mod rule;
pub mod ruleset;
pub mod slot;
pub mod spec;
pub mod store;
pub mod time;
pub mod tokens;
pub mod usage;
pub mod validation;
pub mod wire;
