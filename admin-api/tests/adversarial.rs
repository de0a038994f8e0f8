//! Abuse of the HTTP layer, each attack reproduced against a real server on 127.0.0.1 and
//! each bound checked on both sides (just within it is served, beyond it is refused):
//! made-up methods as metric labels, slowloris over plain TCP and TLS, idle keep-alive
//! connections, the connection cap, header floods, huge query strings and paths, absurd
//! methods, floods of live metric streams, deeply nested rules files, rules files that take
//! longer than the parse-time bound, replayed syncs and reports, and `/metrics` on a
//! listener of its own.
//!
//! No test depends on the machine's speed: waits are bounded by [`PATIENCE`], and where a
//! timeout is checked, it is checked from below (a timer cannot fire early) and within a
//! generous bound from above.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use sluice_admin::conn::{ConnLimits, MAX_HEAD_BYTES, MAX_HEADERS};
use sluice_admin::http::AppState;
use sluice_admin::http::streams::{MAX_STREAMS, MAX_STREAMS_PER_TOKEN};
use sluice_admin::server::ServeOptions;
use sluice_admin::store::Role;
use sluice_admin::testing::{Backend, PATIENCE, TestDb, TestServer, assert_contains};
use sluice_rules_file::MAX_NESTING;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::TcpStream;

async fn sqlite() -> TestDb {
    TestDb::new(Backend::Sqlite)
        .await
        .expect("SQLite is always there")
}

/// The server's address, from its base URL.
fn addr(api: &TestServer) -> SocketAddr {
    api.server.addr()
}

/// Writes `request` on `stream` and reads until the server closes the connection (or
/// [`PATIENCE`] runs out): the whole answer, as text.
async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(stream: &mut S, request: &[u8]) -> String {
    // A refused connection may be reset before the request is written: that is an answer.
    let _ = stream.write_all(request).await;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(PATIENCE, stream.read_to_end(&mut answer)).await;
    String::from_utf8_lossy(&answer).into_owned()
}

/// [`exchange`] on a new plain connection to `addr`.
async fn raw(addr: SocketAddr, request: &[u8]) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    exchange(&mut stream, request).await
}

/// The status code of an HTTP/1.1 answer; 0 when there is none (the connection was closed
/// without one).
fn status(answer: &str) -> u16 {
    answer
        .strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
        .unwrap_or(0)
}

/// A GET of `path` that closes its connection after the answer.
fn get(path: &str, extra_headers: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{extra_headers}Connection: close\r\n\r\n")
        .into_bytes()
}

/// Waits, at most [`PATIENCE`], for the server to close `stream`; returns how long after
/// `since` it did. Fails the test if it stays open.
async fn closed_after<S: AsyncRead + Unpin>(stream: &mut S, since: Instant) -> Duration {
    let mut buf = [0u8; 1024];
    let deadline = Instant::now() + PATIENCE;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.read(&mut buf)).await {
            Ok(Ok(0) | Err(_)) => return since.elapsed(),
            Ok(Ok(_)) => continue,
            Err(_) => panic!("the server kept the connection open for {PATIENCE:?}"),
        }
    }
}

