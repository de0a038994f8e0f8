//! Numbers, rates, durations and rule summaries as people read them: the parts that need
//! no browser (clock times, which need the browser's time zone, stay in the dashboard).

use sluice_core::rule::{DEFAULT_QUEUE_PER_KEY, DEFAULT_QUEUE_PER_WORKER};
use sluice_core::spec::{
    DelaySpec, ElasticSpec, KeyMissingSpec, KeySpec, LimitSpec, MatchSpec, Mode, NamedPeriod,
    OnLimit, PeerCertificateField, PeriodSpec, RuleSpec, Scope, TokensSpec, UsageMeasure,
    UsageSpec,
};

/// `1234` → `1,234`; `1_234_567` → `1.23M`.
pub fn count(n: u64) -> String {
    if n >= 1_000_000 {
        return format!("{}M", trim(n as f64 / 1e6, 2));
    }
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A rate per second: `0`, `0.4`, `12.5`, `1.2k`.
pub fn rate(x: f64) -> String {
    if !x.is_finite() || x <= 0.0 {
        "0".to_string()
    } else if x >= 1000.0 {
        format!("{}k", trim(x / 1000.0, 1))
    } else if x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 10.0 {
        trim(x, 1)
    } else {
        trim(x, 2)
    }
}

/// An axis label: like [`rate`] but never more than 3 significant digits.
pub fn axis(x: f64) -> String {
    if x >= 1e6 {
        format!("{}M", trim(x / 1e6, 1))
    } else if x >= 1000.0 {
        format!("{}k", trim(x / 1000.0, 1))
    } else {
        trim(x, 2)
    }
}

pub(crate) fn trim(x: f64, decimals: usize) -> String {
    let text = format!("{x:.decimals$}");
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        text
    }
}

/// `0.1234` → `12.3%`.
pub fn percent(ratio: f64) -> String {
    if !ratio.is_finite() || ratio <= 0.0 {
        "0%".to_string()
    } else if ratio < 0.001 {
        "<0.1%".to_string()
    } else {
        format!("{}%", trim(ratio * 100.0, 1))
    }
}

/// A length of time in milliseconds: `0.8 ms`, `12 ms`, `1.4 s` (answer times, waits).
pub fn millis(ms: f64) -> String {
    if ms >= 1_000.0 {
        format!("{} s", trim(ms / 1_000.0, 1))
    } else if ms >= 10.0 {
        format!("{ms:.0} ms")
    } else {
        format!("{} ms", trim(ms, 1))
    }
}

/// A rule's shaped traffic as the rule table shows it beside allowed and throttled:
/// `12 warned · 40 delayed, mean wait 85 ms · 3 in-flight refused`, naming only the counts
/// that are non-zero (most rules shape nothing, and their rows stay as they were); `None`
/// when all are 0. Warned and delayed requests are also in allowed, in-flight refusals in
/// throttled (docs/shaping.md#statistics), so these explain those columns, not add to them.
pub fn shaping(
    warned: u64,
    delayed: u64,
    delay_wait_ms: u64,
    in_flight_refused: u64,
) -> Option<String> {
    let mut parts = Vec::new();
    if warned > 0 {
        parts.push(format!("{} warned", count(warned)));
    }
    if let Some(wait) = mean_wait(delayed, delay_wait_ms) {
        parts.push(format!("{} delayed, mean wait {wait}", count(delayed)));
    }
    if in_flight_refused > 0 {
        parts.push(format!("{} in-flight refused", count(in_flight_refused)));
    }
    (!parts.is_empty()).then(|| parts.join(" · "))
}

/// The mean of the waits computed for `delayed` requests, summed in `delay_wait_ms`:
/// `85 ms`; `None` without delayed requests (a sum alone has no mean).
pub fn mean_wait(delayed: u64, delay_wait_ms: u64) -> Option<String> {
    (delayed > 0).then(|| millis(delay_wait_ms as f64 / delayed as f64))
}

/// One of the overview's cards for shaped traffic: its label, figure and note, the
/// card's tone, and its `data-test` name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShapedCard {
    pub label: &'static str,
    pub value: String,
    pub note: String,
    pub tone: &'static str,
    pub test: &'static str,
}

