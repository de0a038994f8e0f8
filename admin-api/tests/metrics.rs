//! The throttle-metrics pipeline: proxies' reports in (`POST /api/v1/reports`), time series
//! out (`/api/v1/metrics/*`), on SQLite and PostgreSQL alike: validation, live reads
//! before and after flushes, rollups, top clients, zero-filling, retention, the live
//! stream through a real server, and the flush on a clean stop.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sluice_admin::http::report_guard::ReportRate;
use sluice_admin::http::{self, AppState};
use sluice_admin::pipeline::MetricsConfig;
use sluice_admin::server;
use sluice_admin::store::{
    ClientBucket, Counts, MetricsBatch, ProxyBucket, Resolution, Role, RuleBucket, Span, now_ms,
};
use sluice_admin::testing::{PATIENCE, Req, TestApp, TestDb, assert_contains, items, rule};

sluice_admin::on_every_backend!(
    a_report_is_visible_in_every_query_before_and_after_the_flush,
    bad_reports_are_refused_and_change_nothing,
    reports_are_taken_whatever_their_start_and_client_errors,
    every_range_the_document_admits_is_answered,
    every_metrics_endpoint_checks_the_token_and_the_role,
    rollups_agree_at_every_resolution,
    top_clients_merge_across_proxies_buckets_and_flushes,
    series_are_zero_filled_and_steps_follow_the_range,
    retention_deletes_old_buckets_per_resolution,
    each_metrics_table_is_capped_and_loses_its_oldest_buckets_counted,
    reads_never_count_a_flush_twice,
    the_stream_delivers_an_event_after_a_report_and_ends_on_shutdown,
    a_clean_stop_writes_every_accepted_report,
    metrics_and_openapi_describe_the_pipeline,
    reports_through_several_replicas_are_counted_once,
);

const MINUTE: i64 = 60_000;
const HOUR: i64 = 3_600_000;

/// A time well inside the retention of every resolution, aligned to an hour so a test's
/// reports stay in one hour and one minute bucket unless it says otherwise.
fn base_time() -> i64 {
    Resolution::Hour.bucket(now_ms()) - 2 * HOUR
}

/// Issues the rules these tests report on ("api", "busy", "spare": versions 1 to 3): the
/// server takes reports only of rules and versions it issued.
async fn issue(api: &TestApp) {
    for name in ["api", "busy", "spare"] {
        api.create(&rule(name)).await;
    }
}

/// [`issue`], for a test that runs its own server over `db`.
async fn issue_in(db: &TestDb) {
    issue(&TestApp::new(db).await).await;
}

fn report(proxy: &str, end_ms: i64, rules: Value) -> Value {
    json!({"proxy_id": proxy, "start_ms": end_ms - 2000, "end_ms": end_ms,
           "ruleset_version": 3, "rules": rules})
}

/// One rule's counts as a proxy reports them.
fn counts(rule: &str, allowed: u64, denied: u64, shadow_denied: u64) -> Value {
    json!({"rule": rule, "allowed": allowed, "denied": denied, "shadow_denied": shadow_denied,
           "near_limit": 1, "fail_open": 1, "key_missing": 1})
}

/// A report sent with `token`.
fn report_request(api: &TestApp, token: &str) -> Req {
    api.post("/api/v1/reports").token(token)
}

async fn post_report(api: &TestApp, token: &str, body: &Value) {
    report_request(api, token).json(body).expect(204).await;
}

async fn flush(api: &TestApp, db: &TestDb) {
    api.state.pipeline().flush(&db.store).await.unwrap();
}

/// Sums of a series' points.
/// `api` with no practical limit on how fast a proxy id may report: these tests send
/// minutes of one proxy's reports at once, and the arrival limit is not what they test.
fn unlimited(api: TestApp) -> TestApp {
    api.state.set_report_rate(ReportRate {
        per_minute: 60_000_000,
        burst: 1_000_000,
    });
    api
}

fn totals(series: &Value) -> (u64, u64, u64) {
    let points = series["points"].as_array().unwrap();
    let sum = |k: &str| points.iter().map(|p| p[k].as_u64().unwrap()).sum::<u64>();
    (sum("allowed"), sum("denied"), sum("shadow_denied"))
}

/// The shaping counts the report in the next test carries: warned, delayed,
/// delay_wait_ms, in_flight_refused.
const SHAPING: [Option<u64>; 4] = [Some(7), Some(6), Some(3_000_000), Some(3)];

/// A series point's, rule's or overview's shaping counts, in the order of [`SHAPING`].
fn shaping(counts: &Value) -> [Option<u64>; 4] {
    ["warned", "delayed", "delay_wait_ms", "in_flight_refused"].map(|k| counts[k].as_u64())
}

