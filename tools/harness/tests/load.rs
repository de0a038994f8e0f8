//! The load generator against the echo upstream on loopback: what it sends, what it
//! counts, and that every way of ending a load ends it.

use std::net::{Ipv4Addr, TcpListener};
use std::time::Duration;

use sluice_harness::load::{Client, Dialer, Load, Req, Stop};
use sluice_harness::upstream::EchoUpstream;

#[test]
fn a_client_answers_in_request_order_and_keeps_its_connections() {
    let upstream = EchoUpstream::start().unwrap();
    let client = Client::connect(upstream.addr(), 3, Dialer::tcp()).unwrap();
    for _ in 0..2 {
        let answers = client.run((0..20).map(|i| Req::get(format!("/{i}")).header("x-n", "v")));
        for (i, answer) in answers.iter().enumerate() {
            assert_eq!(answer.status, 200);
            assert_eq!(answer.json()["path"], format!("/{i}"));
            assert_eq!(answer.upstream_header("X-N").as_deref(), Some("v"));
            assert_eq!(
                answer.upstream_header("host"),
                Some(upstream.addr().to_string())
            );
        }
    }
    let counts = client.run_counting_for(50, Duration::from_secs(30), |_| Req::get("/"));
    assert_eq!(counts.total.get(200), 50, "{counts:?}");
    assert_eq!(upstream.requests_seen(), 90);
}

#[test]
fn counts_per_target_key_and_bin_add_up_to_the_total() {
    let (a, b) = (
        EchoUpstream::start().unwrap(),
        EchoUpstream::start().unwrap(),
    );
    let load = Load::new([(a.addr(), 2), (b.addr(), 1)])
        .at_most(300)
        .count_keys(3, |n| (n % 3) as usize)
        .bins(Duration::from_millis(20))
        .keep_latencies()
        .threads(2);
    let live = load.live();
    let outcome = load
        .run(|n| {
            Req::get("/")
                .header("host", "bench")
                .header("x-api-key", format!("k{}", n % 3))
        })
        .unwrap();
    assert_eq!(outcome.total.get(200), 300, "{outcome:?}");
    assert_eq!(outcome.total.errors, 0);
    assert_eq!(a.requests_seen() + b.requests_seen(), 300);
    assert_eq!(outcome.per_target[0].get(200), a.requests_seen());
    assert_eq!(outcome.per_target[1].get(200), b.requests_seen());
    for row in &outcome.per_key {
        assert_eq!(row.iter().map(|t| t.admitted()).sum::<u64>(), 100);
    }
    let binned: u64 = outcome.bins.iter().map(|t| t.responses()).sum();
    assert_eq!(binned, 300);
    assert_eq!(
        outcome
            .between(Duration::ZERO, outcome.elapsed + outcome.bin)
            .responses(),
        300
    );
    assert!(outcome.percentile(0.5) <= outcome.percentile(0.99));
    assert!(outcome.percentile(0.99) <= outcome.total.slowest);
    assert_eq!(live.sent(), 300);
    assert_eq!(live.tally().by_status, outcome.total.by_status);
}

#[test]
fn a_target_that_is_down_counts_errors_until_the_duration_ends() {
    let addr = {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        listener.local_addr().unwrap()
    };
    let outcome = Load::new([(addr, 2)])
        .for_duration(Duration::from_millis(200))
        .run(|_| Req::get("/"))
        .unwrap();
    assert_eq!(outcome.total.responses(), 0);
    assert!(outcome.total.errors > 0, "{outcome:?}");
    assert!(outcome.total.first_error.is_some());
    assert!(outcome.elapsed < Duration::from_secs(10), "{outcome:?}");
}

#[test]
fn a_paced_load_sends_no_faster_than_its_clock() {
    let upstream = EchoUpstream::start().unwrap();
    // Two connections, each two requests at 0, 100 and 200 ms (the second 50 ms later).
    let outcome = Load::new([(upstream.addr(), 2)])
        .paced(Duration::from_millis(100), 2)
        .for_duration(Duration::from_millis(250))
        .run(|_| Req::get("/"))
        .unwrap();
    let sent = outcome.total.responses() + outcome.total.errors;
    assert!((2..=12).contains(&sent), "{sent} requests: {outcome:?}");
}

#[test]
fn a_stop_ends_a_load_and_kept_answers_say_what_was_not_sent() {
    let upstream = EchoUpstream::start().unwrap();
    let stop = Stop::new();
    let load = Load::new([(upstream.addr(), 1)])
        .paced(Duration::from_millis(20), 1)
        .at_most(10_000)
        .until_stopped(&stop)
        .keep_answers();
    let stopper = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            stop.stop();
        })
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (outcome, connections) = runtime.block_on(load.drive(|_| Req::get("/")));
    stopper.join().unwrap();
    assert_eq!(connections.len(), 1);
    let answered = outcome.total.responses() as usize;
    assert!(answered > 0 && answered < 100, "{answered}");
    assert_eq!(outcome.answers.len(), 10_000);
    assert!(outcome.answers[..answered].iter().all(Result::is_ok));
    assert!(outcome.answers[answered..].iter().all(Result::is_err));
}
