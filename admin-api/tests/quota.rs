//! `POST /api/v1/quota/sync`: the coordinator of global buckets as proxies see it: who may
//! sync, what is refused, the warm-up after a start, pre-debited grants shared by a fleet,
//! two replicas sharing one real Redis (one server, and a three-master Redis Cluster), a
//! Redis outage, and the OpenAPI description. (The arithmetic itself is tested in
//! `sluice-core`.)

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sluice_admin::http::AppState;
use sluice_admin::http::token_cache::REFRESH_AFTER;
use sluice_admin::pipeline::MetricsConfig;
use sluice_admin::store::{Actor, Role, now_ms};
use sluice_admin::testing::{Backend, PATIENCE, Req, TestApp, TestDb, assert_contains};
use sluice_coordinator as quota;
use sluice_coordinator::redis::RedisBuckets;
use sluice_core::global::coordinator::Settings;
use sluice_core::time::Nanos;
use sluice_harness::{RedisCluster, RedisServer, redis_available};

/// How long a bucket counts as young for these syncs (every 500 ms): the coordinator keeps
/// the other proxies' even shares meanwhile.
fn young() -> Duration {
    Duration::from_nanos(Settings::for_interval(Nanos::new(500_000_000)).young_ns())
}

/// A sync sent with `token`.
fn sync_request(api: &TestApp, token: &str) -> Req {
    api.post("/api/v1/quota/sync").token(token)
}

fn sync_body(proxy: &str, buckets: Value) -> Value {
    json!({"proxy": proxy, "interval_ms": 500, "covers_ms": 500, "buckets": buckets})
}

/// One bucket of 10/s with a burst of 100, asking for `want` tokens.
fn bucket(id: &str, want: u64) -> Value {
    json!({"bucket": id, "interval_ns": 100_000_000, "burst": 100, "attempts": want, "want": want})
}

/// The global rule whose limit [`bucket`] carries (10/s, burst 100): the coordinator
/// takes only limits the rules produce.
fn fleet_rule() -> Value {
    json!({"name": "fleet", "key": "global",
           "limits": [{"requests": 10, "period": "second", "burst": 100, "scope": "global"}]})
}

async fn app() -> (TestDb, TestApp) {
    let db = TestDb::new(Backend::Sqlite).await.expect("sqlite");
    let api = TestApp::new(&db).await;
    api.create(&fleet_rule()).await;
    (db, api)
}

/// A Redis server of the test's own and a SQLite database, when Redis is installed (the
/// test passes without running otherwise).
async fn with_redis() -> Option<(RedisServer, TestDb)> {
    if !redis_available() {
        return None;
    }
    let redis = RedisServer::start();
    let db = TestDb::new(Backend::Sqlite).await.expect("sqlite");
    TestApp::new(&db).await.create(&fleet_rule()).await;
    Some((redis, db))
}

/// The tests' Redis: one server, or a cluster of three masters and their replicas.
enum TestRedis {
    Server(RedisServer),
    Cluster(RedisCluster),
}

impl TestRedis {
    fn url(&self) -> String {
        match self {
            TestRedis::Server(server) => server.url(),
            TestRedis::Cluster(cluster) => cluster.url(),
        }
    }
}

/// [`with_redis`], on a Redis Cluster when `cluster`.
async fn on_redis(cluster: bool) -> Option<(TestRedis, TestDb)> {
    if !cluster {
        let (server, db) = with_redis().await?;
        return Some((TestRedis::Server(server), db));
    }
    if !redis_available() {
        return None;
    }
    let cluster = RedisCluster::start();
    let db = TestDb::new(Backend::Sqlite).await.expect("sqlite");
    TestApp::new(&db).await.create(&fleet_rule()).await;
    Some((TestRedis::Cluster(cluster), db))
}

/// An app whose global buckets live in the Redis at `url` (one `sluice serve` replica).
async fn replica(db: &TestDb, url: &str) -> TestApp {
    let redis = RedisBuckets::connect(url).await.expect("redis");
    let state = AppState::with_options(
        db.store.clone(),
        MetricsConfig::default(),
        quota::Backend::Redis(redis),
        sluice_admin::http::failed_auth::FailureLimit::default(),
    )
    .await
    .expect("state");
    TestApp::over(db, state).await
}