/// The value of the sample `name` (with its labels, if any) in OpenMetrics `text`.
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// Waits, at most [`PATIENCE`], until `check` holds of the server's metrics.
async fn wait_for_metrics(api: &TestServer, what: &str, check: impl Fn(&str) -> bool) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let text = api.metrics().await;
        if check(&text) {
            return;
        }
        assert!(Instant::now() < deadline, "never: {what}\n{text}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Limits for the timeout tests: one timeout short enough to wait out, the others long.
fn limits(header: Duration, idle: Duration, handshake: Duration, max: usize) -> ConnLimits {
    ConnLimits {
        header_read_timeout: header,
        idle_timeout: idle,
        tls_handshake_timeout: handshake,
        max_connections: max,
    }
}

const SHORT: Duration = Duration::from_secs(1);
const LONG: Duration = Duration::from_secs(60);
/// Long enough for the steps a slowloris test takes while its connections are held.
const HEAD_TIMEOUT: Duration = Duration::from_secs(3);

/// The first finding: any request with a made-up method was answered 405 but added its
/// method as a new label value to two metric families (20,000 long methods grew `/metrics`
/// to 458 MB). Now every made-up method is `other`, and `/metrics` does not grow with
/// them; a known method keeps its own label, and an unmatched path is one route value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn made_up_methods_are_one_metric_label_and_metrics_stay_small() {
    let db = sqlite().await;
    let api = TestServer::start(&db).await;
    let send = |i: usize| {
        let method =
            reqwest::Method::from_bytes(format!("X{}{i}", "M".repeat(1000)).as_bytes()).unwrap();
        let path = if i % 2 == 0 {
            "/api/v1/rules".to_string()
        } else {
            format!("/api/v1/no-such-{i}")
        };
        api.http
            .request(method, format!("{}{path}", api.base))
            .send()
    };
    for i in 0..10 {
        let status = send(i).await.unwrap().status();
        assert!(status.is_client_error(), "{status}");
    }
    api.get("/api/v1/rules").send().await.unwrap();
    // Scraped once first, so `/metrics`' own series exist before the measure.
    api.metrics().await;
    let before = api.metrics().await;
    for i in 10..510 {
        let status = send(i).await.unwrap().status();
        assert!(status.is_client_error(), "{status}");
    }
    api.get("/api/v1/rules").send().await.unwrap();
    let after = api.metrics().await;
    // 500 more made-up methods changed counts, not series: a few digits' growth.
    assert!(
        after.len() < before.len() + 2048,
        "/metrics grew from {} to {} bytes",
        before.len(),
        after.len()
    );
    assert!(!after.contains("MMMM"), "a made-up method became a label");
    assert_contains(&after, "method=\"other\"");
    assert_contains(&after, "method=\"GET\",route=\"/api/v1/rules\"");
    assert_contains(&after, "route=\"(unmatched)\"");
    assert!(
        !after.contains("no-such"),
        "an unmatched path became a label"
    );
}

