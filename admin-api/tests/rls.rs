//! Envoy's rate limit service (`sluice serve --rls-listen`) over real gRPC: a tonic client
//! from Envoy's own protos against a real server, in memory and on a real Redis (two
//! replicas sharing one server, or a Redis Cluster), plain and over TLS; and every bound a client is held to
//! (message size, descriptors, entries, string lengths, costs, connections, the call's
//! timeout), each refused with a clear status and changing nothing. (The decisions
//! themselves are tested in `sluice-core`'s `rls` module.)

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use sluice_admin::http::AppState;
use sluice_admin::pipeline::MetricsConfig;
use sluice_admin::rls::{MAX_MESSAGE_BYTES, RlsAuth, RlsLimits};
use sluice_admin::server::ServeOptions;
use sluice_admin::testing::{Backend, TestApp, TestDb, TestServer};
use sluice_coordinator::redis::RedisBuckets;
use sluice_core::rls::{MAX_DESCRIPTORS, MAX_DOMAIN_LEN, MAX_ENTRIES, MAX_KEY_LEN, MAX_VALUE_LEN};
use sluice_core::rule::MAX_COST;
use sluice_harness::{RedisCluster, RedisServer, redis_available};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tonic::transport::{Channel, Endpoint};

/// Two a second per API key, burst 2, for descriptors `(api_key, KEY)` of domain `edge`.
fn per_key() -> Value {
    json!({
        "name": "per-key", "key": "global",
        "limits": [{"requests": 2, "period": "second", "burst": 2}],
        "descriptor": {"domain": "edge", "entries": [{"key": "api_key"}]}
    })
}

async fn db_with(rule: &Value) -> TestDb {
    let db = TestDb::new(Backend::Sqlite).await.expect("sqlite");
    TestApp::new(&db).await.create(rule).await;
    db
}

fn options(limits: RlsLimits) -> ServeOptions {
    ServeOptions {
        rls_listen: Some("127.0.0.1:0".parse().unwrap()),
        rls_limits: limits,
        // The protocol alone: tokens are `rls_auth.rs`'s.
        rls_auth: RlsAuth::None,
        ..ServeOptions::default()
    }
}

async fn client(addr: SocketAddr) -> RateLimitServiceClient<Channel> {
    RateLimitServiceClient::connect(format!("http://{addr}"))
        .await
        .expect("connecting to the rate limit service")
}

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect(),
        ..RateLimitDescriptor::default()
    }
}

fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors,
        hits_addend: 0,
    }
}

fn key(key: &str) -> RateLimitRequest {
    request("edge", vec![descriptor(&[("api_key", key)])])
}

async fn ask(
    client: &mut RateLimitServiceClient<Channel>,
    r: RateLimitRequest,
) -> RateLimitResponse {
    client
        .should_rate_limit(r)
        .await
        .expect("an answer")
        .into_inner()
}

