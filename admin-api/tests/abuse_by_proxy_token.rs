//! What a leaked proxy token can do, probed as an attacker would: through the real router
//! over a real SQLite database and the real coordinator. Each test reproduces one attack
//! and checks its bound from both sides (just within it accepted, past it refused, and the
//! refusal counted under its reason).
//!
//! The findings: made-up buckets and limits growing the coordinator (#1), made-up reports
//! flooding the metrics (#2), proxy ids not tied to tokens and checked differently on each
//! path (#3); and beyond them: replayed syncs and reports, a sync at the documented
//! maximum, many proxy ids from one token, reports far in the past and the future.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sluice_admin::http::report_guard::ReportRate;
use sluice_admin::store::{Resolution, Role, now_ms};
use sluice_admin::testing::{Backend, PATIENCE, Req, Resp, TestApp, TestDb, assert_contains, rule};
use sluice_coordinator::guard::Bounds;
use sluice_coordinator::{MAX_SYNC_BUCKETS, MAX_SYNC_BYTES};

/// A global rule of 10/s with a burst of 100: the limit every bucket below carries.
fn fleet_rule() -> Value {
    json!({"name": "fleet", "key": "global",
           "limits": [{"requests": 10, "period": "second", "burst": 100, "scope": "global"}]})
}

fn bucket(id: u64, want: u64) -> Value {
    json!({"bucket": format!("{id:016x}"), "interval_ns": 100_000_000, "burst": 100,
           "attempts": want, "want": want})
}

fn sync_body(proxy: &str, buckets: Vec<Value>) -> Value {
    json!({"proxy": proxy, "interval_ms": 500, "covers_ms": 500, "buckets": buckets})
}

fn sync(api: &TestApp, token: &str) -> Req {
    api.post("/api/v1/quota/sync").token(token)
}

/// A sync of no buckets as `proxy`, expecting `status`.
async fn empty_sync(api: &TestApp, token: &str, proxy: &str, status: u16) -> Resp {
    sync(api, token)
        .json(&sync_body(proxy, vec![]))
        .expect(status)
        .await
}

/// An app with the fleet rule and the "api" rule (ruleset version 2), and a proxy token.
async fn app() -> (TestDb, TestApp, String) {
    let db = TestDb::new(Backend::Sqlite).await.expect("sqlite");
    let api = TestApp::new(&db).await;
    api.create(&fleet_rule()).await;
    api.create(&rule("api")).await;
    let proxy = db.token(Role::Proxy).await;
    (db, api, proxy)
}

/// The value of the metric line starting with `series` (name and labels), 0 if absent.
async fn metric(api: &TestApp, series: &str) -> u64 {
    let text = api.metrics().await;
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .map_or(0, |v| v.trim().parse().unwrap())
}

