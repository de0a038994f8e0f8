//! Numbers, rates, times and rule summaries as people read them.

use sluice_core::spec::{KeySpec, LimitSpec, MatchSpec, NamedPeriod, PeriodSpec, RuleSpec};

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

fn trim(x: f64, decimals: usize) -> String {
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

fn date(ms: f64) -> js_sys::Date {
    js_sys::Date::new(&wasm_bindgen::JsValue::from_f64(ms))
}

/// Local `HH:MM`.
pub fn clock(ms: i64) -> String {
    let d = date(ms as f64);
    format!("{:02}:{:02}", d.get_hours(), d.get_minutes())
}

/// Local `HH:MM:SS`.
pub fn clock_seconds(ms: i64) -> String {
    let d = date(ms as f64);
    format!(
        "{:02}:{:02}:{:02}",
        d.get_hours(),
        d.get_minutes(),
        d.get_seconds()
    )
}

/// An RFC 3339 time from the API as local `YYYY-MM-DD HH:MM:SS`.
pub fn timestamp(rfc3339: &str) -> String {
    let ms = js_sys::Date::parse(rfc3339);
    if ms.is_nan() {
        return rfc3339.to_string();
    }
    let d = date(ms);
    format!(
        "{}-{:02}-{:02} {:02}:{:02}:{:02}",
        d.get_full_year(),
        d.get_month() + 1,
        d.get_date(),
        d.get_hours(),
        d.get_minutes(),
        d.get_seconds()
    )
}

/// How long ago an RFC 3339 time was: `just now`, `5 min ago`, `3 h ago`, `2 days ago`.
pub fn ago(rfc3339: &str) -> String {
    let ms = js_sys::Date::parse(rfc3339);
    if ms.is_nan() {
        return rfc3339.to_string();
    }
    let seconds = ((js_sys::Date::now() - ms) / 1000.0).max(0.0) as u64;
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

/// `5/s, burst 10`.
pub fn limit(l: &LimitSpec) -> String {
    let base = match l.period {
        PeriodSpec::Seconds(_) => format!("{} per {}", count(l.requests), period(&l.period)),
        _ => format!("{}/{}", count(l.requests), period(&l.period)),
    };
    match l.burst {
        Some(b) if b != l.requests => format!("{base}, burst {}", count(b)),
        _ => base,
    }
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
    }
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
