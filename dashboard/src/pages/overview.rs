//! The overview: live request and throttle rates, the throttle ratio, shaped traffic
//! (delayed, warned, in-flight refused), near-limit and fail-open counts, per-rule
//! trends, the most throttled clients, and the proxies.

use leptos::prelude::*;
use leptos_router::components::A;
use send_wrapper::SendWrapper;
use wasm_bindgen::JsCast;
use wasm_bindgen::closure::Closure;
use web_sys::{EventSource, MessageEvent};

use crate::api::{
    self, ClientMetricsList as ClientList, GlobalSyncView, Overview as OverviewData, ProxyList,
    RuleMetricsList, Series, StreamEvent, enc, now_ms,
};
use crate::chart::{Legend, Line, Sparkline, TimeChart};
use crate::components::{Empty, Load, Stat, WindowPicker, load, show};
use crate::format;
use sluice_dashboard_model::fleet;

pub const ALLOWED: &str = "#2f6fde";
pub const THROTTLED: &str = "#e5484d";
pub const SHADOW: &str = "#e59c0b";
/// Shaped traffic, drawn over allowed and throttled (each is a part of one of them):
/// hues apart from blue, red and amber, and from each other.
pub const DELAYED: &str = "#8e4ec6";
pub const WARNED: &str = "#12a594";
pub const IN_FLIGHT_REFUSED: &str = "#d6409f";

/// The seconds a bucket starting at `t` covers so far: a whole step, or for the bucket in
/// progress the part already elapsed. `None` for a bucket too fresh to show (under half
/// elapsed: its rate would swing wildly and read as a sudden drop).
pub fn bucket_seconds(t: i64, step_seconds: i64, now: i64) -> Option<f64> {
    let step = step_seconds.max(1) as f64;
    let elapsed = (now - t) as f64 / 1000.0;
    if elapsed >= step {
        Some(step)
    } else if elapsed >= step / 2.0 {
        Some(elapsed)
    } else {
        None
    }
}

/// `f` of each of the series' points, per second of its bucket.
fn per_second(s: &Series, f: fn(&api::SeriesPoint) -> u64) -> Vec<(i64, f64)> {
    let now = now_ms();
    s.points
        .iter()
        .filter_map(|p| {
            bucket_seconds(p.t, s.step_seconds, now).map(|secs| (p.t, f(p) as f64 / secs))
        })
        .collect()
}

/// How many of a bucket's requests a line counts.
type Count = fn(&api::SeriesPoint) -> u64;

/// Requests per second over the series' points: allowed and throttled, then the parts of
/// them that were shadow-throttled, delayed, warned or refused in flight, each only while
/// the window has some (most rulesets shape nothing, and a flat line at zero would only
/// crowd the legend).
pub fn series_lines(s: &Series) -> Vec<Line> {
    let line = |label, color, count: Count, fill, dashed| Line {
        label,
        color,
        points: per_second(s, count),
        fill,
        dashed,
    };
    let mut lines = vec![
        line("Allowed", ALLOWED, |p| p.allowed, true, false),
        line("Throttled", THROTTLED, |p| p.denied, true, false),
    ];
    let parts: [(&'static str, &'static str, Count, bool); 4] = [
        ("Shadow-throttled", SHADOW, |p| p.shadow_denied, true),
        ("Delayed", DELAYED, |p| p.delayed, false),
        ("Warned", WARNED, |p| p.warned, false),
        (
            "In-flight refused",
            IN_FLIGHT_REFUSED,
            |p| p.in_flight_refused,
            false,
        ),
    ];
    for (label, color, count, dashed) in parts {
        if s.points.iter().any(|p| count(p) > 0) {
            lines.push(line(label, color, count, false, dashed));
        }
    }
    lines
}

/// LLM tokens per second over the series' points: used by allowed requests, asked for by
/// throttled ones. Empty when no rule with token limits saw traffic (the chart is then
/// not shown).
pub fn token_lines(s: &Series) -> Vec<Line> {
    if !s
        .points
        .iter()
        .any(|p| p.tokens_used > 0 || p.tokens_throttled > 0)
    {
        return Vec::new();
    }
    vec![
        Line {
            label: "Tokens used",
            color: ALLOWED,
            points: per_second(s, |p| p.tokens_used),
            fill: true,
            dashed: false,
        },
        Line {
            label: "Tokens throttled",
            color: THROTTLED,
            points: per_second(s, |p| p.tokens_throttled),
            fill: true,
            dashed: false,
        },
    ]
}