async fn sync(api: &TestApp, token: &str, proxy: &str, bucket_id: &str, want: u64) -> Value {
    sync_request(api, token)
        .json(&sync_body(proxy, json!([bucket(bucket_id, want)])))
        .expect(200)
        .await
        .json()
}

/// A poll as `proxy`, so that it is listed at `/api/v1/proxies`.
async fn poll_as(api: &TestApp, token: &str, proxy: &str) {
    api.get("/api/v1/ruleset?after=0&wait=0")
        .token(token)
        .header("x-sluice-proxy-id", proxy)
        .send()
        .await;
}

/// What `/api/v1/proxies` says of `proxy`'s global syncs.
async fn global_sync_of(api: &TestApp, proxy: &str) -> Value {
    let list = api.read("/api/v1/proxies").await;
    list["proxies"]
        .as_array()
        .and_then(|all| all.iter().find(|p| p["id"] == proxy))
        .map(|p| p["global_sync"].clone())
        .unwrap_or_else(|| panic!("{proxy} is not listed: {list}"))
}

fn granted(answer: &Value) -> u64 {
    answer["grants"][0]["granted"].as_u64().unwrap()
}

/// Syncs until the coordinator has warmed up (one lease TTL after it started).
async fn warmed_up(api: &TestApp, token: &str) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let answer = sync_request(api, token)
            .json(&sync_body("probe", json!([])))
            .expect(200)
            .await
            .json();
        if answer["warming_up"] == json!(false) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "still warming up after {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn only_proxy_and_admin_tokens_may_sync() {
    let (db, api) = app().await;
    let body = sync_body("edge-1", json!([]));
    api.post("/api/v1/quota/sync")
        .no_token()
        .json(&body)
        .expect(401)
        .await;
    for role in [Role::Viewer, Role::Editor] {
        let token = db.token(role).await;
        sync_request(&api, &token).json(&body).expect(403).await;
    }
    let proxy = db.token(Role::Proxy).await;
    for token in [&proxy, &api.admin] {
        sync_request(&api, token).json(&body).expect(200).await;
    }
}

