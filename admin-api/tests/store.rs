//! The repository layer's behaviour, on SQLite and PostgreSQL alike.

use std::collections::BTreeSet;

use serde_json::{Value, json};
use sluice_admin::server::{Bootstrap, BootstrapError, MIN_ADMIN_TOKEN_LEN, bootstrap_admin};
use sluice_admin::store::{
    Action, Actor, ChangeKind, Edited, IfMatch, NewToken, ProxySeen, Role, RuleFilter, StoreError,
    Working, hash_token,
};
use sluice_admin::testing::TestDb;
use sluice_core::spec::{Mode, RuleSpec};
use sluice_core::validation::ValidationErrors;

sluice_admin::on_every_backend!(
    a_fresh_database_is_at_version_zero,
    an_edit_writes_rules_a_version_and_an_audit_entry,
    an_edit_is_stamped_with_the_callers_time,
    a_preview_writes_nothing,
    an_edit_that_changes_nothing_makes_no_version,
    an_invalid_ruleset_writes_nothing,
    a_failed_edit_writes_nothing,
    a_stale_revision_is_refused,
    concurrent_edits_get_gapless_versions,
    two_rules_can_swap_names_in_one_edit,
    diff_and_rollback_restore_an_old_ruleset,
    revisions_are_never_reused,
    tokens_are_stored_hashed_and_can_be_revoked,
    token_times_are_the_callers,
    the_bootstrap_token_is_stored_once,
    a_short_bootstrap_token_is_refused,
    a_changed_bootstrap_token_retires_the_old_one,
    proxies_are_upserted,
    rules_are_listed_filtered_and_paged,
    migrating_twice_is_harmless,
);

/// The time every change in these tests is made at, unless a test says otherwise
/// (2023-11-14T22:13:20Z): the store takes its time from the caller.
const NOW: i64 = 1_700_000_000_000;

fn spec(value: Value) -> RuleSpec {
    serde_json::from_value(value).unwrap()
}

fn rule(name: &str) -> RuleSpec {
    spec(sluice_admin::testing::rule(name))
}

fn actor() -> Actor {
    Actor {
        id: Some("tok_test".to_string()),
        name: "tester".to_string(),
    }
}

/// An edit by the tests' actor, at `at`.
async fn edit(
    db: &TestDb,
    action: Action,
    target: Option<&str>,
    at: i64,
    change: impl FnOnce(&mut Working) -> Result<(), StoreError>,
) -> Result<Edited, StoreError> {
    db.store.edit(&actor(), action, target, at, change).await
}

/// The problems of an edit refused as invalid (the test fails on any other outcome).
fn problems(result: Result<Edited, StoreError>) -> ValidationErrors {
    match result {
        Err(StoreError::Invalid(errors)) => errors,
        other => panic!("{other:?}"),
    }
}

/// An editor token named `ci`, created by the command line.
async fn ci_token(db: &TestDb) -> NewToken {
    db.store
        .create_token(&Actor::cli(), "ci", Role::Editor, NOW)
        .await
        .unwrap()
}

async fn create(db: &TestDb, spec: RuleSpec) -> u64 {
    let id = sluice_admin::store::rule_id(&spec).to_string();
    edit(db, Action::RuleCreate, Some(&id), NOW, |w| {
        w.put(spec, "");
        Ok(())
    })
    .await
    .unwrap()
    .version
}

async fn a_fresh_database_is_at_version_zero(db: TestDb) {
    assert_eq!(db.store.current_version().await.unwrap(), 0);
    let doc = db.store.document().await.unwrap();
    assert_eq!((doc.version, doc.rules.len()), (0, 0));
    assert!(db.store.list_versions(10, None).await.unwrap().is_empty());
    let initial = db.store.version(0).await.unwrap();
    assert!(initial.rules.is_empty());
    assert!(matches!(
        db.store.version(1).await,
        Err(StoreError::VersionNotFound(1))
    ));
}

