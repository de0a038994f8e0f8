//! Shaping at the sizes, in a real Envoy with two workers: 10,000 requests holding
//! in-flight places that end every way the harness can make them end (with the filter's
//! configuration replaced while they run), and 10,000 delayed requests whose clients give
//! up while they wait. Calls go over HTTP/2 ([`sluice_tests::h2`]), a few hundred at a
//! time; every wait is for a condition and every run is bounded.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use serde_json::json;
use sluice_harness::upstream::{DELAY_HEADER, RESET_HEADER};
use sluice_tests::h2::{H2Call, H2Load, H2Outcome, h2_run};
use sluice_tests::{Client, Envoy, EnvoyOptions, Req, Upstream, wait_for};

const MANY: u64 = 10_000;
/// How long a client waits before giving a call up. Over a second: Envoy closes an HTTP/2
/// connection on which most streams are reset within a second of opening (its defence
/// against rapid-reset floods), which is not what these tests are about.
const PATIENCE: Duration = Duration::from_millis(1_100);
const LOAD: H2Load = H2Load {
    connections: 4,
    streams: 64,
    deadline: Duration::from_secs(300),
};

fn get(addr: std::net::SocketAddr, key: &str) -> hyper::http::request::Builder {
    hyper::Request::get(format!("http://{addr}/work")).header("x-api-key", key)
}

fn counter(envoy: &Envoy, name: &str) -> u64 {
    envoy.counter(&format!("wasmcustom.sluice_{name}_total"))
}

#[test]
fn ten_thousand_requests_ending_every_way_leave_no_place_held() {
    const LIMIT: u64 = 10;
    let upstream = Upstream::start();
    let mut envoy = Envoy::start(EnvoyOptions {
        rules: json!([{"name": "in-flight", "key": {"header": "x-api-key"},
                       "limits": [{"concurrent": LIMIT}]}]),
        upstream: upstream.target(),
        filter_discovery: true,
        ..Default::default()
    });
    let addr = envoy.listener_addr();
    // Three endings in turn over 100 keys: completed, reset by the upstream, and given up
    // by the client while the upstream still works on it.
    let run = std::thread::spawn(move || {
        h2_run(addr, MANY, LOAD, move |n| {
            let key = format!("k{}", n % 100);
            let request = get(addr, &key);
            let (request, give_up_after) = match n % 3 {
                0 => (request.header(DELAY_HEADER, "2"), None),
                1 => (
                    request.header(DELAY_HEADER, "2").header(RESET_HEADER, "1"),
                    None,
                ),
                _ => (request.header(DELAY_HEADER, "3000"), Some(PATIENCE)),
            };
            H2Call {
                request: request.body(Full::new(Bytes::new())).expect("a request"),
                give_up_after,
            }
        })
    });
    // The filter's VMs replaced twice while the requests run (a new VM configuration):
    // each stream lets its place go through the filter instance that took it.
    for generation in 1..=2 {
        let held_before = counter(&envoy, "in_flight_held");
        wait_for(
            "a few thousand more places taken",
            Duration::from_secs(120),
            || counter(&envoy, "in_flight_held") >= held_before + 2_000 || run.is_finished(),
        );
        let reloads = envoy.ecds_reloads();
        envoy.replace_filter(|wasm| {
            wasm["config"]["vm_config"]["configuration"] = json!({
                "@type": "type.googleapis.com/google.protobuf.StringValue",
                "value": format!("generation {generation}"),
            });
        });
        wait_for("Envoy to apply it", Duration::from_secs(30), || {
            envoy.ecds_reloads() > reloads
        });
    }
    let outcome = run.join().expect("the HTTP/2 run");
    eprintln!("{outcome:?}");
    let ended = outcome.answered(200) + outcome.answered(503) + outcome.answered(429);
    assert_eq!(
        ended + outcome.reset + outcome.given_up,
        MANY,
        "{outcome:?}"
    );
    assert!(
        outcome.given_up > 0 && outcome.answered(503) > 0,
        "{outcome:?}"
    );
    assert!(outcome.answered(200) > 0, "{outcome:?}");
    wait_for("every place let go", Duration::from_secs(30), || {
        let held = counter(&envoy, "in_flight_held");
        held >= outcome.answered(200) && held == counter(&envoy, "in_flight_released")
    });
    assert_eq!(counter(&envoy, "in_flight_lapsed"), 0);
    assert_eq!(counter(&envoy, "in_flight_failures"), 0);
    // And every key's places are whole: LIMIT at once pass, one more is refused.
    wait_for("the upstream idle", Duration::from_secs(30), || {
        upstream.in_flight() == 0
    });
    let (client, probe) = (
        Client::connect(addr, LIMIT as usize),
        Client::connect(addr, 1),
    );
    for key in ["k0", "k41", "k99"] {
        let held = std::thread::scope(|s| {
            let slow = s.spawn(|| {
                client.run((0..LIMIT).map(|_| {
                    Req::get("/work")
                        .header("x-api-key", key)
                        .header(DELAY_HEADER, "1500")
                }))
            });
            wait_for("the key's places taken", Duration::from_secs(10), || {
                upstream.in_flight() == LIMIT
            });
            let refused = probe.send(Req::get("/work").header("x-api-key", key));
            assert_eq!(refused.status, 429, "{key}: {refused:?}");
            slow.join().expect("the slow requests")
        });
        assert!(held.iter().all(|r| r.status == 200), "{key}: {held:?}");
    }
}

