//! Chart scales and geometry: round axis maxima, time-axis tick spacing, where a time or a
//! value lands in the plot, and the SVG paths of lines and sparklines. The Leptos charts
//! only draw what this computes, so the arithmetic is tested on the host.

/// Room left of the plot for the value labels.
pub const MARGIN_LEFT: f64 = 52.0;
pub const MARGIN_RIGHT: f64 = 14.0;
/// Room above the plot for the unit label.
pub const MARGIN_TOP: f64 = 10.0;
/// Room below the plot for the time labels.
pub const MARGIN_BOTTOM: f64 = 26.0;

/// The smallest "nice" number (1, 2, 2.5, 5 × 10^n) at or above `x`.
pub fn nice(x: f64) -> f64 {
    if x <= 0.0 || !x.is_finite() {
        return 1.0;
    }
    let exp = x.log10().floor();
    let base = 10f64.powf(exp);
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if m * base >= x - 1e-9 {
            return m * base;
        }
    }
    10.0 * base
}

/// Time-axis tick spacing in ms for a span and plot width: at most one tick per 70 px.
pub fn time_step(span_ms: i64, width: f64) -> i64 {
    let max_ticks = (width / 70.0).max(2.0);
    const STEPS: [i64; 14] = [
        5_000, 10_000, 15_000, 30_000, 60_000, 120_000, 300_000, 600_000, 900_000, 1_800_000,
        3_600_000, 7_200_000, 10_800_000, 21_600_000,
    ];
    STEPS
        .iter()
        .copied()
        .find(|s| (span_ms as f64 / *s as f64) <= max_ticks)
        .unwrap_or(43_200_000)
}

/// A time-series chart's geometry: the window it shows, its size in pixels and its value
/// axis, which is rounded up so that its four steps are nice numbers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Plot {
    /// The window's start, Unix ms.
    pub from: i64,
    /// The window's length in ms (at least 1, so that nothing divides by zero).
    pub span: i64,
    /// The whole chart's width, margins included.
    pub width: f64,
    pub plot_w: f64,
    pub plot_h: f64,
    pub y_max: f64,
    pub y_step: f64,
}

impl Plot {
    /// The geometry for a window `(from, to)` in Unix ms, a chart `width` × `height` px and
    /// the largest value shown.
    pub fn new(window: (i64, i64), width: f64, height: f64, max_value: f64) -> Plot {
        let (from, to) = window;
        // Headroom above the highest point keeps it off the top edge, and a floor keeps an
        // idle chart's axis from collapsing to zero.
        let y_step = nice((max_value * 1.1).max(0.4) / 4.0);
        Plot {
            from,
            span: (to - from).max(1),
            width,
            plot_w: (width - MARGIN_LEFT - MARGIN_RIGHT).max(10.0),
            plot_h: height - MARGIN_TOP - MARGIN_BOTTOM,
            y_max: y_step * 4.0,
            y_step,
        }
    }

    /// The x coordinate of a time in Unix ms.
    pub fn x(&self, t: i64) -> f64 {
        MARGIN_LEFT + (t - self.from) as f64 / self.span as f64 * self.plot_w
    }

    /// The y coordinate of a value; values above the axis are drawn at its top.
    pub fn y(&self, v: f64) -> f64 {
        MARGIN_TOP + self.plot_h - (v / self.y_max).min(1.0) * self.plot_h
    }

    /// The y coordinate of the time axis.
    pub fn bottom(&self) -> f64 {
        MARGIN_TOP + self.plot_h
    }

    /// The x coordinate where grid lines end.
    pub fn right(&self) -> f64 {
        self.width - MARGIN_RIGHT
    }

    /// The value axis' ticks, `(value, y)`, from zero to the top.
    pub fn y_ticks(&self) -> Vec<(f64, f64)> {
        let mut ticks = Vec::new();
        let mut v = 0.0;
        // The tolerance keeps the top tick, which repeated addition may overshoot by a hair.
        while v <= self.y_max + 1e-9 {
            ticks.push((v, MARGIN_TOP + self.plot_h - v / self.y_max * self.plot_h));
            v += self.y_step;
        }
        ticks
    }