async fn an_edit_writes_rules_a_version_and_an_audit_entry(db: TestDb) {
    let edited = edit(&db, Action::RuleCreate, Some("a"), NOW, |w| {
        w.put(rule("a"), "");
        Ok(())
    })
    .await
    .unwrap();
    assert!(edited.created);
    assert_eq!(edited.version, 1);
    assert_eq!(edited.changes.len(), 1);
    assert_eq!(edited.changes[0].change, ChangeKind::Added);

    let record = db.store.get_rule("a").await.unwrap().unwrap();
    assert_eq!(record.revision, 1);
    assert_eq!(record.spec, rule("a"));
    assert_eq!(edited.rules["a"], record);

    let doc = db.store.document().await.unwrap();
    assert_eq!(doc.version, 1);
    assert_eq!(doc.rules, vec![rule("a")]);

    let versions = db.store.list_versions(10, None).await.unwrap();
    assert_eq!(versions.len(), 1);
    assert_eq!(versions[0].version, 1);
    assert_eq!(versions[0].action, "rule.create");
    assert_eq!(versions[0].actor_name, "tester");
    assert_eq!(versions[0].actor_id.as_deref(), Some("tok_test"));
    assert_eq!(versions[0].rule_count, 1);

    let audit = db.store.list_audit(10, None).await.unwrap();
    assert_eq!(audit.len(), 1);
    assert_eq!(audit[0].action, "rule.create");
    assert_eq!(audit[0].target.as_deref(), Some("a"));
    assert_eq!(audit[0].version, Some(1));
    assert_eq!(audit[0].before, None);
    assert_eq!(audit[0].after.as_ref().unwrap()["name"], "a");
}

async fn an_edit_is_stamped_with_the_callers_time(db: TestDb) {
    create(&db, rule("a")).await;
    let record = db.store.get_rule("a").await.unwrap().unwrap();
    assert_eq!((record.created_at, record.updated_at), (NOW, NOW));
    let later = NOW + 5_000;
    let mut a2 = rule("a");
    a2.limits[0].requests = Some(99);
    let edited = edit(&db, Action::RuleReplace, Some("a"), later, |w| {
        w.put(a2, "");
        Ok(())
    })
    .await
    .unwrap();
    // A changed rule keeps the time it was created.
    assert_eq!(
        (edited.rules["a"].created_at, edited.rules["a"].updated_at),
        (NOW, later)
    );
    assert_eq!(
        db.store.get_rule("a").await.unwrap().unwrap(),
        edited.rules["a"]
    );
    let versions = db.store.list_versions(10, None).await.unwrap();
    let times: Vec<i64> = versions.iter().map(|v| v.created_at).collect();
    assert_eq!(times, [later, NOW]);
    let audit = db.store.list_audit(10, None).await.unwrap();
    let times: Vec<i64> = audit.iter().map(|a| a.at).collect();
    assert_eq!(times, [later, NOW]);
}

async fn a_preview_writes_nothing(db: TestDb) {
    create(&db, rule("a")).await;
    let before = db.footprint().await;
    let previewed = db
        .store
        .preview(|w| {
            w.remove("a");
            w.put(rule("b"), "rules[0]");
            Ok(())
        })
        .await
        .unwrap();
    assert!(!previewed.created);
    assert_eq!(previewed.version, 1);
    let kinds: Vec<(&str, ChangeKind)> = previewed
        .changes
        .iter()
        .map(|c| (c.id.as_str(), c.change))
        .collect();
    assert_eq!(
        kinds,
        [("a", ChangeKind::Removed), ("b", ChangeKind::Added)]
    );
    // The rules as they are, not as the preview would have them.
    assert_eq!(previewed.rules.keys().collect::<Vec<_>>(), ["a"]);
    assert_eq!(db.footprint().await, before);
    assert!(db.store.get_rule("b").await.unwrap().is_none());
    // An invalid result is refused like a real edit's.
    let mut zero = rule("z");
    zero.limits[0].requests = Some(0);
    assert!(matches!(
        db.store
            .preview(|w| {
                w.put(zero, "rules[0]");
                Ok(())
            })
            .await,
        Err(StoreError::Invalid(_))
    ));
    assert_eq!(db.footprint().await, before);
    // The next real edit gets the next version: a preview leaves no gap.
    assert_eq!(create(&db, rule("c")).await, 2);
}

