//! What this server issued, as proxies' syncs and reports may name it: ruleset versions up
//! to the current one, the rule ids of the current version and of the one before it, and
//! (for the coordinator) their global limits.
//!
//! Read from the store once per ruleset version, so every replica agrees. The version
//! before the current one stays valid because proxies switch within a second of a change:
//! a report or a sync in flight may still carry the old rules.

use std::collections::HashSet;

/// The rule ids of the newest version this process read and of the one before it.
#[derive(Debug, Default)]
pub(crate) struct Issued {
    version: Option<u64>,
    rules: HashSet<String>,
}

impl Issued {
    /// The version read last, if any.
    pub(crate) fn version(&self) -> Option<u64> {
        self.version
    }

    /// `rules` (the ids of `version` and of the one before) become the ones proxies may
    /// name (an older version is ignored).
    pub(crate) fn advance(&mut self, version: u64, rules: HashSet<String>) {
        if self.version.is_none_or(|v| v < version) {
            *self = Issued {
                version: Some(version),
                rules,
            };
        }
    }

    /// Whether a proxy may report rule `id`.
    pub(crate) fn has_rule(&self, id: &str) -> bool {
        self.rules.contains(id)
    }
}
