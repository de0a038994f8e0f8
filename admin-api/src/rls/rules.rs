//! The RLS rules in force: compiled from the current ruleset version whenever it changes
//! (a change through this replica at once; through another replica sharing the database
//! within a second, as the proxies' long-polls learn of it).

use std::sync::{Arc, RwLock};

use sluice_core::rls::RlsRules;
use sluice_core::rule::Rule;

use crate::http::AppState;

/// The compiled RLS rules, shared by every call.
#[derive(Debug, Clone, Default)]
pub(crate) struct Current(Arc<RwLock<Arc<RlsRules>>>);

impl Current {
    pub(crate) fn get(&self) -> Arc<RlsRules> {
        self.0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn set(&self, rules: RlsRules) {
        *self
            .0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(rules);
    }

    /// Loads the current version's RLS rules; `false` when the store could not be read
    /// (the previous rules stay).
    pub(crate) async fn load(&self, state: &AppState) -> bool {
        match state.store().document().await {
            Ok(document) => {
                // Each stored rule was validated when it was written; one that no longer
                // compiles (an older server's) decides nothing.
                let rules: Vec<Rule> = document
                    .rules
                    .into_iter()
                    .filter_map(|spec| Rule::try_from(spec).ok())
                    .collect();
                let compiled = RlsRules::from_rules(&rules);
                state.rls_metrics().rules.set(compiled.len() as i64);
                self.set(compiled);
                true
            }
            Err(err) => {
                tracing::warn!(%err, "rate limit service: could not read the ruleset; keeping the rules in force");
                false
            }
        }
    }

    /// Follows the ruleset version until shutdown, reloading on every change.
    pub(crate) async fn follow(self, state: AppState) {
        let mut versions = state.versions();
        let stopping = state.shutting_down();
        tokio::pin!(stopping);
        loop {
            tokio::select! {
                changed = versions.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    if !self.load(&state).await {
                        // Retried on the next change, or after a second.
                        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                        versions.mark_changed();
                    }
                }
                () = &mut stopping => return,
            }
        }
    }
}
