//! The failed-authentication log's volume bound, end to end: a real server on 127.0.0.1,
//! many wrong bearer tokens, and the WARN lines its log gets. In a file of its own, so
//! that the process-wide log subscriber it installs sees only this test's server.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use sluice_admin::http::AppState;
use sluice_admin::http::failed_auth::FailureLimit;
use sluice_admin::pipeline::MetricsConfig;
use sluice_admin::server::{self, ServeOptions};
use sluice_admin::testing::{Backend, PATIENCE, TestDb, metrics_text};
use sluice_coordinator::Backend as Quota;

/// The log, as the server writes it.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<u8>>>);

impl Write for Log {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Log {
    /// The WARN lines about failed authentications so far.
    fn failure_lines(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .lines()
            .filter(|line| line.contains("WARN") && line.contains("authentication failed"))
            .map(str::to_string)
            .collect()
    }
}

/// Failures are logged one line each up to 10 a minute; 500 more in the same minute add
/// none (the next window's first line says how many went unlogged), while every one is
/// counted in `sluice_admin_auth_failures_total`. The throttle is raised so that every
/// wrong token is a failure, not a 429 (which is not logged at all).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_failed_authentications_write_a_bounded_number_of_warn_lines() {
    let log = Log::default();
    let writer = log.clone();
    tracing::subscriber::set_global_default(
        tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::WARN)
            .finish(),
    )
    .unwrap();
    let Some(db) = TestDb::new(Backend::Sqlite).await else {
        return;
    };
    let limit = FailureLimit {
        allowed: 10_000,
        refill: Duration::from_secs(10),
    };
    let state = AppState::with_options(
        db.store.clone(),
        MetricsConfig::default(),
        Quota::Memory,
        limit,
    )
    .await
    .unwrap();
    let server = server::start_with(
        state,
        "127.0.0.1:0".parse().unwrap(),
        ServeOptions::default(),
    )
    .await
    .unwrap();
    let base = server.listening().url();
    let http = reqwest::Client::builder()
        .timeout(PATIENCE)
        .build()
        .unwrap();
    let fail = || {
        http.get(format!("{base}/api/v1/rules"))
            .bearer_auth("slc_wrong_token_0123456789abcdef0123456789")
            .send()
    };
    let started = Instant::now();
    for _ in 0..5 {
        assert_eq!(fail().await.unwrap().status(), StatusCode::UNAUTHORIZED);
    }
    assert_eq!(log.failure_lines().len(), 5, "below the bound: a line each");
    for _ in 0..500 {
        assert_eq!(fail().await.unwrap().status(), StatusCode::UNAUTHORIZED);
    }
    // The first window began with the server; 10 lines each. On a machine slow enough to
    // take most of a minute, the failures may reach into the next window.
    let elapsed = started.elapsed();
    let lines = log.failure_lines();
    if elapsed < Duration::from_secs(50) {
        assert_eq!(lines.len(), 10, "{lines:#?}");
    } else {
        let windows = 2 + elapsed.as_secs() / 60;
        assert!(
            (10..=10 * windows as usize).contains(&lines.len()),
            "{lines:#?}"
        );
    }
    let metrics = metrics_text(&http, &base).await;
    assert!(
        metrics.contains("sluice_admin_auth_failures_total{credential=\"bearer\"} 505"),
        "every failure counted: {metrics}"
    );
}
