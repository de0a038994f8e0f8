//! The rule form's inputs as plain data, and their translation to and from a rule spec.
//!
//! The form keeps one Leptos signal per input; reading them gives a [`Draft`], and a
//! [`Draft`] made from a spec fills them. Everything between the inputs and the spec (which
//! text means which period, what is a number, which field path a problem belongs to) lives
//! here, so it is tested on the host without a browser.

use sluice_core::rule::Rule;
use sluice_core::spec::{
    ClientIpSpec, CostSpec, FailureMode, GrpcStatus, HeaderCostSpec, HeaderMatchSpec, KeySpec,
    LimitSpec, MatchSpec, Mode, NamedPeriod, OverrideSpec, PeriodSpec, ResponseSpec, RuleSpec,
    Scope,
};

/// One problem with one field, as the API and the core name them (`limits[0].requests`).
pub use sluice_core::validation::FieldError;

/// One limit's inputs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LimitDraft {
    pub requests: String,
    /// `second`, `minute`, `hour`, `day` or `custom`.
    pub period: String,
    /// The period in seconds when `period` is `custom`.
    pub seconds: String,
    /// Empty: the burst defaults to `requests`.
    pub burst: String,
    /// One bucket per client for the whole fleet (`scope: global`) rather than per proxy.
    pub global: bool,
}

impl LimitDraft {
    /// The inputs for `spec`, or for a new limit (10 per second).
    pub fn from_spec(spec: Option<&LimitSpec>) -> LimitDraft {
        let (period, seconds) = match spec.map(|s| s.period) {
            None => ("second".to_string(), String::new()),
            Some(PeriodSpec::Named(n)) => (period_name(n).to_string(), String::new()),
            Some(PeriodSpec::Seconds(s)) => ("custom".to_string(), s.to_string()),
        };
        LimitDraft {
            requests: spec.map(|s| s.requests.to_string()).unwrap_or_default(),
            period,
            seconds,
            burst: spec
                .and_then(|s| s.burst)
                .map(|b| b.to_string())
                .unwrap_or_default(),
            global: spec.is_some_and(|s| s.scope == Scope::Global),
        }
    }

    /// The inputs of a limit added below `last`: rules usually stack a short and a longer
    /// window, so after a per-second limit comes a per-minute one, after any other an hourly
    /// one.
    pub fn after(last: Option<&LimitDraft>) -> LimitDraft {
        let mut next = LimitDraft::from_spec(None);
        if let Some(last) = last {
            next.period = if last.period == "second" {
                "minute"
            } else {
                "hour"
            }
            .to_string();
        }
        next
    }
}

/// The form's name of a named period.
pub fn period_name(n: NamedPeriod) -> &'static str {
    match n {
        NamedPeriod::Second => "second",
        NamedPeriod::Minute => "minute",
        NamedPeriod::Hour => "hour",
        NamedPeriod::Day => "day",
    }
}

/// One header condition's inputs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeaderDraft {
    pub name: String,
    /// `present`, `absent` or `equals`.
    pub kind: String,
    pub value: String,
}

/// One per-client override's inputs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OverrideDraft {
    pub client: String,
    pub limits: Vec<LimitDraft>,
}

/// Every input of the rule form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Draft {
    pub id: String,
    pub name: String,
    pub description: String,
    pub priority: String,
    pub enabled: bool,
    pub shadow: bool,
    pub host: String,
    pub path_prefix: String,
    pub path_exact: String,
    pub path_regex: String,
    /// Comma- or space-separated.
    pub methods: String,
    pub headers: Vec<HeaderDraft>,
    /// `header`, `client_ip`, `query`, `path` or `global` (composite keys are edited as
    /// JSON).
    pub key_kind: String,
    pub key_value: String,
    pub hops: String,
    pub limits: Vec<LimitDraft>,
    /// `fixed` or `header`.
    pub cost_kind: String,
    pub cost_fixed: String,
    pub cost_header: String,
    pub cost_max: String,
    pub cost_default: String,
    pub overrides: Vec<OverrideDraft>,
    /// ``, `open` or `closed`.
    pub failure: String,
    pub status: String,
    pub rate_limit_headers: bool,
    /// Not an input of the form: kept as loaded, so saving the form does not reset it.
    pub grpc_status: GrpcStatus,
}

fn opt(s: &Option<String>) -> String {
    s.clone().unwrap_or_default()
}

