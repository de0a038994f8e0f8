//! The filter's plugin configuration: the JSON Envoy hands the filter at start-up.
//!
//! It carries static rules in the same shape the admin API accepts, so the filter works
//! with no control plane, plus the proxy-wide settings below. `sluice envoy-config`
//! writes it; users may also write it by hand.

use std::num::NonZeroU32;

use serde::{Deserialize, Serialize};

use crate::global::table::LeaseTable;
use crate::limiter::SlotTable;
use crate::response::RateLimitHeaders;
use crate::ruleset::Ruleset;
use crate::spec::{FailureMode, RuleSpec};
use crate::validation::ValidationErrors;

/// Default size of the bucket slot table: about 65k concurrently active clients, roughly
/// 10 MiB of Envoy memory (Envoy keeps about 94 bytes per key, plus the value).
pub const DEFAULT_SLOTS: u32 = 65_536;
/// Bounds on the slot table size.
pub const MIN_SLOTS: u32 = 16;
pub const MAX_SLOTS: u32 = 4_194_304;
/// Default size of the lease table (global buckets a proxy tracks at once). The control
/// service reads every entry once per sync interval, so this also bounds that scan.
pub const DEFAULT_GLOBAL_SLOTS: u32 = 4_096;
pub const MAX_GLOBAL_SLOTS: u32 = 65_536;
/// The header set on requests forwarded upstream when a shadow rule would have denied.
pub const DEFAULT_SHADOW_HEADER: &str = "x-sluice-shadow-denied";

/// The configuration as written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FilterConfigSpec {
    /// Rules enforced from start-up.
    #[serde(default)]
    pub rules: Vec<RuleSpec>,
    /// What rules without their own `failure_mode` do when they cannot be evaluated.
    #[serde(default)]
    pub failure_mode: FailureMode,
    /// Number of bucket slots: the bound on Envoy memory used for buckets.
    #[serde(default = "default_slots")]
    pub slots: u32,
    /// Number of lease-table entries: the most global buckets (clients of `scope: global`
    /// limits) this proxy tracks at once.
    #[serde(default = "default_global_slots")]
    pub global_slots: u32,
    /// Which rate-limit header fields responses carry: `"ietf"` (`RateLimit-Policy` and
    /// `RateLimit`, the default), `"x"` (`X-RateLimit-*`), `"both"` or `"none"`; `true`
    /// and `false` mean `"both"` and `"none"`. A rule can only switch them off.
    #[serde(default)]
    pub rate_limit_headers: RateLimitHeaders,
    /// Request header added upstream when a shadow rule would have denied; `null` to
    /// disable.
    #[serde(default = "default_shadow_header")]
    pub shadow_header: Option<String>,
    /// The admin API to follow where no singleton control service can run (Istio, Envoy
    /// Gateway and other control planes that load Sluice as a plain HTTP filter and allow
    /// no bootstrap extension): the workers elect one of themselves to run the control
    /// service. Absent: static rules only, or a singleton control service follows the
    /// admin API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control: Option<ControlConfigSpec>,
}

fn default_slots() -> u32 {
    DEFAULT_SLOTS
}

fn default_global_slots() -> u32 {
    DEFAULT_GLOBAL_SLOTS
}

fn default_shadow_header() -> Option<String> {
    Some(DEFAULT_SHADOW_HEADER.to_string())
}

impl Default for FilterConfigSpec {
    fn default() -> Self {
        Self {
            rules: Vec::new(),
            failure_mode: FailureMode::Open,
            slots: DEFAULT_SLOTS,
            global_slots: DEFAULT_GLOBAL_SLOTS,
            rate_limit_headers: RateLimitHeaders::default(),
            shadow_header: default_shadow_header(),
            control: None,
        }
    }
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct FilterConfig {
    pub ruleset: Ruleset,
    pub failure_mode: FailureMode,
    pub table: SlotTable,
    pub lease_table: LeaseTable,
    pub rate_limit_headers: RateLimitHeaders,
    pub shadow_header: Option<String>,
    /// The admin API the workers follow when no singleton does (already checked).
    pub control: Option<ControlConfigSpec>,
}

/// Why a configuration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("configuration is not valid JSON of the expected shape at `{path}`: {message}")]
    Shape { path: String, message: String },
    #[error("configuration is invalid: {0}")]
    Invalid(ValidationErrors),
}

