//! A JSON (not streamed) body: held up to its cap, parsed once at the end.

use serde_json::Value;

use super::bounds::{MAX_JSON_BODY_BYTES, extend_capped};
use super::depth::DepthGauge;
use super::fields::{self, ANTHROPIC_FIELDS, CHAT_FIELDS, FieldNames, RESPONSES_FIELDS};
use super::format::UsageFormat;
use super::outcome::{Usage, UsageError};

#[derive(Debug)]
pub(super) struct JsonBody {
    format: UsageFormat,
    bytes: Vec<u8>,
    /// Measured as bytes arrive, so a too-deep body stops being held at once.
    depth: DepthGauge,
    refused: bool,
}

impl JsonBody {
    pub(super) fn new(format: UsageFormat) -> JsonBody {
        JsonBody {
            format,
            bytes: Vec::new(),
            depth: DepthGauge::default(),
            refused: false,
        }
    }

    pub(super) fn feed(&mut self, chunk: &[u8]) {
        if self.refused {
            return;
        }
        let fits = self.bytes.len().saturating_add(chunk.len()) <= MAX_JSON_BODY_BYTES;
        if !fits || !self.depth.feed(chunk) {
            // Past a bound the answer is known: drop what was held.
            self.refused = true;
            self.bytes = Vec::new();
            return;
        }
        extend_capped(&mut self.bytes, chunk, MAX_JSON_BODY_BYTES);
    }

    pub(super) fn finish(self) -> Result<Usage, UsageError> {
        if self.refused {
            return Err(UsageError::TooLarge);
        }
        let usage = match &self.format {
            UsageFormat::OpenAiChat => provider_usage(&self.bytes, CHAT_FIELDS)?,
            UsageFormat::OpenAiResponses => provider_usage(&self.bytes, RESPONSES_FIELDS)?,
            UsageFormat::AnthropicMessages => provider_usage(&self.bytes, ANTHROPIC_FIELDS)?,
            UsageFormat::JsonPointer(pointers) => {
                let document: Value = fields::parse(&self.bytes)?;
                fields::read_pointers(&document, pointers)?
            }
        };
        usage
            .filter(|usage| *usage != Usage::default())
            .ok_or(UsageError::Missing)
    }

    pub(super) fn retained_capacity(&self) -> usize {
        self.bytes.capacity()
    }
}

/// A provider's body: its top-level `usage`.
fn provider_usage(bytes: &[u8], names: FieldNames) -> Result<Option<Usage>, UsageError> {
    let envelope = fields::parse_envelope(bytes)?;
    match &envelope.usage {
        Some(usage) => fields::read_usage(usage, names),
        None => Ok(None),
    }
}
