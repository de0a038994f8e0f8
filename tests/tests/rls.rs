//! Sluice as Envoy's rate limit service: a real Envoy with the native ratelimit filter
//! (`envoy.filters.http.ratelimit`, as `sluice envoy-config --rls` writes it) asking
//! `sluice serve --rls-listen 127.0.0.1:0`, with rules that have a `descriptor`, buckets in
//! memory (SQLite) and in Redis. Loads run for a duration and every assertion allows for a
//! slow machine: a ceiling from the client's outer window, a floor from its inner one.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{Value, json};
use sluice_envoy_config::{AdminTls, LISTENER_NAME, RlsAction, RlsCredentials, RlsService};
use sluice_harness::envoy::{EnvoyLaunch, EnvoyProcess};
use sluice_harness::load::Load;
use sluice_harness::{RedisServer, redis_available};
use sluice_tests::{
    ADMIN_TOKEN, AdminServer, Artifacts, Client, Envoy, EnvoyOptions, Method, Req, TestPki,
    Upstream, wait_for,
};

const CONNECTIONS: usize = 8;
const RATE: f64 = 50.0;
const BURST: f64 = 50.0;

/// 50 a second per API key, burst 50, decided for descriptors `(api_key, KEY)` of domain
/// `edge`.
fn per_key_rule(requests: u64, burst: u64) -> Value {
    json!({
        "name": "per-key", "key": "global",
        "limits": [{"requests": requests, "period": "second", "burst": burst}],
        "descriptor": {"domain": "edge", "entries": [{"key": "api_key"}]}
    })
}

/// The server with `rule` in force for its rate limit service, and an Envoy asking it.
struct Setup {
    _upstream: Upstream,
    admin: AdminServer,
    envoy: Envoy,
}

impl Setup {
    fn start(redis: Option<&str>, rule: Value) -> Setup {
        let admin = admin_with(redis, rule);
        let actions = vec!["header:x-api-key=api_key".parse().unwrap()];
        Setup::with_envoy(admin, vec![actions])
    }

    /// An Envoy whose requests send `descriptors` (each the actions of its entries).
    fn with_envoy(admin: AdminServer, descriptors: Vec<Vec<RlsAction>>) -> Setup {
        let (upstream, envoy) = envoy_asking(&admin, descriptors);
        Setup {
            _upstream: upstream,
            admin,
            envoy,
        }
    }

    fn metric(&self, line_prefix: &str) -> f64 {
        metric(&self.admin, line_prefix)
    }
}

/// `sluice serve --rls-listen` (buckets in the Redis at `redis` if given) with `rule` in
/// force.
fn admin_with(redis: Option<&str>, rule: Value) -> AdminServer {
    let admin = AdminServer::start_rls(redis);
    let (status, body) = admin.call(Method::POST, "/api/v1/rules", Some(rule));
    assert_eq!(status, 201, "{body}");
    wait_for("the RLS rule in force", Duration::from_secs(5), || {
        admin.metrics_text().contains("sluice_rls_rules 1")
    });
    admin
}

/// An Envoy with the native ratelimit filter asking `admin`, its requests sending
/// `descriptors` (each the actions of its entries), and the upstream behind it.
fn envoy_asking(admin: &AdminServer, descriptors: Vec<Vec<RlsAction>>) -> (Upstream, Envoy) {
    let service = rls_service(admin.rls_addr(), descriptors);
    envoy_calling(service, admin.rls_credentials())
}

/// The native filter's settings for `addr`, failing open.
fn rls_service(addr: SocketAddr, descriptors: Vec<Vec<RlsAction>>) -> RlsService {
    RlsService {
        addr,
        domain: "edge".into(),
        descriptors,
        // Generous: a decision that times out fails open, which the ceiling
        // below would catch as over-admission on a slow machine.
        timeout_ms: 2_000,
        fail_closed: false,
    }
}

