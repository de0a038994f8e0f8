//! Whole-request decisions over a ruleset, with the in-memory store and a fake clock.

use sluice_core::global::lease::FleetView;
use sluice_core::hash::{client_fingerprint, global_bucket};
use sluice_core::request::HttpRequest;
use sluice_core::response::{problem_body, rate_limit_headers, retry_after_seconds};
use sluice_core::ruleset::{Decision, Outcome};
use sluice_core::time::{NANOS_PER_SECOND, Nanos};

const T0: u64 = 1_700_000_000 * NANOS_PER_SECOND;

mod support;

use support::TestFilter as Harness;

impl Harness {
    fn decide(&self, request: &HttpRequest, now: u64) -> Decision<'_> {
        self.config
            .ruleset
            .decide(request, &self.context(now, None))
    }

    fn count_allowed(&self, request: &HttpRequest, now: u64, n: usize) -> usize {
        (0..n)
            .filter(|_| self.decide(request, now).is_allowed())
            .count()
    }
}

const EXAMPLE: &str = r#"[{"name":"api-per-key","match":{"path_prefix":"/api/"},"key":{"header":"x-api-key"},
    "limits":[{"requests":5,"period":"second","burst":10},{"requests":100,"period":"minute"}],"mode":"enforce"}]"#;

fn api(key: &str) -> HttpRequest {
    HttpRequest::get("/api/items").with_header("x-api-key", key)
}

#[test]
fn the_example_rule_admits_the_burst_then_the_rate() {
    let h = Harness::new(EXAMPLE);
    assert_eq!(h.count_allowed(&api("alice"), T0, 20), 10);
    assert_eq!(h.count_allowed(&api("alice"), T0 + NANOS_PER_SECOND, 20), 5);
    assert_eq!(
        h.count_allowed(&api("bob"), T0, 20),
        10,
        "separate keys, separate buckets"
    );
    assert_eq!(
        h.count_allowed(
            &HttpRequest::get("/other").with_header("x-api-key", "alice"),
            T0,
            3
        ),
        3
    );
}

#[test]
fn requests_without_a_key_skip_the_rule_and_are_counted() {
    let h = Harness::new(EXAMPLE);
    let d = h.decide(&HttpRequest::get("/api/items"), T0);
    assert!(d.is_allowed());
    assert_eq!((d.matched_rules, d.keys_missing), (1, 1));
}

