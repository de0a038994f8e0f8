//! In-flight limits in whole-request decisions: places taken at admission, let go by the
//! caller at the stream's end, and never kept by a denied request.

use sluice_core::hash::client_fingerprint;
use sluice_core::in_flight::{HolderIds, InFlightCounters, InFlightTable};
use sluice_core::report::Aggregate;
use sluice_core::request::HttpRequest;
use sluice_core::ruleset::{Decision, InFlightContext, Outcome};
use sluice_core::store::MemoryStore;
use sluice_core::time::{NANOS_PER_SECOND, Nanos};

const T0: Nanos = Nanos::new(1_700_000_000 * NANOS_PER_SECOND);

mod support;

use support::TestFilter;

/// The filter under test, and the in-flight table's places.
struct Harness {
    filter: TestFilter,
    places: MemoryStore,
    table: InFlightTable,
    ids: std::cell::RefCell<HolderIds>,
    /// The worker's per-rule statistics.
    stats: std::cell::RefCell<Aggregate>,
}

impl std::ops::Deref for Harness {
    type Target = TestFilter;

    fn deref(&self) -> &TestFilter {
        &self.filter
    }
}

impl Harness {
    fn new(rules: &str) -> Self {
        Self {
            filter: TestFilter::new(rules),
            places: MemoryStore::new(),
            table: InFlightTable::default(),
            ids: std::cell::RefCell::new(HolderIds::new(1)),
            stats: Default::default(),
        }
    }

    fn decide(&self, request: &HttpRequest) -> Decision<'_> {
        let cx = self.context(T0.get(), None);
        let in_flight = InFlightContext {
            table: &self.table,
            store: &self.places,
            holder: self.ids.borrow_mut().next_id(),
        };
        self.config.ruleset.decide_in_flight(
            request,
            &cx,
            &in_flight,
            &mut *self.stats.borrow_mut(),
        )
    }

    /// What the filter does when the stream ends.
    fn end(&self, decision: Decision<'_>) {
        for hold in &decision.holds {
            let released =
                self.table
                    .release(&self.places, hold, T0, &mut InFlightCounters::default());
            assert_eq!(released, Ok(true));
        }
    }

    fn in_flight(&self, rule: &str, client: &str) -> usize {
        self.table
            .in_flight(&self.places, client_fingerprint(rule, client), T0)
            .unwrap()
    }
}

fn keyed(key: &str) -> HttpRequest {
    HttpRequest::get("/llm").with_header("x-api-key", key)
}

const CONCURRENT: &str = r#"[{"name":"llm","key":{"header":"x-api-key"},"limits":[{"concurrent":3}],
    "overrides":[{"client":"big","limits":[{"concurrent":5}]}]}]"#;

#[test]
fn a_client_has_at_most_its_limit_in_flight_and_an_ended_request_frees_its_place() {
    let h = Harness::new(CONCURRENT);
    assert!(h.config.ruleset.has_in_flight_rules());
    let live: Vec<Decision<'_>> = (0..3).map(|_| h.decide(&keyed("alice"))).collect();
    assert!(live.iter().all(|d| d.is_allowed() && d.holds.len() == 1));
    let denied = h.decide(&keyed("alice"));
    let Outcome::InFlightFull(denial) = denied.outcome else {
        panic!("{:?}", denied.outcome)
    };
    assert_eq!((denial.rule.name.as_str(), denial.max), ("llm", 3));
    assert!(denied.holds.is_empty());
    assert_eq!(h.in_flight("llm", "alice"), 3);
    // Other clients, and overrides, count apart.
    assert!(h.decide(&keyed("bob")).is_allowed());
    let big: Vec<bool> = (0..6)
        .map(|_| h.decide(&keyed("big")).is_allowed())
        .collect();
    assert_eq!(big, [true, true, true, true, true, false]);
    let mut live = live.into_iter();
    h.end(live.next().unwrap());
    assert_eq!(h.in_flight("llm", "alice"), 2);
    assert!(h.decide(&keyed("alice")).is_allowed());
    assert!(!h.decide(&keyed("alice")).is_allowed());
    // Three refused (alice twice, big once), counted apart among the denials.
    let batch = h.stats.borrow_mut().take();
    let counts = &batch.rules[0].counts;
    assert_eq!((counts.denied, counts.in_flight_refused), (3, 3));
    assert_eq!(counts.allowed, 3 + 1 + 5 + 1);
}

