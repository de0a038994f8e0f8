//! Schemas written by hand, for what no derive can describe: the core's rule model
//! (`sluice-core` keeps its spec free of OpenAPI), rules files, the ruleset document
//! proxies poll for, parameters read as strings but documented as enums, and the
//! metrics stream's events. Only with the `openapi` feature.
//!
//! `the_rule_schema_covers_every_field` pins the rule's schema to the serde model, so a
//! field added in the core cannot go missing here.

use std::borrow::Cow;

use serde_json::json;
use sluice_core::identity::{MAX_METADATA_NAME, MAX_METADATA_PATH};
use sluice_core::rls;
use sluice_core::rule::{
    MAX_CONCURRENT, MAX_COST, MAX_DELAY_MS, MAX_LIMITS_PER_RULE, MAX_OVERRIDES,
    MAX_QUEUE_PER_WORKER, MAX_SOFT_PERCENT, NO_GLOBAL_IN_FLIGHT,
};
use sluice_core::spec::RuleSpec;
use utoipa::openapi::{ObjectBuilder, RefOr, Schema};

use crate::metrics::StreamEvent;

/// The schema of `sluice_core::spec::Mode`, which has no OpenAPI derive of its own.
#[derive(Debug, utoipa::ToSchema)]
#[schema(rename_all = "snake_case")]
#[allow(dead_code)] // Only its schema is used.
pub enum ModeName {
    Enforce,
    Shadow,
}

/// `sluice_core::wire::RulesetDocument`, for the OpenAPI document.
#[derive(Debug, utoipa::ToSchema)]
// Never built: it only describes the bytes of the core's type, which is what is served.
#[allow(dead_code)]
#[schema(as = RulesetDocument)]
pub struct RulesetDocumentSchema {
    /// Increases with every change; poll again with `after` set to it.
    pub version: u64,
    /// Every rule, enabled or not, in evaluation order.
    #[schema(value_type = Vec<RuleSpecSchema>)]
    pub rules: Vec<RuleSpec>,
}

/// One server-sent event of the metrics stream as a client parses it (OpenAPI 3.1
/// describes an event stream by its events): `event: metrics`, and `data` holding a
/// [`StreamEvent`] as JSON.
#[derive(Debug)]
pub struct StreamFrame;

impl utoipa::ToSchema for StreamFrame {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("StreamFrame")
    }

    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        schemas.push((
            <StreamEvent as utoipa::ToSchema>::name().into_owned(),
            <StreamEvent as utoipa::PartialSchema>::schema(),
        ));
        <StreamEvent as utoipa::ToSchema>::schemas(schemas);
    }
}

impl utoipa::PartialSchema for StreamFrame {
    fn schema() -> RefOr<Schema> {
        let frame = json!({
            "type": "object",
            "required": ["event", "data"],
            "properties": {
                "event": {"type": "string", "enum": ["metrics"]},
                "data": {"type": "string", "contentMediaType": "application/json",
                         "contentSchema": {"$ref": "#/components/schemas/StreamEvent"}},
            },
        });
        serde_json::from_value(frame)
            .unwrap_or_else(|_| RefOr::T(Schema::Object(ObjectBuilder::new().build())))
    }
}

/// The schema of `sluice_core::spec::RuleSpec`.
#[derive(Debug)]
pub struct RuleSpecSchema;

impl utoipa::ToSchema for RuleSpecSchema {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("RuleSpec")
    }
}

impl utoipa::PartialSchema for RuleSpecSchema {
    fn schema() -> RefOr<Schema> {
        serde_json::from_value(rule_spec_schema())
            .unwrap_or_else(|_| RefOr::T(Schema::Object(ObjectBuilder::new().build())))
    }
}

/// The schema of a rules file, as `rules:apply` reads it (see
/// `crate::rules_file::parse_rules`): a list of rules, or `{rules: [...]}`.
#[derive(Debug)]
pub struct RulesFileSchema;

impl utoipa::ToSchema for RulesFileSchema {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("RulesFile")
    }

    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        schemas.push((
            RuleSpecSchema::name().into_owned(),
            <RuleSpecSchema as utoipa::PartialSchema>::schema(),
        ));
    }
}

