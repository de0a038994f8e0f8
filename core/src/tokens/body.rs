//! What a request body says about the tokens it will use, and the one change Sluice may
//! make to it (`stream_options.include_usage`).
//!
//! Read only from a body the filter buffered whole, at most [`MAX_REQUEST_BODY_BYTES`].

use serde::Deserialize;
use serde_json::Value;

use crate::usage::MAX_TOKENS;

/// The most request body the filter holds to read `max_tokens` from (1 MiB, Envoy's
/// default buffer limit). A longer body goes on unread and the rule's default estimate
/// is reserved (counted in `sluice_token_body_unread_total`).
pub const MAX_REQUEST_BODY_BYTES: usize = 1 << 20;

/// Bytes of request body per input token when `estimate_input_from_body` is on: OpenAI's
/// rule of thumb for English text ("one token is about four characters").
pub const BYTES_PER_INPUT_TOKEN: u64 = 4;

/// What a request told Sluice before it was decided.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BodyFacts {
    /// `max_tokens`, `max_completion_tokens` or `max_output_tokens` (the first present, in
    /// that order), when the body was read and names one.
    pub max_output: Option<u64>,
    /// The body's length in bytes, as far as it was seen.
    pub bytes: u64,
    /// Whether the body was read (JSON within the cap); `false` when it was not there, too
    /// long, or not JSON.
    pub read: bool,
}

#[derive(Deserialize)]
struct Maxima {
    #[serde(default)]
    max_tokens: Option<Value>,
    #[serde(default)]
    max_completion_tokens: Option<Value>,
    #[serde(default)]
    max_output_tokens: Option<Value>,
}

impl BodyFacts {
    /// Reads a whole request body. A body that is not a JSON object, or whose maximum is
    /// not a whole number from 0 to [`MAX_TOKENS`], names no maximum.
    pub fn read(body: &[u8]) -> BodyFacts {
        let bytes = u64::try_from(body.len()).unwrap_or(u64::MAX);
        // serde would also read a struct from an array: only an object is a request.
        let object = body.trim_ascii_start().starts_with(b"{");
        let parsed = serde_json::from_slice::<Maxima>(body)
            .ok()
            .filter(|_| object);
        let Some(maxima) = parsed else {
            return BodyFacts {
                max_output: None,
                bytes,
                read: false,
            };
        };
        let max_output = [
            maxima.max_tokens,
            maxima.max_completion_tokens,
            maxima.max_output_tokens,
        ]
        .into_iter()
        .flatten()
        .find_map(|v| v.as_u64().filter(|n| *n <= MAX_TOKENS));
        BodyFacts {
            max_output,
            bytes,
            read: true,
        }
    }

    /// A body not read (absent, over the cap, or not yet seen): only its length counts.
    pub fn unread(bytes: u64) -> BodyFacts {
        BodyFacts {
            max_output: None,
            bytes,
            read: false,
        }
    }
}

/// The body with `stream_options.include_usage` set to `true`, when it is a JSON object
/// with `"stream": true` that does not already ask for usage; `None` otherwise (the body
/// goes on unchanged). Other fields keep their values (the object's key order may change).
pub fn with_include_usage(body: &[u8]) -> Option<Vec<u8>> {
    let mut doc: Value = serde_json::from_slice(body).ok()?;
    let object = doc.as_object_mut()?;
    if object.get("stream") != Some(&Value::Bool(true)) {
        return None;
    }
    let options = object
        .entry("stream_options")
        .or_insert_with(|| Value::Object(serde_json::Map::new()));
    if options.is_null() {
        *options = Value::Object(serde_json::Map::new());
    }
    let options = options.as_object_mut()?;
    if options.get("include_usage") == Some(&Value::Bool(true)) {
        return None;
    }
    options.insert("include_usage".into(), Value::Bool(true));
    serde_json::to_vec(&doc).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_maximum_present_is_read() {
        for (body, max) in [
            (r#"{"model":"m","max_tokens":300}"#, Some(300)),
            (r#"{"max_completion_tokens":40,"messages":[]}"#, Some(40)),
            (r#"{"max_output_tokens":7,"input":"hi"}"#, Some(7)),
            (r#"{"max_tokens":null,"max_output_tokens":7}"#, Some(7)),
            (r#"{"max_tokens":-1}"#, None),
            (r#"{"max_tokens":"300"}"#, None),
            (r#"{"max_tokens":1.5}"#, None),
            (r#"{"max_tokens":1e300}"#, None),
            (r#"{"messages":[]}"#, None),
        ] {
            let facts = BodyFacts::read(body.as_bytes());
            assert_eq!(facts.max_output, max, "{body}");
            assert!(facts.read);
            assert_eq!(facts.bytes, body.len() as u64);
        }
        for broken in ["", "{", "[1]", "not json", "{\"max_tokens\":3"] {
            let facts = BodyFacts::read(broken.as_bytes());
            assert_eq!((facts.max_output, facts.read), (None, false), "{broken}");
        }
        // Deep nesting in a field not read is skipped without recursion, not a crash.
        let deep = format!(
            "{{\"a\":{}{},\"max_tokens\":9}}",
            "[".repeat(100_000),
            "]".repeat(100_000)
        );
        assert_eq!(BodyFacts::read(deep.as_bytes()).max_output, Some(9));
    }

    #[test]
    fn include_usage_is_added_to_streamed_requests_only() {
        let added = with_include_usage(br#"{"model":"m","stream":true,"messages":[]}"#).unwrap();
        let doc: Value = serde_json::from_slice(&added).unwrap();
        assert_eq!(doc["stream_options"]["include_usage"], Value::Bool(true));
        assert_eq!(doc["model"], "m");
        let kept = with_include_usage(
            br#"{"stream":true,"stream_options":{"include_usage":false,"x":1}}"#,
        )
        .unwrap();
        let doc: Value = serde_json::from_slice(&kept).unwrap();
        assert_eq!(
            doc["stream_options"],
            serde_json::json!({"include_usage":true,"x":1})
        );
        assert!(with_include_usage(br#"{"stream":false}"#).is_none());
        assert!(with_include_usage(br#"{"messages":[]}"#).is_none());
        assert!(
            with_include_usage(br#"{"stream":true,"stream_options":{"include_usage":true}}"#)
                .is_none()
        );
        assert!(with_include_usage(br#"{"stream":true,"stream_options":3}"#).is_none());
        assert!(with_include_usage(b"broken").is_none());
    }
}