/// Live rates from the server-sent metrics stream.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Live {
    at: i64,
    requests: f64,
    throttled: f64,
}

/// Subscribes to `/api/v1/metrics/stream` while the page is shown; `on_traffic` runs for
/// every event that carries traffic (so the page refreshes as soon as reports arrive).
fn live_stream(on_traffic: impl Fn() + 'static) -> (RwSignal<Option<Live>>, RwSignal<bool>) {
    let live = RwSignal::new(None::<Live>);
    let connected = RwSignal::new(false);
    let Ok(source) = EventSource::new("/api/v1/metrics/stream") else {
        return (live, connected);
    };
    let mut last_t = None::<i64>;
    let on_metrics = Closure::<dyn FnMut(MessageEvent)>::new(move |ev: MessageEvent| {
        let Some(text) = ev.data().as_string() else {
            return;
        };
        let Ok(event) = serde_json::from_str::<StreamEvent>(&text) else {
            return;
        };
        let dt = last_t.map_or(2.0, |t| ((event.t - t) as f64 / 1000.0).clamp(0.5, 30.0));
        last_t = Some(event.t);
        live.try_set(Some(Live {
            at: now_ms(),
            requests: (event.allowed + event.denied) as f64 / dt,
            throttled: event.denied as f64 / dt,
        }));
        connected.try_set(true);
        if event.allowed + event.denied + event.shadow_denied > 0 {
            on_traffic();
        }
    });
    let on_open = Closure::<dyn FnMut()>::new(move || {
        connected.try_set(true);
    });
    let on_error = Closure::<dyn FnMut()>::new(move || {
        connected.try_set(false);
    });
    let _ = source.add_event_listener_with_callback("metrics", on_metrics.as_ref().unchecked_ref());
    source.set_onopen(Some(on_open.as_ref().unchecked_ref()));
    source.set_onerror(Some(on_error.as_ref().unchecked_ref()));
    let held = SendWrapper::new((source, on_metrics, on_open, on_error));
    on_cleanup(move || {
        let (source, ..) = &*held;
        source.close();
        drop(held);
    });
    (live, connected)
}

