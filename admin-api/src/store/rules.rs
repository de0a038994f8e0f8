//! Rules, ruleset versions and diffs, as read; changes go through [`Store::edit`]
//! (`edit.rs`).

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use sluice_core::spec::{Mode, RuleSpec};
use sluice_core::wire::RulesetDocument;
use sqlx::Row;
use sqlx::any::AnyRow;

use super::{AnyQuery, Store, StoreError, to_i64, to_u64};

/// A rule's id: its `id`, or its name when it has none.
pub fn rule_id(spec: &RuleSpec) -> &str {
    spec.id.as_deref().unwrap_or(&spec.name)
}

/// The stored form of a spec: an `id` equal to the name is dropped, so `{id: a, name: a}`
/// and `{name: a}` are one rule and applying either file twice changes nothing.
pub(crate) fn canonical(mut spec: RuleSpec) -> RuleSpec {
    if spec.id.as_deref() == Some(spec.name.as_str()) {
        spec.id = None;
    }
    spec
}

/// A rule as stored now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleRecord {
    pub(crate) id: String,
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

/// An `If-Match` precondition on a rule's revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IfMatch {
    /// `*`: the rule must exist.
    Any,
    /// One of these revisions.
    Revisions(Vec<u64>),
}

impl IfMatch {
    pub(super) fn allows(&self, revision: u64) -> bool {
        match self {
            IfMatch::Any => true,
            IfMatch::Revisions(revisions) => revisions.contains(&revision),
        }
    }
}

pub use sluice_api::ChangeKind;

/// How one rule differs between two rulesets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleChange {
    pub id: String,
    pub change: ChangeKind,
    pub before: Option<RuleSpec>,
    pub after: Option<RuleSpec>,
}

/// The per-rule differences from `before` to `after`, by id.
pub(crate) fn diff(before: &[RuleSpec], after: &[RuleSpec]) -> Vec<RuleChange> {
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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionSummary {
    pub version: u64,
    pub created_at: i64,
    pub actor_id: Option<String>,
    pub actor_name: String,
    pub action: String,
    pub(crate) summary: String,
    pub rule_count: u64,
}

/// A ruleset version with its snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionDetail {
    pub(crate) summary: VersionSummary,
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

fn parse_spec(json: &str, what: &str) -> Result<RuleSpec, StoreError> {
    serde_json::from_str(json).map_err(|e| StoreError::Corrupt(format!("{what}: {e}")))
}

fn parse_snapshot(json: &str, version: u64) -> Result<Vec<RuleSpec>, StoreError> {
    serde_json::from_str(json)
        .map_err(|e| StoreError::Corrupt(format!("snapshot of version {version}: {e}")))
}

pub(super) fn to_json<T: Serialize>(value: &T) -> Result<String, StoreError> {
    serde_json::to_string(value).map_err(|e| StoreError::Corrupt(e.to_string()))
}

pub(super) fn rule_record(row: &AnyRow) -> Result<RuleRecord, StoreError> {
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

pub(super) fn mode_str(mode: Mode) -> &'static str {
    match mode {
        Mode::Enforce => "enforce",
        Mode::Shadow => "shadow",
        Mode::Warn => "warn",
    }
}

/// Binds what a [`RuleFilter`] filters on, in the order of the placeholders
/// [`Store::list_rules`] numbers; `pattern` is the `LIKE` pattern for its name.
fn bind_filter<'q>(
    mut query: AnyQuery<'q>,
    filter: &RuleFilter,
    pattern: Option<&str>,
) -> AnyQuery<'q> {
    if let Some(p) = pattern {
        query = query.bind(p.to_string());
    }
    if let Some(e) = filter.enabled {
        query = query.bind(e);
    }
    if let Some(m) = filter.mode {
        query = query.bind(mode_str(m));
    }
    query
}

pub(super) const RULE_COLUMNS: &str = "id, spec, revision, created_at, updated_at";
const VERSION_COLUMNS: &str =
    "version, created_at, actor_id, actor_name, action, summary, rule_count";

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
        let count = bind_filter(sqlx::query(&count_sql), filter, pattern.as_deref())
            .fetch_one(&self.pool)
            .await?;
        let total = to_u64(count.try_get(0)?);

        let list_sql = format!(
            "SELECT {RULE_COLUMNS} FROM rules{filter_sql} ORDER BY priority DESC, name ASC{page_sql}"
        );
        let list = bind_filter(sqlx::query(&list_sql), filter, pattern.as_deref());
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

    pub async fn rule_count(&self) -> Result<u64, StoreError> {
        self.count("rules").await
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A spec from its JSON.
    pub(in crate::store) fn spec(json: &str) -> RuleSpec {
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
