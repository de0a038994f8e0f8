//! A token budget's inputs (the rule's `tokens` section): where usage is read, what a
//! request reserves, and the two opt-ins. The section applies only while some limit counts
//! tokens; its inputs keep what was typed while none does.

use sluice_core::spec::{TokensSpec, UsageSpec};
use sluice_core::usage::{JsonPointer, PointerSet};

use super::FieldError;
use super::choice::Choice;
use super::number::{Number, Numbers};

/// Where a response reports its usage: [`UsageSpec`] without the pointers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UsageKind {
    OpenAi,
    Anthropic,
    JsonPointer,
}

/// The usage `<select>`: nothing picked yet (`None`, which the API refuses with its own
/// message once a limit counts tokens), or a kind, named as on the wire.
impl Choice for Option<UsageKind> {
    const ALL: &'static [Self] = &[
        None,
        Some(UsageKind::OpenAi),
        Some(UsageKind::Anthropic),
        Some(UsageKind::JsonPointer),
    ];

    fn value(self) -> &'static str {
        match self {
            None => "",
            Some(UsageKind::OpenAi) => "openai",
            Some(UsageKind::Anthropic) => "anthropic",
            Some(UsageKind::JsonPointer) => "json_pointer",
        }
    }
}

/// The token budget's inputs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokensDraft {
    pub usage: Option<UsageKind>,
    /// RFC 6901 pointers for [`UsageKind::JsonPointer`]; empty ones are left out.
    pub input_pointer: String,
    pub output_pointer: String,
    pub total_pointer: String,
    pub default_estimate: Number<u64>,
    pub estimate_input_from_body: bool,
    pub include_usage: bool,
}

impl Default for TokensDraft {
    fn default() -> TokensDraft {
        TokensDraft::from_spec(None)
    }
}

impl TokensDraft {
    /// The inputs that show `spec` (`None`: a rule without token limits yet).
    pub fn from_spec(spec: Option<&TokensSpec>) -> TokensDraft {
        let pointer = |p: Option<&JsonPointer>| p.map(|p| p.as_str().to_string());
        let (usage, pointers) = match spec.map(|s| &s.usage) {
            None => (None, None),
            Some(UsageSpec::OpenAi) => (Some(UsageKind::OpenAi), None),
            Some(UsageSpec::Anthropic) => (Some(UsageKind::Anthropic), None),
            Some(UsageSpec::JsonPointer(set)) => (Some(UsageKind::JsonPointer), Some(set)),
        };
        TokensDraft {
            usage,
            input_pointer: pointer(pointers.and_then(PointerSet::input)).unwrap_or_default(),
            output_pointer: pointer(pointers.and_then(PointerSet::output)).unwrap_or_default(),
            total_pointer: pointer(pointers.and_then(PointerSet::total)).unwrap_or_default(),
            default_estimate: spec
                .map(|s| Number::from(s.default_estimate))
                .unwrap_or_default(),
            estimate_input_from_body: spec.is_some_and(|s| s.estimate_input_from_body),
            include_usage: spec.is_some_and(|s| s.include_usage),
        }
    }

    /// The section the inputs describe, given whether any limit counts tokens (none: no
    /// section). No usage picked, or a pointer set with no pointer that parses, gives no
    /// section either, which the core then refuses with its own message (`tokens: is
    /// required when a limit counts tokens...`). Pointers that do not parse are the
    /// form's problems, at the field of their input.
    pub(super) fn to_spec(&self, counts_tokens: bool, numbers: &mut Numbers) -> Option<TokensSpec> {
        if !counts_tokens {
            return None;
        }
        let usage = match self.usage? {
            UsageKind::OpenAi => UsageSpec::OpenAi,
            UsageKind::Anthropic => UsageSpec::Anthropic,
            UsageKind::JsonPointer => UsageSpec::JsonPointer(self.pointers(numbers)?),
        };
        let default_estimate = numbers
            .required(&self.default_estimate, "tokens.default_estimate")
            .unwrap_or(0);
        Some(TokensSpec {
            usage,
            default_estimate,
            estimate_input_from_body: self.estimate_input_from_body,
            include_usage: self.include_usage,
        })
    }

    /// The pointers that parse; `None` when none does.
    fn pointers(&self, numbers: &mut Numbers) -> Option<PointerSet> {
        let mut read = |text: &str, name: &str| {
            let text = text.trim();
            if text.is_empty() {
                return None;
            }
            JsonPointer::try_from(text)
                .map_err(|e| {
                    numbers.problems.push(FieldError {
                        field: pointer_field(name),
                        message: e.to_string(),
                    });
                })
                .ok()
        };
        let input = read(&self.input_pointer, "input");
        let output = read(&self.output_pointer, "output");
        let total = read(&self.total_pointer, "total");
        PointerSet::new(input, output, total).ok()
    }
}