impl Draft {
    /// The inputs that show `spec`.
    pub fn from_spec(spec: &RuleSpec) -> Draft {
        let (key_kind, key_value, hops) = match &spec.key {
            KeySpec::Header(h) => ("header", h.clone(), "0".to_string()),
            KeySpec::ClientIp(ip) => ("client_ip", String::new(), ip.trusted_hops.to_string()),
            KeySpec::Query(q) => ("query", q.clone(), "0".to_string()),
            KeySpec::Path => ("path", String::new(), "0".to_string()),
            KeySpec::Global | KeySpec::Composite(_) => ("global", String::new(), "0".to_string()),
        };
        let (cost_kind, cost_fixed, cost_header, cost_max, cost_default) = match &spec.cost {
            CostSpec::Fixed(n) => (
                "fixed",
                n.to_string(),
                String::new(),
                "100".to_string(),
                "1".to_string(),
            ),
            CostSpec::Header(h) => (
                "header",
                "1".to_string(),
                h.name.clone(),
                h.max.to_string(),
                h.default.to_string(),
            ),
        };
        let limits = |ls: &[LimitSpec]| ls.iter().map(|l| LimitDraft::from_spec(Some(l))).collect();
        Draft {
            id: opt(&spec.id),
            name: spec.name.clone(),
            description: spec.description.clone(),
            priority: spec.priority.to_string(),
            enabled: spec.enabled,
            shadow: spec.mode == Mode::Shadow,
            host: opt(&spec.matcher.host),
            path_prefix: opt(&spec.matcher.path_prefix),
            path_exact: opt(&spec.matcher.path_exact),
            path_regex: opt(&spec.matcher.path_regex),
            methods: spec.matcher.methods.join(", "),
            headers: spec
                .matcher
                .headers
                .iter()
                .map(|h| HeaderDraft {
                    name: h.name.clone(),
                    kind: match (h.present, &h.equals) {
                        (_, Some(_)) => "equals",
                        (Some(false), None) => "absent",
                        _ => "present",
                    }
                    .to_string(),
                    value: opt(&h.equals),
                })
                .collect(),
            key_kind: key_kind.to_string(),
            key_value,
            hops,
            limits: limits(&spec.limits),
            cost_kind: cost_kind.to_string(),
            cost_fixed,
            cost_header,
            cost_max,
            cost_default,
            overrides: spec
                .overrides
                .iter()
                .map(|o| OverrideDraft {
                    client: o.client.clone(),
                    limits: limits(&o.limits),
                })
                .collect(),
            failure: match spec.failure_mode {
                None => "",
                Some(FailureMode::Open) => "open",
                Some(FailureMode::Closed) => "closed",
            }
            .to_string(),
            status: spec.response.status.to_string(),
            rate_limit_headers: spec.response.rate_limit_headers,
            grpc_status: spec.response.grpc_status,
        }
    }

    /// Adds an override for `client` that starts from the rule's own limits (the rules page
    /// links here to raise one client's limits), unless the client already has one: then
    /// nothing changes and this returns `false`.
    pub fn add_override_for(&mut self, client: &str) -> bool {
        if self.overrides.iter().any(|o| o.client == client) {
            return false;
        }
        self.overrides.push(OverrideDraft {
            client: client.to_string(),
            limits: self.limits.clone(),
        });
        true
    }