fn code(response: &RateLimitResponse) -> Code {
    Code::try_from(response.overall_code).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_descriptor_gets_its_status_with_the_limit_and_what_is_left() {
    let db = db_with(&per_key()).await;
    let server = TestServer::start_with(&db, options(RlsLimits::default())).await;
    let mut rls = client(server.server.rls_addr().unwrap()).await;

    let first = ask(&mut rls, key("alice")).await;
    assert_eq!(code(&first), Code::Ok);
    let status = &first.statuses[0];
    let limit = status.current_limit.as_ref().unwrap();
    assert_eq!(
        (limit.requests_per_unit, limit.name.as_str()),
        (2, "per-key")
    );
    assert_eq!(Unit::try_from(limit.unit).unwrap(), Unit::Second);
    assert_eq!(status.limit_remaining, 1);
    assert!(status.duration_until_reset.is_some());

    assert_eq!(
        ask(&mut rls, key("alice")).await.statuses[0].limit_remaining,
        0
    );
    let third = ask(&mut rls, key("alice")).await;
    assert_eq!(code(&third), Code::OverLimit);
    let wait = third.statuses[0].duration_until_reset.unwrap();
    assert_eq!(
        (wait.seconds, wait.nanos),
        (1, 0),
        "half a second, rounded up"
    );

    // Another key, a descriptor no rule decides, another domain: their own answers.
    let mixed = ask(
        &mut rls,
        request(
            "edge",
            vec![
                descriptor(&[("api_key", "bob")]),
                descriptor(&[("path", "/")]),
            ],
        ),
    )
    .await;
    assert_eq!(code(&mixed), Code::Ok);
    assert_eq!(mixed.statuses.len(), 2);
    assert!(mixed.statuses[1].current_limit.is_none());
    let elsewhere = ask(
        &mut rls,
        request("other", vec![descriptor(&[("api_key", "alice")])]),
    )
    .await;
    assert_eq!(code(&elsewhere), Code::Ok);

    // Over the limit on one descriptor: the other, which fitted, is not charged.
    let both = ask(
        &mut rls,
        request(
            "edge",
            vec![
                descriptor(&[("api_key", "dave")]),
                descriptor(&[("api_key", "alice")]),
            ],
        ),
    )
    .await;
    assert_eq!(code(&both), Code::OverLimit);
    assert_eq!(
        ask(&mut rls, key("dave")).await.statuses[0].limit_remaining,
        1
    );

    let metrics = reqwest::get(format!("{}/metrics", server.base))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for line in [
        "sluice_rls_descriptors_total{outcome=\"not_charged\"} 1",
        "sluice_rls_requests_total{code=\"over_limit\"} 2",
        "sluice_rls_requests_total{code=\"ok\"} 5",
        "sluice_rls_descriptors_total{outcome=\"denied\"} 2",
        "sluice_rls_descriptors_total{outcome=\"unlimited\"} 2",
        "sluice_rls_rules 1",
    ] {
        assert!(metrics.contains(line), "{line} in\n{metrics}");
    }

    // The same decisions reach the reports the dashboard reads, as a proxy's would.
    let now = sluice_admin::store::now_ms();
    let range = format!("from={}&to={}", now - 60_000, now + 60_000);
    let started = Instant::now();
    let rules = loop {
        let rules = server.json(&format!("/api/v1/metrics/rules?{range}")).await;
        let per_key = rules["rules"]
            .as_array()
            .and_then(|rules| rules.iter().find(|r| r["rule"] == "per-key").cloned());
        if let Some(r) = per_key.filter(|r| r["denied"] == 2) {
            break r;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "{rules}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(rules["allowed"], 4, "{rules}");
    let clients = server
        .json(&format!("/api/v1/metrics/clients?{range}"))
        .await;
    assert_eq!(clients["clients"][0]["client"], "alice", "{clients}");

    // And the per-rule counters, named as the filter's are in Envoy.
    let metrics = reqwest::get(format!("{}/metrics", server.base))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for line in [
        "sluice_rule_allowed_total{sluice_rule=\"per-key\"} 4",
        "sluice_rule_denied_total{sluice_rule=\"per-key\"} 2",
        "sluice_rule_near_limit_total{sluice_rule=\"per-key\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} in\n{metrics}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_change_reaches_the_service_at_once() {
    let db = TestDb::new(Backend::Sqlite).await.expect("sqlite");
    let server = TestServer::start_with(&db, options(RlsLimits::default())).await;
    let mut rls = client(server.server.rls_addr().unwrap()).await;
    assert!(
        ask(&mut rls, key("alice")).await.statuses[0]
            .current_limit
            .is_none()
    );
    server
        .post("/api/v1/rules")
        .json(&per_key())
        .send()
        .await
        .unwrap()
        .error_for_status()
        .unwrap();
    let started = Instant::now();
    loop {
        if ask(&mut rls, key("carol")).await.statuses[0]
            .current_limit
            .is_some()
        {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the rule never applied"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Every bound of a request, one past it: `INVALID_ARGUMENT` naming the field, and the
/// bucket the request would have charged is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bound_is_refused_with_invalid_argument_and_charges_nothing() {
    let db = db_with(&per_key()).await;
    let server = TestServer::start_with(&db, options(RlsLimits::default())).await;
    let mut rls = client(server.server.rls_addr().unwrap()).await;
    let alice = || descriptor(&[("api_key", "alice")]);
    let mut cases: Vec<(&str, RateLimitRequest)> = Vec::new();
    cases.push((
        "descriptors",
        request("edge", vec![alice(); MAX_DESCRIPTORS + 1]),
    ));
    let many: Vec<(String, String)> = (0..=MAX_ENTRIES)
        .map(|i| (format!("k{i}"), "v".to_string()))
        .collect();
    let many: Vec<(&str, &str)> = many.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    cases.push((
        "descriptors[1].entries",
        request("edge", vec![alice(), descriptor(&many)]),
    ));
    cases.push((
        "descriptors[1].entries",
        request("edge", vec![alice(), descriptor(&[])]),
    ));
    let long_key = "k".repeat(MAX_KEY_LEN + 1);
    cases.push((
        "descriptors[1].entries[0].key",
        request("edge", vec![alice(), descriptor(&[(&long_key, "v")])]),
    ));
    let long_value = "v".repeat(MAX_VALUE_LEN + 1);
    cases.push((
        "descriptors[1].entries[0].value",
        request(
            "edge",
            vec![alice(), descriptor(&[("api_key", &long_value)])],
        ),
    ));
    cases.push((
        "domain",
        request(&"d".repeat(MAX_DOMAIN_LEN + 1), vec![alice()]),
    ));
    cases.push(("domain", request("", vec![alice()])));
    let mut costly = request("edge", vec![alice()]);
    costly.hits_addend = u32::try_from(MAX_COST + 1).unwrap();
    cases.push(("hits_addend", costly));
    let mut own = alice();
    own.hits_addend = Some(envoy_types::pb::google::protobuf::UInt64Value {
        value: MAX_COST + 1,
    });
    cases.push(("descriptors[0].hits_addend", request("edge", vec![own])));
    let mut negative = alice();
    negative.is_negative_hits = true;
    cases.push((
        "descriptors[0].is_negative_hits",
        request("edge", vec![negative]),
    ));
    for (field, r) in cases {
        let status = rls.should_rate_limit(r).await.unwrap_err();
        assert_eq!(
            status.code(),
            tonic::Code::InvalidArgument,
            "{field}: {status:?}"
        );
        assert!(
            status.message().starts_with(field),
            "{field}: {}",
            status.message()
        );
    }
    let after = ask(&mut rls, key("alice")).await;
    assert_eq!(after.statuses[0].limit_remaining, 1, "nothing was charged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_over_the_size_limit_is_refused_unread() {
    let db = db_with(&per_key()).await;
    let server = TestServer::start_with(&db, options(RlsLimits::default())).await;
    let mut rls = client(server.server.rls_addr().unwrap()).await;
    // 64 descriptors of 16 entries whose values are long but each within its bound:
    // over the message limit as a whole.
    let value = "v".repeat(MAX_VALUE_LEN / 2);
    let entries: Vec<(String, String)> = (0..MAX_ENTRIES)
        .map(|i| (format!("k{i}"), value.clone()))
        .collect();
    let entries: Vec<(&str, &str)> = entries
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let big = request("edge", vec![descriptor(&entries); MAX_DESCRIPTORS]);
    assert!(MAX_DESCRIPTORS * MAX_ENTRIES * value.len() > MAX_MESSAGE_BYTES);
    let status = rls.should_rate_limit(big).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::OutOfRange, "{status:?}");
    assert_eq!(code(&ask(&mut rls, key("alice")).await), Code::Ok);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_cap_are_closed_at_once() {
    let db = db_with(&per_key()).await;
    let limits = RlsLimits {
        max_connections: 2,
        ..RlsLimits::default()
    };
    let server = TestServer::start_with(&db, options(limits)).await;
    let addr = server.server.rls_addr().unwrap();
    let held = [
        TcpStream::connect(addr).await.unwrap(),
        TcpStream::connect(addr).await.unwrap(),
    ];
    let mut third = TcpStream::connect(addr).await.unwrap();
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_secs(5), third.read(&mut byte))
        .await
        .expect("closed at once, not held");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    drop(held);
    // The slots free as the held connections close.
    let started = Instant::now();
    loop {
        if let Ok(mut rls) = RateLimitServiceClient::connect(format!("http://{addr}")).await {
            if rls.should_rate_limit(key("alice")).await.is_ok() {
                break;
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "slots never freed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let metrics = reqwest::get(format!("{}/metrics", server.base))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    // The third, and any attempt above made before a held connection's close was seen.
    let refused: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("sluice_rls_refused_connections_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    assert!(refused >= 1, "{metrics}");
}

/// The streams a connection may have in flight and the size of a call's metadata are
/// announced in the server's first HTTP/2 SETTINGS frame, read here byte by byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_per_connection_and_metadata_size_are_announced_to_the_client() {
    use tokio::io::AsyncWriteExt;
    let db = db_with(&per_key()).await;
    let limits = RlsLimits {
        max_streams: 3,
        ..RlsLimits::default()
    };
    let server = TestServer::start_with(&db, options(limits)).await;
    let mut h2 = TcpStream::connect(server.server.rls_addr().unwrap())
        .await
        .unwrap();
    // The client preface, then an empty SETTINGS frame.
    h2.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    h2.write_all(&[0, 0, 0, 0x4, 0, 0, 0, 0, 0]).await.unwrap();
    let mut header = [0u8; 9];
    tokio::time::timeout(Duration::from_secs(5), h2.read_exact(&mut header))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(header[3], 0x4, "the server's first frame is SETTINGS");
    let len = usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
    let mut payload = vec![0u8; len];
    h2.read_exact(&mut payload).await.unwrap();
    let settings: Vec<(u16, u32)> = payload
        .chunks_exact(6)
        .map(|c| {
            (
                u16::from_be_bytes([c[0], c[1]]),
                u32::from_be_bytes([c[2], c[3], c[4], c[5]]),
            )
        })
        .collect();
    assert!(
        settings.contains(&(0x3, 3)),
        "MAX_CONCURRENT_STREAMS: {settings:?}"
    );
    assert!(
        settings.contains(&(0x6, sluice_admin::rls::MAX_HEADER_LIST_BYTES)),
        "MAX_HEADER_LIST_SIZE: {settings:?}"
    );
}

/// A client that connects and sends nothing is closed after the handshake timeout, and
/// its slot is free again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_connection_is_closed_after_the_handshake_timeout() {
    let db = db_with(&per_key()).await;
    let limits = RlsLimits {
        max_connections: 1,
        tls_handshake_timeout: Duration::from_millis(300),
        ..RlsLimits::default()
    };
    let server = TestServer::start_with(&db, options(limits)).await;
    let addr = server.server.rls_addr().unwrap();
    let mut silent = TcpStream::connect(addr).await.unwrap();
    let started = Instant::now();
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_secs(5), silent.read(&mut byte))
        .await
        .expect("closed, not held");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    assert!(
        started.elapsed() >= Duration::from_millis(250),
        "{:?}",
        started.elapsed()
    );
    let mut rls = client(addr).await;
    assert_eq!(code(&ask(&mut rls, key("alice")).await), Code::Ok);
}

/// Over TLS the service speaks HTTP/2 with the server's certificate (ALPN `h2`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_the_service_answers_with_the_servers_certificate() {
    let db = db_with(&per_key()).await;
    let pki = pki();
    let server = TestServer::start_with(
        &db,
        ServeOptions {
            tls: Some(pki.server.clone()),
            ..options(RlsLimits::default())
        },
    )
    .await;
    let addr = server.server.rls_addr().unwrap();
    let connector = pki.client.clone();
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_with_connector(tower::service_fn(move |_| {
            let connector = connector.clone();
            async move {
                let tcp = TcpStream::connect(addr).await?;
                let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
                let tls = connector.connect(name, tcp).await?;
                Ok::<_, std::io::Error>(TokioIo::new(tls))
            }
        }))
        .await
        .expect("a TLS connection");
    let mut rls = RateLimitServiceClient::new(channel);
    assert_eq!(code(&ask(&mut rls, key("alice")).await), Code::Ok);
    // Plain HTTP/2 to the TLS listener gets no answer.
    let plain = tokio::time::timeout(Duration::from_secs(5), async {
        let mut c = RateLimitServiceClient::connect(format!("http://{addr}"))
            .await
            .ok()?;
        c.should_rate_limit(key("a")).await.ok()
    })
    .await;
    assert!(matches!(plain, Ok(None)), "{plain:?}");
}

struct Pki {
    _dir: tempfile::TempDir,
    server: Arc<rustls::ServerConfig>,
    client: tokio_rustls::TlsConnector,
}

/// A throwaway CA and a server certificate for 127.0.0.1; a client trusting the CA that
/// asks for HTTP/2.
fn pki() -> Pki {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (cert_path, key_path) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert_path, cert.pem()).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    let server = sluice_admin::tls::server_config(&cert_path, &key_path).unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.der().clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut client = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    client.alpn_protocols = vec![b"h2".to_vec()];
    Pki {
        _dir: dir,
        server,
        client: tokio_rustls::TlsConnector::from(Arc::new(client)),
    }
}

/// A replica of `sluice serve` whose buckets live in the Redis at `url`.
async fn replica(db: &TestDb, url: &str, limits: RlsLimits) -> TestServer {
    let redis = RedisBuckets::connect(url).await.expect("redis");
    let state = AppState::with_options(
        db.store.clone(),
        MetricsConfig::default(),
        sluice_coordinator::Backend::Redis(redis),
        sluice_admin::http::failed_auth::FailureLimit::default(),
    )
    .await
    .expect("state");
    TestServer::over(db, state, options(limits)).await
}

/// Two replicas on one Redis answer one fleet: a burst of 2 is 2 in all, whichever
/// replica each call reaches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_two_replicas_share_each_bucket() {
    if !redis_available() {
        return;
    }
    let redis = RedisServer::start();
    two_replicas_share_each_bucket(&redis.url()).await;
}

/// The same on a Redis Cluster of three masters (`redis+cluster://`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_redis_cluster_two_replicas_share_each_bucket() {
    if !redis_available() {
        return;
    }
    let cluster = RedisCluster::start();
    two_replicas_share_each_bucket(&cluster.url()).await;
}

async fn two_replicas_share_each_bucket(url: &str) {
    let db = db_with(&per_key()).await;
    let a = replica(&db, url, RlsLimits::default()).await;
    let b = replica(&db, url, RlsLimits::default()).await;
    let mut ra = client(a.server.rls_addr().unwrap()).await;
    let mut rb = client(b.server.rls_addr().unwrap()).await;
    let mut admitted = 0;
    for i in 0..10 {
        let rls = if i % 2 == 0 { &mut ra } else { &mut rb };
        if code(&ask(rls, key("alice")).await) == Code::Ok {
            admitted += 1;
        }
    }
    // At 2 a second, the calls' own duration may refill a token or two.
    assert!((2..=3).contains(&admitted), "{admitted} admitted");
}

/// Redis that stops answering (its port taken over by a listener that reads and never
/// writes): the call is answered within `--rls-request-timeout`, never held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_hangs_is_cut_off_by_the_calls_timeout() {
    if !redis_available() {
        return;
    }
    let mut redis = RedisServer::start();
    let db = db_with(&per_key()).await;
    let limits = RlsLimits {
        request_timeout: Duration::from_millis(200),
        ..RlsLimits::default()
    };
    let server = replica(&db, &redis.url(), limits).await;
    let mut rls = client(server.server.rls_addr().unwrap()).await;
    assert_eq!(code(&ask(&mut rls, key("alice")).await), Code::Ok);
    let port = redis.addr();
    redis.kill();
    let hang = tokio::net::TcpListener::bind(port).await.expect("the port");
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((stream, _)) = hang.accept().await {
            open.push(stream);
        }
    });
    for _ in 0..3 {
        let started = Instant::now();
        let answer = rls.should_rate_limit(key("alice")).await;
        let took = started.elapsed();
        assert!(
            took < Duration::from_millis(1_500),
            "held {took:?}: {answer:?}"
        );
        // Cut off by the timeout, or (when the connection manager gave up first) decided
        // by the rule's failure mode: open.
        match answer {
            Ok(r) => assert_eq!(code(r.get_ref()), Code::Ok),
            Err(status) => assert_eq!(status.code(), tonic::Code::Cancelled, "{status:?}"),
        }
    }
    held.abort();
}