/// The second finding, over plain TCP: connections that send half a request head are
/// closed after `--header-read-timeout` (not before); up to `--max-connections` are
/// accepted, one more is closed at once (and counted), and a valid client is served
/// throughout, at once just under the cap and as soon as the slow ones are gone over it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_is_closed_after_the_header_timeout_and_valid_clients_are_served() {
    const CAP: usize = 16;
    let db = sqlite().await;
    let options = ServeOptions {
        limits: limits(HEAD_TIMEOUT, LONG, LONG, CAP),
        // The metrics are read on a listener of their own, which has its own cap.
        metrics_listen: Some("127.0.0.1:0".parse().unwrap()),
        ..ServeOptions::default()
    };
    let api = TestServer::start_with(&db, options).await;
    let half_head = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ";
    let mut slow = Vec::new();
    // Each wait is measured from before the connection is opened: the server's timer
    // starts after that, so a close measured sooner than the timeout was early.
    for _ in 0..CAP - 1 {
        let since = Instant::now();
        let mut stream = TcpStream::connect(addr(&api)).await.unwrap();
        stream.write_all(half_head).await.unwrap();
        slow.push((stream, since));
    }
    // Just under the cap: a valid request is served at once (and no HSTS over plain HTTP).
    let answer = raw(addr(&api), &get("/healthz", "")).await;
    assert_eq!(status(&answer), 200, "{answer}");
    assert!(
        !answer
            .to_ascii_lowercase()
            .contains("strict-transport-security")
    );
    // That connection is gone; one more slow one fills the cap.
    wait_for_metrics(&api, "the valid connection closed", |m| {
        sample(m, "sluice_admin_open_connections") <= Some((CAP - 1) as f64 + 1.0)
    })
    .await;
    let since = Instant::now();
    let mut stream = TcpStream::connect(addr(&api)).await.unwrap();
    stream.write_all(half_head).await.unwrap();
    slow.push((stream, since));
    // Over the cap: closed without an answer, and counted as refused. (Until the server
    // has taken the last slow connection, an attempt may still be served: retried.)
    let deadline = Instant::now() + PATIENCE;
    loop {
        let answer = raw(addr(&api), &get("/healthz", "")).await;
        if status(&answer) == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never refused over the cap: {answer}"
        );
    }
    wait_for_metrics(&api, "a refused connection counted", |m| {
        sample(m, "sluice_admin_refused_connections_total") >= Some(1.0)
    })
    .await;
    // Meanwhile a valid client retries until it is served: within the header timeout
    // and a generous bound.
    let started = Instant::now();
    let valid = {
        let target = addr(&api);
        tokio::spawn(async move {
            let deadline = Instant::now() + PATIENCE;
            loop {
                let answer = raw(target, &get("/healthz", "")).await;
                if status(&answer) == 200 {
                    return Instant::now();
                }
                assert!(
                    Instant::now() < deadline,
                    "a valid request was never served"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    for (stream, since) in &mut slow {
        let after = closed_after(stream, *since).await;
        assert!(
            after >= HEAD_TIMEOUT,
            "closed after {after:?}: before the header timeout"
        );
    }
    let served_at = valid.await.unwrap();
    assert!(served_at.duration_since(started) < HEAD_TIMEOUT + PATIENCE);
}

/// Idle keep-alive connections: one that has had its answer and sends nothing more is
/// closed after `--idle-timeout` (not before); a request in flight for longer than that (a
/// live metrics stream) keeps its connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_closed_after_the_idle_timeout_busy_ones_are_kept() {
    let db = sqlite().await;
    let options = ServeOptions {
        limits: limits(LONG, SHORT, LONG, 64),
        ..ServeOptions::default()
    };
    let api = TestServer::start_with(&db, options).await;
    let mut idle = TcpStream::connect(addr(&api)).await.unwrap();
    // The server's idle clock starts when its answer is sent, after this.
    let asked = Instant::now();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let mut answer = [0u8; 1024];
    let n = tokio::time::timeout(PATIENCE, idle.read(&mut answer))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status(&String::from_utf8_lossy(&answer[..n])), 200);
    // A live stream, busy for three idle timeouts: it keeps getting events.
    let mut stream = TcpStream::connect(addr(&api)).await.unwrap();
    let request = format!(
        "GET /api/v1/metrics/stream HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {}\r\n\r\n",
        api.admin
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let after = closed_after(&mut idle, asked).await;
    assert!(
        after >= SHORT,
        "closed after {after:?}: before the idle timeout"
    );
    let opened = Instant::now();
    let mut seen = Vec::new();
    while opened.elapsed() < SHORT * 3 {
        let mut buf = [0u8; 4096];
        let n = tokio::time::timeout(PATIENCE, stream.read(&mut buf))
            .await
            .expect("the stream went quiet")
            .unwrap();
        assert!(
            n > 0,
            "the busy connection was closed after {:?}",
            opened.elapsed()
        );
        seen.extend_from_slice(&buf[..n]);
    }
    assert_contains(&String::from_utf8_lossy(&seen), "event: metrics");
}

/// A throwaway CA and a server certificate it signed for 127.0.0.1, on disk for
/// `server_config`, and a client that trusts the CA.
struct Tls {
    _dir: tempfile::TempDir,
    server: Arc<rustls::ServerConfig>,
    client: tokio_rustls::TlsConnector,
}

fn tls() -> Tls {
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
    let client = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    Tls {
        _dir: dir,
        server,
        client: tokio_rustls::TlsConnector::from(Arc::new(client)),
    }
}

/// Slowloris over TLS: a client that never starts its handshake is closed after
/// `--tls-handshake-timeout`, one that sends half a request head after its handshake
/// after `--header-read-timeout` (neither before); a valid request is answered, with
/// `Strict-Transport-Security`. The silent client counts as a handshake `timeout`, a
/// client speaking plain HTTP to the TLS port as a `tls` failure, and nothing else does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_over_tls_is_closed_after_its_timeouts() {
    let db = sqlite().await;
    let tls = tls();
    let options = ServeOptions {
        limits: limits(SHORT * 2, LONG, SHORT, 64),
        tls: Some(tls.server.clone()),
        // Plain HTTP, so the test's client reads it without the test CA.
        metrics_listen: Some("127.0.0.1:0".parse().unwrap()),
        ..ServeOptions::default()
    };
    let api = TestServer::start_with(&db, options).await;
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let connect = || async {
        let tcp = TcpStream::connect(addr(&api)).await.unwrap();
        tls.client.connect(name.clone(), tcp).await.unwrap()
    };
    // Measured from before connecting: the server's timers start after that.
    let silent_since = Instant::now();
    let mut silent = TcpStream::connect(addr(&api)).await.unwrap();
    let slow_since = Instant::now();
    let mut slow = connect().await;
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        .await
        .unwrap();
    slow.flush().await.unwrap();
    let answer = exchange(&mut connect().await, &get("/healthz", "")).await;
    assert_eq!(status(&answer), 200, "{answer}");
    assert_contains(
        &answer.to_ascii_lowercase(),
        "strict-transport-security: max-age=31536000",
    );
    let after = closed_after(&mut silent, silent_since).await;
    assert!(after >= SHORT, "no handshake: closed after {after:?}");
    let after = closed_after(&mut slow, slow_since).await;
    assert!(after >= SHORT * 2, "half a head: closed after {after:?}");

    let failures =
        |reason: &str| format!("sluice_admin_handshake_failures_total{{reason=\"{reason}\"}}");
    wait_for_metrics(&api, "the silent client counted", |m| {
        sample(m, &failures("timeout")) == Some(1.0)
    })
    .await;
    let answer = raw(addr(&api), &get("/healthz", "")).await;
    assert_eq!(status(&answer), 0, "plain HTTP on the TLS port: {answer}");
    wait_for_metrics(&api, "plain HTTP counted as a TLS failure", |m| {
        sample(m, &failures("tls")) == Some(1.0)
    })
    .await;
    let text = api.metrics().await;
    assert_eq!(sample(&text, &failures("timeout")), Some(1.0), "{text}");
    assert_eq!(
        sample(&text, &failures("client_certificate")),
        None,
        "{text}"
    );
}

/// Header floods: at most [`MAX_HEADERS`] header fields and [`MAX_HEAD_BYTES`] of head
/// (request line included, so a huge query string or path counts); beyond either, 431
/// and the connection is closed. Just within both, the request is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_floods_huge_queries_and_paths_are_answered_431() {
    let db = sqlite().await;
    let api = TestServer::start(&db).await;
    let fields = |n: usize| -> String { (0..n).map(|i| format!("X-F{i}: v\r\n")).collect() };
    // `get` sends Host and Connection besides.
    let within = raw(addr(&api), &get("/healthz", &fields(MAX_HEADERS - 2))).await;
    assert_eq!(status(&within), 200, "{within}");
    let over = raw(addr(&api), &get("/healthz", &fields(MAX_HEADERS - 1))).await;
    assert_eq!(status(&over), 431, "{over}");
    let over = raw(addr(&api), &get("/healthz", &fields(10_000))).await;
    assert_eq!(status(&over), 431, "{over}");

    // One big header; a huge query string; a huge path: a kilobyte under the head's limit
    // each is served, a kilobyte over is refused.
    let big = |n: usize| "a".repeat(n);
    let near = MAX_HEAD_BYTES - 1024;
    let far = MAX_HEAD_BYTES + 1024;
    for (size, expected) in [(near, 200), (far, 431)] {
        let header = format!("X-Big: {}\r\n", big(size));
        let answer = raw(addr(&api), &get("/healthz", &header)).await;
        assert_eq!(status(&answer), expected, "a {size}-byte header");
        let answer = raw(addr(&api), &get(&format!("/healthz?q={}", big(size)), "")).await;
        assert_eq!(status(&answer), expected, "a {size}-byte query");
    }
    for (size, expected) in [(near, 404), (far, 431)] {
        let path = format!("/api/v1/{}", big(size));
        let answer = raw(addr(&api), &get(&path, "")).await;
        assert_eq!(status(&answer), expected, "a {size}-byte path");
        // The answer does not echo the path back.
        assert!(answer.len() < 4096, "{} bytes answered", answer.len());
    }
    // The server is still fine.
    assert_eq!(
        api.http
            .get(format!("{}/healthz", api.base))
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );
}

/// Absurd methods and paths: a method within the head's limit is a 405 or 404, not a
/// crash, and a short answer; one over it is a 431; paths full of escapes, dots and
/// encoded bytes are a plain 404 that does not echo them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absurd_methods_and_paths_get_short_answers() {
    let db = sqlite().await;
    let api = TestServer::start(&db).await;
    let request = |method: &str, path: &str| {
        format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            .into_bytes()
    };
    let long_method = "M".repeat(MAX_HEAD_BYTES / 2);
    let answer = raw(addr(&api), &request(&long_method, "/api/v1/rules")).await;
    assert_eq!(status(&answer), 405, "{}", &answer[..answer.len().min(200)]);
    assert!(answer.len() < 4096 && !answer.contains("MMMM"));
    let answer = raw(addr(&api), &request(&"M".repeat(MAX_HEAD_BYTES + 1), "/")).await;
    assert_eq!(status(&answer), 431);
    for path in [
        "/api/v1/%00%ff%fe/../../../etc/passwd",
        "/api/v1/rules/%2e%2e%2f%2e%2e%2f",
        "/api/v1//////////////////////////////x",
        "/api/v1/rules/%E2%80%AE%F0%9F%92%A9",
    ] {
        let answer = raw(addr(&api), &request("GET", path)).await;
        assert!(
            [400, 401, 404].contains(&status(&answer)),
            "{path}: {answer}"
        );
        assert!(
            answer.len() < 4096 && !answer.contains("passwd"),
            "{answer}"
        );
    }
}