#[component]
pub fn Overview() -> impl IntoView {
    let range = RwSignal::new(900_u64);
    // Polled slowly; the live stream triggers a refresh whenever new traffic is reported.
    let overview = load(Some(10_000), move || {
        let window = range.get().min(3600);
        async move {
            api::get::<OverviewData>(&format!("/api/v1/metrics/overview?window={window}")).await
        }
    });
    let series = load(Some(10_000), move || {
        let r = range.get();
        async move {
            let to = now_ms();
            let from = to - (r as i64) * 1000;
            api::get::<Series>(&format!("/api/v1/metrics/series?from={from}&to={to}")).await
        }
    });
    let rule_metrics = load(Some(10_000), move || {
        let r = range.get();
        async move {
            let to = now_ms();
            api::get::<RuleMetricsList>(&format!(
                "/api/v1/metrics/rules?from={}&to={to}",
                to - (r as i64) * 1000
            ))
            .await
        }
    });
    let top = load(Some(10_000), move || {
        let r = range.get();
        async move {
            let to = now_ms();
            api::get::<ClientList>(&format!(
                "/api/v1/metrics/clients?from={}&to={to}&limit=6",
                to - (r as i64) * 1000
            ))
            .await
        }
    });
    let proxies = load(Some(10_000), || api::get::<ProxyList>("/api/v1/proxies"));
    let (live, connected) = live_stream(move || {
        overview.refresh();
        series.refresh();
        top.refresh();
        rule_metrics.refresh();
    });
    let ov = move || overview.ready();
    // The live figure while the stream is fresh, else the window's average.
    let fresh = move || live.get().filter(|l| now_ms() - l.at < 8_000);

    let lines =
        Signal::derive(move || series.ready().map(|s| series_lines(&s)).unwrap_or_default());
    let tokens =
        Signal::derive(move || series.ready().map(|s| token_lines(&s)).unwrap_or_default());
    let window = Signal::derive(move || {
        series
            .ready()
            .map(|s| (s.from, s.to))
            .unwrap_or_else(|| (now_ms() - range.get() as i64 * 1000, now_ms()))
    });
    let window_label = move || format::window(range.get().min(3600));

    view! {
        <div class="page">
            <div class="page-head">
                <div>
                    <h1>"Overview"</h1>
                    <p class="muted">"Traffic through every connected Envoy, as its proxies report it."</p>
                </div>
                <div class="head-tools">
                    <span class=move || if connected.get() { "live on" } else { "live" }
                        title="Server-sent metrics stream">
                        <span class="dot"></span>{move || if connected.get() { "Live" } else { "Connecting…" }}
                    </span>
                    <WindowPicker value=range options=&[300, 900, 3600] />
                </div>
            </div>
            {move || match overview.get() {
                Load::Failed(e) => Some(view! { <crate::components::ErrorBanner error=e /> }),
                _ => None,
            }}
            <section class="stats" data-test="stats">
                <Stat label="Requests / s"
                    value=Signal::derive(move || fresh().map(|l| format::rate(l.requests))
                        .or_else(|| ov().map(|o| format::rate(o.requests_per_second))).unwrap_or_else(|| "–".into()))
                    note=Signal::derive(move || if fresh().is_some() { "live, last 2 s".to_string() } else { format!("average, last {}", window_label()) }) />
                <Stat label="Throttled / s" tone="bad"
                    value=Signal::derive(move || fresh().map(|l| format::rate(l.throttled))
                        .or_else(|| ov().map(|o| format::rate(o.throttled_per_second))).unwrap_or_else(|| "–".into()))
                    note=Signal::derive(move || ov().map(|o| format!("{} throttled in {}", format::count(o.denied), window_label())).unwrap_or_default()) />
                <Stat label="Throttle ratio"
                    value=Signal::derive(move || ov().map(|o| format::percent(o.throttle_ratio)).unwrap_or_else(|| "–".into()))
                    note=Signal::derive(move || ov().map(|o| format!("{} shadow-throttled", format::count(o.shadow_denied))).unwrap_or_default()) />
                {move || ov().map(|o| format::shaped_cards(o.warned, o.delayed, o.delay_wait_ms, o.in_flight_refused)
                    .into_iter()
                    .map(|c| view! { <Stat label=c.label value=c.value note=c.note tone=c.tone test=c.test /> })
                    .collect_view())}
                <Stat label="Near limit" tone="warn"
                    value=Signal::derive(move || ov().map(|o| format::count(o.near_limit)).unwrap_or_else(|| "–".into()))
                    note=Signal::derive(|| "allowed, but ≥ 80% of a limit used".to_string()) />
                <Stat label="Fail-open · errors"
                    value=Signal::derive(move || ov().map(|o| format!("{} · {}", format::count(o.fail_open), format::count(o.errors))).unwrap_or_else(|| "–".into()))
                    note=Signal::derive(|| "let through because something failed".to_string()) />
                <Stat label="Proxies connected" tone="good"
                    value=Signal::derive(move || ov().map(|o| format!("{} of {}", o.proxies.connected, o.proxies.total)).unwrap_or_else(|| "–".into()))
                    note=Signal::derive(move || ov().map(|o| versions_note(&o)).unwrap_or_default()) />
                <Stat label="Fleet syncs answered"
                    value=Signal::derive(move || ov().and_then(|o| o.proxies.sync_answers).map(|t| fleet::answer_times(t.p50_ms, t.p99_ms, t.samples).0).unwrap_or_else(|| "–".into()))
                    note=Signal::derive(move || match ov().map(|o| o.proxies.sync_answers) {
                        Some(Some(t)) => format!("{} in {}", fleet::answer_times(t.p50_ms, t.p99_ms, t.samples).1, window_label()),
                        Some(None) => format!("no sync answered in {}", window_label()),
                        None => String::new(),
                    }) />
            </section>

            <section class="card">
                <div class="card-head">
                    <h2>"Requests per second"</h2>
                    <Legend lines=lines unit="req/s" />
                </div>
                {move || match series.get() {
                    Load::Loading => view! { <crate::components::Spinner /> }.into_any(),
                    Load::Failed(e) => view! { <crate::components::ErrorBanner error=e /> }.into_any(),
                    Load::Ready(_) => view! { <TimeChart lines=lines unit="requests / s" window=window /> }.into_any(),
                }}
            </section>

            {move || (!tokens.with(Vec::is_empty)).then(|| view! {
                <section class="card" data-test="token-chart">
                    <div class="card-head">
                        <h2>"LLM tokens per second"</h2>
                        <Legend lines=tokens unit="tokens/s" />
                    </div>
                    <TimeChart lines=tokens unit="tokens / s" window=window height=180.0 />
                </section>
            })}

            <div class="columns">
                <section class="card">
                    <div class="card-head">
                        <h2>"Rules"</h2>
                        <A href="/rules" attr:class="more">"All rules →"</A>
                    </div>
                    {show(rule_metrics, move |m| rules_table(m, window_label()))}
                </section>
                <section class="card">
                    <div class="card-head">
                        <h2>"Most throttled clients"</h2>
                        <A href="/clients" attr:class="more">"All clients →"</A>
                    </div>
                    {show(top, move |list| top_clients(list, window_label()))}
                </section>
            </div>

            <section class="card">
                <div class="card-head"><h2>"Proxies"</h2></div>
                {show(proxies, move |list| proxies_list(list, ov().map(|o| o.ruleset_version)))}
            </section>
        </div>
    }
}

