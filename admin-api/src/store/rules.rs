//! Rules, ruleset versions, diffs and the audit log.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use serde_json::Value;
use sluice_core::ruleset::Ruleset;
use sluice_core::spec::{Mode, RuleSpec};
use sluice_core::validation::{FieldError, ValidationErrors};
use sluice_core::wire::RulesetDocument;
use sqlx::any::AnyRow;
use sqlx::{Any, Row};

use super::{Actor, Store, StoreError, now_ms, to_i64, to_u64};

/// A rule's id: its `id`, or its name when it has none.
pub fn rule_id(spec: &RuleSpec) -> &str {
    spec.id.as_deref().unwrap_or(&spec.name)
}

/// The stored form of a spec: an `id` equal to the name is dropped, so `{id: a, name: a}`
/// and `{name: a}` are one rule and applying either file twice changes nothing.
pub fn canonical(mut spec: RuleSpec) -> RuleSpec {
    if spec.id.as_deref() == Some(spec.name.as_str()) {
        spec.id = None;
    }
    spec
}

/// A rule as stored now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleRecord {
    pub id: String,
    pub spec: RuleSpec,
    /// The ruleset version that last changed this rule: never reused, so an `ETag` from a
    /// deleted and re-created rule cannot match the new one.
    pub revision: u64,
    pub created_at: i64,
    pub updated_at: i64,
}

/// Which rules to list.
#[derive(Debug, Clone, Default)]
pub struct RuleFilter {
    /// Case-insensitive substring of the name.
    pub name: Option<String>,
    pub enabled: Option<bool>,
    pub mode: Option<Mode>,
    pub limit: u32,
    pub offset: u64,
}

/// One page of rules, in evaluation order (priority, highest first, then name).
#[derive(Debug, Clone)]
pub struct RulePage {
    pub rules: Vec<RuleRecord>,
    /// Matching rules on all pages.
    pub total: u64,
}

/// What a change did, as recorded in versions and the audit log.
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
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::RuleCreate => "rule.create",
            Action::RuleReplace => "rule.update",
            Action::RulePatch => "rule.patch",
            Action::RuleDelete => "rule.delete",
            Action::RuleEnable => "rule.enable",
            Action::RuleDisable => "rule.disable",
            Action::Apply => "rules.apply",
            Action::Rollback => "ruleset.rollback",
        }
    }

    fn is_single_rule(self) -> bool {
        !matches!(self, Action::Apply | Action::Rollback)
    }
}

/// An `If-Match` precondition on a rule's revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IfMatch {
    /// `*`: the rule must exist.
    Any,
    /// One of these revisions.
    Revisions(Vec<u64>),
}

impl IfMatch {
    fn allows(&self, revision: u64) -> bool {
        match self {
            IfMatch::Any => true,
            IfMatch::Revisions(revisions) => revisions.contains(&revision),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    Added,
    Removed,
    Changed,
}

/// How one rule differs between two rulesets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleChange {
    pub id: String,
    pub change: ChangeKind,
    pub before: Option<RuleSpec>,
    pub after: Option<RuleSpec>,
}

/// The per-rule differences from `before` to `after`, by id.
pub fn diff(before: &[RuleSpec], after: &[RuleSpec]) -> Vec<RuleChange> {
    let before: BTreeMap<&str, &RuleSpec> = before.iter().map(|s| (rule_id(s), s)).collect();
    let after: BTreeMap<&str, &RuleSpec> = after.iter().map(|s| (rule_id(s), s)).collect();
    let ids: BTreeSet<&str> = before.keys().chain(after.keys()).copied().collect();
    ids.into_iter()
        .filter_map(|id| {
            let (b, a) = (before.get(id).copied(), after.get(id).copied());
            let change = match (b, a) {
                (None, Some(_)) => ChangeKind::Added,
                (Some(_), None) => ChangeKind::Removed,
                (Some(b), Some(a)) if b != a => ChangeKind::Changed,
                _ => return None,
            };
            Some(RuleChange {
                id: id.to_string(),
                change,
                before: b.cloned(),
                after: a.cloned(),
            })
        })
        .collect()
}

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

    /// The rule as it was before this edit.
    pub fn original(&self, id: &str) -> Option<&RuleRecord> {
        self.original.get(id)
    }

