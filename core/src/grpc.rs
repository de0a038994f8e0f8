//! What a gRPC client sees when it is limited.
//!
//! A gRPC client reads the call's outcome from `grpc-status`, not from the HTTP status: an
//! HTTP 429 reaches it as UNAVAILABLE (14), which clients and service meshes retry at once.
//! So a denied gRPC call is answered as a gRPC error: the rule's gRPC status
//! (RESOURCE_EXHAUSTED by default), a short message naming the rule and the wait, the
//! rate-limit fields as response metadata, and `grpc-retry-pushback-ms`, the field of
//! gRPC's retry design that tells a client when to come back. A fail-closed rule that could
//! not be checked answers UNAVAILABLE with its own message.
//!
//! gRPC-Web calls (`application/grpc-web*`) reaching the filter directly get the same answer
//! as a gRPC-Web "trailers-only" response (status and message in the headers). Behind
//! Envoy's `grpc_web` filter the filter sees plain gRPC and Envoy translates the answer.

use std::fmt::Write as _;

use crate::response::{self, HeaderList, Limited, RateLimitFields, RateLimitHeaders};
use crate::rule::Rule;
use crate::spec::GrpcStatus;
use crate::time::NANOS_PER_SECOND;

/// The metadata telling a client how long to wait before retrying, in milliseconds.
pub const RETRY_PUSHBACK_HEADER: &str = "grpc-retry-pushback-ms";

/// Which kind of gRPC a request is, from its `content-type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrpcFlavour {
    /// `application/grpc`, `application/grpc+proto`, `application/grpc;...`.
    Grpc,
    /// `application/grpc-web`, `application/grpc-web+proto`, `application/grpc-web-text...`.
    GrpcWeb,
}

impl GrpcFlavour {
    /// The flavour of a request with this `content-type`, or `None` for anything else.
    /// Media types are case-insensitive; parameters and suffixes are allowed.
    pub fn of(content_type: &[u8]) -> Option<GrpcFlavour> {
        let lower = content_type.to_ascii_lowercase();
        let rest = lower.strip_prefix(b"application/grpc")?;
        let boundary = |rest: &[u8]| matches!(rest.first(), None | Some(b'+' | b';' | b' '));
        if let Some(web) = rest.strip_prefix(b"-web") {
            let web = web.strip_prefix(b"-text").unwrap_or(web);
            return boundary(web).then_some(GrpcFlavour::GrpcWeb);
        }
        boundary(rest).then_some(GrpcFlavour::Grpc)
    }
}

/// A gRPC error answer: status, message and metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrpcAnswer {
    pub status: GrpcStatus,
    /// Human-readable; ASCII, since rule names are validated to a header-safe alphabet.
    pub message: String,
    /// Response metadata (header fields), in order.
    pub metadata: HeaderList,
}

impl GrpcAnswer {
    /// The header fields of a gRPC-Web trailers-only answer carrying this error, for a
    /// request of `content_type` (echoed, so `-text` clients get `-text` back; Envoy 1.40
    /// drops it from a local reply without a body, and gRPC-Web clients read the status
    /// from `grpc-status` alone).
    pub fn grpc_web_headers(&self, content_type: &str) -> HeaderList {
        let mut headers: HeaderList = vec![
            ("content-type", content_type.to_string()),
            ("grpc-status", self.status.code().to_string()),
            ("grpc-message", percent_encode(&self.message)),
        ];
        headers.extend(self.metadata.iter().cloned());
        headers
    }
}

/// The answer to a gRPC call that `limited` denies, with the rate-limit fields `format`
/// asks for as metadata.
pub fn denial(limited: &Limited<'_>, format: RateLimitHeaders) -> GrpcAnswer {
    let retry_after = response::retry_after_seconds(limited);
    let (requests, period) = limited
        .limit()
        .map_or((0, 0), |l| (l.requests, l.period_seconds));
    let message = format!(
        "rate limit '{}' ({requests} requests per {period} s) is exhausted; retry in {retry_after} s",
        limited.rule.name
    );
    let mut metadata: HeaderList = vec![
        (RETRY_PUSHBACK_HEADER, pushback_ms(limited).to_string()),
        ("retry-after", retry_after.to_string()),
    ];
    metadata.extend(RateLimitFields::of(limited, true).to_list(format));
    GrpcAnswer {
        status: limited.rule.grpc_status,
        message,
        metadata,
    }
}

/// The answer to a gRPC call that `rule`'s in-flight limit of `max` requests denies: the
/// rule's gRPC status, with the same one-second hint as `Retry-After`
/// ([`response::IN_FLIGHT_RETRY_AFTER_SECONDS`]).
pub fn in_flight_full(rule: &Rule, max: u32) -> GrpcAnswer {
    let retry_after = response::IN_FLIGHT_RETRY_AFTER_SECONDS;
    GrpcAnswer {
        status: rule.grpc_status,
        message: format!(
            "rate limit '{}' allows {max} calls in flight at once; retry when one has ended",
            rule.name
        ),
        metadata: vec![
            (RETRY_PUSHBACK_HEADER, (retry_after * 1_000).to_string()),
            ("retry-after", retry_after.to_string()),
        ],
    }
}

/// The answer to a gRPC call that a fail-closed `rule` could not check.
pub fn failed_closed(rule: &Rule) -> GrpcAnswer {
    GrpcAnswer {
        status: GrpcStatus::Unavailable,
        message: format!(
            "rate limit '{}' could not be checked and is configured to fail closed",
            rule.name
        ),
        metadata: HeaderList::new(),
    }
}