async fn a_report_is_visible_in_every_query_before_and_after_the_flush(db: TestDb) {
    let api = TestApp::new(&db).await;
    api.create(&rule("api")).await;
    api.create(&rule("quiet")).await;
    // Deleted in the newest version: its proxies may still report it.
    api.create(&rule("deleted-since")).await;
    api.delete("/api/v1/rules/deleted-since").expect(204).await;
    let proxy = db.token(Role::Proxy).await;
    let now = now_ms();
    let end = now - 5_000;
    let mut body = report(
        "envoy-1",
        end,
        json!([{"rule": "api", "allowed": 90, "denied": 8, "shadow_denied": 2, "near_limit": 5,
                "fail_open": 0, "key_missing": 3,
                // Tokens: more than the request ceiling of a 2 s report (2,000,000) allows
                // for requests, which token counts are not held to.
                "tokens_used": 5_000_000, "tokens_throttled": 900,
                // Shaping: warned and delayed are also in allowed, in-flight refusals in
                // denied; the summed wait, like tokens, is not held to the request ceiling.
                "warned": 7, "delayed": 6, "delay_wait_ms": 3_000_000, "in_flight_refused": 3,
                "top_clients": [{"client": "acme", "throttled": 6, "error": 0, "tokens": 700},
                                {"client": "a b/c", "throttled": 4, "error": 1}],
                "top_requesters": [{"client": "acme", "requests": 60, "error": 0}]},
               {"rule": "deleted-since", "denied": 1, "top_clients": [{"client": "acme", "throttled": 1}]}]),
    );
    body["overflow"] = json!(0);
    body["dropped_reports"] = json!(0);
    post_report(&api, &proxy, &body).await;

    let check = |label: &'static str| {
        let api = api.clone();
        async move {
            let range = format!("from={}&to={}", now - 15 * MINUTE, now + 1);
            let series = api.read(&format!("/api/v1/metrics/series?{range}")).await;
            assert_eq!(series["step_seconds"], 10, "{label}");
            assert_eq!(totals(&series), (90, 9, 2), "{label}");
            let point = items(&series["points"])
                .find(|p| p["denied"].as_u64() > Some(0))
                .unwrap()
                .clone();
            assert_eq!(point["t"], Resolution::TenSeconds.bucket(end), "{label}");
            assert_eq!(point["near_limit"], 5);
            assert_eq!(
                (
                    point["tokens_used"].as_u64(),
                    point["tokens_throttled"].as_u64()
                ),
                (Some(5_000_000), Some(900)),
                "{label}"
            );
            assert_eq!(shaping(&point), SHAPING, "{label}");
            let one = api
                .read(&format!("/api/v1/metrics/series?{range}&rule=api"))
                .await;
            assert_eq!(totals(&one), (90, 8, 2), "{label}");
            let mine = api
                .read(&format!(
                    "/api/v1/metrics/series?{range}&proxy=envoy-1&rule=api"
                ))
                .await;
            assert_eq!(totals(&mine), (90, 8, 2), "{label}");
            let other = api
                .read(&format!("/api/v1/metrics/series?{range}&proxy=envoy-2"))
                .await;
            assert_eq!(totals(&other), (0, 0, 0), "{label}");

            let rules = api.read(&format!("/api/v1/metrics/rules?{range}")).await;
            let rules = rules["rules"].as_array().unwrap().clone();
            let ids: Vec<&str> = rules.iter().map(|r| r["rule"].as_str().unwrap()).collect();
            assert_eq!(ids, ["api", "deleted-since", "quiet"], "{label}");
            let r = &rules[0];
            assert_eq!(r["name"], "api");
            assert_eq!(
                (r["allowed"].as_u64(), r["denied"].as_u64()),
                (Some(90), Some(8))
            );
            assert!((r["throttle_ratio"].as_f64().unwrap() - 0.1).abs() < 1e-9);
            assert_eq!(
                (r["tokens_used"].as_u64(), r["tokens_throttled"].as_u64()),
                (Some(5_000_000), Some(900)),
                "{label}"
            );
            assert_eq!(shaping(r), SHAPING, "{label}");
            let spark = r["sparkline"].as_array().unwrap();
            assert_eq!(spark.len(), 30);
            assert_eq!(spark.iter().map(|v| v.as_u64().unwrap()).sum::<u64>(), 10);
            assert_eq!(rules[1]["name"], Value::Null, "a deleted rule has no name");
            assert_eq!(
                rules[2]["denied"], 0,
                "a defined rule without traffic is listed"
            );

            let clients = api.read(&format!("/api/v1/metrics/clients?{range}")).await;
            let clients = clients["clients"].as_array().unwrap().clone();
            assert_eq!(clients.len(), 3, "{label}");
            assert_eq!(
                (
                    &clients[0]["client"],
                    &clients[0]["rule"],
                    &clients[0]["throttled"]
                ),
                (&json!("acme"), &json!("api"), &json!(6))
            );
            assert_eq!(clients[0]["tokens"], 700, "{label}");
            assert_eq!(clients[1]["client"], "a b/c");
            assert_eq!(clients[1]["error"], 1);
            assert_eq!(clients[1]["tokens"], 0, "{label}");
            let limited = api
                .read(&format!("/api/v1/metrics/clients?{range}&rule=api&limit=1"))
                .await;
            assert_eq!(limited["clients"].as_array().unwrap().len(), 1);

            let history = api
                .read(&format!("/api/v1/metrics/clients/a%20b%2Fc?{range}"))
                .await;
            assert_eq!(history["client"], "a b/c");
            assert_eq!(history["rules"][0]["rule"], "api");
            assert_eq!(history["rules"][0]["throttled"], 4);
            assert_eq!(history["rules"][0]["points"].as_array().unwrap().len(), 91);
            let acme = api
                .read(&format!("/api/v1/metrics/clients/acme?{range}"))
                .await;
            assert_eq!(acme["rules"].as_array().unwrap().len(), 2);

            let overview = api.read("/api/v1/metrics/overview?window=300").await;
            assert_eq!(overview["window_seconds"], 300);
            assert_eq!(
                (overview["allowed"].as_u64(), overview["denied"].as_u64()),
                (Some(90), Some(9))
            );
            assert_eq!(overview["tokens_used"], 5_000_000, "{label}");
            assert_eq!(shaping(&overview), SHAPING, "{label}");
            assert_eq!(overview["ruleset_version"], 4);
            assert_eq!(
                overview["proxies"]["connected"], 1,
                "{label}: a report is a sign of life"
            );
            assert_eq!(overview["proxies"]["versions"]["3"], 1);
            assert!(overview["requests_per_second"].as_f64().unwrap() > 0.0);
            assert_eq!(overview["errors"], 0);
        }
    };
    check("in memory").await;
    flush(&api, &db).await;
    assert!(
        db.store
            .metric_row_counts()
            .await
            .unwrap()
            .iter()
            .all(|n| *n > 0)
    );
    check("stored").await;
    // Flushed: the proxy is listed, seen now.
    let proxies = api.read("/api/v1/proxies").await;
    assert_eq!(proxies["proxies"][0]["id"], "envoy-1");
    assert_eq!(proxies["proxies"][0]["connected"], true);
    assert_eq!(proxies["proxies"][0]["ruleset_version"], 3);
}

