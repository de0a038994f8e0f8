//! Envoy's quota service (RLQS, `sluice serve --rls-listen`) over real gRPC: a tonic client
//! from Envoy's own protos streams usage reports to a real server and reads its
//! assignments; and every bound of the long-lived, client-driven stream (streams in all,
//! streams per connection, buckets per stream, message size, idle time), each tested on
//! both sides. (The assignments' arithmetic is tested in `sluice-core`'s `rls::quota`.)

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Action;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use serde_json::{Value, json};
use sluice_admin::rls::{ASSIGNMENT_TTL, MAX_MESSAGE_BYTES, RlsAuth, RlsLimits};
use sluice_admin::server::ServeOptions;
use sluice_admin::testing::{Backend, TestApp, TestDb, TestServer};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;
use tonic::transport::Channel;

/// 10 a second per API key, burst 20, for buckets `{api_key: KEY}` of domain `edge`.
fn per_key() -> Value {
    json!({
        "name": "per-key", "key": "global",
        "limits": [{"requests": 10, "period": "second", "burst": 20}],
        "descriptor": {"domain": "edge", "entries": [{"key": "api_key"}]}
    })
}

async fn server(limits: RlsLimits) -> (TestDb, TestServer) {
    let db = TestDb::new(Backend::Sqlite).await.expect("sqlite");
    TestApp::new(&db).await.create(&per_key()).await;
    let server = TestServer::start_with(
        &db,
        ServeOptions {
            rls_listen: Some("127.0.0.1:0".parse().unwrap()),
            rls_limits: limits,
            // The protocol alone: tokens are `rls_auth.rs`'s.
            rls_auth: RlsAuth::None,
            ..ServeOptions::default()
        },
    )
    .await;
    (db, server)
}

async fn channel(addr: SocketAddr) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .expect("connecting to the quota service")
}

/// One open stream: reports go in, answers come out.
struct Quota {
    reports: mpsc::Sender<RateLimitQuotaUsageReports>,
    answers: Streaming<RateLimitQuotaResponse>,
}

async fn open(channel: Channel) -> Result<Quota, tonic::Status> {
    let (reports, outbound) = mpsc::channel(16);
    let answers = RateLimitQuotaServiceClient::new(channel)
        .max_decoding_message_size(64 << 20)
        .stream_rate_limit_quotas(ReceiverStream::new(outbound))
        .await?
        .into_inner();
    Ok(Quota { reports, answers })
}

fn usage(key: &str, allowed: u64) -> BucketQuotaUsage {
    BucketQuotaUsage {
        bucket_id: Some(BucketId {
            bucket: HashMap::from([("api_key".to_string(), key.to_string())]),
        }),
        num_requests_allowed: allowed,
        ..BucketQuotaUsage::default()
    }
}

fn report(usages: Vec<BucketQuotaUsage>) -> RateLimitQuotaUsageReports {
    RateLimitQuotaUsageReports {
        domain: "edge".into(),
        bucket_quota_usages: usages,
    }
}

impl Quota {
    async fn send(&self, usages: Vec<BucketQuotaUsage>) {
        self.reports
            .send(report(usages))
            .await
            .expect("stream open");
    }

    async fn answer(&mut self) -> Result<Option<RateLimitQuotaResponse>, tonic::Status> {
        tokio::time::timeout(Duration::from_secs(5), self.answers.message())
            .await
            .expect("an answer within 5 s")
    }

    /// The next answer's actions, by the bucket's API key.
    async fn actions(&mut self) -> HashMap<String, Action> {
        let answer = self.answer().await.expect("an answer").expect("open");
        answer
            .bucket_action
            .into_iter()
            .map(|a| {
                let key = a.bucket_id.unwrap().bucket["api_key"].clone();
                (key, a.bucket_action.unwrap())
            })
            .collect()
    }
}

/// `(max_tokens, tokens_per_fill, fill_interval seconds)` of a token-bucket assignment.
fn token_bucket(action: &Action) -> (u32, u32, i64) {
    let Action::QuotaAssignmentAction(assignment) = action else {
        panic!("an assignment: {action:?}");
    };
    assert_eq!(
        assignment.assignment_time_to_live.unwrap().seconds,
        ASSIGNMENT_TTL.as_secs() as i64
    );
    match assignment.rate_limit_strategy.unwrap().strategy.unwrap() {
        Strategy::TokenBucket(tb) => (
            tb.max_tokens,
            tb.tokens_per_fill.unwrap().value,
            tb.fill_interval.unwrap().seconds,
        ),
        other => panic!("a token bucket: {other:?}"),
    }
}