    /// The spec the inputs describe, and the inputs that are not even numbers (with the
    /// field paths the core uses, so the form shows both kinds of problem the same way).
    pub fn to_spec(&self) -> (RuleSpec, Vec<FieldError>) {
        let mut numbers = Numbers::default();
        let limits = numbers.limits(&self.limits, "limits");
        let overrides = self
            .overrides
            .iter()
            .enumerate()
            .map(|(i, o)| OverrideSpec {
                client: o.client.clone(),
                limits: numbers.limits(&o.limits, &format!("overrides[{i}].limits")),
            })
            .collect();
        let key = match self.key_kind.as_str() {
            "header" => KeySpec::Header(self.key_value.trim().to_string()),
            "query" => KeySpec::Query(self.key_value.trim().to_string()),
            "client_ip" => KeySpec::ClientIp(ClientIpSpec {
                trusted_hops: numbers
                    .parse(&self.hops, "key.client_ip.trusted_hops", false)
                    .map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX)),
            }),
            "path" => KeySpec::Path,
            _ => KeySpec::Global,
        };
        let cost = if self.cost_kind == "header" {
            CostSpec::Header(HeaderCostSpec {
                name: self.cost_header.trim().to_string(),
                max: numbers
                    .parse(&self.cost_max, "cost.header.max", true)
                    .unwrap_or(0),
                default: numbers
                    .parse(&self.cost_default, "cost.header.default", false)
                    .unwrap_or(1),
            })
        } else {
            CostSpec::Fixed(
                numbers
                    .parse(&self.cost_fixed, "cost.fixed", true)
                    .unwrap_or(0),
            )
        };
        let status = numbers
            .parse(&self.status, "response.status", true)
            .map_or(0, |n| u16::try_from(n).unwrap_or(0));
        let priority = match self.priority.trim() {
            "" => 0,
            p => p.parse::<i32>().unwrap_or_else(|_| {
                numbers.problem("priority", "must be a whole number");
                0
            }),
        };
        let nonempty = |s: &str| {
            let v = s.trim();
            (!v.is_empty()).then(|| v.to_string())
        };
        let spec = RuleSpec {
            id: nonempty(&self.id),
            name: self.name.trim().to_string(),
            description: self.description.trim().to_string(),
            enabled: self.enabled,
            priority,
            mode: if self.shadow {
                Mode::Shadow
            } else {
                Mode::Enforce
            },
            matcher: MatchSpec {
                host: nonempty(&self.host),
                path_exact: nonempty(&self.path_exact),
                path_prefix: nonempty(&self.path_prefix),
                path_regex: nonempty(&self.path_regex),
                methods: methods(&self.methods),
                headers: self
                    .headers
                    .iter()
                    .map(|h| HeaderMatchSpec {
                        name: h.name.trim().to_string(),
                        present: match h.kind.as_str() {
                            "absent" => Some(false),
                            "present" => Some(true),
                            _ => None,
                        },
                        equals: (h.kind == "equals").then(|| h.value.clone()),
                    })
                    .collect(),
            },
            key,
            limits,
            cost,
            overrides,
            failure_mode: match self.failure.as_str() {
                "open" => Some(FailureMode::Open),
                "closed" => Some(FailureMode::Closed),
                _ => None,
            },
            response: ResponseSpec {
                status,
                rate_limit_headers: self.rate_limit_headers,
                grpc_status: self.grpc_status,
            },
        };
        (spec, numbers.problems)
    }
}

/// The methods a methods input lists, as the spec holds them.
fn methods(text: &str) -> Vec<String> {
    text.split([',', ' '])
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .map(str::to_ascii_uppercase)
        .collect()
}

/// The field path whose problem the methods input (holding `text`) shows. The core names
/// each method (`match.methods[2]`) but the form has one input for all of them, so it
/// follows the first method the core refuses.
pub fn methods_field(text: &str) -> String {
    let bad = methods(text)
        .iter()
        .position(|m| !m.bytes().all(|b| b.is_ascii_alphabetic()));
    format!("match.methods[{}]", bad.unwrap_or(0))
}

/// Reads numeric inputs, collecting what is missing or not a number.
#[derive(Debug, Default)]
struct Numbers {
    problems: Vec<FieldError>,
}

impl Numbers {
    fn problem(&mut self, field: &str, message: &str) {
        self.problems.push(FieldError {
            field: field.to_string(),
            message: message.to_string(),
        });
    }

    /// A whole number, allowing `,` and `_` as digit separators; `None` (and a problem
    /// when `required`) for an empty input.
    fn parse(&mut self, value: &str, field: &str, required: bool) -> Option<u64> {
        let v = value.trim();
        if v.is_empty() {
            if required {
                self.problem(field, "is required");
            }
            return None;
        }
        match v.replace([',', '_'], "").parse::<u64>() {
            Ok(n) => Some(n),
            Err(_) => {
                self.problem(field, "must be a whole number");
                None
            }
        }
    }

