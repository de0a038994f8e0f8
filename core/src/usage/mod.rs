//! Reading LLM token usage from a response body as it passes (issue #29).
//!
//! A token budget reserves an estimate when a request arrives and commits the real usage
//! when its response ends. This module is the second half's reader: fed the response body
//! chunk by chunk, it answers the provider's reported [`Usage`] or, when that cannot be
//! trusted, a [`UsageError`] whose [`UsageError::name`] labels a metric (the caller then
//! charges the reservation).
//!
//! Nothing reads it yet: the filter wires it in next.
//!
//! # Shapes read
//!
//! | [`UsageFormat`] | JSON body | streamed (`text/event-stream`) |
//! | --- | --- | --- |
//! | `openai_chat` | `usage.prompt_tokens`, `completion_tokens`, `total_tokens` | the one chunk whose `usage` is not `null`, sent before `data: [DONE]` when the request set `stream_options.include_usage` |
//! | `openai_responses` | `usage.input_tokens`, `output_tokens`, `total_tokens` | `response.usage` of the terminal `response.completed` (or `response.incomplete` / `response.failed`) event; there is no `[DONE]` |
//! | `anthropic_messages` | `usage.input_tokens`, `output_tokens` | `message_start`'s `message.usage` (input, and output so far), then each `message_delta`'s `usage` (cumulative: the latest wins; an `input_tokens` there replaces the start's) |
//! | `json_pointer` | RFC 6901 pointers into the body | the same pointers into each event's data; the latest event where one resolves wins |
//!
//! The provider documentation these follow:
//! * OpenAI Chat Completions, streaming and `stream_options.include_usage` ("an additional
//!   chunk will be streamed before the `data: [DONE]` message ... the `choices` field will
//!   always be an empty array. All other chunks will also include a `usage` field, but
//!   with a null value"): <https://platform.openai.com/docs/api-reference/chat/create>,
//!   <https://platform.openai.com/docs/api-reference/chat/streaming>.
//! * OpenAI Responses API streaming events (`response.completed` carries the whole
//!   `Response`, `usage` included): <https://developers.openai.com/api/reference/resources/responses/streaming-events>,
//!   <https://developers.openai.com/api/docs/guides/streaming-responses>.
//! * Anthropic streaming Messages (`message_start`, `content_block_*`, `ping`,
//!   `message_delta` with cumulative `usage`, `message_stop`, `error`):
//!   <https://platform.claude.com/docs/en/build-with-claude/streaming> (formerly
//!   <https://docs.anthropic.com/en/docs/build-with-claude/streaming>).
//! * Server-sent events framing (line endings, `:` comments, `event:`, multi-line `data:`,
//!   an unterminated event at the end is discarded):
//!   <https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation>.
//!
//! Servers that copy these shapes vary in ways the reader tolerates: a chat usage chunk
//! whose `choices` is `null` or absent (vLLM), usage in every chunk, cumulative (the
//! latest wins), events without `event:` lines (judged by their data's `type`).
//!
//! Anthropic's `cache_creation_input_tokens` and `cache_read_input_tokens` are not added to
//! `input`: they are priced differently, and whether a budget counts them is the rule's
//! decision, not the reader's.
//!
//! # Bounds
//!
//! Hostile or broken upstreams get a budget, and memory does not grow with the stream:
//! * a JSON body is buffered up to [`MAX_JSON_BODY_BYTES`], then dropped ([`UsageError::TooLarge`]);
//! * an event stream is framed line by line and never buffered whole: a line is held up to
//!   [`MAX_SSE_LINE_BYTES`] and one event's data up to [`MAX_SSE_EVENT_BYTES`]; longer ones
//!   are skipped and counted ([`UsageReader::oversized`]), not buffered. Only the latest
//!   usage figures are kept;
//! * JSON nesting deeper than [`MAX_JSON_DEPTH`] is refused before serde_json sees it
//!   (serde_json's own recursion limit is 128, so it never becomes the bound);
//! * a count above [`MAX_TOKENS`] is [`UsageError::OutOfRange`].
//!
//! Architecture invariant: no I/O, no clock, no threads; the same code runs in the filter
//! (wasm32) and in native tests. No input makes it panic.

mod depth;
mod fields;
mod json;
mod sse;

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use self::json::JsonBody;
use self::sse::EventStream;

/// The most bytes of a JSON (not streamed) body held for parsing. Usage sits beside the
/// whole answer in these bodies, so the cap is the answer's size; 1 MiB is several
/// hundred thousand tokens of text.
pub const MAX_JSON_BODY_BYTES: usize = 1 << 20;

/// The longest server-sent-events line held. A longer line is skipped and counted, and
/// the event it belongs to is dropped.
pub const MAX_SSE_LINE_BYTES: usize = 256 << 10;

/// The most data one server-sent event may carry (its `data:` lines joined). A longer
/// event is dropped and counted.
pub const MAX_SSE_EVENT_BYTES: usize = 256 << 10;

/// The deepest JSON nesting (objects and arrays) parsed. Provider bodies nest well under
/// ten levels; 64 keeps parsing cost linear and stays below serde_json's own recursion
/// limit of 128, which would otherwise report a deep document as a syntax error.
pub const MAX_JSON_DEPTH: u32 = 64;