impl utoipa::PartialSchema for RulesFileSchema {
    fn schema() -> RefOr<Schema> {
        serde_json::from_value(rules_file_schema())
            .unwrap_or_else(|_| RefOr::T(Schema::Object(ObjectBuilder::new().build())))
    }
}

fn rules_file_schema() -> serde_json::Value {
    let rules = json!({"type": "array", "maxItems": sluice_core::ruleset::MAX_RULES,
                       "items": {"$ref": "#/components/schemas/RuleSpec"}});
    json!({
        "oneOf": [
            rules,
            {"type": "null", "description": "An empty YAML file: no rules"},
            {"type": "object", "additionalProperties": false, "required": ["rules"],
             "properties": {"rules": rules}},
        ],
    })
}

/// The `tokens` section of a rule with token limits (`sluice_core::spec::TokensSpec`).
fn tokens_section() -> serde_json::Value {
    // RFC 6901, as `sluice_core::usage::JsonPointer` checks it.
    let pointer = json!({"type": ["string", "null"], "pattern": "^(/([^~]|~[01])*)*$"});
    json!({
        "type": ["object", "null"],
        "additionalProperties": false,
        "required": ["usage", "default_estimate"],
        "description": "Where a rule with token limits reads usage, and what a request reserves",
        "properties": {
            "usage": {
                "description": "`openai` (Chat Completions; the Responses API for a path ending in `/responses`), `anthropic` (Messages), or RFC 6901 pointers",
                "oneOf": [
                    {"type": "string", "enum": ["openai", "anthropic"]},
                    {"type": "object", "additionalProperties": false, "required": ["json_pointer"],
                     "properties": {"json_pointer": {
                        "type": "object", "additionalProperties": false, "minProperties": 1,
                        "properties": {"input": pointer, "output": pointer, "total": pointer}}}},
                ],
            },
            "default_estimate": {"type": "integer", "minimum": 0, "maximum": sluice_core::rule::MAX_ESTIMATE,
                                 "description": "Output tokens reserved when the request body names no `max_tokens`, `max_completion_tokens` or `max_output_tokens`"},
            "estimate_input_from_body": {"type": "boolean", "default": false,
                                         "description": "Also reserve input tokens: the request body's bytes / 4"},
            "include_usage": {"type": "boolean", "default": false,
                              "description": "Add `stream_options: {include_usage: true}` to streamed OpenAI chat requests"},
        },
    })
}

