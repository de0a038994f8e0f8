//! Rules saved in the admin API are enforced by every worker of a real Envoy within a
//! second, and enforcement survives the admin API going away.
//!
//! Every worker shares one bucket, so "every worker enforces" is checked by counting:
//! with a burst of B, at most B requests pass in total across many connections spread
//! over both workers. A worker still on the old rules would let its share through.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sluice_tests::{AdminServer, Client, Envoy, EnvoyOptions, Method, Req, burst_rule, wait_for};

const CONNECTIONS: usize = 16;
/// The promise: a saved rule is enforced everywhere within this.
const PROPAGATION: Duration = Duration::from_secs(1);

fn rule(burst: u64) -> Value {
    burst_rule("pushed", "p", burst)
}

/// Sends `n` requests over many connections and returns how many passed.
fn passed(client: &Client, n: usize) -> usize {
    client.passed(&Req::get("/p/x"), n)
}

/// Waits out the rest of the propagation promise, measured from when the API answered.
fn after_propagation(saved: Instant) {
    std::thread::sleep(PROPAGATION.saturating_sub(saved.elapsed()));
}

struct Stack {
    admin: AdminServer,
    envoy: Envoy,
    client: Client,
}

fn stack() -> Stack {
    let admin = AdminServer::start();
    let proxy_token = admin.create_token("proxy", "e2e-envoy");
    let envoy = Envoy::start(EnvoyOptions {
        admin: Some(admin.connection(&proxy_token, "e2e-proxy")),
        ..Default::default()
    });
    // The control service has polled once (and holds a poll open) before the test begins.
    wait_for("the proxy to connect", Duration::from_secs(10), || {
        let (_, proxies) = admin.call(Method::GET, "/api/v1/proxies", None);
        proxies.to_string().contains("e2e-proxy")
    });
    let client = Client::connect(envoy.listener_addr(), CONNECTIONS);
    Stack {
        admin,
        envoy,
        client,
    }
}

#[test]
fn created_updated_and_deleted_rules_reach_every_worker_within_a_second() {
    let s = stack();
    assert_eq!(passed(&s.client, 20), 20, "no rules yet");

    let (status, created) = s.admin.call(Method::POST, "/api/v1/rules", Some(rule(5)));
    let saved = Instant::now();
    assert_eq!(status, 201, "{created}");
    after_propagation(saved);
    assert_eq!(
        passed(&s.client, 100),
        5,
        "created: every worker shares the 5-token bucket"
    );
    let per_worker = s.envoy.worker_downstream_connections();
    assert!(
        per_worker.iter().all(|&c| c > 0),
        "both workers served: {per_worker:?}"
    );

    // A new limit is a new bucket: a fresh burst of 30.
    let (status, body) = s
        .admin
        .call(Method::PUT, "/api/v1/rules/pushed", Some(rule(30)));
    let saved = Instant::now();
    assert_eq!(status, 200, "{body}");
    after_propagation(saved);
    assert_eq!(passed(&s.client, 100), 30, "updated");

    let (status, body) = s.admin.call(Method::DELETE, "/api/v1/rules/pushed", None);
    let saved = Instant::now();
    assert!(status == 200 || status == 204, "{status} {body}");
    after_propagation(saved);
    assert_eq!(passed(&s.client, 100), 100, "deleted: traffic flows");

    let (_, proxies) = s.admin.call(Method::GET, "/api/v1/proxies", None);
    let proxy = proxies["proxies"]
        .as_array()
        .and_then(|list| list.iter().find(|p| p["id"] == "e2e-proxy"))
        .unwrap_or_else(|| panic!("the proxy is listed: {proxies}"));
    assert_eq!(proxy["connected"], true, "{proxy}");
    assert_eq!(
        s.envoy.counter("wasmcustom.sluice_control_ruleset_version"),
        3
    );
}

