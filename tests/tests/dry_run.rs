//! A rule dry run against recorded traffic, with a real Envoy reporting to a real admin API:
//! traffic recorded under a loose rule, a tighter version of the rule dry-run against it,
//! then applied, and the same traffic replayed. The estimate must be within 10% of what
//! the replay really gets throttled, and name the same number of throttled clients.
//!
//! The traffic pattern is laid out in the admin API's 10 s buckets (aligned to the wall
//! clock, as the server's are): in each bucket every client sends at its own rate for
//! [`ACTIVE`] (a burst, a steady stream, a pause), so that the reports covering it (every
//! 2 s) all end inside the bucket. A sender that falls behind catches up within the
//! bucket, so each client sends exactly its planned count however busy the machine is.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use sluice_tests::{AdminServer, Client, Envoy, EnvoyOptions, Method, Req, wait_for};

const BUCKET_MS: u64 = 10_000;
/// When a client starts sending in a bucket, and for how long.
const OFFSET: Duration = Duration::from_millis(500);
const ACTIVE: Duration = Duration::from_secs(5);
/// How often the sender tops each client up to its planned count.
const TICK: Duration = Duration::from_millis(100);
const CONNECTIONS: usize = 16;

/// Requests a second per client in each bucket: a steady heavy client, one bursting every
/// other bucket, one pausing for two buckets, and a light one the tight rule never limits.
const PATTERN: [(&str, [u64; 6]); 4] = [
    ("steady", [40, 40, 40, 40, 40, 40]),
    ("bursty", [80, 0, 80, 0, 80, 0]),
    ("pausing", [30, 30, 0, 0, 30, 30]),
    ("light", [2, 2, 2, 2, 2, 2]),
];

fn rule(requests: u64, burst: u64) -> Value {
    json!({
        "name": "dry-run", "key": {"header": "x-api-key"},
        "match": {"path_prefix": "/dry"},
        "limits": [{"requests": requests, "period": "second", "burst": burst}]
    })
}

fn now_ms() -> u64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    u64::try_from(since.as_millis()).unwrap()
}

/// Sleeps until `OFFSET` into the next 10 s bucket, then plays `PATTERN` bucket after
/// bucket. Returns, per client, the requests sent and those answered 429.
fn play(client: &Client) -> BTreeMap<&'static str, (u64, u64)> {
    let mut totals: BTreeMap<&str, (u64, u64)> =
        PATTERN.iter().map(|(c, _)| (*c, (0, 0))).collect();
    let first = (now_ms() / BUCKET_MS + 1) * BUCKET_MS;
    for bucket in 0..PATTERN[0].1.len() {
        let start = first + bucket as u64 * BUCKET_MS + OFFSET.as_millis() as u64;
        std::thread::sleep(Duration::from_millis(start.saturating_sub(now_ms())));
        let began = Instant::now();
        let mut sent: BTreeMap<&str, u64> = BTreeMap::new();
        loop {
            let elapsed = began.elapsed().min(ACTIVE);
            let mut batch = Vec::new();
            for (name, rates) in PATTERN {
                let due = (rates[bucket] as f64 * elapsed.as_secs_f64()).round() as u64;
                let done = sent.entry(name).or_default();
                for _ in *done..due {
                    batch.push((name, Req::get("/dry/x").header("x-api-key", name)));
                }
                *done = due.max(*done);
            }
            let (names, requests): (Vec<&str>, Vec<Req>) = batch.into_iter().unzip();
            for (name, response) in names.into_iter().zip(client.run(requests)) {
                assert!(matches!(response.status, 200 | 429), "{response:?}");
                let total = totals.get_mut(name).unwrap();
                total.0 += 1;
                total.1 += u64::from(response.status == 429);
            }
            if elapsed >= ACTIVE {
                break;
            }
            std::thread::sleep(TICK.saturating_sub(began.elapsed().saturating_sub(elapsed)));
        }
    }
    totals
}

fn estimate(admin: &AdminServer, spec: &Value) -> Value {
    let (status, body) = admin.call(Method::POST, "/api/v1/rules:estimate", Some(spec.clone()));
    assert_eq!(status, 200, "{body}");
    body
}

