//! The usage reader against provider-shaped fixtures (`tests/fixtures/usage/`, modelled
//! on each provider's documentation), split every way a proxy might split them, and
//! against the inputs a broken or hostile upstream sends.

use proptest::prelude::*;
use sluice_core::usage::{
    BodyKind, JsonPointer, MAX_JSON_BODY_BYTES, MAX_JSON_DEPTH, MAX_SSE_EVENT_BYTES,
    MAX_SSE_LINE_BYTES, MAX_SSE_RETAINED_BYTES, MAX_TOKENS, PointerSet, Usage, UsageError,
    UsageFormat, UsageMeasure, UsageReader,
};

const SSE: Option<&str> = Some("text/event-stream; charset=utf-8");
const JSON: Option<&str> = Some("application/json");

fn gemini_pointers() -> UsageFormat {
    let pointer = |text: &str| Some(JsonPointer::try_from(text).unwrap());
    UsageFormat::JsonPointer(
        PointerSet::new(
            pointer("/usageMetadata/promptTokenCount"),
            pointer("/usageMetadata/candidatesTokenCount"),
            pointer("/usageMetadata/totalTokenCount"),
        )
        .unwrap(),
    )
}

fn usage(input: u64, output: u64, total: Option<u64>) -> Usage {
    Usage {
        input: Some(input),
        output: Some(output),
        total,
    }
}

struct Fixture {
    name: &'static str,
    format: UsageFormat,
    content_type: Option<&'static str>,
    body: &'static [u8],
    expected: Usage,
}

fn fixtures() -> Vec<Fixture> {
    macro_rules! fixture {
        ($file:literal, $format:expr, $content_type:expr, $expected:expr) => {
            Fixture {
                name: $file,
                format: $format,
                content_type: $content_type,
                body: include_bytes!(concat!("fixtures/usage/", $file)),
                expected: $expected,
            }
        };
    }
    vec![
        fixture!(
            "openai_chat.json",
            UsageFormat::OpenAiChat,
            JSON,
            usage(1117, 46, Some(1163))
        ),
        fixture!(
            "openai_chat.sse",
            UsageFormat::OpenAiChat,
            SSE,
            usage(9, 12, Some(21))
        ),
        fixture!(
            "openai_responses.json",
            UsageFormat::OpenAiResponses,
            JSON,
            usage(328, 52, Some(380))
        ),
        fixture!(
            "openai_responses.sse",
            UsageFormat::OpenAiResponses,
            SSE,
            usage(37, 11, Some(48))
        ),
        fixture!(
            "anthropic_messages.json",
            UsageFormat::AnthropicMessages,
            None,
            usage(2095, 503, None)
        ),
        fixture!(
            "anthropic_messages.sse",
            UsageFormat::AnthropicMessages,
            SSE,
            usage(25, 15, None)
        ),
        fixture!(
            "gemini_pointer.json",
            gemini_pointers(),
            JSON,
            usage(8, 2, Some(10))
        ),
        fixture!(
            "gemini_pointer.sse",
            gemini_pointers(),
            SSE,
            usage(8, 2, Some(10))
        ),
    ]
}

/// The fixture with its line endings rewritten (event streams only: CRLF and lone CR
/// are line endings too).
fn line_ending_variants(fixture: &Fixture) -> Vec<(&'static str, Vec<u8>)> {
    let mut variants = vec![("LF", fixture.body.to_vec())];
    if fixture.content_type == SSE {
        let text = std::str::from_utf8(fixture.body).unwrap();
        variants.push(("CRLF", text.replace('\n', "\r\n").into_bytes()));
        variants.push(("CR", text.replace('\n', "\r").into_bytes()));
    }
    variants
}

fn read(
    format: &UsageFormat,
    content_type: Option<&str>,
    chunks: &[&[u8]],
) -> Result<Usage, UsageError> {
    let mut reader = UsageReader::new(format.clone(), content_type);
    for chunk in chunks {
        reader.feed(chunk);
    }
    reader.finish()
}

fn read_whole(
    format: &UsageFormat,
    content_type: Option<&str>,
    body: &[u8],
) -> Result<Usage, UsageError> {
    read(format, content_type, &[body])
}

