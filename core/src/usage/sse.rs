//! A `text/event-stream` body, read as it passes: lines framed incrementally, events
//! assembled within their caps, and only the data of events that can carry usage parsed.
//! What is kept between chunks is one partial line, one partial event and the latest
//! figures, so memory does not depend on the stream's length.

use serde_json::Value;

use super::bounds::{MAX_EVENT_NAME_BYTES, MAX_SSE_EVENT_BYTES, MAX_SSE_LINE_BYTES, extend_capped};
use super::fields::{self, ANTHROPIC_FIELDS, CHAT_FIELDS, FieldNames, RESPONSES_FIELDS};
use super::format::UsageFormat;
use super::outcome::{Usage, UsageError};

/// A buffer that grew for a large line or event is shrunk back to this after use, so one
/// large event does not keep its memory for the rest of a long stream.
const RETAINED_BUFFER_BYTES: usize = 16 << 10;

const BOM: &[u8] = "\u{feff}".as_bytes();

#[derive(Debug)]
pub(super) struct EventStream {
    lines: LineFramer,
    event: PendingEvent,
    tally: Tally,
    format: UsageFormat,
}

/// Splits bytes into lines ending in CRLF, LF or CR, holding at most
/// [`MAX_SSE_LINE_BYTES`] of the current one.
#[derive(Debug, Default)]
struct LineFramer {
    line: Vec<u8>,
    /// The current line outgrew the cap: its remaining bytes are dropped up to its end.
    overflowed: bool,
    /// The overflowed line was a comment, whose loss harms no event.
    overflowed_comment: bool,
    /// The last byte seen was a CR, so a LF first in the next chunk ends no line.
    after_cr: bool,
    /// No line has ended yet: the first may start with a byte order mark.
    first_line: bool,
}

/// What one line turned out to be.
enum Line<'a> {
    Complete(&'a [u8]),
    /// Longer than the cap; `comment` when it began with `:`.
    Oversized {
        comment: bool,
    },
}

/// The event being assembled from its lines.
#[derive(Debug, Default)]
struct PendingEvent {
    name: Vec<u8>,
    name_too_long: bool,
    /// The `data:` lines so far, each followed by LF, as the specification joins them.
    data: Vec<u8>,
    /// A line or the data outgrew its cap: the event is dropped when dispatched.
    damaged: bool,
}

/// What the events read so far reported.
#[derive(Debug, Default)]
struct Tally {
    /// The figures of the final usage event, once one has been read.
    final_usage: Option<Usage>,
    /// Anthropic's figures so far (from `message_start`, updated by `message_delta`).
    running: Usage,
    /// The first failure in an event that could carry usage: it decides the answer.
    error: Option<UsageError>,
    /// An event that could carry usage was dropped for its size.
    dropped_usage_event: bool,
    /// The stream said it ended (`[DONE]`, a terminal Responses event, `message_stop`).
    ended: bool,
    oversized: u64,
}

impl EventStream {
    pub(super) fn new(format: UsageFormat) -> EventStream {
        EventStream {
            lines: LineFramer {
                first_line: true,
                ..LineFramer::default()
            },
            event: PendingEvent::default(),
            tally: Tally::default(),
            format,
        }
    }

    pub(super) fn feed(&mut self, chunk: &[u8]) {
        let EventStream {
            lines,
            event,
            tally,
            format,
        } = self;
        lines.feed(chunk, |line| match line {
            Line::Complete(line) => event.take_line(line, format, tally),
            Line::Oversized { comment } => {
                tally.oversized += 1;
                if !comment {
                    event.damaged = true;
                }
            }
        });
    }

    /// An event not ended by a blank line is discarded, as the specification says of a
    /// stream that ends mid-event: a cut-off usage event is not believed.
    pub(super) fn finish(self) -> Result<Usage, UsageError> {
        let tally = self.tally;
        if let Some(error) = tally.error {
            return Err(error);
        }
        match tally.final_usage {
            Some(usage) if usage != Usage::default() => Ok(usage),
            Some(_) => Err(UsageError::Missing),
            None if tally.dropped_usage_event => Err(UsageError::TooLarge),
            None if tally.ended => Err(UsageError::Missing),
            None => Err(UsageError::Incomplete),
        }
    }

    pub(super) fn oversized(&self) -> u64 {
        self.tally.oversized
    }

