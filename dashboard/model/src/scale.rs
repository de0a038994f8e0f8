//! Chart scales: round axis maxima and time-axis tick spacing.

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
}