/// The wait before the denied request would fit, in whole milliseconds rounded up (at
/// least 1): a client that waits this long finds the tokens it needs.
fn pushback_ms(limited: &Limited<'_>) -> u64 {
    const NANOS_PER_MILLI: u64 = NANOS_PER_SECOND / 1_000;
    limited
        .verdict()
        .retry_after_ns
        .div_ceil(NANOS_PER_MILLI)
        .max(1)
}

/// `grpc-message` encoding: printable ASCII except `%` as is, everything else as `%XX`.
fn percent_encode(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for byte in message.bytes() {
        if (0x20..=0x7e).contains(&byte) && byte != b'%' {
            out.push(char::from(byte));
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bucket::TierVerdict;
    use crate::gcra::Verdict;
    use crate::response::RenderedRule;
    use crate::spec::RuleSpec;

    fn rule(extra: &str) -> Rule {
        let spec: RuleSpec = serde_json::from_str(&format!(
            r#"{{"name":"h2","key":"global","limits":[{{"requests":1,"period":"minute"}}]{extra}}}"#
        ))
        .unwrap();
        Rule::try_from(spec).unwrap()
    }

    fn denied<'r>(rule: &'r Rule, text: &'r RenderedRule, retry_after_ns: u64) -> Limited<'r> {
        Limited {
            rule,
            limits: &rule.limits,
            rendered: text.for_client(""),
            tier: TierVerdict {
                tier: 0,
                verdict: Verdict {
                    allowed: false,
                    new_tat: crate::time::Nanos::ZERO,
                    remaining: 0,
                    reset_ns: retry_after_ns,
                    retry_after_ns,
                },
            },
        }
    }

    #[test]
    fn recognises_grpc_and_grpc_web_content_types() {
        for ct in [
            "application/grpc",
            "application/grpc+proto",
            "Application/GRPC;charset=utf-8",
        ] {
            assert_eq!(
                GrpcFlavour::of(ct.as_bytes()),
                Some(GrpcFlavour::Grpc),
                "{ct}"
            );
        }
        for ct in [
            "application/grpc-web",
            "application/grpc-web+proto",
            "application/grpc-web-text",
            "application/grpc-web-text+proto",
        ] {
            assert_eq!(
                GrpcFlavour::of(ct.as_bytes()),
                Some(GrpcFlavour::GrpcWeb),
                "{ct}"
            );
        }
        for ct in [
            "application/json",
            "application/grpcx",
            "application/grpc-webby",
            "",
            "\u{ff}",
        ] {
            assert_eq!(GrpcFlavour::of(ct.as_bytes()), None, "{ct}");
        }
    }

    #[test]
    fn a_denied_call_is_resource_exhausted_with_the_pushback_by_default() {
        let rule = rule("");
        let text = RenderedRule::new(&rule);
        let answer = denial(
            &denied(&rule, &text, 59_000_000_001),
            RateLimitHeaders::Both,
        );
        assert_eq!(answer.status, GrpcStatus::ResourceExhausted);
        assert_eq!(answer.status.code(), 8);
        assert_eq!(
            answer.message,
            "rate limit 'h2' (1 requests per 60 s) is exhausted; retry in 60 s"
        );
        assert_eq!(answer.metadata[0], (RETRY_PUSHBACK_HEADER, "59001".into()));
        assert_eq!(answer.metadata[1], ("retry-after", "60".into()));
        assert!(
            answer
                .metadata
                .iter()
                .any(|(n, _)| *n == "ratelimit-policy")
        );
        let quiet = denial(&denied(&rule, &text, 5), RateLimitHeaders::None);
        assert_eq!(
            quiet.metadata.len(),
            2,
            "no rate-limit fields when switched off"
        );
        assert_eq!(quiet.metadata[0].1, "1", "at least a millisecond");
    }

    #[test]
    fn a_rule_may_choose_another_status_and_fail_closed_is_unavailable() {
        let rule = rule(r#","response":{"grpc_status":"unavailable"}"#);
        let text = RenderedRule::new(&rule);
        assert_eq!(
            denial(&denied(&rule, &text, 1), RateLimitHeaders::None).status,
            GrpcStatus::Unavailable
        );
        let answer = failed_closed(&rule);
        assert_eq!(answer.status.code(), 14);
        assert!(answer.message.contains("fail closed"));
        let bad: Result<RuleSpec, _> = serde_json::from_str(
            r#"{"name":"x","key":"global","limits":[{"requests":1,"period":"second"}],"response":{"grpc_status":"ok"}}"#,
        );
        assert!(bad.is_err(), "OK is not a denial");
    }

    #[test]
    fn grpc_web_answers_carry_status_and_message_in_headers() {
        let answer = GrpcAnswer {
            status: GrpcStatus::ResourceExhausted,
            message: "50% used\n".into(),
            metadata: vec![(RETRY_PUSHBACK_HEADER, "10".into())],
        };
        assert_eq!(
            answer.grpc_web_headers("application/grpc-web-text"),
            vec![
                ("content-type", "application/grpc-web-text".to_string()),
                ("grpc-status", "8".to_string()),
                ("grpc-message", "50%25 used%0A".to_string()),
                (RETRY_PUSHBACK_HEADER, "10".to_string()),
            ]
        );
    }

    #[test]
    fn the_default_status_is_not_written_out() {
        let spec = rule("").spec;
        let json = serde_json::to_value(&spec.response).unwrap();
        assert!(json.get("grpc_status").is_none(), "{json}");
    }
}
