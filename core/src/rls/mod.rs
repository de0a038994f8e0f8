//! Envoy's rate limit service (RLS, `envoy.service.ratelimit.v3.RateLimitService`)
//! decided by Sluice's rules, without I/O: the admin API's gRPC listener
//! (`sluice serve --rls-listen`) is thin glue over this module and the coordinator's
//! bucket store.
//!
//! A rule with a `descriptor` section applies to RLS requests only (the filter never
//! matches it): it names a domain and a descriptor's entries in order, each a key with an
//! optional value. A request's descriptor is decided as envoyproxy/ratelimit decides it:
//! walking its entries level by level, a fixed value beats a value prefix beats a key
//! alone, and the choice made at one level holds for the levels below ([`select`]). The values of the entries the rule leaves
//! open are the client key (joined with `|` when several), so per-client overrides apply to
//! them, and every limit of the rule is a token bucket (GCRA) of that client, kept where
//! fleet-wide buckets live. A rule may instead answer without buckets (`unlimited`,
//! `deny`), match values by prefix, and replace other rules within one request: every
//! behaviour of envoyproxy/ratelimit's configuration format (`docs/rls.md`).
//!
//! The parts, each using only those before it: [`spec`] (the rule's section as written),
//! [`descriptor`] (it validated, and how it matches), [`request`] (what Envoy asks, and
//! its bounds), [`select`] (which rule and buckets each descriptor gets), [`verdict`]
//! (charging them: all-or-nothing over the enforced limits, shadow limits apart, one
//! status per descriptor), [`outcome`] (what each status counts as in the rule's
//! statistics, in the filter's words), [`quota`] (Envoy's quota service, RLQS: bucket ids read as
//! descriptors, usage charged, token-bucket assignments shared among streams).

pub mod descriptor;
pub mod outcome;
pub mod quota;
pub mod request;
pub mod select;
pub mod spec;
pub mod verdict;

pub use descriptor::{DescriptorMatch, ValueMatch};
pub use request::{RequestError, RlsDescriptor, RlsRequest};
pub use select::{Charge, Matched, Plan, Planned, RlsRules};
pub use spec::{Answer, DescriptorSpec, EntrySpec};
pub use verdict::{Code, Decided, Status, decide, failed};

/// Longest domain, in a rule or a request (characters).
pub const MAX_DOMAIN_LEN: usize = 256;
/// Longest descriptor entry key (characters).
pub const MAX_KEY_LEN: usize = 256;
/// Longest descriptor entry value (characters).
pub const MAX_VALUE_LEN: usize = 1_024;
/// Most entries in one descriptor, in a rule or a request.
pub const MAX_ENTRIES: usize = 16;
/// Most descriptors in one request.
pub const MAX_DESCRIPTORS: usize = 64;
