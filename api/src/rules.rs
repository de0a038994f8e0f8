//! `/api/v1/rules`: rules as stored, pages of them, and what a bulk change did.

use serde::{Deserialize, Serialize};
use sluice_core::spec::{Mode, RuleSpec};

use crate::query::Whole;
#[cfg(feature = "openapi")]
use crate::schema::{ModeName, RuleSpecSchema};

/// A stored rule: its spec and the metadata the server keeps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RuleView {
    /// The rule's id (its `id`, or its name when it has none): its URL is
    /// `/api/v1/rules/{id}`.
    pub id: String,
    /// The ruleset version that last changed this rule; the rule's `ETag` is this number
    /// in quotes.
    pub revision: u64,
    pub created_at: String,
    pub updated_at: String,
    /// The rule as written, the body `PUT` takes.
    #[cfg_attr(feature = "openapi", schema(value_type = RuleSpecSchema))]
    pub spec: RuleSpec,
}

impl RuleView {
    /// The rule's `ETag`: its revision, quoted (strong).
    pub fn etag(&self) -> String {
        etag(self.revision)
    }
}

/// The `ETag` of a rule at a revision, or of the ruleset at a version: strong, quoted.
pub fn etag(revision: u64) -> String {
    format!("\"{revision}\"")
}

/// One page of rules, in evaluation order (highest priority first, then by name).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RuleList {
    pub rules: Vec<RuleView>,
    /// Rules matching the filter on all pages.
    pub total: u64,
    pub limit: u32,
    pub offset: u64,
}

/// `GET /api/v1/rules`'s filter and page.
#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query))]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// Only rules whose name contains this (case-insensitive).
    pub name: Option<String>,
    /// Only enabled (`true`) or disabled (`false`) rules.
    pub enabled: Option<bool>,
    /// Only rules in this mode.
    #[cfg_attr(feature = "openapi", param(inline, value_type = Option<ModeName>))]
    pub mode: Option<Mode>,
    /// Page size (default 100).
    #[cfg_attr(feature = "openapi", param(minimum = 1, maximum = 1000))]
    pub limit: Option<u32>,
    /// Rules to skip (default 0).
    #[cfg_attr(feature = "openapi", param(value_type = Option<u64>, minimum = 0, maximum = 9_007_199_254_740_991_u64))]
    pub offset: Option<Whole>,
}

/// What a bulk change did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ChangeSummary {
    /// Whether a new ruleset version was made (or, for a dry run, would be).
    pub changed: bool,
    pub dry_run: bool,
    /// The ruleset version now current.
    pub version: u64,
    pub added: Vec<String>,
    pub updated: Vec<String>,
    pub removed: Vec<String>,
    /// A dry run's estimate, per added or updated rule, of what it would have throttled
    /// of the last hour's traffic (absent from an applied change).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub estimates: Vec<RuleEstimate>,
}

/// What a new or changed rule would have throttled of the traffic recorded over the last
/// hour (`POST /api/v1/rules:estimate`, and each rule of a dry-run apply): the recorded
/// clients' requests replayed, 10 s bucket by 10 s bucket, through the rule's limits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RuleEstimate {
    /// The rule estimated (its id).
    pub rule: String,
    /// The rule whose recorded traffic was replayed: this rule itself, or a rule with the
    /// same match and key. Absent: no traffic was recorded under this match and key, and
    /// nothing is estimated.
    pub traffic_of: Option<String>,
    /// The window replayed, in seconds (the last hour).
    pub window_seconds: u64,
    /// Requests the rule with this traffic decided in the window (exact).
    pub requests: u64,
    /// Requests that would have been throttled, of those replayed.
    pub throttled_requests: u64,
    /// Clients with at least one throttled request.
    pub throttled_clients: u64,
    /// Clients and requests replayed: those in the recorded top clients.
    pub replayed_clients: u64,
    pub replayed_requests: u64,
    /// Of the replayed requests, how many may belong to other clients (the recorded
    /// counts are upper bounds).
    pub uncertain_requests: u64,
    /// Requests of clients outside the recorded top clients: not replayed, so at most
    /// this many more could be throttled.
    pub untracked_requests: u64,
    /// Clients left out by the estimate's work bound, and their requests.
    pub skipped_clients: u64,
    pub skipped_requests: u64,
}

impl RuleEstimate {
    /// The estimate in one sentence, as the CLI and the dashboard show it.
    pub fn sentence(&self) -> String {
        let Some(source) = &self.traffic_of else {
            return format!(
                "{}: no traffic was recorded under this match and key in the last hour, so \
                 nothing can be estimated (run the rule in `mode: shadow` for a while to see \
                 what it would throttle)",
                self.rule
            );
        };
        let minutes = self.window_seconds / 60;
        let from = if *source == self.rule {
            String::new()
        } else {
            format!(" (traffic of rule {source})")
        };
        let mut text = format!(
            "{}: would have throttled ~{} of {} requests from {} of {} clients in the last {minutes} minutes{from}",
            self.rule,
            self.throttled_requests,
            self.requests,
            self.throttled_clients,
            self.replayed_clients,
        );
        if self.untracked_requests > 0 {
            text.push_str(&format!(
                "; {} requests of less busy clients were not replayed (at most that many more)",
                self.untracked_requests
            ));
        }
        if self.skipped_clients > 0 {
            text.push_str(&format!(
                "; {} clients ({} requests) were left out by the work bound",
                self.skipped_clients, self.skipped_requests
            ));
        }
        text
    }
}

/// `POST /api/v1/rules:apply`'s options.
#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query))]
#[serde(deny_unknown_fields)]
pub struct ApplyQuery {
    /// Delete rules that are not in the file.
    #[serde(default)]
    pub prune: bool,
    /// Validate and report what would change, without changing anything.
    #[serde(default)]
    pub dry_run: bool,
}
