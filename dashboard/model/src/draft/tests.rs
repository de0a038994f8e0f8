//! The whole draft: round trips through specs, and every problem on the field the form
//! shows it at. Each part's own tests are in its module.

use super::*;

fn spec(json: &str) -> RuleSpec {
    serde_json::from_str(json).unwrap()
}

/// Rules the form can express, one for each of its inputs' states.
fn expressible() -> Vec<RuleSpec> {
    let mut rules = vec![blank()];
    for json in [
        r#"{"name":"api","match":{"path_prefix":"/api/","methods":["GET","POST"],"host":"*.example.com"},
            "key":{"header":"x-api-key"},
            "limits":[{"requests":5,"period":"second","burst":10},{"requests":100,"period":"minute"}]}"#,
        r#"{"id":"stable","name":"ips","description":"by address","priority":7,"enabled":false,
            "mode":"shadow","key":{"client_ip":{"trusted_hops":2}},
            "limits":[{"requests":3,"period":90}],"failure_mode":"closed",
            "response":{"status":503,"rate_limit_headers":false,"grpc_status":"unavailable"}}"#,
        r#"{"name":"q","match":{"path_exact":"/search","headers":[
                {"name":"x-beta","present":false},{"name":"x-tier","equals":"gold"},
                {"name":"x-any","present":true}]},
            "key":{"query":"user"},"limits":[{"requests":1,"period":"day"}],
            "cost":{"header":{"name":"x-cost","max":50,"default":2}}}"#,
        r#"{"name":"paths","match":{"path_regex":"/v[0-9]+/.*"},"key":"path","priority":-3,
            "limits":[{"requests":9,"period":"hour"}],"cost":{"fixed":3},
            "overrides":[{"client":"acme","limits":[{"requests":500,"period":"second","burst":600}]},
                         {"client":"beta","limits":[{"requests":1,"period":60}]}]}"#,
        r#"{"name":"all","key":"global","limits":[{"requests":1000,"period":"second"}],"failure_mode":"open"}"#,
        r#"{"name":"fleet","key":{"header":"x-api-key"},
            "limits":[{"requests":100,"period":"minute","scope":"global"},{"requests":10,"period":"second"}],
            "overrides":[{"client":"acme","limits":[{"requests":1000,"period":"minute","scope":"global"}]}]}"#,
        r#"{"name":"llm","key":{"header":"x-api-key"},"limits":[{"requests":5,"period":"second"},{"concurrent":10}],
            "overrides":[{"client":"acme","limits":[{"concurrent":50}]}]}"#,
        r#"{"name":"tenant","key":{"metadata":{"filter":"envoy.filters.http.jwt_authn","path":["claims","tenant"]}},
            "key_missing":{"fallback":"anonymous"},"enforce_percent":25,
            "limits":[{"requests":60,"period":"minute"},{"tokens":20000,"period":"minute","burst":30000,"count":"output"}],
            "tokens":{"usage":{"json_pointer":{"input":"/usage/in","output":"/usage/out"}},"default_estimate":500,"estimate_input_from_body":true}}"#,
        r#"{"name":"mtls","key":{"peer_certificate":"subject"},"enforce_percent":0,
            "limits":[{"tokens":1000,"period":"second","count":"input"}],
            "tokens":{"usage":"openai","default_estimate":0,"include_usage":true}}"#,
        r#"{"name":"session","key":{"cookie":"sid"},"key_missing":"skip","limits":[{"requests":1,"period":"second"}],
            "overrides":[{"client":"big","limits":[{"tokens":9,"period":"day"}]}],
            "tokens":{"usage":"anthropic","default_estimate":7}}"#,
        r#"{"name":"smooth","key":{"header":"x-api-key"},"limits":[{"requests":20,"period":"second","burst":5}],
            "on_limit":"delay","delay":{"max_delay_ms":1000}}"#,
        r#"{"name":"queued","key":"global","limits":[{"requests":2,"period":"second"}],
            "on_limit":"delay","delay":{"max_delay_ms":250,"queue_per_key":4,"queue_per_worker":64}}"#,
        r#"{"name":"roomy","key":{"header":"x-api-key"},"limits":[{"requests":10,"period":"second"}],
            "elastic":{"requests":300,"period":"second"}}"#,
        r#"{"name":"roomy-slow","key":"path","limits":[{"requests":1,"period":"minute"},{"concurrent":4}],
            "overrides":[{"client":"acme","limits":[{"requests":5,"period":"minute"}]}],
            "elastic":{"requests":600,"period":45,"burst":50}}"#,
    ] {
        rules.push(spec(json));
    }
    rules
}