    /// The time axis' tick spacing in ms and its ticks, `(time, x)`: round multiples of the
    /// spacing strictly inside the window.
    pub fn time_ticks(&self) -> (i64, Vec<(i64, f64)>) {
        let step = time_step(self.span, self.plot_w);
        let mut ticks = Vec::new();
        let mut t = (self.from / step + 1) * step;
        while t < self.from + self.span {
            ticks.push((t, self.x(t)));
            t += step;
        }
        (step, ticks)
    }

    /// The time under a pointer at `x`, or `None` outside the plot.
    pub fn time_at(&self, x: f64) -> Option<i64> {
        (MARGIN_LEFT..=MARGIN_LEFT + self.plot_w)
            .contains(&x)
            .then(|| self.from + ((x - MARGIN_LEFT) / self.plot_w * self.span as f64) as i64)
    }

    /// The SVG path through `(time, value)` points, oldest first.
    pub fn line_path(&self, points: &[(i64, f64)]) -> String {
        let mut d = String::new();
        for (i, (t, v)) in points.iter().enumerate() {
            let cmd = if i == 0 { 'M' } else { 'L' };
            d.push_str(&format!("{cmd}{:.1} {:.1} ", self.x(*t), self.y(*v)));
        }
        d
    }

    /// The SVG path of the area under `points`: their line closed along the time axis.
    pub fn area_path(&self, points: &[(i64, f64)]) -> String {
        let first = points.first().map_or(0, |p| p.0);
        let last = points.last().map_or(0, |p| p.0);
        let bottom = self.bottom();
        format!(
            "{}L{:.1} {bottom:.1} L{:.1} {bottom:.1} Z",
            self.line_path(points),
            self.x(last),
            self.x(first)
        )
    }
}

/// The time of the point nearest to `t`, for the hover read-out.
pub fn nearest_time(points: &[(i64, f64)], t: i64) -> Option<i64> {
    points.iter().min_by_key(|p| (p.0 - t).abs()).map(|p| p.0)
}