#[test]
fn a_dry_run_estimates_within_ten_percent_what_the_same_traffic_then_gets_throttled() {
    let admin = AdminServer::start();
    let proxy_token = admin.create_token("proxy", "dry-run-envoy");
    let envoy = Envoy::start(EnvoyOptions {
        admin: Some(admin.connection(&proxy_token, "dry-run-proxy")),
        ..Default::default()
    });
    let (status, body) = admin.call(Method::POST, "/api/v1/rules", Some(rule(10_000, 10_000)));
    assert_eq!(status, 201, "{body}");
    let client = Client::connect(envoy.listener_addr(), CONNECTIONS);
    wait_for(
        "the rule to reach the proxy",
        Duration::from_secs(10),
        || envoy.counter("wasmcustom.sluice_control_ruleset_version") >= 1,
    );

    // A rule nobody has sent traffic under: said plainly, nothing estimated.
    let elsewhere = json!({
        "name": "elsewhere", "key": {"header": "x-api-key"},
        "match": {"path_prefix": "/nobody"},
        "limits": [{"requests": 1, "period": "second"}]
    });
    let none = estimate(&admin, &elsewhere);
    assert_eq!(none["traffic_of"], Value::Null, "{none}");
    assert_eq!(none["throttled_requests"], 0, "{none}");

    let recorded = play(&client);
    let sent: u64 = recorded.values().map(|(n, _)| n).sum();
    assert_eq!(
        recorded.values().map(|(_, t)| t).sum::<u64>(),
        0,
        "the loose rule throttles nothing"
    );

    // Dry runs of the tight rule: the same id (a changed rule) and, with another name, a
    // new rule with the same match and key. Once every report is in, the rule's request
    // count is exactly what was sent.
    let tight = rule(2, 20);
    let mut dry = Value::Null;
    wait_for(
        "the reports of the recording",
        Duration::from_secs(20),
        || {
            dry = estimate(&admin, &tight);
            dry["requests"] == sent
        },
    );
    assert_eq!(dry["traffic_of"], "dry-run", "{dry}");
    assert_eq!(dry["replayed_clients"], 4, "every client is tracked: {dry}");
    assert_eq!(dry["untracked_requests"], 0, "{dry}");
    let mut renamed = tight.clone();
    renamed["name"] = json!("dry-run-copy");
    let copy = estimate(&admin, &renamed);
    assert_eq!(copy["traffic_of"], "dry-run", "{copy}");
    assert_eq!(copy["throttled_requests"], dry["throttled_requests"]);

    // The same through a dry-run apply, as `sluice rules apply --dry-run` shows it.
    let (status, summary) = admin.call(
        Method::POST,
        "/api/v1/rules:apply?dry_run=true",
        Some(json!([tight.clone()])),
    );
    assert_eq!(status, 200, "{summary}");
    assert_eq!(summary["updated"], json!(["dry-run"]), "{summary}");
    assert_eq!(
        summary["estimates"][0]["throttled_requests"], dry["throttled_requests"],
        "{summary}"
    );

    // Apply it, and replay the same traffic.
    let (status, body) = admin.call(Method::PUT, "/api/v1/rules/dry-run", Some(tight));
    assert_eq!(status, 200, "{body}");
    wait_for(
        "the tight rule to reach the proxy",
        Duration::from_secs(10),
        || envoy.counter("wasmcustom.sluice_control_ruleset_version") >= 2,
    );
    let replayed = play(&client);
    let replay_sent: u64 = replayed.values().map(|(n, _)| n).sum();
    assert_eq!(replay_sent, sent, "the same traffic");
    let throttled: u64 = replayed.values().map(|(_, t)| t).sum();
    let throttled_clients = replayed.values().filter(|(_, t)| *t > 0).count() as u64;
    let estimated = dry["throttled_requests"].as_u64().unwrap();
    println!(
        "sent {sent} twice; estimated {estimated} throttled, replay throttled {throttled}: {replayed:?}"
    );
    assert!(throttled > sent / 2, "the tight rule binds: {replayed:?}");
    let error = (estimated as f64 - throttled as f64).abs() / throttled as f64;
    assert!(
        error <= 0.10,
        "estimate {estimated} vs {throttled} throttled ({:.1}% off): {dry}",
        error * 100.0
    );
    assert_eq!(
        dry["throttled_clients"], throttled_clients,
        "{dry} {replayed:?}"
    );
    assert_eq!(
        replayed["light"].1, 0,
        "the light client is never throttled"
    );
}
