//! Elastic rules (`elastic`): a client over its own limit passes, warned, while the rule's
//! admitted traffic in this Envoy is under the ceiling; over the real decision path with
//! the in-memory stores and a fake clock.

use sluice_core::report::Aggregate;
use sluice_core::request::HttpRequest;
use sluice_core::rule::Rule;
use sluice_core::ruleset::Outcome;
use sluice_core::spec::RuleSpec;
use sluice_core::time::{NANOS_PER_MILLI, NANOS_PER_SECOND};

mod support;

use support::{Reference, Seen, TestFilter, key, seen};

const T0: u64 = 1_700_000_000 * NANOS_PER_SECOND;
const MS: u64 = NANOS_PER_MILLI;

/// Four requests a second per key (four at most); clients may pass that while the rule
/// admits fewer than ten a second, all clients together (ten at most). Both emission
/// intervals are whole nanoseconds (250 ms and 100 ms), so token buckets in integers are
/// an exact reference.
const ELASTIC: &str = r#"[{"name":"elastic","key":{"header":"x-api-key"},
    "limits":[{"requests":4,"period":"second"}],
    "elastic":{"requests":10,"period":"second"}}]"#;

fn decide(filter: &TestFilter, request: &HttpRequest, now: u64) -> Seen {
    seen(
        &filter
            .config
            .ruleset
            .decide(request, &filter.context(now, None)),
    )
}

#[test]
fn a_client_alone_passes_its_limit_up_to_the_ceiling_warned_and_then_is_refused() {
    let filter = TestFilter::new(ELASTIC);
    let mut stats = Aggregate::default();
    let mut outcomes = Vec::new();
    for _ in 0..12 {
        let decision =
            filter
                .config
                .ruleset
                .decide_observed(&key("a"), &filter.context(T0, None), &mut stats);
        if seen(&decision) == Seen::Warned {
            assert_eq!(decision.warnings, ["elastic"]);
        }
        if let Outcome::Denied(limited) = decision.outcome {
            // Refused by its own limit: the wait is until that has a token again.
            assert_eq!(limited.verdict().retry_after_ns, 250 * MS);
        }
        outcomes.push(seen(&decision));
    }
    // Four within its limit, six more while the ceiling's ten had room, then refused.
    let expected: Vec<Seen> = [Seen::Allowed; 4]
        .into_iter()
        .chain([Seen::Warned; 6])
        .chain([Seen::Denied; 2])
        .collect();
    assert_eq!(outcomes, expected);
    let batch = stats.take();
    let counts = &batch.rules[0].counts;
    assert_eq!((counts.allowed, counts.warned, counts.denied), (10, 6, 2));
}

#[test]
fn once_the_rules_traffic_reaches_the_ceiling_the_next_request_is_held_to_its_limit() {
    // Two requests a minute per key: a client's own bucket stays empty for this test.
    let filter = TestFilter::new(
        r#"[{"name":"elastic","key":{"header":"x-api-key"},
             "limits":[{"requests":2,"period":"minute"}],
             "elastic":{"requests":10,"period":"second"}}]"#,
    );
    // Six clients within their own limits: twelve requests, more than the ceiling's ten.
    for client in ["b", "c", "d", "e", "f", "g"] {
        for _ in 0..2 {
            assert_eq!(decide(&filter, &key(client), T0), Seen::Allowed);
        }
    }
    // Nobody is ever held below their own limit; over it, nobody passes now.
    for _ in 0..2 {
        assert_eq!(decide(&filter, &key("a"), T0), Seen::Allowed);
    }
    assert_eq!(decide(&filter, &key("a"), T0), Seen::Denied);
    // The pool is fourteen requests in: its ten and a debt of four. It has room for one
    // again once five have refilled (500 ms), and not a nanosecond before.
    assert_eq!(decide(&filter, &key("a"), T0 + 500 * MS - 1), Seen::Denied);
    assert_eq!(decide(&filter, &key("a"), T0 + 500 * MS), Seen::Warned);
    assert_eq!(decide(&filter, &key("a"), T0 + 500 * MS), Seen::Denied);
}

/// Four clients in bursts of up to eight requests after pauses of up to 1.2 s, then of
/// up to 250 ms, twenty seconds each in turn, for a simulated two minutes: every decision is what the reference buckets say (a client's
/// own decides while it has a token and charges the pool, into a debt of at most one
/// burst; without one, the pool decides). So no client is ever refused within its own
/// limit, and requests over the limits never pass beyond the ceiling's bound.
#[test]
fn bursty_and_pausing_load_passes_limits_exactly_while_the_ceiling_has_room() {
    let filter = TestFilter::new(ELASTIC);
    let clients = ["k0", "k1", "k2", "k3"];
    let mut own: Vec<Reference> = clients.iter().map(|_| Reference::full(4, 4, T0)).collect();
    let mut pool = Reference::with_debt(10, 10, 10, T0);
    let mut rng: u64 = 0xe1a5;
    let mut next = |bound: u64| {
        rng = rng
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (rng >> 33) % bound
    };
    let (mut now, mut over) = (T0, 0u64);
    let mut within = [0u64; 4];
    let mut tally = [0u64; 3];
    while now < T0 + 120 * NANOS_PER_SECOND {
        // Twenty quiet seconds, then twenty busy ones, and again.
        let busy = (now - T0) / NANOS_PER_SECOND / 20 % 2 == 1;
        now += next(if busy { 250 } else { 1_200 }) * MS + next(1_000);
        let c = next(4) as usize;
        for _ in 0..next(9) {
            own[c].refill(now);
            pool.refill(now);
            let expected = if own[c].has_one() {
                own[c].take_one();
                pool.charge_with_debt();
                Seen::Allowed
            } else if pool.has_one() {
                pool.take_one();
                Seen::Warned
            } else {
                Seen::Denied
            };
            let got = decide(&filter, &key(clients[c]), now);
            assert_eq!(got, expected, "{} at {} ms", clients[c], (now - T0) / MS);
            tally[got as usize] += 1;
            over += u64::from(got == Seen::Warned);
            within[c] += u64::from(got == Seen::Allowed);
            let elapsed_s = (now - T0) as f64 / NANOS_PER_SECOND as f64;
            assert!(over as f64 <= 10.0 + 10.0 * elapsed_s);
            assert!(within[c] as f64 <= 4.0 + 4.0 * elapsed_s);
        }
    }
    // The load passed limits, was held to them, and was refused, each often.
    assert!(tally.iter().all(|n| *n > 100), "{tally:?}");
}

