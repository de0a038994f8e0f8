//! Numbers, rates, times and rule summaries as people read them. Everything that needs no
//! browser lives (and is tested) in `sluice_dashboard_model::format`; clock times, which
//! need the browser's time zone, are here.

pub use sluice_dashboard_model::format::*;

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
    ago_text(((js_sys::Date::now() - ms) / 1000.0).max(0.0) as u64)
}
