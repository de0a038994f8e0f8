//! In-flight limits, delayed requests (`on_limit: delay`), soft limits and warn mode in a
//! real Envoy with two workers, in front of the echo upstream, which counts the requests it
//! answers and those it works on at once.
//!
//! Load runs for a duration, not a count; every wait is for a condition. The limit is
//! checked from both sides: the upstream never works on more than the limit of one key's
//! requests at once, and under load it does reach the limit (places are not lost).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;
use sluice_core::response::{DELAY_QUEUED_HEADER, DELAY_WAIT_HEADER};
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
    // The rule's statistics count every in-flight refusal apart (flushed once a second).
    wait_for(
        "the rule's in-flight refusals",
        Duration::from_secs(10),
        || {
            let refusals = envoy.counter("wasmcustom.sluice_in_flight_denied_total");
            let counted = envoy
                .stat("wasmcustom.sluice_rule.in-flight.in_flight_refused_total")
                .unwrap_or(0);
            refusals > 0 && counted == refusals
        },
    );
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

/// The worker's tick while its rules delay (`sluice_filter::delay::DELAY_TICK`).
const DELAY_TICK_MS: f64 = 10.0;

fn delaying_envoy(
    upstream: &Upstream,
    limit: serde_json::Value,
    delay: serde_json::Value,
) -> Envoy {
    Envoy::start(EnvoyOptions {
        rules: json!([{
            "name": "smooth", "key": {"header": "x-api-key"},
            "limits": [limit], "on_limit": "delay", "delay": delay
        }]),
        upstream: upstream.target(),
        ..Default::default()
    })
}

/// A delayed response's computed wait and time queued, in milliseconds.
fn delay_of(resp: &sluice_tests::Resp) -> Option<(f64, f64)> {
    let ms = |name| resp.header(name)?.parse::<f64>().ok();
    Some((ms(DELAY_WAIT_HEADER)?, ms(DELAY_QUEUED_HEADER)?))
}

#[test]
fn delayed_requests_pass_within_the_rate_and_wait_their_computed_time_plus_a_tick() {
    const RATE: u64 = 20;
    const BURST: u64 = 5;
    let upstream = Upstream::start();
    let envoy = delaying_envoy(
        &upstream,
        json!({"requests": RATE, "period": "second", "burst": BURST}),
        json!({"max_delay_ms": 1000, "queue_per_key": 1000, "queue_per_worker": 1000}),
    );
    let client = Client::connect(envoy.listener_addr(), 30)
        .with_timeouts(Duration::from_secs(20), Duration::from_secs(60));
    let start = Instant::now();
    let done = AtomicBool::new(false);
    let responses = std::thread::scope(|s| {
        // The upstream never sees more than `burst + rate × elapsed` of the key's
        // requests, measured from before the first was sent.
        let watcher = s.spawn(|| {
            let mut samples = 0;
            while !done.load(Ordering::Relaxed) {
                let seen = upstream.requests_seen();
                let bound = BURST + (RATE as f64 * start.elapsed().as_secs_f64()) as u64;
                assert!(seen <= bound, "{seen} seen, {bound} allowed");
                samples += 1;
                std::thread::sleep(Duration::from_millis(2));
            }
            samples
        });
        let responses = client.run((0..150).map(|_| Req::get("/work").header("x-api-key", "k")));
        done.store(true, Ordering::Relaxed);
        assert!(watcher.join().unwrap() > 100);
        responses
    });
    let passed: Vec<_> = responses.iter().filter(|r| r.status == 200).collect();
    let refused = responses.iter().filter(|r| r.status == 429).count();
    assert_eq!(passed.len() + refused, responses.len(), "only 200 and 429");
    assert!(
        refused > 0,
        "past `max_delay`, requests are refused as ever"
    );
    let delays: Vec<(f64, f64)> = passed.iter().filter_map(|r| delay_of(r)).collect();
    assert!(delays.len() as u64 > BURST, "{} delayed", delays.len());
    // Never early: each waited at least its computed wait; the tick adds at most one
    // period to most (the median; the slowest are printed, since a loaded machine can
    // fire a timer late).
    let mut late: Vec<f64> = delays
        .iter()
        .map(|(wait, queued)| {
            assert!(queued >= wait, "passed early: waited {queued} of {wait} ms");
            queued - wait
        })
        .collect();
    late.sort_by(f64::total_cmp);
    let median = late[late.len() / 2];
    let p99 = late[(late.len() * 99 / 100).min(late.len() - 1)];
    eprintln!(
        "{} delayed; past their due time: median {median:.3} ms, p99 {p99:.3} ms",
        late.len()
    );
    assert!(median <= DELAY_TICK_MS, "median {median} ms past due");
    // Every delayed request is counted, and none was left waiting.
    wait_for("the delay counters", Duration::from_secs(5), || {
        envoy.counter("wasmcustom.sluice_delay_passed_total") == delays.len() as u64
    });
    assert_eq!(
        envoy.counter("wasmcustom.sluice_delayed_total"),
        delays.len() as u64
    );
    assert_eq!(envoy.counter("wasmcustom.sluice_delay_cancelled_total"), 0);
    assert_eq!(envoy.counter("wasmcustom.sluice_delay_failures_total"), 0);
    // The rule's statistics count the delayed requests and their computed waits, each
    // rounded up to a whole millisecond (flushed once a second).
    let waits: f64 = delays.iter().map(|(wait, _)| wait).sum();
    let rule_stat = |outcome: &str| {
        envoy
            .stat(&format!("wasmcustom.sluice_rule.smooth.{outcome}_total"))
            .unwrap_or(0)
    };
    wait_for(
        "the rule's delay statistics",
        Duration::from_secs(10),
        || rule_stat("delayed") == delays.len() as u64,
    );
    let counted = rule_stat("delay_wait_ms") as f64;
    assert!(
        counted >= waits.floor() && counted <= waits + 1.001 * delays.len() as f64,
        "{counted} ms counted, {waits} ms computed"
    );
}