async fn an_edit_that_changes_nothing_makes_no_version(db: TestDb) {
    create(&db, rule("a")).await;
    let before = db.footprint().await;
    // `{id: a, name: a}` is the same rule as `{name: a}`.
    let mut same = rule("a");
    same.id = Some("a".to_string());
    let edited = edit(&db, Action::Apply, None, NOW, |w| {
        w.put(same, "rules[0]");
        Ok(())
    })
    .await
    .unwrap();
    assert!(!edited.created);
    assert_eq!(edited.version, 1);
    assert!(edited.changes.is_empty());
    assert_eq!(db.footprint().await, before);
}

async fn an_invalid_ruleset_writes_nothing(db: TestDb) {
    create(&db, rule("a")).await;
    let before = db.footprint().await;

    // A duplicate name is a problem of the whole ruleset, reported on the new rule.
    let mut clash = rule("a");
    clash.id = Some("other".to_string());
    let errors = problems(
        edit(&db, Action::RuleCreate, Some("other"), NOW, |w| {
            w.put(clash, "");
            Ok(())
        })
        .await,
    );
    assert_eq!(errors.0[0].field, "name");

    // A bad rule in a bulk change is reported with its place in the file.
    let mut zero = rule("z");
    zero.limits[0].requests = Some(0);
    let errors = problems(
        edit(&db, Action::Apply, None, NOW, |w| {
            w.put(rule("fine"), "rules[0]");
            w.put(zero, "rules[1]");
            Ok(())
        })
        .await,
    );
    let fields: Vec<&str> = errors.0.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(fields, ["rules[1].limits[0].requests"]);
    assert_eq!(db.footprint().await, before);
    assert!(db.store.get_rule("fine").await.unwrap().is_none());
}

async fn a_failed_edit_writes_nothing(db: TestDb) {
    create(&db, rule("a")).await;
    let before = db.footprint().await;
    let err = db
        .store
        .edit(
            &actor(),
            Action::RuleCreate,
            Some("b"),
            NOW,
            |w: &mut Working| {
                w.put(rule("b"), "");
                w.remove("a");
                Err(StoreError::RuleExists("b".to_string()))
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::RuleExists(_)));
    assert_eq!(db.footprint().await, before);
    assert!(db.store.get_rule("a").await.unwrap().is_some());
}

async fn a_stale_revision_is_refused(db: TestDb) {
    create(&db, rule("a")).await;
    create(&db, rule("b")).await;
    let before = db.footprint().await;
    let err = edit(&db, Action::RuleDelete, Some("a"), NOW, |w| {
        w.require("a", Some(&IfMatch::Revisions(vec![7])))?;
        w.remove("a");
        Ok(())
    })
    .await
    .unwrap_err();
    assert!(
        matches!(err, StoreError::StaleRevision { current: 1, .. }),
        "{err:?}"
    );
    assert_eq!(db.footprint().await, before);
    // The right revision, or `*`, passes.
    for condition in [IfMatch::Revisions(vec![1]), IfMatch::Any] {
        edit(&db, Action::RulePatch, Some("a"), NOW, |w| {
            w.require("a", Some(&condition))?;
            Ok(())
        })
        .await
        .unwrap();
    }
    assert!(matches!(
        edit(&db, Action::RuleDelete, Some("x"), NOW, |w| {
            w.require("x", None).map(|_| ())
        })
        .await,
        Err(StoreError::RuleNotFound(_))
    ));
}