/// The answers of envoyproxy/ratelimit's fixed behaviours, as that service gives them: a
/// deny list (its limit of 0) is over the limit with `requests_per_unit` 0, an unlimited
/// value is `OK` with the most `limit_remaining` and no limit, and a shadow (quota-mode)
/// rule that would have denied passes, naming itself in a header Envoy adds upstream and
/// in ratelimit's quota-mode dynamic metadata.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deny_lists_unlimited_values_and_shadow_denials_answer_as_ratelimit_does() {
    let db = TestDb::new(Backend::Sqlite).await.expect("sqlite");
    let app = TestApp::new(&db).await;
    app.create(&json!({
        "name": "banned", "key": "global", "limits": [],
        "descriptor": {"domain": "edge", "answer": "deny",
                       "entries": [{"key": "api_key", "value": "mallory"}]}
    }))
    .await;
    app.create(&json!({
        "name": "ops", "key": "global", "limits": [],
        "descriptor": {"domain": "edge", "answer": "unlimited",
                       "entries": [{"key": "api_key", "value": "ops"}]}
    }))
    .await;
    app.create(&json!({
        "name": "soft", "key": "global", "mode": "shadow",
        "limits": [{"requests": 1, "period": "minute"}],
        "descriptor": {"domain": "edge", "entries": [{"key": "tenant"}]}
    }))
    .await;
    let server = TestServer::start_with(&db, options(RlsLimits::default())).await;
    let mut rls = client(server.server.rls_addr().unwrap()).await;

    let banned = ask(&mut rls, key("mallory")).await;
    assert_eq!(code(&banned), Code::OverLimit);
    let limit = banned.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!(
        (limit.requests_per_unit, limit.name.as_str()),
        (0, "banned")
    );

    for _ in 0..5 {
        let ops = ask(&mut rls, key("ops")).await;
        assert_eq!(code(&ops), Code::Ok);
        assert_eq!(ops.statuses[0].limit_remaining, u32::MAX);
        assert!(ops.statuses[0].current_limit.is_none());
    }

    let tenant = || request("edge", vec![descriptor(&[("tenant", "t1")])]);
    let first = ask(&mut rls, tenant()).await;
    assert!(first.request_headers_to_add.is_empty() && first.dynamic_metadata.is_none());
    let second = ask(&mut rls, tenant()).await;
    assert_eq!(code(&second), Code::Ok, "shadow never denies");
    let header = &second.request_headers_to_add[0];
    assert_eq!(
        (header.key.as_str(), header.value.as_str()),
        ("x-sluice-shadow-denied", "soft")
    );
    let metadata = second.dynamic_metadata.unwrap();
    assert!(metadata.fields.contains_key("quotaModeViolations"));
}