#[test]
fn ten_thousand_waiters_that_give_up_leave_nothing_queued_or_reserved() {
    const KEYS: u64 = 1_000;
    let upstream = Upstream::start();
    // One request per key every 25 s; a request may wait up to 60 s. Refunds keep a key's
    // waits within 60 s (two of its waiters at once at most, due within 25 s and 50 s);
    // without them, its third waiter would be due in 75 s and refused.
    let envoy = Envoy::start(EnvoyOptions {
        rules: json!([{"name": "smooth", "key": {"header": "x-api-key"},
                       "limits": [{"requests": 1, "period": 25}],
                       "on_limit": "delay",
                       "delay": {"max_delay_ms": 60_000, "queue_per_worker": 10_000}}]),
        upstream: upstream.target(),
        ..Default::default()
    });
    let addr = envoy.listener_addr();
    // Each key's first request passes at once; then ten waiters a key, one key's at a
    // time (256 calls in flight over 1,000 keys in turn), each given up after PATIENCE.
    let first = h2_run(addr, KEYS, LOAD, move |n| {
        H2Call::whole(
            get(addr, &format!("k{n}"))
                .body(Full::new(Bytes::new()))
                .expect("a request"),
        )
    });
    assert_eq!(first.answered(200), KEYS, "{first:?}");
    // A thousand calls at a time, on fresh connections: a connection on which 256 streams
    // were reset by the client stopped taking calls (seen with this HTTP/2 client against
    // Envoy's defaults), and 1,000 over eight connections stay well under that.
    let spread = H2Load {
        connections: 8,
        streams: 32,
        ..LOAD
    };
    let mut waiters = H2Outcome::default();
    for _ in 0..MANY / KEYS {
        waiters.add(h2_run(addr, KEYS, spread, move |n| H2Call {
            request: get(addr, &format!("k{n}"))
                .body(Full::new(Bytes::new()))
                .expect("a request"),
            give_up_after: Some(PATIENCE),
        }));
    }
    eprintln!("{waiters:?}");
    // None refused: each waiter's reservation came back before its key's next. Each was
    // queued and given up on, or passed at once where its key's bucket had refilled.
    assert_eq!(waiters.answered(429), 0, "{waiters:?}");
    assert_eq!(
        waiters.given_up + waiters.answered(200),
        MANY,
        "{waiters:?}"
    );
    wait_for(
        "every waiter taken out of the queue",
        Duration::from_secs(30),
        || {
            counter(&envoy, "delayed")
                == counter(&envoy, "delay_cancelled") + counter(&envoy, "delay_passed")
        },
    );
    // A key's bucket refills in 25 s, a few times over the run: most waiters waited.
    assert!(counter(&envoy, "delay_cancelled") > MANY / 2);
    assert_eq!(counter(&envoy, "delay_failures"), 0);
    assert_eq!(counter(&envoy, "denied"), 0);
    // What reached the upstream: the first requests, the waiters answered, and at most
    // the resumed ones whose clients gave up just after.
    let seen = upstream.requests_seen();
    let answered = KEYS + waiters.answered(200);
    assert!(
        (answered..=answered + counter(&envoy, "delay_passed")).contains(&seen),
        "{seen} {waiters:?}"
    );
}
