//! A fake LLM API on loopback, standing in for OpenAI and Anthropic behind Envoy in the
//! token-budget tests (and the benchmark): JSON and server-sent-event answers in the
//! shapes `sluice_core::usage` reads, with seeded random usage, configurable latency and
//! chunking, and faults on demand.
//!
//! Routes, by path suffix: `/chat/completions` (OpenAI Chat Completions), `/responses`
//! (OpenAI Responses), `/messages` (Anthropic Messages). The request body's `"stream":
//! true` asks for an event stream; a chat stream carries its usage chunk only when the
//! request set `stream_options.include_usage`, as OpenAI's does. Usage is drawn from the
//! generator seeded by [`LlmOptions::seed`], the path and the body (the same request gets
//! the same answer): input 1 to 2,000 tokens, output 1 to the request's `max_tokens` (or
//! `max_completion_tokens`, `max_output_tokens`; 4,000 when none).
//!
//! The `x-llm-fault` request header asks for a fault: `abort` (the stream is cut halfway:
//! the connection is reset), `status-500`, `broken-json`, `negative`, `huge` (10^15) and
//! `string` (usage figures that cannot be believed), `no-usage`, `endless` (a stream that
//! keeps sending deltas for [`LlmOptions::endless_for`] and then stops without its final
//! event). Only well-formed usage is entered in the [`Ledger`]. The `x-llm-deltas` header
//! asks one stream for that many content deltas instead of [`LlmOptions::deltas`] (at most
//! [`MAX_DELTAS`]: the benchmark's 50 MB stream), and `x-llm-gap-ms` for that many
//! milliseconds between writes instead of [`LlmOptions::chunk_gap`] (at most one second),
//! and `x-llm-chunk-bytes` for writes of that many bytes instead of
//! [`LlmOptions::chunk_bytes`] (at most 1 MiB: a long stream in few writes, since each
//! write is followed by a timer's pause, which tokio rounds up to its 1 ms tick).

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use http_body_util::{BodyExt, channel::Channel};
use hyper::body::{Bytes, Incoming};
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

use crate::background::Background;

/// Most content deltas `x-llm-deltas` may ask for (about 150 MB of events).
pub const MAX_DELTAS: usize = 1_000_000;

/// Bytes of one content delta event of a stream from `path` (the benchmark sizes its
/// streams with it).
pub fn delta_event_bytes(path: &str) -> usize {
    event_for_delta(Api::of(path)).len()
}

/// How the fake answers.
#[derive(Debug, Clone)]
pub struct LlmOptions {
    /// Seeds the usage drawn (each connection's generator derives from it).
    pub seed: u64,
    /// Before the response headers.
    pub latency: Duration,
    /// Bytes per body write; 0 writes each event whole (a JSON body in one write).
    pub chunk_bytes: usize,
    /// Between two writes.
    pub chunk_gap: Duration,
    /// Content deltas in a stream.
    pub deltas: usize,
    /// How long an `endless` stream goes on.
    pub endless_for: Duration,
}

impl Default for LlmOptions {
    fn default() -> Self {
        LlmOptions {
            seed: 29,
            latency: Duration::ZERO,
            chunk_bytes: 0,
            chunk_gap: Duration::ZERO,
            deltas: 4,
            endless_for: Duration::from_secs(2),
        }
    }
}

/// Usage the fake reported in well-formed answers, summed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reported {
    pub responses: u64,
    pub input: u64,
    pub output: u64,
}

impl Reported {
    pub fn total(&self) -> u64 {
        self.input + self.output
    }
}

/// What the fake answered: reported usage per `x-api-key` (`""` without one) and the
/// faults it played.
#[derive(Debug, Default)]
pub struct Ledger {
    pub reported: HashMap<String, Reported>,
    pub faults: u64,
}

/// The fake LLM API, serving until dropped.
#[derive(Debug)]
pub struct LlmUpstream {
    addr: SocketAddr,
    ledger: Arc<Mutex<Ledger>>,
    _background: Background,
}

