//! Sluice as a plain HTTP filter, the way Istio (`WasmPlugin`) and Envoy Gateway
//! (`EnvoyExtensionPolicy`) load it: no bootstrap extension, the admin API's settings in
//! the filter's plugin configuration, and one worker elected through shared data to run
//! the control service. Real Envoy (several workers), real `sluice serve` on SQLite.
//!
//! The filter's configuration reaches Envoy through file-based extension config discovery
//! (ECDS), as Istio delivers a `WasmPlugin`, so the failover test can replace it while
//! Envoy runs: Envoy then starts new VMs and tears the old ones down, the elected one with
//! them.
//!
//! Every worker shares one bucket per client, so "every worker enforces" is checked by
//! counting, as in `propagation.rs`: with a burst of B, exactly B of many requests spread
//! over all workers pass. A worker still on the old rules would let its share through.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sluice_core::control::election::LEASE_DURATION;
use sluice_tests::{AdminServer, Client, ControlMode, Envoy, EnvoyOptions, Method, Req, wait_for};

const WORKERS: usize = 3;
const CONNECTIONS: usize = 24;
const BURST: usize = 5;
/// Requests per check: far more than the burst, spread over every worker.
const PROBE: usize = 40;
/// The promise: a saved rule is enforced everywhere within this.
const PROPAGATION: Duration = Duration::from_secs(1);
/// A worker's tick: how long after a lease is freed a standby worker takes it.
const WORKER_TICK: Duration = Duration::from_millis(100);
/// How long Envoy may take to start new VMs and tear down the old ones after a filter
/// configuration change (its own work, not Sluice's): a generous upper bound.
const RELOAD_PATIENCE: Duration = Duration::from_secs(30);
const PATIENCE: Duration = Duration::from_secs(20);

/// A rule limiting each `x-probe` client on `/PREFIX/` to a burst of 5 a minute: every
/// check uses a fresh client, so a check never depends on what an earlier one spent.
fn rule(name: &str) -> Value {
    json!({
        "name": name, "match": {"path_prefix": format!("/{name}/")},
        "key": {"header": "x-probe"},
        "limits": [{"requests": 1, "period": "minute", "burst": BURST}]
    })
}

struct Stack {
    admin: AdminServer,
    envoy: Envoy,
    client: Client,
    /// Probes sent, to give each a fresh client key.
    probes: usize,
    /// What the probes should make the admin API's statistics say.
    allowed: usize,
    denied: usize,
}

impl Stack {
    /// An Envoy following `admin` with the control section in its plugin configuration
    /// and no bootstrap extension, delivered by ECDS.
    fn start(admin: AdminServer) -> Stack {
        let proxy_token = admin.create_token("proxy", "worker-envoy");
        let envoy = Envoy::start(EnvoyOptions {
            admin: Some(admin.connection(&proxy_token, "worker-proxy")),
            control_mode: ControlMode::Worker,
            filter_discovery: true,
            concurrency: WORKERS,
            ..Default::default()
        });
        let client = Client::connect(envoy.listener_addr(), CONNECTIONS);
        Stack {
            admin,
            envoy,
            client,
            probes: 0,
            allowed: 0,
            denied: 0,
        }
    }

    /// Sends a probe of `PROBE` requests to `/NAME/` as a fresh client; returns how many
    /// passed.
    fn probe(&mut self, name: &str) -> usize {
        self.probes += 1;
        let key = format!("client-{}", self.probes);
        let probe = Req::get(format!("/{name}/x")).header("x-probe", key);
        self.client.passed(&probe, PROBE)
    }

    /// Saves `rule(name)` through the admin API; returns when the API answered.
    fn save_rule(&self, name: &str) -> Instant {
        let (status, body) = self
            .admin
            .call(Method::POST, "/api/v1/rules", Some(rule(name)));
        let saved = Instant::now();
        assert_eq!(status, 201, "{body}");
        saved
    }

    /// At `bound` after `saved`, the rule holds on every worker: exactly the burst of a
    /// fresh client passes.
    fn check_enforced_within(&mut self, name: &str, saved: Instant, bound: Duration) {
        std::thread::sleep(bound.saturating_sub(saved.elapsed()));
        let passed = self.probe(name);
        assert_eq!(
            passed, BURST,
            "rule {name}: {passed} of {PROBE} passed at {bound:?} after saving, not the burst \
             of {BURST}: some worker did not enforce it"
        );
        self.allowed += BURST;
        self.denied += PROBE - BURST;
    }

    /// Long-polls the admin API holds now, from its own `/metrics`.
    fn held_polls(&self) -> u64 {
        self.admin
            .metrics_text()
            .lines()
            .find_map(|line| line.strip_prefix("sluice_admin_long_polls "))
            .and_then(|value| value.trim().parse::<f64>().ok())
            .map_or(0, |polls| polls as u64)
    }

