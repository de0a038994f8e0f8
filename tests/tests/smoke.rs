//! The harness itself, and the filter loaded in a real Envoy.

use sluice_tests::{Client, Envoy, EnvoyOptions, Req, Upstream};

const REQUESTS: usize = 20;

/// Envoy with only the router: proves the harness (config, start-up, port discovery, client,
/// upstream, stats) without the filter.
#[test]
fn envoy_without_the_filter_proxies_to_the_upstream() {
    let upstream = Upstream::start();
    let envoy = Envoy::start(EnvoyOptions {
        upstream: upstream.target(),
        wasm_filter: false,
        ..Default::default()
    });
    let client = Client::connect(envoy.listener_addr(), 4);

    let responses = client.run(
        (0..REQUESTS)
            .map(|i| Req::get(format!("/echo/{i}?q=1")).header("x-api-key", format!("key-{i}"))),
    );

    for (i, response) in responses.iter().enumerate() {
        assert_eq!(response.status, 200, "{response:?}");
        let echo = response.json();
        assert_eq!(echo["method"], "GET");
        assert_eq!(echo["path"], format!("/echo/{i}?q=1"));
        assert_eq!(echo["headers"]["x-api-key"], format!("key-{i}"));
    }
    assert_eq!(upstream.requests_seen(), REQUESTS as u64);
    assert_eq!(
        envoy.counter("http.ingress_http.downstream_rq_2xx"),
        REQUESTS as u64
    );
    assert!(envoy.stat("wasmcustom.sluice_requests_total").is_none());
    let per_worker = envoy.worker_downstream_connections();
    assert_eq!(per_worker.len(), 2, "one entry per worker: {per_worker:?}");
    assert_eq!(per_worker.iter().sum::<u64>(), 4, "{per_worker:?}");
    assert!(envoy.rss_bytes() > 1 << 20);
    assert!(envoy.is_running());
}

/// The filter with no rules loads in every worker, lets everything through to the upstream
/// and counts requests.
#[test]
fn the_filter_with_no_rules_lets_everything_through() {
    let upstream = Upstream::start();
    let envoy = Envoy::start(EnvoyOptions {
        upstream: upstream.target(),
        ..Default::default()
    });
    let client = Client::connect(envoy.listener_addr(), 4);

    let responses = client.run((0..REQUESTS).map(|i| Req::get(format!("/api/{i}"))));

    for response in &responses {
        assert_eq!(response.status, 200, "{response:?}\n{}", envoy.log_tail());
        assert_eq!(response.json()["method"], "GET");
    }
    assert_eq!(upstream.requests_seen(), REQUESTS as u64);
    assert_eq!(
        envoy.counter("wasmcustom.sluice_requests_total"),
        REQUESTS as u64,
        "{:#?}",
        envoy.stats_matching("^wasmcustom\\.")
    );
    assert!(envoy.is_running());
}