/// The field path of one usage pointer's input (`input`, `output` or `total`).
pub fn pointer_field(name: &str) -> String {
    format!("tokens.usage.json_pointer.{name}")
}

#[cfg(test)]
mod tests {
    use super::super::choice::tests::options_round_trip;
    use super::*;

    fn spec(json: &str) -> TokensSpec {
        serde_json::from_str(json).unwrap()
    }

    fn read(draft: &TokensDraft) -> (Option<TokensSpec>, Vec<String>) {
        let mut numbers = Numbers::default();
        let spec = draft.to_spec(true, &mut numbers);
        let problems = numbers
            .problems
            .into_iter()
            .map(|p| format!("{}: {}", p.field, p.message))
            .collect();
        (spec, problems)
    }

    #[test]
    fn usage_options_are_the_wire_names() {
        options_round_trip::<Option<UsageKind>>();
        for (json, kind) in [
            (
                r#"{"usage":"openai","default_estimate":1}"#,
                UsageKind::OpenAi,
            ),
            (
                r#"{"usage":"anthropic","default_estimate":1}"#,
                UsageKind::Anthropic,
            ),
            (
                r#"{"usage":{"json_pointer":{"total":"/t"}},"default_estimate":1}"#,
                UsageKind::JsonPointer,
            ),
        ] {
            let tokens = spec(json);
            let wire = serde_json::to_value(&tokens.usage).unwrap();
            let name = match &wire {
                serde_json::Value::String(s) => s.clone(),
                serde_json::Value::Object(o) => o.keys().next().unwrap().clone(),
                other => panic!("{other}"),
            };
            assert_eq!(Some(kind).value(), name);
            assert_eq!(TokensDraft::from_spec(Some(&tokens)).usage, Some(kind));
        }
    }

    #[test]
    fn every_setting_survives_the_inputs() {
        for json in [
            r#"{"usage":"openai","default_estimate":1000,"include_usage":true}"#,
            r#"{"usage":"anthropic","default_estimate":0,"estimate_input_from_body":true}"#,
            r#"{"usage":{"json_pointer":{"input":"/u/in","output":"/u/out","total":"/u/a~1b"}},"default_estimate":5}"#,
            r#"{"usage":{"json_pointer":{"output":"/usage/completion"}},"default_estimate":7}"#,
        ] {
            let tokens = spec(json);
            let (back, problems) = read(&TokensDraft::from_spec(Some(&tokens)));
            assert!(problems.is_empty(), "{problems:?}");
            assert_eq!(back, Some(tokens), "{json}");
        }
    }

    #[test]
    fn without_a_token_limit_there_is_no_section_and_the_inputs_stay() {
        let draft =
            TokensDraft::from_spec(Some(&spec(r#"{"usage":"openai","default_estimate":9}"#)));
        let mut numbers = Numbers::default();
        assert_eq!(draft.to_spec(false, &mut numbers), None);
        assert!(numbers.problems.is_empty());
        assert_eq!(draft.default_estimate.text(), "9", "kept for when one does");
        let blank = TokensDraft::default();
        assert_eq!(blank.usage, None);
        assert_eq!(blank.default_estimate.text(), "");
    }

    #[test]
    fn a_missing_usage_or_pointer_set_leaves_the_section_out_for_the_core_to_refuse() {
        let mut draft = TokensDraft {
            default_estimate: Number::from(1),
            ..TokensDraft::default()
        };
        assert_eq!(read(&draft), (None, vec![]));
        draft.usage = Some(UsageKind::JsonPointer);
        draft.input_pointer = "  ".into();
        assert_eq!(read(&draft), (None, vec![]), "no pointer given");
    }

    #[test]
    fn a_pointer_that_does_not_parse_is_named_by_its_input() {
        let draft = TokensDraft {
            usage: Some(UsageKind::JsonPointer),
            input_pointer: "usage/in".into(),
            output_pointer: " /usage/out ".into(),
            total_pointer: "/bad~2".into(),
            default_estimate: Number::parse(""),
            ..TokensDraft::default()
        };
        let (spec, problems) = read(&draft);
        assert_eq!(
            problems,
            [
                r#"tokens.usage.json_pointer.input: JSON pointer "usage/in" must be empty or start with '/' (RFC 6901)"#,
                r#"tokens.usage.json_pointer.total: JSON pointer "/bad~2" has a '~' not followed by 0 or 1 (RFC 6901)"#,
                "tokens.default_estimate: is required",
            ]
        );
        let spec = spec.unwrap();
        let UsageSpec::JsonPointer(set) = &spec.usage else {
            panic!("{spec:?}");
        };
        assert_eq!(set.output().map(JsonPointer::as_str), Some("/usage/out"));
        assert_eq!(set.input(), None);
    }
}
