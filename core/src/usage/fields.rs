//! From parsed JSON to figures: where each provider puts them, and which numbers are
//! believed.

use serde::Deserialize;
use serde_json::Value;

use super::bounds::MAX_TOKENS;
use super::depth::DepthGauge;
use super::format::{JsonPointer, PointerSet};
use super::outcome::{Usage, UsageError};

/// The names of one provider's usage fields.
#[derive(Debug, Clone, Copy)]
pub(super) struct FieldNames {
    input: &'static str,
    output: &'static str,
    total: Option<&'static str>,
}

pub(super) const CHAT_FIELDS: FieldNames = FieldNames {
    input: "prompt_tokens",
    output: "completion_tokens",
    total: Some("total_tokens"),
};

pub(super) const RESPONSES_FIELDS: FieldNames = FieldNames {
    input: "input_tokens",
    output: "output_tokens",
    total: Some("total_tokens"),
};

/// Anthropic reports no total; [`Usage::count`] adds input and output.
pub(super) const ANTHROPIC_FIELDS: FieldNames = FieldNames {
    input: "input_tokens",
    output: "output_tokens",
    total: None,
};

/// The top-level members of a provider's body or event that can lead to usage; serde
/// skips the rest without building it. Values, not typed fields, so that a member of an
/// unexpected type is judged where it matters (in [`read_usage`]) rather than failing the
/// whole document.
#[derive(Debug, Default, Deserialize)]
pub(super) struct Envelope {
    #[serde(rename = "type", default)]
    kind: Option<Value>,
    #[serde(default)]
    pub(super) usage: Option<Value>,
    /// Responses API events: the `Response` object.
    #[serde(default)]
    pub(super) response: Option<Value>,
    /// Anthropic's `message_start`: the `Message` object.
    #[serde(default)]
    pub(super) message: Option<Value>,
}

impl Envelope {
    /// The `type` member, when it is a string.
    pub(super) fn kind(&self) -> Option<&str> {
        self.kind.as_ref().and_then(Value::as_str)
    }
}

/// Parses one JSON document within the depth bound.
pub(super) fn parse<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, UsageError> {
    if !DepthGauge::within_bound(bytes) {
        return Err(UsageError::TooLarge);
    }
    serde_json::from_slice(bytes).map_err(|_| UsageError::Malformed)
}

/// Parses a provider's body or event. Only an object is one: serde would otherwise read
/// an array's elements as the envelope's members, in order.
pub(super) fn parse_envelope(bytes: &[u8]) -> Result<Envelope, UsageError> {
    if bytes.trim_ascii_start().first() != Some(&b'{') {
        return Err(UsageError::Malformed);
    }
    parse(bytes)
}

/// The `usage` member of an object such as a `Response` or a `Message`; `None` when the
/// object has none or it is `null`.
pub(super) fn usage_member(container: Option<&Value>) -> Option<&Value> {
    container
        .and_then(|value| value.get("usage"))
        .filter(|usage| !usage.is_null())
}

/// The figures of a usage object: `Ok(None)` for `null` (not reported here).
pub(super) fn read_usage(usage: &Value, names: FieldNames) -> Result<Option<Usage>, UsageError> {
    if usage.is_null() {
        return Ok(None);
    }
    let Value::Object(members) = usage else {
        return Err(UsageError::Malformed);
    };
    Ok(Some(Usage {
        input: token_count(members.get(names.input))?,
        output: token_count(members.get(names.output))?,
        total: match names.total {
            Some(name) => token_count(members.get(name))?,
            None => None,
        },
    }))
}

/// The figures the pointers find in `document`: `Ok(None)` when none resolves.
pub(super) fn read_pointers(
    document: &Value,
    pointers: &PointerSet,
) -> Result<Option<Usage>, UsageError> {
    let find = |pointer: Option<&JsonPointer>| {
        token_count(pointer.and_then(|pointer| document.pointer(pointer.as_str())))
    };
    let usage = Usage {
        input: find(pointers.input())?,
        output: find(pointers.output())?,
        total: find(pointers.total())?,
    };
    Ok((!usage.is_empty()).then_some(usage))
}

/// One figure: absent or `null` is not reported; a non-negative integer up to
/// [`MAX_TOKENS`] is believed. Negative and enormous numbers (whatever their notation:
/// 2^64 and beyond reach serde_json as floats) are out of range; fractions, strings and
/// anything else are malformed. A number too large even for a float fails parsing, and
/// so reads as malformed.
pub(super) fn token_count(value: Option<&Value>) -> Result<Option<u64>, UsageError> {
    let number = match value {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Number(number)) => number,
        Some(_) => return Err(UsageError::Malformed),
    };
    if let Some(count) = number.as_u64() {
        return if count <= MAX_TOKENS {
            Ok(Some(count))
        } else {
            Err(UsageError::OutOfRange)
        };
    }
    if number.is_i64() {
        // Not a u64, so negative.
        return Err(UsageError::OutOfRange);
    }
    match number.as_f64() {
        // 2^40 is exact in an f64.
        Some(float) if float < 0.0 || float > MAX_TOKENS as f64 => Err(UsageError::OutOfRange),
        _ => Err(UsageError::Malformed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(json: &str) -> Result<Option<u64>, UsageError> {
        let value: Value = serde_json::from_str(json).unwrap();
        token_count(Some(&value))
    }

    #[test]
    fn integers_up_to_the_cap_are_believed() {
        assert_eq!(count("0"), Ok(Some(0)));
        assert_eq!(count("1234"), Ok(Some(1234)));
        assert_eq!(count(&MAX_TOKENS.to_string()), Ok(Some(MAX_TOKENS)));
        assert_eq!(count("null"), Ok(None));
        assert_eq!(token_count(None), Ok(None));
    }

    #[test]
    fn negative_and_enormous_are_out_of_range() {
        for json in [
            "-1",
            "-9223372036854775808",
            "-1.5",
            "-1e3",
            &(MAX_TOKENS + 1).to_string(),
            "18446744073709551615",
            "18446744073709551616",
            "100000000000000000000000000000",
            "1e30",
        ] {
            assert_eq!(count(json), Err(UsageError::OutOfRange), "{json}");
        }
    }

    #[test]
    fn fractions_strings_and_structures_are_malformed() {
        for json in ["1.5", "12.0", "1e3", r#""12""#, "true", "[1]", r#"{"n":1}"#] {
            assert_eq!(count(json), Err(UsageError::Malformed), "{json}");
        }
    }

    #[test]
    fn a_usage_that_is_not_an_object_is_malformed() {
        assert_eq!(
            read_usage(&Value::from(3), CHAT_FIELDS),
            Err(UsageError::Malformed)
        );
        assert_eq!(read_usage(&Value::Null, CHAT_FIELDS), Ok(None));
    }
}
