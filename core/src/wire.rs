//! What travels between the admin API and the proxies, and into shared data.
//!
//! The admin API serves a [`RulesetDocument`] at `GET /api/v1/ruleset?after=VERSION`
//! (long-polled by the control service inside Envoy); the control service validates it
//! and publishes it in shared data with [`RulesetDocument::encode`], where every worker
//! reads it back with [`RulesetDocument::decode`]. The encoding starts with a format
//! byte so a newer module can tell an older module's bytes apart (pinned by tests).

use serde::{Deserialize, Serialize};

use crate::ruleset::Ruleset;
use crate::spec::RuleSpec;
use crate::validation::ValidationErrors;

/// The long-poll endpoint.
pub const RULESET_PATH: &str = "/api/v1/ruleset";
/// Request headers a proxy sends with every poll, so the admin API can list it.
pub const PROXY_ID_HEADER: &str = "x-sluice-proxy-id";
/// The ruleset version the proxy is running (0: none yet).
pub const PROXY_RULESET_VERSION_HEADER: &str = "x-sluice-ruleset-version";
/// The proxy's last error, if any (e.g. a ruleset it refused), for the admin API to show.
pub const PROXY_ERROR_HEADER: &str = "x-sluice-proxy-error";

/// Format byte of [`RulesetDocument::encode`].
pub const RULESET_FORMAT_VERSION: u8 = 1;

/// A whole ruleset at one version: the unit the admin API pushes and the proxies apply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RulesetDocument {
    /// Increases with every change; a proxy asks for anything newer than what it runs.
    pub version: u64,
    pub rules: Vec<RuleSpec>,
}

/// Why bytes are not a ruleset document.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("unknown ruleset format version {0}")]
    UnknownFormat(u8),
    #[error("empty ruleset bytes")]
    Empty,
    #[error("ruleset is not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
}

impl RulesetDocument {
    /// Validates every rule; a document that fails is refused whole.
    pub fn compile(&self) -> Result<Ruleset, ValidationErrors> {
        Ruleset::from_specs(self.rules.clone())
    }

    /// Parses the admin API's JSON answer.
    pub fn from_json(bytes: &[u8]) -> Result<Self, WireError> {
        Ok(serde_json::from_slice(bytes)?)
    }

    /// The shared-data encoding: a format byte, then JSON.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![RULESET_FORMAT_VERSION];
        // Serialising plain data structures into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut out, self);
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        match bytes.split_first() {
            None => Err(WireError::Empty),
            Some((&RULESET_FORMAT_VERSION, json)) => Ok(serde_json::from_slice(json)?),
            Some((&other, _)) => Err(WireError::UnknownFormat(other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shared_data_encoding_is_a_format_byte_then_json() {
        let doc = RulesetDocument {
            version: 7,
            rules: vec![],
        };
        assert_eq!(doc.encode(), b"\x01{\"version\":7,\"rules\":[]}");
        assert_eq!(RulesetDocument::decode(&doc.encode()).unwrap(), doc);
        assert!(matches!(
            RulesetDocument::decode(b"\x02{}"),
            Err(WireError::UnknownFormat(2))
        ));
        assert!(matches!(
            RulesetDocument::decode(b""),
            Err(WireError::Empty)
        ));
        assert!(matches!(
            RulesetDocument::decode(b"\x01{"),
            Err(WireError::Json(_))
        ));
    }
}