/// Syncs until the coordinator has warmed up (one lease TTL after it started).
async fn warmed_up(api: &TestApp, token: &str) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let answer = sync(api, token)
            .json(&sync_body("probe", vec![]))
            .expect(200)
            .await
            .json();
        if answer["warming_up"] == json!(false) {
            return;
        }
        assert!(Instant::now() < deadline, "still warming up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ---- #1: the coordinator's state ------------------------------------------------------

/// The probe's attack: syncs of made-up buckets, many proxy ids, nothing evicted. The
/// coordinator keeps at most its bounds (here 150 in all, 100 per proxy id), answers every
/// bucket past them with nothing granted, counts each, and evicts idle buckets.
#[tokio::test]
async fn made_up_buckets_cannot_grow_the_coordinator_past_its_bounds() {
    let (_db, api, proxy) = app().await;
    api.state.set_quota_bounds(Bounds {
        max_buckets: 150,
        max_buckets_per_proxy: 100,
    });
    let made_up = |from: u64, n: u64| (from..from + n).map(|id| bucket(id, 1)).collect();
    let answer = sync(&api, &proxy)
        .json(&sync_body("edge-1", made_up(0, 101)))
        .expect(200)
        .await
        .json();
    assert_eq!(answer["grants"].as_array().unwrap().len(), 101);
    assert_eq!(metric(&api, "sluice_quota_active_buckets").await, 100);
    let per_proxy = "sluice_quota_refused_total{reason=\"max_buckets_per_proxy\"}";
    assert_eq!(metric(&api, per_proxy).await, 1, "the 101st of one proxy");
    let last = &answer["grants"][100];
    assert_eq!(
        (last["granted"].clone(), last["young"].clone()),
        (json!(0), json!(true))
    );

    // Another id of the same token fills the rest, then the total bound holds.
    sync(&api, &proxy)
        .json(&sync_body("edge-2", made_up(1_000, 60)))
        .expect(200)
        .await;
    assert_eq!(metric(&api, "sluice_quota_active_buckets").await, 150);
    let total = "sluice_quota_refused_total{reason=\"max_buckets\"}";
    assert_eq!(metric(&api, total).await, 10);
    // Buckets already held are settled as before, whoever syncs them.
    sync(&api, &proxy)
        .json(&sync_body("edge-3", made_up(0, 5)))
        .expect(200)
        .await;
    assert_eq!(metric(&api, total).await, 10);
}

/// A limit no rule produces (the probe's interval of 4 × 10^18 ns), or one a burst off a
/// real one, refuses the whole sync by field; the real limit is taken.
#[tokio::test]
async fn absurd_limits_are_refused_and_counted() {
    let (_db, api, proxy) = app().await;
    let mut absurd = bucket(1, 1);
    absurd["interval_ns"] = json!(4_000_000_000_000_000_000_u64);
    let mut off_by_one = bucket(2, 1);
    off_by_one["burst"] = json!(101);
    let refused = sync(&api, &proxy)
        .json(&sync_body("edge-1", vec![bucket(0, 1), absurd, off_by_one]))
        .expect(422)
        .await;
    assert_eq!(refused.fields(), ["buckets[1]", "buckets[2]"]);
    assert_eq!(
        metric(&api, "sluice_quota_refused_total{reason=\"unknown_limit\"}").await,
        1
    );
    assert_eq!(
        metric(&api, "sluice_quota_active_buckets").await,
        0,
        "nothing kept"
    );
    sync(&api, &proxy)
        .json(&sync_body("edge-1", vec![bucket(0, 1)]))
        .expect(200)
        .await;
}

/// A made-up count of tokens admitted without a lease would drain a fleet's bucket in one
/// sync: it is bounded by twice what the bucket holds and refills over the time covered
/// and a lease's life (10/s, burst 100, 500 ms covered, 1.5 s lease: 242).
#[tokio::test]
async fn a_made_up_unleased_count_cannot_drain_a_fleet_bucket() {
    let (_db, api, proxy) = app().await;
    let mut drain = bucket(1, 1);
    drain["unleased"] = json!(1_000_000_000_000_u64);
    let refused = sync(&api, &proxy)
        .json(&sync_body("edge-1", vec![drain.clone()]))
        .expect(422)
        .await;
    assert_eq!(refused.fields(), ["buckets[0].unleased"]);
    drain["unleased"] = json!(243);
    sync(&api, &proxy)
        .json(&sync_body("edge-1", vec![drain.clone()]))
        .expect(422)
        .await;
    assert_eq!(
        metric(&api, "sluice_quota_refused_total{reason=\"invalid\"}").await,
        2
    );
    drain["unleased"] = json!(242);
    sync(&api, &proxy)
        .json(&sync_body("edge-1", vec![drain]))
        .expect(200)
        .await;
}

/// A sync at the documented maximum (50,000 buckets) is taken and kept whole (the
/// per-proxy default is one full sync); one more bucket is refused by name.
#[tokio::test]
async fn a_sync_at_the_documented_maximum_is_taken_and_one_more_is_refused() {
    let (_db, api, proxy) = app().await;
    // Each attempted once, so that none is idle when the first sync sweeps.
    let most: Vec<Value> = (0..MAX_SYNC_BUCKETS as u64)
        .map(|id| bucket(id, 1))
        .collect();
    let body = sync_body("edge-1", most);
    assert!(serde_json::to_vec(&body).unwrap().len() < MAX_SYNC_BYTES);
    let answer = sync(&api, &proxy).json(&body).expect(200).await.json();
    assert_eq!(answer["grants"].as_array().unwrap().len(), MAX_SYNC_BUCKETS);
    assert_eq!(
        metric(&api, "sluice_quota_active_buckets").await,
        MAX_SYNC_BUCKETS as u64
    );
    let mut over = body;
    over["buckets"]
        .as_array_mut()
        .unwrap()
        .push(bucket(MAX_SYNC_BUCKETS as u64, 0));
    let refused = sync(&api, &proxy).json(&over).expect(422).await;
    assert_eq!(refused.fields(), ["buckets"]);
}

/// The same sync sent again and again by a proxy from before sequences (no `seq`) grants
/// no token twice: the grants of every copy together stay within the bucket's
/// `burst + rate × elapsed`, and no state is added.
#[tokio::test]
async fn a_replayed_sync_never_grants_twice_nor_grows_state() {
    let (_db, api, proxy) = app().await;
    warmed_up(&api, &proxy).await;
    let body = sync_body("edge-1", vec![bucket(7, 60)]);
    sync(&api, &proxy)
        .json(&sync_body("edge-1", vec![bucket(7, 0)]))
        .expect(200)
        .await;
    // Let the bucket grow out of its young phase, so grants are real.
    tokio::time::sleep(Duration::from_millis(900)).await;
    let started = Instant::now();
    let mut granted = 0;
    for _ in 0..20 {
        let answer = sync(&api, &proxy).json(&body).expect(200).await.json();
        granted += answer["grants"][0]["granted"].as_u64().unwrap();
    }
    let ceiling = 100 + (10.0 * started.elapsed().as_secs_f64()).ceil() as u64;
    assert!(granted >= 60, "the first copy is granted: {granted}");
    assert!(granted <= ceiling, "{granted} granted of at most {ceiling}");
    assert_eq!(metric(&api, "sluice_quota_active_buckets").await, 1);
}

/// A sync carries `seq`, larger each time: a copy of one (a replay) is refused before it
/// can debit its buckets again, as is one that drops its sequence or runs far ahead of
/// the server's clock. A proxy that never sends one (from before sequences) is served.
#[tokio::test]
async fn a_replayed_sync_is_refused_by_its_sequence() {
    let (_db, api, proxy) = app().await;
    let seq = u64::try_from(now_ms()).unwrap();
    let mut body = sync_body("edge-1", vec![bucket(7, 60)]);
    body["seq"] = json!(seq);
    sync(&api, &proxy).json(&body).expect(200).await;
    for _ in 0..3 {
        let refused = sync(&api, &proxy).json(&body).expect(422).await;
        assert_eq!(refused.fields(), ["seq"]);
    }
    let replays = "sluice_quota_refused_total{reason=\"replay\"}";
    assert_eq!(metric(&api, replays).await, 3);
    body["seq"] = json!(seq - 1);
    sync(&api, &proxy).json(&body).expect(422).await;
    body["seq"] = json!(seq + 1);
    sync(&api, &proxy).json(&body).expect(200).await;
    let mut dropped = body.clone();
    dropped.as_object_mut().unwrap().remove("seq");
    let refused = sync(&api, &proxy).json(&dropped).expect(422).await;
    assert_eq!(refused.fields(), ["seq"], "a sequence once sent must go on");
    assert_eq!(metric(&api, replays).await, 5);

    let most = seq + 5 * 60_000;
    let mut ahead = sync_body("edge-2", vec![]);
    ahead["seq"] = json!(most + 60_000);
    let refused = sync(&api, &proxy).json(&ahead).expect(422).await;
    assert_eq!(refused.fields(), ["seq"], "more than 5 minutes ahead");
    ahead["seq"] = json!(most - 60_000);
    sync(&api, &proxy).json(&ahead).expect(200).await;

    for _ in 0..2 {
        empty_sync(&api, &proxy, "edge-old", 200).await;
    }
}

// ---- #2: reports ----------------------------------------------------------------------

fn report(proxy: &str, end_ms: i64, rules: Value) -> Value {
    json!({"proxy_id": proxy, "start_ms": end_ms - 2_000, "end_ms": end_ms,
           "ruleset_version": 2, "rules": rules})
}

fn report_request(api: &TestApp, token: &str) -> Req {
    api.post("/api/v1/reports").token(token)
}

/// Sends `body` as a report, expecting 422; the fields the refusal names.
async fn refused_report(api: &TestApp, token: &str, body: &Value) -> Vec<String> {
    report_request(api, token)
        .json(body)
        .expect(422)
        .await
        .fields()
}

fn rejected(reason: &str) -> String {
    format!("sluice_admin_reports_rejected_total{{reason=\"{reason}\"}}")
}

/// Allowed requests the series shows around `at`.
async fn allowed_near(api: &TestApp, at: i64) -> u64 {
    let series = api
        .read(&format!(
            "/api/v1/metrics/series?from={}&to={}&step=1h",
            Resolution::Hour.bucket(at),
            Resolution::Hour.bucket(at) + 3_600_000
        ))
        .await;
    series["points"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["allowed"].as_u64().unwrap())
        .sum()
}

/// The probe's flood: made-up rules, made-up versions and counts of 10^12. Only rules and
/// versions the server issued are taken, and each count is bounded by 1,000,000 a second
/// of the report's window (here 2 s: 2,000,000 taken, 2,000,001 refused).
#[tokio::test]
async fn made_up_rules_versions_and_counts_are_refused_and_counted() {
    let (_db, api, proxy) = app().await;
    let now = now_ms() - 60_000;
    let made_up = report(
        "edge-1",
        now,
        json!([{"rule": "api"}, {"rule": "made-up", "allowed": 1}]),
    );
    assert_eq!(
        refused_report(&api, &proxy, &made_up).await,
        ["rules[1].rule"]
    );
    assert_eq!(metric(&api, &rejected("unknown_rule")).await, 1);

    let mut future_version = report("edge-1", now, json!([{"rule": "api"}]));
    future_version["ruleset_version"] = json!(3);
    assert_eq!(
        refused_report(&api, &proxy, &future_version).await,
        ["ruleset_version"]
    );
    assert_eq!(metric(&api, &rejected("unknown_version")).await, 1);

    let huge = report(
        "edge-1",
        now,
        json!([{"rule": "api", "allowed": 1_000_000_000_000_u64}]),
    );
    assert_eq!(
        refused_report(&api, &proxy, &huge).await,
        ["rules[0].allowed"]
    );
    let over = report(
        "edge-1",
        now,
        json!([{"rule": "api", "denied": 2_000_001, "in_flight_refused": 2_000_001,
        "top_clients": [{"client": "c", "throttled": 2_000_001}]}]),
    );
    let refused = report_request(&api, &proxy).json(&over).expect(422).await;
    assert_eq!(
        refused.fields(),
        [
            "rules[0].denied",
            "rules[0].in_flight_refused",
            "rules[0].top_clients"
        ]
    );
    assert_eq!(metric(&api, &rejected("over_ceiling")).await, 2);

    let most = report(
        "edge-1",
        now,
        // Shaping request counts are held to the ceiling too; the summed wait is not.
        json!([{"rule": "api", "allowed": 2_000_000, "warned": 2_000_000,
                "delay_wait_ms": 2_000_001}]),
    );
    report_request(&api, &proxy).json(&most).expect(204).await;
    assert_eq!(
        allowed_near(&api, now).await,
        2_000_000,
        "nothing refused was kept"
    );
}

/// The same report resent is counted once; the next one must end at least 500 ms later,
/// and its counts are bounded by the time since the last one, whatever its start says.
#[tokio::test]
async fn a_replayed_report_is_counted_once() {
    let (_db, api, proxy) = app().await;
    let end = now_ms() - 60_000;
    let body = report("edge-1", end, json!([{"rule": "api", "allowed": 5}]));
    report_request(&api, &proxy).json(&body).expect(204).await;
    for _ in 0..5 {
        assert_eq!(refused_report(&api, &proxy, &body).await, ["end_ms"]);
    }
    assert_eq!(metric(&api, &rejected("replay")).await, 5);
    let soon = report("edge-1", end + 499, json!([{"rule": "api", "allowed": 1}]));
    report_request(&api, &proxy).json(&soon).expect(422).await;
    // 500 ms later: at most 500,000 a count, though its start claims five minutes.
    let mut next = report(
        "edge-1",
        end + 500,
        json!([{"rule": "api", "allowed": 500_001}]),
    );
    next["start_ms"] = json!(end + 500 - 300_000);
    report_request(&api, &proxy).json(&next).expect(422).await;
    next["rules"][0]["allowed"] = json!(500_000);
    report_request(&api, &proxy).json(&next).expect(204).await;
    assert_eq!(allowed_near(&api, end).await, 500_005);
}

/// Reports are limited as they arrive, per proxy id: the burst is taken, one more is
/// answered 429 with `Retry-After` and counted, whatever its reported time; another id
/// has its own allowance.
#[tokio::test]
async fn reports_of_one_proxy_id_are_limited_as_they_arrive() {
    let (_db, api, proxy) = app().await;
    assert_eq!(
        ReportRate::default(),
        ReportRate {
            per_minute: 120,
            burst: 10
        }
    );
    api.state.set_report_rate(ReportRate {
        per_minute: 1,
        burst: 3,
    });
    let end = now_ms() - 60_000;
    let at = |i: i64| {
        report(
            "edge-1",
            end + i * 1_000,
            json!([{"rule": "api", "allowed": 1}]),
        )
    };
    for i in 0..3 {
        report_request(&api, &proxy).json(&at(i)).expect(204).await;
    }
    let refused = report_request(&api, &proxy).json(&at(3)).expect(429).await;
    let retry: u64 = refused.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry), "Retry-After: {retry}");
    assert_eq!(metric(&api, &rejected("rate_limited")).await, 1);
    let other = report("edge-2", end, json!([{"rule": "api", "allowed": 1}]));
    report_request(&api, &proxy).json(&other).expect(204).await;
    assert_eq!(allowed_near(&api, end).await, 4, "nothing refused was kept");
}

