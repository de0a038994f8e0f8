//! Rule dry runs through the admin API, on SQLite and PostgreSQL alike: proxies report the
//! clients sending each rule the most requests (`top_requesters`), the server keeps them
//! per 10 s bucket, and `POST /api/v1/rules:estimate` (and a dry-run apply) replays them
//! through a changed or new rule's limits, before and after the flush alike. Reports whose
//! requesters break a bound are refused, naming the field; one at every bound is taken.

use serde_json::{Value, json};
use sluice_admin::store::{Role, now_ms};
use sluice_admin::testing::{TestApp, TestDb};

sluice_admin::on_every_backend!(
    an_estimate_replays_the_recorded_requests_through_the_new_limits,
    a_rule_without_recorded_traffic_gets_no_number,
    requesters_are_held_to_their_bounds,
);

const BUCKET_MS: i64 = 10_000;

/// A rule keyed by `x-api-key` on every request: `requests` a second, holding `burst`.
fn keyed(name: &str, requests: u64, burst: u64) -> Value {
    json!({"name": name, "key": {"header": "x-api-key"},
           "limits": [{"requests": requests, "period": "second", "burst": burst}]})
}

/// A report ending `end_ms` of rule "api" with `allowed` requests and `requesters`.
fn report(end_ms: i64, allowed: u64, requesters: Value) -> Value {
    json!({"proxy_id": "envoy-1", "start_ms": end_ms - 2000, "end_ms": end_ms,
           "ruleset_version": 1,
           "rules": [{"rule": "api", "allowed": allowed, "top_requesters": requesters}]})
}

async fn estimate(api: &TestApp, rule: &Value) -> Value {
    api.post("/api/v1/rules:estimate")
        .json(rule)
        .expect(200)
        .await
        .json()
}

async fn an_estimate_replays_the_recorded_requests_through_the_new_limits(db: TestDb) {
    let api = TestApp::new(&db).await;
    api.create(&keyed("api", 1_000, 1_000)).await;
    let proxy = db.token(Role::Proxy).await;
    // Half a minute ago, inside one 10 s bucket: 100 requests of one client, 10 of another.
    let end = (now_ms() / BUCKET_MS) * BUCKET_MS - 3 * BUCKET_MS + 5_000;
    let body = report(
        end,
        110,
        json!([{"client": "heavy", "requests": 100}, {"client": "light", "requests": 10}]),
    );
    api.post("/api/v1/reports")
        .token(&proxy)
        .json(&body)
        .expect(204)
        .await;

    // 5 a second with a burst of 10: spread over the bucket, the heavy client's 100 come
    // every 100 ms, and 10 + 5 × 9.95 s ≈ 59 of them fit; the light one is never limited.
    let tight = keyed("api", 5, 10);
    let before_flush = estimate(&api, &tight).await;
    assert_eq!(before_flush["traffic_of"], "api", "{before_flush}");
    assert_eq!(before_flush["requests"], 110);
    assert_eq!(before_flush["replayed_clients"], 2);
    assert_eq!(before_flush["throttled_clients"], 1);
    let throttled = before_flush["throttled_requests"].as_u64().unwrap();
    assert!((40..=42).contains(&throttled), "{before_flush}");
    assert_eq!(before_flush["untracked_requests"], 0);
    api.state.pipeline().flush(&db.store).await.unwrap();
    assert_eq!(
        estimate(&api, &tight).await,
        before_flush,
        "stored, the same"
    );

    // Both sides of the bound: 10 a second is exactly the heavy client's rate.
    let enough = estimate(&api, &keyed("api", 10, 1)).await;
    assert_eq!(
        (
            enough["throttled_requests"].as_u64(),
            enough["throttled_clients"].as_u64()
        ),
        (Some(0), Some(0)),
        "{enough}"
    );
    let short = estimate(&api, &keyed("api", 9, 1)).await;
    assert!(short["throttled_requests"].as_u64().unwrap() > 0, "{short}");

    // A new rule with the same match and key is estimated on that rule's traffic.
    let copy = estimate(&api, &keyed("api-copy", 5, 10)).await;
    assert_eq!(copy["rule"], "api-copy");
    assert_eq!(copy["traffic_of"], "api");
    assert_eq!(
        copy["throttled_requests"],
        before_flush["throttled_requests"]
    );

    // A dry-run apply answers with the same estimate and changes nothing.
    let summary = api
        .post("/api/v1/rules:apply?dry_run=true")
        .json(&json!([tight]))
        .expect(200)
        .await
        .json();
    assert_eq!(summary["updated"], json!(["api"]), "{summary}");
    assert_eq!(summary["estimates"][0], before_flush, "{summary}");
    let stored = api.read("/api/v1/rules/api").await;
    assert_eq!(stored["spec"]["limits"][0]["requests"], 1_000);
    // An applied change carries no estimate.
    let applied = api
        .post("/api/v1/rules:apply")
        .json(&json!([tight]))
        .expect(200)
        .await
        .json();
    assert!(applied.get("estimates").is_none(), "{applied}");
}