async fn concurrent_edits_get_gapless_versions(db: TestDb) {
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let store = db.store.clone();
            tokio::spawn(async move {
                store
                    .edit(&actor(), Action::RuleCreate, None, NOW, |w| {
                        w.put(rule(&format!("r{i}")), "");
                        Ok(())
                    })
                    .await
                    .map(|e| e.version)
            })
        })
        .collect();
    let mut versions = BTreeSet::new();
    for task in tasks {
        versions.insert(task.await.unwrap().unwrap());
    }
    assert_eq!(versions, (1..=8).collect());
    assert_eq!(db.store.current_version().await.unwrap(), 8);
    assert_eq!(db.store.rule_count().await.unwrap(), 8);
    // Each snapshot has one more rule than the one before: no edit lost another's.
    for v in 1..=8 {
        assert_eq!(db.store.version(v).await.unwrap().rules.len() as u64, v);
    }
}

async fn two_rules_can_swap_names_in_one_edit(db: TestDb) {
    let with_id = |id: &str, name: &str| {
        let mut s = rule(name);
        s.id = Some(id.to_string());
        s
    };
    create(&db, with_id("one", "alpha")).await;
    create(&db, with_id("two", "beta")).await;
    edit(&db, Action::Apply, None, NOW, |w| {
        w.put(with_id("one", "beta"), "rules[0]");
        w.put(with_id("two", "alpha"), "rules[1]");
        Ok(())
    })
    .await
    .unwrap();
    assert_eq!(
        db.store.get_rule("one").await.unwrap().unwrap().spec.name,
        "beta"
    );
    assert_eq!(
        db.store.get_rule("two").await.unwrap().unwrap().spec.name,
        "alpha"
    );
}

async fn diff_and_rollback_restore_an_old_ruleset(db: TestDb) {
    create(&db, rule("a")).await; // 1
    create(&db, rule("b")).await; // 2
    let mut a2 = rule("a");
    a2.limits[0].requests = Some(99);
    edit(&db, Action::RuleReplace, Some("a"), NOW, |w| {
        w.put(a2.clone(), "");
        Ok(())
    })
    .await
    .unwrap(); // 3
    edit(&db, Action::RuleDelete, Some("b"), NOW, |w| {
        w.remove("b");
        Ok(())
    })
    .await
    .unwrap(); // 4
    create(&db, rule("c")).await; // 5

    let changes = db.store.diff(2, 5).await.unwrap();
    let summary: Vec<(&str, ChangeKind)> =
        changes.iter().map(|c| (c.id.as_str(), c.change)).collect();
    assert_eq!(
        summary,
        [
            ("a", ChangeKind::Changed),
            ("b", ChangeKind::Removed),
            ("c", ChangeKind::Added)
        ]
    );
    assert_eq!(
        changes[0].before.as_ref().unwrap().limits[0].requests,
        Some(10)
    );
    assert_eq!(
        changes[0].after.as_ref().unwrap().limits[0].requests,
        Some(99)
    );
    assert!(db.store.diff(5, 5).await.unwrap().is_empty());
    assert_eq!(db.store.diff(0, 1).await.unwrap().len(), 1);

    // Rolling back is an edit to the old snapshot: a new version, audited.
    let snapshot = db.store.version(2).await.unwrap().rules;
    let edited = edit(&db, Action::Rollback, Some("version 2"), NOW, |w| {
        for id in w.ids() {
            w.remove(&id);
        }
        for (i, s) in snapshot.iter().enumerate() {
            w.put(s.clone(), format!("rules[{i}]"));
        }
        Ok(())
    })
    .await
    .unwrap();
    assert_eq!(edited.version, 6);
    assert_eq!(
        db.store.document().await.unwrap().rules,
        db.store.version(2).await.unwrap().rules
    );
    assert!(db.store.diff(2, 6).await.unwrap().is_empty());
    let audit = db.store.list_audit(1, None).await.unwrap();
    assert_eq!(audit[0].action, "ruleset.rollback");
    // A bulk change records maps of the changed rules by id.
    assert_eq!(audit[0].before.as_ref().unwrap()["c"]["name"], "c");
    assert_eq!(audit[0].after.as_ref().unwrap()["c"], Value::Null);
    // The restored `b` is new as far as ETags go.
    assert_eq!(db.store.get_rule("b").await.unwrap().unwrap().revision, 6);
}

