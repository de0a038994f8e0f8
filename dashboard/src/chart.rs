//! Plain SVG charts drawn by Leptos views: a time-series chart with axes, units, legend
//! and a hover read-out, and sparklines. No charting dependency: the bundle stays small.

use leptos::ev;
use leptos::html::Div;
use leptos::prelude::*;

use sluice_dashboard_model::scale::{nice, time_step};

use crate::format;

/// One line of a [`TimeChart`]: `(time in Unix ms, value)` points, oldest first.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    pub label: &'static str,
    pub color: &'static str,
    pub points: Vec<(i64, f64)>,
    /// Shade the area under the line.
    pub fill: bool,
    pub dashed: bool,
}

const MARGIN_LEFT: f64 = 52.0;
const MARGIN_RIGHT: f64 = 14.0;
const MARGIN_TOP: f64 = 10.0;
const MARGIN_BOTTOM: f64 = 26.0;

/// A time-series chart that fills its container's width.
#[component]
pub fn TimeChart(
    /// The lines, redrawn when the signal changes.
    #[prop(into)]
    lines: Signal<Vec<Line>>,
    /// The y axis' unit, e.g. "requests / s".
    unit: &'static str,
    /// The time window shown, Unix ms.
    #[prop(into)]
    window: Signal<(i64, i64)>,
    #[prop(default = 240.0)] height: f64,
    /// Shown over an empty chart.
    #[prop(default = "No requests in this window")]
    empty: &'static str,
) -> impl IntoView {
    let container = NodeRef::<Div>::new();
    let width = RwSignal::new(720.0_f64);
    let measure = move || {
        if let Some(el) = container.get_untracked() {
            let w = f64::from(el.client_width());
            if w > 0.0 {
                width.set(w);
            }
        }
    };
    Effect::new(move |_| {
        if container.get().is_some() {
            measure();
        }
    });
    let resize = window_event_listener(ev::resize, move |_| measure());
    on_cleanup(move || resize.remove());
    let hover = RwSignal::new(None::<f64>);

    let geometry = Memo::new(move |_| {
        let (from, to) = window.get();
        let span = (to - from).max(1);
        let w = width.get();
        let plot_w = (w - MARGIN_LEFT - MARGIN_RIGHT).max(10.0);
        let plot_h = height - MARGIN_TOP - MARGIN_BOTTOM;
        let max = lines.with(|ls| {
            ls.iter()
                .flat_map(|l| l.points.iter().map(|p| p.1))
                .fold(0.0_f64, f64::max)
        });
        let y_step = nice((max * 1.1).max(0.4) / 4.0);
        let y_max = y_step * 4.0;
        (from, span, w, plot_w, plot_h, y_max, y_step)
    });
    let x_of = move |t: i64| {
        let (from, span, _, plot_w, ..) = geometry.get();
        MARGIN_LEFT + (t - from) as f64 / span as f64 * plot_w
    };
    let y_of = move |v: f64| {
        let (.., plot_h, y_max, _) = geometry.get();
        MARGIN_TOP + plot_h - (v / y_max).min(1.0) * plot_h
    };

    let grid = move || {
        let (from, span, w, plot_w, plot_h, y_max, y_step) = geometry.get();
        let mut y_ticks = Vec::new();
        let mut v = 0.0;
        while v <= y_max + 1e-9 {
            let y = MARGIN_TOP + plot_h - v / y_max * plot_h;
            y_ticks.push(view! {
                <line class="grid" x1=MARGIN_LEFT x2=w - MARGIN_RIGHT y1=y y2=y />
                <text class="tick" x=MARGIN_LEFT - 6.0 y=y + 4.0 text-anchor="end">{format::axis(v)}</text>
            });
            v += y_step;
        }
        let step = time_step(span, plot_w);
        let mut x_ticks = Vec::new();
        let mut t = (from / step + 1) * step;
        while t < from + span {
            let x = MARGIN_LEFT + (t - from) as f64 / span as f64 * plot_w;
            let label = if step < 60_000 {
                format::clock_seconds(t)
            } else {
                format::clock(t)
            };
            x_ticks.push(view! {
                <line class="axis" x1=x x2=x y1=MARGIN_TOP + plot_h y2=MARGIN_TOP + plot_h + 4.0 />
                <text class="tick" x=x y=MARGIN_TOP + plot_h + 17.0 text-anchor="middle">{label}</text>
            });
            t += step;
        }
        view! {
            {y_ticks}
            <line class="axis" x1=MARGIN_LEFT x2=w - MARGIN_RIGHT y1=MARGIN_TOP + plot_h y2=MARGIN_TOP + plot_h />
            {x_ticks}
        }
    };

    let paths = move || {
        let (.., plot_h, _, _) = geometry.get();
        let bottom = MARGIN_TOP + plot_h;
        lines
            .get()
            .into_iter()
            .filter(|l| !l.points.is_empty())
            .map(|l| {
                let mut d = String::new();
                for (i, (t, v)) in l.points.iter().enumerate() {
                    let cmd = if i == 0 { 'M' } else { 'L' };
                    d.push_str(&format!("{cmd}{:.1} {:.1} ", x_of(*t), y_of(*v)));
                }
                let area = l.fill.then(|| {
                    let first = l.points.first().map_or(0, |p| p.0);
                    let last = l.points.last().map_or(0, |p| p.0);
                    format!(
                        "{d}L{:.1} {bottom:.1} L{:.1} {bottom:.1} Z",
                        x_of(last),
                        x_of(first)
                    )
                });
                view! {
                    {area.map(|a| view! { <path d=a fill=l.color fill-opacity="0.12" stroke="none" /> })}
                    <path d=d fill="none" stroke=l.color stroke-width="2" stroke-linejoin="round"
                        stroke-dasharray=if l.dashed { "5 4" } else { "none" } />
                }
            })
            .collect_view()
    };

    // The hover read-out: the nearest point of each line to the pointer's time.
    let readout = move || {
        let x = hover.get()?;
        let (from, span, w, plot_w, plot_h, ..) = geometry.get();
        if x < MARGIN_LEFT || x > MARGIN_LEFT + plot_w {
            return None;
        }
        let t = from + ((x - MARGIN_LEFT) / plot_w * span as f64) as i64;
        let ls = lines.get();
        let nearest = ls
            .iter()
            .find_map(|l| l.points.iter().min_by_key(|p| (p.0 - t).abs()).map(|p| p.0))?;
        let px = x_of(nearest);
        let rows = ls
            .iter()
            .filter_map(|l| {
                let p = l.points.iter().find(|p| p.0 == nearest)?;
                Some(view! {
                    <div class="tip-row">
                        <span class="swatch" style=format!("background:{}", l.color)></span>
                        {l.label}": "<b>{format::rate(p.1)}</b>
                    </div>
                })
            })
            .collect_view();
        let dots = ls
            .iter()
            .filter_map(|l| {
                let p = l.points.iter().find(|p| p.0 == nearest)?;
                Some(view! { <circle cx=px cy=y_of(p.1) r="3.5" fill=l.color /> })
            })
            .collect_view();
        let left = if px > w / 2.0 {
            format!("right:{:.0}px", w - px + 10.0)
        } else {
            format!("left:{:.0}px", px + 10.0)
        };
        Some(view! {
            <svg class="chart-overlay" width=w height=height>
                <line class="cursor" x1=px x2=px y1=MARGIN_TOP y2=MARGIN_TOP + plot_h />
                {dots}
            </svg>
            <div class="tip" style=left>
                <div class="tip-time">{format::clock_seconds(nearest)}</div>
                {rows}
            </div>
        })
    };

    let is_empty = move || lines.with(|ls| ls.iter().all(|l| l.points.iter().all(|p| p.1 <= 0.0)));

    view! {
        <div class="chart" node_ref=container style=format!("height:{height}px")
            on:mousemove=move |ev| hover.set(Some(f64::from(ev.offset_x())))
            on:mouseleave=move |_| hover.set(None)>
            <svg width=move || width.get() height=height role="img" aria-label=unit>
                {grid}
                {paths}
                <text class="unit" x=MARGIN_LEFT + 4.0 y=MARGIN_TOP + 10.0>{unit}</text>
            </svg>
            {readout}
            <Show when=is_empty>
                <div class="chart-empty">{empty}</div>
            </Show>
        </div>
    }
}

