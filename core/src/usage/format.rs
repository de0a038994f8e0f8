//! Where a response reports its usage: the formats rules name, and RFC 6901 pointers for
//! any other JSON.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// Where a response reports its usage. Rules files name these (`openai_chat`,
/// `openai_responses`, `anthropic_messages`, `json_pointer: {input, output, total}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UsageFormat {
    /// OpenAI Chat Completions (and the many servers that copy it).
    #[serde(rename = "openai_chat")]
    OpenAiChat,
    /// The OpenAI Responses API.
    #[serde(rename = "openai_responses")]
    OpenAiResponses,
    /// The Anthropic Messages API.
    AnthropicMessages,
    /// Any other JSON: where each figure is, as RFC 6901 pointers.
    JsonPointer(PointerSet),
}

/// The pointers of [`UsageFormat::JsonPointer`]: at least one is given.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "PointerSetSpec")]
pub struct PointerSet {
    #[serde(skip_serializing_if = "Option::is_none")]
    input: Option<JsonPointer>,
    #[serde(skip_serializing_if = "Option::is_none")]
    output: Option<JsonPointer>,
    #[serde(skip_serializing_if = "Option::is_none")]
    total: Option<JsonPointer>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PointerSetSpec {
    #[serde(default)]
    input: Option<JsonPointer>,
    #[serde(default)]
    output: Option<JsonPointer>,
    #[serde(default)]
    total: Option<JsonPointer>,
}

impl TryFrom<PointerSetSpec> for PointerSet {
    type Error = InvalidPointer;

    fn try_from(spec: PointerSetSpec) -> Result<Self, InvalidPointer> {
        PointerSet::new(spec.input, spec.output, spec.total)
    }
}

impl PointerSet {
    /// The pointers, or [`InvalidPointer::NoneGiven`] when all three are absent.
    pub fn new(
        input: Option<JsonPointer>,
        output: Option<JsonPointer>,
        total: Option<JsonPointer>,
    ) -> Result<Self, InvalidPointer> {
        if input.is_none() && output.is_none() && total.is_none() {
            return Err(InvalidPointer::NoneGiven);
        }
        Ok(PointerSet {
            input,
            output,
            total,
        })
    }

    pub fn input(&self) -> Option<&JsonPointer> {
        self.input.as_ref()
    }

    pub fn output(&self) -> Option<&JsonPointer> {
        self.output.as_ref()
    }

    pub fn total(&self) -> Option<&JsonPointer> {
        self.total.as_ref()
    }
}

/// An RFC 6901 JSON pointer, checked once: empty (the whole document) or `/`-separated
/// reference tokens where `~` only appears as `~0` or `~1`. Cheap to clone, since every
/// request's reader holds its rule's pointers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct JsonPointer(Arc<str>);

impl JsonPointer {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for JsonPointer {
    type Error = InvalidPointer;

    fn try_from(text: String) -> Result<Self, InvalidPointer> {
        JsonPointer::try_from(text.as_str())
    }
}

impl TryFrom<&str> for JsonPointer {
    type Error = InvalidPointer;

    fn try_from(text: &str) -> Result<Self, InvalidPointer> {
        if !text.is_empty() && !text.starts_with('/') {
            return Err(InvalidPointer::NoLeadingSlash(text.to_owned()));
        }
        let mut chars = text.chars();
        while let Some(c) = chars.next() {
            if c == '~' && !matches!(chars.next(), Some('0' | '1')) {
                return Err(InvalidPointer::BadEscape(text.to_owned()));
            }
        }
        Ok(JsonPointer(Arc::from(text)))
    }
}

impl From<JsonPointer> for String {
    fn from(pointer: JsonPointer) -> String {
        pointer.0.as_ref().to_owned()
    }
}

impl fmt::Display for JsonPointer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why a pointer (or a set of them) was refused at the edge.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidPointer {
    #[error("JSON pointer {0:?} must be empty or start with '/' (RFC 6901)")]
    NoLeadingSlash(String),
    #[error("JSON pointer {0:?} has a '~' not followed by 0 or 1 (RFC 6901)")]
    BadEscape(String),
    #[error("json_pointer needs at least one of input, output and total")]
    NoneGiven,
}
