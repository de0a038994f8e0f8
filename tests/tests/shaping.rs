//! In-flight limits in a real Envoy with two workers, in front of the echo upstream, which
//! counts the requests it works on at once.
//!
//! Load runs for a duration, not a count; every wait is for a condition. The limit is
//! checked from both sides: the upstream never works on more than the limit of one key's
//! requests at once, and under load it does reach the limit (places are not lost).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use serde_json::json;
use sluice_harness::upstream::{DELAY_HEADER, RESET_HEADER};
use sluice_tests::{Client, Envoy, EnvoyOptions, Req, Upstream, wait_for};

/// The in-flight limit under test.
const LIMIT: u64 = 10;

fn envoy_in_front_of(upstream: &Upstream) -> Envoy {
    Envoy::start(EnvoyOptions {
        rules: json!([{
            "name": "in-flight", "key": {"header": "x-api-key"},
            "limits": [{"concurrent": LIMIT}]
        }]),
        upstream: upstream.target(),
        ..Default::default()
    })
}

fn slow(key: &str, delay_ms: u64) -> Req {
    Req::get("/work")
        .header("x-api-key", key)
        .header(DELAY_HEADER, delay_ms.to_string())
}

/// A request sent on a connection of its own, answered (or abandoned) later.
struct Pending(TcpStream);

impl Pending {
    fn send(addr: SocketAddr, key: &str, delay_ms: u64) -> Pending {
        let mut stream = TcpStream::connect(addr).unwrap();
        write!(
            stream,
            "GET /work HTTP/1.1\r\nhost: test\r\nx-api-key: {key}\r\n{DELAY_HEADER}: {delay_ms}\r\n\r\n"
        )
        .unwrap();
        Pending(stream)
    }

    /// The answer's status.
    fn status(mut self) -> u16 {
        self.0
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let mut head = Vec::new();
        let mut byte = [0; 1];
        while !head.ends_with(b"\r\n") {
            assert_eq!(self.0.read(&mut byte).unwrap(), 1, "closed: {head:?}");
            head.push(byte[0]);
        }
        String::from_utf8_lossy(&head)
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap()
    }
}

/// Every place taken was let go, none lapsed, and the table's counters say so.
fn assert_all_places_let_go(envoy: &Envoy) {
    wait_for("every place let go", Duration::from_secs(10), || {
        let held = envoy.counter("wasmcustom.sluice_in_flight_held_total");
        held > 0 && held == envoy.counter("wasmcustom.sluice_in_flight_released_total")
    });
    assert_eq!(envoy.counter("wasmcustom.sluice_in_flight_lapsed_total"), 0);
    assert_eq!(
        envoy.counter("wasmcustom.sluice_in_flight_failures_total"),
        0
    );
}

/// All `LIMIT` places are usable, and not one more: `LIMIT` slow requests reach the
/// upstream together, the next one is refused with the in-flight answer, and the slow
/// ones then complete.
fn assert_every_place_usable(envoy: &Envoy, upstream: &Upstream, key: &str) {
    let held: Vec<Pending> = (0..LIMIT)
        .map(|_| Pending::send(envoy.listener_addr(), key, 2_000))
        .collect();
    wait_for("all places taken", Duration::from_secs(10), || {
        upstream.in_flight() == LIMIT
    });
    let refused = Client::connect(envoy.listener_addr(), 1).send(slow(key, 0));
    assert_eq!(refused.status, 429, "{refused:?}");
    assert_eq!(refused.header("retry-after"), Some("1"));
    assert_eq!(refused.json()["type"], "urn:sluice:too-many-in-flight");
    assert_eq!(refused.json()["in_flight_limit"], LIMIT);
    for pending in held {
        assert_eq!(pending.status(), 200);
    }
}

#[test]
fn two_hundred_clients_on_one_key_never_have_more_than_the_limit_in_flight() {
    let upstream = Upstream::start();
    let envoy = envoy_in_front_of(&upstream);
    let client = Client::connect(envoy.listener_addr(), 200)
        .with_timeouts(Duration::from_secs(20), Duration::from_secs(60));
    let outcome = client.run_for(Duration::from_secs(3), |_| slow("shared-key", 20));
    assert_eq!(outcome.total.errors, 0, "{:?}", outcome.total.first_error);
    let (ok, refused) = (outcome.total.get(200), outcome.total.get(429));
    assert_eq!(
        ok + refused,
        outcome.total.responses(),
        "{:?}",
        outcome.total
    );
    assert!(ok > 0 && refused > 0, "{:?}", outcome.total);
    // Never more than the limit at once, and the limit is reached: places are neither
    // over-granted nor lost under load.
    assert_eq!(upstream.in_flight_high_water(), LIMIT);
    let per_worker = envoy.worker_downstream_connections();
    assert!(per_worker.iter().all(|&c| c > 0), "{per_worker:?}");
    assert_all_places_let_go(&envoy);
    // Another key has places of its own, whatever this one holds.
    assert_eq!(client.send(slow("other-key", 0)).status, 200);
    assert_every_place_usable(&envoy, &upstream, "shared-key");
}

#[test]
fn places_come_back_however_requests_end() {
    let upstream = Upstream::start();
    let envoy = envoy_in_front_of(&upstream);
    let client = Client::connect(envoy.listener_addr(), LIMIT as usize)
        .with_timeouts(Duration::from_secs(20), Duration::from_secs(60));
    let key = "k";
    // Completed.
    assert!(
        client
            .run((0..LIMIT).map(|_| slow(key, 0)))
            .iter()
            .all(|r| r.status == 200)
    );
    // Reset by the client while the upstream works on them.
    let abandoned: Vec<Pending> = (0..LIMIT)
        .map(|_| Pending::send(envoy.listener_addr(), key, 10_000))
        .collect();
    wait_for(
        "the abandoned requests upstream",
        Duration::from_secs(10),
        || upstream.in_flight() == LIMIT,
    );
    drop(abandoned);
    wait_for(
        "the abandoned requests gone",
        Duration::from_secs(10),
        || upstream.in_flight() == 0,
    );
    // Reset by the upstream.
    let reset = client.run((0..LIMIT).map(|_| slow(key, 50).header(RESET_HEADER, "1")));
    assert!(reset.iter().all(|r| r.status == 503), "{reset:?}");
    // Envoy's own timeout is not covered here: it ignores `x-envoy-upstream-rq-timeout-ms`
    // from these clients (external requests), and the generated route's is 15 s.
    assert_all_places_let_go(&envoy);
    assert_every_place_usable(&envoy, &upstream, key);
    assert_all_places_let_go(&envoy);
}
