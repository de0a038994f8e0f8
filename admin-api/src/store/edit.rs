//! The one way the ruleset changes: [`Store::edit`], and its dry run [`Store::preview`].
//!
//! An edit runs in steps, each its own function:
//! 1. [`load`]: open a transaction that holds the write lock and read the rules.
//! 2. [`Plan::new`]: apply the caller's edit to them in memory, and validate the whole
//!    resulting ruleset if anything changed. Pure: no database, no clock.
//! 3. [`Store::commit`]: write the changed rules ([`write_rules`]), the new version with
//!    its snapshot ([`insert_version`]) and one audit entry ([`audit`]), announce the
//!    version, commit.
//!
//! A dry run, an edit that changes nothing and a failed edit stop after step 2 and roll
//! back, so they write nothing. The time of a change is the caller's `now`.

use std::collections::BTreeMap;

use sluice_core::ruleset::Ruleset;
use sluice_core::spec::RuleSpec;
use sluice_core::validation::{FieldError, ValidationErrors};
use sqlx::{Any, Transaction};

use super::audit::{Action, NewAudit, insert_audit};
use super::rules::{
    ChangeKind, IfMatch, RULE_COLUMNS, RuleChange, RuleRecord, canonical, diff, mode_str, rule_id,
    rule_record, to_json,
};
use super::{Actor, Store, StoreError, to_i64, to_u64};

/// The ruleset being edited inside [`Store::edit`]: the rules as they were when the
/// transaction began, and as the edit wants them.
#[derive(Debug)]
pub struct Working {
    original: BTreeMap<String, RuleRecord>,
    desired: BTreeMap<String, RuleSpec>,
    /// Rules the edit touched, each with the field prefix its author knows it by (`""` for
    /// a single rule in a request body, `rules[3]` for a rules file), so validation errors
    /// point into what the user sent rather than into the merged ruleset.
    labels: Vec<(String, String)>,
}

impl Working {
    fn new(original: BTreeMap<String, RuleRecord>) -> Working {
        let desired = original
            .iter()
            .map(|(id, r)| (id.clone(), r.spec.clone()))
            .collect();
        Working {
            original,
            desired,
            labels: Vec::new(),
        }
    }

    /// The rule as the edit has it so far.
    pub(crate) fn get(&self, id: &str) -> Option<&RuleSpec> {
        self.desired.get(id)
    }

    pub fn ids(&self) -> Vec<String> {
        self.desired.keys().cloned().collect()
    }

    /// The current spec of an existing rule, after checking an `If-Match` precondition
    /// against its stored revision.
    pub fn require(&self, id: &str, if_match: Option<&IfMatch>) -> Result<&RuleSpec, StoreError> {
        let (Some(record), Some(spec)) = (self.original.get(id), self.desired.get(id)) else {
            return Err(StoreError::RuleNotFound(id.to_string()));
        };
        match if_match {
            Some(condition) if !condition.allows(record.revision) => {
                Err(StoreError::StaleRevision {
                    id: id.to_string(),
                    current: record.revision,
                })
            }
            _ => Ok(spec),
        }
    }

    /// Adds or replaces the rule with this spec's id; returns the id.
    pub fn put(&mut self, spec: RuleSpec, label: impl Into<String>) -> String {
        let spec = canonical(spec);
        let id = rule_id(&spec).to_string();
        self.labels.push((id.clone(), label.into()));
        self.desired.insert(id.clone(), spec);
        id
    }

    pub fn remove(&mut self, id: &str) -> Option<RuleSpec> {
        self.desired.remove(id)
    }

    /// [`Working::put`] for one rule sent on its own (create, replace, patch), refusing a
    /// name another rule holds: that is a conflict with the stored rules (409), which the
    /// sender resolves by renaming one of them, not a fault in the rule itself (422).
    pub(crate) fn put_one(&mut self, spec: RuleSpec) -> Result<String, StoreError> {
        let spec = canonical(spec);
        let id = rule_id(&spec);
        if let Some((holder, _)) = self
            .desired
            .iter()
            .find(|(other, rule)| other.as_str() != id && rule.name == spec.name)
        {
            return Err(StoreError::NameTaken {
                name: spec.name.clone(),
                holder: holder.clone(),
            });
        }
        Ok(self.put(spec, ""))
    }