    fn limits(&mut self, rows: &[LimitDraft], prefix: &str) -> Vec<LimitSpec> {
        rows.iter()
            .enumerate()
            .map(|(i, r)| {
                let field = format!("{prefix}[{i}]");
                let requests = self
                    .parse(&r.requests, &format!("{field}.requests"), true)
                    .unwrap_or(0);
                let period = match r.period.as_str() {
                    "minute" => PeriodSpec::Named(NamedPeriod::Minute),
                    "hour" => PeriodSpec::Named(NamedPeriod::Hour),
                    "day" => PeriodSpec::Named(NamedPeriod::Day),
                    "custom" => PeriodSpec::Seconds(
                        self.parse(&r.seconds, &format!("{field}.period"), true)
                            .unwrap_or(0),
                    ),
                    _ => PeriodSpec::Named(NamedPeriod::Second),
                };
                let burst = self.parse(&r.burst, &format!("{field}.burst"), false);
                LimitSpec {
                    requests,
                    period,
                    burst,
                    scope: if r.global {
                        Scope::Global
                    } else {
                        Scope::Proxy
                    },
                }
            })
            .collect()
    }
}

/// Every problem with a spec: the form's own (not a number) first, then the core's, without
/// repeating a field already flagged.
pub fn validate(spec: RuleSpec, mut problems: Vec<FieldError>) -> Vec<FieldError> {
    if let Err(errors) = Rule::try_from(spec) {
        for e in errors.0 {
            if !problems.iter().any(|p| p.field == e.field) {
                problems.push(FieldError {
                    field: e.field,
                    message: e.message,
                });
            }
        }
    }
    problems
}