/// A sparkline's SVG paths, `(line, area)`, for values drawn left to right in a `width` ×
/// `height` box: the largest value touches the top (less a 2 px inset), zero the bottom.
/// Both are empty without values.
pub fn sparkline(values: &[u64], width: f64, height: f64) -> (String, String) {
    // All zeros still get a flat line: the maximum is at least 1.
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
    (line, area)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_numbers() {
        assert_eq!(nice(0.0), 1.0);
        assert_eq!(nice(3.0), 5.0);
        assert_eq!(nice(11.0), 20.0);
        assert_eq!(nice(0.22), 0.25);
        assert_eq!(nice(100.0), 100.0);
    }

    #[test]
    fn time_steps_fit_the_width() {
        assert_eq!(time_step(15 * 60_000, 900.0), 120_000);
        assert_eq!(time_step(5 * 60_000, 300.0), 120_000);
        assert_eq!(time_step(3_600_000, 900.0), 300_000);
        assert_eq!(time_step(15 * 60_000, 264.0), 300_000);
    }

    #[test]
    fn nice_numbers_are_never_below_their_input() {
        for x in [0.013, 0.7, 1.0, 1.01, 2.4, 2.6, 7.0, 9.99, 45.0, 1234.0] {
            let n = nice(x);
            assert!(n >= x, "nice({x}) = {n}");
            assert!(n < 2.0 * x + 1e-9, "nice({x}) = {n} is more than double");
        }
        assert_eq!(nice(f64::NAN), 1.0);
        assert_eq!(nice(-5.0), 1.0);
    }

    #[test]
    fn long_windows_fall_back_to_twelve_hours() {
        assert_eq!(time_step(7 * 86_400_000, 900.0), 43_200_000);
        assert_eq!(time_step(60_000, 900.0), 5_000);
    }

    fn plot() -> Plot {
        // A minute-long window, 266 px wide (200 px of plot) and 136 px high (100 px).
        Plot::new((60_000, 120_000), 266.0, 136.0, 9.0)
    }

    #[test]
    fn the_value_axis_has_headroom_and_four_nice_steps() {
        let p = plot();
        assert_eq!(
            (p.y_step, p.y_max),
            (2.5, 10.0),
            "9 × 1.1 = 9.9 rounds up to 4 × 2.5"
        );
        let ticks = p.y_ticks();
        let values: Vec<f64> = ticks.iter().map(|t| t.0).collect();
        assert_eq!(values, [0.0, 2.5, 5.0, 7.5, 10.0]);
        assert_eq!(ticks[0].1, p.bottom());
        assert_eq!(ticks[4].1, MARGIN_TOP);
        let idle = Plot::new((0, 1), 266.0, 136.0, 0.0);
        assert_eq!(idle.y_max, 0.4, "an idle chart still has an axis");
        let tenths = Plot::new((0, 1), 266.0, 136.0, 0.27);
        assert_eq!(
            tenths.y_ticks().len(),
            5,
            "0.1 steps summed up to the top keep the top tick"
        );
    }

    #[test]
    fn times_and_values_map_into_the_plot() {
        let p = plot();
        assert_eq!(p.x(60_000), MARGIN_LEFT);
        assert_eq!(p.x(90_000), MARGIN_LEFT + 100.0);
        assert_eq!(p.x(120_000), MARGIN_LEFT + 200.0);
        assert_eq!(p.y(0.0), MARGIN_TOP + 100.0);
        assert_eq!(p.y(5.0), MARGIN_TOP + 50.0);
        assert_eq!(
            p.y(50.0),
            MARGIN_TOP,
            "values above the axis stay on the chart"
        );
        assert_eq!(p.right(), 266.0 - MARGIN_RIGHT);
        assert_eq!(p.time_at(MARGIN_LEFT + 100.0), Some(90_000));
        assert_eq!(p.time_at(MARGIN_LEFT - 1.0), None);
        assert_eq!(p.time_at(MARGIN_LEFT + 201.0), None);
        let narrow = Plot::new((0, 0), 20.0, 136.0, 1.0);
        assert_eq!(
            (narrow.span, narrow.plot_w),
            (1, 10.0),
            "no division by zero"
        );
    }

    #[test]
    fn time_ticks_are_round_and_inside_the_window() {
        let p = Plot::new((61_000, 121_000), 266.0, 136.0, 1.0);
        let (step, ticks) = p.time_ticks();
        assert_eq!(step, 30_000, "200 px hold 2 ticks");
        let times: Vec<i64> = ticks.iter().map(|t| t.0).collect();
        assert_eq!(times, [90_000, 120_000]);
        assert_eq!(ticks[0].1, p.x(90_000));
        let (_, on_edge) = plot().time_ticks();
        assert_eq!(
            on_edge.iter().map(|t| t.0).collect::<Vec<_>>(),
            [90_000],
            "no tick on the window's edges"
        );
    }

    #[test]
    fn lines_and_areas_are_svg_paths() {
        let p = plot();
        let points = [(60_000, 0.0), (90_000, 5.0), (120_000, 10.0)];
        assert_eq!(p.line_path(&points), "M52.0 110.0 L152.0 60.0 L252.0 10.0 ");
        assert_eq!(
            p.area_path(&points),
            "M52.0 110.0 L152.0 60.0 L252.0 10.0 L252.0 110.0 L52.0 110.0 Z"
        );
        assert_eq!(p.line_path(&[]), "");
    }

    #[test]
    fn the_readout_picks_the_nearest_point() {
        let points = [(0, 1.0), (10_000, 2.0), (20_000, 3.0)];
        assert_eq!(nearest_time(&points, 4_000), Some(0));
        assert_eq!(nearest_time(&points, 6_000), Some(10_000));
        assert_eq!(nearest_time(&points, 99_000), Some(20_000));
        assert_eq!(nearest_time(&[], 0), None);
    }

    #[test]
    fn sparklines_span_their_box() {
        let (line, area) = sparkline(&[0, 5, 10], 102.0, 24.0);
        assert_eq!(line, "M1.0 22.0 L51.0 12.0 L101.0 2.0 ");
        assert_eq!(area, format!("{line}L101.0 24 L1.0 24 Z"));
        let (flat, _) = sparkline(&[0, 0], 102.0, 24.0);
        assert_eq!(
            flat, "M1.0 22.0 L101.0 22.0 ",
            "all zeros lie on the bottom"
        );
        let (one, _) = sparkline(&[3], 102.0, 24.0);
        assert_eq!(one, "M1.0 2.0 ");
        assert_eq!(sparkline(&[], 102.0, 24.0), (String::new(), String::new()));
    }
}