#[test]
fn every_form_expressible_rule_survives_the_form() {
    for rule in expressible() {
        let (back, problems) = Draft::from_spec(&rule).to_spec();
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(back, rule);
    }
}

#[test]
fn a_draft_survives_the_wire_and_back() {
    for rule in expressible() {
        let draft = Draft::from_spec(&rule);
        let (spec, _) = draft.to_spec();
        let json = serde_json::to_string(&spec).unwrap();
        let read: RuleSpec = serde_json::from_str(&json).unwrap();
        assert_eq!(Draft::from_spec(&read), draft, "{json}");
    }
}

#[test]
fn drafts_hold_typed_values() {
    let rule = &expressible()[2];
    let draft = Draft::from_spec(rule);
    assert_eq!(draft.mode, Mode::Shadow);
    assert_eq!(draft.failure_mode, Some(FailureMode::Closed));
    assert_eq!(draft.key.kind, KeyKind::ClientIp);
    assert_eq!(draft.key.hops.value(), Ok(Some(2)));
    assert_eq!(draft.limits[0].period, PeriodChoice::Custom);
    assert_eq!(draft.limits[0].seconds.value(), Ok(Some(90)));
    assert_eq!(draft.status.value(), Ok(Some(503)));
    assert_eq!(draft.priority.text(), "7");
    let fleet = Draft::from_spec(&expressible()[6]);
    assert_eq!(fleet.limits[0].scope, Scope::Global);
    assert_eq!(fleet.limits[1].scope, Scope::Proxy);
}

#[test]
fn typed_text_is_read_as_a_number_and_comes_back_plain() {
    let mut draft = Draft::from_spec(&blank());
    draft.name = "n".into();
    draft.limits[0].requests = Number::parse(" 1,000 ");
    draft.limits[0].burst = Number::parse("2_000");
    draft.priority = Number::parse("");
    let (spec, problems) = draft.to_spec();
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(
        (spec.limits[0].requests, spec.limits[0].burst, spec.priority),
        (Some(1_000), Some(2_000), 0)
    );
    let back = Draft::from_spec(&spec);
    assert_eq!(back.limits[0].requests.text(), "1000");
    assert_eq!(back.limits[0].burst.text(), "2000");
    assert_eq!(back.priority.text(), "0");
}

#[test]
fn a_grpc_status_the_form_cannot_show_is_kept() {
    let rule = spec(
        r#"{"name":"g","key":"global","limits":[{"requests":1,"period":"second"}],
            "response":{"grpc_status":"permission_denied"}}"#,
    );
    let mut draft = Draft::from_spec(&rule);
    draft.status = Number::parse("503");
    let (saved, _) = draft.to_spec();
    assert_eq!(saved.response.grpc_status, GrpcStatus::PermissionDenied);
    assert_eq!(saved.response.status, 503);
}

#[test]
fn inputs_that_are_not_numbers_are_named_by_field_path() {
    let mut draft = Draft::from_spec(&blank());
    draft.limits[0].requests = Number::parse("ten");
    draft.limits.push(LimitDraft {
        requests: Number::parse("1,000"),
        period: PeriodChoice::Custom,
        seconds: Number::empty(),
        burst: Number::parse("x"),
        scope: Scope::Proxy,
        counts: LimitCounts::Requests,
        soft_percent: Number::empty(),
    });
    draft.overrides.push(OverrideDraft {
        client: "acme".into(),
        limits: vec![LimitDraft {
            period: PeriodChoice::Named(NamedPeriod::Minute),
            ..LimitDraft::default()
        }],
    });
    draft.key = KeyDraft {
        kind: KeyKind::ClientIp,
        name: String::new(),
        hops: Number::parse("two"),
        ..draft.key.clone()
    };
    draft.cost.fixed = Number::parse("");
    draft.priority = Number::parse("high");
    draft.status = Number::empty();
    let (spec, problems) = draft.to_spec();
    let fields: Vec<(&str, &str)> = problems
        .iter()
        .map(|p| (p.field.as_str(), p.message.as_str()))
        .collect();
    assert_eq!(
        fields,
        [
            ("limits[0].requests", "must be a whole number"),
            ("limits[1].period", "is required"),
            ("limits[1].burst", "must be a whole number"),
            ("overrides[0].limits[0].requests", "is required"),
            ("key.client_ip.trusted_hops", "must be a whole number"),
            ("cost.fixed", "is required"),
            ("response.status", "is required"),
            ("priority", "must be a whole number"),
        ]
    );
    assert_eq!(
        spec.limits[1].requests,
        Some(1_000),
        "digit separators are fine"
    );
}

