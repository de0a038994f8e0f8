use sluice_core::usage::{
    JsonPointer, MAX_JSON_BODY_BYTES, MAX_SSE_RETAINED_BYTES, MAX_TOKENS, PointerSet, Usage,
    UsageError, UsageFormat, UsageReader,
};

/// `UsageReader`: an upstream's response body (JSON or `text/event-stream`), from which
/// the filter will read LLM token usage as the body passes (issue #29).
///
/// The first byte chooses the format (`% 4`: OpenAI Chat, OpenAI Responses, Anthropic
/// Messages, JSON pointers); the second the framing (even: JSON, odd: event stream) and,
/// in its other bits, a chunk size of 1 to 128 bytes; the rest is the body.
///
/// Asserts: reading never panics; the answer does not depend on how the body is cut
/// (whole, in chunks of that size, one byte at a time); what the reader holds never
/// exceeds its caps; and a usage it answers has at least one figure, none above
/// `MAX_TOKENS`.
pub fn usage_reader(input: &[u8]) {
    let [format, framing, body @ ..] = input else {
        return;
    };
    let format = match format % 4 {
        0 => UsageFormat::OpenAiChat,
        1 => UsageFormat::OpenAiResponses,
        2 => UsageFormat::AnthropicMessages,
        _ => pointers(),
    };
    let content_type = if framing % 2 == 1 {
        Some("text/event-stream")
    } else {
        Some("application/json")
    };
    let chunk = usize::from(framing >> 1) + 1;
    let bound = if framing % 2 == 1 {
        MAX_SSE_RETAINED_BYTES
    } else {
        MAX_JSON_BODY_BYTES
    };

    let whole = read(&format, content_type, body, body.len().max(1), bound);
    let chunked = read(&format, content_type, body, chunk, bound);
    assert_eq!(chunked, whole, "chunks of {chunk} bytes read otherwise");
    let bytewise = read(&format, content_type, body, 1, bound);
    assert_eq!(bytewise, whole, "one byte at a time reads otherwise");

    if let Ok(usage) = whole {
        assert_ne!(usage, Usage::default(), "a usage with no figure");
        for figure in [usage.input, usage.output, usage.total]
            .into_iter()
            .flatten()
        {
            assert!(figure <= MAX_TOKENS, "{figure} is above MAX_TOKENS");
        }
    }
}

fn read(
    format: &UsageFormat,
    content_type: Option<&str>,
    body: &[u8],
    chunk: usize,
    bound: usize,
) -> Result<Usage, UsageError> {
    let mut reader = UsageReader::new(format.clone(), content_type);
    for piece in body.chunks(chunk) {
        reader.feed(piece);
        assert!(
            reader.retained_capacity() <= bound,
            "holds {} bytes",
            reader.retained_capacity()
        );
    }
    reader.finish()
}

/// Pointers as a generic rule would write them, into the seeds' Gemini-shaped bodies.
fn pointers() -> UsageFormat {
    let pointer = |text: &str| JsonPointer::try_from(text).ok();
    match PointerSet::new(
        pointer("/usageMetadata/promptTokenCount"),
        pointer("/usageMetadata/candidatesTokenCount"),
        pointer("/usageMetadata/totalTokenCount"),
    ) {
        Ok(pointers) => UsageFormat::JsonPointer(pointers),
        Err(_) => UsageFormat::OpenAiChat,
    }
}
