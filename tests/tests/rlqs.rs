//! Sluice as Envoy's quota service (RLQS, experimental): a real Envoy with the quota filter
//! (`envoy.filters.http.rate_limit_quota`, as `sluice envoy-config --rlqs` writes it)
//! streaming to `sluice serve --rls-listen 127.0.0.1:0`, with a rule that has a
//! `descriptor`; and the same Envoy with the service out of reach, failing open by
//! default and closed when asked. Loads run for a duration; every assertion allows for a
//! slow machine: a ceiling from the client's outer window, a floor from its inner one.

use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use serde_json::json;
use sluice_envoy_config::{RlqsService, RlsAction, RlsCredentials};
use sluice_tests::{AdminServer, Client, Envoy, EnvoyOptions, Method, Req, Upstream, wait_for};

const CONNECTIONS: usize = 8;
const RATE: f64 = 50.0;
const BURST: f64 = 50.0;

fn keyed(key: &str) -> Req {
    Req::get("/rlqs").header("x-api-key", key)
}

/// An Envoy whose quota filter puts each API key in its own bucket and asks `addr`,
/// showing it `credentials`.
fn envoy(
    upstream: &Upstream,
    addr: SocketAddr,
    credentials: RlsCredentials,
    fail_closed: bool,
) -> Envoy {
    Envoy::start(EnvoyOptions {
        wasm_filter: false,
        upstream: upstream.target(),
        rlqs: Some(RlqsService {
            addr,
            domain: "edge".into(),
            bucket: vec![RlsAction::Header {
                name: "x-api-key".into(),
                key: "api_key".into(),
            }],
            reporting_interval_ms: 500,
            fail_closed,
        }),
        rls_credentials: credentials,
        ..Default::default()
    })
}

fn metric(admin: &AdminServer, line_prefix: &str) -> f64 {
    admin
        .metrics_text()
        .lines()
        .find_map(|l| l.strip_prefix(line_prefix))
        .map_or(0.0, |v| v.trim().parse().unwrap())
}

/// 50 a second per API key, burst 50; the key `big` 100,000 a second.
#[test]
fn rlqs_a_limit_binds_within_burst_plus_rate_and_far_above_denies_nothing() {
    let admin = AdminServer::start_rls(None);
    let rule = json!({
        "name": "per-key", "key": "global",
        "limits": [{"requests": RATE as u64, "period": "second", "burst": BURST as u64}],
        "descriptor": {"domain": "edge", "entries": [{"key": "api_key"}]},
        "overrides": [{"client": "big", "limits": [{"requests": 100_000, "period": "second"}]}],
    });
    let (status, body) = admin.call(Method::POST, "/api/v1/rules", Some(rule));
    assert_eq!(status, 201, "{body}");
    wait_for("the RLS rule in force", Duration::from_secs(5), || {
        admin.metrics_text().contains("sluice_rls_rules 1")
    });
    let upstream = Upstream::start();
    let envoy = envoy(&upstream, admin.rls_addr(), admin.rls_credentials(), false);
    let client = Client::connect(envoy.listener_addr(), CONNECTIONS);

    // The bucket's first request is allowed before any assignment (the generated
    // no-assignment behaviour) and reported at once; its assignment follows.
    let started = Instant::now();
    assert_eq!(client.send(keyed("alice")).status, 200);
    wait_for("the first report", Duration::from_secs(5), || {
        metric(&admin, "sluice_rlqs_reports_total ") >= 1.0
    });
    std::thread::sleep(Duration::from_millis(300));
    let counts = client.run_for(Duration::from_secs(3), |_| keyed("alice"));
    assert_eq!(counts.total.errors, 0, "{:?}", counts.total.first_error);
    let admitted = 1.0 + counts.total.get(200) as f64;
    let denied = counts.total.get(429) as f64;
    assert!(
        denied > admitted,
        "the load must drain the bucket: {counts:?}"
    );
    let ceiling = BURST + RATE * started.elapsed().as_secs_f64();
    assert!(
        admitted <= ceiling,
        "over-admission: {admitted} admitted, at most {ceiling:.1} in {:.3} s",
        started.elapsed().as_secs_f64()
    );
    // Envoy's bucket starts with the burst less the first request, and refills at the
    // rule's rate while the load runs.
    let floor = BURST - 1.0 + RATE * counts.total.busy().as_secs_f64();
    assert!(
        admitted >= floor * 0.95,
        "under-admission: {admitted} admitted, {floor:.1} refilled in {:.3} s",
        counts.total.busy().as_secs_f64()
    );
    assert_eq!(metric(&admin, "sluice_rlqs_streams "), 1.0, "one stream");

    // Far above the load: never a denial.
    assert_eq!(client.send(keyed("big")).status, 200);
    std::thread::sleep(Duration::from_millis(800));
    let counts = client.run_for(Duration::from_secs(2), |_| keyed("big"));
    assert_eq!(counts.total.errors, 0, "{:?}", counts.total.first_error);
    assert_eq!(counts.total.get(429), 0, "{counts:?}");
    assert!(counts.total.get(200) > 100, "{counts:?}");
}

/// An address nothing listens on.
fn closed_port() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}

#[test]
fn rlqs_out_of_reach_fails_open_by_default_and_closed_when_asked() {
    let upstream = Upstream::start();
    let addr = closed_port();
    let open = envoy(&upstream, addr, RlsCredentials::default(), false);
    let client = Client::connect(open.listener_addr(), CONNECTIONS);
    let counts = client.run_for(Duration::from_secs(1), |i| keyed(&format!("k{}", i % 5)));
    assert_eq!(counts.total.errors, 0, "{:?}", counts.total.first_error);
    assert_eq!(counts.total.get(429), 0, "{counts:?}");
    assert!(counts.total.get(200) > 0, "{counts:?}");
    drop(open);

    let closed = envoy(&upstream, addr, RlsCredentials::default(), true);
    let client = Client::connect(closed.listener_addr(), CONNECTIONS);
    let counts = client.run_for(Duration::from_secs(1), |i| keyed(&format!("k{}", i % 5)));
    assert_eq!(counts.total.errors, 0, "{:?}", counts.total.first_error);
    assert_eq!(counts.total.get(200), 0, "{counts:?}");
    assert!(counts.total.get(429) > 0, "{counts:?}");
    // A request in no bucket (no API key) is not limited either way.
    assert_eq!(client.send(Req::get("/rlqs")).status, 200);
}
