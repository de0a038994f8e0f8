//! Time buckets: the three resolutions metrics are kept at, and spans of buckets, the
//! unit every range query reads.

/// A time-series resolution: the width of a bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Resolution {
    TenSeconds,
    Minute,
    Hour,
}

impl Resolution {
    pub(crate) const ALL: [Resolution; 3] =
        [Resolution::TenSeconds, Resolution::Minute, Resolution::Hour];

    pub fn seconds(self) -> i64 {
        match self {
            Resolution::TenSeconds => 10,
            Resolution::Minute => 60,
            Resolution::Hour => 3600,
        }
    }

    pub fn ms(self) -> i64 {
        self.seconds() * 1000
    }

    /// The start of the bucket holding `t_ms`.
    pub fn bucket(self, t_ms: i64) -> i64 {
        t_ms - t_ms.rem_euclid(self.ms())
    }

    /// As the API spells it: `10s`, `1m`, `1h`.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Resolution::TenSeconds => "10s",
            Resolution::Minute => "1m",
            Resolution::Hour => "1h",
        }
    }

    pub(crate) fn from_label(label: &str) -> Option<Resolution> {
        Resolution::ALL.into_iter().find(|r| r.label() == label)
    }

    /// The step a range is shown at when none is asked for: up to an hour in 10 s
    /// buckets, up to two days in minutes, beyond in hours.
    pub(crate) fn for_range(range_ms: i64) -> Resolution {
        if range_ms <= 3_600_000 {
            Resolution::TenSeconds
        } else if range_ms <= 2 * 86_400_000 {
            Resolution::Minute
        } else {
            Resolution::Hour
        }
    }
}

/// A stretch of time read at one resolution: the buckets starting in `[from_ms, to_ms)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub resolution: Resolution,
    pub from_ms: i64,
    pub to_ms: i64,
}

impl Span {
    /// Every bucket of `resolution` that overlaps `[from_ms, to_ms)`.
    pub fn overlapping(resolution: Resolution, from_ms: i64, to_ms: i64) -> Span {
        Span {
            resolution,
            from_ms: resolution.bucket(from_ms),
            to_ms,
        }
    }

    /// `[from_ms, to_ms)` cut into few buckets: whole hours in hour buckets, whole
    /// minutes at the edges in minute buckets, the rest in 10 s buckets (overlapping the
    /// range's ends), so that a day reads about 24 + 120 + 12 buckets instead of 1,440.
    /// `retained(r)` is the oldest bucket of `r` still kept; an edge older than that is
    /// read from the whole coarser bucket instead.
    pub(crate) fn cover(
        from_ms: i64,
        to_ms: i64,
        retained: impl Fn(Resolution) -> i64,
    ) -> Vec<Span> {
        let mut out = Vec::new();
        cover(
            &[Resolution::Hour, Resolution::Minute, Resolution::TenSeconds],
            from_ms,
            to_ms,
            &retained,
            &mut out,
        );
        out
    }
}

fn cover(
    levels: &[Resolution],
    from: i64,
    to: i64,
    retained: &impl Fn(Resolution) -> i64,
    out: &mut Vec<Span>,
) {
    let Some((&r, finer)) = levels.split_first() else {
        return;
    };
    if from >= to {
        return;
    }
    if finer.is_empty() {
        out.push(Span::overlapping(r, from, to));
        return;
    }
    // Whether the next finer resolution still holds the data from `a` on.
    let descend = |a: i64| finer.first().is_some_and(|f| f.bucket(a) >= retained(*f));
    let lo = r.bucket(from + r.ms() - 1);
    let hi = r.bucket(to);
    if lo >= hi {
        if descend(from) {
            cover(finer, from, to, retained, out);
        } else {
            out.push(Span::overlapping(r, from, to));
        }
        return;
    }
    out.push(Span {
        resolution: r,
        from_ms: lo,
        to_ms: hi,
    });
    for (a, b) in [(from, lo), (hi, to)] {
        if a >= b {
            continue;
        }
        if descend(a) {
            cover(finer, a, b, retained, out);
        } else {
            out.push(Span::overlapping(r, a, b));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_and_steps() {
        assert_eq!(Resolution::TenSeconds.bucket(12_345), 10_000);
        assert_eq!(Resolution::Minute.bucket(59_999), 0);
        assert_eq!(Resolution::Minute.bucket(60_000), 60_000);
        assert_eq!(Resolution::Hour.bucket(-1), -3_600_000);
        assert_eq!(Resolution::for_range(3_600_000), Resolution::TenSeconds);
        assert_eq!(Resolution::for_range(3_600_001), Resolution::Minute);
        assert_eq!(Resolution::for_range(2 * 86_400_000), Resolution::Minute);
        assert_eq!(Resolution::for_range(2 * 86_400_000 + 1), Resolution::Hour);
        for r in Resolution::ALL {
            assert_eq!(Resolution::from_label(r.label()), Some(r));
        }
        assert_eq!(Resolution::from_label("5m"), None);
    }

    #[test]
    fn ranges_are_covered_by_few_buckets() {
        const M: i64 = 60_000;
        const H: i64 = 3_600_000;
        let all = |_: Resolution| i64::MIN;
        let span = |resolution, from_ms, to_ms| Span {
            resolution,
            from_ms,
            to_ms,
        };
        // A day from 10:00:05 to 10:00:05 the next day.
        let (from, to) = (10 * H + 5_000, 34 * H + 5_000);
        assert_eq!(
            Span::cover(from, to, all),
            [
                span(Resolution::Hour, 11 * H, 34 * H),
                span(Resolution::Minute, 10 * H + M, 11 * H),
                span(Resolution::TenSeconds, 10 * H, 10 * H + M),
                span(Resolution::TenSeconds, 34 * H, 34 * H + 5_000),
            ]
        );
        // Aligned: one span.
        assert_eq!(
            Span::cover(H, 3 * H, all),
            [span(Resolution::Hour, H, 3 * H)]
        );
        // Within a minute: 10 s buckets overlapping it.
        assert_eq!(
            Span::cover(H + 15_000, H + 25_000, all),
            [span(Resolution::TenSeconds, H + 10_000, H + 25_000)]
        );
        // Minutes no longer kept: the edge hour is read whole.
        let no_minutes = |r: Resolution| {
            if r == Resolution::Hour {
                i64::MIN
            } else {
                i64::MAX
            }
        };
        assert_eq!(
            Span::cover(from, to, no_minutes),
            [
                span(Resolution::Hour, 11 * H, 34 * H),
                span(Resolution::Hour, 10 * H, 11 * H),
                span(Resolution::Hour, 34 * H, 34 * H + 5_000),
            ]
        );
        // Every millisecond of the range is in exactly one span's buckets.
        let spans = Span::cover(from, to, all);
        for t in (from..to).step_by(997) {
            let n = spans
                .iter()
                .filter(|s| {
                    let b = s.resolution.bucket(t);
                    b >= s.from_ms && b < s.to_ms
                })
                .count();
            assert_eq!(n, 1, "{t}");
        }
    }
}