#[test]
fn the_cores_problems_land_on_the_fields_the_form_shows() {
    let mut draft = Draft::from_spec(&blank());
    draft.name = "bad name!".into();
    draft.limits[0].requests = Number::parse("0");
    draft.status = Number::parse("200");
    draft.limits[0].burst = Number::parse("x");
    let (spec, problems) = draft.to_spec();
    let all = validate(spec, problems);
    let field = |f: &str| all.iter().filter(|p| p.field == f).count();
    assert_eq!(field("name"), 1, "{all:?}");
    assert_eq!(field("limits[0].requests"), 1, "{all:?}");
    assert_eq!(field("response.status"), 1, "{all:?}");
    assert_eq!(
        field("limits[0].burst"),
        1,
        "the form's own problem, not repeated by the core: {all:?}"
    );
    assert_eq!(
        all[0].field, "limits[0].burst",
        "the form's problems come first"
    );
    let (valid, none) = Draft::from_spec(&blank()).to_spec();
    let mut valid = valid;
    valid.name = "ok".into();
    assert!(validate(valid, none).is_empty());
}

#[test]
fn out_of_range_numbers_get_the_cores_range_message() {
    let mut draft = Draft::from_spec(&blank());
    draft.name = "n".into();
    draft.status = Number::parse("70000");
    draft.key.kind = KeyKind::ClientIp;
    draft.key.hops = Number::parse("99999999999");
    let (spec, problems) = draft.to_spec();
    assert!(problems.is_empty(), "{problems:?}");
    let all = validate(spec, problems);
    let message = |f: &str| {
        all.iter()
            .find(|p| p.field == f)
            .map(|p| p.message.as_str())
    };
    assert_eq!(all.len(), 2, "{all:?}");
    assert_eq!(
        message("response.status"),
        Some("must be an HTTP error status from 400 to 599")
    );
    assert!(message("key.client_ip.trusted_hops").is_some(), "{all:?}");
}

#[test]
fn texts_are_trimmed_and_empty_ones_absent() {
    let mut draft = Draft::from_spec(&blank());
    draft.id = "  ".into();
    draft.name = " api ".into();
    draft.description = " why ".into();
    let (spec, _) = draft.to_spec();
    assert_eq!(spec.id, None);
    assert_eq!(spec.name, "api");
    assert_eq!(spec.description, "why");
    draft.id = " stable ".into();
    assert_eq!(draft.to_spec().0.id.as_deref(), Some("stable"));
}

#[test]
fn an_override_for_a_client_starts_from_the_rules_limits_once() {
    let rule = spec(
        r#"{"name":"api","key":{"header":"x-api-key"},
            "limits":[{"requests":5,"period":"second","burst":10},{"requests":90,"period":60}],
            "overrides":[{"client":"beta","limits":[{"requests":1,"period":"second"}]}]}"#,
    );
    let mut draft = Draft::from_spec(&rule);
    assert!(draft.add_override_for("acme"));
    assert!(!draft.add_override_for("beta"), "beta already has one");
    assert!(!draft.add_override_for("acme"));
    let (saved, problems) = draft.to_spec();
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(saved.overrides.len(), 2);
    assert_eq!(saved.overrides[1].client, "acme");
    assert_eq!(saved.overrides[1].limits, rule.limits);
    assert_eq!(
        saved.overrides[0], rule.overrides[0],
        "the existing override is untouched"
    );
}