#[test]
fn denial_headers_and_body_carry_exact_numbers() {
    let h = Harness::new(EXAMPLE);
    h.count_allowed(&api("carol"), T0, 10);
    let d = h.decide(&api("carol"), T0 + 50_000_000);
    let Outcome::Denied(limited) = d.outcome else {
        panic!("{:?}", d.outcome)
    };
    assert_eq!(retry_after_seconds(&limited), 1);
    assert_eq!(limited.verdict().retry_after_ns, 150_000_000);
    let headers = rate_limit_headers(&limited, true);
    let get = |n: &str| {
        headers
            .iter()
            .find(|(k, _)| *k == n)
            .map(|(_, v)| v.as_str())
            .unwrap()
    };
    // 5/s with a burst of 10: the quota is the capacity, refilled from empty in 2 s.
    assert_eq!(
        get("ratelimit-policy"),
        r#""api-per-key/1";q=10;w=2, "api-per-key/2";q=100;w=60"#
    );
    assert_eq!(get("ratelimit"), r#""api-per-key/1";r=0;t=1"#);
    assert_eq!(get("x-ratelimit-limit"), "10");
    assert_eq!(get("x-ratelimit-remaining"), "0");
    assert_eq!(get("x-ratelimit-reset"), "1");
    let body: serde_json::Value = serde_json::from_str(&problem_body(&limited, 429)).unwrap();
    assert_eq!(body["rule"], "api-per-key");
    assert_eq!(body["retry_after"], 1);
    assert_eq!(body["status"], 429);
}

#[test]
fn allowed_headers_describe_the_tightest_limit() {
    let h = Harness::new(EXAMPLE);
    let d = h.decide(&api("dave"), T0);
    let tightest = d.tightest.expect("headers for allowed requests");
    let headers = rate_limit_headers(&tightest, false);
    assert_eq!(
        headers[1],
        ("ratelimit", r#""api-per-key/1";r=9;t=1"#.to_string())
    );
    assert!(!d.near_limit);
    h.count_allowed(&api("dave"), T0, 7);
    assert!(h.decide(&api("dave"), T0).near_limit, "9 of 10 used");
}

#[test]
fn shadow_rules_never_deny_but_report_would_be_denials() {
    let h = Harness::new(
        r#"[{"name":"shadow","mode":"shadow","key":"global","limits":[{"requests":2,"period":"minute"}]}]"#,
    );
    let decisions: Vec<bool> = (0..5)
        .map(|_| {
            h.decide(&HttpRequest::get("/"), T0)
                .shadow_denied
                .is_empty()
        })
        .collect();
    assert_eq!(decisions, [true, true, false, false, false]);
    assert!((0..5).all(|_| h.decide(&HttpRequest::get("/"), T0).is_allowed()));
    assert!(
        h.decide(&HttpRequest::get("/"), T0).tightest.is_none(),
        "shadow rules stay invisible to clients"
    );
}

#[test]
fn overrides_weighted_costs_and_disabled_rules() {
    let h = Harness::new(
        r#"[{"name":"keyed","key":{"header":"x-api-key"},"limits":[{"requests":2,"period":"minute"}],
             "overrides":[{"client":"acme","limits":[{"requests":500,"period":"second"}]}]},
            {"name":"costly","match":{"path_prefix":"/bulk"},"key":"global","limits":[{"requests":10,"period":"minute"}],
             "cost":{"header":{"name":"x-cost","max":8}}},
            {"name":"off","enabled":false,"key":"global","limits":[{"requests":1,"period":"day"}]}]"#,
    );
    assert_eq!(
        h.count_allowed(
            &HttpRequest::get("/").with_header("x-api-key", "acme"),
            T0,
            600
        ),
        500
    );
    assert_eq!(
        h.count_allowed(
            &HttpRequest::get("/").with_header("x-api-key", "zed"),
            T0,
            10
        ),
        2
    );
    let bulk = |cost: &str| {
        HttpRequest::get("/bulk")
            .with_header("x-api-key", "bulk")
            .with_header("x-cost", cost)
    };
    assert!(h.decide(&bulk("6"), T0).is_allowed());
    assert!(!h.decide(&bulk("6"), T0).is_allowed(), "6 + 6 > 10");
    assert!(
        h.decide(&bulk("4"), T0).is_allowed(),
        "a denied request consumed nothing"
    );
}

#[test]
fn a_denying_rule_charges_no_other_matching_rule() {
    let h = Harness::new(
        r#"[{"name":"wide","key":"global","limits":[{"requests":100,"period":"minute"}]},
            {"name":"narrow","key":{"header":"x-user"},"limits":[{"requests":1,"period":"minute"}]}]"#,
    );
    let user = HttpRequest::get("/").with_header("x-user", "u");
    assert_eq!(h.count_allowed(&user, T0, 10), 1);
    let d = h.decide(&HttpRequest::get("/"), T0);
    assert_eq!(
        d.tightest.unwrap().verdict().remaining,
        98,
        "only one request charged the wide rule"
    );
}