/// The largest token count believed (2^40, about 1.1 × 10^12). No response comes near it
/// (context windows hold millions of tokens); a bigger figure is a broken upstream, and
/// refusing it keeps `input + output` and the budget arithmetic after it far from
/// overflow.
pub const MAX_TOKENS: u64 = 1 << 40;

/// Event names held in full; longer names cannot be ones the reader looks for.
pub const MAX_EVENT_NAME_BYTES: usize = 64;

/// The most buffer an event-stream reader holds at any moment: one line, one event's
/// data and one event name ([`UsageReader::retained_capacity`]).
pub const MAX_SSE_RETAINED_BYTES: usize =
    MAX_SSE_LINE_BYTES + MAX_SSE_EVENT_BYTES + MAX_EVENT_NAME_BYTES;

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

    fn is_empty(&self) -> bool {
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
    /// A figure is negative or above [`MAX_TOKENS`].
    #[error("a usage figure is negative or above the largest believed")]
    OutOfRange,
    /// A bound was hit: the JSON body is over [`MAX_JSON_BODY_BYTES`], nesting is deeper
    /// than [`MAX_JSON_DEPTH`], or an event that could carry usage was over
    /// [`MAX_SSE_LINE_BYTES`] / [`MAX_SSE_EVENT_BYTES`] and skipped.
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

/// How the body is framed, from the response's content type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyKind {
    /// One JSON document (any content type but an event stream, or none).
    Json,
    /// `text/event-stream`.
    EventStream,
}

impl BodyKind {
    /// `text/event-stream` (any case, any parameters) is an event stream; anything else,
    /// or no content type, is read as JSON.
    pub fn from_content_type(content_type: Option<&str>) -> BodyKind {
        let media_type = content_type
            .and_then(|value| value.split(';').next())
            .map(str::trim)
            .unwrap_or("");
        if media_type.eq_ignore_ascii_case("text/event-stream") {
            BodyKind::EventStream
        } else {
            BodyKind::Json
        }
    }
}

/// Reads one response's usage from its body chunks: [`UsageReader::feed`] each chunk as
/// it passes, in order, then [`UsageReader::finish`] when the body ends (or is
/// abandoned). Chunks may split the body anywhere (mid-line, mid-UTF-8 character); the
/// answer is the same however they fall.
#[derive(Debug)]
pub struct UsageReader {
    body: Body,
}

#[derive(Debug)]
enum Body {
    Json(JsonBody),
    EventStream(EventStream),
}

impl UsageReader {
    /// A reader for a response in `format`, framed as its `content-type` header says.
    pub fn new(format: UsageFormat, content_type: Option<&str>) -> UsageReader {
        let body = match BodyKind::from_content_type(content_type) {
            BodyKind::Json => Body::Json(JsonBody::new(format)),
            BodyKind::EventStream => Body::EventStream(EventStream::new(format)),
        };
        UsageReader { body }
    }

    pub fn body_kind(&self) -> BodyKind {
        match self.body {
            Body::Json(_) => BodyKind::Json,
            Body::EventStream(_) => BodyKind::EventStream,
        }
    }

    /// Reads the next chunk of the body.
    pub fn feed(&mut self, chunk: &[u8]) {
        match &mut self.body {
            Body::Json(body) => body.feed(chunk),
            Body::EventStream(stream) => stream.feed(chunk),
        }
    }

    /// The usage the body reported, or why it is unknown. Call it at the end of the body,
    /// or when the response is abandoned (a stream cut off is [`UsageError::Incomplete`]).
    pub fn finish(self) -> Result<Usage, UsageError> {
        match self.body {
            Body::Json(body) => body.finish(),
            Body::EventStream(stream) => stream.finish(),
        }
    }

    /// How many lines or events were skipped for exceeding [`MAX_SSE_LINE_BYTES`] or
    /// [`MAX_SSE_EVENT_BYTES`] (always 0 for a JSON body), for a metric.
    pub fn oversized(&self) -> u64 {
        match &self.body {
            Body::Json(_) => 0,
            Body::EventStream(stream) => stream.oversized(),
        }
    }

    /// The bytes of buffer the reader holds now: at most [`MAX_JSON_BODY_BYTES`] for a
    /// JSON body and [`MAX_SSE_RETAINED_BYTES`] for an event stream, whatever the body's
    /// length.
    pub fn retained_capacity(&self) -> usize {
        match &self.body {
            Body::Json(body) => body.retained_capacity(),
            Body::EventStream(stream) => stream.retained_capacity(),
        }
    }
}

/// Appends `bytes` to `buffer`, whose length the caller has kept within `cap`: grows it as
/// `Vec` would (doubling), but never to a capacity past `cap`, so a bound on length is a
/// bound on memory.
fn extend_capped(buffer: &mut Vec<u8>, bytes: &[u8], cap: usize) {
    let needed = buffer.len().saturating_add(bytes.len());
    if needed > buffer.capacity() {
        let grown = buffer.capacity().saturating_mul(2).min(cap).max(needed);
        buffer.reserve_exact(grown - buffer.len());
    }
    buffer.extend_from_slice(bytes);
}

#[cfg(test)]
mod tests;