async fn revisions_are_never_reused(db: TestDb) {
    create(&db, rule("a")).await;
    edit(&db, Action::RuleDelete, Some("a"), NOW, |w| {
        w.remove("a");
        Ok(())
    })
    .await
    .unwrap();
    create(&db, rule("a")).await;
    let record = db.store.get_rule("a").await.unwrap().unwrap();
    assert_eq!(record.revision, 3);
}

async fn tokens_are_stored_hashed_and_can_be_revoked(db: TestDb) {
    let by = Actor::cli();
    let created = ci_token(&db).await;
    assert!(created.secret.starts_with("slc_"));
    let info = db
        .store
        .authenticate(&created.secret, NOW)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((info.name.as_str(), info.role), ("ci", Role::Editor));
    assert!(
        db.store
            .authenticate("slc_wrong", NOW)
            .await
            .unwrap()
            .is_none()
    );

    // Only the hash is stored.
    let stored: Vec<String> = sqlx::query_scalar("SELECT hash FROM tokens")
        .fetch_all(db.store.pool())
        .await
        .unwrap();
    assert_eq!(stored, vec![hash_token(&created.secret)]);

    let listed = db.store.list_tokens().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id, created.info.id);
    assert!(listed[0].last_used_at.is_some());

    let revoked = db
        .store
        .revoke_token(&by, &created.info.id, NOW)
        .await
        .unwrap();
    assert!(revoked.revoked_at.is_some());
    assert!(
        db.store
            .authenticate(&created.secret, NOW)
            .await
            .unwrap()
            .is_none()
    );
    // Again: harmless, and not audited twice.
    db.store
        .revoke_token(&by, &created.info.id, NOW)
        .await
        .unwrap();
    assert!(matches!(
        db.store.revoke_token(&by, "tok_nope", NOW).await,
        Err(StoreError::TokenNotFound(_))
    ));
    let audit = db.store.list_audit(10, None).await.unwrap();
    let actions: Vec<&str> = audit.iter().map(|a| a.action.as_str()).collect();
    assert_eq!(actions, ["token.revoke", "token.create"]);
    let text = format!("{audit:?}");
    assert!(!text.contains(&created.secret));
    assert!(!text.contains(&hash_token(&created.secret)));

    assert!(matches!(
        db.store.create_token(&by, " ", Role::Viewer, NOW).await,
        Err(StoreError::Invalid(_))
    ));
}

async fn token_times_are_the_callers(db: TestDb) {
    let by = Actor::cli();
    let created = ci_token(&db).await;
    assert_eq!(created.info.created_at, NOW);
    // Authenticates at `at`; returns the last use the token then has on record.
    let use_at = |at: i64| {
        let (store, secret) = (db.store.clone(), created.secret.clone());
        async move {
            store.authenticate(&secret, at).await.unwrap().unwrap();
            store.list_tokens().await.unwrap()[0].last_used_at
        }
    };
    assert_eq!(db.store.list_tokens().await.unwrap()[0].last_used_at, None);
    assert_eq!(use_at(NOW + 1_000).await, Some(NOW + 1_000));
    // Within a minute of the last noted use, a use is not written again.
    assert_eq!(use_at(NOW + 60_999).await, Some(NOW + 1_000));
    assert_eq!(use_at(NOW + 61_000).await, Some(NOW + 61_000));

    let revoked = db
        .store
        .revoke_token(&by, &created.info.id, NOW + 90_000)
        .await
        .unwrap();
    assert_eq!(revoked.revoked_at, Some(NOW + 90_000));
    let audit = db.store.list_audit(10, None).await.unwrap();
    let entries: Vec<(&str, i64)> = audit.iter().map(|a| (a.action.as_str(), a.at)).collect();
    assert_eq!(
        entries,
        [("token.revoke", NOW + 90_000), ("token.create", NOW)]
    );
}