#[test]
fn statistics_count_each_rules_outcomes_and_its_throttled_clients() {
    use sluice_core::report::Aggregate;
    let h = Harness::new(
        r#"[{"name":"keyed","key":{"header":"x-api-key"},"limits":[{"requests":2,"period":"minute"}]},
            {"name":"watch","mode":"shadow","key":"global","limits":[{"requests":3,"period":"minute"}]}]"#,
    );
    let mut stats = Aggregate::default();
    let mut decide = |request: &HttpRequest| {
        h.config
            .ruleset
            .decide_observed(request, &h.context(T0, None), &mut stats);
    };
    for _ in 0..4 {
        decide(&HttpRequest::get("/").with_header("x-api-key", "mallory"));
    }
    decide(&HttpRequest::get("/"));
    let batch = stats.take();
    let keyed = batch.rules.iter().find(|r| r.rule == "keyed").unwrap();
    assert_eq!(
        (
            keyed.counts.allowed,
            keyed.counts.denied,
            keyed.counts.key_missing
        ),
        (2, 2, 1)
    );
    assert_eq!(
        keyed.counts.near_limit, 1,
        "the second request used the whole burst"
    );
    assert_eq!(keyed.top_clients[0].client, "mallory");
    assert_eq!(keyed.top_clients[0].throttled, 2);
    let watch = batch.rules.iter().find(|r| r.rule == "watch").unwrap();
    assert_eq!((watch.counts.allowed, watch.counts.shadow_denied), (3, 2));
}

#[test]
fn a_ruleset_lists_exactly_the_request_attributes_its_rules_read() {
    use sluice_core::request::RequestNeeds;
    let key_only = Harness::new(
        r#"[{"name":"k","key":{"header":"X-Api-Key"},"limits":[{"requests":1,"period":1}]}]"#,
    );
    assert_eq!(
        key_only.config.ruleset.needs(),
        &RequestNeeds {
            headers: vec!["x-api-key".into()],
            ..RequestNeeds::default()
        },
        "a global match and a header key need one header and nothing else"
    );
    let everything = Harness::new(
        r#"[{"name":"a","match":{"host":"h","path_prefix":"/","methods":["GET"],"headers":[{"name":"x-t","present":true}]},
             "key":{"composite":[{"client_ip":{"trusted_hops":1}},{"query":"q"}]},"limits":[{"requests":1,"period":1}],
             "cost":{"header":{"name":"x-cost","max":2}}},
            {"name":"off","enabled":false,"key":{"header":"x-unused"},"limits":[{"requests":1,"period":1}]}]"#,
    );
    assert_eq!(
        everything.config.ruleset.needs(),
        &RequestNeeds {
            method: true,
            authority: true,
            path: true,
            peer_ip: true,
            headers: vec!["x-t".into(), "x-forwarded-for".into(), "x-cost".into()],
            ..RequestNeeds::default()
        },
        "disabled rules read nothing"
    );
}

const GLOBAL: &str = r#"[{"name":"fleet","key":{"header":"x-api-key"},
    "limits":[{"requests":5,"period":"second","burst":10,"scope":"global"}]}]"#;

/// Whether a ruleset has a fleet-wide limit decides how often its proxy syncs: a global
/// limit on a rule or on one of its overrides counts, a disabled rule's does not.
#[test]
fn a_ruleset_knows_whether_it_has_a_fleet_wide_limit() {
    let has = |rules: &str| Harness::new(rules).config.ruleset.has_global_limits();
    assert!(has(GLOBAL));
    assert!(!has(r#"[{"name":"local","key":{"header":"x-api-key"},
        "limits":[{"requests":5,"period":"second"}]}]"#));
    assert!(has(r#"[{"name":"vip","key":{"header":"x-api-key"},
        "limits":[{"requests":5,"period":"second"}],
        "overrides":[{"client":"big","limits":[{"requests":50,"period":"second","scope":"global"}]}]}]"#));
    assert!(!has(
        r#"[{"name":"off","enabled":false,"key":{"header":"x-api-key"},
        "limits":[{"requests":5,"period":"second","scope":"global"}]}]"#
    ));
    assert!(!has("[]"));
}

