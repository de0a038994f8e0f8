//! Soft limits (`soft_percent`) and warn mode, over the real decision path with the
//! in-memory stores and a fake clock.

use sluice_core::report::Aggregate;
use sluice_core::request::HttpRequest;
use sluice_core::ruleset::Outcome;
use sluice_core::time::{NANOS_PER_MILLI, NANOS_PER_SECOND};

mod support;

use support::{Reference, Seen, TestFilter, key, seen};

const T0: u64 = 1_700_000_000 * NANOS_PER_SECOND;
const MS: u64 = NANOS_PER_MILLI;

/// Eight requests a second per key, eight at most, 25% soft: a margin of ten a second,
/// ten at most. Both emission intervals are whole nanoseconds (125 ms and 100 ms), so a
/// plain token bucket in integers is an exact reference.
const SOFT: &str = r#"[{"name":"soft","key":{"header":"x-api-key"},
    "limits":[{"requests":8,"period":"second","soft_percent":25}]}]"#;

#[test]
fn over_a_spent_limit_requests_are_warned_within_the_margin_and_denied_beyond() {
    let filter = TestFilter::new(SOFT);
    let mut stats = Aggregate::default();
    let mut outcomes = Vec::new();
    for _ in 0..12 {
        let decision =
            filter
                .config
                .ruleset
                .decide_observed(&key("a"), &filter.context(T0, None), &mut stats);
        if seen(&decision) == Seen::Warned {
            assert_eq!(decision.warnings, ["soft"]);
        }
        if let Outcome::Denied(limited) = decision.outcome {
            // Beyond the margin, the wait is the margin's: one request every 100 ms.
            assert_eq!(limited.verdict().retry_after_ns, 100 * MS);
        }
        outcomes.push(seen(&decision));
    }
    let expected: Vec<Seen> = [Seen::Allowed; 8]
        .into_iter()
        .chain([Seen::Warned; 2])
        .chain([Seen::Denied; 2])
        .collect();
    assert_eq!(outcomes, expected);
    // Another client is untouched.
    let other = filter
        .config
        .ruleset
        .decide(&key("b"), &filter.context(T0, None));
    assert_eq!(seen(&other), Seen::Allowed);
    let batch = stats.take();
    let counts = &batch.rules[0].counts;
    // Warned requests passed: in `allowed`, and never in `denied`.
    assert_eq!((counts.allowed, counts.warned, counts.denied), (10, 2, 2));
}

/// Bursts of up to 15 requests after pauses of up to 400 ms, for a simulated two
/// minutes: every decision is what the two reference buckets say (the margin's decides
/// admission and is charged for every admitted request; the limit's own is charged only
/// when it has room, and a request it has none for is warned). So admission never goes
/// beyond the margin's bound and is never refused within it, on both sides exactly, and
/// the running totals stay within `burst + rate × elapsed` of each bucket.
#[test]
fn bursty_and_pausing_load_is_admitted_exactly_within_the_margin() {
    let filter = TestFilter::new(SOFT);
    let mut strict = Reference::full(8, 8, T0);
    let mut margin = Reference::full(10, 10, T0);
    let mut rng: u64 = 0x5eed;
    let mut next = |bound: u64| {
        rng = rng
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (rng >> 33) % bound
    };
    let (mut now, mut admitted, mut within_limit) = (T0, 0u64, 0u64);
    let mut tally = [0u64; 3];
    while now < T0 + 120 * NANOS_PER_SECOND {
        now += next(400) * MS + next(1_000);
        for _ in 0..next(16) {
            strict.refill(now);
            margin.refill(now);
            let expected = if !margin.has_one() {
                Seen::Denied
            } else if strict.has_one() {
                strict.take_one();
                margin.take_one();
                Seen::Allowed
            } else {
                margin.take_one();
                Seen::Warned
            };
            let decision = filter
                .config
                .ruleset
                .decide(&key("bursty"), &filter.context(now, None));
            let got = seen(&decision);
            assert_eq!(got, expected, "at {} ms", (now - T0) / MS);
            tally[got as usize] += 1;
            admitted += u64::from(got != Seen::Denied);
            within_limit += u64::from(got == Seen::Allowed);
            let elapsed_s = (now - T0) as f64 / NANOS_PER_SECOND as f64;
            assert!(admitted as f64 <= 10.0 + 10.0 * elapsed_s);
            assert!(within_limit as f64 <= 8.0 + 8.0 * elapsed_s);
        }
    }
    // The load went over the limit and over the margin, often.
    assert!(tally.iter().all(|n| *n > 100), "{tally:?}");
}