async fn bad_reports_are_refused_and_change_nothing(db: TestDb) {
    let api = TestApp::new(&db).await;
    issue(&api).await;
    let proxy = db.token(Role::Proxy).await;
    let now = now_ms();
    let good = report("envoy-1", now, json!([counts("api", 1, 1, 0)]));
    let with = |patch: Value| {
        let mut v = good.clone();
        for (k, val) in patch.as_object().unwrap() {
            v[k] = val.clone();
        }
        v
    };
    // (body, status, field named)
    let cases: Vec<(Value, u16, &str)> = vec![
        (with(json!({"surprise": 1})), 422, "surprise"),
        (with(json!({"proxy_id": ""})), 422, "proxy_id"),
        (with(json!({"proxy_id": "has space"})), 422, "proxy_id"),
        (with(json!({"end_ms": "soon"})), 422, "end_ms"),
        // Any start is taken (see the next test), but not one beyond the document's bound.
        (
            with(json!({"start_ms": 9_007_199_254_740_992_u64})),
            422,
            "start_ms",
        ),
        (
            with(json!({"start_ms": now + 6 * MINUTE, "end_ms": now + 6 * MINUTE})),
            422,
            "end_ms",
        ),
        (
            with(json!({"rules": [{"rule": "api", "denied": -1}]})),
            422,
            "rules[0].denied",
        ),
        (
            with(json!({"rules": [{"rule": "api", "blocked": 1}]})),
            422,
            "rules[0].blocked",
        ),
        (
            with(json!({"rules": [counts("api", 1, 0, 0), {"rule": ""}]})),
            422,
            "rules[1].rule",
        ),
        (
            with(
                json!({"rules": [{"rule": "api", "top_clients": [{"client": "x".repeat(257), "throttled": 1}]}]}),
            ),
            422,
            "rules[0].top_clients[0].client",
        ),
        // Token counts and the summed delay wait have the absolute bound every count has.
        (
            with(json!({"rules": [{"rule": "api", "delay_wait_ms": 1_000_000_000_001_u64}]})),
            422,
            "rules[0].delay_wait_ms",
        ),
        (
            with(json!({"rules": [{"rule": "api", "tokens_used": 1_000_000_000_001_u64}]})),
            422,
            "rules[0].tokens_used",
        ),
        (
            with(
                json!({"rules": [{"rule": "api", "top_clients": [{"client": "c", "throttled": 1, "tokens": 1_000_000_000_001_u64}]}]}),
            ),
            422,
            "rules[0].top_clients[0].tokens",
        ),
        (
            with(
                json!({"rules": [{"rule": "api", "top_clients": (0..101).map(|i| json!({"client": format!("c{i}"), "throttled": 1})).collect::<Vec<_>>()}]}),
            ),
            422,
            "rules[0].top_clients",
        ),
        (
            with(
                json!({"rules": (0..1001).map(|i| json!({"rule": format!("r{i}")})).collect::<Vec<_>>()}),
            ),
            422,
            "rules",
        ),
    ];
    for (body, status, field) in &cases {
        let response = report_request(&api, &proxy)
            .json(body)
            .send()
            .await
            .expect(*status);
        assert_eq!(
            response.header("content-type"),
            Some("application/problem+json")
        );
        assert!(
            response.fields().iter().any(|f| f == field),
            "{field}: {}",
            response.text()
        );
    }
    // Not JSON, the wrong media type, too large.
    report_request(&api, &proxy)
        .raw("application/json", "{\"proxy_id\":")
        .expect(400)
        .await;
    report_request(&api, &proxy)
        .raw("text/plain", serde_json::to_vec(&good).unwrap())
        .expect(415)
        .await;
    let huge = with(
        json!({"rules": [{"rule": "api", "top_clients": [{"client": "x".repeat(1_100_000), "throttled": 1}]}]}),
    );
    report_request(&api, &proxy).json(&huge).expect(413).await;
    // Who may send: a proxy or an admin; nobody else, and no revoked token.
    for role in [Role::Viewer, Role::Editor] {
        let token = db.token(role).await;
        let response = report_request(&api, &token).json(&good).expect(403).await;
        assert_eq!(response.json()["type"], "urn:sluice:forbidden");
    }
    api.post("/api/v1/reports")
        .no_token()
        .json(&good)
        .expect(401)
        .await;
    let revoked = db.revoked_token(Role::Proxy).await;
    report_request(&api, &revoked).json(&good).expect(401).await;
    // A forbidden or unauthenticated caller learns nothing about its body.
    api.post("/api/v1/reports")
        .no_token()
        .raw("text/plain", "nonsense")
        .expect(401)
        .await;

    // Nothing of any of it was kept.
    let series_path = format!("/api/v1/metrics/series?from={}&to={}", now - HOUR, now + 1);
    assert_eq!(totals(&api.read(&series_path).await), (0, 0, 0));
    flush(&api, &db).await;
    assert_eq!(db.store.metric_row_counts().await.unwrap(), [0, 0, 0, 0]);
    assert!(db.store.list_proxies().await.unwrap().is_empty());
    let metrics = api.metrics().await;
    assert_contains(&metrics, "sluice_admin_reports_ingested_total 0");
    assert_contains(
        &metrics,
        r#"sluice_admin_reports_rejected_total{reason="invalid"} 16"#,
    );
    assert_contains(
        &metrics,
        r#"sluice_admin_reports_rejected_total{reason="forbidden"} 2"#,
    );
    assert_contains(
        &metrics,
        r#"sluice_admin_reports_rejected_total{reason="unauthenticated"} 3"#,
    );

    // An admin may send, and the good report is taken.
    post_report(&api, &api.admin, &good).await;
    assert_eq!(totals(&api.read(&series_path).await), (1, 1, 0));
}

/// What the document cannot state is not refused: JSON Schema cannot compare `start_ms`
/// with `end_ms`, nor a client's `error` with its `throttled`. A report whose start is
/// after its end (a proxy clock that stepped back) or long before it is counted at its
/// end, and an error above `throttled` is kept as `throttled`.
async fn reports_are_taken_whatever_their_start_and_client_errors(db: TestDb) {
    let api = TestApp::new(&db).await;
    issue(&api).await;
    let proxy = db.token(Role::Proxy).await;
    let end = base_time() + 30 * MINUTE;
    // One proxy each: a proxy's reports move forward in time (see abuse_by_proxy_token).
    for (i, start) in [end + 1, end + 5 * MINUTE, 0].into_iter().enumerate() {
        let mut body = report(&format!("envoy-{i}"), end, json!([counts("api", 1, 0, 0)]));
        body["start_ms"] = json!(start);
        post_report(&api, &proxy, &body).await;
    }
    let clients = json!([{"client": "acme", "throttled": 2, "error": 7}]);
    let mut body = report("envoy-3", end, json!([counts("api", 0, 2, 0)]));
    body["rules"][0]["top_clients"] = clients;
    post_report(&api, &proxy, &body).await;
    let range = format!("from={}&to={}", end - MINUTE, end + MINUTE);
    let series = api.read(&format!("/api/v1/metrics/series?{range}")).await;
    assert_eq!(totals(&series), (3, 2, 0));
    let top = api.read(&format!("/api/v1/metrics/clients?{range}")).await;
    assert_eq!(top["clients"][0]["throttled"], 2);
    assert_eq!(top["clients"][0]["error"], 2);
    flush(&api, &db).await;
    let top = api.read(&format!("/api/v1/metrics/clients?{range}")).await;
    assert_eq!(top["clients"][0]["error"], 2);
}