/// An Envoy calling `service` with `credentials`, and the upstream behind it.
fn envoy_calling(service: RlsService, credentials: RlsCredentials) -> (Upstream, Envoy) {
    let upstream = Upstream::start();
    let envoy = Envoy::start(EnvoyOptions {
        wasm_filter: false,
        upstream: upstream.target(),
        rls: Some(service),
        rls_credentials: credentials,
        ..Default::default()
    });
    (upstream, envoy)
}

/// The value of the line of `admin`'s `/metrics` that starts with `line_prefix`.
fn metric(admin: &AdminServer, line_prefix: &str) -> f64 {
    admin
        .metrics_text()
        .lines()
        .find_map(|l| l.strip_prefix(line_prefix))
        .map_or(0.0, |v| v.trim().parse().unwrap())
}

fn keyed(key: &str) -> Req {
    Req::get("/rls").header("x-api-key", key)
}

/// Drives one key for 3 s: admitted never exceeds `burst + rate × elapsed`, and falls
/// short of what refilled while Envoy was surely deciding by at most 3 %; a denial carries
/// Envoy's X-RateLimit headers with Sluice's figures.
fn check_a_limit_binds(setup: &Setup) {
    check_a_limit_binds_behind(setup.envoy.listener_addr(), &setup.admin);
}

/// [`check_a_limit_binds`] through the Envoy listening at `listener`, asking `admin`.
fn check_a_limit_binds_behind(listener: SocketAddr, admin: &AdminServer) {
    let client = Client::connect(listener, CONNECTIONS);
    let counts = client.run_for(Duration::from_secs(3), |_| keyed("alice"));
    assert_eq!(counts.total.errors, 0, "{:?}", counts.total.first_error);
    let admitted = counts.total.get(200) as f64;
    let denied = counts.total.get(429) as f64;
    assert!(
        denied > admitted,
        "the load must keep the bucket drained: {counts:?}"
    );
    let ceiling = BURST + RATE * counts.elapsed.as_secs_f64();
    assert!(
        admitted <= ceiling,
        "over-admission: {admitted} admitted, at most {ceiling:.1} in {:.3} s",
        counts.elapsed.as_secs_f64()
    );
    let floor = BURST + RATE * counts.total.busy().as_secs_f64();
    assert!(
        admitted >= floor * 0.97 - 1.0,
        "under-admission: {admitted} admitted, {floor:.1} refilled in {:.3} s",
        counts.total.busy().as_secs_f64()
    );
    for reason in ["unavailable", "contended", "max_buckets"] {
        let line = format!("sluice_rls_failures_total{{reason=\"{reason}\"}} ");
        assert_eq!(metric(admin, &line), 0.0, "{reason}");
    }

    // The bucket refills one token every 20 ms: of a few quick requests, one is denied.
    let denied = (0..100)
        .map(|_| client.send(keyed("alice")))
        .find(|r| r.status == 429)
        .expect("a denial");
    assert_eq!(
        denied
            .header("x-ratelimit-limit")
            .map(|l| l.starts_with("50")),
        Some(true),
        "{denied:?}"
    );
    assert_eq!(
        denied.header("x-ratelimit-remaining"),
        Some("0"),
        "{denied:?}"
    );
    assert_eq!(denied.header("x-ratelimit-reset"), Some("1"), "{denied:?}");
    // Another key has its own bucket.
    assert_eq!(client.send(keyed("bob")).status, 200);
    assert!(
        metric(admin, "sluice_rls_descriptors_total{outcome=\"denied\"} ") >= denied_count(&counts)
    );
}

fn denied_count(counts: &sluice_tests::Outcome) -> f64 {
    counts.total.get(429) as f64
}

/// A limit far above the load: never a denial, and the headers on every answer.
fn check_a_limit_far_above_denies_nothing(setup: &Setup) {
    check_far_above_behind(setup.envoy.listener_addr(), "x-api-key");
}