#[test]
fn a_request_another_rule_refuses_does_not_charge_the_pool() {
    // `gate` denies every /gate request after its first.
    let filter = TestFilter::new(
        r#"[{"name":"elastic","priority":2,"key":{"header":"x-api-key"},
             "limits":[{"requests":4,"period":"second"}],
             "elastic":{"requests":10,"period":"second"}},
            {"name":"gate","priority":1,"match":{"path_prefix":"/gate"},"key":{"header":"x-api-key"},
             "limits":[{"requests":1,"period":"hour"}]}]"#,
    );
    let gate = HttpRequest::get("/gate").with_header("x-api-key", "a");
    assert_eq!(decide(&filter, &gate, T0), Seen::Allowed);
    for _ in 0..20 {
        assert_eq!(decide(&filter, &gate, T0), Seen::Denied);
    }
    // The first /gate took one of the pool's ten and one of `a`'s four; the refused ones
    // took nothing.
    let work: Vec<Seen> = (0..11).map(|_| decide(&filter, &key("a"), T0)).collect();
    let expected: Vec<Seen> = [Seen::Allowed; 3]
        .into_iter()
        .chain([Seen::Warned; 6])
        .chain([Seen::Denied; 2])
        .collect();
    assert_eq!(work, expected);
}

#[test]
fn a_shadow_mode_elastic_rule_reports_what_its_strict_limit_would_do() {
    let filter = TestFilter::new(
        r#"[{"name":"elastic","mode":"shadow","key":{"header":"x-api-key"},
             "limits":[{"requests":4,"period":"second"}],
             "elastic":{"requests":10,"period":"second"}}]"#,
    );
    let mut stats = Aggregate::default();
    for _ in 0..8 {
        let decision =
            filter
                .config
                .ruleset
                .decide_observed(&key("a"), &filter.context(T0, None), &mut stats);
        assert_eq!(seen(&decision), Seen::Allowed);
    }
    let batch = stats.take();
    assert_eq!(batch.rules[0].counts.shadow_denied, 4);
}

fn problems(rule: &str) -> Vec<(String, String)> {
    let spec: RuleSpec = serde_json::from_str(rule).unwrap();
    match Rule::try_from(spec) {
        Ok(_) => Vec::new(),
        Err(errors) => errors.0.into_iter().map(|p| (p.field, p.message)).collect(),
    }
}

/// A rule with `limits` and the rest of its fields given in `extra`.
fn rule_with(limits: &str, extra: &str) -> String {
    format!(
        r#"{{"name":"e","key":{{"header":"k"}},"limits":{limits},
            "elastic":{{"requests":10,"period":"second"}}{extra}}}"#
    )
}

#[test]
fn an_elastic_rule_is_checked_on_both_sides_of_each_bound() {
    let proxy = r#"[{"requests":4,"period":"second"}]"#;
    assert_eq!(problems(&rule_with(proxy, "")), []);
    assert_eq!(problems(&rule_with(proxy, r#","mode":"shadow""#)), []);
    let refused = [
        (
            r#"[{"requests":4,"period":"second","scope":"global"}]"#,
            "",
            "scope: proxy",
        ),
        (
            r#"[{"tokens":400,"period":"second"}]"#,
            r#","tokens":{"usage":"openai","default_estimate":100}"#,
            "scope: proxy",
        ),
        (
            r#"[{"requests":4,"period":"second","soft_percent":10}]"#,
            "",
            "soft",
        ),
        (r#"[{"concurrent":4}]"#, "", "in-flight"),
        (
            proxy,
            r#","on_limit":"delay","delay":{"max_delay_ms":100}"#,
            "delay",
        ),
        (proxy, r#","mode":"warn""#, "warn-mode"),
    ];
    for (limits, extra, why) in refused {
        let found = problems(&rule_with(limits, extra));
        assert!(
            found.iter().any(|(f, m)| f == "elastic" && m.contains(why)),
            "{limits} {extra}: {found:?}"
        );
    }
    // The ceiling's own fields are checked as any limit's, at their path.
    let zero = r#"{"name":"e","key":{"header":"k"},"limits":[{"requests":4,"period":"second"}],
        "elastic":{"requests":0,"period":"second"}}"#;
    assert_eq!(
        problems(zero),
        [(
            "elastic.requests".to_string(),
            "must be between 1 and 1000000000".to_string()
        )]
    );
    let unknown = r#"{"name":"e","key":{"header":"k"},"limits":[{"requests":4,"period":"second"}],
        "elastic":{"requests":10,"period":"second","ceiling":5}}"#;
    assert!(serde_json::from_str::<RuleSpec>(unknown).is_err());
}