/// The body cut at `cuts` (positions, in any order, repeats allowed).
fn split_at<'a>(body: &'a [u8], cuts: &[usize]) -> Vec<&'a [u8]> {
    let mut cuts: Vec<usize> = cuts.iter().map(|cut| cut % (body.len() + 1)).collect();
    cuts.sort_unstable();
    let mut pieces = Vec::new();
    let mut start = 0;
    for cut in cuts {
        pieces.push(&body[start..cut]);
        start = cut;
    }
    pieces.push(&body[start..]);
    pieces
}

#[test]
fn every_fixture_reads_as_documented() {
    for fixture in fixtures() {
        for (ending, body) in line_ending_variants(&fixture) {
            assert_eq!(
                read_whole(&fixture.format, fixture.content_type, &body),
                Ok(fixture.expected),
                "{} ({ending})",
                fixture.name
            );
        }
    }
}

#[test]
fn every_fixture_reads_the_same_one_byte_at_a_time() {
    for fixture in fixtures() {
        for (ending, body) in line_ending_variants(&fixture) {
            let bytes: Vec<&[u8]> = body.chunks(1).collect();
            assert_eq!(
                read(&fixture.format, fixture.content_type, &bytes),
                Ok(fixture.expected),
                "{} ({ending})",
                fixture.name
            );
        }
    }
}

#[test]
fn the_counts_a_limit_asks_for() {
    let chat = usage(9, 12, Some(21));
    assert_eq!(chat.count(UsageMeasure::Input), Some(9));
    assert_eq!(chat.count(UsageMeasure::Output), Some(12));
    assert_eq!(chat.count(UsageMeasure::Total), Some(21));
    let anthropic = usage(25, 15, None);
    assert_eq!(anthropic.count(UsageMeasure::Total), Some(40));
    let input_only = Usage {
        input: Some(7),
        ..Usage::default()
    };
    assert_eq!(input_only.count(UsageMeasure::Total), None);
    assert_eq!(
        input_only.require(UsageMeasure::Output),
        Err(UsageError::Missing)
    );
}

#[test]
fn content_types_choose_the_framing() {
    for (content_type, kind) in [
        (Some("text/event-stream"), BodyKind::EventStream),
        (
            Some("Text/Event-Stream ; charset=utf-8"),
            BodyKind::EventStream,
        ),
        (Some("application/json"), BodyKind::Json),
        (Some("application/json; charset=utf-8"), BodyKind::Json),
        (Some("text/plain"), BodyKind::Json),
        (None, BodyKind::Json),
    ] {
        assert_eq!(
            BodyKind::from_content_type(content_type),
            kind,
            "{content_type:?}"
        );
        assert_eq!(
            UsageReader::new(UsageFormat::OpenAiChat, content_type).body_kind(),
            kind
        );
    }
}