#[test]
fn the_methods_input_follows_the_first_refused_method() {
    let mut draft = Draft::from_spec(&blank());
    draft.name = "m".into();
    draft.matcher.methods = "get, p0st, 7".into();
    assert_eq!(methods_field(&draft.matcher.methods), "match.methods[1]");
    let (spec, problems) = draft.to_spec();
    let all = validate(spec, problems);
    let fields: Vec<&str> = all.iter().map(|p| p.field.as_str()).collect();
    assert_eq!(fields, ["match.methods[1]", "match.methods[2]"]);
}

/// The fields the core names for a draft of the blank rule changed by `edit`.
/// The fields the form and the core name after `edit` on a valid blank rule.
pub(super) fn fields_after(edit: impl FnOnce(&mut Draft)) -> Vec<String> {
    let mut draft = Draft::from_spec(&blank());
    draft.name = "ok".into();
    edit(&mut draft);
    let (spec, problems) = draft.to_spec();
    validate(spec, problems)
        .into_iter()
        .map(|p| p.field)
        .collect()
}

#[test]
fn each_input_gets_the_cores_problems_about_it() {
    assert!(fields_after(|_| {}).is_empty());
    assert_eq!(fields_after(|d| d.name = String::new()), ["name"]);
    assert_eq!(fields_after(|d| d.id = "no spaces".into()), ["id"]);
    assert_eq!(
        fields_after(|d| d.matcher.host = "a/b".into()),
        ["match.host"]
    );
    assert_eq!(
        fields_after(|d| d.matcher.path_prefix = "api".into()),
        ["match.path_prefix"]
    );
    assert_eq!(
        fields_after(|d| d.matcher.path_exact = "api".into()),
        ["match.path_exact"]
    );
    assert_eq!(
        fields_after(|d| d.matcher.path_regex = "(".into()),
        ["match.path_regex"]
    );
    assert_eq!(
        fields_after(|d| d.matcher.headers.push(HeaderDraft::default())),
        ["match.headers[0].name"]
    );
    assert_eq!(
        fields_after(|d| d.key.name = "no spaces".into()),
        ["key.header"]
    );
    assert_eq!(
        fields_after(|d| {
            d.key.kind = KeyKind::Query;
            d.key.name = String::new();
        }),
        ["key.query"]
    );
    assert_eq!(
        fields_after(|d| {
            d.key.kind = KeyKind::ClientIp;
            d.key.hops = Number::parse("17");
        }),
        ["key.client_ip.trusted_hops"]
    );
    assert_eq!(
        fields_after(|d| {
            d.limits[0].period = PeriodChoice::Custom;
            d.limits[0].seconds = Number::parse("0");
        }),
        ["limits[0].period"]
    );
    assert_eq!(
        fields_after(|d| d.limits[0].burst = Number::parse("0")),
        ["limits[0].burst"]
    );
    assert_eq!(fields_after(|d| d.limits.clear()), ["limits"]);
    assert_eq!(
        fields_after(|d| d.cost.fixed = Number::parse("0")),
        ["cost.fixed"]
    );
    assert_eq!(
        fields_after(|d| {
            d.cost.kind = CostKind::Header;
            d.cost.header = "bad name".into();
        }),
        ["cost.header.name"]
    );
    assert_eq!(
        fields_after(|d| {
            d.overrides.push(OverrideDraft {
                client: String::new(),
                limits: vec![LimitDraft {
                    requests: Number::parse("0"),
                    ..LimitDraft::default()
                }],
            });
        }),
        ["overrides[0].client", "overrides[0].limits[0].requests"]
    );
    assert_eq!(
        fields_after(|d| {
            assert!(d.add_override_for("acme"));
            d.overrides.push(d.overrides[0].clone());
        }),
        ["overrides[1].client"]
    );
}

#[test]
fn a_descriptor_the_form_cannot_show_is_kept() {
    let loaded = spec(
        r#"{"name":"rls","key":"global","limits":[{"requests":5,"period":"second"}],
            "descriptor":{"domain":"edge","entries":[{"key":"remote_address"}]}}"#,
    );
    let (saved, problems) = Draft::from_spec(&loaded).to_spec();
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(saved.descriptor, loaded.descriptor);
}