#[test]
fn enforcement_continues_without_the_admin_api_and_sync_resumes_after_a_restart() {
    let mut s = stack();
    let (status, _) = s.admin.call(Method::POST, "/api/v1/rules", Some(rule(5)));
    assert_eq!(status, 201);
    after_propagation(Instant::now());

    s.admin.stop();
    assert_eq!(
        passed(&s.client, 50),
        5,
        "the last ruleset is still enforced"
    );
    // Long enough for the control service to notice and back off at least once.
    wait_for(
        "the control service to notice the outage",
        Duration::from_secs(15),
        || s.envoy.counter("wasmcustom.sluice_control_errors_total") > 0,
    );
    assert_eq!(
        passed(&s.client, 50),
        0,
        "still enforced, nothing fails open"
    );
    assert_eq!(s.envoy.counter("wasmcustom.sluice_fail_open_total"), 0);

    s.admin.restart();
    let (status, body) = s
        .admin
        .call(Method::PUT, "/api/v1/rules/pushed", Some(rule(40)));
    assert_eq!(status, 200, "{body}");
    // Backoff is at most 10 s, then the change arrives at once.
    let started = Instant::now();
    wait_for(
        "the proxy to follow the restarted admin API",
        Duration::from_secs(15),
        || s.envoy.counter("wasmcustom.sluice_control_ruleset_version") == 2,
    );
    eprintln!(
        "resynchronised {:.1} s after the restart",
        started.elapsed().as_secs_f64()
    );
    after_propagation(Instant::now());
    assert_eq!(passed(&s.client, 100), 40, "the new limit is enforced");
}

/// An Envoy started while no admin API answers enforces the static rules of its plugin
/// configuration (here a burst of 3; a configuration without rules lets everything
/// through), counts the failed polls, and switches to the pushed ruleset once an admin
/// API answers, without a restart.
#[test]
fn an_envoy_started_without_an_admin_api_enforces_its_static_rules_until_one_answers() {
    let mut admin = AdminServer::start();
    let proxy_token = admin.create_token("proxy", "e2e-envoy");
    let (status, _) = admin.call(Method::POST, "/api/v1/rules", Some(rule(7)));
    assert_eq!(status, 201);
    let connection = admin.connection(&proxy_token, "e2e-late-proxy");
    admin.stop();

    let envoy = Envoy::start(EnvoyOptions {
        rules: json!([rule(3)]),
        admin: Some(connection),
        ..Default::default()
    });
    let client = Client::connect(envoy.listener_addr(), CONNECTIONS);
    wait_for(
        "the control service to fail a poll",
        Duration::from_secs(15),
        || envoy.counter("wasmcustom.sluice_control_errors_total") > 0,
    );
    assert_eq!(
        passed(&client, 50),
        3,
        "the static rule, from the first request"
    );
    assert_eq!(
        envoy.counter("wasmcustom.sluice_control_ruleset_version"),
        0
    );

    admin.restart();
    wait_for(
        "the proxy to take the stored ruleset",
        Duration::from_secs(15),
        || envoy.counter("wasmcustom.sluice_control_ruleset_version") == 1,
    );
    after_propagation(Instant::now());
    assert_eq!(
        passed(&client, 50),
        7,
        "the pushed rule (burst 7: a new limit, so a fresh bucket) replaced the static one"
    );
}

#[test]
fn a_rollout_percentage_change_reaches_every_worker_and_splits_clients_by_their_hash() {
    let s = stack();
    let rollout = |percent: u8| {
        json!({"name": "rollout", "key": {"header": "x-api-key"}, "enforce_percent": percent,
               "limits": [{"requests": 1, "period": "hour"}]})
    };
    let keys: Vec<String> = (0..40).map(|i| format!("client-{i}")).collect();
    let passed_per_key = |key: &str| {
        s.client
            .passed(&Req::get("/anything").header("x-api-key", key), 2)
    };
    let (status, body) = s
        .admin
        .call(Method::POST, "/api/v1/rules", Some(rollout(0)));
    assert_eq!(status, 201, "{body}");
    after_propagation(Instant::now());
    for key in &keys {
        assert_eq!(passed_per_key(key), 2, "enforced for nobody: shadow mode");
    }
    let shadowed = s.envoy.counter("wasmcustom.sluice_rollout_shadow_total");
    assert_eq!(shadowed, 2 * keys.len() as u64);

    let (status, body) = s
        .admin
        .call(Method::PUT, "/api/v1/rules/rollout", Some(rollout(50)));
    let saved = Instant::now();
    assert_eq!(status, 200, "{body}");
    after_propagation(saved);
    // Every key drained its bucket in shadow mode (the limits did not change, so neither
    // did the buckets): an enforced key now gets nothing, a shadowed one everything. Which
    // is which is the hash every Envoy computes.
    let mut enforced = 0;
    for key in &keys {
        let in_rollout = sluice_core::hash::rollout_point("rollout", key) < 5_000;
        enforced += usize::from(in_rollout);
        let expected = if in_rollout { 0 } else { 2 };
        assert_eq!(
            passed_per_key(key),
            expected,
            "{key} (in rollout: {in_rollout})"
        );
    }
    assert!(
        (8..=32).contains(&enforced),
        "about half of 40 keys are in a 50% rollout: {enforced}"
    );
}