#[test]
fn formats_have_the_names_rules_files_use() {
    let names: Vec<String> = [
        UsageFormat::OpenAiChat,
        UsageFormat::OpenAiResponses,
        UsageFormat::AnthropicMessages,
    ]
    .iter()
    .map(|format| serde_json::to_string(format).unwrap())
    .collect();
    assert_eq!(
        names,
        [
            r#""openai_chat""#,
            r#""openai_responses""#,
            r#""anthropic_messages""#
        ]
    );
    let pointer: UsageFormat =
        serde_json::from_str(r#"{"json_pointer": {"input": "/usage/in", "total": "/usage/a~1b"}}"#)
            .unwrap();
    assert_eq!(
        serde_json::to_string(&pointer).unwrap(),
        r#"{"json_pointer":{"input":"/usage/in","total":"/usage/a~1b"}}"#
    );
    for refused in [
        r#"{"json_pointer": {}}"#,
        r#"{"json_pointer": {"input": "usage/in"}}"#,
        r#"{"json_pointer": {"input": "/usage/~2"}}"#,
        r#"{"json_pointer": {"input": "/usage/~"}}"#,
        r#"{"json_pointer": {"inputs": "/usage/in"}}"#,
        r#""openai""#,
    ] {
        assert!(
            serde_json::from_str::<UsageFormat>(refused).is_err(),
            "{refused}"
        );
    }
}

#[test]
fn error_names_are_stable_metric_labels() {
    let names: Vec<&str> = UsageError::ALL.iter().map(|error| error.name()).collect();
    assert_eq!(
        names,
        [
            "missing",
            "malformed",
            "out_of_range",
            "too_large",
            "incomplete"
        ]
    );
}

/// Usage objects that are wrong whatever carries them, as a JSON body's `usage` or a
/// stream's last chunk's: each with the reason it gives.
const BAD_USAGE: [(&str, &str, UsageError); 9] = [
    ("empty usage", "{}", UsageError::Missing),
    (
        "negative",
        r#"{"prompt_tokens": -1}"#,
        UsageError::OutOfRange,
    ),
    (
        "negative beside a good figure",
        r#"{"prompt_tokens": -3, "completion_tokens": 1}"#,
        UsageError::OutOfRange,
    ),
    (
        "2^64",
        r#"{"total_tokens": 18446744073709551616}"#,
        UsageError::OutOfRange,
    ),
    ("float", r#"{"total_tokens": 12.5}"#, UsageError::Malformed),
    (
        "another float",
        r#"{"total_tokens": 7.25}"#,
        UsageError::Malformed,
    ),
    ("string", r#"{"total_tokens": "12"}"#, UsageError::Malformed),
    (
        "another string",
        r#"{"total_tokens": "7"}"#,
        UsageError::Malformed,
    ),
    ("bool", r#"{"total_tokens": true}"#, UsageError::Malformed),
];

/// [`BAD_USAGE`] carried by `carrier`, as test cases.
fn bad_usage_in(carrier: fn(&str) -> String) -> Vec<(&'static str, String, UsageError)> {
    BAD_USAGE
        .iter()
        .map(|(what, usage, expected)| (*what, carrier(usage), *expected))
        .collect()
}

// Bad JSON bodies.

fn chat_body(usage: &str) -> String {
    format!(r#"{{"id":"chatcmpl-1","object":"chat.completion","choices":[],"usage":{usage}}}"#)
}

#[test]
fn bad_json_bodies_are_each_their_own_reason() {
    let cases: &[(&str, String, UsageError)] = &[
        (
            "broken",
            r#"{"usage": {"prompt_tokens": 3,"#.to_owned(),
            UsageError::Malformed,
        ),
        ("empty", String::new(), UsageError::Malformed),
        (
            "not an object",
            "[1, 2, 3]".to_owned(),
            UsageError::Malformed,
        ),
        (
            "trailing garbage",
            format!("{} x", chat_body("null")),
            UsageError::Malformed,
        ),
        (
            "no usage",
            r#"{"error": {"message": "overloaded"}}"#.to_owned(),
            UsageError::Missing,
        ),
        ("null usage", chat_body("null"), UsageError::Missing),
        (
            "usage not an object",
            chat_body("42"),
            UsageError::Malformed,
        ),
        (
            "u64::MAX",
            chat_body(r#"{"total_tokens": 18446744073709551615}"#),
            UsageError::OutOfRange,
        ),
        (
            "above the cap",
            chat_body(&format!(r#"{{"total_tokens": {}}}"#, MAX_TOKENS + 1)),
            UsageError::OutOfRange,
        ),
        (
            "1e300",
            chat_body(r#"{"total_tokens": 1e300}"#),
            UsageError::OutOfRange,
        ),
        (
            "beyond f64",
            chat_body(&format!(r#"{{"total_tokens": 1{}}}"#, "0".repeat(400))),
            UsageError::Malformed,
        ),
    ];
    for (what, body, expected) in cases.iter().cloned().chain(bad_usage_in(chat_body)) {
        assert_eq!(
            read_whole(&UsageFormat::OpenAiChat, JSON, body.as_bytes()),
            Err(expected),
            "{what}"
        );
    }
    assert_eq!(
        read_whole(
            &UsageFormat::OpenAiChat,
            JSON,
            chat_body(&format!(r#"{{"total_tokens": {MAX_TOKENS}}}"#)).as_bytes()
        ),
        Ok(Usage {
            total: Some(MAX_TOKENS),
            ..Usage::default()
        })
    );
}

#[test]
fn nesting_deeper_than_the_bound_is_refused_before_parsing() {
    // Deeper than serde_json's own recursion limit (128) too.
    for depth in [MAX_JSON_DEPTH as usize + 1, 129, 100_000] {
        let body = format!(
            r#"{{"usage": {{"total_tokens": 1}}, "x": {}{}}}"#,
            "[".repeat(depth),
            "]".repeat(depth)
        );
        assert_eq!(
            read_whole(&UsageFormat::OpenAiChat, JSON, body.as_bytes()),
            Err(UsageError::TooLarge),
            "depth {depth}"
        );
        let event = format!("data: {body}\n\n");
        assert_eq!(
            read_whole(&UsageFormat::OpenAiChat, SSE, event.as_bytes()),
            Err(UsageError::TooLarge),
            "depth {depth}, streamed"
        );
    }
    let within = format!(
        r#"{{"usage": {{"total_tokens": 1}}, "x": {}{}}}"#,
        "[".repeat(60),
        "]".repeat(60)
    );
    assert!(read_whole(&UsageFormat::OpenAiChat, JSON, within.as_bytes()).is_ok());
}

#[test]
fn a_json_body_over_its_cap_is_dropped() {
    let mut reader = UsageReader::new(UsageFormat::OpenAiChat, JSON);
    let padding = vec![b' '; 64 << 10];
    reader.feed(chat_body(r#"{"total_tokens": 3}"#).as_bytes());
    for _ in 0..(MAX_JSON_BODY_BYTES / padding.len()) {
        reader.feed(&padding);
    }
    assert_eq!(reader.retained_capacity(), 0, "dropped once over the cap");
    assert_eq!(reader.finish(), Err(UsageError::TooLarge));

    let mut exactly = chat_body(r#"{"total_tokens": 3}"#).into_bytes();
    exactly.resize(MAX_JSON_BODY_BYTES, b' ');
    assert!(read_whole(&UsageFormat::OpenAiChat, JSON, &exactly).is_ok());
}

// Bad event streams.

const CHAT_CHUNK: &str = r#"data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"token "},"finish_reason":null}],"usage":null}"#;

fn chat_stream(final_usage: &str) -> String {
    format!(
        "{CHAT_CHUNK}\n\ndata: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{final_usage}}}\n\ndata: [DONE]\n\n"
    )
}

#[test]
fn bad_streams_are_each_their_own_reason() {
    let cases: &[(&str, String, UsageError)] = &[
        (
            "no include_usage",
            format!("{CHAT_CHUNK}\n\ndata: [DONE]\n\n"),
            UsageError::Missing,
        ),
        (
            "never ends",
            format!("{CHAT_CHUNK}\n\n").repeat(50),
            UsageError::Incomplete,
        ),
        ("empty", String::new(), UsageError::Incomplete),
        (
            "cut mid usage event",
            chat_stream(r#"{"total_tokens": 5}"#)[..CHAT_CHUNK.len() + 60].to_owned(),
            UsageError::Incomplete,
        ),
        (
            "usage event without its blank line",
            format!("{CHAT_CHUNK}\n\ndata: {{\"choices\":[],\"usage\":{{\"total_tokens\":5}}}}\n"),
            UsageError::Incomplete,
        ),
        (
            "broken JSON",
            format!(
                "data: {{\"usage\": {{\n\n{}",
                chat_stream(r#"{"total_tokens": 5}"#)
            ),
            UsageError::Malformed,
        ),
    ];
    for (what, body, expected) in cases.iter().cloned().chain(bad_usage_in(chat_stream)) {
        assert_eq!(
            read_whole(&UsageFormat::OpenAiChat, SSE, body.as_bytes()),
            Err(expected),
            "{what}"
        );
    }
}

#[test]
fn an_anthropic_stream_cut_before_its_message_delta_is_incomplete() {
    let body = include_str!("fixtures/usage/anthropic_messages.sse");
    let cut = body.find("event: message_delta").unwrap();
    assert_eq!(
        read_whole(
            &UsageFormat::AnthropicMessages,
            SSE,
            &body.as_bytes()[..cut]
        ),
        Err(UsageError::Incomplete)
    );
    // An error event ends the stream with no usage.
    let failed = format!(
        "{}event: error\ndata: {{\"type\": \"error\", \"error\": {{\"type\": \"overloaded_error\", \"message\": \"Overloaded\"}}}}\n\n",
        &body[..cut]
    );
    assert_eq!(
        read_whole(&UsageFormat::AnthropicMessages, SSE, failed.as_bytes()),
        Err(UsageError::Incomplete)
    );
}

#[test]
fn anthropic_input_reported_late_replaces_the_start() {
    let body = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":0,\"output_tokens\":1}}}\n\n\
                event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"input_tokens\":472,\"output_tokens\":30}}\n\n";
    assert_eq!(
        read_whole(&UsageFormat::AnthropicMessages, SSE, body.as_bytes()),
        Ok(usage(472, 30, None))
    );
}

#[test]
fn a_responses_stream_ending_incomplete_still_reports_usage() {
    let body = "event: response.incomplete\ndata: {\"type\":\"response.incomplete\",\"response\":{\"status\":\"incomplete\",\"usage\":{\"input_tokens\":10,\"output_tokens\":256,\"total_tokens\":266}}}\n\n";
    assert_eq!(
        read_whole(&UsageFormat::OpenAiResponses, SSE, body.as_bytes()),
        Ok(usage(10, 256, Some(266)))
    );
    let failed = "event: response.failed\ndata: {\"type\":\"response.failed\",\"response\":{\"status\":\"failed\",\"usage\":null}}\n\n";
    assert_eq!(
        read_whole(&UsageFormat::OpenAiResponses, SSE, failed.as_bytes()),
        Err(UsageError::Missing)
    );
}

#[test]
fn an_overlong_line_is_skipped_and_counted_not_buffered() {
    // A comment longer than the cap harms nothing.
    let long_comment = format!(": {}\n\n", "x".repeat(MAX_SSE_LINE_BYTES + 10));
    let body = format!("{long_comment}{}", chat_stream(r#"{"total_tokens": 5}"#));
    let mut reader = UsageReader::new(UsageFormat::OpenAiChat, SSE);
    for chunk in body.as_bytes().chunks(16 << 10) {
        reader.feed(chunk);
        assert!(reader.retained_capacity() <= MAX_SSE_RETAINED_BYTES);
    }
    assert_eq!(reader.oversized(), 1);
    assert_eq!(reader.finish().unwrap().total, Some(5));

    // A usage event too large to hold is reported as such, not as a stream without usage.
    let huge_text = "y".repeat(MAX_SSE_LINE_BYTES);
    let body = format!(
        "event: response.completed\ndata: {{\"type\":\"response.completed\",\"response\":{{\"output\":\"{huge_text}\",\"usage\":{{\"total_tokens\":5}}}}}}\n\n"
    );
    let mut reader = UsageReader::new(UsageFormat::OpenAiResponses, SSE);
    reader.feed(body.as_bytes());
    assert_eq!(reader.oversized(), 1);
    assert_eq!(reader.finish(), Err(UsageError::TooLarge));

    // ... while a large event that cannot carry usage is only counted.
    let body = format!(
        "event: response.output_text.done\ndata: {{\"text\":\"{huge_text}\"}}\n\n\
         event: response.completed\ndata: {{\"type\":\"response.completed\",\"response\":{{\"usage\":{{\"total_tokens\":5}}}}}}\n\n"
    );
    assert_eq!(
        read_whole(&UsageFormat::OpenAiResponses, SSE, body.as_bytes())
            .unwrap()
            .total,
        Some(5)
    );
}

#[test]
fn an_event_over_its_cap_in_many_short_lines_is_dropped() {
    let line = format!("data: {}\n", "z".repeat(1000));
    let lines = MAX_SSE_EVENT_BYTES / line.len() + 2;
    let body = format!(
        "{}\n{}",
        line.repeat(lines),
        chat_stream(r#"{"total_tokens": 5}"#)
    );
    let mut reader = UsageReader::new(UsageFormat::OpenAiChat, SSE);
    reader.feed(body.as_bytes());
    assert_eq!(reader.oversized(), 1);
    // The dropped event might have been the usage one, but a later one reported.
    assert_eq!(reader.finish().unwrap().total, Some(5));
}

#[test]
fn fifty_megabytes_of_stream_keep_memory_flat() {
    // 50 MB of chunks in 16 KiB pieces, then the usage chunk: what the reader holds stays
    // within its caps all the way, however long the stream.
    let mut chunk = String::new();
    while chunk.len() < (50 << 20) / 64 {
        chunk.push_str(CHAT_CHUNK);
        chunk.push_str("\n\n: ping\r\n\r\n");
    }
    let piece = chunk.as_bytes();
    let mut reader = UsageReader::new(UsageFormat::OpenAiChat, SSE);
    let mut fed = 0usize;
    let mut max_retained = 0;
    while fed < 50_000_000 {
        for window in piece.chunks(16 << 10) {
            reader.feed(window);
            fed += window.len();
            max_retained = max_retained.max(reader.retained_capacity());
        }
    }
    reader.feed(
        chat_stream(
            r#"{"prompt_tokens": 10, "completion_tokens": 990000, "total_tokens": 990010}"#,
        )
        .as_bytes(),
    );
    assert!(max_retained <= 16 << 10, "retained {max_retained} bytes");
    assert_eq!(reader.oversized(), 0);
    assert_eq!(reader.finish(), Ok(usage(10, 990_000, Some(990_010))));
}

/// One line of a generated stream: what it is and how long its value is.
fn stream_line(kind: u8, len: usize) -> String {
    let filler = "x".repeat(len);
    match kind % 5 {
        0 => format!("data: {filler}\n"),
        1 => format!(": {filler}\r\n"),
        2 => format!("event: {filler}\r"),
        3 => "\n".to_owned(),
        _ => format!("data: {{\"choices\":[],\"usage\":{{\"total_tokens\":{len}}}}}\n\n"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Lines and events of any length, in chunks of any size: the reader never holds more
    /// than its caps allow.
    #[test]
    fn what_a_stream_reader_holds_stays_within_its_caps(
        lines in prop::collection::vec((any::<u8>(), 0usize..600_000), 1..8),
        chunk in 1usize..100_000,
    ) {
        let body: String = lines.iter().map(|&(kind, len)| stream_line(kind, len)).collect();
        let mut reader = UsageReader::new(UsageFormat::OpenAiChat, SSE);
        for piece in body.as_bytes().chunks(chunk) {
            reader.feed(piece);
            prop_assert!(reader.retained_capacity() <= MAX_SSE_RETAINED_BYTES);
        }
        let _ = reader.finish();
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// However the body is cut into chunks, the answer is the one read whole.
    #[test]
    fn splitting_a_fixture_anywhere_gives_the_same_answer(
        which in 0usize..8,
        ending in 0usize..3,
        cuts in prop::collection::vec(any::<usize>(), 0..40),
    ) {
        let fixtures = fixtures();
        let fixture = &fixtures[which];
        let variants = line_ending_variants(fixture);
        let (_, body) = &variants[ending % variants.len()];
        let pieces = split_at(body, &cuts);
        prop_assert_eq!(read(&fixture.format, fixture.content_type, &pieces), Ok(fixture.expected));
    }

    /// The same for broken bodies: splitting never changes the answer, whatever it is.
    #[test]
    fn splitting_a_damaged_fixture_gives_the_same_answer(
        which in 0usize..8,
        damage in prop::collection::vec((any::<usize>(), any::<u8>()), 1..6),
        cuts in prop::collection::vec(any::<usize>(), 0..20),
    ) {
        let fixtures = fixtures();
        let fixture = &fixtures[which];
        let mut body = fixture.body.to_vec();
        for (at, byte) in damage {
            let at = at % body.len();
            body[at] = byte;
        }
        let whole = read_whole(&fixture.format, fixture.content_type, &body);
        let pieces = split_at(&body, &cuts);
        prop_assert_eq!(read(&fixture.format, fixture.content_type, &pieces), whole);
    }

    /// Arbitrary bytes, in any format and framing: an answer, never a panic.
    #[test]
    fn arbitrary_bytes_never_panic(
        which in 0usize..8,
        bytes in prop::collection::vec(any::<u8>(), 0..2000),
        stream in any::<bool>(),
    ) {
        let fixtures = fixtures();
        let content_type = if stream { SSE } else { JSON };
        let _ = read_whole(&fixtures[which].format, content_type, &bytes);
    }
}