impl FilterConfig {
    /// Parses and validates the plugin configuration bytes. Empty bytes mean defaults.
    pub fn from_json(bytes: &[u8]) -> Result<FilterConfig, ConfigError> {
        let spec = if bytes.iter().all(u8::is_ascii_whitespace) {
            FilterConfigSpec::default()
        } else {
            let mut de = serde_json::Deserializer::from_slice(bytes);
            serde_path_to_error::deserialize(&mut de).map_err(|e| ConfigError::Shape {
                path: e.path().to_string(),
                message: e.inner().to_string(),
            })?
        };
        FilterConfig::try_from(spec)
    }
}

impl TryFrom<FilterConfigSpec> for FilterConfig {
    type Error = ConfigError;

    fn try_from(spec: FilterConfigSpec) -> Result<Self, Self::Error> {
        let mut problems = crate::validation::Problems::default();
        let slots =
            NonZeroU32::new(spec.slots).filter(|s| (MIN_SLOTS..=MAX_SLOTS).contains(&s.get()));
        if slots.is_none() {
            problems.add(
                "slots",
                format!("must be between {MIN_SLOTS} and {MAX_SLOTS}"),
            );
        }
        let global_slots = NonZeroU32::new(spec.global_slots)
            .filter(|s| (MIN_SLOTS..=MAX_GLOBAL_SLOTS).contains(&s.get()));
        if global_slots.is_none() {
            problems.add(
                "global_slots",
                format!("must be between {MIN_SLOTS} and {MAX_GLOBAL_SLOTS}"),
            );
        }
        if let Some(h) = &spec.shadow_header {
            if h.is_empty() || !h.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
                problems.add(
                    "shadow_header",
                    "must be a header name of letters, digits and '-'",
                );
            }
        }
        if let Some(control) = &spec.control {
            control.check(&mut problems, "control.");
        }
        let ruleset = Ruleset::from_specs(spec.rules).map_err(|e| problems.nest_top(e));
        match (ruleset, slots, global_slots) {
            (Ok(ruleset), Some(slots), Some(global_slots)) if problems.is_empty() => {
                Ok(FilterConfig {
                    ruleset,
                    failure_mode: spec.failure_mode,
                    table: SlotTable::new(slots),
                    lease_table: LeaseTable::new(global_slots),
                    rate_limit_headers: spec.rate_limit_headers,
                    shadow_header: spec.shadow_header.map(|h| h.to_ascii_lowercase()),
                    control: spec.control,
                })
            }
            _ => Err(ConfigError::Invalid(problems.into_errors())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_configuration_means_defaults() {
        let config = FilterConfig::from_json(b"").unwrap();
        assert!(config.ruleset.is_empty());
        assert_eq!(config.table.slots(), DEFAULT_SLOTS);
        assert_eq!(config.shadow_header.as_deref(), Some(DEFAULT_SHADOW_HEADER));
    }

    #[test]
    fn a_control_section_is_checked_like_the_singletons_configuration() {
        let config = FilterConfig::from_json(
            br#"{"control":{"admin_cluster":"outbound|8080||sluice-admin.sluice.svc.cluster.local",
                            "admin_authority":"sluice-admin.sluice:8080","token":"t"}}"#,
        )
        .unwrap();
        let control = config.control.unwrap();
        assert_eq!(control.admin_authority, "sluice-admin.sluice:8080");
        assert_eq!(control.poll_timeout_seconds, 30);

        let err = FilterConfig::from_json(
            br#"{"control":{"admin_cluster":"","admin_authority":"a","token":"t","sync_interval_ms":1}}"#,
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "configuration is invalid: control.admin_cluster: must not be empty; control.sync_interval_ms: must be between 50 and 10000"
        );
    }

    #[test]
    fn shape_errors_name_the_path() {
        let err = FilterConfig::from_json(
            br#"{"rules":[{"name":"a","key":"global","limits":[{"requests":"x","period":1}]}]}"#,
        )
        .unwrap_err();
        let ConfigError::Shape { path, .. } = err else {
            panic!("{err:?}")
        };
        assert_eq!(path, "rules[0].limits[0].requests");
    }

