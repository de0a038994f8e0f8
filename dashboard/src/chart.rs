//! Plain SVG charts drawn by Leptos views: a time-series chart with axes, units, legend
//! and a hover read-out, and sparklines. No charting dependency: the bundle stays small.
//! Every coordinate and path comes from `sluice_dashboard_model::scale`; this draws them.

use leptos::ev;
use leptos::html::Div;
use leptos::prelude::*;

use sluice_dashboard_model::scale::{MARGIN_LEFT, MARGIN_TOP, Plot, nearest_time, sparkline};

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
        let max = lines.with(|ls| {
            ls.iter()
                .flat_map(|l| l.points.iter().map(|p| p.1))
                .fold(0.0_f64, f64::max)
        });
        Plot::new(window.get(), width.get(), height, max)
    });

    let grid = move || {
        let p = geometry.get();
        let y_ticks = p
            .y_ticks()
            .into_iter()
            .map(|(v, y)| {
                view! {
                    <line class="grid" x1=MARGIN_LEFT x2=p.right() y1=y y2=y />
                    <text class="tick" x=MARGIN_LEFT - 6.0 y=y + 4.0 text-anchor="end">{format::axis(v)}</text>
                }
            })
            .collect_view();
        let (step, ticks) = p.time_ticks();
        let x_ticks = ticks
            .into_iter()
            .map(|(t, x)| {
                let label = if step < 60_000 {
                    format::clock_seconds(t)
                } else {
                    format::clock(t)
                };
                view! {
                    <line class="axis" x1=x x2=x y1=p.bottom() y2=p.bottom() + 4.0 />
                    <text class="tick" x=x y=p.bottom() + 17.0 text-anchor="middle">{label}</text>
                }
            })
            .collect_view();
        view! {
            {y_ticks}
            <line class="axis" x1=MARGIN_LEFT x2=p.right() y1=p.bottom() y2=p.bottom() />
            {x_ticks}
        }
    };

    let paths = move || {
        let p = geometry.get();
        lines
            .get()
            .into_iter()
            .filter(|l| !l.points.is_empty())
            .map(|l| {
                let d = p.line_path(&l.points);
                let area = l.fill.then(|| p.area_path(&l.points));
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
        let p = geometry.get();
        let t = p.time_at(hover.get()?)?;
        let ls = lines.get();
        let nearest = ls.iter().find_map(|l| nearest_time(&l.points, t))?;
        let px = p.x(nearest);
        let w = p.width;
        let rows = ls
            .iter()
            .filter_map(|l| {
                let point = l.points.iter().find(|pt| pt.0 == nearest)?;
                Some(view! {
                    <div class="tip-row">
                        <span class="swatch" style=format!("background:{}", l.color)></span>
                        {l.label}": "<b>{format::rate(point.1)}</b>
                    </div>
                })
            })
            .collect_view();
        let dots = ls
            .iter()
            .filter_map(|l| {
                let point = l.points.iter().find(|pt| pt.0 == nearest)?;
                Some(view! { <circle cx=px cy=p.y(point.1) r="3.5" fill=l.color /> })
            })
            .collect_view();
        let left = if px > w / 2.0 {
            format!("right:{:.0}px", w - px + 10.0)
        } else {
            format!("left:{:.0}px", px + 10.0)
        };
        Some(view! {
            <svg class="chart-overlay" width=w height=height>
                <line class="cursor" x1=px x2=px y1=MARGIN_TOP y2=p.bottom() />
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
    let (line, area) = sparkline(&values, width, height);
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