/// Per key, failing closed: a call the bucket bound turns away is `OVER_LIMIT`.
fn per_key_failing_closed() -> Value {
    let mut rule = per_key();
    rule["failure_mode"] = json!("closed");
    rule
}

/// `--quota-max-buckets 3`: three keys get buckets, the fourth (a new bucket past the
/// bound) is decided by the rule's failure mode and counted, while the first three keep
/// being charged.
async fn check_the_bucket_bound(state: &AppState, server: &TestServer) {
    state.set_quota_bounds(sluice_coordinator::guard::Bounds {
        max_buckets: 3,
        max_buckets_per_proxy: 3,
    });
    let mut rls = client(server.server.rls_addr().unwrap()).await;
    for k in ["k1", "k2", "k3"] {
        let answer = ask(&mut rls, key(k)).await;
        assert_eq!(code(&answer), Code::Ok, "{k}: at the bound");
        assert_eq!(answer.statuses[0].limit_remaining, 1, "{k}: charged");
    }
    assert_eq!(
        code(&ask(&mut rls, key("k4")).await),
        Code::OverLimit,
        "past it"
    );
    assert_eq!(
        ask(&mut rls, key("k1")).await.statuses[0].limit_remaining,
        0
    );
    let metrics = server
        .http
        .get(format!("{}/metrics", server.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("sluice_rls_failures_total{reason=\"max_buckets\"} 1"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory_rls_buckets_count_against_the_bucket_bound() {
    let db = db_with(&per_key_failing_closed()).await;
    let state = AppState::new(db.store.clone()).await.unwrap();
    let server = TestServer::over(&db, state.clone(), options(RlsLimits::default())).await;
    check_the_bucket_bound(&state, &server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_rls_buckets_count_against_the_bucket_bound() {
    if !redis_available() {
        return;
    }
    let redis = RedisServer::start();
    let db = db_with(&per_key_failing_closed()).await;
    let buckets = RedisBuckets::connect(&redis.url()).await.expect("redis");
    let state = AppState::with_options(
        db.store.clone(),
        MetricsConfig::default(),
        sluice_coordinator::Backend::Redis(buckets),
        sluice_admin::http::failed_auth::FailureLimit::default(),
    )
    .await
    .expect("state");
    let server = TestServer::over(&db, state.clone(), options(RlsLimits::default())).await;
    check_the_bucket_bound(&state, &server).await;
}
