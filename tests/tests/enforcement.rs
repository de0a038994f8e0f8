//! The filter enforcing token buckets in a real Envoy with two workers.
//!
//! Every test starts its own Envoy (listener and admin on loopback, port 0) with the built
//! filter; loads are bounded in request count and time. Load that must last runs for a
//! duration, and assertions allow for what refills while a slow machine sends a burst, so
//! the tests pass on an idle machine and on one busy core alike.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sluice_tests::{Client, Envoy, EnvoyOptions, Req, Resp, Upstream};

/// Connections per test client: enough that the kernel spreads them over both workers.
const CONNECTIONS: usize = 16;

fn envoy_with(rules: Value) -> Envoy {
    Envoy::start(EnvoyOptions {
        rules,
        ..Default::default()
    })
}

fn statuses(responses: &[Resp]) -> (usize, usize) {
    let ok = responses.iter().filter(|r| r.status == 200).count();
    let limited = responses.iter().filter(|r| r.status == 429).count();
    assert_eq!(
        ok + limited,
        responses.len(),
        "only 200 and 429 expected: {responses:?}"
    );
    (ok, limited)
}

fn keyed(path: &str, key: &str) -> Req {
    Req::get(path).header("x-api-key", key)
}

/// Both workers must have served connections, or a test of "one limit across workers"
/// proves nothing.
fn assert_both_workers_served(envoy: &Envoy) {
    let per_worker = envoy.worker_downstream_connections();
    assert!(
        per_worker.len() >= 2 && per_worker.iter().all(|&c| c > 0),
        "connections per worker: {per_worker:?}"
    );
}

#[test]
fn concurrent_clients_on_both_workers_get_exactly_the_burst() {
    // A refill of one token a minute is negligible over the test: exactly the burst passes.
    let envoy = envoy_with(json!([{
        "name": "burst-only", "key": "global",
        "limits": [{"requests": 1, "period": "minute", "burst": 20}]
    }]));
    let client = Client::connect(envoy.listener_addr(), CONNECTIONS);
    let responses = client.run((0..200).map(|_| Req::get("/anything")));
    assert_eq!(statuses(&responses), (20, 180));
    assert_both_workers_served(&envoy);
    assert_eq!(envoy.counter("wasmcustom.sluice_allowed_total"), 20);
    assert_eq!(envoy.counter("wasmcustom.sluice_denied_total"), 180);
    assert_eq!(envoy.counter("wasmcustom.sluice_fail_open_total"), 0);
}

#[test]
fn sustained_load_admits_burst_plus_rate_times_elapsed_and_never_more() {
    const RATE: f64 = 100.0;
    // A burst of a whole second of refill: the client would have to stall for longer than
    // that, with the bucket full, before a refill could go unused and count against the
    // lower bound. A stall that short is normal on a busy machine.
    const BURST: f64 = 100.0;
    let envoy = envoy_with(json!([{
        "name": "steady", "key": "global",
        "limits": [{"requests": 100, "period": "second", "burst": 100}]
    }]));
    let client = Client::connect(envoy.listener_addr(), CONNECTIONS);
    // A duration, not a count: the bucket stays drained for as long on a fast machine as on
    // a slow one.
    let counts = client.run_for(Duration::from_secs(3), |_| Req::get("/steady"));
    assert_eq!(counts.total.errors, 0, "{:?}", counts.total.first_error);
    let admitted = counts.total.get(200) as f64;
    let denied = counts.total.get(429) as f64;
    assert!(
        denied > admitted,
        "the load must keep the bucket drained (demand well above the rate): {counts:?}"
    );
    // Every decision fell inside the client's outer window, so this is a hard ceiling.
    let ceiling = BURST + RATE * counts.elapsed.as_secs_f64();
    assert!(
        admitted <= ceiling,
        "over-admission: {admitted} admitted, at most {ceiling:.1} allowed in {:.3} s",
        counts.elapsed.as_secs_f64()
    );
    // Envoy was deciding this run's requests at least from the first response to the last
    // request sent, with the bucket drained throughout: falling more than 1% (plus a token
    // for rounding) short of what refilled then would mean refills are lost.
    let floor = BURST + RATE * counts.total.busy().as_secs_f64();
    assert!(
        admitted >= floor * 0.99 - 1.0,
        "under-admission: {admitted} admitted, at least {floor:.1} refilled in {:.3} s",
        counts.total.busy().as_secs_f64()
    );
    assert_both_workers_served(&envoy);
}