/// The overview's cards for a window's shaped traffic: delayed (with the mean wait),
/// warned and in-flight refused, each only when non-zero, as [`shaping`] names them: most
/// rulesets shape nothing, and three cards of zeros would push the ones that matter down.
/// The notes say which total each is part of, since they explain allowed and throttled
/// rather than add to them.
pub fn shaped_cards(
    warned: u64,
    delayed: u64,
    delay_wait_ms: u64,
    in_flight_refused: u64,
) -> Vec<ShapedCard> {
    let mut cards = Vec::new();
    if let Some(wait) = mean_wait(delayed, delay_wait_ms) {
        cards.push(ShapedCard {
            label: "Delayed",
            value: count(delayed),
            note: format!("mean wait {wait} · passed, in allowed"),
            tone: "",
            test: "delayed",
        });
    }
    if warned > 0 {
        cards.push(ShapedCard {
            label: "Warned",
            value: count(warned),
            note: "over a limit, told so · in allowed".to_string(),
            tone: "warn",
            test: "warned",
        });
    }
    if in_flight_refused > 0 {
        cards.push(ShapedCard {
            label: "In-flight refused",
            value: count(in_flight_refused),
            note: "too many at once · in throttled".to_string(),
            tone: "bad",
            test: "in-flight-refused",
        });
    }
    cards
}

/// How long ago something was, from its age in seconds: `just now`, `5 min ago`, `3 h ago`,
/// `2 days ago`.
pub fn ago_text(seconds: u64) -> String {
    match seconds {
        0..=9 => "just now".to_string(),
        10..=59 => format!("{seconds} s ago"),
        60..=3599 => format!("{} min ago", seconds / 60),
        3600..=86_399 => format!("{} h ago", seconds / 3600),
        _ => match seconds / 86_400 {
            1 => "yesterday".to_string(),
            d => format!("{d} days ago"),
        },
    }
}

/// A window length: `5 min`, `1 h`, `24 h`.
pub fn window(seconds: u64) -> String {
    if seconds >= 3600 && seconds % 3600 == 0 {
        format!("{} h", seconds / 3600)
    } else if seconds >= 60 {
        format!("{} min", seconds / 60)
    } else {
        format!("{seconds} s")
    }
}

pub fn period(p: &PeriodSpec) -> String {
    match p {
        PeriodSpec::Named(NamedPeriod::Second) => "s".to_string(),
        PeriodSpec::Named(NamedPeriod::Minute) => "min".to_string(),
        PeriodSpec::Named(NamedPeriod::Hour) => "h".to_string(),
        PeriodSpec::Named(NamedPeriod::Day) => "day".to_string(),
        PeriodSpec::Seconds(s) => format!("{s} s"),
    }
}

/// `5/s, burst 10`; a token limit `100,000 tokens/min`.
pub fn limit(l: &LimitSpec) -> String {
    if let Some(n) = l.concurrent {
        return format!("{} in flight", count(n));
    }
    let amount = l.requests.or(l.tokens).unwrap_or(0);
    let unit = match (l.tokens, l.count) {
        (None, _) => "",
        (Some(_), Some(UsageMeasure::Input)) => " input tokens",
        (Some(_), Some(UsageMeasure::Output)) => " output tokens",
        (Some(_), _) => " tokens",
    };
    let every = l.period.unwrap_or(PeriodSpec::Seconds(0));
    let base = bucket(amount, unit, &every, l.burst);
    if l.scope == Scope::Global {
        format!("{base}, fleet-wide")
    } else {
        base
    }
}

/// A bucket's rate and burst, as a limit and an elastic ceiling are written: `5/s, burst
/// 10`, `1,000 tokens per 90 s`; a burst equal to the amount is the default, left out.
fn bucket(amount: u64, unit: &str, every: &PeriodSpec, burst: Option<u64>) -> String {
    let base = match every {
        PeriodSpec::Seconds(_) => format!("{}{unit} per {}", count(amount), period(every)),
        _ => format!("{}{unit}/{}", count(amount), period(every)),
    };
    match burst {
        Some(b) if b != amount => format!("{base}, burst {}", count(b)),
        _ => base,
    }
}

/// An elastic rule's ceiling: `clients pass their limits while all of them together are
/// under 300/s, burst 400, in each Envoy`.
pub fn elastic(e: &ElasticSpec) -> String {
    format!(
        "clients pass their limits while all of them together are under {}, in each Envoy",
        bucket(e.requests, "", &e.period, e.burst)
    )
}

pub fn limits(ls: &[LimitSpec]) -> String {
    ls.iter().map(limit).collect::<Vec<_>>().join(" · ")
}

