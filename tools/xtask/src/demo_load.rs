//! The demo's load generator: a few clients sending steady, bursty and over-the-limit
//! traffic through Envoy, so the dashboard has something to show. Loopback only, bounded
//! in time, and quiet: it counts answers and reports them when it stops.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use http_body_util::Empty;
use hyper::Request;
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::time::Instant;

/// One simulated client.
#[derive(Debug, Clone, Copy)]
struct Profile {
    /// The `x-api-key` it sends, if any.
    key: Option<&'static str>,
    path: &'static str,
    /// Requests sent together every `every`.
    batch: u32,
    every: Duration,
}

/// Against `examples/rules.yaml` (5/s with bursts of 10 and 100/min per key; a shadow
/// 20/s per IP): alice and dave stay within their limits, erin runs close to hers, bob
/// sends too much all the time and carol in bursts, and keyless static traffic pushes the
/// shared IP past the shadow rule.
const PROFILES: &[Profile] = &[
    Profile {
        key: Some("alice"),
        path: "/api/orders",
        batch: 1,
        every: Duration::from_millis(700),
    },
    Profile {
        key: Some("bob"),
        path: "/api/orders",
        batch: 1,
        every: Duration::from_millis(125),
    },
    Profile {
        key: Some("carol"),
        path: "/api/search",
        batch: 25,
        every: Duration::from_secs(10),
    },
    Profile {
        key: Some("dave"),
        path: "/api/profile",
        batch: 1,
        every: Duration::from_secs(2),
    },
    Profile {
        key: Some("erin"),
        path: "/api/orders",
        batch: 1,
        every: Duration::from_millis(650),
    },
    Profile {
        key: None,
        path: "/static/app.js",
        batch: 3,
        every: Duration::from_millis(250),
    },
];

/// Answers by class.
#[derive(Debug, Default)]
pub struct Counts {
    pub ok: AtomicU64,
    pub throttled: AtomicU64,
    pub other: AtomicU64,
}

/// Sends the demo traffic to `target` until `until`; returns what came back.
pub async fn run(target: SocketAddr, until: Instant) -> Arc<Counts> {
    let counts = Arc::new(Counts::default());
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let mut tasks = Vec::new();
    for profile in PROFILES.iter().copied() {
        let client = client.clone();
        let counts = Arc::clone(&counts);
        tasks.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(profile.every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            while Instant::now() < until {
                tick.tick().await;
                for _ in 0..profile.batch {
                    let mut request = Request::get(format!("http://{target}{}", profile.path));
                    if let Some(key) = profile.key {
                        request = request.header("x-api-key", key);
                    }
                    let Ok(request) = request.body(Empty::new()) else {
                        continue;
                    };
                    let answer =
                        tokio::time::timeout(Duration::from_secs(5), client.request(request)).await;
                    let counter = match answer {
                        Ok(Ok(r)) if r.status().is_success() => &counts.ok,
                        Ok(Ok(r)) if r.status().as_u16() == 429 => &counts.throttled,
                        _ => &counts.other,
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
    counts
}
