//! The admin API's JSON wire types: what `sluice serve` answers and reads, what the
//! dashboard and the command line send and parse. One definition of each, so a field
//! cannot drift between the server and its clients.
//!
//! Serde only, so the crate builds for the host and for wasm32 alike. With the `openapi`
//! feature the types also derive their OpenAPI schemas (`utoipa`), carrying the bounds,
//! patterns and examples the server checks; the admin API's document is generated from
//! them. Types the core owns (rule specs, the ruleset document, proxies' reports) are the
//! core's, re-exported where a client needs them.
//!
//! Times are RFC 3339 strings; metric times and ranges are Unix milliseconds.

// The rule's hand-written schema (`schema.rs`) is one `json!` deep enough to need more
// than the default 128.
#![recursion_limit = "256"]

pub mod audit;
pub mod metrics;
pub mod problem;
pub mod proxies;
pub mod query;
pub mod rules;
pub mod ruleset;
#[cfg(feature = "openapi")]
pub mod schema;
pub mod session;
pub mod tokens;
pub mod versions;

pub use audit::{AuditEntryView, AuditList, AuditQuery};
pub use metrics::{
    ClientHistory, ClientMetrics, ClientMetricsList, ClientPoint, ClientRule, ClientsQuery,
    Overview, OverviewQuery, ProxySummary, RangeQuery, RuleMetrics, RuleMetricsList, Series,
    SeriesPoint, SeriesQuery, StreamEvent, StreamRule, SyncAnswerTimes,
};
pub use problem::{FieldError, Problem};
pub use proxies::{GlobalSyncView, ProxyList, ProxyView};
pub use query::{MAX_SAFE_INTEGER, Whole};
pub use rules::{ApplyQuery, ChangeSummary, ListQuery, RuleEstimate, RuleList, RuleView, etag};
pub use ruleset::PollQuery;
pub use session::{SessionView, SignIn};
pub use sluice_core::spec::RuleSpec;
pub use sluice_core::wire::RulesetDocument;
pub use tokens::{CreateToken, CreatedToken, Role, TokenList, TokenView};
pub use versions::{
    ChangeKind, DiffQuery, DiffView, RuleChangeView, VersionDetailView, VersionList, VersionView,
    VersionsQuery,
};
