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
    /// What the rule answers: its limits (the default), always `OK` (`unlimited`), or
    /// always `OVER_LIMIT` (`deny`, envoyproxy/ratelimit's limit of 0). The last two
    /// have no `limits`.
    #[serde(default, skip_serializing_if = "Answer::is_limit")]
    pub answer: Answer,
    /// Names of rules this one replaces: when a request's descriptors are decided by this
    /// rule and by a rule named here, the named rule's descriptor is neither charged nor
    /// limited (envoyproxy/ratelimit's `replaces`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replaces: Vec<String>,
}

/// One entry of a [`DescriptorSpec`]: a key, with at most one of `value` (that value only)
/// and `value_prefix` (values starting with it; envoyproxy/ratelimit's `value: abc*`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EntrySpec {
    pub key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_prefix: Option<String>,
}

/// What a descriptor rule answers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Answer {
    /// Its limits decide (token buckets).
    #[default]
    Limit,
    /// Always `OK`, without a bucket, `limit_remaining` at its most.
    Unlimited,
    /// Always `OVER_LIMIT` (a deny list), without a bucket.
    Deny,
}

impl Answer {
    pub fn is_limit(&self) -> bool {
        *self == Answer::Limit
    }
}