/// Floods of live metric streams (`/api/v1/metrics/stream`): each token may hold
/// [`MAX_STREAMS_PER_TOKEN`] at once and everyone together [`MAX_STREAMS`]; one more is
/// 503 naming the limit, and a closed stream frees its place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metric_stream_floods_are_bounded_per_token_and_in_all() {
    let db = sqlite().await;
    let api = TestServer::start(&db).await;
    let open = |token: String| {
        api.http
            .get(format!("{}/api/v1/metrics/stream", api.base))
            .bearer_auth(token)
            .send()
    };
    let mut tokens = Vec::new();
    let mut held = Vec::new();
    while held.len() < MAX_STREAMS {
        let token = db.token(Role::Viewer).await;
        for _ in 0..MAX_STREAMS_PER_TOKEN.min(MAX_STREAMS - held.len()) {
            let response = open(token.clone()).await.unwrap();
            assert_eq!(response.status(), StatusCode::OK);
            held.push(response);
        }
        tokens.push(token);
    }
    // The first token is at its own limit, a new token at the server's.
    let first = tokens[0].clone();
    let refused = open(first.clone()).await.unwrap();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    let detail: Value = refused.json().await.unwrap();
    let fresh = db.token(Role::Viewer).await;
    let refused = open(fresh.clone()).await.unwrap();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    let everyone: Value = refused.json().await.unwrap();
    assert!(
        detail["detail"]
            .as_str()
            .unwrap()
            .contains("metric streams")
            && everyone["detail"]
                .as_str()
                .unwrap()
                .contains(&MAX_STREAMS.to_string()),
        "{detail} {everyone}"
    );
    // Other requests are still served.
    assert_eq!(
        api.get("/api/v1/rules").send().await.unwrap().status(),
        StatusCode::OK
    );
    // Closing one of the first token's streams frees a place (once the server notices,
    // at its next event).
    held.remove(0);
    let deadline = Instant::now() + PATIENCE;
    loop {
        let response = open(first.clone()).await.unwrap();
        if response.status() == StatusCode::OK {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the closed stream's place was never freed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The fourth finding: a rules body of deeply nested sequences, within the body limit,
/// took seconds to refuse and stalled other requests. Now it is refused before parsing
/// with a 400 that names the nesting limit, `/healthz` answers within a second throughout,
/// and a document just within the limit is parsed (and refused for its shape, 422).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deeply_nested_rules_files_are_refused_without_stalling_the_server() {
    let db = sqlite().await;
    let api = TestServer::start(&db).await;
    let done = Arc::new(AtomicBool::new(false));
    let prober = probe_healthz(&api, done.clone());
    let apply = |body: String, content_type: &'static str| {
        api.post("/api/v1/rules:apply")
            .header("content-type", content_type)
            .body(body)
            .send()
    };
    // Flow and block nesting, a few times each, within the 1 MiB body limit.
    let deep = [
        ("[".repeat(500_000), "application/yaml"),
        ("- ".repeat(400_000), "application/yaml"),
        (
            format!("rules:\n{}", "  - ".repeat(200_000)),
            "application/yaml",
        ),
        ("[".repeat(500_000), "application/json"),
    ];
    for _ in 0..3 {
        for (body, content_type) in &deep {
            let response = apply(body.clone(), content_type).await.unwrap();
            assert_eq!(response.status(), StatusCode::BAD_REQUEST);
            let problem: Value = response.json().await.unwrap();
            let detail = problem["detail"].as_str().unwrap();
            assert!(
                detail.contains("nesting limit") && detail.contains(&MAX_NESTING.to_string()),
                "{detail}"
            );
        }
    }
    // Just within the limit (the top level counts as one): parsed, and refused for what
    // it holds; one level more: refused unparsed.
    let nested = |depth: usize| format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    for content_type in ["application/yaml", "application/json"] {
        let response = apply(nested(MAX_NESTING - 1), content_type).await.unwrap();
        assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);
        let response = apply(nested(MAX_NESTING), content_type).await.unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    }
    healthz_stayed_fast(&done, prober).await;
}