/// JSON Schema (OpenAPI 3.1) of a rule, following serde's encoding of the core's types.
/// An optional field may also be `null`, which serde reads as absent.
fn rule_spec_schema() -> serde_json::Value {
    let nullable = |mut schema: serde_json::Value| {
        schema["type"] = json!([schema["type"].clone(), "null"]);
        schema
    };
    let identifier = |max: u32, description: &str| {
        json!({"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._-]*$", "maxLength": max,
               "description": description})
    };
    let period = json!({
        "description": "second, minute, hour, day, or a number of seconds (1 to 31,622,400)",
        "oneOf": [
            {"type": "string", "enum": ["second", "minute", "hour", "day"]},
            {"type": "integer", "minimum": 1, "maximum": 31_622_400},
        ],
    });
    let burst = json!({"type": ["integer", "null"], "minimum": 1, "maximum": 1_000_000_000u64,
                       "description": "The bucket's capacity; defaults to `requests` (or `tokens`). A burst that would take more than 2^62 ns (about 146 years) to refill at this limit's rate is capped at what that refill holds (one token a day: 53,375)"});
    let scope = json!({"type": "string", "enum": ["proxy", "global"], "default": "proxy",
                       "description": "`proxy`: each Envoy keeps its own bucket per client. `global`: one bucket per client for the whole fleet of Envoys following this admin API, still decided inside each Envoy from leases"});
    let amount = json!({"type": "integer", "minimum": 1, "maximum": 1_000_000_000u64});
    let absent = json!({"type": "null"});
    // Two whole forms, as for header conditions below: a request limit, or a token limit
    // (LLM usage read from the response, `count` saying which).
    let limit = json!({
        "description": "`requests` per `period`, or `tokens` of LLM usage per `period` (a token limit: the rule's `tokens` section says where usage is read), or `concurrent` alone (an in-flight limit)",
        "oneOf": [
            {"type": "object", "additionalProperties": false, "required": ["requests", "period"],
             "properties": {"requests": amount, "period": period, "burst": burst, "scope": scope,
                            "soft_percent": {"type": ["integer", "null"], "minimum": 1, "maximum": MAX_SOFT_PERCENT,
                                             "description": "A soft limit: once the limit is spent, requests are still admitted (with the `x-sluice-warning` response field, counted `warned`) while the client stays within this percentage over the limit's rate and burst; beyond that, denied. Only with `scope: proxy`, and not in a rule with `on_limit: delay`"},
                            "tokens": absent, "count": absent, "concurrent": absent}},
            {"type": "object", "additionalProperties": false, "required": ["tokens", "period"],
             "properties": {"tokens": amount, "period": period, "burst": burst, "scope": scope,
                            "requests": absent, "concurrent": absent, "soft_percent": absent,
                            "count": {"type": ["string", "null"], "enum": ["input", "output", "total", null],
                                      "default": "total",
                                      "description": "Which usage the limit counts"}}},
            {"type": "object", "additionalProperties": false, "required": ["concurrent"],
             "properties": {"concurrent": {"type": "integer", "minimum": 1, "maximum": MAX_CONCURRENT,
                                           "description": "At most this many of the client's requests in flight in this Envoy at once (all workers together); a request holds its place until its stream ends, however it ends"},
                            "scope": {"type": "string", "enum": ["proxy"], "default": "proxy",
                                      "description": NO_GLOBAL_IN_FLIGHT},
                            "requests": absent, "tokens": absent, "period": absent,
                            "burst": absent, "count": absent, "soft_percent": absent}},
        ],
    });
    // At least one, except in a descriptor rule whose `answer` is `unlimited` or `deny`
    // (none there), which the API checks.
    let limits = json!({"type": "array", "minItems": 0, "maxItems": MAX_LIMITS_PER_RULE,
                        "items": limit});
    // As `sluice_core::rule` checks them: token characters of RFC 9110, at most 256.
    let header_name = json!({"type": "string", "pattern": "^[A-Za-z0-9!#$%&'*+^_`|~.-]{1,256}$"});
    let part_keys = json!([
        {"type": "string", "enum": ["path"]},
        {"type": "object", "additionalProperties": false, "required": ["header"],
         "properties": {"header": header_name}},
        {"type": "object", "additionalProperties": false, "required": ["client_ip"],
         "properties": {"client_ip": {"type": "object", "additionalProperties": false,
            "properties": {"trusted_hops": {"type": "integer", "minimum": 0, "maximum": 16,
                "default": 0,
                "description": "Proxies in front of Envoy whose X-Forwarded-For entries to trust"}}}}},
        {"type": "object", "additionalProperties": false, "required": ["query"],
         "properties": {"query": {"type": "string", "minLength": 1, "maxLength": 256}}},
        {"type": "object", "additionalProperties": false, "required": ["metadata"],
         "properties": {"metadata": {"type": "object", "additionalProperties": false,
            "required": ["filter", "path"],
            "description": "A value another filter verified and left in the request's dynamic metadata: a JWT claim from `jwt_authn`'s `payload_in_metadata` (`filter: envoy.filters.http.jwt_authn`, `path: [PAYLOAD_NAME, CLAIM, ...]`), or what ext_authz or Lua set. Key on string values: Envoy hands numbers, booleans and lists over in a binary encoding",
            "properties": {
                "filter": {"type": "string", "minLength": 1, "maxLength": MAX_METADATA_NAME,
                           "description": "The metadata namespace (usually the filter's name)"},
                "path": {"type": "array", "minItems": 1, "maxItems": MAX_METADATA_PATH,
                         "items": {"type": "string", "minLength": 1, "maxLength": MAX_METADATA_NAME}},
            }}}},
        {"type": "object", "additionalProperties": false, "required": ["peer_certificate"],
         "properties": {"peer_certificate": {"type": "string", "enum": ["uri_san", "dns_san", "subject"],
            "description": "A field of the TLS peer's certificate as Envoy verified it (mTLS): the first URI SAN, the first DNS SAN, or the subject"}}},
        {"type": "object", "additionalProperties": false, "required": ["cookie"],
         "properties": {"cookie": header_name}},
    ]);
    let composite_key = json!({"type": "object", "additionalProperties": false, "required": ["composite"],
        "properties": {"composite": {"type": "array", "minItems": 2, "maxItems": 4,
            "items": {"oneOf": part_keys},
            "description": "2 to 4 keys (not `global`, not nested) joined with `|`"}}});
    let mut key_forms = part_keys.as_array().cloned().unwrap_or_default();
    key_forms.push(json!({"type": "string", "enum": ["global"]}));
    key_forms.push(composite_key.clone());
    let key = json!({"description": "Whose bucket a request draws from", "oneOf": key_forms});
    let mut value_forms = part_keys.as_array().cloned().unwrap_or_default();
    value_forms.push(composite_key);
    let value_condition = |present: serde_json::Value,
                           equals: serde_json::Value,
                           required: &[&str]| {
        json!({"type": "object", "additionalProperties": false, "required": required,
               "properties": {"value": {"oneOf": value_forms}, "present": present, "equals": equals}})
    };
    let value_match = json!({
        "description": "A condition on a value read as a key is (a claim, a cookie, a certificate field): `present`, `equals`, or both with `present: true`",
        "anyOf": [
            value_condition(json!({"type": "boolean"}), json!({"type": "null"}), &["value", "present"]),
            value_condition(json!({"type": "null"}), json!({"type": "string"}), &["value", "equals"]),
            value_condition(json!({"type": "boolean", "enum": [true]}), json!({"type": "string"}),
                            &["value", "present", "equals"]),
        ],
    });
    // The three forms the core accepts (a null is an absent field): `present` alone,
    // `equals` alone, or `equals` with `present: true`. Spelled as whole objects, since
    // utoipa's object schema has no `anyOf` of its own (it would be dropped).
    let condition = |present: serde_json::Value, equals: serde_json::Value, required: &[&str]| {
        json!({"type": "object", "additionalProperties": false, "required": required,
               "properties": {"name": header_name, "present": present, "equals": equals}})
    };
    let header_condition = json!({
        "description": "`present`, `equals`, or both with `present: true`",
        "anyOf": [
            condition(json!({"type": "boolean"}), json!({"type": "null"}), &["name", "present"]),
            condition(json!({"type": "null"}), json!({"type": "string"}), &["name", "equals"]),
            condition(json!({"type": "boolean", "enum": [true]}), json!({"type": "string"}),
                      &["name", "present", "equals"]),
        ],
    });
    json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["name", "key", "limits"],
        "properties": {
            "id": nullable(identifier(128, "Stable identity of the rule and its buckets (defaults to `name`); keep it when renaming")),
            "name": identifier(64, "Shown in headers and bodies"),
            "description": {"type": "string", "maxLength": 1024},
            "enabled": {"type": "boolean", "default": true},
            "priority": {"type": "integer", "format": "int32", "default": 0,
                         "minimum": i32::MIN, "maximum": i32::MAX,
                         "description": "Higher is evaluated first"},
            "mode": {"type": "string", "enum": ["enforce", "shadow", "warn"], "default": "enforce",
                     "description": "`enforce` denies over-limit requests; `shadow` only counts what it would deny; `warn` never denies but adds the `x-sluice-warning` response field over the limit and counts the request `warned`"},
            "match": {
                "type": "object",
                "additionalProperties": false,
                "description": "Every given condition must hold; empty matches everything",
                "properties": {
                    "host": {"type": ["string", "null"], "pattern": "^(\\*\\.)?[^*/ ]+$",
                             "description": "`api.example.com` or `*.example.com`"},
                    "path_exact": {"type": ["string", "null"], "pattern": "^/"},
                    "path_prefix": {"type": ["string", "null"], "pattern": "^/"},
                    "path_regex": {"type": ["string", "null"], "maxLength": 1024,
                                   "description": "A regular expression (Rust `regex` syntax) that must match the whole path"},
                    "methods": {"type": "array", "items": {"type": "string", "pattern": "^[A-Za-z]+$"}},
                    "headers": {"type": "array", "items": header_condition},
                    "values": {"type": "array", "items": value_match},
                },
            },
            "key": key,
            "key_missing": {
                "description": "A matching request without a client key: `skip` the rule (the default), or `{fallback: CLIENT}`: draw from that client's bucket. Both are counted",
                "oneOf": [
                    {"type": "string", "enum": ["skip"]},
                    {"type": "object", "additionalProperties": false, "required": ["fallback"],
                     "properties": {"fallback": {"type": "string", "minLength": 1, "maxLength": 1024}}},
                ],
            },
            "enforce_percent": {"type": "integer", "minimum": 0, "maximum": 100, "default": 100,
                                "description": "Enforce-mode rules only: the share of clients the rule is enforced for, chosen by a stable hash of the client key (a client is always on the same side, on every Envoy); the others are in shadow mode"},
            "limits": limits,
            "cost": {
                "description": "Tokens per request: `{fixed: N}` (default `{fixed: 1}`) or read from a header",
                "oneOf": [
                    {"type": "object", "additionalProperties": false, "required": ["fixed"],
                     "properties": {"fixed": {"type": "integer", "minimum": 1, "maximum": MAX_COST}}},
                    {"type": "object", "additionalProperties": false, "required": ["header"],
                     "properties": {"header": {"type": "object", "additionalProperties": false,
                        "required": ["name", "max"],
                        "properties": {
                            "name": header_name,
                            "max": {"type": "integer", "minimum": 1, "maximum": MAX_COST},
                            "default": {"type": "integer", "minimum": 0, "maximum": MAX_COST,
                                        "default": 1, "description": "At most `max`"},
                        }}}},
                ],
            },
            "overrides": {"type": "array", "maxItems": MAX_OVERRIDES, "items": {
                "type": "object", "additionalProperties": false, "required": ["client", "limits"],
                "properties": {"client": {"type": "string", "minLength": 1, "maxLength": 1024,
                                          "description": "A client key; each client once"},
                               "limits": limits},
            }},
            "tokens": tokens_section(),
            "on_limit": {"type": "string", "enum": ["refuse", "delay"], "default": "refuse",
                         "description": "What an over-limit request gets (enforce mode): `refuse` answers it at once with the rule's response; `delay` holds it until its tokens are due, if that is within `delay.max_delay_ms` and the queues have room, and refuses it otherwise. Only with `scope: proxy` limits"},
            "delay": {
                "type": ["object", "null"], "additionalProperties": false,
                "required": ["max_delay_ms"],
                "description": "With `on_limit: delay` (and only then): how long a request may wait for its tokens and how many may wait",
                "properties": {
                    "max_delay_ms": {"type": "integer", "minimum": 1, "maximum": MAX_DELAY_MS,
                                     "description": "The longest a request is held, in milliseconds; one whose tokens are due later is refused"},
                    "queue_per_key": {"type": ["integer", "null"], "minimum": 1, "maximum": MAX_QUEUE_PER_WORKER,
                                      "description": "The most requests of one client waiting at once on one Envoy worker; at most `queue_per_worker` (default 16, or `queue_per_worker` if smaller)"},
                    "queue_per_worker": {"type": ["integer", "null"], "minimum": 1, "maximum": MAX_QUEUE_PER_WORKER,
                                         "description": "The most requests of this rule waiting at once on one Envoy worker (default 1,024)"},
                },
            },
            "elastic": {
                "type": ["object", "null"], "additionalProperties": false,
                "required": ["requests", "period"],
                "description": "An elastic rule: a client over its own limit is still admitted (with the `x-sluice-warning` response field, counted `warned`) while the requests this rule admitted in this Envoy, all clients together, stay within this ceiling; once they reach it, every client is held to its own limit again from the next request. Only with `requests` limits of `scope: proxy`, no soft limits, `on_limit: refuse`, and not in warn mode",
                "properties": {"requests": amount, "period": period,
                               "burst": {"type": ["integer", "null"], "minimum": 1, "maximum": 1_000_000_000u64,
                                         "description": "The ceiling's capacity; defaults to `requests`"}},
            },
            "failure_mode": {"type": ["string", "null"], "enum": ["open", "closed", null],
                             "description": "Defaults to the proxy's"},
            "response": {
                "type": "object", "additionalProperties": false,
                "properties": {
                    "status": {"type": "integer", "minimum": 400, "maximum": 599, "default": 429},
                    "rate_limit_headers": {"type": "boolean", "default": true},
                    "grpc_status": {
                        "type": "string", "default": "resource_exhausted",
                        "description": "The gRPC status of a denied gRPC call",
                        "enum": ["cancelled", "unknown", "invalid_argument", "deadline_exceeded",
                                 "not_found", "already_exists", "permission_denied",
                                 "resource_exhausted", "failed_precondition", "aborted",
                                 "out_of_range", "unimplemented", "internal", "unavailable",
                                 "data_loss", "unauthenticated"],
                    },
                },
            },
            "descriptor": {
                "type": ["object", "null"], "additionalProperties": false,
                "required": ["domain", "entries"],
                "description": "Set: the rule decides Envoy's rate limit service (RLS) requests with these descriptors (`key` must be `global`, `match` and `cost` left out), never HTTP requests in the filter",
                "properties": {
                    "domain": {"type": "string", "minLength": 1, "maxLength": rls::MAX_DOMAIN_LEN},
                    "entries": {"type": "array", "minItems": 1, "maxItems": rls::MAX_ENTRIES, "items": {
                        "type": "object", "additionalProperties": false, "required": ["key"],
                        "properties": {
                            "key": {"type": "string", "minLength": 1, "maxLength": rls::MAX_KEY_LEN},
                            "value": {"type": ["string", "null"], "minLength": 1, "maxLength": rls::MAX_VALUE_LEN,
                                      "description": "Absent: any value, and the value is (part of) the client key"},
                            "value_prefix": {"type": ["string", "null"], "maxLength": rls::MAX_VALUE_LEN,
                                      "description": "Values starting with this (envoyproxy/ratelimit's `value: abc*`); the value is (part of) the client key"},
                        },
                    }},
                    "answer": {"type": "string", "enum": ["limit", "unlimited", "deny"],
                               "description": "`limit` (default): the limits decide; `unlimited`: always OK; `deny`: always OVER_LIMIT (both without `limits`)"},
                    "replaces": {"type": "array", "maxItems": rls::descriptor::MAX_REPLACES,
                                 "items": {"type": "string", "minLength": 1, "maxLength": 64},
                                 "description": "Rule names whose descriptors in the same request this rule's match leaves unlimited"},
                },
            },
        },
        "example": {
            "name": "api-per-key",
            "match": {"path_prefix": "/api/"},
            "key": {"header": "x-api-key"},
            "limits": [
                {"requests": 5, "period": "second", "burst": 10},
                {"requests": 100, "period": "minute"},
            ],
            "mode": "enforce",
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    /// utoipa reads a hand-written schema into its own types, which silently drop any
    /// keyword they do not model (an object's `anyOf`, `const`): the document would then
    /// admit what the server refuses. Every keyword written here reaches the document.
    #[test]
    fn the_hand_written_request_schemas_reach_the_document_whole() {
        for (name, written, read) in [
            (
                "RuleSpec",
                rule_spec_schema(),
                <RuleSpecSchema as utoipa::PartialSchema>::schema(),
            ),
            (
                "RulesFile",
                rules_file_schema(),
                <RulesFileSchema as utoipa::PartialSchema>::schema(),
            ),
        ] {
            assert_eq!(serde_json::to_value(read).unwrap(), written, "{name}");
        }
    }

    /// The header conditions the schema admits are exactly those the core accepts.
    #[test]
    fn the_schema_admits_exactly_the_header_conditions_the_core_accepts() {
        let schema = rule_spec_schema();
        let forms = schema["properties"]["match"]["properties"]["headers"]["items"]["anyOf"]
            .as_array()
            .unwrap()
            .clone();
        // Enough of JSON Schema for these forms: `required`, and `type` or `enum` per
        // property.
        let admits = |form: &Value, condition: &Value| {
            let required = form["required"].as_array().unwrap();
            required
                .iter()
                .all(|k| condition.get(k.as_str().unwrap()).is_some())
                && condition.as_object().unwrap().iter().all(|(k, v)| {
                    let property = &form["properties"][k];
                    let kind = match v {
                        Value::Null => "null",
                        Value::Bool(_) => "boolean",
                        _ => "string",
                    };
                    property["type"] == kind
                        && property
                            .get("enum")
                            .is_none_or(|e| e.as_array().unwrap().contains(v))
                })
        };
        for present in [
            None,
            Some(Value::Null),
            Some(json!(true)),
            Some(json!(false)),
        ] {
            for equals in [None, Some(Value::Null), Some(json!("v"))] {
                let mut condition = json!({"name": "x-tier"});
                if let Some(p) = &present {
                    condition["present"] = p.clone();
                }
                if let Some(e) = &equals {
                    condition["equals"] = e.clone();
                }
                let in_schema = forms.iter().any(|form| admits(form, &condition));
                let spec: RuleSpec = serde_json::from_value(json!({
                    "name": "h", "key": "global", "limits": [{"requests": 1, "period": 1}],
                    "match": {"headers": [condition.clone()]},
                }))
                .unwrap();
                let accepted = sluice_core::rule::Rule::try_from(spec).is_ok();
                assert_eq!(in_schema, accepted, "{condition}");
            }
        }
    }

    /// Every key serde writes for a rule with every field set is described by the schema.
    #[test]
    fn the_rule_schema_covers_every_field() {
        let full: RuleSpec = serde_json::from_value(json!({
            "id": "i", "name": "n", "description": "d", "enabled": false, "priority": 3,
            "mode": "shadow",
            "match": {"host": "h", "path_exact": "/a", "path_prefix": "/", "path_regex": ".*",
                      "methods": ["GET"], "headers": [{"name": "x", "present": true, "equals": "y"}],
                      "values": [{"value": {"cookie": "plan"}, "present": true, "equals": "pro"}]},
            "key": {"composite": [{"header": "x"}, {"client_ip": {"trusted_hops": 1}}]},
            "key_missing": {"fallback": "anonymous"},
            "enforce_percent": 10,
            "limits": [{"requests": 1, "period": 5, "burst": 2, "scope": "global"},
                       {"tokens": 100, "period": 60, "burst": 200, "count": "output"},
                       {"concurrent": 10}],
            "cost": {"header": {"name": "c", "max": 5, "default": 2}},
            "tokens": {"usage": {"json_pointer": {"input": "/u/i", "output": "/u/o", "total": "/u/t"}},
                       "default_estimate": 10, "estimate_input_from_body": true,
                       "include_usage": true},
            "overrides": [{"client": "acme", "limits": [{"requests": 9, "period": "day"}]}],
            "failure_mode": "closed",
            "response": {"status": 503, "rate_limit_headers": false, "grpc_status": "unavailable"},
            "descriptor": {"domain": "d", "entries": [{"key": "k", "value": "v"}]},
            "on_limit": "delay",
            "delay": {"max_delay_ms": 500, "queue_per_key": 4, "queue_per_worker": 64},
            "elastic": {"requests": 100, "period": "second", "burst": 50},
        }))
        .unwrap();
        let written = serde_json::to_value(&full).unwrap();
        let schema = rule_spec_schema();
        let props = &schema["properties"];
        for key in written.as_object().unwrap().keys() {
            assert!(props.get(key).is_some(), "schema lacks `{key}`");
        }
        for (section, value) in [
            ("match", &written["match"]),
            ("response", &written["response"]),
            ("delay", &written["delay"]),
            ("elastic", &written["elastic"]),
        ] {
            for key in value.as_object().unwrap().keys() {
                assert!(
                    props[section]["properties"].get(key).is_some(),
                    "schema lacks `{section}.{key}`"
                );
            }
        }
        for (form, limit) in written["limits"].as_array().unwrap().iter().enumerate() {
            let limit_props = &props["limits"]["items"]["oneOf"][form]["properties"];
            for key in limit.as_object().unwrap().keys() {
                assert!(
                    limit_props.get(key).is_some(),
                    "schema lacks `limits[].{key}` in form {form}"
                );
            }
        }
        for key in written["tokens"].as_object().unwrap().keys() {
            assert!(
                props["tokens"]["properties"].get(key).is_some(),
                "schema lacks `tokens.{key}`"
            );
        }
        // The schema is valid for utoipa, not the empty fallback.
        let RefOr::T(Schema::Object(object)) = <RuleSpecSchema as utoipa::PartialSchema>::schema()
        else {
            panic!("not an object schema");
        };
        assert!(object.properties.contains_key("limits"));
        let _: Value = serde_json::to_value(&object).unwrap();
    }
}