/// A report's body is at most 1 MiB: one of exactly 1 MiB is taken, one byte more is
/// answered 413 and counted.
#[tokio::test]
async fn a_report_is_at_most_one_mebibyte() {
    let (_db, api, proxy) = app().await;
    let end = now_ms() - 60_000;
    let sized = |end: i64, size: usize| {
        let mut body = report("edge-1", end, json!([{"rule": "api", "allowed": 1}])).to_string();
        // JSON allows any whitespace between its tokens.
        body.insert_str(1, &" ".repeat(size - body.len()));
        body
    };
    const MIB: usize = 1024 * 1024;
    report_request(&api, &proxy)
        .raw("application/json", sized(end, MIB))
        .expect(204)
        .await;
    report_request(&api, &proxy)
        .raw("application/json", sized(end + 1_000, MIB + 1))
        .expect(413)
        .await;
    assert_eq!(metric(&api, &rejected("too_large")).await, 1);
}

/// Reports far in the future are refused (more than 5 minutes ahead); reports far in the
/// past are taken but keep nothing past the retention of each resolution (400 days for
/// hours by default), so they cannot grow the tables with old rows.
#[tokio::test]
async fn reports_far_in_the_past_or_future_are_bounded() {
    let (db, api, proxy) = app().await;
    let now = now_ms();
    let ahead = report(
        "edge-1",
        now + 5 * 60_000 + 10_000,
        json!([{"rule": "api", "allowed": 1}]),
    );
    assert_eq!(refused_report(&api, &proxy, &ahead).await, ["end_ms"]);
    let long_ago = now - 401 * 86_400_000;
    let old = report("edge-2", long_ago, json!([{"rule": "api", "allowed": 1}]));
    report_request(&api, &proxy).json(&old).expect(204).await;
    api.state.pipeline().flush(&db.store).await.unwrap();
    assert_eq!(db.store.metric_row_counts().await.unwrap(), [0, 0, 0, 0]);
    // Just within the clock-skew allowance: taken.
    let skewed = report(
        "edge-3",
        now + 4 * 60_000,
        json!([{"rule": "api", "allowed": 1}]),
    );
    report_request(&api, &proxy).json(&skewed).expect(204).await;
}