impl LlmUpstream {
    /// Binds 127.0.0.1 on a free port and starts serving.
    pub fn start(options: LlmOptions) -> Result<LlmUpstream> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .context("binding the fake LLM upstream on 127.0.0.1")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let background = Background::start(&format!("llm-upstream-{}", addr.port()))?;
        let listener = background
            .block_on(
                async move { tokio::net::TcpListener::from_std(listener) },
                Duration::from_secs(10),
            )?
            .context("the fake LLM upstream's listener")?;
        let ledger = Arc::new(Mutex::new(Ledger::default()));
        background.spawn(serve(listener, Arc::new(options), Arc::clone(&ledger)));
        Ok(LlmUpstream {
            addr,
            ledger,
            _background: background,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The usage reported to `key` so far.
    pub fn reported(&self, key: &str) -> Reported {
        self.ledger
            .lock()
            .map(|l| l.reported.get(key).copied().unwrap_or_default())
            .unwrap_or_default()
    }

    /// Faults played so far.
    pub fn faults(&self) -> u64 {
        self.ledger.lock().map(|l| l.faults).unwrap_or_default()
    }
}

async fn serve(
    listener: tokio::net::TcpListener,
    options: Arc<LlmOptions>,
    ledger: Arc<Mutex<Ledger>>,
) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (options, ledger) = (Arc::clone(&options), Arc::clone(&ledger));
        tokio::spawn(async move {
            let service = service_fn(move |request: Request<Incoming>| {
                let (options, ledger) = (Arc::clone(&options), Arc::clone(&ledger));
                async move { Ok::<_, Infallible>(answer(request, &options, &ledger).await) }
            });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// FNV-1a, 64 bits: a stable seed from bytes.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The API a path belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    OpenAiChat,
    OpenAiResponses,
    AnthropicMessages,
}

impl Api {
    fn of(path: &str) -> Api {
        let path = path.split('?').next().unwrap_or(path);
        if path.ends_with("/responses") {
            Api::OpenAiResponses
        } else if path.ends_with("/messages") {
            Api::AnthropicMessages
        } else {
            Api::OpenAiChat
        }
    }
}

/// A fault the request asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    None,
    Abort,
    Status500,
    BrokenJson,
    Negative,
    Huge,
    NotANumber,
    NoUsage,
    Endless,
}

impl Fault {
    fn of(value: Option<&HeaderValue>) -> Fault {
        match value.and_then(|v| v.to_str().ok()) {
            Some("abort") => Fault::Abort,
            Some("status-500") => Fault::Status500,
            Some("broken-json") => Fault::BrokenJson,
            Some("negative") => Fault::Negative,
            Some("huge") => Fault::Huge,
            Some("string") => Fault::NotANumber,
            Some("no-usage") => Fault::NoUsage,
            Some("endless") => Fault::Endless,
            _ => Fault::None,
        }
    }

    /// A usage figure as this fault writes it.
    fn figure(self, n: u64) -> Value {
        match self {
            Fault::Negative => json!(-5),
            Fault::Huge => json!(1_000_000_000_000_000u64),
            Fault::NotANumber => json!(n.to_string()),
            _ => json!(n),
        }
    }
}

/// One answer's content: its usage and the text of its deltas.
struct Draw {
    input: u64,
    output: u64,
}

/// Text with multi-byte characters, so chunks split inside them.
const DELTA: &str = "héllo wörld ✓ ";

async fn answer(
    request: Request<Incoming>,
    options: &LlmOptions,
    ledger: &Mutex<Ledger>,
) -> Response<Channel<Bytes, std::io::Error>> {
    let api = Api::of(request.uri().path());
    let path = request.uri().path().to_string();
    let fault = Fault::of(request.headers().get("x-llm-fault"));
    let deltas = request
        .headers()
        .get("x-llm-deltas")
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok())
        .map_or(options.deltas, |n| n.min(MAX_DELTAS));
    let chunk_gap = request
        .headers()
        .get("x-llm-gap-ms")
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        .map_or(options.chunk_gap, |ms| Duration::from_millis(ms.min(1_000)));
    let chunk_bytes = request
        .headers()
        .get("x-llm-chunk-bytes")
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok())
        .map_or(options.chunk_bytes, |n| n.min(1 << 20));
    let key = request
        .headers()
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let Ok(body) = request.into_body().collect().await.map(|b| b.to_bytes()) else {
        // The request never arrived whole (Envoy reset it: a denial decided at the end
        // of its body): nothing was asked, nothing is used.
        let (_, channel) = Channel::<Bytes, std::io::Error>::new(1);
        let mut response = Response::new(channel);
        *response.status_mut() = StatusCode::BAD_REQUEST;
        return response;
    };
    // The same request draws the same usage: a test can ask the fake directly for the
    // bytes Envoy should pass through unchanged.
    let mut rng = StdRng::seed_from_u64(options.seed ^ fnv1a(path.as_bytes()) ^ fnv1a(&body));
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let stream = body["stream"] == Value::Bool(true);
    let include_usage = body["stream_options"]["include_usage"] == Value::Bool(true);
    let max = ["max_tokens", "max_completion_tokens", "max_output_tokens"]
        .iter()
        .find_map(|k| body[*k].as_u64())
        .unwrap_or(4_000)
        .max(1);
    let draw = Draw {
        input: rng.random_range(1..=2_000),
        output: rng.random_range(1..=max),
    };
    tokio::time::sleep(options.latency).await;
    let (mut sender, channel) = Channel::<Bytes, std::io::Error>::new(4);
    let reports = match fault {
        Fault::None => !(stream && api == Api::OpenAiChat && !include_usage),
        _ => false,
    };
    if let Ok(mut ledger) = ledger.lock() {
        if reports {
            let entry = ledger.reported.entry(key).or_default();
            entry.responses += 1;
            entry.input += draw.input;
            entry.output += draw.output;
        } else if fault != Fault::None {
            ledger.faults += 1;
        }
    }
    let status = if fault == Fault::Status500 {
        StatusCode::INTERNAL_SERVER_ERROR
    } else {
        StatusCode::OK
    };
    let pieces = if fault == Fault::Status500 {
        vec![json!({"error": {"message": "upstream failed"}}).to_string()]
    } else if stream {
        events(api, &draw, fault, include_usage, deltas)
    } else {
        vec![whole(api, &draw, fault)]
    };
    let options = LlmOptions {
        chunk_gap,
        chunk_bytes,
        ..options.clone()
    };
    tokio::spawn(async move {
        if fault == Fault::Endless {
            // Deltas until the time is up, then the stream stops without its last event.
            let started = Instant::now();
            while started.elapsed() < options.endless_for {
                for write in split(&[event_for_delta(api)], options.chunk_bytes) {
                    if sender.send_data(Bytes::from(write)).await.is_err() {
                        return;
                    }
                }
                tokio::time::sleep(options.chunk_gap.max(Duration::from_millis(20))).await;
            }
            return;
        }
        let writes = split(&pieces, options.chunk_bytes);
        let cut = (fault == Fault::Abort).then_some(writes.len() / 2);
        for (i, write) in writes.into_iter().enumerate() {
            if cut == Some(i) {
                sender.abort(std::io::Error::other("aborted on request"));
                return;
            }
            if sender.send_data(Bytes::from(write)).await.is_err() {
                return;
            }
            tokio::time::sleep(options.chunk_gap).await;
        }
    });
    let mut response = Response::new(channel);
    *response.status_mut() = status;
    let content_type = if stream && status == StatusCode::OK {
        "text/event-stream"
    } else {
        "application/json"
    };
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// The writes of a body: each piece whole (`bytes` 0), or the pieces joined and cut every
/// `bytes` bytes, wherever that falls.
fn split(pieces: &[String], bytes: usize) -> Vec<Vec<u8>> {
    if bytes == 0 {
        return pieces.iter().map(|p| p.clone().into_bytes()).collect();
    }
    pieces
        .concat()
        .into_bytes()
        .chunks(bytes)
        .map(<[u8]>::to_vec)
        .collect()
}

/// A JSON answer.
fn whole(api: Api, draw: &Draw, fault: Fault) -> String {
    let (i, o) = (fault.figure(draw.input), fault.figure(draw.output));
    let usage = match api {
        Api::OpenAiChat => {
            json!({"prompt_tokens": i, "completion_tokens": o, "total_tokens": fault.figure(draw.input + draw.output)})
        }
        Api::OpenAiResponses => {
            json!({"input_tokens": i, "output_tokens": o, "total_tokens": fault.figure(draw.input + draw.output)})
        }
        Api::AnthropicMessages => json!({"input_tokens": i, "output_tokens": o}),
    };
    let mut doc = match api {
        Api::OpenAiChat => json!({"id": "chatcmpl-1", "object": "chat.completion", "model": "fake",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": DELTA}, "finish_reason": "stop"}]}),
        Api::OpenAiResponses => json!({"id": "resp_1", "object": "response", "status": "completed",
            "output": [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": DELTA}]}]}),
        Api::AnthropicMessages => json!({"id": "msg_1", "type": "message", "role": "assistant",
            "content": [{"type": "text", "text": DELTA}], "stop_reason": "end_turn"}),
    };
    if fault != Fault::NoUsage {
        doc["usage"] = usage;
    }
    let text = doc.to_string();
    if fault == Fault::BrokenJson {
        // Cut inside the usage object.
        let at = text.find("\"usage\"").map_or(text.len() / 2, |u| u + 12);
        return text.get(..at).unwrap_or(&text).to_string();
    }
    text
}

fn sse(event: Option<&str>, data: &Value) -> String {
    match event {
        Some(name) => format!("event: {name}\ndata: {data}\n\n"),
        None => format!("data: {data}\n\n"),
    }
}

fn event_for_delta(api: Api) -> String {
    match api {
        Api::OpenAiChat => sse(
            None,
            &json!({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": DELTA}}], "usage": null}),
        ),
        Api::OpenAiResponses => sse(
            Some("response.output_text.delta"),
            &json!({"type": "response.output_text.delta", "delta": DELTA}),
        ),
        Api::AnthropicMessages => sse(
            Some("content_block_delta"),
            &json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": DELTA}}),
        ),
    }
}

/// A stream's events, usage in the last (as each API sends it).
fn events(api: Api, draw: &Draw, fault: Fault, include_usage: bool, deltas: usize) -> Vec<String> {
    let (i, o) = (fault.figure(draw.input), fault.figure(draw.output));
    let mut events = Vec::new();
    match api {
        Api::OpenAiChat => {
            events.extend((0..deltas).map(|_| event_for_delta(api)));
            if include_usage && fault != Fault::NoUsage {
                let usage = json!({"prompt_tokens": i, "completion_tokens": o,
                                   "total_tokens": fault.figure(draw.input + draw.output)});
                events.push(sse(
                    None,
                    &json!({"object": "chat.completion.chunk", "choices": [], "usage": usage}),
                ));
            }
            events.push("data: [DONE]\n\n".to_string());
        }
        Api::OpenAiResponses => {
            events.push(sse(
                Some("response.created"),
                &json!({"type": "response.created", "response": {"id": "resp_1", "status": "in_progress", "usage": null}}),
            ));
            events.extend((0..deltas).map(|_| event_for_delta(api)));
            let mut response = json!({"id": "resp_1", "status": "completed"});
            if fault != Fault::NoUsage {
                response["usage"] = json!({"input_tokens": i, "output_tokens": o,
                                           "total_tokens": fault.figure(draw.input + draw.output)});
            }
            events.push(sse(
                Some("response.completed"),
                &json!({"type": "response.completed", "response": response}),
            ));
        }
        Api::AnthropicMessages => {
            let start_usage = if fault == Fault::NoUsage {
                Value::Null
            } else {
                json!({"input_tokens": i, "output_tokens": 1})
            };
            events.push(sse(
                Some("message_start"),
                &json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "content": [], "usage": start_usage}}),
            ));
            events.push(sse(
                Some("content_block_start"),
                &json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            ));
            events.push(sse(Some("ping"), &json!({"type": "ping"})));
            events.extend((0..deltas).map(|_| event_for_delta(api)));
            events.push(sse(
                Some("content_block_stop"),
                &json!({"type": "content_block_stop", "index": 0}),
            ));
            let mut delta = json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}});
            if fault != Fault::NoUsage {
                delta["usage"] = json!({"output_tokens": o});
            }
            events.push(sse(Some("message_delta"), &delta));
            events.push(sse(Some("message_stop"), &json!({"type": "message_stop"})));
        }
    }
    if fault == Fault::BrokenJson {
        // The usage event loses its end: it is no longer JSON.
        if let Some(last_usage) = events.iter_mut().rev().find(|e| e.contains("usage")) {
            let cut = last_usage.rfind('}').unwrap_or(last_usage.len());
            last_usage.truncate(cut.saturating_sub(3));
            last_usage.push_str("\n\n");
        }
    }
    events
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::usage::{UsageError, UsageFormat, UsageReader};

    fn read(api: Api, pieces: &[String], stream: bool, chunk: usize) -> Result<u64, UsageError> {
        let format = match api {
            Api::OpenAiChat => UsageFormat::OpenAiChat,
            Api::OpenAiResponses => UsageFormat::OpenAiResponses,
            Api::AnthropicMessages => UsageFormat::AnthropicMessages,
        };
        let content_type = if stream {
            "text/event-stream"
        } else {
            "application/json"
        };
        let mut reader = UsageReader::new(format, Some(content_type));
        for write in split(pieces, chunk) {
            reader.feed(&write);
        }
        let usage = reader.finish()?;
        usage.require(sluice_core::usage::UsageMeasure::Total)
    }

    /// Every shape the fake writes reads back as the usage drawn, however it is chunked;
    /// every fault reads as the error the filter counts.
    #[test]
    fn the_core_reads_back_what_the_fake_reports() {
        let draw = Draw {
            input: 17,
            output: 1_234,
        };
        for api in [
            Api::OpenAiChat,
            Api::OpenAiResponses,
            Api::AnthropicMessages,
        ] {
            for chunk in [0, 1, 3, 7, 64] {
                let json = vec![whole(api, &draw, Fault::None)];
                assert_eq!(
                    read(api, &json, false, chunk),
                    Ok(1_251),
                    "{api:?} json {chunk}"
                );
                let sse = events(api, &draw, Fault::None, true, 3);
                assert_eq!(
                    read(api, &sse, true, chunk),
                    Ok(1_251),
                    "{api:?} sse {chunk}"
                );
            }
            for (fault, error) in [
                (Fault::BrokenJson, UsageError::Malformed),
                (Fault::Negative, UsageError::OutOfRange),
                (Fault::Huge, UsageError::OutOfRange),
                (Fault::NotANumber, UsageError::Malformed),
                (Fault::NoUsage, UsageError::Missing),
            ] {
                let json = vec![whole(api, &draw, fault)];
                assert_eq!(
                    read(api, &json, false, 5),
                    Err(error),
                    "{api:?} json {fault:?}"
                );
            }
        }
        // A chat stream without include_usage reports nothing.
        let sse = events(Api::OpenAiChat, &draw, Fault::None, false, 3);
        assert_eq!(
            read(Api::OpenAiChat, &sse, true, 0),
            Err(UsageError::Missing)
        );
    }

    /// The server itself: a streamed answer over loopback, its usage in the ledger.
    #[test]
    fn the_server_answers_and_keeps_its_ledger() {
        let llm = LlmUpstream::start(LlmOptions {
            chunk_bytes: 7,
            ..LlmOptions::default()
        })
        .unwrap();
        let (status, body) = crate::http::http_request(
            llm.addr(),
            "POST",
            "/v1/messages",
            &[("x-api-key", "k")],
            r#"{"stream":true,"max_tokens":50}"#,
        )
        .unwrap();
        assert_eq!(status, 200, "{body}");
        assert!(body.contains("message_stop"), "{body}");
        let reported = llm.reported("k");
        assert_eq!(reported.responses, 1);
        assert!((1..=50).contains(&reported.output));
        // A stream asked for more deltas is that much longer.
        let deltas = |n: &str| {
            let (_, body) = crate::http::http_request(
                llm.addr(),
                "POST",
                "/v1/messages",
                &[("x-llm-deltas", n)],
                r#"{"stream":true}"#,
            )
            .unwrap();
            body.matches("content_block_delta").count()
        };
        // Each delta event names its type twice (event line and data).
        assert_eq!(deltas("300"), 600);
        assert_eq!(deltas("1"), 2);
    }
}
