//! The event-stream framing details the fixtures do not spell out.

use super::*;

fn read(format: UsageFormat, chunks: &[&[u8]]) -> Result<Usage, UsageError> {
    let mut reader = UsageReader::new(format, Some("text/event-stream"));
    for chunk in chunks {
        reader.feed(chunk);
    }
    reader.finish()
}

const USAGE_EVENT: &[u8] = b"data: {\"choices\":[],\"usage\":{\"total_tokens\":7}}\n\n";

fn total(tokens: u64) -> Result<Usage, UsageError> {
    Ok(Usage {
        total: Some(tokens),
        ..Usage::default()
    })
}

#[test]
fn a_byte_order_mark_before_the_first_line_is_ignored() {
    let mut body = "\u{feff}".as_bytes().to_vec();
    body.extend_from_slice(USAGE_EVENT);
    assert_eq!(read(UsageFormat::OpenAiChat, &[&body]), total(7));
    // Split inside the mark.
    let (head, tail) = body.split_at(2);
    assert_eq!(read(UsageFormat::OpenAiChat, &[head, tail]), total(7));
}

#[test]
fn a_crlf_split_between_chunks_is_one_line_ending() {
    let body = b"data: {\"choices\":[],\"usage\":{\"total_tokens\":7}}\r\n\r\n";
    let cr = body.iter().position(|&b| b == b'\r').unwrap() + 1;
    let (head, tail) = body.split_at(cr);
    assert_eq!(read(UsageFormat::OpenAiChat, &[head, b"", tail]), total(7));
    // Were the LF after a chunk-ending CR a line of its own, this event would be
    // dispatched before its second data line.
    let two_lines = b"data: {\"choices\":[],\r\ndata: \"usage\":{\"total_tokens\":7}}\r\n\r\n";
    let cr = two_lines.iter().position(|&b| b == b'\r').unwrap() + 1;
    let (head, tail) = two_lines.split_at(cr);
    assert_eq!(read(UsageFormat::OpenAiChat, &[head, tail]), total(7));
}

#[test]
fn fields_are_read_as_the_specification_says() {
    // No space after the colon, `id` and `retry` fields, a field with no colon.
    let body = b"id: 1\nretry: 10\ndata\ndata:{\"choices\":[],\"usage\":{\"total_tokens\":7}}\n\n";
    assert_eq!(read(UsageFormat::OpenAiChat, &[body]), total(7));
    // Only the first space of a value is the separator's.
    let body = b"data:  {\"choices\":[],\"usage\":{\"total_tokens\":8}}\n\n";
    assert_eq!(read(UsageFormat::OpenAiChat, &[body]), total(8));
    // A blank line with no data dispatches nothing.
    let body = b"\n\n\nevent: x\n\n";
    assert_eq!(
        read(UsageFormat::OpenAiChat, &[body]),
        Err(UsageError::Incomplete)
    );
}

#[test]
fn an_unnamed_anthropic_event_is_judged_by_its_type() {
    let body = b"data: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":3,\"output_tokens\":1}}}\n\n\
                 data: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":4}}\n\n\
                 data: {\"type\":\"message_stop\"}\n\n";
    assert_eq!(
        read(UsageFormat::AnthropicMessages, &[body]),
        Ok(Usage {
            input: Some(3),
            output: Some(4),
            total: None,
        })
    );
}

#[test]
fn events_named_otherwise_are_not_parsed() {
    // Broken data in an event that cannot carry usage does not matter...
    let body = b"event: ping\ndata: {broken\n\n\
                 event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":4}}\n\n";
    assert!(read(UsageFormat::AnthropicMessages, &[body]).is_ok());
    // ...nor does an overlong name, which is none the reader looks for.
    let mut body = format!(
        "event: {}\ndata: {{broken\n\n",
        "n".repeat(MAX_EVENT_NAME_BYTES + 1)
    )
    .into_bytes();
    body.extend_from_slice(
        b"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":4}}\n\n",
    );
    assert!(read(UsageFormat::AnthropicMessages, &[&body]).is_ok());
    // But broken data where usage could be is the answer, whatever comes after.
    let body = b"event: message_delta\ndata: {broken\n\n\
                 event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":4}}\n\n";
    assert_eq!(
        read(UsageFormat::AnthropicMessages, &[body]),
        Err(UsageError::Malformed)
    );
}

#[test]
fn a_json_pointer_stream_keeps_the_latest_event_that_reports() {
    let format = UsageFormat::JsonPointer(
        PointerSet::new(None, Some(JsonPointer::try_from("/u/out").unwrap()), None).unwrap(),
    );
    let body =
        b"data: {\"u\":{\"out\":1}}\n\ndata: {\"u\":{\"out\":5}}\n\ndata: {\"other\":true}\n\n";
    assert_eq!(
        read(format, &[body]),
        Ok(Usage {
            output: Some(5),
            ..Usage::default()
        })
    );
}

#[test]
fn the_line_buffer_shrinks_back_after_a_large_line() {
    let mut reader = UsageReader::new(UsageFormat::OpenAiChat, Some("text/event-stream"));
    reader.feed(format!("data: {{\"x\":\"{}\"}}", "a".repeat(200 << 10)).as_bytes());
    assert!(reader.retained_capacity() >= 200 << 10);
    reader.feed(b"\n\n");
    assert!(reader.retained_capacity() <= 2 * (16 << 10));
}

#[test]
fn copies_of_the_chat_shape_are_read_too() {
    // Usage in every chunk, cumulative, and a last chunk whose `choices` is null.
    let body = b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}],\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":1,\"total_tokens\":5}}\n\n\
                 data: {\"choices\":null,\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":2,\"total_tokens\":6}}\n\n\
                 data: [DONE]\n\n";
    assert_eq!(
        read(UsageFormat::OpenAiChat, &[body]),
        Ok(Usage {
            input: Some(4),
            output: Some(2),
            total: Some(6),
        })
    );
}

#[test]
fn responses_events_without_names_are_judged_by_their_type() {
    let body = b"data: {\"type\":\"response.created\",\"response\":{\"usage\":null}}\n\n\
                 data: {\"type\":\"response.output_text.delta\",\"delta\":\"hi\"}\n\n\
                 data: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":2,\"output_tokens\":1,\"total_tokens\":3}}}\n\n";
    assert_eq!(
        read(UsageFormat::OpenAiResponses, &[body]).map(|u| u.total),
        Ok(Some(3))
    );
}
