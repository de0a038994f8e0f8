//! What reading a body answers: the figures reported, or why they are unknown.

use serde::{Deserialize, Serialize};

/// The figures a response reported; a figure it did not report is `None`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub input: Option<u64>,
    pub output: Option<u64>,
    /// As reported; [`Usage::count`] derives it from the other two when absent.
    pub total: Option<u64>,
}

impl Usage {
    /// The count a limit charges, or `None` when the response did not report it. A total
    /// not reported is `input + output` when both are.
    pub fn count(&self, measure: UsageMeasure) -> Option<u64> {
        match measure {
            UsageMeasure::Input => self.input,
            UsageMeasure::Output => self.output,
            UsageMeasure::Total => self.total.or_else(|| self.input?.checked_add(self.output?)),
        }
    }

    /// [`Usage::count`], with an unreported count as [`UsageError::Missing`].
    pub fn require(&self, measure: UsageMeasure) -> Result<u64, UsageError> {
        self.count(measure).ok_or(UsageError::Missing)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.input.is_none() && self.output.is_none() && self.total.is_none()
    }
}

/// Which of a response's figures a token limit counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UsageMeasure {
    Input,
    Output,
    #[default]
    Total,
}

/// Why a response's usage is unknown. Each has a stable [`UsageError::name`] for a metric
/// label; the caller charges the reservation whatever the reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum UsageError {
    /// The body was read whole and reported no usage (an error body, or a stream that
    /// ended properly without a usage event, e.g. `include_usage` not set).
    #[error("the response reported no usage")]
    Missing,
    /// The body, or an event that could carry usage, is not the JSON expected: broken
    /// syntax, a figure that is not an integer (a string, a fraction), a usage that is not
    /// an object.
    #[error("the response's usage could not be parsed")]
    Malformed,
    /// A figure is negative or above [`MAX_TOKENS`](super::MAX_TOKENS).
    #[error("a usage figure is negative or above the largest believed")]
    OutOfRange,
    /// A bound was hit: the JSON body is over [`MAX_JSON_BODY_BYTES`], nesting is deeper
    /// than [`MAX_JSON_DEPTH`], or an event that could carry usage was over
    /// [`MAX_SSE_LINE_BYTES`] / [`MAX_SSE_EVENT_BYTES`] and skipped.
    ///
    /// [`MAX_JSON_BODY_BYTES`]: super::MAX_JSON_BODY_BYTES
    /// [`MAX_JSON_DEPTH`]: super::MAX_JSON_DEPTH
    /// [`MAX_SSE_LINE_BYTES`]: super::MAX_SSE_LINE_BYTES
    /// [`MAX_SSE_EVENT_BYTES`]: super::MAX_SSE_EVENT_BYTES
    #[error("the response exceeded a bound of the usage reader")]
    TooLarge,
    /// The stream ended (or was abandoned) before its final usage event.
    #[error("the stream ended before its final usage event")]
    Incomplete,
}

impl UsageError {
    /// Every reason, for registering metrics up front.
    pub const ALL: [UsageError; 5] = [
        UsageError::Missing,
        UsageError::Malformed,
        UsageError::OutOfRange,
        UsageError::TooLarge,
        UsageError::Incomplete,
    ];

    /// A short, stable name for a metric label.
    pub fn name(self) -> &'static str {
        match self {
            UsageError::Missing => "missing",
            UsageError::Malformed => "malformed",
            UsageError::OutOfRange => "out_of_range",
            UsageError::TooLarge => "too_large",
            UsageError::Incomplete => "incomplete",
        }
    }
}
