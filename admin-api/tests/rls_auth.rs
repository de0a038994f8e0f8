//! Who may call the rate limit and quota services (`sluice serve --rls-listen --rls-auth
//! token`): a tonic client from Envoy's own protos against a real server. A call without a
//! proxy token, with a wrong, revoked or malformed one, or with a token of another role is
//! refused before anything is read or charged, and counted; wrong tokens spend the same
//! failed-authentication budget per address as the HTTP API's, on both sides of it; a
//! valid proxy token is answered as before. (Client certificates, `--rls-client-ca`, are
//! tested with a real Envoy in `tests/tests/rls.rs`.)

use std::collections::HashMap;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{BucketId, RateLimitQuotaUsageReports};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use serde_json::json;
use sluice_admin::http::failed_auth::ALLOWED_FAILURES;
use sluice_admin::rls::RlsAuth;
use sluice_admin::server::ServeOptions;
use sluice_admin::store::Role;
use sluice_admin::testing::{Backend, TestApp, TestDb, TestServer};
use tonic::transport::Channel;

/// One request a minute for the key `alice` of domain `edge`: a charged call shows.
async fn server() -> (TestDb, TestServer) {
    let db = TestDb::new(Backend::Sqlite).await.expect("sqlite");
    let rule = json!({
        "name": "per-key", "key": "global",
        "limits": [{"requests": 1, "period": "minute"}],
        "descriptor": {"domain": "edge", "entries": [{"key": "api_key"}]}
    });
    TestApp::new(&db).await.create(&rule).await;
    let server = TestServer::start_with(
        &db,
        ServeOptions {
            rls_listen: Some("127.0.0.1:0".parse().unwrap()),
            rls_auth: RlsAuth::Token,
            ..ServeOptions::default()
        },
    )
    .await;
    (db, server)
}

async fn channel(server: &TestServer) -> Channel {
    let addr = server.server.rls_addr().unwrap();
    Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .expect("connecting to the rate limit service")
}

/// A call for `alice` with `authorization` metadata when given.
fn call(authorization: Option<&str>) -> tonic::Request<RateLimitRequest> {
    let mut call = tonic::Request::new(RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "api_key".into(),
                value: "alice".into(),
            }],
            ..RateLimitDescriptor::default()
        }],
        hits_addend: 0,
    });
    if let Some(value) = authorization {
        call.metadata_mut()
            .insert("authorization", value.parse().unwrap());
    }
    call
}

async fn ask(
    channel: &Channel,
    authorization: Option<&str>,
) -> Result<RateLimitResponse, tonic::Status> {
    RateLimitServiceClient::new(channel.clone())
        .should_rate_limit(call(authorization))
        .await
        .map(tonic::Response::into_inner)
}

async fn refused(channel: &Channel, authorization: Option<&str>) -> tonic::Code {
    match ask(channel, authorization).await {
        Ok(answer) => panic!("{authorization:?} was answered: {answer:?}"),
        Err(status) => status.code(),
    }
}

fn code(answer: &RateLimitResponse) -> Code {
    Code::try_from(answer.overall_code).unwrap()
}

async fn unauthenticated(server: &TestServer, reason: &str) -> f64 {
    let text = server
        .get("/metrics")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let line = format!("sluice_rls_unauthenticated_total{{reason=\"{reason}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&line))
        .map_or(0.0, |v| v.trim().parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_proxy_token_is_answered_and_refused_calls_charge_nothing() {
    let (db, server) = server().await;
    let channel = channel(&server).await;
    let revoked = db.revoked_token(Role::Proxy).await;
    let viewer = db.token(Role::Viewer).await;
    let proxy = db.token(Role::Proxy).await;

    assert_eq!(refused(&channel, None).await, tonic::Code::Unauthenticated);
    for wrong in [
        "Bearer slc_not_a_token".to_string(),
        format!("Basic {proxy}"),
        format!("Bearer {revoked}"),
    ] {
        assert_eq!(
            refused(&channel, Some(&wrong)).await,
            tonic::Code::Unauthenticated,
            "{wrong}"
        );
    }
    let viewer = format!("Bearer {viewer}");
    assert_eq!(
        refused(&channel, Some(&viewer)).await,
        tonic::Code::PermissionDenied
    );
    assert_eq!(unauthenticated(&server, "missing_token").await, 1.0);
    assert_eq!(unauthenticated(&server, "bad_token").await, 3.0);
    assert_eq!(unauthenticated(&server, "wrong_role").await, 1.0);

    // The one request of the minute is still there: nothing refused took it.
    let proxy = format!("Bearer {proxy}");
    let first = ask(&channel, Some(&proxy)).await.expect("answered");
    assert_eq!(code(&first), Code::Ok, "{first:?}");
    let second = ask(&channel, Some(&proxy)).await.expect("answered");
    assert_eq!(code(&second), Code::OverLimit, "{second:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_tokens_spend_the_addresss_failure_budget_and_a_valid_one_still_passes() {
    let (db, server) = server().await;
    let channel = channel(&server).await;
    let proxy = format!("Bearer {}", db.token(Role::Proxy).await);
    let wrong = Some("Bearer slc_guessed");
    for i in 0..ALLOWED_FAILURES {
        assert_eq!(
            refused(&channel, wrong).await,
            tonic::Code::Unauthenticated,
            "failure {i} is within the budget"
        );
    }
    assert_eq!(
        refused(&channel, wrong).await,
        tonic::Code::ResourceExhausted,
        "one failure past the budget"
    );
    assert_eq!(unauthenticated(&server, "throttled").await, 1.0);
    let answer = ask(&channel, Some(&proxy))
        .await
        .expect("a valid token passes");
    assert_eq!(code(&answer), Code::Ok);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_stream_opens_only_with_a_proxy_token() {
    let (db, server) = server().await;
    let channel = channel(&server).await;
    let open = |authorization: Option<String>| {
        let channel = channel.clone();
        async move {
            let report = RateLimitQuotaUsageReports {
                domain: "edge".into(),
                bucket_quota_usages: vec![BucketQuotaUsage {
                    bucket_id: Some(BucketId {
                        bucket: HashMap::from([("api_key".into(), "alice".into())]),
                    }),
                    num_requests_allowed: 1,
                    ..BucketQuotaUsage::default()
                }],
            };
            let mut call = tonic::Request::new(tokio_stream::iter([report]));
            if let Some(value) = authorization {
                call.metadata_mut()
                    .insert("authorization", value.parse().unwrap());
            }
            RateLimitQuotaServiceClient::new(channel)
                .stream_rate_limit_quotas(call)
                .await
                .map(|_| ())
        }
    };
    let refused = open(None).await.expect_err("no token");
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);
    assert_eq!(unauthenticated(&server, "missing_token").await, 1.0);
    // The refused stream's report charged nothing: the minute's request is still there.
    let proxy = format!("Bearer {}", db.token(Role::Proxy).await);
    let answer = ask(&channel, Some(&proxy)).await.expect("answered");
    assert_eq!(code(&answer), Code::Ok, "{answer:?}");
    open(Some(proxy))
        .await
        .expect("a proxy token opens a stream");
}
