//! Rules from an envoyproxy/ratelimit configuration: `sluice rules import --from
//! envoy-ratelimit`.
//!
//! That service's configuration is a tree of descriptors, `(key, value?)` pairs with a
//! `rate_limit` where a limit applies, but the tree alone does not say which requests
//! produce which descriptor: Envoy's `rate_limits` actions do (a `request_headers` action
//! turns a header into a value, `remote_address` the client's address, `generic_key` and
//! `header_value_match` a fixed value when the route or a header condition matches). So
//! each descriptor key is *bound* to an action before it can become a Sluice rule:
//!
//! * from the Envoy configuration itself, when the user passes it: every `rate_limits`
//!   entry of every route and virtual host, with the route's match;
//! * otherwise from conventions and flags: `remote_address` is the client's address,
//!   `generic_key` a constant, and `--header KEY=NAME` binds a key to a request header.
//!
//! Each limit in the tree (a descriptor with a `rate_limit`, at any depth) then becomes one
//! rule per `rate_limits` entry producing its descriptor: the route's match plus the fixed
//! conditions become the rule's match, the value-taking actions its client key, and the
//! limit a token bucket of `requests_per_unit` per unit with a burst of the same size
//! (ratelimit's fixed window admits that many at the start of a window).
//!
//! ratelimit picks the most specific descriptor at a level: `(api_key, acme)` replaces
//! `(api_key)` for that client. Sluice says the same with a per-client override, so value
//! siblings of a value-less limit become overrides of its rule.
//!
//! What has no Sluice equivalent is not guessed at: [`Import::skipped`] says what was left
//! out and why, and the user decides.
//!
//! For Sluice's own rate limit service ([`import_for_rls`], `--for rls`) none of that is
//! needed: each limit becomes a rule whose `descriptor` is its path in the tree.
//!
//! The parts, each using only those before it: `report` (what an import returns),
//! `config` (the ratelimit configuration and the limits in its tree), `bindings` (which
//! requests produce a descriptor: the Envoy configuration's `rate_limits`, or conventions
//! and flags), `convert` (limits on their bindings to rules), `rls` (limits to rules of
//! the rate limit service).

mod bindings;
mod config;
mod convert;
mod report;
mod rls;

pub use bindings::Bindings;
pub use report::{Import, ImportError, Skipped};

use bindings::envoy_sites;
use config::{limits, parse};
use convert::convert;
use rls::convert_for_rls;

/// Converts an envoy-ratelimit configuration (YAML, as that service reads it). With
/// `envoy` (an Envoy configuration in YAML or JSON: a bootstrap, a listener or a route
/// configuration), descriptor keys are bound by its `rate_limits` actions; without it, by
/// `bindings`.
pub fn import(
    config: &str,
    envoy: Option<&str>,
    bindings: &Bindings,
) -> Result<Import, ImportError> {
    let config = parse(config)?;
    let mut out = Import::default();
    let sites = match envoy {
        Some(text) => Some(envoy_sites(text, &mut out)?),
        None => None,
    };
    let found = limits(&config, &mut out.skipped);
    convert(&config.domain, found, sites.as_deref(), bindings, &mut out);
    Ok(out)
}

