//! A rule's `descriptor` section as users write it (serde only): its own file, so the
//! rule model (`crate::spec`) names it without depending on how it is checked.

use serde::{Deserialize, Serialize};

/// The descriptors a rule decides, as written:
/// `{domain: edge, entries: [{key: remote_address}, {key: path, value: /login}]}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DescriptorSpec {
    /// The `domain` of Envoy's rate limit filter configuration.
    pub domain: String,
    /// The descriptor's entries in order. An entry without `value` matches any value and
    /// its value is (part of) the client key.
    pub entries: Vec<EntrySpec>,
}

/// One entry of a [`DescriptorSpec`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EntrySpec {
    pub key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}