/// A proxy's pace of syncs and when the last was answered: `every 250 ms · just now`,
/// `idle · every 4 s · 3 s ago`; `–` for a proxy that never synced.
fn sync_cell(sync: Option<&GlobalSyncView>) -> String {
    let Some(sync) = sync else {
        return "–".into();
    };
    let pace = fleet::pace(sync.interval_ms, sync.next_sync_ms);
    match &sync.last_answered {
        Some(at) => format!("{pace} · {}", format::ago(at)),
        None => format!("{pace} · never answered"),
    }
}

fn versions_note(o: &OverviewData) -> String {
    let versions = versions_only(o);
    match o.proxies.on_fallback {
        0 => versions,
        n => format!("{versions} · {n} on fallback shares"),
    }
}

fn versions_only(o: &OverviewData) -> String {
    match o.proxies.versions.len() {
        0 => format!("ruleset v{}", o.ruleset_version),
        1 => {
            let v = o
                .proxies
                .versions
                .keys()
                .next()
                .cloned()
                .unwrap_or_default();
            if v == o.ruleset_version.to_string() {
                format!("all on ruleset v{v} (current)")
            } else {
                format!("on v{v}; current is v{}", o.ruleset_version)
            }
        }
        _ => {
            let parts: Vec<String> = o
                .proxies
                .versions
                .iter()
                .map(|(v, n)| format!("v{v}: {n}"))
                .collect();
            format!("{} (current v{})", parts.join(", "), o.ruleset_version)
        }
    }
}