/// `--metrics-listen`: `/metrics` is served on its own listener (and nothing else is),
/// and the main listener answers it 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_can_have_a_listener_of_their_own() {
    let db = sqlite().await;
    let options = ServeOptions {
        metrics_listen: Some("127.0.0.1:0".parse().unwrap()),
        ..ServeOptions::default()
    };
    let api = TestServer::start_with(&db, options).await;
    let metrics = api.server.metrics_addr().unwrap();
    assert_ne!(metrics, addr(&api));
    let text = api.metrics().await;
    assert_contains(&text, "sluice_admin_open_connections");
    let main = api.get("/metrics").send().await.unwrap();
    assert_eq!(main.status(), StatusCode::NOT_FOUND);
    for path in ["/api/v1/rules", "/healthz", "/"] {
        let answer = raw(metrics, &get(path, "")).await;
        assert_eq!(status(&answer), 404, "{path}: {answer}");
    }
}

/// Probes `/healthz` every 20 ms until `done` (five times at least); the slowest answer.
fn probe_healthz(api: &TestServer, done: Arc<AtomicBool>) -> tokio::task::JoinHandle<Duration> {
    let (http, base) = (api.http.clone(), api.base.clone());
    tokio::spawn(async move {
        let mut slowest = Duration::ZERO;
        let mut probes = 0;
        while !done.load(Ordering::SeqCst) || probes < 5 {
            let sent = Instant::now();
            let status = http
                .get(format!("{base}/healthz"))
                .send()
                .await
                .unwrap()
                .status();
            assert_eq!(status, StatusCode::OK);
            slowest = slowest.max(sent.elapsed());
            probes += 1;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        slowest
    })
}

/// Stops [`probe_healthz`]'s prober and checks that `/healthz` never waited a second.
async fn healthz_stayed_fast(done: &AtomicBool, prober: tokio::task::JoinHandle<Duration>) {
    done.store(true, Ordering::SeqCst);
    let slowest = prober.await.unwrap();
    assert!(
        slowest < Duration::from_secs(1),
        "/healthz waited {slowest:?}"
    );
}

/// A server over `db` whose state the test keeps, to change its bounds.
async fn server_over(db: &TestDb) -> (TestServer, AppState) {
    let state = AppState::new(db.store.clone()).await.unwrap();
    let api = TestServer::over(db, state.clone(), ServeOptions::default()).await;
    (api, state)
}

/// The parse-time bound: a rules body that takes longer than it to parse is answered 400
/// naming the bound (or 503 when no turn to parse came within it), and `/healthz` answers
/// within a second meanwhile; within the bound the same body is parsed. Machine speed
/// does not matter: the bound is set to 1 ms for a body of thousands of rules, which no
/// machine parses that fast, and the default 2 s for the same body, which any does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rules_body_over_the_parse_time_bound_is_refused_without_stalling_the_server() {
    let db = sqlite().await;
    let (api, state) = server_over(&db).await;
    let body: String = (0..5_000)
        .map(|i| {
            format!("- {{name: r{i}, key: global, limits: [{{requests: 10, period: second}}]}}\n")
        })
        .collect();
    assert!(body.len() < 1024 * 1024, "within the body limit");
    let apply = |body: String| {
        api.post("/api/v1/rules:apply")
            .header("content-type", "application/yaml")
            .body(body)
            .send()
    };
    let detail = |problem: &Value| problem["detail"].as_str().unwrap_or("").to_string();
    // Within the bound: parsed (and answered for what it holds, whatever that is).
    let answer = apply(body.clone()).await.unwrap();
    let problem: Value = answer.json().await.unwrap_or(Value::Null);
    assert!(!detail(&problem).contains("to parse"), "{problem}");

    state.set_parse_time_limit(Duration::from_millis(1));
    let done = Arc::new(AtomicBool::new(false));
    let prober = probe_healthz(&api, done.clone());
    let mut over_the_bound = 0;
    for _ in 0..3 {
        // Four at once, for the two turns to parse.
        let mut all = tokio::task::JoinSet::new();
        for _ in 0..4 {
            all.spawn(
                api.post("/api/v1/rules:apply")
                    .header("content-type", "application/yaml")
                    .body(body.clone())
                    .send(),
            );
        }
        for answer in all.join_all().await {
            let answer = answer.unwrap();
            let status = answer.status();
            let problem: Value = answer.json().await.unwrap();
            match status {
                StatusCode::BAD_REQUEST => {
                    assert!(
                        detail(&problem).contains("took longer than 1ms to parse"),
                        "{problem}"
                    );
                    over_the_bound += 1;
                }
                StatusCode::SERVICE_UNAVAILABLE => {
                    assert!(detail(&problem).contains("busy parsing"), "{problem}")
                }
                other => panic!("{other}: {problem}"),
            }
        }
    }
    assert!(over_the_bound > 0, "no body was refused for its parse time");
    healthz_stayed_fast(&done, prober).await;
}