    fn changes(&self) -> Vec<RuleChange> {
        let before: Vec<RuleSpec> = self.original.values().map(|r| r.spec.clone()).collect();
        let after: Vec<RuleSpec> = self.desired.values().cloned().collect();
        diff(&before, &after)
    }

    /// Validates the whole desired ruleset; returns its specs in evaluation order.
    fn validate(&self) -> Result<Vec<RuleSpec>, ValidationErrors> {
        let mut touched: Vec<(&str, &str)> = Vec::new();
        for (id, label) in &self.labels {
            // A rule put twice keeps its last label.
            touched.retain(|(t, _)| t != id);
            if self.desired.contains_key(id) {
                touched.push((id, label));
            }
        }
        let mut order: Vec<(String, String)> = self
            .desired
            .keys()
            .filter(|id| !touched.iter().any(|(t, _)| t == id))
            .map(|id| (id.clone(), format!("(existing rule `{id}`)")))
            .collect();
        // Touched rules go last, so a clash with an untouched rule (a duplicate name) is
        // reported on the rule the user just sent.
        order.extend(
            touched
                .iter()
                .map(|(id, l)| (id.to_string(), l.to_string())),
        );
        let specs: Vec<RuleSpec> = order
            .iter()
            .filter_map(|(id, _)| self.desired.get(id).cloned())
            .collect();
        let labels: Vec<&str> = order.iter().map(|(_, l)| l.as_str()).collect();
        match Ruleset::from_specs(specs) {
            Ok(ruleset) => Ok(ruleset.rules().iter().map(|r| r.spec.clone()).collect()),
            Err(errors) => Err(ValidationErrors(
                errors
                    .0
                    .into_iter()
                    .map(|e| FieldError {
                        field: relabel(&e.field, &labels),
                        message: e.message,
                    })
                    .collect(),
            )),
        }
    }
}

/// Rewrites `rules[k].rest` with the label of the k-th validated rule.
fn relabel(field: &str, labels: &[&str]) -> String {
    let parsed = field.strip_prefix("rules[").and_then(|rest| {
        let (index, tail) = rest.split_once(']')?;
        let label = labels.get(index.parse::<usize>().ok()?)?;
        Some((*label, tail.strip_prefix('.').unwrap_or(tail)))
    });
    match parsed {
        None => field.to_string(),
        Some(("", "")) => "(body)".to_string(),
        Some(("", tail)) => tail.to_string(),
        Some((label, "")) => label.to_string(),
        Some((label, tail)) => format!("{label}.{tail}"),
    }
}

/// The result of [`Store::edit`].
#[derive(Debug, Clone)]
pub struct Edited {
    /// The current version after the edit: new if `created`, else unchanged.
    pub version: u64,
    /// Whether the edit changed anything (and so made a new version).
    pub created: bool,
    pub changes: Vec<RuleChange>,
    /// Every rule after the edit.
    pub rules: BTreeMap<String, RuleRecord>,
}

/// An edit applied in memory and validated, nothing written yet: what a dry run reports,
/// and what [`Store::commit`] writes.
#[derive(Debug)]
struct Plan {
    /// The version committing this plan creates: one past the current version.
    version: u64,
    working: Working,
    changes: Vec<RuleChange>,
    /// The whole resulting ruleset, validated, in evaluation order (empty when nothing
    /// changes: an unchanged ruleset is not validated again).
    ordered: Vec<RuleSpec>,
}

impl Plan {
    /// Applies `edit` to the loaded rules and, if anything changed, validates the whole
    /// resulting ruleset. `version` is the version a commit would create.
    fn new<F>(version: u64, mut working: Working, edit: F) -> Result<Plan, StoreError>
    where
        F: FnOnce(&mut Working) -> Result<(), StoreError>,
    {
        edit(&mut working)?;
        let changes = working.changes();
        let ordered = if changes.is_empty() {
            Vec::new()
        } else {
            working.validate().map_err(StoreError::Invalid)?
        };
        Ok(Plan {
            version,
            working,
            changes,
            ordered,
        })
    }