    /// Exactly one control service runs: one proxy at the admin API, one held poll at a
    /// time (sampled over a few of the worker's ticks), and one takeover so far in all.
    fn check_one_control_service(&self, takeovers: u64) {
        wait_for("one held poll", PATIENCE, || self.held_polls() == 1);
        for _ in 0..10 {
            let polls = self.held_polls();
            assert!(
                polls <= 1,
                "{polls} long-polls held: more than one control service"
            );
            std::thread::sleep(WORKER_TICK);
        }
        let (status, proxies) = self.admin.call(Method::GET, "/api/v1/proxies", None);
        assert_eq!(status, 200, "{proxies}");
        let listed = proxies["proxies"].as_array().expect("a proxy list");
        assert_eq!(listed.len(), 1, "{proxies}");
        assert_eq!(listed[0]["id"], "worker-proxy", "{proxies}");
        assert_eq!(
            self.envoy
                .counter("wasmcustom.sluice_control_takeovers_total"),
            takeovers,
            "leadership moved more often than expected"
        );
    }

    /// The admin API's statistics hold exactly what the probes were answered.
    fn check_reports_arrived(&self) {
        let (allowed, denied) = (self.allowed, self.denied);
        wait_for("the reports to arrive", PATIENCE, || {
            let (status, overview) =
                self.admin
                    .call(Method::GET, "/api/v1/metrics/overview?window=3600", None);
            assert_eq!(status, 200, "{overview}");
            overview["allowed"] == allowed && overview["denied"] == denied
        });
    }

    /// Takeovers counted by every root, summed.
    fn takeovers(&self) -> u64 {
        self.envoy
            .stat("wasmcustom.sluice_control_takeovers_total")
            .unwrap_or(0)
    }
}

/// Lines of Envoy's log in which a root says it took the control service's lease.
fn takeover_lines(envoy: &Envoy) -> Vec<String> {
    envoy
        .log()
        .lines()
        .filter(|line| line.contains("runs the control service (lease term"))
        .map(str::to_string)
        .collect()
}

#[test]
fn an_elected_worker_follows_the_admin_api_and_a_successor_takes_over_when_its_vm_goes() {
    let mut s = Stack::start(AdminServer::start());
    let config = std::fs::read_to_string(s.envoy.config_path()).expect("the bootstrap");
    assert!(
        !config.contains("bootstrap_extensions") && !config.contains("singleton"),
        "no bootstrap extension: {config}"
    );
    wait_for("an elected worker to poll", PATIENCE, || {
        s.held_polls() == 1
    });
    let takeovers = takeover_lines(&s.envoy);
    assert_eq!(takeovers.len(), 1, "one worker elected: {takeovers:#?}");
    assert!(
        takeovers[0].contains("this worker runs"),
        "{}",
        takeovers[0]
    );

    // (a) A rule saved through the admin API is enforced by every worker within 1 s.
    let saved = s.save_rule("first");
    s.check_enforced_within("first", saved, PROPAGATION);
    let per_worker = s.envoy.worker_downstream_connections();
    assert!(
        per_worker.len() == WORKERS && per_worker.iter().all(|&c| c > 0),
        "every worker served: {per_worker:?}"
    );
    // (c) Exactly one control service runs.
    s.check_one_control_service(1);
    // (b) Its reports arrive: the admin API's statistics are what the workers decided.
    s.check_reports_arrived();
    assert_eq!(
        s.envoy
            .counter("wasmcustom.sluice_report_batches_dropped_total"),
        0
    );

    // (d) Failover: a new filter configuration (a new VM configuration) makes Envoy start
    // new VMs and tear the old ones down, the elected worker's among them. Its root
    // releases the lease as it goes, and a worker of the new VMs takes over.
    let reloads_before = s.envoy.ecds_reloads();
    let takeovers_before = s.takeovers();
    s.envoy.replace_filter(|wasm| {
        wasm["config"]["vm_config"]["configuration"] = json!({
            "@type": "type.googleapis.com/google.protobuf.StringValue",
            "value": "generation 2",
        });
    });
    wait_for(
        "Envoy to apply the new filter configuration",
        RELOAD_PATIENCE,
        || s.envoy.ecds_reloads() > reloads_before,
    );
    let applied = Instant::now();
    wait_for("a new root to take over", RELOAD_PATIENCE, || {
        s.takeovers() > takeovers_before
    });
    let handover = applied.elapsed();
    eprintln!(
        "a new root took over {:.0} ms after Envoy applied the new configuration",
        handover.as_secs_f64() * 1000.0
    );
    let released = s
        .envoy
        .log()
        .lines()
        .any(|line| line.contains("released the control service's lease"));
    eprintln!("the old leader released its lease on teardown: {released}");
    // The documented bound: a stopped leader's lease frees within LEASE_DURATION of its
    // last renewal, and a standby takes it on its next tick (at once after a release).
    // Counters reach Envoy on the next tick, and reading them takes a round of polls.
    let bound = Duration::from(LEASE_DURATION) + WORKER_TICK + Duration::from_secs(1);
    assert!(
        handover <= bound,
        "the handover took {handover:?}, over the documented {bound:?}"
    );
    let takeovers = takeover_lines(&s.envoy);
    assert_eq!(takeovers.len(), 2, "{takeovers:#?}");
    // The old VMs' roots are gone: nothing of theirs polls any more.
    s.check_one_control_service(takeovers_before + 1);

    // A rule saved after the handover is enforced by every new worker within 1 s again.
    let saved = s.save_rule("second");
    s.check_enforced_within("second", saved, PROPAGATION);
    // The first rule is still enforced: the new VMs took the published ruleset at once.
    assert_eq!(s.probe("first"), BURST);
    s.allowed += BURST;
    s.denied += PROBE - BURST;
    assert_eq!(s.envoy.counter("wasmcustom.sluice_fail_open_total"), 0);
    // Reports continue from the new leader. Everything before the handover had arrived,
    // and nothing was sent in between, so the statistics are exact again.
    s.check_reports_arrived();
}

