//! The inputs that choose which requests a rule applies to: host, paths, methods, header
//! conditions, and conditions on values read as keys are (a JWT claim, a cookie...).

use sluice_core::spec::{HeaderMatchSpec, KeySpec, MatchSpec, ValueMatchSpec};

use super::choice::Choice;
use super::key::{KeyDraft, KeyKind, form_shows};
use super::number::Numbers;

/// What a header condition asks of its header: `HeaderMatchSpec`'s `present` and
/// `equals` as the one choice the form offers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum HeaderCondition {
    #[default]
    Present,
    Absent,
    Equals,
}

impl Choice for HeaderCondition {
    const ALL: &'static [Self] = &[
        HeaderCondition::Present,
        HeaderCondition::Absent,
        HeaderCondition::Equals,
    ];

    fn value(self) -> &'static str {
        match self {
            HeaderCondition::Present => "present",
            HeaderCondition::Absent => "absent",
            HeaderCondition::Equals => "equals",
        }
    }
}

/// One header condition's inputs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeaderDraft {
    pub name: String,
    pub condition: HeaderCondition,
    /// Read only for [`HeaderCondition::Equals`], kept while another is picked.
    pub value: String,
}

impl HeaderDraft {
    fn from_spec(spec: &HeaderMatchSpec) -> HeaderDraft {
        HeaderDraft {
            name: spec.name.clone(),
            condition: condition(spec.present, spec.equals.as_ref()),
            value: spec.equals.clone().unwrap_or_default(),
        }
    }

    fn to_spec(&self) -> HeaderMatchSpec {
        let (present, equals) = self.condition.to_spec(&self.value);
        HeaderMatchSpec {
            name: self.name.trim().to_string(),
            present,
            equals,
        }
    }
}

/// One `match.values` condition's inputs: where the value is read (the key inputs, any
/// kind but composite), and what it asks of it (as a header condition does).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValueDraft {
    pub source: KeyDraft,
    pub condition: HeaderCondition,
    /// Read only for [`HeaderCondition::Equals`], kept while another is picked.
    pub value: String,
}

impl Default for ValueDraft {
    /// A claim of a verified JWT, which is what value conditions are mostly for.
    fn default() -> ValueDraft {
        ValueDraft {
            source: KeyDraft {
                kind: KeyKind::Metadata,
                metadata_filter: "envoy.filters.http.jwt_authn".into(),
                ..KeyDraft::default()
            },
            condition: HeaderCondition::Equals,
            value: String::new(),
        }
    }
}

impl ValueDraft {
    fn from_spec(spec: &ValueMatchSpec) -> ValueDraft {
        ValueDraft {
            source: KeyDraft::from_spec(&spec.value),
            condition: condition(spec.present, spec.equals.as_ref()),
            value: spec.equals.clone().unwrap_or_default(),
        }
    }

    fn to_spec(&self, numbers: &mut Numbers, i: usize) -> ValueMatchSpec {
        let (present, equals) = self.condition.to_spec(&self.value);
        ValueMatchSpec {
            value: self
                .source
                .to_spec_at(numbers, &format!("match.values[{i}].value")),
            present,
            equals,
        }
    }
}

/// Whether the form's inputs can show a value condition's source: one of the kinds a key
/// part can be, read back exactly.
pub fn value_form_shows(source: &KeySpec) -> bool {
    !matches!(source, KeySpec::Composite(_)) && form_shows(source)
}

/// The condition a `present` and an `equals` make.
fn condition(present: Option<bool>, equals: Option<&String>) -> HeaderCondition {
    match (present, equals) {
        (_, Some(_)) => HeaderCondition::Equals,
        (Some(false), None) => HeaderCondition::Absent,
        _ => HeaderCondition::Present,
    }
}

impl HeaderCondition {
    /// `present` and `equals` as the spec holds them; a value is compared as typed,
    /// spaces included.
    fn to_spec(self, value: &str) -> (Option<bool>, Option<String>) {
        match self {
            HeaderCondition::Present => (Some(true), None),
            HeaderCondition::Absent => (Some(false), None),
            HeaderCondition::Equals => (None, Some(value.to_string())),
        }
    }
}

/// The match's inputs; an empty text is no condition.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MatchDraft {
    pub host: String,
    pub path_prefix: String,
    pub path_exact: String,
    pub path_regex: String,
    /// Comma- or space-separated.
    pub methods: String,
    pub headers: Vec<HeaderDraft>,
    /// Conditions on claims, cookies, certificate fields and the other key sources.
    pub values: Vec<ValueDraft>,
}

impl MatchDraft {
    pub(super) fn from_spec(spec: &MatchSpec) -> MatchDraft {
        let text = |s: &Option<String>| s.clone().unwrap_or_default();
        MatchDraft {
            host: text(&spec.host),
            path_prefix: text(&spec.path_prefix),
            path_exact: text(&spec.path_exact),
            path_regex: text(&spec.path_regex),
            methods: spec.methods.join(", "),
            headers: spec.headers.iter().map(HeaderDraft::from_spec).collect(),
            values: spec.values.iter().map(ValueDraft::from_spec).collect(),
        }
    }