/// Every `from`, `to` and `step` the document admits is answered 200: a `from` at or
/// after `to` is an empty range, and a range of more than 20,000 buckets is cut to its
/// newest 20,000, the answer's `from` saying so.
async fn every_range_the_document_admits_is_answered(db: TestDb) {
    let api = TestApp::new(&db).await;
    issue(&api).await;
    let proxy = db.token(Role::Proxy).await;
    let end = base_time() + 30 * MINUTE;
    post_report(
        &api,
        &proxy,
        &report("envoy-1", end, json!([counts("api", 4, 1, 0)])),
    )
    .await;
    let max = 9_007_199_254_740_991_i64;
    let paths = [
        "/api/v1/metrics/series",
        "/api/v1/metrics/rules",
        "/api/v1/metrics/clients",
        "/api/v1/metrics/clients/acme",
    ];
    for path in paths {
        for (from, to) in [(end, end), (end + MINUTE, end), (max, 0)] {
            let empty = api.read(&format!("{path}?from={from}&to={to}")).await;
            assert_eq!(
                (&empty["from"], &empty["to"]),
                (&json!(to), &json!(to)),
                "{path}"
            );
        }
        for step in ["10s", "1m", "1h"] {
            let cut = api
                .read(&format!("{path}?from=0&to={max}&step={step}"))
                .await;
            assert_eq!(cut["to"], max, "{path}");
            assert!(cut["from"].as_i64().unwrap() > 0, "{path} {step}");
        }
        // `to` within 15 minutes of the epoch: the default `from` is 0.
        let early = api.read(&format!("{path}?to=60000")).await;
        assert_eq!(early["from"], 0, "{path}");
    }
    let empty = api
        .read(&format!("/api/v1/metrics/series?from={end}&to={end}"))
        .await;
    assert_eq!(empty["points"], json!([]));
    // Cut to its newest 20,000 10 s buckets: the report's bucket is still in it.
    let long = format!("from=0&to={}&step=10s", end + MINUTE);
    let cut = api.read(&format!("/api/v1/metrics/series?{long}")).await;
    assert_eq!(cut["points"].as_array().unwrap().len(), 20_000);
    assert_eq!(totals(&cut), (4, 1, 0));
    let rules = api.read(&format!("/api/v1/metrics/rules?{long}")).await;
    assert_eq!(rules["rules"][0]["allowed"], 4);
    // An empty range counts nothing: the defined rules are listed with zeros.
    let rules = api
        .read(&format!("/api/v1/metrics/rules?from={end}&to=0"))
        .await;
    assert!(
        items(&rules["rules"]).all(|r| r["allowed"] == 0 && r["denied"] == 0),
        "{rules}"
    );
}

async fn every_metrics_endpoint_checks_the_token_and_the_role(db: TestDb) {
    let api = TestApp::new(&db).await;
    issue(&api).await;
    let proxy = db.token(Role::Proxy).await;
    let revoked = db.revoked_token(Role::Viewer).await;
    for path in [
        "/api/v1/metrics/series",
        "/api/v1/metrics/rules",
        "/api/v1/metrics/clients",
        "/api/v1/metrics/clients/acme",
        "/api/v1/metrics/overview",
    ] {
        api.get(path).no_token().expect(401).await;
        api.get(path).token(&revoked).expect(401).await;
        api.get(path).token(&proxy).expect(403).await;
        for role in [Role::Viewer, Role::Editor, Role::Admin] {
            let token = db.token(role).await;
            api.get(path).token(&token).expect(200).await;
        }
    }
    api.get("/api/v1/metrics/stream")
        .token(&proxy)
        .expect(403)
        .await;
    api.get("/api/v1/metrics/stream")
        .no_token()
        .expect(401)
        .await;
    // Malformed parameters are 400 problems (a reversed or long range is not malformed:
    // see `every_range_the_document_admits_is_answered`).
    for bad in [
        "/api/v1/metrics/series?from=x",
        "/api/v1/metrics/series?from=-1",
        "/api/v1/metrics/series?to=9007199254740992",
        "/api/v1/metrics/series?step=5m",
        "/api/v1/metrics/clients?limit=0",
        "/api/v1/metrics/clients?limit=1001",
        "/api/v1/metrics/overview?window=0",
    ] {
        let response = api.get(bad).expect(400).await;
        assert_eq!(
            response.header("content-type"),
            Some("application/problem+json"),
            "{bad}"
        );
    }
}

async fn rollups_agree_at_every_resolution(db: TestDb) {
    let api = unlimited(TestApp::new(&db).await);
    issue(&api).await;
    let proxy = db.token(Role::Proxy).await;
    let t0 = base_time();
    // Two proxies, reports spread over three minutes: every 10 s bucket gets some.
    let mut expected = (0, 0, 0);
    for i in 0..18 {
        let end = t0 + i * 10_000 + 5_000;
        for (p, n) in [("envoy-1", 1), ("envoy-2", 2)] {
            post_report(
                &api,
                &proxy,
                &report(p, end, json!([counts("api", 10 * n, n, i as u64 % 2)])),
            )
            .await;
            expected.0 += 10 * n;
            expected.1 += n;
            expected.2 += i as u64 % 2;
        }
        if i == 9 {
            // Half written, half in memory: the sums must not care.
            flush(&api, &db).await;
        }
    }
    let range = format!("from={t0}&to={}", t0 + HOUR);
    for (step, points) in [("10s", 360), ("1m", 60), ("1h", 1)] {
        let series = api
            .read(&format!("/api/v1/metrics/series?{range}&step={step}"))
            .await;
        assert_eq!(series["points"].as_array().unwrap().len(), points, "{step}");
        assert_eq!(totals(&series), expected, "{step}");
    }
    flush(&api, &db).await;
    for (step, first) in [
        ("10s", (10 + 20, 3, 0)),
        ("1m", (6 * 30, 18, 6)),
        ("1h", expected),
    ] {
        let series = api
            .read(&format!("/api/v1/metrics/series?{range}&step={step}"))
            .await;
        assert_eq!(totals(&series), expected, "{step}");
        let p = &series["points"][0];
        assert_eq!(
            (
                p["allowed"].as_u64().unwrap(),
                p["denied"].as_u64().unwrap(),
                p["shadow_denied"].as_u64().unwrap()
            ),
            first,
            "{step}"
        );
        // One proxy's rows roll up the same way.
        let one = api
            .read(&format!(
                "/api/v1/metrics/series?{range}&step={step}&proxy=envoy-2"
            ))
            .await;
        assert_eq!(totals(&one).1, 18 * 2, "{step}");
    }
    // Stored: one row per bucket and rule (and per proxy), not one per report.
    let [rule_rows, proxy_rows, _, _] = db.store.metric_row_counts().await.unwrap();
    assert_eq!(rule_rows, 18 + 3 + 1);
    assert_eq!(proxy_rows, 2 * (18 + 3 + 1));
}

