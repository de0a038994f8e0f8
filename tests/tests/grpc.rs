//! gRPC calls through a real Envoy over HTTP/2 (h2c): a denied call is a gRPC error a
//! client understands (RESOURCE_EXHAUSTED with `grpc-retry-pushback-ms`), not an HTTP 429
//! that gRPC would turn into UNAVAILABLE and retry at once.
//!
//! The upstream is a real tonic server running the standard gRPC health service, reached by
//! Envoy over HTTP/2; the client is tonic's generated health client.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::json;
use sluice_tests::{Client, Envoy, EnvoyOptions, Req, Target, UpstreamProtocol};
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;
use tonic::{Code, Request, Status};
use tonic_health::ServingStatus;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

/// One call per two seconds per key: the pushback is short enough to wait out in a test.
fn rules() -> serde_json::Value {
    json!([{
        "name": "h2", "key": {"header": "x-api-key"},
        "limits": [{"requests": 1, "period": 2}]
    }])
}

/// A gRPC health server on 127.0.0.1, serving until the test's runtime ends.
async fn grpc_upstream() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (reporter, service) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("", ServingStatus::Serving)
        .await;
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await
    });
    addr
}

fn envoy_in_front_of(upstream: SocketAddr) -> Envoy {
    tokio::task::block_in_place(|| {
        Envoy::start(EnvoyOptions {
            rules: rules(),
            upstream: Target::Cluster(upstream),
            upstream_protocol: UpstreamProtocol::Http2,
            ..Default::default()
        })
    })
}

async fn health_client(envoy: &Envoy) -> HealthClient<Channel> {
    let channel = Channel::from_shared(format!("http://{}", envoy.listener_addr()))
        .unwrap()
        .timeout(Duration::from_secs(10))
        .connect()
        .await
        .unwrap();
    HealthClient::new(channel)
}

async fn check(client: &mut HealthClient<Channel>, key: &str) -> Result<i32, Status> {
    let mut request = Request::new(HealthCheckRequest {
        service: String::new(),
    });
    request
        .metadata_mut()
        .insert("x-api-key", MetadataValue::try_from(key).unwrap());
    client.check(request).await.map(|r| r.into_inner().status)
}

fn pushback_ms(status: &Status) -> u64 {
    status
        .metadata()
        .get("grpc-retry-pushback-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no grpc-retry-pushback-ms: {status:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttled_grpc_call_is_resource_exhausted_with_a_pushback_that_holds() {
    let envoy = envoy_in_front_of(grpc_upstream().await);
    let mut client = health_client(&envoy).await;

    assert_eq!(
        check(&mut client, "alice")
            .await
            .expect("the first call is allowed"),
        ServingStatus::Serving as i32,
        "the allowed call reached the server"
    );
    let denied = check(&mut client, "alice").await.unwrap_err();
    let answered = Instant::now();
    assert_eq!(denied.code(), Code::ResourceExhausted, "{denied:?}");
    assert_eq!(
        denied.message(),
        "rate limit 'h2' (1 requests per 2 s) is exhausted; retry in 2 s"
    );
    let pushback = pushback_ms(&denied);
    assert!(
        (1..=2_000).contains(&pushback),
        "pushback {pushback} ms for one call per 2 s"
    );
    let metadata = denied.metadata();
    assert_eq!(
        metadata.get("ratelimit-policy").unwrap(),
        r#""h2";q=1;w=2"#,
        "the rate-limit fields travel as metadata"
    );
    assert!(metadata.get("ratelimit").is_some());

    // A client that follows gRPC's retry design waits for the pushback: a call sooner is
    // still refused, and one after it goes through (the pushback is rounded up, so the
    // token is there).
    if answered.elapsed() < Duration::from_millis(pushback) {
        let early = check(&mut client, "alice").await.unwrap_err();
        assert_eq!(early.code(), Code::ResourceExhausted);
    }
    let wait = Duration::from_millis(pushback_ms(&check(&mut client, "alice").await.unwrap_err()));
    tokio::time::sleep(wait).await;
    assert_eq!(
        check(&mut client, "alice")
            .await
            .expect("after the pushback the call goes through"),
        ServingStatus::Serving as i32,
    );
    assert!(tokio::task::block_in_place(|| envoy.counter("wasmcustom.sluice_denied_total")) >= 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http2_and_grpc_web_requests_next_to_grpc_get_their_own_answers() {
    let envoy = envoy_in_front_of(grpc_upstream().await);

    // Plain HTTP/2 without TLS (prior knowledge), not gRPC: the usual 429 + problem+json.
    let stream = tokio::net::TcpStream::connect(envoy.listener_addr())
        .await
        .unwrap();
    let (mut h2, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(connection);
    let mut statuses = Vec::new();
    let mut last = None;
    for _ in 0..2 {
        let request = hyper::Request::get(format!("http://{}/plain", envoy.listener_addr()))
            .header("x-api-key", "h2c")
            .body(Empty::<Bytes>::new())
            .unwrap();
        let response = h2.send_request(request).await.unwrap();
        statuses.push(response.status().as_u16());
        let content_type = response
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_string());
        let _ = response.into_body().collect().await;
        last = content_type;
    }
    assert_ne!(statuses[0], 429, "the first request passes");
    assert_eq!(statuses[1], 429);
    assert_eq!(last.as_deref(), Some("application/problem+json"));

    // gRPC-Web straight to the filter (no grpc_web filter in front): a trailers-only
    // gRPC-Web answer, status and message in the headers.
    let client = tokio::task::block_in_place(|| Client::connect(envoy.listener_addr(), 1));
    let web = || {
        Req::post(
            "/grpc.health.v1.Health/Check",
            Bytes::from_static(&[0, 0, 0, 0, 0]),
        )
        .header("content-type", "application/grpc-web+proto")
        .header("x-api-key", "web")
    };
    let responses = tokio::task::block_in_place(|| client.run([web(), web()]));
    let denied = &responses[1];
    assert_eq!(denied.status, 200, "{denied:?}");
    assert_eq!(denied.header("grpc-status"), Some("8"), "{denied:?}");
    assert!(
        denied
            .header("grpc-message")
            .is_some_and(|m| m.contains("rate limit 'h2'")),
        "{denied:?}"
    );
    let pushback: u64 = denied
        .header("grpc-retry-pushback-ms")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no pushback: {denied:?}"));
    assert!((1..=2_000).contains(&pushback));
}
