//! The demo's traffic: a few clients sending steady, bursty and over-the-limit traffic
//! through Envoy, so the dashboard has something to show. Each client is one paced
//! connection of the harness's load generator. Loopback only, bounded in time, and quiet:
//! it counts answers and reports them when it stops.

use std::net::SocketAddr;
use std::time::Duration;

use sluice_harness::load::{Load, Req, Tally};

/// An answer slower than this counts as none.
const ANSWER_LIMIT: Duration = Duration::from_secs(5);

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

impl Profile {
    fn request(&self) -> Req {
        let request = Req::get(self.path);
        match self.key {
            Some(key) => request.header("x-api-key", key),
            None => request,
        }
    }
}

/// Sends the demo traffic to `target` for `duration`; returns what came back.
pub async fn run(target: SocketAddr, duration: Duration) -> Tally {
    let clients: Vec<_> = PROFILES
        .iter()
        .map(|&profile| {
            let load = Load::new([(target, 1)])
                .paced(profile.every, profile.batch)
                .for_duration(duration)
                .answer_limit(ANSWER_LIMIT);
            tokio::spawn(load.drive(move |_| profile.request()))
        })
        .collect();
    let mut answers = Tally::default();
    for client in clients {
        if let Ok((outcome, _)) = client.await {
            answers.merge(&outcome.total);
        }
    }
    answers
}
