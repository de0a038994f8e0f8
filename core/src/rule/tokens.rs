//! A rule's token-budget settings: where usage is read and what a request reserves.

use crate::spec::{TokensSpec, UsageSpec};
use crate::usage::UsageFormat;
use crate::validation::Problems;

/// The largest `default_estimate`: more output than any model's context window holds.
pub const MAX_ESTIMATE: u64 = 10_000_000;

/// The validated `tokens` section of a rule with token limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenBudget {
    pub usage: UsageSpec,
    /// Output tokens reserved when the request names no maximum.
    pub default_estimate: u64,
    pub estimate_input_from_body: bool,
    pub include_usage: bool,
}

impl TokenBudget {
    /// Checks the section against the rule's limits: it is required exactly when some
    /// limit (the rule's or an override's) counts tokens.
    pub(super) fn build(
        spec: Option<&TokensSpec>,
        has_token_limits: bool,
        problems: &mut Problems,
    ) -> Option<TokenBudget> {
        let spec = match (spec, has_token_limits) {
            (Some(spec), true) => spec,
            (None, false) => return None,
            (None, true) => {
                problems.add(
                    "tokens",
                    "is required when a limit counts tokens: say where usage is read (`usage: openai`, `anthropic` or `json_pointer`) and the `default_estimate`",
                );
                return None;
            }
            (Some(_), false) => {
                problems.add(
                    "tokens",
                    "applies only to a rule with a token limit (`tokens: N` in a limit)",
                );
                return None;
            }
        };
        if spec.default_estimate > MAX_ESTIMATE {
            problems.add(
                "tokens.default_estimate",
                format!("must be between 0 and {MAX_ESTIMATE}"),
            );
        }
        if spec.include_usage && spec.usage != UsageSpec::OpenAi {
            problems.add(
                "tokens.include_usage",
                "applies only to `usage: openai` (OpenAI's `stream_options`)",
            );
        }
        Some(TokenBudget {
            usage: spec.usage.clone(),
            default_estimate: spec.default_estimate,
            estimate_input_from_body: spec.estimate_input_from_body,
            include_usage: spec.include_usage,
        })
    }

    /// The response shape to read for a request to `path`: `openai` is the Responses
    /// API for a path ending in `/responses` (query excluded), Chat Completions otherwise.
    pub fn format_for(&self, path: &str) -> UsageFormat {
        match &self.usage {
            UsageSpec::OpenAi => {
                let path = path.split(['?', '#']).next().unwrap_or(path);
                if path.trim_end_matches('/').ends_with("/responses") {
                    UsageFormat::OpenAiResponses
                } else {
                    UsageFormat::OpenAiChat
                }
            }
            UsageSpec::Anthropic => UsageFormat::AnthropicMessages,
            UsageSpec::JsonPointer(pointers) => UsageFormat::JsonPointer(pointers.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{errors, rule};
    use crate::rule::Counts;
    use crate::spec::UsageMeasure;
    use crate::usage::UsageFormat;

    const RULE: &str = r#"{"name":"llm","key":{"header":"x-api-key"},
        "limits":[{"requests":60,"period":"minute"},{"tokens":100000,"period":"minute","burst":150000},{"tokens":20000,"period":"minute","count":"output","scope":"global"}],
        "tokens":{"usage":"openai","default_estimate":1000}}"#;

    #[test]
    fn token_limits_sit_beside_request_limits() {
        let r = rule(RULE);
        let counts: Vec<Counts> = r.limits.iter().map(|l| l.counts).collect();
        assert_eq!(
            counts,
            [
                Counts::Requests,
                Counts::Tokens(UsageMeasure::Total),
                Counts::Tokens(UsageMeasure::Output)
            ]
        );
        assert_eq!(
            (r.limits[1].requests, r.limits[1].burst),
            (100_000, 150_000)
        );
        assert!(r.limits[2].global);
        let budget = r.tokens.as_ref().unwrap();
        assert_eq!(budget.default_estimate, 1000);
        assert_eq!(
            budget.format_for("/v1/chat/completions"),
            UsageFormat::OpenAiChat
        );
        assert_eq!(
            budget.format_for("/v1/responses?x=1"),
            UsageFormat::OpenAiResponses
        );
    }

    #[test]
    fn a_token_limit_and_a_request_limit_of_the_same_figures_are_two_buckets() {
        let r = rule(
            r#"{"name":"t","key":"global","limits":[{"requests":10,"period":1},{"tokens":10,"period":1}],
                "tokens":{"usage":"anthropic","default_estimate":5}}"#,
        );
        assert_ne!(r.limits[0].identity, r.limits[1].identity);
    }

    #[test]
    fn bad_token_settings_name_their_fields() {
        assert_eq!(
            errors(r#"{"name":"t","key":"global","limits":[{"tokens":10,"period":1}]}"#),
            [
                "tokens: is required when a limit counts tokens: say where usage is read (`usage: openai`, `anthropic` or `json_pointer`) and the `default_estimate`"
            ]
        );
        assert_eq!(
            errors(
                r#"{"name":"t","key":"global","limits":[{"requests":10,"period":1}],"tokens":{"usage":"openai","default_estimate":1}}"#
            ),
            ["tokens: applies only to a rule with a token limit (`tokens: N` in a limit)"]
        );
        assert_eq!(
            errors(
                r#"{"name":"t","key":"global","limits":[{"requests":10,"tokens":5,"period":1},{"period":1},{"requests":1,"period":1,"count":"input"},{"tokens":0,"period":1},{"tokens":5,"period":1}],
                    "tokens":{"usage":"anthropic","default_estimate":99999999999,"include_usage":true}}"#
            ),
            [
                "limits[0]: give either requests or tokens, not both",
                "limits[1].requests: is required (or `tokens`, for a token limit)",
                "limits[2].count: only a token limit (`tokens`) counts input, output or total",
                "limits[3].tokens: must be between 1 and 1000000000",
                "tokens.default_estimate: must be between 0 and 10000000",
                "tokens.include_usage: applies only to `usage: openai` (OpenAI's `stream_options`)",
            ]
        );
    }

    #[test]
    fn an_override_with_token_limits_needs_the_section_too() {
        assert_eq!(
            errors(
                r#"{"name":"t","key":{"header":"k"},"limits":[{"requests":10,"period":1}],"overrides":[{"client":"a","limits":[{"tokens":9,"period":1}]}]}"#
            ),
            [
                "tokens: is required when a limit counts tokens: say where usage is read (`usage: openai`, `anthropic` or `json_pointer`) and the `default_estimate`"
            ]
        );
    }
}