async fn the_bootstrap_token_is_stored_once(db: TestDb) {
    let secret = "a-long-bootstrap-secret-for-tests";
    let Bootstrap::FromEnv {
        created: true,
        token,
        replaced: 0,
    } = bootstrap_admin(&db.store, Some(secret)).await.unwrap()
    else {
        panic!("not stored")
    };
    assert_eq!(token.role, Role::Admin);
    assert!(matches!(
        bootstrap_admin(&db.store, Some(secret)).await.unwrap(),
        Bootstrap::FromEnv { created: false, .. }
    ));
    assert!(matches!(
        bootstrap_admin(&db.store, None).await.unwrap(),
        Bootstrap::NotNeeded
    ));
    db.store
        .revoke_token(&Actor::cli(), &token.id, NOW)
        .await
        .unwrap();
    assert!(matches!(
        bootstrap_admin(&db.store, Some(secret)).await.unwrap(),
        Bootstrap::EnvTokenRevoked(_)
    ));
    assert_eq!(db.store.list_tokens().await.unwrap().len(), 1);
}

/// `SLUICE_ADMIN_TOKEN=abc` would be an admin token anyone could guess: one character
/// short of the minimum is refused, with nothing stored; the minimum itself is accepted.
async fn a_short_bootstrap_token_is_refused(db: TestDb) {
    let short = "x".repeat(MIN_ADMIN_TOKEN_LEN - 1);
    for secret in ["abc", short.as_str()] {
        let err = bootstrap_admin(&db.store, Some(secret)).await.unwrap_err();
        assert!(matches!(err, BootstrapError::TooShort { .. }), "{err}");
        let message = err.to_string();
        assert!(message.contains("SLUICE_ADMIN_TOKEN"), "{message}");
        assert!(
            message.contains(&MIN_ADMIN_TOKEN_LEN.to_string()),
            "{message}"
        );
    }
    assert!(db.store.list_tokens().await.unwrap().is_empty());
    let enough = "x".repeat(MIN_ADMIN_TOKEN_LEN);
    assert!(matches!(
        bootstrap_admin(&db.store, Some(&enough)).await.unwrap(),
        Bootstrap::FromEnv { created: true, .. }
    ));
}

/// Changing `SLUICE_ADMIN_TOKEN` revokes the previous bootstrap token (and a generated
/// one); tokens made through the API stay valid.
async fn a_changed_bootstrap_token_retires_the_old_one(db: TestDb) {
    let Bootstrap::Generated(generated) = bootstrap_admin(&db.store, None).await.unwrap() else {
        panic!("no token was generated")
    };
    let editor = db.token(Role::Editor).await;
    let first = "first-bootstrap-secret-0123456789abcdef";
    let second = "second-bootstrap-secret-0123456789abcdef";
    let Bootstrap::FromEnv { replaced: 1, .. } =
        bootstrap_admin(&db.store, Some(first)).await.unwrap()
    else {
        panic!("the generated token was not replaced")
    };
    let Bootstrap::FromEnv {
        created: true,
        replaced: 1,
        ..
    } = bootstrap_admin(&db.store, Some(second)).await.unwrap()
    else {
        panic!("the first token was not replaced")
    };
    let now = sluice_admin::store::now_ms();
    for gone in [generated.secret.as_str(), first] {
        assert!(db.store.authenticate(gone, now).await.unwrap().is_none());
    }
    for valid in [second, editor.as_str()] {
        assert!(db.store.authenticate(valid, now).await.unwrap().is_some());
    }
    // Restarting with the same token changes nothing.
    assert!(matches!(
        bootstrap_admin(&db.store, Some(second)).await.unwrap(),
        Bootstrap::FromEnv {
            created: false,
            replaced: 0,
            ..
        }
    ));
}