#[test]
fn a_global_limit_without_a_coordinator_is_enforced_by_this_proxy_alone() {
    let h = Harness::new(GLOBAL);
    assert!(h.config.ruleset.rules()[0].limits[0].global);
    assert_eq!(h.count_allowed(&api("alice"), T0, 20), 10);
    assert_eq!(h.count_allowed(&api("alice"), T0 + NANOS_PER_SECOND, 20), 5);
    let d = h.decide(&api("alice"), T0 + NANOS_PER_SECOND);
    let Outcome::Denied(limited) = d.outcome else {
        panic!("denied")
    };
    assert!(limited.verdict().retry_after_ns > 0);
    assert_eq!(limited.limit().unwrap().requests, 5);
    assert_eq!(
        h.store.slots_used(),
        0,
        "a global limit takes no bucket slot"
    );
}

#[test]
fn a_global_limit_in_a_fleet_spends_an_even_share_then_waits_for_leases() {
    let mut h = Harness::new(GLOBAL);
    h.view = FleetView {
        fleet_size: 2,
        fallback: false,
        ..FleetView::ALONE
    };
    assert_eq!(
        h.count_allowed(&api("bob"), T0, 20),
        5,
        "half the burst of 10"
    );
    // A client's `remaining` is the fleet's, not this proxy's even share: 4 of the 5 here,
    // for each of the two proxies.
    let allowed = h.decide(&api("carol"), T0);
    let headers = rate_limit_headers(&allowed.tightest.unwrap(), false);
    let remaining = headers.iter().find(|(n, _)| *n == "x-ratelimit-remaining");
    assert_eq!(remaining.map(|(_, v)| v.as_str()), Some("8"));
}

#[test]
fn a_denial_by_another_rule_gives_the_global_token_back() {
    // "both": a global limit of 3 and a proxy limit of 5; "tight": a proxy limit of 2 that
    // denies the third request after "both" spent its global token.
    let h = Harness::new(
        r#"[{"name":"both","key":{"header":"x-api-key"},
             "limits":[{"requests":3,"period":"minute","scope":"global"},{"requests":5,"period":"minute"}]},
            {"name":"tight","key":{"header":"x-api-key"},"limits":[{"requests":2,"period":"minute"}]}]"#,
    );
    assert_eq!(h.count_allowed(&api("dave"), T0, 10), 2);
    let both = h
        .config
        .ruleset
        .rules()
        .iter()
        .find(|r| r.name == "both")
        .unwrap();
    let bucket = global_bucket(
        both.limits[0].identity,
        client_fingerprint(&both.id, "dave"),
    );
    let spend = |now| {
        h.config
            .lease_table
            .spend(
                &h.leases,
                bucket,
                &both.limits[0].gcra,
                1,
                Nanos::new(now),
                &h.view,
            )
            .unwrap()
            .spend
            .admitted()
    };
    assert!(
        spend(T0),
        "one of 3 global tokens is left: the denials gave theirs back"
    );
    assert!(!spend(T0));
}

#[test]
fn a_global_denial_names_the_global_limit() {
    let h = Harness::new(
        r#"[{"name":"both","key":{"header":"x-api-key"},
             "limits":[{"requests":2,"period":"minute","scope":"global"},{"requests":5,"period":"minute"}]}]"#,
    );
    assert_eq!(h.count_allowed(&api("erin"), T0, 10), 2);
    let Outcome::Denied(limited) = h.decide(&api("erin"), T0).outcome else {
        panic!("denied")
    };
    assert!(limited.limit().unwrap().global);
}

/// A rule with a `descriptor` decides Envoy's rate limit service requests only: the filter
/// never matches it (its empty `match` would otherwise match everything) and reads nothing
/// for it.
#[test]
fn a_descriptor_rule_never_decides_an_http_request() {
    let h = Harness::new(
        r#"[{"name":"rls-only","key":"global","limits":[{"requests":1,"period":"minute"}],
            "descriptor":{"domain":"edge","entries":[{"key":"api_key"}]}}]"#,
    );
    assert_eq!(h.count_allowed(&api("alice"), T0, 5), 5);
    assert_eq!(h.decide(&api("alice"), T0).matched_rules, 0);
    assert_eq!(
        *h.config.ruleset.needs(),
        sluice_core::request::RequestNeeds::default()
    );
}