    #[test]
    fn invalid_rules_and_settings_are_all_reported() {
        let err = FilterConfig::from_json(
            br#"{"slots":3,"rules":[{"name":"a","key":"global","limits":[{"requests":1,"period":1}]},
                                    {"name":"a","key":"global","limits":[{"requests":0,"period":1}]}]}"#,
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "configuration is invalid: slots: must be between 16 and 4194304; rules[1].limits[0].requests: must be between 1 and 1000000000"
        );
    }
}

/// The control service's configuration: the singleton inside Envoy (bootstrap extension,
/// same `vm_id` and module as the filter) that long-polls the admin API and publishes
/// rulesets to shared data.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControlConfigSpec {
    /// The Envoy cluster that reaches the admin API.
    pub admin_cluster: String,
    /// The `:authority` to send, e.g. `127.0.0.1:8080`.
    pub admin_authority: String,
    /// A token with the `proxy` role.
    pub token: String,
    /// How this proxy names itself to the admin API; defaults to Envoy's node id, or a
    /// generated id when the node has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_id: Option<String>,
    /// How long the admin API may hold a poll open when nothing changed.
    #[serde(default = "default_poll_seconds")]
    pub poll_timeout_seconds: u32,
    /// How often decision statistics are sent to the admin API.
    #[serde(default = "default_report_seconds")]
    pub report_interval_seconds: u32,
    /// How often global buckets are synced with the admin API (50 to 10,000 ms).
    #[serde(default = "default_sync_interval_ms")]
    pub sync_interval_ms: u32,
}

fn default_sync_interval_ms() -> u32 {
    (crate::global::DEFAULT_SYNC_INTERVAL_NS / 1_000_000) as u32
}

fn default_report_seconds() -> u32 {
    2
}

fn default_poll_seconds() -> u32 {
    30
}

impl ControlConfigSpec {
    /// Following the admin API at `admin_authority` through the Envoy cluster
    /// `admin_cluster` with `token`, every other setting at its default; the generators
    /// start from this and check the result with [`ControlConfigSpec::checked`].
    pub fn new(admin_cluster: &str, admin_authority: &str, token: &str) -> ControlConfigSpec {
        ControlConfigSpec {
            admin_cluster: admin_cluster.to_string(),
            admin_authority: admin_authority.to_string(),
            token: token.to_string(),
            proxy_id: None,
            poll_timeout_seconds: default_poll_seconds(),
            report_interval_seconds: default_report_seconds(),
            sync_interval_ms: default_sync_interval_ms(),
        }
    }

    /// Parses and checks the control service's configuration.
    pub fn from_json(bytes: &[u8]) -> Result<ControlConfigSpec, ConfigError> {
        let mut de = serde_json::Deserializer::from_slice(bytes);
        let spec: ControlConfigSpec =
            serde_path_to_error::deserialize(&mut de).map_err(|e| ConfigError::Shape {
                path: e.path().to_string(),
                message: e.inner().to_string(),
            })?;
        spec.checked()
    }

    /// These settings if the control service would take them, else every problem.
    pub fn checked(self) -> Result<ControlConfigSpec, ConfigError> {
        let mut problems = crate::validation::Problems::default();
        self.check(&mut problems, "");
        if problems.is_empty() {
            Ok(self)
        } else {
            Err(ConfigError::Invalid(problems.into_errors()))
        }
    }

    /// Adds what is wrong with these settings to `problems`, each field named after
    /// `prefix` (empty for the singleton's own configuration, `control.` inside the
    /// filter's).
    fn check(&self, problems: &mut crate::validation::Problems, prefix: &str) {
        for (field, value) in [
            ("admin_cluster", &self.admin_cluster),
            ("admin_authority", &self.admin_authority),
            ("token", &self.token),
        ] {
            if value.is_empty() {
                problems.add(format!("{prefix}{field}"), "must not be empty");
            }
        }
        if !(1..=60).contains(&self.poll_timeout_seconds) {
            problems.add(
                format!("{prefix}poll_timeout_seconds"),
                "must be between 1 and 60",
            );
        }
        if !(1..=300).contains(&self.report_interval_seconds) {
            problems.add(
                format!("{prefix}report_interval_seconds"),
                "must be between 1 and 300",
            );
        }
        if !(50..=10_000).contains(&self.sync_interval_ms) {
            problems.add(
                format!("{prefix}sync_interval_ms"),
                "must be between 50 and 10000",
            );
        }
    }
}