    /// The rule as the edit has it so far.
    pub fn get(&self, id: &str) -> Option<&RuleSpec> {
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
    pub fn put_one(&mut self, spec: RuleSpec) -> Result<String, StoreError> {
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

/// A ruleset version without its rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionSummary {
    pub version: u64,
    pub created_at: i64,
    pub actor_id: Option<String>,
    pub actor_name: String,
    pub action: String,
    pub summary: String,
    pub rule_count: u64,
}

/// A ruleset version with its snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionDetail {
    pub summary: VersionSummary,
    /// In evaluation order.
    pub rules: Vec<RuleSpec>,
}

impl VersionDetail {
    /// Version 0: the empty ruleset before any change.
    fn initial() -> VersionDetail {
        VersionDetail {
            summary: VersionSummary {
                version: 0,
                created_at: 0,
                actor_id: None,
                actor_name: "system".to_string(),
                action: "initial".to_string(),
                summary: "empty ruleset before any change".to_string(),
                rule_count: 0,
            },
            rules: Vec::new(),
        }
    }
}

/// One audit log entry.
#[derive(Debug, Clone, PartialEq)]
pub struct AuditEntry {
    pub id: u64,
    pub at: i64,
    pub actor_id: Option<String>,
    pub actor_name: String,
    pub action: String,
    /// The rule id, token id or version acted on.
    pub target: Option<String>,
    /// The ruleset version the change created, if it was a ruleset change.
    pub version: Option<u64>,
    pub before: Option<Value>,
    pub after: Option<Value>,
}

fn parse_spec(json: &str, what: &str) -> Result<RuleSpec, StoreError> {
    serde_json::from_str(json).map_err(|e| StoreError::Corrupt(format!("{what}: {e}")))
}

fn parse_snapshot(json: &str, version: u64) -> Result<Vec<RuleSpec>, StoreError> {
    serde_json::from_str(json)
        .map_err(|e| StoreError::Corrupt(format!("snapshot of version {version}: {e}")))
}

fn to_json<T: Serialize>(value: &T) -> Result<String, StoreError> {
    serde_json::to_string(value).map_err(|e| StoreError::Corrupt(e.to_string()))
}

fn rule_record(row: &AnyRow) -> Result<RuleRecord, StoreError> {
    let id: String = row.try_get("id")?;
    let spec: String = row.try_get("spec")?;
    Ok(RuleRecord {
        spec: parse_spec(&spec, &format!("rule `{id}`"))?,
        id,
        revision: to_u64(row.try_get("revision")?),
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
    })
}

fn version_summary(row: &AnyRow) -> Result<VersionSummary, StoreError> {
    Ok(VersionSummary {
        version: to_u64(row.try_get("version")?),
        created_at: row.try_get("created_at")?,
        actor_id: row.try_get("actor_id")?,
        actor_name: row.try_get("actor_name")?,
        action: row.try_get("action")?,
        summary: row.try_get("summary")?,
        rule_count: to_u64(row.try_get("rule_count")?),
    })
}

fn mode_str(mode: Mode) -> &'static str {
    match mode {
        Mode::Enforce => "enforce",
        Mode::Shadow => "shadow",
    }
}

const RULE_COLUMNS: &str = "id, spec, revision, created_at, updated_at";
const VERSION_COLUMNS: &str =
    "version, created_at, actor_id, actor_name, action, summary, rule_count";

/// An audit entry to write.
pub(super) struct NewAudit<'a> {
    pub actor: &'a Actor,
    pub action: &'a str,
    pub target: Option<&'a str>,
    pub version: Option<u64>,
    pub before: Option<String>,
    pub after: Option<String>,
}

pub(super) async fn insert_audit<'e, E>(executor: E, entry: NewAudit<'_>) -> Result<(), StoreError>
where
    E: sqlx::Executor<'e, Database = Any>,
{
    sqlx::query(
        "INSERT INTO audit_log (at, actor_id, actor_name, action, target, version, before_json, after_json) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
    )
    .bind(now_ms())
    .bind(entry.actor.id.clone())
    .bind(entry.actor.name.clone())
    .bind(entry.action)
    .bind(entry.target)
    .bind(entry.version.map(to_i64))
    .bind(entry.before)
    .bind(entry.after)
    .execute(executor)
    .await?;
    Ok(())
}