/// Replays over the wire: a sync sent again with its `seq` is refused (422 naming `seq`)
/// and counted, the next one in sequence is served; a report sent again is refused and
/// counted, and a flood of reports from one proxy id is answered 429 past its burst.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replayed_syncs_and_reports_are_refused_over_the_wire() {
    let db = sqlite().await;
    let (api, _state) = server_over(&db).await;
    let rule = json!({"name": "fleet", "key": "global",
                      "limits": [{"requests": 10, "period": "second", "burst": 100, "scope": "global"}]});
    assert_eq!(
        api.post("/api/v1/rules")
            .json(&rule)
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::CREATED
    );
    let proxy = db.token(Role::Proxy).await;
    let send = |path: &str, body: &Value| {
        api.http
            .post(format!("{}{path}", api.base))
            .bearer_auth(&proxy)
            .json(body)
            .send()
    };
    let seq = u64::try_from(sluice_admin::store::now_ms()).unwrap();
    let sync = |seq: u64| {
        json!({"proxy": "edge-1", "interval_ms": 500, "covers_ms": 500, "seq": seq,
               "buckets": [{"bucket": "07", "interval_ns": 100_000_000, "burst": 100,
                            "attempts": 5, "unleased": 5, "want": 5}]})
    };
    assert_eq!(
        send("/api/v1/quota/sync", &sync(seq))
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );
    for _ in 0..3 {
        let refused = send("/api/v1/quota/sync", &sync(seq)).await.unwrap();
        assert_eq!(refused.status(), StatusCode::UNPROCESSABLE_ENTITY);
        let problem: Value = refused.json().await.unwrap();
        assert_eq!(problem["errors"][0]["field"], "seq", "{problem}");
    }
    assert_eq!(
        send("/api/v1/quota/sync", &sync(seq + 1))
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );
    let metrics = api.metrics().await;
    assert_eq!(
        sample(&metrics, "sluice_quota_refused_total{reason=\"replay\"}"),
        Some(3.0)
    );

    let end = i64::try_from(seq).unwrap() - 60_000;
    let report = |end: i64| {
        json!({"proxy_id": "edge-1", "start_ms": end - 2_000, "end_ms": end,
               "ruleset_version": 1, "rules": [{"rule": "fleet", "allowed": 1}]})
    };
    assert_eq!(
        send("/api/v1/reports", &report(end))
            .await
            .unwrap()
            .status(),
        StatusCode::NO_CONTENT
    );
    let replayed = send("/api/v1/reports", &report(end)).await.unwrap();
    assert_eq!(replayed.status(), StatusCode::UNPROCESSABLE_ENTITY);
    // The default burst is 10 reports at once: two are spent, eight more are taken, and
    // past them the flood is answered 429 with Retry-After (one more is due every 500 ms,
    // so a few may be taken on a slow machine; a bounded number in all).
    let mut taken = 0;
    let mut limited = 0;
    for i in 1..=40 {
        let answer = send("/api/v1/reports", &report(end + i * 1_000))
            .await
            .unwrap();
        match answer.status() {
            StatusCode::NO_CONTENT => taken += 1,
            StatusCode::TOO_MANY_REQUESTS => {
                assert!(answer.headers().contains_key("retry-after"));
                limited += 1;
            }
            other => panic!("{other}"),
        }
    }
    assert!(taken >= 8, "the burst is taken: {taken}");
    assert!(limited > 0, "the flood is limited");
    let metrics = api.metrics().await;
    assert_eq!(
        sample(
            &metrics,
            "sluice_admin_reports_rejected_total{reason=\"rate_limited\"}"
        ),
        Some(f64::from(limited))
    );
    assert_eq!(
        sample(
            &metrics,
            "sluice_admin_reports_rejected_total{reason=\"replay\"}"
        ),
        Some(1.0)
    );
}