/// Tokens a bucket refilling `rate` per second can gain in `elapsed`, rounded up: how far a
/// count may exceed the exact figure when the machine is slow enough for refills to happen
/// during a burst.
fn refills(rate: f64, elapsed: Duration) -> usize {
    (rate * elapsed.as_secs_f64()).ceil() as usize
}

#[test]
fn the_documented_rule_gives_each_key_its_own_buckets_and_tiers() {
    let envoy = envoy_with(json!([{
        "name": "api-per-key", "match": {"path_prefix": "/api/"}, "key": {"header": "x-api-key"},
        "limits": [{"requests": 5, "period": "second", "burst": 10}, {"requests": 12, "period": "minute"}],
        "mode": "enforce"
    }]));
    let client = Client::connect(envoy.listener_addr(), CONNECTIONS);
    // Thirty requests at once against a burst of 10: exactly 10 pass, unless the machine is
    // slow enough for the 5/s tier to refill during the burst.
    let burst = |key: &'static str| {
        let started = Instant::now();
        let (ok, limited) = statuses(&client.run((0..30).map(move |_| keyed("/api/items", key))));
        let slack = refills(5.0, started.elapsed());
        assert!(
            (10..=10 + slack).contains(&ok),
            "{key}: {ok} of 30 passed (burst 10, up to {slack} refilled meanwhile)"
        );
        assert_eq!(ok + limited, 30);
        ok
    };
    let started = Instant::now();
    let alice_first = burst("alice");
    burst("bob");
    assert_eq!(
        statuses(&client.run((0..30).map(|_| keyed("/public", "alice")))),
        (30, 0),
        "the rule matches /api/ only"
    );
    assert_eq!(
        statuses(&client.run((0..5).map(|_| Req::get("/api/items")))),
        (5, 0),
        "no key, no limit"
    );
    assert_eq!(envoy.counter("wasmcustom.sluice_key_missing_total"), 5);

    // A second later the per-second tier holds 5 more tokens, but the minute tier only what
    // is left of its 12 (2 after a burst of 10), plus its refill of 12/min since the start.
    std::thread::sleep(Duration::from_millis(1_100));
    let (ok, _) = statuses(&client.run((0..30).map(|_| keyed("/api/items", "alice"))));
    let left = 12 - alice_first.min(12);
    let slack = refills(12.0 / 60.0, started.elapsed());
    assert!(
        (left..=left + slack).contains(&ok),
        "{ok} passed; the minute tier had {left} left and refilled up to {slack}"
    );
    let denied = client.send(keyed("/api/items", "alice"));
    assert!(
        denied
            .header("ratelimit")
            .unwrap()
            .starts_with(r#""api-per-key/2";r=0;t="#),
        "the minute tier is the one that binds: {denied:?}"
    );
}

#[test]
fn weighted_costs_take_several_tokens_and_a_denial_takes_none() {
    let envoy = envoy_with(json!([{
        "name": "bulk", "key": {"header": "x-api-key"},
        "limits": [{"requests": 10, "period": "minute"}],
        "cost": {"header": {"name": "x-cost", "max": 8}}
    }]));
    let client = Client::connect(envoy.listener_addr(), 1);
    let send = |cost: &str| {
        client
            .send(keyed("/bulk", "k").header("x-cost", cost))
            .status
    };
    assert_eq!(send("6"), 200);
    assert_eq!(send("6"), 429, "6 + 6 exceeds 10");
    assert_eq!(send("4"), 200, "the denied request consumed nothing");
    assert_eq!(send("50"), 429, "capped at 8, still more than is left");
    assert_eq!(
        client
            .send(keyed("/bulk", "other").header("x-cost", "50"))
            .status,
        200,
        "capped at 8 of 10"
    );
}