fn rules_table(m: RuleMetricsList, window: String) -> AnyView {
    if m.rules.is_empty() {
        return view! {
            <Empty title="No rule saw traffic">{format!("Nothing matched a rule in the last {window}.")}</Empty>
        }
        .into_any();
    }
    let mut rules = m.rules;
    rules.sort_by(|a, b| b.denied.cmp(&a.denied).then(b.allowed.cmp(&a.allowed)));
    view! {
        <table class="table" data-test="rule-metrics">
            <thead><tr><th>"Rule"</th><th class="num">"Allowed"</th><th class="num">"Throttled"</th><th class="num">"Ratio"</th><th class="hide-sm">"Trend"</th></tr></thead>
            <tbody>
                {rules.into_iter().map(|r| {
                    let name = r.name.clone().unwrap_or_else(|| r.rule.clone());
                    let href = format!("/rules/{}", enc(&r.rule));
                    let color = if r.denied > 0 { THROTTLED } else { ALLOWED };
                    view! {
                        <tr data-rule=r.rule.clone()>
                            <td><A href=href>{name}</A>
                                {format::shaping(r.warned, r.delayed, r.delay_wait_ms, r.in_flight_refused).map(|text| view! {
                                    <div class="muted small" data-test="rule-shaping">{text}</div>
                                })}
                            </td>
                            <td class="num">{format::count(r.allowed)}</td>
                            <td class="num bad-text">{format::count(r.denied)}
                                {(r.shadow_denied > 0).then(|| view! { <span class="muted small">" +"{format::count(r.shadow_denied)}" shadow"</span> })}
                            </td>
                            <td class="num">{format::percent(r.throttle_ratio)}
                                {(r.tokens_used + r.tokens_throttled > 0).then(|| view! {
                                    <span class="muted small" data-test="rule-tokens">" · "{format::count(r.tokens_used)}" tokens used, "{format::count(r.tokens_throttled)}" throttled"</span>
                                })}
                            </td>
                            <td class="hide-sm"><Sparkline values=r.sparkline color=color /></td>
                        </tr>
                    }
                }).collect_view()}
            </tbody>
        </table>
    }
    .into_any()
}

pub fn top_clients(list: ClientList, window: String) -> AnyView {
    if list.clients.is_empty() {
        return view! {
            <Empty title="Nobody throttled">{format!("No client was throttled in the last {window}.")}</Empty>
        }
        .into_any();
    }
    let max = list
        .clients
        .iter()
        .map(|c| c.throttled)
        .max()
        .unwrap_or(1)
        .max(1);
    view! {
        <ul class="bars" data-test="top-clients">
            {list.clients.into_iter().map(|c| {
                let width = format!("width:{:.1}%", c.throttled as f64 / max as f64 * 100.0);
                let href = format!("/clients/{}", enc(&c.client));
                view! {
                    <li>
                        <div class="bar-label">
                            <A href=href attr:class="client">{c.client.clone()}</A>
                            <span class="muted small">" · "{c.rule.clone()}</span>
                            <span class="bar-value">{format::count(c.throttled)}</span>
                        </div>
                        <div class="bar"><div class="bar-fill" style=width></div></div>
                    </li>
                }
            }).collect_view()}
        </ul>
    }
    .into_any()
}

fn proxies_list(list: ProxyList, current: Option<u64>) -> AnyView {
    if list.proxies.is_empty() {
        return view! {
            <Empty title="No proxy has connected yet">
                "Point an Envoy at this admin API: "
                <code>"sluice envoy-config --admin-url http://HOST:PORT --proxy-token TOKEN …"</code>
            </Empty>
        }
        .into_any();
    }
    view! {
        <table class="table" data-test="proxies">
            <thead><tr><th>"Proxy"</th><th class="hide-sm">"Address"</th><th>"Ruleset"</th><th class="hide-sm">"Fleet sync"</th><th>"Last seen"</th></tr></thead>
            <tbody>
                {list.proxies.into_iter().map(|p| {
                    let behind = current.is_some_and(|c| p.ruleset_version < c);
                    view! {
                        <tr>
                            <td>
                                <span class=if p.connected { "status-dot on" } else { "status-dot" }
                                    title=if p.connected { "connected" } else { "not connected" }></span>
                                <span class="mono">{p.id.clone()}</span>
                                {p.global_sync.as_ref().filter(|g| g.on_fallback).map(|_| view! {
                                    " "
                                    <span class="badge warn" data-test="fallback"
                                        title="Its syncs with the coordinator fail: it enforces fleet-wide limits with its own share of each limit until they succeed">
                                        "fallback shares"
                                    </span>
                                })}
                                {p.last_error.clone().map(|e| view! { <div class="bad-text small">{e}</div> })}
                            </td>
                            <td class="hide-sm mono muted">{p.address.clone()}</td>
                            <td><span class=if behind { "badge warn" } else { "badge" }>{format!("v{}", p.ruleset_version)}</span></td>
                            <td class="hide-sm muted" data-test="fleet-sync">{sync_cell(p.global_sync.as_ref())}</td>
                            <td class="muted">{format::ago(&p.last_seen)}</td>
                        </tr>
                    }
                }).collect_view()}
            </tbody>
        </table>
    }
    .into_any()
}