pub fn key(k: &KeySpec) -> String {
    match k {
        KeySpec::Header(h) => format!("header {h}"),
        KeySpec::ClientIp(ip) if ip.trusted_hops == 0 => "client IP".to_string(),
        KeySpec::ClientIp(ip) => format!("client IP ({} hops)", ip.trusted_hops),
        KeySpec::Query(q) => format!("query {q}"),
        KeySpec::Path => "path".to_string(),
        KeySpec::Global => "everyone (global)".to_string(),
        KeySpec::Composite(parts) => parts.iter().map(key).collect::<Vec<_>>().join(" + "),
        KeySpec::Metadata(m) => format!("{} {}", m.filter, m.path.join(".")),
        KeySpec::PeerCertificate(field) => match field {
            PeerCertificateField::UriSan => "peer certificate URI SAN".to_string(),
            PeerCertificateField::DnsSan => "peer certificate DNS SAN".to_string(),
            PeerCertificateField::Subject => "peer certificate subject".to_string(),
        },
        KeySpec::Cookie(c) => format!("cookie {c}"),
    }
}

/// What a matching request without a client key gets.
pub fn key_missing(k: &KeyMissingSpec) -> String {
    match k {
        KeyMissingSpec::Skip => "the rule is skipped".to_string(),
        KeyMissingSpec::Fallback(client) => format!("the fallback key {client}"),
    }
}

/// Which clients a rule is enforced for.
pub fn rollout(mode: Mode, enforce_percent: u8) -> String {
    match (mode, enforce_percent) {
        (Mode::Shadow, _) => "no one (shadow mode)".to_string(),
        (Mode::Warn, _) => "no one (warn mode: over the limit, clients are told)".to_string(),
        (Mode::Enforce, 100..) => "every client".to_string(),
        (Mode::Enforce, 0) => "no one yet (0%: every client in shadow mode)".to_string(),
        (Mode::Enforce, p) => format!("{p}% of clients (the rest in shadow mode)"),
    }
}

/// What an over-limit request gets: `refused`, or `delayed up to 1.5 s, at most 8 waiting
/// per client and 512 for the rule on each Envoy worker`, the queue bounds as the core
/// applies them when left out (a client's default follows a smaller rule bound down).
pub fn on_limit(on_limit: OnLimit, delay: Option<&DelaySpec>) -> String {
    match (on_limit, delay) {
        (OnLimit::Refuse, _) => "refused".to_string(),
        (OnLimit::Delay, None) => "delayed (no delay section)".to_string(),
        (OnLimit::Delay, Some(d)) => {
            let per_worker = d.queue_per_worker.unwrap_or(DEFAULT_QUEUE_PER_WORKER);
            let per_key = d
                .queue_per_key
                .unwrap_or(DEFAULT_QUEUE_PER_KEY.min(per_worker));
            format!(
                "delayed up to {}, at most {} waiting per client and {} for the rule on each Envoy worker",
                millis(d.max_delay_ms as f64),
                count(u64::from(per_key)),
                count(u64::from(per_worker)),
            )
        }
    }
}

/// A token budget: where usage is read, what is reserved, and the opt-ins.
pub fn token_budget(t: &TokensSpec) -> String {
    let usage = match &t.usage {
        UsageSpec::OpenAi => "OpenAI".to_string(),
        UsageSpec::Anthropic => "Anthropic".to_string(),
        UsageSpec::JsonPointer(set) => {
            let pointers: Vec<String> = [
                ("input", set.input()),
                ("output", set.output()),
                ("total", set.total()),
            ]
            .into_iter()
            .filter_map(|(name, p)| p.map(|p| format!("{name} {p}")))
            .collect();
            format!("JSON pointers ({})", pointers.join(", "))
        }
    };
    let mut parts = vec![
        format!("usage from {usage}"),
        format!(
            "{} output tokens reserved by default",
            count(t.default_estimate)
        ),
    ];
    if t.estimate_input_from_body {
        parts.push("input estimated from the body".to_string());
    }
    if t.include_usage {
        parts.push("streams asked for usage".to_string());
    }
    parts.join(" · ")
}

