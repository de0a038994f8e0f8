//! `GET /api/v1/ruleset`: the proxies' long-poll. Its answer is the core's
//! [`RulesetDocument`](sluice_core::wire::RulesetDocument).

use serde::Deserialize;

use crate::query::Whole;

/// What a proxy polls with.
#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query))]
#[serde(deny_unknown_fields)]
pub struct PollQuery {
    /// The version the proxy runs (default 0: none). Answered at once when the current
    /// version is newer.
    #[cfg_attr(feature = "openapi", param(value_type = Option<u64>, minimum = 0, maximum = 9_007_199_254_740_991_u64))]
    pub after: Option<Whole>,
    /// Seconds to hold the request when nothing is newer (default 30; 0 answers at once).
    #[cfg_attr(feature = "openapi", param(minimum = 0, maximum = 60))]
    pub wait: Option<u64>,
}
