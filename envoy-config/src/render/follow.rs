//! How the elected worker follows the admin API: the proxy token it presents, and the
//! plugin configuration with its `control` section, checked as the filter will check it.

use serde_json::Value;
use sluice_core::config::{ControlConfigSpec, FilterConfig, FilterConfigSpec};

use super::resources::RenderError;
use crate::error::field_errors;

/// Stands in for the proxy token when none is given: `envsubst` (or any template step)
/// replaces it with the real one before the resources are applied.
pub const TOKEN_PLACEHOLDER: &str = "${SLUICE_PROXY_TOKEN}";

/// The proxy token (a `proxy`-role API token) embedded in the plugin configuration.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ProxyToken {
    /// [`TOKEN_PLACEHOLDER`], to be substituted before applying.
    #[default]
    Placeholder,
    /// The real token, from a file the operator named.
    Given(String),
}

impl ProxyToken {
    pub(super) fn as_str(&self) -> &str {
        match self {
            ProxyToken::Placeholder => TOKEN_PLACEHOLDER,
            ProxyToken::Given(token) => token,
        }
    }

    pub(super) fn header(&self) -> Option<String> {
        match self {
            ProxyToken::Placeholder => Some(format!(
                "The proxy token is the placeholder {TOKEN_PLACEHOLDER}: substitute a token of \
                 the proxy role before applying, e.g. `SLUICE_PROXY_TOKEN=$(cat proxy-token) \
                 envsubst '$SLUICE_PROXY_TOKEN' < FILE | kubectl apply -f -`, or render with \
                 --proxy-token-file."
            )),
            ProxyToken::Given(_) => Some(
                "This file contains a proxy token (control.token): treat it as a secret."
                    .to_string(),
            ),
        }
    }
}

/// How the elected worker follows the admin API, apart from where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Follow {
    pub token: ProxyToken,
    /// How each proxy names itself; by default Envoy's node id (one per pod under Istio
    /// and Envoy Gateway).
    pub proxy_id: Option<String>,
    /// How often fleet-wide buckets are synced; `None` for the control service's default.
    pub sync_interval_ms: Option<u32>,
}

impl Default for Follow {
    fn default() -> Self {
        Follow {
            token: ProxyToken::Placeholder,
            proxy_id: None,
            sync_interval_ms: None,
        }
    }
}

/// The plugin configuration with its `control` section naming `cluster` and `authority`,
/// checked as the filter will check it, as JSON.
pub(super) fn plugin_config(
    filter: &FilterConfigSpec,
    follow: &Follow,
    cluster: &str,
    authority: &str,
) -> Result<(FilterConfigSpec, Value), RenderError> {
    let mut control = ControlConfigSpec::new(cluster, authority, follow.token.as_str());
    control.proxy_id = follow.proxy_id.clone();
    if let Some(ms) = follow.sync_interval_ms {
        control.sync_interval_ms = ms;
    }
    let control = control.checked().map_err(|e| {
        let mut errors = field_errors(e);
        for error in &mut errors.0 {
            error.field = format!("control.{}", error.field);
        }
        RenderError::InvalidFilterConfig(errors)
    })?;
    let spec = FilterConfigSpec {
        control: Some(control),
        ..filter.clone()
    };
    FilterConfig::try_from(spec.clone())
        .map_err(|e| RenderError::InvalidFilterConfig(field_errors(e)))?;
    let value = serde_json::to_value(&spec).map_err(|e| RenderError::Serialise(e.to_string()))?;
    Ok((spec, value))
}