#[test]
fn a_request_another_rule_denies_gives_back_both_buckets_of_a_soft_limit() {
    // `soft` is charged first (higher priority); `gate` then denies every /gate request
    // after its first.
    let filter = TestFilter::new(
        r#"[{"name":"soft","priority":2,"key":{"header":"x-api-key"},
             "limits":[{"requests":8,"period":"second","soft_percent":25}]},
            {"name":"gate","priority":1,"match":{"path_prefix":"/gate"},"key":{"header":"x-api-key"},
             "limits":[{"requests":1,"period":"hour"}]}]"#,
    );
    let decide = |path: &str| {
        let request = HttpRequest::get(path).with_header("x-api-key", "a");
        seen(
            &filter
                .config
                .ruleset
                .decide(&request, &filter.context(T0, None)),
        )
    };
    assert_eq!(decide("/gate"), Seen::Allowed);
    for _ in 0..6 {
        assert_eq!(decide("/work"), Seen::Allowed);
    }
    // Denied by `gate` both while `soft` has room (its own bucket and margin charged,
    // then refunded) and once `soft` is spent (its margin only).
    assert_eq!(decide("/gate"), Seen::Denied);
    assert_eq!(decide("/work"), Seen::Allowed);
    for _ in 0..5 {
        assert_eq!(decide("/gate"), Seen::Denied);
    }
    // The margin held ten: one for the first /gate, eight for /work; this is the ninth.
    assert_eq!(decide("/work"), Seen::Warned);
    assert_eq!(decide("/gate"), Seen::Denied);
    // The tenth: the denied /gate gave its margin back.
    assert_eq!(decide("/work"), Seen::Warned);
    assert_eq!(decide("/work"), Seen::Denied);
}

#[test]
fn a_warn_mode_rule_never_refuses_and_warns_over_its_limit() {
    let filter = TestFilter::new(
        r#"[{"name":"told","mode":"warn","key":{"header":"x-api-key"},
             "limits":[{"requests":5,"period":"second"}]},
            {"name":"counted","mode":"shadow","key":{"header":"x-api-key"},
             "limits":[{"requests":2,"period":"second","soft_percent":50}]}]"#,
    );
    let mut stats = Aggregate::default();
    let mut warned = 0;
    let mut now = T0;
    // Two seconds at 40 requests a second: eight times the limit.
    for i in 0..80 {
        now += 25 * MS;
        let decision = filter.config.ruleset.decide_observed(
            &key("a"),
            &filter.context(now, None),
            &mut stats,
        );
        assert!(decision.is_allowed(), "request {i}");
        // Only the warn-mode rule tells the client; the shadow-mode one counts.
        assert!(decision.warnings.iter().all(|w| *w == "told"));
        warned += usize::from(!decision.warnings.is_empty());
    }
    // The limit's burst, then five a second, pass unwarned.
    assert!((80 - 5 - 10..=80 - 5 - 9).contains(&warned), "{warned}");
    let batch = stats.take();
    let counts = |name: &str| {
        batch
            .rules
            .iter()
            .find(|r| r.rule == name)
            .unwrap()
            .counts
            .clone()
    };
    let told = counts("told");
    assert_eq!(
        (told.allowed, told.warned, told.denied),
        (80, warned as u64, 0)
    );
    let counted = counts("counted");
    assert_eq!(counted.denied, 0);
    assert!(
        counted.warned >= 1 && counted.shadow_denied > 0,
        "{counted:?}"
    );
}

#[test]
fn a_warn_mode_rule_that_cannot_be_evaluated_warns_no_one_and_counts_the_failure() {
    let filter = TestFilter::new(
        r#"[{"name":"told","mode":"warn","failure_mode":"closed","key":{"header":"x-api-key"},
             "limits":[{"requests":5,"period":"second"}]}]"#,
    );
    let mut stats = Aggregate::default();
    // The shared data fails once: the rule is not evaluated.
    filter.store.inject_failures(1);
    let failed =
        filter
            .config
            .ruleset
            .decide_observed(&key("a"), &filter.context(T0, None), &mut stats);
    assert!(failed.is_allowed());
    assert!(failed.warnings.is_empty(), "{:?}", failed.warnings);
    // The other side: evaluated and over its limit, the rule warns.
    let mut warnings = 0;
    for i in 1..=6 {
        let decision = filter.config.ruleset.decide_observed(
            &key("a"),
            &filter.context(T0 + i, None),
            &mut stats,
        );
        warnings += decision.warnings.len();
    }
    assert_eq!(
        warnings, 1,
        "the sixth request of a burst of five is warned"
    );
    let batch = stats.take();
    let told = &batch
        .rules
        .iter()
        .find(|r| r.rule == "told")
        .unwrap()
        .counts;
    assert_eq!(
        (told.fail_open, told.warned, told.shadow_denied),
        (1, 1, 0),
        "{told:?}"
    );
}
