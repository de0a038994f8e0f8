//! What the admin API said when it refused a call, in one line the control service can
//! log: the text comes from the network, so it is bounded and printable.

/// Longest problem text a refused sync's log line carries.
const MAX_PROBLEM_CHARS: usize = 300;

/// `: <detail> (<field>: <message>)` from a problem document the admin API refused a sync
/// with (a `seq` taken for a replay, a limit it does not know), so the one line the proxy
/// logs says why; empty for any other body. Printable characters only, at most
/// [`MAX_PROBLEM_CHARS`]: the text comes from the network.
pub(crate) fn problem_summary(body: &[u8]) -> String {
    let Ok(problem) = serde_json::from_slice::<serde_json::Value>(body) else {
        return String::new();
    };
    fn text_at<'a>(value: Option<&'a serde_json::Value>, key: &str) -> Option<&'a str> {
        value
            .and_then(|v| v.get(key))
            .and_then(serde_json::Value::as_str)
    }
    let detail = text_at(Some(&problem), "detail").unwrap_or_default();
    let first_error = problem.get("errors").and_then(|errors| errors.get(0));
    let field = match (
        text_at(first_error, "field"),
        text_at(first_error, "message"),
    ) {
        (Some(field), Some(message)) => format!(" ({field}: {message})"),
        _ => String::new(),
    };
    let text: String = format!("{detail}{field}")
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(MAX_PROBLEM_CHARS)
        .collect();
    if text.trim().is_empty() {
        String::new()
    } else {
        format!(": {text}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_sync_says_why_in_one_bounded_line() {
        let body = br#"{"type":"urn:sluice:invalid","title":"Invalid quota sync","status":422,
            "detail":"the sync is invalid","errors":[{"field":"seq","message":"must be larger than 17\nsecond line"}]}"#;
        assert_eq!(
            problem_summary(body),
            ": the sync is invalid (seq: must be larger than 17 second line)"
        );
        assert_eq!(problem_summary(b"not json"), "");
        assert_eq!(problem_summary(b"{}"), "");
        let long = format!(r#"{{"detail":"{}"}}"#, "x".repeat(10_000));
        assert_eq!(
            problem_summary(long.as_bytes()).chars().count(),
            2 + MAX_PROBLEM_CHARS
        );
    }
}