/// [`check_a_limit_far_above_denies_nothing`] through the Envoy at `listener`, whose
/// rule's key is read from `header`.
fn check_far_above_behind(listener: SocketAddr, header: &'static str) {
    let client = Client::connect(listener, CONNECTIONS);
    let keyed = move |key: &str| Req::get("/rls").header(header, key);
    let counts = client.run_for(Duration::from_secs(2), move |i| {
        keyed(&format!("k{}", i % 7))
    });
    assert_eq!(counts.total.errors, 0, "{:?}", counts.total.first_error);
    assert_eq!(counts.total.get(429), 0, "{counts:?}");
    assert!(counts.total.get(200) > 0);
    let allowed = client.send(keyed("k1"));
    assert_eq!(allowed.status, 200);
    assert!(
        allowed.header("x-ratelimit-remaining").is_some(),
        "{allowed:?}"
    );
}

#[test]
fn rls_in_memory_a_limit_binds_exactly_with_headers() {
    let setup = Setup::start(None, per_key_rule(50, 50));
    check_a_limit_binds(&setup);
}

#[test]
fn rls_in_memory_a_limit_far_above_the_load_denies_nothing() {
    let setup = Setup::start(None, per_key_rule(1_000_000, 1_000_000));
    check_a_limit_far_above_denies_nothing(&setup);
}

#[test]
fn rls_on_redis_a_limit_binds_exactly_and_far_above_denies_nothing() {
    if !redis_available() {
        return;
    }
    let redis = RedisServer::start();
    let setup = Setup::start(Some(&redis.url()), per_key_rule(50, 50));
    check_a_limit_binds(&setup);
    let redis = RedisServer::start();
    let setup = Setup::start(Some(&redis.url()), per_key_rule(1_000_000, 1_000_000));
    check_a_limit_far_above_denies_nothing(&setup);
}

/// Drives `alice` through the Envoy at `listener` for 1 s, far over her limit, and
/// returns the counts; every request is answered (none times out or resets).
fn over_the_limit(listener: SocketAddr) -> sluice_tests::Outcome {
    let client = Client::connect(listener, CONNECTIONS);
    let counts = client.run_for(Duration::from_secs(1), |_| keyed("alice"));
    assert_eq!(counts.total.errors, 0, "{:?}", counts.total.first_error);
    counts
}

/// With `--rls-auth token`, an Envoy sending the proxy token is limited as before (every
/// other test here sends one too); one sending none is refused `UNAUTHENTICATED`, counted,
/// and its requests follow its own failure mode: through when it fails open (no 429
/// although the load is far over the limit: nothing was decided), Envoy's 500 when it
/// fails closed.
#[test]
fn rls_an_envoy_without_the_proxy_token_is_refused_and_fails_open_or_closed_as_configured() {
    let setup = Setup::start(None, per_key_rule(50, 50));
    let actions = || vec![vec!["header:x-api-key=api_key".parse().unwrap()]];

    let (_open_upstream, open) = envoy_calling(
        rls_service(setup.admin.rls_addr(), actions()),
        RlsCredentials::default(),
    );
    let counts = over_the_limit(open.listener_addr());
    assert_eq!(counts.total.get(429), 0, "{counts:?}");
    assert!(counts.total.get(200) > 100, "{counts:?}");
    let refused = setup.metric("sluice_rls_unauthenticated_total{reason=\"missing_token\"} ");
    assert!(
        refused >= counts.total.get(200) as f64,
        "{refused} refused, {counts:?}"
    );
    assert_eq!(setup.metric("sluice_rls_requests_total{code=\"ok\"} "), 0.0);

    let closed_service = RlsService {
        fail_closed: true,
        ..rls_service(setup.admin.rls_addr(), actions())
    };
    let (_closed_upstream, closed) = envoy_calling(closed_service, RlsCredentials::default());
    let counts = over_the_limit(closed.listener_addr());
    assert_eq!(counts.total.get(200), 0, "{counts:?}");
    assert!(counts.total.get(500) > 0, "{counts:?}");

    check_a_limit_binds(&setup);
}