    pub(super) fn retained_capacity(&self) -> usize {
        self.lines.line.capacity() + self.event.name.capacity() + self.event.data.capacity()
    }
}

impl LineFramer {
    fn feed(&mut self, mut bytes: &[u8], mut on_line: impl FnMut(Line<'_>)) {
        if self.after_cr && !bytes.is_empty() {
            self.after_cr = false;
            if let Some(rest) = bytes.strip_prefix(b"\n") {
                bytes = rest;
            }
        }
        while let Some(end) = bytes.iter().position(|&b| b == b'\n' || b == b'\r') {
            let (segment, rest) = bytes.split_at(end);
            self.append(segment);
            let Some((&ending, mut rest)) = rest.split_first() else {
                break;
            };
            if ending == b'\r' {
                match rest.strip_prefix(b"\n") {
                    Some(after_lf) => rest = after_lf,
                    None => self.after_cr = rest.is_empty(),
                }
            }
            self.end_line(&mut on_line);
            bytes = rest;
        }
        self.append(bytes);
    }

    fn append(&mut self, segment: &[u8]) {
        if self.overflowed || segment.is_empty() {
            return;
        }
        if self.line.len() + segment.len() > MAX_SSE_LINE_BYTES {
            let first = self.line.first().or(segment.first());
            self.overflowed = true;
            self.overflowed_comment = first == Some(&b':');
            self.line = Vec::new();
            return;
        }
        extend_capped(&mut self.line, segment, MAX_SSE_LINE_BYTES);
    }

    fn end_line(&mut self, on_line: &mut impl FnMut(Line<'_>)) {
        if self.overflowed {
            self.overflowed = false;
            on_line(Line::Oversized {
                comment: self.overflowed_comment,
            });
        } else {
            let mut line = self.line.as_slice();
            if self.first_line {
                line = line.strip_prefix(BOM).unwrap_or(line);
            }
            on_line(Line::Complete(line));
            self.line.clear();
            self.line.shrink_to(RETAINED_BUFFER_BYTES);
        }
        self.first_line = false;
    }
}

impl PendingEvent {
    /// One complete line: a field of the event, or the blank line that dispatches it.
    fn take_line(&mut self, line: &[u8], format: &UsageFormat, tally: &mut Tally) {
        if line.is_empty() {
            self.dispatch(format, tally);
            return;
        }
        if line.first() == Some(&b':') {
            return;
        }
        let (field, value) = match line.iter().position(|&b| b == b':') {
            Some(colon) => {
                let (field, value) = line.split_at(colon);
                let value = value.get(1..).unwrap_or_default();
                (field, value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &b""[..]),
        };
        match field {
            b"event" => {
                self.name.clear();
                self.name_too_long = value.len() > MAX_EVENT_NAME_BYTES;
                if !self.name_too_long {
                    extend_capped(&mut self.name, value, MAX_EVENT_NAME_BYTES);
                }
            }
            b"data" if !self.damaged => {
                if self.data.len() + value.len() + 1 > MAX_SSE_EVENT_BYTES {
                    tally.oversized += 1;
                    self.damaged = true;
                    self.data = Vec::new();
                } else {
                    extend_capped(&mut self.data, value, MAX_SSE_EVENT_BYTES);
                    extend_capped(&mut self.data, b"\n", MAX_SSE_EVENT_BYTES);
                }
            }
            // `id`, `retry` and unknown fields say nothing about usage.
            _ => {}
        }
    }

    fn dispatch(&mut self, format: &UsageFormat, tally: &mut Tally) {
        let name = if self.name_too_long {
            EventName::Other
        } else {
            EventName::of(&self.name)
        };
        if self.damaged {
            if may_carry_usage(format, name) {
                tally.dropped_usage_event = true;
            }
        } else if let Some(data) = self.data.strip_suffix(b"\n") {
            if may_carry_usage(format, name) || data == b"[DONE]" {
                tally.read_event(format, data);
            }
        }
        self.name.clear();
        self.name_too_long = false;
        self.damaged = false;
        self.data.clear();
        self.data.shrink_to(RETAINED_BUFFER_BYTES);
    }
}

/// An event's `event:` name, as far as the reader cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EventName<'a> {
    /// No `event:` line: the specification's default type, `message`.
    Unnamed,
    Named(&'a [u8]),
    /// Longer than any name looked for.
    Other,
}

impl<'a> EventName<'a> {
    fn of(name: &'a [u8]) -> EventName<'a> {
        match name {
            b"" | b"message" => EventName::Unnamed,
            name => EventName::Named(name),
        }
    }
}

/// Whether an event so named is worth parsing. Names only narrow: an unnamed event is
/// parsed and judged by its data's `type`, for servers that copy a provider's data but
/// not its `event:` lines.
fn may_carry_usage(format: &UsageFormat, name: EventName<'_>) -> bool {
    let EventName::Named(name) = name else {
        return name == EventName::Unnamed || !provider_names_events(format);
    };
    match format {
        UsageFormat::OpenAiResponses => RESPONSES_TERMINAL_EVENTS
            .iter()
            .any(|terminal| terminal.as_bytes() == name),
        UsageFormat::AnthropicMessages => {
            matches!(name, b"message_start" | b"message_delta" | b"message_stop")
        }
        UsageFormat::OpenAiChat | UsageFormat::JsonPointer(_) => true,
    }
}

/// Providers whose events are named, so a name tells which can carry usage.
fn provider_names_events(format: &UsageFormat) -> bool {
    matches!(
        format,
        UsageFormat::OpenAiResponses | UsageFormat::AnthropicMessages
    )
}

/// The Responses API events that end a stream; each carries the final `Response`, whose
/// `usage` is the whole call's.
const RESPONSES_TERMINAL_EVENTS: [&str; 3] = [
    "response.completed",
    "response.incomplete",
    "response.failed",
];

impl Tally {
    fn read_event(&mut self, format: &UsageFormat, data: &[u8]) {
        if self.error.is_some() {
            return;
        }
        if data == b"[DONE]" {
            self.ended = true;
            return;
        }
        let read = match format {
            UsageFormat::OpenAiChat => self.read_chat(data),
            UsageFormat::OpenAiResponses => self.read_responses(data),
            UsageFormat::AnthropicMessages => self.read_anthropic(data),
            UsageFormat::JsonPointer(pointers) => fields::parse::<Value>(data)
                .and_then(|document| fields::read_pointers(&document, pointers))
                .map(|usage| self.final_usage = usage.or(self.final_usage)),
        };
        if let Err(error) = read {
            self.error = Some(error);
        }
    }

    /// Every chunk has a `usage`; only the last one's is not `null`.
    fn read_chat(&mut self, data: &[u8]) -> Result<(), UsageError> {
        let chunk = fields::parse_envelope(data)?;
        if let Some(usage) = reported(chunk.usage.as_ref(), CHAT_FIELDS)? {
            self.final_usage = Some(usage);
        }
        Ok(())
    }

    fn read_responses(&mut self, data: &[u8]) -> Result<(), UsageError> {
        let event = fields::parse_envelope(data)?;
        let Some(kind) = event.kind() else {
            return Ok(());
        };
        if RESPONSES_TERMINAL_EVENTS.contains(&kind) {
            self.ended = true;
            let usage = fields::usage_member(event.response.as_ref());
            if let Some(usage) = reported(usage, RESPONSES_FIELDS)? {
                self.final_usage = Some(usage);
            }
        }
        Ok(())
    }

    /// `message_start` gives input (and output so far); each `message_delta` gives the
    /// cumulative output, and sometimes input, which replace what was known. The usage is
    /// final once a `message_delta` has reported.
    fn read_anthropic(&mut self, data: &[u8]) -> Result<(), UsageError> {
        let event = fields::parse_envelope(data)?;
        match event.kind() {
            Some("message_start") => {
                let usage = fields::usage_member(event.message.as_ref());
                if let Some(usage) = reported(usage, ANTHROPIC_FIELDS)? {
                    self.running = usage;
                }
            }
            Some("message_delta") => {
                if let Some(delta) = reported(event.usage.as_ref(), ANTHROPIC_FIELDS)? {
                    self.running.input = delta.input.or(self.running.input);
                    self.running.output = delta.output.or(self.running.output);
                    self.final_usage = Some(self.running);
                }
            }
            Some("message_stop") => self.ended = true,
            _ => {}
        }
        Ok(())
    }
}

fn reported(usage: Option<&Value>, names: FieldNames) -> Result<Option<Usage>, UsageError> {
    match usage {
        Some(usage) => fields::read_usage(usage, names),
        None => Ok(None),
    }
}