/// A new rule's starting point: a per-API-key limit under /api/.
pub fn blank() -> RuleSpec {
    RuleSpec {
        id: None,
        name: String::new(),
        description: String::new(),
        enabled: true,
        priority: 0,
        mode: Mode::Enforce,
        matcher: MatchSpec::default(),
        key: KeySpec::Header("x-api-key".to_string()),
        limits: vec![LimitSpec {
            requests: 10,
            period: PeriodSpec::Named(NamedPeriod::Second),
            burst: None,
            scope: Scope::Proxy,
        }],
        cost: CostSpec::default(),
        overrides: Vec::new(),
        failure_mode: None,
        response: ResponseSpec::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(json: &str) -> RuleSpec {
        serde_json::from_str(json).unwrap()
    }

    fn round_trip(rule: &RuleSpec) {
        let (back, problems) = Draft::from_spec(rule).to_spec();
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(&back, rule);
    }

    #[test]
    fn every_form_expressible_rule_survives_the_form() {
        round_trip(&blank());
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
            r#"{"name":"paths","match":{"path_regex":"/v[0-9]+/.*"},"key":"path",
                "limits":[{"requests":9,"period":"hour"}],"cost":{"fixed":3},
                "overrides":[{"client":"acme","limits":[{"requests":500,"period":"second","burst":600}]},
                             {"client":"beta","limits":[{"requests":1,"period":60}]}]}"#,
            r#"{"name":"all","key":"global","limits":[{"requests":1000,"period":"second"}],"failure_mode":"open"}"#,
            r#"{"name":"fleet","key":{"header":"x-api-key"},
                "limits":[{"requests":100,"period":"minute","scope":"global"},{"requests":10,"period":"second"}],
                "overrides":[{"client":"acme","limits":[{"requests":1000,"period":"minute","scope":"global"}]}]}"#,
        ] {
            round_trip(&spec(json));
        }
    }

    #[test]
    fn a_grpc_status_the_form_cannot_show_is_kept() {
        let rule = spec(
            r#"{"name":"g","key":"global","limits":[{"requests":1,"period":"second"}],
                "response":{"grpc_status":"permission_denied"}}"#,
        );
        let mut draft = Draft::from_spec(&rule);
        draft.status = "503".into();
        let (saved, _) = draft.to_spec();
        assert_eq!(saved.response.grpc_status, GrpcStatus::PermissionDenied);
        assert_eq!(saved.response.status, 503);
    }

    #[test]
    fn inputs_that_are_not_numbers_are_named_by_field_path() {
        let mut draft = Draft::from_spec(&blank());
        draft.limits[0].requests = "ten".into();
        draft.limits.push(LimitDraft {
            requests: "1,000".into(),
            period: "custom".into(),
            seconds: String::new(),
            burst: "x".into(),
            global: false,
        });
        draft.overrides.push(OverrideDraft {
            client: "acme".into(),
            limits: vec![LimitDraft {
                requests: String::new(),
                period: "minute".into(),
                ..LimitDraft::default()
            }],
        });
        draft.priority = "high".into();
        draft.status = String::new();
        let (spec, problems) = draft.to_spec();
        let fields: Vec<&str> = problems.iter().map(|p| p.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "limits[0].requests",
                "limits[1].period",
                "limits[1].burst",
                "overrides[0].limits[0].requests",
                "response.status",
                "priority",
            ]
        );
        assert_eq!(problems[0].message, "must be a whole number");
        assert_eq!(problems[1].message, "is required");
        assert_eq!(spec.limits[1].requests, 1_000, "digit separators are fine");
    }

    #[test]
    fn the_cores_problems_land_on_the_fields_the_form_shows() {
        let mut draft = Draft::from_spec(&blank());
        draft.name = "bad name!".into();
        draft.limits[0].requests = "0".into();
        draft.status = "200".into();
        draft.limits[0].burst = "x".into();
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
    fn methods_are_split_and_upper_cased() {
        let mut draft = Draft::from_spec(&blank());
        draft.methods = " get,post  Put ".into();
        assert_eq!(draft.to_spec().0.matcher.methods, ["GET", "POST", "PUT"]);
    }

    #[test]
    fn each_key_kind_reads_back_from_its_inputs() {
        let mut draft = Draft::from_spec(&blank());
        let mut key = |kind: &str, value: &str, hops: &str| {
            draft.key_kind = kind.into();
            draft.key_value = value.into();
            draft.hops = hops.into();
            draft.to_spec()
        };
        assert_eq!(
            key("header", " x-user ", "").0.key,
            KeySpec::Header("x-user".into())
        );
        assert_eq!(
            key("query", "token", "").0.key,
            KeySpec::Query("token".into())
        );
        assert_eq!(key("path", "ignored", "").0.key, KeySpec::Path);
        assert_eq!(key("global", "", "").0.key, KeySpec::Global);
        let (spec, problems) = key("client_ip", "", "3");
        assert_eq!(
            spec.key,
            KeySpec::ClientIp(ClientIpSpec { trusted_hops: 3 })
        );
        assert!(problems.is_empty());
        let (spec, problems) = key("client_ip", "", "");
        assert_eq!(
            spec.key,
            KeySpec::ClientIp(ClientIpSpec { trusted_hops: 0 }),
            "no hops: the TCP peer"
        );
        assert!(problems.is_empty(), "hops are optional");
        let (_, problems) = key("client_ip", "", "two");
        assert_eq!(problems[0].field, "key.client_ip.trusted_hops");
    }

    #[test]
    fn a_composite_key_is_not_shown_by_the_form() {
        // The page opens such a rule in JSON mode and refuses to switch to the form, because
        // the form would save it as a global key.
        let rule = spec(
            r#"{"name":"c","key":{"composite":[{"header":"x-tenant"},"path"]},
                "limits":[{"requests":1,"period":"second"}]}"#,
        );
        assert_eq!(Draft::from_spec(&rule).key_kind, "global");
    }

    #[test]
    fn costs_read_back_with_their_defaults_and_problems() {
        let mut draft = Draft::from_spec(&blank());
        assert_eq!(
            (draft.cost_kind.as_str(), draft.cost_fixed.as_str()),
            ("fixed", "1")
        );
        assert_eq!(
            (draft.cost_max.as_str(), draft.cost_default.as_str()),
            ("100", "1"),
            "switching to a header cost starts from sensible bounds"
        );
        draft.cost_kind = "header".into();
        draft.cost_header = " x-cost ".into();
        draft.cost_default = String::new();
        let (spec, problems) = draft.to_spec();
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(
            spec.cost,
            CostSpec::Header(HeaderCostSpec {
                name: "x-cost".into(),
                max: 100,
                default: 1,
            })
        );
        draft.cost_max = String::new();
        draft.cost_default = "-1".into();
        let fields: Vec<String> = draft.to_spec().1.into_iter().map(|p| p.field).collect();
        assert_eq!(fields, ["cost.header.max", "cost.header.default"]);
        draft.cost_kind = "fixed".into();
        draft.cost_fixed = "1.5".into();
        assert_eq!(draft.to_spec().1[0].field, "cost.fixed");
    }

    #[test]
    fn empty_texts_are_absent_and_header_conditions_keep_their_kind() {
        let mut draft = Draft::from_spec(&blank());
        draft.id = "  ".into();
        draft.name = " api ".into();
        draft.host = String::new();
        draft.path_prefix = " /api/ ".into();
        draft.headers = vec![
            HeaderDraft {
                name: " x-a ".into(),
                kind: "present".into(),
                value: "ignored".into(),
            },
            HeaderDraft {
                name: "x-b".into(),
                kind: "absent".into(),
                value: String::new(),
            },
            HeaderDraft {
                name: "x-c".into(),
                kind: "equals".into(),
                value: " v ".into(),
            },
        ];
        let (spec, _) = draft.to_spec();
        assert_eq!(spec.id, None);
        assert_eq!(spec.name, "api");
        assert_eq!(spec.matcher.host, None);
        assert_eq!(spec.matcher.path_prefix.as_deref(), Some("/api/"));
        let headers: Vec<(&str, Option<bool>, Option<&str>)> = spec
            .matcher
            .headers
            .iter()
            .map(|h| (h.name.as_str(), h.present, h.equals.as_deref()))
            .collect();
        assert_eq!(
            headers,
            [
                ("x-a", Some(true), None),
                ("x-b", Some(false), None),
                ("x-c", None, Some(" v ")),
            ],
            "a header value is compared as typed"
        );
    }

    #[test]
    fn a_new_limit_follows_the_last_one() {
        assert_eq!(LimitDraft::after(None), LimitDraft::from_spec(None));
        assert_eq!(LimitDraft::after(None).period, "second");
        let per = |period: &str| LimitDraft {
            period: period.into(),
            ..LimitDraft::default()
        };
        assert_eq!(LimitDraft::after(Some(&per("second"))).period, "minute");
        assert_eq!(LimitDraft::after(Some(&per("minute"))).period, "hour");
        assert_eq!(LimitDraft::after(Some(&per("custom"))).period, "hour");
        assert_eq!(LimitDraft::after(Some(&per("second"))).requests, "");
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
        draft.methods = "get, p0st, 7".into();
        assert_eq!(methods_field(&draft.methods), "match.methods[1]");
        let (spec, problems) = draft.to_spec();
        let all = validate(spec, problems);
        let fields: Vec<&str> = all.iter().map(|p| p.field.as_str()).collect();
        assert_eq!(fields, ["match.methods[1]", "match.methods[2]"]);
        assert_eq!(methods_field("GET"), "match.methods[0]");
    }

    /// The fields the core names for a draft of the blank rule changed by `edit`.
    fn fields_after(edit: impl FnOnce(&mut Draft)) -> Vec<String> {
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
        assert_eq!(fields_after(|d| d.host = "a/b".into()), ["match.host"]);
        assert_eq!(
            fields_after(|d| d.path_prefix = "api".into()),
            ["match.path_prefix"]
        );
        assert_eq!(
            fields_after(|d| d.path_exact = "api".into()),
            ["match.path_exact"]
        );
        assert_eq!(
            fields_after(|d| d.path_regex = "(".into()),
            ["match.path_regex"]
        );
        assert_eq!(
            fields_after(|d| d.headers.push(HeaderDraft {
                name: String::new(),
                kind: "present".into(),
                value: String::new(),
            })),
            ["match.headers[0].name"]
        );
        assert_eq!(
            fields_after(|d| d.key_value = "no spaces".into()),
            ["key.header"]
        );
        assert_eq!(
            fields_after(|d| {
                d.key_kind = "query".into();
                d.key_value = String::new();
            }),
            ["key.query"]
        );
        assert_eq!(
            fields_after(|d| {
                d.key_kind = "client_ip".into();
                d.hops = "17".into();
            }),
            ["key.client_ip.trusted_hops"]
        );
        assert_eq!(
            fields_after(|d| {
                d.limits[0].period = "custom".into();
                d.limits[0].seconds = "0".into();
            }),
            ["limits[0].period"]
        );
        assert_eq!(
            fields_after(|d| d.limits[0].burst = "0".into()),
            ["limits[0].burst"]
        );
        assert_eq!(fields_after(|d| d.limits.clear()), ["limits"]);
        assert_eq!(fields_after(|d| d.cost_fixed = "0".into()), ["cost.fixed"]);
        assert_eq!(
            fields_after(|d| {
                d.cost_kind = "header".into();
                d.cost_header = "bad name".into();
            }),
            ["cost.header.name"]
        );
        assert_eq!(
            fields_after(|d| {
                d.overrides.push(OverrideDraft {
                    client: String::new(),
                    limits: vec![LimitDraft {
                        requests: "0".into(),
                        ..LimitDraft::from_spec(None)
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
}