/// Converts an envoy-ratelimit configuration into rules for Sluice's rate limit service
/// (`sluice serve --rls-listen`): each limit a rule whose `descriptor` is its path in the
/// tree, so Envoy's existing `rate_limits` actions keep working unchanged.
pub fn import_for_rls(config: &str) -> Result<Import, ImportError> {
    let config = parse(config)?;
    let mut out = Import::default();
    let found = limits(&config, &mut out.skipped);
    convert_for_rls(&config.domain, found, &mut out);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use sluice_core::rule::MAX_REQUESTS;
    use sluice_core::ruleset::Ruleset;
    use sluice_core::spec::RuleSpec;

    use super::*;

    fn imported(config: &str, envoy: Option<&str>, bindings: &Bindings) -> Import {
        let import = import(config, envoy, bindings).unwrap();
        // Whatever is converted must be rules Sluice accepts.
        Ruleset::from_specs(import.rules.clone()).unwrap();
        import
    }

    /// Why the first part of `config` was skipped, when nothing could be converted.
    fn only_skip(config: &str, bindings: &Bindings) -> String {
        let import = import(config, None, bindings).unwrap();
        assert!(import.rules.is_empty(), "{:?}", import.rules);
        import.skipped[0].why.clone()
    }

    fn json(rule: &RuleSpec) -> serde_json::Value {
        serde_json::to_value(rule).unwrap()
    }

    fn headers(pairs: &[(&str, &str)]) -> Bindings {
        Bindings {
            headers: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            trusted_hops: 0,
        }
    }

    #[test]
    fn per_address_limits_with_a_more_specific_address_become_an_override_or_a_skip() {
        let import = imported(
            "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 10}\n  - key: remote_address\n    value: 50.0.0.5\n    rate_limit: {unit: minute, requests_per_unit: 3}\n  - key: remote_address\n    value: 50.0.0.6\n    rate_limit: {unit: second, requests_per_unit: 0}\n",
            None,
            &Bindings::default(),
        );
        assert_eq!(import.rules.len(), 1);
        let rule = json(&import.rules[0]);
        assert_eq!(rule["name"], "edge-remote_address");
        assert_eq!(
            rule["key"],
            serde_json::json!({"client_ip": {"trusted_hops": 0}})
        );
        assert_eq!(
            rule["limits"],
            serde_json::json!([{"requests": 10, "period": "second"}])
        );
        assert_eq!(
            rule["overrides"],
            serde_json::json!([{"client": "50.0.0.5", "limits": [{"requests": 3, "period": "minute"}]}])
        );
        assert_eq!(
            import.skipped,
            vec![Skipped {
                what: "descriptor (remote_address, 50.0.0.6)".into(),
                why: "a limit of 0 denies every request, which a filter rule cannot; import with `--for rls`"
                    .into()
            }]
        );
    }

    #[test]
    fn nested_descriptors_become_matches_and_composite_keys() {
        let config = "domain: messaging\ndescriptors:\n  - key: message_type\n    value: marketing\n    descriptors:\n      - key: to_number\n        rate_limit: {unit: day, requests_per_unit: 5}\n  - key: to_number\n    rate_limit: {unit: day, requests_per_unit: 100}\n  - key: tenant\n    descriptors:\n      - key: to_number\n        shadow_mode: true\n        rate_limit: {unit: hour, requests_per_unit: 50}\n";
        let import = imported(
            config,
            None,
            &headers(&[
                ("message_type", "x-message-type"),
                ("to_number", "x-to"),
                ("tenant", "x-tenant"),
            ]),
        );
        let rules: Vec<_> = import.rules.iter().map(json).collect();
        assert_eq!(rules.len(), 3, "{rules:#?}");
        assert_eq!(
            rules[0]["match"],
            serde_json::json!({"headers": [{"name": "x-message-type", "equals": "marketing"}]})
        );
        assert_eq!(rules[0]["key"], serde_json::json!({"header": "x-to"}));
        assert_eq!(rules[1]["key"], serde_json::json!({"header": "x-to"}));
        assert_eq!(rules[1]["match"], serde_json::json!({}));
        assert_eq!(
            rules[2]["key"],
            serde_json::json!({"composite": [{"header": "x-tenant"}, {"header": "x-to"}]})
        );
        assert_eq!(rules[2]["mode"], "shadow");
        assert!(import.skipped.is_empty(), "{:?}", import.skipped);
    }

    #[test]
    fn keys_nothing_binds_are_skipped_with_the_flag_that_would_bind_them() {
        let why = only_skip(
            "domain: d\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
            &Bindings::default(),
        );
        assert!(why.contains("--header api_key=HEADER-NAME"), "{why}");
    }

    #[test]
    fn unlimited_values_and_unconvertible_units_say_why() {
        let import = imported(
            "domain: internal\ndescriptors:\n  - key: ldap\n    rate_limit: {unlimited: true}\n  - key: azure\n    rate_limit: {unit: minute, requests_per_unit: 100}\n  - key: azure\n    value: batch\n    rate_limit: {unlimited: true}\n  - key: monthly\n    rate_limit: {unit: month, requests_per_unit: 100}\n  - key: pre\n    value: abc*\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
            None,
            &headers(&[
                ("ldap", "x-ldap"),
                ("azure", "x-azure"),
                ("monthly", "x-m"),
                ("pre", "x-p"),
            ]),
        );
        assert_eq!(import.rules.len(), 1);
        let rule = json(&import.rules[0]);
        assert_eq!(rule["overrides"][0]["client"], "batch");
        assert_eq!(rule["overrides"][0]["limits"][0]["requests"], MAX_REQUESTS);
        let why: Vec<&str> = import.skipped.iter().map(|s| s.why.as_str()).collect();
        assert!(why.iter().any(|w| w.contains("wildcard")), "{why:?}");
        assert!(
            why.iter().any(|w| w.contains("no rule is needed")),
            "{why:?}"
        );
        assert!(why.iter().any(|w| w.contains("no fixed length")), "{why:?}");
    }

    #[test]
    fn for_the_rate_limit_service_every_limit_is_a_descriptor_rule_and_the_most_specific_wins() {
        let config = "domain: messaging\ndescriptors:\n  - key: message_type\n    value: marketing\n    descriptors:\n      - key: to_number\n        rate_limit: {unit: day, requests_per_unit: 5}\n  - key: to_number\n    rate_limit: {unit: day, requests_per_unit: 100}\n  - key: to_number\n    value: \"+15550000\"\n    shadow_mode: true\n    rate_limit: {unit: day, requests_per_unit: 1}\n  - key: tenant\n    descriptors:\n      - key: user\n        rate_limit: {unit: hour, requests_per_unit: 50}\n      - key: user\n        value: root\n        rate_limit: {unlimited: true}\n";
        let import = import_for_rls(config).unwrap();
        assert!(import.skipped.is_empty(), "{:?}", import.skipped);
        let ruleset = Ruleset::from_specs(import.rules.clone()).unwrap();
        let rls = sluice_core::rls::RlsRules::from_rules(ruleset.rules());
        assert_eq!(rls.len(), 5);
        let request = |descriptors: &[&[(&str, &str)]]| sluice_core::rls::RlsRequest {
            domain: "messaging".into(),
            descriptors: descriptors
                .iter()
                .map(|entries| sluice_core::rls::RlsDescriptor {
                    entries: entries
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                    hits_addend: None,
                })
                .collect(),
            hits_addend: 1,
        };
        let plan = rls.plan(&request(&[
            &[("message_type", "marketing"), ("to_number", "+1555")],
            &[("to_number", "+1555")],
            &[("to_number", "+15550000")],
            &[("tenant", "t"), ("user", "root")],
            &[("tenant", "t"), ("user", "u")],
        ]));
        let decided: Vec<(Option<u64>, bool)> = plan
            .descriptors
            .iter()
            .map(|d| {
                let m = d.rule.as_ref().unwrap();
                (m.charges.first().map(|c| c.limit.requests), m.shadow)
            })
            .collect();
        assert_eq!(
            decided,
            [
                (Some(5), false),
                (Some(100), false),
                (Some(1), true),
                (None, false),
                (Some(50), false)
            ]
        );
        assert_eq!(
            plan.descriptors[3].rule.as_ref().unwrap().answer,
            sluice_core::rls::Answer::Unlimited
        );
        let rule = json(&import.rules[0]);
        assert_eq!(rule["key"], "global");
        assert_eq!(
            rule["descriptor"],
            serde_json::json!({"domain": "messaging", "entries": [{"key": "message_type", "value": "marketing"}, {"key": "to_number"}]})
        );
        assert!(import.notes.is_empty(), "{:?}", import.notes);
    }

    #[test]
    fn for_the_rate_limit_service_wildcards_zero_limits_replaces_and_quota_mode_are_kept() {
        // ratelimit's README examples 3, 7 and 9, with `quota_mode`.
        let config = "domain: d\ndescriptors:\n  - key: remote_address\n    value: 50.0.0.5\n    rate_limit: {unit: second, requests_per_unit: 0}\n  - key: path\n    value: /api/*\n    quota_mode: true\n    rate_limit: {unit: minute, requests_per_unit: 20}\n  - key: key_1\n    value: value_1\n    descriptors:\n      - key: user\n        value: bkthomps\n        rate_limit: {name: specific_limit, unit: second, requests_per_unit: 5}\n  - key: key_2\n    value: value_2\n    descriptors:\n      - key: user\n        value: bkthomps\n        rate_limit: {replaces: [{name: specific_limit}, {name: nobody}], unit: second, requests_per_unit: 10}\n";
        let import = import_for_rls(config).unwrap();
        let rules: Vec<_> = import.rules.iter().map(json).collect();
        assert_eq!(rules.len(), 4, "{rules:#?}");
        assert_eq!(rules[0]["descriptor"]["answer"], "deny");
        assert_eq!(rules[0]["limits"], serde_json::json!([]));
        assert_eq!(
            rules[1]["descriptor"]["entries"],
            serde_json::json!([{"key": "path", "value_prefix": "/api/"}])
        );
        assert_eq!(rules[1]["mode"], "shadow");
        assert_eq!(rules[2]["name"], "specific_limit");
        assert_eq!(
            rules[3]["descriptor"]["replaces"],
            serde_json::json!(["specific_limit"])
        );
        let skipped: Vec<String> = import
            .skipped
            .iter()
            .map(|s| format!("{}: {}", s.what, s.why))
            .collect();
        assert_eq!(skipped.len(), 1, "{skipped:#?}");
        assert!(skipped[0].contains("replaces: nobody"), "{skipped:#?}");
        Ruleset::from_specs(import.rules).unwrap();
    }

    const ENVOY: &str = r#"
static_resources:
  listeners:
  - name: main
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          route_config:
            virtual_hosts:
            - name: api
              domains: ["api.example.com", "api.example.com:443"]
              rate_limits:
              - actions:
                - remote_address: {}
              routes:
              - match: {prefix: /slow}
                route:
                  cluster: backend
                  rate_limits:
                  - actions:
                    - generic_key: {descriptor_value: slowpath}
                    - request_headers: {header_name: X-Api-Key, descriptor_key: api_key}
              - match:
                  prefix: /
                  headers:
                  - name: ":method"
                    string_match: {exact: POST}
                route:
                  cluster: backend
                  rate_limits:
                  - actions:
                    - header_value_match:
                        descriptor_value: beta
                        headers:
                        - name: x-beta
                          present_match: true
                  - actions:
                    - destination_cluster: {}
"#;

    #[test]
    fn the_envoy_configuration_binds_keys_and_gives_routes_and_conditions() {
        let config = "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 20}\n  - key: generic_key\n    value: slowpath\n    descriptors:\n      - key: api_key\n        rate_limit: {unit: minute, requests_per_unit: 60}\n      - key: api_key\n        value: acme\n        rate_limit: {unit: minute, requests_per_unit: 600}\n  - key: header_match\n    value: beta\n    rate_limit: {unit: second, requests_per_unit: 5}\n  - key: header_match\n    value: gamma\n    rate_limit: {unit: second, requests_per_unit: 5}\n";
        let import = imported(config, Some(ENVOY), &Bindings::default());
        let rules: Vec<_> = import.rules.iter().map(json).collect();
        assert_eq!(rules.len(), 3, "{rules:#?}");
        assert_eq!(
            rules[0]["match"],
            serde_json::json!({"host": "api.example.com"})
        );
        assert_eq!(
            rules[0]["key"],
            serde_json::json!({"client_ip": {"trusted_hops": 0}})
        );
        assert_eq!(
            rules[1]["match"],
            serde_json::json!({"host": "api.example.com", "path_prefix": "/slow"})
        );
        assert_eq!(rules[1]["key"], serde_json::json!({"header": "x-api-key"}));
        assert_eq!(rules[1]["overrides"][0]["client"], "acme");
        assert_eq!(
            rules[2]["match"],
            serde_json::json!({"host": "api.example.com", "methods": ["POST"],
                               "headers": [{"name": "x-beta", "present": true}]})
        );
        assert_eq!(rules[2]["key"], "global");
        let skipped: Vec<String> = import
            .skipped
            .iter()
            .map(|s| format!("{}: {}", s.what, s.why))
            .collect();
        assert_eq!(skipped.len(), 2, "{skipped:#?}");
        assert!(
            skipped[0].contains("`destination_cluster` action"),
            "{skipped:#?}"
        );
        assert!(
            skipped[1].starts_with("descriptor (header_match, gamma): no `rate_limits` entry"),
            "{skipped:#?}"
        );
    }

    #[test]
    fn fixed_value_siblings_follow_their_routes_not_overrides() {
        let envoy = "virtual_hosts:\n- name: v\n  domains: [\"*\"]\n  routes:\n  - match: {prefix: /a}\n    route: {rate_limits: [{actions: [{generic_key: {descriptor_value: a}}]}]}\n  - match: {prefix: /b}\n    route: {rate_limits: [{actions: [{generic_key: {descriptor_value: b}}]}]}\n";
        let config = "domain: d\ndescriptors:\n  - key: generic_key\n    rate_limit: {unit: second, requests_per_unit: 10}\n  - key: generic_key\n    value: b\n    rate_limit: {unit: second, requests_per_unit: 99}\n";
        let rules: Vec<_> = imported(config, Some(envoy), &Bindings::default())
            .rules
            .iter()
            .map(json)
            .collect();
        assert_eq!(rules.len(), 2, "{rules:#?}");
        assert_eq!(rules[0]["match"], serde_json::json!({"path_prefix": "/a"}));
        assert_eq!(rules[0]["limits"][0]["requests"], 10);
        assert_eq!(rules[1]["match"], serde_json::json!({"path_prefix": "/b"}));
        assert_eq!(rules[1]["limits"][0]["requests"], 99);
        assert!(
            rules
                .iter()
                .all(|r| r["key"] == "global" && r.get("overrides").is_none())
        );

        // Without the routes, both limits apply to every request, each as its own rule.
        let import = imported(config, None, &Bindings::default());
        assert_eq!(import.rules.len(), 2);
        assert!(
            import
                .notes
                .iter()
                .all(|n| n.contains("applies to every request")),
            "{:?}",
            import.notes
        );
    }

    #[test]
    fn rules_sluice_would_refuse_are_skipped_with_the_validators_words() {
        let why = only_skip(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
            &headers(&[("k", "not a header")]),
        );
        assert!(
            why.starts_with("the rule would be invalid: key.header:"),
            "{why}"
        );
    }

    #[test]
    fn unreadable_input_is_an_error_naming_the_file_kind() {
        let err = import("domain: [", None, &Bindings::default()).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("not a valid envoy-ratelimit configuration")
        );
        let err = import("domain: d", Some("{"), &Bindings::default()).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("not a valid Envoy configuration")
        );
    }
}
