//! The audit log: who changed what, when, with the value before and after.

use serde_json::Value;
use sqlx::any::AnyRow;
use sqlx::{Any, Row};

use super::{Actor, Store, StoreError, to_i64, to_u64};

/// What a change did, as recorded in the audit log and, for ruleset changes, in versions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    RuleCreate,
    RuleReplace,
    RulePatch,
    RuleDelete,
    RuleEnable,
    RuleDisable,
    Apply,
    Rollback,
    TokenCreate,
    TokenRevoke,
}

impl Action {
    /// The stored name: existing audit logs and versions hold these, so they never change.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Action::RuleCreate => "rule.create",
            Action::RuleReplace => "rule.update",
            Action::RulePatch => "rule.patch",
            Action::RuleDelete => "rule.delete",
            Action::RuleEnable => "rule.enable",
            Action::RuleDisable => "rule.disable",
            Action::Apply => "rules.apply",
            Action::Rollback => "ruleset.rollback",
            Action::TokenCreate => "token.create",
            Action::TokenRevoke => "token.revoke",
        }
    }

    /// Whether the action changes one rule, so its audit entry holds that rule's spec
    /// before and after rather than a map of changed rules.
    pub(super) fn is_single_rule(self) -> bool {
        matches!(
            self,
            Action::RuleCreate
                | Action::RuleReplace
                | Action::RulePatch
                | Action::RuleDelete
                | Action::RuleEnable
                | Action::RuleDisable
        )
    }
}

/// One audit log entry, as read back. The action stays the stored text: the log is a
/// record, and shows whatever a past or newer version of Sluice wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct AuditEntry {
    pub(crate) id: u64,
    pub at: i64,
    pub(crate) actor_id: Option<String>,
    pub(crate) actor_name: String,
    pub action: String,
    /// The rule id, token id or version acted on.
    pub target: Option<String>,
    /// The ruleset version the change created, if it was a ruleset change.
    pub version: Option<u64>,
    pub before: Option<Value>,
    pub after: Option<Value>,
}

/// An audit entry to write.
pub(super) struct NewAudit<'a> {
    pub(crate) actor: &'a Actor,
    pub(crate) action: Action,
    /// When the change was made, in Unix milliseconds.
    pub(crate) at: i64,
    pub(crate) target: Option<&'a str>,
    pub(crate) version: Option<u64>,
    pub(crate) before: Option<String>,
    pub(crate) after: Option<String>,
}

pub(super) async fn insert_audit<'e, E>(executor: E, entry: NewAudit<'_>) -> Result<(), StoreError>
where
    E: sqlx::Executor<'e, Database = Any>,
{
    sqlx::query(
        "INSERT INTO audit_log (at, actor_id, actor_name, action, target, version, before_json, after_json) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
    )
    .bind(entry.at)
    .bind(entry.actor.id.clone())
    .bind(entry.actor.name.clone())
    .bind(entry.action.as_str())
    .bind(entry.target)
    .bind(entry.version.map(to_i64))
    .bind(entry.before)
    .bind(entry.after)
    .execute(executor)
    .await?;
    Ok(())
}

fn audit_entry(row: &AnyRow) -> Result<AuditEntry, StoreError> {
    let json = |column: &str| -> Result<Option<Value>, StoreError> {
        let text: Option<String> = row.try_get(column)?;
        text.map(|t| {
            serde_json::from_str(&t)
                .map_err(|e| StoreError::Corrupt(format!("audit {column}: {e}")))
        })
        .transpose()
    };
    Ok(AuditEntry {
        id: to_u64(row.try_get("id")?),
        at: row.try_get("at")?,
        actor_id: row.try_get("actor_id")?,
        actor_name: row.try_get("actor_name")?,
        action: row.try_get("action")?,
        target: row.try_get("target")?,
        version: row.try_get::<Option<i64>, _>("version")?.map(to_u64),
        before: json("before_json")?,
        after: json("after_json")?,
    })
}

impl Store {
    /// Newest first; `before` pages back (entries with a lower id).
    pub async fn list_audit(
        &self,
        limit: u32,
        before: Option<u64>,
    ) -> Result<Vec<AuditEntry>, StoreError> {
        let rows = sqlx::query(
            "SELECT id, at, actor_id, actor_name, action, target, version, before_json, after_json \
             FROM audit_log WHERE id < $1 ORDER BY id DESC LIMIT $2",
        )
        .bind(before.map_or(i64::MAX, to_i64))
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(audit_entry).collect()
    }

    /// Number of audit entries: lets tests assert that a refused request wrote nothing.
    #[cfg(any(test, feature = "test-support"))]
    pub(crate) async fn audit_count(&self) -> Result<u64, StoreError> {
        self.count("audit_log").await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names are in every existing database: renaming one would split the log.
    #[test]
    fn action_names_are_pinned() {
        let pinned = [
            (Action::RuleCreate, "rule.create"),
            (Action::RuleReplace, "rule.update"),
            (Action::RulePatch, "rule.patch"),
            (Action::RuleDelete, "rule.delete"),
            (Action::RuleEnable, "rule.enable"),
            (Action::RuleDisable, "rule.disable"),
            (Action::Apply, "rules.apply"),
            (Action::Rollback, "ruleset.rollback"),
            (Action::TokenCreate, "token.create"),
            (Action::TokenRevoke, "token.revoke"),
        ];
        for (action, name) in pinned {
            assert_eq!(action.as_str(), name);
        }
    }
}
