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
//! The Responses API repeats the whole output in `response.completed`, beside `usage`: an
//! answer longer than [`MAX_SSE_EVENT_BYTES`] makes that event too large to hold, and the
//! reader answers [`UsageError::TooLarge`] (counted apart from a stream without usage).
//! Scanning such an event for `usage` as it passes, holding none of it, would lift that
//! limit; it waits until traffic shows it is needed.
//!
//! Architecture invariant: no I/O, no clock, no threads; the same code runs in the filter
//! (wasm32) and in native tests. No input makes it panic.

mod bounds;
mod depth;
mod fields;
mod format;
mod json;
mod outcome;
mod sse;

pub use self::bounds::{
    MAX_EVENT_NAME_BYTES, MAX_JSON_BODY_BYTES, MAX_JSON_DEPTH, MAX_SSE_EVENT_BYTES,
    MAX_SSE_LINE_BYTES, MAX_SSE_RETAINED_BYTES, MAX_TOKENS,
};
pub use self::format::{InvalidPointer, JsonPointer, PointerSet, UsageFormat};
pub use self::outcome::{Usage, UsageError, UsageMeasure};

use self::json::JsonBody;
use self::sse::EventStream;

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

#[cfg(test)]
mod tests;