#[test]
fn shadow_rules_never_deny_and_tell_the_upstream() {
    let upstream = Upstream::start();
    let envoy = Envoy::start(EnvoyOptions {
        rules: json!([{ "name": "trial", "mode": "shadow", "key": "global", "limits": [{"requests": 3, "period": "minute"}] }]),
        upstream: upstream.target(),
        ..Default::default()
    });
    let client = Client::connect(envoy.listener_addr(), 1);
    // A client cannot forge the header: it is removed unless the filter sets it.
    let responses =
        client.run((0..8).map(|_| Req::get("/x").header("x-sluice-shadow-denied", "forged")));
    let seen: Vec<Option<String>> = responses
        .iter()
        .map(|r| {
            assert_eq!(r.status, 200, "{r:?}");
            assert!(
                r.header("ratelimit").is_none(),
                "shadow rules stay invisible to clients"
            );
            r.upstream_header("x-sluice-shadow-denied")
        })
        .collect();
    let expected: Vec<Option<String>> = (0..8)
        .map(|i| (i >= 3).then(|| "trial".to_string()))
        .collect();
    assert_eq!(seen, expected);
    assert_eq!(envoy.counter("wasmcustom.sluice_shadow_denied_total"), 5);
    assert_eq!(envoy.counter("wasmcustom.sluice_denied_total"), 0);
}