// ---- #3: proxy ids --------------------------------------------------------------------

/// One rule on every path: a sync's `proxy`, a report's `proxy_id` and the poll's header
/// refuse the same ids (the poll still serves the rules, but does not record the proxy).
#[tokio::test]
async fn proxy_ids_are_checked_alike_on_every_path() {
    let (_db, api, proxy) = app().await;
    let end = now_ms() - 60_000;
    for bad in ["", "édge-1", "edge 1", &"e".repeat(129)] {
        let refused = sync(&api, &proxy)
            .json(&sync_body(bad, vec![]))
            .expect(422)
            .await;
        assert_eq!(refused.fields(), ["proxy"], "{bad:?}");
        let refused = report_request(&api, &proxy)
            .json(&report(bad, end, json!([])))
            .expect(422)
            .await;
        assert_eq!(refused.fields(), ["proxy_id"], "{bad:?}");
    }
    for bad in ["édge-1", "<b>edge</b> 1", &"e".repeat(129)] {
        api.get("/api/v1/ruleset?after=0&wait=0")
            .token(&proxy)
            .header("x-sluice-proxy-id", bad)
            .expect(200)
            .await;
    }
    let longest = "e".repeat(128);
    api.get("/api/v1/ruleset?after=0&wait=0")
        .token(&proxy)
        .header("x-sluice-proxy-id", &longest)
        .expect(200)
        .await;
    let listed = api.read("/api/v1/proxies").await;
    let ids: Vec<&str> = listed["proxies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [longest.as_str()], "only the valid id is recorded");
    assert_eq!(
        metric(
            &api,
            "sluice_admin_proxy_ids_refused_total{path=\"ruleset\",reason=\"invalid\"}"
        )
        .await,
        3
    );
}

/// A proxy id belongs to the first proxy token that used it: another token cannot sync,
/// report or be recorded as it. One token may use at most 1,000 ids.
#[tokio::test]
async fn a_proxy_id_is_tied_to_its_first_token_and_ids_per_token_are_bounded() {
    let (db, api, proxy) = app().await;
    let other = db.token(Role::Proxy).await;
    let end = now_ms() - 60_000;
    empty_sync(&api, &proxy, "edge-1", 200).await;
    let refused = empty_sync(&api, &other, "edge-1", 422).await;
    assert_eq!(refused.fields(), ["proxy"]);
    let refused = report_request(&api, &other)
        .json(&report("edge-1", end, json!([])))
        .expect(422)
        .await;
    assert_eq!(refused.fields(), ["proxy_id"]);
    assert_eq!(metric(&api, &rejected("proxy_id")).await, 1);
    report_request(&api, &proxy)
        .json(&report("edge-1", end, json!([])))
        .expect(204)
        .await;
    // An admin token may act as any proxy (it can mint proxy tokens anyway).
    empty_sync(&api, &api.admin, "edge-1", 200).await;

    // `other` now takes ids up to its bound: the 1,000th is taken, the 1,001st refused.
    for i in 0..1_000 {
        empty_sync(&api, &other, &format!("other-{i}"), 200).await;
    }
    let refused = empty_sync(&api, &other, "other-1000", 422).await;
    assert_eq!(refused.fields(), ["proxy"]);
    empty_sync(&api, &other, "other-0", 200).await;
    let text = api.metrics().await;
    assert_contains(
        &text,
        "sluice_admin_proxy_ids_refused_total{path=\"sync\",reason=\"too_many_ids\"} 1",
    );
    assert_contains(
        &text,
        "sluice_admin_proxy_ids_refused_total{path=\"sync\",reason=\"other_token\"} 1",
    );
}
