//! The HTTP API through the router (`tower::ServiceExt::oneshot`), on SQLite and
//! PostgreSQL alike.

use std::net::SocketAddr;

use axum::http::Method;
use serde_json::{Value, json};
use sluice_admin::store::Role;
use sluice_admin::testing::{TestApp, TestDb, assert_contains, example_rule, items, rule};

sluice_admin::on_every_backend!(
    the_example_rule_is_accepted_and_served_to_proxies,
    rules_can_be_read_replaced_patched_toggled_and_deleted,
    bad_input_is_refused_with_field_paths_and_writes_nothing,
    a_stale_if_match_is_a_conflict_and_changes_nothing,
    versions_diffs_and_rollback,
    apply_is_idempotent_and_prunes_only_when_asked,
    export_round_trips_through_apply,
    every_endpoint_checks_the_token_and_the_role,
    tokens_are_managed_through_the_api_and_never_leak,
    rules_are_listed_with_filters_and_pages,
    polls_record_the_proxy,
    a_change_through_one_replica_reaches_the_other_replicas_polls,
    the_audit_log_names_who_did_what,
    metrics_count_requests_by_route,
    configured_limits_are_gauges_per_rule_and_limit,
    openapi_health_and_readiness,
    the_document_bounds_are_the_servers,
    every_rule_within_the_documents_bounds_is_accepted,
    overrides_beyond_the_documents_bound_are_refused_with_their_path,
    failed_authentications_are_limited_per_address,
);

async fn the_example_rule_is_accepted_and_served_to_proxies(db: TestDb) {
    let api = TestApp::new(&db).await;
    let created = api
        .post("/api/v1/rules")
        .json(&example_rule())
        .expect(201)
        .await;
    assert_eq!(
        created.header("location"),
        Some("/api/v1/rules/api-per-key")
    );
    assert_eq!(created.header("etag"), Some("\"1\""));
    assert_eq!(created.header("x-sluice-ruleset-version"), Some("1"));
    let body = created.json();
    assert_eq!(body["id"], "api-per-key");
    assert_eq!(body["revision"], 1);
    assert_eq!(body["spec"]["limits"][0]["burst"], 10);
    assert!(body["created_at"].as_str().unwrap().ends_with('Z'));

    let got = api.get("/api/v1/rules/api-per-key").expect(200).await;
    assert_eq!(got.header("etag"), Some("\"1\""));
    assert_eq!(got.json()["spec"], body["spec"]);

    let proxy = db.token(Role::Proxy).await;
    let doc = api
        .get("/api/v1/ruleset?after=0")
        .token(&proxy)
        .expect(200)
        .await;
    let doc: sluice_core::wire::RulesetDocument = serde_json::from_slice(&doc.body).unwrap();
    assert_eq!(doc.version, 1);
    assert_eq!(doc.rules.len(), 1);
    // What the proxies get compiles with the core, exactly as the control service does.
    doc.compile().unwrap();
}

async fn rules_can_be_read_replaced_patched_toggled_and_deleted(db: TestDb) {
    let api = TestApp::new(&db).await;
    api.create(&rule("a")).await;

    // PUT replaces the whole rule; If-Match with the current ETag passes.
    let mut replacement = rule("a");
    replacement["limits"] = json!([{"requests": 50, "period": "minute"}]);
    let put = api
        .put("/api/v1/rules/a")
        .header("if-match", "\"1\"")
        .json(&replacement)
        .expect(200)
        .await;
    assert_eq!(put.header("etag"), Some("\"2\""));
    assert_eq!(put.json()["spec"]["limits"][0]["requests"], 50);

    // Renaming through PUT keeps the id (and so the URL and the buckets).
    let renamed = api
        .put("/api/v1/rules/a")
        .json(&rule("a-renamed"))
        .expect(200)
        .await
        .json();
    assert_eq!(renamed["id"], "a");
    assert_eq!(renamed["spec"]["id"], "a");
    assert_eq!(renamed["spec"]["name"], "a-renamed");

    // PATCH is a JSON merge patch of the rule as it is now.
    let patched = api
        .patch("/api/v1/rules/a")
        .raw(
            "application/merge-patch+json",
            r#"{"description":"per client","match":{"path_prefix":"/v1/"},"priority":7}"#,
        )
        .expect(200)
        .await
        .json();
    assert_eq!(patched["spec"]["description"], "per client");
    assert_eq!(patched["spec"]["priority"], 7);
    assert_eq!(patched["spec"]["name"], "a-renamed");
    let patched = api
        .patch("/api/v1/rules/a")
        .json(&json!({"match": {"path_prefix": null}, "description": null}))
        .expect(200)
        .await
        .json();
    assert_eq!(patched["spec"].get("description"), None);
    assert_eq!(patched["spec"]["match"], json!({}));

    let disabled = api.post("/api/v1/rules/a/disable").expect(200).await;
    assert_eq!(disabled.json()["spec"]["enabled"], false);
    let version = db.store.current_version().await.unwrap();
    // Disabling twice changes nothing and makes no version.
    api.post("/api/v1/rules/a/disable").expect(200).await;
    assert_eq!(db.store.current_version().await.unwrap(), version);
    // Proxies get disabled rules too: the filter skips them.
    let doc = api.read("/api/v1/ruleset?after=0").await;
    assert_eq!(doc["rules"][0]["enabled"], false);
    let enabled = api.post("/api/v1/rules/a/enable").expect(200).await;
    assert_eq!(enabled.json()["spec"]["enabled"], true);

    let deleted = api.delete("/api/v1/rules/a").expect(204).await;
    assert!(deleted.body.is_empty());
    let version = db.store.current_version().await.unwrap();
    assert_eq!(
        deleted.header("x-sluice-ruleset-version"),
        Some(version.to_string().as_str())
    );
    api.get("/api/v1/rules/a").expect(404).await;
    api.delete("/api/v1/rules/a").expect(404).await;
    api.put("/api/v1/rules/a")
        .json(&rule("a"))
        .expect(404)
        .await;
}