/// A rule with token limits (the rule's and an override's) and a budget saves unchanged.
#[test]
fn a_token_budget_survives_the_form_unchanged() {
    let original = spec(
        r#"{"name":"llm","key":{"header":"x-api-key"},
            "limits":[{"requests":60,"period":"minute"},{"tokens":100000,"period":"minute","count":"output"},{"tokens":5000,"period":"second"}],
            "overrides":[{"client":"acme","limits":[{"tokens":9,"period":"day"}]}],
            "tokens":{"usage":"anthropic","default_estimate":1000,"estimate_input_from_body":true}}"#,
    );
    let (back, problems) = Draft::from_spec(&original).to_spec();
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(back, original);
}

#[test]
fn the_token_budget_is_written_while_a_limit_counts_tokens() {
    let mut draft = Draft::from_spec(&spec(
        r#"{"name":"llm","key":"global","limits":[{"tokens":10,"period":"second"}],
            "tokens":{"usage":"anthropic","default_estimate":5}}"#,
    ));
    assert!(draft.counts_tokens());
    draft.limits[0].counts = LimitCounts::Requests;
    assert!(!draft.counts_tokens());
    let (saved, problems) = draft.to_spec();
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(saved.tokens, None, "a request limit has no budget");
    assert!(validate(saved, problems).is_empty());
    draft.overrides.push(OverrideDraft {
        client: "acme".into(),
        limits: vec![LimitDraft {
            counts: LimitCounts::Tokens(sluice_core::spec::UsageMeasure::Output),
            ..draft.limits[0].clone()
        }],
    });
    assert!(
        draft.counts_tokens(),
        "an override's token limit needs it too"
    );
    let (saved, _) = draft.to_spec();
    assert_eq!(saved.tokens.map(|t| t.default_estimate), Some(5));
}

#[test]
fn the_new_inputs_get_the_cores_problems_about_them() {
    let token_limit = |d: &mut Draft| {
        d.limits[0].counts = LimitCounts::Tokens(sluice_core::spec::UsageMeasure::Total);
    };
    assert_eq!(fields_after(token_limit), ["tokens"], "no usage picked");
    assert_eq!(
        fields_after(|d| {
            token_limit(d);
            d.tokens.usage = Some(UsageKind::OpenAi);
        }),
        ["tokens.default_estimate"]
    );
    let budget = |d: &mut Draft| {
        token_limit(d);
        d.tokens.usage = Some(UsageKind::Anthropic);
        d.tokens.default_estimate = Number::from(100);
    };
    assert!(fields_after(budget).is_empty());
    assert_eq!(
        fields_after(|d| {
            budget(d);
            d.tokens.include_usage = true;
        }),
        ["tokens.include_usage"]
    );
    assert_eq!(
        fields_after(|d| {
            budget(d);
            d.tokens.default_estimate = Number::parse("99999999999");
        }),
        ["tokens.default_estimate"]
    );
    assert_eq!(
        fields_after(|d| {
            budget(d);
            d.tokens.usage = Some(UsageKind::JsonPointer);
            d.tokens.total_pointer = "total".into();
        }),
        ["tokens.usage.json_pointer.total", "tokens"]
    );
    assert_eq!(
        fields_after(|d| {
            d.limits[0].counts = LimitCounts::InFlight;
            d.limits[0].scope = Scope::Global;
        }),
        ["limits[0].scope"]
    );
    assert_eq!(
        fields_after(|d| {
            d.limits[0].counts = LimitCounts::InFlight;
            d.limits[0].requests = Number::parse("1001");
        }),
        ["limits[0].concurrent"]
    );
    assert_eq!(
        fields_after(|d| {
            d.key.kind = KeyKind::Metadata;
            d.key.metadata_path = "claims,,sub".into();
        }),
        ["key.metadata.filter", "key.metadata.path[1]"]
    );
    assert_eq!(
        fields_after(|d| {
            d.key.kind = KeyKind::Cookie;
            d.key.name = "a b".into();
        }),
        ["key.cookie"]
    );
    assert_eq!(
        fields_after(|d| {
            d.key_missing.choice = KeyMissing::Fallback;
        }),
        ["key_missing.fallback"]
    );
    assert_eq!(
        fields_after(|d| d.enforce_percent = Number::parse("101")),
        ["enforce_percent"]
    );
    assert_eq!(
        fields_after(|d| d.enforce_percent = Number::parse("half")),
        ["enforce_percent"]
    );
    assert!(fields_after(|d| d.enforce_percent = Number::parse("100")).is_empty());
    assert!(fields_after(|d| d.enforce_percent = Number::parse("0")).is_empty());
    let (spec, _) = {
        let mut d = Draft::from_spec(&blank());
        d.enforce_percent = Number::parse("");
        d.to_spec()
    };
    assert_eq!(spec.enforce_percent, 100, "empty: every client");
}