#[test]
fn every_rate_limit_header_and_the_problem_body_carry_exact_values() {
    let upstream = Upstream::start();
    let envoy = Envoy::start(EnvoyOptions {
        rules: json!([{
            "name": "api-per-key", "match": {"path_prefix": "/api/"}, "key": {"header": "x-api-key"},
            "limits": [{"requests": 5, "period": "second", "burst": 10}, {"requests": 100, "period": "minute"}]
        }]),
        upstream: upstream.target(),
        plugin_settings: json!({"rate_limit_headers": "both"}),
        ..Default::default()
    });
    let client = Client::connect(envoy.listener_addr(), 1);
    let first = client.send(keyed("/api/items", "hdr"));
    assert_eq!(first.status, 200);
    assert_eq!(first.json()["path"], "/api/items", "came from the upstream");
    // A burst of 10 at 5/s: every field reads against the capacity, 10 tokens that
    // refill from empty in 2 s, so `remaining` never exceeds the limit beside it.
    assert_eq!(
        first.header("ratelimit-policy"),
        Some(r#""api-per-key/1";q=10;w=2, "api-per-key/2";q=100;w=60"#)
    );
    assert_eq!(
        first.header("ratelimit"),
        Some(r#""api-per-key/1";r=9;t=1"#)
    );
    assert_eq!(first.header("x-ratelimit-limit"), Some("10"));
    assert_eq!(first.header("x-ratelimit-remaining"), Some("9"));
    assert_eq!(first.header("x-ratelimit-reset"), Some("1"));

    client.run((0..9).map(|_| keyed("/api/items", "hdr")));
    let denied = client.send(keyed("/api/items", "hdr"));
    assert_eq!(denied.status, 429);
    assert_eq!(denied.header("retry-after"), Some("1"));
    assert_eq!(
        denied.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(
        denied.header("ratelimit"),
        Some(r#""api-per-key/1";r=0;t=1"#)
    );
    assert_eq!(denied.header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(denied.header("x-ratelimit-reset"), Some("1"));
    let body = denied.json();
    assert_eq!(body["status"], 429);
    assert_eq!(body["rule"], "api-per-key");
    assert_eq!(body["retry_after"], 1);
    assert_eq!(body["title"], "Too Many Requests");
    assert!(
        body["detail"].as_str().unwrap().contains("api-per-key"),
        "{body}"
    );
    assert_eq!(
        upstream.requests_seen(),
        10,
        "denied requests never reach the upstream"
    );
}

#[test]
fn the_proxy_chooses_which_rate_limit_fields_to_send() {
    let rules = json!([{
        "name": "fields", "key": {"header": "x-api-key"},
        "limits": [{"requests": 1, "period": "minute"}]
    }]);
    let names = |setting: Option<Value>| -> Vec<(bool, bool)> {
        let envoy = Envoy::start(EnvoyOptions {
            rules: rules.clone(),
            plugin_settings: setting.map_or(json!({}), |s| json!({"rate_limit_headers": s})),
            ..Default::default()
        });
        let client = Client::connect(envoy.listener_addr(), 1);
        [keyed("/", "a"), keyed("/", "a")]
            .into_iter()
            .map(|req| {
                let r = client.send(req);
                assert!(
                    r.header("retry-after").is_some() || r.status == 200,
                    "{r:?}"
                );
                let ietf =
                    r.header("ratelimit-policy").is_some() && r.header("ratelimit").is_some();
                let x = [
                    "x-ratelimit-limit",
                    "x-ratelimit-remaining",
                    "x-ratelimit-reset",
                ]
                .iter()
                .all(|n| r.header(n).is_some());
                (ietf, x)
            })
            .collect()
    };
    // Allowed, then denied: each setting sends the same fields on both.
    assert_eq!(
        names(None),
        [(true, true); 2],
        "the default is both families, as earlier versions sent"
    );
    assert_eq!(names(Some(json!("ietf"))), [(true, false); 2]);
    assert_eq!(names(Some(json!("x"))), [(false, true); 2]);
    assert_eq!(names(Some(json!("both"))), [(true, true); 2]);
    assert_eq!(names(Some(json!("none"))), [(false, false); 2]);
    assert_eq!(
        names(Some(json!(true))),
        [(true, true); 2],
        "`true` is both, as before"
    );
    assert_eq!(names(Some(json!(false))), [(false, false); 2]);
}

#[test]
fn a_rule_can_change_the_status_and_turn_headers_off() {
    // The proxy sends every field; the rule's switch still silences all of them.
    let envoy = Envoy::start(EnvoyOptions {
        rules: json!([{
            "name": "quiet", "key": "global", "limits": [{"requests": 1, "period": "minute"}],
            "response": {"status": 503, "rate_limit_headers": false}
        }]),
        plugin_settings: json!({"rate_limit_headers": "both"}),
        ..Default::default()
    });
    let client = Client::connect(envoy.listener_addr(), 1);
    let allowed = client.send(Req::get("/"));
    assert_eq!(allowed.status, 200);
    assert!(allowed.header("ratelimit").is_none() && allowed.header("x-ratelimit-limit").is_none());
    let denied = client.send(Req::get("/"));
    assert_eq!(denied.status, 503);
    assert!(
        denied.header("retry-after").is_some(),
        "Retry-After is always sent"
    );
    assert!(denied.header("ratelimit").is_none() && denied.header("x-ratelimit-limit").is_none());
}

#[test]
fn a_malformed_configuration_passes_traffic_and_says_so() {
    for raw in [
        "{not json",
        r#"{"rules":[{"name":"bad","key":"global","limits":[{"requests":0,"period":"second"}]}]}"#,
    ] {
        let envoy = Envoy::start(EnvoyOptions {
            raw_plugin_config: Some(raw.to_string()),
            ..Default::default()
        });
        let client = Client::connect(envoy.listener_addr(), CONNECTIONS);
        let responses = client.run((0..50).map(|_| Req::get("/")));
        assert_eq!(statuses(&responses), (50, 0), "{}", envoy.log_tail());
        assert!(envoy.counter("wasmcustom.sluice_config_errors_total") >= 1);
        assert_eq!(envoy.counter("wasmcustom.sluice_fail_open_total"), 50);
        assert!(
            envoy.log().contains("passing all traffic"),
            "{}",
            envoy.log_tail()
        );
    }
}

#[test]
fn metrics_are_exported_to_prometheus() {
    let envoy = envoy_with(
        json!([{ "name": "p", "key": "global", "limits": [{"requests": 2, "period": "minute"}] }]),
    );
    let client = Client::connect(envoy.listener_addr(), 1);
    client.run((0..5).map(|_| Req::get("/")));
    // The filter hands its counts to Envoy on a timer; wait until they have settled.
    assert_eq!(envoy.counter("wasmcustom.sluice_requests_total"), 5);
    let text = envoy.admin_get("/stats/prometheus");
    let value = |name: &str| {
        text.lines()
            .find_map(|l| {
                l.strip_prefix(name)
                    .and_then(|rest| rest.trim().strip_prefix("{}").or(Some(rest.trim())))
            })
            .map(|v| v.trim().parse::<u64>().unwrap())
    };
    assert_eq!(value("sluice_requests_total"), Some(5), "{text}");
    assert_eq!(value("sluice_allowed_total"), Some(2));
    assert_eq!(value("sluice_denied_total"), Some(3));
    assert_eq!(
        value("sluice_near_limit_total"),
        Some(1),
        "only the second request left the bucket 80% used"
    );
}
