//! Two `sluice serve` replicas on one PostgreSQL database, both given to a real Envoy as
//! its admin URLs: the replica holding the Envoy's long-poll is killed, and a change made
//! through the survivor is enforced within the promised 2 s.

use std::time::{Duration, Instant};

use serde_json::Value;
use sluice_harness::PostgresDatabase;
use sluice_tests::{AdminServer, Client, Envoy, EnvoyOptions, Method, Req, burst_rule, wait_for};

/// The promise: a change made on a surviving replica is enforced within this.
const FAILOVER: Duration = Duration::from_secs(2);
const CONNECTIONS: usize = 8;

fn rule(burst: u64) -> Value {
    burst_rule("replicated", "r", burst)
}

/// Sends `n` requests and returns how many passed.
fn passed(client: &Client, n: usize) -> usize {
    client.passed(&Req::get("/r/x"), n)
}

/// Long-polls a replica holds now, from its own `/metrics`.
fn held_polls(admin: &AdminServer) -> u64 {
    admin
        .metrics_text()
        .lines()
        .find_map(|line| line.strip_prefix("sluice_admin_long_polls "))
        .and_then(|value| value.trim().parse::<f64>().ok())
        .map_or(0, |polls| polls as u64)
}

#[test]
fn chaos_the_replica_an_envoy_follows_is_killed_and_the_survivor_takes_over() {
    let Some(database) = PostgresDatabase::on_the_suites_server("sluice_failover") else {
        return;
    };
    let mut replicas = [
        AdminServer::start_on_database(database.url()),
        AdminServer::start_on_database(database.url()),
    ];
    let token = replicas[0].create_token("proxy", "failover-envoy");
    let mut connection = replicas[0].connection(&token, "failover-proxy");
    connection.replicas = vec![replicas[1].connection(&token, "failover-proxy").url];
    let envoy = Envoy::start(EnvoyOptions {
        admin: Some(connection),
        ..Default::default()
    });
    let client = Client::connect(envoy.listener_addr(), CONNECTIONS);

    let (status, body) = replicas[0].call(Method::POST, "/api/v1/rules", Some(rule(5)));
    assert_eq!(status, 201, "{body}");
    wait_for(
        "the Envoy to take version 1",
        Duration::from_secs(10),
        || envoy.counter("wasmcustom.sluice_control_ruleset_version") == 1,
    );
    assert_eq!(passed(&client, 30), 5, "the first rule is enforced");

    // The replica holding the Envoy's next poll is the one to lose.
    let mut holder = None;
    wait_for(
        "a replica to hold the Envoy's poll",
        Duration::from_secs(10),
        || {
            holder = replicas.iter().position(|r| held_polls(r) > 0);
            holder.is_some()
        },
    );
    let holder = holder.unwrap_or_default();
    let survivor = 1 - holder;
    replicas[holder].stop();

    let (status, body) =
        replicas[survivor].call(Method::PUT, "/api/v1/rules/replicated", Some(rule(40)));
    let changed = Instant::now();
    assert_eq!(status, 200, "{body}");
    wait_for(
        "the Envoy to take version 2 from the survivor",
        Duration::from_secs(20),
        || envoy.counter("wasmcustom.sluice_control_ruleset_version") == 2,
    );
    let took = changed.elapsed();
    eprintln!(
        "replica {holder} killed; the change through replica {survivor} reached the Envoy in {:.2} s",
        took.as_secs_f64()
    );
    assert!(
        took <= FAILOVER,
        "failover took {took:?}, more than {FAILOVER:?}"
    );
    assert_eq!(passed(&client, 100), 40, "the new limit is enforced");
}