impl Store {
    /// The current ruleset version (0 before any change).
    pub async fn current_version(&self) -> Result<u64, StoreError> {
        let version: i64 = sqlx::query_scalar("SELECT version FROM ruleset_head WHERE id = 1")
            .fetch_one(&self.pool)
            .await?;
        Ok(to_u64(version))
    }

    pub async fn get_rule(&self, id: &str) -> Result<Option<RuleRecord>, StoreError> {
        let row = sqlx::query(&format!("SELECT {RULE_COLUMNS} FROM rules WHERE id = $1"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(rule_record).transpose()
    }

    pub async fn list_rules(&self, filter: &RuleFilter) -> Result<RulePage, StoreError> {
        // Placeholders are numbered by hand: sqlx's query builder writes `?` for `Any`,
        // which PostgreSQL does not accept.
        let mut conditions = Vec::new();
        let mut n = 0;
        let mut next = || {
            n += 1;
            format!("${n}")
        };
        if filter.name.is_some() {
            conditions.push(format!("LOWER(name) LIKE {} ESCAPE '\\'", next()));
        }
        if filter.enabled.is_some() {
            conditions.push(format!("enabled = {}", next()));
        }
        if filter.mode.is_some() {
            conditions.push(format!("mode = {}", next()));
        }
        let filter_sql = if conditions.is_empty() {
            String::new()
        } else {
            format!(" WHERE {}", conditions.join(" AND "))
        };
        let page_sql = format!(" LIMIT {} OFFSET {}", next(), next());
        let pattern = filter.name.as_ref().map(|name| {
            let escaped = name
                .to_lowercase()
                .replace('\\', "\\\\")
                .replace('%', "\\%")
                .replace('_', "\\_");
            format!("%{escaped}%")
        });

        let count_sql = format!("SELECT COUNT(*) FROM rules{filter_sql}");
        let mut count = sqlx::query_scalar::<_, i64>(&count_sql);
        if let Some(p) = &pattern {
            count = count.bind(p.clone());
        }
        if let Some(e) = filter.enabled {
            count = count.bind(e);
        }
        if let Some(m) = filter.mode {
            count = count.bind(mode_str(m));
        }
        let total = to_u64(count.fetch_one(&self.pool).await?);

        let list_sql = format!(
            "SELECT {RULE_COLUMNS} FROM rules{filter_sql} ORDER BY priority DESC, name ASC{page_sql}"
        );
        let mut list = sqlx::query(&list_sql);
        if let Some(p) = &pattern {
            list = list.bind(p.clone());
        }
        if let Some(e) = filter.enabled {
            list = list.bind(e);
        }
        if let Some(m) = filter.mode {
            list = list.bind(mode_str(m));
        }
        let rows = list
            .bind(i64::from(filter.limit))
            .bind(to_i64(filter.offset))
            .fetch_all(&self.pool)
            .await?;
        let rules = rows.iter().map(rule_record).collect::<Result<_, _>>()?;
        Ok(RulePage { rules, total })
    }

    /// The current ruleset as the proxies get it.
    pub async fn document(&self) -> Result<RulesetDocument, StoreError> {
        let row = sqlx::query(
            "SELECT h.version AS version, v.rules AS rules FROM ruleset_head h \
             LEFT JOIN ruleset_versions v ON v.version = h.version WHERE h.id = 1",
        )
        .fetch_one(&self.pool)
        .await?;
        let version = to_u64(row.try_get("version")?);
        let rules: Option<String> = row.try_get("rules")?;
        let rules = match (version, rules) {
            (0, _) => Vec::new(),
            (_, Some(json)) => parse_snapshot(&json, version)?,
            (_, None) => {
                return Err(StoreError::Corrupt(format!(
                    "version {version} has no snapshot"
                )));
            }
        };
        Ok(RulesetDocument { version, rules })
    }

    /// Newest first; `before` pages back (versions lower than it).
    pub async fn list_versions(
        &self,
        limit: u32,
        before: Option<u64>,
    ) -> Result<Vec<VersionSummary>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {VERSION_COLUMNS} FROM ruleset_versions WHERE version < $1 \
             ORDER BY version DESC LIMIT $2"
        ))
        .bind(before.map_or(i64::MAX, to_i64))
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(version_summary).collect()
    }

    /// One version and its snapshot; version 0 is the empty ruleset.
    pub async fn version(&self, version: u64) -> Result<VersionDetail, StoreError> {
        if version == 0 {
            return Ok(VersionDetail::initial());
        }
        let row = sqlx::query(&format!(
            "SELECT {VERSION_COLUMNS}, rules FROM ruleset_versions WHERE version = $1"
        ))
        .bind(to_i64(version))
        .fetch_optional(&self.pool)
        .await?
        .ok_or(StoreError::VersionNotFound(version))?;
        let rules: String = row.try_get("rules")?;
        Ok(VersionDetail {
            summary: version_summary(&row)?,
            rules: parse_snapshot(&rules, version)?,
        })
    }

    /// How the ruleset changed from version `from` to version `to`.
    pub async fn diff(&self, from: u64, to: u64) -> Result<Vec<RuleChange>, StoreError> {
        let before = self.version(from).await?;
        let after = self.version(to).await?;
        Ok(diff(&before.rules, &after.rules))
    }

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
        let json = |row: &AnyRow, column: &str| -> Result<Option<Value>, StoreError> {
            let text: Option<String> = row.try_get(column)?;
            text.map(|t| {
                serde_json::from_str(&t)
                    .map_err(|e| StoreError::Corrupt(format!("audit {column}: {e}")))
            })
            .transpose()
        };
        rows.iter()
            .map(|row| {
                Ok(AuditEntry {
                    id: to_u64(row.try_get("id")?),
                    at: row.try_get("at")?,
                    actor_id: row.try_get("actor_id")?,
                    actor_name: row.try_get("actor_name")?,
                    action: row.try_get("action")?,
                    target: row.try_get("target")?,
                    version: row.try_get::<Option<i64>, _>("version")?.map(to_u64),
                    before: json(row, "before_json")?,
                    after: json(row, "after_json")?,
                })
            })
            .collect()
    }

    /// Number of audit entries: lets tests assert that a refused request wrote nothing.
    pub async fn audit_count(&self) -> Result<u64, StoreError> {
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM audit_log")
            .fetch_one(&self.pool)
            .await?;
        Ok(to_u64(n))
    }

    pub async fn rule_count(&self) -> Result<u64, StoreError> {
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM rules")
            .fetch_one(&self.pool)
            .await?;
        Ok(to_u64(n))
    }

    /// Changes the ruleset in one transaction.
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
        edit: F,
    ) -> Result<Edited, StoreError>
    where
        F: FnOnce(&mut Working) -> Result<(), StoreError>,
    {
        self.run_edit(actor, action, target, true, edit).await
    }

    /// Runs an edit and validates the result like [`Store::edit`], then rolls it back:
    /// what the edit would change, for dry runs.
    pub async fn preview<F>(
        &self,
        actor: &Actor,
        action: Action,
        edit: F,
    ) -> Result<Edited, StoreError>
    where
        F: FnOnce(&mut Working) -> Result<(), StoreError>,
    {
        self.run_edit(actor, action, None, false, edit).await
    }

    async fn run_edit<F>(
        &self,
        actor: &Actor,
        action: Action,
        target: Option<&str>,
        commit: bool,
        edit: F,
    ) -> Result<Edited, StoreError>
    where
        F: FnOnce(&mut Working) -> Result<(), StoreError>,
    {
        let mut tx = self.pool.begin().await?;
        // Writing first takes the write lock at once (SQLite: no deferred-transaction
        // upgrade that could fail with SQLITE_BUSY; PostgreSQL: a row lock that queues
        // concurrent edits), so every edit sees the one before it and versions are gapless.
        let next: i64 = sqlx::query_scalar(
            "UPDATE ruleset_head SET version = version + 1 WHERE id = 1 RETURNING version",
        )
        .fetch_one(&mut *tx)
        .await?;
        let version = to_u64(next);
        let rows = sqlx::query(&format!("SELECT {RULE_COLUMNS} FROM rules"))
            .fetch_all(&mut *tx)
            .await?;
        let mut original = BTreeMap::new();
        for row in &rows {
            let record = rule_record(row)?;
            original.insert(record.id.clone(), record);
        }
        let mut working = Working::new(original);

        let outcome = edit(&mut working).and_then(|()| {
            let changes = working.changes();
            if changes.is_empty() {
                Ok(None)
            } else {
                let ordered = working.validate().map_err(StoreError::Invalid)?;
                Ok(Some((changes, ordered)))
            }
        });
        let (changes, ordered) = match outcome {
            Ok(Some((changes, _))) if !commit => {
                tx.rollback().await?;
                return Ok(Edited {
                    version: version - 1,
                    created: false,
                    changes,
                    rules: working.original,
                });
            }
            Ok(Some(found)) => found,
            Ok(None) => {
                tx.rollback().await?;
                return Ok(Edited {
                    version: version - 1,
                    created: false,
                    changes: Vec::new(),
                    rules: working.original,
                });
            }
            Err(err) => {
                tx.rollback().await?;
                return Err(err);
            }
        };

        let now = now_ms();
        let mut rules = working.original.clone();
        // Changed rules are deleted and inserted again rather than updated, so that two
        // rules swapping names never trip the UNIQUE(name) constraint halfway.
        for change in &changes {
            if change.change != ChangeKind::Added {
                sqlx::query("DELETE FROM rules WHERE id = $1")
                    .bind(&change.id)
                    .execute(&mut *tx)
                    .await?;
                rules.remove(&change.id);
            }
        }
        for change in &changes {
            let Some(spec) = &change.after else { continue };
            let created_at = working
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
            .bind(to_i64(version))
            .bind(created_at)
            .bind(now)
            .execute(&mut *tx)
            .await?;
            rules.insert(
                change.id.clone(),
                RuleRecord {
                    id: change.id.clone(),
                    spec: spec.clone(),
                    revision: version,
                    created_at,
                    updated_at: now,
                },
            );
        }

        let count = |kind| changes.iter().filter(|c| c.change == kind).count();
        let summary = format!(
            "{}{}: {} added, {} changed, {} removed",
            action.as_str(),
            target.map(|t| format!(" {t}")).unwrap_or_default(),
            count(ChangeKind::Added),
            count(ChangeKind::Changed),
            count(ChangeKind::Removed),
        );
        sqlx::query(
            "INSERT INTO ruleset_versions (version, created_at, actor_id, actor_name, action, summary, rule_count, rules) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(to_i64(version))
        .bind(now)
        .bind(actor.id.clone())
        .bind(actor.name.clone())
        .bind(action.as_str())
        .bind(&summary)
        .bind(i64::try_from(ordered.len()).unwrap_or(i64::MAX))
        .bind(to_json(&ordered)?)
        .execute(&mut *tx)
        .await?;

        let (before, after) = audit_values(action, &changes)?;
        insert_audit(
            &mut *tx,
            NewAudit {
                actor,
                action: action.as_str(),
                target,
                version: Some(version),
                before,
                after,
            },
        )
        .await?;
        self.announce_version(&mut tx, version).await?;
        tx.commit().await?;
        Ok(Edited {
            version,
            created: true,
            changes,
            rules,
        })
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(json: &str) -> RuleSpec {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn an_id_equal_to_the_name_is_dropped() {
        let a = spec(r#"{"id":"a","name":"a","key":"global","limits":[]}"#);
        assert_eq!(canonical(a).id, None);
        let b = spec(r#"{"id":"b1","name":"b","key":"global","limits":[]}"#);
        assert_eq!(canonical(b.clone()), b);
        assert_eq!(rule_id(&b), "b1");
    }

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

    #[test]
    fn diff_reports_added_removed_and_changed_by_id() {
        let a1 = spec(r#"{"name":"a","key":"global","limits":[]}"#);
        let a2 = spec(r#"{"name":"a","key":"path","limits":[]}"#);
        let b = spec(r#"{"name":"b","key":"global","limits":[]}"#);
        let c = spec(r#"{"name":"c","key":"global","limits":[]}"#);
        let changes = diff(&[a1.clone(), b.clone()], &[a2.clone(), c.clone(), b]);
        let kinds: Vec<(&str, ChangeKind)> =
            changes.iter().map(|c| (c.id.as_str(), c.change)).collect();
        assert_eq!(
            kinds,
            [("a", ChangeKind::Changed), ("c", ChangeKind::Added)]
        );
        assert_eq!(changes[0].before, Some(a1));
        assert_eq!(changes[0].after, Some(a2));
        assert_eq!(changes[1].before, None);
    }
}