/// What a rule matches, in a few words.
pub fn matcher(m: &MatchSpec) -> String {
    let mut parts = Vec::new();
    if !m.methods.is_empty() {
        parts.push(m.methods.join(","));
    }
    if let Some(h) = &m.host {
        parts.push(h.clone());
    }
    if let Some(p) = &m.path_exact {
        parts.push(p.clone());
    }
    if let Some(p) = &m.path_prefix {
        parts.push(format!("{p}*"));
    }
    if let Some(p) = &m.path_regex {
        parts.push(format!("~{p}"));
    }
    for h in &m.headers {
        parts.push(match (&h.equals, h.present) {
            (Some(v), _) => format!("{}={v}", h.name),
            (None, Some(false)) => format!("no {}", h.name),
            _ => format!("has {}", h.name),
        });
    }
    for v in &m.values {
        let name = key(&v.value);
        parts.push(match (&v.equals, v.present) {
            (Some(e), _) => format!("{name}={e}"),
            (None, Some(false)) => format!("no {name}"),
            _ => format!("has {name}"),
        });
    }
    if parts.is_empty() {
        "all requests".to_string()
    } else {
        parts.join(" ")
    }
}

/// The rule's id as the API names it.
pub fn rule_id(spec: &RuleSpec) -> &str {
    spec.id.as_deref().unwrap_or(&spec.name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::spec::{ClientIpSpec, HeaderMatchSpec};

    #[test]
    fn times_read_in_the_unit_that_fits() {
        assert_eq!(millis(0.84), "0.8 ms");
        assert_eq!(millis(12.4), "12 ms");
        assert_eq!(millis(1_400.0), "1.4 s");
        assert_eq!(millis(250.0), "250 ms");
    }

    #[test]
    fn shaping_names_only_the_counts_a_rule_has() {
        assert_eq!(shaping(0, 0, 0, 0), None);
        assert_eq!(shaping(1, 0, 0, 0).as_deref(), Some("1 warned"));
        assert_eq!(shaping(0, 0, 0, 3).as_deref(), Some("3 in-flight refused"));
        assert_eq!(
            shaping(12_000, 40, 3_400, 3).as_deref(),
            Some("12,000 warned · 40 delayed, mean wait 85 ms · 3 in-flight refused")
        );
        // A wait sum without delayed requests has no mean to show.
        assert_eq!(shaping(0, 0, 500, 0), None);
    }

    #[test]
    fn shaped_cards_show_only_what_a_window_has() {
        assert_eq!(shaped_cards(0, 0, 0, 0), []);
        assert_eq!(
            shaped_cards(0, 0, 900, 0),
            [],
            "a wait sum alone has no card"
        );
        let cards = shaped_cards(12_000, 40, 3_400, 3);
        let shown: Vec<(&str, &str, &str)> = cards
            .iter()
            .map(|c| (c.test, c.value.as_str(), c.note.as_str()))
            .collect();
        assert_eq!(
            shown,
            [
                ("delayed", "40", "mean wait 85 ms · passed, in allowed"),
                ("warned", "12,000", "over a limit, told so · in allowed"),
                ("in-flight-refused", "3", "too many at once · in throttled"),
            ]
        );
        let only_refused = shaped_cards(0, 0, 0, 1);
        assert_eq!(only_refused.len(), 1);
        assert_eq!(only_refused[0].label, "In-flight refused");
        assert_eq!(only_refused[0].tone, "bad");
        assert_eq!(mean_wait(0, 0), None);
        assert_eq!(mean_wait(3, 1).as_deref(), Some("0.3 ms"));
    }

    #[test]
    fn a_mean_wait_reads_in_milliseconds_below_a_second_and_seconds_from_one() {
        let delayed = |waited_ms| shaping(0, 2, waited_ms, 0).unwrap();
        assert_eq!(delayed(3), "2 delayed, mean wait 1.5 ms");
        assert_eq!(delayed(1_998), "2 delayed, mean wait 999 ms");
        assert_eq!(delayed(2_000), "2 delayed, mean wait 1 s");
        assert_eq!(delayed(3_000), "2 delayed, mean wait 1.5 s");
    }

    #[test]
    fn counts_rates_and_percentages_read_naturally() {
        assert_eq!(count(0), "0");
        assert_eq!(count(999), "999");
        assert_eq!(count(1_234), "1,234");
        assert_eq!(count(123_456), "123,456");
        assert_eq!(count(1_234_567), "1.23M");
        assert_eq!(rate(0.0), "0");
        assert_eq!(rate(f64::NAN), "0");
        assert_eq!(rate(0.4), "0.4");
        assert_eq!(rate(12.54), "12.5");
        assert_eq!(rate(250.4), "250");
        assert_eq!(rate(1_234.0), "1.2k");
        assert_eq!(axis(2_500_000.0), "2.5M");
        assert_eq!(axis(0.25), "0.25");
        assert_eq!(percent(0.1234), "12.3%");
        assert_eq!(percent(0.0004), "<0.1%");
        assert_eq!(percent(-1.0), "0%");
    }

    #[test]
    fn ages_and_windows() {
        assert_eq!(ago_text(3), "just now");
        assert_eq!(ago_text(42), "42 s ago");
        assert_eq!(ago_text(300), "5 min ago");
        assert_eq!(ago_text(3 * 3600), "3 h ago");
        assert_eq!(ago_text(86_400 + 5), "yesterday");
        assert_eq!(ago_text(3 * 86_400), "3 days ago");
        assert_eq!(window(30), "30 s");
        assert_eq!(window(300), "5 min");
        assert_eq!(window(86_400), "24 h");
    }

    #[test]
    fn limits_keys_and_matchers_in_a_few_words() {
        let per_second: LimitSpec =
            serde_json::from_str(r#"{"requests":5,"period":"second","burst":10}"#).unwrap();
        let custom: LimitSpec = serde_json::from_str(r#"{"requests":1000,"period":90}"#).unwrap();
        assert_eq!(limit(&per_second), "5/s, burst 10");
        assert_eq!(limit(&custom), "1,000 per 90 s");
        assert_eq!(
            limits(&[per_second, custom]),
            "5/s, burst 10 · 1,000 per 90 s"
        );
        assert_eq!(
            key(&KeySpec::ClientIp(ClientIpSpec { trusted_hops: 2 })),
            "client IP (2 hops)"
        );
        assert_eq!(
            key(&KeySpec::Composite(vec![
                KeySpec::Header("x-api-key".into()),
                KeySpec::Path
            ])),
            "header x-api-key + path"
        );
        let matcher_spec = MatchSpec {
            methods: vec!["GET".into()],
            path_prefix: Some("/api/".into()),
            headers: vec![HeaderMatchSpec {
                name: "x-beta".into(),
                present: Some(false),
                equals: None,
            }],
            ..MatchSpec::default()
        };
        assert_eq!(matcher(&matcher_spec), "GET /api/* no x-beta");
        assert_eq!(matcher(&MatchSpec::default()), "all requests");
    }

    #[test]
    fn periods_windows_and_edges() {
        assert_eq!(period(&PeriodSpec::Named(NamedPeriod::Second)), "s");
        assert_eq!(period(&PeriodSpec::Named(NamedPeriod::Minute)), "min");
        assert_eq!(period(&PeriodSpec::Named(NamedPeriod::Hour)), "h");
        assert_eq!(period(&PeriodSpec::Named(NamedPeriod::Day)), "day");
        assert_eq!(period(&PeriodSpec::Seconds(45)), "45 s");
        assert_eq!(window(3600), "1 h");
        assert_eq!(window(5400), "90 min", "not a whole number of hours");
        assert_eq!(window(90), "1 min");
        assert_eq!(count(1_000_000), "1M");
        assert_eq!(rate(1_000.0), "1k");
        assert_eq!(rate(99.95), "100", "rounding up to three digits");
        assert_eq!(axis(1_000.0), "1k");
        assert_eq!(percent(1.0), "100%");
    }

    #[test]
    fn a_burst_equal_to_the_rate_is_not_repeated() {
        let same: LimitSpec =
            serde_json::from_str(r#"{"requests":100,"period":"hour","burst":100}"#).unwrap();
        assert_eq!(limit(&same), "100/h");
        assert_eq!(limits(&[]), "");
        let fleet: LimitSpec =
            serde_json::from_str(r#"{"requests":100,"period":"minute","scope":"global"}"#).unwrap();
        assert_eq!(limit(&fleet), "100/min, fleet-wide");
    }

    #[test]
    fn every_key_kind_and_condition_has_words() {
        assert_eq!(
            key(&KeySpec::Header("x-api-key".into())),
            "header x-api-key"
        );
        assert_eq!(
            key(&KeySpec::ClientIp(ClientIpSpec { trusted_hops: 0 })),
            "client IP"
        );
        assert_eq!(key(&KeySpec::Query("user".into())), "query user");
        assert_eq!(key(&KeySpec::Path), "path");
        assert_eq!(key(&KeySpec::Global), "everyone (global)");
        let m = MatchSpec {
            methods: vec!["GET".into(), "POST".into()],
            host: Some("*.example.com".into()),
            path_exact: Some("/login".into()),
            path_regex: Some("/v[0-9]+/.*".into()),
            headers: vec![
                HeaderMatchSpec {
                    name: "x-tier".into(),
                    present: None,
                    equals: Some("gold".into()),
                },
                HeaderMatchSpec {
                    name: "x-beta".into(),
                    present: Some(true),
                    equals: None,
                },
            ],
            ..MatchSpec::default()
        };
        assert_eq!(
            matcher(&m),
            "GET,POST *.example.com /login ~/v[0-9]+/.* x-tier=gold has x-beta"
        );
    }

    #[test]
    fn missing_keys_rollouts_and_token_budgets_in_a_few_words() {
        assert_eq!(key_missing(&KeyMissingSpec::Skip), "the rule is skipped");
        assert_eq!(
            key_missing(&KeyMissingSpec::Fallback("anonymous".into())),
            "the fallback key anonymous"
        );
        assert_eq!(rollout(Mode::Enforce, 100), "every client");
        assert_eq!(
            rollout(Mode::Enforce, 25),
            "25% of clients (the rest in shadow mode)"
        );
        assert_eq!(
            rollout(Mode::Enforce, 0),
            "no one yet (0%: every client in shadow mode)"
        );
        assert_eq!(rollout(Mode::Shadow, 25), "no one (shadow mode)");
        let budget = |json: &str| token_budget(&serde_json::from_str(json).unwrap());
        assert_eq!(
            budget(r#"{"usage":"openai","default_estimate":1000,"include_usage":true}"#),
            "usage from OpenAI · 1,000 output tokens reserved by default · streams asked for usage"
        );
        assert_eq!(
            budget(
                r#"{"usage":{"json_pointer":{"input":"/u/in","total":"/u/all"}},"default_estimate":5,"estimate_input_from_body":true}"#
            ),
            "usage from JSON pointers (input /u/in, total /u/all) · 5 output tokens reserved by default · input estimated from the body"
        );
        assert_eq!(
            budget(r#"{"usage":"anthropic","default_estimate":0}"#),
            "usage from Anthropic · 0 output tokens reserved by default"
        );
    }

    #[test]
    fn what_an_over_limit_request_gets_in_a_few_words() {
        let delay = |json: &str| serde_json::from_str::<DelaySpec>(json).unwrap();
        assert_eq!(on_limit(OnLimit::Refuse, None), "refused");
        assert_eq!(
            on_limit(
                OnLimit::Delay,
                Some(&delay(
                    r#"{"max_delay_ms":1500,"queue_per_key":8,"queue_per_worker":512}"#
                ))
            ),
            "delayed up to 1.5 s, at most 8 waiting per client and 512 for the rule on each Envoy worker"
        );
        assert_eq!(
            on_limit(OnLimit::Delay, Some(&delay(r#"{"max_delay_ms":250}"#))),
            "delayed up to 250 ms, at most 16 waiting per client and 1,024 for the rule on each Envoy worker",
            "the defaults"
        );
        assert_eq!(
            on_limit(
                OnLimit::Delay,
                Some(&delay(r#"{"max_delay_ms":250,"queue_per_worker":4}"#))
            ),
            "delayed up to 250 ms, at most 4 waiting per client and 4 for the rule on each Envoy worker",
            "a client's default follows a smaller rule bound down"
        );
    }

    #[test]
    fn an_elastic_ceiling_in_a_few_words() {
        let ceiling = |json: &str| elastic(&serde_json::from_str(json).unwrap());
        assert_eq!(
            ceiling(r#"{"requests":300,"period":"second","burst":400}"#),
            "clients pass their limits while all of them together are under 300/s, burst 400, in each Envoy"
        );
        assert_eq!(
            ceiling(r#"{"requests":1200,"period":90,"burst":1200}"#),
            "clients pass their limits while all of them together are under 1,200 per 90 s, in each Envoy",
            "a burst equal to the requests is the default"
        );
    }

    #[test]
    fn a_rule_is_named_by_its_id_or_else_its_name() {
        let mut spec: RuleSpec = serde_json::from_str(
            r#"{"name":"api","key":"global","limits":[{"requests":1,"period":"second"}]}"#,
        )
        .unwrap();
        assert_eq!(rule_id(&spec), "api");
        spec.id = Some("stable".into());
        assert_eq!(rule_id(&spec), "stable");
    }
}
