//! The inputs that choose which requests a rule applies to: host, paths, methods and
//! header conditions.

use sluice_core::spec::{HeaderMatchSpec, MatchSpec, ValueMatchSpec};

use super::choice::Choice;

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
            condition: match (spec.present, &spec.equals) {
                (_, Some(_)) => HeaderCondition::Equals,
                (Some(false), None) => HeaderCondition::Absent,
                _ => HeaderCondition::Present,
            },
            value: spec.equals.clone().unwrap_or_default(),
        }
    }

    fn to_spec(&self) -> HeaderMatchSpec {
        let (present, equals) = match self.condition {
            HeaderCondition::Present => (Some(true), None),
            HeaderCondition::Absent => (Some(false), None),
            // A header value is compared as typed, spaces included.
            HeaderCondition::Equals => (None, Some(self.value.clone())),
        };
        HeaderMatchSpec {
            name: self.name.trim().to_string(),
            present,
            equals,
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
    /// Conditions on claims, cookies and certificate fields: no input shows them yet;
    /// kept as loaded, so saving the form does not drop them.
    pub values: Vec<ValueMatchSpec>,
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
            values: spec.values.clone(),
        }
    }

    pub(super) fn to_spec(&self) -> MatchSpec {
        MatchSpec {
            host: nonempty(&self.host),
            path_exact: nonempty(&self.path_exact),
            path_prefix: nonempty(&self.path_prefix),
            path_regex: nonempty(&self.path_regex),
            methods: methods(&self.methods),
            headers: self.headers.iter().map(HeaderDraft::to_spec).collect(),
            values: self.values.clone(),
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
        let spec = draft.to_spec();
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
}