/// (e) A control section naming a cluster Envoy does not have: the control service says
/// so once (naming the cluster and what to create), counts every refused call, and
/// traffic flows under the static rules.
#[test]
fn a_missing_admin_cluster_is_logged_once_counted_and_traffic_still_flows() {
    let envoy = Envoy::start(EnvoyOptions {
        rules: json!([rule("static")]),
        plugin_settings: json!({"control": {
            "admin_cluster": "outbound|8080||sluice-admin.sluice.svc.cluster.local",
            "admin_authority": "sluice-admin.sluice:8080",
            "token": "slc_unused",
            "proxy_id": "missing-cluster-proxy",
        }}),
        concurrency: 2,
        ..Default::default()
    });
    // Polls are retried with backoff (1 s, then 2 s): three refusals within a few seconds.
    wait_for("three refused calls", PATIENCE, || {
        envoy
            .stat("wasmcustom.sluice_control_admin_cluster_missing_total")
            .unwrap_or(0)
            >= 3
    });
    let log = envoy.log();
    let told = log
        .lines()
        .filter(|line| {
            line.contains("no cluster named `outbound|8080||sluice-admin.sluice.svc.cluster.local`")
        })
        .count();
    assert_eq!(told, 1, "said once, not per call:\n{}", envoy.log_tail());
    assert!(log.contains("ServiceEntry"), "says what to create");

    let client = Client::connect(envoy.listener_addr(), 8);
    let responses =
        client.run((0..PROBE).map(|_| Req::get("/static/x").header("x-probe", "someone")));
    let passed = responses.iter().filter(|r| r.status == 200).count();
    assert_eq!(passed, BURST, "the static rule holds");
    let elsewhere = client.run((0..20).map(|_| Req::get("/other")));
    assert!(
        elsewhere.iter().all(|r| r.status == 200),
        "traffic flows: {:?}",
        elsewhere.iter().map(|r| r.status).collect::<Vec<_>>()
    );
    assert_eq!(envoy.counter("wasmcustom.sluice_fail_open_total"), 0);
}

/// Where the singleton runs too (a bootstrap extension) and the plugin configuration also
/// names the admin API, the singleton leads: a worker that got there first steps down.
#[test]
fn the_singleton_leads_over_elected_workers() {
    let admin = AdminServer::start();
    let proxy_token = admin.create_token("proxy", "both-envoy");
    let connection = admin.connection(&proxy_token, "both-proxy");
    let control = connection.control_spec().expect("a valid connection");
    let envoy = Envoy::start(EnvoyOptions {
        admin: Some(connection),
        control_mode: ControlMode::Singleton,
        plugin_settings: json!({ "control": control }),
        concurrency: 2,
        ..Default::default()
    });
    wait_for("the singleton to lead", PATIENCE, || {
        takeover_lines(&envoy)
            .last()
            .is_some_and(|line| line.contains("this singleton runs"))
    });
    let s = Stack {
        admin,
        client: Client::connect(envoy.listener_addr(), 4),
        envoy,
        probes: 0,
        allowed: 0,
        denied: 0,
    };
    wait_for("one held poll", PATIENCE, || s.held_polls() == 1);
    // Steady: the singleton renews every 50 ms, so no worker takes over again.
    // Read once the counters stand still: a takeover reaches Envoy on the next tick.
    let settled = s.envoy.counter("wasmcustom.sluice_control_takeovers_total");
    for _ in 0..10 {
        assert!(s.held_polls() <= 1, "more than one control service");
        std::thread::sleep(WORKER_TICK * 3);
    }
    assert_eq!(
        s.takeovers(),
        settled,
        "leadership moved while the singleton ran"
    );
    let lines = takeover_lines(&s.envoy);
    assert!(
        lines
            .last()
            .is_some_and(|l| l.contains("this singleton runs")),
        "{lines:#?}"
    );
}