/// The legend above a chart: a swatch, the label, and the latest value with its unit.
#[component]
pub fn Legend(#[prop(into)] lines: Signal<Vec<Line>>, unit: &'static str) -> impl IntoView {
    view! {
        <div class="legend">
            {move || {
                lines
                    .get()
                    .into_iter()
                    .map(|l| {
                        let last = l.points.last().map_or(0.0, |p| p.1);
                        let class = if l.dashed { "swatch dashed" } else { "swatch" };
                        view! {
                            <span class="legend-item">
                                <span class=class style=format!("background:{}", l.color)></span>
                                {l.label}
                                <span class="legend-value">{format::rate(last)}" "{unit}</span>
                            </span>
                        }
                    })
                    .collect_view()
            }}
        </div>
    }
}

/// A small trend line without axes, for tables.
#[component]
pub fn Sparkline(
    values: Vec<u64>,
    #[prop(default = "#2f6fde")] color: &'static str,
    #[prop(default = 110.0)] width: f64,
    #[prop(default = 26.0)] height: f64,
) -> impl IntoView {
    let max = values.iter().copied().max().unwrap_or(0).max(1) as f64;
    let n = values.len().max(2) - 1;
    let points: Vec<(f64, f64)> = values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            (
                i as f64 / n as f64 * (width - 2.0) + 1.0,
                height - 2.0 - *v as f64 / max * (height - 4.0),
            )
        })
        .collect();
    let line: String = points
        .iter()
        .enumerate()
        .map(|(i, (x, y))| format!("{}{x:.1} {y:.1} ", if i == 0 { 'M' } else { 'L' }))
        .collect();
    let area = match (points.first(), points.last()) {
        (Some(first), Some(last)) => {
            format!("{line}L{:.1} {height} L{:.1} {height} Z", last.0, first.0)
        }
        _ => String::new(),
    };
    let quiet = values.iter().all(|v| *v == 0);
    let color = if quiet { "#c2c8d0" } else { color };
    view! {
        <svg class="sparkline" width=width height=height viewBox=format!("0 0 {width} {height}") aria-hidden="true">
            {(!values.is_empty()).then(|| view! {
                <path d=area fill=color fill-opacity="0.15" stroke="none" />
                <path d=line fill="none" stroke=color stroke-width="1.5" />
            })}
        </svg>
    }
}
