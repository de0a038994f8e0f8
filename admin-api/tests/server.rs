//! A real server on 127.0.0.1: the long-poll's timing, graceful shutdown, concurrent
//! edits and the proxy's address, on SQLite and PostgreSQL alike. The `sluice` binary
//! itself is tested in `cli/tests/cli.rs`.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use sluice_admin::store::Role;
use sluice_admin::testing::{PATIENCE, TestDb, TestServer, example_rule, items, rule};

sluice_admin::on_every_backend!(
    a_poll_behind_the_current_version_is_answered_at_once,
    a_current_poll_is_held_then_answered_304,
    held_polls_wake_within_milliseconds_of_a_change,
    shutdown_ends_held_polls_promptly,
    concurrent_edits_with_one_etag_have_one_winner,
    the_proxy_address_is_the_tcp_peer,
);

/// A long-poll as the admin, and how long it took to be answered.
async fn poll(api: &TestServer, path: &str) -> (reqwest::Response, Duration) {
    let start = Instant::now();
    let response = api.get(path).send().await.unwrap();
    (response, start.elapsed())
}

async fn a_poll_behind_the_current_version_is_answered_at_once(db: TestDb) {
    let api = TestServer::start(&db).await;
    api.create(&example_rule()).await;
    let (response, took) = poll(&api, "/api/v1/ruleset?after=0&wait=30").await;
    assert_eq!(response.status(), StatusCode::OK);
    assert!(took < Duration::from_secs(1), "took {took:?}");
    let doc: Value = response.json().await.unwrap();
    assert_eq!(doc["version"], 1);
    assert_eq!(doc["rules"][0]["name"], "api-per-key");
    api.server.stop().await.unwrap();
}

async fn a_current_poll_is_held_then_answered_304(db: TestDb) {
    let api = TestServer::start(&db).await;
    api.create(&rule("a")).await;
    let (response, took) = poll(&api, "/api/v1/ruleset?after=1&wait=1").await;
    assert_eq!(response.status(), StatusCode::NOT_MODIFIED);
    assert!(
        took >= Duration::from_millis(950) && took < Duration::from_secs(3),
        "held for {took:?}"
    );
    assert!(response.bytes().await.unwrap().is_empty());
    // `wait` is capped at 60 s and 0 answers at once.
    let (response, took) = poll(&api, "/api/v1/ruleset?after=1&wait=0").await;
    assert_eq!(response.status(), StatusCode::NOT_MODIFIED);
    assert!(took < Duration::from_millis(500));
    api.server.stop().await.unwrap();
}

async fn held_polls_wake_within_milliseconds_of_a_change(db: TestDb) {
    let api = TestServer::start(&db).await;
    let polls: Vec<_> = (0..5)
        .map(|i| {
            let request = api
                .get("/api/v1/ruleset?after=0&wait=30")
                .header("x-sluice-proxy-id", format!("envoy-{i}"));
            tokio::spawn(async move {
                let response = request.send().await.unwrap();
                let answered = Instant::now();
                (
                    response.status(),
                    response.json::<Value>().await.ok(),
                    answered,
                )
            })
        })
        .collect();
    api.wait_for_held_polls(5).await;
    // Held polls count as connected proxies.
    let proxies: Value = api.json("/api/v1/proxies").await;
    assert_eq!(proxies["proxies"].as_array().unwrap().len(), 5);
    assert!(items(&proxies["proxies"]).all(|p| p["connected"] == true));

    let changed = Instant::now();
    api.create(&rule("a")).await;
    let committed = changed.elapsed();
    for poll in polls {
        let (status, doc, answered) = tokio::time::timeout(PATIENCE, poll).await.unwrap().unwrap();
        assert_eq!(status, StatusCode::OK);
        assert_eq!(doc.unwrap()["version"], 1);
        let latency = answered.duration_since(changed);
        // The change itself (one transaction) plus the wake-up: milliseconds, not the
        // poll's 30 s. Generous for a loaded 2-core CI machine.
        assert!(
            latency < Duration::from_millis(500),
            "woke {latency:?} after the change (the change took {committed:?})"
        );
    }
    assert_eq!(api.held_polls().await, 0);
    api.server.stop().await.unwrap();
}

async fn shutdown_ends_held_polls_promptly(db: TestDb) {
    let api = TestServer::start(&db).await;
    let poll = tokio::spawn(api.get("/api/v1/ruleset?after=0&wait=60").send());
    api.wait_for_held_polls(1).await;
    let start = Instant::now();
    tokio::time::timeout(PATIENCE, api.server.stop())
        .await
        .expect("shutdown hung")
        .unwrap();
    let response = poll.await.unwrap().unwrap();
    assert_eq!(response.status(), StatusCode::NOT_MODIFIED);
    let took = start.elapsed();
    assert!(took < Duration::from_secs(2), "shutdown took {took:?}");
}

async fn concurrent_edits_with_one_etag_have_one_winner(db: TestDb) {
    let api = TestServer::start(&db).await;
    let revision = api.create(&rule("a")).await;
    let etag = format!("\"{revision}\"");
    let attempts: Vec<_> = (0..8)
        .map(|i| {
            let request = api
                .http
                .patch(format!("{}/api/v1/rules/a", api.base))
                .bearer_auth(&api.admin)
                .header("if-match", &etag)
                .json(&json!({"priority": i + 1}));
            tokio::spawn(async move { request.send().await.unwrap().status() })
        })
        .collect();
    let mut statuses = Vec::new();
    for attempt in attempts {
        statuses.push(attempt.await.unwrap());
    }
    let won = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    let lost = statuses
        .iter()
        .filter(|s| **s == StatusCode::CONFLICT)
        .count();
    assert_eq!((won, lost), (1, 7), "{statuses:?}");
    // Exactly one new version: the losers changed nothing.
    assert_eq!(db.store.current_version().await.unwrap(), revision + 1);
    api.server.stop().await.unwrap();
}

async fn the_proxy_address_is_the_tcp_peer(db: TestDb) {
    let api = TestServer::start(&db).await;
    let proxy = db.token(Role::Proxy).await;
    let response = api
        .http
        .get(format!("{}/api/v1/ruleset?after=0&wait=0", api.base))
        .bearer_auth(&proxy)
        .header("x-sluice-proxy-id", "envoy-1")
        .header("x-sluice-ruleset-version", "0")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NOT_MODIFIED);
    let proxies: Value = api.json("/api/v1/proxies").await;
    let address = proxies["proxies"][0]["address"].as_str().unwrap();
    assert!(address.starts_with("127.0.0.1:"), "{address}");
    assert_eq!(
        proxies["proxies"][0]["token_id"]
            .as_str()
            .map(|t| t.starts_with("tok_")),
        Some(true)
    );
    api.server.stop().await.unwrap();
}