async fn a_rule_without_recorded_traffic_gets_no_number(db: TestDb) {
    let api = TestApp::new(&db).await;
    api.create(&keyed("api", 1_000, 1_000)).await;
    // Another key: nothing was recorded under it, whatever was under the rule's.
    let by_ip = json!({"name": "api", "key": {"client_ip": {"trusted_hops": 0}},
                       "limits": [{"requests": 1, "period": "second"}]});
    for rule in [keyed("api", 1, 1), keyed("new", 1, 1), by_ip] {
        let answer = estimate(&api, &rule).await;
        assert_eq!(answer["traffic_of"], Value::Null, "{answer}");
        assert_eq!(answer["throttled_requests"], 0, "{answer}");
    }
    // An invalid rule is refused as a rule is, naming the field.
    let refused = api
        .post("/api/v1/rules:estimate")
        .json(&keyed("api", 0, 1))
        .expect(422)
        .await;
    assert_eq!(refused.fields(), ["limits[0].requests"]);
}

async fn requesters_are_held_to_their_bounds(db: TestDb) {
    let api = TestApp::new(&db).await;
    api.create(&keyed("api", 1_000, 1_000)).await;
    let proxy = db.token(Role::Proxy).await;
    let end = now_ms() - 5_000;
    let many: Vec<Value> = (0..101)
        .map(|i| json!({"client": format!("c{i}"), "requests": 1}))
        .collect();
    for (requesters, field) in [
        (json!(many), "rules[0].top_requesters"),
        (
            json!([{"client": "c", "requests": 1_000_000_000_001_u64}]),
            "rules[0].top_requesters[0].requests",
        ),
        (
            json!([{"client": "x".repeat(257), "requests": 1}]),
            "rules[0].top_requesters[0].client",
        ),
        (
            json!([{"client": "c", "requests": 1, "who": 2}]),
            "rules[0].top_requesters[0].who",
        ),
    ] {
        let refused = api
            .post("/api/v1/reports")
            .token(&proxy)
            .json(&report(end, 1, requesters))
            .expect(422)
            .await;
        assert_eq!(refused.fields(), [field]);
    }
    // More requests than a 2 s report can hold (1,000,000 a second): refused too.
    let refused = api
        .post("/api/v1/reports")
        .token(&proxy)
        .json(&report(
            end,
            1,
            json!([{"client": "c", "requests": 2_000_001}]),
        ))
        .expect(422)
        .await;
    assert_eq!(refused.fields(), ["rules[0].top_requesters"]);
    // Nothing refused was stored, so the same report window is still free.
    // At every bound at once: 100 requesters, names of 256 characters, and a client with
    // the 2,000,000 requests a 2 s report can hold (1,000,000 a second).
    let at_bounds: Vec<Value> = (0..100)
        .map(|i| {
            let requests = if i == 0 { 2_000_000 } else { 1 };
            json!({"client": format!("{i:0>256}"), "requests": requests})
        })
        .collect();
    api.post("/api/v1/reports")
        .token(&proxy)
        .json(&report(end, 2_000_000, json!(at_bounds)))
        .expect(204)
        .await;
}