/// With `--rls-client-ca` (and `--rls-auth none`), an Envoy presenting a client
/// certificate from that CA (`sluice envoy-config --rls-client-cert`, certificates made
/// here) is limited as before; one presenting none fails the TLS handshake, counted as
/// such, so its requests follow its failure mode (closed here: Envoy's 500, never a
/// 200).
#[test]
fn rls_with_client_certificates_an_envoy_without_one_is_refused() {
    let pki = TestPki::new();
    let admin = AdminServer::start_rls_mtls(&pki);
    let (status, body) = admin.call(Method::POST, "/api/v1/rules", Some(per_key_rule(50, 50)));
    assert_eq!(status, 201, "{body}");
    wait_for("the RLS rule in force", Duration::from_secs(5), || {
        admin.metrics_text().contains("sluice_rls_rules 1")
    });
    let actions = || vec![vec!["header:x-api-key=api_key".parse().unwrap()]];

    let anonymous = RlsService {
        fail_closed: true,
        ..rls_service(admin.rls_addr(), actions())
    };
    let (_anonymous_upstream, envoy) = envoy_calling(anonymous, admin.rls_credentials());
    let counts = over_the_limit(envoy.listener_addr());
    assert_eq!(counts.total.get(200), 0, "{counts:?}");
    assert!(counts.total.get(500) > 0, "{counts:?}");
    drop(envoy);
    let refused = "sluice_rls_handshake_failures_total{reason=\"client_certificate\"}";
    assert!(metric(&admin, refused) > 0.0, "{}", admin.metrics_text());

    let mut tls = AdminTls::new(pki.ca());
    tls.client_cert = Some(pki.client_cert());
    let credentials = RlsCredentials {
        token: None,
        tls: Some(tls),
        insecure: false,
    };
    let (_upstream, envoy) = envoy_calling(rls_service(admin.rls_addr(), actions()), credentials);
    check_a_limit_binds_behind(envoy.listener_addr(), &admin);
}

/// Redis killed under load (docs/rls.md#failures): every request is answered within
/// Envoy's configured timeout (plus the slack of a busy machine), none is refused or
/// reset; once Redis is gone the service answers with the rules' failure mode (open:
/// counted as `unavailable` and `failed_open`) and the generated configuration lets
/// everything through; with Redis back, the limit binds again.
#[test]
fn rls_on_redis_killed_under_load_every_call_answers_in_time_and_fails_open() {
    if !redis_available() {
        return;
    }
    const TIMEOUT_MS: u32 = 500;
    let bound = Duration::from_millis(u64::from(TIMEOUT_MS) + 1_000);
    let mut redis = RedisServer::start();
    let admin = admin_with(Some(&redis.url()), per_key_rule(50, 50));
    let service = RlsService {
        timeout_ms: TIMEOUT_MS,
        ..rls_service(
            admin.rls_addr(),
            vec![vec!["header:x-api-key=api_key".parse().unwrap()]],
        )
    };
    let (_upstream, envoy) = envoy_calling(service, admin.rls_credentials());
    let client = Client::connect(envoy.listener_addr(), CONNECTIONS);
    let limited = client.run_for(Duration::from_secs(1), |_| keyed("alice"));
    assert!(
        limited.total.get(429) > 0,
        "the limit binds first: {limited:?}"
    );

    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(500));
        redis.kill();
        redis
    });
    let across = client.run_for(Duration::from_secs(2), |_| keyed("alice"));
    let mut redis = killer.join().unwrap();
    assert_eq!(across.total.errors, 0, "{:?}", across.total.first_error);
    assert_eq!(
        across.total.get(200) + across.total.get(429),
        across.total.responses(),
        "{across:?}"
    );
    assert!(across.total.slowest <= bound, "{across:?}");

    let gone = client.run_for(Duration::from_secs(1), |_| keyed("alice"));
    assert_eq!(gone.total.errors, 0, "{:?}", gone.total.first_error);
    assert_eq!(gone.total.get(200), gone.total.responses(), "{gone:?}");
    assert!(gone.total.slowest <= bound, "{gone:?}");
    assert!(metric(&admin, "sluice_rls_failures_total{reason=\"unavailable\"} ") > 0.0);
    assert!(
        metric(
            &admin,
            "sluice_rls_descriptors_total{outcome=\"failed_open\"} "
        ) > 0.0
    );

    redis.restart();
    wait_for("the limit binding again", Duration::from_secs(10), || {
        (0..60).any(|_| client.send(keyed("alice")).status == 429)
    });
}