async fn metric(server: &TestServer, line_prefix: &str) -> f64 {
    let text = reqwest::get(format!("{}/metrics", server.base))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(line_prefix))
        .map_or(0.0, |v| v.trim().parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buckets_are_assigned_shares_of_their_rule_and_usage_is_charged() {
    let (_db, server) = server(RlsLimits::default()).await;
    let addr = server.server.rls_addr().unwrap();
    let mut first = open(channel(addr).await).await.unwrap();
    let started = std::time::Instant::now();
    // A new bucket whose first request Envoy allowed: the rule's rate, the burst less it.
    first.send(vec![usage("acme", 1)]).await;
    assert_eq!(token_bucket(&first.actions().await["acme"]), (19, 10, 1));
    // The same assignment again while nothing changes: Envoy keeps its bucket's level.
    first.send(vec![usage("acme", 5)]).await;
    assert_eq!(token_bucket(&first.actions().await["acme"]), (19, 10, 1));
    // A bucket no rule decides is allowed everything.
    first
        .reports
        .send(RateLimitQuotaUsageReports {
            domain: "edge".into(),
            bucket_quota_usages: vec![BucketQuotaUsage {
                bucket_id: Some(BucketId {
                    bucket: HashMap::from([("other".to_string(), "x".to_string())]),
                }),
                ..BucketQuotaUsage::default()
            }],
        })
        .await
        .unwrap();
    let answer = first.answer().await.unwrap().unwrap();
    let Some(Action::QuotaAssignmentAction(a)) = &answer.bucket_action[0].bucket_action else {
        panic!("{answer:?}");
    };
    assert_eq!(
        a.rate_limit_strategy.unwrap().strategy,
        Some(Strategy::BlanketRule(BlanketRule::AllowAll as i32))
    );

    // A second stream holding the same client's bucket: both get half the rate (10 per
    // 2 s) and of the burst; the first at its next report.
    let mut second = open(channel(addr).await).await.unwrap();
    second.send(vec![usage("acme", 0)]).await;
    let (burst, per_fill, interval) = token_bucket(&second.actions().await["acme"]);
    assert_eq!((per_fill, interval), (10, 2));
    assert!(burst <= 10, "at most half the burst: {burst}");
    first.send(vec![usage("acme", 0)]).await;
    assert_eq!(token_bucket(&first.actions().await["acme"]).2, 2);

    // The usage (6 requests) went to the fleet's bucket: an RLS caller of the same rule
    // finds it gone (the bucket refills 10 a second meanwhile).
    let mut rls = RateLimitServiceClient::new(channel(addr).await);
    let answer = rls
        .should_rate_limit(RateLimitRequest {
            domain: "edge".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "api_key".into(),
                    value: "acme".into(),
                }],
                ..RateLimitDescriptor::default()
            }],
            hits_addend: 0,
        })
        .await
        .unwrap()
        .into_inner();
    let refilled = (started.elapsed().as_secs_f64() * 10.0).ceil() as u32;
    let remaining = answer.statuses[0].limit_remaining;
    assert!(
        remaining <= 13 + refilled,
        "{remaining} left, {refilled} refilled"
    );
    assert!(metric(&server, "sluice_rlqs_reports_total ").await >= 5.0);
    assert_eq!(metric(&server, "sluice_rlqs_streams ").await, 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_in_all_are_capped_and_a_closed_one_frees_its_place() {
    let limits = RlsLimits {
        max_quota_streams: 2,
        ..RlsLimits::default()
    };
    let (_db, server) = server(limits).await;
    let addr = server.server.rls_addr().unwrap();
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut q = open(channel(addr).await).await.unwrap();
        q.send(vec![usage("a", 1)]).await;
        q.actions().await;
        held.push(q);
    }
    let refused = open(channel(addr).await).await.err().expect("refused");
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
    assert_eq!(
        metric(
            &server,
            "sluice_rlqs_refused_total{reason=\"max_streams\"} "
        )
        .await,
        1.0
    );
    drop(held.pop());
    // The place is given back once the server sees the stream end.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        match open(channel(addr).await).await {
            Ok(mut q) => {
                q.send(vec![usage("a", 1)]).await;
                q.actions().await;
                break;
            }
            Err(_) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("the place was not given back: {e:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_per_connection_wait_for_a_free_http2_stream() {
    let limits = RlsLimits {
        max_streams: 2,
        ..RlsLimits::default()
    };
    let (_db, server) = server(limits).await;
    let addr = server.server.rls_addr().unwrap();
    let connection = channel(addr).await;
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut q = open(connection.clone()).await.unwrap();
        q.send(vec![usage("a", 1)]).await;
        q.actions().await;
        held.push(q);
    }
    // A third stream on the same connection is not served while two are open...
    let third = tokio::spawn(async move {
        let mut q = open(connection).await.unwrap();
        q.send(vec![usage("a", 1)]).await;
        q.actions().await
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!third.is_finished(), "served past the connection's streams");
    // ...and is once one of them ends.
    drop(held.pop());
    let actions = tokio::time::timeout(Duration::from_secs(5), third)
        .await
        .expect("served after a stream ended")
        .unwrap();
    assert!(actions.contains_key("a"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buckets_per_stream_are_capped_new_ones_get_no_assignment() {
    let limits = RlsLimits {
        max_stream_buckets: 3,
        ..RlsLimits::default()
    };
    let (_db, server) = server(limits).await;
    let mut q = open(channel(server.server.rls_addr().unwrap()).await)
        .await
        .unwrap();
    q.send((0..3).map(|i| usage(&format!("k{i}"), 1)).collect())
        .await;
    assert_eq!(q.actions().await.len(), 3, "up to the bound: all assigned");
    q.send(vec![usage("k0", 1), usage("k3", 1)]).await;
    let actions = q.actions().await;
    assert!(
        actions.contains_key("k0") && !actions.contains_key("k3"),
        "{actions:?}"
    );
    assert_eq!(
        metric(
            &server,
            "sluice_rlqs_refused_total{reason=\"max_stream_buckets\"} "
        )
        .await,
        1.0
    );
    // A report naming more buckets than a stream may hold is refused whole.
    q.send((0..4).map(|i| usage(&format!("k{i}"), 1)).collect())
        .await;
    let refused = q.answer().await.expect_err("refused");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(
        refused.message().contains("bucket_quota_usages"),
        "{refused:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_over_the_message_size_ends_the_stream_one_under_is_answered() {
    let limits = RlsLimits {
        max_stream_buckets: 100_000,
        ..RlsLimits::default()
    };
    let (_db, server) = server(limits).await;
    let addr = server.server.rls_addr().unwrap();
    // Buckets with 1,000-character keys: about 1 KiB each on the wire.
    let big = |n: usize| -> Vec<BucketQuotaUsage> {
        (0..n).map(|i| usage(&format!("{i:0>1000}"), 1)).collect()
    };
    let under = MAX_MESSAGE_BYTES / 1_100;
    let mut q = open(channel(addr).await).await.unwrap();
    q.send(big(under)).await;
    assert_eq!(q.actions().await.len(), under);
    let mut q = open(channel(addr).await).await.unwrap();
    q.send(big(MAX_MESSAGE_BYTES / 1_000 + 10)).await;
    let refused = q.answer().await.expect_err("refused");
    assert_eq!(refused.code(), tonic::Code::OutOfRange, "{refused:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_stream_ends_after_the_idle_timeout_a_reporting_one_stays() {
    let limits = RlsLimits {
        quota_idle_timeout: Duration::from_millis(400),
        ..RlsLimits::default()
    };
    let (_db, server) = server(limits).await;
    let addr = server.server.rls_addr().unwrap();
    let mut reporting = open(channel(addr).await).await.unwrap();
    let mut quiet = open(channel(addr).await).await.unwrap();
    quiet.send(vec![usage("q", 1)]).await;
    quiet.actions().await;
    for _ in 0..8 {
        reporting.send(vec![usage("r", 1)]).await;
        reporting.actions().await;
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    let ended = quiet.answer().await.expect_err("ended");
    assert_eq!(ended.code(), tonic::Code::DeadlineExceeded, "{ended:?}");
    reporting.send(vec![usage("r", 1)]).await;
    assert!(
        reporting.actions().await.contains_key("r"),
        "1.2 s, still open"
    );
    assert!(metric(&server, "sluice_rlqs_refused_total{reason=\"idle\"} ").await >= 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_bucket_is_abandoned_an_active_one_kept() {
    let limits = RlsLimits {
        abandon_after: Duration::from_millis(300),
        ..RlsLimits::default()
    };
    let (_db, server) = server(limits).await;
    let mut q = open(channel(server.server.rls_addr().unwrap()).await)
        .await
        .unwrap();
    q.send(vec![usage("idle", 1), usage("busy", 1)]).await;
    q.actions().await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    q.send(vec![usage("idle", 0), usage("busy", 3)]).await;
    let actions = q.actions().await;
    assert!(
        matches!(actions["idle"], Action::AbandonAction(_)),
        "{actions:?}"
    );
    token_bucket(&actions["busy"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_id_without_entries_is_refused_with_its_field() {
    let (_db, server) = server(RlsLimits::default()).await;
    let mut q = open(channel(server.server.rls_addr().unwrap()).await)
        .await
        .unwrap();
    q.reports
        .send(report(vec![BucketQuotaUsage::default()]))
        .await
        .unwrap();
    let refused = q.answer().await.expect_err("refused");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(
        refused
            .message()
            .contains("bucket_quota_usages[0].bucket_id"),
        "{refused:?}"
    );
}

/// Waits until `/api/v1/metrics/rules` shows rule `rule` with `denied` denials, and
/// returns its row.
async fn rule_counts(server: &TestServer, rule: &str, denied: u64) -> Value {
    let now = sluice_admin::store::now_ms();
    let range = format!("from={}&to={}", now - 60_000, now + 60_000);
    let started = std::time::Instant::now();
    loop {
        let rules = server.json(&format!("/api/v1/metrics/rules?{range}")).await;
        let row = rules["rules"]
            .as_array()
            .and_then(|rules| rules.iter().find(|r| r["rule"] == rule).cloned());
        if let Some(row) = row.filter(|r| r["denied"] == denied) {
            return row;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "{rules}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reported_usage_reaches_the_rules_reports_and_per_rule_counters() {
    let (_db, server) = server(RlsLimits::default()).await;
    let mut quota = open(channel(server.server.rls_addr().unwrap()).await)
        .await
        .unwrap();
    let denied = |key: &str, allowed: u64, denied: u64| BucketQuotaUsage {
        num_requests_denied: denied,
        ..usage(key, allowed)
    };
    quota
        .send(vec![denied("acme", 12, 5), denied("globex", 3, 0)])
        .await;
    quota.actions().await;
    quota.send(vec![denied("acme", 4, 2)]).await;
    quota.actions().await;

    // The same reports the filter's decisions reach: its rule's counts and top clients.
    let row = rule_counts(&server, "per-key", 7).await;
    assert_eq!(row["allowed"], 19, "{row}");
    let now = sluice_admin::store::now_ms();
    let range = format!("from={}&to={}", now - 60_000, now + 60_000);
    let clients = server
        .json(&format!("/api/v1/metrics/clients?{range}"))
        .await;
    assert_eq!(clients["clients"][0]["client"], "acme", "{clients}");
    assert_eq!(
        clients["clients"].as_array().map(Vec::len),
        Some(1),
        "a client denied nothing is not throttled: {clients}"
    );
    assert_eq!(
        metric(
            &server,
            "sluice_rule_denied_total{sluice_rule=\"per-key\"} "
        )
        .await,
        7.0
    );
    assert_eq!(
        metric(
            &server,
            "sluice_rule_allowed_total{sluice_rule=\"per-key\"} "
        )
        .await,
        19.0
    );
}

/// A shadow rule's bucket is assigned `ALLOW_ALL`, so Envoy admits everything; what its
/// bucket had no room for is counted as its would-be denials (`shadow_denied`), as a
/// shadow descriptor of `ShouldRateLimit` is, and only what fitted is charged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_rules_usage_over_its_limit_counts_as_shadow_denied() {
    let db = TestDb::new(Backend::Sqlite).await.expect("sqlite");
    let trial = json!({
        "name": "trial", "key": "global", "mode": "shadow",
        "limits": [{"requests": 1, "period": "minute"}],
        "descriptor": {"domain": "edge", "entries": [{"key": "api_key"}]}
    });
    TestApp::new(&db).await.create(&trial).await;
    let server = TestServer::start_with(
        &db,
        ServeOptions {
            rls_listen: Some("127.0.0.1:0".parse().unwrap()),
            rls_auth: RlsAuth::None,
            ..ServeOptions::default()
        },
    )
    .await;
    let mut quota = open(channel(server.server.rls_addr().unwrap()).await)
        .await
        .unwrap();
    quota.send(vec![usage("acme", 5)]).await;
    quota.actions().await;
    quota.send(vec![usage("acme", 2)]).await;
    quota.actions().await;

    let counter = |outcome: &str| format!("sluice_rule_{outcome}_total{{sluice_rule=\"trial\"}} ");
    let started = std::time::Instant::now();
    while metric(&server, &counter("shadow_denied")).await < 6.0 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "shadow_denied: {}",
            metric(&server, &counter("shadow_denied")).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // One request of the minute fitted; the other six would have been denied.
    assert_eq!(metric(&server, &counter("shadow_denied")).await, 6.0);
    assert_eq!(metric(&server, &counter("allowed")).await, 1.0);
    assert_eq!(metric(&server, &counter("denied")).await, 0.0);
}