/// A proxy's token is checked from memory between database lookups (the admin API's
/// `token_cache`): revoked through this replica it is refused at once; revoked elsewhere
/// (the command line, another replica) it is still taken from memory, then refused within
/// a second and one lookup; people's requests always ask the database.
#[tokio::test]
async fn a_revoked_proxy_token_is_refused_at_once_here_and_within_a_second_elsewhere() {
    let (db, api) = app().await;
    let empty = || sync_body("edge", json!([]));

    let here = db.token(Role::Proxy).await;
    sync(&api, &here, "edge", "b1", 1).await;
    let id = db.token_id(&here).await;
    api.delete(&format!("/api/v1/tokens/{id}"))
        .expect(200)
        .await;
    sync_request(&api, &here).json(&empty()).expect(401).await;

    // An admin token may sync and read the rules.
    let elsewhere = db.token(Role::Admin).await;
    sync(&api, &elsewhere, "edge", "b1", 1).await;
    let id = db.token_id(&elsewhere).await;
    db.store
        .revoke_token(&Actor::cli(), &id, now_ms())
        .await
        .unwrap();
    let revoked_at = Instant::now();
    sync_request(&api, &elsewhere)
        .json(&empty())
        .expect(200)
        .await;
    api.get("/api/v1/rules").token(&elsewhere).expect(401).await;
    loop {
        let status = sync_request(&api, &elsewhere)
            .json(&empty())
            .send()
            .await
            .status;
        if status == 401 {
            break;
        }
        assert_eq!(status, 200);
        assert!(
            revoked_at.elapsed() < REFRESH_AFTER + PATIENCE,
            "a token revoked in the database still syncs after {:?}",
            revoked_at.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// With PostgreSQL, a proxy's sync does not wait for the database: while another
/// transaction holds the tokens table locked, a remembered token still syncs (its refresh
/// waits in the background), and a person's request waits for the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxys_sync_does_not_wait_for_the_database() {
    let Some(db) = TestDb::new(Backend::Postgres).await else {
        return;
    };
    let api = TestApp::new(&db).await;
    api.create(&fleet_rule()).await;
    let proxy = db.token(Role::Proxy).await;
    sync(&api, &proxy, "edge", "b1", 1).await;

    let mut lock = db.store.pool().begin().await.unwrap();
    sqlx::query("LOCK TABLE tokens IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .unwrap();
    // Past the refresh age, so the syncs below start a lookup that cannot finish.
    tokio::time::sleep(REFRESH_AFTER).await;
    for _ in 0..3 {
        let answered = tokio::time::timeout(
            PATIENCE,
            sync_request(&api, &proxy)
                .json(&sync_body("edge", json!([])))
                .expect(200),
        )
        .await;
        assert!(
            answered.is_ok(),
            "a sync waited for the locked tokens table"
        );
    }
    let read = tokio::time::timeout(Duration::from_millis(300), api.get("/api/v1/rules").send());
    assert!(
        read.await.is_err(),
        "a person's request answered without the tokens table: the lock did not hold"
    );
    lock.rollback().await.unwrap();
}

#[tokio::test]
async fn bad_syncs_are_refused_with_every_problem_named() {
    let (db, api) = app().await;
    let proxy = db.token(Role::Proxy).await;
    let mut body = sync_body(
        "",
        json!([bucket("00000000000000ab", 1),
               {"bucket": "1", "interval_ns": 0, "burst": 5}]),
    );
    body["interval_ms"] = json!(10);
    let refused = sync_request(&api, &proxy).json(&body).expect(422).await;
    assert_eq!(
        refused.fields(),
        ["proxy", "interval_ms", "buckets[1].interval_ns"]
    );

    let shape = sync_request(&api, &proxy)
        .json(&sync_body(
            "p",
            json!([{"bucket": "zz", "interval_ns": 1, "burst": 1}]),
        ))
        .expect(422)
        .await;
    assert_eq!(shape.fields(), ["buckets[0].bucket"]);

    sync_request(&api, &proxy)
        .raw("text/plain", "{}")
        .expect(415)
        .await;
}

/// The document bounds `interval_ns` and `burst` each by 2^62 and cannot bound their
/// product, nor say which limits the rules produce: a limit within the bounds that no
/// global rule produces is refused by name (and counted), the slowest a rule can produce
/// is settled (its burst capped as the rule's is), and a value beyond the bounds is
/// refused by name.
#[tokio::test]
async fn only_limits_the_rules_produce_are_settled() {
    let (db, api) = app().await;
    let proxy = db.token(Role::Proxy).await;
    const MAX: u64 = 1 << 62;
    const DAY_NS: u64 = 86_400_000_000_000;
    api.create(&json!({"name": "slow", "key": "global",
        "limits": [{"requests": 1, "period": "day", "burst": 1_000_000_000_u64, "scope": "global"}]}))
        .await;
    let limit = |interval_ns: u64, burst: u64| json!({"bucket": "ab", "interval_ns": interval_ns, "burst": burst, "attempts": 1, "want": 1});
    // One a day holds at most 2^62 / 86,400 s = 53,375 tokens: what the proxy sends, and
    // what the coordinator caps a larger burst to.
    for (interval_ns, burst) in [
        (DAY_NS, 53_375),
        (DAY_NS, 1_000_000_000),
        (100_000_000, 100),
    ] {
        let answer = sync_request(&api, &proxy)
            .json(&sync_body("edge-1", json!([limit(interval_ns, burst)])))
            .send()
            .await;
        assert_eq!(
            answer.status.as_u16(),
            200,
            "{interval_ns} × {burst}: {}",
            answer.text()
        );
        assert_eq!(answer.json()["grants"].as_array().unwrap().len(), 1);
    }
    for (interval_ns, burst) in [
        (MAX, MAX),
        (MAX, 1),
        (1, MAX),
        (DAY_NS, 53_374),
        (100_000_000, 101),
    ] {
        let refused = sync_request(&api, &proxy)
            .json(&sync_body(
                "edge-1",
                json!([bucket("01", 0), limit(interval_ns, burst)]),
            ))
            .expect(422)
            .await;
        assert_eq!(refused.fields(), ["buckets[1]"], "{interval_ns} × {burst}");
    }
    assert_contains(
        &api.metrics().await,
        "sluice_quota_refused_total{reason=\"unknown_limit\"} 5",
    );
    for (bucket, field) in [
        (limit(MAX + 1, 1), "buckets[0].interval_ns"),
        (limit(1, MAX + 1), "buckets[0].burst"),
        (limit(1, 0), "buckets[0].burst"),
    ] {
        let refused = sync_request(&api, &proxy)
            .json(&sync_body("edge-1", json!([bucket])))
            .send()
            .await
            .expect(422);
        assert_eq!(refused.fields(), [field]);
    }
}

#[tokio::test]
async fn a_fleet_shares_one_bucket_and_every_grant_is_taken_at_once() {
    let (db, api) = app().await;
    let proxy = db.token(Role::Proxy).await;
    warmed_up(&api, &proxy).await;

    let sync = |name: &'static str, want: u64| {
        let api = api.clone();
        let proxy = proxy.clone();
        async move {
            sync_request(&api, &proxy)
                .json(&sync_body(name, json!([bucket("00000000000000c1", want)])))
                .expect(200)
                .await
                .json()
        }
    };
    // While a bucket is young the coordinator keeps the other proxies' even shares for
    // their first reports: let it age first, so the whole burst is anyone's.
    sync("edge-1", 0).await;
    tokio::time::sleep(young()).await;
    let started = Instant::now();
    let first = sync("edge-1", 80).await;
    let second = sync("edge-2", 80).await;
    let elapsed = started.elapsed().as_secs_f64();
    let a = first["grants"][0]["granted"].as_u64().unwrap();
    let b = second["grants"][0]["granted"].as_u64().unwrap();
    assert_eq!(a, 80, "the bucket starts full: {first}");
    // Whatever the machine's speed: the second proxy gets what is left plus the refill
    // since, never a second full burst.
    let ceiling = 100 + (10.0 * elapsed).floor() as u64;
    assert!(a + b <= ceiling, "granted {a} + {b} of at most {ceiling}");
    // The rest of the burst goes to the second proxy, except for one sync interval's
    // refill (5 tokens at 10/s and 500 ms), kept for the proxies' demand shares.
    assert!(
        b >= 20 - 5,
        "the rest of the burst goes to the second proxy: {second}"
    );
    assert_eq!(
        second["fleet_size"],
        json!(3),
        "the probe, edge-1 and edge-2"
    );
    let share = second["grants"][0]["share_ppm"].as_u64().unwrap();
    assert!(share > 0 && share <= 1_000_000, "{share}");

    let mut back = bucket("00000000000000c1", 0);
    back["returned"] = json!(a);
    back["attempts"] = json!(0);
    sync_request(&api, &proxy)
        .json(&sync_body("edge-1", json!([back])))
        .expect(200)
        .await;
    // Tokens given back are granted again (less, again, what one interval's refill keeps
    // for the others' demand shares).
    let again = sync("edge-2", 80).await;
    let regranted = again["grants"][0]["granted"].as_u64().unwrap();
    assert!(regranted >= 80 - 5, "{again}");

    let metrics = api.metrics().await;
    assert_contains(&metrics, "sluice_quota_syncs_total");
    assert_contains(&metrics, "sluice_quota_active_buckets 1");
}

#[tokio::test]
async fn two_replicas_on_one_redis_share_buckets_and_the_fleet() {
    two_replicas_share_buckets_and_the_fleet(false).await;
}

#[tokio::test]
async fn two_replicas_on_a_redis_cluster_share_buckets_and_the_fleet() {
    two_replicas_share_buckets_and_the_fleet(true).await;
}

async fn two_replicas_share_buckets_and_the_fleet(cluster: bool) {
    let Some((redis, db)) = on_redis(cluster).await else {
        return;
    };
    let (one, two) = (
        replica(&db, &redis.url()).await,
        replica(&db, &redis.url()).await,
    );
    let proxy = db.token(Role::Proxy).await;
    warmed_up(&one, &proxy).await;

    sync(&one, &proxy, "edge-1", "00000000000000d1", 0).await;
    tokio::time::sleep(young()).await;
    let started = Instant::now();
    let first = sync(&one, &proxy, "edge-1", "00000000000000d1", 80).await;
    let second = sync(&two, &proxy, "edge-2", "00000000000000d1", 80).await;
    let elapsed = started.elapsed().as_secs_f64();
    let (a, b) = (granted(&first), granted(&second));
    assert_eq!(a, 80);
    let ceiling = 100 + (10.0 * elapsed).floor() as u64;
    assert!(a + b <= ceiling, "granted {a} + {b} of at most {ceiling}");
    // The rest of the burst, less one interval's refill kept for demand shares.
    assert!(b >= 20 - 5, "{second}");
    assert_eq!(
        second["fleet_size"],
        json!(3),
        "the probe, edge-1 and edge-2"
    );

    // Concurrent syncs through both replicas never grant a token twice.
    let burst = |api: TestApp, proxy: String, name: &'static str| async move {
        let mut total = 0;
        for _ in 0..5 {
            total += granted(&sync(&api, &proxy, name, "00000000000000d2", 30).await);
        }
        total
    };
    sync(&one, &proxy, "edge-1", "00000000000000d2", 0).await;
    tokio::time::sleep(young()).await;
    let started = Instant::now();
    let (x, y) = tokio::join!(
        burst(one.clone(), proxy.clone(), "edge-1"),
        burst(two.clone(), proxy.clone(), "edge-2")
    );
    let ceiling = 100 + (10.0 * started.elapsed().as_secs_f64()).floor() as u64;
    assert!(x + y <= ceiling, "granted {x} + {y} of at most {ceiling}");
    assert!(x + y >= 100, "the whole burst was asked for: {x} + {y}");

    let metrics = two.metrics().await;
    assert_contains(&metrics, "sluice_quota_redis_commands_total");
}

#[tokio::test]
async fn concurrent_syncs_on_one_replica_are_settled_together_and_never_grant_twice() {
    concurrent_syncs_are_settled_together_and_never_grant_twice(false).await;
}

/// The same on a cluster, where a batch's commands go out as one pipeline per hash slot.
#[tokio::test]
async fn concurrent_syncs_on_a_redis_cluster_are_settled_together_and_never_grant_twice() {
    concurrent_syncs_are_settled_together_and_never_grant_twice(true).await;
}

async fn concurrent_syncs_are_settled_together_and_never_grant_twice(cluster: bool) {
    let Some((redis, db)) = on_redis(cluster).await else {
        return;
    };
    let api = replica(&db, &redis.url()).await;
    let proxy = db.token(Role::Proxy).await;
    warmed_up(&api, &proxy).await;

    // Twenty proxies share the same fifty buckets, each asking for 30 of every 100.
    const PROXIES: usize = 20;
    let buckets: Vec<String> = (0..50).map(|i| format!("{:016x}", 0xe000 + i)).collect();
    let body = |name: &str, want: u64| {
        let buckets: Vec<Value> = buckets.iter().map(|id| bucket(id, want)).collect();
        sync_body(name, json!(buckets))
    };
    sync_request(&api, &proxy)
        .json(&body("probe", 0))
        .expect(200)
        .await;
    tokio::time::sleep(young()).await;
    let commands_before = redis_commands(&api).await;
    let started = Instant::now();
    let mut syncs = tokio::task::JoinSet::new();
    for i in 0..PROXIES {
        let (api, proxy, body) = (api.clone(), proxy.clone(), body(&format!("edge-{i}"), 30));
        syncs.spawn(async move {
            let answer: Value = sync_request(&api, &proxy)
                .json(&body)
                .expect(200)
                .await
                .json();
            answer
        });
    }
    let answers = syncs.join_all().await;
    let ceiling = 100 + (10.0 * started.elapsed().as_secs_f64()).floor() as u64;
    for (b, id) in buckets.iter().enumerate() {
        let total: u64 = answers
            .iter()
            .map(|a| a["grants"][b]["granted"].as_u64().unwrap())
            .sum();
        assert!(
            total <= ceiling,
            "bucket {id}: granted {total} of at most {ceiling}"
        );
        assert!(
            total >= 100 - 5,
            "bucket {id}: the burst was asked for, {total} granted"
        );
    }
    // One at a time, the twenty syncs would cost 2 commands per bucket each, 2,000 in all
    // beside the fleet's few; settled together, each batch reads and writes each bucket
    // once, a hash-tag group of buckets in one command.
    let commands = redis_commands(&api).await - commands_before;
    assert!(
        commands < 2 * 50 * PROXIES as u64,
        "{commands} Redis commands"
    );
}

/// `sluice_quota_redis_commands_total` as `/metrics` says it.
async fn redis_commands(api: &TestApp) -> u64 {
    let metrics = api.metrics().await;
    metrics
        .lines()
        .find_map(|line| line.strip_prefix("sluice_quota_redis_commands_total "))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or_else(|| panic!("no Redis command count: {metrics}"))
}

/// The bucket [`drain`] and [`check_rebuilt`] use.
const DRAINED: &str = "00000000000000d1";

/// Warms `api` up and has proxy `edge-1` lease the whole of a new bucket: returns how long
/// the fleet's bucket then takes to fill, in ms as the answer said, and when it said so.
async fn drain(api: &TestApp, token: &str) -> (u64, Instant) {
    warmed_up(api, token).await;
    sync(api, token, "edge-1", DRAINED, 100).await;
    tokio::time::sleep(young()).await;
    let answer = sync(api, token, "edge-1", DRAINED, 100).await;
    let drained_at = Instant::now();
    assert!(granted(&answer) >= 90, "{answer}");
    let full_in_ns = answer["grants"][0]["full_in_ns"].as_u64().unwrap();
    (full_in_ns.div_ceil(1_000_000), drained_at)
}

/// Issue #33: after `api`'s coordinator lost its state, `edge-1` (on fallback shares, its
/// syncs failed or answered "warming up") reports the level it last heard, counted down:
/// the bucket is rebuilt at it, not young (it is not new to the fleet), and once warmed
/// up grants only what refilled since the drain, never a fresh burst.
async fn check_rebuilt(api: &TestApp, token: &str, (full_in_ms, drained_at): (u64, Instant)) {
    let reported = full_in_ms.saturating_sub(drained_at.elapsed().as_millis() as u64);
    assert!(reported > 0, "the bucket refilled before the test went on");
    let mut knowing = bucket(DRAINED, 100);
    knowing["full_in_ms"] = json!(reported);
    let answer = sync_request(api, token)
        .json(&sync_body("edge-1", json!([knowing])))
        .expect(200)
        .await
        .json();
    assert_eq!(answer["warming_up"], json!(true), "{answer}");
    let grant = &answer["grants"][0];
    assert_eq!(grant["full_in_ns"], json!(reported * 1_000_000), "{answer}");
    assert_eq!(grant["young"], json!(false), "{answer}");

    warmed_up(api, token).await;
    let answer = sync(api, token, "edge-1", DRAINED, 100).await;
    // 10/s since the drain, and a token of rounding; a bucket started full would grant
    // the whole burst of 100.
    let refilled = (drained_at.elapsed().as_secs_f64() * 10.0).ceil() as u64 + 1;
    assert!(
        granted(&answer) <= refilled.min(99),
        "at most the {refilled} refilled since the drain: {answer}"
    );
}

#[tokio::test]
async fn a_restarted_coordinator_rebuilds_a_bucket_from_the_level_proxies_report() {
    let (db, api) = app().await;
    let proxy = db.token(Role::Proxy).await;
    let drained = drain(&api, &proxy).await;
    // A new process over the same database: its buckets start empty, and it warms up.
    let restarted = TestApp::new(&db).await;
    check_rebuilt(&restarted, &proxy, drained).await;
}

#[tokio::test]
async fn an_emptied_redis_is_rebuilt_from_the_level_proxies_report() {
    let Some((redis, db)) = with_redis().await else {
        return;
    };
    let api = replica(&db, &redis.url()).await;
    let proxy = db.token(Role::Proxy).await;
    let drained = drain(&api, &proxy).await;
    redis
        .cli(&["FLUSHALL"])
        .unwrap_or_else(|err| panic!("{err:#}"));
    check_rebuilt(&api, &proxy, drained).await;
}

#[tokio::test]
async fn a_redis_outage_answers_at_once_and_recovery_warms_up() {
    let Some((mut redis, db)) = with_redis().await else {
        return;
    };
    let api = replica(&db, &redis.url()).await;
    let proxy = db.token(Role::Proxy).await;
    warmed_up(&api, &proxy).await;
    poll_as(&api, &proxy, "edge-1").await;
    sync(&api, &proxy, "edge-1", "00000000000000e1", 1).await;
    let before = global_sync_of(&api, "edge-1").await;
    assert_eq!(before["on_fallback"], json!(false), "{before}");

    redis.kill();
    let asked = Instant::now();
    let refused = sync_request(&api, &proxy)
        .json(&sync_body("edge-1", json!([bucket("00000000000000e1", 5)])))
        .expect(503)
        .await;
    // The connection and response timeouts are one second each: a proxy's sync is never
    // held for long, and the proxy keeps to its fallback shares meanwhile.
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "{:?}",
        asked.elapsed()
    );
    assert!(refused.text().contains("Redis"), "{}", refused.text());
    // The proxy now keeps to its fallback shares, and the API says so.
    let during = global_sync_of(&api, "edge-1").await;
    assert_eq!(during["on_fallback"], json!(true), "{during}");
    assert_eq!(
        api.read("/api/v1/metrics/overview").await["proxies"]["on_fallback"],
        json!(1)
    );

    // Redis comes back empty (no persistence): the coordinator reconnects by itself and
    // warms up, because leases granted before may still be spent.
    redis.restart();
    let deadline = Instant::now() + PATIENCE;
    let answer = loop {
        let response = sync_request(&api, &proxy)
            .json(&sync_body("edge-1", json!([bucket("00000000000000e1", 5)])))
            .send()
            .await;
        if response.status == axum::http::StatusCode::OK {
            break response.json();
        }
        assert!(Instant::now() < deadline, "no answer after Redis came back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(answer["warming_up"], json!(true), "{answer}");
    assert_eq!(granted(&answer), 0);
    let during_warm_up = global_sync_of(&api, "edge-1").await;
    assert_eq!(
        during_warm_up["on_fallback"],
        json!(true),
        "no grants while warming up: {during_warm_up}"
    );
    warmed_up(&api, &proxy).await;
    sync(&api, &proxy, "edge-1", "00000000000000e1", 1).await;
    let after = global_sync_of(&api, "edge-1").await;
    assert_eq!(
        after["on_fallback"],
        json!(false),
        "answered again: {after}"
    );
}

#[tokio::test]
async fn the_proxies_list_says_when_each_proxy_last_synced() {
    let (db, api) = app().await;
    let proxy = db.token(Role::Proxy).await;
    poll_as(&api, &proxy, "edge-1").await;
    poll_as(&api, &proxy, "edge-2").await;
    warmed_up(&api, &proxy).await;
    sync(&api, &proxy, "edge-1", "00000000000000a1", 1).await;
    let synced = global_sync_of(&api, "edge-1").await;
    assert_eq!(synced["on_fallback"], json!(false), "{synced}");
    assert_eq!(synced["interval_ms"], json!(500));
    assert!(synced["last_answered"].is_string(), "{synced}");
    assert_eq!(
        global_sync_of(&api, "edge-2").await,
        Value::Null,
        "edge-2 never synced"
    );
}

#[tokio::test]
async fn the_openapi_document_describes_the_sync() {
    let (_db, api) = app().await;
    let doc = api.openapi().await;
    let op = &doc["paths"]["/api/v1/quota/sync"]["post"];
    assert_eq!(op["tags"], json!(["quota"]));
    let schemas = &doc["components"]["schemas"];
    for name in ["SyncRequest", "BucketUsage", "SyncResponse", "Grant"] {
        assert!(schemas[name].is_object(), "{name} missing");
    }
    assert_eq!(
        schemas["BucketUsage"]["properties"]["bucket"]["type"],
        json!("string")
    );
}

/// A replica that has not heard of the newest ruleset version yet asks the store before
/// refusing a limit: a legitimate proxy that already runs the new rule is not refused.
#[tokio::test]
async fn a_replica_behind_the_newest_rules_asks_the_store_before_refusing() {
    let (db, api) = app().await;
    let behind = TestApp::new(&db).await;
    let proxy = db.token(Role::Proxy).await;
    // `behind` reads the rules of version 1.
    sync(&behind, &proxy, "edge-1", "0a", 1).await;
    api.create(&json!({"name": "later", "key": "global",
        "limits": [{"requests": 20, "period": "second", "burst": 40, "scope": "global"}]}))
        .await;
    let new_limit =
        json!({"bucket": "0b", "interval_ns": 50_000_000, "burst": 40, "attempts": 1, "want": 1});
    sync_request(&behind, &proxy)
        .json(&sync_body("edge-1", json!([new_limit])))
        .expect(200)
        .await;
    assert!(
        !behind
            .metrics()
            .await
            .contains("sluice_quota_refused_total{reason=\"unknown_limit\"}"),
        "nothing was refused"
    );
}

/// `sluice_quota_refused_total{reason}` as `/metrics` says it (0 before the first).
async fn refused_for(api: &TestApp, reason: &str) -> u64 {
    let key = format!("sluice_quota_refused_total{{reason=\"{reason}\"}} ");
    let metrics = api.metrics().await;
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(&key))
        .map_or(0, |n| n.trim().parse().unwrap())
}

/// With Redis, the coordinator keeps the same bounds as in memory: buckets in all and
/// created per proxy id, counted across replicas, the rest answered with nothing granted
/// and counted; buckets whose keys expired free their room.
#[tokio::test]
async fn redis_keeps_the_bucket_bounds_across_replicas_and_expiry_frees_room() {
    bucket_bounds_hold_across_replicas_and_expiry_frees_room(false).await;
}

/// The same on a cluster, where the sorted sets that count buckets are in other hash
/// slots than the buckets.
#[tokio::test]
async fn a_redis_cluster_keeps_the_bucket_bounds_across_replicas_and_expiry_frees_room() {
    bucket_bounds_hold_across_replicas_and_expiry_frees_room(true).await;
}

async fn bucket_bounds_hold_across_replicas_and_expiry_frees_room(cluster: bool) {
    let Some((redis, db)) = on_redis(cluster).await else {
        return;
    };
    let bounds = quota::guard::Bounds {
        max_buckets: 5,
        max_buckets_per_proxy: 3,
    };
    let (one, two) = (
        replica(&db, &redis.url()).await,
        replica(&db, &redis.url()).await,
    );
    one.state.set_quota_bounds(bounds);
    two.state.set_quota_bounds(bounds);
    let proxy = db.token(Role::Proxy).await;
    warmed_up(&one, &proxy).await;
    // At the shortest interval (50 ms) an idle bucket's key lasts 2 s (ten demand time
    // constants of four intervals).
    let body = |name: &str, ids: &[u64]| {
        let buckets: Vec<Value> = ids
            .iter()
            .map(|i| bucket(&format!("{i:016x}"), 0))
            .collect();
        json!({"proxy": name, "interval_ms": 50, "covers_ms": 50, "buckets": buckets})
    };
    let send = |api: &TestApp, b: Value| {
        let request = sync_request(api, &proxy).json(&b).expect(200);
        async move { request.await.json() }
    };
    let a: Value = send(&one, body("a", &[1, 2, 3, 4])).await;
    assert_eq!(
        a["grants"].as_array().unwrap().len(),
        4,
        "every bucket answered"
    );
    assert_eq!(a["grants"][3]["granted"], 0);
    assert_eq!(a["grants"][3]["young"], true);
    assert_eq!(
        refused_for(&one, "max_buckets_per_proxy").await,
        1,
        "a's fourth"
    );

    // b shares a's bucket 1 (not new) and brings three new ones: two fit in all.
    send(&two, body("b", &[1, 10, 11, 12])).await;
    assert_eq!(
        refused_for(&two, "max_buckets").await,
        1,
        "counted on the other replica"
    );
    assert_contains(&two.metrics().await, "sluice_quota_active_buckets 5");
    send(&one, body("c", &[20])).await;
    assert_eq!(
        refused_for(&one, "max_buckets").await,
        1,
        "full for every replica"
    );

    // Nobody syncs them: their keys expire, and a new bucket fits again.
    let deadline = Instant::now() + PATIENCE;
    for id in 100.. {
        let before = refused_for(&one, "max_buckets").await;
        send(&one, body("c", &[id])).await;
        if refused_for(&one, "max_buckets").await == before {
            break;
        }
        assert!(Instant::now() < deadline, "the idle buckets never expired");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_contains(&one.metrics().await, "sluice_quota_active_buckets 1");
}