    fn changes_anything(&self) -> bool {
        !self.changes.is_empty()
    }

    /// The plan as a result without writing it: the version and rules stay the current
    /// ones, and `changes` says what committing it would change.
    fn unwritten(self) -> Edited {
        Edited {
            version: self.version - 1,
            created: false,
            changes: self.changes,
            rules: self.working.original,
        }
    }

    /// The version's one-line summary, e.g. `rule.create a: 1 added, 0 changed, 0 removed`.
    fn summary(&self, stamp: &Stamp<'_>) -> String {
        let count = |kind| self.changes.iter().filter(|c| c.change == kind).count();
        format!(
            "{}{}: {} added, {} changed, {} removed",
            stamp.action.as_str(),
            stamp.target.map(|t| format!(" {t}")).unwrap_or_default(),
            count(ChangeKind::Added),
            count(ChangeKind::Changed),
            count(ChangeKind::Removed),
        )
    }
}

/// Who made a change, what it was, what it was made on, and when (Unix milliseconds):
/// stamped on the rules it writes, its version and its audit entry.
struct Stamp<'a> {
    actor: &'a Actor,
    action: Action,
    target: Option<&'a str>,
    now: i64,
}

/// Step 1: begins the edit inside `tx` and reads the rules as they are. Returns the
/// version the edit would create.
async fn load(tx: &mut Transaction<'static, Any>) -> Result<(u64, Working), StoreError> {
    // Writing first takes the write lock at once (SQLite: no deferred-transaction
    // upgrade that could fail with SQLITE_BUSY; PostgreSQL: a row lock that queues
    // concurrent edits), so every edit sees the one before it and versions are gapless.
    let next: i64 = sqlx::query_scalar(
        "UPDATE ruleset_head SET version = version + 1 WHERE id = 1 RETURNING version",
    )
    .fetch_one(&mut **tx)
    .await?;
    let rows = sqlx::query(&format!("SELECT {RULE_COLUMNS} FROM rules"))
        .fetch_all(&mut **tx)
        .await?;
    let mut original = BTreeMap::new();
    for row in &rows {
        let record = rule_record(row)?;
        original.insert(record.id.clone(), record);
    }
    Ok((to_u64(next), Working::new(original)))
}