    /// Whether the inputs can show every condition of `spec` (a value condition reading a
    /// composite key, or a metadata path a text cannot hold, is edited as JSON).
    pub fn form_shows(spec: &MatchSpec) -> bool {
        spec.values.iter().all(|v| value_form_shows(&v.value))
    }

    pub(super) fn to_spec(&self, numbers: &mut Numbers) -> MatchSpec {
        MatchSpec {
            host: nonempty(&self.host),
            path_exact: nonempty(&self.path_exact),
            path_prefix: nonempty(&self.path_prefix),
            path_regex: nonempty(&self.path_regex),
            methods: methods(&self.methods),
            headers: self.headers.iter().map(HeaderDraft::to_spec).collect(),
            values: self
                .values
                .iter()
                .enumerate()
                .map(|(i, v)| v.to_spec(numbers, i))
                .collect(),
        }
    }
}

/// `text` trimmed, or `None` when that leaves nothing.
pub(super) fn nonempty(text: &str) -> Option<String> {
    let v = text.trim();
    (!v.is_empty()).then(|| v.to_string())
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

#[cfg(test)]
mod tests {
    use super::super::choice::tests::options_round_trip;
    use super::*;

    #[test]
    fn methods_are_split_and_upper_cased() {
        assert_eq!(methods(" get,post  Put "), ["GET", "POST", "PUT"]);
        assert_eq!(methods_field("get, p0st, 7"), "match.methods[1]");
        assert_eq!(methods_field("GET"), "match.methods[0]");
    }

    #[test]
    fn empty_texts_are_absent_and_header_conditions_keep_their_kind() {
        options_round_trip::<HeaderCondition>();
        let draft = MatchDraft {
            path_prefix: " /api/ ".into(),
            host: "  ".into(),
            headers: vec![
                HeaderDraft {
                    name: " x-a ".into(),
                    condition: HeaderCondition::Present,
                    value: "ignored".into(),
                },
                HeaderDraft {
                    name: "x-b".into(),
                    condition: HeaderCondition::Absent,
                    value: String::new(),
                },
                HeaderDraft {
                    name: "x-c".into(),
                    condition: HeaderCondition::Equals,
                    value: " v ".into(),
                },
            ],
            ..MatchDraft::default()
        };
        let spec = draft.to_spec(&mut Numbers::default());
        assert_eq!(spec.host, None);
        assert_eq!(spec.path_prefix.as_deref(), Some("/api/"));
        let headers: Vec<(&str, Option<bool>, Option<&str>)> = spec
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
        let back: Vec<HeaderCondition> = MatchDraft::from_spec(&spec)
            .headers
            .iter()
            .map(|h| h.condition)
            .collect();
        assert_eq!(
            back,
            [
                HeaderCondition::Present,
                HeaderCondition::Absent,
                HeaderCondition::Equals
            ]
        );
    }

    #[test]
    fn value_conditions_read_back_from_their_inputs() {
        let spec: MatchSpec = serde_json::from_str(
            r#"{"values":[
                {"value":{"metadata":{"filter":"envoy.filters.http.jwt_authn","path":["payload","plan"]}},"equals":"pro"},
                {"value":{"cookie":"beta"},"present":true},
                {"value":{"peer_certificate":"uri_san"},"present":false}]}"#,
        )
        .unwrap();
        assert!(MatchDraft::form_shows(&spec));
        let draft = MatchDraft::from_spec(&spec);
        let conditions: Vec<HeaderCondition> = draft.values.iter().map(|v| v.condition).collect();
        assert_eq!(
            conditions,
            [
                HeaderCondition::Equals,
                HeaderCondition::Present,
                HeaderCondition::Absent
            ]
        );
        assert_eq!(draft.values[0].source.metadata_path, "payload, plan");
        assert_eq!(draft.to_spec(&mut Numbers::default()), spec);
        // A new condition starts on a JWT claim; a bad number is named at its condition.
        let mut typed = draft.clone();
        typed.values.push(ValueDraft::default());
        typed.values[3].source.metadata_path = "tenant".into();
        typed.values[3].value = "acme".into();
        typed.values[1].source.kind = KeyKind::ClientIp;
        typed.values[1].source.hops = super::super::number::Number::parse("x");
        let mut numbers = Numbers::default();
        let out = typed.to_spec(&mut numbers);
        assert_eq!(
            serde_json::to_value(&out.values[3]).unwrap(),
            serde_json::json!({"value":{"metadata":{"filter":"envoy.filters.http.jwt_authn","path":["tenant"]}},"equals":"acme"})
        );
        assert_eq!(
            numbers.problems[0].field,
            "match.values[1].value.client_ip.trusted_hops"
        );
    }

    #[test]
    fn a_value_condition_on_a_composite_key_stays_in_json() {
        let spec: MatchSpec = serde_json::from_str(
            r#"{"values":[{"value":{"composite":[{"header":"a"},"path"]},"present":true}]}"#,
        )
        .unwrap();
        assert!(!MatchDraft::form_shows(&spec));
    }
}