#[test]
fn queues_keep_their_bounds_and_waiters_that_give_up_are_refunded() {
    const PER_KEY: u64 = 2;
    let upstream = Upstream::start();
    // A token every 6 s: nothing queued passes while the test counts.
    let envoy = delaying_envoy(
        &upstream,
        json!({"requests": 10, "period": 60, "burst": 1}),
        json!({"max_delay_ms": 60000, "queue_per_key": PER_KEY}),
    );
    let workers = envoy.concurrency() as u64;
    let client = Client::connect(envoy.listener_addr(), 1)
        .with_timeouts(Duration::from_secs(20), Duration::from_secs(60));
    assert_eq!(client.send(slow("k", 0)).status, 200, "the burst");
    // Eleven more on connections of their own, spread over the workers: each worker
    // queues at most `PER_KEY` of them, and refuses the rest at once.
    let pending: Vec<Pending> = (0..11)
        .map(|_| Pending::send(envoy.listener_addr(), "k", 0))
        .collect();
    wait_for(
        "every request queued or refused",
        Duration::from_secs(10),
        || {
            let delayed = envoy.counter("wasmcustom.sluice_delayed_total");
            delayed + envoy.counter("wasmcustom.sluice_denied_total") == 11
        },
    );
    let delayed = envoy.counter("wasmcustom.sluice_delayed_total");
    // One worker took at least six of the eleven: its key's queue is full.
    assert!(
        (PER_KEY..=PER_KEY * workers).contains(&delayed),
        "{delayed} queued on {workers} workers"
    );
    assert_eq!(upstream.requests_seen(), 1, "nothing queued has passed");
    // They all give up (the client resets): nothing stays queued, and their tokens go
    // back, so the next request waits for the one token after the burst, not for theirs.
    drop(pending);
    wait_for(
        "every waiter out of the queue",
        Duration::from_secs(10),
        || envoy.counter("wasmcustom.sluice_delay_cancelled_total") == delayed,
    );
    assert_eq!(envoy.counter("wasmcustom.sluice_delay_failures_total"), 0);
    let next = client.send(slow("k", 0));
    assert_eq!(next.status, 200);
    let (wait, _) = delay_of(&next).expect("it waited");
    assert!(
        wait <= 6_000.0,
        "waited {wait} ms: the cancelled reservations stand"
    );
    assert_eq!(envoy.counter("wasmcustom.sluice_delay_passed_total"), 1);
}