/// A delay rule loads into the form and saves unchanged; switched back to refuse, it saves
/// without its `delay` section (which the core would refuse beside `on_limit: refuse`).
#[test]
fn a_delay_rule_keeps_its_queue_through_the_form_and_refusing_drops_it() {
    let original = spec(
        r#"{"name":"smooth","key":{"header":"x-api-key"},
            "limits":[{"requests":20,"period":"second","burst":5}],
            "overrides":[{"client":"acme","limits":[{"requests":100,"period":"second"}]}],
            "on_limit":"delay","delay":{"max_delay_ms":1500,"queue_per_key":8,"queue_per_worker":512}}"#,
    );
    let mut draft = Draft::from_spec(&original);
    assert!(draft.delay.delays());
    assert_eq!(draft.delay.max_delay_ms.text(), "1500");
    let (back, problems) = draft.to_spec();
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(back, original, "nothing lost on a save");
    assert!(validate(back, problems).is_empty());

    draft.delay.on_limit = sluice_core::spec::OnLimit::Refuse;
    let (refusing, problems) = draft.to_spec();
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(refusing.on_limit, sluice_core::spec::OnLimit::Refuse);
    assert_eq!(refusing.delay, None);
    assert_eq!(
        refusing,
        RuleSpec {
            on_limit: Default::default(),
            delay: None,
            ..original.clone()
        },
        "only on_limit and delay changed"
    );
    assert!(validate(refusing, problems).is_empty());
}

#[test]
fn the_delay_inputs_get_the_cores_problems_about_them() {
    let delaying = |d: &mut Draft| {
        d.delay.on_limit = sluice_core::spec::OnLimit::Delay;
        d.delay.max_delay_ms = Number::from(500);
    };
    assert!(fields_after(delaying).is_empty());
    assert_eq!(
        fields_after(|d| d.delay.on_limit = sluice_core::spec::OnLimit::Delay),
        ["delay.max_delay_ms"],
        "the maximum is required"
    );
    assert_eq!(
        fields_after(|d| {
            delaying(d);
            d.delay.max_delay_ms = Number::parse("60001");
        }),
        ["delay.max_delay_ms"]
    );
    assert!(
        fields_after(|d| {
            delaying(d);
            d.delay.max_delay_ms = Number::parse("60000");
        })
        .is_empty()
    );
    assert_eq!(
        fields_after(|d| {
            delaying(d);
            d.delay.queue_per_worker = Number::parse("10001");
        }),
        ["delay.queue_per_worker"]
    );
    assert_eq!(
        fields_after(|d| {
            delaying(d);
            d.delay.queue_per_worker = Number::parse("8");
            d.delay.queue_per_key = Number::parse("9");
        }),
        ["delay.queue_per_key"],
        "a client's queue is at most the worker's"
    );
    assert!(
        fields_after(|d| {
            delaying(d);
            d.delay.queue_per_worker = Number::parse("8");
            d.delay.queue_per_key = Number::parse("8");
        })
        .is_empty()
    );
    assert_eq!(
        fields_after(|d| {
            delaying(d);
            d.delay.queue_per_key = Number::parse("0");
        }),
        ["delay.queue_per_key"]
    );
    assert_eq!(
        fields_after(|d| {
            delaying(d);
            d.limits[0].scope = Scope::Global;
        }),
        ["on_limit"],
        "a fleet-wide limit cannot delay"
    );
    assert_eq!(
        fields_after(|d| {
            delaying(d);
            d.limits[0].soft_percent = Number::from(50);
        }),
        ["on_limit"],
        "over a soft limit a request is warned, not delayed"
    );
}