/// What a user writes once for both sides: the rules the service decides, from which
/// `sluice envoy-config --rls --rules` also makes the route's descriptors. The API key's
/// limit binds under the load below; the tenant's is far above it.
const RULES_FOR_RENDERING: &str = "\
- name: per-key
  key: global
  limits: [{requests: 50, period: second, burst: 50}]
  descriptor: {domain: edge, entries: [{key: api_key}]}
- name: per-tenant
  key: global
  limits: [{requests: 1000000, period: second}]
  descriptor: {domain: edge, entries: [{key: tenant}]}
";

/// The bootstrap exactly as `sluice envoy-config --rls ADDR --rules FILE` renders it
/// (the API key read from `x-api-key`, the tenant from the default header `tenant`),
/// run by a real Envoy against `sluice serve --rls-listen` holding the same rules: 429s
/// at the limit with `burst + rate × elapsed` admitted, none below it.
#[test]
fn rls_a_bootstrap_rendered_from_the_rules_limits_at_the_limit_and_not_below() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.yaml");
    std::fs::write(&rules, RULES_FOR_RENDERING).unwrap();
    let rules = rules.display().to_string();
    let admin = AdminServer::start_rls(None);
    let url = admin.url();
    sluice(&[
        "rules",
        "apply",
        "-f",
        &rules,
        "--url",
        &url,
        "--token",
        ADMIN_TOKEN,
    ]);
    wait_for("the rules in force", Duration::from_secs(5), || {
        admin.metrics_text().contains("sluice_rls_rules 2")
    });
    let upstream = Upstream::start();
    let config = dir.path().join("envoy.yaml");
    sluice(&[
        "envoy-config",
        "--listen",
        "127.0.0.1:0",
        "--envoy-admin",
        "127.0.0.1:0",
        "--upstream",
        &upstream.addr().to_string(),
        "--rls",
        &admin.rls_addr().to_string(),
        "--rules",
        &rules,
        "--rls-key-header",
        "api_key=x-api-key",
        "--rls-token",
        admin.rls_credentials().token.as_deref().unwrap(),
        // Generous, as above: a decision timing out fails open.
        "--rls-timeout-ms",
        "2000",
        "-o",
        &config.display().to_string(),
    ]);
    let envoy = EnvoyProcess::start(&EnvoyLaunch {
        envoy: Artifacts::from_env().envoy(),
        config: &config,
        concurrency: Some(2),
        log_level: "warn",
        cpus: None,
        dir: dir.path(),
        name: "rendered",
        ready_timeout: Duration::from_secs(20),
        listener: Some(LISTENER_NAME),
    })
    .unwrap_or_else(|err| panic!("{err:#}"));
    check_a_limit_binds_behind(envoy.listener(), &admin);
    check_far_above_behind(envoy.listener(), "tenant");
    // Neither header: no descriptor, so nothing to limit.
    let client = Client::connect(envoy.listener(), 1);
    assert_eq!(client.passed(&Req::get("/rls"), 5), 5);
}