#[test]
fn a_request_denied_by_a_token_bucket_holds_no_place_and_one_denied_in_flight_no_token() {
    let h = Harness::new(
        r#"[{"name":"both","key":{"header":"x-api-key"},
             "limits":[{"requests":1,"period":"minute","burst":2},{"concurrent":1}]}]"#,
    );
    let first = h.decide(&keyed("alice"));
    assert!(first.is_allowed());
    // The place is taken: denied in flight, and the bucket's second token is untouched.
    assert!(matches!(
        h.decide(&keyed("alice")).outcome,
        Outcome::InFlightFull(_)
    ));
    h.end(first);
    let second = h.decide(&keyed("alice"));
    assert!(second.is_allowed(), "the second token was still there");
    h.end(second);
    // Now the bucket denies; the place it took first is let go with the denial.
    let third = h.decide(&keyed("alice"));
    assert!(matches!(third.outcome, Outcome::Denied(_)));
    assert!(third.holds.is_empty());
    assert_eq!(h.in_flight("both", "alice"), 0);
}

#[test]
fn a_request_denied_by_another_rule_lets_every_place_go() {
    let h = Harness::new(
        r#"[{"name":"places","priority":2,"key":{"header":"x-api-key"},"limits":[{"concurrent":5}]},
            {"name":"shadow-places","mode":"shadow","key":{"header":"x-api-key"},"limits":[{"concurrent":5}]},
            {"name":"bucket","priority":1,"key":"global","limits":[{"requests":1,"period":"minute"}]}]"#,
    );
    let allowed = h.decide(&keyed("alice"));
    assert!(allowed.is_allowed());
    assert_eq!(allowed.holds.len(), 2, "an enforced and a shadow place");
    let denied = h.decide(&keyed("alice"));
    assert!(matches!(denied.outcome, Outcome::Denied(_)));
    assert_eq!(h.in_flight("places", "alice"), 1);
    assert_eq!(h.in_flight("shadow-places", "alice"), 1);
}

#[test]
fn a_shadow_in_flight_limit_never_denies() {
    let h = Harness::new(
        r#"[{"name":"watch","mode":"shadow","key":{"header":"x-api-key"},"limits":[{"concurrent":1}]}]"#,
    );
    let first = h.decide(&keyed("alice"));
    let second = h.decide(&keyed("alice"));
    assert!(first.is_allowed() && second.is_allowed());
    assert!(first.shadow_denied.is_empty());
    assert_eq!(second.shadow_denied.len(), 1);
    assert!(second.holds.is_empty(), "a would-be denial holds no place");
}

#[test]
fn a_table_that_cannot_be_used_follows_the_rules_failure_mode() {
    for (mode, allowed) in [("open", true), ("closed", false)] {
        let h = Harness::new(&format!(
            r#"[{{"name":"r","key":"global","failure_mode":"{mode}","limits":[{{"concurrent":2}}]}}]"#
        ));
        h.places.inject_failures(1);
        let decision = h.decide(&keyed("alice"));
        assert_eq!(decision.is_allowed(), allowed, "{mode}");
        assert_eq!(decision.in_flight_failures, 1);
        assert!(decision.holds.is_empty());
    }
}

#[test]
fn rules_without_in_flight_limits_never_touch_the_in_flight_table() {
    let h = Harness::new(
        r#"[{"name":"rate","key":{"header":"x-api-key"},"limits":[{"requests":5,"period":1}],
             "overrides":[{"client":"big","limits":[{"requests":50,"period":1}]}]}]"#,
    );
    assert!(!h.config.ruleset.has_in_flight_rules());
    for key in ["alice", "big"] {
        assert!(h.decide(&keyed(key)).is_allowed());
    }
    assert_eq!(h.places.reads(), 0);
}