/// Soft limits and warn mode: `soft` on /work (20 a second, 10 at once, 50% soft: a
/// margin of 30 a second, 15 at once) and `told` on /told (warn mode, 5 a second).
fn warning_envoy(upstream: &Upstream) -> Envoy {
    Envoy::start(EnvoyOptions {
        rules: json!([
            {"name": "soft", "match": {"path_prefix": "/work"}, "key": {"header": "x-api-key"},
             "limits": [{"requests": 20, "period": "second", "burst": 10, "soft_percent": 50}]},
            {"name": "told", "mode": "warn", "match": {"path_prefix": "/told"},
             "key": {"header": "x-user"},
             "limits": [{"requests": 5, "period": "second"}]},
        ]),
        upstream: upstream.target(),
        ..Default::default()
    })
}

/// How one burst of a key's requests was answered.
#[derive(Debug, Default)]
struct Answered {
    passed: u64,
    warned: u64,
    refused: u64,
}

/// Sends `n` requests at once and sorts their answers, checking the warning field says
/// which limit (`limit`) and is only ever on a passed request. Returns them with the time
/// the burst took, which every decision fell within.
fn burst(client: &Client, n: usize, request: impl Fn() -> Req, limit: &str) -> (Answered, f64) {
    let start = Instant::now();
    let responses = client.run((0..n).map(|_| request()));
    let elapsed = start.elapsed().as_secs_f64();
    let mut answered = Answered::default();
    for r in &responses {
        let warning = r.header(sluice_core::response::WARNING_HEADER);
        match r.status {
            200 => {
                answered.passed += 1;
                if let Some(warning) = warning {
                    assert_eq!(warning, format!("over limit {limit}"));
                    answered.warned += 1;
                }
            }
            429 => {
                assert_eq!(warning, None, "{r:?}");
                answered.refused += 1;
            }
            other => panic!("status {other}: {r:?}"),
        }
    }
    (answered, elapsed)
}

#[test]
fn a_soft_limit_warns_within_its_margin_refuses_beyond_it_and_warn_mode_never_refuses() {
    let upstream = Upstream::start();
    let envoy = warning_envoy(&upstream);
    let client = Client::connect(envoy.listener_addr(), 20);
    let work = || Req::get("/work").header("x-api-key", "k");
    let mut total = Answered::default();
    // Two bursts, a pause between them long enough for both buckets to fill again.
    for round in 0..2 {
        let (answered, elapsed) = burst(&client, 60, work, "soft");
        eprintln!("round {round}: {answered:?} in {elapsed:.3} s");
        let within_limit = answered.passed - answered.warned;
        // Both sides of both bounds: the limit's burst passes unwarned and the margin's
        // burst passes, never more than each admits in the time the burst took.
        assert!(within_limit >= 10, "{answered:?}");
        assert!(within_limit as f64 <= 10.0 + 20.0 * elapsed, "{answered:?}");
        assert!(answered.passed >= 15, "{answered:?}");
        assert!(
            answered.passed as f64 <= 15.0 + 30.0 * elapsed,
            "{answered:?}"
        );
        assert!(answered.warned >= 5 && answered.refused > 0, "{answered:?}");
        total.passed += answered.passed;
        total.warned += answered.warned;
        total.refused += answered.refused;
        std::thread::sleep(Duration::from_millis(1_000));
    }
    assert_eq!(upstream.requests_seen(), total.passed);
    // Warn mode: never refused; over its limit, told.
    let (told, elapsed) = burst(
        &client,
        30,
        || Req::get("/told").header("x-user", "u"),
        "told",
    );
    assert_eq!((told.passed, told.refused), (30, 0));
    let unwarned = told.passed - told.warned;
    assert!(
        (5..=5 + (5.0 * elapsed) as u64).contains(&unwarned),
        "{told:?} in {elapsed:.3} s"
    );
    // Counted as warned (and allowed), never as denied.
    assert_eq!(
        envoy.counter("wasmcustom.sluice_warned_total"),
        total.warned + told.warned
    );
    assert_eq!(
        envoy.counter("wasmcustom.sluice_denied_total"),
        total.refused
    );
    // Each rule's statistics, flushed once a second (a counter appears with its first).
    let rule_stat = |rule: &str, outcome: &str| {
        envoy
            .stat(&format!("wasmcustom.sluice_rule.{rule}.{outcome}_total"))
            .unwrap_or(0)
    };
    wait_for("the per-rule counters", Duration::from_secs(10), || {
        rule_stat("soft", "warned") == total.warned
            && rule_stat("told", "warned") == told.warned
            && rule_stat("soft", "allowed") == total.passed
            && rule_stat("soft", "denied") == total.refused
    });
    assert_eq!(rule_stat("told", "denied"), 0);
}