/// Writes the plan's changed rules at its version; returns every rule after the edit.
async fn write_rules(
    tx: &mut Transaction<'static, Any>,
    plan: &Plan,
    now: i64,
) -> Result<BTreeMap<String, RuleRecord>, StoreError> {
    let mut rules = plan.working.original.clone();
    // Changed rules are deleted and inserted again rather than updated, so that two
    // rules swapping names never trip the UNIQUE(name) constraint halfway.
    for change in &plan.changes {
        if change.change != ChangeKind::Added {
            sqlx::query("DELETE FROM rules WHERE id = $1")
                .bind(&change.id)
                .execute(&mut **tx)
                .await?;
            rules.remove(&change.id);
        }
    }
    for change in &plan.changes {
        let Some(spec) = &change.after else { continue };
        let created_at = plan
            .working
            .original
            .get(&change.id)
            .map_or(now, |r| r.created_at);
        sqlx::query(
            "INSERT INTO rules (id, name, enabled, mode, priority, spec, revision, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        )
        .bind(&change.id)
        .bind(&spec.name)
        .bind(spec.enabled)
        .bind(mode_str(spec.mode))
        .bind(i64::from(spec.priority))
        .bind(to_json(spec)?)
        .bind(to_i64(plan.version))
        .bind(created_at)
        .bind(now)
        .execute(&mut **tx)
        .await?;
        rules.insert(
            change.id.clone(),
            RuleRecord {
                id: change.id.clone(),
                spec: spec.clone(),
                revision: plan.version,
                created_at,
                updated_at: now,
            },
        );
    }
    Ok(rules)
}

/// Writes the plan's version: its summary and the snapshot of the whole ruleset.
async fn insert_version(
    tx: &mut Transaction<'static, Any>,
    plan: &Plan,
    stamp: &Stamp<'_>,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO ruleset_versions (version, created_at, actor_id, actor_name, action, summary, rule_count, rules) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
    )
    .bind(to_i64(plan.version))
    .bind(stamp.now)
    .bind(stamp.actor.id.clone())
    .bind(stamp.actor.name.clone())
    .bind(stamp.action.as_str())
    .bind(plan.summary(stamp))
    .bind(i64::try_from(plan.ordered.len()).unwrap_or(i64::MAX))
    .bind(to_json(&plan.ordered)?)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Writes the plan's audit entry.
async fn audit(
    tx: &mut Transaction<'static, Any>,
    plan: &Plan,
    stamp: &Stamp<'_>,
) -> Result<(), StoreError> {
    let (before, after) = audit_values(stamp.action, &plan.changes)?;
    let entry = NewAudit {
        actor: stamp.actor,
        action: stamp.action,
        at: stamp.now,
        target: stamp.target,
        version: Some(plan.version),
        before,
        after,
    };
    insert_audit(&mut **tx, entry).await
}

/// Single-rule actions record the rule before and after; bulk ones a map of the changed
/// rules by id (`null` where a rule did not exist).
fn audit_values(
    action: Action,
    changes: &[RuleChange],
) -> Result<(Option<String>, Option<String>), StoreError> {
    if let ([change], true) = (changes, action.is_single_rule()) {
        return Ok((
            change.before.as_ref().map(to_json).transpose()?,
            change.after.as_ref().map(to_json).transpose()?,
        ));
    }
    let side = |pick: fn(&RuleChange) -> &Option<RuleSpec>| -> Result<String, StoreError> {
        let map: BTreeMap<&str, &Option<RuleSpec>> =
            changes.iter().map(|c| (c.id.as_str(), pick(c))).collect();
        to_json(&map)
    };
    Ok((Some(side(|c| &c.before)?), Some(side(|c| &c.after)?)))
}

impl Store {
    /// Changes the ruleset in one transaction, made by `actor` at `now` (Unix ms).
    ///
    /// `edit` gets the rules as they are at the start of the transaction and changes them
    /// in memory. Then, only if anything differs, the whole resulting ruleset is
    /// validated, and the rules, a new version with its snapshot, and one audit entry are
    /// written. Any error (the edit's own, validation, the database's) writes nothing.
    /// An edit that changes nothing makes no version: applying the same file twice is a
    /// no-op.
    pub async fn edit<F>(
        &self,
        actor: &Actor,
        action: Action,
        target: Option<&str>,
        now: i64,
        edit: F,
    ) -> Result<Edited, StoreError>
    where
        F: FnOnce(&mut Working) -> Result<(), StoreError>,
    {
        let mut tx = self.pool.begin().await?;
        let (version, working) = load(&mut tx).await?;
        let plan = match Plan::new(version, working, edit) {
            Ok(plan) if plan.changes_anything() => plan,
            nothing_to_write => {
                tx.rollback().await?;
                return nothing_to_write.map(Plan::unwritten);
            }
        };
        let stamp = Stamp {
            actor,
            action,
            target,
            now,
        };
        self.commit(tx, plan, &stamp).await
    }

    /// Runs an edit and validates the result like [`Store::edit`], then rolls it back:
    /// what the edit would change, for dry runs.
    pub async fn preview<F>(&self, edit: F) -> Result<Edited, StoreError>
    where
        F: FnOnce(&mut Working) -> Result<(), StoreError>,
    {
        let mut tx = self.pool.begin().await?;
        let (version, working) = load(&mut tx).await?;
        let plan = Plan::new(version, working, edit);
        tx.rollback().await?;
        plan.map(Plan::unwritten)
    }

    /// Step 3: writes a plan that changes something (its rules, its version and an audit
    /// entry), announces the version, and commits.
    async fn commit(
        &self,
        mut tx: Transaction<'static, Any>,
        plan: Plan,
        stamp: &Stamp<'_>,
    ) -> Result<Edited, StoreError> {
        let rules = write_rules(&mut tx, &plan, stamp.now).await?;
        insert_version(&mut tx, &plan, stamp).await?;
        audit(&mut tx, &plan, stamp).await?;
        self.announce_version(&mut tx, plan.version).await?;
        tx.commit().await?;
        Ok(Edited {
            version: plan.version,
            created: true,
            changes: plan.changes,
            rules,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::rules::tests::spec;

    #[test]
    fn relabel_points_into_what_the_user_sent() {
        let labels = ["(existing rule `x`)", "", "rules[4]"];
        assert_eq!(
            relabel("rules[1].limits[0].requests", &labels),
            "limits[0].requests"
        );
        assert_eq!(relabel("rules[2].name", &labels), "rules[4].name");
        assert_eq!(
            relabel("rules[0].name", &labels),
            "(existing rule `x`).name"
        );
        assert_eq!(relabel("rules", &labels), "rules");
        assert_eq!(relabel("rules[1]", &labels), "(body)");
        assert_eq!(relabel("rules[9].name", &labels), "rules[9].name");
    }

    fn valid(name: &str) -> RuleSpec {
        spec(&format!(
            r#"{{"name":"{name}","key":"global","limits":[{{"requests":10,"period":"second"}}]}}"#
        ))
    }

    fn record(spec: RuleSpec, revision: u64) -> RuleRecord {
        RuleRecord {
            id: rule_id(&spec).to_string(),
            spec,
            revision,
            created_at: 1,
            updated_at: 1,
        }
    }

    fn loaded(specs: &[RuleSpec]) -> Working {
        Working::new(
            specs
                .iter()
                .map(|s| (rule_id(s).to_string(), record(s.clone(), 1)))
                .collect(),
        )
    }

    #[test]
    fn a_plan_that_changes_nothing_is_not_validated_and_keeps_the_version() {
        // An invalid stored rule is not re-validated when the edit leaves it alone.
        let mut broken = valid("broken");
        broken.limits.clear();
        let plan = Plan::new(4, loaded(&[broken]), |_| Ok(())).unwrap();
        assert!(!plan.changes_anything());
        assert!(plan.ordered.is_empty());
        let edited = plan.unwritten();
        assert_eq!((edited.version, edited.created), (3, false));
        assert!(edited.changes.is_empty());
        assert_eq!(edited.rules.len(), 1);
    }

    #[test]
    fn a_plan_validates_the_whole_result_and_labels_errors_as_sent() {
        let mut bad = valid("b");
        bad.limits.clear();
        let err = Plan::new(2, loaded(&[valid("a")]), |w| {
            w.put(bad, "rules[7]");
            Ok(())
        })
        .unwrap_err();
        let StoreError::Invalid(errors) = err else {
            panic!("{err:?}")
        };
        assert!(
            errors.0.iter().all(|e| e.field.starts_with("rules[7]")),
            "{errors:?}"
        );
    }

    #[test]
    fn an_unwritten_plan_reports_its_changes_and_the_current_version_and_rules() {
        let plan = Plan::new(2, loaded(&[valid("a")]), |w| {
            w.remove("a");
            w.put(valid("b"), "");
            Ok(())
        })
        .unwrap();
        assert!(plan.changes_anything());
        assert_eq!(plan.ordered, [valid("b")]);
        let stamp = Stamp {
            actor: &Actor::system(),
            action: Action::Apply,
            target: None,
            now: 0,
        };
        assert_eq!(
            plan.summary(&stamp),
            "rules.apply: 1 added, 0 changed, 1 removed"
        );
        let edited = plan.unwritten();
        assert_eq!((edited.version, edited.created), (1, false));
        assert_eq!(edited.changes.len(), 2);
        assert_eq!(edited.rules.keys().collect::<Vec<_>>(), ["a"]);
    }

    #[test]
    fn single_rule_actions_audit_the_rule_and_bulk_ones_a_map() {
        let changes = diff(&[], &[valid("a")]);
        let (before, after) = audit_values(Action::RuleCreate, &changes).unwrap();
        assert_eq!(before, None);
        assert_eq!(after, Some(to_json(&valid("a")).unwrap()));
        let (before, after) = audit_values(Action::Apply, &changes).unwrap();
        assert_eq!(before.as_deref(), Some(r#"{"a":null}"#));
        assert_eq!(
            after,
            Some(format!(r#"{{"a":{}}}"#, to_json(&valid("a")).unwrap()))
        );
    }
}
