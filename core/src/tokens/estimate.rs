//! The tokens a request is expected to use, what a limit charges for them, and one
//! bucket's change when the usage is known.

use crate::rule::{Counts, Limit, TokenBudget};
use crate::usage::UsageMeasure;

use super::body::{BYTES_PER_INPUT_TOKEN, BodyFacts};

/// The tokens a request is expected to use, before its response says.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokenEstimate {
    pub input: u64,
    pub output: u64,
}

impl TokenEstimate {
    /// The estimate for a rule's budget: output from the body's maximum, else the rule's
    /// default; input from the body's size where the rule opts in.
    pub fn of(budget: &TokenBudget, facts: &BodyFacts) -> TokenEstimate {
        TokenEstimate {
            input: if budget.estimate_input_from_body {
                facts.bytes / BYTES_PER_INPUT_TOKEN
            } else {
                0
            },
            output: facts.max_output.unwrap_or(budget.default_estimate),
        }
    }

    /// The raw estimate of one measure.
    pub fn count(&self, measure: UsageMeasure) -> u64 {
        match measure {
            UsageMeasure::Input => self.input,
            UsageMeasure::Output => self.output,
            UsageMeasure::Total => self.input.saturating_add(self.output),
        }
    }

    /// The whole estimate, input and output (what a throttled request's statistics count).
    pub fn total(&self) -> u64 {
        self.count(UsageMeasure::Total)
    }

    /// What a token limit reserves: the estimate, at least 1 (so an empty bucket refuses)
    /// and at most the limit's burst (so a large request still fits a full bucket; the
    /// rest is charged as debt when its usage is known).
    pub fn reserve(&self, measure: UsageMeasure, limit: &Limit) -> u64 {
        self.count(measure).clamp(1, limit.burst.max(1))
    }
}

/// What a limit charges a request: the rule's cost for a request limit, the reservation
/// for a token limit.
pub fn cost_of(limit: &Limit, requests: u64, tokens: &TokenEstimate) -> u64 {
    match limit.counts {
        Counts::Requests => requests,
        Counts::Tokens(measure) => tokens.reserve(measure, limit),
    }
}

/// One token bucket's change: from `reserved` to `used` tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenChange {
    pub limit: Limit,
    pub reserved: u64,
    pub used: u64,
}
