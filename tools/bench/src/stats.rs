//! Medians and ranges over rounds.

use serde_json::{Value, json};

/// The `q` quantile of `values` (nearest rank over the sorted values); NaN for none.
pub fn quantile(values: &[f64], q: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted
        .get((sorted.len().saturating_sub(1) as f64 * q).round() as usize)
        .copied()
        .unwrap_or(f64::NAN)
}

/// Median and range of one measure over the rounds of a run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub n: usize,
}

impl Summary {
    /// `None` for no finite values.
    pub fn of(values: impl IntoIterator<Item = f64>) -> Option<Summary> {
        let mut v: Vec<f64> = values.into_iter().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Some(Summary {
            median,
            min: v[0],
            max: v[n - 1],
            n,
        })
    }

    /// `median (min–max)` with `decimals` digits.
    pub fn show(&self, decimals: usize) -> String {
        format!(
            "{:.d$} ({:.d$}–{:.d$})",
            self.median,
            self.min,
            self.max,
            d = decimals
        )
    }

    pub fn to_json(self) -> Value {
        json!({ "median": self.median, "min": self.min, "max": self.max, "rounds": self.n })
    }
}

/// `Summary::show`, or an em dash when there is nothing to show.
pub fn show(summary: Option<Summary>, decimals: usize) -> String {
    summary.map_or_else(|| "—".to_string(), |s| s.show(decimals))
}

pub fn to_json(summary: Option<Summary>) -> Value {
    summary.map_or(Value::Null, Summary::to_json)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_pick_from_the_sorted_values() {
        let v = [5.0, 1.0, 3.0, 2.0, 4.0];
        assert_eq!(quantile(&v, 0.5), 3.0);
        assert_eq!(quantile(&v, 1.0), 5.0);
        assert!(quantile(&[], 0.5).is_nan());
    }

    #[test]
    fn medians_of_odd_and_even_counts() {
        let s = Summary::of([3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.n), (2.0, 1.0, 3.0, 3));
        let s = Summary::of([4.0, 1.0, 2.0, 3.0, f64::NAN]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.n), (2.5, 1.0, 4.0, 4));
        assert_eq!(Summary::of([]), None);
        assert_eq!(s.show(1), "2.5 (1.0–4.0)");
    }
}