/// An elastic rule on /work: 10 a second per key (5 at once); over that, a key passes
/// while the rule's admitted requests in this Envoy, all keys together, are under 30 a
/// second (15 at once).
fn elastic_envoy(upstream: &Upstream) -> Envoy {
    Envoy::start(EnvoyOptions {
        rules: json!([
            {"name": "elastic", "key": {"header": "x-api-key"},
             "limits": [{"requests": 10, "period": "second", "burst": 5}],
             "elastic": {"requests": 30, "period": "second", "burst": 15}},
        ]),
        upstream: upstream.target(),
        ..Default::default()
    })
}

/// The pool is read before a decision and charged after: each worker but the deciding one
/// may take its last room at the same instant (two workers: one).
const ELASTIC_RACE: f64 = 1.0;

#[test]
fn an_elastic_rule_lets_a_key_past_its_limit_while_the_ceiling_has_room_and_not_after() {
    let upstream = Upstream::start();
    let envoy = elastic_envoy(&upstream);
    let client = Client::connect(envoy.listener_addr(), 20);
    let key = |k: &'static str| move || Req::get("/work").header("x-api-key", k);

    // Alone, a key passes its own limit up to the ceiling, told so; then it is refused.
    let (alone, elapsed) = burst(&client, 60, key("a"), "elastic");
    eprintln!("alone: {alone:?} in {elapsed:.3} s");
    let within = alone.passed - alone.warned;
    assert!(within >= 5, "held below its own limit: {alone:?}");
    assert!(within as f64 <= 5.0 + 10.0 * elapsed, "{alone:?}");
    assert!(
        alone.passed >= 15,
        "the ceiling's room was not lent: {alone:?}"
    );
    assert!(
        alone.passed as f64 <= 15.0 + 30.0 * elapsed + ELASTIC_RACE,
        "beyond the ceiling: {alone:?} in {elapsed:.3} s"
    );

    // The pool's debt (at most one burst) is paid and it is full again within 1 s.
    std::thread::sleep(Duration::from_millis(1_500));
    // Six keys within their own limits fill the ceiling (30 requests against its 15)...
    let start = Instant::now();
    let mut filled = 0;
    for k in ["b", "c", "d", "e", "f", "g"] {
        let (answered, _) = burst(&client, 5, key(k), "elastic");
        assert_eq!(
            (answered.passed, answered.warned),
            (5, 0),
            "{k}: {answered:?}"
        );
        filled += answered.passed;
    }
    // ...so a key over its limit is held to it: over its own limit it passes only what
    // the pool got back since the filling began.
    let (held, _) = burst(&client, 30, key("a"), "elastic");
    let span = start.elapsed().as_secs_f64();
    eprintln!("held: {held:?}, {span:.3} s after the filling began");
    let within = held.passed - held.warned;
    assert!(within >= 5, "held below its own limit: {held:?}");
    let room = (15.0 + 30.0 * span - (filled + within) as f64).max(0.0);
    assert!(
        held.warned as f64 <= room + ELASTIC_RACE,
        "passed beyond the ceiling: {held:?} with room for {room:.1} in {span:.3} s"
    );

    let passed = alone.passed + filled + held.passed;
    assert_eq!(upstream.requests_seen(), passed);
    assert_eq!(
        envoy.counter("wasmcustom.sluice_warned_total"),
        alone.warned + held.warned
    );
    assert_eq!(
        envoy.counter("wasmcustom.sluice_denied_total"),
        alone.refused + held.refused
    );
    assert_eq!(envoy.counter("wasmcustom.sluice_errors_total"), 0);
}