async fn proxies_are_upserted(db: TestDb) {
    let mut seen = ProxySeen {
        id: "envoy-1".to_string(),
        address: "127.0.0.1:5000".to_string(),
        token_id: Some("tok_p".to_string()),
        ruleset_version: 0,
        error: Some("refused version 3: rules[0].name: bad".to_string()),
    };
    db.store.record_proxy(&seen, 1_000).await.unwrap();
    seen.ruleset_version = 4;
    seen.error = None;
    seen.address = "127.0.0.1:5001".to_string();
    db.store.record_proxy(&seen, 2_000).await.unwrap();
    let proxies = db.store.list_proxies().await.unwrap();
    assert_eq!(proxies.len(), 1);
    let p = &proxies[0];
    assert_eq!((p.first_seen, p.last_seen), (1_000, 2_000));
    assert_eq!(p.ruleset_version, 4);
    assert_eq!(p.last_error, None);
    assert_eq!(p.address, "127.0.0.1:5001");
    assert_eq!(db.store.proxies_seen_since(1_500).await.unwrap(), 1);
    assert_eq!(db.store.proxies_seen_since(2_500).await.unwrap(), 0);
}

async fn rules_are_listed_filtered_and_paged(db: TestDb) {
    let rules = [
        json!({"name": "API-keys", "priority": 5, "key": "global", "limits": [{"requests": 1, "period": 1}]}),
        json!({"name": "api_login", "priority": 1, "mode": "shadow", "key": "global", "limits": [{"requests": 1, "period": 1}]}),
        json!({"name": "apixlogin", "enabled": false, "key": "global", "limits": [{"requests": 1, "period": 1}]}),
        json!({"name": "web", "key": "global", "limits": [{"requests": 1, "period": 1}]}),
    ];
    for r in rules {
        create(&db, spec(r)).await;
    }
    let names = |page: sluice_admin::store::RulePage| {
        page.rules
            .into_iter()
            .map(|r| r.spec.name)
            .collect::<Vec<_>>()
    };
    let all = RuleFilter {
        limit: 100,
        ..RuleFilter::default()
    };
    // Evaluation order: priority, highest first, then name.
    let page = db.store.list_rules(&all).await.unwrap();
    assert_eq!(page.total, 4);
    assert_eq!(names(page), ["API-keys", "api_login", "apixlogin", "web"]);

    let by_name = |name: &str| RuleFilter {
        name: Some(name.to_string()),
        ..all.clone()
    };
    // Case-insensitive, and `_` is a character, not a wildcard.
    assert_eq!(
        names(db.store.list_rules(&by_name("api")).await.unwrap()),
        ["API-keys", "api_login", "apixlogin"]
    );
    assert_eq!(
        names(db.store.list_rules(&by_name("_")).await.unwrap()),
        ["api_login"]
    );
    assert_eq!(
        names(db.store.list_rules(&by_name("%")).await.unwrap()),
        Vec::<String>::new()
    );

    let disabled = RuleFilter {
        enabled: Some(false),
        ..all.clone()
    };
    assert_eq!(
        names(db.store.list_rules(&disabled).await.unwrap()),
        ["apixlogin"]
    );
    let shadow = RuleFilter {
        mode: Some(Mode::Shadow),
        ..all.clone()
    };
    assert_eq!(
        names(db.store.list_rules(&shadow).await.unwrap()),
        ["api_login"]
    );

    let second_page = RuleFilter {
        limit: 2,
        offset: 2,
        ..all.clone()
    };
    let page = db.store.list_rules(&second_page).await.unwrap();
    assert_eq!(page.total, 4);
    assert_eq!(names(page), ["apixlogin", "web"]);
}

async fn migrating_twice_is_harmless(db: TestDb) {
    create(&db, rule("a")).await;
    db.store.migrate().await.unwrap();
    let again = sluice_admin::store::Store::open(&db.url).await.unwrap();
    assert_eq!(again.current_version().await.unwrap(), 1);
    assert_eq!(again.backend(), db.store.backend());
    again.close().await;
}