/// An envoyproxy/ratelimit configuration using every behaviour of its format, each on
/// descriptors of its own so that the scripted traffic below shows each one apart:
/// nested descriptors and "most specific value wins" (`slowpath` → `api_key`), a value's
/// own limit (`acme`), `unlimited` (`ops`), `shadow_mode` on one value (`beta`),
/// `detailed_metric` (accepted; metrics only), wildcard values (`/api/*`, a bucket per
/// path), a limit of 0 (`/api/banned`), `quota_mode` (`/api/soft`), and `replaces`
/// (a promotion's limit replacing a user's own within one request).
const RATELIMIT_CONFIG: &str = "\
domain: edge
descriptors:
  - key: generic_key
    value: slowpath
    descriptors:
      - key: api_key
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 5}
      - key: api_key
        value: acme
        rate_limit: {unit: minute, requests_per_unit: 20}
      - key: api_key
        value: ops
        rate_limit: {unlimited: true}
      - key: api_key
        value: beta
        shadow_mode: true
        rate_limit: {unit: minute, requests_per_unit: 1}
  - key: path
    value: /api/*
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: path
    value: /api/banned
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: path
    value: /api/soft
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: user
    descriptors:
      - key: plan
        value: basic
        rate_limit: {name: user_limit, unit: minute, requests_per_unit: 5}
  - key: promo
    value: spring
    descriptors:
      - key: user
        rate_limit: {replaces: [{name: user_limit}], unit: minute, requests_per_unit: 10}
";

/// The descriptors Envoy sends (each only when its headers are present): the API key
/// under `slowpath`; the path; the user and their plan; a promotion and the user; the
/// tenant (for a Sluice rule with two limits).
fn ratelimit_descriptors() -> Vec<Vec<RlsAction>> {
    [
        "generic:generic_key=slowpath,header:x-api-key=api_key",
        "header:x-path=path",
        "header:x-user=user,header:x-plan=plan",
        "header:x-promo=promo,header:x-user=user",
        "header:x-tenant=tenant",
    ]
    .iter()
    .map(|d| RlsAction::parse_list(d).unwrap())
    .collect()
}

/// `sluice ARGS...`, which must succeed; its standard error.
fn sluice(args: &[&str]) -> String {
    let output = std::process::Command::new(Artifacts::from_env().sluice_bin())
        .args(args)
        .output()
        .expect("running sluice");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "sluice {args:?}: {stderr}");
    stderr
}

/// The configuration imported with `--for rls` and applied as written, behind Envoy's
/// `rate_limits` actions, plus one Sluice rule with two limits on one descriptor: within
/// a minute each client gets what that configuration gives it (a fixed window's count is
/// the bucket's burst; a refill of a few a minute adds at most one over the test), the
/// statuses Envoy turns into headers, and what shadow rules add upstream.
#[test]
fn rls_imported_ratelimit_configuration_serves_every_behaviour_of_its_format() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, RATELIMIT_CONFIG).unwrap();
    let rules = dir.path().join("rules.yaml");
    let (config, rules) = (config.display().to_string(), rules.display().to_string());
    let stderr = sluice(&[
        "rules",
        "import",
        "--from",
        "envoy-ratelimit",
        "--for",
        "rls",
        &config,
        "-o",
        &rules,
    ]);
    assert!(
        stderr.contains("converted 9 rule(s); 0 part(s) skipped"),
        "{stderr}"
    );
    let admin = AdminServer::start_rls(None);
    let url = admin.url();
    sluice(&[
        "rules",
        "apply",
        "-f",
        &rules,
        "--url",
        &url,
        "--token",
        ADMIN_TOKEN,
    ]);
    let two_limits = json!({
        "name": "tenant", "key": "global",
        "limits": [{"requests": 4, "period": "minute"}, {"requests": 3, "period": "hour"}],
        "descriptor": {"domain": "edge", "entries": [{"key": "tenant"}]}
    });
    let (status, body) = admin.call(Method::POST, "/api/v1/rules", Some(two_limits));
    assert_eq!(status, 201, "{body}");
    wait_for("the rules in force", Duration::from_secs(5), || {
        admin.metrics_text().contains("sluice_rls_rules 10")
    });
    let setup = Setup::with_envoy(admin, ratelimit_descriptors());
    let client = Client::connect(setup.envoy.listener_addr(), 2);
    let started = std::time::Instant::now();
    let with = |headers: &[(&str, &str)]| {
        headers
            .iter()
            .fold(Req::get("/rls"), |r, (name, value)| r.header(*name, *value))
    };
    let passed = |headers: &[(&str, &str)], n: usize| client.passed(&with(headers), n);

    // Nested descriptors; the most specific value wins; unlimited; shadow per value.
    let alice = passed(&[("x-api-key", "alice")], 10);
    let acme = passed(&[("x-api-key", "acme")], 30);
    let ops = passed(&[("x-api-key", "ops")], 30);
    let beta = passed(&[("x-api-key", "beta")], 5);
    let unkeyed = passed(&[], 5);
    // Wildcard values, a bucket per value; a limit of 0 beats the wildcard; quota mode.
    let items = passed(&[("x-path", "/api/items")], 6);
    let orders = passed(&[("x-path", "/api/orders")], 6);
    let banned = passed(&[("x-path", "/api/banned")], 3);
    let soft = passed(&[("x-path", "/api/soft")], 4);
    let elsewhere = passed(&[("x-path", "/static")], 5);
    // Replaces: the user's own limit, then a promotion's replacing it in the same request.
    let basic = [("x-user", "bob"), ("x-plan", "basic")];
    let own = passed(&basic, 8);
    let promoted = passed(&[basic[0], basic[1], ("x-promo", "spring")], 12);
    // Several limits on one descriptor: the hour's 3 binds before the minute's 4.
    let tenant = passed(&[("x-tenant", "t1")], 6);

    let slack =
        |per_minute: f64| (per_minute * started.elapsed().as_secs_f64() / 60.0).ceil() as usize;
    let within = |got: usize, burst: usize, per_minute: f64| {
        (burst..=burst + slack(per_minute)).contains(&got)
    };
    assert!(within(alice, 5, 5.0), "alice (5 a minute): {alice}");
    assert!(within(acme, 20, 20.0), "acme (its own 20 a minute): {acme}");
    assert_eq!(ops, 30, "ops is unlimited");
    assert_eq!(beta, 5, "beta's limit is in shadow mode");
    assert_eq!(unkeyed, 5, "no API key: no descriptor, no limit");
    assert!(within(items, 3, 3.0), "/api/items: {items}");
    assert!(
        within(orders, 3, 3.0),
        "/api/orders has its own bucket: {orders}"
    );
    assert_eq!(banned, 0, "a limit of 0 denies everything");
    assert_eq!(soft, 4, "quota mode never denies");
    assert_eq!(elsewhere, 5, "no rule for /static");
    assert!(within(own, 5, 5.0), "bob's own limit: {own}");
    assert!(
        within(promoted, 10, 10.0),
        "the promotion replaces it: {promoted}"
    );
    assert_eq!(tenant, 3, "the hour's limit binds");

    // What Envoy made of the statuses: the headers a denied client sees, and the header a
    // shadow (quota-mode) denial adds to the request upstream.
    let denied = client.send(with(&[("x-path", "/api/banned")]));
    assert_eq!(denied.status, 429);
    assert_eq!(
        denied
            .header("x-ratelimit-limit")
            .map(|l| l.starts_with('0')),
        Some(true),
        "{denied:?}"
    );
    let unlimited = client.send(with(&[("x-api-key", "ops")]));
    assert_eq!(unlimited.status, 200);
    let over_hour = client.send(with(&[("x-tenant", "t1")]));
    assert_eq!(
        over_hour
            .header("x-ratelimit-limit")
            .map(|l| l.starts_with("3, 3;w=3600")),
        Some(true),
        "{over_hour:?}"
    );
    let quota = client.send(with(&[("x-path", "/api/soft")]));
    assert_eq!(quota.status, 200);
    assert!(
        quota
            .upstream_header("x-sluice-shadow-denied")
            .is_some_and(|rule| rule.contains("soft")),
        "{quota:?}"
    );
    assert!(setup.metric("sluice_rls_descriptors_total{outcome=\"shadow_denied\"} ") >= 7.0);
}

/// Two `sluice serve` replicas on one Redis, each asked by its own Envoy, one API key
/// sent to both at once: they answer one fleet, so the key's admissions in all stay within
/// one bucket's `burst + rate × elapsed`, never one per replica. (Each replica has its own
/// SQLite database holding the same rule: the rule's id names the buckets, so both charge
/// the same ones, as replicas sharing one database do.)
#[test]
fn rls_on_redis_two_replicas_behind_two_envoys_share_one_bucket() {
    if !redis_available() {
        return;
    }
    let redis = RedisServer::start();
    let a = Setup::start(Some(&redis.url()), per_key_rule(50, 50));
    let b = Setup::start(Some(&redis.url()), per_key_rule(50, 50));
    let targets = [a.envoy.listener_addr(), b.envoy.listener_addr()]
        .into_iter()
        .map(|addr| (addr, CONNECTIONS / 2));
    let outcome = Load::new(targets)
        .for_duration(Duration::from_secs(3))
        .run(|_| keyed("alice"))
        .unwrap_or_else(|err| panic!("{err:#}"));
    assert_eq!(outcome.total.errors, 0, "{:?}", outcome.total.first_error);
    assert_one_bucket("alice", &outcome, 0.97);
    assert_no_rls_failures(&[&a, &b]);
}

/// `key`'s admissions over a load through several Envoys: every Envoy both admitted and
/// refused some, and all together admitted within [`floor_share`, 1.0] of one bucket's
/// `burst + rate × elapsed`. The ceiling reads the client's outer window, the floor the
/// inner one in which Envoy was surely deciding (less one request for the refill in
/// flight), so a slow machine cannot fail it.
fn assert_one_bucket(key: &str, outcome: &sluice_tests::Outcome, floor_share: f64) {
    for tally in &outcome.per_target {
        assert!(tally.get(200) > 0 && tally.get(429) > 0, "{key}: {tally:?}");
    }
    let admitted = outcome.total.get(200) as f64;
    let ceiling = BURST + RATE * outcome.elapsed.as_secs_f64();
    assert!(
        admitted <= ceiling,
        "{key}: over-admission: {admitted} admitted, at most {ceiling:.1} in {:.3} s",
        outcome.elapsed.as_secs_f64()
    );
    let floor = BURST + RATE * outcome.total.busy().as_secs_f64();
    assert!(
        admitted >= floor * floor_share - 1.0,
        "{key}: under-admission: {admitted} admitted, {floor:.1} refilled in {:.3} s",
        outcome.total.busy().as_secs_f64()
    );
}

/// No replica failed to reach Redis, lost a compare-and-set race for good, or ran out of
/// buckets.
fn assert_no_rls_failures(setups: &[&Setup]) {
    for setup in setups {
        for reason in ["unavailable", "contended", "max_buckets"] {
            let line = format!("sluice_rls_failures_total{{reason=\"{reason}\"}} ");
            assert_eq!(setup.metric(&line), 0.0, "{reason}");
        }
    }
}

/// Three Envoys calling two `sluice serve` replicas on one Redis (two of them the first
/// replica), two API keys driven at once through all three for a duration: each key's
/// admissions stay within [0.99, 1.0] of its bucket's `burst + rate × elapsed`, a token
/// bucket's figure (a fixed window would admit up to twice its limit across an edge).
#[test]
fn rls_on_redis_three_envoys_two_replicas_admit_each_descriptor_exactly() {
    if !redis_available() {
        return;
    }
    let redis = RedisServer::start();
    let a = Setup::start(Some(&redis.url()), per_key_rule(50, 50));
    let b = Setup::start(Some(&redis.url()), per_key_rule(50, 50));
    let api_key = vec!["header:x-api-key=api_key".parse().unwrap()];
    let (_upstream, third) = envoy_asking(&a.admin, vec![api_key]);
    let envoys = [
        a.envoy.listener_addr(),
        b.envoy.listener_addr(),
        third.listener_addr(),
    ];
    let drive = |key: &'static str| {
        std::thread::spawn(move || {
            Load::new(envoys.map(|addr| (addr, 2)))
                .for_duration(Duration::from_secs(4))
                .run(move |_| keyed(key))
                .unwrap_or_else(|err| panic!("{err:#}"))
        })
    };
    let (alice, bob) = (drive("alice"), drive("bob"));
    for (key, outcome) in [
        ("alice", alice.join().unwrap()),
        ("bob", bob.join().unwrap()),
    ] {
        assert_eq!(
            outcome.total.errors, 0,
            "{key}: {:?}",
            outcome.total.first_error
        );
        assert_one_bucket(key, &outcome, 0.99);
    }
    assert_no_rls_failures(&[&a, &b]);
}