async fn bad_input_is_refused_with_field_paths_and_writes_nothing(db: TestDb) {
    let api = TestApp::new(&db).await;
    api.create(&rule("taken")).await;
    let before = db.footprint().await;
    let original = api.get("/api/v1/rules/taken").send().await.json();

    let mut big = rule("big");
    big["description"] = json!("x".repeat(2 * 1024 * 1024));
    // (what, method, path, content type, body, status, fields named in the problem)
    type Case<'a> = (
        &'a str,
        Method,
        &'a str,
        &'a str,
        Vec<u8>,
        u16,
        Vec<&'a str>,
    );
    let cases: Vec<Case> = vec![
        ("missing key", Method::POST, "/api/v1/rules", "application/json",
         br#"{"name":"a","limits":[{"requests":1,"period":"second"}]}"#.to_vec(), 422, vec!["key"]),
        ("missing period", Method::POST, "/api/v1/rules", "application/json",
         br#"{"name":"a","key":"global","limits":[{"requests":1}]}"#.to_vec(), 422, vec!["limits[0].period"]),
        ("zero requests", Method::POST, "/api/v1/rules", "application/json",
         br#"{"name":"a","key":"global","limits":[{"requests":0,"period":"second"}]}"#.to_vec(), 422, vec!["limits[0].requests"]),
        ("negative requests", Method::POST, "/api/v1/rules", "application/json",
         br#"{"name":"a","key":"global","limits":[{"requests":-5,"period":"second"}]}"#.to_vec(), 422, vec!["limits[0].requests"]),
        ("zero period and burst", Method::POST, "/api/v1/rules", "application/json",
         br#"{"name":"a","key":"global","limits":[{"requests":1,"period":0,"burst":0}]}"#.to_vec(), 422, vec!["limits[0].period", "limits[0].burst"]),
        ("no limits", Method::POST, "/api/v1/rules", "application/json",
         br#"{"name":"a","key":"global","limits":[]}"#.to_vec(), 422, vec!["limits"]),
        ("unknown key", Method::POST, "/api/v1/rules", "application/json",
         br#"{"name":"a","nmae":"b","key":"global","limits":[{"requests":1,"period":1}]}"#.to_vec(), 422, vec!["nmae"]),
        ("unknown nested key", Method::POST, "/api/v1/rules", "application/json",
         br#"{"name":"a","key":"global","limits":[{"requests":1,"period":1,"brust":2}]}"#.to_vec(), 422, vec!["limits[0].brust"]),
        ("wrong type", Method::POST, "/api/v1/rules", "application/json",
         br#"{"name":"a","priority":"high","key":"global","limits":[{"requests":1,"period":1}]}"#.to_vec(), 422, vec!["priority"]),
        ("unknown period", Method::POST, "/api/v1/rules", "application/json",
         br#"{"name":"a","key":"global","limits":[{"requests":1,"period":"fortnight"}]}"#.to_vec(), 422, vec!["limits[0].period"]),
        ("invalid regex and name", Method::POST, "/api/v1/rules", "application/json",
         br#"{"name":"a b","match":{"path_regex":"(("},"key":"global","limits":[{"requests":1,"period":1}]}"#.to_vec(), 422, vec!["name", "match.path_regex"]),
        // A conflict with a stored rule, resolved by renaming one: 409, like an existing id.
        ("duplicate name", Method::POST, "/api/v1/rules", "application/json",
         br#"{"id":"other","name":"taken","key":"global","limits":[{"requests":1,"period":1}]}"#.to_vec(), 409, vec![]),
        ("existing id", Method::POST, "/api/v1/rules", "application/json",
         serde_json::to_vec(&rule("taken")).unwrap(), 409, vec![]),
        ("bad JSON", Method::POST, "/api/v1/rules", "application/json",
         br#"{"name":"a","#.to_vec(), 400, vec![]),
        ("trailing garbage", Method::POST, "/api/v1/rules", "application/json",
         br#"{"name":"a","key":"global","limits":[{"requests":1,"period":1}]} x"#.to_vec(), 400, vec![]),
        ("empty body", Method::POST, "/api/v1/rules", "application/json", Vec::new(), 400, vec![]),
        ("not an object", Method::POST, "/api/v1/rules", "application/json", b"\"a rule\"".to_vec(), 422, vec!["(body)"]),
        ("not JSON", Method::POST, "/api/v1/rules", "text/plain",
         serde_json::to_vec(&rule("a")).unwrap(), 415, vec![]),
        ("oversized", Method::POST, "/api/v1/rules", "application/json",
         serde_json::to_vec(&big).unwrap(), 413, vec![]),
        ("PUT with another id", Method::PUT, "/api/v1/rules/taken", "application/json",
         br#"{"id":"else","name":"taken","key":"global","limits":[{"requests":1,"period":1}]}"#.to_vec(), 422, vec!["id"]),
        ("PUT invalid", Method::PUT, "/api/v1/rules/taken", "application/json",
         br#"{"name":"taken","key":"global","limits":[{"requests":1,"period":"second","burst":0}]}"#.to_vec(), 422, vec!["limits[0].burst"]),
        ("PATCH making it invalid", Method::PATCH, "/api/v1/rules/taken", "application/merge-patch+json",
         br#"{"limits":[]}"#.to_vec(), 422, vec!["limits"]),
        ("PATCH unknown key", Method::PATCH, "/api/v1/rules/taken", "application/merge-patch+json",
         br#"{"limit":[]}"#.to_vec(), 422, vec!["limit"]),
        ("PATCH wrong type", Method::PATCH, "/api/v1/rules/taken", "application/merge-patch+json",
         br#"{"enabled":"no"}"#.to_vec(), 422, vec!["enabled"]),
        ("apply: bad YAML", Method::POST, "/api/v1/rules:apply", "application/yaml",
         b"- name: [".to_vec(), 400, vec![]),
        ("apply: one bad rule", Method::POST, "/api/v1/rules:apply", "application/yaml",
         b"- {name: ok, key: global, limits: [{requests: 1, period: second}]}\n- {name: bad, key: global, limits: [{requests: 0, period: second}]}\n".to_vec(),
         422, vec!["rules[1].limits[0].requests"]),
        ("apply: unknown key", Method::POST, "/api/v1/rules:apply", "application/json",
         br#"{"rules":[{"name":"a","key":"global","limits":[{"requests":1,"period":1}],"colour":"red"}]}"#.to_vec(),
         422, vec!["rules[0].colour"]),
        ("apply: one id twice", Method::POST, "/api/v1/rules:apply", "application/yaml",
         b"- {name: a, key: global, limits: [{requests: 1, period: second}]}\n- {name: a, key: path, limits: [{requests: 1, period: second}]}\n".to_vec(),
         422, vec!["rules[1].name"]),
        ("apply: duplicate name with a kept rule", Method::POST, "/api/v1/rules:apply", "application/yaml",
         b"- {id: x, name: taken, key: global, limits: [{requests: 1, period: second}]}\n".to_vec(),
         422, vec!["rules[0].name"]),
        ("apply: unknown media type", Method::POST, "/api/v1/rules:apply", "text/csv",
         b"a,b".to_vec(), 415, vec![]),
        ("token: unknown role", Method::POST, "/api/v1/tokens", "application/json",
         br#"{"name":"x","role":"root"}"#.to_vec(), 422, vec!["role"]),
    ];
    for (what, method, path, content_type, body, status, fields) in cases {
        let response = api.req(method, path).raw(content_type, body).send().await;
        assert_eq!(
            response.status.as_u16(),
            status,
            "{what}: {}",
            response.text()
        );
        assert_eq!(
            response.header("content-type"),
            Some("application/problem+json"),
            "{what}"
        );
        let problem = response.json();
        assert_eq!(problem["status"], status, "{what}");
        assert!(
            problem["detail"].as_str().is_some_and(|d| !d.is_empty()),
            "{what}"
        );
        assert_eq!(response.fields(), fields, "{what}: {}", response.text());
        if status == 422 {
            assert_eq!(problem["type"], "urn:sluice:invalid", "{what}");
            for error in problem["errors"].as_array().unwrap() {
                assert!(
                    error["message"].as_str().is_some_and(|m| !m.is_empty()),
                    "{what}"
                );
            }
        }
        assert_eq!(db.footprint().await, before, "{what} wrote something");
    }
    assert_eq!(api.get("/api/v1/rules/taken").send().await.json(), original);
    assert_eq!(db.store.rule_count().await.unwrap(), 1);
}

async fn a_stale_if_match_is_a_conflict_and_changes_nothing(db: TestDb) {
    let api = TestApp::new(&db).await;
    api.create(&rule("a")).await;
    // Someone else changes the rule: revision 1 is now stale.
    api.patch("/api/v1/rules/a")
        .json(&json!({"priority": 1}))
        .expect(200)
        .await;
    let before = db.footprint().await;
    let stale = "\"1\"";
    let attempts = [
        api.put("/api/v1/rules/a").json(&rule("a")),
        api.patch("/api/v1/rules/a").json(&json!({"priority": 9})),
        api.delete("/api/v1/rules/a"),
        api.post("/api/v1/rules/a/disable"),
    ];
    for attempt in attempts {
        let response = attempt.header("if-match", stale).expect(409).await;
        let problem = response.json();
        assert_eq!(problem["type"], "urn:sluice:stale-revision");
        assert!(problem["detail"].as_str().unwrap().contains("revision 2"));
    }
    assert_eq!(db.footprint().await, before);
    let current = api.get("/api/v1/rules/a").expect(200).await;
    assert_eq!(current.json()["spec"]["priority"], 1);
    // An If-Match that is no ETag matches no revision: refused as stale, never a silent
    // pass, and the answer names the current revision.
    let refused = api
        .delete("/api/v1/rules/a")
        .header("if-match", "2")
        .expect(409)
        .await;
    assert_eq!(refused.json()["type"], "urn:sluice:stale-revision");
    // The current ETag, or `*`, passes.
    api.patch("/api/v1/rules/a")
        .header("if-match", current.header("etag").unwrap())
        .json(&json!({"priority": 3}))
        .expect(200)
        .await;
    api.delete("/api/v1/rules/a")
        .header("if-match", "*")
        .expect(204)
        .await;
}

async fn versions_diffs_and_rollback(db: TestDb) {
    let api = TestApp::new(&db).await;
    api.create(&rule("a")).await; // 1
    api.create(&rule("b")).await; // 2
    api.patch("/api/v1/rules/a")
        .json(&json!({"priority": 4}))
        .expect(200)
        .await; // 3
    api.delete("/api/v1/rules/b").expect(204).await; // 4

    let versions = api.read("/api/v1/versions").await;
    let numbers: Vec<u64> = items(&versions["versions"])
        .map(|v| v["version"].as_u64().unwrap())
        .collect();
    assert_eq!(numbers, [4, 3, 2, 1]);
    assert_eq!(versions["versions"][0]["action"], "rule.delete");
    assert_eq!(versions["versions"][0]["actor_name"], "test-admin");
    let page = api.read("/api/v1/versions?limit=2&before=3").await;
    assert_eq!(page["versions"].as_array().unwrap().len(), 2);
    assert_eq!(page["versions"][0]["version"], 2);

    let v2 = api.read("/api/v1/versions/2").await;
    assert_eq!(v2["version"], 2);
    assert_eq!(v2["rules"].as_array().unwrap().len(), 2);
    let v0 = api.read("/api/v1/versions/0").await;
    assert_eq!(v0["rules"], json!([]));
    api.get("/api/v1/versions/99").expect(404).await;
    api.get("/api/v1/versions/x").expect(400).await;

    let diff = api.read("/api/v1/diff?from=2&to=4").await;
    assert_eq!(diff["from"], 2);
    assert_eq!(diff["to"], 4);
    let changes = diff["changes"].as_array().unwrap();
    assert_eq!(changes.len(), 2);
    assert_eq!(
        (changes[0]["id"].as_str(), changes[0]["change"].as_str()),
        (Some("a"), Some("changed"))
    );
    assert_eq!(changes[0]["before"]["priority"], 0);
    assert_eq!(changes[0]["after"]["priority"], 4);
    assert_eq!(
        (changes[1]["id"].as_str(), changes[1]["change"].as_str()),
        (Some("b"), Some("removed"))
    );
    assert_eq!(changes[1]["after"], Value::Null);
    // `to` defaults to the current version.
    let diff = api.read("/api/v1/diff?from=0").await;
    assert_eq!(diff["to"], 4);
    api.get("/api/v1/diff").expect(400).await;

    let rolled = api
        .post("/api/v1/versions/2/rollback")
        .expect(200)
        .await
        .json();
    assert_eq!(rolled["changed"], true);
    assert_eq!(rolled["version"], 5);
    assert_eq!(rolled["added"], json!(["b"]));
    assert_eq!(rolled["updated"], json!(["a"]));
    let v5 = api.get("/api/v1/versions/5").send().await.json();
    assert_eq!(v5["rules"], v2["rules"]);
    assert_eq!(v5["action"], "ruleset.rollback");
    let doc = api.read("/api/v1/ruleset?after=4").await;
    assert_eq!(doc["version"], 5);
    // Rolling back to what is already current changes nothing.
    let again = api
        .post("/api/v1/versions/5/rollback")
        .expect(200)
        .await
        .json();
    assert_eq!(
        (again["changed"].as_bool(), again["version"].as_u64()),
        (Some(false), Some(5))
    );
    api.post("/api/v1/versions/42/rollback").expect(404).await;
    // Rolling back to version 0 empties the ruleset, as a new version.
    let empty = api
        .post("/api/v1/versions/0/rollback")
        .expect(200)
        .await
        .json();
    assert_eq!(empty["version"], 6);
    assert_eq!(db.store.rule_count().await.unwrap(), 0);
}

const RULES_YAML: &str = "
# Two rules, as an operator writes them.
- name: api-per-key
  match: {path_prefix: /api/}
  key: {header: x-api-key}
  limits:
    - {requests: 5, period: second, burst: 10}
    - {requests: 100, period: minute}
- name: login
  key: {client_ip: {trusted_hops: 0}}
  limits: [{requests: 3, period: minute}]
";

async fn apply_is_idempotent_and_prunes_only_when_asked(db: TestDb) {
    let api = TestApp::new(&db).await;
    api.create(&rule("manual")).await; // 1
    let apply = |body: &str, content_type: &str, query: &str| {
        api.post(&format!("/api/v1/rules:apply{query}"))
            .raw(content_type, body.to_string())
            .send()
    };

    let first = apply(RULES_YAML, "application/yaml", "")
        .await
        .expect(200)
        .json();
    assert_eq!(first["changed"], true);
    assert_eq!(first["version"], 2);
    assert_eq!(first["added"], json!(["api-per-key", "login"]));

    // The same file again, and the same rules as JSON: nothing changes, no new version.
    let again = apply(RULES_YAML, "application/yaml", "")
        .await
        .expect(200)
        .json();
    assert_eq!(
        (again["changed"].as_bool(), again["version"].as_u64()),
        (Some(false), Some(2))
    );
    let as_json: Value = serde_norway::from_str(RULES_YAML).unwrap();
    let as_json = json!({ "rules": as_json });
    let again = apply(&as_json.to_string(), "application/json", "")
        .await
        .expect(200)
        .json();
    assert_eq!(again["changed"], false);
    assert_eq!(db.store.current_version().await.unwrap(), 2);
    assert_eq!(db.store.list_versions(100, None).await.unwrap().len(), 2);

    // One rule changed, one left out: without prune the left-out one stays.
    let edited = "
- name: api-per-key
  match: {path_prefix: /api/}
  key: {header: x-api-key}
  limits: [{requests: 6, period: second}]
";
    let dry = apply(edited, "application/yaml", "?prune=true&dry_run=true")
        .await
        .expect(200)
        .json();
    assert_eq!(dry["dry_run"], true);
    assert_eq!(dry["updated"], json!(["api-per-key"]));
    assert_eq!(dry["removed"], json!(["login", "manual"]));
    assert_eq!(
        db.store.current_version().await.unwrap(),
        2,
        "a dry run wrote"
    );

    let kept = apply(edited, "text/yaml", "").await.expect(200).json();
    assert_eq!(kept["updated"], json!(["api-per-key"]));
    assert_eq!(kept["removed"], json!([]));
    assert_eq!(db.store.rule_count().await.unwrap(), 3);

    let pruned = apply(edited, "application/yaml", "?prune=true")
        .await
        .expect(200)
        .json();
    assert_eq!(pruned["removed"], json!(["login", "manual"]));
    assert_eq!(pruned["version"], 4);
    assert_eq!(db.store.rule_count().await.unwrap(), 1);
    let audit = db.store.list_audit(1, None).await.unwrap();
    assert_eq!(audit[0].action, "rules.apply");

    // An empty file with prune empties the ruleset.
    let emptied = apply("", "application/yaml", "?prune=true")
        .await
        .expect(200)
        .json();
    assert_eq!(emptied["removed"], json!(["api-per-key"]));
    api.post("/api/v1/rules:apply?prune=maybe")
        .raw("application/yaml", "[]")
        .expect(400)
        .await;
}

async fn export_round_trips_through_apply(db: TestDb) {
    let api = TestApp::new(&db).await;
    api.post("/api/v1/rules:apply")
        .raw("application/yaml", RULES_YAML)
        .expect(200)
        .await;
    let mut with_id = rule("renamed");
    with_id["id"] = json!("stable-id");
    api.create(&with_id).await;
    let version = db.store.current_version().await.unwrap();

    let yaml = api
        .get("/api/v1/export")
        .header("accept", "application/yaml")
        .expect(200)
        .await;
    assert_eq!(yaml.header("content-type"), Some("application/yaml"));
    assert_eq!(
        yaml.header("x-sluice-ruleset-version"),
        Some(version.to_string().as_str())
    );
    assert!(yaml.text().starts_with("# Sluice rules at ruleset version"));
    let json = api.get("/api/v1/export").expect(200).await;
    assert_eq!(json.header("content-type"), Some("application/json"));
    assert_eq!(json.json()["rules"].as_array().unwrap().len(), 3);

    for (body, content_type) in [
        (yaml.text(), "application/yaml"),
        (json.text(), "application/json"),
    ] {
        let result = api
            .post("/api/v1/rules:apply?prune=true")
            .raw(content_type, body)
            .expect(200)
            .await
            .json();
        assert_eq!(result["changed"], false, "{content_type}: {result}");
    }
    assert_eq!(db.store.current_version().await.unwrap(), version);
}

/// Who may call what: every endpoint with no token, a bad token, a revoked token, and
/// each role.
async fn every_endpoint_checks_the_token_and_the_role(db: TestDb) {
    let api = TestApp::new(&db).await;
    api.create(&rule("a")).await;
    let tokens: Vec<(Role, String)> = {
        let mut v = Vec::new();
        for role in Role::ALL {
            v.push((role, db.token(role).await));
        }
        v
    };
    let revoked = db.revoked_token(Role::Admin).await;

    // (method, path, body, who may)
    let read = &[Role::Admin, Role::Editor, Role::Viewer][..];
    let write = &[Role::Admin, Role::Editor][..];
    let admin = &[Role::Admin][..];
    let poll = &Role::ALL[..];
    let endpoints: Vec<(Method, String, Option<Value>, &[Role])> = vec![
        (Method::GET, "/api/v1/rules".into(), None, read),
        (Method::GET, "/api/v1/rules/a".into(), None, read),
        (
            Method::POST,
            "/api/v1/rules".into(),
            Some(rule("new")),
            write,
        ),
        (
            Method::PUT,
            "/api/v1/rules/a".into(),
            Some(rule("a")),
            write,
        ),
        (
            Method::PATCH,
            "/api/v1/rules/a".into(),
            Some(json!({"priority": 1})),
            write,
        ),
        (Method::POST, "/api/v1/rules/a/disable".into(), None, write),
        (Method::POST, "/api/v1/rules/a/enable".into(), None, write),
        (
            Method::POST,
            "/api/v1/rules:apply".into(),
            Some(json!([])),
            write,
        ),
        (Method::GET, "/api/v1/export".into(), None, read),
        (Method::GET, "/api/v1/versions".into(), None, read),
        (Method::GET, "/api/v1/versions/1".into(), None, read),
        (Method::GET, "/api/v1/diff?from=0".into(), None, read),
        (
            Method::POST,
            "/api/v1/versions/1/rollback".into(),
            None,
            write,
        ),
        (
            Method::GET,
            "/api/v1/ruleset?after=0&wait=0".into(),
            None,
            poll,
        ),
        (Method::GET, "/api/v1/proxies".into(), None, read),
        (Method::GET, "/api/v1/audit".into(), None, read),
        (Method::GET, "/api/v1/tokens".into(), None, admin),
        (
            Method::POST,
            "/api/v1/tokens".into(),
            Some(json!({"name": "n", "role": "viewer"})),
            admin,
        ),
        (
            Method::DELETE,
            "/api/v1/tokens/tok_unknown".into(),
            None,
            admin,
        ),
        (Method::DELETE, "/api/v1/rules/a".into(), None, write),
    ];
    let mut failures: u8 = 0;
    for (method, path, body, allowed) in &endpoints {
        let request = |token: Option<&str>| {
            let mut r = api.req(method.clone(), path);
            r = match token {
                Some(t) => r.token(t),
                None => r.no_token(),
            };
            match body {
                Some(b) => r.json(b),
                None => r,
            }
        };
        for (label, token) in [
            ("no token", None),
            ("unknown token", Some("slc_not-a-real-token")),
            ("revoked token", Some(revoked.as_str())),
        ] {
            // Each wrong secret from an address of its own: one address's failures are
            // limited (see `failed_authentications_are_limited_per_address`).
            failures += 1;
            let peer = SocketAddr::from(([10, 0, 0, failures], 40000));
            let response = request(token).from(peer).send().await;
            assert_eq!(
                response.status.as_u16(),
                401,
                "{method} {path} with {label}"
            );
            assert_eq!(
                response.header("www-authenticate"),
                Some("Bearer realm=\"sluice\""),
                "{method} {path}"
            );
            assert_eq!(response.json()["type"], "urn:sluice:unauthenticated");
        }
        for (role, token) in &tokens {
            let response = request(Some(token)).send().await;
            let status = response.status.as_u16();
            if allowed.contains(role) {
                assert!(
                    status != 401 && status != 403 && status < 500,
                    "{method} {path} as {role}: {status} {}",
                    response.text()
                );
            } else {
                assert_eq!(
                    status,
                    403,
                    "{method} {path} as {role}: {}",
                    response.text()
                );
                assert_eq!(response.json()["type"], "urn:sluice:forbidden");
            }
        }
    }
    // Other schemes and malformed headers are 401 too.
    for header in ["Basic YWRtaW46YWRtaW4=", "Bearer", "Bearer ", &api.admin] {
        let response = api
            .get("/api/v1/rules")
            .header("authorization", header)
            .send()
            .await;
        assert_eq!(response.status.as_u16(), 401, "{header}");
    }
    // The scheme is case-insensitive.
    api.get("/api/v1/rules")
        .header("authorization", &format!("bearer {}", api.admin))
        .expect(200)
        .await;
    // A viewer learns it may not write before anything about its body.
    let viewer = &tokens.iter().find(|(r, _)| *r == Role::Viewer).unwrap().1;
    api.post("/api/v1/rules")
        .token(viewer)
        .raw("application/json", "{not json")
        .expect(403)
        .await;
}

async fn tokens_are_managed_through_the_api_and_never_leak(db: TestDb) {
    let api = TestApp::new(&db).await;
    let created = api
        .post("/api/v1/tokens")
        .json(&json!({"name": "deploy", "role": "editor"}))
        .expect(201)
        .await
        .json();
    let secret = created["token"].as_str().unwrap().to_string();
    assert!(secret.starts_with("slc_"));
    assert_eq!(created["role"], "editor");
    let id = created["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("tok_"));

    // The new token works, and for what its role allows only.
    api.post("/api/v1/rules")
        .token(&secret)
        .json(&rule("a"))
        .expect(201)
        .await;
    api.get("/api/v1/tokens").token(&secret).expect(403).await;

    let list = api.get("/api/v1/tokens").expect(200).await;
    let hash = sluice_admin::store::hash_token(&secret);
    assert!(!list.text().contains(&secret));
    assert!(!list.text().contains(&hash));
    let tokens = list.json()["tokens"].as_array().unwrap().clone();
    assert_eq!(tokens.len(), 2);
    assert!(
        tokens
            .iter()
            .all(|t| t.get("token").is_none() && t.get("hash").is_none())
    );
    let deploy = tokens.iter().find(|t| t["id"] == id.as_str()).unwrap();
    assert_eq!(deploy["name"], "deploy");
    assert!(deploy["last_used_at"].is_string());
    assert_eq!(deploy["revoked_at"], Value::Null);

    let revoked = api
        .delete(&format!("/api/v1/tokens/{id}"))
        .expect(200)
        .await
        .json();
    assert!(revoked["revoked_at"].is_string());
    api.get("/api/v1/rules").token(&secret).expect(401).await;
    api.delete(&format!("/api/v1/tokens/{id}"))
        .expect(200)
        .await;
    api.delete("/api/v1/tokens/tok_nope").expect(404).await;

    // Nothing anywhere shows a secret or a hash: not the audit log, not the versions.
    for path in ["/api/v1/audit", "/api/v1/versions", "/api/v1/tokens"] {
        let text = api.get(path).expect(200).await.text();
        assert!(!text.contains(&secret) && !text.contains(&hash), "{path}");
        assert!(!text.contains(&api.admin), "{path}");
    }
    api.post("/api/v1/tokens")
        .json(&json!({"name": "", "role": "viewer"}))
        .expect(422)
        .await;
}

async fn rules_are_listed_with_filters_and_pages(db: TestDb) {
    let api = TestApp::new(&db).await;
    for (name, extra) in [
        ("alpha", json!({"priority": 2})),
        ("beta", json!({"mode": "shadow"})),
        ("gamma", json!({"enabled": false})),
        ("alphabet", json!({})),
    ] {
        let mut r = rule(name);
        for (k, v) in extra.as_object().unwrap() {
            r[k] = v.clone();
        }
        api.create(&r).await;
    }
    let names = |v: &Value| -> Vec<String> {
        items(&v["rules"])
            .map(|r| r["spec"]["name"].as_str().unwrap().to_string())
            .collect()
    };
    let all = api.read("/api/v1/rules").await;
    assert_eq!(names(&all), ["alpha", "alphabet", "beta", "gamma"]);
    assert_eq!(all["total"], 4);
    assert!(all["rules"][0]["revision"].is_u64());
    let alpha = api.get("/api/v1/rules?name=ALPHA").send().await.json();
    assert_eq!(names(&alpha), ["alpha", "alphabet"]);
    let off = api.get("/api/v1/rules?enabled=false").send().await.json();
    assert_eq!(names(&off), ["gamma"]);
    let shadow = api.get("/api/v1/rules?mode=shadow").send().await.json();
    assert_eq!(names(&shadow), ["beta"]);
    let page = api
        .get("/api/v1/rules?limit=2&offset=1")
        .send()
        .await
        .json();
    assert_eq!(names(&page), ["alphabet", "beta"]);
    assert_eq!(
        (
            page["total"].as_u64(),
            page["limit"].as_u64(),
            page["offset"].as_u64()
        ),
        (Some(4), Some(2), Some(1))
    );
    for bad in [
        "enabled=maybe",
        "mode=loud",
        "limit=0",
        "limit=5000",
        "offset=-1",
        "colour=red",
    ] {
        api.get(&format!("/api/v1/rules?{bad}")).expect(400).await;
    }
}

async fn polls_record_the_proxy(db: TestDb) {
    let api = TestApp::new(&db).await;
    let proxy = db.token(Role::Proxy).await;
    // Current and `wait=0`: 304 at once, no body.
    let response = api
        .get("/api/v1/ruleset?after=0&wait=0")
        .token(&proxy)
        .header("x-sluice-proxy-id", "envoy-a")
        .header("x-sluice-ruleset-version", "0")
        .header(
            "x-sluice-proxy-error",
            "refused version 9: rules[0].name: bad",
        )
        .expect(304)
        .await;
    assert!(response.body.is_empty());
    let proxies = api.read("/api/v1/proxies").await;
    let p = &proxies["proxies"][0];
    assert_eq!(p["id"], "envoy-a");
    assert_eq!(p["connected"], true);
    assert_eq!(p["ruleset_version"], 0);
    assert_eq!(p["last_error"], "refused version 9: rules[0].name: bad");
    // No ConnectInfo through oneshot: the address is unknown here (the server test
    // checks the real one).
    assert_eq!(p["address"], "unknown");

    api.create(&rule("a")).await;
    api.get("/api/v1/ruleset?after=0")
        .token(&proxy)
        .header("x-sluice-proxy-id", "envoy-a")
        .header("x-sluice-ruleset-version", "1")
        .expect(200)
        .await;
    let proxies = api.get("/api/v1/proxies").send().await.json();
    assert_eq!(proxies["proxies"][0]["ruleset_version"], 1);
    assert_eq!(proxies["proxies"][0]["last_error"], Value::Null);
    // A poll without an id is served but not listed.
    api.get("/api/v1/ruleset?after=0")
        .token(&proxy)
        .expect(200)
        .await;
    assert_eq!(
        api.get("/api/v1/proxies").send().await.json()["proxies"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    api.get("/api/v1/ruleset?after=x")
        .token(&proxy)
        .expect(400)
        .await;
}

async fn the_audit_log_names_who_did_what(db: TestDb) {
    let api = TestApp::new(&db).await;
    let editor = db.token(Role::Editor).await;
    api.post("/api/v1/rules")
        .token(&editor)
        .json(&rule("a"))
        .expect(201)
        .await;
    api.patch("/api/v1/rules/a")
        .json(&json!({"priority": 2}))
        .expect(200)
        .await;
    let audit = api.read("/api/v1/audit?limit=2").await;
    let entries = audit["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 2);
    assert_eq!(entries[0]["action"], "rule.patch");
    assert_eq!(entries[0]["actor_name"], "test-admin");
    assert_eq!(entries[0]["before"]["priority"], 0);
    assert_eq!(entries[0]["after"]["priority"], 2);
    assert_eq!(entries[0]["version"], 2);
    assert_eq!(entries[1]["action"], "rule.create");
    assert_eq!(entries[1]["actor_name"], "test-editor");
    assert!(entries[1]["actor_id"].as_str().unwrap().starts_with("tok_"));
    assert_eq!(entries[1]["before"], Value::Null);
    let older = entries[1]["id"].as_u64().unwrap();
    let next = api
        .get(&format!("/api/v1/audit?before={older}"))
        .send()
        .await
        .json();
    // The token creations from the test setup.
    assert!(items(&next["entries"]).all(|e| e["action"] == "token.create"));
}

async fn metrics_count_requests_by_route(db: TestDb) {
    let api = TestApp::new(&db).await;
    api.create(&rule("a")).await;
    api.get("/api/v1/rules/a").expect(200).await;
    api.get("/api/v1/rules/zzz").expect(404).await;
    let metrics = api.get("/metrics").no_token().expect(200).await;
    assert!(
        metrics
            .header("content-type")
            .unwrap()
            .starts_with("application/openmetrics-text")
    );
    let text = metrics.text();
    for line in [
        "sluice_admin_http_requests_total{method=\"POST\",route=\"/api/v1/rules\",status=\"201\"} 1",
        // By route pattern, not by path.
        "sluice_admin_http_requests_total{method=\"GET\",route=\"/api/v1/rules/{id}\",status=\"200\"} 1",
        "sluice_admin_http_requests_total{method=\"GET\",route=\"/api/v1/rules/{id}\",status=\"404\"} 1",
        "sluice_admin_rules 1",
        "sluice_admin_ruleset_version 1",
        "sluice_admin_connected_proxies 0",
        "sluice_admin_long_polls 0",
    ] {
        assert_contains(&text, line);
    }
    assert_contains(&text, "sluice_admin_http_request_duration_seconds_bucket");
    assert!(text.trim_end().ends_with("# EOF"));
}

async fn configured_limits_are_gauges_per_rule_and_limit(db: TestDb) {
    let api = TestApp::new(&db).await;
    api.create(&rule("a")).await;
    api.create(&json!({"name": "two", "key": {"header": "k"}, "enforce_percent": 25,
        "limits": [{"requests": 5, "period": "second", "burst": 10}, {"requests": 100, "period": "minute"}]}))
        .await;
    api.create(&json!({"name": "off", "enabled": false, "key": "global",
        "limits": [{"requests": 1, "period": 1}]}))
        .await;
    let text = api.get("/metrics").no_token().expect(200).await.text();
    for line in [
        "sluice_rule_limit{rule=\"a\",limit=\"a\",unit=\"requests\"} 10",
        "sluice_rule_limit_period_seconds{rule=\"a\",limit=\"a\",unit=\"requests\"} 1",
        "sluice_rule_limit_burst{rule=\"a\",limit=\"a\",unit=\"requests\"} 10",
        "sluice_rule_limit{rule=\"two\",limit=\"two/1\",unit=\"requests\"} 5",
        "sluice_rule_limit_burst{rule=\"two\",limit=\"two/1\",unit=\"requests\"} 10",
        "sluice_rule_limit{rule=\"two\",limit=\"two/2\",unit=\"requests\"} 100",
        "sluice_rule_limit_period_seconds{rule=\"two\",limit=\"two/2\",unit=\"requests\"} 60",
        "sluice_rule_enforce_percent{rule=\"two\"} 25",
        "sluice_rule_enforce_percent{rule=\"a\"} 100",
    ] {
        assert_contains(&text, line);
    }
    assert!(
        !text.contains("rule=\"off\""),
        "a disabled rule enforces nothing: {text}"
    );
    // A deleted rule's series go with it.
    api.delete("/api/v1/rules/two").expect(204).await;
    let text = api.get("/metrics").no_token().expect(200).await.text();
    assert!(!text.contains("rule=\"two\""), "{text}");
    assert_contains(
        &text,
        "sluice_rule_limit{rule=\"a\",limit=\"a\",unit=\"requests\"} 10",
    );
}

async fn openapi_health_and_readiness(db: TestDb) {
    let api = TestApp::new(&db).await;
    let doc = api.openapi().await;
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    let paths = doc["paths"].as_object().unwrap();
    for path in [
        "/api/v1/rules",
        "/api/v1/rules/{id}",
        "/api/v1/rules/{id}/enable",
        "/api/v1/rules/{id}/disable",
        "/api/v1/rules:apply",
        "/api/v1/export",
        "/api/v1/versions",
        "/api/v1/versions/{version}",
        "/api/v1/versions/{version}/rollback",
        "/api/v1/diff",
        "/api/v1/ruleset",
        "/api/v1/proxies",
        "/api/v1/audit",
        "/api/v1/tokens",
        "/api/v1/tokens/{id}",
    ] {
        assert!(
            paths.contains_key(path),
            "{path} missing from the OpenAPI document"
        );
    }
    for method in ["get", "put", "patch", "delete"] {
        assert!(
            paths["/api/v1/rules/{id}"].get(method).is_some(),
            "{method}"
        );
    }
    let schemas = doc["components"]["schemas"].as_object().unwrap();
    assert!(schemas["RuleSpec"]["properties"]["limits"].is_object());
    assert!(schemas.contains_key("Problem"));
    assert_eq!(
        schemas["RulesetDocument"]["properties"]["rules"]["items"]["$ref"],
        "#/components/schemas/RuleSpec"
    );
    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
    assert_eq!(
        doc["paths"]["/api/v1/rules"]["post"]["responses"]["401"]["content"]["application/problem+json"]
            ["schema"]["$ref"],
        "#/components/schemas/Problem"
    );

    api.get("/healthz").no_token().expect(200).await;
    api.get("/readyz").no_token().expect(200).await;
    let missing = api.get("/api/v1/nothing-here").expect(404).await;
    assert_eq!(missing.json()["type"], "urn:sluice:not-found");
    // With the database gone, not ready.
    db.store.close().await;
    let not_ready = api.get("/readyz").no_token().expect(503).await;
    assert_eq!(not_ready.json()["type"], "urn:sluice:unavailable");
}

/// Two servers on one database (replicas behind a load balancer): a poll held by the
/// second wakes for a change committed through the first, within the follow interval.
async fn a_change_through_one_replica_reaches_the_other_replicas_polls(db: TestDb) {
    let first = TestApp::new(&db).await;
    let second = TestApp::new(&db).await;
    let follower = second.state.clone();
    // On PostgreSQL the replicas' notices must wake the poll: the re-read of the version
    // that covers lost notices is slowed to once an hour, so only a notice can answer the
    // poll before its 20 s hold ends.
    let notices = db.store.backend() == sluice_admin::store::Backend::Postgres;
    let reread = if notices {
        std::time::Duration::from_secs(3600)
    } else {
        sluice_admin::http::VERSION_FOLLOW_INTERVAL
    };
    // Listening before the change is made, so its notice cannot be missed.
    let listening = follower.store().version_notices().await.unwrap();
    assert_eq!(listening.is_some(), notices);
    let following = tokio::spawn(async move { follower.follow(listening, reread).await });
    let proxy = db.token(Role::Proxy).await;
    let held = {
        let poll = second.get("/api/v1/ruleset?after=0&wait=20").token(&proxy);
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            (poll.send().await, started.elapsed())
        })
    };
    first
        .post("/api/v1/rules")
        .json(&rule("shared"))
        .expect(201)
        .await;
    let (answer, waited) = held.await.expect("poll task");
    let doc = answer.expect(200).json();
    assert_eq!(doc["version"], 1);
    assert!(
        waited < std::time::Duration::from_secs(15),
        "woken by the follower (notices: {notices}), not the 20 s hold: {waited:?}"
    );
    second.state.shutdown();
    following.await.expect("the follower stops at shutdown");
}

/// Where the OpenAPI document states a bound, the server keeps exactly it (schemathesis in
/// `cargo xtask test` explores this at large; these are the edges it once found apart).
async fn the_document_bounds_are_the_servers(db: TestDb) {
    let api = TestApp::new(&db).await;
    // Page sizes: 1 to 1000, as documented.
    for path in ["/api/v1/audit", "/api/v1/versions", "/api/v1/rules"] {
        api.get(&format!("{path}?limit=1000")).expect(200).await;
        api.get(&format!("{path}?limit=1001")).expect(400).await;
        api.get(&format!("{path}?limit=0")).expect(400).await;
    }
    // Ids and versions: 0 to 2^53 - 1.
    api.get("/api/v1/versions?before=9007199254740991")
        .expect(200)
        .await;
    api.get("/api/v1/versions?before=9007199254740992")
        .expect(400)
        .await;
    api.get("/api/v1/versions/-1").expect(400).await;
    // The long poll holds for at most 60 s, and says so rather than shortening it.
    api.get("/api/v1/ruleset?after=0&wait=61").expect(400).await;
    // Unknown query parameters are refused, not ignored.
    api.get("/api/v1/metrics/overview?windw=5")
        .expect(400)
        .await;
    api.get("/api/v1/metrics/series?step=").expect(400).await;
    // JSON Schema counts 5.0 as an integer, so the server does too.
    let create_raw = |body: &[u8]| api.post("/api/v1/rules").raw("application/json", body);
    create_raw(br#"{"name":"floaty","key":"global","limits":[{"requests":5.0,"period":60.0}]}"#)
        .expect(201)
        .await;
    let fractional = create_raw(
        br#"{"name":"fraction","key":"global","limits":[{"requests":5.5,"period":60}]}"#,
    )
    .expect(422)
    .await;
    assert_eq!(fractional.json()["title"], "Invalid rule");
    // A problem's title names what was invalid.
    let report = api
        .post("/api/v1/reports")
        .json(
            &json!({"proxy_id": "", "start_ms": 1, "end_ms": 2, "ruleset_version": 0, "rules": []}),
        )
        .expect(422)
        .await;
    assert_eq!(report.json()["title"], "Invalid report");
    let token = api
        .post("/api/v1/tokens")
        .json(&json!({"name": " ", "role": "viewer"}))
        .expect(422)
        .await;
    assert_eq!(token.json()["title"], "Invalid token request");
    // No token revokes itself: an admin cannot lock themselves out by accident.
    let me = api.read("/api/v1/session").await;
    let id = me["token_id"].as_str().unwrap();
    api.delete(&format!("/api/v1/tokens/{id}"))
        .expect(409)
        .await;
    api.get("/api/v1/rules").expect(200).await;
}

/// What the rule's schema admits field by field is accepted: lengths are counted in
/// characters (as `maxLength` counts them, not in bytes), every requests, period and
/// burst within their own bounds makes a limit (a burst beyond 146 years of refill is
/// capped, since JSON Schema cannot bound a product), and every header condition form the
/// schema lists is one the core takes.
async fn every_rule_within_the_documents_bounds_is_accepted(db: TestDb) {
    let api = TestApp::new(&db).await;
    let wide = |n: usize| "é".repeat(n);
    let rules = [
        json!({"name": "chars", "description": wide(1024), "key": {"query": wide(256)},
               "match": {"path_regex": wide(1024)},
               "limits": [{"requests": 1, "period": 1}],
               "overrides": [{"client": wide(1024), "limits": [{"requests": 2, "period": 1}]}]}),
        json!({"name": "slow", "key": "global", "limits": [
            {"requests": 1, "period": 31_622_400, "burst": 1_000_000_000_u64},
            {"requests": 1, "period": "day", "burst": 1_000_000_000_u64, "scope": "global"},
            {"requests": 1_000_000_000_u64, "period": 1, "burst": 1_000_000_000_u64}]}),
        json!({"name": "headers", "key": "global", "limits": [{"requests": 1, "period": 1}],
               "match": {"headers": [{"name": "a", "present": false},
                                     {"name": "b", "present": true, "equals": "x"},
                                     {"name": "c", "equals": "y", "present": null}]}}),
    ];
    for rule in &rules {
        let created = api.post("/api/v1/rules").json(rule).send().await;
        assert_eq!(
            created.status.as_u16(),
            201,
            "{}: {}",
            rule["name"],
            created.text()
        );
        // Stored as sent: the cap is the limit's, not the spec's.
        assert_eq!(created.json()["spec"]["limits"], rule["limits"]);
    }
    // The same through rules:apply, and what the proxies get compiles.
    api.post("/api/v1/rules:apply?prune=true")
        .json(&json!({ "rules": rules }))
        .send()
        .await
        .expect(200);
    let doc = api.get("/api/v1/ruleset?after=0").send().await.expect(200);
    let doc: sluice_core::wire::RulesetDocument = serde_json::from_slice(&doc.body).unwrap();
    let compiled = doc.compile().unwrap();
    assert_eq!(compiled.rules().len(), 3);
}

/// `overrides` holds at most 10,000 entries, as the document says: one more is refused
/// with the same 422 problem as any other invalid field, naming it, by every operation
/// that takes a rule.
async fn overrides_beyond_the_documents_bound_are_refused_with_their_path(db: TestDb) {
    let api = TestApp::new(&db).await;
    api.post("/api/v1/rules")
        .json(&rule("taken"))
        .send()
        .await
        .expect(201);
    let before = db.footprint().await;
    let overrides = |n: usize| -> Vec<Value> {
        (0..n)
            .map(|i| json!({"client": format!("c{i}"), "limits": [{"requests": 1, "period": 1}]}))
            .collect()
    };
    let with = |name: &str, n: usize| {
        json!({"name": name, "key": {"header": "x-key"}, "limits": [{"requests": 1, "period": 1}],
               "overrides": overrides(n)})
    };
    let yaml = |rule: &Value| {
        // JSON is YAML: one flow-style rule in a block list.
        format!(
            "- {}
",
            serde_json::to_string(rule).unwrap()
        )
    };
    let too_many = with("many", 10_001);
    let taken = with("taken", 10_001);
    let cases: Vec<(Method, &str, &str, Vec<u8>, &str)> = vec![
        (
            Method::POST,
            "/api/v1/rules",
            "application/json",
            serde_json::to_vec(&too_many).unwrap(),
            "overrides",
        ),
        (
            Method::PUT,
            "/api/v1/rules/taken",
            "application/json",
            serde_json::to_vec(&taken).unwrap(),
            "overrides",
        ),
        (
            Method::PATCH,
            "/api/v1/rules/taken",
            "application/merge-patch+json",
            serde_json::to_vec(&json!({"overrides": overrides(10_001)})).unwrap(),
            "overrides",
        ),
        (
            Method::POST,
            "/api/v1/rules:apply",
            "application/json",
            serde_json::to_vec(&json!([too_many])).unwrap(),
            "rules[0].overrides",
        ),
        (
            Method::POST,
            "/api/v1/rules:apply?dry_run=true",
            "application/yaml",
            yaml(&too_many).into_bytes(),
            "rules[0].overrides",
        ),
    ];
    for (method, path, content_type, body, field) in cases {
        let refused = api
            .req(method.clone(), path)
            .raw(content_type, body)
            .send()
            .await;
        assert_eq!(
            refused.status.as_u16(),
            422,
            "{method} {path}: {}",
            refused.text()
        );
        assert_eq!(
            refused.header("content-type"),
            Some("application/problem+json")
        );
        assert_eq!(refused.json()["type"], "urn:sluice:invalid");
        assert_eq!(refused.fields(), [field], "{method} {path}");
    }
    assert_eq!(db.footprint().await, before);
    // The bound itself is accepted.
    api.post("/api/v1/rules")
        .json(&with("full", 10_000))
        .send()
        .await
        .expect(201);
}

/// Wrong secrets from one address are answered 429 once it has spent its failures; valid
/// secrets from that same address are still accepted (an attacker behind the proxies' NAT
/// or load balancer must not lock them out); other addresses are not affected; forged
/// forwarding headers change nothing; and the refusals are counted.
async fn failed_authentications_are_limited_per_address(db: TestDb) {
    use sluice_admin::http::failed_auth::ALLOWED_FAILURES;
    let api = TestApp::new(&db).await;
    let proxy = db.token(Role::Proxy).await;
    let attacker = SocketAddr::from(([198, 51, 100, 7], 40000));
    let neighbour = SocketAddr::from(([198, 51, 100, 8], 40000));
    // Successes spend nothing.
    for _ in 0..2 * ALLOWED_FAILURES {
        api.get("/api/v1/rules").from(attacker).expect(200).await;
    }
    // Just under the limit, a wrong secret is an ordinary 401 ...
    for _ in 0..ALLOWED_FAILURES {
        api.get("/api/v1/rules")
            .token("slc_guess")
            .from(attacker)
            .expect(401)
            .await;
    }
    // ... over it, 429.
    let throttled = api
        .get("/api/v1/rules")
        .token("slc_guess")
        .from(attacker)
        .expect(429)
        .await;
    let retry_after: u64 = throttled.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=10).contains(&retry_after), "{retry_after}");
    assert_eq!(
        throttled.json()["type"],
        "urn:sluice:too-many-failed-authentications"
    );
    // While the attacker keeps failing, the admin's and a proxy's valid tokens from the
    // same address are served, and so is a sign-in with a valid token.
    for _ in 0..3 {
        api.get("/api/v1/rules")
            .token("slc_guess")
            .from(attacker)
            .expect(429)
            .await;
        api.get("/api/v1/rules").from(attacker).expect(200).await;
        // Current already: 304 at once.
        api.get("/api/v1/ruleset?after=0&wait=0")
            .token(&proxy)
            .header("x-sluice-proxy-id", "envoy-behind-the-nat")
            .from(attacker)
            .expect(304)
            .await;
    }
    api.post("/api/v1/session")
        .no_token()
        .json(&json!({"token": api.admin}))
        .from(attacker)
        .expect(201)
        .await;
    // The dashboard's sign-in shares the limit for wrong tokens.
    api.post("/api/v1/session")
        .no_token()
        .json(&json!({"token": "slc_guess"}))
        .from(attacker)
        .expect(429)
        .await;
    // The address is the TCP peer's: a forged forwarding header neither frees the
    // attacker nor throttles the neighbour it names.
    for (name, value) in [
        ("x-forwarded-for", "203.0.113.9"),
        ("forwarded", "for=203.0.113.9"),
        ("x-real-ip", "203.0.113.9"),
    ] {
        api.get("/api/v1/rules")
            .token("slc_guess")
            .header(name, value)
            .from(attacker)
            .expect(429)
            .await;
    }
    api.get("/api/v1/rules")
        .token("slc_guess")
        .header("x-forwarded-for", "198.51.100.7")
        .from(neighbour)
        .expect(401)
        .await;
    api.get("/api/v1/rules").from(neighbour).expect(200).await;
    let metrics = api.get("/metrics").no_token().expect(200).await.text();
    assert_contains(
        &metrics,
        &format!(
            "sluice_admin_auth_failures_total{{credential=\"bearer\"}} {}",
            ALLOWED_FAILURES + 1
        ),
    );
    assert_contains(&metrics, "sluice_admin_auth_throttled_total 8");
}