async fn top_clients_merge_across_proxies_buckets_and_flushes(db: TestDb) {
    let api = TestApp::new(&db).await;
    issue(&api).await;
    let proxy = db.token(Role::Proxy).await;
    let t0 = base_time();
    let clients = |range: std::ops::Range<u64>, weight: u64| -> Value {
        range
            .map(|i| json!({"client": format!("c{i:03}"), "throttled": weight * (i + 1), "error": 0}))
            .collect()
    };
    // Rule `api` denying 100, c000..c019 throttled `weight` times their number.
    let denials = |proxy_id, end_ms, weight| {
        let rules = json!([{"rule": "api", "denied": 100, "top_clients": clients(0..20, weight)}]);
        report(proxy_id, end_ms, rules)
    };
    // envoy-1 and envoy-2 both see c000..c019 in one bucket; envoy-2 sees them again in
    // the next bucket.
    post_report(&api, &proxy, &denials("envoy-1", t0 + 5_000, 1)).await;
    post_report(&api, &proxy, &denials("envoy-2", t0 + 6_000, 2)).await;
    flush(&api, &db).await;
    post_report(&api, &proxy, &denials("envoy-2", t0 + 15_000, 1)).await;
    let range = format!("from={t0}&to={}", t0 + 10 * MINUTE);
    let top = api
        .read(&format!("/api/v1/metrics/clients?{range}&limit=3"))
        .await;
    // c019: 20 + 40 + 20.
    let got: Vec<(String, u64)> = items(&top["clients"])
        .map(|c| {
            (
                c["client"].as_str().unwrap().to_string(),
                c["throttled"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("c019".to_string(), 80),
            ("c018".to_string(), 76),
            ("c017".to_string(), 72)
        ]
    );
    // A client outside the stored top that memory pushes to the top is counted with
    // what is stored for it too: c005 has 6 + 12 stored, 6 + 100 in memory.
    post_report(
        &api,
        &proxy,
        &report(
            "envoy-1",
            t0 + 16_000,
            json!([{"rule": "api", "denied": 100, "top_clients": [{"client": "c005", "throttled": 100}]}]),
        ),
    )
    .await;
    let top = api
        .read(&format!("/api/v1/metrics/clients?{range}&limit=3"))
        .await;
    assert_eq!(top["clients"][0]["client"], "c005");
    assert_eq!(top["clients"][0]["throttled"], 124);
    assert_eq!(top["clients"][1]["throttled"], 80);
    for step in ["10s", "1m", "1h"] {
        let top = api
            .read(&format!(
                "/api/v1/metrics/clients?from={t0}&to={}&step={step}&limit=1",
                t0 + HOUR
            ))
            .await;
        assert_eq!(top["clients"][0]["throttled"], 124, "{step}");
    }
    let history = api
        .read(&format!("/api/v1/metrics/clients/c019?{range}&step=10s"))
        .await;
    let points: Vec<u64> = items(&history["rules"][0]["points"])
        .map(|p| p["throttled"].as_u64().unwrap())
        .collect();
    assert_eq!(&points[..3], [60, 20, 0]);
    let c005 = api
        .read(&format!("/api/v1/metrics/clients/c005?{range}&step=10s"))
        .await;
    assert_eq!(c005["rules"][0]["throttled"], 124);

    // A bucket keeps its 50 most throttled clients, also when they arrive over several
    // flushes and proxies.
    flush(&api, &db).await;
    for (proxy_id, range) in [("envoy-1", 100..140), ("envoy-2", 140..180)] {
        post_report(
            &api,
            &proxy,
            &report(
                proxy_id,
                t0 + 3 * MINUTE,
                json!([{"rule": "busy", "denied": 1, "top_clients": clients(range, 1)}]),
            ),
        )
        .await;
        flush(&api, &db).await;
    }
    let busy = api
        .read(&format!(
            "/api/v1/metrics/clients?from={}&to={}&step=10s&rule=busy&limit=1000",
            t0 + 3 * MINUTE,
            t0 + 4 * MINUTE
        ))
        .await;
    let busy = busy["clients"].as_array().unwrap();
    assert_eq!(busy.len(), 50);
    assert_eq!(busy[0]["client"], "c179");
    assert_eq!(busy[49]["client"], "c130");
}

async fn series_are_zero_filled_and_steps_follow_the_range(db: TestDb) {
    let api = TestApp::new(&db).await;
    issue(&api).await;
    let proxy = db.token(Role::Proxy).await;
    let now = now_ms();
    let series = api.read("/api/v1/metrics/series").await;
    assert_eq!(series["step_seconds"], 10);
    let to = series["to"].as_i64().unwrap();
    assert!((to - now).abs() < 5_000);
    assert_eq!(series["from"].as_i64().unwrap(), to - 15 * MINUTE);
    let points = series["points"].as_array().unwrap();
    assert!(points.len() == 90 || points.len() == 91, "{}", points.len());
    assert!(
        points
            .iter()
            .all(|p| p["allowed"] == 0 && p["fail_open"] == 0)
    );
    assert!(
        points
            .windows(2)
            .all(|w| w[1]["t"].as_i64().unwrap() - w[0]["t"].as_i64().unwrap() == 10_000)
    );

    let t0 = Resolution::Hour.bucket(now) - 3 * 86_400_000;
    for (range, step, points) in [
        (HOUR, 10, 360),
        (HOUR + 1, 60, 61),
        (2 * 86_400_000, 60, 2880),
        (2 * 86_400_000 + HOUR, 3600, 49),
    ] {
        let s = api
            .read(&format!(
                "/api/v1/metrics/series?from={t0}&to={}",
                t0 + range
            ))
            .await;
        assert_eq!(s["step_seconds"], step, "{range}");
        assert_eq!(s["points"].as_array().unwrap().len(), points, "{range}");
    }
    // A report in the middle of a zero-filled range lands in its bucket only.
    let t = base_time() + 30 * MINUTE;
    post_report(
        &api,
        &proxy,
        &report("envoy-1", t + 1, json!([counts("api", 5, 0, 0)])),
    )
    .await;
    let s = api
        .read(&format!(
            "/api/v1/metrics/series?from={}&to={}&step=1m",
            t - 5 * MINUTE,
            t + 5 * MINUTE
        ))
        .await;
    let allowed: Vec<u64> = items(&s["points"])
        .map(|p| p["allowed"].as_u64().unwrap())
        .collect();
    assert_eq!(allowed, [0, 0, 0, 0, 0, 5, 0, 0, 0, 0]);
    // A report whose end is exactly on a boundary belongs to the bucket that starts there.
    post_report(
        &api,
        &proxy,
        &report("envoy-1", t + MINUTE, json!([counts("api", 7, 0, 0)])),
    )
    .await;
    let s = api
        .read(&format!(
            "/api/v1/metrics/series?from={}&to={}&step=1m",
            t,
            t + 2 * MINUTE
        ))
        .await;
    assert_eq!(s["points"][1]["allowed"], 7);
}

async fn retention_deletes_old_buckets_per_resolution(db: TestDb) {
    let config = MetricsConfig {
        retention_10s: Duration::from_secs(3600),
        retention_1m: Duration::from_secs(6 * 3600),
        retention_1h: Duration::from_secs(48 * 3600),
        ..MetricsConfig::default()
    };
    let state = AppState::with_metrics_config(db.store.clone(), config)
        .await
        .unwrap();
    let api = TestApp {
        app: http::app(state.clone()),
        admin: db.token(Role::Admin).await,
        state,
    };
    issue(&api).await;
    let proxy = db.token(Role::Proxy).await;
    let now = now_ms();
    let recent = now - 30 * MINUTE;
    post_report(
        &api,
        &proxy,
        &report(
            "envoy-1",
            recent,
            json!([{"rule": "api", "denied": 2, "top_clients": [{"client": "c", "throttled": 2}]}]),
        ),
    )
    .await;
    // Too old for 10 s buckets already: only its 1 m and 1 h rows are made.
    post_report(
        &api,
        &proxy,
        &report("envoy-2", now - 2 * HOUR, json!([counts("api", 1, 0, 0)])),
    )
    .await;
    flush(&api, &db).await;
    assert_eq!(db.store.metric_row_counts().await.unwrap(), [5, 5, 3, 0]);
    let pipeline = api.state.pipeline();
    // Nothing is past retention yet.
    assert_eq!(pipeline.run_retention(&db.store, now).await.unwrap(), 0);
    // 2 h later the 10 s buckets (1 h retention) go, with their clients.
    let deleted = pipeline
        .run_retention(&db.store, now + 2 * HOUR)
        .await
        .unwrap();
    assert_eq!(deleted, 3);
    let minute = Resolution::Minute.bucket(recent);
    for (step, denied) in [("10s", 0), ("1m", 2)] {
        let path = format!(
            "/api/v1/metrics/series?from={minute}&to={}&step={step}",
            minute + MINUTE
        );
        assert_eq!(totals(&api.read(&path).await).1, denied, "{step}");
    }
    // Then the minutes (6 h), then the hours (48 h).
    assert_eq!(
        pipeline
            .run_retention(&db.store, now + 7 * HOUR)
            .await
            .unwrap(),
        5
    );
    assert_eq!(
        db.store.metric_row_counts().await.unwrap(),
        [2, 2, 1, 0],
        "only hours are left"
    );
    assert_eq!(
        pipeline
            .run_retention(&db.store, now + 60 * HOUR)
            .await
            .unwrap(),
        5
    );
    assert_eq!(db.store.metric_row_counts().await.unwrap(), [0, 0, 0, 0]);
    let m = api.metrics().await;
    assert_contains(&m, "sluice_admin_metrics_rows_deleted_total 13");
}

/// Reads race flushes on purpose: every answer must count the report exactly once, never
/// zero times (in neither place) or twice (in both).
async fn reads_never_count_a_flush_twice(db: TestDb) {
    let api = unlimited(TestApp::new(&db).await);
    issue(&api).await;
    let proxy = db.token(Role::Proxy).await;
    let t0 = base_time();
    let path = format!("/api/v1/metrics/series?from={t0}&to={}&step=1h", t0 + HOUR);
    let mut expected = 0;
    for round in 0..20 {
        post_report(
            &api,
            &proxy,
            &report(
                "envoy-1",
                t0 + 1_000 + round * 1_000,
                json!([counts("api", 1, 1, 0)]),
            ),
        )
        .await;
        expected += 1;
        let flusher = {
            let (state, store) = (api.state.clone(), db.store.clone());
            tokio::spawn(async move { state.pipeline().flush(&store).await.unwrap() })
        };
        while !flusher.is_finished() {
            assert_eq!(totals(&api.read(&path).await).1, expected, "round {round}");
            // Reads keep racing the flush, but leave it room: on one busy core an
            // unbroken stream of reads kept the flush from a pool connection for 10 s.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        flusher.await.unwrap();
        assert_eq!(totals(&api.read(&path).await).1, expected, "round {round}");
    }
}

struct Running {
    server: server::Server,
    base: String,
    http: reqwest::Client,
}

async fn start(db: &TestDb, config: MetricsConfig) -> Running {
    let state = AppState::with_metrics_config(db.store.clone(), config)
        .await
        .unwrap();
    let server = server::start(state, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    Running {
        base: format!("http://{}", server.addr()),
        server,
        http: reqwest::Client::builder()
            .timeout(PATIENCE)
            .build()
            .unwrap(),
    }
}

async fn the_stream_delivers_an_event_after_a_report_and_ends_on_shutdown(db: TestDb) {
    issue_in(&db).await;
    let api = start(&db, MetricsConfig::default()).await;
    let viewer = db.token(Role::Viewer).await;
    let proxy = db.token(Role::Proxy).await;
    let mut stream = api
        .http
        .get(format!("{}/api/v1/metrics/stream", api.base))
        .bearer_auth(&viewer)
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    assert_eq!(stream.headers()["content-type"], "text/event-stream");
    let mut api_counts = counts("api", 4, 3, 1);
    api_counts["warned"] = json!(2);
    let posted = api
        .http
        .post(format!("{}/api/v1/reports", api.base))
        .bearer_auth(&proxy)
        .json(&report("envoy-1", now_ms(), json!([api_counts])))
        .send()
        .await
        .unwrap();
    assert_eq!(posted.status(), 204);
    let deadline = Instant::now() + PATIENCE;
    let mut text = String::new();
    let event = loop {
        assert!(
            Instant::now() < deadline,
            "no event with the report: {text}"
        );
        let chunk = tokio::time::timeout(PATIENCE, stream.chunk())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        text.push_str(&String::from_utf8_lossy(&chunk));
        let found = text.split("\n\n").find_map(|block| {
            let mut lines = block.lines();
            (lines.next() == Some("event: metrics"))
                .then(|| lines.find_map(|l| l.strip_prefix("data: ")))
                .flatten()
                .and_then(|d| serde_json::from_str::<Value>(d).ok())
                .filter(|v| v["denied"] == 3)
        });
        if let Some(event) = found {
            break event;
        }
    };
    assert_eq!(event["allowed"], 4);
    assert_eq!(event["shadow_denied"], 1);
    assert_eq!(
        (&event["warned"], &event["delayed"]),
        (&json!(2), &json!(0))
    );
    // A rule's entry leaves out the shaping counts that are 0.
    assert_eq!(
        event["rules"]["api"],
        json!({"allowed": 4, "denied": 3, "shadow_denied": 1, "warned": 2})
    );
    assert!(event["t"].as_i64().unwrap() > 0);
    let started = Instant::now();
    tokio::time::timeout(PATIENCE, api.server.stop())
        .await
        .expect("shutdown hung")
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "stop took {:?}",
        started.elapsed()
    );
    // The stream ended with the server.
    let rest = tokio::time::timeout(PATIENCE, async {
        while let Ok(Some(_)) = stream.chunk().await {}
    })
    .await;
    assert!(rest.is_ok(), "the stream outlived the server");
}

async fn a_clean_stop_writes_every_accepted_report(db: TestDb) {
    // No periodic flush during the test: only the one on the way out.
    let config = MetricsConfig {
        flush_interval: Duration::from_secs(3600),
        ..MetricsConfig::default()
    };
    issue_in(&db).await;
    let api = start(&db, config).await;
    let proxy = db.token(Role::Proxy).await;
    let t0 = base_time();
    let mut sent = Vec::new();
    // Four proxies at once, each sending its ten reports in order (a proxy's reports move
    // forward in time).
    for k in 0..4_i64 {
        let (http, base, proxy) = (api.http.clone(), api.base.clone(), proxy.clone());
        sent.push(tokio::spawn(async move {
            let mut statuses = Vec::new();
            for i in (k..40).step_by(4) {
                let body = report(&format!("envoy-{k}"), t0 + i * 7_000, json!([{"rule": "api", "allowed": 1, "denied": 1, "top_clients": [{"client": "c", "throttled": 1}]}]));
                let response = http
                    .post(format!("{base}/api/v1/reports"))
                    .bearer_auth(&proxy)
                    .json(&body)
                    .send()
                    .await
                    .unwrap();
                statuses.push(response.status());
            }
            statuses
        }));
    }
    for s in sent {
        for status in s.await.unwrap() {
            assert_eq!(status, 204);
        }
    }
    assert_eq!(
        db.store.metric_row_counts().await.unwrap(),
        [0, 0, 0, 0],
        "nothing flushed yet"
    );
    api.server.stop().await.unwrap();
    let series = db
        .store
        .metric_series(
            Span {
                resolution: Resolution::Hour,
                from_ms: t0,
                to_ms: t0 + HOUR,
            },
            None,
            None,
        )
        .await
        .unwrap();
    let denied: u64 = series.iter().map(|(_, c)| c.denied).sum();
    assert_eq!(denied, 40);
    let ten: u64 = db
        .store
        .metric_series(
            Span {
                resolution: Resolution::TenSeconds,
                from_ms: t0,
                to_ms: t0 + HOUR,
            },
            Some("api"),
            Some("envoy-3"),
        )
        .await
        .unwrap()
        .iter()
        .map(|(_, c)| c.allowed)
        .sum();
    assert_eq!(ten, 10);
    let top = db
        .store
        .metric_top_clients(
            &[Span::overlapping(Resolution::Minute, t0, t0 + HOUR)],
            None,
            5,
        )
        .await
        .unwrap();
    assert_eq!(top[0].throttled, 40);
    // A report is a sign of life: every proxy is known.
    assert_eq!(db.store.list_proxies().await.unwrap().len(), 4);
}

async fn metrics_and_openapi_describe_the_pipeline(db: TestDb) {
    let api = TestApp::new(&db).await;
    issue(&api).await;
    let proxy = db.token(Role::Proxy).await;
    post_report(
        &api,
        &proxy,
        &report("envoy-1", now_ms(), json!([counts("api", 1, 0, 0)])),
    )
    .await;
    flush(&api, &db).await;
    let m = api.metrics().await;
    for line in [
        "sluice_admin_reports_ingested_total 1",
        "sluice_admin_report_ingest_duration_seconds_count 1",
        "sluice_admin_metrics_flush_duration_seconds_count 1",
        r#"sluice_admin_metrics_rows_written_total{table="metric_rule_buckets"} 3"#,
        r#"sluice_admin_metrics_rows_written_total{table="metric_proxy_buckets"} 3"#,
        r#"sluice_admin_metrics_rows_written_total{table="proxies"} 1"#,
        "sluice_admin_metrics_pending_entries 0",
    ] {
        assert_contains(&m, line);
    }
    let doc = api.openapi().await;
    for path in [
        "/api/v1/reports",
        "/api/v1/metrics/series",
        "/api/v1/metrics/rules",
        "/api/v1/metrics/clients",
        "/api/v1/metrics/clients/{client}",
        "/api/v1/metrics/overview",
        "/api/v1/metrics/stream",
    ] {
        assert!(
            doc["paths"][path].is_object(),
            "{path} is not in the OpenAPI document"
        );
    }
    let schemas = &doc["components"]["schemas"];
    for schema in [
        "Report",
        "RuleReport",
        "ClientCount",
        "Series",
        "Overview",
        "StreamEvent",
    ] {
        assert!(schemas[schema].is_object(), "schema {schema} missing");
    }
    assert!(doc["paths"]["/api/v1/metrics/stream"]["get"]["responses"]["200"]["content"]["text/event-stream"].is_object());
}

/// Replicas sharing a database each take some of the fleet's reports and flush them on
/// their own: every report counts once, in whichever replica is asked, flushes racing
/// included.
async fn reports_through_several_replicas_are_counted_once(db: TestDb) {
    let replicas = [TestApp::new(&db).await, TestApp::new(&db).await];
    issue(&replicas[0]).await;
    let proxy = db.token(Role::Proxy).await;
    let now = now_ms();
    let (mut allowed, mut denied) = (0, 0);
    // Three proxies, each report to the next replica, over two 10 s buckets.
    for i in 0..24_u64 {
        let api = &replicas[(i % 2) as usize];
        let end = now - 30_000 + i64::try_from(i).unwrap() * 1_000;
        let body = report(
            &format!("envoy-{}", i % 3),
            end,
            json!([counts("api", 10 + i, i, 0)]),
        );
        post_report(api, &proxy, &body).await;
        allowed += 10 + i;
        denied += i;
        // Flushes race the next reports, and each other.
        if i % 5 == 4 {
            let flushes = replicas
                .iter()
                .map(|r| {
                    let (state, store) = (r.state.clone(), db.store.clone());
                    tokio::spawn(async move { state.pipeline().flush(&store).await.unwrap() })
                })
                .collect::<Vec<_>>();
            for flush in flushes {
                flush.await.unwrap();
            }
        }
    }
    let range = format!("from={}&to={}", now - 15 * MINUTE, now + 1);
    for (label, flushed) in [("before the last flush", false), ("after it", true)] {
        if flushed {
            for api in &replicas {
                flush(api, &db).await;
            }
        }
        let mut seen = Vec::new();
        for api in &replicas {
            let series = api
                .read(&format!("/api/v1/metrics/series?{range}&rule=api"))
                .await;
            seen.push(totals(&series));
        }
        if flushed {
            // Everything is stored: both replicas answer the whole fleet's counts.
            assert_eq!(seen, [(allowed, denied, 0); 2], "{label}");
        } else {
            // A replica sees what is stored plus its own unflushed reports: never more
            // than the fleet sent.
            for (a, d, _) in &seen {
                assert!(*a <= allowed && *d <= denied, "{label}: {seen:?}");
            }
        }
    }
}

/// `--metrics-max-rows`: a table over the cap loses its oldest buckets (of any resolution)
/// until it is within it, each table on its own, and the rows are counted; a table at the
/// cap, or under it, keeps everything.
async fn each_metrics_table_is_capped_and_loses_its_oldest_buckets_counted(db: TestDb) {
    let config = MetricsConfig {
        max_rows_per_table: 10,
        ..MetricsConfig::default()
    };
    let state = AppState::with_metrics_config(db.store.clone(), config)
        .await
        .unwrap();
    let pipeline = state.pipeline();
    let start = base_time();
    let counts = Counts {
        allowed: 1,
        ..Counts::default()
    };
    // Minutes 0..6, five rules each: 30 rows of rules; 10 of proxies (minutes 0 and 1);
    // 8 of clients (an hour bucket older than every minute, and minute 5).
    let mut batch = MetricsBatch::default();
    for minute in 0..6 {
        for rule in 0..5 {
            batch.rules.push(RuleBucket {
                resolution: Resolution::Minute,
                bucket_ms: start + minute * MINUTE,
                rule: format!("r{rule}"),
                counts,
            });
            if minute < 2 {
                batch.proxies.push(ProxyBucket {
                    resolution: Resolution::Minute,
                    bucket_ms: start + minute * MINUTE,
                    proxy: "edge-1".into(),
                    rule: format!("r{rule}"),
                    counts,
                });
            }
        }
    }
    for (resolution, bucket_ms, n) in [
        (Resolution::Hour, start - HOUR, 4),
        (Resolution::Minute, start + 5 * MINUTE, 4),
    ] {
        for c in 0..n {
            batch.clients.push(ClientBucket {
                resolution,
                bucket_ms,
                rule: "r0".into(),
                client: format!("c{c}"),
                throttled: 1,
                error: 0,
                tokens: 0,
            });
        }
    }
    db.store.load_metrics(&batch).await.unwrap();
    assert_eq!(db.store.metric_row_counts().await.unwrap(), [30, 10, 8, 0]);

    let pruned = pipeline.enforce_row_cap(&db.store).await.unwrap();
    assert_eq!(
        pruned,
        [20, 0, 0, 0],
        "the four oldest minutes; the others are at or under"
    );
    assert_eq!(db.store.metric_row_counts().await.unwrap(), [10, 10, 8, 0]);
    let left = format!(
        "/api/v1/metrics/series?from={start}&to={}&step=1m",
        start + 6 * MINUTE
    );
    assert_eq!(
        totals(&state_read(&state, &db, &left).await).0,
        10,
        "the newest two minutes"
    );
    assert_eq!(
        pipeline.enforce_row_cap(&db.store).await.unwrap(),
        [0, 0, 0, 0],
        "at the cap"
    );

    // Over by one in the clients: the oldest bucket goes whole, whatever its resolution.
    batch = MetricsBatch::default();
    for c in 0..3 {
        batch.clients.push(ClientBucket {
            resolution: Resolution::Minute,
            bucket_ms: start + 6 * MINUTE,
            rule: "r0".into(),
            client: format!("c{c}"),
            throttled: 1,
            error: 0,
            tokens: 0,
        });
    }
    db.store.load_metrics(&batch).await.unwrap();
    assert_eq!(
        pipeline.enforce_row_cap(&db.store).await.unwrap(),
        [0, 0, 4, 0]
    );
    assert_eq!(db.store.metric_row_counts().await.unwrap(), [10, 10, 7, 0]);

    let api = TestApp {
        app: http::app(state.clone()),
        admin: db.token(Role::Admin).await,
        state,
    };
    assert_contains(
        &api.metrics().await,
        "sluice_admin_metrics_rows_deleted_total 24",
    );
}

/// Reads `path` as the admin through a router over `state`.
async fn state_read(state: &AppState, db: &TestDb, path: &str) -> Value {
    let api = TestApp {
        app: http::app(state.clone()),
        admin: db.token(Role::Admin).await,
        state: state.clone(),
    };
    api.read(path).await
}
